//! A power-loss simulation under the chunk store, for tests: [`PowerLossIo`].
//!
//! Every write goes to the real file (so reads, including the fast paths, see what a running
//! system sees), and the simulation remembers what the kernel would have made durable: each
//! file's content as of its last `fsync`/`fdatasync`, and each directory's entries as of its
//! last directory fsync. [`PowerLossIo::crash`], called while nothing uses the files (the store
//! dropped, as a crashed process would be), puts the disk in the state a power cut would leave:
//! every file back to its durable content (optionally with part of the first unsynced page
//! torn in), files created since their directory's last fsync gone, files removed since then
//! back, renames since then undone. The store is then reopened on the files as they are, and a
//! test checks that every acknowledged write is there.
//!
//! It covers the chunk store's own files (segments, shards, probes). The index (RocksDB) does
//! its own file I/O with synced writes: an index write that returned is durable, which is what
//! this simulation assumes of it.

use crate::io::{IoOp, RealIo, SegmentIo};
use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The page a torn write may leave partly written.
const PAGE_BYTES: usize = 4096;

#[derive(Debug, Default)]
struct Sim {
    /// Files written through the simulation since the last crash: their durable content (what
    /// the last fsync made durable; empty if never synced).
    durable: HashMap<PathBuf, Vec<u8>>,
    /// Directory changes not yet made durable by a directory fsync, per directory, in order.
    pending: HashMap<PathBuf, Vec<DirChange>>,
    /// Operations counted, for seeded crash points.
    ops: u64,
    /// The machine dies after this many operations: later ones fail and change nothing.
    dead_after: Option<u64>,
    /// Planted bugs (see [`PowerLossIo::forget_syncs`]).
    forget_syncs: (bool, bool),
}

impl Sim {
    /// Counts an operation; an error if the machine is already dead.
    fn op(&mut self) -> std::io::Result<()> {
        if self.dead_after.is_some_and(|d| self.ops >= d) {
            return Err(std::io::Error::from_raw_os_error(libc::EIO));
        }
        self.ops += 1;
        Ok(())
    }
}

#[derive(Debug)]
enum DirChange {
    Created(PathBuf),
    /// A removed file and its durable content, to bring back.
    Removed(PathBuf, Vec<u8>),
    /// A rename, and the durable content of the file it replaced (if any).
    Renamed {
        from: PathBuf,
        to: PathBuf,
        replaced: Option<Vec<u8>>,
    },
}

/// What a simulated crash did, for a test's message.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CrashReport {
    /// Files put back to their last synced content, and the bytes that were lost.
    pub files_rolled_back: u64,
    pub bytes_lost: u64,
    /// Bytes of a lost tail kept as a torn page.
    pub bytes_torn_in: u64,
    /// Directory changes undone (creates, removes, renames).
    pub dir_changes_undone: u64,
}

/// The file system as a power cut would leave it (see the module docs).
#[derive(Debug, Default)]
pub struct PowerLossIo {
    sim: Mutex<Sim>,
}

fn parent(p: &Path) -> PathBuf {
    p.parent().map(Path::to_path_buf).unwrap_or_default()
}

impl PowerLossIo {
    fn sim(&self) -> std::sync::MutexGuard<'_, Sim> {
        self.sim.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The power goes after `ops` more file operations: from then on every operation fails
    /// with EIO and changes nothing (what the dead machine never did), until [`crash`].
    ///
    /// [`crash`]: Self::crash
    pub fn die_after(&self, ops: u64) {
        let mut sim = self.sim();
        sim.dead_after = Some(sim.ops + ops);
    }

    /// Whether the power is gone (an operation failed for it since the last [`crash`]).
    ///
    /// [`crash`]: Self::crash
    pub fn is_dead(&self) -> bool {
        let sim = self.sim();
        sim.dead_after.is_some_and(|d| sim.ops >= d)
    }

    /// Plants a bug, for tests of the harnesses built on the simulation: file syncs (`files`)
    /// or directory syncs (`dirs`) succeed but make nothing durable, as if the store had
    /// acknowledged without them. A harness that passes with this set finds nothing.
    pub fn forget_syncs(&self, files: bool, dirs: bool) {
        self.sim().forget_syncs = (files, dirs);
    }

