//! Erasure-coding upkeep in a running server: sealing idle segments, repairing what reads
//! found damaged, and scrubbing every shard (in the background at a bounded rate, or at once
//! through `packrat admin scrub`). The work itself is in the chunk store; this module runs it
//! off the async threads and keeps the progress `admin scrub` shows.

use crate::engine::Engine;
use packrat_chunk_store::ScrubReport;
use std::sync::Arc;
use std::time::Duration;

/// The scrub in progress, or the last one.
pub type ScrubJob = crate::job::Job<ScrubReport>;

/// A scrub's report as the store seam carries it (the chunk store's, field for field).
pub fn scrub_report(r: ScrubReport) -> packrat_store_api::reports::ScrubReport {
    packrat_store_api::reports::ScrubReport {
        segments_checked: r.segments_checked,
        shards_checked: r.shards_checked,
        bytes_checked: r.bytes_checked,
        shards_missing: r.shards_missing,
        shards_corrupt: r.shards_corrupt,
        shards_rebuilt: r.shards_rebuilt,
        segments_sealed: r.segments_sealed,
        unrepairable: r.unrepairable,
    }
}

/// Starts a scrub unless one is running; `rate` bounds its reading (bytes per second).
/// Returns whether this call started it.
pub fn start_scrub(engine: &Arc<Engine>, rate: Option<u64>) -> bool {
    if !engine.scrub.try_start() {
        return false;
    }
    let engine = engine.clone();
    tokio::task::spawn_blocking(move || {
        let job = &engine.scrub;
        let started = std::time::Instant::now();
        let result = engine
            .chunks
            .scrub(rate, &|done, total| {
                job.set_done(done);
                job.set_total(total);
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
        job.finish(result);
    });
    true
}

/// Seals idle segments and repairs damaged ones every second, probes every disk every
/// `probe_interval`, and scrubs every `scrub_interval` at `scrub_rate` bytes per second (zero
/// intervals: never).
pub fn spawn_background(
    engine: Arc<Engine>,
    seal_idle: Duration,
    scrub_interval: Duration,
    scrub_rate: u64,
    probe_interval: Duration,
) {
    tokio::spawn(async move {
        let mut last_scrub = tokio::time::Instant::now();
        let mut last_probe = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let probe = !probe_interval.is_zero() && last_probe.elapsed() >= probe_interval;
            if probe {
                last_probe = tokio::time::Instant::now();
            }
            let e = engine.clone();
            let upkeep = tokio::task::spawn_blocking(move || {
                if probe {
                    for disk in e.chunks.probe_disks() {
                        tracing::error!(disk = %disk.display(), "disk probe failed: the disk is marked failed (new segments avoid it; a scrub takes it back once it works)");
                    }
                }
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
