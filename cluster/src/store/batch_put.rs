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
use packrat_store_api::{Bucket, StoreError, StoreResult, Versioning};
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
        // Each key's members in the order given: with versioning enabled each is a version
        // of its key, written one after the other; otherwise the last wins, as in one
        // server's commit (members of different keys go at once, in any order).
        let mut by_key: HashMap<String, Vec<Bytes>> = HashMap::new();
        let mut keys = Vec::new();
        for (key, body) in members {
            let bodies = by_key.entry(key.clone()).or_default();
            if bodies.is_empty() {
                keys.push(key);
            }
            bodies.push(body);
        }
        if bucket.versioning != Versioning::Enabled {
            for bodies in by_key.values_mut() {
                bodies.drain(..bodies.len() - 1);
            }
        }
        let planned: usize = by_key.values().map(Vec::len).sum();
        let writes = keys.into_iter().map(|key| {
            let bodies = by_key.remove(&key).unwrap_or_default();
            let (store, bucket) = (store.clone(), bucket.clone());
            async move {
                let mut results = Vec::with_capacity(bodies.len());
                for body in bodies {
                    let put = WirePut {
                        last_modified_ms: now_ms,
                        ..Default::default()
                    };
                    let r = store.put_bytes(&bucket, &key, body, put).await;
                    let failed = r.is_err();
                    results.push(r);
                    if failed {
                        break;
                    }
                }
                futures_util::stream::iter(results)
            }
        });
        let results: Vec<StoreResult<_>> = futures_util::stream::iter(writes)
            .buffer_unordered(MEMBERS_IN_FLIGHT)
            .flatten()
            .collect()
            .await;
        let written = results.iter().filter(|r| r.is_ok()).count();
        if let Some(Err(e)) = results.into_iter().find(|r| r.is_err()) {
            return Err(match e {
                StoreError::Unavailable(why) => StoreError::Unavailable(format!(
                    "{written} of {planned} members were written before the batch PUT failed: {why}"
                )),
                e => e,
            });
        }
        Ok(count)
    }
}
