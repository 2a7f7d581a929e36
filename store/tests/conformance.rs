//! The store conformance suite (`packrat_store_api::conformance`) against `LocalStore`: one
//! node's engine on a fresh data directory per test, as `packrat serve` runs it (one disk, no
//! erasure coding, no tiers).

use packrat_chunk_store::{ChunkStore, ChunkStoreOptions};
use packrat_index::RocksIndex;
use packrat_store::LocalStore;
use packrat_store::engine::Engine;
use packrat_store::tier::{TierOptions, Tiers};
use packrat_store_api::ObjectStore;
use std::sync::Arc;

async fn local_store() -> Arc<dyn ObjectStore> {
    // The directory lives as long as the test process; each test gets its own.
    let dir = tempfile::tempdir().unwrap().keep();
    let index = RocksIndex::open(&dir.join("index")).unwrap();
    let chunks = ChunkStore::open(
        dir.join("segments"),
        ChunkStoreOptions {
            // Small segments, so the checks also cross segment rotations.
            segment_bytes_max: 4 * 1024 * 1024,
            ..Default::default()
        },
    )
    .unwrap();
    let tiers = Tiers::open(
        TierOptions {
            specs: Vec::new(),
            cache_bytes: 1 << 20,
            segment_bytes: 1 << 20,
            rate: 0,
        },
        &dir,
        &index,
    )
    .unwrap();
    let engine = Arc::new(Engine::new(index, chunks, tiers));
    Arc::new(LocalStore::new(engine))
}

packrat_store_api::conformance_suite!(local_store);
