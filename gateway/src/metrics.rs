//! Prometheus metrics: request counts and latency per operation and status, and chunk-store
//! figures. Counting is a few relaxed atomic adds under a short lock per request.

use packrat_store::engine::Engine;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::time::Duration;

/// Upper bounds of the latency histogram buckets, in seconds.
const LATENCY_BUCKETS_SECS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

#[derive(Default)]
struct OpStats {
    count: u64,
    sum_secs: f64,
    buckets: [u64; LATENCY_BUCKETS_SECS.len()],
}

#[derive(Default)]
pub struct Metrics {
    ops: Mutex<BTreeMap<(&'static str, u16), OpStats>>,
    pub bytes_in: std::sync::atomic::AtomicU64,
    pub bytes_out: std::sync::atomic::AtomicU64,
}

impl Metrics {
    pub fn observe(&self, op: &'static str, status: u16, elapsed: Duration) {
        let secs = elapsed.as_secs_f64();
        let mut ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        let s = ops.entry((op, status)).or_default();
        s.count += 1;
        s.sum_secs += secs;
        for (i, b) in LATENCY_BUCKETS_SECS.iter().enumerate() {
            if secs <= *b {
                s.buckets[i] += 1;
            }
        }
    }

    pub fn render(&self, engine: &Engine) -> String {
        let mut out = String::new();
        out.push_str("# TYPE packrat_requests_total counter\n");
        out.push_str("# TYPE packrat_request_duration_seconds histogram\n");
        let ops = self.ops.lock().unwrap_or_else(|p| p.into_inner());
        for ((op, status), s) in ops.iter() {
            let _ = writeln!(
                out,
                "packrat_requests_total{{op=\"{op}\",status=\"{status}\"}} {}",
                s.count
            );
            for (i, b) in LATENCY_BUCKETS_SECS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "packrat_request_duration_seconds_bucket{{op=\"{op}\",status=\"{status}\",le=\"{b}\"}} {}",
                    s.buckets[i]
                );
            }
            let _ = writeln!(
                out,
                "packrat_request_duration_seconds_bucket{{op=\"{op}\",status=\"{status}\",le=\"+Inf\"}} {}",
                s.count
            );
            let _ = writeln!(
                out,
                "packrat_request_duration_seconds_sum{{op=\"{op}\",status=\"{status}\"}} {}",
                s.sum_secs
            );
            let _ = writeln!(
                out,
                "packrat_request_duration_seconds_count{{op=\"{op}\",status=\"{status}\"}} {}",
                s.count
            );
        }
        drop(ops);
        let st = engine.chunks.stats();
        let _ = writeln!(
            out,
            "# TYPE packrat_segments gauge\npackrat_segments {}",
            st.segments
        );
        let _ = writeln!(
            out,
            "# TYPE packrat_active_segment_bytes gauge\npackrat_active_segment_bytes {}",
            st.active_segment_bytes
        );
        let _ = writeln!(
            out,
            "# TYPE packrat_segment_syncs_total counter\npackrat_segment_syncs_total {}",
            st.syncs
        );
        let gauges = [
            ("counter", "packrat_segment_appends_total", st.appends),
            (
                "counter",
                "packrat_segment_appended_bytes_total",
                st.appended_bytes,
            ),
            ("counter", "packrat_degraded_reads_total", st.degraded_reads),
            (
                "counter",
                "packrat_unrecoverable_reads_total",
                st.unrecoverable_reads,
            ),
            (
                "counter",
                "packrat_segments_encoded_total",
                st.segments_encoded,
            ),
            ("counter", "packrat_bytes_encoded_total", st.bytes_encoded),
            ("counter", "packrat_shards_rebuilt_total", st.shards_rebuilt),
            (
                "counter",
                "packrat_shard_faults_total",
                st.shard_faults_found,
            ),
            (
                "counter",
                "packrat_disk_probe_failures_total",
                st.disk_probe_failures,
            ),
        ];
        let tier_counters = engine.tiers.metrics();
        let gauges: Vec<(&str, &str, u64)> = gauges
            .into_iter()
            .chain(tier_counters.iter().map(|(n, v)| ("counter", *n, *v)))
            .collect();
        use std::sync::atomic::Ordering::Relaxed;
        let _ = writeln!(
            out,
            "# TYPE packrat_bytes_in_total counter\npackrat_bytes_in_total {}",
            self.bytes_in.load(Relaxed)
        );
        let _ = writeln!(
            out,
            "# TYPE packrat_bytes_out_total counter\npackrat_bytes_out_total {}",
            self.bytes_out.load(Relaxed)
        );
        let cs = &engine.commit_stats;
        let batches = cs.batches.load(Relaxed);
        let _ = writeln!(
            out,
            "# TYPE packrat_commit_batches_total counter\npackrat_commit_batches_total {batches}"
        );
        let _ = writeln!(
            out,
            "# TYPE packrat_commit_jobs_total counter\npackrat_commit_jobs_total {}",
            cs.jobs.load(Relaxed)
        );
        out.push_str("# TYPE packrat_commit_duration_seconds histogram\n");
        for (i, b) in packrat_store::engine::COMMIT_LATENCY_BUCKETS_US
            .iter()
            .enumerate()
        {
            let _ = writeln!(
                out,
                "packrat_commit_duration_seconds_bucket{{le=\"{}\"}} {}",
                *b as f64 / 1e6,
                cs.latency_buckets[i].load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "packrat_commit_duration_seconds_bucket{{le=\"+Inf\"}} {batches}"
        );
        let _ = writeln!(
            out,
            "packrat_commit_duration_seconds_sum {}",
            cs.latency_us_sum.load(Relaxed) as f64 / 1e6
        );
        let _ = writeln!(out, "packrat_commit_duration_seconds_count {batches}");
        let ix = engine.index.object_stats();
        let index_gauges = [
            (
                "gauge",
                "packrat_index_objects_estimate",
                ix.objects_estimate,
            ),
            ("gauge", "packrat_index_sst_bytes", ix.sst_bytes),
            ("gauge", "packrat_index_memtable_bytes", ix.memtable_bytes),
        ];
        for (kind, name, v) in gauges.iter().chain(index_gauges.iter()) {
            let _ = writeln!(out, "# TYPE {name} {kind}\n{name} {v}");
        }
        out
    }
}
