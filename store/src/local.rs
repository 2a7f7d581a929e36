//! [`LocalStore`]: one node's engine behind the [`ObjectStore`] trait, the store `packrat
//! serve` runs. It converts between the index's records and the trait's types and runs
//! blocking index work off the async threads; the write protocol itself stays in
//! [`crate::engine`].

use crate::engine::{CommitAs, Engine, ObjectReader, Written, blocking};
use crate::error::{EngineError, EngineResult};
use crate::master_key::MasterKey;
use crate::multipart::{self, UPLOAD_TAGGING_HEADER, tags_to_header};
use crate::versions::{VersionId, bucket_lock_of, lock_config_of, versioning_code, versioning_of};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::Bytes;
use packrat_chunk_store::{
    ChunkStore, ChunkStoreOptions, FaultyIo, IoBackend, IoOp, RealIo, SegmentIo,
};
use packrat_index::{
    BucketRecord, ChunkRef, KeyRecord, ObjectRecord, PartRecord, StoredChecksum, UploadRecord,
};
use packrat_index::{IndexWrite, RocksIndex, VersionCursor, WriteGate};
use packrat_store_api::admin::{AccessKey, JobKind, JobStart, Metric, NewKey, Report};
use packrat_store_api::batch::{BatchItem, BatchOrder, BatchPlan, BatchWriter, EntrySink};
use packrat_store_api::checksum::ChecksumAlgorithm;
use packrat_store_api::lifecycle::Rule;
use packrat_store_api::lock::{LockChange, LockCheck, LockConfig, ObjectLock};
use packrat_store_api::stream::KeyList;
use packrat_store_api::{
    AttrEdit, Bucket, BucketConfig, ByteSource, CompleteAs, CompletePart, Identity, ListQuery,
    NewBucket, NewUpload, ObjectAttrs, ObjectChecksum, ObjectInfo, ObjectPage, ObjectRead,
    ObjectStore, ObjectVersion, Part, PutObject, PutPart, StoreError, StoreResult, Upload,
    UploadPage, UploadQuery, VersionAs, WriteCondition,
};
use packrat_store_api::{Clock, Credentials, ReplicaStore, StoreAdmin};
use packrat_store_api::{Deleted, FoundVersion, VersionPage, VersionQuery, Versioning};
use packrat_tiering::TierSpec;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

mod admin;
mod convert;
mod credentials;
mod kms;
mod replica;

use crate::summary::{summary_of, version_summary};
use convert::*;

pub struct LocalStore {
    engine: Arc<Engine>,
    /// The fault rules under the store, with `fault_injection` (tests only).
    faults: Option<Arc<FaultyIo>>,
    /// Web console sessions: in memory, one process serves them all (a restart ends them).
    sessions: packrat_store_api::sessions::MemorySessions,
    /// SSE-KMS keys, opened (see `local/kms.rs`), and one maker of keys at a time.
    kms: packrat_secrets::kms::KeyRing,
    kms_maker: tokio::sync::Mutex<()>,
}

/// How `packrat serve` opens its store.
pub struct LocalOptions {
    pub data_dir: PathBuf,
    /// Root credentials to hold (created, or updated to this secret); `None` keeps a stored
    /// root key, or generates one.
    pub root: Option<(String, String)>,
    /// Segment directories, one per disk (none: under `data_dir`).
    pub disks: Vec<PathBuf>,
    /// Erasure coding `(K, M)` across `disks`.
    pub ec: Option<(usize, usize)>,
    pub segment_bytes_max: u64,
    pub io_backend: IoBackend,
    pub tiers: Vec<TierSpec>,
    pub tier_cache_bytes: u64,
    pub tier_segment_bytes: u64,
    /// Bytes per second a tier move may read and write (0: unthrottled).
    pub tier_rate: u64,
    /// Background compaction every interval (zero: never), of segments below the threshold.
    pub compact_interval: Duration,
    pub compact_threshold: f64,
    pub compact_grace: Duration,
    /// Background tier runs every interval (zero: never).
    pub tier_interval: Duration,
    /// Erasure-coding upkeep: seal segments idle this long, scrub every interval at the rate,
    /// probe disks every interval.
    pub seal_idle: Duration,
    pub scrub_interval: Duration,
    pub scrub_rate: u64,
    pub disk_probe_interval: Duration,
    /// Erasure coding's background upkeep, every second: sealing idle segments, repairing
    /// what reads found damaged, the probes and scrubs above. Off (tests), sealing and repair
    /// happen only in a scrub job.
    pub ec_upkeep: bool,
    /// Tests only: every file operation (and index write, and tier transfer) goes through
    /// fault rules that the admin API sets (`packrat serve --fault-injection`).
    pub fault_injection: bool,
    /// Tests only: the file-I/O backend under the store instead of the file system itself
    /// (a power-loss simulation, `packrat_chunk_store::PowerLossIo`). Not with
    /// `fault_injection`, which brings its own.
    pub io: Option<Arc<dyn SegmentIo>>,
    /// Where the store reads the date (the system clock; a manual one in tests).
    pub clock: Arc<dyn Clock>,
}

