//! The committer thread: writes queued by many requests made durable and indexed together
//! (group commit), each request woken once its write is applied.

use super::*;

/// Set once a commit job's ops are in the index (or its batch failed and they never will be).
/// Writers that read the index under a key lock wait for the last job enqueued under that
/// lock first (see [`Engine::lock_key`]).
#[derive(Default)]
pub(super) struct Applied {
    pub(super) done: std::sync::atomic::AtomicBool,
    pub(super) notify: tokio::sync::Notify,
}

impl Applied {
    pub(super) fn set(&self) {
        self.done.store(true, std::sync::atomic::Ordering::Release);
        self.notify.notify_waiters();
    }

    pub(super) async fn wait(&self) {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.done.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}

/// Marks its job applied when dropped, whatever happens to the job: processed, or lost with a
/// commit thread that stopped. Writers waiting to read under a key lock are never stranded.
pub(super) struct AppliedOnDrop(pub(super) Arc<Applied>);

impl Drop for AppliedOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// One write waiting for group commit.
pub(super) struct CommitJob {
    pub(super) ticket: Option<WriteTicket>,
    pub(super) ops: Vec<ObjectOp>,
    pub(super) applied: Option<AppliedOnDrop>,
    pub(super) done: tokio::sync::oneshot::Sender<EngineResult<()>>,
}

/// The committer thread: takes every queued job, makes their records durable with one
/// `sync_through` per distinct segment (the first syncs, the rest are usually covered), then
/// publishes their index entries in one synced write batch, then answers them all.
pub(super) fn run_committer(
    index: &RocksIndex,
    chunks: &ChunkStore,
    stats: &CommitStats,
    mut rx: tokio::sync::mpsc::Receiver<CommitJob>,
) {
    use std::sync::atomic::Ordering::Relaxed;
    let mut jobs: Vec<CommitJob> = Vec::with_capacity(COMMIT_BATCH_JOBS_MAX);
    while let Some(first) = rx.blocking_recv() {
        jobs.push(first);
        while jobs.len() < COMMIT_BATCH_JOBS_MAX {
            match rx.try_recv() {
                Ok(j) => jobs.push(j),
                Err(_) => break,
            }
        }
        let started = std::time::Instant::now();
        let result = commit_batch(index, chunks, &jobs);
        for j in &jobs {
            if let Some(a) = &j.applied {
                a.0.set();
            }
        }
        let us = started.elapsed().as_micros() as u64;
        stats.batches.fetch_add(1, Relaxed);
        stats.jobs.fetch_add(jobs.len() as u64, Relaxed);
        stats.latency_us_sum.fetch_add(us, Relaxed);
        for (i, b) in COMMIT_LATENCY_BUCKETS_US.iter().enumerate() {
            if us <= *b {
                stats.latency_buckets[i].fetch_add(1, Relaxed);
            }
        }
        for j in jobs.drain(..) {
            let _ = j.done.send(result.clone());
        }
    }
}

fn commit_batch(index: &RocksIndex, chunks: &ChunkStore, jobs: &[CommitJob]) -> EngineResult<()> {
    let mut tickets: Vec<WriteTicket> = jobs.iter().filter_map(|j| j.ticket).collect();
    tickets.sort_unstable();
    // Newest first: its sync covers every earlier ticket of the same segment, and a ticket in
    // a segment abandoned after a failed fsync still gets its error.
    for t in tickets.iter().rev() {
        chunks.sync_through(*t)?;
    }
    let ops: Vec<&ObjectOp> = jobs.iter().flat_map(|j| j.ops.iter()).collect();
    if !ops.is_empty() {
        index.apply_object_ops(&ops)?;
    }
    Ok(())
}
