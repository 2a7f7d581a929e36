//! A source that knows its bytes' MD5 (a cluster member's chain step, whose bytes were checked
//! against its head's CRC) is not hashed again: the store takes the MD5 it gives for the ETag
//! and for the Content-MD5 check.

mod common;

use md5::Digest as _;
use packrat_store_api::checksum::ChecksumAlgorithm;
use packrat_store_api::{ByteSource, Digest, ObjectStore, PutObject, StoreError, StoreResult};

struct Known(Option<bytes::Bytes>, [u8; 16]);

#[async_trait::async_trait]
impl ByteSource for Known {
    async fn next_piece(&mut self) -> StoreResult<Option<bytes::Bytes>> {
        Ok(self.0.take())
    }

    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }

    fn known_md5(&self) -> Option<[u8; 16]> {
        Some(self.1)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_md5_is_taken_rather_than_computed() {
    let dir = tempfile::tempdir().unwrap();
    let (store, b) = common::store_with_bucket(dir.path()).await;
    let body = bytes::Bytes::from(vec![7u8; 100_000]);
    let md5: [u8; 16] = md5::Md5::digest(&body).into();
    let put = |known, content_md5| {
        let body = body.clone();
        let store = &store;
        let b = &b;
        async move {
            store
                .put_object(
                    b,
                    "k",
                    &mut Known(Some(body), known),
                    PutObject {
                        content_md5,
                        ..Default::default()
                    },
                )
                .await
        }
    };
    let info = put(md5, Some(md5)).await.unwrap();
    assert_eq!(info.etag, hex::encode(md5));
    let mut r = store.read_object(&info, 0, info.size).unwrap();
    let mut got = Vec::new();
    while let Some(p) = r.next().await.unwrap() {
        got.extend_from_slice(&p);
    }
    assert_eq!(got, body);
    // Taken as given, not computed: the caller vouches for it (here a wrong one shows).
    let other = [1u8; 16];
    assert_eq!(put(other, None).await.unwrap().etag, hex::encode(other));
    // And the Content-MD5 is checked against it.
    assert!(matches!(
        put(other, Some(md5)).await,
        Err(StoreError::BadDigest(Digest::ContentMd5))
    ));
}
