//! The store conformance suite (`packrat_store_api::conformance`) against `ClusterStore`: per
//! test, a private etcd (Debian's `etcd-server`, on free loopback ports), three storage nodes
//! in this process (each a `LocalStore` on its own directory, serving the internal API on
//! loopback) with R=3, and a cluster store over them, as `packrat gateway` opens it.
//!
//! The nodes run for the rest of the test process, so each cluster's directory outlives its
//! test: it is named after the process, and the next run removes those of processes gone.

use packrat_cluster::map::{Etcd, NodeEntry, NodeState};
use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::Store;
use packrat_store_api::admin::AccessKey;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A private etcd that dies with the test's thread (PR_SET_PDEATHSIG), so none outlives it.
/// Its ports are picked free just before it starts; another test can take one in between, so
/// an etcd that exits at once is started again on other ports.
fn spawn_etcd(dir: &std::path::Path) -> (std::process::Child, String) {
    let etcd =
        which("etcd").expect("etcd is needed (Debian's etcd-server; see the README's setup)");
    let (client, peer) = (free_port(), free_port());
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let mut cmd = Command::new(etcd);
    cmd.args(["--name", "t", "--data-dir"])
        .arg(dir)
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args([
            "--initial-cluster",
            &format!("t={peer_url}"),
            "--log-level",
            "error",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: prctl with PR_SET_PDEATHSIG takes plain integers; it runs in the child between
    // fork and exec and touches no memory of ours.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    (cmd.spawn().expect("start etcd (Debian's etcd-server)"), url)
}

async fn start_etcd(dir: &std::path::Path) -> Etcd {
    for attempt in 0..5 {
        let (mut child, url) = spawn_etcd(&dir.join(format!("etcd{attempt}")));
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(15) {
            if child.try_wait().expect("poll the etcd process").is_some() {
                break; // a port was taken: again, on others
            }
            if let Ok(e) = Etcd::connect(&url).await
                && e.get("probe").await.is_ok()
            {
                // Reaped when it dies with the test's thread.
                std::thread::spawn(move || child.wait());
                return e;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
    }
    panic!("etcd did not start in five tries");
}

fn which(name: &str) -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|d| std::path::Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// Removes the test clusters' directories (`packrat-conformance-<pid>-*` in the temp
/// directory) of the test processes `gone` names.
fn remove_cluster_dirs(gone: impl Fn(u32) -> bool) {
    for entry in std::fs::read_dir(std::env::temp_dir())
        .into_iter()
        .flatten()
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix("packrat-conformance-")
            .and_then(|rest| rest.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if gone(pid) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// Removes this process's cluster directories as the test binary exits. By then each test's
/// nodes have stopped with its runtime, and its etcd was killed when its thread ended
/// (`PR_SET_PDEATHSIG`); a file still open goes when its process does.
extern "C" fn remove_own_cluster_dirs() {
    let me = std::process::id();
    remove_cluster_dirs(|pid| pid == me);
}

/// A new directory for one test's cluster, under `packrat-conformance-<pid>-*` in the temp
/// directory (about 130 MiB each). This process's are removed as it exits; those of test
/// processes no longer running (one killed, say) are removed here.
fn cluster_dir() -> std::path::PathBuf {
    static AT_EXIT: std::sync::Once = std::sync::Once::new();
    AT_EXIT.call_once(|| {
        // SAFETY: registers a plain function with no arguments, as `atexit` requires.
        unsafe { libc::atexit(remove_own_cluster_dirs) };
    });
    remove_cluster_dirs(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists());
    let tmp = std::env::temp_dir();
    tempfile::Builder::new()
        .prefix(&format!("packrat-conformance-{}-", std::process::id()))
        .tempdir_in(&tmp)
        .unwrap()
        .keep()
}

async fn cluster_store() -> Arc<dyn Store> {
    let dir = cluster_dir();
    let etcd = start_etcd(&dir).await;
    let started = Instant::now();
    let root = AccessKey {
        access_key: "ROOT".into(),
        secret_key: "root-secret-123".into(),
        name: "root".into(),
        owner_id: "root".into(),
        is_root: true,
        created_ms: 0,
    };
    packrat_cluster::init(
        &etcd,
        16,
        3,
        packrat_cluster::map::REREPLICATE_AFTER_S,
        root,
    )
    .await
    .unwrap();
    for i in 0..3 {
        let data_dir = dir.join(format!("node{i}"));
        let store = LocalStore::open(LocalOptions::new(data_dir.clone())).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let entry = NodeEntry {
            id: format!("node{i}"),
            addr: listener.local_addr().unwrap().to_string(),
            zone: None,
            weight: 1.0,
            state: NodeState::Active,
            incarnation: 1,
            classes: Vec::new(),
            s3: None,
        };
        let etcd = etcd.clone();
        tokio::spawn(async move {
            packrat_cluster::run_node(
                etcd,
                entry,
                Arc::new(store.store),
                listener,
                packrat_cluster::NodeOptions {
                    tombstone_keep: Duration::from_secs(600),
                    lifecycle: Default::default(),
                    metrics: None,
                    data_dir: Some(&data_dir),
                    reads: None,
                },
                std::future::pending(),
            )
            .await
        });
    }
    loop {
        let (map, _) = etcd.map().await.unwrap();
        let report = packrat_cluster::status_report(&map);
        if report["pgs_healthy"] == 16 && map.nodes.len() == 3 {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no healthy cluster: {report}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    packrat_cluster::store::ClusterStore::connect(etcd)
        .await
        .unwrap()
}

// Every check of the suite, as the local store runs them: a new check reaches both.
packrat_store_api::conformance_suite!(cluster_store);
