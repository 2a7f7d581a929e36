//! Erasure coding survives one disk failing under an open segment. Open segments are mirrored
//! (M+1 copies on distinct disks); a fault injected on one disk's copy (a torn write, a failed
//! write, a failed fsync, at the Nth operation) must:
//!
//! - fail only the writes it touches, with an I/O error (never an acknowledgement);
//! - leave later writes working (the segment is abandoned, the disk marked failed, new
//!   segments go to the healthy disks);
//! - lose no acknowledged write: every one reads back byte for byte before and after a seal
//!   (a scrub encodes the segments into shards) and after a restart without the fault, and the
//!   offline verifier finds nothing wrong;
//! - leave a failed write's key as it was (absent for a new key).

mod common;

use common::{EC, disks, erasure_coded, read_state, seal};
use packrat_index::RocksIndex;
use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::conformance::{MemSource, new_bucket};
use packrat_store_api::{Bucket, PutObject, ReplicaStore, StoreError};
use std::path::Path;

const WRITES: usize = 40;

fn options(dir: &Path, fault_injection: bool) -> LocalOptions {
    let o = LocalOptions {
        segment_bytes_max: 128 * 1024,
        fault_injection,
        ..LocalOptions::new(dir.to_path_buf())
    };
    erasure_coded(o, dir)
}

fn body(i: usize) -> Vec<u8> {
    let len = [700, 9_000, 30_000, 3][i % 4];
    (0..len).map(|j| (j * 31 + i * 7) as u8).collect()
}

/// Every acknowledged write reads back; every failed one left its key absent.
async fn check(
    store: &dyn ReplicaStore,
    b: &Bucket,
    acked: &[usize],
    failed: &[usize],
    when: &str,
) {
    for &i in acked {
        let got = read_state(store, b, &format!("k{i:03}")).await.unwrap();
        assert!(
            got.as_deref() == Some(&body(i)[..]),
            "{when}: k{i:03} was acknowledged and reads back {:?} bytes",
            got.map(|g| g.len())
        );
    }
    for &i in failed {
        assert_eq!(
            read_state(store, b, &format!("k{i:03}")).await.unwrap(),
            None,
            "{when}: k{i:03} failed"
        );
    }
}

/// One fault rule on disk 1's segment copies; answers (acknowledged, failed) write numbers.
fn run(rule: serde_json::Value) -> (Vec<usize>, Vec<usize>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (acked, failed, bucket) = rt.block_on(async {
        let opened = LocalStore::open(options(dir.path(), true)).unwrap();
        let store: &dyn ReplicaStore = &opened.store;
        let b = new_bucket(store, "ec").await;
        store
            .faults(Some(serde_json::json!({ "rules": [rule] })))
            .await
            .unwrap();
        let (mut acked, mut failed) = (Vec::new(), Vec::new());
        for i in 0..WRITES {
            let mut src = MemSource::new(body(i));
            match store
                .put_object(&b, &format!("k{i:03}"), &mut src, PutObject::default())
                .await
            {
                Ok(_) => acked.push(i),
                Err(StoreError::Internal { .. } | StoreError::InsufficientStorage(_)) => {
                    failed.push(i)
                }
                Err(e) => panic!("k{i:03}: a disk fault answered {e:?}, not an I/O error"),
            }
        }
        let injected = store.faults(None).await.unwrap()["injected"]
            .as_u64()
            .unwrap();
        assert!(injected > 0, "the rule {rule} never fired");
        check(store, &b, &acked, &failed, "with the fault").await;
        seal(store).await.expect("the seal");
        check(store, &b, &acked, &failed, "after the seal").await;
        (acked, failed, b.name)
    });
    drop(rt);

    let logs = tempfile::tempdir().unwrap();
    let index = RocksIndex::open_read_only(&dir.path().join("index"), logs.path()).unwrap();
    let report = packrat_store::verify::run(
        &index,
        &dir.path().join("segments"),
        &disks(dir.path()),
        Some(EC),
        true,
    )
    .unwrap();
    drop(index);
    assert_eq!(
        report.problem_count, 0,
        "offline verify: {:?}",
        report.problems
    );
    assert_eq!(report.objects, acked.len() as u64);

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let opened = LocalStore::open(options(dir.path(), false)).unwrap();
        let store: &dyn ReplicaStore = &opened.store;
        let b = store.bucket(&bucket).unwrap().expect("the bucket");
        check(store, &b, &acked, &failed, "after a restart").await;
    });
    (acked, failed)
}

fn rule(op: &str, fault: &str, after: u64) -> serde_json::Value {
    serde_json::json!({ "op": op, "fault": fault, "path": "disk1/segments", "after": after, "times": 1 })
}

#[test]
fn a_torn_write_on_one_disk_fails_only_its_write() {
    for after in [0, 3, 11] {
        let (acked, failed) = run(rule("write", "torn", after));
        assert_eq!(failed.len(), 1, "after {after}: failed {failed:?}");
        assert_eq!(acked.len(), WRITES - 1);
    }
}

#[test]
fn a_failed_write_on_one_disk_fails_only_its_write() {
    let (acked, failed) = run(rule("write", "eio", 5));
    assert_eq!(failed.len(), 1, "failed {failed:?}");
    assert_eq!(acked.len(), WRITES - 1);
}

#[test]
fn a_failed_fsync_on_one_disk_fails_the_writes_it_covered() {
    for after in [0, 4] {
        let (acked, failed) = run(rule("sync", "eio", after));
        // Writes are sequential here, so one fsync covers one write.
        assert_eq!(failed.len(), 1, "after {after}: failed {failed:?}");
        assert_eq!(acked.len(), WRITES - 1);
    }
}

#[test]
fn intermittent_faults_on_one_disk_lose_nothing_acknowledged() {
    let (acked, failed) = run(serde_json::json!({
        "op": "write", "fault": "torn", "path": "disk1/segments", "every": 4
    }));
    assert!(
        !failed.is_empty() && !acked.is_empty(),
        "{acked:?} {failed:?}"
    );
}
