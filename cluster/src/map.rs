//! The cluster map and everything else packrat keeps in etcd.
//!
//! Keys, under one prefix (`/packrat/`):
//!
//! | key | value | written by |
//! |---|---|---|
//! | `map` | [`ClusterMap`] (JSON): epoch, PG count, R, nodes, chains | `cluster init`, the manager |
//! | `secret` | the cluster secret nodes and gateways authenticate with | `cluster init` |
//! | `cluster-id` | the cluster's identity, kept in each node's data directory too | `cluster init` (or the first node of an older cluster) |
//! | `master-key` | the key SSE-S3 data keys are sealed with (hex of 32 bytes) | the first gateway that needs it |
//! | `nodes/<id>` | [`NodeEntry`] (JSON): address, zone, weight, state | the node, `cluster drain` |
//! | `live/<id>` | the node's address, under the node's lease (liveness) | the node |
//! | `synced/<id>/<pg>` | the epoch a node caught up with a PG for | the node |
//! | `reports/<id>/<reporter>` | when `reporter` last found node `id` unreachable (ms), under a 3 s lease | nodes (`node::reports`) |
//! | `stepped-down/<id>` | the node serves nothing: most others cannot reach it, under a 3 s lease | the node |
//! | `manager` | the election whose leader runs [`crate::manager`] | nodes |
//! | `buckets/<name>` | a bucket (JSON) | gateways |
//! | `bucket-seq` | the last bucket id handed out | gateways |
//! | `keys/<access key>` | an access key (JSON) | gateways, `cluster init` |
//! | `console-sessions/<digest>` | the access key a web console session acts as, under a lease of the session's length; the digest is SHA-256 of the browser's token | gateways |
//!
//! Object metadata never goes to etcd: it stays in each node's RocksDB index.

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, DeleteOptions, GetOptions, Txn, TxnOp,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

pub const PREFIX: &str = "/packrat/";

pub fn key(rest: &str) -> String {
    format!("{PREFIX}{rest}")
}

/// The state of a node in the map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Holds PGs when it is alive.
    Active,
    /// Its PGs are moved elsewhere; it keeps serving until they are.
    Draining,
}

/// A storage node as registered in etcd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeEntry {
    pub id: String,
    /// Where its internal API listens (`host:port`).
    pub addr: String,
    pub zone: Option<String>,
    pub weight: f64,
    pub state: NodeState,
    /// When this run of the node started (microseconds): a node that restarted has a new one,
    /// and catches up on all its PGs before it serves reads again (it may have missed writes
    /// while it was away, however briefly).
    #[serde(default)]
    pub incarnation: u64,
    /// The storage classes other than STANDARD this node has a tier for (`--tier`).
    #[serde(default)]
    pub classes: Vec<String>,
    /// Where its S3 read endpoint listens (`http://host:port`, `--s3-listen`), for clients
    /// that read straight from the nodes holding their data (see `routes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<String>,
}

