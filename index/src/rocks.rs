//! The RocksDB index: opening (read-write and read-only), column families, synced writes.

use crate::{cache, records};
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

pub(crate) const CF_BUCKETS: &str = "buckets";
pub(crate) const CF_OBJECTS: &str = "objects";
pub(crate) const CF_VERSIONS: &str = "versions";
pub(crate) const CF_UPLOADS: &str = "uploads";
pub(crate) const CF_PARTS: &str = "parts";
pub(crate) const CF_KEYS: &str = "keys";
pub(crate) const CF_META: &str = "meta";
pub(crate) const CF_MEMBERS: &str = "members";
/// Block cache shared by all column families, sized for point lookups of hot objects.
const BLOCK_CACHE_BYTES: usize = 64 * 1024 * 1024;
/// Decoded object records kept for point lookups (a few hundred bytes each for small objects).
const OBJECT_CACHE_ENTRIES: usize = 256 * 1024;

pub struct RocksIndex {
    pub(crate) db: DB,
    /// Asked before every write (fault injection in tests; see [`RocksIndex::set_gate`]).
    pub(crate) gate: std::sync::OnceLock<std::sync::Arc<dyn WriteGate>>,
    /// Serialises bucket creation and deletion (name uniqueness, id allocation, emptiness).
    pub(crate) bucket_lock: Mutex<()>,
    /// Decoded object records of recent point lookups (see `cache.rs` for why it is coherent).
    pub(crate) objects: cache::ObjectCache,
    /// Whether any TAR member index was ever stored here (found at open, set before one is
    /// written): until then a write replaces no member index, and skips looking for one (a
    /// batched read of the keys it replaces, about 6% of a small PUT's instructions).
    pub(crate) member_indexes: std::sync::atomic::AtomicBool,
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
        // A directory written before a column family existed (`versions`) opens without it:
        // nothing is created here, and what reads it treats it as empty.
        let existing = DB::list_cf(&db_opts, path).unwrap_or_default();
        let families = Self::column_families()
            .into_iter()
            .filter(|d| d.name() != CF_VERSIONS || existing.iter().any(|n| n == CF_VERSIONS));
        let db =
            DB::open_cf_descriptors_read_only(&db_opts, path, families, false).map_err(|e| {
                IndexError::NotAvailable(format!("{} is not a packrat index: {e}", path.display()))
            })?;
        Ok(Self::with_db(db))
    }

    pub(crate) fn with_db(db: DB) -> Self {
        let member_indexes = db.cf_handle(crate::CF_MEMBERS).is_some_and(|cf| {
            let mut it = db.raw_iterator_cf(cf);
            it.seek_to_first();
            // An iterator that cannot tell counts as "some": the lookups then run as before.
            it.valid() || it.status().is_err()
        });
        Self {
            db,
            gate: std::sync::OnceLock::new(),
            bucket_lock: Mutex::new(()),
            objects: cache::ObjectCache::new(OBJECT_CACHE_ENTRIES),
            member_indexes: std::sync::atomic::AtomicBool::new(member_indexes),
        }
    }

    pub(crate) fn column_families() -> Vec<ColumnFamilyDescriptor> {
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
            cf(CF_VERSIONS, false),
        ];
        cfs
    }

    pub(crate) fn cf(&self, name: &'static str) -> &rocksdb::ColumnFamily {
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

    pub(crate) fn write_gate(&self, write: IndexWrite) -> Result<()> {
        match self.gate.get() {
            Some(g) => g.check(write).map_err(IndexError::Injected),
            None => Ok(()),
        }
    }

    pub(crate) fn sync_opts() -> WriteOptions {
        let mut w = WriteOptions::default();
        w.set_sync(true);
        w
    }

    pub(crate) fn get_decoded<T: records::Record>(
        &self,
        cf: &'static str,
        key: &[u8],
    ) -> Result<Option<T>> {
        match self.db.get_pinned_cf(self.cf(cf), key)? {
            None => Ok(None),
            Some(v) => records::decode(&v)
                .map(Some)
                .map_err(|reason| IndexError::Corrupt { cf, reason }),
        }
    }

    pub(crate) fn put_encoded<T: records::Record>(
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

    pub(crate) fn for_each_decoded<T: records::Record>(
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
