//! Power loss under the whole store: the real write protocol (records appended and fsynced by
//! group commit, segment rotations with their directory fsyncs, synced index commits, deletes,
//! compaction's moves and segment removals) runs on `PowerLossIo` until the power goes at a
//! seeded operation; the files are then put in the state a power cut leaves (unsynced bytes
//! gone, a page torn in, unsynced creates, renames and removals undone). Then, in order:
//!
//! 1. the offline verifier, on the index opened read-only, finds every object the index holds
//!    intact on disk (no committed object points at a record the cut took);
//! 2. the store reopens on the raw directory and recovers by itself;
//! 3. every acknowledged write reads back byte for byte, every acknowledged delete is gone,
//!    and the key of the one operation cut by the power reads as before it or after it.
//!
//! Two layouts: one disk, and erasure coding 2+1 over four disks, where open segments are
//! mirrored (every copy on its own disk, each cut and torn on its own), a seal operation (a
//! scrub) encodes sealed segments into shards, and shards are renamed into place and their
//! copies removed while the power may go.
//!
//! A seed reproduces a failure: `PACKRAT_POWERLOSS_SEED=N cargo test -p packrat-store --test
//! powerloss`. `PACKRAT_POWERLOSS_SEEDS` sets how many seeds run per layout (300 by default on
//! one disk, half that under erasure coding; the long mode in docs/reliability.md runs 2,000).

mod common;

use common::{EC, disks, erasure_coded, read_state, seal};
use packrat_chunk_store::{CrashReport, PowerLossIo};
use packrat_index::RocksIndex;
use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::conformance::{MemSource, new_bucket};
use packrat_store_api::{PutObject, ReplicaStore, StoreError};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// splitmix64: a seeded, reproducible choice of operations, sizes and crash points.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// What a key holds: nothing, or these bytes.
type State = Option<Vec<u8>>;

/// What one seed did, for the summary.
#[derive(Default)]
struct Outcome {
    acked: u64,
    /// Whether the power went during the operations (not after the last).
    died_mid_run: bool,
    cut_op: Option<&'static str>,
    crash: CrashReport,
    /// Shard files on the disks after the cut (erasure coding: segments sealed and encoded).
    shards: u64,
}

const OPS: usize = 60;
/// Crash points are drawn from this many file and index operations (a run of `OPS` operations
/// takes about 200-300, so most points fall inside the run).
const CRASH_POINTS: u64 = 250;

#[derive(Clone, Copy, PartialEq, Debug)]
enum Layout {
    OneDisk,
    /// Erasure coding 2+1 across four disks.
    Erasure,
}

fn options(dir: &Path, layout: Layout) -> LocalOptions {
    let o = LocalOptions {
        // Small segments: rotations (new files, directory fsyncs) happen every few writes.
        segment_bytes_max: 96 * 1024,
        ..LocalOptions::new(dir.to_path_buf())
    };
    match layout {
        Layout::OneDisk => o,
        Layout::Erasure => erasure_coded(o, dir),
    }
}

fn body(rng: &mut Rng) -> Vec<u8> {
    let len = match rng.below(20) {
        0 => 0,
        1 => 1_200_000, // more than one chunk
        2..=4 => 40_000,
        5..=9 => 9_000,
        _ => 1 + rng.below(3000) as usize,
    };
    let fill = rng.next() as u8;
    (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(fill))
        .collect()
}

fn show(s: &State) -> String {
    match s {
        None => "no object".into(),
        Some(v) => format!("{} bytes", v.len()),
    }
}

