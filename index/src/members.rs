//! Column family `members`: TAR member indexes.
//!
//! Keyed by the identity of an object's bytes (its first record id), not by its name: an
//! overwrite gets a new identity, so a stale index is never consulted. Bytes belong to one key
//! only (copies write new records), so when a key's object is overwritten or deleted, the
//! member index of its old bytes is removed in the same write batch.

use crate::layout::{member_key, prefix_successor};
use crate::objects::bytes_identity;
use crate::records::{MemberRecord, ObjectRecord, TarIndexRecord};
use crate::{CF_MEMBERS, CF_OBJECTS, IndexError, IndexWrite, Result, RocksIndex, records};
use rocksdb::WriteBatch;
use std::collections::HashMap;

impl RocksIndex {
    /// Adds to `batch` the removal of the member indexes of the objects that `changes` (object
    /// index key, identity of the bytes it will hold, in order) replace or delete, where
    /// there is one. One batched lookup of the current objects, and one filtered lookup per
    /// replaced identity; a range deletion only for an index that exists.
    pub(crate) fn drop_replaced_member_indexes(
        &self,
        batch: &mut WriteBatch,
        changes: &[(Vec<u8>, Option<[u8; 16]>)],
    ) -> Result<()> {
        // No member index was ever stored: none to drop. One stored meanwhile, for bytes this
        // batch replaces, is left behind under an identity nothing names (its key is the
        // bytes' identity, so no other object's lookup finds it), as when the index of an
        // object is built while it is replaced.
        if !self
            .member_indexes
            .load(std::sync::atomic::Ordering::Acquire)
        {
            return Ok(());
        }
        let cf = self.cf(CF_OBJECTS);
        let mut now: HashMap<&[u8], Option<[u8; 16]>> = HashMap::new();
        let current = self
            .db
            .batched_multi_get_cf(cf, changes.iter().map(|(k, _)| k), false);
        let mut replaced = Vec::new();
        for ((k, next), cur) in changes.iter().zip(current) {
            let before = match now.get(k.as_slice()) {
                Some(id) => *id,
                None => match cur? {
                    Some(v) => {
                        let rec: ObjectRecord =
                            records::decode(&v).map_err(|reason| IndexError::Corrupt {
                                cf: CF_OBJECTS,
                                reason,
                            })?;
                        bytes_identity(&rec)
                    }
                    None => None,
                },
            };
            if let Some(id) = before
                && before != *next
            {
                replaced.push(id);
            }
            now.insert(k, *next);
        }
        let members = self.cf(CF_MEMBERS);
        for id in replaced {
            if self.db.get_pinned_cf(members, id)?.is_some()
                && let Some(end) = prefix_successor(&id)
            {
                batch.delete_range_cf(members, id.as_slice(), end.as_slice());
            }
        }
        Ok(())
    }

    /// The TAR index summary of the object whose bytes have identity `id`, if built.
    pub fn get_tar_index(&self, id: &[u8; 16]) -> Result<Option<TarIndexRecord>> {
        self.get_decoded(CF_MEMBERS, id)
    }

    /// One member of an indexed TAR.
    pub fn get_member(&self, id: &[u8; 16], name: &str) -> Result<Option<MemberRecord>> {
        self.get_decoded(CF_MEMBERS, &member_key(id, name))
    }