/// Which nodes hold which PG, in chain order (head first), and since when.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterMap {
    /// Bumped by every change; requests carry it and nodes refuse older ones (fencing).
    pub epoch: u64,
    pub pgs: u32,
    pub replicas: usize,
    /// The nodes in the chains, by id.
    pub nodes: BTreeMap<String, NodeEntry>,
    /// One chain per PG.
    pub chains: Vec<Vec<String>>,
    /// Members still catching up, by node: PG -> the epoch at which it joined the chain. They
    /// take writes (at the tail) but serve no reads until they report the resync done.
    #[serde(default)]
    pub syncing: BTreeMap<String, BTreeMap<u32, u64>>,
    /// Nodes gone (their lease lapsed) for less than [`ClusterMap::rereplicate_after_s`],
    /// by id: their chains run a member short meanwhile, and a node that comes back rejoins
    /// them and catches up on what it missed, instead of its replicas being copied whole to
    /// other nodes for a restart or a reboot.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub away: BTreeMap<String, Away>,
    /// Members that stay in a PG's chain only until the members that joined it have caught
    /// up (a drain, a rebalance): they are not part of the placement, and leave when the move
    /// is over.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub leaving: BTreeMap<u32, Vec<String>>,
    /// PGs with no caught-up member, each with the nodes it waits for: the caught-up members
    /// of its chain when it last had any. An acknowledged write is durable on every member of
    /// the chain that took it, so those nodes hold every write the PG acknowledged, and no
    /// other node is known to. Such a PG serves no reads and takes no writes (its copies may
    /// be partial) until one of them is back in its chain; the manager then makes that one
    /// its source again and the others catch up from it. A power cut of every node leaves
    /// every PG here until its members start again (see `manager::next_map`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub waiting: BTreeMap<u32, Vec<String>>,
    /// How long the replicas of a node that is gone wait for it before the manager makes
    /// them on other nodes (`packrat cluster set --rereplicate-after`; 0: at once).
    #[serde(default = "default_rereplicate_after")]
    pub rereplicate_after_s: u64,
}

/// A node that is gone, and the places kept for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Away {
    /// When the manager first found it gone (Unix milliseconds, by that manager's clock; shown
    /// to operators: the grace period itself is an etcd lease, see `manager::away_now`).
    pub since_ms: u64,
    /// The PGs whose chains keep a place for it.
    pub pgs: Vec<u32>,
}

/// Ten minutes, as Ceph waits before it marks a down OSD out: a reboot or an upgrade comes
/// back well within it, and a dead disk or machine is replaced after it.
pub const REREPLICATE_AFTER_S: u64 = 600;

fn default_rereplicate_after() -> u64 {
    REREPLICATE_AFTER_S
}

impl ClusterMap {
    pub fn new(pgs: u32, replicas: usize) -> Self {
        ClusterMap {
            epoch: 1,
            pgs,
            replicas,
            nodes: BTreeMap::new(),
            chains: vec![Vec::new(); pgs as usize],
            syncing: BTreeMap::new(),
            away: BTreeMap::new(),
            leaving: BTreeMap::new(),
            waiting: BTreeMap::new(),
            rereplicate_after_s: REREPLICATE_AFTER_S,
        }
    }

    pub fn chain(&self, pg: u32) -> &[String] {
        self.chains.get(pg as usize).map_or(&[], Vec::as_slice)
    }

    pub fn is_syncing(&self, node: &str, pg: u32) -> bool {
        self.syncing
            .get(node)
            .is_some_and(|pgs| pgs.contains_key(&pg))
    }

    /// The members of a PG's chain that serve reads (caught up), in chain order.
    pub fn readers(&self, pg: u32) -> impl Iterator<Item = &String> {
        self.chain(pg)
            .iter()
            .filter(move |n| !self.is_syncing(n, pg))
    }

    /// The nodes that hold every write `pg` acknowledged: its caught-up members, or, while
    /// it has none, the ones it waits for ([`ClusterMap::waiting`]).
    pub fn holders(&self, pg: u32) -> Vec<String> {
        let readers: Vec<String> = self.readers(pg).cloned().collect();
        if readers.is_empty() {
            self.waiting.get(&pg).cloned().unwrap_or_default()
        } else {
            readers
        }
    }

    /// Members a PG's chain needs to take writes: two (one dead node never leaves a write
    /// with a single copy), or R if R is smaller.
    pub fn write_quorum(&self) -> usize {
        self.replicas.min(2)
    }

    pub fn addr(&self, node: &str) -> Option<&str> {
        self.nodes.get(node).map(|n| n.addr.as_str())
    }
}

/// Where deleted cluster buckets are named (`deleted-buckets/<id>`, the time of the delete
/// in ms), for the nodes to drop what they keep of them, those away now too when they come
/// back: a note stays until every node of the map has ([`DROPPED_BUCKETS`]).
pub const DELETED_BUCKETS: &str = "deleted-buckets/";

