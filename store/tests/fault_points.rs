//! A fault at every I/O point the store has, one kind at a time, on one disk and under erasure
//! coding: segment creation (rotation), positioned writes (appends, compaction's moves, shard
//! rows), fsyncs, directory fsyncs, renames (shards into place), removals (compacted segments,
//! sealed copies), reads (compaction and sealing read what they move), index writes and index
//! deletes; on the Nth operation, or intermittently.
//!
//! Three layouts: one disk; erasure coding 2+1 over four disks; one disk with an HDD-directory
//! tier, where tier uploads, reads and deletes are fault points too.
//!
//! A workload of PUTs, overwrites, DELETEs, GETs, compaction runs, seals (erasure coding) and
//! tier runs (tiered, half the objects in the tier's class) runs with the rule armed. Then:
//!
//! - an operation the fault hits fails with an I/O error (Internal, or InsufficientStorage
//!   for ENOSPC; a tier read also TierData or Unavailable), never with another answer, and a
//!   GET never answers bytes other than the object's;
//! - a failed write or delete leaves its key in its old or its new state, never another;
//! - every acknowledged state reads back byte for byte, once the rule is cleared, again after
//!   a compaction and a seal without faults, and after a restart; the offline verifier finds
//!   nothing wrong and counts exactly the objects the model holds.

mod common;

use common::{EC, disks, erasure_coded, get, read_state, run_job, seal};
use packrat_index::RocksIndex;
use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::admin::JobStart;
use packrat_store_api::conformance::{MemSource, new_bucket};
use packrat_store_api::{Bucket, PutObject, ReplicaStore, StoreError};
use packrat_tiering::{Target, TierSpec};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Layout {
    OneDisk,
    Erasure,
    Tiered,
}

const TIER: &str = "COLD";

const OPS: usize = 64;

fn options(dir: &Path, layout: Layout, fault_injection: bool) -> LocalOptions {
    let o = LocalOptions {
        segment_bytes_max: 64 * 1024,
        fault_injection,
        ..LocalOptions::new(dir.to_path_buf())
    };
    match layout {
        Layout::OneDisk => o,
        Layout::Erasure => erasure_coded(o, dir),
        Layout::Tiered => LocalOptions {
            tiers: vec![TierSpec {
                class: TIER.into(),
                target: Target::Dir(dir.join("hdd")),
            }],
            tier_segment_bytes: 32 * 1024,
            ..o
        },
    }
}

fn put_options(layout: Layout, i: usize) -> PutObject {
    let mut put = PutObject::default();
    if layout == Layout::Tiered && i.is_multiple_of(2) {
        put.attrs.storage_class = Some(TIER.into());
    }
    put
}

fn io_error(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Internal { .. } | StoreError::InsufficientStorage(_)
    )
}

/// What a read may answer when the disk or the tier under it fails.
fn read_error(e: &StoreError) -> bool {
    io_error(e) || matches!(e, StoreError::TierData(_) | StoreError::Unavailable(_))
}

fn body(i: usize) -> Vec<u8> {
    let len = [900, 12_000, 31_000, 5, 4_000][i % 5];
    (0..len).map(|j| (j * 17 + i * 3) as u8).collect()
}

/// What a key holds: nothing, or these bytes.
type State = Option<Vec<u8>>;
type Model = BTreeMap<String, State>;

async fn check_all(store: &dyn ReplicaStore, b: &Bucket, model: &Model, when: &str) {
    for (key, want) in model {
        let got = read_state(store, b, key)
            .await
            .unwrap_or_else(|e| panic!("{when}: {e}"));
        assert!(
            &got == want,
            "{when}: {key} holds {:?} bytes, the model {:?}",
            got.map(|g| g.len()),
            want.as_ref().map(|w| w.len())
        );
    }
}

/// What one rule did: operations failed by it, and faults injected.
struct Outcome {
    failed: usize,
    injected: u64,
}

