//! Column family `keys`: access keys by access key id.

use crate::records::KeyRecord;
use crate::{CF_KEYS, IndexError, IndexWrite, Result, RocksIndex, records};
use rocksdb::IteratorMode;

impl RocksIndex {
    pub fn put_key(&self, rec: &KeyRecord) -> Result<()> {
        self.put_encoded(CF_KEYS, rec.access_key.as_bytes(), rec)
    }

    pub fn get_key(&self, access_key: &str) -> Result<Option<KeyRecord>> {
        self.get_decoded(CF_KEYS, access_key.as_bytes())
    }

    pub fn delete_key(&self, access_key: &str) -> Result<bool> {
        let existed = self.get_key(access_key)?.is_some();
        self.write_gate(IndexWrite::Delete)?;
        self.db
            .delete_cf_opt(self.cf(CF_KEYS), access_key, &Self::sync_opts())?;
        Ok(existed)
    }

    pub fn list_keys(&self) -> Result<Vec<KeyRecord>> {
        let mut out = Vec::new();
        for item in self.db.iterator_cf(self.cf(CF_KEYS), IteratorMode::Start) {
            let (_, v) = item?;
            out.push(records::decode(&v).map_err(|reason| IndexError::Corrupt {
                cf: CF_KEYS,
                reason,
            })?);
        }
        Ok(out)
    }
}
