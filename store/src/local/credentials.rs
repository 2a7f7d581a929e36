//! The local store's keys, console sessions and sealing (its [`Credentials`]).

use super::*;

#[async_trait::async_trait]
impl Credentials for LocalStore {
    fn access_key(&self, access_key: &str) -> StoreResult<Option<Identity>> {
        Ok(self.engine.access_key(access_key)?.map(identity_of))
    }

    async fn list_keys(&self) -> StoreResult<Vec<AccessKey>> {
        let keys = self.run(|e| crate::keys::list(&e.index, &e.master)).await?;
        Ok(keys.into_iter().map(crate::keys::access_key_of).collect())
    }

    async fn create_key(&self, new: NewKey) -> StoreResult<AccessKey> {
        let rec = self
            .run(move |e| crate::keys::create_key(&e.index, &e.master, new, false, &*e.clock))
            .await?;
        self.engine.forget_access_key(&rec.access_key);
        Ok(crate::keys::access_key_of(rec))
    }

    async fn delete_key(&self, access_key: &str) -> StoreResult<Option<AccessKey>> {
        let ak = access_key.to_string();
        let gone = self
            .run(move |e| crate::keys::delete_key(&e.index, &e.master, &ak))
            .await?;
        self.engine.forget_access_key(access_key);
        Ok(gone.map(crate::keys::access_key_of))
    }

    async fn put_session(
        &self,
        token_id: &str,
        access_key: &str,
        ttl: std::time::Duration,
    ) -> StoreResult<()> {
        self.sessions.put(token_id, access_key, ttl);
        Ok(())
    }

    async fn session(&self, token_id: &str) -> StoreResult<Option<String>> {
        Ok(self.sessions.get(token_id))
    }

    async fn end_session(&self, token_id: &str) -> StoreResult<()> {
        self.sessions.end(token_id);
        Ok(())
    }

    fn seal_secret(&self, plain: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        Ok(self.engine.master.seal(plain, context))
    }

    fn open_secret(&self, sealed: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        self.engine
            .master
            .open(sealed, context)
            .map_err(StoreError::Corrupt)
    }
}
