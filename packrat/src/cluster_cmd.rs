//! `packrat node`, `packrat gateway` and `packrat cluster`: packrat on many machines (the
//! cluster crate does the work; this is the command line).

use crate::{
    HttpArgs, LogArgs, StorageArgs, listen, open_local, serve_config, serve_s3, start_process,
};
use packrat_cluster::map::{Etcd, NodeEntry, NodeState};
use packrat_store_api::admin::AccessKey;
use std::path::Path;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct NodeArgs {
    /// etcd endpoints, comma-separated (http://HOST:PORT).
    #[arg(long, env = "PACKRAT_ETCD")]
    etcd: String,
    /// Failure domain (rack, room): a PG's replicas go to distinct zones when there are
    /// enough of them.
    #[arg(long, env = "PACKRAT_ZONE")]
    zone: Option<String>,
    /// Relative capacity: a node of weight 2 holds twice the PGs of one of weight 1.
    #[arg(long, env = "PACKRAT_WEIGHT", default_value_t = 1.0)]
    weight: f64,
    /// The address other nodes and gateways reach this node's internal API at (default: the
    /// --listen address, which must then not be a wildcard).
    #[arg(long, env = "PACKRAT_ADVERTISE")]
    advertise: Option<String>,
    /// Address of the internal API (port 0 picks a free port; it is printed).
    #[arg(long, env = "PACKRAT_LISTEN", default_value = "127.0.0.1:9100")]
    listen: std::net::SocketAddr,
    /// Seconds a delete's tombstone is kept. It orders the delete against writes still on
    /// their way down a chain (seconds); a node away for longer learns of the delete when it
    /// catches up, by the object's absence.
    #[arg(long, env = "PACKRAT_TOMBSTONE_KEEP", default_value_t = 600)]
    tombstone_keep: u64,
    /// Apply lifecycle rules as if this many days had passed (tests and previews only).
    #[arg(long, default_value_t = 0, hide = true)]
    lifecycle_days_ahead: u32,
    /// Address of the node's S3 read endpoint (port 0 picks a free port; it is printed):
    /// GetObject, HeadObject and batch GET of the objects this node holds, signed with the
    /// cluster's access keys, for clients that read straight from the nodes holding their
    /// data (`packrat_client`). Off unless given; everything else goes to a gateway.
    #[arg(long, env = "PACKRAT_S3_LISTEN")]
    s3_listen: Option<std::net::SocketAddr>,
    /// The URL clients reach the S3 read endpoint at (default: http:// and the --s3-listen
    /// address, which must then not be a wildcard).
    #[arg(long, env = "PACKRAT_S3_ADVERTISE")]
    s3_advertise: Option<String>,
    /// Region name the S3 read endpoint answers as: the gateways' (clients sign for it).
    #[arg(long, env = "PACKRAT_REGION", default_value = "us-east-1")]
    region: String,
    /// Async runtime threads (default: one per core). Several nodes on one machine each
    /// take their share of its cores.
    #[arg(long, env = "PACKRAT_WORKER_THREADS")]
    pub worker_threads: Option<usize>,
    #[command(flatten)]
    logging: LogArgs,
    #[command(flatten)]
    storage: StorageArgs,
}

#[derive(clap::Args)]
pub struct GatewayArgs {
    /// etcd endpoints, comma-separated (http://HOST:PORT).
    #[arg(long, env = "PACKRAT_ETCD")]
    etcd: String,
    #[command(flatten)]
    pub http: HttpArgs,
}

#[derive(clap::Args)]
pub struct ClusterArgs {
    /// etcd endpoints, comma-separated (http://HOST:PORT).
    #[arg(
        long,
        global = true,
        env = "PACKRAT_ETCD",
        default_value = "http://127.0.0.1:2379"
    )]
    etcd: String,
    #[command(subcommand)]
    command: ClusterCommand,
}

