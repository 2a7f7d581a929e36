//! What an operator asks of a store: access keys, status, the long jobs (compaction, scrub,
//! tier runs) and the store's own metrics.
//!
//! The jobs' reports and the tier status are typed ([`crate::reports`]): a cluster adds up
//! its nodes' and the CLI reads them into the same types. The status and the fault rules stay
//! JSON documents in the store's own shape (one store's counters, a cluster's map; a store's
//! own fault switches). Metrics are typed, so the S3 layer renders every store's figures the
//! same way next to its own.

use crate::StoreResult;
use crate::reports::{CompactReport, JobProgress, TierStatus};
use serde::{Deserialize, Serialize};

/// A status or fault document as the admin API answers it (see the module's note).
pub type Report = serde_json::Value;

/// An access key as the store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AccessKey {
    pub access_key: String,
    pub secret_key: String,
    pub name: String,
    pub owner_id: String,
    pub is_root: bool,
    pub created_ms: i64,
}

/// A key to create; access and secret keys are generated when not given.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NewKey {
    pub name: String,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
    /// The user's canonical id (owner id), as a migration from another store keeps it; a
    /// random one when not given. A second key of a user gives its id and the same name.
    #[serde(default)]
    pub user_id: Option<String>,
}

/// The background jobs an operator starts and follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobKind {
    /// Reads every erasure-coded shard and repairs what it finds wrong.
    Scrub,
    /// Applies lifecycle rules and moves cold data to its storage tier.
    TierRun,
    /// Moves live records out of sparse sealed segments and removes them.
    Compact,
}

/// How a job is started.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum JobStart {
    Scrub,
    /// A tier run that treats objects as `days_ahead` days older than they are.
    TierRun {
        days_ahead: u32,
    },
    /// A compaction of the sealed segments whose live share is below `threshold` (0 to 1);
    /// removed segments stay readable through open handles for `grace`.
    Compact {
        threshold: f64,
        grace: std::time::Duration,
    },
}

impl JobStart {
    /// The kind of job this starts.
    pub fn kind(&self) -> JobKind {
        match self {
            JobStart::Scrub => JobKind::Scrub,
            JobStart::TierRun { .. } => JobKind::TierRun,
            JobStart::Compact { .. } => JobKind::Compact,
        }
    }
}

/// What a metric counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricKind {
    /// Only ever grows (`_total`).
    Counter,
    /// Goes up and down.
    Gauge,
    /// Counts observations by bounds (see [`MetricValue::Histogram`]).
    Histogram,
}

/// One figure of a store, in base units (bytes, seconds).
#[derive(Debug, Clone)]
pub struct Metric {
    pub name: &'static str,
    pub help: &'static str,
    pub kind: MetricKind,
    pub value: MetricValue,
}

#[derive(Debug, Clone)]
pub enum MetricValue {
    Value(f64),
    /// Observations at most each bound (`le`, cumulative), their sum and count.
    Histogram {
        buckets: Vec<(f64, u64)>,
        sum: f64,
        count: u64,
    },
    /// One gauge per value of a label (`name{label="value"} n`), as for each node a cluster
    /// waits for.
    ByLabel {
        label: &'static str,
        values: Vec<(String, f64)>,
    },
}

impl Metric {
    pub fn counter(name: &'static str, help: &'static str, value: u64) -> Self {
        Self {
            name,
            help,
            kind: MetricKind::Counter,
            value: MetricValue::Value(value as f64),
        }
    }

    /// A gauge per value of `label`.
    pub fn gauge_by(
        name: &'static str,
        help: &'static str,
        label: &'static str,
        values: Vec<(String, u64)>,
    ) -> Self {
        Self {
            name,
            help,
            kind: MetricKind::Gauge,
            value: MetricValue::ByLabel {
                label,
                values: values.into_iter().map(|(k, v)| (k, v as f64)).collect(),
            },
        }
    }

    pub fn gauge(name: &'static str, help: &'static str, value: u64) -> Self {
        Self {
            name,
            help,
            kind: MetricKind::Gauge,
            value: MetricValue::Value(value as f64),
        }
    }
}

/// What an operator asks of a store: its state, its long jobs, its fault switches (tests), its
/// figures and whether it can take writes.
#[async_trait::async_trait]
pub trait StoreAdmin: Send + Sync + 'static {
    /// The store's state: objects, segments, space, disks, erasure coding. With `flush`, the
    /// index first writes out and compacts what it holds in memory (exact figures, slower).
    async fn status(&self, flush: bool) -> StoreResult<Report>;
    /// Compacts the segments whose live bytes are below `threshold` (0 to 1); removed
    /// segments stay readable for `grace` by readers that have them open. Answers the report.
    async fn compact(
        &self,
        threshold: f64,
        grace: std::time::Duration,
    ) -> StoreResult<CompactReport>;
    /// Starts a background job, or joins the one of its kind that is running; answers its
    /// progress. `Invalid` if the store cannot run it (a scrub without erasure coding).
    fn start_job(&self, job: JobStart) -> StoreResult<JobProgress>;
    /// The progress of the running (or last) job of a kind.
    fn job_progress(&self, job: JobKind) -> StoreResult<JobProgress>;
    /// Storage tiers: what each holds, what is due to move.
    async fn tier_status(&self) -> StoreResult<TierStatus>;
    /// Test fault injection: sets the store's fault rules if `set` is given, and answers
    /// them. `Invalid` for rules the store does not have, or with fault injection off.
    async fn faults(&self, set: Option<Report>) -> StoreResult<Report>;
    /// The store's own figures (segments, commits, disks, tiers, index).
    fn metrics(&self) -> Vec<Metric>;
    /// Whether the store can take writes now; `Err` says why not (too few healthy disks, a
    /// full disk, ...). `/health/ready` answers from it.
    fn write_readiness(&self) -> Result<(), String>;
}
