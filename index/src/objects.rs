//! Column family `objects`: object records by bucket id and key; point lookups (through the
//! record cache), batched lookups, group-commit writes, reference scans and ordered listing.

use crate::layout::{object_key, object_key_into, prefix_successor, scan_upper_bound, version_key};
use crate::records::{ObjectRecord, PartRecord};
use crate::{
    CF_OBJECTS, CF_PARTS, CF_VERSIONS, IndexError, IndexWrite, Result, RocksIndex, cache, records,
};
use rocksdb::{ReadOptions, WriteBatch};
use std::sync::Arc;

/// A change to the object index, applied in batches by group commit.
#[derive(Debug, Clone)]
pub enum ObjectOp {
    Put {
        bucket_id: u64,
        key: String,
        record: Box<ObjectRecord>,
    },
    Delete {
        bucket_id: u64,
        key: String,
    },
    /// Stores a noncurrent version or delete marker (under its `version_seq`) in `versions`.
    PutVersion {
        bucket_id: u64,
        key: String,
        record: Box<ObjectRecord>,
    },
    /// Removes one version from `versions`.
    DeleteVersion {
        bucket_id: u64,
        key: String,
        seq: u64,
    },
}

/// One page of an object listing.
#[derive(Debug, Default)]
pub struct ListPage {
    pub objects: Vec<(String, ObjectRecord)>,
    pub common_prefixes: Vec<String>,
    pub truncated: bool,
    /// The last key or common prefix returned; listing resumes strictly after it.
    pub last: Option<String>,
}

/// The identity of an object's bytes (the record id of its first chunk), which keys its TAR
/// member index; none for an empty object.
pub(crate) fn bytes_identity(rec: &ObjectRecord) -> Option<[u8; 16]> {
    (!rec.chunks.is_empty()).then(|| rec.chunk_identity(0).0)
}

impl RocksIndex {
    pub fn get_object(&self, bucket_id: u64, key: &str) -> Result<Option<ObjectRecord>> {
        Ok(self
            .get_object_shared(bucket_id, key)?
            .map(Arc::unwrap_or_clone))
    }

    /// [`get_object`](Self::get_object), shared with the record cache (no copy on a hit).
    pub fn get_object_shared(
        &self,
        bucket_id: u64,
        key: &str,
    ) -> Result<Option<Arc<ObjectRecord>>> {
        let k = object_key(bucket_id, key);
        let epoch = match self.objects.lookup(&k) {
            cache::Lookup::Hit(r) => return Ok(Some(r)),
            cache::Lookup::Miss(epoch) => epoch,
        };
        let Some(rec) = self.get_decoded::<ObjectRecord>(CF_OBJECTS, &k)? else {
            return Ok(None);
        };
        let rec = Arc::new(rec);
        self.objects.insert(&k, epoch, &rec);
        Ok(Some(rec))
    }

    pub fn put_object(&self, bucket_id: u64, key: &str, rec: &ObjectRecord) -> Result<()> {
        self.apply_object_ops(&[&ObjectOp::Put {
            bucket_id,
            key: key.to_string(),
            record: Box::new(rec.clone()),
        }])
    }

