//! What a listing shows of an index record: an object's summary, a version's.

use packrat_index::ObjectRecord;
use packrat_store_api::lock::LOCK_HEADER;
use packrat_store_api::{ObjectSummary, VersionSummary};

/// A version as a listing shows it (and copies between cluster members compare it).
pub(crate) fn version_summary(key: String, rec: ObjectRecord, is_latest: bool) -> VersionSummary {
    VersionSummary {
        object: summary_of(key, &rec),
        version_id: rec.version_id(),
        is_latest,
        delete_marker: rec.is_delete_marker(),
        lock: rec
            .headers
            .iter()
            .find(|(k, _)| k == LOCK_HEADER)
            .map(|(_, v)| v.clone()),
        acl: rec
            .headers
            .iter()
            .find(|(k, _)| k == packrat_store_api::ACL_HEADER)
            .map(|(_, v)| v.clone()),
        tags: rec.tags,
    }
}

pub(crate) fn summary_of(key: String, o: &ObjectRecord) -> ObjectSummary {
    ObjectSummary {
        key,
        size: packrat_store_api::sealed::shown_size(
            &o.headers,
            o.size,
            o.parts.iter().map(|p| p.size),
        ),
        etag: o.etag.clone(),
        last_modified_ms: o.last_modified_ms,
        checksum: o
            .checksum
            .as_ref()
            .map(|c| (c.algorithm.clone(), c.kind.clone())),
        storage_class: o.storage_class.clone(),
    }
}
