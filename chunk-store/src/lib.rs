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

pub mod ec;
mod mapped;
mod record;
mod uring;

pub use record::{
    RECORD_HEADER_BYTES, RecordHeader, SEGMENT_HEADER_BYTES, SegmentHeader, decode_record_header,
};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
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

/// How long mapped reads stay off after one of them waited for the disk.
const MAPPED_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
/// How many records ahead a mapped read asks for the next records' first bytes.
const MAPPED_PREFETCH_AHEAD: usize = 4;
/// A mapped copy of one record slower than this may have waited for the disk (a hot 4 KiB
/// record takes about a microsecond): whether the thread slept is checked.
const MAPPED_SLOW_COPY: std::time::Duration = std::time::Duration::from_micros(20);

/// Records at most this far apart in a file share one vectored read (the gap is read into a
/// discard buffer).
pub const SCATTER_GAP_BYTES_MAX: u64 = 4096;
/// Largest single vectored read of [`ChunkStore::read_cached_records_into`]...
const SCATTER_RUN_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// ...and most pieces in it (Linux accepts 1024).
const SCATTER_IOVECS_MAX: usize = 512;

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
}

impl Default for ChunkStoreOptions {
    fn default() -> Self {
        Self {
            segment_bytes_max: SEGMENT_BYTES_DEFAULT,
            io_backend: IoBackend::Auto,
            disks: Vec::new(),
            ec: None,
        }
    }
}

/// Fault injection for tests (`packrat serve --fault-injection`): every segment file operation
/// consults this switchboard first. In normal operation all switches are off and the cost is one
/// relaxed atomic load per operation.
#[derive(Debug, Default)]
pub struct Faults {
    write: std::sync::atomic::AtomicU8,
    sync: std::sync::atomic::AtomicU8,
    read: std::sync::atomic::AtomicU8,
    /// Operations failed on purpose so far.
    pub injected: std::sync::atomic::AtomicU64,
}

/// What an injected fault does to the operation it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    #[default]
    None,
    /// The operation fails with EIO.
    Eio,
    /// The operation fails with ENOSPC (writes only).
    Enospc,
    /// Half of the record is written, then the write fails with EIO (writes only).
    Torn,
}

impl Fault {
    fn code(self) -> u8 {
        match self {
            Fault::None => 0,
            Fault::Eio => 1,
            Fault::Enospc => 2,
            Fault::Torn => 3,
        }
    }

    fn from_code(c: u8) -> Self {
        match c {
            1 => Fault::Eio,
            2 => Fault::Enospc,
            3 => Fault::Torn,
            _ => Fault::None,
        }
    }
}

impl Faults {
    pub fn set(&self, write: Fault, sync: Fault, read: Fault) {
        use std::sync::atomic::Ordering::Relaxed;
        self.write.store(write.code(), Relaxed);
        self.sync.store(sync.code(), Relaxed);
        self.read.store(read.code(), Relaxed);
    }

    /// (write, sync, read) as set now.
    pub fn get(&self) -> (Fault, Fault, Fault) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            Fault::from_code(self.write.load(Relaxed)),
            Fault::from_code(self.sync.load(Relaxed)),
            Fault::from_code(self.read.load(Relaxed)),
        )
    }

    fn hit(&self, which: &std::sync::atomic::AtomicU8) -> Fault {
        let f = Fault::from_code(which.load(std::sync::atomic::Ordering::Relaxed));
        if f != Fault::None {
            self.injected
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        f
    }
}

fn injected_error(f: Fault) -> std::io::Error {
    match f {
        Fault::Enospc => std::io::Error::from_raw_os_error(libc::ENOSPC),
        _ => std::io::Error::from_raw_os_error(libc::EIO),
    }
}

/// Completion callback of [`ChunkStore::read_with`].
pub type RecordDone = Box<dyn FnOnce(Result<Vec<u8>>) + Send>;

/// One data disk: a directory (a mount point in production) holding segment copies under
/// `segments/` and erasure-coded shards under `shards/`.
struct Disk {
    root: PathBuf,
    segments: PathBuf,
    shards: PathBuf,
    /// Set after an I/O error on this disk; new segments and rebuilt shards avoid it until a
    /// scrub finds it writable again.
    failed: std::sync::atomic::AtomicBool,
}

impl Disk {
    fn usable(&self) -> bool {
        !self.failed.load(std::sync::atomic::Ordering::Relaxed) && self.root.is_dir()
    }

    fn fail(&self, why: &dyn std::fmt::Display) {
        if !self.failed.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::error!(disk = %self.root.display(), error = %why, "disk marked failed");
        }
    }
}

/// Where a segment's bytes are: whole copies (the open segment, and sealed ones not yet
/// encoded) or erasure-coded shards. This is the segment catalog; it is derived at start-up
/// from the self-describing files on the disks (segment and shard headers), so it can never
/// disagree with them.
#[derive(Debug, Clone)]
enum Placement {
    /// Disks holding a full copy of the segment file.
    Copies(Vec<usize>),
    /// The disk of each shard (`None`: lost, to be rebuilt).
    Shards {
        layout: packrat_erasure::Layout,
        disks: Vec<Option<usize>>,
    },
}

/// Open files of one segment, cached for reads.
enum Handle {
    /// The files, and a mapping of the first, made on first use (`None`: it could not be).
    Copies(Vec<Arc<File>>, std::sync::OnceLock<Option<mapped::Mapping>>),
    Shards(Arc<ec::ShardSet>),
}

struct Copy {
    disk: usize,
    file: Arc<File>,
    path: PathBuf,
}

struct ActiveSegment {
    id: u64,
    /// The segment file on each of its disks (one without erasure coding; m + 1 with it),
    /// all written and synced alike.
    copies: Vec<Copy>,
    /// End of the last record written (the next append goes here).
    offset: u64,
    /// Set when a write or an fsync failed: the page cache of these files can no longer be
    /// trusted, so the next append starts a fresh segment.
    poisoned: bool,
    /// Every segment with a smaller id is fully durable (synced when it was rotated out). A
    /// segment abandoned after a failed fsync stays at or above this mark, so a writer still
    /// waiting on it is told its write failed instead of being acknowledged.
    durable_below: u64,
    last_append: std::time::Instant,
}

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

/// The erasure-coding state for `admin status`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct EcStatus {
    pub k: usize,
    pub m: usize,
    pub disks: Vec<DiskStatus>,
    /// Segments being written (mirrored), sealed and waiting to be encoded, and encoded.
    pub segments_open: u64,
    pub segments_sealed: u64,
    pub segments_encoded: u64,
    /// Segments with a missing or corrupt copy or shard that still read correctly.
    pub segments_degraded: u64,
    /// Segments with fewer than k shards left: some of their objects cannot be read.
    pub segments_unrecoverable: u64,
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

/// What a scrub found and did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ScrubReport {
    pub segments_checked: u64,
    pub shards_checked: u64,
    pub bytes_checked: u64,
    pub shards_missing: u64,
    pub shards_corrupt: u64,
    pub shards_rebuilt: u64,
    pub segments_sealed: u64,
    /// Segments that could not be repaired (fewer than k good shards), by id.
    pub unrepairable: Vec<u64>,
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

/// The file a disk probe writes, syncs, reads back and removes.
const PROBE_FILE: &str = ".packrat-probe";
/// Bytes a disk probe writes.
const PROBE_BYTES: usize = 4096;

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
    faults: Faults,
    /// Mapped reads are paused until this many milliseconds after `opened` (a mapped copy
    /// waited for the disk: the data is not hot).
    mapped_paused_until_ms: AtomicU64,
    opened: std::time::Instant,
}

fn segment_name(id: u64) -> String {
    format!("seg-{id:016x}.pkr")
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(segment_name(id))
}

fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("seg-")?.strip_suffix(".pkr")?;
    u64::from_str_radix(hex, 16).ok()
}

/// fsync a directory so that a file created or renamed in it survives a crash.
fn sync_dir(dir: &Path) -> Result<()> {
    let f = File::open(dir).map_err(|e| io_err(dir, e))?;
    f.sync_all().map_err(|e| io_err(dir, e))
}

fn list_dir<T>(dir: &Path, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<(T, u64)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        // A lost disk (read-only opening creates nothing): no files there.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_err(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_err(dir, e))?;
        if let Some(t) = entry.file_name().to_str().and_then(&parse) {
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            out.push((t, len));
        }
    }
    Ok(out)
}

impl ChunkStore {
    /// Opens (creating if needed) the segment directory and starts a new active segment.
    /// With `options.ec` set, `dir` is unused and the segments live on `options.disks`.
    pub fn open(dir: impl Into<PathBuf>, options: ChunkStoreOptions) -> Result<Self> {
        Self::open_mode(dir.into(), options, false)
    }

    /// Opens the segments for reading only, for offline tools (`packrat admin verify`): it
    /// creates, removes and writes nothing (no active segment; `append` fails), and reads
    /// fall back on redundancy exactly as in a running server.
    pub fn open_read_only(dir: impl Into<PathBuf>, options: ChunkStoreOptions) -> Result<Self> {
        Self::open_mode(dir.into(), options, true)
    }

    fn open_mode(dir: PathBuf, options: ChunkStoreOptions, read_only: bool) -> Result<Self> {
        let disks: Vec<Disk> = match options.ec {
            None => vec![Disk {
                root: dir.clone(),
                shards: dir.join("shards"),
                segments: dir,
                failed: Default::default(),
            }],
            Some((k, m)) => {
                if k == 0 || m == 0 || options.disks.len() < k + m {
                    return Err(ChunkStoreError::Config(format!(
                        "erasure coding {k}+{m} needs k >= 1, m >= 1 and at least {} disks ({} given)",
                        k + m,
                        options.disks.len()
                    )));
                }
                options
                    .disks
                    .iter()
                    .map(|root| Disk {
                        root: root.clone(),
                        segments: root.join("segments"),
                        shards: root.join("shards"),
                        failed: Default::default(),
                    })
                    .collect()
            }
        };
        for d in disks.iter().filter(|_| !read_only) {
            if options.ec.is_some() && !d.root.exists() {
                tracing::warn!(
                    disk = %d.root.display(),
                    "disk directory is missing: created empty (a replaced disk); its copies and \
                     shards are read around and rebuilt by repair"
                );
            }
            std::fs::create_dir_all(&d.segments).map_err(|e| io_err(&d.segments, e))?;
            if options.ec.is_some() {
                std::fs::create_dir_all(&d.shards).map_err(|e| io_err(&d.shards, e))?;
            }
        }
        let catalog = Self::load_catalog(&disks, options.ec, read_only)?;
        let next_id = catalog.keys().next_back().map_or(1, |id| id + 1);
        if let Some((&last, Placement::Copies(on))) = catalog.iter().next_back()
            && let Some(&d) = on.first()
        {
            // Report the state of the segment that was active when the process stopped: a
            // crash may have left a torn tail there, which is never indexed and never read.
            match scan_segment(&segment_path(&disks[d].segments, last)) {
                Ok(scan) if scan.torn_tail_bytes > 0 => tracing::warn!(
                    segment = last,
                    records = scan.records.len(),
                    torn_tail_bytes = scan.torn_tail_bytes,
                    "previous active segment ends in a torn tail (crash); it is never read"
                ),
                Ok(scan) => tracing::info!(
                    segment = last,
                    records = scan.records.len(),
                    "previous active segment is intact"
                ),
                Err(e) => {
                    tracing::warn!(segment = last, error = %e, "cannot scan previous segment")
                }
            }
        }
        let segments = catalog.len() as u64;
        let store = Self {
            uring: None,
            mapped_paused_until_ms: AtomicU64::new(0),
            opened: std::time::Instant::now(),
            durable: Mutex::new(WriteTicket {
                segment_id: 0,
                end_offset: 0,
            }),
            stats: Mutex::new(ChunkStoreStats {
                segments,
                ..Default::default()
            }),
            active: Mutex::new(ActiveSegment {
                id: 0,
                copies: Vec::new(),
                offset: 0,
                poisoned: false,
                durable_below: 0,
                last_append: std::time::Instant::now(),
            }),
            catalog: Mutex::new(catalog),
            readers: RwLock::new(HashMap::new()),
            counters: EcCounters::default(),
            suspects: Mutex::new(BTreeSet::new()),
            retired: Mutex::new(Vec::new()),
            maintenance: Mutex::new(()),
            faults: Faults::default(),
            ec: options.ec,
            read_only,
            seal_blocked: Default::default(),
            disks,
            options,
        };
        if read_only {
            store.active.lock().unwrap_or_else(|p| p.into_inner()).id = u64::MAX;
            return Ok(store);
        }
        let active = store.create_segment(next_id)?;
        let first = active.copies[0].file.clone();
        let first_path = active.copies[0].path.clone();
        *store.durable.lock().unwrap_or_else(|p| p.into_inner()) = WriteTicket {
            segment_id: active.id,
            end_offset: active.offset,
        };
        *store.active.lock().unwrap_or_else(|p| p.into_inner()) = active;
        store
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .segments += 1;
        let uring = match store.options.io_backend {
            IoBackend::Pread => None,
            wanted => match uring::UringReader::start(&first) {
                Ok(r) => {
                    tracing::info!("reads use io_uring");
                    Some(r)
                }
                Err(e) if wanted == IoBackend::Auto => {
                    tracing::info!(error = %e, "io_uring unavailable; reads use pread");
                    None
                }
                Err(e) => return Err(io_err(&first_path, e)),
            },
        };
        if uring.is_none() {
            tracing::info!("reads use pread");
        }
        Ok(Self { uring, ..store })
    }

