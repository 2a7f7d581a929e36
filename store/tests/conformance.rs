//! The store conformance suite (`packrat_store_api::conformance`) against `LocalStore`: one
//! node's engine on a fresh data directory per test, opened as `packrat serve` opens it
//! (`LocalStore::open`: one disk, no erasure coding, no tiers, no background jobs).

use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::Store;
use std::sync::Arc;

async fn local_store() -> Arc<dyn Store> {
    // The directory lives as long as the test process; each test gets its own.
    let dir = tempfile::tempdir().unwrap().keep();
    // Small segments (4 MiB), so the checks also cross segment rotations.
    let opened = LocalStore::open(LocalOptions::new(dir)).unwrap();
    Arc::new(opened.store)
}

packrat_store_api::conformance_suite!(local_store);