    /// Applies a power cut to the files: see the module docs. `tear_seed`, if given, keeps a
    /// pseudo-random part of the first lost page of each rolled-back file (a torn write).
    /// Afterwards the files as they are count as durable.
    pub fn crash(&self, tear_seed: Option<u64>) -> std::io::Result<CrashReport> {
        let mut sim = self.sim();
        let mut report = CrashReport::default();
        // Directory changes first, newest first, so every file is back under its durable name.
        let pending = std::mem::take(&mut sim.pending);
        for (_, changes) in pending {
            for c in changes.into_iter().rev() {
                report.dir_changes_undone += 1;
                match c {
                    DirChange::Created(p) => {
                        let _ = std::fs::remove_file(&p);
                        sim.durable.remove(&p);
                    }
                    DirChange::Removed(p, content) => {
                        std::fs::write(&p, &content)?;
                        sim.durable.insert(p, content);
                    }
                    DirChange::Renamed { from, to, replaced } => {
                        if to.exists() {
                            std::fs::rename(&to, &from)?;
                        }
                        if let Some(d) = sim.durable.remove(&to) {
                            sim.durable.insert(from, d);
                        }
                        if let Some(content) = replaced {
                            std::fs::write(&to, &content)?;
                            sim.durable.insert(to, content);
                        }
                    }
                }
            }
        }
        let mut rng = tear_seed.unwrap_or(0) | 1;
        for (path, durable) in std::mem::take(&mut sim.durable) {
            let Ok(now) = std::fs::read(&path) else {
                continue;
            };
            if now == durable {
                continue;
            }
            let mut keep = durable.clone();
            if tear_seed.is_some() && now.len() > durable.len() && now.starts_with(&durable) {
                // xorshift: a reproducible length of the next page.
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                let extra = (rng as usize % PAGE_BYTES).min(now.len() - durable.len());
                keep.extend_from_slice(&now[durable.len()..durable.len() + extra]);
                report.bytes_torn_in += extra as u64;
            }
            report.files_rolled_back += 1;
            report.bytes_lost += now.len().saturating_sub(keep.len()) as u64;
            std::fs::write(&path, &keep)?;
        }
        sim.ops = 0;
        sim.dead_after = None;
        Ok(report)
    }
}

impl SegmentIo for PowerLossIo {
    fn create_new(&self, path: &Path) -> std::io::Result<File> {
        let mut sim = self.sim();
        sim.op()?;
        let f = RealIo.create_new(path)?;
        sim.durable.insert(path.to_path_buf(), Vec::new());
        sim.pending
            .entry(parent(path))
            .or_default()
            .push(DirChange::Created(path.to_path_buf()));
        Ok(f)
    }

    fn create(&self, path: &Path) -> std::io::Result<File> {
        let mut sim = self.sim();
        sim.op()?;
        let existed = path.exists();
        let old = existed.then(|| std::fs::read(path).unwrap_or_default());
        let f = RealIo.create(path)?;
        match old {
            // Truncating an existing file: its durable content stays until the next sync.
            Some(content) => {
                sim.durable.entry(path.to_path_buf()).or_insert(content);
            }
            None => {
                sim.durable.insert(path.to_path_buf(), Vec::new());
                sim.pending
                    .entry(parent(path))
                    .or_default()
                    .push(DirChange::Created(path.to_path_buf()));
            }
        }
        Ok(f)
    }

    fn open(&self, path: &Path) -> std::io::Result<File> {
        RealIo.open(path)
    }

    fn write_at(
        &self,
        file: &File,
        path: &Path,
        bufs: &[&[u8]],
        offset: u64,
    ) -> std::io::Result<()> {
        {
            let mut sim = self.sim();
            sim.op()?;
            if !sim.durable.contains_key(path) {
                // A file from before the simulation started: durable as it was.
                let content = std::fs::read(path).unwrap_or_default();
                sim.durable.insert(path.to_path_buf(), content);
            }
        }
        RealIo.write_at(file, path, bufs, offset)
    }

    fn read_at(
        &self,
        file: &File,
        path: &Path,
        buf: &mut [u8],
        offset: u64,
    ) -> std::io::Result<usize> {
        RealIo.read_at(file, path, buf, offset)
    }