    /// Builds the segment catalog from the files on the disks, finishing or undoing a seal
    /// that a crash interrupted: a segment with every shard and leftover copies lost its copies
    /// (the seal had finished); one with copies and an incomplete shard set loses the shards
    /// (the seal had not, and runs again).
    fn load_catalog(
        disks: &[Disk],
        ec: Option<(usize, usize)>,
        read_only: bool,
    ) -> Result<BTreeMap<u64, Placement>> {
        let remove = |p: &Path| {
            if !read_only {
                let _ = std::fs::remove_file(p);
            }
        };
        let mut copies: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (d, disk) in disks.iter().enumerate() {
            for (id, _) in list_dir(&disk.segments, parse_segment_name)? {
                copies.entry(id).or_default().push(d);
            }
        }
        let mut shards: BTreeMap<u64, Vec<(usize, usize, ec::ShardHeader)>> = BTreeMap::new();
        if ec.is_some() {
            for (d, disk) in disks.iter().enumerate() {
                for (name, _) in list_dir(&disk.shards, |n| Some(n.to_string()))? {
                    let path = disk.shards.join(&name);
                    if name.ends_with(".tmp") {
                        // A seal or repair that did not finish; it will run again.
                        remove(&path);
                        continue;
                    }
                    let Some((id, index)) = ec::parse_shard_name(&name) else {
                        continue;
                    };
                    let header = File::open(&path)
                        .map_err(|e| io_err(&path, e))
                        .and_then(|f| ec::read_shard_header(&f, &path));
                    match header {
                        Ok(h) if h.segment_id == id && h.index as usize == index => {
                            shards.entry(id).or_default().push((index, d, h))
                        }
                        Ok(_) => {
                            tracing::warn!(path = %path.display(), "shard header does not match its name; ignored")
                        }
                        Err(e) => {
                            tracing::warn!(path = %path.display(), error = %e, "unreadable shard header; the shard counts as lost")
                        }
                    }
                }
            }
        }
        let mut catalog = BTreeMap::new();
        for (id, found) in shards {
            let h = found[0].2;
            let Ok(layout) = h.layout() else { continue };
            let mut on: Vec<Option<usize>> = vec![None; layout.k + layout.m];
            for (index, d, hh) in &found {
                if hh.segment_len == h.segment_len && hh.k == h.k && hh.m == h.m {
                    on[*index] = Some(*d);
                }
            }
            let complete = on.iter().all(Option::is_some);
            match copies.remove(&id) {
                Some(cs) if !complete => {
                    tracing::info!(
                        segment = id,
                        "incomplete seal found; the segment is sealed again"
                    );
                    for (index, d, _) in found {
                        remove(&disks[d].shards.join(ec::shard_file_name(id, index)));
                    }
                    catalog.insert(id, Placement::Copies(cs));
                    continue;
                }
                Some(cs) => {
                    for d in cs {
                        remove(&segment_path(&disks[d].segments, id));
                    }
                }
                None => {}
            }
            let lost = on.iter().filter(|d| d.is_none()).count();
            if lost > 0 {
                tracing::warn!(
                    segment = id,
                    lost,
                    "encoded segment is missing shards; reads rebuild them until repair"
                );
            }
            catalog.insert(id, Placement::Shards { layout, disks: on });
        }
        for (id, cs) in copies {
            catalog.insert(id, Placement::Copies(cs));
        }
        Ok(catalog)
    }

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

    /// The disks for segment `id`'s copies (or shards): `count` distinct usable disks,
    /// starting at `id mod disks` so that load spreads evenly.
    fn pick_disks(&self, id: u64, count: usize, avoid: &[usize]) -> Result<Vec<usize>> {
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

    /// Creates segment `id` on its disks; with erasure coding a disk that fails is marked
    /// failed and the segment is placed on the next healthy ones.
    fn create_segment(&self, id: u64) -> Result<ActiveSegment> {
        loop {
            match self.try_create_segment(id) {
                Err(e) if self.ec.is_some() && !matches!(e, ChunkStoreError::NoSpace { .. }) => {
                    // `try_create_segment` marked the disk at fault; `pick_disks` fails once
                    // too few healthy ones are left, which ends this loop.
                    tracing::warn!(segment = id, error = %e, "segment creation failed; retrying on other disks");
                    if self
                        .pick_disks(id, self.ec.map_or(1, |(_, m)| m + 1), &[])
                        .is_err()
                    {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }

    fn try_create_segment(&self, id: u64) -> Result<ActiveSegment> {
        let want = self.ec.map_or(1, |(_, m)| m + 1);
        let on = if self.ec.is_some() {
            self.pick_disks(id, want, &[])?
        } else {
            vec![0]
        };
        let header = SegmentHeader {
            segment_id: id,
            created_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        let mut copies = Vec::with_capacity(on.len());
        for d in on {
            let dir = &self.disks[d].segments;
            let path = segment_path(dir, id);
            let made = (|| {
                let file = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .create_new(true)
                    .open(&path)
                    .map_err(|e| io_err(&path, e))?;
                file.write_all_at(&header.encode(), 0)
                    .map_err(|e| io_err(&path, e))?;
                // The header and the directory entry are made durable now, so that a later
                // fdatasync of appended records never depends on metadata that was not synced.
                file.sync_all().map_err(|e| io_err(&path, e))?;
                sync_dir(dir)?;
                Ok::<_, ChunkStoreError>(file)
            })();
            match made {
                Ok(file) => copies.push(Copy {
                    disk: d,
                    file: Arc::new(file),
                    path,
                }),
                Err(e) => {
                    if self.ec.is_some() && !matches!(e, ChunkStoreError::NoSpace { .. }) {
                        self.disks[d].fail(&e);
                    }
                    for c in &copies {
                        let _ = std::fs::remove_file(&c.path);
                    }
                    return Err(e);
                }
            }
        }
        self.catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id,
                Placement::Copies(copies.iter().map(|c| c.disk).collect()),
            );
        Ok(ActiveSegment {
            id,
            copies,
            offset: SEGMENT_HEADER_BYTES as u64,
            poisoned: false,
            durable_below: id,
            last_append: std::time::Instant::now(),
        })
    }

    /// Appends one record. The bytes are not durable until `sync_through` returns.
    pub fn append(
        &self,
        object_id: [u8; 16],
        chunk_index: u32,
        payload: &[u8],
    ) -> Result<(RecordLocation, WriteTicket)> {
        let (len, header) = record_header(object_id, chunk_index, payload)?;
        let record_bytes = RECORD_HEADER_BYTES as u64 + u64::from(len);
        if self.read_only {
            return Err(ChunkStoreError::Config(
                "the store was opened read-only".into(),
            ));
        }

        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if active.poisoned
            || (active.offset + record_bytes > self.options.segment_bytes_max
                && active.offset > SEGMENT_HEADER_BYTES as u64)
        {
            self.rotate(&mut active)?;
        }
        let offset = active.offset;
        match self.faults.hit(&self.faults.write) {
            Fault::None => {}
            Fault::Torn => {
                // Half the record reaches the file, as in a write cut short by a crash or a
                // failing disk; the offset is not advanced, so the next record overwrites it.
                let half = (RECORD_HEADER_BYTES + payload.len()) / 2;
                let mut rec = header.to_vec();
                rec.extend_from_slice(payload);
                let _ = active.copies[0].file.write_all_at(&rec[..half], offset);
                return Err(io_err(&active.copies[0].path, injected_error(Fault::Eio)));
            }
            f => return Err(io_err(&active.copies[0].path, injected_error(f))),
        }
        for c in &active.copies {
            if let Err(e) = write_all_vectored_at(&c.file, &header, payload, offset) {
                // A failed write may have left part of the record in the file; the offset is
                // not advanced past it, and the next record overwrites it. With several
                // copies the segment is abandoned: its copies may now differ.
                let err = io_err(&c.path, e);
                if self.ec.is_some() {
                    if !matches!(err, ChunkStoreError::NoSpace { .. }) {
                        self.disks[c.disk].fail(&err);
                    }
                    active.poisoned = true;
                }
                return Err(err);
            }
        }
        active.offset += record_bytes;
        active.last_append = std::time::Instant::now();
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.appends += 1;
            stats.appended_bytes += record_bytes;
        }
        Ok((
            RecordLocation {
                segment_id: active.id,
                offset,
                len,
            },
            WriteTicket {
                segment_id: active.id,
                end_offset: active.offset,
            },
        ))
    }

    /// Closes the active segment (syncing it fully) and starts the next one.
    fn rotate(&self, active: &mut ActiveSegment) -> Result<()> {
        if !active.poisoned {
            // Everything in the old segment becomes durable here, so `sync_through` can treat
            // any ticket of an older segment as already synced.
            for c in &active.copies {
                c.file.sync_data().map_err(|e| io_err(&c.path, e))?;
            }
        }
        let mut next = self.create_segment(active.id + 1)?;
        if active.poisoned {
            next.durable_below = active.durable_below;
        }
        *active = next;
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.segments += 1;
        Ok(())
    }

    /// Returns once the record behind `ticket` is durable. Concurrent callers share one
    /// `fdatasync` (one per copy): whoever holds the `durable` lock syncs everything written
    /// so far, and the callers queued behind it usually find their ticket covered when they
    /// get the lock.
    pub fn sync_through(&self, ticket: WriteTicket) -> Result<()> {
        let mut durable = self.durable.lock().unwrap_or_else(|p| p.into_inner());
        if *durable >= ticket {
            return Ok(());
        }
        let (files, written) = {
            let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            if ticket.segment_id < active.durable_below {
                // Rotation synced the whole older segment before it switched.
                return Ok(());
            }
            if ticket.segment_id < active.id {
                return Err(ChunkStoreError::Io {
                    path: self.seg_path(ticket.segment_id),
                    source: std::io::Error::other(
                        "an fsync of this segment failed; the write is not durable",
                    ),
                });
            }
            (
                active
                    .copies
                    .iter()
                    .map(|c| (c.disk, c.file.clone(), c.path.clone()))
                    .collect::<Vec<_>>(),
                WriteTicket {
                    segment_id: active.id,
                    end_offset: active.offset,
                },
            )
        };
        let sync_one = |file: &File| match self.faults.hit(&self.faults.sync) {
            Fault::None => file.sync_data(),
            f => Err(injected_error(f)),
        };
        let results: Vec<std::io::Result<()>> = if files.len() == 1 {
            vec![sync_one(&files[0].1)]
        } else {
            // Copies sit on different disks: their syncs run side by side.
            std::thread::scope(|s| {
                let hs: Vec<_> = files
                    .iter()
                    .map(|(_, f, _)| s.spawn(|| sync_one(f)))
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(std::io::Error::other("sync thread panicked")))
                    })
                    .collect()
            })
        };
        for ((disk, _, path), r) in files.iter().zip(results) {
            if let Err(e) = r {
                // After a failed fsync the kernel may have dropped dirty pages: nothing in this
                // segment past the last durable point may be trusted, so appends move on.
                let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
                if active.id == written.segment_id {
                    active.poisoned = true;
                }
                let err = io_err(path, e);
                if self.ec.is_some() && !matches!(err, ChunkStoreError::NoSpace { .. }) {
                    self.disks[*disk].fail(&err);
                }
                return Err(err);
            }
        }
        *durable = written;
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.syncs += 1;
        Ok(())
    }

    /// The segments no longer written to (every one but the active one), with their sizes,
    /// by id.
    pub fn sealed_segments(&self) -> Result<Vec<(u64, u64)>> {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).id;
        let catalog = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut out = Vec::new();
        for (id, place) in catalog.range(..active) {
            let len = match place {
                Placement::Shards { layout, .. } => layout.len,
                Placement::Copies(on) => on
                    .iter()
                    .filter_map(|&d| {
                        std::fs::metadata(segment_path(&self.disks[d].segments, *id)).ok()
                    })
                    .map(|m| m.len())
                    .max()
                    .unwrap_or(0),
            };
            out.push((*id, len));
        }
        Ok(out)
    }

