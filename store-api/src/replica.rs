//! What only a cluster node asks of its own store: writes whose version the chain chose, and
//! the uploads and parts a node copies when it joins a placement group.

use crate::types::{Deleted, NewUpload, Part, VersionAs};
use crate::{Bucket, ObjectRead, ObjectStore, Store, StoreResult};

/// A store that can be a replica in a chain: besides the data plane, it takes versions chosen
/// by the chain's head (see [`VersionAs`]) and hands out what a joining member copies.
/// `LocalStore` implements it; a gateway's `ClusterStore` does not.
#[async_trait::async_trait]
pub trait ReplicaStore: Store + ObjectStore {
    /// Adds a delete marker with the version the caller chose (see [`VersionAs`]) and
    /// modification time: the key's latest version if it is above every version the key has
    /// (the current object is kept in its history, or dropped if it is the null one and
    /// `version.null`), else only kept in its history.
    async fn put_delete_marker(
        &self,
        bucket: &Bucket,
        key: &str,
        version: VersionAs,
        last_modified_ms: i64,
    ) -> StoreResult<Deleted>;
    /// What [`ObjectStore::create_upload`] needs to make this upload again in another store,
    /// under the same id, with every attribute it was begun with (a cluster node copying
    /// the uploads in progress of a PG it joins); `None` if there is no such upload.
    async fn upload_to_copy(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
    ) -> StoreResult<Option<NewUpload>>;
    /// A stored part's size and bytes (checked as an object's are as they are read); `None`
    /// if the upload has no such part.
    async fn read_part(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
    ) -> StoreResult<Option<(Part, Box<dyn ObjectRead>)>>;
}
