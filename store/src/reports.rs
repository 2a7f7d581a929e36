//! What the store's background jobs report and keep between runs: plain data, so the engine
//! that holds them needs none of the jobs' code.

use serde::Serialize;

/// Live and dead bytes of the segments, as of a compaction scan.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Space {
    pub segment_bytes: u64,
    pub live_bytes: u64,
    pub dead_bytes: u64,
    /// Unix ms of the scan.
    pub measured_ms: i64,
}

#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct CompactReport {
    pub objects_scanned: u64,
    pub sealed_segments: u64,
    /// Segments below the threshold, chosen for compaction.
    pub segments_chosen: u64,
    /// Segments removed.
    pub segments_removed: u64,
    /// Chosen segments kept because something still referenced them after the move (a
    /// record that could not be read), or a write in flight might still reach them.
    pub segments_kept: u64,
    pub records_moved: u64,
    pub bytes_moved: u64,
    pub objects_moved: u64,
    /// Objects overwritten or deleted while being moved (their new version won).
    pub objects_changed_meanwhile: u64,
    pub bytes_reclaimed: u64,
    pub before: Space,
    pub seconds: f64,
}
