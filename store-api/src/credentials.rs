//! Who may use a store: access keys, the web console's sessions, and the sealing of secrets
//! with the store's master key.

use crate::StoreResult;
use crate::admin::{AccessKey, NewKey};
use crate::types::Identity;

/// A store's credentials: the keys requests are signed with, the console's sessions, and
/// sealing under the master key (SSE-S3 data keys). Every gateway of a store sees the same.
#[async_trait::async_trait]
pub trait Credentials: Send + Sync + 'static {
    /// The identity holding an access key, `None` if there is no such key.
    fn access_key(&self, access_key: &str) -> StoreResult<Option<Identity>>;
    /// Every access key.
    async fn list_keys(&self) -> StoreResult<Vec<AccessKey>>;
    /// Creates a key; `Invalid` if the name or a given key breaks the rules or the access key
    /// exists.
    async fn create_key(&self, new: NewKey) -> StoreResult<AccessKey>;
    /// Deletes a key, answering it; `None` if there is none. `Invalid` for the last root key.
    async fn delete_key(&self, access_key: &str) -> StoreResult<Option<AccessKey>>;
    /// Records a web console session of `access_key` under `token_id` (a digest of the
    /// session's token) for `ttl`, where every gateway of the store finds it ([`sessions`]).
    async fn put_session(
        &self,
        token_id: &str,
        access_key: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<()>;
    /// The access key of a live console session, `None` if it ended, expired or never was.
    async fn session(&self, token_id: &str) -> StoreResult<Option<String>>;
    /// Ends a console session (signing out); nothing if there is none.
    async fn end_session(&self, token_id: &str) -> StoreResult<()>;
    /// `plain` (a data key of server-side encryption, SSE-S3) sealed with the store's master
    /// key and bound to `context`; `Invalid` from a store that has no master key to offer.
    fn seal_secret(&self, plain: &[u8], context: &[u8]) -> StoreResult<Vec<u8>>;
    /// What [`Self::seal_secret`] sealed with the same `context`; `Corrupt` if it does not
    /// open (another master key, another context, changed bytes).
    fn open_secret(&self, sealed: &[u8], context: &[u8]) -> StoreResult<Vec<u8>>;
}
