//! The storage engine of one node, and the write protocol in one place:
//!
//! 1. stream the payload into chunk-store records (at most [`CHUNK_BYTES`] each, so memory per
//!    request is bounded whatever the object size), hashing as it goes;
//! 2. verify every digest the client sent (Content-MD5, flexible checksum, payload SHA-256);
//!    on a mismatch nothing is indexed and the records are unreachable garbage;
//! 3. under the key's lock, check write conditions, then hand the record ticket and the index
//!    entry to the committer thread and wait. The committer takes every job queued so far,
//!    makes their records durable with one `fdatasync` and publishes their index entries in
//!    one synced RocksDB write batch (group commit: the batch grows with the load, since jobs
//!    queue while the previous batch syncs);
//! 4. only then acknowledge.
//!
//! A crash before the committer's batch write leaves unreferenced records; a crash after it
//! leaves complete, durable objects. Reads never see anything the committer did not publish.

use crate::error::{EngineError, EngineResult};
use crate::master_key::MasterKey;
use bytes::Bytes;
use md5::{Digest, Md5};
use packrat_chunk_store::{ChunkStore, WriteTicket};
use packrat_index::{
    BucketRecord, ChunkRef, KeyRecord, ObjectOp, ObjectRecord, PartRecord, RocksIndex, UploadRecord,
};
use packrat_store_api::checksum::{ChecksumAlgorithm, Hasher};
use packrat_store_api::{ByteSource, Clock, OnStaged};
use packrat_store_api::{Digest as DigestKind, StoreError, StoreResult};
use packrat_store_api::{Versioning, WriteCondition, etag_matches};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

mod committer;
mod records;

use committer::{Applied, AppliedOnDrop, CommitJob, run_committer};
pub use records::{ObjectReader, RecordWriter};

/// Size of the records a large object is cut into. Small enough that a ranged read of a large
/// object reads (and checksums) little more than it needs; large enough that a 5 GiB object
/// has a few thousand chunk entries.
pub const CHUNK_BYTES: usize = 1024 * 1024;

/// Number of key-lock stripes serialising check-and-commit of writes to the same key.
const KEY_LOCK_STRIPES: usize = 4096;

/// Records up to this size are appended on the calling (async) thread: a write of a few KiB
/// into the page cache is cheaper than a trip through the blocking pool.
const INLINE_WRITE_BYTES_MAX: usize = 64 * 1024;

/// Bound on the committer's queue (back-pressure for writers) and on one batch.
const COMMIT_QUEUE_JOBS_MAX: usize = 8192;
const COMMIT_BATCH_JOBS_MAX: usize = 1024;

/// Upper bounds of the commit-latency histogram buckets, in microseconds.
pub const COMMIT_LATENCY_BUCKETS_US: [u64; 10] =
    [50, 100, 250, 500, 1000, 2500, 5000, 10_000, 50_000, 250_000];

/// Group-commit figures for metrics: batches, jobs per batch, and the time each batch took to
/// become durable (fdatasync plus the synced index write).
#[derive(Default)]
pub struct CommitStats {
    pub batches: std::sync::atomic::AtomicU64,
    pub jobs: std::sync::atomic::AtomicU64,
    pub latency_us_sum: std::sync::atomic::AtomicU64,
    pub latency_buckets: [std::sync::atomic::AtomicU64; COMMIT_LATENCY_BUCKETS_US.len()],
}

/// Records up to this size are read on the calling (async) thread: a positioned read of a few
/// KiB from the page cache or NVMe costs less than a trip through the blocking pool. Larger
/// records go to the blocking pool so a slow disk cannot stall the runtime for long.
const INLINE_READ_BYTES_MAX: u32 = 64 * 1024;

pub struct Engine {
    /// Every date the store records or acts on (see `packrat_store_api::clock`).
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) index: Arc<RocksIndex>,
    pub(crate) chunks: Arc<ChunkStore>,
    /// Seals the secrets the index keeps (see `master_key`).
    pub(crate) master: Arc<MasterKey>,
    commit_tx: tokio::sync::mpsc::Sender<CommitJob>,
    /// The commit thread, joined when the engine is dropped: declared after `commit_tx`, so
    /// the queue is closed first and the thread ends once it has committed what was queued.
    /// The index then closes on the thread that drops the engine, not during process exit
    /// (where RocksDB's threads outliving the process's statics aborted it: `pthread lock:
    /// Invalid argument`).
    _committer: JoinOnDrop,
    pub(crate) commit_stats: Arc<CommitStats>,
    key_locks: Vec<tokio::sync::Mutex<()>>,
    /// Per key-lock stripe, the last commit job enqueued under that lock.
    stripe_tails: Vec<std::sync::Mutex<Option<Arc<Applied>>>>,
    /// Buckets and access keys are read on every request and change rarely; they are cached
    /// here and every change made through this process invalidates its entry. (Offline admin
    /// changes happen only while the server is stopped.)
    bucket_cache: RwLock<CacheMap<BucketRecord>>,
    key_cache: RwLock<CacheMap<KeyRecord>>,
    /// One compaction at a time (`compact.rs`).
    pub(crate) compaction: tokio::sync::Mutex<()>,
    /// Writes between their first append and their index commit: token -> the active segment
    /// when they started. Compaction never removes a segment at or above the smallest.
    inflight: Arc<std::sync::Mutex<(u64, std::collections::BTreeMap<u64, u64>)>>,
    /// Live and dead bytes as of the last compaction scan, for `admin status`.
    pub(crate) last_space: std::sync::Mutex<Option<crate::reports::Space>>,
    /// The erasure-coding scrub in progress, or the last one (`ec.rs`).
    pub(crate) scrub: crate::job::Job<packrat_chunk_store::ScrubReport>,
    /// The compaction started as an admin job, or the last one (`compact.rs`).
    pub(crate) compaction_job: crate::job::Job<crate::reports::CompactReport>,
    /// Storage tiers and the catalog of segments that live on them (`tier.rs`).
    pub(crate) tiers: Arc<crate::tiers::Tiers>,
    /// The last version sequence handed out (`versions.rs`).
    pub(crate) last_version_seq: std::sync::atomic::AtomicU64,
}

