//! packrat on many machines: storage nodes (`packrat node`) hold the objects of their
//! placement groups in their own local stores; stateless gateways (`packrat gateway`) serve S3
//! through [`store::ClusterStore`]; etcd holds the cluster map, buckets and keys
//! ([`map`]); the node that wins an etcd election keeps the chains in step with the live nodes
//! ([`manager`]). See docs/ARCHITECTURE.md, "A cluster".

mod batch;
mod gather;
pub mod manager;
pub mod map;
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
pub const LEASE_SECS: i64 = 4;

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
    serde_json::json!({
        "epoch": map.epoch,
        "pgs": map.pgs,
        "replicas": map.replicas,
        "rereplicate_after_s": map.rereplicate_after_s,
        "pgs_healthy": healthy,
        "pgs_degraded": map.pgs as usize - healthy,
        "nodes": nodes,
        "away": away,
    })
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
pub async fn register(etcd: &Etcd, entry: &NodeEntry) -> Result<i64, String> {
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
    let client = etcd.client.clone();
    tokio::spawn(async move {
        // Renews the lease three times per period. If the lease is lost (etcd was unreachable
        // for longer than the lease), the node is out of its chains: it exits so that a
        // supervisor restarts it, and it rejoins at the tails and catches up.
        let mut client = client;
        loop {
            // Ends only when the lease is gone (Ok) or etcd cannot be reached (Err).
            let kept = async {
                let (mut keeper, mut stream) = client.lease_keep_alive(lease).await?;
                loop {
                    keeper.keep_alive().await?;
                    match stream.message().await? {
                        Some(r) if r.ttl() > 0 => {}
                        _ => return Ok::<(), etcd_client::Error>(()),
                    }
                    tokio::time::sleep(Duration::from_millis(LEASE_SECS as u64 * 1000 / 3)).await;
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

/// Everything a node runs besides its local store: registration, the manager election, the
/// resync of PGs it joins, and the internal API on `listener` until `stop` (with `/metrics`
/// and `/health/*` for operators when `metrics` is given).
#[allow(clippy::too_many_arguments)]
pub async fn run_node(
    etcd: Etcd,
    entry: NodeEntry,
    store: Arc<dyn packrat_store_api::ObjectStore>,
    listener: tokio::net::TcpListener,
    tombstone_keep: Duration,
    lifecycle: node::LifecycleSchedule,
    metrics: Option<MetricsPage>,
    data_dir: Option<&std::path::Path>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let secret = etcd.secret().await?;
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
        secret,
        tombstone_keep,
        metrics,
        held,
    );
    let lease = register(&etcd, &entry).await?;
    tokio::spawn(manager::run(etcd.clone(), lease, entry.id.clone()));
    tokio::spawn(node.clone().resync_loop(etcd.clone()));
    tokio::spawn(node.clone().collect_tombstones());
    tokio::spawn(node.clone().drop_deleted_buckets(etcd.clone()));
    tokio::spawn(node.clone().resend_loop());
    tokio::spawn(node.clone().lifecycle_loop(etcd.clone(), lifecycle));
    node.serve(listener, stop).await;
    // Leave at once rather than when the lease runs out.
    let _ = etcd.client.clone().lease_revoke(lease).await;
    Ok(())
}