    /// Every file of segment `id` as the catalog knows it.
    fn segment_files(&self, id: u64, place: &Placement) -> Vec<(usize, PathBuf)> {
        match place {
            Placement::Copies(on) => on
                .iter()
                .map(|&d| (d, segment_path(&self.disks[d].segments, id)))
                .collect(),
            Placement::Shards { disks, .. } => disks
                .iter()
                .enumerate()
                .filter_map(|(i, d)| {
                    d.map(|d| (d, self.disks[d].shards.join(ec::shard_file_name(id, i))))
                })
                .collect(),
        }
    }

    /// Removes a sealed segment that nothing references any more (compaction moved its live
    /// records). Its files are unlinked now (their space returns once the last handle closes),
    /// but this store keeps its handles open for `grace`, so a read that looked the old
    /// location up just before the index changed still succeeds. The active segment is never
    /// removed.
    pub fn retire_segment(&self, segment_id: u64, grace: std::time::Duration) -> Result<()> {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).id;
        if segment_id >= active {
            return Err(ChunkStoreError::Io {
                path: self.seg_path(segment_id),
                source: std::io::Error::other("the active segment cannot be retired"),
            });
        }
        // Opened (and cached) before the unlink, so in-flight readers keep working.
        self.reader(segment_id)?;
        let mut catalog = self.catalog.lock().unwrap_or_else(|p| p.into_inner());
        let Some(place) = catalog.remove(&segment_id) else {
            return Err(ChunkStoreError::MissingSegment(segment_id));
        };
        let files = self.segment_files(segment_id, &place);
        let mut dirs = BTreeSet::new();
        for (_, path) in &files {
            match std::fs::remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(path, e)),
            }
            if let Some(dir) = path.parent() {
                dirs.insert(dir.to_path_buf());
            }
        }
        drop(catalog);
        for dir in dirs {
            sync_dir(&dir)?;
        }
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((segment_id, std::time::Instant::now() + grace));
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.segments = stats.segments.saturating_sub(1);
        drop(stats);
        self.reap_retired();
        Ok(())
    }

    /// Closes the handles of retired segments whose grace period is over.
    pub fn reap_retired(&self) {
        let now = std::time::Instant::now();
        let mut expired = Vec::new();
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, until)| {
                if *until <= now {
                    expired.push(*id);
                    false
                } else {
                    true
                }
            });
        if !expired.is_empty() {
            let mut readers = self.readers.write().unwrap_or_else(|p| p.into_inner());
            for id in expired {
                readers.remove(&id);
            }
        }
    }

    /// The fault-injection switchboard (see [`Faults`]).
    pub fn faults(&self) -> &Faults {
        &self.faults
    }

    fn reader(&self, segment_id: u64) -> Result<Arc<Handle>> {
        if let f @ (Fault::Eio | Fault::Enospc | Fault::Torn) = self.faults.hit(&self.faults.read) {
            return Err(io_err(&self.seg_path(segment_id), injected_error(f)));
        }
        if let Some(h) = self
            .readers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&segment_id)
        {
            return Ok(h.clone());
        }
        let place = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&segment_id)
            .cloned()
            .ok_or(ChunkStoreError::MissingSegment(segment_id))?;
        let handle = Arc::new(self.open_handle(segment_id, &place)?);
        self.readers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(segment_id, handle.clone());
        Ok(handle)
    }

    fn open_handle(&self, id: u64, place: &Placement) -> Result<Handle> {
        let open = |path: &Path| match File::open(path) {
            Ok(f) => Ok(Some(Arc::new(f))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(path, e)),
        };
        match place {
            Placement::Copies(on) => {
                let mut files = Vec::new();
                let mut last_err = None;
                for &d in on {
                    match open(&segment_path(&self.disks[d].segments, id)) {
                        Ok(Some(f)) => files.push(f),
                        Ok(None) => {}
                        Err(e) => last_err = Some(e),
                    }
                }
                if files.is_empty() {
                    return Err(last_err.unwrap_or(ChunkStoreError::MissingSegment(id)));
                }
                Ok(Handle::Copies(files, std::sync::OnceLock::new()))
            }
            Placement::Shards { layout, disks } => {
                let mut files = Vec::with_capacity(disks.len());
                let mut paths = Vec::with_capacity(disks.len());
                for (i, d) in disks.iter().enumerate() {
                    let path = d.map_or_else(PathBuf::new, |d| {
                        self.disks[d].shards.join(ec::shard_file_name(id, i))
                    });
                    files.push(if d.is_some() {
                        open(&path).ok().flatten()
                    } else {
                        None
                    });
                    paths.push(path);
                }
                Ok(Handle::Shards(Arc::new(ec::ShardSet::new(
                    id, *layout, files, paths,
                )?)))
            }
        }
    }

    /// Whether reads go through io_uring (`read_with` completes on the io_uring thread).
    pub fn uses_uring(&self) -> bool {
        self.uring.is_some()
    }

    /// The one file and offset holding a whole record, when the fast paths can read it with
    /// one positioned read: the first copy, or the data shard that holds it.
    fn direct(&self, loc: &RecordLocation) -> Result<Option<(Arc<File>, u64)>> {
        let total = RECORD_HEADER_BYTES as u64 + u64::from(loc.len);
        Ok(match &*self.reader(loc.segment_id)? {
            Handle::Copies(files, _) => Some((files[0].clone(), loc.offset)),
            Handle::Shards(set) => set.direct(loc.offset, total),
        })
    }

    /// Whether the record at `loc` can be read without I/O errors as far as the catalog knows:
    /// a copy exists, or its data shard does, or enough shards to rebuild it. A check of open
    /// handles only (no reads), for refusing a multi-chunk GET up front.
    pub fn can_read(&self, loc: &RecordLocation) -> bool {
        match self.reader(loc.segment_id).as_deref() {
            Err(_) => false,
            Ok(Handle::Copies(files, _)) => !files.is_empty(),
            Ok(Handle::Shards(set)) => {
                let total = RECORD_HEADER_BYTES as u64 + u64::from(loc.len);
                set.pieces(loc.offset, total)
                    .iter()
                    .all(|(shard, _, _)| set.files[*shard].is_some())
                    || set.files.iter().filter(|f| f.is_some()).count() >= set.layout.k
            }
        }
    }

    fn note_degraded(&self, segment_id: u64, why: &dyn std::fmt::Display) {
        use std::sync::atomic::Ordering::Relaxed;
        self.counters.degraded_reads.fetch_add(1, Relaxed);
        if self
            .suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(segment_id)
        {
            self.counters.shard_faults_found.fetch_add(1, Relaxed);
            tracing::warn!(
                segment = segment_id,
                reason = %why,
                "degraded read: served from redundancy; the segment is queued for repair"
            );
        }
    }

    /// Reads one whole record, checks its header against the expected identity and its
    /// payload against the stored crc32c, and returns the payload. Always positioned reads on
    /// the calling thread. With erasure coding a record that is missing, unreadable or fails
    /// its checks is read from another copy or rebuilt from the other shards (and checked
    /// again); a record is never served unless it verifies.
    pub fn read(
        &self,
        loc: &RecordLocation,
        object_id: &[u8; 16],
        chunk_index: u32,
    ) -> Result<Vec<u8>> {
        let total = RECORD_HEADER_BYTES + loc.len as usize;
        let path = self.seg_path(loc.segment_id);
        let handle = self.reader(loc.segment_id)?;
        match &*handle {
            Handle::Copies(files, _) => {
                let mut first_err = None;
                for f in files {
                    let mut buf = vec![0u8; total];
                    let read = f.read_exact_at(&mut buf, loc.offset);
                    match verify_record(loc, read.map(|()| buf), object_id, chunk_index, &path) {
                        Ok(p) => {
                            if let Some(e) = first_err {
                                self.note_degraded(loc.segment_id, &e);
                            }
                            return Ok(p);
                        }
                        Err(e) => {
                            if first_err.is_none() {
                                first_err = Some(e);
                            }
                        }
                    }
                }
                Err(first_err.unwrap_or(ChunkStoreError::MissingSegment(loc.segment_id)))
            }
            Handle::Shards(set) => {
                let mut first_err = None;
                for rebuild_all in [false, true] {
                    let mut buf = vec![0u8; total];
                    let got = set.read(loc.offset, &mut buf, rebuild_all);
                    let read = match got {
                        Ok((n, rebuilt)) if n == total => Ok((buf, rebuilt)),
                        Ok(_) => Err(ChunkStoreError::Corrupt {
                            segment_id: loc.segment_id,
                            offset: loc.offset,
                            reason: "record extends past the end of the segment".into(),
                        }),
                        Err(e) => Err(e),
                    };
                    let verified = read.and_then(|(buf, rebuilt)| {
                        verify_record(loc, Ok(buf), object_id, chunk_index, &path)
                            .map(|p| (p, rebuilt))
                    });
                    match verified {
                        Ok((p, rebuilt)) => {
                            if rebuilt || first_err.is_some() {
                                let why = first_err.map_or_else(
                                    || "a shard is missing".to_string(),
                                    |e: ChunkStoreError| e.to_string(),
                                );
                                self.note_degraded(loc.segment_id, &why);
                            }
                            return Ok(p);
                        }
                        Err(e) => {
                            if matches!(e, ChunkStoreError::Unrecoverable { .. }) {
                                self.counters
                                    .unrecoverable_reads
                                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                tracing::error!(segment = loc.segment_id, error = %e, "record lost: too few shards left to rebuild it");
                                return Err(e);
                            }
                            if first_err.is_none() {
                                first_err = Some(e);
                            }
                        }
                    }
                }
                Err(first_err.unwrap_or(ChunkStoreError::MissingSegment(loc.segment_id)))
            }
        }
    }

    /// With [`IoBackend::Auto`] and io_uring in use: reads and verifies the record on the
    /// calling thread if it is entirely in the page cache, without ever blocking on the disk.
    /// `None` means the caller should use [`read_with`](Self::read_with).
    pub fn read_cached(
        &self,
        loc: &RecordLocation,
        object_id: &[u8; 16],
        chunk_index: u32,
    ) -> Option<Result<Vec<u8>>> {
        if self.uring.is_none() || self.options.io_backend != IoBackend::Auto {
            return None;
        }
        let (file, at) = match self.direct(loc) {
            Ok(Some(d)) => d,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let mut buf = vec![0u8; RECORD_HEADER_BYTES + loc.len as usize];
        let read = read_if_cached(&file, &mut buf, at)?;
        let path = self.seg_path(loc.segment_id);
        Some(verify_record(
            loc,
            read.map(|()| buf),
            object_id,
            chunk_index,
            &path,
        ))
    }

    /// Like [`read`](Self::read), but through io_uring when the store uses it: `done` is then
    /// called on the io_uring thread once the record is read and verified. With `pread` it is
    /// called before this returns. This is the fast path only: with erasure coding, a failure
    /// here (or a record the fast path cannot reach in one read) is for the caller to retry
    /// with [`read`](Self::read), which falls back on redundancy, off the async threads.
    pub fn read_with(
        &self,
        loc: RecordLocation,
        object_id: [u8; 16],
        chunk_index: u32,
        done: RecordDone,
    ) {
        let Some(uring) = &self.uring else {
            return done(self.read(&loc, &object_id, chunk_index));
        };
        let (file, at) = match self.direct(&loc) {
            Ok(Some(d)) => d,
            Ok(None) => return done(Err(ChunkStoreError::MissingSegment(loc.segment_id))),
            Err(e) => return done(Err(e)),
        };
        let path = self.seg_path(loc.segment_id);
        let total = RECORD_HEADER_BYTES + loc.len as usize;
        uring.read(
            file,
            at,
            total,
            Box::new(move |r| done(verify_record(&loc, r, &object_id, chunk_index, &path))),
        );
    }

    /// Reads raw bytes of a segment from `offset` into `dst` with one positioned read (a
    /// page-cache hit without blocking when possible, else a `pread`) and returns how many
    /// were read: fewer than `dst.len()` only at the end of the segment. The batch read path
    /// merges neighbouring records into one such read and verifies each with [`Span::record`].
    /// Blocks the calling thread on a cache miss. With erasure coding, pieces on a missing or
    /// unreadable shard are rebuilt; bytes that read but fail a record check are for the
    /// caller to read again with [`read`](Self::read).
    pub fn read_span_into(&self, segment_id: u64, offset: u64, dst: &mut [u8]) -> Result<usize> {
        let path = self.seg_path(segment_id);
        let handle = self.reader(segment_id)?;
        let files = match &*handle {
            Handle::Copies(files, _) => files,
            Handle::Shards(set) => {
                let (n, rebuilt) = set.read(offset, dst, false)?;
                if rebuilt {
                    self.note_degraded(segment_id, &"a shard is missing or unreadable");
                }
                return Ok(n);
            }
        };
        let file = &files[0];
        if let Some(r) = read_if_cached(file, dst, offset) {
            r.map_err(|e| io_err(&path, e))?;
            return Ok(dst.len());
        }
        let mut last_err = None;
        for file in files {
            let mut filled = 0usize;
            let mut failed = false;
            while filled < dst.len() {
                match file.read_at(&mut dst[filled..], offset + filled as u64) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    Err(e) => {
                        last_err = Some(io_err(&path, e));
                        failed = true;
                        break;
                    }
                }
            }
            if !failed {
                return Ok(filled);
            }
        }
        Err(last_err.unwrap_or(ChunkStoreError::MissingSegment(segment_id)))
    }

    /// Reads whole records straight into the caller's buffer, from the page cache only and
    /// never waiting for the disk, so it may run on an async worker thread: the payload of
    /// `reads[i]` goes to `buf[dst..dst + len]`. Records that are neighbours in one file (gaps
    /// of at most [`SCATTER_GAP_BYTES_MAX`]) share one vectored read that scatters headers
    /// aside, payloads into place and gap bytes into a discard buffer, so a run of records
    /// costs one syscall and one copy, out of the page cache into `buf`. Every record is
    /// checked as [`read`](Self::read) checks it. True if every record is in place and
    /// verified; false if any is not (not cached, not directly readable such as a shard piece,
    /// an I/O error, a failed check), and then the caller reads them another way.
    ///
    /// Panics if two slots overlap or a slot is outside `buf` (a caller's bug).
    pub fn read_cached_records_into(&self, reads: &[RecordRead], buf: &mut [u8]) -> bool {
        check_slots(reads, buf.len());
        // Where each record is: (record, file, offset of its header in the file).
        let mut placed: Vec<(usize, Arc<File>, u64)> = Vec::with_capacity(reads.len());
        for (i, r) in reads.iter().enumerate() {
            match self.direct(&r.loc) {
                Ok(Some((file, at))) => placed.push((i, file, at)),
                _ => return false,
            }
        }
        placed.sort_unstable_by_key(|(_, f, at)| (Arc::as_ptr(f) as usize, *at));
        let mut headers = vec![[0u8; RECORD_HEADER_BYTES]; reads.len()];
        let mut discard = vec![0u8; SCATTER_GAP_BYTES_MAX as usize];
        let rec_len = |i: usize| RECORD_HEADER_BYTES as u64 + u64::from(reads[i].loc.len);
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(SCATTER_IOVECS_MAX);
        let mut run = 0usize;
        while run < placed.len() {
            // The run: placed[run..end], one file, each record at most a small gap after the
            // previous one's end.
            let (_, file, start) = &placed[run];
            let mut end = run + 1;
            let mut run_end = start + rec_len(placed[run].0);
            while end < placed.len() {
                let (i, f, at) = &placed[end];
                let fits = Arc::ptr_eq(f, file)
                    && *at >= run_end
                    && at - run_end <= SCATTER_GAP_BYTES_MAX
                    && at + rec_len(*i) - start <= SCATTER_RUN_BYTES_MAX
                    && (end - run) * 3 + 3 <= SCATTER_IOVECS_MAX;
                if !fits {
                    break;
                }
                run_end = at + rec_len(*i);
                end += 1;
            }
            iov.clear();
            let mut at_end = *start;
            for (i, _, at) in &placed[run..end] {
                let gap = (at - at_end) as usize;
                if gap > 0 {
                    iov.push(libc::iovec {
                        iov_base: discard.as_mut_ptr().cast(),
                        iov_len: gap,
                    });
                }
                iov.push(libc::iovec {
                    iov_base: headers[*i].as_mut_ptr().cast(),
                    iov_len: RECORD_HEADER_BYTES,
                });
                let len = reads[*i].loc.len as usize;
                if len > 0 {
                    iov.push(libc::iovec {
                        // In bounds: asserted above.
                        iov_base: buf[reads[*i].dst..].as_mut_ptr().cast(),
                        iov_len: len,
                    });
                }
                at_end = at + rec_len(*i);
            }
            let wanted = (run_end - start) as usize;
            // SAFETY: every iovec points into `buf`, `headers` or `discard`, all exclusively
            // borrowed by this function and not otherwise touched until the call returns.
            let got = unsafe { preadv_cached(file, &mut iov, *start) };
            if !matches!(got, Ok(n) if n == wanted) {
                return false;
            }
            for (i, _, _) in &placed[run..end] {
                if self.check_scattered(&reads[*i], &headers[*i], buf).is_err() {
                    return false;
                }
            }
            run = end;
        }
        true
    }

    /// Whether [`read_mapped_records_into`](Self::read_mapped_records_into) may be tried now:
    /// the backend is `Auto` and no mapped read has waited for the disk within the last
    /// second.
    pub fn mapped_reads_enabled(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.options.io_backend == IoBackend::Auto
            && self.opened.elapsed().as_millis() as u64 >= self.mapped_paused_until_ms.load(Relaxed)
    }

    /// Like [`read_cached_records_into`](Self::read_cached_records_into), but copies each
    /// record out of a mapping of its segment file: no system call per record. A page that is
    /// not in the page cache makes the copy wait for the disk (the page fault sleeps), so this
    /// stops at the first record whose copy slept, pauses mapped reads for [`MAPPED_PAUSE`]
    /// and returns false: cold data then goes the non-blocking way, and an async worker calling
    /// this waits for at most one disk read per pause. Records of erasure-coded segments are
    /// not mapped (false). True if every record is in place and verified.
    ///
    /// Panics if two slots overlap or a slot is outside `buf` (a caller's bug).
    pub fn read_mapped_records_into(&self, reads: &[RecordRead], buf: &mut [u8]) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.mapped_reads_enabled() {
            return false;
        }
        check_slots(reads, buf.len());
        // One getrusage per call (not per record): the count to compare a slow copy against.
        let waits_before = mapped::thread_waits();
        let mut last: Option<(u64, Arc<Handle>)> = None;
        for (i, r) in reads.iter().enumerate() {
            if last.as_ref().is_none_or(|(id, _)| *id != r.loc.segment_id) {
                match self.reader(r.loc.segment_id) {
                    Ok(h) => last = Some((r.loc.segment_id, h)),
                    Err(_) => return false,
                }
            }
            let Some((_, handle)) = &last else {
                return false;
            };
            let Handle::Copies(files, map) = &**handle else {
                return false;
            };
            let Some(map) = map.get_or_init(|| {
                let len = files[0]
                    .metadata()
                    .ok()?
                    .len()
                    .max(self.options.segment_bytes_max);
                mapped::Mapping::new(&files[0], usize::try_from(len).ok()?).ok()
            }) else {
                return false;
            };
            // The next records of this segment are asked for now (their first lines: the
            // hardware prefetcher follows on with the rest), so their misses overlap this copy.
            // (Each once: the first record asks for the next few, each later one for the
            // record that many places after it.)
            let from = if i == 0 { 1 } else { i + MAPPED_PREFETCH_AHEAD };
            for next in reads.iter().take(i + MAPPED_PREFETCH_AHEAD + 1).skip(from) {
                if next.loc.segment_id == r.loc.segment_id {
                    map.prefetch(next.loc.offset, RECORD_HEADER_BYTES + 128);
                }
            }
            let len = r.loc.len as usize;
            let mut header = [0u8; RECORD_HEADER_BYTES];
            let started = std::time::Instant::now();
            let copied = map.copy_to(r.loc.offset, &mut header)
                && map.copy_to(
                    r.loc.offset + RECORD_HEADER_BYTES as u64,
                    &mut buf[r.dst..r.dst + len],
                );
            // Slow: preempted, or the disk was read (the thread slept: stop here).
            if started.elapsed() > MAPPED_SLOW_COPY && mapped::thread_waits() != waits_before {
                let until = self.opened.elapsed() + MAPPED_PAUSE;
                self.mapped_paused_until_ms
                    .store(until.as_millis() as u64, Relaxed);
                return false;
            }
            let ok = copied && self.check_scattered(r, &header, buf).is_ok();
            if !ok {
                // A fault or a failed check: this mapping may now hold a zero page where the
                // file had an unreadable one. Forget the handle (and with it the mapping) so
                // later reads open the file afresh; this frame is read the other way, which
                // reports the error or serves the record from another copy.
                let mut readers = self.readers.write().unwrap_or_else(|p| p.into_inner());
                if readers
                    .get(&r.loc.segment_id)
                    .is_some_and(|h| Arc::ptr_eq(h, handle))
                {
                    readers.remove(&r.loc.segment_id);
                }
                return false;
            }
        }
        true
    }

    fn check_scattered(
        &self,
        r: &RecordRead,
        header: &[u8; RECORD_HEADER_BYTES],
        buf: &[u8],
    ) -> std::result::Result<(), String> {
        let h = decode_record_header(header)?;
        if h.object_id != r.object_id || h.chunk_index != r.chunk_index {
            return Err("record belongs to another object".into());
        }
        if h.payload_len != r.loc.len {
            return Err("length does not match the index".into());
        }
        if crc32c(&buf[r.dst..r.dst + r.loc.len as usize]) != h.payload_crc32c {
            return Err("payload crc32c mismatch".into());
        }
        Ok(())
    }

    /// Seals the active segment now if it holds records (a new one takes over), so that
    /// compaction may reclaim its dead records. Returns whether it did.
    pub fn seal_active(&self) -> Result<bool> {
        if self.read_only {
            return Ok(false);
        }
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if active.offset <= SEGMENT_HEADER_BYTES as u64 {
            return Ok(false);
        }
        self.rotate(&mut active)?;
        Ok(true)
    }

    /// Logical segment bytes: every segment's length as written (headers and records), once,
    /// whatever its redundancy on disk.
    pub fn segment_bytes(&self) -> u64 {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).offset;
        self.sealed_segments()
            .map(|s| s.iter().map(|(_, len)| len).sum::<u64>())
            .unwrap_or(0)
            + active
    }

    /// Bytes of all segment and shard files on disk.
    pub fn disk_bytes(&self) -> u64 {
        let mut total = 0;
        for d in &self.disks {
            for dir in [&d.segments, &d.shards] {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                total += entries
                    .filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name().to_str().is_some_and(|n| {
                            parse_segment_name(n).is_some() || ec::parse_shard_name(n).is_some()
                        })
                    })
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum::<u64>();
            }
        }
        total
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
            if let Err(e) = probe_disk(&d.root) {
                use std::sync::atomic::Ordering::Relaxed;
                self.counters.disk_probe_failures.fetch_add(1, Relaxed);
                d.fail(&format_args!("disk probe: {e}"));
                failed.push(d.root.clone());
            }
        }
        failed
    }
}