/// Which nodes have dropped what they kept of a deleted bucket
/// (`deleted-buckets-done/<id>/<node>`); the marks go with the bucket's note.
pub const DROPPED_BUCKETS: &str = "deleted-buckets-done/";

/// An etcd client with packrat's operations on it.
#[derive(Clone)]
pub struct Etcd {
    pub client: Client,
}

pub type EtcdResult<T> = Result<T, String>;

fn etcd_err(what: &str) -> impl Fn(etcd_client::Error) -> String + '_ {
    move |e| format!("etcd: {what}: {e}")
}

impl Etcd {
    /// Connects to any of `endpoints` (`http://host:port`, comma-separated).
    pub async fn connect(endpoints: &str) -> EtcdResult<Etcd> {
        let urls: Vec<&str> = endpoints
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if urls.is_empty() {
            return Err("no etcd endpoint given (--etcd http://HOST:PORT)".into());
        }
        let options = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(3))
            .with_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(2), Duration::from_secs(3));
        let client = Client::connect(&urls, Some(options))
            .await
            .map_err(|e| format!("cannot reach etcd at {endpoints}: {e}"))?;
        Ok(Etcd { client })
    }

    pub async fn get(&self, rest: &str) -> EtcdResult<Option<(Vec<u8>, i64)>> {
        let resp = self
            .client
            .clone()
            .get(key(rest), None)
            .await
            .map_err(etcd_err(rest))?;
        Ok(resp
            .kvs()
            .first()
            .map(|kv| (kv.value().to_vec(), kv.mod_revision())))
    }

    /// Every key under `PREFIX + rest`, as (key without the prefix, value).
    pub async fn list(&self, rest: &str) -> EtcdResult<Vec<(String, Vec<u8>)>> {
        let resp = self
            .client
            .clone()
            .get(key(rest), Some(GetOptions::new().with_prefix()))
            .await
            .map_err(etcd_err(rest))?;
        Ok(resp
            .kvs()
            .iter()
            .map(|kv| {
                let k = String::from_utf8_lossy(kv.key());
                (
                    k.trim_start_matches(PREFIX).to_string(),
                    kv.value().to_vec(),
                )
            })
            .collect())
    }

    pub async fn put(&self, rest: &str, value: impl Into<Vec<u8>>) -> EtcdResult<()> {
        self.client
            .clone()
            .put(key(rest), value, None)
            .await
            .map_err(etcd_err(rest))?;
        Ok(())
    }

    /// Writes `value` under a new lease of `ttl_s` seconds: the key is gone when it runs out.
    pub async fn put_leased(
        &self,
        rest: &str,
        value: impl Into<Vec<u8>>,
        ttl_s: u64,
    ) -> EtcdResult<()> {
        let mut client = self.client.clone();
        let lease = client
            .lease_grant(i64::try_from(ttl_s).unwrap_or(i64::MAX), None)
            .await
            .map_err(etcd_err(rest))?
            .id();
        client
            .put(
                key(rest),
                value,
                Some(etcd_client::PutOptions::new().with_lease(lease)),
            )
            .await
            .map_err(etcd_err(rest))?;
        Ok(())
    }

    /// The lease a key was written under: seconds granted and seconds left (etcd's count);
    /// `None` if the key is gone or has no lease.
    pub async fn lease_left(&self, rest: &str) -> EtcdResult<Option<(i64, i64)>> {
        let mut client = self.client.clone();
        let resp = client.get(key(rest), None).await.map_err(etcd_err(rest))?;
        let Some(lease) = resp.kvs().first().map(|kv| kv.lease()).filter(|l| *l != 0) else {
            return Ok(None);
        };
        let ttl = client
            .lease_time_to_live(lease, None)
            .await
            .map_err(etcd_err(rest))?;
        Ok((ttl.ttl() > 0).then(|| (ttl.granted_ttl(), ttl.ttl())))
    }

    pub async fn delete(&self, rest: &str) -> EtcdResult<bool> {
        let resp = self
            .client
            .clone()
            .delete(key(rest), None)
            .await
            .map_err(etcd_err(rest))?;
        Ok(resp.deleted() > 0)
    }

    /// Writes `value` if the key is unchanged since `revision` (0: if it does not exist).
    /// `false` if someone else wrote it first.
    pub async fn put_if(&self, rest: &str, revision: i64, value: Vec<u8>) -> EtcdResult<bool> {
        let k = key(rest);
        let cmp = if revision == 0 {
            Compare::version(k.clone(), CompareOp::Equal, 0)
        } else {
            Compare::mod_revision(k.clone(), CompareOp::Equal, revision)
        };
        let txn = Txn::new()
            .when([cmp])
            .and_then([TxnOp::put(k, value, None)]);
        let resp = self.client.clone().txn(txn).await.map_err(etcd_err(rest))?;
        Ok(resp.succeeded())
    }

    /// Deletes the key if it is unchanged since `revision`.
    pub async fn delete_if(&self, rest: &str, revision: i64) -> EtcdResult<bool> {
        let k = key(rest);
        let txn = Txn::new()
            .when([Compare::mod_revision(k.clone(), CompareOp::Equal, revision)])
            .and_then([TxnOp::delete(k, None)]);
        let resp = self.client.clone().txn(txn).await.map_err(etcd_err(rest))?;
        Ok(resp.succeeded())
    }

    /// Deletes bucket record `buckets/<name>` if it is unchanged since `revision`, and in the
    /// same transaction leaves [`DELETED_BUCKETS`]`<id>` with the time (ms), by which nodes
    /// drop what they keep of the bucket (`Node::drop_deleted_buckets`), those away now too
    /// when they come back. `false` if the record changed first.
    pub async fn delete_bucket_record(
        &self,
        name: &str,
        revision: i64,
        id: u64,
        deleted_ms: i64,
    ) -> EtcdResult<bool> {
        let rest = format!("buckets/{name}");
        let k = key(&rest);
        let txn = Txn::new()
            .when([Compare::mod_revision(k.clone(), CompareOp::Equal, revision)])
            .and_then([
                TxnOp::delete(k, None),
                TxnOp::put(
                    key(&format!("{DELETED_BUCKETS}{id}")),
                    deleted_ms.to_string(),
                    None,
                ),
            ]);
        let resp = self
            .client
            .clone()
            .txn(txn)
            .await
            .map_err(etcd_err(&rest))?;
        Ok(resp.succeeded())
    }

    /// The cluster buckets deleted (their ids) and when (ms), as [`Self::delete_bucket_record`]
    /// left them.
    pub async fn deleted_buckets(&self) -> EtcdResult<Vec<(u64, i64)>> {
        Ok(self
            .list(DELETED_BUCKETS)
            .await?
            .iter()
            .filter_map(|(k, v)| {
                let id = k.strip_prefix(DELETED_BUCKETS)?.parse().ok()?;
                let at = std::str::from_utf8(v).ok()?.parse().ok()?;
                Some((id, at))
            })
            .collect())
    }

    /// Every node registered (`nodes/<id>`), alive or not, until `packrat cluster
    /// remove-node` removes it.
    pub async fn registered_nodes(&self) -> EtcdResult<Vec<NodeEntry>> {
        Ok(self
            .list("nodes/")
            .await?
            .iter()
            .filter_map(|(_, v)| serde_json::from_slice(v).ok())
            .collect())
    }

    /// Marks that `node` holds nothing of deleted bucket `id` any more.
    pub async fn mark_bucket_dropped(&self, id: u64, node: &str) -> EtcdResult<()> {
        self.put(&format!("{DROPPED_BUCKETS}{id}/{node}"), Vec::new())
            .await
    }

    /// The nodes that have dropped each deleted bucket, as [`Self::mark_bucket_dropped`]
    /// marked them.
    pub async fn dropped_buckets(&self) -> EtcdResult<HashMap<u64, HashSet<String>>> {
        let mut out: HashMap<u64, HashSet<String>> = HashMap::new();
        for (k, _) in self.list(DROPPED_BUCKETS).await? {
            let Some((id, node)) = k
                .strip_prefix(DROPPED_BUCKETS)
                .and_then(|rest| rest.split_once('/'))
            else {
                continue;
            };
            if let Ok(id) = id.parse() {
                out.entry(id).or_default().insert(node.to_string());
            }
        }
        Ok(out)
    }

    /// Removes deleted bucket `id`'s note and its drop marks, in one transaction: once every
    /// node has dropped what it kept of the bucket.
    pub async fn forget_deleted_bucket(&self, id: u64) -> EtcdResult<()> {
        let rest = format!("{DELETED_BUCKETS}{id}");
        let txn = Txn::new().and_then([
            TxnOp::delete(key(&rest), None),
            TxnOp::delete(
                key(&format!("{DROPPED_BUCKETS}{id}/")),
                Some(DeleteOptions::new().with_prefix()),
            ),
        ]);
        self.client
            .clone()
            .txn(txn)
            .await
            .map_err(etcd_err(&rest))?;
        Ok(())
    }

    /// The cluster map and its revision; an error if the cluster was never initialised.
    pub async fn map(&self) -> EtcdResult<(ClusterMap, i64)> {
        let (value, rev) = self
            .get("map")
            .await?
            .ok_or("no packrat cluster in this etcd: run `packrat cluster init` first")?;
        let map =
            serde_json::from_slice(&value).map_err(|e| format!("etcd: bad cluster map: {e}"))?;
        Ok((map, rev))
    }

    pub async fn secret(&self) -> EtcdResult<String> {
        let (value, _) = self
            .get("secret")
            .await?
            .ok_or("no cluster secret in etcd: run `packrat cluster init` first")?;
        String::from_utf8(value).map_err(|_| "etcd: the cluster secret is not text".into())
    }

    /// The cluster's identity (`cluster-<32 hex digits>`), made by `cluster init`, or by the
    /// first node to start in a cluster made before identities (a transaction: nodes starting
    /// at once agree on one). A node keeps it in its data directory and refuses to serve
    /// another cluster's etcd with that directory.
    pub async fn cluster_id(&self) -> EtcdResult<String> {
        for _ in 0..8 {
            if let Some((value, _)) = self.get("cluster-id").await? {
                return String::from_utf8(value)
                    .map_err(|_| "etcd: the cluster id is not text".into());
            }
            let fresh = format!("cluster-{}", hex::encode(rand::random::<[u8; 16]>()));
            if self
                .put_if("cluster-id", 0, fresh.clone().into_bytes())
                .await?
            {
                return Ok(fresh);
            }
        }
        Err("etcd: the cluster id keeps changing".into())
    }

    /// The cluster's master key: SSE-S3 data keys are sealed with it by every gateway. Made
    /// by the first gateway to start (a transaction, so two gateways starting at once agree
    /// on one key), never replaced afterwards: a new key would leave every SSE-S3 object
    /// unreadable. It lives in etcd, not on the nodes: a node's disks hold only sealed data
    /// keys, so a disk (or a whole node) taken away does not reveal the objects it holds.
    pub async fn master_key(&self) -> EtcdResult<[u8; 32]> {
        for _ in 0..8 {
            if let Some((value, _)) = self.get("master-key").await? {
                let mut key = [0u8; 32];
                return match hex::decode_to_slice(&value, &mut key) {
                    Ok(()) => Ok(key),
                    Err(_) => Err("etcd: the cluster master key is not 64 hex digits".into()),
                };
            }
            let fresh: [u8; 32] = rand::random();
            if self
                .put_if("master-key", 0, hex::encode(fresh).into_bytes())
                .await?
            {
                tracing::info!("made the cluster's master key (SSE-S3)");
                return Ok(fresh);
            }
        }
        Err("etcd: the cluster master key keeps changing".into())
    }

    /// Follows the map: sends every new version on the returned channel. Keeps going through
    /// etcd outages (the last map stays in use meanwhile) until the receiver is dropped.
    pub async fn follow_map(
        &self,
    ) -> EtcdResult<tokio::sync::watch::Receiver<std::sync::Arc<ClusterMap>>> {
        self.follow_map_noting(|_| {}).await
    }

    /// [`Etcd::follow_map`], with `note` called with each new map before it is sent (a node
    /// records the PGs it is given before it serves by them; see `node::held`).
    pub async fn follow_map_noting(
        &self,
        note: impl Fn(&ClusterMap) + Send + Sync + 'static,
    ) -> EtcdResult<tokio::sync::watch::Receiver<std::sync::Arc<ClusterMap>>> {
        let (map, _) = self.map().await?;
        note(&map);
        let (tx, rx) = tokio::sync::watch::channel(std::sync::Arc::new(map));
        let etcd = self.clone();
        tokio::spawn(async move {
            loop {
                if tx.is_closed() {
                    return;
                }
                // A watch from the map's current state; on any error, read it again after a
                // pause (etcd restarting, a compaction) and watch anew.
                let watched = async {
                    let (map, rev) = etcd.map().await?;
                    publish(&tx, map, &note);
                    let mut stream = etcd
                        .client
                        .clone()
                        .watch(
                            key("map"),
                            Some(etcd_client::WatchOptions::new().with_start_revision(rev + 1)),
                        )
                        .await
                        .map_err(etcd_err("watch map"))?;
                    while let Some(resp) = stream.message().await.map_err(etcd_err("watch map"))? {
                        for ev in resp.events() {
                            if let Some(kv) = ev.kv()
                                && let Ok(map) = serde_json::from_slice::<ClusterMap>(kv.value())
                            {
                                publish(&tx, map, &note);
                            }
                        }
                        if tx.is_closed() {
                            return Ok(());
                        }
                    }
                    Ok::<(), String>(())
                };
                if let Err(e) = watched.await {
                    tracing::warn!("following the cluster map: {e}; using the last one meanwhile");
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Ok(rx)
    }
}

/// Sends `map`, noted first, unless what the channel holds is as new (this task is the
/// channel's only sender, so the check holds until the send).
fn publish(
    tx: &tokio::sync::watch::Sender<std::sync::Arc<ClusterMap>>,
    map: ClusterMap,
    note: &impl Fn(&ClusterMap),
) {
    if map.epoch > tx.borrow().epoch {
        note(&map);
        tx.send_replace(std::sync::Arc::new(map));
    }
}

/// A bucket as etcd keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BucketRecord {
    pub id: u64,
    pub name: String,
    pub owner_id: String,
    pub owner_name: String,
    pub created_ms: i64,
    pub public_read: bool,
    #[serde(default)]
    pub lifecycle: Option<Vec<packrat_store_api::lifecycle::Rule>>,
    /// Configuration documents (`BucketConfig`) by name, base64 (the store does not read them).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub configs: std::collections::BTreeMap<String, String>,
    /// Versioning once set (PutBucketVersioning); `None` for a bucket that never had it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versioning: Option<crate::wire::WireVersioning>,
    /// Object Lock once enabled (never disabled; versioning is then enabled for good).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_lock: Option<crate::wire::WireLockConfig>,
}

/// Every bucket in etcd.
pub async fn bucket_records(etcd: &Etcd) -> EtcdResult<Vec<BucketRecord>> {
    Ok(etcd
        .list("buckets/")
        .await?
        .iter()
        .filter_map(|(_, v)| serde_json::from_slice(v).ok())
        .collect())
}

/// A random secret of 32 bytes, hex.
pub fn new_secret() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    hex::encode(b)
}