#[derive(clap::Subcommand)]
enum ClusterCommand {
    /// Create a cluster in etcd: its map (PGs, replicas), its secret and the root key
    /// (PACKRAT_ROOT_ACCESS_KEY/PACKRAT_ROOT_SECRET_KEY, generated and printed if unset).
    /// Nodes then join as they start.
    Init {
        /// Placement groups (fixed for the cluster's life; a few hundred per node is right).
        #[arg(long, default_value_t = 1024)]
        pgs: u32,
        /// Copies of every object, on distinct nodes (distinct zones where zones are given).
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// Seconds the replicas of a node that is gone wait for it to come back (a reboot, an
        /// upgrade) before they are made on other nodes; 0 makes them at once.
        #[arg(long, default_value_t = packrat_cluster::map::REREPLICATE_AFTER_S)]
        rereplicate_after: u64,
    },
    /// Change a setting of a running cluster.
    Set {
        /// Seconds the replicas of a node that is gone wait for it before they are made on
        /// other nodes (0: at once). Applies to nodes already gone too.
        #[arg(long)]
        rereplicate_after: u64,
    },
    /// The map: nodes, their PGs and heads, PGs with fewer than R caught-up replicas (JSON).
    Status,
    /// Mark a node draining: its PGs move to the other nodes (watch `status`, or give
    /// --wait), after which it can be stopped and removed.
    Drain {
        node: String,
        /// Wait until the node holds no PG and every PG is caught up, with a progress bar of
        /// the PGs moved off it.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up (exit status 1) after this many seconds.
        #[arg(long, default_value_t = 3600)]
        timeout: u64,
    },
    /// Forget a node that is stopped and holds no PG.
    RemoveNode { node: String },
    /// Placement figures at 10, 100 and 1000 nodes: balance, and data moved when a node is
    /// added or removed (JSON lines).
    Simulate {
        #[arg(long, default_value_t = 4096)]
        pgs: u32,
        #[arg(long, default_value_t = 3)]
        replicas: usize,
    },
}

/// This node's id: kept in its data directory, made on first start.
fn node_id(data_dir: &Path) -> Result<String, String> {
    let path = data_dir.join("node-id");
    match std::fs::read_to_string(&path) {
        Ok(id) if !id.trim().is_empty() => Ok(id.trim().to_string()),
        _ => {
            std::fs::create_dir_all(data_dir)
                .map_err(|e| format!("{}: {e}", data_dir.display()))?;
            let id = format!("node-{}", hex::encode(rand::random::<[u8; 4]>()));
            std::fs::write(&path, &id).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(id)
        }
    }
}

/// Ties the data directory to the cluster whose etcd it is started with: the first start
/// writes the cluster's id into it; a later start against another cluster's etcd is refused.
/// A node in a cluster that is not its own would be given that cluster's PGs and, catching up
/// on them, give up its copies as unknown there.
fn check_cluster(data_dir: &Path, cluster: &str, etcd: &str) -> Result<(), String> {
    let path = data_dir.join("cluster-id");
    match std::fs::read_to_string(&path) {
        Ok(kept) if kept.trim() == cluster => Ok(()),
        Ok(kept) if !kept.trim().is_empty() => Err(format!(
            "{}: this data directory belongs to cluster {}, and the etcd at {etcd} is cluster              {cluster}: not starting (joining another cluster would give up this node's              copies). Give the --etcd of its cluster, or an empty --data-dir to join this one.",
            data_dir.display(),
            kept.trim()
        )),
        _ => {
            std::fs::create_dir_all(data_dir)
                .map_err(|e| format!("{}: {e}", data_dir.display()))?;
            std::fs::write(&path, cluster).map_err(|e| format!("{}: {e}", path.display()))
        }
    }
}

