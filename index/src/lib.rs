//! packrat-index: the metadata of a packrat node in RocksDB.
//!
//! Owns the column families `buckets`, `objects`, `uploads`, `parts`, `keys` and `meta`, the
//! encoding of their keys and values ([`records`]), and ordered listing. Main types:
//! [`RocksIndex`], [`BucketRecord`], [`ObjectRecord`], [`UploadRecord`], [`PartRecord`],
//! [`KeyRecord`].
//!
//! Every mutation is written with `sync = true`: when a call returns, the change is in the
//! RocksDB write-ahead log on disk. RocksDB groups concurrent synced writers into one WAL
//! fsync, which is the index half of packrat's group commit.
//!
//! It stores chunk locations but never reads object bytes, and it must never depend on the
//! chunk store, the gateway or HTTP types.

mod cache;
pub mod records;

pub use records::{
    BucketRecord, ChunkRef, KeyRecord, MemberRecord, ObjectRecord, PartExtent, PartRecord,
    StoredChecksum, TarIndexRecord, UploadRecord,
};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, Direction, IteratorMode, Options,
    ReadOptions, WriteBatch, WriteOptions,
};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

#[derive(Debug, thiserror::Error)]
pub enum IndexError {
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("corrupt index value in {cf}: {reason}")]
    Corrupt { cf: &'static str, reason: String },
    #[error("bucket already exists")]
    BucketExists,
    #[error("no such bucket")]
    NoSuchBucket,
    #[error("bucket is not empty")]
    BucketNotEmpty,
    #[error("injected index write failure (fault injection)")]
    Injected,
}

pub type Result<T> = std::result::Result<T, IndexError>;

const CF_BUCKETS: &str = "buckets";
const CF_OBJECTS: &str = "objects";
const CF_UPLOADS: &str = "uploads";
const CF_PARTS: &str = "parts";
const CF_KEYS: &str = "keys";
const CF_META: &str = "meta";
const CF_MEMBERS: &str = "members";
const META_NEXT_BUCKET_ID: &[u8] = b"next_bucket_id";

/// Block cache shared by all column families, sized for point lookups of hot objects.
const BLOCK_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// Decoded object records kept for point lookups (a few hundred bytes each for small objects).
const OBJECT_CACHE_ENTRIES: usize = 256 * 1024;

pub struct RocksIndex {
    db: DB,
    /// Fault injection for tests: when set, every write fails before reaching RocksDB.
    pub fail_writes: std::sync::atomic::AtomicBool,
    /// Serialises bucket creation and deletion (name uniqueness, id allocation, emptiness).
    bucket_lock: Mutex<()>,
    /// Decoded object records of recent point lookups (see `cache.rs` for why it is coherent).
    objects: cache::ObjectCache,
}

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

/// One page of a multipart-upload listing.
#[derive(Debug, Default)]
pub struct UploadPage {
    pub uploads: Vec<UploadRecord>,
    pub common_prefixes: Vec<String>,
    pub truncated: bool,
}

/// The identity of an object's bytes (the record id of its first chunk), which keys its TAR
/// member index; none for an empty object.
fn bytes_identity(rec: &ObjectRecord) -> Option<[u8; 16]> {
    (!rec.chunks.is_empty()).then(|| rec.chunk_identity(0).0)
}

fn object_key(bucket_id: u64, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    object_key_into(&mut k, bucket_id, key);
    k
}

/// [`object_key`] into a reused buffer.
fn object_key_into(k: &mut Vec<u8>, bucket_id: u64, key: &str) {
    k.clear();
    k.extend_from_slice(&bucket_id.to_be_bytes());
    k.extend_from_slice(key.as_bytes());
}

fn upload_key(bucket_id: u64, key: &str, upload_id: &str) -> Vec<u8> {
    let mut k = object_key(bucket_id, key);
    k.push(0);
    k.extend_from_slice(upload_id.as_bytes());
    k
}

/// A TAR member's key in `members`: the identity of the TAR's bytes, then the member name.
fn member_key(id: &[u8; 16], name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + name.len());
    k.extend_from_slice(id);
    k.extend_from_slice(name.as_bytes());
    k
}

fn part_key(upload_id: &str, part_number: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(upload_id.len() + 5);
    k.extend_from_slice(upload_id.as_bytes());
    k.push(0);
    k.extend_from_slice(&part_number.to_be_bytes());
    k
}