/// Sealing, repair, scrub and status of erasure-coded segments.
impl ChunkStore {
    /// Seals the active segment if it holds records and has been idle for `idle`, then encodes
    /// every sealed segment still held as copies into shards (dropping the copies once the
    /// shards are durable). Returns how many segments were encoded. Without erasure coding
    /// this does nothing.
    pub fn seal_due(&self, idle: Option<std::time::Duration>) -> Result<u64> {
        if self.ec.is_none() || self.read_only {
            return Ok(0);
        }
        if let Some(idle) = idle {
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            if active.offset > SEGMENT_HEADER_BYTES as u64 && active.last_append.elapsed() >= idle {
                self.rotate(&mut active)?;
            }
        }
        let _guard = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        self.seal_pending()
    }

    fn seal_pending(&self) -> Result<u64> {
        let Some((k, m)) = self.ec else {
            return Ok(0);
        };
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).id;
        let pending: Vec<(u64, Vec<usize>)> = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .range(..active)
            .filter_map(|(id, p)| match p {
                Placement::Copies(on) => Some((*id, on.clone())),
                Placement::Shards { .. } => None,
            })
            .collect();
        let usable = self.disks.iter().filter(|d| d.usable()).count();
        if !pending.is_empty() && usable < k + m {
            // Sealed segments stay mirrored (M+1 copies) until enough disks are back.
            if !self
                .seal_blocked
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::error!(
                    usable,
                    needed = k + m,
                    "too few healthy disks to encode sealed segments; they stay mirrored"
                );
            }
            return Ok(0);
        }
        self.seal_blocked
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let mut sealed = 0;
        for (id, on) in pending {
            match self.seal_one(id, &on, k, m) {
                Ok(true) => sealed += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(segment = id, error = %e, "sealing failed; retried later"),
            }
        }
        Ok(sealed)
    }

    fn seal_one(&self, id: u64, on: &[usize], k: usize, m: usize) -> Result<bool> {
        // The copy to encode: the one whose records verify furthest (a crash can leave copies
        // with different torn tails; acknowledged records are on all of them).
        let mut best: Option<(u64, u64, PathBuf)> = None;
        for &d in on {
            let path = segment_path(&self.disks[d].segments, id);
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let valid = scan_segment(&path).map_or(0, |s| meta.len() - s.torn_tail_bytes);
            if best
                .as_ref()
                .is_none_or(|(v, l, _)| (valid, meta.len()) > (*v, *l))
            {
                best = Some((valid, meta.len(), path));
            }
        }
        let Some((valid, len, path)) = best else {
            return Err(ChunkStoreError::MissingSegment(id));
        };
        if valid < len {
            tracing::info!(
                segment = id,
                unverified_tail = len - valid,
                "segment copy ends in bytes that do not verify (torn by a crash); encoded as is, never read"
            );
        }
        let src = File::open(&path).map_err(|e| io_err(&path, e))?;
        let targets = self.pick_disks(id, k + m, &[])?;
        let finals: Vec<PathBuf> = targets
            .iter()
            .enumerate()
            .map(|(i, &d)| self.disks[d].shards.join(ec::shard_file_name(id, i)))
            .collect();
        let tmps: Vec<PathBuf> = finals.iter().map(|p| tmp_path(p)).collect();
        for &d in &targets {
            std::fs::create_dir_all(&self.disks[d].shards)
                .map_err(|e| io_err(&self.disks[d].shards, e))?;
        }
        let remove_all = |paths: &[PathBuf]| {
            for p in paths {
                let _ = std::fs::remove_file(p);
            }
        };
        let layout = match ec::encode_segment(id, &src, &path, len, k, m, &tmps) {
            Ok(l) => l,
            Err(e) => {
                remove_all(&tmps);
                return Err(e);
            }
        };
        let mut catalog = self.catalog.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(catalog.get(&id), Some(Placement::Copies(_))) {
            // Retired by compaction meanwhile.
            remove_all(&tmps);
            return Ok(false);
        }
        for (t, f) in tmps.iter().zip(&finals) {
            if let Err(e) = std::fs::rename(t, f) {
                remove_all(&tmps);
                remove_all(&finals);
                return Err(io_err(f, e));
            }
        }
        for &d in &targets {
            sync_dir(&self.disks[d].shards)?;
        }
        let place = Placement::Shards {
            layout,
            disks: targets.iter().map(|&d| Some(d)).collect(),
        };
        let handle = Arc::new(self.open_handle(id, &place)?);
        catalog.insert(id, place);
        self.readers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, handle);
        drop(catalog);
        // The shards are durable and published: the copies go (open handles keep serving
        // reads already under way).
        for &d in on {
            let p = segment_path(&self.disks[d].segments, id);
            if std::fs::remove_file(&p).is_ok() {
                let _ = sync_dir(&self.disks[d].segments);
            }
        }
        use std::sync::atomic::Ordering::Relaxed;
        self.counters.segments_encoded.fetch_add(1, Relaxed);
        self.counters.bytes_encoded.fetch_add(len, Relaxed);
        tracing::info!(
            segment = id,
            bytes = len,
            k,
            m,
            "segment encoded into shards"
        );
        Ok(true)
    }

    /// Repairs the segments reads found damaged (background work between scrubs).
    pub fn repair_suspects(&self) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        if self.ec.is_none() || self.read_only {
            return Ok(report);
        }
        let ids: Vec<u64> = self
            .suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        if ids.is_empty() {
            return Ok(report);
        }
        let _guard = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        report.segments_sealed = self.seal_pending()?;
        for id in ids {
            self.repair_segment(id, &mut |_| {}, &mut report)?;
        }
        Ok(report)
    }

    /// Verifies every shard of every encoded segment (header and block crcs), rebuilds the
    /// missing and corrupt ones onto healthy disks, and first encodes any sealed segment still
    /// held as copies. `rate` (bytes per second) throttles the reading; `progress` is told
    /// (bytes done, bytes in all).
    pub fn scrub(&self, rate: Option<u64>, progress: &dyn Fn(u64, u64)) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        if self.ec.is_none() || self.read_only {
            return Ok(report);
        }
        let _guard = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        for d in &self.disks {
            // A disk that failed earlier and is writable again (replaced) is taken back.
            if d.failed.load(std::sync::atomic::Ordering::Relaxed)
                && std::fs::create_dir_all(&d.shards).is_ok()
                && std::fs::create_dir_all(&d.segments).is_ok()
                && std::fs::write(d.root.join(".probe"), b"ok").is_ok()
            {
                let _ = std::fs::remove_file(d.root.join(".probe"));
                d.failed.store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(disk = %d.root.display(), "disk is writable again");
            } else if !d.root.is_dir() {
                let _ = std::fs::create_dir_all(&d.shards);
                let _ = std::fs::create_dir_all(&d.segments);
            }
        }
        report.segments_sealed = self.seal_pending()?;
        let encoded: Vec<(u64, u64)> = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(id, p)| match p {
                Placement::Shards { layout, .. } => {
                    Some((*id, layout.shard_len as u64 * (layout.k + layout.m) as u64))
                }
                Placement::Copies(_) => None,
            })
            .collect();
        let total: u64 = encoded.iter().map(|(_, b)| b).sum();
        let start = std::time::Instant::now();
        let mut done = 0u64;
        progress(0, total);
        for (id, bytes) in encoded {
            let before = done;
            let mut pace = |n: u64| {
                done += n;
                if let Some(rate) = rate.filter(|r| *r > 0) {
                    let due = std::time::Duration::from_secs_f64(done as f64 / rate as f64);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            };
            self.repair_segment(id, &mut pace, &mut report)?;
            // Missing shards read nothing; the bar still moves by the segment's size.
            done = before + bytes;
            progress(done, total);
        }
        Ok(report)
    }

    fn repair_segment(
        &self,
        id: u64,
        pace: &mut dyn FnMut(u64),
        report: &mut ScrubReport,
    ) -> Result<()> {
        let place = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned();
        let Some(Placement::Shards { layout, disks }) = place.clone() else {
            self.suspects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return Ok(());
        };
        let Some(place) = place else { return Ok(()) };
        let Handle::Shards(set) = self.open_handle(id, &place)? else {
            return Ok(());
        };
        report.segments_checked += 1;
        let mut bad = Vec::new();
        for i in 0..layout.k + layout.m {
            report.shards_checked += 1;
            if set.files[i].is_none() {
                report.shards_missing += 1;
                bad.push(i);
                continue;
            }
            match set.check(i, pace) {
                Ok(()) => report.bytes_checked += layout.shard_len as u64,
                Err(why) => {
                    tracing::warn!(segment = id, shard = i, reason = %why, "corrupt shard found");
                    report.shards_corrupt += 1;
                    bad.push(i);
                }
            }
        }
        if bad.is_empty() {
            self.suspects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return Ok(());
        }
        self.counters
            .shard_faults_found
            .fetch_add(bad.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let n = self.disks.len();
        let holding: Vec<usize> = disks
            .iter()
            .enumerate()
            .filter(|(i, _)| !bad.contains(i))
            .filter_map(|(_, d)| *d)
            .collect();
        let mut chosen: Vec<usize> = Vec::new();
        for &i in &bad {
            let preferred = disks[i].unwrap_or(((id % n as u64) as usize + i) % n);
            let free =
                |d: usize| self.disks[d].usable() && !holding.contains(&d) && !chosen.contains(&d);
            let pick = if free(preferred) {
                Some(preferred)
            } else {
                (0..n).find(|&d| free(d))
            };
            match pick {
                Some(d) => chosen.push(d),
                None => {
                    tracing::error!(segment = id, "no healthy disk left to rebuild a shard on");
                    report.unrepairable.push(id);
                    return Ok(());
                }
            }
        }
        let finals: Vec<PathBuf> = bad
            .iter()
            .zip(&chosen)
            .map(|(&i, &d)| self.disks[d].shards.join(ec::shard_file_name(id, i)))
            .collect();
        let tmps: Vec<PathBuf> = finals.iter().map(|p| tmp_path(p)).collect();
        for &d in &chosen {
            std::fs::create_dir_all(&self.disks[d].shards)
                .map_err(|e| io_err(&self.disks[d].shards, e))?;
        }
        let mut files = set.files.clone();
        for &i in &bad {
            files[i] = None;
        }
        let survivors = ec::ShardSet::new(id, layout, files, set.paths.clone())?;
        match survivors.rebuild_shards(&bad, &tmps) {
            Ok(()) => {}
            Err(e) => {
                for t in &tmps {
                    let _ = std::fs::remove_file(t);
                }
                if matches!(e, ChunkStoreError::Unrecoverable { .. }) {
                    tracing::error!(segment = id, error = %e, "segment cannot be repaired");
                    report.unrepairable.push(id);
                    return Ok(());
                }
                return Err(e);
            }
        }
        let mut catalog = self.catalog.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Placement::Shards { disks: now, .. }) = catalog.get(&id).cloned() else {
            for t in &tmps {
                let _ = std::fs::remove_file(t);
            }
            return Ok(());
        };
        let mut now = now;
        for ((&i, &d), (t, f)) in bad.iter().zip(&chosen).zip(tmps.iter().zip(&finals)) {
            std::fs::rename(t, f).map_err(|e| io_err(f, e))?;
            if let Some(old) = now[i]
                && old != d
            {
                let _ =
                    std::fs::remove_file(self.disks[old].shards.join(ec::shard_file_name(id, i)));
            }
            now[i] = Some(d);
        }
        for &d in &chosen {
            sync_dir(&self.disks[d].shards)?;
        }
        let place = Placement::Shards { layout, disks: now };
        let handle = Arc::new(self.open_handle(id, &place)?);
        catalog.insert(id, place);
        self.readers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, handle);
        drop(catalog);
        self.suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        self.counters
            .shards_rebuilt
            .fetch_add(bad.len() as u64, std::sync::atomic::Ordering::Relaxed);
        report.shards_rebuilt += bad.len() as u64;
        tracing::info!(segment = id, shards = ?bad, "shards rebuilt");
        Ok(())
    }

    /// Disks, their capacity, and segments per state; `None` without erasure coding.
    pub fn ec_status(&self) -> Option<EcStatus> {
        let (k, m) = self.ec?;
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).id;
        let catalog = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let suspects = self
            .suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut st = EcStatus {
            k,
            m,
            ..Default::default()
        };
        let mut copies = vec![0u64; self.disks.len()];
        let mut shards = vec![0u64; self.disks.len()];
        for (id, p) in &catalog {
            match p {
                Placement::Copies(on) => {
                    if *id >= active {
                        st.segments_open += 1;
                    } else {
                        st.segments_sealed += 1;
                    }
                    on.iter().for_each(|&d| copies[d] += 1);
                    if on.len() < m + 1 || suspects.contains(id) {
                        st.segments_degraded += 1;
                    }
                }
                Placement::Shards { disks, .. } => {
                    st.segments_encoded += 1;
                    disks.iter().flatten().for_each(|&d| shards[d] += 1);
                    let lost = disks.iter().filter(|d| d.is_none()).count();
                    if lost > m {
                        st.segments_unrecoverable += 1;
                    } else if lost > 0 || suspects.contains(id) {
                        st.segments_degraded += 1;
                    }
                }
            }
        }
        for (i, d) in self.disks.iter().enumerate() {
            let (capacity_bytes, free_bytes) = fs_space(&d.root).unwrap_or((0, 0));
            st.disks.push(DiskStatus {
                path: d.root.display().to_string(),
                online: d.usable(),
                capacity_bytes,
                free_bytes,
                segment_copies: copies[i],
                shards: shards[i],
            });
        }
        Some(st)
    }
}

