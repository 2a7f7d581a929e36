//! packrat on many machines: storage nodes (`packrat node`) hold the objects of their
//! placement groups in their own local stores; stateless gateways (`packrat gateway`) serve S3
//! through [`store::ClusterStore`]; etcd holds the cluster map, buckets and keys
//! ([`map`]); the node that wins an etcd election keeps the chains in step with the live nodes
//! ([`manager`]). See docs/ARCHITECTURE.md, "A cluster".

mod gather;
pub mod manager;
pub mod map;
mod misses;
pub mod mux;
pub mod node;
pub mod placement;
pub mod relay;
pub mod store;
pub mod wire;

use map::{ClusterMap, Etcd, NodeEntry, NodeState};
use std::sync::Arc;
use std::time::Duration;

/// A node's lease: a node that has not renewed it for this long is taken out of its chains.
/// With the manager's half-second rounds, writes to its PGs wait at most about this long.
pub const LEASE_SECS: i64 = 5;
/// How often a node renews its lease: ten times a lease, so that an etcd restart of a few
/// seconds, or a renewal lost, comes nowhere near the fence time.
const RENEW_EVERY: Duration = Duration::from_millis(500);

/// How long a node keeps serving after the last lease renewal etcd confirmed, counted from
/// when that renewal was sent: a second short of the lease. etcd counts a lease from when the
/// renewal arrived, which is later, and the manager moves a node's PGs only once etcd has let
/// its lease lapse; so a node cut off from etcd stops reads and chain writes at least a second
/// before its PGs can be handed to others (a quarter of the lease: room for clocks that run
/// at different rates, and for a request under way). With renewals every half second, an etcd
/// outage of up to three and a half seconds (a restart) fences nothing.
pub const FENCE_MS: u64 = LEASE_SECS as u64 * 1000 - 1000;
/// A renewal not answered within this long is tried again on a new connection.
const RENEW_TIMEOUT: Duration = Duration::from_millis(1000);

/// When this node's lease was last known alive (see [`FENCE_MS`]): read on every request.
pub struct LeaseClock {
    start: std::time::Instant,
    /// When the last confirmed renewal was sent, in ms since `start`.
    renewed_ms: std::sync::atomic::AtomicU64,
}

