//! Column family `meta`: small named values of the node (the bucket id counter, and the
//! store's versioned records: lifecycle configurations, the catalog of tiered segments,
//! buckets' configuration documents and SSE-KMS keys, under their own key prefixes
//! `lifecycle/`, `tierseg/`, `tier-next-segment`, `bucketcfg/`, `kms/`). The values are the
//! caller's.

use crate::{CF_META, IndexWrite, Result, RocksIndex};
use rocksdb::WriteBatch;

impl RocksIndex {
    /// Writes (synced) a named value.
    pub fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write_gate(IndexWrite::Put)?;
        let mut batch = WriteBatch::default();
        batch.put_cf(self.cf(CF_META), key, value);
        self.db.write_opt(batch, &Self::sync_opts())?;
        Ok(())
    }

    pub fn get_meta(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        Ok(self.db.get_cf(self.cf(CF_META), key)?)
    }

    /// Removes (synced) a named value; removing a missing one is not an error.
    pub fn delete_meta(&self, key: &[u8]) -> Result<()> {
        self.write_gate(IndexWrite::Delete)?;
        let mut batch = WriteBatch::default();
        batch.delete_cf(self.cf(CF_META), key);
        self.db.write_opt(batch, &Self::sync_opts())?;
        Ok(())
    }

    /// Every named value whose key starts with `prefix`, in key order.
    pub fn scan_meta(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut out = Vec::new();
        let mut it = self.db.raw_iterator_cf(self.cf(CF_META));
        it.seek(prefix);
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if !k.starts_with(prefix) {
                break;
            }
            out.push((k.to_vec(), v.to_vec()));
            it.next();
        }
        it.status()?;
        Ok(out)
    }
}
