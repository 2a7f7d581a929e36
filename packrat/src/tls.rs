//! TLS for `packrat serve` and `packrat gateway` (`--tls-cert`, `--tls-key`), with rustls (the
//! ring provider, already in the build through the AWS SDK), and the admin CLI's https client.
//!
//! The certificate chain and key are PEM files. SIGHUP reads them again: connections accepted
//! afterwards get the new certificate, those already open keep theirs. A reload that fails
//! (a missing file, a key that does not match) is logged and the old certificate stays.

use packrat_gateway::server::{Conn, Handshake, Handshaken};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    acceptor: RwLock<tokio_rustls::TlsAcceptor>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn load(cert: &Path, key: &Path) -> Result<tokio_rustls::TlsAcceptor, String> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "--tls-cert {}: no certificate in it",
            cert.display()
        ));
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("the TLS certificate and key do not go together: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(config)))
}

impl Tls {
    pub fn open(cert: &Path, key: &Path) -> Result<Arc<Tls>, String> {
        let tls = Arc::new(Tls {
            acceptor: RwLock::new(load(cert, key)?),
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        });
        let reloader = tls.clone();
        let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
            .map_err(|e| format!("SIGHUP handler: {e}"))?;
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match load(&reloader.cert, &reloader.key) {
                    Ok(a) => {
                        if let Ok(mut cur) = reloader.acceptor.write() {
                            *cur = a;
                        }
                        tracing::info!("SIGHUP: TLS certificate reloaded");
                    }
                    Err(e) => tracing::warn!(
                        "SIGHUP: TLS certificate not reloaded ({e}); the old one stays"
                    ),
                }
            }
        });
        Ok(tls)
    }
}

impl Handshake for Tls {
    fn accept(&self, stream: tokio::net::TcpStream) -> Handshaken {
        let acceptor = self.acceptor.read().map(|a| a.clone()).ok();
        Box::pin(async move {
            let acceptor = acceptor.ok_or_else(|| std::io::Error::other("TLS state poisoned"))?;
            let tls = acceptor.accept(stream).await?;
            Ok(Box::new(tls) as Box<dyn Conn>)
        })
    }
}

/// The admin CLI's connector: https with the roots in `PACKRAT_CA_CERT` (a PEM file) if set,
/// else the system's; plain http too.
pub fn client_connector()
-> Result<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>, String>
{
    let builder = match std::env::var_os("PACKRAT_CA_CERT") {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(&path)
                .map_err(|e| format!("PACKRAT_CA_CERT {}: {e}", path.to_string_lossy()))?
            {
                let cert = cert.map_err(|e| format!("PACKRAT_CA_CERT: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| format!("PACKRAT_CA_CERT: {e}"))?;
            }
            let config = rustls::ClientConfig::builder_with_provider(provider())
                .with_safe_default_protocol_versions()
                .map_err(|e| e.to_string())?
                .with_root_certificates(roots)
                .with_no_client_auth();
            hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
        }
        None => hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider())
            .map_err(|e| format!("the system's certificate roots: {e}"))?,
    };
    Ok(builder.https_or_http().enable_http1().build())
}
