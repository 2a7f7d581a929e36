//! A long admin job (a scrub, a tier run) that runs in the background while clients poll its
//! progress: the server keeps one [`Job`] per kind, `packrat admin ...` follows it with
//! [`follow`], drawing a progress bar until the run it started has finished.

use serde::de::DeserializeOwned;
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

/// Client side: starts a job with a POST to `start` (or joins the run going), polls `poll`
/// with a progress bar named `what` until a run that began after the first poll has finished,
/// and returns its report.
pub async fn follow<R: DeserializeOwned>(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    what: &str,
    start: &str,
    poll: &str,
) -> Result<R, String> {
    use http::Method;
    let ask = |method: Method, path: String| async move {
        let body =
            crate::admin::call_ok(endpoint, region, access_key, secret_key, method, &path).await?;
        serde_json::from_slice::<Progress<R>>(&body)
            .map_err(|e| format!("unexpected answer from the server: {e}"))
    };
    let before = ask(Method::GET, poll.to_string()).await?.finished_runs;
    let mut p = ask(Method::POST, start.to_string()).await?;
    let bar = indicatif::ProgressBar::new(p.total_bytes.max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} [{{elapsed_precise}}] {{wide_bar}} {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, eta {{eta}})"
        ))
        .map_err(|e| e.to_string())?,
    );
    loop {
        bar.set_length(p.total_bytes.max(1));
        bar.set_position(p.done_bytes);
        if !p.running && p.finished_runs > before {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        p = ask(Method::GET, poll.to_string()).await?;
    }
    bar.finish();
    if let Some(e) = p.error {
        return Err(format!("{what} failed: {e}"));
    }
    p.report
        .ok_or_else(|| format!("the server kept no {what} report"))
}
