//! `packrat`: the S3-compatible object store for machine-learning data.
//!
//! The launcher: `packrat serve` runs the gateway, index and chunk store in one process;
//! `packrat node` and `packrat gateway` run a cluster's parts (`cluster_cmd`); `packrat admin`
//! manages a running server (or, with `--data-dir`, a stopped one); `packrat bench` is a load
//! generator. The S3 layer itself is the `packrat-gateway` library.

mod admin_client;
mod bench;
mod cluster_cmd;
mod config_file;
mod tls;

use packrat_gateway::{admin, config, server};

use clap::{CommandFactory, FromArgMatches, Subcommand};
use config::ServeConfig;
use http::Method;
use packrat_chunk_store::{IoBackend, SEGMENT_BYTES_DEFAULT};
use packrat_index::RocksIndex;
use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::SystemClock;
use packrat_store_api::admin::{AccessKey, NewKey};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

/// mimalloc instead of glibc malloc: profiles of the small-object GET path showed glibc's
/// malloc and free at about a tenth of the server's CPU time.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// No transparent huge pages for this process. The allocator hands freed memory back to the
/// system and takes fresh memory again as requests come and go; with huge pages every such
/// fault zeroed 2 MiB, which profiles of batch GETs of 4 KiB samples showed at 3 to 5% of the
/// server's CPU (and 30% more resident memory). With 4 KiB pages only what is touched is
/// zeroed. Best effort: a kernel without the control keeps its default.
fn no_huge_pages() {
    // SAFETY: prctl with PR_SET_THP_DISABLE takes plain integers and touches no memory of ours.
    let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
}

#[derive(clap::Parser)]
#[command(
    name = "packrat",
    version,
    about = "An S3-compatible object store for machine-learning data"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the S3 server (gateway, index and chunk store in one process).
    Serve(ServeArgs),
    /// Administer a server: access keys.
    Admin(AdminArgs),
    /// Run a storage node of a cluster (its objects, its disks, an internal API).
    Node(cluster_cmd::NodeArgs),
    /// Run a stateless S3 gateway in front of a cluster's storage nodes.
    Gateway(cluster_cmd::GatewayArgs),
    /// A cluster's map and levers: init, status, placement simulation.
    Cluster(cluster_cmd::ClusterArgs),
    /// Load an S3 endpoint (packrat or any other) and report ops/s, MB/s and latency.
    Bench(bench::BenchArgs),
    /// The configuration file: print one with every flag and its default.
    Config(ConfigArgs),
}

