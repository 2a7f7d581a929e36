//! Between the index's records and the trait's types.

use super::*;

pub(super) fn bucket_of(r: BucketRecord) -> Bucket {
    Bucket {
        id: r.id,
        name: r.name,
        owner_id: r.owner_id,
        owner_name: r.owner_name,
        created_ms: r.created_ms,
        public_read: r.public_read,
        versioning: versioning_of(r.versioning),
        object_lock: r.object_lock.map(lock_config_of),
    }
}

pub(super) fn identity_of(k: KeyRecord) -> Identity {
    Identity {
        access_key: k.access_key,
        secret_key: k.secret_key,
        name: k.name,
        owner_id: k.owner_id,
        is_root: k.is_root,
    }
}

/// What HEAD and GET show of a record; the record itself rides along as the version. Its
/// version id is shown where S3 shows one (`show_version`: see [`shows_versions`]).
pub(super) fn info_of(rec: Arc<ObjectRecord>, show_version: bool) -> ObjectInfo {
    ObjectInfo {
        version_id: show_version.then(|| rec.version_id()),
        size: rec.size,
        etag: rec.etag.clone(),
        attrs: attrs_of(&rec),
        checksum: rec.checksum.as_ref().map(|c| ObjectChecksum {
            algorithm: c.algorithm.clone(),
            value: c.value.clone(),
            kind: c.kind.clone(),
        }),
        part_sizes: rec.parts.iter().map(|p| p.size).collect(),
        version: ObjectVersion(rec),
    }
}

/// Whether the bucket's objects show version ids: once it has (had) versioning.
pub(super) fn shows_versions(bucket: &Bucket) -> bool {
    bucket.versioning != Versioning::Unversioned
}

/// How a write is versioned: as the version the caller chose (see [`VersionAs`]), else by
/// the bucket's state; the sequence chosen; and whether the answer names its version.
pub(super) fn write_versioning(
    bucket: &Bucket,
    chosen: Option<VersionAs>,
) -> (Versioning, Option<u64>, bool) {
    match chosen {
        Some(v) => (v.mode(), Some(v.seq), true),
        None => (bucket.versioning, None, shows_versions(bucket)),
    }
}

pub(super) fn attrs_of(rec: &ObjectRecord) -> ObjectAttrs {
    ObjectAttrs {
        last_modified_ms: rec.last_modified_ms,
        content_type: rec.content_type.clone(),
        headers: rec.headers.clone(),
        user_meta: rec.user_meta.clone(),
        storage_class: rec.storage_class.clone(),
        tags: rec.tags.clone(),
    }
}

pub(super) fn set_attrs(rec: &mut ObjectRecord, a: ObjectAttrs) {
    rec.last_modified_ms = a.last_modified_ms;
    rec.content_type = a.content_type;
    rec.headers = a.headers;
    rec.user_meta = a.user_meta;
    rec.storage_class = a.storage_class;
    rec.tags = a.tags;
}

/// The index record an [`ObjectInfo`] from this store was made from.
pub(super) fn record_in(info: &ObjectInfo) -> StoreResult<Arc<ObjectRecord>> {
    info.version
        .0
        .clone()
        .downcast::<ObjectRecord>()
        .map_err(|_| StoreError::internal("object version", "not from this store"))
}

/// The record of a freshly written object.
pub(super) fn new_record(w: &Written, attrs: ObjectAttrs) -> ObjectRecord {
    let mut rec = ObjectRecord {
        record_id: w.record_id,
        size: w.size,
        etag: hex::encode(w.md5),
        checksum: w.checksum.as_ref().map(|(alg, bytes, _)| StoredChecksum {
            algorithm: alg.name().to_string(),
            value: B64.encode(bytes),
            kind: "FULL_OBJECT".to_string(),
        }),
        chunks: w.chunks.clone(),
        ..Default::default()
    };
    set_attrs(&mut rec, attrs);
    rec
}

#[async_trait::async_trait]
impl ObjectRead for ObjectReader {
    async fn next(&mut self) -> StoreResult<Option<Bytes>> {
        Ok(ObjectReader::next(self).await?)
    }

    fn is_single_piece(&self) -> bool {
        ObjectReader::is_single_piece(self)
    }
}

pub(super) fn upload_of(u: &UploadRecord) -> Upload {
    Upload {
        upload_id: u.upload_id.clone(),
        key: u.key.clone(),
        owner_id: u.owner_id.clone(),
        initiated_ms: u.initiated_ms,
        storage_class: u.storage_class.clone(),
        checksum: u
            .checksum_algorithm
            .as_deref()
            .and_then(ChecksumAlgorithm::from_name),
        checksum_type: u.checksum_type.clone(),
        envelope: packrat_store_api::sealed::envelope(&u.headers).map(str::to_string),
    }
}

pub(super) fn part_of(p: &PartRecord) -> Part {
    Part {
        part_number: p.part_number,
        etag: p.etag.clone(),
        size: p.size,
        last_modified_ms: p.last_modified_ms,
        checksum: p.checksum.as_ref().map(|c| ObjectChecksum {
            algorithm: c.algorithm.clone(),
            value: c.value.clone(),
            kind: c.kind.clone(),
        }),
    }
}