pub async fn node(args: NodeArgs) -> Result<(), String> {
    let stop = start_process(&args.logging)?;
    let etcd = Etcd::connect(&args.etcd).await?;
    let cluster = etcd.cluster_id().await?;
    check_cluster(&args.storage.data_dir, &cluster, &args.etcd)?;
    let id = node_id(&args.storage.data_dir)?;
    // The node's own store keeps a root key of its own that nobody uses: S3 requests never
    // reach a node (its internal API takes only the cluster secret).
    let opened = open_local(&args.storage, None)?;
    let listener =
        listen(args.listen, 4096).map_err(|e| format!("cannot listen on {}: {e}", args.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let advertise = match args.advertise {
        Some(a) => a,
        None if addr.ip().is_unspecified() => {
            return Err(format!(
                "--listen {addr} is a wildcard: give --advertise HOST:PORT, the address others reach this node at"
            ));
        }
        None => addr.to_string(),
    };
    println!("packrat node {id}: listening on http://{addr}");
    tracing::info!(%id, %advertise, "node started");
    // The node and its S3 read endpoint stop together.
    let (stopping, stopped) = tokio::sync::watch::channel(false);
    let signal = async move {
        stop.await;
        let _ = stopping.send(true);
        std::future::pending::<()>().await
    };
    let stop_of = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let (reads, s3) = match args.s3_listen {
        Some(at) => {
            let (listener, config, url) = reads_endpoint(at, args.s3_advertise, &args.region)?;
            println!("packrat node {id}: S3 reads on {url}");
            let stop = stop_of(stopped.clone());
            let serve: packrat_cluster::ReadsEndpoint = Box::new(move |store| {
                Box::pin(async move {
                    let state = Arc::new(packrat_gateway::server::AppState::new(store, config));
                    let drain = std::time::Duration::from_secs(10);
                    if let Err(e) =
                        packrat_gateway::server::serve(listener, state, stop, drain).await
                    {
                        tracing::error!("the S3 read endpoint stopped: {e}");
                    }
                })
            });
            (Some(serve), Some(url))
        }
        None => (None, None),
    };
    let entry = NodeEntry {
        id,
        addr: advertise,
        zone: args.zone,
        weight: args.weight,
        state: NodeState::Active,
        incarnation: chrono::Utc::now().timestamp_micros().max(1) as u64,
        classes: args.storage.tiers.iter().map(|t| t.class.clone()).collect(),
        s3,
    };
    let keep = std::time::Duration::from_secs(args.tombstone_keep);
    // The node applies the buckets' lifecycle rules to the PGs it heads as often as a
    // server's tier worker runs (`--tier-interval`).
    let lifecycle = packrat_cluster::node::LifecycleSchedule {
        every: std::time::Duration::from_secs(args.storage.tier_interval),
        days_ahead: args.lifecycle_days_ahead,
    };
    let store: Arc<dyn packrat_store_api::ReplicaStore> = Arc::new(opened.store);
    // `/metrics` on the node's address: its store's figures, the process's and the node's
    // own (set before each scrape, one scrape at a time).
    let figures = packrat_gateway::metrics::ExtraFigures::default();
    let metrics = packrat_gateway::metrics::Metrics::for_node(store.clone(), figures.clone());
    let one_scrape = std::sync::Mutex::new(());
    let page: packrat_cluster::MetricsPage = Arc::new(move |own| {
        let _one = one_scrape.lock();
        if let Ok(mut f) = figures.lock() {
            *f = own;
        }
        (metrics.render(), packrat_gateway::metrics::CONTENT_TYPE)
    });
    let run = packrat_cluster::run_node(
        etcd,
        entry,
        store,
        listener,
        packrat_cluster::NodeOptions {
            tombstone_keep: keep,
            lifecycle,
            metrics: Some(page),
            data_dir: Some(&args.storage.data_dir),
            reads,
        },
        stop_of(stopped),
    );
    tokio::select! {
        ran = run => ran?,
        _ = signal => {}
    }
    tracing::info!("stopped");
    Ok(())
}

/// A node's S3 read endpoint on `at` (see `--s3-listen`): its listener, its configuration and
/// the URL it is advertised at.
fn reads_endpoint(
    at: std::net::SocketAddr,
    advertise: Option<String>,
    region: &str,
) -> Result<
    (
        tokio::net::TcpListener,
        packrat_gateway::config::ServeConfig,
        String,
    ),
    String,
> {
    let listener = listen(at, packrat_gateway::config::CONNECTIONS_MAX_DEFAULT)
        .map_err(|e| format!("cannot listen on {at}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let url = match advertise {
        Some(u) => u,
        None if bound.ip().is_unspecified() => {
            return Err(format!(
                "--s3-listen {bound} is a wildcard: give --s3-advertise URL, where clients reach it"
            ));
        }
        None => format!("http://{bound}"),
    };
    use packrat_gateway::config as c;
    let config = packrat_gateway::config::ServeConfig {
        data_dir: Default::default(),
        region: region.to_string(),
        domain: None,
        max_connections: c::CONNECTIONS_MAX_DEFAULT,
        body_idle_timeout_secs: c::BODY_IDLE_TIMEOUT_SECS,
        batch_items_max: c::BATCH_ITEMS_MAX_DEFAULT,
        batch_bytes_max: c::BATCH_BYTES_MAX_DEFAULT,
        max_header_bytes: c::REQUEST_HEAD_BYTES_MAX,
        max_headers: c::REQUEST_HEADERS_MAX,
        header_timeout_secs: c::HEADER_READ_TIMEOUT_SECS,
        compact_threshold: 0.5,
        compact_grace_secs: 0,
        fault_injection: false,
        // Reads routed by clients are the data path of training jobs: counted in the
        // endpoint's /metrics, not logged one line each.
        access_log: false,
        log_json: false,
        allow_insecure_sse_c: false,
        default_object_ownership: packrat_gateway::s3::acl::Ownership::BucketOwnerEnforced,
        reads_only: true,
    };
    Ok((listener, config, url))
}

pub async fn gateway(args: GatewayArgs) -> Result<(), String> {
    let stop = start_process(&args.http.logging)?;
    let etcd = Etcd::connect(&args.etcd).await?;
    let store = packrat_cluster::store::ClusterStore::connect(etcd).await?;
    let config = serve_config(&args.http, None);
    tracing::info!(region = %config.region, "packrat gateway started");
    serve_s3(&args.http, store, config, stop).await?;
    tracing::info!("stopped");
    Ok(())
}

pub async fn cluster(args: ClusterArgs) -> Result<(), String> {
    if let ClusterCommand::Simulate { pgs, replicas } = args.command {
        for n in [10, 100, 1000] {
            let f = packrat_cluster::placement::simulate(n, pgs, replicas, 0);
            println!("{}", serde_json::to_string(&f).map_err(|e| e.to_string())?);
        }
        return Ok(());
    }
    let etcd = Etcd::connect(&args.etcd).await?;
    match args.command {
        ClusterCommand::Init {
            pgs,
            replicas,
            rereplicate_after,
        } => {
            if pgs == 0 || replicas == 0 {
                return Err("--pgs and --replicas must be at least 1".into());
            }
            let (access_key, secret_key, generated) = match crate::root_from_env()? {
                Some((ak, sk)) => (ak, sk, false),
                None => (
                    packrat_store::keys::generate_access_key(),
                    packrat_store::keys::generate_secret_key(),
                    true,
                ),
            };
            let root = AccessKey {
                access_key,
                secret_key,
                name: "root".into(),
                owner_id: hex::encode(rand::random::<[u8; 16]>()),
                is_root: true,
                created_ms: chrono::Utc::now().timestamp_millis(),
            };
            packrat_cluster::init(&etcd, pgs, replicas, rereplicate_after, root.clone()).await?;
            println!(
                "cluster created: {pgs} placement groups, {replicas} replicas, a gone node's \
                 replicas made elsewhere after {rereplicate_after} s"
            );
            if generated {
                println!("root credentials (shown this once):");
                println!("  access key: {}", root.access_key);
                println!("  secret key: {}", root.secret_key);
            }
            Ok(())
        }
        ClusterCommand::Set { rereplicate_after } => {
            packrat_cluster::set_rereplicate_after(&etcd, rereplicate_after).await?;
            println!("a gone node's replicas are now made elsewhere after {rereplicate_after} s");
            Ok(())
        }
        ClusterCommand::Status => {
            let (map, _) = etcd.map().await?;
            let mut report = packrat_cluster::status_report(&map);
            // Read only: a cluster made before identities gets one from its first node.
            let id = etcd.get("cluster-id").await?;
            report["cluster_id"] = id
                .map(|(v, _)| String::from_utf8_lossy(&v).into_owned())
                .into();
            // Deleted buckets some node has yet to drop its copies of (one away, say).
            report["deleted_buckets_pending"] = etcd.deleted_buckets().await?.len().into();
            println!(
                "{}",
                serde_json::to_string_pretty(&report).map_err(|e| e.to_string())?
            );
            Ok(())
        }
        ClusterCommand::Drain {
            node,
            wait,
            timeout,
        } => {
            set_state(&etcd, &node, NodeState::Draining).await?;
            if wait {
                wait_drained(&etcd, &node, std::time::Duration::from_secs(timeout)).await?;
            }
            Ok(())
        }
        ClusterCommand::RemoveNode { node } => {
            let (map, _) = etcd.map().await?;
            if map.chains.iter().flatten().any(|n| *n == node) {
                return Err(format!(
                    "{node} still holds PGs: drain it first and wait until `status` shows none"
                ));
            }
            if !etcd.delete(&format!("nodes/{node}")).await? {
                return Err(format!("no node {node}"));
            }
            println!("removed {node}");
            Ok(())
        }
        ClusterCommand::Simulate { .. } => Ok(()),
    }
}

/// Follows a drain with a progress bar until `node` is in no chain and no PG is syncing.
async fn wait_drained(etcd: &Etcd, node: &str, limit: std::time::Duration) -> Result<(), String> {
    let held = |map: &packrat_cluster::map::ClusterMap| {
        map.chains
            .iter()
            .filter(|c| c.iter().any(|n| n == node))
            .count()
    };
    let began = std::time::Instant::now();
    let start = held(&etcd.map().await?.0);
    let bar = indicatif::ProgressBar::new(start.max(1) as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "drain {node} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} PGs moved (eta {{eta}})"
        ))
        .map_err(|e| e.to_string())?,
    );
    loop {
        let (map, _) = etcd.map().await?;
        let now = held(&map);
        let syncing = (0..map.pgs).any(|pg| map.chain(pg).iter().any(|n| map.is_syncing(n, pg)));
        bar.set_position(start.saturating_sub(now) as u64);
        if now == 0 && !syncing {
            bar.finish();
            println!(
                "{node} drained: {start} PGs moved in {:.1} s; it can be stopped and removed",
                began.elapsed().as_secs_f64()
            );
            return Ok(());
        }
        if began.elapsed() > limit {
            bar.abandon();
            return Err(format!(
                "{node} still holds {now} PGs after {} s (is a node down?)",
                limit.as_secs()
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

async fn set_state(etcd: &Etcd, node: &str, state: NodeState) -> Result<(), String> {
    let rest = format!("nodes/{node}");
    let (value, rev) = etcd.get(&rest).await?.ok_or(format!("no node {node}"))?;
    let mut entry: NodeEntry = serde_json::from_slice(&value).map_err(|e| e.to_string())?;
    entry.state = state;
    let value = serde_json::to_vec(&entry).map_err(|e| e.to_string())?;
    if !etcd.put_if(&rest, rev, value).await? {
        return Err(format!("{node} changed meanwhile; try again"));
    }
    println!("{node} is now {state:?}; its PGs move as the manager rebalances");
    Ok(())
}