#[derive(clap::Args)]
struct ConfigArgs {
    #[command(subcommand)]
    command: ConfigCommand,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print a configuration file holding every flag of a server command with its default
    /// (flags without one are commented out).
    PrintDefault {
        /// The command the file is for.
        #[arg(default_value = "serve", value_parser = config_file::SERVER_COMMANDS)]
        command: String,
    },
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum IoBackendArg {
    Auto,
    Uring,
    Pread,
}

#[derive(clap::Args)]
struct ServeArgs {
    #[command(flatten)]
    http: HttpArgs,
    #[command(flatten)]
    storage: StorageArgs,
}

/// How the S3 side listens and what it allows (`serve` and `gateway`).
#[derive(clap::Args)]
struct HttpArgs {
    /// Address to listen on. Port 0 picks a free port (the address is printed).
    #[arg(long, env = "PACKRAT_LISTEN", default_value = "127.0.0.1:9000")]
    listen: SocketAddr,
    /// Region name the server answers as; clients must sign for this region.
    #[arg(long, env = "PACKRAT_REGION", default_value = "us-east-1")]
    region: String,
    /// Domain for virtual-host style addressing: requests to BUCKET.DOMAIN select BUCKET.
    /// Path-style addressing always works.
    #[arg(long, env = "PACKRAT_DOMAIN")]
    domain: Option<String>,
    /// Most client connections open at once; more are answered 503 SlowDown and closed.
    #[arg(long, env = "PACKRAT_MAX_CONNECTIONS", default_value_t = config::CONNECTIONS_MAX_DEFAULT)]
    max_connections: usize,
    /// Seconds a client may pause while sending a request body before the request fails
    /// with RequestTimeout (slow clients cannot hold connections forever).
    #[arg(long, env = "PACKRAT_BODY_IDLE_TIMEOUT", default_value_t = config::BODY_IDLE_TIMEOUT_SECS)]
    body_idle_timeout: u64,
    /// Largest request head (request line and headers) in bytes; larger heads get 431.
    #[arg(long, env = "PACKRAT_MAX_HEADER_BYTES", default_value_t = config::REQUEST_HEAD_BYTES_MAX)]
    max_header_bytes: usize,
    /// Most headers in one request; more get 431.
    #[arg(long, env = "PACKRAT_MAX_HEADERS", default_value_t = config::REQUEST_HEADERS_MAX)]
    max_headers: usize,
    /// Seconds a client has to send a request head (slowloris protection); also the longest a
    /// keep-alive connection may wait idle for its next request.
    #[arg(long, env = "PACKRAT_HEADER_TIMEOUT", default_value_t = config::HEADER_READ_TIMEOUT_SECS)]
    header_timeout: u64,
    /// On SIGTERM or SIGINT, seconds that requests under way may take to finish before their
    /// connections are cut (no new connection is accepted meanwhile).
    #[arg(long, env = "PACKRAT_SHUTDOWN_TIMEOUT", default_value_t = 30)]
    shutdown_timeout: u64,
    /// Most items in one batch GET (and members in one TAR extracted by batch PUT).
    #[arg(long, env = "PACKRAT_BATCH_ITEMS_MAX", default_value_t = config::BATCH_ITEMS_MAX_DEFAULT)]
    batch_items_max: usize,
    /// Most bytes one batch GET may ask for.
    #[arg(long, env = "PACKRAT_BATCH_BYTES_MAX", default_value_t = config::BATCH_BYTES_MAX_DEFAULT)]
    batch_bytes_max: u64,
    /// Async runtime threads (default: one per core).
    #[arg(long, env = "PACKRAT_WORKER_THREADS")]
    worker_threads: Option<usize>,
    #[command(flatten)]
    logging: LogArgs,
    /// No access log line per request (they are logged at info on the `packrat::access`
    /// target otherwise).
    #[arg(long, env = "PACKRAT_NO_ACCESS_LOG")]
    no_access_log: bool,
    /// Accept SSE-C keys (customer-provided encryption keys) over plain HTTP. S3 refuses them
    /// without TLS, as packrat does by default: a key sent in clear text is a key disclosed.
    /// For test rigs and loopback-only deployments.
    #[arg(long, env = "PACKRAT_ALLOW_INSECURE_SSE_C")]
    allow_insecure_sse_c: bool,
    /// Object Ownership of buckets created without `x-amz-object-ownership`:
    /// BucketOwnerEnforced (ACLs disabled, as AWS today), or ObjectWriter / BucketOwnerPreferred
    /// (objects carry ACLs, as Ceph's gateway and older S3) for clients that rely on them.
    #[arg(long, env = "PACKRAT_DEFAULT_OBJECT_OWNERSHIP", default_value = "BucketOwnerEnforced", value_parser = parse_ownership)]
    default_object_ownership: packrat_gateway::s3::acl::Ownership,
    /// TLS certificate chain (PEM) to serve https with; needs --tls-key. SIGHUP reloads both.
    #[arg(long, env = "PACKRAT_TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// TLS private key (PEM) of --tls-cert.
    #[arg(long, env = "PACKRAT_TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// Where logs go and how they look, and the configuration file (every server process).
#[derive(clap::Args)]
struct LogArgs {
    /// TOML file of settings: keys are these flags without their dashes (see
    /// `packrat config print-default`). Flags and environment variables override it.
    #[arg(long, env = "PACKRAT_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log filter (tracing syntax), e.g. `info`, `packrat=debug` or `info,packrat::access=off`.
    #[arg(long, env = "PACKRAT_LOG", default_value = "info")]
    log: String,
    /// Log lines as text for people, or as JSON objects (one per line) for log shippers.
    #[arg(long, env = "PACKRAT_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

/// The local store (`serve` and `node`).
#[derive(clap::Args)]
struct StorageArgs {
    /// Directory holding the index and the segment files; created if missing.
    #[arg(long, env = "PACKRAT_DATA_DIR", default_value = "./packrat-data")]
    data_dir: PathBuf,
    /// Size in bytes at which a segment file is closed and a new one started.
    #[arg(long, env = "PACKRAT_SEGMENT_SIZE", default_value_t = SEGMENT_BYTES_DEFAULT)]
    segment_size: u64,
    /// Seconds between background compaction runs (0: only `packrat admin compact`).
    #[arg(long, env = "PACKRAT_COMPACT_INTERVAL", default_value_t = 600)]
    compact_interval: u64,
    /// Sealed segments whose live bytes are below this share (0 to 1) are compacted.
    #[arg(long, env = "PACKRAT_COMPACT_THRESHOLD", default_value_t = 0.5)]
    compact_threshold: f64,
    /// Seconds a compacted segment stays readable (through open handles) for reads that looked
    /// up its old location just before the move.
    #[arg(long, env = "PACKRAT_COMPACT_GRACE", default_value_t = 600)]
    compact_grace: u64,
    /// A data disk (directory or mount point) for segments; repeat for several. With one,
    /// segments live there instead of under --data-dir (the index stays in --data-dir).
    /// Several need --ec.
    #[arg(long = "disk", env = "PACKRAT_DISKS", value_delimiter = ',')]
    disks: Vec<PathBuf>,
    /// Erasure coding across the --disk directories as K+M (for example 4+2 on six disks):
    /// open segments are mirrored on M+1 disks, sealed ones are Reed-Solomon encoded into K
    /// data and M parity shards on distinct disks. Any M disks may be lost.
    #[arg(long, env = "PACKRAT_EC", value_parser = parse_ec)]
    ec: Option<(usize, usize)>,
    /// Seconds after which an open segment that received no writes is sealed (and encoded).
    #[arg(long, env = "PACKRAT_SEAL_IDLE", default_value_t = 300)]
    seal_idle: u64,
    /// Seconds between background scrubs of every shard (0: only `packrat admin scrub`).
    #[arg(long, env = "PACKRAT_SCRUB_INTERVAL", default_value_t = 7 * 86_400)]
    scrub_interval: u64,
    /// Bytes per second a background scrub may read (admin scrub runs at full speed).
    #[arg(long, env = "PACKRAT_SCRUB_RATE", default_value_t = 64 * 1024 * 1024)]
    scrub_rate: u64,
    /// Seconds between probes of every disk (a small write, sync and read back), which
    /// notice a disk that failed while idle (0: no probes; I/O errors still mark disks).
    #[arg(long, env = "PACKRAT_DISK_PROBE_INTERVAL", default_value_t = 10)]
    disk_probe_interval: u64,
    /// A storage tier for objects of an S3 storage class, as CLASS=dir:/path (a directory on
    /// slower disks) or CLASS=s3://bucket/prefix?endpoint=URL&region=R (any S3 service;
    /// credentials from PACKRAT_TIER_<CLASS>_ACCESS_KEY_ID / _SECRET_ACCESS_KEY, else
    /// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY). Repeat for several tiers.
    #[arg(long = "tier", env = "PACKRAT_TIERS", value_delimiter = ';')]
    tiers: Vec<packrat_tiering::TierSpec>,
    /// Seconds between tier worker runs (lifecycle rules and pending moves); 0: only
    /// `packrat admin tier run`.
    #[arg(long, env = "PACKRAT_TIER_INTERVAL", default_value_t = 3600)]
    tier_interval: u64,
    /// Bytes per second a tier move may copy (0: unthrottled).
    #[arg(long, env = "PACKRAT_TIER_RATE", default_value_t = 200 * 1024 * 1024)]
    tier_rate: u64,
    /// Size of the segments built for a tier.
    #[arg(long, env = "PACKRAT_TIER_SEGMENT_SIZE", default_value_t = 256 * 1024 * 1024)]
    tier_segment_size: u64,
    /// Bytes of tiered data cached in memory for reads.
    #[arg(long, env = "PACKRAT_TIER_CACHE_BYTES", default_value_t = 256 * 1024 * 1024)]
    tier_cache_bytes: u64,
    /// Tests only: lets the root key inject disk faults through the admin API.
    #[arg(long, hide = true)]
    fault_injection: bool,
    /// How records are read: io_uring when the kernel allows it (auto), always io_uring, or
    /// positioned pread calls. The choice is logged at start-up.
    #[arg(long, env = "PACKRAT_IO_BACKEND", value_enum, default_value = "auto")]
    io_backend: IoBackendArg,
}

/// `K+M` of --ec.
fn parse_ec(s: &str) -> Result<(usize, usize), String> {
    let (k, m) = s
        .split_once('+')
        .ok_or_else(|| format!("--ec wants K+M, like 4+2, not {s:?}"))?;
    let k: usize = k
        .trim()
        .parse()
        .map_err(|_| format!("bad K in --ec {s:?}"))?;
    let m: usize = m
        .trim()
        .parse()
        .map_err(|_| format!("bad M in --ec {s:?}"))?;
    if k == 0 || m == 0 || k + m > 256 {
        return Err(format!("--ec {s}: need K >= 1, M >= 1 and K+M <= 256"));
    }
    Ok((k, m))
}

#[derive(clap::Args)]
struct AdminArgs {
    /// URL of the running server to administer (before or after the subcommand).
    #[arg(
        long,
        global = true,
        env = "PACKRAT_ENDPOINT",
        default_value = "http://127.0.0.1:9000"
    )]
    endpoint: String,
    /// Administer a stopped server by opening its data directory directly instead.
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// Region to sign admin requests for (the server's --region).
    #[arg(
        long,
        global = true,
        env = "PACKRAT_REGION",
        default_value = "us-east-1"
    )]
    region: String,
    /// What to print: text for people, or JSON (one document on stdout) for scripts. Progress
    /// bars go to stderr, and only when it is a terminal.
    #[arg(long, global = true, value_enum, default_value_t = Output::Text)]
    output: Output,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

