//! Column family `buckets`: bucket records by name, and bucket id allocation (in `meta`).

use crate::records::BucketRecord;
use crate::{
    CF_BUCKETS, CF_META, CF_OBJECTS, CF_UPLOADS, CF_VERSIONS, IndexError, IndexWrite, Result,
    RocksIndex, records,
};
use rocksdb::{IteratorMode, WriteBatch};

const META_NEXT_BUCKET_ID: &[u8] = b"next_bucket_id";

impl RocksIndex {
    /// Creates a bucket, assigning it a fresh id that is never reused, so objects left behind
    /// by a deleted bucket of the same name can never reappear.
    pub fn create_bucket(
        &self,
        name: &str,
        make: impl FnOnce(u64) -> BucketRecord,
    ) -> Result<BucketRecord> {
        let _g = self.bucket_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = self.get_bucket(name)? {
            let _ = existing;
            return Err(IndexError::BucketExists);
        }
        let next: u64 = self
            .db
            .get_cf(self.cf(CF_META), META_NEXT_BUCKET_ID)?
            .and_then(|v| v.try_into().ok().map(u64::from_le_bytes))
            .unwrap_or(1);
        let rec = make(next);
        let mut batch = WriteBatch::default();
        batch.put_cf(
            self.cf(CF_META),
            META_NEXT_BUCKET_ID,
            (next + 1).to_le_bytes(),
        );
        batch.put_cf(self.cf(CF_BUCKETS), name, records::encode(&rec));
        self.write_gate(IndexWrite::Put)?;
        self.db.write_opt(batch, &Self::sync_opts())?;
        Ok(rec)
    }

    pub fn get_bucket(&self, name: &str) -> Result<Option<BucketRecord>> {
        self.get_decoded(CF_BUCKETS, name.as_bytes())
    }

    pub fn update_bucket(&self, rec: &BucketRecord) -> Result<()> {
        let _g = self.bucket_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.get_bucket(&rec.name)?.is_none() {
            return Err(IndexError::NoSuchBucket);
        }
        self.put_encoded(CF_BUCKETS, rec.name.as_bytes(), rec)
    }

    /// Changes a bucket's record under the bucket lock, so edits of different fields never
    /// undo each other. `edit` may refuse (`Err`): nothing is written and its error is
    /// answered in `Ok(Err(..))`.
    pub fn edit_bucket<E>(
        &self,
        name: &str,
        edit: impl FnOnce(&mut BucketRecord) -> std::result::Result<(), E>,
    ) -> Result<std::result::Result<BucketRecord, E>> {
        let _g = self.bucket_lock.lock().unwrap_or_else(|p| p.into_inner());
        let mut rec = self.get_bucket(name)?.ok_or(IndexError::NoSuchBucket)?;
        if let Err(e) = edit(&mut rec) {
            return Ok(Err(e));
        }
        self.put_encoded(CF_BUCKETS, rec.name.as_bytes(), &rec)?;
        Ok(Ok(rec))
    }

    pub fn list_buckets(&self) -> Result<Vec<BucketRecord>> {
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf(self.cf(CF_BUCKETS), IteratorMode::Start)
        {
            let (_, v) = item?;
            out.push(records::decode(&v).map_err(|reason| IndexError::Corrupt {
                cf: CF_BUCKETS,
                reason,
            })?);
        }
        Ok(out)
    }

    /// Whether bucket `id` holds an object or a version (a delete marker too).
    pub fn bucket_holds_objects(&self, id: u64) -> Result<bool> {
        self.bucket_holds(id, &[CF_OBJECTS, CF_VERSIONS])
    }

    fn bucket_holds(&self, id: u64, cfs: &[&'static str]) -> Result<bool> {
        let prefix = id.to_be_bytes();
        for cf in cfs {
            let mut it = self.db.raw_iterator_cf(self.cf(cf));
            it.seek(prefix);
            if it.valid() && it.key().is_some_and(|k| k.starts_with(&prefix)) {
                return Ok(true);
            }
            it.status()?;
        }
        Ok(false)
    }

    /// Deletes an empty bucket. Noncurrent versions (delete markers too) and in-progress
    /// multipart uploads count as content here: the store aborts a bucket's uploads first
    /// (as S3 does), and an upload begun meanwhile keeps the bucket.
    pub fn delete_bucket(&self, name: &str) -> Result<()> {
        let _g = self.bucket_lock.lock().unwrap_or_else(|p| p.into_inner());
        let rec = self.get_bucket(name)?.ok_or(IndexError::NoSuchBucket)?;
        if self.bucket_holds(rec.id, &[CF_OBJECTS, CF_VERSIONS, CF_UPLOADS])? {
            return Err(IndexError::BucketNotEmpty);
        }
        self.write_gate(IndexWrite::Delete)?;
        self.db
            .delete_cf_opt(self.cf(CF_BUCKETS), name, &Self::sync_opts())?;
        Ok(())
    }

    /// Bucket ids in use (for spotting objects of deleted buckets).
    pub fn bucket_ids(&self) -> Result<std::collections::HashSet<u64>> {
        Ok(self.list_buckets()?.into_iter().map(|b| b.id).collect())
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    #[test]
    fn bucket_lifecycle() {
        let (_d, i) = idx();
        let b = i
            .create_bucket("a", |id| BucketRecord {
                id,
                name: "a".into(),
                ..Default::default()
            })
            .unwrap();
        assert!(matches!(
            i.create_bucket("a", |id| BucketRecord {
                id,
                ..Default::default()
            }),
            Err(IndexError::BucketExists)
        ));
        i.put_object(b.id, "k", &obj(1)).unwrap();
        assert!(matches!(
            i.delete_bucket("a"),
            Err(IndexError::BucketNotEmpty)
        ));
        i.delete_object(b.id, "k").unwrap();
        i.delete_bucket("a").unwrap();
        let b2 = i
            .create_bucket("a", |id| BucketRecord {
                id,
                name: "a".into(),
                ..Default::default()
            })
            .unwrap();
        assert_ne!(b.id, b2.id, "bucket ids are never reused");
    }
}