impl LocalOptions {
    /// A store in `data_dir` on one disk, with no tiers and no background work, dated by the
    /// system clock: what tests start from (`LocalOptions { field: ..., ..LocalOptions::new(dir) }`).
    pub fn new(data_dir: PathBuf) -> Self {
        Self {
            data_dir,
            root: None,
            disks: Vec::new(),
            ec: None,
            segment_bytes_max: 4 * 1024 * 1024,
            io_backend: IoBackend::Auto,
            tiers: Vec::new(),
            tier_cache_bytes: 1 << 20,
            tier_segment_bytes: 1 << 20,
            tier_rate: 0,
            compact_interval: Duration::ZERO,
            compact_threshold: 0.5,
            compact_grace: Duration::ZERO,
            tier_interval: Duration::ZERO,
            seal_idle: Duration::ZERO,
            scrub_interval: Duration::ZERO,
            scrub_rate: 0,
            disk_probe_interval: Duration::ZERO,
            ec_upkeep: false,
            fault_injection: false,
            io: None,
            clock: Arc::new(packrat_store_api::SystemClock),
        }
    }
}

/// A store just opened, with the root key it generated (to show once), if it did.
pub struct Opened {
    pub store: LocalStore,
    pub generated_root: Option<AccessKey>,
}

impl LocalStore {
    fn new(engine: Arc<Engine>, faults: Option<Arc<FaultyIo>>) -> Self {
        Self {
            kms: kms::ring(&engine.index, &engine.master),
            kms_maker: Default::default(),
            engine,
            faults,
            sessions: Default::default(),
        }
    }

    /// Opens (or creates) a data directory: the index, the segments, the tiers; makes sure a
    /// root key exists; starts the background work (compaction, tier runs, erasure-coding
    /// upkeep). Call inside a Tokio runtime.
    pub fn open(o: LocalOptions) -> Result<Opened, String> {
        std::fs::create_dir_all(&o.data_dir)
            .map_err(|e| format!("cannot create {}: {e}", o.data_dir.display()))?;
        make_private(&o.data_dir)?;
        let index = RocksIndex::open(&o.data_dir.join("index")).map_err(|e| {
            format!(
                "cannot open the index in {}: {e} (is another packrat using it?)",
                o.data_dir.display()
            )
        })?;
        let key_file = o.data_dir.join(crate::master_key::MASTER_KEY_FILE);
        if !key_file.exists()
            && (index
                .list_keys()
                .map_err(|e| e.to_string())?
                .iter()
                .any(|k| !k.sealed_secret.is_empty())
                || !index
                    .scan_meta(b"kms/")
                    .map_err(|e| e.to_string())?
                    .is_empty())
        {
            // A new master key would leave every sealed secret unreadable.
            return Err(format!(
                "{} is missing, and the index holds secrets sealed with it: restore it from a backup of this data directory",
                key_file.display()
            ));
        }
        let master = Arc::new(MasterKey::load_or_create(&o.data_dir)?);
        let sealed = crate::keys::seal_plaintext_keys(&index, &master)
            .map_err(|e| format!("sealing access keys: {e}"))?;
        if sealed > 0 {
            tracing::info!(keys = sealed, "sealed access keys stored in plaintext");
        }
        let generated_root = ensure_root_key(&index, &master, o.root, &*o.clock)?;
        let faults = o.fault_injection.then(|| Arc::new(FaultyIo::default()));
        let io: Arc<dyn SegmentIo> = match (&faults, o.io) {
            (Some(_), Some(_)) => {
                return Err("fault injection brings its own file-I/O backend".into());
            }
            (Some(f), None) => f.clone(),
            (None, Some(io)) => io,
            (None, None) => Arc::new(RealIo),
        };
        index.set_gate(Arc::new(IndexGate {
            io: io.clone(),
            path: o.data_dir.join("index"),
        }));
        let segments_dir = match (o.disks.as_slice(), o.ec) {
            ([], Some(_)) => return Err("--ec needs --disk directories (at least K+M)".into()),
            ([], None) => o.data_dir.join("segments"),
            ([one], None) => one.join("segments"),
            (_, None) => {
                return Err(
                    "several --disk directories need --ec K+M (for example --ec 4+2)".into(),
                );
            }
            (_, Some(_)) => o.data_dir.join("segments"),
        };
        let chunks = ChunkStore::open(
            segments_dir,
            ChunkStoreOptions {
                disks: o.disks.clone(),
                ec: o.ec,
                segment_bytes_max: o.segment_bytes_max,
                io_backend: o.io_backend,
                io: io.clone(),
            },
        )
        .map_err(|e| e.to_string())?;
        // Disks outside the data directory: their packrat folders are private too (the disk's
        // own folder is the operator's).
        for disk in &o.disks {
            for sub in ["segments", "shards"] {
                let dir = disk.join(sub);
                if dir.is_dir() {
                    make_private(&dir)?;
                }
            }
        }
        let tiers = crate::tiers::Tiers::open(
            crate::tiers::TierOptions {
                specs: o.tiers,
                cache_bytes: o.tier_cache_bytes,
                segment_bytes: o.tier_segment_bytes,
                rate: o.tier_rate,
                io,
            },
            &o.data_dir,
            &index,
        )?;
        let engine = Arc::new(Engine::new(index, chunks, tiers, o.clock, master));
        if !o.compact_interval.is_zero() {
            crate::compact::spawn_background(
                engine.clone(),
                o.compact_interval,
                o.compact_threshold,
                o.compact_grace,
            );
        }
        if !o.tier_interval.is_zero() {
            crate::tier::spawn_background(engine.clone(), o.tier_interval);
        }
        if let Some((k, m)) = o.ec {
            tracing::info!(k, m, disks = o.disks.len(), "erasure coding on");
        }
        if o.ec.is_some() && o.ec_upkeep {
            crate::ec::spawn_background(
                engine.clone(),
                o.seal_idle,
                o.scrub_interval,
                o.scrub_rate,
                o.disk_probe_interval,
            );
        }
        Ok(Opened {
            store: LocalStore::new(engine, faults),
            generated_root: generated_root.map(crate::keys::access_key_of),
        })
    }

