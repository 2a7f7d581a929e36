//! Column family `keys`: access keys by access key id.

use crate::records::KeyRecord;
use crate::{CF_KEYS, IndexError, IndexWrite, Result, RocksIndex, records};
use rocksdb::{BottommostLevelCompaction, CompactOptions, IteratorMode};

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

    /// Flushes the keys' memtable and rewrites their tables, so replaced records (secrets in
    /// plaintext, once sealed) leave the files. The bottom level is rewritten by force: a plain
    /// manual compaction may only move the tables down, old versions and all.
    pub fn compact_keys(&self) -> Result<()> {
        self.db.flush_cf(self.cf(CF_KEYS))?;
        let mut opts = CompactOptions::default();
        opts.set_bottommost_level_compaction(BottommostLevelCompaction::Force);
        self.db
            .compact_range_cf_opt(self.cf(CF_KEYS), None::<&[u8]>, None::<&[u8]>, &opts);
        Ok(())
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
