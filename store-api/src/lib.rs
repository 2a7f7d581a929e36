//! packrat-store-api: the seam between the S3 layer and storage.
//!
//! Owns the vocabulary both sides speak: what can go wrong ([`StoreError`], by kind, never an
//! S3 code), the flexible checksums a write carries ([`checksum`]), lifecycle rules and their
//! evaluation ([`lifecycle`]), and where a write's bytes come from ([`ByteSource`]).
//!
//! It must never depend on RocksDB, files, the storage crates or HTTP: the S3 layer (and its
//! fuzz targets) build against it without the storage engine.

pub mod admin;
pub mod batch;
pub mod checksum;
pub mod clock;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod credentials;
pub mod error;
pub mod kms;
pub mod lifecycle;
pub mod lock;
pub mod replica;
pub mod reports;
pub mod routes;
pub mod sealed;
pub mod sessions;
pub mod source;
pub mod stream;

pub use admin::StoreAdmin;
pub use clock::{Clock, ManualClock, SystemClock};
pub use credentials::Credentials;
pub use error::{Digest, StoreError, StoreResult};
pub use kms::KeyProvider;
pub use replica::ReplicaStore;
pub use source::ByteSource;
pub mod types;

pub use types::{
    ACL_HEADER, Bucket, BucketConfig, CompleteAs, CompletePart, Deleted, FoundVersion, Identity,
    ListQuery, NewBucket, NewUpload, ObjectAttrs, ObjectChecksum, ObjectInfo, ObjectPage,
    ObjectSummary, ObjectVersion, OnStaged, PART_BYTES_MIN, Part, PutObject, PutPart,
    UPLOAD_ID_HEADER, Upload, UploadPage, UploadQuery, VersionAs, VersionPage, VersionQuery,
    VersionSummary, Versioning, WriteCondition, completed_from, etag_matches,
};

/// An attribute edit (see [`ObjectStore::update_object`]). Written with `for<'a>` so that
/// `async_trait` leaves the argument's lifetime free.
pub type AttrEdit = Box<dyn for<'a> FnOnce(&'a mut ObjectAttrs) + Send>;

use batch::{BatchItem, BatchOrder, BatchPlan, BatchWriter, EntrySink};
use lifecycle::Rule;