fn tmp_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}

/// (capacity, free) bytes of the file system holding `path`.
fn fs_space(path: &Path) -> Option<(u64, u64)> {
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

/// The payload length and encoded header of a record (refusing oversized payloads): the one
/// place both the store's appends and standalone segment files build records.
fn record_header(
    object_id: [u8; 16],
    chunk_index: u32,
    payload: &[u8],
) -> Result<(u32, [u8; RECORD_HEADER_BYTES])> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= RECORD_PAYLOAD_BYTES_MAX)
        .ok_or(ChunkStoreError::RecordTooLarge(payload.len()))?;
    let header = RecordHeader {
        object_id,
        chunk_index,
        payload_len: len,
        payload_crc32c: crc32c(payload),
    }
    .encode();
    Ok((len, header))
}

/// Writes `header` then `payload` at `offset` with `pwritev`, so the record is not first
/// copied into one buffer (for 1 MiB chunks that copy, and the fresh pages it touched, cost
/// more CPU than the write itself).
/// Fills the buffers of `iov` from `file` at `offset`, in order, from the page cache only
/// (`RWF_NOWAIT`), and returns the bytes read: fewer than asked where the file or the cached
/// pages end (0 where the kernel cannot read without waiting). `iov` is consumed (advanced) as
/// it fills.
///
/// # Safety
///
/// Every iovec must point at memory valid for writes of its length, not accessed through any
/// other path for the duration of the call.
unsafe fn preadv_cached(
    file: &File,
    iov: &mut [libc::iovec],
    offset: u64,
) -> std::io::Result<usize> {
    use std::os::unix::io::AsRawFd;
    let mut first = 0usize;
    let mut done = 0usize;
    while first < iov.len() {
        let at = i64::try_from(offset + done as u64)
            .map_err(|_| std::io::Error::other("offset past i64"))?;
        let count = (iov.len() - first).min(1024) as libc::c_int;
        // SAFETY: the caller guarantees the iovecs; `first..first + count` is in bounds.
        let n = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                iov[first..].as_ptr(),
                count,
                at,
                libc::RWF_NOWAIT,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS) => break,
                _ => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        let mut n = n as usize;
        done += n;
        while n > 0 && first < iov.len() {
            let take = n.min(iov[first].iov_len);
            iov[first].iov_len -= take;
            // SAFETY: advancing within the same buffer by at most its remaining length.
            iov[first].iov_base = unsafe { iov[first].iov_base.cast::<u8>().add(take) }.cast();
            n -= take;
            if iov[first].iov_len == 0 {
                first += 1;
            }
        }
        // A short read stops where the cached pages end: what follows would wait.
        if first < iov.len() {
            break;
        }
    }
    Ok(done)
}

