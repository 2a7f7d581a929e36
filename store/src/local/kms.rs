//! The local store's SSE-KMS keys (its [`KeyProvider`]): records in the index's `meta` column
//! family under `kms/<id>` (see `packrat_secrets::kms`), opened into a ring when the store
//! opens and when a key is made.

use super::*;
use packrat_secrets::kms::{KeyRing, KmsRecord, new_record};
use packrat_store_api::KeyProvider;
use packrat_store_api::kms::{DEFAULT_KEY_NAME, KmsKey, NewKmsKey};

const PREFIX: &[u8] = b"kms/";

/// Every key record in the index.
pub(super) fn records(index: &RocksIndex) -> EngineResult<Vec<KmsRecord>> {
    index
        .scan_meta(PREFIX)?
        .into_iter()
        .map(|(k, v)| {
            serde_json::from_slice(&v).map_err(|e| {
                EngineError(StoreError::internal(
                    "KMS key",
                    format!("{}: {e}", String::from_utf8_lossy(&k)),
                ))
            })
        })
        .collect()
}

/// The ring of `index`'s keys, opened with `master`; a key that does not open is logged.
pub(super) fn ring(index: &RocksIndex, master: &MasterKey) -> KeyRing {
    let ring = KeyRing::default();
    match records(index) {
        Ok(recs) => {
            for bad in ring.replace(master, &recs) {
                tracing::error!("{bad}: its objects cannot be read");
            }
        }
        Err(e) => tracing::error!("reading the KMS keys: {e}"),
    }
    ring
}

impl LocalStore {
    async fn make_kms_key(&self, new: NewKmsKey) -> StoreResult<KmsKey> {
        // One maker at a time, so two requests cannot both take a name (or both make the
        // default key).
        let _one = self.kms_maker.lock().await;
        if new.name == DEFAULT_KEY_NAME
            && let Some(k) = self.kms.get(&format!("alias/{DEFAULT_KEY_NAME}"))
        {
            return Ok(k);
        }
        let taken: Vec<String> = self.kms.list().into_iter().map(|k| k.name).collect();
        let now = self.engine.clock.now_ms();
        let rec = new_record(
            &self.engine.master,
            new,
            taken.iter().map(String::as_str),
            now,
        )
        .map_err(StoreError::Invalid)?;
        let value = serde_json::to_vec(&rec).expect("a KMS record serializes");
        let key = [PREFIX, rec.key.id.as_bytes()].concat();
        self.run(move |e| Ok(e.index.put_meta(&key, &value)?))
            .await?;
        self.kms
            .insert(&self.engine.master, &rec)
            .map_err(|e| StoreError::internal("KMS key", e))?;
        Ok(rec.key)
    }
}

#[async_trait::async_trait]
impl KeyProvider for LocalStore {
    fn kms_key(&self, reference: &str) -> StoreResult<Option<KmsKey>> {
        Ok(self.kms.get(reference))
    }

    async fn list_kms_keys(&self) -> StoreResult<Vec<KmsKey>> {
        Ok(self.kms.list())
    }

    async fn create_kms_key(&self, new: NewKmsKey) -> StoreResult<KmsKey> {
        if new.name == DEFAULT_KEY_NAME {
            return Err(StoreError::Invalid(format!(
                "{DEFAULT_KEY_NAME} is the default key, made on first use"
            )));
        }
        self.make_kms_key(new).await
    }

    async fn default_kms_key(&self) -> StoreResult<KmsKey> {
        if let Some(k) = self.kms.get(&format!("alias/{DEFAULT_KEY_NAME}")) {
            return Ok(k);
        }
        self.make_kms_key(NewKmsKey {
            name: DEFAULT_KEY_NAME.into(),
            users: vec![packrat_store_api::kms::ANY_USER.into()],
        })
        .await
    }

    fn kms_seal(&self, id: &str, plain: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        self.kms.seal(id, plain, context)
    }

    fn kms_open(&self, id: &str, sealed: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        self.kms.open(id, sealed, context)
    }
}
