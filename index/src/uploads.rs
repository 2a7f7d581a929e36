//! Column families `uploads` and `parts`: multipart uploads and their parts, and their listing.

use crate::layout::{object_key, part_key, prefix_successor, upload_key};
use crate::objects::{ObjectOp, bytes_identity};
use crate::records::{ObjectRecord, PartRecord, UploadRecord};
use crate::{
    CF_OBJECTS, CF_PARTS, CF_UPLOADS, IndexError, IndexWrite, Result, RocksIndex, records,
};
use rocksdb::{Direction, IteratorMode, WriteBatch};

/// One page of a multipart-upload listing.
#[derive(Debug, Default)]
pub struct UploadPage {
    pub uploads: Vec<UploadRecord>,
    pub common_prefixes: Vec<String>,
    pub truncated: bool,
}

impl RocksIndex {
    pub fn put_upload(&self, rec: &UploadRecord) -> Result<()> {
        self.put_encoded(
            CF_UPLOADS,
            &upload_key(rec.bucket_id, &rec.key, &rec.upload_id),
            rec,
        )
    }

    pub fn get_upload(
        &self,
        bucket_id: u64,
        key: &str,
        upload_id: &str,
    ) -> Result<Option<UploadRecord>> {
        self.get_decoded(CF_UPLOADS, &upload_key(bucket_id, key, upload_id))
    }

    pub fn put_part(&self, upload_id: &str, rec: &PartRecord) -> Result<()> {
        self.put_encoded(CF_PARTS, &part_key(upload_id, rec.part_number), rec)
    }

    /// One part of an upload in progress.
    pub fn get_part(&self, upload_id: &str, part_number: u32) -> Result<Option<PartRecord>> {
        self.get_decoded(CF_PARTS, &part_key(upload_id, part_number))
    }

    /// Rewrites parts of uploads in progress in one synced batch (compaction, which moves
    /// their records; the caller holds the keys' locks and has checked each part is the one
    /// it moved).
    pub fn replace_parts(&self, parts: &[(String, PartRecord)]) -> Result<()> {
        let mut batch = WriteBatch::default();
        for (upload_id, rec) in parts {
            batch.put_cf(
                self.cf(CF_PARTS),
                part_key(upload_id, rec.part_number),
                records::encode(rec),
            );
        }
        self.write_gate(IndexWrite::Put)?;
        self.db.write_opt(batch, &Self::sync_opts())?;
        Ok(())
    }

    /// Visits every upload in progress, in key order, with each of its parts in number
    /// order (each upload's parts as they are when it is reached).
    pub fn for_each_upload_part(
        &self,
        mut visit: impl FnMut(&UploadRecord, PartRecord) -> Result<()>,
    ) -> Result<()> {
        let mut uploads = Vec::new();
        let snapshot = self.db.snapshot();
        self.for_each_decoded(&snapshot, CF_UPLOADS, |_, rec: UploadRecord| {
            uploads.push(rec);
            Ok(())
        })?;
        drop(snapshot);
        for upload in &uploads {
            for part in self.list_parts(&upload.upload_id, 0, usize::MAX)? {
                visit(upload, part)?;
            }
        }
        Ok(())
    }

