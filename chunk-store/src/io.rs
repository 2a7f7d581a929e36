//! The file operations of the chunk store, behind a trait: [`SegmentIo`].
//!
//! Every operation that changes or reads segment and shard files, or their directories, goes
//! through the store's `SegmentIo`: creating a file, positioned writes, `fdatasync`/`fsync`,
//! directory fsync, renames, removals and positioned reads; and the store asks it before the
//! operations that do not touch local segment files (tier transfers, index writes and deletes:
//! [`SegmentIo::before`]). [`RealIo`] is the file system. [`FaultyIo`] wraps it for tests
//! (`packrat serve --fault-injection`): rules fail chosen operations with EIO or ENOSPC, or
//! tear a write, from the Nth matching operation on, a given number of times, or one in every
//! n (intermittent). A power-loss simulation (what was not synced is lost) is one more
//! implementation of the same trait.
//!
//! The fast read paths (page-cache probes with `RWF_NOWAIT`, io_uring, mapped reads) use the
//! file descriptors directly, for speed; an implementation that must see every read answers
//! false to [`SegmentIo::raw_reads`], and the store then reads only through
//! [`SegmentIo::read_at`].

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::faults::Fault;

/// The kinds of operation a fault rule can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IoOp {
    /// Creating a segment, shard or probe file.
    Create,
    /// A positioned write (a record append, a shard row, a segment file for a tier).
    Write,
    /// `fdatasync` or `fsync` of a file.
    Sync,
    /// `fsync` of a directory after a create, rename or removal.
    SyncDir,
    /// A positioned read of a segment or shard file (opening one is not a fault point: a
    /// failing disk shows in its reads).
    Read,
    /// Renaming a finished shard into place.
    Rename,
    /// Removing a file.
    Remove,
    /// Uploading a segment to a tier, reading from one, deleting from one.
    TierUpload,
    TierRead,
    TierDelete,
    /// A synced index write, or an index write that deletes.
    IndexWrite,
    IndexDelete,
}

/// File operations on segment and shard files and their directories. `path` names the file
/// operated on (for fault rules and for a power-loss simulation to track it).
pub trait SegmentIo: Send + Sync + std::fmt::Debug {
    /// Creates a new file for reading and writing; fails if it exists.
    fn create_new(&self, path: &Path) -> std::io::Result<File>;
    /// Creates (or truncates) a file for writing.
    fn create(&self, path: &Path) -> std::io::Result<File>;
    /// Opens a file for reading.
    fn open(&self, path: &Path) -> std::io::Result<File>;
    /// Writes `bufs`, in order, at `offset` (all of them, or an error).
    fn write_at(
        &self,
        file: &File,
        path: &Path,
        bufs: &[&[u8]],
        offset: u64,
    ) -> std::io::Result<()>;
    /// Reads into `buf` at `offset`; fewer bytes only at the end of the file.
    fn read_at(
        &self,
        file: &File,
        path: &Path,
        buf: &mut [u8],
        offset: u64,
    ) -> std::io::Result<usize>;
    /// `fdatasync` (`all`: `fsync`).
    fn sync(&self, file: &File, path: &Path, all: bool) -> std::io::Result<()>;
    /// `fsync` of a directory, so that entries created, renamed or removed in it persist.
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()>;
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()>;
    fn remove_file(&self, path: &Path) -> std::io::Result<()>;
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()>;
    /// Asked before an operation that does not go through the methods above (tier transfers,
    /// index writes); an error fails that operation.
    fn before(&self, op: IoOp, what: &Path) -> std::io::Result<()>;
    /// Whether reads may bypass [`read_at`](Self::read_at) (page-cache probes, io_uring,
    /// mappings of the files).
    fn raw_reads(&self) -> bool;
}

/// Reads exactly `buf.len()` bytes at `offset` through `io`; a short file is `UnexpectedEof`.
pub(crate) fn read_exact_at(
    io: &dyn SegmentIo,
    file: &File,
    path: &Path,
    buf: &mut [u8],
    offset: u64,
) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        match io.read_at(file, path, &mut buf[done..], offset + done as u64)? {
            0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            n => done += n,
        }
    }
    Ok(())
}

/// The file system, as it is.
#[derive(Debug, Default, Clone, Copy)]
pub struct RealIo;

impl SegmentIo for RealIo {
    fn create_new(&self, path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(path)
    }

    fn create(&self, path: &Path) -> std::io::Result<File> {
        OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
    }

    fn open(&self, path: &Path) -> std::io::Result<File> {
        File::open(path)
    }

    fn write_at(
        &self,
        file: &File,
        _path: &Path,
        bufs: &[&[u8]],
        offset: u64,
    ) -> std::io::Result<()> {
        match bufs {
            [one] => file.write_all_at(one, offset),
            [header, payload] => write_all_vectored_at(file, header, payload, offset),
            _ => {
                let mut at = offset;
                for b in bufs {
                    file.write_all_at(b, at)?;
                    at += b.len() as u64;
                }
                Ok(())
            }
        }
    }