/// A thread that is waited for when this is dropped.
struct JoinOnDrop(Option<std::thread::JoinHandle<()>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take()
            && t.join().is_err()
        {
            tracing::error!("the commit thread panicked");
        }
    }
}

/// Keeps a write's segments safe from compaction until dropped (see [`Engine::pin_write`]).
pub struct WritePin {
    registry: Arc<std::sync::Mutex<(u64, std::collections::BTreeMap<u64, u64>)>>,
    token: u64,
}

impl Drop for WritePin {
    fn drop(&mut self) {
        let mut g = self.registry.lock().unwrap_or_else(|p| p.into_inner());
        g.1.remove(&self.token);
    }
}

/// Chunks of one object moved by compaction or a tier move: (chunk position, old location,
/// new location). `held` says which entry of the key holds them.
pub struct Relocation {
    pub bucket_id: u64,
    pub key: String,
    pub held: Held,
    pub moved: Vec<(usize, ChunkRef, ChunkRef)>,
}

/// Whether `chunks` still holds every old location of `moved` at its position (nothing
/// rewrote the entry since its chunks were read for a move).
fn moved_from(moved: &[(usize, ChunkRef, ChunkRef)], chunks: &[ChunkRef]) -> bool {
    moved.iter().all(|(i, old, _)| chunks.get(*i) == Some(old))
}

/// The index entry whose chunks a [`Relocation`] moves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Held {
    /// The key's current object.
    Current,
    /// A noncurrent version (kept in the key's history), by sequence.
    Version(u64),
    /// A part of an upload of the key still in progress.
    Part { upload_id: String, number: u32 },
}

impl Held {
    /// The current object, or the noncurrent version of sequence `seq`.
    pub fn object(version_seq: Option<u64>) -> Held {
        version_seq.map_or(Held::Current, Held::Version)
    }
}

/// A cache map with a generation count: a value read from the index is only inserted if no
/// invalidation happened since the read began, so a lookup racing a delete cannot re-insert
/// the deleted record.
#[derive(Default)]
struct CacheMap<V> {
    map: HashMap<String, V>,
    generation: u64,
}

fn cached<V: Clone>(
    cache: &RwLock<CacheMap<V>>,
    name: &str,
    load: impl FnOnce() -> EngineResult<Option<V>>,
) -> EngineResult<Option<V>> {
    let generation = {
        let c = cache.read().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = c.map.get(name) {
            return Ok(Some(v.clone()));
        }
        c.generation
    };
    let v = load()?;
    if let Some(v) = &v {
        let mut c = cache.write().unwrap_or_else(|p| p.into_inner());
        if c.generation == generation {
            c.map.insert(name.to_string(), v.clone());
        }
    }
    Ok(v)
}

fn invalidate<V>(cache: &RwLock<CacheMap<V>>, name: &str) {
    let mut c = cache.write().unwrap_or_else(|p| p.into_inner());
    c.map.remove(name);
    c.generation += 1;
}

/// How a write commits: only if `cond` holds, versioned as `versioning` says, as the version
/// sequence the caller chose (`given`) or else the next one.
#[derive(Clone, Copy)]
pub struct CommitAs<'a> {
    pub cond: &'a WriteCondition,
    pub versioning: Versioning,
    pub given: Option<u64>,
}

/// What a streamed write produced, before anything is indexed.
pub struct Written {
    /// Keeps the records' segments from compaction until the caller has indexed them (drop
    /// `Written` only after the commit).
    pub _pin: Option<WritePin>,
    pub record_id: [u8; 16],
    pub chunks: Vec<ChunkRef>,
    /// Proof of the last append, to be made durable before anything points at the records.
    pub ticket: Option<WriteTicket>,
    pub size: u64,
    pub md5: [u8; 16],
    /// Raw checksum bytes and, for CRCs, the integer value.
    pub checksum: Option<(ChecksumAlgorithm, Vec<u8>, Option<u64>)>,
}

pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> EngineResult<T> + Send + 'static,
) -> EngineResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| EngineError::internal("blocking task failed", e))?
}

