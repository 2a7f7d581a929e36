//! A cluster's SSE-KMS keys (the gateway's [`KeyProvider`]): records in etcd under
//! `kms/<name>` (see `packrat_secrets::kms`; the name in the key makes it unique across
//! gateways), sealed with the cluster's master key, followed into every gateway's ring.

use super::*;
use packrat_secrets::kms::{KmsRecord, new_record};
use packrat_store_api::KeyProvider;
use packrat_store_api::kms::{ANY_USER, DEFAULT_KEY_NAME, KmsKey, NewKmsKey};

/// Every key record in etcd (one that does not parse is logged and left out).
pub(super) async fn records(etcd: &Etcd) -> Result<Vec<KmsRecord>, String> {
    Ok(etcd
        .list("kms/")
        .await?
        .iter()
        .filter_map(|(k, v)| match serde_json::from_slice(v) {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::error!("KMS key record {k}: {e}");
                None
            }
        })
        .collect())
}

impl ClusterStore {
    /// Reads the key records into the ring (after a change in etcd, or a miss).
    pub(super) async fn reload_kms(&self) -> Result<(), String> {
        let recs = records(&self.etcd).await?;
        for bad in self.kms.replace(&self.master, &recs) {
            tracing::error!("{bad}: its objects cannot be read");
        }
        Ok(())
    }

    /// Makes a key unless its name is taken; `Ok(None)` if another gateway (or an earlier
    /// call) holds the name.
    async fn make_kms_key(&self, new: NewKmsKey) -> StoreResult<Option<KmsKey>> {
        let name = new.name.clone();
        let rec = new_record(&self.master, new, std::iter::empty(), self.clock.now_ms())
            .map_err(StoreError::Invalid)?;
        let value = serde_json::to_vec(&rec).map_err(|e| StoreError::internal("KMS key", e))?;
        let made = self
            .etcd
            .put_if(&format!("kms/{name}"), 0, value)
            .await
            .map_err(StoreError::Unavailable)?;
        if !made {
            return Ok(None);
        }
        self.kms
            .insert(&self.master, &rec)
            .map_err(|e| StoreError::internal("KMS key", e))?;
        Ok(Some(rec.key))
    }
}

#[async_trait::async_trait]
impl KeyProvider for ClusterStore {
    fn kms_key(&self, reference: &str) -> StoreResult<Option<KmsKey>> {
        if let Some(k) = self.kms.get(reference) {
            return Ok(Some(k));
        }
        // Made on another gateway a moment ago, before this one heard of it; a name etcd
        // lately did not have is not asked again at once (see `misses`).
        let miss = format!("kms/{reference}");
        let now = Instant::now();
        if self.misses.fresh(&miss, now) {
            return Ok(None);
        }
        self.blocking(self.reload_kms())
            .map_err(StoreError::Unavailable)?;
        let found = self.kms.get(reference);
        if found.is_none() {
            self.misses.note(&miss, now);
        }
        Ok(found)
    }

    async fn list_kms_keys(&self) -> StoreResult<Vec<KmsKey>> {
        self.reload_kms().await.map_err(StoreError::Unavailable)?;
        Ok(self.kms.list())
    }

    async fn create_kms_key(&self, new: NewKmsKey) -> StoreResult<KmsKey> {
        if new.name == DEFAULT_KEY_NAME {
            return Err(StoreError::Invalid(format!(
                "{DEFAULT_KEY_NAME} is the default key, made on first use"
            )));
        }
        let name = new.name.clone();
        self.make_kms_key(new)
            .await?
            .ok_or_else(|| StoreError::Invalid(format!("a KMS key named {name} exists")))
    }

    async fn default_kms_key(&self) -> StoreResult<KmsKey> {
        let alias = format!("alias/{DEFAULT_KEY_NAME}");
        if let Some(k) = self.kms.get(&alias) {
            return Ok(k);
        }
        let new = NewKmsKey {
            name: DEFAULT_KEY_NAME.into(),
            users: vec![ANY_USER.into()],
        };
        if let Some(k) = self.make_kms_key(new).await? {
            return Ok(k);
        }
        // Another gateway made it first: take its record.
        self.reload_kms().await.map_err(StoreError::Unavailable)?;
        self.kms.get(&alias).ok_or_else(|| {
            StoreError::internal("KMS key", "the default key's record does not open")
        })
    }

    fn kms_seal(&self, id: &str, plain: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        self.kms.seal(id, plain, context)
    }

    fn kms_open(&self, id: &str, sealed: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        if self.kms.get(id).is_none() {
            self.blocking(self.reload_kms())
                .map_err(StoreError::Unavailable)?;
        }
        self.kms.open(id, sealed, context)
    }
}
