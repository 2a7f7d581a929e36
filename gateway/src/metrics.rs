//! Prometheus metrics, kept and encoded with `prometheus-client` (OpenMetrics text, `# HELP`,
//! `# TYPE` and `# UNIT` for every family, base units).
//!
//! The request path takes no lock: each thread keeps the handles of the label sets it has
//! seen (an `Arc` of atomics each), so after a thread's first request with a given operation
//! and status, counting is a handful of relaxed atomic adds. The library's own `Histogram`
//! takes a write lock per observation, which would make every GET of every thread meet on
//! one lock; [`AtomicHistogram`] below keeps the same figures in atomics instead.
//!
//! A request is counted when its reply ends (its last body byte produced, or the reply
//! dropped when the client went away), so a streamed TAR reply's bytes and time are whole.

use packrat_store_api::StoreAdmin;
use packrat_store_api::admin::{Metric, MetricKind, MetricValue};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Upper bounds of the request latency histogram's buckets, in seconds.
const LATENCY_BUCKETS_SECS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    op: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
    profile: &'static str,
}

/// A histogram in atomics: per-bucket counts (not cumulative), the sum in nanoseconds.
#[derive(Debug, Default)]
pub struct AtomicHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS_SECS.len() + 1],
    sum_nanos: AtomicU64,
}

