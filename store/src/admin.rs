//! One node's answers to an operator: its status report, its fault switches (tests), the
//! background jobs, and its metrics. `LocalStore` serves them through the `ObjectStore` trait.

use crate::engine::{COMMIT_LATENCY_BUCKETS_US, Engine};
use crate::error::{EngineError, EngineResult};
use packrat_chunk_store::{Fault, FaultRule, FaultyIo, IoOp};
use packrat_store_api::StoreError;
use packrat_store_api::admin::{Metric, MetricKind, MetricValue, Report};
use serde::{Deserialize, Serialize};
use std::sync::atomic::Ordering::Relaxed;

/// What `admin status` reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub index: packrat_index::IndexStats,
    pub segments: u64,
    pub active_segment_id: u64,
    pub active_segment_bytes: u64,
    pub segment_disk_bytes: u64,
    pub appends: u64,
    pub appended_bytes: u64,
    pub syncs: u64,
    /// Live and dead segment bytes as of the last compaction scan (none yet: null).
    pub space: Option<crate::compact::Space>,
    /// Erasure coding: disks, capacity and segments per state (null without --ec).
    pub erasure: Option<packrat_chunk_store::EcStatus>,
    pub degraded_reads: u64,
    pub unrecoverable_reads: u64,
    pub segments_encoded: u64,
    pub shards_rebuilt: u64,
    pub shard_faults_found: u64,
    #[serde(default)]
    pub disk_probe_failures: u64,
}

pub fn status(engine: &Engine) -> Status {
    let st = engine.chunks.stats();
    Status {
        index: engine.index.object_stats(),
        segments: st.segments,
        active_segment_id: st.active_segment_id,
        active_segment_bytes: st.active_segment_bytes,
        segment_disk_bytes: engine.chunks.disk_bytes(),
        appends: st.appends,
        appended_bytes: st.appended_bytes,
        syncs: st.syncs,
        space: *engine.last_space.lock().unwrap_or_else(|p| p.into_inner()),
        erasure: engine.chunks.ec_status(),
        degraded_reads: st.degraded_reads,
        unrecoverable_reads: st.unrecoverable_reads,
        segments_encoded: st.segments_encoded,
        shards_rebuilt: st.shards_rebuilt,
        shard_faults_found: st.shard_faults_found,
        disk_probe_failures: st.disk_probe_failures,
    }
}

/// A report as JSON.
pub fn report<T: Serialize>(v: &T) -> EngineResult<Report> {
    serde_json::to_value(v).map_err(|e| EngineError::internal("report", e))
}

/// The fault rules of `packrat serve --fault-injection`, as the admin API reads and sets
/// them. `write`, `sync`, `read` and `index_write` are shorthands, each a rule that fails every
/// such operation (`index_write`: index writes and deletes); `rules` are rules in full (an
/// operation, a fault, and optionally a path, `after`, `times`, `every`). Setting replaces
/// every rule; `{}` clears them.
#[derive(Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
struct Faults {
    write: Fault,
    sync: Fault,
    read: Fault,
    index_write: Fault,
    rules: Vec<FaultRule>,
    injected: u64,
}

/// A rule that fails every `op`.
fn always(op: IoOp, fault: Fault) -> FaultRule {
    FaultRule {
        op,
        fault,
        path: None,
        after: 0,
        times: None,
        every: 0,
    }
}

/// Sets the fault rules from `set` (if given) and answers them.
pub fn faults(io: &FaultyIo, set: Option<Report>) -> EngineResult<Report> {
    if let Some(v) = set {
        let f: Faults = serde_json::from_value(v)
            .map_err(|e| EngineError(StoreError::Invalid(format!("bad JSON body: {e}"))))?;
        let mut rules = vec![
            always(IoOp::Write, f.write),
            always(IoOp::Sync, f.sync),
            always(IoOp::Read, f.read),
            always(IoOp::IndexWrite, f.index_write),
            always(IoOp::IndexDelete, f.index_write),
        ];
        rules.extend(f.rules);
        rules.retain(|r| r.fault != Fault::None);
        tracing::warn!(rules = ?rules, "fault rules set");
        io.set_rules(rules);
    }
    let rules = io.rules();
    let shorthand = |op: IoOp| {
        rules
            .iter()
            .find(|r| *r == &always(op, r.fault))
            .map_or(Fault::None, |r| r.fault)
    };
    report(&Faults {
        write: shorthand(IoOp::Write),
        sync: shorthand(IoOp::Sync),
        read: shorthand(IoOp::Read),
        index_write: shorthand(IoOp::IndexWrite),
        injected: io.injected(),
        rules,
    })
}