    /// Applies many object puts and deletes, in order, in one synced write batch (the index
    /// half of group commit).
    pub fn apply_object_ops(&self, ops: &[&ObjectOp]) -> Result<()> {
        let mut batch = WriteBatch::default();
        let changes: Vec<(Vec<u8>, Option<[u8; 16]>)> = ops
            .iter()
            .filter_map(|op| match op {
                ObjectOp::Put {
                    bucket_id,
                    key,
                    record,
                } => Some((object_key(*bucket_id, key), bytes_identity(record))),
                ObjectOp::Delete { bucket_id, key } => Some((object_key(*bucket_id, key), None)),
                ObjectOp::PutVersion { .. } | ObjectOp::DeleteVersion { .. } => None,
            })
            .collect();
        self.drop_replaced_member_indexes(&mut batch, &changes)?;
        for op in ops {
            match op {
                ObjectOp::Put {
                    bucket_id,
                    key,
                    record,
                } => batch.put_cf(
                    self.cf(CF_OBJECTS),
                    object_key(*bucket_id, key),
                    records::encode(record.as_ref()),
                ),
                ObjectOp::Delete { bucket_id, key } => {
                    batch.delete_cf(self.cf(CF_OBJECTS), object_key(*bucket_id, key))
                }
                history => self.history_into(&mut batch, std::slice::from_ref(*history)),
            }
        }
        let kind = if ops
            .iter()
            .any(|op| matches!(op, ObjectOp::Delete { .. } | ObjectOp::DeleteVersion { .. }))
        {
            IndexWrite::Delete
        } else {
            IndexWrite::Put
        };
        self.write_gate(kind)?;
        let written = self.db.write_opt(batch, &Self::sync_opts());
        // Whether or not it went through (a failed batch changes nothing; forget anyway).
        for (k, _) in &changes {
            self.objects.invalidate(k);
        }
        written?;
        Ok(())
    }

    /// Adds the version ops among `ops` to `batch` (the others are not history: ignored).
    pub(crate) fn history_into(&self, batch: &mut WriteBatch, ops: &[ObjectOp]) {
        for op in ops {
            match op {
                ObjectOp::PutVersion {
                    bucket_id,
                    key,
                    record,
                } => batch.put_cf(
                    self.cf(CF_VERSIONS),
                    version_key(*bucket_id, key, record.version_seq),
                    records::encode(record.as_ref()),
                ),
                ObjectOp::DeleteVersion {
                    bucket_id,
                    key,
                    seq,
                } => batch.delete_cf(self.cf(CF_VERSIONS), version_key(*bucket_id, key, *seq)),
                ObjectOp::Put { .. } | ObjectOp::Delete { .. } => {}
            }
        }
    }

