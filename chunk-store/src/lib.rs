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

mod record;
mod uring;

pub use record::{
    RECORD_HEADER_BYTES, RecordHeader, SEGMENT_HEADER_BYTES, SegmentHeader, decode_record_header,
};

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
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
}

impl Default for ChunkStoreOptions {
    fn default() -> Self {
        Self {
            segment_bytes_max: SEGMENT_BYTES_DEFAULT,
            io_backend: IoBackend::Auto,
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

struct ActiveSegment {
    id: u64,
    file: Arc<File>,
    path: PathBuf,
    /// End of the last record written (the next append goes here).
    offset: u64,
    /// Set when an fsync failed: the page cache of this file can no longer be trusted, so the
    /// next append starts a fresh segment.
    poisoned: bool,
    /// Every segment with a smaller id is fully durable (synced when it was rotated out). A
    /// segment abandoned after a failed fsync stays at or above this mark, so a writer still
    /// waiting on it is told its write failed instead of being acknowledged.
    durable_below: u64,
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
}

pub struct ChunkStore {
    dir: PathBuf,
    options: ChunkStoreOptions,
    active: Mutex<ActiveSegment>,
    /// Serialises `fdatasync` callers; holds the highest ticket known durable.
    durable: Mutex<WriteTicket>,
    readers: RwLock<HashMap<u64, Arc<File>>>,
    stats: Mutex<ChunkStoreStats>,
    uring: Option<uring::UringReader>,
    /// Segments removed by compaction whose open handles are kept a while (see
    /// [`ChunkStore::retire_segment`]), with the time their handle may be closed.
    retired: Mutex<Vec<(u64, std::time::Instant)>>,
    faults: Faults,
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("seg-{id:016x}.pkr"))
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

impl ChunkStore {
    /// Opens (creating if needed) the segment directory and starts a new active segment.
    pub fn open(dir: impl Into<PathBuf>, options: ChunkStoreOptions) -> Result<Self> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        let mut ids = Self::list_segments(&dir)?;
        ids.sort_unstable();
        let next_id = ids.last().map_or(1, |id| id + 1);
        if let Some(&last) = ids.last() {
            // Report the state of the segment that was active when the process stopped: a
            // crash may have left a torn tail there, which is never indexed and never read.
            match scan_segment(&segment_path(&dir, last)) {
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
        let active = Self::create_segment(&dir, next_id)?;
        let uring = match options.io_backend {
            IoBackend::Pread => None,
            wanted => match uring::UringReader::start(&active.file) {
                Ok(r) => {
                    tracing::info!("reads use io_uring");
                    Some(r)
                }
                Err(e) if wanted == IoBackend::Auto => {
                    tracing::info!(error = %e, "io_uring unavailable; reads use pread");
                    None
                }
                Err(e) => return Err(io_err(&active.path, e)),
            },
        };
        if uring.is_none() {
            tracing::info!("reads use pread");
        }
        let store = Self {
            uring,
            durable: Mutex::new(WriteTicket {
                segment_id: active.id,
                end_offset: active.offset,
            }),
            stats: Mutex::new(ChunkStoreStats {
                segments: ids.len() as u64 + 1,
                ..Default::default()
            }),
            active: Mutex::new(active),
            readers: RwLock::new(HashMap::new()),
            retired: Mutex::new(Vec::new()),
            faults: Faults::default(),
            dir,
            options,
        };
        Ok(store)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn list_segments(dir: &Path) -> Result<Vec<u64>> {
        let mut ids = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| io_err(dir, e))? {
            let entry = entry.map_err(|e| io_err(dir, e))?;
            if let Some(id) = entry.file_name().to_str().and_then(parse_segment_name) {
                ids.push(id);
            }
        }
        Ok(ids)
    }

    fn create_segment(dir: &Path, id: u64) -> Result<ActiveSegment> {
        let path = segment_path(dir, id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        let header = SegmentHeader {
            segment_id: id,
            created_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        file.write_all_at(&header.encode(), 0)
            .map_err(|e| io_err(&path, e))?;
        // The header and the directory entry are made durable now, so that a later
        // fdatasync of appended records never depends on metadata that was not synced.
        file.sync_all().map_err(|e| io_err(&path, e))?;
        sync_dir(dir)?;
        Ok(ActiveSegment {
            id,
            file: Arc::new(file),
            path,
            offset: SEGMENT_HEADER_BYTES as u64,
            poisoned: false,
            durable_below: id,
        })
    }

    /// Appends one record. The bytes are not durable until `sync_through` returns.
    pub fn append(
        &self,
        object_id: [u8; 16],
        chunk_index: u32,
        payload: &[u8],
    ) -> Result<(RecordLocation, WriteTicket)> {
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
        let record_bytes = RECORD_HEADER_BYTES as u64 + u64::from(len);

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
                let _ = active.file.write_all_at(&rec[..half], offset);
                return Err(io_err(&active.path, injected_error(Fault::Eio)));
            }
            f => return Err(io_err(&active.path, injected_error(f))),
        }
        if let Err(e) = write_all_vectored_at(&active.file, &header, payload, offset) {
            // A failed write may have left part of the record in the file; the offset is not
            // advanced past it, and the next record overwrites it.
            return Err(io_err(&active.path, e));
        }
        active.offset += record_bytes;
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
            active
                .file
                .sync_data()
                .map_err(|e| io_err(&active.path, e))?;
        }
        let mut next = Self::create_segment(&self.dir, active.id + 1)?;
        if active.poisoned {
            next.durable_below = active.durable_below;
        }
        *active = next;
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.segments += 1;
        Ok(())
    }

    /// Returns once the record behind `ticket` is durable. Concurrent callers share one
    /// `fdatasync`: whoever holds the `durable` lock syncs everything written so far, and the
    /// callers queued behind it usually find their ticket covered when they get the lock.
    pub fn sync_through(&self, ticket: WriteTicket) -> Result<()> {
        let mut durable = self.durable.lock().unwrap_or_else(|p| p.into_inner());
        if *durable >= ticket {
            return Ok(());
        }
        let (file, path, written) = {
            let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            if ticket.segment_id < active.durable_below {
                // Rotation synced the whole older segment before it switched.
                return Ok(());
            }
            if ticket.segment_id < active.id {
                return Err(ChunkStoreError::Io {
                    path: segment_path(&self.dir, ticket.segment_id),
                    source: std::io::Error::other(
                        "an fsync of this segment failed; the write is not durable",
                    ),
                });
            }
            (
                active.file.clone(),
                active.path.clone(),
                WriteTicket {
                    segment_id: active.id,
                    end_offset: active.offset,
                },
            )
        };
        let synced = match self.faults.hit(&self.faults.sync) {
            Fault::None => file.sync_data(),
            f => Err(injected_error(f)),
        };
        if let Err(e) = synced {
            // After a failed fsync the kernel may have dropped dirty pages: nothing in this
            // segment past the last durable point may be trusted, so appends move on.
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            if active.id == written.segment_id {
                active.poisoned = true;
            }
            return Err(io_err(&path, e));
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
        let mut out = Vec::new();
        for id in Self::list_segments(&self.dir)? {
            if id < active {
                let path = segment_path(&self.dir, id);
                let len = std::fs::metadata(&path)
                    .map_err(|e| io_err(&path, e))?
                    .len();
                out.push((id, len));
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Removes a sealed segment that nothing references any more (compaction moved its live
    /// records). The file is unlinked now (its space returns once the last handle closes), but
    /// this store keeps a handle open for `grace`, so a read that looked the old location up just
    /// before the index changed still succeeds. The active segment is never removed.
    pub fn retire_segment(&self, segment_id: u64, grace: std::time::Duration) -> Result<()> {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).id;
        if segment_id >= active {
            return Err(ChunkStoreError::Io {
                path: segment_path(&self.dir, segment_id),
                source: std::io::Error::other("the active segment cannot be retired"),
            });
        }
        // Opened (and cached) before the unlink, so in-flight readers keep working.
        self.reader(segment_id)?;
        let path = segment_path(&self.dir, segment_id);
        std::fs::remove_file(&path).map_err(|e| io_err(&path, e))?;
        sync_dir(&self.dir)?;
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

    fn reader(&self, segment_id: u64) -> Result<Arc<File>> {
        if let f @ (Fault::Eio | Fault::Enospc | Fault::Torn) = self.faults.hit(&self.faults.read) {
            return Err(io_err(
                &segment_path(&self.dir, segment_id),
                injected_error(f),
            ));
        }
        if let Some(f) = self
            .readers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&segment_id)
        {
            return Ok(f.clone());
        }
        let path = segment_path(&self.dir, segment_id);
        let file = match File::open(&path) {
            Ok(f) => Arc::new(f),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(ChunkStoreError::MissingSegment(segment_id));
            }
            Err(e) => return Err(io_err(&path, e)),
        };
        self.readers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(segment_id, file.clone());
        Ok(file)
    }

    /// Whether reads go through io_uring (`read_with` completes on the io_uring thread).
    pub fn uses_uring(&self) -> bool {
        self.uring.is_some()
    }

    /// Reads one whole record, checks its header against the expected identity and its
    /// payload against the stored crc32c, and returns the payload. Always a `pread` on the
    /// calling thread.
    pub fn read(
        &self,
        loc: &RecordLocation,
        object_id: &[u8; 16],
        chunk_index: u32,
    ) -> Result<Vec<u8>> {
        let file = self.reader(loc.segment_id)?;
        let mut buf = vec![0u8; RECORD_HEADER_BYTES + loc.len as usize];
        let path = segment_path(&self.dir, loc.segment_id);
        let read = file.read_exact_at(&mut buf, loc.offset);
        verify_record(loc, read.map(|()| buf), object_id, chunk_index, &path)
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
        let file = match self.reader(loc.segment_id) {
            Ok(f) => f,
            Err(e) => return Some(Err(e)),
        };
        let mut buf = vec![0u8; RECORD_HEADER_BYTES + loc.len as usize];
        let read = read_if_cached(&file, &mut buf, loc.offset)?;
        let path = segment_path(&self.dir, loc.segment_id);
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
    /// called before this returns.
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
        let file = match self.reader(loc.segment_id) {
            Ok(f) => f,
            Err(e) => return done(Err(e)),
        };
        let path = segment_path(&self.dir, loc.segment_id);
        let total = RECORD_HEADER_BYTES + loc.len as usize;
        uring.read(
            file,
            loc.offset,
            total,
            Box::new(move |r| done(verify_record(&loc, r, &object_id, chunk_index, &path))),
        );
    }

    /// Reads raw bytes of a segment from `offset` into `dst` with one positioned read (a
    /// page-cache hit without blocking when possible, else a `pread`) and returns how many
    /// were read: fewer than `dst.len()` only at the end of the segment. The batch read path
    /// merges neighbouring records into one such read and verifies each with [`Span::record`].
    /// Blocks the calling thread on a cache miss.
    pub fn read_span_into(&self, segment_id: u64, offset: u64, dst: &mut [u8]) -> Result<usize> {
        let file = self.reader(segment_id)?;
        let path = segment_path(&self.dir, segment_id);
        if let Some(r) = read_if_cached(&file, dst, offset) {
            r.map_err(|e| io_err(&path, e))?;
            return Ok(dst.len());
        }
        let mut filled = 0usize;
        while filled < dst.len() {
            match file.read_at(&mut dst[filled..], offset + filled as u64) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(io_err(&path, e)),
            }
        }
        Ok(filled)
    }

    /// Bytes of all segment files on disk.
    pub fn disk_bytes(&self) -> u64 {
        std::fs::read_dir(&self.dir)
            .map(|entries| {
                entries
                    .filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name()
                            .to_str()
                            .and_then(parse_segment_name)
                            .is_some()
                    })
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0)
    }

    pub fn stats(&self) -> ChunkStoreStats {
        let mut s = *self.stats.lock().unwrap_or_else(|p| p.into_inner());
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        s.active_segment_id = active.id;
        s.active_segment_bytes = active.offset;
        s
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

/// Read-only access to the segment files of a data directory, for offline tools (`packrat
/// admin verify`): unlike [`ChunkStore::open`] it creates nothing and never writes.
pub struct SegmentReader {
    dir: PathBuf,
    files: HashMap<u64, File>,
}

impl SegmentReader {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            files: HashMap::new(),
        }
    }

    /// The segment files present: (id, size in bytes), by id.
    pub fn segments(&self) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        let entries = std::fs::read_dir(&self.dir).map_err(|e| io_err(&self.dir, e))?;
        for e in entries {
            let e = e.map_err(|e| io_err(&self.dir, e))?;
            if let Some(id) = e.file_name().to_str().and_then(parse_segment_name) {
                let len = e.metadata().map_err(|err| io_err(&e.path(), err))?.len();
                out.push((id, len));
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// Reads and verifies one record exactly as [`ChunkStore::read`] does.
    pub fn read(
        &mut self,
        loc: &RecordLocation,
        object_id: &[u8; 16],
        chunk_index: u32,
    ) -> Result<Vec<u8>> {
        let path = segment_path(&self.dir, loc.segment_id);
        let file = match self.files.entry(loc.segment_id) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => match File::open(&path) {
                Ok(f) => v.insert(f),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(ChunkStoreError::MissingSegment(loc.segment_id));
                }
                Err(e) => return Err(io_err(&path, e)),
            },
        };
        let mut buf = vec![0u8; RECORD_HEADER_BYTES + loc.len as usize];
        let read = file.read_exact_at(&mut buf, loc.offset);
        verify_record(loc, read.map(|()| buf), object_id, chunk_index, &path)
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
            },
        )
        .unwrap()
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