#[derive(Subcommand)]
enum AdminCommand {
    /// Access keys: each key is a user with its own buckets.
    #[command(subcommand)]
    Key(KeyCommand),
    /// SSE-KMS keys of packrat's own key provider (kept sealed under the master key).
    #[command(subcommand)]
    Kms(KmsCommand),
    /// Index and segment figures of a running server (JSON).
    Status {
        /// Flush and compact the object index first, so on-disk sizes are settled.
        #[arg(long)]
        flush: bool,
    },
    /// Compact now: sealed segments whose live share is below the threshold have their live
    /// records moved and are removed. Shows a progress bar of the bytes to move, then prints
    /// what was done (JSON).
    Compact {
        /// Live share (0 to 1) under which a segment is compacted (default: the server's
        /// --compact-threshold).
        #[arg(long)]
        threshold: Option<f64>,
    },
    /// Storage tiers: status, and running the tier worker now.
    #[command(subcommand)]
    Tier(TierCommand),
    /// Verify every erasure-coded shard of a running server (header and block checksums),
    /// rebuild missing and corrupt shards onto healthy disks, and encode sealed segments still
    /// held as copies. Shows progress and prints what was found and fixed.
    Scrub,
    /// Check offline (on a stopped server's --data-dir) that the index and the segments
    /// agree: every chunk of every object and part is read and verified. Reports live and
    /// dead bytes; exits with status 1 if anything is wrong.
    Verify {
        /// Print the report as JSON (the same as --output json).
        #[arg(long)]
        json: bool,
        /// The server's --disk directories (with --ec).
        #[arg(long = "disk", value_delimiter = ',')]
        disks: Vec<PathBuf>,
        /// The server's --ec K+M.
        #[arg(long, value_parser = parse_ec)]
        ec: Option<(usize, usize)>,
    },
}

