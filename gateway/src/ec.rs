//! Erasure-coding upkeep in a running server: sealing idle segments, repairing what reads
//! found damaged, and scrubbing every shard (in the background at a bounded rate, or at once
//! through `packrat admin scrub`). The work itself is in the chunk store; this module runs it
//! off the async threads and keeps the progress `admin scrub` shows.

use crate::engine::Engine;
use packrat_chunk_store::ScrubReport;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// The scrub in progress, or the last one.
#[derive(Default)]
pub struct ScrubJob {
    running: AtomicBool,
    done_bytes: AtomicU64,
    total_bytes: AtomicU64,
    last: Mutex<Option<Result<ScrubReport, String>>>,
}

/// What `GET /_packrat/admin/scrub` answers.
#[derive(Debug, Serialize, Deserialize)]
pub struct ScrubProgress {
    pub running: bool,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// The report of the last scrub that finished.
    pub report: Option<ScrubReport>,
    pub error: Option<String>,
}

impl ScrubJob {
    pub fn progress(&self) -> ScrubProgress {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        ScrubProgress {
            running: self.running.load(Relaxed),
            done_bytes: self.done_bytes.load(Relaxed),
            total_bytes: self.total_bytes.load(Relaxed),
            report: last.as_ref().and_then(|r| r.as_ref().ok().cloned()),
            error: last.and_then(|r| r.err()),
        }
    }
}

/// Starts a scrub unless one is running; `rate` bounds its reading (bytes per second).
/// Returns whether this call started it.
pub fn start_scrub(engine: &Arc<Engine>, rate: Option<u64>) -> bool {
    if engine.scrub.running.swap(true, Relaxed) {
        return false;
    }
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || {
        let job = &engine.scrub;
        job.done_bytes.store(0, Relaxed);
        job.total_bytes.store(0, Relaxed);
        let started = std::time::Instant::now();
        let result = engine
            .chunks
            .scrub(rate, &|done, total| {
                job.done_bytes.store(done, Relaxed);
                job.total_bytes.store(total, Relaxed);
            })
            .map_err(|e| e.to_string());
        match &result {
            Ok(r) => tracing::info!(
                seconds = started.elapsed().as_secs_f64(),
                segments = r.segments_checked,
                bytes = r.bytes_checked,
                missing = r.shards_missing,
                corrupt = r.shards_corrupt,
                rebuilt = r.shards_rebuilt,
                sealed = r.segments_sealed,
                unrepairable = r.unrepairable.len(),
                "scrub finished"
            ),
            Err(e) => tracing::error!(error = %e, "scrub failed"),
        }
        *job.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        job.running.store(false, Relaxed);
    });
    true
}

/// Seals idle segments and repairs damaged ones every second, and scrubs every
/// `scrub_interval` (zero: never) at `scrub_rate` bytes per second.
pub fn spawn_background(
    engine: Arc<Engine>,
    seal_idle: Duration,
    scrub_interval: Duration,
    scrub_rate: u64,
) {
    tokio::spawn(async move {
        let mut last_scrub = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let e = engine.clone();
            let upkeep = tokio::task::spawn_blocking(move || {
                e.chunks.seal_due(Some(seal_idle))?;
                e.chunks.repair_suspects()
            })
            .await;
            match upkeep {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "sealing or repair failed; retried"),
                Err(e) => tracing::error!(error = %e, "upkeep task failed"),
            }
            if !scrub_interval.is_zero() && last_scrub.elapsed() >= scrub_interval {
                last_scrub = tokio::time::Instant::now();
                start_scrub(&engine, Some(scrub_rate.max(1024 * 1024)));
            }
        }
    });
}
