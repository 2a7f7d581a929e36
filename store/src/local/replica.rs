//! What a cluster node asks of its local store (its [`ReplicaStore`]).

use super::*;

#[async_trait::async_trait]
impl ReplicaStore for LocalStore {
    async fn put_delete_marker(
        &self,
        bucket: &Bucket,
        key: &str,
        version: VersionAs,
        last_modified_ms: i64,
    ) -> StoreResult<Deleted> {
        let deleted = self
            .engine
            .delete_versioned(
                bucket.id,
                key,
                version.mode(),
                None,
                Some((version.seq, last_modified_ms)),
            )
            .await?;
        Ok(deleted.unwrap_or_default())
    }

    async fn upload_to_copy(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
    ) -> StoreResult<Option<NewUpload>> {
        let rec = match self.engine.upload_record(bucket.id, key, upload_id) {
            Ok(r) => r,
            Err(e) => match StoreError::from(e) {
                StoreError::NoSuchUpload => return Ok(None),
                e => return Err(e),
            },
        };
        // The tags ride in the headers as they were stored (see `create_upload`).
        Ok(Some(NewUpload {
            owner_id: rec.owner_id,
            initiated_ms: rec.initiated_ms,
            attrs: ObjectAttrs {
                last_modified_ms: rec.initiated_ms,
                content_type: rec.content_type,
                headers: rec.headers,
                user_meta: rec.user_meta,
                storage_class: rec.storage_class,
                tags: Vec::new(),
            },
            checksum: rec
                .checksum_algorithm
                .as_deref()
                .and_then(ChecksumAlgorithm::from_name),
            checksum_type: rec.checksum_type,
            upload_id: Some(rec.upload_id),
        }))
    }

    async fn read_part(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
    ) -> StoreResult<Option<(Part, Box<dyn ObjectRead>)>> {
        let upload = match self.existing_upload(bucket, key, upload_id) {
            Ok(u) => u,
            Err(StoreError::NoSuchUpload) => return Ok(None),
            Err(e) => return Err(e),
        };
        let uid = upload.upload_id;
        let after = part_number.saturating_sub(1);
        let found = self
            .run(move |e| Ok(e.index.list_parts(&uid, after, 1)?))
            .await?;
        let Some(p) = found.into_iter().find(|p| p.part_number == part_number) else {
            return Ok(None);
        };
        // A part's chunks carry its own record id with indices from 0, as a single PUT's do,
        // so it reads as an object of those chunks would.
        let rec = ObjectRecord {
            record_id: p.record_id,
            size: p.size,
            etag: p.etag.clone(),
            chunks: p.chunks.clone(),
            ..Default::default()
        };
        let size = p.size;
        let reader = ObjectReader::new(self.engine.clone(), Arc::new(rec), 0, size);
        Ok(Some((part_of(&p), Box::new(reader))))
    }
}