/// Panics if two records' payload slots overlap or one lies outside a buffer of `buf_len`
/// bytes.
fn check_slots(reads: &[RecordRead], buf_len: usize) {
    let mut by_dst: Vec<(usize, usize)> = reads
        .iter()
        .map(|r| (r.dst, r.dst + r.loc.len as usize))
        .collect();
    by_dst.sort_unstable();
    for w in by_dst.windows(2) {
        assert!(w[0].1 <= w[1].0, "record slots overlap");
    }
    if let Some(last) = by_dst.last() {
        assert!(last.1 <= buf_len, "record slot outside the buffer");
    }
}

/// One disk probe (see [`ChunkStore::probe_disks`]).
fn probe_disk(root: &Path) -> std::io::Result<()> {
    use std::io::{Read, Write};
    let path = root.join(PROBE_FILE);
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut data = vec![0u8; PROBE_BYTES];
    for (i, b) in data.iter_mut().enumerate() {
        *b = (stamp >> ((i % 8) * 8)) as u8 ^ i as u8;
    }
    let result = (|| {
        let mut f = File::create(&path)?;
        f.write_all(&data)?;
        f.sync_data()?;
        let mut back = Vec::with_capacity(PROBE_BYTES);
        File::open(&path)?.read_to_end(&mut back)?;
        if back != data {
            return Err(std::io::Error::other(
                "read back differs from what was written",
            ));
        }
        Ok(())
    })();
    let _ = std::fs::remove_file(&path);
    result
}

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

/// Reads `buf.len()` bytes at `offset` only if they are all in the page cache
/// (`preadv2` with `RWF_NOWAIT`); `None` means "not cached, or not supported": read otherwise.
fn read_if_cached(file: &File, buf: &mut [u8], offset: u64) -> Option<std::io::Result<()>> {
    use std::os::unix::io::AsRawFd;
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let offset = i64::try_from(offset).ok()?;
    // SAFETY: `iov` points at `buf`, which is valid for writes of its length for the call.
    let n = unsafe { libc::preadv2(file.as_raw_fd(), &iov, 1, offset, libc::RWF_NOWAIT) };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN)
            | Some(libc::EOPNOTSUPP)
            | Some(libc::ENOSYS)
            | Some(libc::EINVAL) => None,
            _ => Some(Err(e)),
        };
    }
    // A partly cached record is read again in full by the slow path.
    (n as usize == buf.len()).then_some(Ok(()))
}

/// Checks a record read from disk (magic, version, header crc, identity, length, payload
/// crc32c) and returns its payload.
fn verify_record(
    loc: &RecordLocation,
    read: std::io::Result<Vec<u8>>,
    object_id: &[u8; 16],
    chunk_index: u32,
    path: &Path,
) -> Result<Vec<u8>> {
    let corrupt = |reason: String| ChunkStoreError::Corrupt {
        segment_id: loc.segment_id,
        offset: loc.offset,
        reason,
    };
    let mut buf = match read {
        Ok(b) if b.len() == RECORD_HEADER_BYTES + loc.len as usize => b,
        Ok(_) => return Err(corrupt("short read".into())),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(corrupt("record extends past the end of the segment".into()));
        }
        Err(e) => return Err(io_err(path, e)),
    };
    check_record(&buf, loc, object_id, chunk_index)?;
    buf.drain(..RECORD_HEADER_BYTES);
    Ok(buf)
}

/// Verifies one whole record (header then payload, exactly `RECORD_HEADER_BYTES + loc.len`
/// bytes): magic, version and header crc, the expected identity and length, and the payload
/// crc32c. Returns the payload. Every read path ends here.
fn check_record<'a>(
    record: &'a [u8],
    loc: &RecordLocation,
    object_id: &[u8; 16],
    chunk_index: u32,
) -> Result<&'a [u8]> {
    let corrupt = |reason: String| ChunkStoreError::Corrupt {
        segment_id: loc.segment_id,
        offset: loc.offset,
        reason,
    };
    let header = decode_record_header(&record[..RECORD_HEADER_BYTES]).map_err(corrupt)?;
    if header.object_id != *object_id || header.chunk_index != chunk_index {
        return Err(corrupt("record belongs to another object".into()));
    }
    if header.payload_len != loc.len {
        return Err(corrupt(format!(
            "length {} does not match the index ({})",
            header.payload_len, loc.len
        )));
    }
    let payload = &record[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + loc.len as usize];
    let crc = crc32c(payload);
    if crc != header.payload_crc32c {
        return Err(corrupt(format!(
            "payload crc32c {crc:08x} != stored {:08x}",
            header.payload_crc32c
        )));
    }
    Ok(payload)
}

/// A run of bytes read from one segment by [`ChunkStore::read_span_into`]: several
/// neighbouring records in one read, in any byte container (an owned buffer, or a slice of a
/// larger one). Each record in it is verified when it is taken out with [`Span::record`].
#[derive(Debug)]
pub struct Span<B = Vec<u8>> {
    pub segment_id: u64,
    /// Offset in the segment of `bytes[0]`.
    pub offset: u64,
    pub bytes: B,
}

impl<B: AsRef<[u8]>> Span<B> {
    /// Whether the whole record at `loc` (header and payload) lies inside this span.
    pub fn covers(&self, loc: &RecordLocation) -> bool {
        loc.segment_id == self.segment_id
            && loc.offset >= self.offset
            && loc.offset + RECORD_HEADER_BYTES as u64 + u64::from(loc.len)
                <= self.offset + self.bytes.as_ref().len() as u64
    }

    /// The verified payload of the record at `loc`, borrowed from the span: header magic,
    /// version and crc, the expected identity and length, and the payload crc32c are all
    /// checked, exactly as [`ChunkStore::read`] does.
    pub fn record(
        &self,
        loc: &RecordLocation,
        object_id: &[u8; 16],
        chunk_index: u32,
    ) -> Result<&[u8]> {
        let corrupt = |reason: String| ChunkStoreError::Corrupt {
            segment_id: loc.segment_id,
            offset: loc.offset,
            reason,
        };
        if !self.covers(loc) {
            return Err(corrupt("record extends past the end of the segment".into()));
        }
        let at = (loc.offset - self.offset) as usize;
        let end = at + RECORD_HEADER_BYTES + loc.len as usize;
        check_record(&self.bytes.as_ref()[at..end], loc, object_id, chunk_index)
    }
}

pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// Writes one standalone segment file (segment header, then records) outside the store's own
/// directories: the tier mover builds the segments it sends to slower tiers with it, in the
/// same format, so their records verify exactly like local ones.
pub struct SegmentFileWriter {
    file: File,
    path: PathBuf,
    id: u64,
    offset: u64,
}

