//! What the server and every handler share: the state of the app, a request as the S3
//! handlers see it, response bodies, and the connection types TLS plugs into.

use crate::config::ServeConfig;
use crate::metrics::Metrics;
use crate::s3::body::BodyReader;
use crate::s3::headers::RequestHeaders;
use crate::s3::sigv4;
use bytes::Bytes;
use http::Method;
use http_body_util::{BodyExt, Empty, Full};
use packrat_store_api::{Clock, Identity, Store};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub type RespBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

pub fn full(b: impl Into<Bytes>) -> RespBody {
    Full::new(b.into()).map_err(|e| match e {}).boxed_unsync()
}

pub fn empty() -> RespBody {
    Empty::new().map_err(|e| match e {}).boxed_unsync()
}

pub struct AppState {
    /// Storage, as the S3 handlers see it.
    pub store: Arc<dyn Store>,
    /// The store's clock: the one source of the date (SigV4 request times, presigned expiry,
    /// the last-modified and creation times handed to the store).
    pub clock: Arc<dyn Clock>,
    pub config: ServeConfig,
    pub signing_keys: sigv4::SigningKeyCache,
    pub metrics: Metrics,
    /// One permit per open client connection (`--max-connections`).
    pub connections: Arc<tokio::sync::Semaphore>,
    request_counter: AtomicU64,
    request_id_prefix: u32,
    /// Faults of the HTTP layer (`--fault-injection`, tests only).
    pub http_faults: HttpFaults,
    /// TLS (`--tls-cert`/`--tls-key`): every accepted connection goes through this handshake
    /// first. The library knows nothing of certificates; the binary brings the TLS stack.
    pub tls: Option<Arc<dyn Handshake>>,
    /// The access log, when it is wanted (`--no-access-log` not given) and the log filter
    /// lets its target through; otherwise no request spends anything on it.
    pub(crate) access_log: Option<crate::access_log::AccessLog>,
    /// Buckets' parsed policies (`s3::policy`).
    pub policies: crate::s3::policy::PolicyCache,
    /// Buckets' default encryption (`s3::sse`).
    pub bucket_encryption: crate::s3::policy::ConfigCache<BucketDefault>,
}

/// A connection after its handshake: what hyper serves.
pub trait Conn: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static> Conn for T {}

/// What a handshake hands back: the connection to serve HTTP on.
pub type Handshaken =
    std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Box<dyn Conn>>> + Send>>;

/// A handshake run on each accepted connection before HTTP (TLS). It runs in the
/// connection's own task, within the header timeout, so a slow client holds only itself.
pub trait Handshake: Send + Sync + 'static {
    fn accept(&self, stream: tokio::net::TcpStream) -> Handshaken;
}

/// Faults of the HTTP layer, set by `PUT /_packrat/admin/faults/http` when the server runs with
/// `--fault-injection` (tests only): what a client's retries and resumes are tested against.
#[derive(Default)]
pub struct HttpFaults {
    /// The next this many S3 requests are answered 503 SlowDown.
    pub slowdown: AtomicU64,
    /// The next this many TAR answers (batch GET, epoch streams) are cut...
    pub cuts: AtomicU64,
    /// ...after this many bytes of their body: the connection ends without the rest.
    pub cut_after_bytes: AtomicU64,
}

impl HttpFaults {
    /// Takes one from `counter` if it is not zero.
    pub fn take(counter: &AtomicU64) -> bool {
        counter
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
    }
}

/// A request after routing and authentication, as the S3 handlers see it.
pub struct S3Request {
    pub method: Method,
    pub query: Vec<(String, String)>,
    pub headers: RequestHeaders,
    pub bucket: Option<String>,
    pub key: Option<String>,
    pub body: BodyReader,
    /// `None` for an anonymous request.
    pub identity: Option<Identity>,
    /// The client's address as this server's socket sees it (a proxy's, behind one), and
    /// whether the connection is TLS: bucket policies' `aws:SourceIp` and
    /// `aws:SecureTransport`.
    pub peer: Option<std::net::IpAddr>,
    pub secure: bool,
    /// Whether SSE-C keys may be sent on this connection: over TLS, or anywhere with
    /// `--allow-insecure-sse-c` (test rigs and loopback deployments).
    pub sse_c_allowed: bool,
}

impl S3Request {
    pub fn q(&self, name: &str) -> Option<&str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn has_q(&self, name: &str) -> bool {
        self.query.iter().any(|(k, _)| k == name)
    }

    /// A header's value; `name` is best a `HeaderName` constant, looked up without parsing.
    pub fn header<K: http::header::AsHeaderName>(&self, name: K) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl AppState {
    pub fn new(store: Arc<dyn Store>, config: ServeConfig) -> Self {
        let connections_max = config.max_connections.max(1);
        let wanted =
            config.access_log && tracing::enabled!(target: "packrat::access", tracing::Level::INFO);
        let access_log = match wanted.then(|| crate::access_log::AccessLog::start(config.log_json))
        {
            Some(Ok(log)) => Some(log),
            Some(Err(e)) => {
                tracing::error!(error = %e, "cannot start the access log");
                None
            }
            None => None,
        };
        Self {
            access_log,
            policies: Default::default(),
            bucket_encryption: Default::default(),
            clock: store.clock(),
            metrics: Metrics::new(store.clone()),
            store,
            config,
            signing_keys: Default::default(),
            connections: Arc::new(tokio::sync::Semaphore::new(connections_max)),
            request_counter: AtomicU64::new(0),
            request_id_prefix: rand::random(),
            http_faults: HttpFaults::default(),
            tls: None,
        }
    }

    /// Client connections open now. The semaphore holds at least one permit even when
    /// `--max-connections` is 0, hence the saturating count.
    pub(crate) fn open_connections(&self) -> usize {
        self.config
            .max_connections
            .max(1)
            .saturating_sub(self.connections.available_permits())
    }

    pub(crate) fn next_request_id(&self) -> String {
        let n = self.request_counter.fetch_add(1, Ordering::Relaxed);
        let Ok(low) = u32::try_from(n) else {
            return format!("{:08X}{n:08X}", self.request_id_prefix);
        };
        // Sixteen hex digits without `format!` (a per-request cost in callgrind's count).
        hex::encode_upper(
            ((u64::from(self.request_id_prefix) << 32) | u64::from(low)).to_be_bytes(),
        )
    }
}

/// A bucket's default encryption for writes that ask for none: SSE-S3, or SSE-KMS under the
/// key named (`None`: the store's default key). Cached per bucket in [`AppState`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketDefault {
    S3,
    Kms(Option<String>),
}