#[derive(Subcommand)]
enum TierCommand {
    /// Objects and bytes per tier, segments on each tier, objects waiting to move (JSON).
    Status,
    /// Apply lifecycle rules and pending storage-class changes now: move what must move,
    /// with a progress bar, then print what was done.
    Run {
        /// Evaluate lifecycle rules as if this many days had passed (tests, previews).
        #[arg(long, default_value_t = 0)]
        days_ahead: u32,
    },
}

#[derive(Subcommand)]
enum KmsCommand {
    /// Named keys that SSE-KMS writes seal their data keys under.
    #[command(subcommand)]
    Key(KmsKeyCommand),
}

#[derive(Subcommand)]
pub enum KmsKeyCommand {
    /// Create a key; writes name it as `x-amz-server-side-encryption-aws-kms-key-id` (its id,
    /// its ARN or `alias/NAME`). Keys are never deleted: their objects would be lost.
    Create {
        name: String,
        /// A canonical user id that may use the key (repeat for more; `*` for every signed
        /// caller). Root keys always may; with none given, only they can.
        #[arg(long = "user")]
        users: Vec<String>,
    },
    /// List keys: id, name, who may use each.
    List,
}

#[derive(Subcommand)]
enum KeyCommand {
    /// Create a key (a new user). Generates the access and secret key unless given.
    Create {
        /// Display name reported as the owner in listings.
        #[arg(long)]
        name: String,
        #[arg(long)]
        access_key: Option<String>,
        #[arg(long)]
        secret_key: Option<String>,
        /// The user's canonical id (the owner id that ACLs and listings show), to keep the
        /// one another store gave it; random when not given. Giving the id of an existing
        /// user (with its name) makes a second key of that user.
        #[arg(long)]
        user_id: Option<String>,
    },
    /// List keys (secrets are not shown).
    List,
    /// Delete a key; requests signed with it fail from then on.
    Delete { access_key: String },
}

/// The command line, over the defaults a configuration file sets for a server command. Usage
/// errors and --help exit here, as clap does.
fn parse_cli(args: &[String]) -> Result<Cli, String> {
    let mut cmd = Cli::command();
    if let (Some(sub), Some(path)) = (
        config_file::subcommand_of(args),
        config_file::path_from(args),
    ) && config_file::SERVER_COMMANDS.contains(&sub)
    {
        cmd = config_file::apply(cmd, sub, Path::new(&path))?;
    }
    let matches = cmd.try_get_matches_from(args).unwrap_or_else(|e| e.exit());
    Cli::from_arg_matches(&matches).map_err(|e| e.to_string())
}