/// Runs one seed; `Err` describes what the crash lost or broke.
fn run_seed(seed: u64, layout: Layout, plant: Option<(bool, bool)>) -> Result<Outcome, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let sim = Arc::new(PowerLossIo::default());
    if let Some((files, dirs)) = plant {
        sim.forget_syncs(files, dirs);
    }
    let mut rng = Rng(seed);
    let mut model: BTreeMap<String, State> = BTreeMap::new();
    // The operation the power cut: (key, state before, state after), if it was a write.
    let mut cut: Option<(String, State, State)> = None;
    let mut out = Outcome::default();
    let bucket = rt.block_on(async {
        let opened = LocalStore::open(LocalOptions {
            io: Some(sim.clone()),
            ..options(dir.path(), layout)
        })
        .map_err(|e| format!("open: {e}"))?;
        let store: &dyn ReplicaStore = &opened.store;
        let b = new_bucket(store, "power").await;
        sim.die_after(1 + rng.below(CRASH_POINTS));
        for i in 0..OPS {
            let keys: Vec<String> = model
                .iter()
                .filter(|(_, v)| v.is_some())
                .map(|(k, _)| k.clone())
                .collect();
            let pick = rng.below(100);
            let (what, key, new, result): (&'static str, String, State, Result<(), StoreError>) =
                if keys.is_empty() || pick < 70 {
                    let (what, key) = if keys.is_empty() || pick < 45 {
                        ("put", format!("k{i:03}"))
                    } else {
                        let key = keys[rng.below(keys.len() as u64) as usize].clone();
                        ("overwrite", key)
                    };
                    let data = body(&mut rng);
                    let mut src = MemSource::new(data.clone());
                    let r = store
                        .put_object(&b, &key, &mut src, PutObject::default())
                        .await;
                    (what, key, Some(data), r.map(|_| ()))
                } else if pick < 90 {
                    let key = keys[rng.below(keys.len() as u64) as usize].clone();
                    let r = store.delete_object(&b, &key).await.map(|_| ());
                    ("delete", key, None, r)
                } else if layout == Layout::Erasure && pick < 95 {
                    ("seal", String::new(), None, seal(store).await)
                } else {
                    // Every segment with a dead byte is rewritten: moves, index updates,
                    // segment removals.
                    let r = store.compact(1.0, Duration::ZERO).await;
                    ("compact", String::new(), None, r.map(|_| ()))
                };
            match result {
                Ok(()) => {
                    out.acked += 1;
                    if !key.is_empty() {
                        model.insert(key, new);
                    }
                    // The power went inside an operation that still succeeded (a seal that
                    // left a segment as copies to retry later): it stays acknowledged.
                    if sim.is_dead() {
                        out.died_mid_run = true;
                        out.cut_op = Some(what);
                        break;
                    }
                }
                Err(e) if sim.is_dead() => {
                    out.died_mid_run = true;
                    out.cut_op = Some(what);
                    if !key.is_empty() {
                        let old = model.get(&key).cloned().flatten();
                        cut = Some((key, old, new));
                    }
                    let _ = e;
                    break;
                }
                Err(e) => return Err(format!("{what} {key} failed with the power on: {e}")),
            }
        }
        drop(opened);
        Ok::<String, String>(b.name)
    })?;
    out.crash = sim.crash(Some(seed)).map_err(|e| format!("crash: {e}"))?;
    out.shards = disks(dir.path())
        .iter()
        .filter_map(|d| std::fs::read_dir(d.join("shards")).ok())
        .map(|entries| entries.count() as u64)
        .sum();

    // 1. The offline verifier, read-only, on the directory the cut left.
    let logs = tempfile::tempdir().unwrap();
    let index = RocksIndex::open_read_only(&dir.path().join("index"), logs.path())
        .map_err(|e| format!("read-only index: {e}"))?;
    let report = match layout {
        Layout::OneDisk => {
            packrat_store::verify::run(&index, &dir.path().join("segments"), &[], None, true)?
        }
        Layout::Erasure => packrat_store::verify::run(
            &index,
            &dir.path().join("segments"),
            &disks(dir.path()),
            Some(EC),
            true,
        )?,
    };
    drop(index);
    if report.problem_count > 0 {
        return Err(format!("offline verify: {:?}", report.problems));
    }

    // 2 and 3. The store recovers the raw directory; every acknowledged state reads back.
    rt.block_on(async {
        let opened =
            LocalStore::open(options(dir.path(), layout)).map_err(|e| format!("reopen: {e}"))?;
        let store: &dyn ReplicaStore = &opened.store;
        let b = store
            .bucket(&bucket)
            .map_err(|e| format!("bucket: {e}"))?
            .ok_or("the bucket is gone")?;
        let objects = report.objects as usize;
        for (key, want) in &model {
            if cut.as_ref().is_some_and(|(k, _, _)| k == key) {
                continue;
            }
            let got = read_state(store, &b, key).await?;
            if &got != want {
                return Err(format!(
                    "{key}: acknowledged {}, read {}",
                    show(want),
                    show(&got)
                ));
            }
        }
        if let Some((key, old, new)) = &cut {
            let got = read_state(store, &b, key).await?;
            if &got != old && &got != new {
                return Err(format!(
                    "{key} (cut by the power): read {}, expected {} or {}",
                    show(&got),
                    show(old),
                    show(new)
                ));
            }
        }
        let present = model.values().filter(|v| v.is_some()).count();
        if objects.abs_diff(present) > 1 {
            return Err(format!(
                "the index holds {objects} objects after recovery, the model {present}"
            ));
        }
        Ok(())
    })?;
    Ok(out)
}

