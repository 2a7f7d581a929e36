//! packrat-index: the metadata of a packrat node in RocksDB.
//!
//! Owns the column families `buckets`, `objects`, `uploads`, `parts`, `members`, `keys` and
//! `meta`, the
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
//!
//! One module per column family: `buckets`, `objects` (with the record cache, `cache`),
//! `uploads` (and `parts`), `members`, `access_keys` (`keys`) and `meta`; every key layout is
//! in `layout`, pinned by golden bytes; value encodings are in `records`.

mod access_keys;
mod buckets;
mod cache;
mod layout;
mod members;
mod meta;
mod objects;
pub mod records;
mod uploads;

pub use objects::{ListPage, ObjectOp};
pub use records::{
    BucketRecord, ChunkRef, KeyRecord, MemberRecord, ObjectRecord, PartExtent, PartRecord,
    StoredChecksum, TarIndexRecord, UploadRecord,
};
pub use uploads::UploadPage;

use rocksdb::{BlockBasedOptions, Cache, ColumnFamilyDescriptor, DB, Options, WriteOptions};
use std::path::Path;
use std::sync::Mutex;

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
    #[error("index write refused: {0}")]
    Injected(String),
    /// A read-only open found no packrat index at the path, or one in use.
    #[error("{0}")]
    NotAvailable(String),
}

pub type Result<T> = std::result::Result<T, IndexError>;

/// The kind of an index write, for a [`WriteGate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexWrite {
    /// A write that only adds or replaces entries.
    Put,
    /// A write that removes entries (deletes, aborts, completions of uploads).
    Delete,
}

/// Asked before every index write; an error refuses the write (nothing reaches RocksDB).
pub trait WriteGate: Send + Sync {
    fn check(&self, write: IndexWrite) -> std::result::Result<(), String>;
}

const CF_BUCKETS: &str = "buckets";
const CF_OBJECTS: &str = "objects";
const CF_UPLOADS: &str = "uploads";
const CF_PARTS: &str = "parts";
const CF_KEYS: &str = "keys";
const CF_META: &str = "meta";
const CF_MEMBERS: &str = "members";
/// Block cache shared by all column families, sized for point lookups of hot objects.
const BLOCK_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// Decoded object records kept for point lookups (a few hundred bytes each for small objects).
const OBJECT_CACHE_ENTRIES: usize = 256 * 1024;

pub struct RocksIndex {
    db: DB,
    /// Asked before every write (fault injection in tests; see [`RocksIndex::set_gate`]).
    gate: std::sync::OnceLock<std::sync::Arc<dyn WriteGate>>,
    /// Serialises bucket creation and deletion (name uniqueness, id allocation, emptiness).
    bucket_lock: Mutex<()>,
    /// Decoded object records of recent point lookups (see `cache.rs` for why it is coherent).
    objects: cache::ObjectCache,
}

#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
pub struct IndexStats {
    pub objects_estimate: u64,
    pub sst_bytes: u64,
    pub memtable_bytes: u64,
    pub block_cache_bytes: u64,
}

impl RocksIndex {
    pub fn open(path: &Path) -> Result<Self> {
        let mut db_opts = Options::default();
        db_opts.create_if_missing(true);
        db_opts.create_missing_column_families(true);
        db_opts.set_max_background_jobs(2);
        db_opts.set_keep_log_file_num(4);
        let db = DB::open_cf_descriptors(&db_opts, path, Self::column_families())?;
        Ok(Self::with_db(db))
    }

    /// Opens an existing index without writing to it: nothing is created, the write-ahead log
    /// is replayed in memory only, and RocksDB's own info log goes to `log_dir` (outside the
    /// index). Refuses a path with no index, an index without packrat's column families, and
    /// an index a running server holds (its `LOCK` file is locked).
    pub fn open_read_only(path: &Path, log_dir: &Path) -> Result<Self> {
        if !path.join("CURRENT").is_file() {
            return Err(IndexError::NotAvailable(format!(
                "no packrat index at {} (not a packrat data directory, or an empty one)",
                path.display()
            )));
        }
        if lock_held(&path.join("LOCK")) {
            return Err(IndexError::NotAvailable(format!(
                "the index at {} is in use: stop the server first",
                path.display()
            )));
        }
        let mut db_opts = Options::default();
        db_opts.create_if_missing(false);
        db_opts.set_db_log_dir(log_dir);
        let db = DB::open_cf_descriptors_read_only(&db_opts, path, Self::column_families(), false)
            .map_err(|e| {
                IndexError::NotAvailable(format!("{} is not a packrat index: {e}", path.display()))
            })?;
        Ok(Self::with_db(db))
    }

