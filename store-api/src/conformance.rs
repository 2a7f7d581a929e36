//! The conformance suite: what every [`Store`] must do, as checks any implementation
//! runs against itself (`LocalStore` in `store/tests/conformance.rs`; a cluster store the
//! same way). Each check makes its own buckets, so they can share one store; each panics with
//! what it saw when the store does something else. [`conformance_suite!`](crate::conformance_suite)
//! turns them into one `#[test]` each.
//!
//! Only with the `conformance` feature (it brings proptest and tokio).

use crate::checksum::{ChecksumAlgorithm, Hasher};
use crate::error::{Digest, StoreError, StoreResult};
use crate::lifecycle::Rule;
use crate::types::*;
use crate::{ByteSource, Store};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

mod admin;
mod batches;
mod credentials;
mod listing;
mod objects;
mod uploads;
mod versions;

pub use admin::*;
pub use batches::*;
pub use credentials::*;
pub use listing::*;
pub use objects::*;
pub use uploads::*;
pub use versions::*;

/// A payload held in memory, handed out in pieces of `piece` bytes.
pub struct MemSource {
    data: Bytes,
    piece: usize,
    /// Fail (with the source's own error) instead of handing out more once no more than this
    /// many bytes remain.
    fail_after: Option<usize>,
}

impl MemSource {
    pub fn new(data: impl Into<Bytes>) -> Self {
        Self {
            data: data.into(),
            piece: 64 * 1024,
            fail_after: None,
        }
    }
}

#[derive(Debug)]
struct SourceBroke;

impl std::fmt::Display for SourceBroke {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client went away")
    }
}

impl std::error::Error for SourceBroke {}

#[async_trait::async_trait]
impl ByteSource for MemSource {
    async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
        if self.fail_after.is_some_and(|n| self.data.len() <= n) {
            return Err(StoreError::Source(std::sync::Arc::new(SourceBroke)));
        }
        if self.data.is_empty() {
            return Ok(None);
        }
        let n = self.piece.min(self.data.len());
        Ok(Some(self.data.split_to(n)))
    }

    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }
}

static NEXT_BUCKET: AtomicU64 = AtomicU64::new(0);

/// A new bucket with a name no other check uses.
pub async fn new_bucket(store: &dyn Store, what: &str) -> Bucket {
    let n = NEXT_BUCKET.fetch_add(1, Ordering::Relaxed);
    store
        .create_bucket(NewBucket {
            name: format!("conf-{what}-{n}"),
            owner_id: "owner-1".into(),
            owner_name: "one".into(),
            created_ms: 1_700_000_000_000,
            public_read: false,
            object_lock: false,
        })
        .await
        .expect("creating a bucket")
}

fn md5_hex(data: &[u8]) -> String {
    use md5::Digest as _;
    md5::Md5::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub async fn put(store: &dyn Store, b: &Bucket, key: &str, data: &[u8]) -> ObjectInfo {
    put_with(store, b, key, data, PutObject::default())
        .await
        .unwrap_or_else(|e| panic!("PUT {key}: {e}"))
}

pub async fn put_with(
    store: &dyn Store,
    b: &Bucket,
    key: &str,
    data: &[u8],
    put: PutObject,
) -> StoreResult<ObjectInfo> {
    let mut src = MemSource::new(data.to_vec());
    store.put_object(b, key, &mut src, put).await
}

/// Every byte of `[start, end)` of `info`'s version.
pub async fn read(store: &dyn Store, info: &ObjectInfo, start: u64, end: u64) -> Vec<u8> {
    let mut r = store
        .read_object(info, start, end)
        .unwrap_or_else(|e| panic!("read_object: {e}"));
    let mut out = Vec::new();
    while let Some(piece) = r.next().await.unwrap_or_else(|e| panic!("read: {e}")) {
        out.extend_from_slice(&piece);
    }
    out
}

pub async fn head(store: &dyn Store, b: &Bucket, key: &str) -> Option<ObjectInfo> {
    store
        .head_object(b, key)
        .await
        .unwrap_or_else(|e| panic!("HEAD {key}: {e}"))
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

// ---------------------------------------------------------------- the checks

/// One `#[test]` per check against the store that `$make` (an `async fn() -> Arc<dyn
/// Store>`, called once per test) opens.
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        $crate::conformance_suite!(@checks $make;
            buckets, read_after_write, overwrite_and_delete, conditional_writes,
            digests_and_checksums, failed_body_stores_nothing, copies_and_attribute_edits,
            lifecycle_configuration, bucket_configuration, listing_summaries,
            multipart_uploads, tar_members, versions, version_tags, version_acl,
            version_class, object_lock, console_sessions, access_keys, sealing,
            administration, batch_reads, batch_writes, epoch_listing, kms_keys,
            delete_bucket_with_uploads, foreign_handles);
        #[test]
        fn listing_matches_model() {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let store = rt.block_on($make());
            $crate::conformance::listing_matches_model(&rt, &*store);
        }
    };
    (@checks $make:path; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(async {
                    let store = $make().await;
                    $crate::conformance::$check(&*store).await;
                });
            }
        )*
    };
}