    /// Runs blocking engine work on the blocking pool and answers in the trait's error type.
    async fn run<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Engine) -> EngineResult<T> + Send + 'static,
    ) -> StoreResult<T> {
        let engine = self.engine.clone();
        Ok(blocking(move || f(&engine)).await?)
    }

    /// Changes a bucket's record as it is in the index (not as the caller's copy has it), so
    /// two edits of different settings never undo each other; `edit` may refuse.
    async fn edit_bucket(
        &self,
        bucket: &Bucket,
        edit: impl FnOnce(&mut BucketRecord) -> Result<(), StoreError> + Send + 'static,
    ) -> StoreResult<()> {
        let name = bucket.name.clone();
        let edited = self
            .run(move |e| Ok(e.index.edit_bucket(&name, edit)?))
            .await;
        self.engine.forget_bucket(&bucket.name);
        edited?.map(drop)
    }
}

/// The index's write gate: index writes and deletes ask the store's file operations first,
/// so fault rules (and simulations) reach them like any other I/O.
struct IndexGate {
    io: Arc<dyn SegmentIo>,
    path: PathBuf,
}

impl WriteGate for IndexGate {
    fn check(&self, write: IndexWrite) -> Result<(), String> {
        let op = match write {
            IndexWrite::Put => IoOp::IndexWrite,
            IndexWrite::Delete => IoOp::IndexDelete,
        };
        self.io.before(op, &self.path).map_err(|e| e.to_string())
    }
}

/// Mode 0700 on a directory packrat owns: other users of the machine read nothing of the
/// store (files are created 0600 as well: the binary sets its umask to 077).
pub fn make_private(dir: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("cannot make {} private (mode 0700): {e}", dir.display()))
}

/// Makes sure a root key exists: `root` (created, or given that secret), or a stored one, or
/// a new one, which is answered so it can be shown once.
fn ensure_root_key(
    index: &RocksIndex,
    master: &MasterKey,
    root: Option<(String, String)>,
    clock: &dyn Clock,
) -> Result<Option<KeyRecord>, String> {
    match root {
        Some((ak, sk)) => match crate::keys::get(index, master, &ak).map_err(|e| e.to_string())? {
            Some(k) if k.is_root && k.secret_key == sk => Ok(None),
            Some(mut k) => {
                k.secret_key = sk;
                k.is_root = true;
                crate::keys::put(index, master, &k).map_err(|e| e.to_string())?;
                Ok(None)
            }
            None => {
                let new = NewKey {
                    name: "root".into(),
                    access_key: Some(ak),
                    secret_key: Some(sk),
                    user_id: None,
                };
                crate::keys::create_key(index, master, new, true, clock)
                    .map_err(crate::keys::refusal)?;
                Ok(None)
            }
        },
        None => {
            let keys = index.list_keys().map_err(|e| e.to_string())?;
            // Only whether a root key exists: no secret is opened.
            if keys.iter().any(|k| k.is_root) {
                return Ok(None);
            }
            let new = NewKey {
                name: "root".into(),
                ..Default::default()
            };
            let k = crate::keys::create_key(index, master, new, true, clock)
                .map_err(crate::keys::refusal)?;
            Ok(Some(k))
        }
    }
}