/// The data plane: buckets, objects, versions, multipart uploads, listing and batches, as the
/// S3 handlers use them. `LocalStore` (one node's engine, in `packrat-store`) and `ClusterStore`
/// (a gateway's view of a cluster, in `packrat-cluster`) implement it. Every method is real in
/// every implementation: an operation a store cannot do answers a `StoreError` that says so.
///
/// The other parts of a store: [`Credentials`] (keys, console sessions, sealing),
/// [`KeyProvider`] (SSE-KMS keys), [`StoreAdmin`] (reports, jobs, faults, metrics, readiness)
/// and, for a cluster node's own store only, [`ReplicaStore`]. [`Store`] is the four parts a
/// server needs, as one trait object.
///
/// Methods that a request makes on every call and that a store answers from memory (buckets)
/// are plain functions; the rest are async. The traits are used as `Arc<dyn Store>`;
/// `async_trait` boxes each async call's future (one allocation per call, measured against
/// direct calls in `docs/benchmark-log.md`).
#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    // ---- buckets

    /// A bucket by name, `None` if there is none.
    fn bucket(&self, name: &str) -> StoreResult<Option<Bucket>>;
    /// Every bucket, by name.
    async fn list_buckets(&self) -> StoreResult<Vec<Bucket>>;
    /// Creates a bucket; `BucketExists` if the name is taken (by anyone).
    async fn create_bucket(&self, new: NewBucket) -> StoreResult<Bucket>;
    /// Deletes a bucket that holds no object and no version (delete markers included), with
    /// its configuration, aborting its uploads in progress (their parts dropped), as S3 does;
    /// `BucketNotEmpty` if it holds objects, and then its uploads stay.
    async fn delete_bucket(&self, bucket: &Bucket) -> StoreResult<()>;
    /// Sets the bucket's versioning (`Enabled` or `Suspended`); `Invalid` for `Unversioned`
    /// (S3 has no way back), or from a store that cannot keep versions (the text says so);
    /// `InvalidBucketState` for `Suspended` in a bucket with Object Lock.
    async fn set_versioning(&self, bucket: &Bucket, state: Versioning) -> StoreResult<()>;
    /// Enables Object Lock on a bucket (for good) and sets its default retention;
    /// `InvalidBucketState` unless the bucket's versioning is `Enabled`; `Invalid` from a
    /// store that cannot keep versions.
    async fn set_lock_config(&self, bucket: &Bucket, config: lock::LockConfig) -> StoreResult<()>;
    /// Sets or clears anonymous read access (the `public-read` canned ACL).
    async fn set_bucket_public(&self, bucket: &Bucket, public: bool) -> StoreResult<()>;
    /// Replaces the bucket's lifecycle rules.
    async fn put_lifecycle(&self, bucket: &Bucket, rules: Vec<Rule>) -> StoreResult<()>;
    /// The bucket's lifecycle rules, `None` if none were set.
    async fn get_lifecycle(&self, bucket: &Bucket) -> StoreResult<Option<Vec<Rule>>>;
    async fn delete_lifecycle(&self, bucket: &Bucket) -> StoreResult<()>;
    /// Sets (`Some`) or removes (`None`) one of the bucket's configuration documents.
    async fn put_bucket_config(
        &self,
        bucket: &Bucket,
        kind: BucketConfig,
        doc: Option<Vec<u8>>,
    ) -> StoreResult<()>;
    /// One of the bucket's configuration documents, `None` if it has none. Asked on requests
    /// that need it (a browser's, for CORS), so a store answers it from memory where it can.
    async fn get_bucket_config(
        &self,
        bucket: &Bucket,
        kind: BucketConfig,
    ) -> StoreResult<Option<Vec<u8>>>;
    /// Whether `class` names a storage class this store can hold (`STANDARD` always).
    fn is_storage_class(&self, class: &str) -> bool;

    // ---- objects

    /// An object's current version, `None` if the key holds none.
    async fn head_object(&self, bucket: &Bucket, key: &str) -> StoreResult<Option<ObjectInfo>>;
    /// A reader of bytes `[start, end)` of exactly the version `object` describes, every byte
    /// verified before it is handed out. Refuses up front (no I/O) when the range is known to
    /// be unreadable (on more lost disks than the erasure code can rebuild from).
    fn read_object(
        &self,
        object: &ObjectInfo,
        start: u64,
        end: u64,
    ) -> StoreResult<Box<dyn ObjectRead>>;
    /// Stores `body` under `key` (durable before this returns), if `put.condition` holds when
    /// it commits. Answers what was stored.
    async fn put_object(
        &self,
        bucket: &Bucket,
        key: &str,
        body: &mut dyn ByteSource,
        put: PutObject,
    ) -> StoreResult<ObjectInfo>;
    /// Copies the bytes of `source` (a version read through [`Self::head_object`]) to a new
    /// object under `key`, with `put`'s attributes and checksum.
    async fn copy_object(
        &self,
        source: &ObjectInfo,
        bucket: &Bucket,
        key: &str,
        put: PutObject,
    ) -> StoreResult<ObjectInfo>;
    /// Changes an object's attributes, never its bytes: `edit` gets them as they are when the
    /// edit commits (a write that landed meanwhile is edited, not undone). `NoSuchKey` if the
    /// object is gone.
    async fn update_object(
        &self,
        bucket: &Bucket,
        key: &str,
        condition: &WriteCondition,
        edit: AttrEdit,
    ) -> StoreResult<ObjectInfo>;
    /// Deletes a key's object (durable before this returns); deleting a missing key succeeds.
    /// In a versioned bucket it adds a delete marker instead (the `null` one when suspended),
    /// and the versions under it stay.
    async fn delete_object(&self, bucket: &Bucket, key: &str) -> StoreResult<Deleted>;
    /// One version of a key by id (`null` included); `version_id: None` asks for the latest,
    /// which may be a delete marker. `None` if there is no such version; `Invalid` for an id
    /// this store never makes.
    async fn find_version(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: Option<&str>,
    ) -> StoreResult<Option<FoundVersion>>;
    /// Removes one version for good (an object or a delete marker); the newest remaining
    /// becomes current. A version that does not exist is not an error (nothing is removed).
    /// `ObjectLocked` if its lock protects it as `check` judges (see [`lock`]).
    async fn delete_version(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        check: lock::LockCheck,
    ) -> StoreResult<Deleted>;
    /// Changes the lock of one version (the current object when `version_id` is `None`), as
    /// [`lock::ObjectLock::apply_by`] allows with `check`, atomically with the key's other
    /// writes; answers its lock now, or `None` when there is no such version (a delete marker
    /// has no lock: `Invalid`).
    async fn update_lock(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: Option<&str>,
        change: lock::LockChange,
        check: lock::LockCheck,
    ) -> StoreResult<Option<lock::ObjectLock>>;
    /// Gives one version of a key (by id, `null` included) the tag set `tags` (empty: none),
    /// atomically with the key's other writes; its bytes, version id and place in the history
    /// stay. `false` when there is no such version; a delete marker has no tags (`Invalid`).
    async fn set_version_tags(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        tags: Vec<(String, String)>,
    ) -> StoreResult<bool>;
    /// Gives one version of a key (by id) the storage class `class` (`STANDARD`: none), in
    /// place, atomically with the key's other writes; the store moves its bytes to that
    /// class's tier in its own time. `false` when there is no such version; a delete marker
    /// has no class (`Invalid`). With `noncurrent_only` (a NoncurrentVersionTransition), a
    /// version that is the key's current one is left as it is: `PreconditionFailed`.
    async fn set_version_class(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        class: &str,
        noncurrent_only: bool,
    ) -> StoreResult<bool>;
    /// One page of the bucket's versions and delete markers.
    async fn list_versions(
        &self,
        bucket: &Bucket,
        query: &VersionQuery,
    ) -> StoreResult<VersionPage>;

    // ---- multipart uploads

    /// Begins an upload of `key`; answers it with its new id.
    async fn create_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        new: NewUpload,
    ) -> StoreResult<Upload>;
    /// An upload in progress, `None` if there is none with that id for that key.
    async fn upload(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
    ) -> StoreResult<Option<Upload>>;
    /// Stores part `part_number` of an upload from `body` (replacing an earlier one with the
    /// same number), durable before this returns; `NoSuchUpload` if the upload is gone or
    /// ends while the part streams in.
    async fn upload_part(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        body: &mut dyn ByteSource,
        put: PutPart,
    ) -> StoreResult<Part>;
    /// Stores part `part_number` from the bytes `range` of `source` (UploadPartCopy).
    async fn upload_part_copy(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        source: &ObjectInfo,
        range: std::ops::Range<u64>,
    ) -> StoreResult<Part>;
    /// Makes the object from the named parts, in ascending order, if `condition` holds:
    /// `InvalidPartOrder`, `InvalidPart` (a part missing, or its ETag or checksum differs),
    /// `EntityTooSmall` (a part but the last under [`PART_BYTES_MIN`]). The upload ends.
    /// `stamp` fixes the object's time and adds user metadata (see [`CompleteAs`]).
    async fn complete_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletePart>,
        condition: &WriteCondition,
        stamp: &CompleteAs,
    ) -> StoreResult<ObjectInfo>;
    /// Ends an upload and drops its parts; `NoSuchUpload` if there is none.
    async fn abort_upload(&self, bucket: &Bucket, key: &str, upload_id: &str) -> StoreResult<()>;
    /// Parts numbered above `after`, in order, at most `max`; and whether more follow.
    async fn list_parts(
        &self,
        upload: &Upload,
        bucket: &Bucket,
        after: u32,
        max: usize,
    ) -> StoreResult<(Vec<Part>, bool)>;
    /// One page of the bucket's uploads in progress.
    async fn list_uploads(&self, bucket: &Bucket, query: &UploadQuery) -> StoreResult<UploadPage>;

    // ---- listing

    /// One page of the bucket's objects.
    async fn list_objects(&self, bucket: &Bucket, query: &ListQuery) -> StoreResult<ObjectPage>;

    // ---- batch reads and writes (packrat's extensions, see [`batch`])

    /// Where members of a TAR object (`key`'s version `object`) lie in it, as a batch GET finds them (the object's member
    /// index, built on first use): each name's (offset, size) in the object, `None` for a name
    /// the archive lacks. `Invalid` if the object is not a TAR archive or is encrypted.
    async fn tar_members(
        &self,
        bucket: &Bucket,
        key: &str,
        object: &ObjectInfo,
        names: &[String],
    ) -> StoreResult<Vec<Option<(u64, u64)>>>;
    /// Plans a batch GET: looks up every item's object (and TAR member, building the object's
    /// member index on first use) and resolves its range. An item that cannot be read becomes
    /// an error entry (`NoSuchKey`, `NoSuchMember`, `RangeNotSatisfiable`); an object named
    /// with a member that is not a TAR archive fails the whole plan (`Invalid`).
    async fn plan_batch(
        &self,
        bucket: &Bucket,
        items: Vec<BatchItem>,
        order: BatchOrder,
    ) -> StoreResult<BatchPlan>;
    /// Reads a plan's entries into `sink` in the plan's order, every payload verified. A read
    /// that fails becomes an error entry when the entry's header is not yet out, else cuts
    /// the stream. Ends the stream (`sink.finish`) after the last entry.
    async fn read_batch(&self, plan: BatchPlan, sink: &mut dyn EntrySink);
    /// Every key under `prefix`, in key order: what an epoch stream is planned from (see
    /// [`stream`]; the stream is then read as batches).
    async fn stream_keys(&self, bucket: &Bucket, prefix: &str) -> StoreResult<stream::KeyList>;
    /// A hint before an epoch stream is read: the keys at `positions` of the listing that
    /// [`stream_keys`](Self::stream_keys) returned will be looked up by key, in this order (a
    /// random one). A store may read their records ahead in one pass; it may warm only the
    /// first ones. Reads never depend on it: the listing may have changed since.
    async fn warm_listing(
        &self,
        _bucket: &Bucket,
        _prefix: &str,
        _positions: Vec<usize>,
    ) -> StoreResult<()> {
        Ok(())
    }
    /// Starts a batch PUT into `bucket`.
    fn batch_writer(&self, bucket: &Bucket) -> StoreResult<Box<dyn BatchWriter>>;
    /// Where a client may read `bucket`'s objects straight from the nodes that hold them
    /// ([`routes`]); `None` where reads have one place (one server, which is the default).
    async fn route_map(&self, _bucket: &Bucket) -> StoreResult<Option<routes::RouteMap>> {
        Ok(None)
    }

    // ---- time

    /// The clock the store dates everything by; the S3 layer reads the time from it too
    /// (last-modified times it passes in, SigV4 request times, presigned expiry).
    fn clock(&self) -> std::sync::Arc<dyn Clock>;
}

