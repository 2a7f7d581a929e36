//! packrat-chunk-store: object bytes in append-only segment files.
//!
//! Owns the segment files under `<data-dir>/segments/`, the record ("needle") format, group
//! commit (many appends share one `fdatasync`) and checksum-verified positioned reads.
//! Main types: [`ChunkStore`], [`RecordLocation`], [`WriteTicket`].
//!
//! It knows nothing of buckets, keys, HTTP or RocksDB: the caller keeps the record locations in
//! its index. It must never depend on the gateway or the index crate.
//!
//! Durability contract: [`ChunkStore::append`] writes a record into the page cache and returns a
//! [`WriteTicket`]; the record is durable only once [`ChunkStore::sync_through`] has returned
//! `Ok` for that ticket. Concurrent callers of `sync_through` share one `fdatasync`.
//!
//! Crash contract: after a restart the store never appends to an old segment; it opens a new
//! one. Records torn by a crash therefore sit only at the tail of an old segment, beyond every
//! record that was ever made durable, and no index entry points at them (the caller only indexes
//! records after `sync_through`). Every read checks the record header and the payload crc32c,
//! so a torn or rotted record is reported as [`ChunkStoreError::Corrupt`], never served.
//!
//! Modules, by duty: `catalog` (opening the store, the segment catalog, retiring segments),
//! `disks` (disk choice, failure and probes), `append` (segment creation, appends, rotation,
//! group commit), `read` (verified single-record and span reads), `scatter` (many records into
//! one buffer: vectored page-cache reads and mapped reads), `ec` (the shard format and shard
//! sets) and `upkeep` (sealing into shards, scrub and repair), `segment_file` (standalone
//! segment files and scans), `record` (the byte layouts), `faults` (test fault injection).

mod append;
mod catalog;
mod disks;
pub mod ec;
mod faults;
pub mod io;
mod mapped;
mod placement;
pub mod powerloss;
mod read;
mod record;
mod scatter;
mod segment_file;
mod upkeep;
mod uring;

pub use disks::DiskStatus;
pub use faults::Fault;
pub use io::{FaultRule, FaultyIo, IoOp, RealIo, SegmentIo};
pub use powerloss::{CrashReport, PowerLossIo};
pub use read::Span;
pub use record::{
    RECORD_HEADER_BYTES, RecordHeader, SEGMENT_HEADER_BYTES, SegmentHeader, decode_record_header,
};
pub use scatter::SCATTER_GAP_BYTES_MAX;
pub use segment_file::{SegmentFileWriter, SegmentScan, scan_segment};
pub use upkeep::{EcStatus, ScrubReport};

use crate::append::ActiveSegment;
use crate::disks::Disk;
use crate::placement::{Placement, segment_path};
use crate::read::Handle;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, RwLock};

/// The largest payload one record may carry. Large objects are split into chunks of at most
/// this size by the caller, so a read of any record needs a bounded buffer.
pub const RECORD_PAYLOAD_BYTES_MAX: u32 = 16 * 1024 * 1024;

/// Default size at which the active segment is closed and a new one started.
pub const SEGMENT_BYTES_DEFAULT: u64 = 1024 * 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ChunkStoreError {
    #[error("i/o error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("disk full writing {path}")]
    NoSpace { path: PathBuf },
    #[error("corrupt record in segment {segment_id} at offset {offset}: {reason}")]
    Corrupt {
        segment_id: u64,
        offset: u64,
        reason: String,
    },
    #[error("segment {0} is missing")]
    MissingSegment(u64),
    #[error("record payload of {0} bytes exceeds the limit of {RECORD_PAYLOAD_BYTES_MAX}")]
    RecordTooLarge(usize),
    #[error("segment {segment_id} cannot be rebuilt: {reason}")]
    Unrecoverable { segment_id: u64, reason: String },
    #[error("configuration: {0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, ChunkStoreError>;

fn io_err(path: &Path, source: std::io::Error) -> ChunkStoreError {
    if source.raw_os_error() == Some(libc_enospc()) {
        ChunkStoreError::NoSpace {
            path: path.to_path_buf(),
        }
    } else {
        ChunkStoreError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}

/// ENOSPC is 28 on every Linux architecture; spelt out to avoid a libc dependency.
const fn libc_enospc() -> i32 {
    28
}

/// Where one record lives: the payload is `len` bytes after the record header at `offset`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordLocation {
    pub segment_id: u64,
    /// Offset of the record header within the segment file.
    pub offset: u64,
    /// Payload length in bytes (the header is not counted).
    pub len: u32,
}

/// One record for [`ChunkStore::read_cached_records_into`] to read and verify: its location and
/// identity, and where in the caller's buffer its payload goes (`dst..dst + loc.len`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordRead {
    pub loc: RecordLocation,
    pub object_id: [u8; 16],
    pub chunk_index: u32,
    pub dst: usize,
}