/// Where a bucket's configuration document lives in the `meta` column family:
/// `bucketcfg/<name>/` and the bucket id, 8 bytes big-endian.
fn bucket_config_key(kind: BucketConfig, bucket_id: u64) -> Vec<u8> {
    let mut k = format!("bucketcfg/{}/", kind.name()).into_bytes();
    k.extend_from_slice(&bucket_id.to_be_bytes());
    k
}

impl LocalStore {
    fn existing_upload(&self, bucket: &Bucket, key: &str, upload_id: &str) -> StoreResult<Upload> {
        Ok(upload_of(
            &self.engine.upload_record(bucket.id, key, upload_id)?,
        ))
    }

    /// Makes a streamed part durable and records it (see `Engine::put_part`).
    async fn publish_part(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        w: Written,
    ) -> StoreResult<Part> {
        let part = PartRecord {
            part_number,
            record_id: w.record_id,
            etag: hex::encode(w.md5),
            size: w.size,
            last_modified_ms: self.engine.clock.now_ms(),
            chunks: w.chunks.clone(),
            checksum: w.checksum.as_ref().map(|(alg, bytes, _)| StoredChecksum {
                algorithm: alg.name().to_string(),
                value: B64.encode(bytes),
                kind: "FULL_OBJECT".to_string(),
            }),
            crc: w.checksum.as_ref().and_then(|c| c.2),
        };
        let shown = part_of(&part);
        self.engine
            .put_part(bucket.id, key, upload_id, part, w.ticket)
            .await?;
        // `w` (and its pin against compaction) lives until the part entry is written.
        drop(w);
        Ok(shown)
    }

    /// Appends `body`, then commits it under `key` if `condition` holds (steps 1 to 4 of the
    /// write protocol, `crate::engine`).
    async fn write_object(
        &self,
        bucket: &Bucket,
        key: &str,
        body: &mut dyn ByteSource,
        put: PutObject,
    ) -> StoreResult<ObjectInfo> {
        let w = self
            .engine
            .write_stream(body, put.checksum, put.expected_checksum, put.content_md5)
            .await?;
        let mut rec = new_record(&w, put.attrs);
        let (mode, given, shown) = write_versioning(bucket, put.version_as);
        self.engine
            .commit_object(
                bucket.id,
                key,
                &mut rec,
                w.ticket,
                CommitAs {
                    cond: &put.condition,
                    versioning: mode,
                    given,
                },
                put.on_staged.as_ref(),
            )
            .await?;
        Ok(info_of(Arc::new(rec), shown))
    }
}

#[async_trait::async_trait]
impl ObjectStore for LocalStore {
    fn bucket(&self, name: &str) -> StoreResult<Option<Bucket>> {
        Ok(self.engine.bucket(name)?.map(bucket_of))
    }

    async fn list_buckets(&self) -> StoreResult<Vec<Bucket>> {
        self.run(|e| Ok(e.index.list_buckets()?))
            .await
            .map(|v| v.into_iter().map(bucket_of).collect())
    }

    async fn create_bucket(&self, new: NewBucket) -> StoreResult<Bucket> {
        let name = new.name.clone();
        let created = self
            .run(move |e| {
                Ok(e.index
                    .create_bucket(&new.name.clone(), |id| BucketRecord {
                        id,
                        name: new.name,
                        owner_id: new.owner_id,
                        owner_name: new.owner_name,
                        created_ms: new.created_ms,
                        public_read: new.public_read,
                        // Object Lock comes with versioning enabled, for good.
                        versioning: u8::from(new.object_lock),
                        object_lock: new.object_lock.then(Default::default),
                    })?)
            })
            .await;
        self.engine.forget_bucket(&name);
        created.map(bucket_of)
    }

    async fn delete_bucket(&self, bucket: &Bucket) -> StoreResult<()> {
        let id = bucket.id;
        if self
            .run(move |e| Ok(e.index.bucket_holds_objects(id)?))
            .await?
        {
            return Err(StoreError::BucketNotEmpty);
        }
        packrat_store_api::abort_uploads(self, bucket).await?;
        let name = bucket.name.clone();
        let deleted = self
            .run(move |e| {
                e.index.delete_bucket(&name)?;
                // Bucket ids are never reused; its configurations go with it.
                for kind in BucketConfig::ALL {
                    e.index.delete_meta(&bucket_config_key(kind, id))?;
                }
                crate::tiers::delete_lifecycle(&e.index, id)
            })
            .await;
        self.engine.forget_bucket(&bucket.name);
        deleted
    }