    fn sync(&self, file: &File, path: &Path, all: bool) -> std::io::Result<()> {
        let mut sim = self.sim();
        sim.op()?;
        RealIo.sync(file, path, all)?;
        if sim.forget_syncs.0 {
            return Ok(());
        }
        let content = std::fs::read(path)?;
        sim.durable.insert(path.to_path_buf(), content);
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        let mut sim = self.sim();
        sim.op()?;
        RealIo.sync_dir(dir)?;
        if sim.forget_syncs.1 {
            return Ok(());
        }
        sim.pending.remove(dir);
        Ok(())
    }

    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        let mut sim = self.sim();
        sim.op()?;
        let replaced = to.exists().then(|| {
            sim.durable
                .get(to)
                .cloned()
                .unwrap_or_else(|| std::fs::read(to).unwrap_or_default())
        });
        RealIo.rename(from, to)?;
        if let Some(d) = sim.durable.remove(from) {
            sim.durable.insert(to.to_path_buf(), d);
        }
        sim.pending
            .entry(parent(to))
            .or_default()
            .push(DirChange::Renamed {
                from: from.to_path_buf(),
                to: to.to_path_buf(),
                replaced,
            });
        Ok(())
    }

    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        let mut sim = self.sim();
        sim.op()?;
        let content = sim
            .durable
            .get(path)
            .cloned()
            .unwrap_or_else(|| std::fs::read(path).unwrap_or_default());
        RealIo.remove_file(path)?;
        sim.durable.remove(path);
        sim.pending
            .entry(parent(path))
            .or_default()
            .push(DirChange::Removed(path.to_path_buf(), content));
        Ok(())
    }

    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        RealIo.create_dir_all(dir)
    }

    /// Index writes and deletes, and tier transfers, are crash points too: after the power
    /// is gone they fail (the dead machine never made them). One that returned is durable
    /// (the index writes synced).
    fn before(&self, op: IoOp, _what: &Path) -> std::io::Result<()> {
        match op {
            IoOp::IndexWrite
            | IoOp::IndexDelete
            | IoOp::TierUpload
            | IoOp::TierRead
            | IoOp::TierDelete => self.sim().op(),
            _ => Ok(()),
        }
    }

    fn raw_reads(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use std::sync::Arc;

    /// Appends records until a seeded crash point (counted in file operations), acknowledging
    /// each after `sync_through`; then crashes, reopens and answers the acknowledged records
    /// that do not read back intact.
    fn lost_after_crash(sim: Arc<PowerLossIo>, seed: u64) -> (Vec<u32>, CrashReport) {
        let dir = tempfile::tempdir().unwrap();
        let s = ChunkStore::open(
            dir.path(),
            ChunkStoreOptions {
                segment_bytes_max: 16 * 1024,
                io: sim.clone(),
                ..Default::default()
            },
        )
        .unwrap();
        // The power goes at a seeded operation: an append, a sync, or anywhere inside a
        // rotation (segment creation, its header, its fsync, its directory's fsync).
        sim.die_after(seed % 97);
        let mut acked = Vec::new();
        for i in 0..400u32 {
            let data = payload(i % 3);
            let Ok((loc, t)) = s.append([5; 16], i, &data) else {
                break;
            };
            // Every other record waits for durability before the next; the rest are in flight
            // at the crash.
            if i % 2 == 0 {
                if s.sync_through(t).is_err() {
                    break;
                }
                acked.push((i, loc, data));
            }
        }
        drop(s);
        let report = sim.crash(Some(seed)).unwrap();
        // A store that cannot even open after the cut has lost everything.
        let Ok(s) = ChunkStore::open(dir.path(), ChunkStoreOptions::default()) else {
            return (acked.into_iter().map(|(i, _, _)| i).collect(), report);
        };
        let lost = acked
            .into_iter()
            .filter(|(i, loc, data)| s.read(loc, &[5; 16], *i).ok().as_ref() != Some(data))
            .map(|(i, _, _)| i)
            .collect();
        (lost, report)
    }

    #[test]
    fn acknowledged_appends_survive_every_simulated_power_cut() {
        let mut cut = CrashReport::default();
        for seed in 0..200 {
            let (lost, report) = lost_after_crash(Arc::default(), seed);
            assert!(
                lost.is_empty(),
                "seed {seed}: acknowledged records lost: {lost:?}"
            );
            cut.bytes_lost += report.bytes_lost;
            cut.bytes_torn_in += report.bytes_torn_in;
            cut.dir_changes_undone += report.dir_changes_undone;
        }
        // The cuts did cut: unsynced bytes went, torn pages came in, and segment files created
        // after the last directory fsync vanished, at some crash points.
        assert!(
            cut.bytes_lost > 0 && cut.bytes_torn_in > 0 && cut.dir_changes_undone > 0,
            "{cut:?}"
        );
    }

    /// The simulation catches the bugs it exists for: acknowledging without the file fsync,
    /// or without the directory fsync of a new segment, loses acknowledged records at some
    /// crash point.
    #[test]
    fn a_missing_fsync_is_caught() {
        for (file_syncs, dir_syncs) in [(true, false), (false, true)] {
            let caught = (0..200).any(|seed| {
                let sim = Arc::new(PowerLossIo::default());
                sim.forget_syncs(file_syncs, dir_syncs);
                !lost_after_crash(sim, seed).0.is_empty()
            });
            assert!(
                caught,
                "skipping {} went unnoticed",
                if file_syncs {
                    "file fsyncs"
                } else {
                    "directory fsyncs"
                }
            );
        }
    }
}