    fn read_at(
        &self,
        file: &File,
        _path: &Path,
        buf: &mut [u8],
        offset: u64,
    ) -> std::io::Result<usize> {
        loop {
            match file.read_at(buf, offset) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }

    fn sync(&self, file: &File, _path: &Path, all: bool) -> std::io::Result<()> {
        if all {
            file.sync_all()
        } else {
            file.sync_data()
        }
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        std::fs::remove_file(path)
    }

    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        std::fs::create_dir_all(dir)
    }

    fn before(&self, _op: IoOp, _what: &Path) -> std::io::Result<()> {
        Ok(())
    }

    fn raw_reads(&self) -> bool {
        true
    }
}

/// Writes `header` then `payload` at `offset` with `pwritev`, so the record is not first
/// copied into one buffer (for 1 MiB chunks that copy, and the fresh pages it touched, cost
/// more CPU than the write itself).
fn write_all_vectored_at(
    file: &File,
    header: &[u8],
    payload: &[u8],
    offset: u64,
) -> std::io::Result<()> {
    use std::os::unix::io::AsRawFd;
    let total = header.len() + payload.len();
    let mut done = 0usize;
    while done < total {
        let (h, p) = if done < header.len() {
            (&header[done..], payload)
        } else {
            (&header[..0], &payload[done - header.len()..])
        };
        let iov = [
            libc::iovec {
                iov_base: h.as_ptr() as *mut libc::c_void,
                iov_len: h.len(),
            },
            libc::iovec {
                iov_base: p.as_ptr() as *mut libc::c_void,
                iov_len: p.len(),
            },
        ];
        let at = i64::try_from(offset + done as u64)
            .map_err(|_| std::io::Error::other("offset past i64"))?;
        // SAFETY: both iovecs point into slices that stay borrowed for the call; the kernel
        // only reads from them.
        let n = unsafe { libc::pwritev(file.as_raw_fd(), iov.as_ptr(), 2, at) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(std::io::Error::from(std::io::ErrorKind::WriteZero));
        }
        done += n as usize;
    }
    Ok(())
}

/// One fault rule of [`FaultyIo`]: which operations it hits and how.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    pub op: IoOp,
    /// EIO, ENOSPC, or (writes only) a torn write: half the bytes reach the file, then EIO.
    pub fault: Fault,
    /// Only operations on paths containing this string.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// Matching operations let through before the first failure.
    #[serde(default)]
    pub after: u64,
    /// How many operations fail (then the rule lets everything through); none: no end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u64>,
    /// Fail one matching operation in every `every` (1 or 0: each one).
    #[serde(default)]
    pub every: u64,
}

#[derive(Debug)]
struct Armed {
    rule: FaultRule,
    seen: AtomicU64,
    failed: AtomicU64,
}

impl Armed {
    /// Counts one matching operation and says whether it fails.
    fn hit(&self) -> bool {
        let n = self.seen.fetch_add(1, Relaxed);
        let Some(k) = n.checked_sub(self.rule.after) else {
            return false;
        };
        if !k.is_multiple_of(self.rule.every.max(1)) {
            return false;
        }
        match self.rule.times {
            None => {
                self.failed.fetch_add(1, Relaxed);
                true
            }
            Some(t) => self
                .failed
                .fetch_update(Relaxed, Relaxed, |f| (f < t).then_some(f + 1))
                .is_ok(),
        }
    }
}

/// [`RealIo`] with fault rules, set and cleared while the store runs. With no rule set it
/// costs one uncontended lock per operation, and reads all go through [`read_at`]
/// (no page-cache probes, io_uring or mappings), so that read rules see every read.
///
/// [`read_at`]: SegmentIo::read_at
#[derive(Debug, Default)]
pub struct FaultyIo {
    rules: Mutex<Vec<Armed>>,
    injected: AtomicU64,
}

impl FaultyIo {
    /// Replaces the rules (an empty list clears every fault).
    pub fn set_rules(&self, rules: Vec<FaultRule>) {
        let armed = rules
            .into_iter()
            .filter(|r| r.fault != Fault::None)
            .map(|rule| Armed {
                rule,
                seen: AtomicU64::new(0),
                failed: AtomicU64::new(0),
            })
            .collect();
        *self.rules.lock().unwrap_or_else(|p| p.into_inner()) = armed;
    }

    /// The rules in force.
    pub fn rules(&self) -> Vec<FaultRule> {
        self.rules
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|a| a.rule.clone())
            .collect()
    }

    /// Operations failed on purpose so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Relaxed)
    }

    /// The fault that hits this operation, if any (every matching rule counts it).
    fn hit(&self, op: IoOp, path: &Path) -> Option<Fault> {
        // Counted under the lock (atomics only, nothing blocks), so no copy of the rules.
        let rules = self.rules.lock().unwrap_or_else(|p| p.into_inner());
        let mut fault = None;
        for a in rules.iter().filter(|a| a.rule.op == op) {
            if let Some(p) = &a.rule.path
                && !path.to_string_lossy().contains(p.as_str())
            {
                continue;
            }
            if a.hit() && fault.is_none() {
                fault = Some(a.rule.fault);
            }
        }
        drop(rules);
        if fault.is_some() {
            self.injected.fetch_add(1, Relaxed);
        }
        fault
    }

    fn check(&self, op: IoOp, path: &Path) -> std::io::Result<()> {
        match self.hit(op, path) {
            None => Ok(()),
            Some(Fault::Slow) => {
                std::thread::sleep(crate::faults::SLOW);
                Ok(())
            }
            Some(f) => Err(injected_error(f)),
        }
    }
}