    async fn set_versioning(&self, bucket: &Bucket, state: Versioning) -> StoreResult<()> {
        if state == Versioning::Unversioned {
            return Err(StoreError::Invalid(
                "a bucket's versioning can be Enabled or Suspended, never turned off".into(),
            ));
        }
        let code = versioning_code(state);
        self.edit_bucket(bucket, move |r| {
            if state == Versioning::Suspended && r.object_lock.is_some() {
                return Err(StoreError::InvalidBucketState(
                    "An Object Lock configuration is present on this bucket, so the versioning state cannot be changed.".into(),
                ));
            }
            r.versioning = code;
            Ok(())
        })
        .await
    }

    async fn set_lock_config(&self, bucket: &Bucket, config: LockConfig) -> StoreResult<()> {
        let lock = bucket_lock_of(&config);
        self.edit_bucket(bucket, move |r| {
            if r.versioning != versioning_code(Versioning::Enabled) {
                return Err(StoreError::InvalidBucketState(
                    "Versioning must be 'Enabled' on the bucket to apply a Object Lock configuration".into(),
                ));
            }
            r.object_lock = Some(lock);
            Ok(())
        })
        .await
    }

    async fn set_bucket_public(&self, bucket: &Bucket, public: bool) -> StoreResult<()> {
        self.edit_bucket(bucket, move |r| {
            r.public_read = public;
            Ok(())
        })
        .await
    }

    async fn put_lifecycle(&self, bucket: &Bucket, rules: Vec<Rule>) -> StoreResult<()> {
        let id = bucket.id;
        self.run(move |e| crate::tiers::put_lifecycle(&e.index, id, &rules))
            .await
    }

    async fn get_lifecycle(&self, bucket: &Bucket) -> StoreResult<Option<Vec<Rule>>> {
        let id = bucket.id;
        self.run(move |e| crate::tiers::get_lifecycle(&e.index, id))
            .await
    }

    async fn delete_lifecycle(&self, bucket: &Bucket) -> StoreResult<()> {
        let id = bucket.id;
        self.run(move |e| crate::tiers::delete_lifecycle(&e.index, id))
            .await
    }

    async fn put_bucket_config(
        &self,
        bucket: &Bucket,
        kind: BucketConfig,
        doc: Option<Vec<u8>>,
    ) -> StoreResult<()> {
        let key = bucket_config_key(kind, bucket.id);
        self.run(move |e| {
            match doc {
                Some(doc) => e.index.put_meta(&key, &doc)?,
                None => e.index.delete_meta(&key)?,
            }
            Ok(())
        })
        .await
    }

    async fn get_bucket_config(
        &self,
        bucket: &Bucket,
        kind: BucketConfig,
    ) -> StoreResult<Option<Vec<u8>>> {
        // A point read of a small value, in RocksDB's block cache once read: cheaper inline
        // than a hop to the blocking pool.
        Ok(self
            .engine
            .index
            .get_meta(&bucket_config_key(kind, bucket.id))
            .map_err(EngineError::from)?)
    }

    fn is_storage_class(&self, class: &str) -> bool {
        class == "STANDARD" || crate::tiers::is_tier_class(class)
    }

    async fn head_object(&self, bucket: &Bucket, key: &str) -> StoreResult<Option<ObjectInfo>> {
        // A point lookup, answered by the record cache on the calling thread when it holds
        // the key (RocksDB's own block cache otherwise).
        let rec = self
            .engine
            .index
            .get_object_shared(bucket.id, key)
            .map_err(EngineError::from)?;
        Ok(rec.map(|r| info_of(r, shows_versions(bucket))))
    }

    fn read_object(
        &self,
        object: &ObjectInfo,
        start: u64,
        end: u64,
    ) -> StoreResult<Box<dyn ObjectRead>> {
        let rec = record_in(object)?;
        // With erasure coding, a range on more lost disks than the code can rebuild from is
        // refused before anything is sent (a catalog check, no I/O), so the client gets a
        // clean error instead of a cut stream.
        if rec.chunks.len() > 1 && self.engine.chunks.has_redundancy() {
            let mut at = 0u64;
            for c in &rec.chunks {
                let chunk_end = at + u64::from(c.len);
                if chunk_end > start
                    && at < end
                    && !crate::tiers::is_tier_segment(c.segment_id)
                    && !self.engine.chunks.can_read(&location(c))
                {
                    return Err(EngineError::from(
                        packrat_chunk_store::ChunkStoreError::Unrecoverable {
                            segment_id: c.segment_id,
                            reason: "too few shards left".into(),
                        },
                    )
                    .into());
                }
                at = chunk_end;
            }
        }
        Ok(Box::new(ObjectReader::new(
            self.engine.clone(),
            rec,
            start,
            end,
        )))
    }