/// Aborts every upload in progress in `bucket` (what deleting a bucket does first); answers
/// how many. An upload that ends meanwhile is passed over.
pub async fn abort_uploads(store: &dyn ObjectStore, bucket: &Bucket) -> StoreResult<usize> {
    let mut query = UploadQuery {
        max_uploads: 1000,
        ..Default::default()
    };
    let mut aborted = 0;
    loop {
        let page = store.list_uploads(bucket, &query).await?;
        for u in &page.uploads {
            match store.abort_upload(bucket, &u.key, &u.upload_id).await {
                Ok(()) => aborted += 1,
                Err(StoreError::NoSuchUpload) => {}
                Err(e) => return Err(e),
            }
        }
        match page.uploads.last() {
            Some(last) if page.truncated => {
                query.key_marker = Some(last.key.clone());
                query.upload_id_marker = Some(last.upload_id.clone());
            }
            _ => return Ok(aborted),
        }
    }
}

/// What a server needs of a store: its data plane, its credentials, its SSE-KMS keys and its
/// administration, as one trait object (`Arc<dyn Store>`, which coerces to any one part).
/// Every type with the four parts is a `Store`.
pub trait Store: ObjectStore + Credentials + KeyProvider + StoreAdmin {}

impl<T: ObjectStore + Credentials + KeyProvider + StoreAdmin + ?Sized> Store for T {}

/// The bytes of one object range, in order, as verified pieces.
#[async_trait::async_trait]
pub trait ObjectRead: Send {
    /// The next piece, `None` after the last.
    async fn next(&mut self) -> StoreResult<Option<bytes::Bytes>>;
    /// Whether the whole range comes as one piece (so a caller can read it before it answers,
    /// and turn a failure into a clean error instead of a cut stream).
    fn is_single_piece(&self) -> bool;
}
