//! packrat-index: the metadata of a packrat node in RocksDB.
//!
//! Owns the column families `buckets`, `objects`, `versions`, `uploads`, `parts`, `members`,
//! `keys` and `meta`, the
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

//!
//! The value encodings (`records`) build without RocksDB (default feature `rocksdb` off), so
//! the fuzz targets decode index records without linking it.

pub mod records;

pub use records::{
    BucketLock, BucketRecord, ChunkRef, KeyRecord, MemberRecord, ObjectRecord, PartExtent,
    PartRecord, StoredChecksum, TarIndexRecord, UploadRecord,
};

#[cfg(feature = "rocksdb")]
mod access_keys;
#[cfg(feature = "rocksdb")]
mod buckets;
#[cfg(feature = "rocksdb")]
mod cache;
#[cfg(feature = "rocksdb")]
mod layout;
#[cfg(feature = "rocksdb")]
mod members;
#[cfg(feature = "rocksdb")]
mod meta;
#[cfg(feature = "rocksdb")]
mod objects;
#[cfg(feature = "rocksdb")]
mod rocks;
#[cfg(feature = "rocksdb")]
mod uploads;
#[cfg(feature = "rocksdb")]
mod versions;

#[cfg(feature = "rocksdb")]
pub use objects::{ListPage, ObjectOp};
#[cfg(feature = "rocksdb")]
use rocks::{
    CF_BUCKETS, CF_KEYS, CF_MEMBERS, CF_META, CF_OBJECTS, CF_PARTS, CF_UPLOADS, CF_VERSIONS,
};
#[cfg(feature = "rocksdb")]
pub use rocks::{IndexError, IndexStats, IndexWrite, Result, RocksIndex, WriteGate};
#[cfg(feature = "rocksdb")]
pub use uploads::UploadPage;
#[cfg(feature = "rocksdb")]
pub use versions::{VersionCursor, VersionListPage};

/// Helpers shared by the unit tests of every module.
#[cfg(all(test, feature = "rocksdb"))]
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

#[cfg(all(test, feature = "rocksdb"))]
mod read_only_tests {
    use super::testing::*;
    use std::path::Path;

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

    /// An index from before versioning has no `versions` column family: a read-only open
    /// (the offline verifier's) reads it all the same, creating nothing.
    #[test]
    fn a_read_only_open_reads_an_index_from_before_versioning() {
        let d = tempfile::tempdir().unwrap();
        let logs = tempfile::tempdir().unwrap();
        {
            let mut opts = rocksdb::Options::default();
            opts.create_if_missing(true);
            opts.create_missing_column_families(true);
            let families = RocksIndex::column_families()
                .into_iter()
                .filter(|f| f.name() != CF_VERSIONS);
            let i = RocksIndex::with_db(
                rocksdb::DB::open_cf_descriptors(&opts, d.path(), families).unwrap(),
            );
            i.put_object(1, "k", &obj(7)).unwrap();
        }
        let ro = RocksIndex::open_read_only(d.path(), logs.path()).unwrap();
        let mut seen = Vec::new();
        ro.scan_references(
            |_, k, r| {
                seen.push((k.to_string(), r.size));
                Ok(())
            },
            |_, _, _| panic!("no versions here"),
            |_, _| Ok(()),
        )
        .unwrap();
        assert_eq!(seen, vec![("k".to_string(), 7)]);
        drop(ro);
        let names = rocksdb::DB::list_cf(&rocksdb::Options::default(), d.path()).unwrap();
        assert!(!names.iter().any(|n| n == CF_VERSIONS), "{names:?}");
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