    async fn put_object(
        &self,
        bucket: &Bucket,
        key: &str,
        body: &mut dyn ByteSource,
        put: PutObject,
    ) -> StoreResult<ObjectInfo> {
        self.write_object(bucket, key, body, put).await
    }

    async fn copy_object(
        &self,
        source: &ObjectInfo,
        bucket: &Bucket,
        key: &str,
        put: PutObject,
    ) -> StoreResult<ObjectInfo> {
        let rec = record_in(source)?;
        let size = rec.size;
        let mut reader = ObjectReader::new(self.engine.clone(), rec, 0, size);
        let put = PutObject {
            expected_checksum: None,
            content_md5: None,
            ..put
        };
        self.write_object(bucket, key, &mut reader, put).await
    }

    async fn update_object(
        &self,
        bucket: &Bucket,
        key: &str,
        condition: &WriteCondition,
        edit: AttrEdit,
    ) -> StoreResult<ObjectInfo> {
        let rec = self
            .engine
            .update_object(bucket.id, key, condition, |rec| {
                let mut attrs = attrs_of(rec);
                edit(&mut attrs);
                set_attrs(rec, attrs);
            })
            .await?;
        Ok(info_of(Arc::new(rec), shows_versions(bucket)))
    }

    async fn delete_object(&self, bucket: &Bucket, key: &str) -> StoreResult<Deleted> {
        if bucket.versioning == Versioning::Unversioned {
            self.engine.delete_object(bucket.id, key).await?;
            return Ok(Deleted::default());
        }
        let deleted = self
            .engine
            .delete_versioned(bucket.id, key, bucket.versioning, None, None)
            .await?;
        Ok(deleted.unwrap_or_default())
    }

    async fn find_version(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: Option<&str>,
    ) -> StoreResult<Option<FoundVersion>> {
        let id = version_id.map(VersionId::parse).transpose()?;
        let found = if bucket.versioning == Versioning::Unversioned {
            // Every object is the null version; no other version exists.
            match id {
                None | Some(VersionId::Null) => self.engine.index.get_object(bucket.id, key),
                Some(VersionId::Seq(_)) => Ok(None),
            }
            .map_err(EngineError::from)?
        } else {
            let (e, key, bucket_id) = (self.engine.clone(), key.to_string(), bucket.id);
            blocking(move || match id {
                None => e.latest_version(bucket_id, &key),
                Some(id) => Ok(e.locate_version(bucket_id, &key, id)?.map(|l| l.record)),
            })
            .await?
        };
        // A version asked by id is named in the answer, `null` included.
        let show_version = version_id.is_some() || shows_versions(bucket);
        Ok(found.map(|rec| {
            if rec.is_delete_marker() {
                FoundVersion::DeleteMarker {
                    version_id: rec.version_id(),
                    last_modified_ms: rec.last_modified_ms,
                }
            } else {
                FoundVersion::Object(Box::new(info_of(Arc::new(rec), show_version)))
            }
        }))
    }

    async fn delete_version(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        check: LockCheck,
    ) -> StoreResult<Deleted> {
        let id = VersionId::parse(version_id)?;
        if bucket.versioning == Versioning::Unversioned {
            if id == VersionId::Null {
                self.engine.delete_object(bucket.id, key).await?;
            }
            return Ok(Deleted {
                version_id: Some(version_id.to_string()),
                delete_marker: false,
            });
        }
        self.engine
            .delete_version(bucket.id, key, id, version_id, check, false)
            .await?
            .ok_or_else(|| StoreError::internal("delete version", "a version was kept"))
    }

    async fn update_lock(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: Option<&str>,
        change: LockChange,
        check: LockCheck,
    ) -> StoreResult<Option<ObjectLock>> {
        let id = version_id.map(VersionId::parse).transpose()?;
        Ok(self
            .engine
            .update_lock(bucket.id, key, id, change, check)
            .await?)
    }

    async fn set_version_tags(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        tags: Vec<(String, String)>,
    ) -> StoreResult<bool> {
        let id = VersionId::parse(version_id)?;
        Ok(self
            .engine
            .set_version_tags(bucket.id, key, id, tags)
            .await?
            .is_some())
    }

    async fn set_version_class(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        class: &str,
        noncurrent_only: bool,
    ) -> StoreResult<bool> {
        let id = VersionId::parse(version_id)?;
        Ok(self
            .engine
            .set_version_class(bucket.id, key, id, class, noncurrent_only)
            .await?
            .is_some())
    }

