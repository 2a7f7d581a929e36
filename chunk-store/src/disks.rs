//! Data disks: choosing disks for new segments, marking failed ones, probing idle ones, and
//! their space for status.

use crate::io::{SegmentIo, read_exact_at};
use crate::{ChunkStore, ChunkStoreError, Result};
use std::path::{Path, PathBuf};

/// One data disk: a directory (a mount point in production) holding segment copies under
/// `segments/` and erasure-coded shards under `shards/`.
pub(crate) struct Disk {
    pub(crate) root: PathBuf,
    pub(crate) segments: PathBuf,
    pub(crate) shards: PathBuf,
    /// Set after an I/O error on this disk; new segments and rebuilt shards avoid it until a
    /// scrub finds it writable again.
    pub(crate) failed: std::sync::atomic::AtomicBool,
}

impl Disk {
    pub(crate) fn usable(&self) -> bool {
        !self.failed.load(std::sync::atomic::Ordering::Relaxed) && self.root.is_dir()
    }

    pub(crate) fn fail(&self, why: &dyn std::fmt::Display) {
        if !self.failed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::error!(disk = %self.root.display(), error = %why, "disk marked failed");
        }
    }
}

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct DiskStatus {
    pub path: String,
    pub online: bool,
    pub capacity_bytes: u64,
    pub free_bytes: u64,
    pub segment_copies: u64,
    pub shards: u64,
}

/// The file a disk probe writes, syncs, reads back and removes.
const PROBE_FILE: &str = ".packrat-probe";
/// Bytes a disk probe writes.
const PROBE_BYTES: usize = 4096;

/// (capacity, free) bytes of the file system holding `path`.
pub(crate) fn fs_space(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `s` a valid out-pointer for the call.
    if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
        return None;
    }
    let frsize = s.f_frsize as u64;
    Some((s.f_blocks as u64 * frsize, s.f_bavail as u64 * frsize))
}

/// One disk probe (see [`ChunkStore::probe_disks`]): a file is written, synced, read back,
/// compared and removed, through the store's file operations.
pub(crate) fn probe_disk(io: &dyn SegmentIo, root: &Path) -> std::io::Result<()> {
    let path = root.join(PROBE_FILE);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut data = vec![0u8; PROBE_BYTES];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (stamp >> ((i % 8) * 8)) as u8 ^ i as u8;
    }
    let result = (|| {
        let f = io.create(&path)?;
        io.write_at(&f, &path, &[&data], 0)?;
        io.sync(&f, &path, false)?;
        let mut back = vec![0u8; PROBE_BYTES];
        read_exact_at(io, &io.open(&path)?, &path, &mut back, 0)?;
        if back != data {
            return Err(std::io::Error::other(
                "read back differs from what was written",
            ));
        }
        Ok(())
    })();
    let _ = io.remove_file(&path);
    result
}

impl ChunkStore {
    /// The disks for segment `id`'s copies (or shards): `count` distinct usable disks,
    /// starting at `id mod disks` so that load spreads evenly.
    pub(crate) fn pick_disks(&self, id: u64, count: usize, avoid: &[usize]) -> Result<Vec<usize>> {
        let n = self.disks.len();
        let start = (id % n as u64) as usize;
        let chosen: Vec<usize> = (0..n)
            .map(|j| (start + j) % n)
            .filter(|d| !avoid.contains(d) && self.disks[*d].usable())
            .take(count)
            .collect();
        if chosen.len() < count {
            return Err(ChunkStoreError::Io {
                path: self.disks[0].root.clone(),
                source: std::io::Error::other(format!(
                    "need {count} healthy disks for segment {id}, have {}",
                    chosen.len()
                )),
            });
        }
        Ok(chosen)
    }

    /// Whether a write can be taken now: enough healthy disks for a new segment's copies (one,
    /// or M+1 under erasure coding K+M), each with room for a segment. `Err` says why not.
    pub fn write_readiness(&self) -> std::result::Result<(), String> {
        if self.read_only {
            return Err("the store was opened read-only".into());
        }
        let needed = self.ec.map_or(1, |(_, m)| m + 1);
        let usable: Vec<&Disk> = self.disks.iter().filter(|d| d.usable()).collect();
        if usable.len() < needed {
            return Err(format!(
                "{} of {} disks are healthy; a new segment needs {needed}",
                usable.len(),
                self.disks.len()
            ));
        }
        let room = self.options.segment_bytes_max;
        let with_room = usable
            .iter()
            .filter(|d| fs_space(&d.root).is_none_or(|(_, free)| free >= room))
            .count();
        if with_room < needed {
            let free = usable
                .iter()
                .map(|d| {
                    let free = fs_space(&d.root).map_or(0, |(_, f)| f);
                    format!("{} has {free} bytes free", d.root.display())
                })
                .collect::<Vec<_>>()
                .join(", ");
            return Err(format!(
                "disk full: {free}; a new segment needs {room} bytes on {needed} disk(s)"
            ));
        }
        Ok(())
    }