impl SegmentFileWriter {
    pub fn create(path: &Path, id: u64) -> Result<Self> {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)
            .map_err(|e| io_err(path, e))?;
        let header = SegmentHeader {
            segment_id: id,
            created_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        file.write_all_at(&header.encode(), 0)
            .map_err(|e| io_err(path, e))?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            id,
            offset: SEGMENT_HEADER_BYTES as u64,
        })
    }

    /// Bytes written so far (the segment's length).
    pub fn len(&self) -> u64 {
        self.offset
    }

    pub fn is_empty(&self) -> bool {
        self.offset <= SEGMENT_HEADER_BYTES as u64
    }

    pub fn append(
        &mut self,
        object_id: [u8; 16],
        chunk_index: u32,
        payload: &[u8],
    ) -> Result<RecordLocation> {
        let (len, header) = record_header(object_id, chunk_index, payload)?;
        write_all_vectored_at(&self.file, &header, payload, self.offset)
            .map_err(|e| io_err(&self.path, e))?;
        let loc = RecordLocation {
            segment_id: self.id,
            offset: self.offset,
            len,
        };
        self.offset += RECORD_HEADER_BYTES as u64 + u64::from(len);
        Ok(loc)
    }

    /// Makes the file durable and returns its length.
    pub fn finish(self) -> Result<u64> {
        self.file.sync_all().map_err(|e| io_err(&self.path, e))?;
        Ok(self.offset)
    }
}

/// The outcome of scanning a segment file from the start.
#[derive(Debug, Default)]
pub struct SegmentScan {
    pub records: Vec<(RecordLocation, RecordHeader)>,
    /// Bytes after the last valid record (a torn write, or never written).
    pub torn_tail_bytes: u64,
}