impl Engine {
    pub fn new(
        index: RocksIndex,
        chunks: ChunkStore,
        tiers: crate::tiers::Tiers,
        clock: Arc<dyn Clock>,
        master: Arc<MasterKey>,
    ) -> Self {
        let index = Arc::new(index);
        let chunks = Arc::new(chunks);
        let (commit_tx, commit_rx) = tokio::sync::mpsc::channel(COMMIT_QUEUE_JOBS_MAX);
        let commit_stats = Arc::new(CommitStats::default());
        let committer = {
            let (index, chunks, stats) = (index.clone(), chunks.clone(), commit_stats.clone());
            std::thread::Builder::new()
                .name("packrat-commit".into())
                .spawn(move || run_committer(&index, &chunks, &stats, commit_rx))
                .expect("spawning the commit thread")
        };
        Self {
            clock,
            index,
            chunks,
            master,
            commit_tx,
            _committer: JoinOnDrop(Some(committer)),
            commit_stats,
            key_locks: (0..KEY_LOCK_STRIPES)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            stripe_tails: (0..KEY_LOCK_STRIPES)
                .map(|_| std::sync::Mutex::new(None))
                .collect(),
            bucket_cache: RwLock::new(CacheMap::default()),
            key_cache: RwLock::new(CacheMap::default()),
            compaction: tokio::sync::Mutex::new(()),
            inflight: Default::default(),
            last_space: std::sync::Mutex::new(None),
            scrub: Default::default(),
            compaction_job: Default::default(),
            tiers: Arc::new(tiers),
            last_version_seq: Default::default(),
        }
    }

    /// Registers a write that is about to append records; hold the pin until its index entry
    /// is committed (or the write failed). See [`inflight_floor`](Self::inflight_floor).
    pub fn pin_write(&self) -> WritePin {
        let active = self.chunks.active_segment_id();
        let mut g = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        g.0 += 1;
        let token = g.0;
        g.1.insert(token, active);
        WritePin {
            registry: self.inflight.clone(),
            token,
        }
    }

    /// The smallest segment an unfinished write may have appended to (`u64::MAX` if none).
    pub fn inflight_floor(&self) -> u64 {
        let g = self.inflight.lock().unwrap_or_else(|p| p.into_inner());
        g.1.values().copied().min().unwrap_or(u64::MAX)
    }

    /// A bucket by name, from the cache or the index.
    pub fn bucket(&self, name: &str) -> EngineResult<Option<BucketRecord>> {
        cached(&self.bucket_cache, name, || {
            Ok(self.index.get_bucket(name)?)
        })
    }

    /// Must be called after any change to a bucket's record (create, delete, ACL).
    pub fn forget_bucket(&self, name: &str) {
        invalidate(&self.bucket_cache, name);
    }

    /// An access key, from the cache or the index.
    pub fn access_key(&self, access_key: &str) -> EngineResult<Option<KeyRecord>> {
        cached(&self.key_cache, access_key, || {
            crate::keys::get(&self.index, &self.master, access_key)
        })
    }

    /// Must be called after an access key is created, replaced or deleted.
    pub fn forget_access_key(&self, access_key: &str) {
        invalidate(&self.key_cache, access_key);
    }

    fn key_stripe(&self, bucket_id: u64, key: &str) -> usize {
        use std::hash::{Hash, Hasher as _};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (bucket_id, key).hash(&mut h);
        (h.finish() as usize) % KEY_LOCK_STRIPES
    }

    /// Takes the locks of many keys at once, stripe by stripe in ascending order (so two
    /// multi-key writers never deadlock, and a single-key writer waits for at most one).
    async fn lock_keys<'k>(
        &self,
        keys: impl Iterator<Item = (u64, &'k str)>,
    ) -> (Vec<tokio::sync::MutexGuard<'_, ()>>, Vec<usize>) {
        let mut stripes: Vec<usize> = keys.map(|(b, k)| self.key_stripe(b, k)).collect();
        stripes.sort_unstable();
        stripes.dedup();
        let mut guards = Vec::with_capacity(stripes.len());
        for s in &stripes {
            guards.push(self.key_locks[*s].lock().await);
        }
        (guards, stripes)
    }

    /// Takes a key's lock for a writer that only enqueues ops (an unconditional PUT or
    /// DELETE): the lock orders its op among the key's writes and is released once the op is
    /// enqueued, not when it is durable, so writers of a key never wait for each other's
    /// fsync. Returns the guard and the lock stripe.
    async fn lock_for_enqueue(
        &self,
        bucket_id: u64,
        key: &str,
    ) -> (tokio::sync::MutexGuard<'_, ()>, usize) {
        let s = self.key_stripe(bucket_id, key);
        (self.key_locks[s].lock().await, s)
    }