    fn with_db(db: DB) -> Self {
        Self {
            db,
            gate: std::sync::OnceLock::new(),
            bucket_lock: Mutex::new(()),
            objects: cache::ObjectCache::new(OBJECT_CACHE_ENTRIES),
        }
    }

    fn column_families() -> Vec<ColumnFamilyDescriptor> {
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
        cfs
    }

    fn cf(&self, name: &'static str) -> &rocksdb::ColumnFamily {
        // The column families are created at open; a missing one is a programming error.
        self.db
            .cf_handle(name)
            .expect("column family created at open")
    }

    /// Installs the gate every later write asks first (once; later calls are ignored). The
    /// store installs its file-I/O backend's, so that fault rules reach index writes and
    /// deletes too.
    pub fn set_gate(&self, gate: std::sync::Arc<dyn WriteGate>) {
        let _ = self.gate.set(gate);
    }

    fn write_gate(&self, write: IndexWrite) -> Result<()> {
        match self.gate.get() {
            Some(g) => g.check(write).map_err(IndexError::Injected),
            None => Ok(()),
        }
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
        self.write_gate(IndexWrite::Put)?;
        self.db
            .put_cf_opt(self.cf(cf), key, records::encode(value), &Self::sync_opts())?;
        Ok(())
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

/// Whether another process holds RocksDB's lock on `lock` (a POSIX record lock, which RocksDB
/// takes with `fcntl`): asked with `F_GETLK`, which takes no lock itself.
fn lock_held(lock: &Path) -> bool {
    use std::os::fd::AsRawFd;
    let Ok(f) = std::fs::File::open(lock) else {
        return false;
    };
    // SAFETY: `flock` is plain data, zeroed is a valid value; the descriptor is open for the
    // duration of the call.
    unsafe {
        let mut fl: libc::flock = std::mem::zeroed();
        fl.l_type = libc::F_WRLCK as libc::c_short;
        fl.l_whence = libc::SEEK_SET as libc::c_short;
        libc::fcntl(f.as_raw_fd(), libc::F_GETLK, &mut fl) == 0
            && fl.l_type != libc::F_UNLCK as libc::c_short
    }
}

/// Helpers shared by the unit tests of every module.
#[cfg(test)]
mod testing {
    pub(crate) use super::*;

    pub(crate) fn obj(size: u64) -> ObjectRecord {
        ObjectRecord {
            size,
            etag: format!("{size:032x}"),
            ..Default::default()
        }
    }

    pub(crate) fn idx() -> (tempfile::TempDir, RocksIndex) {
        let d = tempfile::tempdir().unwrap();
        let i = RocksIndex::open(d.path()).unwrap();
        (d, i)
    }
}

#[cfg(test)]
mod read_only_tests {
    use super::testing::*;

    fn listing(dir: &Path) -> Vec<(String, u64, std::time::SystemTime)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let m = e.metadata().unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    m.len(),
                    m.modified().unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_read_only_open_sees_unflushed_writes_and_changes_no_file() {
        let d = tempfile::tempdir().unwrap();
        let logs = tempfile::tempdir().unwrap();
        {
            let i = RocksIndex::open(d.path()).unwrap();
            let b = i
                .create_bucket("b", |id| BucketRecord {
                    id,
                    ..Default::default()
                })
                .unwrap();
            // Synced to the write-ahead log only (no flush): what a crash leaves.
            i.put_object(b.id, "k", &obj(7)).unwrap();
        }
        let before = listing(d.path());
        let ro = RocksIndex::open_read_only(d.path(), logs.path()).unwrap();
        let b = ro.get_bucket("b").unwrap().unwrap();
        assert_eq!(ro.get_object(b.id, "k").unwrap().unwrap().size, 7);
        drop(ro);
        assert_eq!(
            listing(d.path()),
            before,
            "a read-only open changed the index directory"
        );
    }

    #[test]
    fn a_read_only_open_refuses_a_directory_without_an_index() {
        let d = tempfile::tempdir().unwrap();
        let logs = tempfile::tempdir().unwrap();
        let err = RocksIndex::open_read_only(d.path(), logs.path())
            .err()
            .unwrap();
        assert!(matches!(err, IndexError::NotAvailable(_)), "{err}");
        assert_eq!(
            std::fs::read_dir(d.path()).unwrap().count(),
            0,
            "it created files"
        );
        // A RocksDB database that is not packrat's (none of its column families).
        let other = tempfile::tempdir().unwrap();
        drop(rocksdb::DB::open_default(other.path()).unwrap());
        let err = RocksIndex::open_read_only(other.path(), logs.path())
            .err()
            .unwrap();
        assert!(
            matches!(err, IndexError::NotAvailable(ref m) if m.contains("not a packrat index")),
            "{err}"
        );
    }
}