    /// Stores a TAR's member index and its summary in one synced batch.
    pub fn put_tar_index(
        &self,
        id: &[u8; 16],
        summary: &TarIndexRecord,
        members: &[(String, MemberRecord)],
    ) -> Result<()> {
        self.member_indexes
            .store(true, std::sync::atomic::Ordering::Release);
        let cf = self.cf(CF_MEMBERS);
        let mut batch = WriteBatch::default();
        for (name, m) in members {
            batch.put_cf(cf, member_key(id, name), records::encode(m));
        }
        batch.put_cf(cf, id, records::encode(summary));
        self.write_gate(IndexWrite::Put)?;
        self.db.write_opt(batch, &Self::sync_opts())?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::testing::*;

    /// A TAR's record whose bytes have identity `id`.
    fn tar(id: u8) -> ObjectRecord {
        ObjectRecord {
            record_id: [id; 16],
            size: 10,
            chunks: vec![ChunkRef {
                segment_id: 1,
                offset: 0,
                len: 10,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn member_indexes_go_with_the_bytes_they_describe() {
        let (_d, i) = idx();
        let index = |id: u8| {
            let m = MemberRecord {
                offset: 512,
                size: 3,
            };
            let summary = TarIndexRecord {
                members: 2,
                not_a_tar: None,
            };
            i.put_tar_index(&[id; 16], &summary, &[("a".into(), m), ("b/c".into(), m)])
                .unwrap();
        };
        let indexed = |id: u8| {
            i.get_tar_index(&[id; 16]).unwrap().is_some()
                || i.get_member(&[id; 16], "a").unwrap().is_some()
                || i.get_member(&[id; 16], "b/c").unwrap().is_some()
        };
        i.put_object(1, "shard.tar", &tar(1)).unwrap();
        index(1);
        // Rewriting the record with the same bytes (a metadata edit) keeps the index.
        let mut edited = tar(1);
        edited.tags = vec![("k".into(), "v".into())];
        i.put_object(1, "shard.tar", &edited).unwrap();
        assert!(indexed(1));
        // An overwrite with other bytes drops it; the new bytes' index is separate.
        i.put_object(1, "shard.tar", &tar(2)).unwrap();
        assert!(!indexed(1));
        index(2);
        i.put_object(1, "other", &tar(9)).unwrap();
        index(9);
        // A delete drops it, and only it.
        i.delete_object(1, "shard.tar").unwrap();
        assert!(!indexed(2));
        assert!(indexed(9));
        // Several ops in one batch: the state each op replaces is the one the previous left.
        let put = |key: &str, id: u8| ObjectOp::Put {
            bucket_id: 1,
            key: key.into(),
            record: Box::new(tar(id)),
        };
        i.apply_object_ops(&[&put("other", 9), &put("other", 10), &put("x", 11)])
            .unwrap();
        assert!(!indexed(9));
        // CompleteMultipartUpload replacing an object drops its index too.
        index(11);
        let up = UploadRecord {
            upload_id: "u1".into(),
            bucket_id: 1,
            key: "x".into(),
            ..Default::default()
        };
        i.put_upload(&up).unwrap();
        i.complete_upload(&up, Some(&tar(12)), &[]).unwrap();
        assert!(!indexed(11));
    }

    /// A store with no member index skips the lookups on writes; one that has some, opened
    /// again, still drops them with the bytes they describe.
    #[test]
    fn an_index_opened_again_knows_it_holds_member_indexes() {
        use std::sync::atomic::Ordering;
        let d = tempfile::tempdir().unwrap();
        {
            let i = RocksIndex::open(d.path()).unwrap();
            assert!(
                !i.member_indexes.load(Ordering::Relaxed),
                "a new index holds none"
            );
            i.put_object(1, "t.tar", &tar(1)).unwrap();
            let summary = TarIndexRecord {
                members: 1,
                not_a_tar: None,
            };
            let m = MemberRecord {
                offset: 512,
                size: 3,
            };
            i.put_tar_index(&[1; 16], &summary, &[("a".into(), m)])
                .unwrap();
            assert!(i.member_indexes.load(Ordering::Relaxed));
        }
        let i = RocksIndex::open(d.path()).unwrap();
        assert!(i.member_indexes.load(Ordering::Relaxed), "found at open");
        i.put_object(1, "t.tar", &tar(2)).unwrap();
        assert!(i.get_tar_index(&[1; 16]).unwrap().is_none());
        assert!(i.get_member(&[1; 16], "a").unwrap().is_none());
    }
}
