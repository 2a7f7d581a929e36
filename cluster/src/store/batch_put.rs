//! Batch PUT (TAR extraction) through a cluster gateway: the members are held here as the TAR
//! streams in, and written to their placement groups only at commit, once the whole TAR has
//! parsed and its digests have held, so a bad TAR stores nothing, as on one server. Unlike one
//! server's single group commit, the members of a commit become visible one by one (each is a
//! chain write to its own PG); a chain failing during the commit leaves the members written
//! before it in place, and the answer is an error that says how many.

use super::{CLUSTER_PUT_MAX, ClusterStore};
use crate::wire::WirePut;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use packrat_store_api::batch::BatchWriter;
use packrat_store_api::{Bucket, StoreError, StoreResult};
use std::collections::HashMap;
use std::sync::Arc;

/// Members written at once at commit.
const MEMBERS_IN_FLIGHT: usize = 16;

pub(super) struct ClusterBatchWriter {
    pub(super) store: Arc<ClusterStore>,
    pub(super) bucket: Bucket,
    pub(super) now_ms: i64,
    pub(super) members: Vec<(String, Bytes)>,
    pub(super) current: Option<(String, BytesMut)>,
    pub(super) total: u64,
}

#[async_trait::async_trait]
impl BatchWriter for ClusterBatchWriter {
    fn begin(&mut self, key: String) -> StoreResult<()> {
        if self.current.is_some() {
            return Err(StoreError::internal(
                "batch PUT",
                "an object begun before the last ended",
            ));
        }
        self.current = Some((key, BytesMut::new()));
        Ok(())
    }

    fn write(&mut self, data: &[u8]) -> StoreResult<()> {
        let Some((_, buf)) = self.current.as_mut() else {
            return Err(StoreError::internal("batch PUT", "bytes before any object"));
        };
        self.total += data.len() as u64;
        if self.total > CLUSTER_PUT_MAX {
            return Err(StoreError::Invalid(format!(
                "a batch PUT through a cluster gateway holds at most {CLUSTER_PUT_MAX} bytes of members"
            )));
        }
        buf.extend_from_slice(data);
        Ok(())
    }

    fn end(&mut self) -> StoreResult<u64> {
        let Some((key, buf)) = self.current.take() else {
            return Err(StoreError::internal(
                "batch PUT",
                "an end without an object",
            ));
        };
        let size = buf.len() as u64;
        self.members.push((key, buf.freeze()));
        Ok(size)
    }

    fn count(&self) -> usize {
        self.members.len()
    }

    async fn commit(self: Box<Self>) -> StoreResult<usize> {
        let Self {
            store,
            bucket,
            now_ms,
            members,
            ..
        } = *self;
        let count = members.len();
        // A key named twice: the later member wins, as in one server's commit.
        let last: HashMap<String, usize> = members
            .iter()
            .enumerate()
            .map(|(i, (k, _))| (k.clone(), i))
            .collect();
        let unique: Vec<(String, Bytes)> = members
            .into_iter()
            .enumerate()
            .filter(|(i, (k, _))| last.get(k) == Some(i))
            .map(|(_, m)| m)
            .collect();
        let writes = unique.into_iter().map(|(key, body)| {
            let (store, bucket) = (store.clone(), bucket.clone());
            async move {
                let put = WirePut {
                    last_modified_ms: now_ms,
                    ..Default::default()
                };
                store.put_bytes(&bucket, &key, body, put).await
            }
        });
        let results: Vec<StoreResult<_>> = futures_util::stream::iter(writes)
            .buffer_unordered(MEMBERS_IN_FLIGHT)
            .collect()
            .await;
        let written = results.iter().filter(|r| r.is_ok()).count();
        if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
            return Err(match e {
                StoreError::Unavailable(why) => StoreError::Unavailable(format!(
                    "{written} of {} members were written before the batch PUT failed: {why}",
                    last.len()
                )),
                e => e,
            });
        }
        Ok(count)
    }
}