/// The smallest byte string greater than every string that starts with `prefix`, if any.
fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut p = prefix.to_vec();
    while let Some(last) = p.pop() {
        if last < 0xff {
            p.push(last + 1);
            return Some(p);
        }
    }
    None
}

impl RocksIndex {
    pub fn open(path: &Path) -> Result<Self> {
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_keep_log_file_num(4);
        let cache = Cache::new_lru_cache(BLOCK_CACHE_BYTES);
        let cf = |name: &str, bloom: bool| {
            let mut bb = BlockBasedOptions::default();
            bb.set_block_cache(&cache);
            if bloom {
                bb.set_bloom_filter(10.0, false);
                bb.set_cache_index_and_filter_blocks(true);
                bb.set_pin_l0_filter_and_index_blocks_in_cache(true);
                // Point lookups (GET, HEAD, batch multi-gets) find their key in a data block
                // through a small hash index instead of a binary search of the restart
                // points; range scans are unaffected. Older tables without it still read.
                bb.set_data_block_index_type(rocksdb::DataBlockIndexType::BinaryAndHash);
                bb.set_data_block_hash_ratio(0.75);
            }
            let mut o = Options::default();
            o.set_block_based_table_factory(&bb);
            o.set_compression_type(rocksdb::DBCompressionType::Lz4);
            ColumnFamilyDescriptor::new(name, o)
        };
        let cfs = vec![
            cf(CF_BUCKETS, false),
            cf(CF_OBJECTS, true),
            cf(CF_UPLOADS, false),
            cf(CF_PARTS, false),
            cf(CF_KEYS, false),
            cf(CF_META, false),
            cf(CF_MEMBERS, true),
        ];
        let db = DB::open_cf_descriptors(&db_opts, path, cfs)?;
        Ok(Self {
            db,
            fail_writes: Default::default(),
            bucket_lock: Mutex::new(()),
            objects: cache::ObjectCache::new(OBJECT_CACHE_ENTRIES),
        })
    }

    fn cf(&self, name: &'static str) -> &rocksdb::ColumnFamily {
        // The column families are created at open; a missing one is a programming error.
        self.db
            .cf_handle(name)
            .expect("column family created at open")
    }

