//! A long admin job (a scrub, a tier run) that runs in the background while clients poll its
//! progress: the store keeps one [`Job`] per kind, and the admin API reports its [`Progress`].

use serde::{Deserialize, Serialize};
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

/// What the admin API answers about a job.
#[derive(Debug, Serialize, Deserialize)]
pub struct Progress<R> {
    pub running: bool,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub finished_runs: u64,
    /// The report of the last run that finished.
    pub report: Option<R>,
    pub error: Option<String>,
}

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

    pub fn finish(&self, result: Result<R, String>) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some(result);
        self.finished.fetch_add(1, Relaxed);
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
