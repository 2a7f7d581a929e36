//! What a node keeps of a cluster bucket that was deleted: its local buckets (`o-<id>`, the
//! objects and their history and uploads; `t-<id>`, the tombstones) are emptied and removed.
//! A bucket is deleted only when it holds nothing, so on the nodes that were up this drops
//! empty local buckets and tombstones; a node that was away meanwhile still holds the objects
//! deleted while it was gone, which a resync (over the buckets that exist) never reaches.
//!
//! Only buckets named deleted in etcd (`map::DELETED_BUCKETS`, written with the removal of
//! the bucket's record) are dropped, never one merely missing from a listing, and only once
//! the delete is older than `--tombstone-keep`: writes a gateway sent before it saw the
//! delete have landed by then (a gateway's bucket cache lasts a second).
//!
//! Then the node marks the bucket dropped in etcd (`map::DROPPED_BUCKETS`), and once every
//! registered node has, the note and its marks go: a node away keeps the note until it is
//! back and has dropped its copies (or is removed with `packrat cluster remove-node`).

use super::{Node, now_micros, with_versions};
use crate::map::Etcd;
use packrat_store_api::lock::LockCheck;
use packrat_store_api::{Bucket, ListQuery, StoreResult, UploadQuery, VersionQuery};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// The cluster bucket a local bucket belongs to (`o-<id>` or `t-<id>`).
fn cluster_bucket_of(local: &str) -> Option<u64> {
    let id = local
        .strip_prefix("o-")
        .or_else(|| local.strip_prefix("t-"))?;
    id.parse().ok()
}

impl Node {
    /// Drops the local buckets of deleted cluster buckets as often as tombstones are
    /// collected, for the node's life.
    pub async fn drop_deleted_buckets(self: Arc<Self>, etcd: Etcd) {
        let every = self
            .tombstone_keep
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
        loop {
            tokio::time::sleep(every).await;
            match self.drop_deleted_buckets_once(&etcd).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(local_buckets = n, "dropped what deleted buckets left"),
                Err(e) => tracing::warn!("dropping deleted buckets: {e}"),
            }
        }
    }

    /// One pass; answers how many local buckets it dropped.
    pub(super) async fn drop_deleted_buckets_once(&self, etcd: &Etcd) -> StoreResult<usize> {
        let cutoff = (now_micros() / 1000) as i64 - self.tombstone_keep.as_millis() as i64;
        let gone: HashSet<u64> = etcd
            .deleted_buckets()
            .await
            .map_err(packrat_store_api::StoreError::Unavailable)?
            .into_iter()
            .filter(|(_, at)| *at < cutoff)
            .map(|(id, _)| id)
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        let mut dropped = 0;
        for local in self.store.list_buckets().await? {
            if !cluster_bucket_of(&local.name).is_some_and(|id| gone.contains(&id)) {
                continue;
            }
            if let Ok(mut cached) = self.buckets.lock() {
                cached.remove(&local.name);
                cached.remove(&format!("{}+v", local.name));
            }
            self.empty(&local).await?;
            self.store.delete_bucket(&local).await?;
            self.buckets_dropped.fetch_add(1, Ordering::Relaxed);
            dropped += 1;
        }
        self.forget_dropped(etcd, &gone).await?;
        Ok(dropped)
    }

    /// Marks the deleted buckets `gone` dropped here (this node holds nothing of them now),
    /// and forgets those every registered node has marked.
    async fn forget_dropped(&self, etcd: &Etcd, gone: &HashSet<u64>) -> StoreResult<()> {
        let unavailable = packrat_store_api::StoreError::Unavailable;
        // Every registered node, those away too: each drops its own copies.
        let members = etcd.registered_nodes().await.map_err(unavailable)?;
        let mut marks = etcd.dropped_buckets().await.map_err(unavailable)?;
        for id in gone {
            let marked = marks.entry(*id).or_default();
            if !marked.contains(&self.id) {
                etcd.mark_bucket_dropped(*id, &self.id)
                    .await
                    .map_err(unavailable)?;
                marked.insert(self.id.clone());
            }
            if members.iter().all(|n| marked.contains(&n.id)) {
                etcd.forget_deleted_bucket(*id).await.map_err(unavailable)?;
                tracing::info!(
                    bucket = id,
                    "every node dropped the deleted bucket: note removed"
                );
            }
        }
        Ok(())
    }

    /// Removes everything a local bucket holds: its current objects, the history its keys
    /// kept, its uploads in progress.
    async fn empty(&self, local: &Bucket) -> StoreResult<()> {
        let mut query = ListQuery {
            max_keys: 1000,
            ..Default::default()
        };
        loop {
            let page = self.store.list_objects(local, &query).await?;
            for o in &page.objects {
                self.store.delete_object(local, &o.key).await?;
            }
            if !page.truncated || page.objects.is_empty() {
                break;
            }
            query.after = page.objects.last().map(|o| o.key.clone());
        }
        // A deleted bucket held no versions; a node away then may still, and none is kept
        // for a bucket that is gone, whatever its lock said.
        let history = with_versions(local);
        let mut query = VersionQuery {
            max_keys: 1000,
            ..Default::default()
        };
        loop {
            let page = self.store.list_versions(&history, &query).await?;
            for v in &page.versions {
                self.store
                    .delete_version(&history, &v.object.key, &v.version_id, LockCheck::Decided)
                    .await?;
            }
            if !page.truncated || page.versions.is_empty() {
                break;
            }
            query.key_marker = page.next_key_marker;
            query.version_id_marker = page.next_version_id_marker;
        }
        let mut query = UploadQuery {
            max_uploads: 1000,
            ..Default::default()
        };
        loop {
            let page = self.store.list_uploads(local, &query).await?;
            for u in &page.uploads {
                self.store.abort_upload(local, &u.key, &u.upload_id).await?;
            }
            let Some(last) = page.uploads.last().filter(|_| page.truncated) else {
                break;
            };
            query.key_marker = Some(last.key.clone());
            query.upload_id_marker = Some(last.upload_id.clone());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::cluster_bucket_of;

    #[test]
    fn only_local_buckets_of_cluster_buckets_are_named() {
        assert_eq!(cluster_bucket_of("o-17"), Some(17));
        assert_eq!(cluster_bucket_of("t-17"), Some(17));
        assert_eq!(cluster_bucket_of("o-17+v"), None);
        assert_eq!(cluster_bucket_of("datasets"), None);
        assert_eq!(cluster_bucket_of("x-17"), None);
    }
}