/// Proof of an append, to be passed to [`ChunkStore::sync_through`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct WriteTicket {
    segment_id: u64,
    end_offset: u64,
}

/// How records are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoBackend {
    /// A non-blocking `preadv2(RWF_NOWAIT)` first, which succeeds when the record is in the
    /// page cache; io_uring for the rest, if the kernel (and any seccomp policy) allows it,
    /// else a plain `pread`. Hot records then cost one syscall on the caller's thread, and
    /// cold ones never block it.
    #[default]
    Auto,
    /// Every read through io_uring (or fail to open).
    Uring,
    /// Positioned `pread` calls by the caller's thread.
    Pread,
}

pub struct ChunkStoreOptions {
    pub segment_bytes_max: u64,
    pub io_backend: IoBackend,
    /// Disk directories for erasure coding (used only with `ec`).
    pub disks: Vec<PathBuf>,
    /// Erasure coding `(k, m)` across `disks`; `None` keeps every segment in one directory.
    pub ec: Option<(usize, usize)>,
    /// The file operations: [`RealIo`], or a test's [`FaultyIo`] or simulation.
    pub io: Arc<dyn SegmentIo>,
}

impl Default for ChunkStoreOptions {
    fn default() -> Self {
        Self {
            segment_bytes_max: SEGMENT_BYTES_DEFAULT,
            io_backend: IoBackend::Auto,
            disks: Vec::new(),
            ec: None,
            io: Arc::new(RealIo),
        }
    }
}

/// Completion callback of [`ChunkStore::read_with`].
pub type RecordDone = Box<dyn FnOnce(Result<Vec<u8>>) + Send>;

/// Statistics for metrics and `admin status`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChunkStoreStats {
    pub segments: u64,
    pub active_segment_id: u64,
    pub active_segment_bytes: u64,
    /// fdatasync calls made by group commit.
    pub syncs: u64,
    /// Records appended; `appends / syncs` is the mean group-commit batch.
    pub appends: u64,
    pub appended_bytes: u64,
    /// Reads served from another copy or rebuilt from other shards.
    pub degraded_reads: u64,
    /// Reads that failed because too little redundancy was left.
    pub unrecoverable_reads: u64,
    /// Segments encoded into shards, and their bytes.
    pub segments_encoded: u64,
    pub bytes_encoded: u64,
    /// Shards written anew by repair.
    pub shards_rebuilt: u64,
    /// Shards found missing or corrupt (by reads or by scrub).
    pub shard_faults_found: u64,
    /// Disk probes that failed (each marks its disk failed).
    pub disk_probe_failures: u64,
}

#[derive(Default)]
struct EcCounters {
    degraded_reads: AtomicU64,
    unrecoverable_reads: AtomicU64,
    segments_encoded: AtomicU64,
    bytes_encoded: AtomicU64,
    shards_rebuilt: AtomicU64,
    shard_faults_found: AtomicU64,
    disk_probe_failures: AtomicU64,
}

pub struct ChunkStore {
    disks: Vec<Disk>,
    /// Erasure coding `(k, m)`, or `None` for a single disk.
    ec: Option<(usize, usize)>,
    options: ChunkStoreOptions,
    active: Mutex<ActiveSegment>,
    /// Serialises `fdatasync` callers; holds the highest ticket known durable.
    durable: Mutex<WriteTicket>,
    catalog: Mutex<BTreeMap<u64, Placement>>,
    readers: RwLock<HashMap<u64, Arc<Handle>>>,
    stats: Mutex<ChunkStoreStats>,
    counters: EcCounters,
    /// Segments a read found damaged, for the background repair.
    suspects: Mutex<BTreeSet<u64>>,
    uring: Option<uring::UringReader>,
    /// Segments removed by compaction whose open handles are kept a while (see
    /// [`ChunkStore::retire_segment`]), with the time their handle may be closed.
    retired: Mutex<Vec<(u64, std::time::Instant)>>,
    /// Serialises sealing, repair and scrub.
    maintenance: Mutex<()>,
    /// Opened by [`ChunkStore::open_read_only`].
    read_only: bool,
    /// Set while too few disks are healthy to encode (logged once).
    seal_blocked: std::sync::atomic::AtomicBool,
    /// Every file operation goes through this (the file system, or a test's faulty one).
    io: Arc<dyn SegmentIo>,
    /// Mapped reads are paused until this many milliseconds after `opened` (a mapped copy
    /// waited for the disk: the data is not hot).
    mapped_paused_until_ms: AtomicU64,
    opened: std::time::Instant,
}

pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

impl ChunkStore {
    /// The single-disk segment directory (the first disk's with erasure coding).
    pub fn dir(&self) -> &Path {
        &self.disks[0].segments
    }

    /// Whether reads have another copy or shards to fall back on (erasure coding is on).
    pub fn has_redundancy(&self) -> bool {
        self.ec.is_some()
    }

    fn seg_path(&self, id: u64) -> PathBuf {
        segment_path(&self.disks[0].segments, id)
    }

    /// The file operations this store makes (see [`SegmentIo`]): the tier mover and the
    /// index ask it before their own I/O, so fault rules and simulations cover them too.
    pub fn io(&self) -> &Arc<dyn SegmentIo> {
        &self.io
    }

    /// Whether reads go through io_uring (`read_with` completes on the io_uring thread).
    pub fn uses_uring(&self) -> bool {
        self.uring.is_some()
    }

    /// The id of the segment appends go to now (one lock, where [`Self::stats`] takes two and
    /// copies every counter: every write asks this).
    pub fn active_segment_id(&self) -> u64 {
        self.active.lock().unwrap_or_else(|p| p.into_inner()).id
    }

    pub fn stats(&self) -> ChunkStoreStats {
        use std::sync::atomic::Ordering::Relaxed;
        let mut s = *self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        s.active_segment_id = active.id;
        s.active_segment_bytes = active.offset;
        let c = &self.counters;
        s.degraded_reads = c.degraded_reads.load(Relaxed);
        s.unrecoverable_reads = c.unrecoverable_reads.load(Relaxed);
        s.segments_encoded = c.segments_encoded.load(Relaxed);
        s.bytes_encoded = c.bytes_encoded.load(Relaxed);
        s.shards_rebuilt = c.shards_rebuilt.load(Relaxed);
        s.shard_faults_found = c.shard_faults_found.load(Relaxed);
        s.disk_probe_failures = c.disk_probe_failures.load(Relaxed);
        s
    }
}

/// Helpers shared by the unit tests of every module.
#[cfg(test)]
mod testing {
    pub(crate) use super::*;
    pub(crate) use std::path::{Path, PathBuf};

    pub(crate) fn store(dir: &Path, seg: u64) -> ChunkStore {
        ChunkStore::open(
            dir,
            ChunkStoreOptions {
                segment_bytes_max: seg,
                io_backend: IoBackend::Auto,
                ..Default::default()
            },
        )
        .unwrap()
    }

    pub(crate) fn ec_store(disks: &[PathBuf], seg: u64) -> ChunkStore {
        ChunkStore::open(
            "/nonexistent-unused",
            ChunkStoreOptions {
                segment_bytes_max: seg,
                io_backend: IoBackend::Auto,
                disks: disks.to_vec(),
                ec: Some((4, 2)),
                ..Default::default()
            },
        )
        .unwrap()
    }

    /// A store whose file operations go through fault rules (`ec`: 4+2 over six disks under
    /// `dir`), and the rules.
    pub(crate) fn faulty_store(dir: &Path, seg: u64, ec: bool) -> (ChunkStore, Arc<FaultyIo>) {
        let io = Arc::new(FaultyIo::default());
        let s = ChunkStore::open(
            dir,
            ChunkStoreOptions {
                segment_bytes_max: seg,
                disks: (0..6).map(|i| dir.join(format!("d{i}"))).collect(),
                ec: ec.then_some((4, 2)),
                io: io.clone(),
                ..Default::default()
            },
        )
        .unwrap();
        (s, io)
    }

    /// A rule failing `op` with EIO from its `after`th occurrence on, `times` times.
    pub(crate) fn eio(op: IoOp, path: Option<&str>, after: u64, times: Option<u64>) -> FaultRule {
        FaultRule {
            op,
            fault: Fault::Eio,
            path: path.map(str::to_string),
            after,
            times,
            every: 0,
        }
    }

    pub(crate) fn payload(i: u32) -> Vec<u8> {
        let n = [100usize, 3000, 70_000, 300_000][i as usize % 4] + i as usize;
        (0..n)
            .map(|b| (b as u32).wrapping_mul(i | 1) as u8)
            .collect()
    }
}