impl Default for LeaseClock {
    /// Alive as of now (a node serves nothing before it registers).
    fn default() -> Self {
        LeaseClock {
            start: std::time::Instant::now(),
            renewed_ms: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl LeaseClock {
    fn ms_at(&self, t: std::time::Instant) -> u64 {
        t.saturating_duration_since(self.start).as_millis() as u64
    }

    /// etcd confirmed a renewal sent at `sent`.
    pub fn renewed(&self, sent: std::time::Instant) {
        self.renewed_ms
            .fetch_max(self.ms_at(sent), std::sync::atomic::Ordering::Relaxed);
    }

    /// How long since the last confirmed renewal was sent, if that is past the fence time:
    /// the lease may be about to lapse, and the node must not serve.
    pub fn fenced(&self) -> Option<Duration> {
        let since = self
            .ms_at(std::time::Instant::now())
            .saturating_sub(self.renewed_ms.load(std::sync::atomic::Ordering::Relaxed));
        (since > FENCE_MS).then(|| Duration::from_millis(since))
    }
}

/// The map as `packrat cluster status` and the admin status show it.
pub fn status_report(map: &ClusterMap) -> serde_json::Value {
    let mut per_node: std::collections::BTreeMap<&str, (usize, usize, usize)> = map
        .nodes
        .keys()
        .map(|id| (id.as_str(), (0, 0, 0)))
        .collect();
    let healthy = pgs_healthy(map);
    for (pg, chain) in map.chains.iter().enumerate() {
        for (i, id) in chain.iter().enumerate() {
            let e = per_node.entry(id.as_str()).or_default();
            e.0 += 1;
            if i == 0 {
                e.1 += 1;
            }
            if map.is_syncing(id, pg as u32) {
                e.2 += 1;
            }
        }
    }
    let nodes: Vec<serde_json::Value> = per_node
        .iter()
        .map(|(id, (pgs, heads, syncing))| {
            let n = map.nodes.get(*id);
            serde_json::json!({
                "id": id,
                "addr": n.map(|n| n.addr.clone()),
                "zone": n.and_then(|n| n.zone.clone()),
                "state": n.map(|n| n.state),
                // When the run of the node that the map knows started (Unix ms): after a
                // restart, a newer one shows that the manager has taken the restart in.
                "started_ms": n.map(|n| n.incarnation / 1000),
                "pgs": pgs,
                "heads": heads,
                "syncing": syncing,
            })
        })
        .collect();
    let now_ms = now_ms();
    let grace_ms = map.rereplicate_after_s.saturating_mul(1000);
    let away: Vec<serde_json::Value> = map
        .away
        .iter()
        .map(|(id, a)| {
            let gone_ms = now_ms.saturating_sub(a.since_ms);
            serde_json::json!({
                "id": id,
                "pgs_kept": a.pgs.len(),
                "gone_s": gone_ms / 1000,
                "rereplicated_in_s": grace_ms.saturating_sub(gone_ms).div_ceil(1000),
            })
        })
        .collect();
    // PGs that wait for former caught-up members to come back (see `ClusterMap::waiting`):
    // they serve nothing until one does.
    let waiting: Vec<serde_json::Value> = map
        .waiting
        .iter()
        .map(|(pg, ids)| serde_json::json!({"pg": pg, "waiting_for": ids}))
        .collect();
    serde_json::json!({
        "epoch": map.epoch,
        "pgs": map.pgs,
        "replicas": map.replicas,
        "rereplicate_after_s": map.rereplicate_after_s,
        "pgs_healthy": healthy,
        "pgs_degraded": map.pgs as usize - healthy,
        "nodes": nodes,
        "away": away,
        "pgs_waiting": waiting,
        "waited_for": waited_for(map),
    })
}

/// The nodes PGs wait for (see `ClusterMap::waiting`), each with how many PGs wait for it.
fn waited_for(map: &ClusterMap) -> std::collections::BTreeMap<String, u64> {
    let mut counts = std::collections::BTreeMap::new();
    for id in map.waiting.values().flatten() {
        *counts.entry(id.clone()).or_default() += 1;
    }
    counts
}

/// Wall-clock time, Unix milliseconds (when a node was found gone, see [`map::Away`]).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// PGs with R caught-up members.
fn pgs_healthy(map: &ClusterMap) -> usize {
    (0..map.pgs)
        .filter(|pg| {
            let chain = map.chain(*pg);
            chain.len() == map.replicas && map.readers(*pg).count() == chain.len()
        })
        .count()
}

/// The map's figures for a gateway's `/metrics`: what an operator alerts on (degraded PGs,
/// nodes away) and follows (the epoch, replicas catching up).
pub fn map_metrics(map: &ClusterMap) -> Vec<packrat_store_api::admin::Metric> {
    use packrat_store_api::admin::Metric;
    let syncing: usize = map.syncing.values().map(|pgs| pgs.len()).sum();
    vec![
        Metric::gauge(
            "packrat_cluster_map_epoch",
            "Epoch of the cluster map this gateway routes by.",
            map.epoch,
        ),
        Metric::gauge(
            "packrat_cluster_pgs",
            "Placement groups of the cluster.",
            u64::from(map.pgs),
        ),
        Metric::gauge(
            "packrat_cluster_pgs_degraded",
            "Placement groups with fewer than R caught-up replicas.",
            (map.pgs as usize - pgs_healthy(map)) as u64,
        ),
        Metric::gauge(
            "packrat_cluster_nodes",
            "Storage nodes in the chains.",
            map.nodes.len() as u64,
        ),
        Metric::gauge(
            "packrat_cluster_nodes_away",
            "Storage nodes gone whose places are kept for them (rereplicate_after_s).",
            map.away.len() as u64,
        ),
        Metric::gauge(
            "packrat_cluster_pgs_waiting",
            "Placement groups with no caught-up member, waiting for one of the nodes that hold all their writes to come back (they serve nothing meanwhile).",
            map.waiting.len() as u64,
        ),
        Metric::gauge_by(
            "packrat_cluster_pgs_waiting_for",
            "Placement groups waiting for this node to come back: it holds all their acknowledged writes.",
            "node",
            waited_for(map).into_iter().collect(),
        ),
        Metric::gauge(
            "packrat_cluster_replicas_syncing",
            "Replicas catching up (they take writes but serve no reads yet).",
            syncing as u64,
        ),
    ]
}

/// Writes a new cluster's map, secret and root key into etcd; refuses if one exists.
pub async fn init(
    etcd: &Etcd,
    pgs: u32,
    replicas: usize,
    rereplicate_after_s: u64,
    root: packrat_store_api::admin::AccessKey,
) -> Result<(), String> {
    let mut map = ClusterMap::new(pgs, replicas);
    map.rereplicate_after_s = rereplicate_after_s;
    let value = serde_json::to_vec(&map).map_err(|e| e.to_string())?;
    if !etcd.put_if("map", 0, value).await? {
        return Err(
            "this etcd already holds a packrat cluster (see `packrat cluster status`)".into(),
        );
    }
    etcd.put("secret", map::new_secret()).await?;
    etcd.cluster_id().await?;
    store::put_key(etcd, &root)
        .await
        .map_err(|e| e.to_string())?;
    Ok(())
}

/// Sets how long a gone node's replicas wait for it (see [`ClusterMap::away`]). The map keeps
/// its epoch: nothing is fenced, and only the manager reads the setting. The nodes away now
/// get it too: each one's grace period (an etcd lease, see `manager::away_now`) is taken again
/// for what the new setting leaves of it, by etcd's count of the time gone, or dropped if
/// nothing is left.
pub async fn set_rereplicate_after(etcd: &Etcd, seconds: u64) -> Result<(), String> {
    for _ in 0..20 {
        let (mut map, rev) = etcd.map().await?;
        map.rereplicate_after_s = seconds;
        let value = serde_json::to_vec(&map).map_err(|e| e.to_string())?;
        if etcd.put_if("map", rev, value).await? {
            for id in map.away.keys() {
                let name = format!("away/{id}");
                let Some((granted, left)) = etcd.lease_left(&name).await? else {
                    continue;
                };
                let gone = u64::try_from(granted - left).unwrap_or(0);
                match seconds.checked_sub(gone).filter(|s| *s > 0) {
                    Some(rest) => etcd.put_leased(&name, now_ms().to_string(), rest).await?,
                    None => {
                        etcd.delete(&name).await?;
                    }
                }
            }
            return Ok(());
        }
        // The manager wrote the map meanwhile: read it again.
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err("the cluster map keeps changing; try again".into())
}

/// A running node's registration: its entry in `nodes/`, and `live/` under a lease kept alive
/// in the background. Returns the lease id (the node campaigns for manager with it).
pub async fn register(
    etcd: &Etcd,
    entry: &NodeEntry,
    clock: Arc<LeaseClock>,
) -> Result<i64, String> {
    // A node keeps the state an operator gave it (draining) across restarts.
    let state = match etcd.get(&format!("nodes/{}", entry.id)).await? {
        Some((v, _)) => serde_json::from_slice::<NodeEntry>(&v)
            .map(|e| e.state)
            .unwrap_or(NodeState::Active),
        None => NodeState::Active,
    };
    let mut entry = entry.clone();
    entry.state = state;
    etcd.put(
        &format!("nodes/{}", entry.id),
        serde_json::to_vec(&entry).map_err(|e| e.to_string())?,
    )
    .await?;
    let granted_at = std::time::Instant::now();
    let lease = etcd
        .client
        .clone()
        .lease_grant(LEASE_SECS, None)
        .await
        .map_err(|e| format!("etcd: lease: {e}"))?
        .id();
    etcd.client
        .clone()
        .put(
            map::key(&format!("live/{}", entry.id)),
            entry.addr.clone(),
            Some(etcd_client::PutOptions::new().with_lease(lease)),
        )
        .await
        .map_err(|e| format!("etcd: live key: {e}"))?;
    clock.renewed(granted_at);
    let client = etcd.client.clone();
    tokio::spawn(async move {
        // Renews the lease every `RENEW_EVERY`, noting each renewal etcd confirms (the
        // node serves only while the last one is recent: see `FENCE_MS`). If the lease is lost
        // (etcd was unreachable for longer than the lease), the node is out of its chains: it
        // exits so that a supervisor restarts it, and it rejoins at the tails and catches up.
        let mut client = client;
        loop {
            // Ends only when the lease is gone (Ok) or etcd cannot be reached in time (Err).
            let kept = async {
                let (mut keeper, mut stream) = match client.lease_keep_alive(lease).await {
                    Ok(kept) => kept,
                    // The client's own word for a first answer of TTL 0: etcd let the lease
                    // lapse (it was unreachable, or stopped, for longer than the lease).
                    Err(etcd_client::Error::LeaseKeepAliveError(e)) if e == "lease not found" => {
                        return Ok(());
                    }
                    Err(e) => return Err(e.to_string()),
                };
                loop {
                    let sent = std::time::Instant::now();
                    let answer = tokio::time::timeout(RENEW_TIMEOUT, async {
                        keeper.keep_alive().await?;
                        stream.message().await
                    })
                    .await
                    .map_err(|_| "no answer in time".to_string())?
                    .map_err(|e| e.to_string())?;
                    match answer {
                        Some(r) if r.ttl() > 0 => clock.renewed(sent),
                        _ => return Ok::<(), String>(()),
                    }
                    tokio::time::sleep(RENEW_EVERY).await;
                }
            };
            match kept.await {
                Ok(()) => {
                    tracing::error!("this node's etcd lease expired; exiting so that it rejoins");
                    std::process::exit(3);
                }
                Err(e) => {
                    tracing::warn!("etcd lease renewal: {e}");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    });
    Ok(lease)
}

/// Renders a node's `/metrics` page (its local store's figures, the process's, the build's)
/// with the node's own figures given (see `Node::figures`): the text and its content type.
pub type MetricsPage =
    Arc<dyn Fn(Vec<packrat_store_api::admin::Metric>) -> (String, &'static str) + Send + Sync>;

/// How a node runs, besides what it is, what it stores in and where it listens.
pub struct NodeOptions<'a> {
    /// How long a delete's tombstone is kept: it orders the delete against writes still on
    /// their way down a chain.
    pub tombstone_keep: Duration,
    /// When the node applies lifecycle rules to the PGs it heads.
    pub lifecycle: node::LifecycleSchedule,
    /// The `/metrics` page for operators (with `/health/*`), if any.
    pub metrics: Option<MetricsPage>,
    /// The node's data directory, where it keeps which PGs it holds (see `node::held`).
    pub data_dir: Option<&'a std::path::Path>,
    /// The node's S3 read endpoint, if it has one (`packrat node --s3-listen`).
    pub reads: Option<ReadsEndpoint>,
}

/// A node's S3 read endpoint: given the store it reads through (a [`store::ClusterStore`]
/// beside the node, see [`store::Beside`]), the future that serves it until the node stops.
pub type ReadsEndpoint = Box<
    dyn FnOnce(Arc<store::ClusterStore>) -> futures_util::future::BoxFuture<'static, ()> + Send,
>;

/// Everything a node runs besides its local store: registration, the manager election, the
/// resync of PGs it joins, and the internal API on `listener` until `stop` (with `/metrics`
/// and `/health/*` for operators when `options.metrics` is given).
pub async fn run_node(
    etcd: Etcd,
    entry: NodeEntry,
    store: Arc<dyn packrat_store_api::ReplicaStore>,
    listener: tokio::net::TcpListener,
    options: NodeOptions<'_>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let NodeOptions {
        tombstone_keep,
        lifecycle,
        metrics,
        data_dir,
        reads,
    } = options;
    let trust = Trust::of(&etcd).await?;
    // The PGs this node may hold copies of, from `data_dir` (see `node::held`); a store with
    // no cluster bucket yet holds none.
    let fresh = store
        .list_buckets()
        .await
        .map_err(|e| format!("listing the local buckets: {e}"))?
        .iter()
        .all(|b| node::cluster_bucket_of(&b.name).is_none());
    let held = Arc::new(node::held::HeldPgs::load(data_dir, fresh));
    let map = etcd
        .follow_map_noting({
            let (held, id) = (held.clone(), entry.id.clone());
            move |map| held.note_map(map, &id)
        })
        .await?;
    let node = node::Node::new(
        entry.id.clone(),
        store,
        map,
        trust,
        tombstone_keep,
        metrics,
        held,
    );
    node.set_incarnation(entry.incarnation);
    let lease = register(&etcd, &entry, node.lease_clock()).await?;
    tokio::spawn(manager::run(etcd.clone(), lease, entry.id.clone()));
    tokio::spawn(node.clone().resync_loop(etcd.clone()));
    tokio::spawn(node.clone().collect_tombstones());
    tokio::spawn(node.clone().drop_deleted_buckets(etcd.clone()));
    tokio::spawn(node.clone().resend_loop());
    tokio::spawn(node.clone().report_loop(etcd.clone()));
    tokio::spawn(node.clone().lifecycle_loop(etcd.clone(), lifecycle));
    let reads = match reads {
        Some(serve) => {
            let beside = store::Beside {
                id: entry.id.clone(),
                addr: entry.addr.clone(),
                handler: node.in_process(),
                reads: node.near_reads(),
                batches: node.near_batches(),
            };
            let store = store::ClusterStore::connect_beside(etcd.clone(), beside).await?;
            Some(tokio::spawn(serve(store)))
        }
        None => None,
    };
    node.serve(listener, stop).await;
    if let Some(served) = reads {
        let _ = served.await;
    }
    // Leave at once rather than when the lease runs out.
    let _ = etcd.client.clone().lease_revoke(lease).await;
    Ok(())
}

/// Whether `node` is cut off from the rest of the cluster (see `node::reports`): reported
/// unreachable by more than half of the other live nodes, none of which is itself so
/// reported. Two nodes cut from each other report each other: neither steps down.
pub fn cut_off(
    node: &str,
    live: &std::collections::BTreeSet<String>,
    reports: &std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
) -> bool {
    let by_most = |id: &str| {
        let others = live.iter().filter(|n| *n != id).count();
        let reporters = reports.get(id).map_or(0, |r| {
            r.iter().filter(|n| *n != id && live.contains(*n)).count()
        });
        others > 0 && reporters * 2 > others
    };
    by_most(node)
        && !reports
            .get(node)
            .is_some_and(|r| r.iter().any(|n| live.contains(n) && by_most(n)))
}

/// What a process shows on the internal connections to prove it belongs to the cluster: the
/// cluster's secret (random, made by `cluster init`) and its identity (`cluster-<hex>`), both
/// read from etcd. A multiplexed connection (`mux`) is refused when either is wrong, so a
/// process pointed at another cluster's node (a copied configuration, a reused address) is
/// told which cluster it reached rather than mistaken for a member.
#[derive(Clone, Debug)]
pub struct Trust {
    pub secret: String,
    pub cluster: String,
}

impl Trust {
    pub async fn of(etcd: &map::Etcd) -> Result<Trust, String> {
        Ok(Trust {
            secret: etcd.secret().await?,
            cluster: etcd.cluster_id().await?,
        })
    }
}

/// Whether `a` and `b` are equal, in time that depends on their length only (secrets).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_most_others_cannot_reach_is_cut_off_and_two_cut_from_each_other_are_not() {
        let set = |v: &[&str]| -> std::collections::BTreeSet<String> {
            v.iter().map(|s| s.to_string()).collect()
        };
        let reports = |v: &[(&str, &[&str])]| {
            v.iter()
                .map(|(s, r)| (s.to_string(), set(r)))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        let three = set(&["a", "b", "c"]);
        // b cut off from a and c (not from etcd): they report it, it reports them.
        let b_cut = reports(&[("b", &["a", "c"]), ("a", &["b"]), ("c", &["b"])]);
        assert!(cut_off("b", &three, &b_cut));
        assert!(!cut_off("a", &three, &b_cut) && !cut_off("c", &three, &b_cut));
        // One reporter of three is not most.
        assert!(!cut_off("b", &three, &reports(&[("b", &["a"])])));
        // A link cut between a and b, both reaching c: neither.
        let link = reports(&[("a", &["b"]), ("b", &["a"])]);
        assert!(!cut_off("a", &three, &link) && !cut_off("b", &three, &link));
        // Two nodes cut from each other: neither steps down.
        let two = set(&["a", "b"]);
        assert!(!cut_off("a", &two, &link) && !cut_off("b", &two, &link));
        // Reports from nodes no longer live do not count; a lone node is never cut off.
        assert!(!cut_off("b", &three, &reports(&[("b", &["a", "x"])])));
        assert!(!cut_off("a", &set(&["a"]), &reports(&[("a", &["x"])])));
        // Four nodes: two of the three others are most.
        let four = set(&["a", "b", "c", "d"]);
        assert!(cut_off("d", &four, &reports(&[("d", &["a", "b"])])));
    }

    #[test]
    fn a_node_is_fenced_once_its_last_confirmed_renewal_is_older_than_the_fence_time() {
        let clock = LeaseClock::default();
        assert_eq!(clock.fenced(), None, "alive as it starts");
        let Some(long_ago) = std::time::Instant::now().checked_sub(Duration::from_secs(30)) else {
            return; // a machine up for less than 30 s: nothing to go back to
        };
        let old = LeaseClock {
            start: long_ago,
            renewed_ms: std::sync::atomic::AtomicU64::new(0),
        };
        let since = old.fenced().expect("30 s without a renewal fences");
        assert!(since >= Duration::from_secs(30));
        // A renewal sent just past the fence time ago, confirmed only now, still fences:
        // the lease is counted from when it was sent.
        old.renewed(std::time::Instant::now() - Duration::from_millis(FENCE_MS + 200));
        assert!(old.fenced().is_some());
        old.renewed(std::time::Instant::now() - Duration::from_millis(FENCE_MS - 500));
        assert_eq!(old.fenced(), None);
        // An older confirmation arriving late never moves it back.
        old.renewed(long_ago);
        assert_eq!(old.fenced(), None);
        assert!(FENCE_MS < LEASE_SECS as u64 * 1000);
    }
}