impl AtomicHistogram {
    fn observe(&self, d: Duration) {
        let secs = d.as_secs_f64();
        let i = LATENCY_BUCKETS_SECS
            .iter()
            .position(|b| secs <= *b)
            .unwrap_or(LATENCY_BUCKETS_SECS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_nanos
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }
}

impl EncodeMetric for AtomicHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        // The encoder sums the buckets up itself; `f64::INFINITY` is written as `+Inf`.
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS_SECS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(self.buckets.iter().map(|b| b.load(Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, n)| n).sum();
        let sum = self.sum_nanos.load(Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// An [`AtomicHistogram`] shared by the family and the threads' handles.
#[derive(Clone, Debug, Default)]
struct SharedHistogram(Arc<AtomicHistogram>);

impl prometheus_client::metrics::TypedMetric for SharedHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for SharedHistogram {
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.0.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// One thread's handles on the figures of one operation and status (each shares its atomics
/// with the family and with the other threads' handles).
struct OpHandles {
    requests: Counter,
    duration: SharedHistogram,
    bytes_in: Counter,
    bytes_out: Counter,
}

type HistogramFamily = Family<RequestLabels, SharedHistogram>;

pub struct Metrics {
    /// Tells this instance's handles from another's in the per-thread cache (tests run many
    /// servers in one process).
    id: u64,
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    durations: HistogramFamily,
    bytes_in: Family<OpLabels, Counter>,
    bytes_out: Family<OpLabels, Counter>,
    pub connections_accepted: Counter,
    pub connections_refused: Counter,
    pub tls_handshake_failures: Counter,
    pub connections_open: Gauge,
}

/// A thread's handles, by (metrics instance, operation, status).
type HandleCache = HashMap<(u64, &'static str, u16), OpHandles>;

thread_local! {
    static HANDLES: RefCell<HandleCache> = RefCell::new(HashMap::new());
}

/// What a finished request adds to the figures.
pub struct Observation {
    pub op: &'static str,
    pub status: u16,
    pub elapsed: Duration,
    pub bytes_in: u64,
    pub bytes_out: u64,
}

impl Metrics {
    /// The gateway's families (their help without a final period: the registry adds one), the store's figures (asked for at each scrape), build
    /// information and the process's own figures.
    pub fn new(store: Arc<dyn StoreAdmin>) -> Self {
        Self::build(store, None)
    }

    /// A storage node's page: its store's figures, `figures` (the node's own, which it sets
    /// before each scrape), build information and the process's figures; not the request
    /// and connection families, since no S3 request reaches a node.
    pub fn for_node(store: Arc<dyn StoreAdmin>, figures: ExtraFigures) -> Self {
        Self::build(store, Some(figures))
    }

    fn build(store: Arc<dyn StoreAdmin>, node: Option<ExtraFigures>) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        let mut registry = Registry::default();
        let mut unshown = Registry::default();
        let served = match node {
            None => &mut registry,
            Some(_) => &mut unshown,
        };
        let requests = Family::<RequestLabels, Counter>::default();
        served.register(
            "packrat_requests",
            "S3 and admin requests answered, by operation and status",
            requests.clone(),
        );
        let durations = HistogramFamily::default();
        served.register_with_unit(
            "packrat_request_duration",
            "Time from a request's arrival to the end of its reply, by operation and status",
            Unit::Seconds,
            durations.clone(),
        );
        let bytes_in = Family::<OpLabels, Counter>::default();
        served.register(
            "packrat_bytes_in",
            "Request body bytes received (as declared by Content-Length), by operation",
            bytes_in.clone(),
        );
        let bytes_out = Family::<OpLabels, Counter>::default();
        served.register(
            "packrat_bytes_out",
            "Reply body bytes sent (streamed replies to their last byte), by operation",
            bytes_out.clone(),
        );
        let connections_accepted = Counter::default();
        served.register(
            "packrat_connections_accepted",
            "Client connections accepted",
            connections_accepted.clone(),
        );
        let connections_refused = Counter::default();
        served.register(
            "packrat_connections_refused",
            "Client connections refused with 503 SlowDown: over --max-connections",
            connections_refused.clone(),
        );
        let tls_handshake_failures = Counter::default();
        served.register(
            "packrat_tls_handshake_failures",
            "Client connections whose TLS handshake failed or timed out",
            tls_handshake_failures.clone(),
        );
        let connections_open = Gauge::default();
        served.register(
            "packrat_connections_open",
            "Client connections open now",
            connections_open.clone(),
        );
        registry.register(
            "packrat_build",
            "The running packrat's version and build profile",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
                profile: if cfg!(debug_assertions) {
                    "debug"
                } else {
                    "release"
                },
            }),
        );
        registry.register_collector(Box::new(StoreCollector(store, node)));
        registry.register_collector(Box::new(ProcessCollector));
        Self {
            id: NEXT_ID.fetch_add(1, Relaxed),
            registry,
            requests,
            durations,
            bytes_in,
            bytes_out,
            connections_accepted,
            connections_refused,
            tls_handshake_failures,
            connections_open,
        }
    }

    /// Counts a finished request with this thread's handles for its operation and status,
    /// made once per thread from the families (which take their read lock only then).
    pub fn observe(&self, o: &Observation) {
        HANDLES.with(|cache| {
            let mut cache = cache.borrow_mut();
            let h = cache.entry((self.id, o.op, o.status)).or_insert_with(|| {
                let labels = RequestLabels {
                    op: o.op,
                    status: o.status,
                };
                let op = OpLabels { op: o.op };
                OpHandles {
                    requests: self.requests.get_or_create(&labels).clone(),
                    duration: self.durations.get_or_create(&labels).clone(),
                    bytes_in: self.bytes_in.get_or_create(&op).clone(),
                    bytes_out: self.bytes_out.get_or_create(&op).clone(),
                }
            });
            h.requests.inc();
            h.duration.0.observe(o.elapsed);
            if o.bytes_in > 0 {
                h.bytes_in.inc_by(o.bytes_in);
            }
            if o.bytes_out > 0 {
                h.bytes_out.inc_by(o.bytes_out);
            }
        });
    }

    /// Everything, in OpenMetrics text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &self.registry) {
            tracing::warn!(error = %e, "encoding the metrics failed");
        }
        out
    }
}

/// The content type of [`Metrics::render`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Figures a process sets itself for the next scrape (see [`Metrics::for_node`]).
pub type ExtraFigures = Arc<std::sync::Mutex<Vec<Metric>>>;

/// The store's figures, asked for at each scrape, and the extra ones.
struct StoreCollector(Arc<dyn StoreAdmin>, Option<ExtraFigures>);

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreCollector")
    }
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for m in self.0.metrics() {
            encode_store_metric(&mut encoder, &m)?;
        }
        if let Some(extra) = &self.1
            && let Ok(figures) = extra.lock()
        {
            for m in figures.iter() {
                encode_store_metric(&mut encoder, m)?;
            }
        }
        Ok(())
    }
}