/// Blocks (`how = SIG_BLOCK`) or unblocks SIGTERM and SIGINT in the calling thread; threads
/// started later inherit the mask.
fn mask_stop_signals(how: libc::c_int) {
    // SAFETY: the set is initialised by sigemptyset before use; pthread_sigmask reads it and
    // writes no old mask (null).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::pthread_sigmask(how, &set, std::ptr::null_mut());
    }
}

fn main() -> ExitCode {
    // A stop signal that arrives before `packrat serve` has its handlers (while the runtime
    // starts, say) waits, blocked, instead of killing the process; it is delivered once the
    // handlers are in place. Other commands unblock at once.
    mask_stop_signals(libc::SIG_BLOCK);
    no_huge_pages();
    // Everything packrat creates (index and segment files, tier copies, the master key,
    // logs it opens) is its user's alone: files 0600, directories 0700.
    // SAFETY: umask only sets the process's file-mode mask; no memory is involved.
    unsafe { libc::umask(0o077) };
    let args: Vec<String> = std::env::args().collect();
    let cli = match parse_cli(&args) {
        Ok(cli) => cli,
        Err(e) => {
            eprintln!("packrat: {e}");
            return ExitCode::from(2);
        }
    };
    if !matches!(
        cli.command,
        Command::Serve(_) | Command::Node(_) | Command::Gateway(_)
    ) {
        mask_stop_signals(libc::SIG_UNBLOCK);
    }
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    let threads = match &cli.command {
        Command::Serve(a) => a.http.worker_threads,
        Command::Gateway(a) => a.http.worker_threads,
        Command::Node(a) => a.worker_threads,
        _ => None,
    };
    if let Some(n) = threads {
        builder.worker_threads(n.max(1));
    }
    let rt = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("packrat: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Serve(args) => rt.block_on(serve(args)),
        Command::Node(args) => rt.block_on(cluster_cmd::node(args)),
        Command::Gateway(args) => rt.block_on(cluster_cmd::gateway(args)),
        Command::Cluster(args) => rt.block_on(cluster_cmd::cluster(args)),
        Command::Admin(args) => rt.block_on(admin(args)),
        Command::Bench(args) => rt.block_on(bench::run(args)),
        Command::Config(ConfigArgs {
            command: ConfigCommand::PrintDefault { command },
        }) => config_file::print_default(&Cli::command(), &command).map(|text| print!("{text}")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("packrat: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Binds the listening socket with an accept backlog sized for `--max-connections` (the kernel
/// caps it at `net.core.somaxconn`). With tokio's default of 1024, a burst of thousands of new
/// connections overflows the accept queue; Linux then drops the handshake's last ACK, the client
/// believes it is connected, and its first request is retransmitted with backoff: seconds of
/// latency that no server metric shows (seen in the 4,000-connection soak).
fn listen(addr: SocketAddr, max_connections: usize) -> std::io::Result<tokio::net::TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    let backlog = u32::try_from(max_connections.clamp(1024, 65_535)).unwrap_or(65_535);
    socket.listen(backlog)
}

fn index_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("index")
}

/// The root credentials from the environment: both or neither.
fn root_from_env() -> Result<Option<(String, String)>, String> {
    let ak = std::env::var("PACKRAT_ROOT_ACCESS_KEY")
        .ok()
        .filter(|s| !s.is_empty());
    let sk = std::env::var("PACKRAT_ROOT_SECRET_KEY")
        .ok()
        .filter(|s| !s.is_empty());
    match (ak, sk) {
        (Some(ak), Some(sk)) => Ok(Some((ak, sk))),
        (None, None) => Ok(None),
        _ => Err("set both PACKRAT_ROOT_ACCESS_KEY and PACKRAT_ROOT_SECRET_KEY, or neither".into()),
    }
}

/// Logging to stderr, and the stop signals caught from here on: a SIGTERM during start-up
/// (recovery can take a while) is a clean stop once the store is open, not death by the
/// signal. The access log has a writer of its own (`packrat_gateway::access_log`).
fn start_process(log: &LogArgs) -> Result<impl std::future::Future<Output = ()>, String> {
    use std::io::IsTerminal as _;
    let logs = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&log.log))
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match log.log_format {
        LogFormat::Text => logs.init(),
        LogFormat::Json => logs.json().flatten_event(true).init(),
    }
    let stop = shutdown_signal()?;
    // The handlers are in place: a signal held back since start-up is delivered now (to this
    // thread, the only one that unblocks it).
    mask_stop_signals(libc::SIG_UNBLOCK);
    Ok(stop)
}

