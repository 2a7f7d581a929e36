//! Bucket records in etcd: a bucket as the trait shows it, edits, and the removal of a deleted
//! bucket's record.

use super::*;

impl ClusterStore {
    /// Removes a bucket's etcd record, with the note of its id by which the nodes drop its
    /// local buckets (`Etcd::delete_bucket_record`). A configuration change that lands first
    /// is read again; a record of another bucket under the name (this one deleted and made
    /// again meanwhile) is not touched.
    pub(super) async fn delete_bucket_record(&self, bucket: &Bucket) -> StoreResult<()> {
        let rest = format!("buckets/{}", bucket.name);
        for _ in 0..8 {
            let Some((value, rev)) = self
                .etcd
                .get(&rest)
                .await
                .map_err(StoreError::Unavailable)?
            else {
                return Ok(());
            };
            let record: BucketRecord = serde_json::from_slice(&value)
                .map_err(|e| StoreError::internal("bucket record", e))?;
            if record.id != bucket.id {
                return Ok(());
            }
            let now_ms = (crate::node::now_micros() / 1000) as i64;
            if self
                .etcd
                .delete_bucket_record(&bucket.name, rev, bucket.id, now_ms)
                .await
                .map_err(StoreError::Unavailable)?
            {
                return Ok(());
            }
        }
        Err(StoreError::Unavailable(
            "the bucket's configuration kept changing while it was deleted; retry".into(),
        ))
    }

    pub(super) fn bucket_of(rec: &BucketRecord) -> Bucket {
        Bucket {
            id: rec.id,
            name: rec.name.clone(),
            owner_id: rec.owner_id.clone(),
            owner_name: rec.owner_name.clone(),
            created_ms: rec.created_ms,
            public_read: rec.public_read,
            versioning: match rec.versioning {
                None => Versioning::Unversioned,
                Some(WireVersioning::Enabled) => Versioning::Enabled,
                Some(WireVersioning::Suspended) => Versioning::Suspended,
            },
            object_lock: rec.object_lock.map(|l| l.config()),
        }
    }

    /// Changes a bucket's record in etcd (compare-and-swap, retried on a race); `edit` may
    /// refuse the change, judging the record as it is in etcd.
    pub(super) async fn edit_bucket(
        &self,
        bucket: &Bucket,
        edit: impl Fn(&mut BucketRecord) -> StoreResult<()>,
    ) -> StoreResult<()> {
        let rest = format!("buckets/{}", bucket.name);
        for _ in 0..16 {
            let (value, rev) = self
                .etcd
                .get(&rest)
                .await
                .map_err(StoreError::Unavailable)?
                .ok_or(StoreError::NoSuchBucket)?;
            let mut rec: BucketRecord = serde_json::from_slice(&value)
                .map_err(|e| StoreError::internal("bucket record", e))?;
            if rec.id != bucket.id {
                return Err(StoreError::NoSuchBucket);
            }
            edit(&mut rec)?;
            let value =
                serde_json::to_vec(&rec).map_err(|e| StoreError::internal("bucket record", e))?;
            if self
                .etcd
                .put_if(&rest, rev, value)
                .await
                .map_err(StoreError::Unavailable)?
            {
                self.edit_bucket_cache(|b| {
                    b.insert(rec.name.clone(), rec);
                });
                return Ok(());
            }
        }
        Err(StoreError::Unavailable(
            "the bucket is being changed; retry".into(),
        ))
    }
}
