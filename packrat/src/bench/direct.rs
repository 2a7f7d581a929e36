//! `packrat bench --direct`: GETs, HEADs and batch GETs sent straight to the storage nodes
//! that hold their keys, by the routes a cluster gateway gives (`GET /BUCKET?routes`, see
//! `packrat_store_api::routes`), as a routing client (`packrat_client`) sends them. A batch
//! is split by node, each part on that node's connection. Nothing falls back to the gateway:
//! what a node does not answer counts as an error.

use super::*;
use packrat_store_api::routes::{RouteMap, pg_of};
use std::collections::HashMap;

/// A bucket's routes, and a client (a signer) per node.
pub(super) struct Direct {
    routes: RouteMap,
    clients: HashMap<String, Arc<Client>>,
}

impl Direct {
    /// Asks the gateway `client` speaks to for the routes of `bucket`.
    pub(super) async fn fetch(
        client: &Client,
        conn: &mut Conn,
        bucket: &str,
    ) -> Result<Direct, String> {
        let o = client
            .request(
                conn,
                Method::GET,
                &format!("/{bucket}"),
                "routes=",
                Bytes::new(),
            )
            .await?;
        if !o.ok {
            return Err(format!(
                "--direct needs a cluster gateway's routes; {} answered {}: {}",
                client.addr,
                o.status,
                String::from_utf8_lossy(&o.body)
            ));
        }
        let routes: RouteMap =
            serde_json::from_slice(&o.body).map_err(|e| format!("the routes: {e}"))?;
        if routes.nodes.is_empty() {
            return Err(
                "no node of the cluster has an S3 read endpoint (packrat node --s3-listen)".into(),
            );
        }
        let mut clients = HashMap::new();
        for (id, url) in &routes.nodes {
            let authority = url
                .strip_prefix("http://")
                .ok_or_else(|| format!("node {id}: --direct speaks http only, not {url}"))?
                .trim_end_matches('/')
                .to_string();
            let signer = Signer {
                host: authority.clone(),
                access_key: client.signer.access_key.clone(),
                region: client.signer.region.clone(),
                key_by_date: std::sync::Mutex::new((String::new(), [0; 32])),
                secret: client.signer.secret.clone(),
            };
            let node = Client {
                addr: authority,
                signer: Arc::new(signer),
            };
            clients.insert(id.clone(), Arc::new(node));
        }
        Ok(Direct { routes, clients })
    }

    /// The node that serves `key`'s reads: the PG's readers take turns by PG, as
    /// `packrat_client` picks them.
    fn node_of(&self, key: &str) -> Result<&str, String> {
        let pg = pg_of(self.routes.bucket_id, key, self.routes.pgs);
        let readers: Vec<&String> = self
            .routes
            .readers
            .get(pg as usize)
            .into_iter()
            .flatten()
            .filter(|n| self.routes.nodes.contains_key(*n))
            .collect();
        readers
            .get(pg as usize % readers.len().max(1))
            .map(|n| n.as_str())
            .ok_or_else(|| format!("no node with a read endpoint serves PG {pg}"))
    }
}

/// A worker's connections, one per node, made as they are first needed.
#[derive(Default)]
pub(super) struct Conns(HashMap<String, Conn>);

impl Conns {
    /// The client and connection for the node serving `key`.
    pub(super) async fn to<'a>(
        &'a mut self,
        d: &'a Direct,
        key: &str,
    ) -> Result<(&'a Arc<Client>, &'a mut Conn), String> {
        let node = d.node_of(key)?;
        let client = &d.clients[node];
        if !self.0.contains_key(node) {
            let conn = connect(&client.addr).await?;
            self.0.insert(node.to_string(), conn);
        }
        let conn = self.0.get_mut(node).ok_or("no connection")?;
        Ok((client, conn))
    }

    /// A batch GET of `keys` split by node, each part sent to its node in turn: the outcome
    /// (every part whole), the samples and their bytes.
    pub(super) async fn batch(
        &mut self,
        d: &Direct,
        args: &BenchArgs,
        keys: &[String],
    ) -> Result<(bool, u64, u64), String> {
        let mut parts: HashMap<&str, Vec<&str>> = HashMap::new();
        for k in keys {
            parts.entry(d.node_of(k)?).or_default().push(k);
        }
        let (mut ok, mut samples, mut bytes) = (true, 0, 0);
        for part in parts.values() {
            let body = batch_body(part, &args.batch_order);
            let (client, conn) = self.to(d, part[0]).await?;
            let o = client.batch(conn, &args.bucket, body).await?;
            ok &= o.ok && o.samples == part.len() as u64 && o.sample_errors == 0;
            samples += o.samples;
            bytes += o.sample_bytes;
        }
        Ok((ok, samples, bytes))
    }
}
