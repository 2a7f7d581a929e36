//! What can go wrong in a store, by kind. The S3 layer turns each kind into an S3 error code
//! and HTTP status in one place (`gateway/src/s3/error.rs`); a store never names an S3 code.

use crate::checksum::ChecksumAlgorithm;
use std::sync::Arc;

/// Which digest of a write did not match what the client said it sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Digest {
    ContentMd5,
    Checksum(ChecksumAlgorithm),
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("no such bucket")]
    NoSuchBucket,
    #[error("bucket already exists")]
    BucketExists,
    #[error("bucket is not empty")]
    BucketNotEmpty,
    #[error("no such key")]
    NoSuchKey,
    /// A TAR object has no member of that name.
    #[error("no such TAR member {0:?}")]
    NoSuchMember(String),
    /// A range asked of an object (or TAR member) of `size` bytes lies outside it.
    #[error("range not satisfiable (size {size})")]
    RangeNotSatisfiable { size: u64 },
    #[error("no such multipart upload")]
    NoSuchUpload,
    /// CompleteMultipartUpload named a part that is not there, or whose ETag or checksum
    /// differs (the text is meant for the client).
    #[error("invalid part: {0}")]
    InvalidPart(String),
    /// CompleteMultipartUpload's parts are not in ascending order.
    #[error("parts not in ascending order")]
    InvalidPartOrder,
    /// A part other than the last is smaller than S3's minimum.
    #[error("a part is too small")]
    EntityTooSmall,
    /// A write condition (`If-None-Match: *`, `If-Match`) did not hold.
    #[error("a write condition did not hold")]
    PreconditionFailed,
    /// The bytes received do not match a digest the client sent; nothing was stored.
    #[error("{0:?} did not match the bytes received")]
    BadDigest(Digest),
    /// A disk is full; nothing was stored.
    #[error("disk full: {0}")]
    InsufficientStorage(String),
    /// Stored bytes failed verification (or their segment is gone); they were not served.
    #[error("stored data failed verification: {0}")]
    Corrupt(String),
    /// Data on more failed disks than the erasure code can rebuild from; not served.
    #[error("data lost beyond the erasure code's reach: {0}")]
    Unrecoverable(String),
    /// Data on a storage tier is missing or failed verification; not served.
    #[error("tiered data missing or wrong: {0}")]
    TierData(String),
    /// Something the request needs cannot be reached now (a tier); retry later. The text is
    /// meant for the client.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// The request reached a storage node that does not hold what it asks for (a client
    /// routing reads by a cluster map, see `RouteMap`, whose map is older or newer than the
    /// node's): `epoch` is the node's map, for the client to fetch again and retry, or to ask
    /// a gateway.
    #[error("misdirected: this node does not serve {what} by map epoch {epoch}")]
    Misdirected { what: String, epoch: u64 },
    /// A version's Object Lock forbids what was asked (the text is meant for the client).
    #[error("object locked: {0}")]
    ObjectLocked(&'static str),
    /// The bucket's state forbids the change (Object Lock without versioning, suspending
    /// versioning under Object Lock); the text is meant for the client.
    #[error("invalid bucket state: {0}")]
    InvalidBucketState(String),
    /// A request the store refuses as asked (the text is meant for the client).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// A failure with no meaning for the client (I/O, a stopped thread, a corrupt index value):
    /// logged with its context, answered as an internal error.
    #[error("{context}: {detail}")]
    Internal {
        context: &'static str,
        detail: String,
    },
    /// The byte source of a write failed (a request body: a bad chunk signature, a client that
    /// went away); the error is the source's own, passed back unchanged.
    #[error("reading the body: {0}")]
    Source(Arc<dyn std::error::Error + Send + Sync>),
}

pub type StoreResult<T> = Result<T, StoreError>;

impl StoreError {
    pub fn internal(context: &'static str, detail: impl std::fmt::Display) -> Self {
        StoreError::Internal {
            context,
            detail: detail.to_string(),
        }
    }
}
