//! A cluster's keys, console sessions and sealing (the gateway's [`Credentials`]): kept in etcd,
//! so every gateway sees the same.

use super::*;

#[async_trait::async_trait]
impl Credentials for ClusterStore {
    fn access_key(&self, access_key: &str) -> StoreResult<Option<Identity>> {
        let cached = self
            .keys
            .read()
            .ok()
            .and_then(|k| k.get(access_key).cloned());
        let key = match cached {
            Some(k) => Some(k),
            None => self
                .uncached("keys", access_key)?
                .and_then(|v| serde_json::from_slice::<AccessKey>(&v).ok()),
        };
        Ok(key.map(|k| Identity {
            access_key: k.access_key,
            secret_key: k.secret_key,
            name: k.name,
            owner_id: k.owner_id,
            is_root: k.is_root,
        }))
    }

    async fn list_keys(&self) -> StoreResult<Vec<AccessKey>> {
        let mut keys: Vec<AccessKey> = self
            .etcd
            .list("keys/")
            .await
            .map_err(StoreError::Unavailable)?
            .iter()
            .filter_map(|(_, v)| serde_json::from_slice(v).ok())
            .collect();
        keys.sort_by(|a, b| a.access_key.cmp(&b.access_key));
        Ok(keys)
    }

    async fn create_key(&self, new: NewKey) -> StoreResult<AccessKey> {
        let (access_key, secret_key) = packrat_secrets::key_rules::checked_new_key(&new)
            .map_err(|e| StoreError::Invalid(e.to_string()))?;
        let keys = self.list_keys().await?;
        let owners = keys.iter().map(|k| (k.owner_id.as_str(), k.name.as_str()));
        let owner_id =
            packrat_secrets::key_rules::owner_id_for(&new, owners).map_err(StoreError::Invalid)?;
        let key = AccessKey {
            access_key,
            secret_key,
            name: new.name,
            owner_id,
            is_root: false,
            created_ms: self.clock.now_ms(),
        };
        put_key(&self.etcd, &key).await?;
        Ok(key)
    }

    async fn delete_key(&self, access_key: &str) -> StoreResult<Option<AccessKey>> {
        let keys = self.list_keys().await?;
        let Some(k) = keys.iter().find(|k| k.access_key == access_key).cloned() else {
            return Ok(None);
        };
        if k.is_root && keys.iter().filter(|k| k.is_root).count() == 1 {
            return Err(StoreError::Invalid(
                "the last root key cannot be deleted".into(),
            ));
        }
        self.etcd
            .delete(&format!("keys/{access_key}"))
            .await
            .map_err(StoreError::Unavailable)?;
        if let Ok(mut m) = self.keys.write() {
            m.remove(access_key);
            self.local_edits.fetch_add(1, Ordering::SeqCst);
        }
        Ok(Some(k))
    }

    async fn put_session(
        &self,
        token_id: &str,
        access_key: &str,
        ttl: Duration,
    ) -> StoreResult<()> {
        // Under a lease of its own: etcd drops the session when it runs out.
        self.etcd
            .put_leased(
                &format!("console-sessions/{token_id}"),
                access_key,
                ttl.as_secs().max(1),
            )
            .await
            .map_err(StoreError::Unavailable)
    }

    async fn session(&self, token_id: &str) -> StoreResult<Option<String>> {
        let found = self
            .etcd
            .get(&format!("console-sessions/{token_id}"))
            .await
            .map_err(StoreError::Unavailable)?;
        Ok(found.and_then(|(v, _)| String::from_utf8(v).ok()))
    }

    async fn end_session(&self, token_id: &str) -> StoreResult<()> {
        self.etcd
            .delete(&format!("console-sessions/{token_id}"))
            .await
            .map_err(StoreError::Unavailable)?;
        Ok(())
    }

    fn seal_secret(&self, plain: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        Ok(self.master.seal(plain, context))
    }

    fn open_secret(&self, sealed: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        self.master
            .open(sealed, context)
            .map_err(StoreError::Corrupt)
    }
}