    /// Checks every disk in use the way a write does: a small file is written, synced, read
    /// back, compared and removed. A disk that fails (or whose directory is gone) is marked
    /// failed, as an I/O error during a write would: new segments and rebuilt shards avoid it
    /// until a scrub finds it writable again. This notices a disk that died while idle before
    /// a write or read trips over it. Returns the disks newly marked failed. Without erasure
    /// coding there is one disk and nothing to fail over to: no probe.
    pub fn probe_disks(&self) -> Vec<PathBuf> {
        let mut failed = Vec::new();
        if self.ec.is_none() || self.read_only {
            return failed;
        }
        for d in self.disks.iter().filter(|d| d.usable()) {
            if let Err(e) = probe_disk(&*self.io, &d.root) {
                use std::sync::atomic::Ordering::Relaxed;
                self.counters.disk_probe_failures.fetch_add(1, Relaxed);
                d.fail(&format_args!("disk probe: {e}"));
                failed.push(d.root.clone());
            }
        }
        failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn a_disk_that_fails_is_avoided_for_new_segments() {
        let dir = tempfile::tempdir().unwrap();
        let disks: Vec<PathBuf> = (0..6).map(|i| dir.path().join(format!("d{i}"))).collect();
        let s = ec_store(&disks, 1 << 20);
        // Disk 3 breaks: its segment directory becomes a file, so creating a segment there
        // fails (ENOTDIR).
        std::fs::remove_dir_all(disks[3].join("segments")).unwrap();
        std::fs::write(disks[3].join("segments"), b"broken").unwrap();
        let mut locs = Vec::new();
        for i in 0..60u32 {
            let (loc, t) = s.append([9; 16], i, &payload(i)).unwrap();
            s.sync_through(t).unwrap();
            locs.push(loc);
        }
        let st = s.ec_status().unwrap();
        assert!(!st.disks[3].online, "{st:?}");
        assert!(s.stats().segments > 5);
        // Sealing places shards on the five healthy disks only if it can: 4+2 needs six, so
        // the sealed segments stay mirrored, and readable.
        s.seal_due(None).unwrap();
        for (i, loc) in locs.iter().enumerate() {
            assert_eq!(s.read(loc, &[9; 16], i as u32).unwrap(), payload(i as u32));
        }
    }

    #[test]
    fn a_probe_finds_a_disk_that_fails_while_idle() {
        let dir = tempfile::tempdir().unwrap();
        let disks: Vec<PathBuf> = (0..6).map(|i| dir.path().join(format!("d{i}"))).collect();
        let s = ec_store(&disks, 1 << 20);
        assert!(s.probe_disks().is_empty());
        assert!(!disks[0].join(PROBE_FILE).exists(), "the probe cleans up");
        // Disk 2 breaks while nothing is written: its probe file cannot be created.
        std::fs::create_dir(disks[2].join(PROBE_FILE)).unwrap();
        assert_eq!(s.probe_disks(), vec![disks[2].clone()]);
        let st = s.ec_status().unwrap();
        assert!(!st.disks[2].online && st.disks[1].online, "{st:?}");
        assert_eq!(s.stats().disk_probe_failures, 1);
        // Reported once; new segments avoid it.
        assert!(s.probe_disks().is_empty());
        let (loc, t) = s.append([4; 16], 0, b"while degraded").unwrap();
        s.sync_through(t).unwrap();
        assert_eq!(s.read(&loc, &[4; 16], 0).unwrap(), b"while degraded");
        // Fixed: the next scrub takes it back.
        std::fs::remove_dir(disks[2].join(PROBE_FILE)).unwrap();
        s.scrub(None, &|_, _| {}).unwrap();
        assert!(s.ec_status().unwrap().disks[2].online);
        assert!(s.probe_disks().is_empty());
    }
}