/// The seeds to run: `PACKRAT_POWERLOSS_SEED` alone, or `PACKRAT_POWERLOSS_SEEDS` of them
/// (`default` when unset).
fn seeds(default: u64) -> Vec<u64> {
    if let Ok(s) = std::env::var("PACKRAT_POWERLOSS_SEED") {
        return vec![s.parse().expect("PACKRAT_POWERLOSS_SEED is a number")];
    }
    let n: u64 = std::env::var("PACKRAT_POWERLOSS_SEEDS")
        .map(|s| s.parse().expect("PACKRAT_POWERLOSS_SEEDS is a number"))
        .unwrap_or(default);
    (0..n).collect()
}

#[test]
fn no_acknowledged_write_is_lost_at_any_crash_point() {
    crash_points(Layout::OneDisk, seeds(300));
}

#[test]
fn no_acknowledged_write_is_lost_at_any_crash_point_under_erasure_coding() {
    crash_points(Layout::Erasure, seeds(150));
}

fn crash_points(layout: Layout, seeds: Vec<u64>) {
    let started = std::time::Instant::now();
    let (mut acked, mut mid_run) = (0u64, 0u64);
    let mut cuts: BTreeMap<&str, u64> = BTreeMap::new();
    let mut crash = CrashReport::default();
    let mut shards = 0;
    for &seed in &seeds {
        let o = run_seed(seed, layout, None).unwrap_or_else(|e| {
            panic!("{layout:?}, seed {seed} (PACKRAT_POWERLOSS_SEED={seed} reproduces it): {e}")
        });
        acked += o.acked;
        mid_run += u64::from(o.died_mid_run);
        *cuts
            .entry(o.cut_op.unwrap_or("none (after the last)"))
            .or_default() += 1;
        crash.files_rolled_back += o.crash.files_rolled_back;
        crash.bytes_lost += o.crash.bytes_lost;
        crash.bytes_torn_in += o.crash.bytes_torn_in;
        crash.dir_changes_undone += o.crash.dir_changes_undone;
        shards += o.shards;
    }
    println!(
        "power loss, {layout:?}: {} seeded crash points in {:.1} s, {acked} acknowledged operations checked; \
         the power went during: {cuts:?}; the cuts rolled back {} files, lost {} unsynced bytes, \
         tore in {} bytes and undid {} directory changes; {shards} shard files were left",
        seeds.len(),
        started.elapsed().as_secs_f64(),
        crash.files_rolled_back,
        crash.bytes_lost,
        crash.bytes_torn_in,
        crash.dir_changes_undone
    );
    if seeds.len() >= 100 {
        // The crash points fall inside the runs, and the cuts take something.
        assert!(
            mid_run * 10 >= seeds.len() as u64 * 7,
            "{mid_run} of {}",
            seeds.len()
        );
        assert!(crash.bytes_lost > 0 && crash.bytes_torn_in > 0 && crash.dir_changes_undone > 0);
        if layout == Layout::Erasure {
            // Segments were sealed, and the power went while one was.
            assert!(
                shards > 0 && cuts.contains_key("seal"),
                "{cuts:?}, {shards} shards"
            );
        }
    }
}

/// The harness finds the bugs it exists for: a store that acknowledges without the segment
/// fsync, or without the directory fsync of a new segment, loses acknowledged writes (or
/// leaves the index pointing at records that are gone) at some crash point, on one disk and
/// under erasure coding.
#[test]
fn a_planted_missing_fsync_is_caught() {
    for layout in [Layout::OneDisk, Layout::Erasure] {
        for (files, dirs, what) in [
            (true, false, "segment fsyncs"),
            (false, true, "directory fsyncs"),
        ] {
            let caught = (0..200).find_map(|seed| {
                run_seed(seed, layout, Some((files, dirs)))
                    .err()
                    .map(|e| (seed, e))
            });
            let Some((seed, e)) = caught else {
                panic!("{layout:?}: skipping {what} went unnoticed in 200 seeds");
            };
            println!("{layout:?}: skipping {what}: caught at seed {seed}: {e}");
        }
    }
}