    /// Takes a key's lock for a writer that reads the index (a conditional write, a
    /// read-modify-write) or writes it directly: after the lock, it waits until every op
    /// enqueued under this lock before it is applied, so what it reads is current.
    pub async fn lock_key(&self, bucket_id: u64, key: &str) -> tokio::sync::MutexGuard<'_, ()> {
        self.lock_key_current(bucket_id, key).await.0
    }

    /// [`Self::lock_key`], also returning the lock stripe (for a writer that then enqueues).
    pub(crate) async fn lock_key_current(
        &self,
        bucket_id: u64,
        key: &str,
    ) -> (tokio::sync::MutexGuard<'_, ()>, usize) {
        let (guard, s) = self.lock_for_enqueue(bucket_id, key).await;
        self.quiesce(&[s]).await;
        (guard, s)
    }

    /// Waits until the last commit job enqueued under each of these stripes' locks is applied
    /// (callers hold the locks, so no new one is enqueued meanwhile).
    async fn quiesce(&self, stripes: &[usize]) {
        for s in stripes {
            let tail = self.stripe_tails[*s]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone();
            if let Some(t) = tail {
                t.wait().await;
            }
        }
    }

    /// Enqueues ops for group commit; callers hold the locks of `stripes`, which record the
    /// job as their last (a job under no lock records nothing). Returns the channel that says
    /// when the ops are durable.
    async fn enqueue(
        &self,
        ticket: Option<WriteTicket>,
        ops: Vec<ObjectOp>,
        stripes: &[usize],
    ) -> EngineResult<tokio::sync::oneshot::Receiver<EngineResult<()>>> {
        let applied = (!stripes.is_empty()).then(|| Arc::new(Applied::default()));
        let (done, wait) = tokio::sync::oneshot::channel();
        self.commit_tx
            .send(CommitJob {
                ticket,
                ops,
                done,
                applied: applied.clone().map(AppliedOnDrop),
            })
            .await
            .map_err(|_| EngineError::internal("commit", "the commit thread has stopped"))?;
        if let Some(applied) = applied {
            for s in stripes {
                *self.stripe_tails[*s]
                    .lock()
                    .unwrap_or_else(|p| p.into_inner()) = Some(applied.clone());
            }
        }
        Ok(wait)
    }

    /// Commits ops under the key locks `guards` (of `stripes`): the job is enqueued while the
    /// locks are held, which fixes its order among the keys' writes, then the locks are released
    /// and the caller waits for durability without them.
    pub(crate) async fn commit_locked<G>(
        &self,
        guards: G,
        ticket: Option<WriteTicket>,
        ops: Vec<ObjectOp>,
        stripes: &[usize],
    ) -> EngineResult<()> {
        self.commit_locked_then(guards, ticket, ops, stripes, None)
            .await
    }

    /// [`Self::commit_locked`], telling `on_staged` once the job is enqueued (what is left is
    /// its durability).
    async fn commit_locked_then<G>(
        &self,
        guards: G,
        ticket: Option<WriteTicket>,
        ops: Vec<ObjectOp>,
        stripes: &[usize],
        on_staged: Option<&OnStaged>,
    ) -> EngineResult<()> {
        let wait = self.enqueue(ticket, ops, stripes).await?;
        drop(guards);
        if let Some(f) = on_staged {
            (f.0)();
        }
        wait.await
            .map_err(|_| EngineError::internal("commit", "the commit thread dropped a job"))?
    }

    /// Steps 1 to 3 of the write protocol: stream, hash, append, verify, make durable.
    /// `expected` lists the checksums the client sent up front; `trailer_alg` names a checksum
    /// the client will send as a trailer of an aws-chunked body; `content_md5` is the raw
    /// Content-MD5.
    pub async fn write_stream<S: ByteSource + ?Sized>(
        self: &Arc<Self>,
        src: &mut S,
        checksum_alg: Option<ChecksumAlgorithm>,
        expected_checksum: Option<Vec<u8>>,
        content_md5: Option<[u8; 16]>,
    ) -> EngineResult<Written> {
        let pin = self.pin_write();
        let record_id: [u8; 16] = rand::random();
        // A source that knows its bytes' MD5 is not hashed again (see `ByteSource::known_md5`).
        let known = src.known_md5();
        let mut md5 = Md5::new();
        let mut hasher = checksum_alg.map(Hasher::new);
        // One chunk buffer for the whole request, refilled after each append: a fresh 1 MiB
        // allocation per chunk costs page faults and page clearing on every chunk.
        let mut buf: Vec<u8> = Vec::new();
        let mut chunks = Vec::new();
        let mut size = 0u64;
        let mut last_ticket: Option<WriteTicket> = None;
        loop {
            let piece = src.next_piece().await?;
            let at_end = piece.is_none();
            let mut rest: &[u8] = piece.as_deref().unwrap_or(&[]);
            if known.is_none() {
                md5.update(rest);
            }
            if let Some(h) = hasher.as_mut() {
                h.update(rest);
            }
            size += rest.len() as u64;
            // Fill the buffer up to a chunk; append each full chunk, and at the end the
            // remainder (if any).
            loop {
                let take = (CHUNK_BYTES - buf.len()).min(rest.len());
                buf.extend_from_slice(&rest[..take]);
                rest = &rest[take..];
                let full = buf.len() == CHUNK_BYTES;
                if !(full || (at_end && rest.is_empty() && !buf.is_empty())) {
                    break;
                }
                let idx = chunks.len() as u32;
                let (loc, ticket) = if buf.len() <= INLINE_WRITE_BYTES_MAX {
                    self.chunks.append(record_id, idx, &buf)?
                } else {
                    let engine = self.clone();
                    let data = std::mem::take(&mut buf);
                    let (appended, data) = blocking(move || {
                        let r = engine.chunks.append(record_id, idx, &data);
                        Ok((r, data))
                    })
                    .await?;
                    buf = data;
                    appended?
                };
                buf.clear();
                last_ticket = Some(ticket);
                chunks.push(ChunkRef {
                    segment_id: loc.segment_id,
                    offset: loc.offset,
                    len: loc.len,
                });
                if rest.is_empty() {
                    break;
                }
            }
            if at_end {
                break;
            }
        }
        let md5: [u8; 16] = known.unwrap_or_else(|| md5.finalize().into());
        if let Some(want) = content_md5
            && want != md5
        {
            return Err(StoreError::BadDigest(DigestKind::ContentMd5).into());
        }
        // The ETag's MD5: an SSE-S3 object shows its plaintext's (checked by the source).
        let md5 = src.shown_md5().unwrap_or(md5);
        let checksum = match (checksum_alg, hasher) {
            (Some(alg), Some(h)) => {
                let (bytes, crc) = h.finish();
                let want = match &expected_checksum {
                    Some(w) => Some(w.clone()),
                    None => src.trailing_checksum(alg)?,
                };
                if let Some(w) = want
                    && w != bytes
                {
                    return Err(StoreError::BadDigest(DigestKind::Checksum(alg)).into());
                }
                Some((alg, bytes, crc))
            }
            _ => None,
        };
        Ok(Written {
            _pin: Some(pin),
            record_id,
            chunks,
            ticket: last_ticket,
            size,
            md5,
            checksum,
        })
    }

    /// Makes appended records durable (for writes whose index entry is not an object, such
    /// as multipart parts).
    pub async fn make_durable(&self, ticket: Option<WriteTicket>) -> EngineResult<()> {
        if ticket.is_none() {
            return Ok(());
        }
        // A job under no key lock: it orders nothing, it only waits for its batch's sync.
        self.commit_locked((), ticket, Vec::new(), &[]).await
    }

    /// Checks `If-None-Match: *` and `If-Match` against the key's current object. Callers hold
    /// the key's lock, with every op queued before under it applied, until their own op is
    /// queued; the commit thread applies the queue in order, so the answer still holds when
    /// their op is applied.
    pub fn check_write_condition(
        &self,
        bucket_id: u64,
        key: &str,
        cond: &WriteCondition,
    ) -> EngineResult<()> {
        if !cond.if_none_match_any && cond.if_match.is_none() {
            return Ok(());
        }
        let failed = || EngineError(StoreError::PreconditionFailed);
        let current = self.index.get_object(bucket_id, key)?;
        if cond.if_none_match_any && current.is_some() {
            return Err(failed());
        }
        match (&cond.if_match, current) {
            (Some(_), None) => Err(StoreError::NoSuchKey.into()),
            (Some(m), Some(c)) if !etag_matches(m, &c.etag) => Err(failed()),
            _ => Ok(()),
        }
    }

    /// Step 3: publish an object under its key, together with the durability of its records.
    /// In a versioned bucket, `rec` gets its version here, and the version it replaces is kept.
    pub async fn commit_object(
        self: &Arc<Self>,
        bucket_id: u64,
        key: &str,
        rec: &mut ObjectRecord,
        ticket: Option<WriteTicket>,
        how: CommitAs<'_>,
        on_staged: Option<&OnStaged>,
    ) -> EngineResult<()> {
        let CommitAs {
            cond,
            versioning,
            given,
        } = how;
        let (guard, stripe) = self.lock_for_enqueue(bucket_id, key).await;
        if versioning != Versioning::Unversioned {
            self.quiesce(&[stripe]).await;
            self.check_write_condition(bucket_id, key, cond)?;
            let ops = self.versioned_put_ops(bucket_id, key, versioning, given, rec)?;
            return self
                .commit_locked_then(guard, ticket, ops, &[stripe], on_staged)
                .await;
        }
        if cond.if_none_match_any || cond.if_match.is_some() {
            self.quiesce(&[stripe]).await;
            self.check_write_condition(bucket_id, key, cond)?;
        }
        let op = ObjectOp::Put {
            bucket_id,
            key: key.to_string(),
            record: Box::new(rec.clone()),
        };
        self.commit_locked_then(guard, ticket, vec![op], &[stripe], on_staged)
            .await
    }

    /// Changes an object's attributes (metadata, storage class, tags), never its bytes, under
    /// its key lock: `edit` gets the record as it is now, so a write that landed meanwhile is
    /// edited rather than undone, and chunk locations are never taken from an older read.
    /// Returns the record as written; NoSuchKey if the object is gone.
    pub async fn update_object(
        self: &Arc<Self>,
        bucket_id: u64,
        key: &str,
        cond: &WriteCondition,
        edit: impl FnOnce(&mut ObjectRecord),
    ) -> EngineResult<ObjectRecord> {
        let (guard, stripe) = self.lock_key_current(bucket_id, key).await;
        self.check_write_condition(bucket_id, key, cond)?;
        let mut rec = self
            .index
            .get_object(bucket_id, key)?
            .ok_or(EngineError(StoreError::NoSuchKey))?;
        edit(&mut rec);
        let op = ObjectOp::Put {
            bucket_id,
            key: key.to_string(),
            record: Box::new(rec.clone()),
        };
        self.commit_locked(guard, None, vec![op], &[stripe]).await?;
        Ok(rec)
    }

    /// Publishes many new objects at once, all or none, in one group-commit job (one synced
    /// index batch). `ticket` must cover every record they reference. No write conditions;
    /// each key's lock is taken, in a fixed order, for the duration of the commit. In a
    /// bucket with versioning (`mode`), each object is a new version of its key, the one it
    /// replaces kept as a PutObject keeps it, a key named twice getting two versions in the
    /// order given (`Suspended`: each replaces the key's null version, so the last stays).
    pub async fn commit_objects(
        self: &Arc<Self>,
        bucket_id: u64,
        mut objects: Vec<(String, ObjectRecord)>,
        ticket: Option<WriteTicket>,
        mode: Versioning,
    ) -> EngineResult<()> {
        let (guards, stripes) = self
            .lock_keys(objects.iter().map(|(k, _)| (bucket_id, k.as_str())))
            .await;
        if mode == Versioning::Unversioned {
            let ops = objects
                .into_iter()
                .map(|(key, rec)| ObjectOp::Put {
                    bucket_id,
                    key,
                    record: Box::new(rec),
                })
                .collect();
            return self.commit_locked(guards, ticket, ops, &stripes).await;
        }
        if mode == Versioning::Suspended {
            // The last object of each key, in the order they came.
            let mut seen = std::collections::HashSet::new();
            objects.reverse();
            objects.retain(|(k, _)| seen.insert(k.clone()));
            objects.reverse();
        }
        // The history ops read the index: the key's writes before this job are applied.
        self.quiesce(&stripes).await;
        let mut ops = Vec::with_capacity(objects.len() * 2);
        // Each key's newest object of the job so far, by key, and the keys in the order met.
        let mut newest: HashMap<String, ObjectRecord> = HashMap::new();
        let mut keys = Vec::new();
        for (key, mut rec) in objects {
            match newest.remove(&key) {
                None => {
                    let (history, _) =
                        self.placed_version_ops(bucket_id, &key, mode, None, &mut rec)?;
                    ops.extend(history);
                    keys.push(key.clone());
                }
                // Named again (enabled versioning): the earlier one is kept in the history.
                Some(prev) => ops.push(self.repeated_version_op(bucket_id, &key, prev, &mut rec)),
            }
            newest.insert(key, rec);
        }
        for key in keys {
            if let Some(rec) = newest.remove(&key) {
                ops.push(ObjectOp::Put {
                    bucket_id,
                    key,
                    record: Box::new(rec),
                });
            }
        }
        self.commit_locked(guards, ticket, ops, &stripes).await
    }

    /// Points objects at the new copies of their moved chunks, made durable by `ticket`: under
    /// each key's lock, an object is updated only if every moved chunk is still where it was
    /// (compare-and-set), so a write or delete that happened meanwhile always wins. Returns
    /// (objects updated, objects that had changed and were left alone).
    pub async fn commit_relocations(
        self: &Arc<Self>,
        relocations: Vec<Relocation>,
        ticket: Option<WriteTicket>,
    ) -> EngineResult<(u64, u64)> {
        let (parts, relocations): (Vec<_>, Vec<_>) = relocations
            .into_iter()
            .partition(|r| matches!(r.held, Held::Part { .. }));
        let (mut updated, mut changed) = (0u64, 0u64);
        if !parts.is_empty() {
            (updated, changed) = self.commit_part_relocations(parts, ticket).await?;
        }
        if relocations.is_empty() {
            return Ok((updated, changed));
        }
        let (guards, stripes) = self
            .lock_keys(relocations.iter().map(|r| (r.bucket_id, r.key.as_str())))
            .await;
        self.quiesce(&stripes).await;
        let mut ops = Vec::with_capacity(relocations.len());
        for r in relocations {
            let current = match r.held {
                Held::Version(seq) => self.index.get_version(r.bucket_id, &r.key, seq)?,
                _ => self.index.get_object(r.bucket_id, &r.key)?,
            };
            let Some(mut obj) = current else {
                changed += 1;
                continue;
            };
            if !moved_from(&r.moved, &obj.chunks) {
                changed += 1;
                continue;
            }
            for (i, _, new) in &r.moved {
                obj.chunks[*i] = *new;
            }
            updated += 1;
            let (bucket_id, key, record) = (r.bucket_id, r.key, Box::new(obj));
            ops.push(match r.held {
                Held::Version(_) => ObjectOp::PutVersion {
                    bucket_id,
                    key,
                    record,
                },
                _ => ObjectOp::Put {
                    bucket_id,
                    key,
                    record,
                },
            });
        }
        self.commit_locked(guards, ticket, ops, &stripes).await?;
        Ok((updated, changed))
    }

    /// The parts among [`Self::commit_relocations`]'s: once the copies are durable, each part
    /// still as it was when read (not uploaded again, its upload neither completed nor
    /// aborted: all three write the part's entry under the key's lock, held here) points at
    /// them, in one synced index write.
    async fn commit_part_relocations(
        self: &Arc<Self>,
        parts: Vec<Relocation>,
        ticket: Option<WriteTicket>,
    ) -> EngineResult<(u64, u64)> {
        self.make_durable(ticket).await?;
        let (_guards, _) = self
            .lock_keys(parts.iter().map(|r| (r.bucket_id, r.key.as_str())))
            .await;
        let mut changed = 0u64;
        let mut rewrite = Vec::with_capacity(parts.len());
        for r in parts {
            let Held::Part { upload_id, number } = r.held else {
                continue;
            };
            match self.index.get_part(&upload_id, number)? {
                Some(mut part) if moved_from(&r.moved, &part.chunks) => {
                    for (i, _, new) in &r.moved {
                        part.chunks[*i] = *new;
                    }
                    rewrite.push((upload_id, part));
                }
                _ => changed += 1,
            }
        }
        let engine = self.clone();
        let updated = rewrite.len() as u64;
        blocking(move || Ok(engine.index.replace_parts(&rewrite)?)).await?;
        Ok((updated, changed))
    }

    // ---- multipart uploads: their index writes, under the key's lock like every other write
    // to the key (so a part is never attached to an upload that Complete or Abort ended).

    /// An upload in progress, or `NoSuchUpload`.
    pub fn upload_record(
        &self,
        bucket_id: u64,
        key: &str,
        upload_id: &str,
    ) -> EngineResult<UploadRecord> {
        self.index
            .get_upload(bucket_id, key, upload_id)?
            .ok_or(EngineError(StoreError::NoSuchUpload))
    }

    /// Records a new upload.
    pub async fn create_upload(self: &Arc<Self>, rec: UploadRecord) -> EngineResult<()> {
        let engine = self.clone();
        blocking(move || Ok(engine.index.put_upload(&rec)?)).await
    }

    /// Publishes a part whose records `ticket` covers: they are made durable first, then the
    /// part entry is written under the key's lock, if the upload still exists then (it may
    /// have been completed or aborted while the part streamed in).
    pub async fn put_part(
        self: &Arc<Self>,
        bucket_id: u64,
        key: &str,
        upload_id: &str,
        part: PartRecord,
        ticket: Option<WriteTicket>,
    ) -> EngineResult<()> {
        self.make_durable(ticket).await?;
        let _g = self.lock_key(bucket_id, key).await;
        self.upload_record(bucket_id, key, upload_id)?;
        let engine = self.clone();
        let uid = upload_id.to_string();
        blocking(move || Ok(engine.index.put_part(&uid, &part)?)).await
    }

    /// Completes an upload under the key's lock: `assemble` makes the object from the upload
    /// and its stored parts, the write condition is checked, and the object replaces the
    /// upload in one synced index batch. Returns the object as written.
    pub async fn complete_upload(
        self: &Arc<Self>,
        bucket_id: u64,
        key: &str,
        upload_id: &str,
        how: CommitAs<'_>,
        assemble: impl FnOnce(&UploadRecord, &[PartRecord]) -> EngineResult<ObjectRecord>,
    ) -> EngineResult<ObjectRecord> {
        let CommitAs {
            cond,
            versioning,
            given,
        } = how;
        let _g = self.lock_key(bucket_id, key).await;
        let upload = self.upload_record(bucket_id, key, upload_id)?;
        let stored = self.index.list_parts(&upload.upload_id, 0, usize::MAX)?;
        let mut rec = assemble(&upload, &stored)?;
        self.check_write_condition(bucket_id, key, cond)?;
        let (mut history, current) = match versioning {
            Versioning::Unversioned => (Vec::new(), true),
            // The new object's own Put is written by `complete_upload` below.
            v => self.placed_version_ops(bucket_id, key, v, given, &mut rec)?,
        };
        if !current {
            // A version below the key's newest: kept in its history.
            history.push(ObjectOp::PutVersion {
                bucket_id,
                key: key.to_string(),
                record: Box::new(rec.clone()),
            });
        }
        let engine = self.clone();
        let written = rec.clone();
        blocking(move || {
            let object = current.then_some(&written);
            Ok(engine.index.complete_upload(&upload, object, &history)?)
        })
        .await?;
        Ok(rec)
    }

    /// Ends an upload and drops its parts (their records become dead bytes).
    pub async fn abort_upload(
        self: &Arc<Self>,
        bucket_id: u64,
        key: &str,
        upload_id: &str,
    ) -> EngineResult<()> {
        let _g = self.lock_key(bucket_id, key).await;
        let upload = self.upload_record(bucket_id, key, upload_id)?;
        let engine = self.clone();
        blocking(move || Ok(engine.index.abort_upload(&upload)?)).await
    }

    /// Deletes an object only if it is still the version `record_id` (the lifecycle worker's
    /// expirations never remove a newer write). Returns whether it was deleted.
    pub async fn delete_if_unchanged(
        self: &Arc<Self>,
        bucket_id: u64,
        key: &str,
        record_id: [u8; 16],
    ) -> EngineResult<bool> {
        let (guard, stripe) = self.lock_key_current(bucket_id, key).await;
        match self.index.get_object(bucket_id, key)? {
            Some(o) if o.record_id == record_id => {}
            _ => return Ok(false),
        }
        let op = ObjectOp::Delete {
            bucket_id,
            key: key.to_string(),
        };
        self.commit_locked(guard, None, vec![op], &[stripe]).await?;
        Ok(true)
    }

    /// Sets an object's storage class if it is still the version `record_id` (lifecycle
    /// transitions). Its bytes move on the tier worker's next pass.
    pub async fn set_storage_class_if_unchanged(
        self: &Arc<Self>,
        bucket_id: u64,
        key: &str,
        record_id: [u8; 16],
        class: &str,
    ) -> EngineResult<bool> {
        let (guard, stripe) = self.lock_key_current(bucket_id, key).await;
        let Some(mut obj) = self.index.get_object(bucket_id, key)? else {
            return Ok(false);
        };
        if obj.record_id != record_id {
            return Ok(false);
        }
        obj.storage_class = (class != "STANDARD").then(|| class.to_string());
        let op = ObjectOp::Put {
            bucket_id,
            key: key.to_string(),
            record: Box::new(obj),
        };
        self.commit_locked(guard, None, vec![op], &[stripe]).await?;
        Ok(true)
    }

    /// Raw bytes of a segment for the batch reader, local or on a tier (blocking; call from a
    /// blocking thread).
    pub fn read_span_into(
        &self,
        segment_id: u64,
        offset: u64,
        dst: &mut [u8],
    ) -> EngineResult<usize> {
        if crate::tiers::is_tier_segment(segment_id) {
            return self.tiers.read_range_blocking(segment_id, offset, dst);
        }
        Ok(self.chunks.read_span_into(segment_id, offset, dst)?)
    }

    pub async fn delete_object(self: &Arc<Self>, bucket_id: u64, key: &str) -> EngineResult<()> {
        let (guard, stripe) = self.lock_for_enqueue(bucket_id, key).await;
        let op = ObjectOp::Delete {
            bucket_id,
            key: key.to_string(),
        };
        self.commit_locked(guard, None, vec![op], &[stripe]).await
    }

    /// Reads and verifies chunk `i` of an object.
    // `#[inline]` here and on `ObjectReader::{new, next}` lets the S3 layer (another crate)
    // inline the GET path's futures: without it, the 4 KiB GET lost 7.7% of its throughput
    // (+2 µs of CPU per request, mostly memmoves of future states) when the engine moved out
    // of the gateway crate (bench/ab.sh, docs/benchmark-log.md).
    #[inline]
    pub async fn read_chunk(self: &Arc<Self>, obj: &ObjectRecord, i: usize) -> EngineResult<Bytes> {
        let c = *obj
            .chunks
            .get(i)
            .ok_or_else(|| EngineError::internal("chunk index out of range", i))?;
        let (rid, idx) = obj.chunk_identity(i);
        let loc = packrat_chunk_store::RecordLocation {
            segment_id: c.segment_id,
            offset: c.offset,
            len: c.len,
        };
        if crate::tiers::is_tier_segment(c.segment_id) {
            return self.tiers.read_record(loc, rid, idx).await;
        }
        if self.chunks.uses_uring() {
            let fast = self.read_chunk_fast(loc, rid, idx).await;
            if fast.is_err() && self.chunks.has_redundancy() {
                // The fast path reads one place only; the full read falls back on the other
                // copies or rebuilds from the other shards (blocking, so off the runtime).
                let engine = self.clone();
                return blocking(move || Ok(Bytes::from(engine.chunks.read(&loc, &rid, idx)?)))
                    .await;
            }
            return fast;
        }
        if c.len <= INLINE_READ_BYTES_MAX && !self.chunks.has_redundancy() {
            return Ok(Bytes::from(self.chunks.read(&loc, &rid, idx)?));
        }
        let engine = self.clone();
        blocking(move || Ok(Bytes::from(engine.chunks.read(&loc, &rid, idx)?))).await
    }

    /// The io_uring path of [`read_chunk`](Self::read_chunk): a page-cache hit on this
    /// thread, else one read through the ring.
    #[inline]
    async fn read_chunk_fast(
        &self,
        loc: packrat_chunk_store::RecordLocation,
        rid: [u8; 16],
        idx: u32,
    ) -> EngineResult<Bytes> {
        {
            if let Some(r) = self.chunks.read_cached(&loc, &rid, idx) {
                return Ok(Bytes::from(r?));
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.chunks.read_with(
                loc,
                rid,
                idx,
                Box::new(move |r| {
                    let _ = tx.send(r);
                }),
            );
            let data = rx.await.map_err(|_| {
                EngineError::internal("read", "the io_uring thread dropped a read")
            })??;
            Ok(Bytes::from(data))
        }
    }
}