    async fn list_versions(
        &self,
        bucket: &Bucket,
        query: &VersionQuery,
    ) -> StoreResult<VersionPage> {
        let (e, q, bucket_id) = (self.engine.clone(), query.clone(), bucket.id);
        blocking(move || {
            let cursor = match (&q.key_marker, &q.version_id_marker) {
                (None, _) => None,
                (Some(k), None) => Some(VersionCursor::AfterKey(k.clone())),
                (Some(k), Some(v)) => {
                    let id = VersionId::parse(v)?;
                    Some(match e.locate_version(bucket_id, k, id)? {
                        Some(l) if l.current => VersionCursor::AfterCurrent(k.clone()),
                        Some(l) => VersionCursor::AfterSeq(k.clone(), l.record.version_seq),
                        // A version gone since: resume after the sequence it named.
                        None => match id {
                            VersionId::Seq(s) => VersionCursor::AfterSeq(k.clone(), s),
                            VersionId::Null => VersionCursor::AfterKey(k.clone()),
                        },
                    })
                }
            };
            let page = e.index.list_versions(
                bucket_id,
                &q.prefix,
                q.delimiter.as_deref(),
                cursor.as_ref(),
                q.max_keys.max(1),
            )?;
            let mut out = VersionPage {
                common_prefixes: page.common_prefixes,
                truncated: page.truncated,
                ..Default::default()
            };
            for (key, rec, is_latest) in page.versions {
                out.versions.push(version_summary(key, rec, is_latest));
            }
            if out.truncated {
                match page.next {
                    Some(VersionCursor::AfterKey(k)) => out.next_key_marker = Some(k),
                    Some(VersionCursor::AfterCurrent(k) | VersionCursor::AfterSeq(k, _)) => {
                        out.next_version_id_marker =
                            out.versions.last().map(|v| v.version_id.clone());
                        out.next_key_marker = Some(k);
                    }
                    None => {}
                }
            }
            Ok(out)
        })
        .await
        .map_err(Into::into)
    }

