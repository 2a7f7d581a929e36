//! Prometheus metrics: request counts and latency per operation and status, and chunk-store
//! figures. Counting is a few relaxed atomic adds under a short lock per request.

use packrat_store_api::admin::{Metric, MetricKind, MetricValue};
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

    /// The gateway's request figures, then the store's `store_metrics`, in Prometheus text.
    pub fn render(&self, store_metrics: &[Metric]) -> String {
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
        for m in store_metrics {
            render_metric(&mut out, m);
        }
        out
    }
}

/// One of the store's metrics in Prometheus text, with its `# HELP` and `# TYPE` lines.
fn render_metric(out: &mut String, m: &Metric) {
    let kind = match m.kind {
        MetricKind::Counter => "counter",
        MetricKind::Gauge => "gauge",
        MetricKind::Histogram => "histogram",
    };
    let name = m.name;
    let _ = writeln!(out, "# HELP {name} {}\n# TYPE {name} {kind}", m.help);
    match &m.value {
        MetricValue::Value(v) => {
            let _ = writeln!(out, "{name} {v}");
        }
        MetricValue::Histogram {
            buckets,
            sum,
            count,
        } => {
            for (le, n) in buckets {
                let _ = writeln!(out, "{name}_bucket{{le=\"{le}\"}} {n}");
            }
            let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
            let _ = writeln!(out, "{name}_sum {sum}");
            let _ = writeln!(out, "{name}_count {count}");
        }
    }
}
