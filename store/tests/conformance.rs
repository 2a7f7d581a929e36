//! The store conformance suite (`packrat_store_api::conformance`) against `LocalStore`: one
//! node's engine on a fresh data directory per test, opened as `packrat serve` opens it
//! (`LocalStore::open`: one disk, no erasure coding, no tiers, no background jobs).

use packrat_chunk_store::IoBackend;
use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::ObjectStore;
use std::sync::Arc;
use std::time::Duration;

async fn local_store() -> Arc<dyn ObjectStore> {
    // The directory lives as long as the test process; each test gets its own.
    let dir = tempfile::tempdir().unwrap().keep();
    let opened = LocalStore::open(LocalOptions {
        data_dir: dir,
        root: None,
        disks: Vec::new(),
        ec: None,
        // Small segments, so the checks also cross segment rotations.
        segment_bytes_max: 4 * 1024 * 1024,
        io_backend: IoBackend::Auto,
        tiers: Vec::new(),
        tier_cache_bytes: 1 << 20,
        tier_segment_bytes: 1 << 20,
        tier_rate: 0,
        compact_interval: Duration::ZERO,
        compact_threshold: 0.5,
        compact_grace: Duration::ZERO,
        tier_interval: Duration::ZERO,
        seal_idle: Duration::ZERO,
        scrub_interval: Duration::ZERO,
        scrub_rate: 0,
        disk_probe_interval: Duration::ZERO,
        fault_injection: false,
        clock: Arc::new(packrat_store_api::SystemClock),
    })
    .unwrap();
    Arc::new(opened.store)
}

packrat_store_api::conformance_suite!(local_store);