/// Opens the local store `serve` and `node` run.
fn open_local(
    storage: &StorageArgs,
    root: Option<(String, String)>,
) -> Result<packrat_store::local::Opened, String> {
    LocalStore::open(LocalOptions {
        data_dir: storage.data_dir.clone(),
        root,
        disks: storage.disks.clone(),
        ec: storage.ec,
        segment_bytes_max: storage.segment_size.max(1024 * 1024),
        io_backend: match storage.io_backend {
            IoBackendArg::Auto => IoBackend::Auto,
            IoBackendArg::Uring => IoBackend::Uring,
            IoBackendArg::Pread => IoBackend::Pread,
        },
        tiers: storage.tiers.clone(),
        tier_cache_bytes: storage.tier_cache_bytes,
        tier_segment_bytes: storage.tier_segment_size,
        tier_rate: storage.tier_rate,
        compact_interval: Duration::from_secs(storage.compact_interval),
        compact_threshold: storage.compact_threshold.clamp(0.0, 1.0),
        compact_grace: Duration::from_secs(storage.compact_grace),
        tier_interval: Duration::from_secs(storage.tier_interval),
        seal_idle: Duration::from_secs(storage.seal_idle),
        scrub_interval: Duration::from_secs(storage.scrub_interval),
        scrub_rate: storage.scrub_rate,
        disk_probe_interval: Duration::from_secs(storage.disk_probe_interval),
        ec_upkeep: true,
        fault_injection: storage.fault_injection,
        io: None,
        clock: Arc::new(SystemClock),
    })
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let stop = start_process(&args.http.logging)?;
    let opened = open_local(&args.storage, root_from_env()?)?;
    if let Some(k) = &opened.generated_root {
        println!(
            "packrat: generated root credentials (shown this once; set PACKRAT_ROOT_ACCESS_KEY/PACKRAT_ROOT_SECRET_KEY to choose your own):"
        );
        println!("  access key: {}", k.access_key);
        println!("  secret key: {}", k.secret_key);
    }
    let config = serve_config(&args.http, Some(&args.storage));
    if config.fault_injection {
        tracing::warn!("fault injection is enabled (--fault-injection): for tests only");
    }
    tracing::info!(data_dir = %config.data_dir.display(), region = %config.region, "packrat started");
    serve_s3(&args.http, Arc::new(opened.store), config, stop).await?;
    // Every acknowledged write is already durable. The store closes when the last reference
    // to it goes: its background work ends with the runtime, the commit thread is joined, and
    // the index is closed after them.
    tracing::info!("stopped");
    Ok(())
}

fn parse_ownership(s: &str) -> Result<packrat_gateway::s3::acl::Ownership, String> {
    packrat_gateway::s3::acl::Ownership::parse(s).ok_or_else(|| {
        format!("{s:?} is not BucketOwnerEnforced, BucketOwnerPreferred or ObjectWriter")
    })
}

/// The S3 side's limits from its flags, and what it reports of a local store (none for a
/// cluster gateway).
fn serve_config(http: &HttpArgs, storage: Option<&StorageArgs>) -> ServeConfig {
    ServeConfig {
        data_dir: storage.map(|s| s.data_dir.clone()).unwrap_or_default(),
        region: http.region.clone(),
        domain: http.domain.clone(),
        max_connections: http.max_connections,
        body_idle_timeout_secs: http.body_idle_timeout.max(1),
        batch_items_max: http.batch_items_max,
        batch_bytes_max: http.batch_bytes_max,
        max_header_bytes: http.max_header_bytes.max(8192),
        max_headers: http.max_headers.max(16),
        header_timeout_secs: http.header_timeout.max(1),
        compact_threshold: storage.map_or(0.5, |s| s.compact_threshold.clamp(0.0, 1.0)),
        compact_grace_secs: storage.map_or(0, |s| s.compact_grace),
        fault_injection: storage.is_some_and(|s| s.fault_injection),
        access_log: !http.no_access_log,
        allow_insecure_sse_c: http.allow_insecure_sse_c,
        default_object_ownership: http.default_object_ownership,
        reads_only: false,
        log_json: matches!(http.logging.log_format, LogFormat::Json),
    }
}