    async fn create_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        new: NewUpload,
    ) -> StoreResult<Upload> {
        let mut headers = new.attrs.headers;
        if !new.attrs.tags.is_empty() {
            headers.push((
                UPLOAD_TAGGING_HEADER.to_string(),
                tags_to_header(&new.attrs.tags),
            ));
        }
        let rec = UploadRecord {
            upload_id: new
                .upload_id
                .unwrap_or_else(|| hex::encode(rand::random::<[u8; 16]>())),
            bucket_id: bucket.id,
            key: key.to_string(),
            owner_id: new.owner_id,
            initiated_ms: new.initiated_ms,
            content_type: new.attrs.content_type,
            headers,
            user_meta: new.attrs.user_meta,
            checksum_algorithm: new.checksum.map(|a| a.name().to_string()),
            checksum_type: new.checksum_type,
            storage_class: new.attrs.storage_class,
        };
        let upload = upload_of(&rec);
        self.engine.create_upload(rec).await?;
        Ok(upload)
    }

    async fn upload(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
    ) -> StoreResult<Option<Upload>> {
        Ok(self
            .engine
            .index
            .get_upload(bucket.id, key, upload_id)
            .map_err(EngineError::from)?
            .map(|u| upload_of(&u)))
    }

    async fn upload_part(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        body: &mut dyn ByteSource,
        put: PutPart,
    ) -> StoreResult<Part> {
        let upload = self.existing_upload(bucket, key, upload_id)?;
        let w = self
            .engine
            .write_stream(
                body,
                put.checksum.or(upload.checksum),
                put.expected_checksum,
                put.content_md5,
            )
            .await?;
        self.publish_part(bucket, key, upload_id, part_number, w)
            .await
    }

    async fn upload_part_copy(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        source: &ObjectInfo,
        range: std::ops::Range<u64>,
    ) -> StoreResult<Part> {
        // A part like any other, its bytes read from the source; the upload's checksum
        // algorithm applies, and there is no client digest to check.
        let mut reader = ObjectReader::new(
            self.engine.clone(),
            record_in(source)?,
            range.start,
            range.end,
        );
        self.upload_part(
            bucket,
            key,
            upload_id,
            part_number,
            &mut reader,
            PutPart::default(),
        )
        .await
    }

    async fn complete_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletePart>,
        condition: &WriteCondition,
        stamp: &CompleteAs,
    ) -> StoreResult<ObjectInfo> {
        let now = self.engine.clock.now_ms();
        let (mode, given, shown) = write_versioning(bucket, stamp.version_as);
        let rec = self
            .engine
            .complete_upload(
                bucket.id,
                key,
                upload_id,
                CommitAs {
                    cond: condition,
                    versioning: mode,
                    given,
                },
                |upload, stored| {
                    let mut rec = multipart::assemble(upload, stored, &parts, now)?;
                    rec.user_meta.extend_from_slice(&stamp.user_meta);
                    if let Some(t) = stamp.last_modified_ms {
                        rec.last_modified_ms = t;
                    }
                    Ok(rec)
                },
            )
            .await?;
        Ok(info_of(Arc::new(rec), shown))
    }

    async fn abort_upload(&self, bucket: &Bucket, key: &str, upload_id: &str) -> StoreResult<()> {
        Ok(self.engine.abort_upload(bucket.id, key, upload_id).await?)
    }

    async fn list_parts(
        &self,
        upload: &Upload,
        _bucket: &Bucket,
        after: u32,
        max: usize,
    ) -> StoreResult<(Vec<Part>, bool)> {
        let uid = upload.upload_id.clone();
        let mut parts = self
            .run(move |e| Ok(e.index.list_parts(&uid, after, max.saturating_add(1))?))
            .await?;
        let truncated = parts.len() > max;
        parts.truncate(max);
        Ok((parts.iter().map(part_of).collect(), truncated))
    }

    async fn list_uploads(&self, bucket: &Bucket, query: &UploadQuery) -> StoreResult<UploadPage> {
        let (id, q) = (bucket.id, query.clone());
        self.run(move |e| {
            let page = e.index.list_uploads(
                id,
                &q.prefix,
                q.delimiter.as_deref(),
                q.key_marker.as_deref(),
                q.upload_id_marker.as_deref(),
                q.max_uploads,
            )?;
            Ok(UploadPage {
                uploads: page.uploads.iter().map(upload_of).collect(),
                common_prefixes: page.common_prefixes,
                truncated: page.truncated,
            })
        })
        .await
    }

    async fn list_objects(&self, bucket: &Bucket, query: &ListQuery) -> StoreResult<ObjectPage> {
        let (id, q) = (bucket.id, query.clone());
        self.run(move |e| {
            let page = e.index.list_objects(
                id,
                &q.prefix,
                q.delimiter.as_deref(),
                q.after.as_deref(),
                q.max_keys,
            )?;
            Ok(ObjectPage {
                objects: page
                    .objects
                    .into_iter()
                    .map(|(k, o)| summary_of(k, &o))
                    .collect(),
                common_prefixes: page.common_prefixes,
                truncated: page.truncated,
                last: page.last,
            })
        })
        .await
    }

    async fn tar_members(
        &self,
        _bucket: &Bucket,
        key: &str,
        object: &ObjectInfo,
        names: &[String],
    ) -> StoreResult<Vec<Option<(u64, u64)>>> {
        let rec = record_in(object)?;
        crate::batch::tar_members(&self.engine, key, &rec, names).await
    }

    async fn plan_batch(
        &self,
        bucket: &Bucket,
        items: Vec<BatchItem>,
        order: BatchOrder,
    ) -> StoreResult<BatchPlan> {
        crate::batch::plan_batch(&self.engine, bucket.id, items, order).await
    }

    async fn read_batch(&self, plan: BatchPlan, sink: &mut dyn EntrySink) {
        crate::batch::read_batch(&self.engine, plan, sink).await
    }

    async fn stream_keys(&self, bucket: &Bucket, prefix: &str) -> StoreResult<KeyList> {
        let (id, prefix) = (bucket.id, prefix.to_string());
        self.run(move |e| {
            let mut keys = KeyList::default();
            e.index.for_each_key(id, &prefix, |k| keys.push(k))?;
            Ok(keys)
        })
        .await
    }

    async fn warm_listing(
        &self,
        bucket: &Bucket,
        prefix: &str,
        positions: Vec<usize>,
    ) -> StoreResult<()> {
        let (id, prefix) = (bucket.id, prefix.to_string());
        self.run(move |e| {
            e.index.warm_objects(id, &prefix, &positions)?;
            Ok(())
        })
        .await
    }

    fn batch_writer(&self, bucket: &Bucket) -> StoreResult<Box<dyn BatchWriter>> {
        if bucket.object_lock.is_some() {
            return Err(StoreError::Invalid(
                "batch PUT into a bucket with Object Lock is not supported (its default retention would not be applied); use PutObject".into(),
            ));
        }
        Ok(Box::new(crate::batch::LocalBatchWriter::new(
            self.engine.clone(),
            bucket.id,
            bucket.versioning,
        )))
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.engine.clock.clone()
    }
}

fn location(c: &ChunkRef) -> packrat_chunk_store::RecordLocation {
    packrat_chunk_store::RecordLocation {
        segment_id: c.segment_id,
        offset: c.offset,
        len: c.len,
    }
}
