//! A long admin job (a scrub, a tier run) that runs in the background while clients poll its
//! progress: the store keeps one [`Job`] per kind, and the admin API reports its [`Progress`].

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// The run in progress, or the last one, of one kind of job.
pub struct Job<R> {
    running: AtomicBool,
    done_bytes: AtomicU64,
    total_bytes: AtomicU64,
    /// Runs finished so far: a client waits for this to pass the count it saw first.
    finished: AtomicU64,
    last: Mutex<Option<Result<R, String>>>,
}

impl<R> Default for Job<R> {
    fn default() -> Self {
        Self {
            running: AtomicBool::new(false),
            done_bytes: AtomicU64::new(0),
            total_bytes: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            last: Mutex::new(None),
        }
    }
}

/// What the admin API answers about a job (a type of the store seam).
pub use packrat_store_api::reports::Progress;

impl<R: Clone> Job<R> {
    /// Claims the job for a new run; false if one is going.
    pub fn try_start(&self) -> bool {
        if self.running.swap(true, Relaxed) {
            return false;
        }
        self.done_bytes.store(0, Relaxed);
        self.total_bytes.store(0, Relaxed);
        true
    }

    pub fn set_total(&self, total: u64) {
        self.total_bytes.store(total, Relaxed);
    }

    pub fn set_done(&self, done: u64) {
        self.done_bytes.store(done, Relaxed);
    }

    pub fn add_done(&self, n: u64) {
        self.done_bytes.fetch_add(n, Relaxed);
    }

    /// Ends a run and begins the next at once: the job never shows as idle in between. A run
    /// no one asked for (`None`) leaves the report and the count of runs as they were, so a
    /// client waiting for the run it asked for gets that run's report.
    pub fn finish_and_go_on(&self, result: Option<Result<R, String>>) {
        if let Some(r) = result {
            self.keep(r);
        }
        self.done_bytes.store(0, Relaxed);
        self.total_bytes.store(0, Relaxed);
    }

    /// Ends a run no one asked for (see [`Job::finish_and_go_on`]).
    pub fn finish_unreported(&self) {
        self.running.store(false, Relaxed);
    }

    fn keep(&self, result: Result<R, String>) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        self.finished.fetch_add(1, Relaxed);
    }

    pub fn finish(&self, result: Result<R, String>) {
        self.keep(result);
        self.running.store(false, Relaxed);
    }

    pub fn progress(&self) -> Progress<R> {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner()).clone();
        Progress {
            running: self.running.load(Relaxed),
            done_bytes: self.done_bytes.load(Relaxed),
            total_bytes: self.total_bytes.load(Relaxed),
            finished_runs: self.finished.load(Relaxed),
            report: last.as_ref().and_then(|r| r.as_ref().ok().cloned()),
            error: last.and_then(|r| r.err()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A run no one asked for, ending as an asked one begins or on its own, changes neither
    /// the report nor the count a client waits on; the job shows running until the asked run
    /// ends, with that run's report.
    #[test]
    fn a_client_gets_the_report_of_the_run_it_asked_for() {
        let job: Job<u32> = Job::default();
        assert!(job.try_start());
        job.finish(Ok(1));
        let before = job.progress().finished_runs;
        assert!(job.try_start(), "a background run");
        assert!(!job.try_start(), "one run at a time");
        job.finish_and_go_on(None);
        let p = job.progress();
        assert!(p.running, "the asked run follows without a gap");
        assert_eq!((p.finished_runs, p.report), (before, Some(1)));
        job.finish(Ok(2));
        let p = job.progress();
        assert!(!p.running);
        assert_eq!((p.finished_runs, p.report), (before + 1, Some(2)));
        assert!(job.try_start(), "a background run after it");
        job.finish_unreported();
        let p = job.progress();
        assert!(!p.running);
        assert_eq!((p.finished_runs, p.report), (before + 1, Some(2)));
    }
}