    /// Looks many keys of one bucket up at once: from the record cache, and the rest in one
    /// RocksDB batched multi-get (the lookups share block reads and filter probes). Results
    /// are in the order of `keys`.
    pub fn multi_get_objects(
        &self,
        bucket_id: u64,
        keys: &[&str],
    ) -> Result<Vec<Option<Arc<ObjectRecord>>>> {
        let mut out = vec![None; keys.len()];
        // (position, index key, cache epoch) of each key the cache does not hold.
        let mut missed: Vec<(usize, Vec<u8>, u64)> = Vec::new();
        let mut raw = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            object_key_into(&mut raw, bucket_id, k);
            match self.objects.lookup(&raw) {
                cache::Lookup::Hit(r) => out[i] = Some(r),
                cache::Lookup::Miss(epoch) => missed.push((i, raw.clone(), epoch)),
            }
        }
        if missed.is_empty() {
            return Ok(out);
        }
        let cf = self.cf(CF_OBJECTS);
        let found = self
            .db
            .batched_multi_get_cf(cf, missed.iter().map(|(_, k, _)| k), false);
        for ((i, raw, epoch), r) in missed.iter().zip(found) {
            if let Some(v) = r? {
                let rec: ObjectRecord =
                    records::decode(&v).map_err(|reason| IndexError::Corrupt {
                        cf: CF_OBJECTS,
                        reason,
                    })?;
                let rec = Arc::new(rec);
                self.objects.insert(raw, *epoch, &rec);
                out[*i] = Some(rec);
            }
        }
        Ok(out)
    }

    /// The records of `keys` that the record cache holds; `None` for each key it does not
    /// (absent from the index, or not cached: ask [`multi_get_objects`](Self::multi_get_objects)
    /// for those). Never reads RocksDB, so it is cheap enough to call from an async task: no
    /// hand-off to a blocking thread, whose cache would then hold the records the caller goes
    /// on to read.
    pub fn cached_objects(&self, bucket_id: u64, keys: &[&str]) -> Vec<Option<Arc<ObjectRecord>>> {
        // Every index key in one buffer.
        let mut raw = Vec::with_capacity(keys.iter().map(|k| 8 + k.len()).sum());
        for k in keys {
            raw.extend_from_slice(&bucket_id.to_be_bytes());
            raw.extend_from_slice(k.as_bytes());
        }
        let mut at = 0;
        let refs: Vec<&[u8]> = keys
            .iter()
            .map(|k| {
                let r = &raw[at..at + 8 + k.len()];
                at += r.len();
                r
            })
            .collect();
        self.objects.lookup_all(&refs)
    }

    /// Visits every object of every bucket in index order (bucket id, key), then every
    /// noncurrent version and delete marker of versioned buckets, then every uploaded
    /// part of every multipart upload in progress, all as of one consistent snapshot (so a
    /// CompleteMultipartUpload, which turns parts into an object atomically, is seen entirely
    /// before or entirely after, and an overwrite that moves the old object into `versions`
    /// is never missed). Objects whose bucket no longer exists are visited too.
    pub fn scan_references(
        &self,
        mut object: impl FnMut(u64, &str, ObjectRecord) -> Result<()>,
        mut version: impl FnMut(u64, &str, ObjectRecord) -> Result<()>,
        mut part: impl FnMut(&str, PartRecord) -> Result<()>,
    ) -> Result<()> {
        let snapshot = self.db.snapshot();
        self.for_each_decoded(&snapshot, CF_OBJECTS, |k, rec: ObjectRecord| {
            let Some((bucket_id, key)) = k.split_first_chunk::<8>() else {
                return Err(IndexError::Corrupt {
                    cf: CF_OBJECTS,
                    reason: "object key shorter than its bucket id".into(),
                });
            };
            let bucket_id = u64::from_be_bytes(*bucket_id);
            let key = std::str::from_utf8(key).map_err(|_| IndexError::Corrupt {
                cf: CF_OBJECTS,
                reason: "key is not UTF-8".into(),
            })?;
            object(bucket_id, key, rec)
        })?;
        // Absent only from a read-only open of a directory from before versioning.
        let has_versions = self.db.cf_handle(CF_VERSIONS).is_some();
        has_versions
            .then(|| {
                self.for_each_decoded(&snapshot, CF_VERSIONS, |k, rec: ObjectRecord| {
                    let (bucket_id, key, _) =
                        crate::layout::split_version_key(k).ok_or_else(|| IndexError::Corrupt {
                            cf: CF_VERSIONS,
                            reason: "malformed version key".into(),
                        })?;
                    version(bucket_id, &key, rec)
                })
            })
            .transpose()?;
        self.for_each_decoded(&snapshot, CF_PARTS, |k, rec: PartRecord| {
            let upload = k.split(|&b| b == 0).next().unwrap_or(&[]);
            part(&String::from_utf8_lossy(upload), rec)
        })
    }

    /// Visits every object's current version (see [`scan_references`](Self::scan_references)).
    pub fn for_each_object(
        &self,
        object: impl FnMut(u64, &str, ObjectRecord) -> Result<()>,
    ) -> Result<()> {
        self.scan_references(object, |_, _, _| Ok(()), |_, _| Ok(()))
    }

    /// Visits every object's current version, then every noncurrent version and delete
    /// marker (`noncurrent` true), as [`scan_references`](Self::scan_references) does.
    pub fn for_each_record(
        &self,
        visit: impl FnMut(u64, &str, ObjectRecord, bool) -> Result<()>,
    ) -> Result<()> {
        let visit = std::cell::RefCell::new(visit);
        self.scan_references(
            |bucket_id, key, obj| visit.borrow_mut()(bucket_id, key, obj, false),
            |bucket_id, key, obj| visit.borrow_mut()(bucket_id, key, obj, true),
            |_, _| Ok(()),
        )
    }

    pub fn delete_object(&self, bucket_id: u64, key: &str) -> Result<()> {
        self.apply_object_ops(&[&ObjectOp::Delete {
            bucket_id,
            key: key.to_string(),
        }])
    }

    /// An iterator over the objects of a bucket whose keys start with `prefix`, at the first.
    fn prefix_iter(&self, bucket_id: u64, prefix: &str) -> rocksdb::DBRawIterator<'_> {
        let full_prefix = object_key(bucket_id, prefix);
        let upper = scan_upper_bound(bucket_id, &full_prefix);
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(upper);
        let mut it = self.db.raw_iterator_cf_opt(self.cf(CF_OBJECTS), ro);
        it.seek(&full_prefix);
        it
    }

    /// Visits every key of a bucket that starts with `prefix`, in key order, without decoding
    /// the records (an epoch stream's listing: a million keys, only their names wanted).
    pub fn for_each_key(
        &self,
        bucket_id: u64,
        prefix: &str,
        mut f: impl FnMut(&str),
    ) -> Result<()> {
        let mut it = self.prefix_iter(bucket_id, prefix);
        while let Some(k) = it.key() {
            let key = std::str::from_utf8(&k[8..]).map_err(|_| IndexError::Corrupt {
                cf: CF_OBJECTS,
                reason: "key is not UTF-8".into(),
            })?;
            f(key);
            it.next();
        }
        it.status()?;
        Ok(())
    }

    /// Reads into the record cache the records of the keys at `positions` (indexes into the
    /// keys [`for_each_key`](Self::for_each_key) visits under `prefix`, in the order they will
    /// be read; only as many as fit half the cache, the first ones), in one sequential scan. For an epoch stream, which then looks its samples up by key in a
    /// random order: on a cold cache those would be random RocksDB lookups, about 3 µs each,
    /// where the scan decodes a record for well under one. Only a hint: if keys were added or
    /// removed since the listing, other records are warmed, and the lookups stay correct
    /// (the cache's epochs keep a record older than a write out of it). Records the cache
    /// already holds are not decoded again (a later epoch finds them all there). Returns the
    /// number of records stored.
    pub fn warm_objects(&self, bucket_id: u64, prefix: &str, positions: &[usize]) -> Result<usize> {
        let mut positions = positions[..positions.len().min(self.objects.capacity() / 2)].to_vec();
        if positions.is_empty() {
            return Ok(0);
        }
        positions.sort_unstable();
        positions.dedup();
        // The epochs are taken before the iterator's snapshot (see `insert_scanned`).
        let epochs = self.objects.epochs();
        let mut it = self.prefix_iter(bucket_id, prefix);
        let mut wanted = positions.iter().copied().peekable();
        let mut at = 0usize;
        let mut stored = 0;
        while let (Some(&next), Some(k), Some(v)) = (wanted.peek(), it.key(), it.value()) {
            if at == next && !self.objects.contains(k) {
                let rec: ObjectRecord =
                    records::decode(v).map_err(|reason| IndexError::Corrupt {
                        cf: CF_OBJECTS,
                        reason,
                    })?;
                self.objects.insert_scanned(k, &epochs, &Arc::new(rec));
                stored += 1;
            }
            if at == next {
                wanted.next();
            }
            at += 1;
            it.next();
        }
        it.status()?;
        Ok(stored)
    }

    /// Lists objects of a bucket in key order: keys starting with `prefix`, strictly after
    /// `after`, folding keys that contain `delimiter` after the prefix into common prefixes.
    /// One ordered scan; a run of keys under one common prefix is skipped with a single seek.
    pub fn list_objects(
        &self,
        bucket_id: u64,
        prefix: &str,
        delimiter: Option<&str>,
        after: Option<&str>,
        max_keys: usize,
    ) -> Result<ListPage> {
        let mut page = ListPage::default();
        let full_prefix = object_key(bucket_id, prefix);
        let upper = scan_upper_bound(bucket_id, &full_prefix);
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(upper);
        let mut it = self.db.raw_iterator_cf_opt(self.cf(CF_OBJECTS), ro);
        let start = match after {
            Some(a) if a.as_bytes() >= prefix.as_bytes() => {
                let mut k = object_key(bucket_id, a);
                // The smallest key strictly greater than `a`.
                k.push(0);
                k
            }
            _ => full_prefix.clone(),
        };
        it.seek(&start);
        let delimiter = delimiter.filter(|d| !d.is_empty());
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            let key = std::str::from_utf8(&k[8..]).map_err(|_| IndexError::Corrupt {
                cf: CF_OBJECTS,
                reason: "key is not UTF-8".into(),
            })?;
            if page.objects.len() + page.common_prefixes.len() >= max_keys {
                page.truncated = true;
                break;
            }
            if let Some(d) = delimiter
                && let Some(pos) = key[prefix.len()..].find(d)
            {
                let cp = &key[..prefix.len() + pos + d.len()];
                // A common prefix at or before the resume point was returned on an earlier
                // page; it is skipped, not counted.
                if after.is_none_or(|a| cp > a) {
                    page.common_prefixes.push(cp.to_string());
                    page.last = Some(cp.to_string());
                }
                match prefix_successor(&object_key(bucket_id, cp)) {
                    Some(next) => it.seek(next),
                    None => break,
                }
                continue;
            }
            let rec: ObjectRecord = records::decode(v).map_err(|reason| IndexError::Corrupt {
                cf: CF_OBJECTS,
                reason,
            })?;
            page.last = Some(key.to_string());
            page.objects.push((key.to_string(), rec));
            it.next();
        }
        it.status()?;
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// Point lookups go through the record cache; every kind of object write is seen by the
    /// next lookup, single or batched, and a failed write leaves the old record served.
    #[test]
    fn lookups_see_every_write() {
        let (_d, i) = idx();
        let size = |r: Option<ObjectRecord>| r.map(|r| r.size);
        let sizes = |keys: &[&str]| -> Vec<Option<u64>> {
            let got: Vec<Option<u64>> = i
                .multi_get_objects(1, keys)
                .unwrap()
                .into_iter()
                .map(|r| r.map(|r| r.size))
                .collect();
            // The cache-only lookup agrees with it: every key just looked up and found is
            // answered, with the same record; absent keys are not cached.
            let cached: Vec<Option<u64>> = i
                .cached_objects(1, keys)
                .into_iter()
                .map(|r| r.map(|r| r.size))
                .collect();
            assert_eq!(cached, got);
            got
        };
        i.put_object(1, "a", &obj(1)).unwrap();
        i.put_object(1, "b", &obj(2)).unwrap();
        // Twice each: the second lookup is served from the cache.
        for _ in 0..2 {
            assert_eq!(size(i.get_object(1, "a").unwrap()), Some(1));
            assert_eq!(sizes(&["b", "a", "zz"]), vec![Some(2), Some(1), None]);
        }
        i.put_object(1, "a", &obj(3)).unwrap();
        assert_eq!(sizes(&["a", "b"]), vec![Some(3), Some(2)]);
        assert_eq!(size(i.get_object(1, "a").unwrap()), Some(3));
        i.delete_object(1, "b").unwrap();
        assert_eq!(size(i.get_object(1, "b").unwrap()), None);
        assert_eq!(sizes(&["b"]), vec![None]);
        i.apply_object_ops(&[
            &ObjectOp::Put {
                bucket_id: 1,
                key: "b".into(),
                record: Box::new(obj(4)),
            },
            &ObjectOp::Delete {
                bucket_id: 1,
                key: "a".into(),
            },
        ])
        .unwrap();
        assert_eq!(sizes(&["a", "b"]), vec![None, Some(4)]);
        let up = UploadRecord {
            upload_id: "u1".into(),
            bucket_id: 1,
            key: "b".into(),
            ..Default::default()
        };
        i.put_upload(&up).unwrap();
        i.complete_upload(&up, Some(&obj(5)), &[]).unwrap();
        assert_eq!(size(i.get_object(1, "b").unwrap()), Some(5));
        assert_eq!(sizes(&["b"]), vec![Some(5)]);
        // Same key in another bucket: its own entry.
        assert_eq!(size(i.get_object(2, "b").unwrap()), None);
        // A write that fails changes nothing, and the old record is still what is served.
        struct Refuse(std::sync::atomic::AtomicBool);
        impl WriteGate for Refuse {
            fn check(&self, _: IndexWrite) -> std::result::Result<(), String> {
                match self.0.load(std::sync::atomic::Ordering::Relaxed) {
                    true => Err("refused".into()),
                    false => Ok(()),
                }
            }
        }
        let gate = Arc::new(Refuse(true.into()));
        i.set_gate(gate.clone());
        assert!(i.put_object(1, "b", &obj(6)).is_err());
        gate.0.store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(sizes(&["b"]), vec![Some(5)]);
    }

    /// A warming scan caches exactly the records at the positions asked (repeats and positions
    /// past the listing's end are harmless), and a later write is served over what it cached.
    #[test]
    fn warming_caches_the_positions_asked() {
        let (_d, i) = idx();
        let keys = ["p/a", "p/b", "p/c", "p/d", "q/a"];
        for (n, k) in keys.iter().enumerate() {
            i.put_object(1, k, &obj(n as u64)).unwrap();
        }
        let cached = |i: &RocksIndex| -> Vec<Option<u64>> {
            i.cached_objects(1, &keys)
                .into_iter()
                .map(|r| r.map(|r| r.size))
                .collect()
        };
        assert_eq!(cached(&i), vec![None; 5]);
        assert_eq!(i.warm_objects(1, "p/", &[3, 1, 3, 9]).unwrap(), 2);
        assert_eq!(cached(&i), vec![None, Some(1), None, Some(3), None]);
        // Cached already: nothing decoded again.
        assert_eq!(i.warm_objects(1, "p/", &[1, 3]).unwrap(), 0);
        i.put_object(1, "p/b", &obj(7)).unwrap();
        assert_eq!(i.get_object(1, "p/b").unwrap().map(|r| r.size), Some(7));
        // Another bucket with the same keys is not touched.
        assert_eq!(i.warm_objects(2, "p/", &[0]).unwrap(), 0);
    }

    /// The reference model of a listing: a plain filter over a sorted map.
    fn model_list(
        m: &BTreeMap<String, u64>,
        prefix: &str,
        delim: Option<&str>,
        after: Option<&str>,
    ) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for k in m.keys() {
            if !k.starts_with(prefix) || after.is_some_and(|a| k.as_str() <= a) {
                continue;
            }
            let entry = match delim.and_then(|d| k[prefix.len()..].find(d).map(|p| (p, d))) {
                Some((p, d)) => k[..prefix.len() + p + d.len()].to_string(),
                None => k.clone(),
            };
            if after.is_some_and(|a| entry.as_str() <= a) {
                continue;
            }
            if out.last() != Some(&entry) {
                out.push(entry);
            }
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn listing_matches_model_across_pages(
            keys in proptest::collection::btree_set("[ab/]{0,6}", 0..40),
            prefix in "[ab/]{0,2}",
            use_delim in any::<bool>(),
            page in 1usize..7,
        ) {
            let (_d, i) = idx();
            let mut m = BTreeMap::new();
            for k in &keys {
                i.put_object(3, k, &obj(1)).unwrap();
                m.insert(k.clone(), 1);
            }
            // Another bucket's keys must never leak into the listing.
            i.put_object(4, "a", &obj(1)).unwrap();
            let delim = use_delim.then_some("/");
            let want = model_list(&m, &prefix, delim, None);
            let mut got = Vec::new();
            let mut after: Option<String> = None;
            loop {
                let p = i.list_objects(3, &prefix, delim, after.as_deref(), page).unwrap();
                let mut entries: Vec<String> = p.objects.iter().map(|(k, _)| k.clone()).collect();
                entries.extend(p.common_prefixes.iter().cloned());
                entries.sort();
                got.extend(entries);
                if !p.truncated { break; }
                after = p.last.clone();
            }
            prop_assert_eq!(got, want);
            // The keys-only scan sees the same keys as an undelimited listing.
            let mut scanned = Vec::new();
            i.for_each_key(3, &prefix, |k| scanned.push(k.to_string())).unwrap();
            prop_assert_eq!(scanned, model_list(&m, &prefix, None, None));
        }
    }
}