    /// Parts of an upload with a number greater than `after`, in order, at most `max`.
    pub fn list_parts(&self, upload_id: &str, after: u32, max: usize) -> Result<Vec<PartRecord>> {
        let mut prefix = upload_id.as_bytes().to_vec();
        prefix.push(0);
        let start = part_key(upload_id, after.saturating_add(1));
        let mut out = Vec::new();
        for item in self.db.iterator_cf(
            self.cf(CF_PARTS),
            IteratorMode::From(&start, Direction::Forward),
        ) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) || out.len() >= max {
                break;
            }
            out.push(records::decode(&v).map_err(|reason| IndexError::Corrupt {
                cf: CF_PARTS,
                reason,
            })?);
        }
        Ok(out)
    }

    fn delete_upload_into(&self, batch: &mut WriteBatch, rec: &UploadRecord) -> Result<()> {
        batch.delete_cf(
            self.cf(CF_UPLOADS),
            upload_key(rec.bucket_id, &rec.key, &rec.upload_id),
        );
        for p in self.list_parts(&rec.upload_id, 0, usize::MAX)? {
            batch.delete_cf(self.cf(CF_PARTS), part_key(&rec.upload_id, p.part_number));
        }
        Ok(())
    }

    pub fn abort_upload(&self, rec: &UploadRecord) -> Result<()> {
        let mut batch = WriteBatch::default();
        self.delete_upload_into(&mut batch, rec)?;
        self.write_gate(IndexWrite::Delete)?;
        self.db.write_opt(batch, &Self::sync_opts())?;
        Ok(())
    }

    /// Commits a completed multipart upload: the object appears and the upload with its parts
    /// disappears in one atomic, synced write batch, together with `history` (the
    /// [`ObjectOp::PutVersion`] and [`ObjectOp::DeleteVersion`] ops of a versioned bucket).
    /// `object: None` when the completed version goes to the key's history (a `PutVersion`
    /// in `history`) rather than becoming its current object.
    pub fn complete_upload(
        &self,
        upload: &UploadRecord,
        object: Option<&ObjectRecord>,
        history: &[ObjectOp],
    ) -> Result<()> {
        let mut batch = WriteBatch::default();
        self.delete_upload_into(&mut batch, upload)?;
        self.history_into(&mut batch, history);
        let k = object_key(upload.bucket_id, &upload.key);
        if let Some(object) = object {
            self.drop_replaced_member_indexes(&mut batch, &[(k.clone(), bytes_identity(object))])?;
            batch.put_cf(self.cf(CF_OBJECTS), &k, records::encode(object));
        }
        self.write_gate(IndexWrite::Delete)?;
        let written = self.db.write_opt(batch, &Self::sync_opts());
        self.objects.invalidate(&k);
        written?;
        Ok(())
    }

    /// Lists in-progress uploads of a bucket ordered by key, then upload id.
    pub fn list_uploads(
        &self,
        bucket_id: u64,
        prefix: &str,
        delimiter: Option<&str>,
        key_marker: Option<&str>,
        upload_id_marker: Option<&str>,
        max: usize,
    ) -> Result<UploadPage> {
        let mut page = UploadPage::default();
        let full_prefix = object_key(bucket_id, prefix);
        let start = match key_marker {
            Some(km) => match upload_id_marker {
                Some(um) => {
                    let mut k = upload_key(bucket_id, km, um);
                    k.push(0);
                    k
                }
                None => {
                    // Everything after all uploads of `km`.
                    let mut k = object_key(bucket_id, km);
                    k.push(1);
                    k
                }
            },
            None => full_prefix.clone(),
        };
        let start = start.max(full_prefix.clone());
        let delimiter = delimiter.filter(|d| !d.is_empty());
        let mut it = self.db.raw_iterator_cf(self.cf(CF_UPLOADS));
        it.seek(&start);
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if !k.starts_with(&full_prefix) {
                break;
            }
            if page.uploads.len() + page.common_prefixes.len() >= max {
                page.truncated = true;
                break;
            }
            let rec: UploadRecord = records::decode(v).map_err(|reason| IndexError::Corrupt {
                cf: CF_UPLOADS,
                reason,
            })?;
            // The upload key has a 0x00 separator after the object key, so a prefix that
            // contains NUL can match bytes past the object key: such an entry is not under it.
            let Some(rest) = rec.key.strip_prefix(prefix) else {
                it.next();
                continue;
            };
            if let Some(d) = delimiter
                && let Some(pos) = rest.find(d)
            {
                let cp = rec.key[..prefix.len() + pos + d.len()].to_string();
                match prefix_successor(&object_key(bucket_id, &cp)) {
                    Some(next) => it.seek(next),
                    None => {
                        page.common_prefixes.push(cp);
                        break;
                    }
                }
                page.common_prefixes.push(cp);
                continue;
            }
            page.uploads.push(rec);
            it.next();
        }
        it.status()?;
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    #[test]
    fn upload_listing_with_nul_in_prefix_does_not_panic() {
        let (_d, i) = idx();
        i.put_upload(&UploadRecord {
            upload_id: "u1".into(),
            bucket_id: 1,
            key: "a".into(),
            ..Default::default()
        })
        .unwrap();
        let page = i.list_uploads(1, "a\0", Some("/"), None, None, 10).unwrap();
        assert!(page.uploads.is_empty());
        let page = i.list_uploads(1, "a", Some("/"), None, None, 10).unwrap();
        assert_eq!(page.uploads.len(), 1);
    }
}