/// One store metric. Its name is the sample's name; a counter's family name is that without
/// `_total` (the encoder adds it back).
fn encode_store_metric(enc: &mut DescriptorEncoder, m: &Metric) -> Result<(), std::fmt::Error> {
    match (&m.kind, &m.value) {
        // Whole numbers are written as integers (`7`, not `7.0`).
        (MetricKind::Counter, MetricValue::Value(v)) => {
            let name = m.name.strip_suffix("_total").unwrap_or(m.name);
            let me = enc.encode_descriptor(name, m.help, None, MetricType::Counter)?;
            match whole(*v) {
                Some(n) => ConstCounter::new(n.unsigned_abs()).encode(me),
                None => ConstCounter::new(*v).encode(me),
            }
        }
        (_, MetricValue::Value(v)) => {
            let me = enc.encode_descriptor(m.name, m.help, None, MetricType::Gauge)?;
            match whole(*v) {
                Some(n) => ConstGauge::new(n).encode(me),
                None => ConstGauge::new(*v).encode(me),
            }
        }
        (_, MetricValue::ByLabel { label, values }) => {
            let mut me = enc.encode_descriptor(m.name, m.help, None, MetricType::Gauge)?;
            for (value, n) in values {
                let labels = [(*label, value.as_str())];
                let family = me.encode_family(&labels)?;
                match whole(*n) {
                    Some(n) => ConstGauge::new(n).encode(family)?,
                    None => ConstGauge::new(*n).encode(family)?,
                }
            }
            Ok(())
        }
        (
            _,
            MetricValue::Histogram {
                buckets,
                sum,
                count,
            },
        ) => {
            // The store's buckets are cumulative; the encoder wants each bucket's own count,
            // with the +Inf bucket (f64::INFINITY) last.
            let mut own = Vec::with_capacity(buckets.len() + 1);
            let mut below = 0;
            for (le, n) in buckets {
                own.push((*le, n.saturating_sub(below)));
                below = *n;
            }
            own.push((f64::INFINITY, count.saturating_sub(below)));
            let mut me = enc.encode_descriptor(m.name, m.help, None, MetricType::Histogram)?;
            me.encode_histogram::<NoLabelSet>(*sum, *count, &own, None)
        }
    }
}

/// `v` as an integer when it is one (and small enough to be exact).
fn whole(v: f64) -> Option<i64> {
    (v.fract() == 0.0 && v.abs() < 9.0e15).then_some(v as i64)
}

/// The process's own figures (CPU, memory, file descriptors, threads, start time), as every
/// Prometheus client names them, read from /proc at each scrape.
#[derive(Debug)]
struct ProcessCollector;

impl Collector for ProcessCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Ok(me) = procfs::process::Process::myself() else {
            return Ok(());
        };
        if let Ok(stat) = me.stat() {
            let tps = procfs::ticks_per_second() as f64;
            let cpu = ConstCounter::new((stat.utime + stat.stime) as f64 / tps);
            cpu.encode(enc.encode_descriptor(
                "process_cpu",
                "Total user and system CPU time spent in seconds.",
                Some(&Unit::Seconds),
                cpu.metric_type(),
            )?)?;
            let gauges = [
                (
                    "process_resident_memory",
                    "Resident memory size in bytes.",
                    Some(Unit::Bytes),
                    procfs::WithCurrentSystemInfo::get(stat.rss_bytes()) as f64,
                ),
                (
                    "process_virtual_memory",
                    "Virtual memory size in bytes.",
                    Some(Unit::Bytes),
                    stat.vsize as f64,
                ),
                (
                    "process_threads",
                    "Number of OS threads in the process.",
                    None,
                    stat.num_threads as f64,
                ),
            ];
            for (name, help, unit, v) in gauges {
                let g = ConstGauge::new(v);
                g.encode(enc.encode_descriptor(name, help, unit.as_ref(), g.metric_type())?)?;
            }
            if let Ok(boot) = procfs::boot_time_secs() {
                let g = ConstGauge::new(boot as f64 + stat.starttime as f64 / tps);
                g.encode(enc.encode_descriptor(
                    "process_start_time",
                    "Start time of the process since unix epoch in seconds.",
                    Some(&Unit::Seconds),
                    g.metric_type(),
                )?)?;
            }
        }
        if let Ok(n) = me.fd_count() {
            let g = ConstGauge::new(n as f64);
            g.encode(enc.encode_descriptor(
                "process_open_fds",
                "Number of open file descriptors.",
                None,
                g.metric_type(),
            )?)?;
        }
        if let Ok(limits) = me.limits()
            && let procfs::process::LimitValue::Value(n) = limits.max_open_files.soft_limit
        {
            let g = ConstGauge::new(n as f64);
            g.encode(enc.encode_descriptor(
                "process_max_fds",
                "Maximum number of open file descriptors.",
                None,
                g.metric_type(),
            )?)?;
        }
        Ok(())
    }
}