/// The error an injected fault returns.
pub(crate) fn injected_error(f: Fault) -> std::io::Error {
    match f {
        Fault::Enospc => std::io::Error::from_raw_os_error(libc::ENOSPC),
        _ => std::io::Error::from_raw_os_error(libc::EIO),
    }
}

impl SegmentIo for FaultyIo {
    fn create_new(&self, path: &Path) -> std::io::Result<File> {
        self.check(IoOp::Create, path)?;
        RealIo.create_new(path)
    }

    fn create(&self, path: &Path) -> std::io::Result<File> {
        self.check(IoOp::Create, path)?;
        RealIo.create(path)
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
        match self.hit(IoOp::Write, path) {
            None => RealIo.write_at(file, path, bufs, offset),
            Some(Fault::Slow) => {
                std::thread::sleep(crate::faults::SLOW);
                RealIo.write_at(file, path, bufs, offset)
            }
            Some(Fault::Torn) => {
                // Half the bytes reach the file, as in a write cut short by a crash or a
                // failing disk.
                let all = bufs.concat();
                let _ = file.write_all_at(&all[..all.len() / 2], offset);
                Err(injected_error(Fault::Eio))
            }
            Some(f) => Err(injected_error(f)),
        }
    }

    fn read_at(
        &self,
        file: &File,
        path: &Path,
        buf: &mut [u8],
        offset: u64,
    ) -> std::io::Result<usize> {
        self.check(IoOp::Read, path)?;
        RealIo.read_at(file, path, buf, offset)
    }

    fn sync(&self, file: &File, path: &Path, all: bool) -> std::io::Result<()> {
        self.check(IoOp::Sync, path)?;
        RealIo.sync(file, path, all)
    }

    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        self.check(IoOp::SyncDir, dir)?;
        RealIo.sync_dir(dir)
    }

    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        self.check(IoOp::Rename, to)?;
        RealIo.rename(from, to)
    }

    fn remove_file(&self, path: &Path) -> std::io::Result<()> {
        self.check(IoOp::Remove, path)?;
        RealIo.remove_file(path)
    }

    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        self.check(IoOp::Create, dir)?;
        RealIo.create_dir_all(dir)
    }

    fn before(&self, op: IoOp, what: &Path) -> std::io::Result<()> {
        self.check(op, what)
    }

    fn raw_reads(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rule(op: IoOp, after: u64, times: Option<u64>, every: u64) -> FaultRule {
        FaultRule {
            op,
            fault: Fault::Eio,
            path: None,
            after,
            times,
            every,
        }
    }

    fn pattern(io: &FaultyIo, op: IoOp, n: usize) -> String {
        (0..n)
            .map(|_| {
                if io.before(op, Path::new("/x/seg")).is_err() {
                    'x'
                } else {
                    '.'
                }
            })
            .collect()
    }

    #[test]
    fn rules_fail_the_chosen_operations() {
        let io = FaultyIo::default();
        assert_eq!(pattern(&io, IoOp::Write, 4), "....");
        io.set_rules(vec![rule(IoOp::Write, 2, Some(3), 0)]);
        assert_eq!(pattern(&io, IoOp::Write, 8), "..xxx...");
        assert_eq!(pattern(&io, IoOp::Sync, 3), "...", "other operations pass");
        io.set_rules(vec![rule(IoOp::Read, 1, None, 3)]);
        assert_eq!(pattern(&io, IoOp::Read, 10), ".x..x..x..");
        assert_eq!(io.injected(), 6);
        let mut only = rule(IoOp::Sync, 0, None, 0);
        only.path = Some("shards".into());
        io.set_rules(vec![only]);
        assert!(io.before(IoOp::Sync, Path::new("/d/segments/a")).is_ok());
        let e = io.before(IoOp::Sync, Path::new("/d/shards/a")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        io.set_rules(Vec::new());
        assert_eq!(pattern(&io, IoOp::Sync, 3), "...");
    }

    #[test]
    fn a_torn_write_leaves_half_the_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let io = FaultyIo::default();
        let file = io.create_new(&path).unwrap();
        io.set_rules(vec![FaultRule {
            fault: Fault::Torn,
            ..rule(IoOp::Write, 0, Some(1), 0)
        }]);
        let e = io
            .write_at(&file, &path, &[b"head", b"payload!"], 0)
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EIO));
        assert_eq!(std::fs::read(&path).unwrap(), b"headpa");
        io.write_at(&file, &path, &[b"head", b"payload!"], 0)
            .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"headpayload!");
    }
}