/// Walks a segment record by record, verifying every header and payload checksum, and stops at
/// the first record that does not verify. Used at start-up and by offline verification.
pub fn scan_segment(path: &Path) -> Result<SegmentScan> {
    let file = File::open(path).map_err(|e| io_err(path, e))?;
    let size = file.metadata().map_err(|e| io_err(path, e))?.len();
    let mut hdr = [0u8; SEGMENT_HEADER_BYTES];
    file.read_exact_at(&mut hdr, 0)
        .map_err(|e| io_err(path, e))?;
    let seg = SegmentHeader::decode(&hdr).map_err(|reason| ChunkStoreError::Corrupt {
        segment_id: 0,
        offset: 0,
        reason,
    })?;
    let mut scan = SegmentScan::default();
    let mut offset = SEGMENT_HEADER_BYTES as u64;
    let mut rh = [0u8; RECORD_HEADER_BYTES];
    let mut payload = Vec::new();
    while offset + RECORD_HEADER_BYTES as u64 <= size {
        if file.read_exact_at(&mut rh, offset).is_err() {
            break;
        }
        let Ok(header) = decode_record_header(&rh) else {
            break;
        };
        let end = offset + RECORD_HEADER_BYTES as u64 + u64::from(header.payload_len);
        if end > size {
            break;
        }
        payload.resize(header.payload_len as usize, 0);
        if file
            .read_exact_at(&mut payload, offset + RECORD_HEADER_BYTES as u64)
            .is_err()
            || crc32c(&payload) != header.payload_crc32c
        {
            break;
        }
        scan.records.push((
            RecordLocation {
                segment_id: seg.segment_id,
                offset,
                len: header.payload_len,
            },
            header,
        ));
        offset = end;
    }
    scan.torn_tail_bytes = size - offset;
    Ok(scan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store(dir: &Path, seg: u64) -> ChunkStore {
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

    fn ec_store(disks: &[PathBuf], seg: u64) -> ChunkStore {
        ChunkStore::open(
            "/nonexistent-unused",
            ChunkStoreOptions {
                segment_bytes_max: seg,
                io_backend: IoBackend::Auto,
                disks: disks.to_vec(),
                ec: Some((4, 2)),
            },
        )
        .unwrap()
    }

    fn payload(i: u32) -> Vec<u8> {
        let n = [100usize, 3000, 70_000, 300_000][i as usize % 4] + i as usize;
        (0..n)
            .map(|b| (b as u32).wrapping_mul(i | 1) as u8)
            .collect()
    }

    #[test]
    fn erasure_coded_segments_survive_two_lost_disks_and_repair() {
        let dir = tempfile::tempdir().unwrap();
        let disks: Vec<PathBuf> = (0..6).map(|i| dir.path().join(format!("d{i}"))).collect();
        let mut locs = Vec::new();
        {
            let s = ec_store(&disks, 1 << 20);
            for i in 0..120u32 {
                let (loc, t) = s.append([5; 16], i, &payload(i)).unwrap();
                s.sync_through(t).unwrap();
                locs.push(loc);
            }
            // Open segments are mirrored on m + 1 = 3 disks.
            let st = s.ec_status().unwrap();
            assert_eq!(st.segments_open, 1);
            assert!(s.seal_due(Some(std::time::Duration::ZERO)).unwrap() > 5);
            let st = s.ec_status().unwrap();
            assert_eq!(st.segments_sealed, 0);
            assert!(st.segments_encoded > 5);
            for (i, loc) in locs.iter().enumerate() {
                assert_eq!(s.read(loc, &[5; 16], i as u32).unwrap(), payload(i as u32));
            }
            assert_eq!(s.stats().degraded_reads, 0);
        }
        let lose = |a: usize, b: usize| {
            std::fs::remove_dir_all(&disks[a]).unwrap();
            std::fs::remove_dir_all(&disks[b]).unwrap();
        };
        // Span reads rebuild missing shards; bytes that read but are wrong are caught by the
        // record check, and the caller then reads the record again with `read`.
        let read_all = |s: &ChunkStore, spans: bool| {
            for (i, loc) in locs.iter().enumerate() {
                assert_eq!(
                    s.read(loc, &[5; 16], i as u32).unwrap(),
                    payload(i as u32),
                    "record {i}"
                );
                if !spans {
                    continue;
                }
                let mut span = vec![0u8; RECORD_HEADER_BYTES + loc.len as usize];
                let n = s
                    .read_span_into(loc.segment_id, loc.offset, &mut span)
                    .unwrap();
                let span = Span {
                    segment_id: loc.segment_id,
                    offset: loc.offset,
                    bytes: &span[..n],
                };
                assert_eq!(
                    span.record(loc, &[5; 16], i as u32).unwrap(),
                    &payload(i as u32)[..]
                );
            }
        };
        lose(1, 4);
        let s = ec_store(&disks, 1 << 20);
        read_all(&s, true);
        assert!(s.stats().degraded_reads > 0);
        assert!(s.ec_status().unwrap().segments_degraded > 0);
        let report = s.scrub(None, &|_, _| {}).unwrap();
        assert!(report.shards_missing > 0 && report.shards_rebuilt == report.shards_missing);
        assert!(report.unrepairable.is_empty());
        assert_eq!(s.ec_status().unwrap().segments_degraded, 0);
        drop(s);
        lose(0, 5);
        let s = ec_store(&disks, 1 << 20);
        read_all(&s, true);
        s.scrub(None, &|_, _| {}).unwrap();
        drop(s);

        // Flipped bytes in every shard on one disk: reads still right, scrub repairs.
        let shard_dir = disks[2].join("shards");
        for e in std::fs::read_dir(&shard_dir).unwrap() {
            let p = e.unwrap().path();
            let mut b = std::fs::read(&p).unwrap();
            for at in (ec::SHARD_HEADER_BYTES as usize..b.len()).step_by(997) {
                b[at] ^= 0x10;
            }
            std::fs::write(&p, &b).unwrap();
        }
        let s = ec_store(&disks, 1 << 20);
        read_all(&s, false);
        let report = s.scrub(None, &|_, _| {}).unwrap();
        assert!(report.shards_corrupt > 0);
        assert_eq!(report.shards_rebuilt, report.shards_corrupt);
        let again = s.scrub(None, &|_, _| {}).unwrap();
        assert_eq!(again.shards_corrupt + again.shards_missing, 0);
        drop(s);

        // Three disks lost: records whose data shard survives still read; the others fail
        // with an error, never with wrong bytes.
        std::fs::remove_dir_all(&disks[0]).unwrap();
        lose(1, 3);
        let s = ec_store(&disks, 1 << 20);
        let (mut ok, mut lost) = (0, 0);
        for (i, loc) in locs.iter().enumerate() {
            match s.read(loc, &[5; 16], i as u32) {
                Ok(p) => {
                    assert_eq!(p, payload(i as u32));
                    ok += 1;
                }
                Err(ChunkStoreError::Unrecoverable { .. }) => lost += 1,
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        assert!(ok > 0 && lost > 0, "ok {ok} lost {lost}");
        assert!(s.ec_status().unwrap().segments_unrecoverable > 0);
        // New writes still work on the surviving (and recreated) disks.
        let (loc, t) = s.append([6; 16], 0, b"after").unwrap();
        s.sync_through(t).unwrap();
        assert_eq!(s.read(&loc, &[6; 16], 0).unwrap(), b"after");
    }

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

    #[test]
    fn interrupted_seal_is_redone_and_finished_seal_drops_copies() {
        let dir = tempfile::tempdir().unwrap();
        let disks: Vec<PathBuf> = (0..6).map(|i| dir.path().join(format!("d{i}"))).collect();
        let mut locs = Vec::new();
        {
            let s = ec_store(&disks, 1 << 20);
            for i in 0..20u32 {
                let (loc, t) = s.append([7; 16], i, &payload(i)).unwrap();
                s.sync_through(t).unwrap();
                locs.push(loc);
            }
        }
        // A crash after some shards were renamed into place: simulate by writing a stray
        // shard file with a valid name but no siblings.
        let first = locs[0].segment_id;
        let stray = disks[0].join("shards").join(ec::shard_file_name(first, 0));
        {
            let s = ec_store(&disks, 1 << 20);
            s.seal_due(None).unwrap();
            std::fs::copy(
                disks
                    .iter()
                    .map(|d| d.join("shards").join(ec::shard_file_name(first, 0)))
                    .find(|p| p.exists())
                    .unwrap(),
                dir.path().join("keep"),
            )
            .unwrap();
        }
        // Put copies back next to a partial shard set: start-up keeps the copies.
        for d in &disks {
            for e in std::fs::read_dir(d.join("shards")).unwrap() {
                let p = e.unwrap().path();
                if p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with(&format!("seg-{first:016x}"))
                {
                    std::fs::remove_file(p).unwrap();
                }
            }
        }
        std::fs::copy(dir.path().join("keep"), &stray).unwrap();
        let s = ec_store(&disks, 1 << 20);
        // Only one shard and no copy: the segment is beyond repair, and says so.
        let r = s.read(&locs[0], &[7; 16], 0);
        assert!(r.is_err() || r.unwrap() == payload(0));
    }

    /// Writes 60 records of 0 to 9 KiB (some neighbours more than a gap apart) across a
    /// sealed and the active segment, and has `read` place them (every other one skipped
    /// between 10 and 20, so runs have gaps) into slots laid out in reverse order with 3
    /// sentinel bytes between them; checks every slot, then that a flipped payload byte on
    /// disk fails the read of that record only. Returns the store for more checks.
    fn check_record_reads(
        read: impl Fn(&ChunkStore, &[RecordRead], &mut [u8]) -> bool,
    ) -> (tempfile::TempDir, ChunkStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 30);
        let mut recs = Vec::new();
        for i in 0..60u32 {
            let data = vec![i as u8 ^ 0x5a; (i as usize * 157) % 9000];
            let (loc, t) = s.append([7; 16], i, &data).unwrap();
            s.sync_through(t).unwrap();
            recs.push((loc, data));
            if i == 30 {
                assert!(s.seal_active().unwrap());
            }
        }
        let mut reads = Vec::new();
        let mut at = 0usize;
        for (i, (loc, _)) in recs.iter().enumerate().rev() {
            if (10..20).contains(&i) && i % 2 == 1 {
                continue;
            }
            reads.push(RecordRead {
                loc: *loc,
                object_id: [7; 16],
                chunk_index: i as u32,
                dst: at,
            });
            at += loc.len as usize + 3;
        }
        // Just written, so in the page cache.
        let mut buf = vec![0xeeu8; at];
        assert!(read(&s, &reads, &mut buf));
        for r in &reads {
            let data = &recs[r.chunk_index as usize].1;
            assert_eq!(&buf[r.dst..r.dst + data.len()], &data[..]);
            assert_eq!(&buf[r.dst + data.len()..r.dst + data.len() + 3], &[0xee; 3]);
        }
        let (bad, _) = recs[12];
        let file = OpenOptions::new()
            .write(true)
            .open(s.seg_path(bad.segment_id))
            .unwrap();
        let at = bad.offset + RECORD_HEADER_BYTES as u64 + 5;
        file.write_all_at(&[0xff], at).unwrap();
        assert!(!read(&s, &reads, &mut buf));
        let without: Vec<RecordRead> = reads
            .iter()
            .copied()
            .filter(|r| r.chunk_index != 12)
            .collect();
        assert!(read(&s, &without, &mut buf));
        (dir, s)
    }

    #[test]
    fn scattered_reads_place_and_verify_each_record() {
        check_record_reads(|s, reads, buf| s.read_cached_records_into(reads, buf));
    }

    /// A mapped read that is expected to succeed. A copy that a busy machine slowed down (these
    /// tests run beside others, on two cores in CI) pauses mapped reads by design, and the read
    /// answers false without a fault: that pause is waited out and the read tried once more,
    /// so only a false that is not a pause fails the caller's assertion.
    fn mapped_read(s: &ChunkStore, reads: &[RecordRead], buf: &mut [u8]) -> bool {
        assert_eq!(s.options.io_backend, IoBackend::Auto);
        if s.read_mapped_records_into(reads, buf) {
            return true;
        }
        if s.mapped_reads_enabled() {
            return false;
        }
        std::thread::sleep(MAPPED_PAUSE + std::time::Duration::from_millis(100));
        s.read_mapped_records_into(reads, buf)
    }

    #[test]
    fn mapped_reads_place_and_verify_each_record() {
        let (_dir, s) = check_record_reads(mapped_read);
        // Appended after the active segment was mapped: still inside the mapping.
        let late = vec![0x42u8; 3000];
        let (loc, t) = s.append([7; 16], 99, &late).unwrap();
        s.sync_through(t).unwrap();
        let one = [RecordRead {
            loc,
            object_id: [7; 16],
            chunk_index: 99,
            dst: 0,
        }];
        let mut small = vec![0u8; late.len()];
        assert!(mapped_read(&s, &one, &mut small));
        assert_eq!(small, late);
        // Another object's identity fails the read.
        let wrong = [RecordRead {
            object_id: [8; 16],
            ..one[0]
        }];
        assert!(!s.read_mapped_records_into(&wrong, &mut small));
    }

    /// A record the file no longer holds (the page behind it raises SIGBUS, as a page with an
    /// I/O error does) fails the mapped read instead of killing the process; the ordinary
    /// read then reports the error.
    #[test]
    fn a_mapped_read_of_an_unreadable_page_fails_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 30);
        let mut locs = Vec::new();
        for i in 0..8u32 {
            let (loc, t) = s.append([7; 16], i, &vec![i as u8; 20_000]).unwrap();
            s.sync_through(t).unwrap();
            locs.push(loc);
        }
        let read = |i: usize| RecordRead {
            loc: locs[i],
            object_id: [7; 16],
            chunk_index: i as u32,
            dst: 0,
        };
        let mut buf = vec![0u8; 20_000];
        assert!(mapped_read(&s, &[read(7)], &mut buf));
        // Cut the file in the middle of record 6 (a fault, not a checksum: the pages past
        // the new end are gone).
        let file = OpenOptions::new()
            .write(true)
            .open(s.seg_path(locs[6].segment_id))
            .unwrap();
        file.set_len(locs[6].offset + 100).unwrap();
        assert!(!s.read_mapped_records_into(&[read(7)], &mut buf));
        assert!(!s.read_mapped_records_into(&[read(6)], &mut buf));
        assert!(s.read(&locs[7], &[7; 16], 7).is_err());
        // Records before the cut still read, mapped and not.
        assert!(mapped_read(&s, &[read(5)], &mut buf));
        assert_eq!(buf, vec![5u8; 20_000]);
        assert_eq!(s.read(&locs[5], &[7; 16], 5).unwrap(), vec![5u8; 20_000]);
    }

    /// Records not in the page cache make a mapped copy wait for the disk: the read stops
    /// and mapped reads pause, so an async worker does not keep waiting.
    #[test]
    fn a_mapped_read_that_waits_for_the_disk_pauses_mapped_reads() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 30);
        let mut reads = Vec::new();
        let mut at = 0;
        for i in 0..64u32 {
            let (loc, t) = s.append([7; 16], i, &vec![i as u8; 64 * 1024]).unwrap();
            s.sync_through(t).unwrap();
            reads.push(RecordRead {
                loc,
                object_id: [7; 16],
                chunk_index: i,
                dst: at,
            });
            at += 64 * 1024;
        }
        // Synced, so clean: the kernel may drop the file's pages.
        let path = s.seg_path(reads[0].loc.segment_id);
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        // SAFETY: advice on an open file descriptor.
        unsafe {
            libc::posix_fadvise(
                std::os::unix::io::AsRawFd::as_raw_fd(&file),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        let mut probe = [0u8; 1];
        if read_if_cached(&file, &mut probe, reads[0].loc.offset).is_some() {
            // This file system keeps the pages (tmpfs): nothing to wait for here.
            eprintln!("pages not evicted; skipping the cold-read check");
            return;
        }
        let mut buf = vec![0u8; at];
        assert!(!s.read_mapped_records_into(&reads, &mut buf));
        assert!(!s.mapped_reads_enabled());
        // The usual path still reads them.
        assert_eq!(
            s.read(&reads[3].loc, &[7; 16], 3).unwrap(),
            vec![3u8; 64 * 1024]
        );
    }

    #[test]
    fn span_reads_verify_each_record() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 30);
        let mut locs = Vec::new();
        for i in 0..20u32 {
            let data = vec![i as u8; 100 + i as usize * 7];
            let (loc, t) = s.append([3; 16], i, &data).unwrap();
            s.sync_through(t).unwrap();
            locs.push((loc, data));
        }
        let first = locs[0].0;
        let last = locs[19].0;
        let end = last.offset + RECORD_HEADER_BYTES as u64 + u64::from(last.len);
        let read = |offset: u64, len: usize| {
            let mut bytes = vec![0u8; len];
            let n = s
                .read_span_into(first.segment_id, offset, &mut bytes)
                .unwrap();
            bytes.truncate(n);
            Span {
                segment_id: first.segment_id,
                offset,
                bytes,
            }
        };
        let span = read(first.offset, (end - first.offset) as usize);
        for (i, (loc, data)) in locs.iter().enumerate() {
            assert!(span.covers(loc));
            assert_eq!(span.record(loc, &[3; 16], i as u32).unwrap(), &data[..]);
        }
        // A borrowed span works the same.
        let borrowed = Span {
            segment_id: span.segment_id,
            offset: span.offset,
            bytes: &span.bytes[..],
        };
        assert!(borrowed.record(&locs[4].0, &[3; 16], 4).is_ok());
        // Wrong identity, and a record beyond the span, are refused.
        assert!(span.record(&locs[1].0, &[3; 16], 0).is_err());
        let short = read(first.offset, 50);
        assert!(short.record(&locs[0].0, &[3; 16], 0).is_err());
        // A flipped payload byte inside the span is caught.
        let mut bad = span;
        let at = (locs[5].0.offset - bad.offset) as usize + RECORD_HEADER_BYTES + 3;
        bad.bytes[at] ^= 0x40;
        assert!(matches!(
            bad.record(&locs[5].0, &[3; 16], 5),
            Err(ChunkStoreError::Corrupt { .. })
        ));
        assert!(bad.record(&locs[6].0, &[3; 16], 6).is_ok());
        // Reading past the end of the segment returns a short span.
        assert_eq!(read(end - 10, 4096).bytes.len(), 10);
    }

    #[test]
    fn append_sync_read_roundtrip_and_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 4096);
        let mut locs = Vec::new();
        for i in 0..50u32 {
            let data = vec![i as u8; 300 + i as usize];
            let (loc, t) = s.append([7; 16], i, &data).unwrap();
            s.sync_through(t).unwrap();
            locs.push((loc, data));
        }
        assert!(s.stats().segments > 3, "small segment size must rotate");
        for (i, (loc, data)) in locs.iter().enumerate() {
            assert_eq!(&s.read(loc, &[7; 16], i as u32).unwrap(), data);
        }
        // A wrong identity is refused.
        assert!(matches!(
            s.read(&locs[0].0, &[8; 16], 0),
            Err(ChunkStoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn flipped_byte_is_detected_and_restart_opens_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let (loc, _) = {
            let s = store(dir.path(), SEGMENT_BYTES_DEFAULT);
            let (loc, t) = s.append([1; 16], 0, b"hello world").unwrap();
            s.sync_through(t).unwrap();
            (loc, t)
        };
        let path = segment_path(dir.path(), loc.segment_id);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = (loc.offset as usize) + RECORD_HEADER_BYTES + 3;
        bytes[at] ^= 0x40;
        // Append a torn half record too.
        bytes.extend_from_slice(&[0x50, 0x4b, 0x52]);
        std::fs::write(&path, &bytes).unwrap();
        let s = store(dir.path(), SEGMENT_BYTES_DEFAULT);
        assert!(s.stats().active_segment_id > loc.segment_id);
        assert!(matches!(
            s.read(&loc, &[1; 16], 0),
            Err(ChunkStoreError::Corrupt { .. })
        ));
        let scan = scan_segment(&path).unwrap();
        assert_eq!(scan.records.len(), 0);
        assert!(scan.torn_tail_bytes > 0);
    }

    #[test]
    fn io_uring_reads_verify_like_pread() {
        let dir = tempfile::tempdir().unwrap();
        let s = match ChunkStore::open(
            dir.path(),
            ChunkStoreOptions {
                segment_bytes_max: SEGMENT_BYTES_DEFAULT,
                io_backend: IoBackend::Uring,
                ..Default::default()
            },
        ) {
            Ok(s) => s,
            Err(e) => {
                // Kernels or sandboxes without io_uring: the pread path is covered elsewhere.
                eprintln!("io_uring unavailable here: {e}");
                return;
            }
        };
        assert!(s.uses_uring());
        let mut locs = Vec::new();
        for i in 0..64u32 {
            let data: Vec<u8> = (0..(i as usize * 997 + 1))
                .map(|b| (b as u32 ^ i) as u8)
                .collect();
            let (loc, t) = s.append([3; 16], i, &data).unwrap();
            s.sync_through(t).unwrap();
            locs.push((loc, data));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, (loc, _)) in locs.iter().enumerate() {
            let tx = tx.clone();
            s.read_with(
                *loc,
                [3; 16],
                i as u32,
                Box::new(move |r| tx.send((i, r)).unwrap()),
            );
        }
        for _ in 0..locs.len() {
            let (i, r) = rx.recv().unwrap();
            assert_eq!(r.unwrap(), locs[i].1);
        }
        let tx2 = tx.clone();
        s.read_with(
            locs[5].0,
            [4; 16],
            5,
            Box::new(move |r| tx2.send((0, r)).unwrap()),
        );
        assert!(matches!(
            rx.recv().unwrap().1,
            Err(ChunkStoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn concurrent_appends_share_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(store(dir.path(), SEGMENT_BYTES_DEFAULT));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..100u32 {
                        let (loc, tk) = s.append([t as u8; 16], i, &[t as u8; 1000]).unwrap();
                        s.sync_through(tk).unwrap();
                        assert_eq!(
                            s.read(&loc, &[t as u8; 16], i).unwrap(),
                            vec![t as u8; 1000]
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let st = s.stats();
        assert!(st.syncs <= 800);
    }
}
