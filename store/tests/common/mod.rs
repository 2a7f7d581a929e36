//! What the store's integration tests share: reading an object whole, a synchronous seal, and
//! the erasure-coded layout they run on.

#![allow(dead_code)] // each test binary uses its own subset

use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::admin::JobStart;
use packrat_store_api::checksum::ChecksumAlgorithm;
use packrat_store_api::{
    Bucket, ByteSource, NewBucket, ObjectStore, ReplicaStore, StoreAdmin, StoreError, StoreResult,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Erasure coding 2+1 across four disks.
pub const EC: (usize, usize) = (2, 1);

pub fn disks(dir: &Path) -> Vec<PathBuf> {
    (0..4).map(|i| dir.join(format!("disk{i}"))).collect()
}

/// `o` on four disks under `dir` with erasure coding [`EC`].
pub fn erasure_coded(o: LocalOptions, dir: &Path) -> LocalOptions {
    LocalOptions {
        disks: disks(dir),
        ec: Some(EC),
        ..o
    }
}

/// A store in `dir` with default options and one bucket `b`, unversioned and unlocked.
pub async fn store_with_bucket(dir: &Path) -> (LocalStore, Bucket) {
    open_with_bucket(LocalOptions::new(dir.to_path_buf())).await
}

/// A store opened with `options` and one bucket `b`, unversioned and unlocked.
pub async fn open_with_bucket(options: LocalOptions) -> (LocalStore, Bucket) {
    let store = LocalStore::open(options).unwrap().store;
    let b = store
        .create_bucket(NewBucket {
            name: "b".into(),
            owner_id: "o".into(),
            owner_name: "o".into(),
            created_ms: 1,
            public_read: false,
            object_lock: false,
        })
        .await
        .unwrap();
    (store, b)
}

/// An object's bytes (`None`: no such object), read whole through the trait.
pub async fn get(
    store: &dyn ReplicaStore,
    b: &Bucket,
    key: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let Some(info) = store.head_object(b, key).await? else {
        return Ok(None);
    };
    let mut r = store.read_object(&info, 0, info.size)?;
    let mut out = Vec::new();
    while let Some(piece) = r.next().await? {
        out.extend_from_slice(&piece);
    }
    Ok(Some(out))
}

/// [`get`], its error told as text naming the key.
pub async fn read_state(
    store: &dyn ReplicaStore,
    b: &Bucket,
    key: &str,
) -> Result<Option<Vec<u8>>, String> {
    get(store, b, key)
        .await
        .map_err(|e| format!("GET {key}: {e}"))
}

/// Runs a job (a scrub, a tier run) to its end; a failed run is an error.
pub async fn run_job(store: &dyn ReplicaStore, job: JobStart) -> Result<(), StoreError> {
    let kind = job.kind();
    let before = store.job_progress(kind)?.finished_runs();
    store.start_job(job)?;
    loop {
        let p = store.job_progress(kind)?;
        if p.finished_runs() > before {
            return match p.error() {
                Some(e) => Err(StoreError::internal("job", e)),
                None => Ok(()),
            };
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Seals what is due and encodes it into shards (a scrub does that first), and waits for it.
pub async fn seal(store: &dyn ReplicaStore) -> Result<(), StoreError> {
    run_job(store, JobStart::Scrub).await
}

/// A body given in one piece, with no trailing checksum.
pub struct Once(pub Option<bytes::Bytes>);

#[async_trait::async_trait]
impl ByteSource for Once {
    async fn next_piece(&mut self) -> StoreResult<Option<bytes::Bytes>> {
        Ok(self.0.take())
    }

    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }
}

/// Compaction run in a loop (threshold 1.0, no grace) until [`Compactor::stop`]: a store's
/// entries change under it in the churn tests.
pub struct Compactor {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl Compactor {
    pub fn start(store: std::sync::Arc<LocalStore>) -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut moved = 0u64;
            while !flag.load(Ordering::Relaxed) {
                let r = store.compact(1.0, Duration::ZERO).await.unwrap();
                moved += r.objects_moved;
                tokio::task::yield_now().await;
            }
            moved
        });
        Compactor { stop, task }
    }

    /// Stops the loop after its current run; answers the entries it moved in all.
    pub async fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

/// The offline verifier over a closed store's data directory: every record every entry
/// references is found and checks.
pub fn verify_offline(dir: &Path) {
    let logs = tempfile::tempdir().unwrap();
    let index = packrat_index::RocksIndex::open_read_only(&dir.join("index"), logs.path()).unwrap();
    let report =
        packrat_store::verify::run(&index, &dir.join("segments"), &[], None, true).unwrap();
    assert!(report.problems.is_empty(), "{:?}", report.problems);
}