    fn write_gate(&self) -> Result<()> {
        if self.fail_writes.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(IndexError::Injected);
        }
        Ok(())
    }

    fn sync_opts() -> WriteOptions {
        let mut w = WriteOptions::default();
        w.set_sync(true);
        w
    }

    fn get_decoded<T: records::Record>(&self, cf: &'static str, key: &[u8]) -> Result<Option<T>> {
        match self.db.get_pinned_cf(self.cf(cf), key)? {
            None => Ok(None),
            Some(v) => records::decode(&v)
                .map(Some)
                .map_err(|reason| IndexError::Corrupt { cf, reason }),
        }
    }

    fn put_encoded<T: records::Record>(
        &self,
        cf: &'static str,
        key: &[u8],
        value: &T,
    ) -> Result<()> {
        self.write_gate()?;
        self.db
            .put_cf_opt(self.cf(cf), key, records::encode(value), &Self::sync_opts())?;
        Ok(())
    }

    // ---- access keys ----

    pub fn put_key(&self, rec: &KeyRecord) -> Result<()> {
        self.put_encoded(CF_KEYS, rec.access_key.as_bytes(), rec)
    }

    pub fn get_key(&self, access_key: &str) -> Result<Option<KeyRecord>> {
        self.get_decoded(CF_KEYS, access_key.as_bytes())
    }

    pub fn delete_key(&self, access_key: &str) -> Result<bool> {
        let existed = self.get_key(access_key)?.is_some();
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

    // ---- buckets ----

    /// Creates a bucket, assigning it a fresh id that is never reused, so objects left behind
    /// by a deleted bucket of the same name can never reappear.
    pub fn create_bucket(
        &self,
        name: &str,
        make: impl FnOnce(u64) -> BucketRecord,
    ) -> Result<BucketRecord> {
        let _g = self.bucket_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(existing) = self.get_bucket(name)? {
            let _ = existing;
            return Err(IndexError::BucketExists);
        }
        let next: u64 = self
            .db
            .get_cf(self.cf(CF_META), META_NEXT_BUCKET_ID)?
            .and_then(|v| v.try_into().ok().map(u64::from_le_bytes))
            .unwrap_or(1);
        let rec = make(next);
        let mut batch = WriteBatch::default();
        batch.put_cf(
            self.cf(CF_META),
            META_NEXT_BUCKET_ID,
            (next + 1).to_le_bytes(),
        );
        batch.put_cf(self.cf(CF_BUCKETS), name, records::encode(&rec));
        self.write_gate()?;
        self.db.write_opt(batch, &Self::sync_opts())?;
        Ok(rec)
    }

    pub fn get_bucket(&self, name: &str) -> Result<Option<BucketRecord>> {
        self.get_decoded(CF_BUCKETS, name.as_bytes())
    }

    pub fn update_bucket(&self, rec: &BucketRecord) -> Result<()> {
        let _g = self.bucket_lock.lock().unwrap_or_else(|p| p.into_inner());
        if self.get_bucket(&rec.name)?.is_none() {
            return Err(IndexError::NoSuchBucket);
        }
        self.put_encoded(CF_BUCKETS, rec.name.as_bytes(), rec)
    }

    pub fn list_buckets(&self) -> Result<Vec<BucketRecord>> {
        let mut out = Vec::new();
        for item in self
            .db
            .iterator_cf(self.cf(CF_BUCKETS), IteratorMode::Start)
        {
            let (_, v) = item?;
            out.push(records::decode(&v).map_err(|reason| IndexError::Corrupt {
                cf: CF_BUCKETS,
                reason,
            })?);
        }
        Ok(out)
    }

    /// Deletes an empty bucket. In-progress multipart uploads count as content, as in S3.
    pub fn delete_bucket(&self, name: &str) -> Result<()> {
        let _g = self.bucket_lock.lock().unwrap_or_else(|p| p.into_inner());
        let rec = self.get_bucket(name)?.ok_or(IndexError::NoSuchBucket)?;
        let prefix = rec.id.to_be_bytes();
        for cf in [CF_OBJECTS, CF_UPLOADS] {
            let mut it = self.db.raw_iterator_cf(self.cf(cf));
            it.seek(prefix);
            if it.valid() && it.key().is_some_and(|k| k.starts_with(&prefix)) {
                return Err(IndexError::BucketNotEmpty);
            }
            it.status()?;
        }
        self.db
            .delete_cf_opt(self.cf(CF_BUCKETS), name, &Self::sync_opts())?;
        Ok(())
    }

    // ---- objects ----

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
            .map(|op| match op {
                ObjectOp::Put {
                    bucket_id,
                    key,
                    record,
                } => (object_key(*bucket_id, key), bytes_identity(record)),
                ObjectOp::Delete { bucket_id, key } => (object_key(*bucket_id, key), None),
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
            }
        }
        self.write_gate()?;
        let written = self.db.write_opt(batch, &Self::sync_opts());
        // Whether or not it went through (a failed batch changes nothing; forget anyway).
        for (k, _) in &changes {
            self.objects.invalidate(k);
        }
        written?;
        Ok(())
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

    /// Visits every object of every bucket in index order (bucket id, key), then every uploaded
    /// part of every multipart upload in progress, all as of one consistent snapshot (so a
    /// CompleteMultipartUpload, which turns parts into an object atomically, is seen entirely
    /// before or entirely after). Objects whose bucket no longer exists are visited too.
    pub fn scan_references(
        &self,
        mut object: impl FnMut(u64, &str, ObjectRecord) -> Result<()>,
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
        self.for_each_decoded(&snapshot, CF_PARTS, |k, rec: PartRecord| {
            let upload = k.split(|&b| b == 0).next().unwrap_or(&[]);
            part(&String::from_utf8_lossy(upload), rec)
        })
    }

    /// Visits every object (see [`scan_references`](Self::scan_references)).
    pub fn for_each_object(
        &self,
        object: impl FnMut(u64, &str, ObjectRecord) -> Result<()>,
    ) -> Result<()> {
        self.scan_references(object, |_, _| Ok(()))
    }

    /// Bucket ids in use (for spotting objects of deleted buckets).
    pub fn bucket_ids(&self) -> Result<std::collections::HashSet<u64>> {
        Ok(self.list_buckets()?.into_iter().map(|b| b.id).collect())
    }

    fn for_each_decoded<T: records::Record>(
        &self,
        snapshot: &rocksdb::Snapshot<'_>,
        cf: &'static str,
        mut f: impl FnMut(&[u8], T) -> Result<()>,
    ) -> Result<()> {
        let mut it = snapshot.raw_iterator_cf(self.cf(cf));
        it.seek_to_first();
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            let rec: T = records::decode(v).map_err(|reason| IndexError::Corrupt { cf, reason })?;
            f(k, rec)?;
            it.next();
        }
        it.status()?;
        Ok(())
    }

    // ---- TAR member indexes ----
    //
    // Keyed by the identity of an object's bytes (its first record id), not by its name: an
    // overwrite gets a new identity, so a stale index is never consulted. Bytes belong to one
    // key only (copies write new records), so when a key's object is overwritten or deleted,
    // the member index of its old bytes is removed in the same write batch.

    /// Adds to `batch` the removal of the member indexes of the objects that `changes` (object
    /// index key, identity of the bytes it will hold, in order) replace or delete, where
    /// there is one. One batched lookup of the current objects, and one filtered lookup per
    /// replaced identity; a range deletion only for an index that exists.
    fn drop_replaced_member_indexes(
        &self,
        batch: &mut WriteBatch,
        changes: &[(Vec<u8>, Option<[u8; 16]>)],
    ) -> Result<()> {
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
        let cf = self.cf(CF_MEMBERS);
        let mut batch = WriteBatch::default();
        for (name, m) in members {
            batch.put_cf(cf, member_key(id, name), records::encode(m));
        }
        batch.put_cf(cf, id, records::encode(summary));
        self.write_gate()?;
        self.db.write_opt(batch, &Self::sync_opts())?;
        Ok(())
    }

    pub fn delete_object(&self, bucket_id: u64, key: &str) -> Result<()> {
        self.apply_object_ops(&[&ObjectOp::Delete {
            bucket_id,
            key: key.to_string(),
        }])
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
        let bucket_prefix = bucket_id.to_be_bytes();
        let full_prefix = object_key(bucket_id, prefix);
        let upper = prefix_successor(&full_prefix).unwrap_or_else(|| {
            let mut u = bucket_prefix.to_vec();
            u.extend_from_slice(&[0xff; 9]);
            u
        });
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

    // ---- multipart uploads ----

    pub fn put_upload(&self, rec: &UploadRecord) -> Result<()> {
        self.put_encoded(
            CF_UPLOADS,
            &upload_key(rec.bucket_id, &rec.key, &rec.upload_id),
            rec,
        )
    }

    pub fn get_upload(
        &self,
        bucket_id: u64,
        key: &str,
        upload_id: &str,
    ) -> Result<Option<UploadRecord>> {
        self.get_decoded(CF_UPLOADS, &upload_key(bucket_id, key, upload_id))
    }

    pub fn put_part(&self, upload_id: &str, rec: &PartRecord) -> Result<()> {
        self.put_encoded(CF_PARTS, &part_key(upload_id, rec.part_number), rec)
    }

    /// Parts of an upload with a number greater than `after`, in order, at most `max`.
    pub fn list_parts(&self, upload_id: &str, after: u32, max: usize) -> Result<Vec<PartRecord>> {
        let mut prefix = upload_id.as_bytes().to_vec();
        prefix.push(0);
        let start = part_key(upload_id, after.saturating_add(1));
        let mut out = Vec::new();
        for item in self.db.iterator_cf(
            self.cf(CF_PARTS),
            IteratorMode::From(&start, Direction::Forward),
        ) {
            let (k, v) = item?;
            if !k.starts_with(&prefix) || out.len() >= max {
                break;
            }
            out.push(records::decode(&v).map_err(|reason| IndexError::Corrupt {
                cf: CF_PARTS,
                reason,
            })?);
        }
        Ok(out)
    }

    fn delete_upload_into(&self, batch: &mut WriteBatch, rec: &UploadRecord) -> Result<()> {
        batch.delete_cf(
            self.cf(CF_UPLOADS),
            upload_key(rec.bucket_id, &rec.key, &rec.upload_id),
        );
        for p in self.list_parts(&rec.upload_id, 0, usize::MAX)? {
            batch.delete_cf(self.cf(CF_PARTS), part_key(&rec.upload_id, p.part_number));
        }
        Ok(())
    }

    pub fn abort_upload(&self, rec: &UploadRecord) -> Result<()> {
        let mut batch = WriteBatch::default();
        self.delete_upload_into(&mut batch, rec)?;
        self.write_gate()?;
        self.db.write_opt(batch, &Self::sync_opts())?;
        Ok(())
    }

    /// Commits a completed multipart upload: the object appears and the upload with its parts
    /// disappears in one atomic, synced write batch.
    pub fn complete_upload(&self, upload: &UploadRecord, object: &ObjectRecord) -> Result<()> {
        let mut batch = WriteBatch::default();
        self.delete_upload_into(&mut batch, upload)?;
        let k = object_key(upload.bucket_id, &upload.key);
        self.drop_replaced_member_indexes(&mut batch, &[(k.clone(), bytes_identity(object))])?;
        batch.put_cf(self.cf(CF_OBJECTS), &k, records::encode(object));
        self.write_gate()?;
        let written = self.db.write_opt(batch, &Self::sync_opts());
        self.objects.invalidate(&k);
        written?;
        Ok(())
    }

    /// Lists in-progress uploads of a bucket ordered by key, then upload id.
    pub fn list_uploads(
        &self,
        bucket_id: u64,
        prefix: &str,
        delimiter: Option<&str>,
        key_marker: Option<&str>,
        upload_id_marker: Option<&str>,
        max: usize,
    ) -> Result<UploadPage> {
        let mut page = UploadPage::default();
        let full_prefix = object_key(bucket_id, prefix);
        let start = match key_marker {
            Some(km) => match upload_id_marker {
                Some(um) => {
                    let mut k = upload_key(bucket_id, km, um);
                    k.push(0);
                    k
                }
                None => {
                    // Everything after all uploads of `km`.
                    let mut k = object_key(bucket_id, km);
                    k.push(1);
                    k
                }
            },
            None => full_prefix.clone(),
        };
        let start = start.max(full_prefix.clone());
        let delimiter = delimiter.filter(|d| !d.is_empty());
        let mut it = self.db.raw_iterator_cf(self.cf(CF_UPLOADS));
        it.seek(&start);
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if !k.starts_with(&full_prefix) {
                break;
            }
            if page.uploads.len() + page.common_prefixes.len() >= max {
                page.truncated = true;
                break;
            }
            let rec: UploadRecord = records::decode(v).map_err(|reason| IndexError::Corrupt {
                cf: CF_UPLOADS,
                reason,
            })?;
            // The upload key has a 0x00 separator after the object key, so a prefix that
            // contains NUL can match bytes past the object key: such an entry is not under it.
            let Some(rest) = rec.key.strip_prefix(prefix) else {
                it.next();
                continue;
            };
            if let Some(d) = delimiter
                && let Some(pos) = rest.find(d)
            {
                let cp = rec.key[..prefix.len() + pos + d.len()].to_string();
                match prefix_successor(&object_key(bucket_id, &cp)) {
                    Some(next) => it.seek(next),
                    None => {
                        page.common_prefixes.push(cp);
                        break;
                    }
                }
                page.common_prefixes.push(cp);
                continue;
            }
            page.uploads.push(rec);
            it.next();
        }
        it.status()?;
        Ok(page)
    }

    /// Approximate figures for metrics and status.
    pub fn property(&self, name: &str) -> Option<u64> {
        self.db
            .property_int_value_cf(self.cf(CF_OBJECTS), name)
            .ok()
            .flatten()
    }

    /// Figures about the object index, for `admin status` and metrics.
    pub fn object_stats(&self) -> IndexStats {
        let p = |n: &str| self.property(n).unwrap_or(0);
        IndexStats {
            objects_estimate: p("rocksdb.estimate-num-keys"),
            sst_bytes: p("rocksdb.total-sst-files-size"),
            memtable_bytes: p("rocksdb.cur-size-all-mem-tables"),
            block_cache_bytes: p("rocksdb.block-cache-usage"),
        }
    }

    // ---- Small named settings (CF `meta`) ----
    //
    // Lifecycle configurations and the catalog of tiered segments live here, under their own
    // key prefixes (`lifecycle/`, `tierseg/`, `tier-next-segment`); the values are the caller's.

    /// Writes (synced) a named value.
    pub fn put_meta(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.write_gate()?;
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
        self.write_gate()?;
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

    /// Flushes the object memtable into SST files and compacts them, so on-disk figures
    /// describe settled data (used by benchmarks; never needed for durability, which the WAL
    /// gives).
    pub fn flush_and_compact_objects(&self) -> Result<()> {
        self.db.flush_cf(self.cf(CF_OBJECTS))?;
        self.db
            .compact_range_cf(self.cf(CF_OBJECTS), None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct IndexStats {
    pub objects_estimate: u64,
    pub sst_bytes: u64,
    pub memtable_bytes: u64,
    pub block_cache_bytes: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The key layouts of ARCHITECTURE.md's column family table, pinned: a change here makes
    /// existing data directories unreadable, so it needs a migration, not a new test value.
    #[test]
    fn key_layouts_are_pinned() {
        let hex = |v: Vec<u8>| v.iter().map(|b| format!("{b:02x}")).collect::<String>();
        // objects: bucket id (u64 BE) ++ key bytes.
        assert_eq!(hex(object_key(0x0102, "a/b")), "0000000000000102612f62");
        // uploads: bucket id ++ key ++ 0x00 ++ upload id.
        assert_eq!(hex(upload_key(7, "k", "U1")), "00000000000000076b005531");
        // parts: upload id ++ 0x00 ++ part number (u32 BE).
        assert_eq!(hex(part_key("U1", 258)), "55310000000102");
        // members: the TAR's byte identity (16 bytes) ++ member name.
        assert_eq!(
            hex(member_key(&[0xab; 16], "x.jpg")),
            "abababababababababababababababab782e6a7067"
        );
        // Keys of one bucket sort together and by key bytes, so a prefix listing is one scan.
        assert!(object_key(1, "zz") < object_key(2, ""));
        assert!(object_key(1, "a") < object_key(1, "a/"));
    }

    fn obj(size: u64) -> ObjectRecord {
        ObjectRecord {
            size,
            etag: format!("{size:032x}"),
            ..Default::default()
        }
    }

    fn idx() -> (tempfile::TempDir, RocksIndex) {
        let d = tempfile::tempdir().unwrap();
        let i = RocksIndex::open(d.path()).unwrap();
        (d, i)
    }

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
        i.complete_upload(&up, &obj(5)).unwrap();
        assert_eq!(size(i.get_object(1, "b").unwrap()), Some(5));
        assert_eq!(sizes(&["b"]), vec![Some(5)]);
        // Same key in another bucket: its own entry.
        assert_eq!(size(i.get_object(2, "b").unwrap()), None);
        // A write that fails changes nothing, and the old record is still what is served.
        i.fail_writes
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(i.put_object(1, "b", &obj(6)).is_err());
        i.fail_writes
            .store(false, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(sizes(&["b"]), vec![Some(5)]);
    }

    #[test]
    fn member_indexes_go_with_the_bytes_they_describe() {
        let (_d, i) = idx();
        let tar = |id: u8| ObjectRecord {
            record_id: [id; 16],
            size: 10,
            chunks: vec![ChunkRef {
                segment_id: 1,
                offset: 0,
                len: 10,
            }],
            ..Default::default()
        };
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
        i.complete_upload(&up, &tar(12)).unwrap();
        assert!(!indexed(11));
    }

    #[test]
    fn bucket_lifecycle() {
        let (_d, i) = idx();
        let b = i
            .create_bucket("a", |id| BucketRecord {
                id,
                name: "a".into(),
                ..Default::default()
            })
            .unwrap();
        assert!(matches!(
            i.create_bucket("a", |id| BucketRecord {
                id,
                ..Default::default()
            }),
            Err(IndexError::BucketExists)
        ));
        i.put_object(b.id, "k", &obj(1)).unwrap();
        assert!(matches!(
            i.delete_bucket("a"),
            Err(IndexError::BucketNotEmpty)
        ));
        i.delete_object(b.id, "k").unwrap();
        i.delete_bucket("a").unwrap();
        let b2 = i
            .create_bucket("a", |id| BucketRecord {
                id,
                name: "a".into(),
                ..Default::default()
            })
            .unwrap();
        assert_ne!(b.id, b2.id, "bucket ids are never reused");
    }

    #[test]
    fn upload_listing_with_nul_in_prefix_does_not_panic() {
        let (_d, i) = idx();
        i.put_upload(&UploadRecord {
            upload_id: "u1".into(),
            bucket_id: 1,
            key: "a".into(),
            ..Default::default()
        })
        .unwrap();
        let page = i.list_uploads(1, "a\0", Some("/"), None, None, 10).unwrap();
        assert!(page.uploads.is_empty());
        let page = i.list_uploads(1, "a", Some("/"), None, None, 10).unwrap();
        assert_eq!(page.uploads.len(), 1);
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
        }
    }
}