fn run(layout: Layout, rule: Value) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (model, bucket, outcome) = rt.block_on(async {
        let opened = LocalStore::open(options(dir.path(), layout, true)).unwrap();
        let store: &dyn ReplicaStore = &opened.store;
        let b = new_bucket(store, "faults").await;
        store
            .faults(Some(json!({ "rules": [rule.clone()] })))
            .await
            .unwrap();
        let mut model = Model::new();
        // Keys whose write or delete failed: old or new state, settled by reading.
        let mut unsettled: Vec<(String, State, State)> = Vec::new();
        let mut failed = 0;
        let mut reads_failed = 0;
        for i in 0..OPS {
            let live: Vec<String> = model
                .iter()
                .filter(|(_, v)| v.is_some())
                .map(|(k, _)| k.clone())
                .collect();
            let (what, key, new, result) = match i % 8 {
                6 if !live.is_empty() => {
                    let key = live[i % live.len()].clone();
                    let r = store.delete_object(&b, &key).await.map(|_| ());
                    ("delete", key, None, r)
                }
                5 if !live.is_empty() => {
                    let key = live[(i * 7) % live.len()].clone();
                    let data = body(i + 100);
                    let mut src = MemSource::new(data.clone());
                    let r = store.put_object(&b, &key, &mut src, put_options(layout, i)).await;
                    ("overwrite", key, Some(data), r.map(|_| ()))
                }
                2 => {
                    // Every live object is read back while the rule is armed.
                    for key in &live {
                        match get(store, &b, key).await {
                            Ok(got) => assert!(
                                got == model[key],
                                "GET {key} under {rule} answered other bytes"
                            ),
                            Err(e) if read_error(&e) => reads_failed += 1,
                            Err(e) => panic!("GET {key} under {rule}: answered {e:?}"),
                        }
                    }
                    continue;
                }
                7 => {
                    let r = store.compact(1.0, Duration::ZERO).await.map(|_| ());
                    ("compact", String::new(), None, r)
                }
                4 if layout == Layout::Erasure => ("seal", String::new(), None, seal(store).await),
                4 if layout == Layout::Tiered => {
                    let r = run_job(store, JobStart::TierRun { days_ahead: 0 }).await;
                    ("tier run", String::new(), None, r)
                }
                _ => {
                    let key = format!("k{i:03}");
                    let data = body(i);
                    let mut src = MemSource::new(data.clone());
                    let r = store.put_object(&b, &key, &mut src, put_options(layout, i)).await;
                    ("put", key, Some(data), r.map(|_| ()))
                }
            };
            match result {
                Ok(()) => {
                    if !key.is_empty() {
                        model.insert(key, new);
                    }
                }
                Err(e) if io_error(&e) => {
                    failed += 1;
                    if !key.is_empty() {
                        let old = model.remove(&key).flatten();
                        unsettled.push((key, old, new));
                    }
                }
                Err(e) => panic!("{what} {key} under {rule}: answered {e:?}, not an I/O error"),
            }
            // A key settles at the next write to it or at the end; until then it stays out of
            // the model, and a later write to it puts it back.
            unsettled.retain(|(k, _, _)| !model.contains_key(k));
        }
        failed += reads_failed;
        let injected = store.faults(Some(json!({}))).await.unwrap()["injected"]
            .as_u64()
            .unwrap();
        for (key, old, new) in unsettled {
            let got = read_state(store, &b, &key).await.unwrap();
            assert!(
                got == old || got == new,
                "{key}: a failed write or delete under {rule} left {:?} bytes, neither the old {:?} nor the new {:?}",
                got.as_ref().map(|g| g.len()),
                old.as_ref().map(|g| g.len()),
                new.as_ref().map(|g| g.len())
            );
            model.insert(key, got);
        }
        check_all(store, &b, &model, "with the rule cleared").await;
        store.compact(1.0, Duration::ZERO).await.expect("a compaction without faults");
        match layout {
            Layout::OneDisk => {}
            Layout::Erasure => seal(store).await.expect("a seal without faults"),
            Layout::Tiered => run_job(store, JobStart::TierRun { days_ahead: 0 })
                .await
                .expect("a tier run without faults"),
        }
        check_all(store, &b, &model, "after a clean compaction and seal").await;
        (model, b.name, Outcome { failed, injected })
    });
    drop(rt);

    let logs = tempfile::tempdir().unwrap();
    let index = RocksIndex::open_read_only(&dir.path().join("index"), logs.path()).unwrap();
    let (segment_disks, ec) = match layout {
        Layout::OneDisk | Layout::Tiered => (Vec::new(), None),
        Layout::Erasure => (disks(dir.path()), Some(EC)),
    };
    let report = packrat_store::verify::run(
        &index,
        &dir.path().join("segments"),
        &segment_disks,
        ec,
        true,
    )
    .unwrap();
    drop(index);
    assert_eq!(
        report.problem_count, 0,
        "{rule}: offline verify: {:?}",
        report.problems
    );
    let present = model.values().filter(|v| v.is_some()).count() as u64;
    assert_eq!(report.objects, present, "{rule}");

    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let opened = LocalStore::open(options(dir.path(), layout, false)).unwrap();
        let store: &dyn ReplicaStore = &opened.store;
        let b = store.bucket(&bucket).unwrap().expect("the bucket");
        check_all(store, &b, &model, "after a restart").await;
    });
    outcome
}

