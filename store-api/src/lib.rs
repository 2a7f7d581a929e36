//! packrat-store-api: the seam between the S3 layer and storage.
//!
//! Owns the vocabulary both sides speak: what can go wrong ([`StoreError`], by kind, never an
//! S3 code), the flexible checksums a write carries ([`checksum`]), lifecycle rules and their
//! evaluation ([`lifecycle`]), and where a write's bytes come from ([`ByteSource`]).
//!
//! It must never depend on RocksDB, files, the storage crates or HTTP: the S3 layer (and its
//! fuzz targets) build against it without the storage engine.

pub mod checksum;
pub mod error;
pub mod lifecycle;
pub mod source;

pub use error::{Digest, StoreError, StoreResult};
pub use source::ByteSource;
pub mod types;

pub use types::{Bucket, Identity, ListQuery, NewBucket, ObjectPage, ObjectSummary};

use lifecycle::Rule;

/// Storage as the S3 handlers see it: the only way they reach buckets and objects. `LocalStore`
/// (one node's engine, in `packrat-store`) implements it; a cluster store is another
/// implementation. Every method is real in every implementation (no default bodies): an
/// operation a store cannot do answers a `StoreError` that says so.
///
/// Methods that a request makes on every call and that a store answers from memory (access
/// keys, buckets) are plain functions; the rest are async. The trait is used as
/// `Arc<dyn ObjectStore>`; `async_trait` boxes each async call's future (one allocation per
/// call, measured against direct calls in `docs/benchmarks.md`).
#[async_trait::async_trait]
pub trait ObjectStore: Send + Sync + 'static {
    /// The identity holding an access key, `None` if there is no such key.
    fn access_key(&self, access_key: &str) -> StoreResult<Option<Identity>>;

    // ---- buckets

    /// A bucket by name, `None` if there is none.
    fn bucket(&self, name: &str) -> StoreResult<Option<Bucket>>;
    /// Every bucket, by name.
    async fn list_buckets(&self) -> StoreResult<Vec<Bucket>>;
    /// Creates a bucket; `BucketExists` if the name is taken (by anyone).
    async fn create_bucket(&self, new: NewBucket) -> StoreResult<Bucket>;
    /// Deletes an empty bucket and its configuration; `BucketNotEmpty` if it holds objects
    /// or uploads in progress.
    async fn delete_bucket(&self, bucket: &Bucket) -> StoreResult<()>;
    /// Sets or clears anonymous read access (the `public-read` canned ACL).
    async fn set_bucket_public(&self, bucket: &Bucket, public: bool) -> StoreResult<()>;
    /// Replaces the bucket's lifecycle rules.
    async fn put_lifecycle(&self, bucket: &Bucket, rules: Vec<Rule>) -> StoreResult<()>;
    /// The bucket's lifecycle rules, `None` if none were set.
    async fn get_lifecycle(&self, bucket: &Bucket) -> StoreResult<Option<Vec<Rule>>>;
    async fn delete_lifecycle(&self, bucket: &Bucket) -> StoreResult<()>;
    /// Whether `class` names a storage class this store can hold (`STANDARD` always).
    fn is_storage_class(&self, class: &str) -> bool;

    // ---- listing

    /// One page of the bucket's objects.
    async fn list_objects(&self, bucket: &Bucket, query: &ListQuery) -> StoreResult<ObjectPage>;
}