/// Serves S3 over `store` on --listen until `stop`, then drains.
async fn serve_s3(
    http: &HttpArgs,
    store: Arc<dyn packrat_store_api::Store>,
    config: ServeConfig,
    stop: impl std::future::Future<Output = ()>,
) -> Result<(), String> {
    let listener = listen(http.listen, http.max_connections)
        .map_err(|e| format!("cannot listen on {}: {e}", http.listen))?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let mut state = server::AppState::new(store, config);
    if let (Some(cert), Some(key)) = (&http.tls_cert, &http.tls_key) {
        state.tls = Some(tls::Tls::open(cert, key)?);
    }
    let scheme = if state.tls.is_some() { "https" } else { "http" };
    println!("packrat: listening on {scheme}://{addr}");
    let state = Arc::new(state);
    let drain = Duration::from_secs(http.shutdown_timeout);
    let stop = async move {
        stop.await;
        tracing::info!("stop requested; no new connections");
    };
    server::serve(listener, state, stop, drain)
        .await
        .map_err(|e| e.to_string())
}

/// SIGTERM or SIGINT. The handlers are installed when this is called, not when the future is
/// first polled: called before the server says it is listening, a stop sent the moment it is
/// up is a clean stop, not the signal's default action (death by SIGTERM, seen by a test that
/// stopped the server right after its "listening" line).
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| format!("SIGTERM handler: {e}"))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| format!("SIGINT handler: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

fn root_credentials() -> Result<(String, String), String> {
    match (
        std::env::var("PACKRAT_ROOT_ACCESS_KEY"),
        std::env::var("PACKRAT_ROOT_SECRET_KEY"),
    ) {
        (Ok(ak), Ok(sk)) => Ok((ak, sk)),
        _ => Err(
            "set PACKRAT_ROOT_ACCESS_KEY and PACKRAT_ROOT_SECRET_KEY to the root credentials"
                .into(),
        ),
    }
}

fn print_key_table(keys: &[admin::KeyInfo]) {
    println!(
        "{:<24} {:<20} {:<34} ROOT",
        "ACCESS KEY", "NAME", "OWNER ID"
    );
    for k in keys {
        println!(
            "{:<24} {:<20} {:<34} {}",
            k.access_key,
            k.name,
            k.owner_id,
            if k.is_root { "yes" } else { "" }
        );
    }
}

fn print_created(k: &AccessKey) {
    println!("created key for {}", k.name);
    println!("  access key: {}", k.access_key);
    println!("  secret key: {}", k.secret_key);
    println!("  owner id:   {}", k.owner_id);
}

async fn admin(args: AdminArgs) -> Result<(), String> {
    let json_out = args.output == Output::Json;
    let cmd = match args.command {
        AdminCommand::Key(cmd) => cmd,
        AdminCommand::Verify { json, disks, ec } => {
            let json = json || json_out;
            let dir = args.data_dir.as_ref().ok_or(
                "verify works offline: stop the server and pass its --data-dir".to_string(),
            )?;
            if !dir.is_dir() {
                return Err(format!("{} is not a directory", dir.display()));
            }
            // RocksDB writes an info log even when it opens read-only: it goes to a directory
            // of its own, removed afterwards, so the data directory is left byte for byte.
            let log_dir =
                std::env::temp_dir().join(format!("packrat-verify-{}", std::process::id()));
            std::fs::create_dir_all(&log_dir).map_err(|e| format!("{}: {e}", log_dir.display()))?;
            let index = RocksIndex::open_read_only(&index_dir(dir), &log_dir);
            let report = index
                .map_err(|e| format!("cannot verify {}: {e}", dir.display()))
                .and_then(|index| {
                    let segments = match disks.as_slice() {
                        [one] if ec.is_none() => one.join("segments"),
                        _ => dir.join("segments"),
                    };
                    packrat_store::verify::run(&index, &segments, &disks, ec, json)
                });
            let _ = std::fs::remove_dir_all(&log_dir);
            let report = report?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string(&report).map_err(|e| e.to_string())?
                );
            } else {
                packrat_store::verify::print(&report);
            }
            if report.problem_count > 0 {
                std::process::exit(1);
            }
            return Ok(());
        }
        AdminCommand::Tier(TierCommand::Run { days_ahead }) => {
            let (ak, sk) = root_credentials()?;
            return admin_client::run_tier(
                &args.endpoint,
                &args.region,
                &ak,
                &sk,
                days_ahead,
                json_out,
            )
            .await;
        }
        AdminCommand::Kms(KmsCommand::Key(cmd)) => {
            let (ak, sk) = root_credentials()?;
            return admin_client::run_kms(&args.endpoint, &args.region, &ak, &sk, cmd, json_out)
                .await;
        }
        AdminCommand::Scrub => {
            let (ak, sk) = root_credentials()?;
            return admin_client::run_scrub(&args.endpoint, &args.region, &ak, &sk, json_out).await;
        }
        AdminCommand::Compact { threshold } => {
            let (ak, sk) = root_credentials()?;
            let start = match threshold {
                Some(t) => format!("compact/run?threshold={t}"),
                None => "compact/run".to_string(),
            };
            let r: packrat_store_api::reports::CompactReport = admin_client::follow(
                &args.endpoint,
                &args.region,
                &ak,
                &sk,
                "compaction",
                &start,
                "compact/run",
            )
            .await?;
            return admin_client::print_json(&r);
        }
        AdminCommand::Status { .. } | AdminCommand::Tier(TierCommand::Status) => {
            let (ak, sk) = root_credentials()?;
            let (method, path) = match args.command {
                AdminCommand::Tier(TierCommand::Status) => (Method::GET, "tier".to_string()),
                AdminCommand::Status { flush: true } => {
                    (Method::GET, "status?flush=true".to_string())
                }
                _ => (Method::GET, "status".to_string()),
            };
            let body = admin_client::call_ok(&args.endpoint, &args.region, &ak, &sk, method, &path)
                .await?;
            println!("{}", String::from_utf8_lossy(&body));
            return Ok(());
        }
    };
    if let Some(dir) = &args.data_dir {
        let index = RocksIndex::open(&index_dir(dir)).map_err(|e| {
            format!(
                "cannot open {}: {e} (a running server holds it; use --endpoint instead)",
                dir.display()
            )
        })?;
        let master = packrat_store::master_key::MasterKey::load_or_create(dir)?;
        return match cmd {
            KeyCommand::Create {
                name,
                access_key,
                secret_key,
                user_id,
            } => {
                let k = packrat_store::keys::create_key(
                    &index,
                    &master,
                    NewKey {
                        name,
                        access_key,
                        secret_key,
                        user_id,
                    },
                    false,
                    &SystemClock,
                )
                .map_err(packrat_store::keys::refusal)?;
                let k = packrat_store::keys::access_key_of(k);
                if json_out {
                    return admin_client::print_json(&k);
                }
                print_created(&k);
                Ok(())
            }
            KeyCommand::List => {
                let keys = packrat_store::keys::list(&index, &master)
                    .map_err(packrat_store::keys::refusal)?;
                let keys: Vec<admin::KeyInfo> = keys
                    .into_iter()
                    .map(|k| admin::KeyInfo::from(&packrat_store::keys::access_key_of(k)))
                    .collect();
                if json_out {
                    return admin_client::print_json(&keys);
                }
                print_key_table(&keys);
                Ok(())
            }
            KeyCommand::Delete { access_key } => {
                match packrat_store::keys::delete_key(&index, &master, &access_key)
                    .map_err(packrat_store::keys::refusal)?
                {
                    Some(_) if json_out => {
                        admin_client::print_json(&serde_json::json!({ "deleted": access_key }))
                    }
                    Some(_) => {
                        println!("deleted {access_key}");
                        Ok(())
                    }
                    None => Err(format!("no access key {access_key}")),
                }
            }
        };
    }
    let (ak, sk) = root_credentials()?;
    let (method, path, body) = match &cmd {
        KeyCommand::Create {
            name,
            access_key,
            secret_key,
            user_id,
        } => (
            Method::POST,
            "keys".to_string(),
            serde_json::to_vec(&NewKey {
                name: name.clone(),
                access_key: access_key.clone(),
                secret_key: secret_key.clone(),
                user_id: user_id.clone(),
            })
            .map_err(|e| e.to_string())?,
        ),
        KeyCommand::List => (Method::GET, "keys".to_string(), Vec::new()),
        KeyCommand::Delete { access_key } => {
            (Method::DELETE, format!("keys/{access_key}"), Vec::new())
        }
    };
    let (status, body) =
        admin_client::call(&args.endpoint, &args.region, &ak, &sk, method, &path, body).await?;
    if !status.is_success() {
        return Err(format!(
            "server answered {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    match cmd {
        KeyCommand::Create { .. } => {
            let k: AccessKey = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            if json_out {
                return admin_client::print_json(&k);
            }
            print_created(&k);
        }
        KeyCommand::List => {
            let keys: Vec<admin::KeyInfo> =
                serde_json::from_slice(&body).map_err(|e| e.to_string())?;
            if json_out {
                return admin_client::print_json(&keys);
            }
            print_key_table(&keys);
        }
        KeyCommand::Delete { access_key } if json_out => {
            return admin_client::print_json(&serde_json::json!({ "deleted": access_key }));
        }
        KeyCommand::Delete { access_key } => println!("deleted {access_key}"),
    }
    Ok(())
}