/// Every operation kind the layout has, on the Nth operation and intermittently.
fn rules(layout: Layout) -> Vec<Value> {
    let mut rules = Vec::new();
    let mut ops = vec![
        ("create", "eio"),
        ("write", "torn"),
        ("write", "enospc"),
        ("sync", "eio"),
        ("sync_dir", "eio"),
        ("rename", "eio"),
        ("remove", "eio"),
        ("read", "eio"),
        ("index_write", "eio"),
        ("index_delete", "eio"),
    ];
    match layout {
        // Shards are renamed into place; nothing else is renamed.
        Layout::OneDisk => ops.retain(|(op, _)| *op != "rename"),
        Layout::Erasure => {}
        Layout::Tiered => {
            ops.retain(|(op, _)| *op != "rename");
            ops.extend([
                ("tier_upload", "eio"),
                ("tier_read", "eio"),
                ("tier_delete", "eio"),
            ]);
        }
    }
    for (op, fault) in ops {
        for after in [1, 6] {
            rules.push(json!({ "op": op, "fault": fault, "after": after, "times": 2 }));
        }
        rules.push(json!({ "op": op, "fault": fault, "every": 5 }));
    }
    rules
}

fn every_fault_point(layout: Layout) {
    let (mut fired, mut failed) = (BTreeMap::new(), 0);
    for rule in rules(layout) {
        let o = run(layout, rule.clone());
        failed += o.failed;
        *fired
            .entry(rule["op"].as_str().unwrap().to_string())
            .or_insert(0) += o.injected;
    }
    println!(
        "{layout:?}: faults injected per operation kind: {fired:?}; {failed} operations failed"
    );
    // Every kind of operation was reached by its rule at least once.
    let silent: Vec<_> = fired.iter().filter(|(_, n)| **n == 0).collect();
    assert!(
        silent.is_empty(),
        "{layout:?}: rules that never fired: {silent:?}"
    );
    assert!(failed > 0);
}

#[test]
fn a_fault_at_every_io_point_loses_nothing_acknowledged() {
    every_fault_point(Layout::OneDisk);
}

#[test]
fn a_fault_at_every_io_point_loses_nothing_acknowledged_under_erasure_coding() {
    every_fault_point(Layout::Erasure);
}

#[test]
fn a_fault_at_every_io_point_loses_nothing_acknowledged_with_a_tier() {
    every_fault_point(Layout::Tiered);
}