/// The node's figures: segments and their I/O, erasure coding, tiers, group commit, index.
pub fn metrics(engine: &Engine) -> Vec<Metric> {
    let st = engine.chunks.stats();
    let mut m = vec![
        Metric::gauge("packrat_segments", "Segment files.", st.segments),
        Metric::gauge(
            "packrat_active_segment_bytes",
            "Bytes in the segment being appended to.",
            st.active_segment_bytes,
        ),
        Metric::counter("packrat_segment_syncs_total", "Segment fsyncs.", st.syncs),
        Metric::counter(
            "packrat_segment_appends_total",
            "Records appended to segments.",
            st.appends,
        ),
        Metric::counter(
            "packrat_segment_appended_bytes_total",
            "Bytes appended to segments.",
            st.appended_bytes,
        ),
        Metric::counter(
            "packrat_degraded_reads_total",
            "Reads served by rebuilding from other shards.",
            st.degraded_reads,
        ),
        Metric::counter(
            "packrat_unrecoverable_reads_total",
            "Reads refused: data on more failed disks than the erasure code can rebuild from.",
            st.unrecoverable_reads,
        ),
        Metric::counter(
            "packrat_segments_encoded_total",
            "Segments erasure-coded.",
            st.segments_encoded,
        ),
        Metric::counter(
            "packrat_bytes_encoded_total",
            "Bytes erasure-coded.",
            st.bytes_encoded,
        ),
        Metric::counter(
            "packrat_shards_rebuilt_total",
            "Erasure-coded shards rebuilt.",
            st.shards_rebuilt,
        ),
        Metric::counter(
            "packrat_shard_faults_total",
            "Shards found missing or wrong.",
            st.shard_faults_found,
        ),
        Metric::counter(
            "packrat_disk_probe_failures_total",
            "Disk probes that failed.",
            st.disk_probe_failures,
        ),
    ];
    m.extend(engine.tiers.metrics());
    let cs = &engine.commit_stats;
    let batches = cs.batches.load(Relaxed);
    m.push(Metric::counter(
        "packrat_commit_batches_total",
        "Group commits (one synced index batch each).",
        batches,
    ));
    m.push(Metric::counter(
        "packrat_commit_jobs_total",
        "Writes committed.",
        cs.jobs.load(Relaxed),
    ));
    m.push(Metric {
        name: "packrat_commit_duration_seconds",
        help: "Time of a group commit.",
        kind: MetricKind::Histogram,
        value: MetricValue::Histogram {
            buckets: COMMIT_LATENCY_BUCKETS_US
                .iter()
                .zip(&cs.latency_buckets)
                .map(|(b, n)| (*b as f64 / 1e6, n.load(Relaxed)))
                .collect(),
            sum: cs.latency_us_sum.load(Relaxed) as f64 / 1e6,
            count: batches,
        },
    });
    let ix = engine.index.object_stats();
    m.push(Metric::gauge(
        "packrat_index_objects_estimate",
        "Objects in the index (RocksDB's estimate).",
        ix.objects_estimate,
    ));
    m.push(Metric::gauge(
        "packrat_index_sst_bytes",
        "Bytes of the index's SST files.",
        ix.sst_bytes,
    ));
    m.push(Metric::gauge(
        "packrat_index_memtable_bytes",
        "Bytes of the index's memtables.",
        ix.memtable_bytes,
    ));
    m
}
