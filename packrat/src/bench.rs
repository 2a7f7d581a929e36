//! `packrat bench`: a lean S3 load generator (SigV4, path-style) that measures any endpoint,
//! packrat or a peer, with the same requests.
//!
//! Each worker owns one keep-alive HTTP/1.1 connection and sends requests back to back; the
//! signing key is derived once; request bodies are shared buffers. Latencies go into a
//! per-worker HDR histogram merged at the end. Given `--server-pid`, the server's CPU time (from
//! `/proc/PID/stat`) per operation and its RSS are reported too.

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{HeaderMap, HeaderValue, Method, Request};
use http_body_util::{BodyExt, Full};
use packrat_gateway::s3::sigv4;
use serde::Serialize;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod direct;

#[derive(Clone, Copy, Debug, clap::ValueEnum, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Workload {
    Put,
    Get,
    Head,
    /// Lists the whole prefix page by page (one operation = one page), with one connection.
    List,
    /// GETs and PUTs of existing keys, `--read-ratio` of them GETs.
    Mixed,
    /// packrat batch GET: each operation fetches `--batch-size` random keys in one request
    /// (`--batch-order request|storage`); samples are the TAR entries received.
    Batch,
    /// packrat epoch streams: each connection streams shard i of `--concurrency` of the
    /// prefix once (one whole epoch in all); samples are the TAR entries received.
    Stream,
    /// Multipart uploads: each operation uploads one object of `--size` in parts of
    /// `--part-size` (CreateMultipartUpload, the parts one after another on the connection,
    /// CompleteMultipartUpload).
    Multipart,
    /// A soak: 60% GET, 25% PUT, 10% DELETE, 5% LIST (one 100-key page) of random keys. A GET
    /// of a key deleted meanwhile (404) is expected; any other failure is an error.
    Soak,
}

#[derive(clap::Args, Clone)]
pub struct BenchArgs {
    /// S3 endpoint to load.
    #[arg(
        long,
        env = "PACKRAT_ENDPOINT",
        default_value = "http://127.0.0.1:9000"
    )]
    pub endpoint: String,
    #[arg(long, env = "AWS_ACCESS_KEY_ID")]
    pub access_key: String,
    #[arg(long, env = "AWS_SECRET_ACCESS_KEY")]
    pub secret_key: String,
    #[arg(long, env = "AWS_DEFAULT_REGION", default_value = "us-east-1")]
    pub region: String,
    /// Bucket to use; created if missing.
    #[arg(long, default_value = "packrat-bench")]
    pub bucket: String,
    #[arg(long, value_enum, default_value = "get")]
    pub workload: Workload,
    /// Object size, e.g. 4KiB, 64KiB, 1MiB, 1GiB.
    #[arg(long, default_value = "4KiB", value_parser = parse_size)]
    pub size: u64,
    /// Number of distinct keys (`PREFIX` + 8-digit index).
    #[arg(long, default_value_t = 10_000)]
    pub keys: u64,
    #[arg(long, default_value = "bench/")]
    pub prefix: String,
    /// Concurrent connections, one request in flight on each.
    #[arg(long, default_value_t = 64)]
    pub concurrency: usize,
    /// Stop after this long, e.g. 30s, 2m.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub duration: Duration,
    /// Stop after this many operations (whichever limit comes first).
    #[arg(long)]
    pub ops: Option<u64>,
    /// Zipf exponent for key choice (e.g. 0.99); uniform when absent.
    #[arg(long)]
    pub zipf: Option<f64>,
    /// Fraction of GETs in the mixed workload.
    #[arg(long, default_value_t = 0.9)]
    pub read_ratio: f64,
    /// Upload the keys before measuring (for get, head, list and mixed).
    #[arg(long)]
    pub prepare: bool,
    /// Server process id: report its CPU time per operation and its RSS.
    #[arg(long)]
    pub server_pid: Option<u32>,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// A label for this run in the output (e.g. the server's name).
    #[arg(long, default_value = "")]
    pub label: String,
    /// Keys per batch GET request (batch workload).
    #[arg(long, default_value_t = 1000)]
    pub batch_size: usize,
    /// Order of a batch GET's answer: request or storage (batch workload).
    #[arg(long, default_value = "request")]
    pub batch_order: String,
    /// Upload objects with SSE-S3 (`x-amz-server-side-encryption: AES256`), so PUTs seal and
    /// GETs open them: what encryption costs, against a run without.
    #[arg(long)]
    pub sse: bool,
    /// Part size of the multipart workload (at least 5 MiB, S3's minimum but for the last).
    #[arg(long, default_value = "8MiB", value_parser = parse_size)]
    pub part_size: u64,
    /// Turn versioning on for the bucket before the workload, so every PUT keeps the version
    /// it replaces: what versioning costs, against a run without.
    #[arg(long)]
    pub versioning: bool,
    /// GETs, HEADs and batch GETs straight to the storage nodes holding the keys, by the
    /// routes the cluster gateway at --endpoint gives (nodes started with --s3-listen), as
    /// packrat_client reads; everything else through the gateway.
    #[arg(long)]
    pub direct: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let (num, mult) = [
        ("GiB", 1u64 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
        ("G", 1 << 30),
        ("M", 1 << 20),
        ("K", 1 << 10),
        ("B", 1),
    ]
    .iter()
    .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
    .unwrap_or((s, 1));
    num.trim()
        .parse::<u64>()
        .map(|n| n * mult)
        .map_err(|_| format!("bad size '{s}' (use e.g. 4KiB, 1MiB)"))
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mult) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else {
        (s, 1.0)
    };
    num.parse::<f64>()
        .map(|n| Duration::from_secs_f64(n * mult))
        .map_err(|_| format!("bad duration '{s}' (use e.g. 30s, 2m)"))
}

/// Picks keys uniformly or by a Zipf law (precomputed CDF, binary search).
struct KeyChooser {
    n: u64,
    cdf: Option<Vec<f64>>,
}

impl KeyChooser {
    fn new(n: u64, zipf: Option<f64>) -> Self {
        let cdf = zipf.map(|s| {
            let mut acc = 0.0;
            let mut v: Vec<f64> = (1..=n)
                .map(|i| {
                    acc += 1.0 / (i as f64).powf(s);
                    acc
                })
                .collect();
            for x in v.iter_mut() {
                *x /= acc;
            }
            v
        });
        Self { n: n.max(1), cdf }
    }

    fn pick(&self, rng: &mut rand::rngs::SmallRng) -> u64 {
        use rand::Rng;
        match &self.cdf {
            None => rng.random_range(0..self.n),
            Some(cdf) => {
                let u: f64 = rng.random();
                cdf.partition_point(|&c| c < u).min(cdf.len() - 1) as u64
            }
        }
    }
}

struct Signer {
    host: String,
    access_key: String,
    region: String,
    key_by_date: std::sync::Mutex<(String, [u8; 32])>,
    secret: String,
}

impl Signer {
    /// The request's headers, signed; `extra` headers (lower-case names) are sent and signed.
    fn sign(
        &self,
        method: &Method,
        path: &str,
        query: &str,
        payload_hash: &str,
        extra: &[(&'static str, &'static str)],
    ) -> HeaderMap {
        let now = chrono::Utc::now();
        let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
        let date = &amz_date[..8];
        let key = {
            let mut k = self.key_by_date.lock().unwrap_or_else(|p| p.into_inner());
            if k.0 != date {
                *k = (
                    date.to_string(),
                    sigv4::derive_signing_key(&self.secret, date, &self.region, "s3"),
                );
            }
            k.1
        };
        let mut h = HeaderMap::new();
        let hv = |s: &str| HeaderValue::from_str(s).unwrap_or(HeaderValue::from_static(""));
        h.insert("host", hv(&self.host));
        h.insert("x-amz-content-sha256", hv(payload_hash));
        h.insert("x-amz-date", hv(&amz_date));
        for (name, value) in extra {
            h.insert(*name, HeaderValue::from_static(value));
        }
        let mut signed: Vec<String> = h.keys().map(|k| k.as_str().to_string()).collect();
        signed.sort();
        let signed_list = signed.join(";");
        let creq = sigv4::canonical_request(&sigv4::CanonicalInput {
            method: method.as_str(),
            raw_path: path,
            raw_query: query,
            headers: &h,
            signed_headers: &signed,
            payload_hash,
            presigned: false,
        });
        let scope = format!("{date}/{}/s3/aws4_request", self.region);
        let sig = sigv4::sign_hex(&key, &sigv4::string_to_sign(&amz_date, &scope, &creq));
        h.insert(
            "authorization",
            hv(&format!(
                "AWS4-HMAC-SHA256 Credential={}/{scope}, SignedHeaders={signed_list}, Signature={sig}",
                self.access_key
            )),
        );
        h
    }
}

type Conn = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(addr: &str) -> Result<Conn, String> {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect {addr}: {e}"))?;
    let _ = stream.set_nodelay(true);
    let (send, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    Ok(send)
}

/// How a request is sent and its answer read.
#[derive(Default, Clone, Copy)]
struct Ask {
    /// Parse a successful answer as a TAR stream as it arrives (entries counted, nothing kept).
    tar: bool,
    /// Headers sent and signed besides the signature's own (lower-case names).
    headers: &'static [(&'static str, &'static str)],
}

struct Client {
    addr: String,
    signer: Arc<Signer>,
}

struct Outcome {
    ok: bool,
    status: u16,
    bytes: u64,
    body: Bytes,
    /// TAR entries and their payload bytes, when the answer was parsed as a TAR.
    samples: u64,
    sample_bytes: u64,
    sample_errors: u64,
}

/// A batch GET's body: `keys` as its items, and the order of the answer.
fn batch_body(keys: &[impl AsRef<str>], order: &str) -> Bytes {
    use std::fmt::Write as _;
    let mut items = String::with_capacity(keys.len() * 40 + 64);
    items.push_str("{\"items\":[");
    for (j, k) in keys.iter().enumerate() {
        if j > 0 {
            items.push(',');
        }
        let _ = write!(items, "{{\"key\":\"{}\"}}", k.as_ref());
    }
    let _ = write!(items, "],\"order\":\"{order}\"}}");
    Bytes::from(items)
}

impl Client {
    /// A batch GET of `body` (see [`batch_body`]), its answer read as a TAR.
    async fn batch(&self, conn: &mut Conn, bucket: &str, body: Bytes) -> Result<Outcome, String> {
        let ask = Ask {
            tar: true,
            ..Ask::default()
        };
        self.request_tar(
            conn,
            Method::POST,
            &format!("/{bucket}"),
            "batch=",
            body,
            ask,
        )
        .await
    }

    async fn request(
        &self,
        conn: &mut Conn,
        method: Method,
        path: &str,
        query: &str,
        body: Bytes,
    ) -> Result<Outcome, String> {
        self.request_tar(conn, method, path, query, body, Ask::default())
            .await
    }

    /// A request sent and read as `ask` says.
    async fn request_tar(
        &self,
        conn: &mut Conn,
        method: Method,
        path: &str,
        query: &str,
        body: Bytes,
        ask: Ask,
    ) -> Result<Outcome, String> {
        let payload = if body.is_empty() {
            sigv4::EMPTY_SHA256
        } else {
            sigv4::UNSIGNED_PAYLOAD
        };
        let headers = self.signer.sign(&method, path, query, payload, ask.headers);
        let uri = if query.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{query}")
        };
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(h) = req.headers_mut() {
            *h = headers;
            h.insert("content-length", HeaderValue::from(body.len()));
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
        if conn.ready().await.is_err() {
            *conn = connect(&self.addr).await?;
        }
        let resp = conn.send_request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status().as_u16();
        let ok = resp.status().is_success();
        // Object bodies are counted and dropped as they arrive (a 1 GiB GET must not be
        // buffered by the load generator); listings (the requests with a query) and errors
        // are kept for parsing.
        let parse = ask.tar && ok;
        let keep = !ok || (!query.is_empty() && !parse);
        let mut body = resp.into_body();
        let mut kept = Vec::new();
        let mut bytes = 0u64;
        let mut parser = packrat_tar::TarParser::new();
        let (mut samples, mut sample_bytes, mut sample_errors) = (0u64, 0u64, 0u64);
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| e.to_string())?;
            if let Ok(d) = frame.into_data() {
                bytes += d.len() as u64;
                if keep {
                    kept.extend_from_slice(&d);
                }
                if parse {
                    parser
                        .push(&d, &mut |ev| {
                            match ev {
                                packrat_tar::TarEvent::File { name, size, .. } => {
                                    if name.starts_with("__error__/") {
                                        sample_errors += 1;
                                    } else {
                                        samples += 1;
                                        sample_bytes += size;
                                    }
                                }
                                packrat_tar::TarEvent::Data(_)
                                | packrat_tar::TarEvent::FileEnd
                                | packrat_tar::TarEvent::Skipped { .. } => {}
                            }
                            Ok::<(), packrat_tar::TarError>(())
                        })
                        .map_err(|e| format!("bad TAR answer: {e}"))?;
                }
            }
        }
        if parse {
            parser
                .finish()
                .map_err(|e| format!("bad TAR answer: {e}"))?;
        }
        Ok(Outcome {
            ok,
            status,
            bytes,
            body: Bytes::from(kept),
            samples,
            sample_bytes,
            sample_errors,
        })
    }
}

/// The shared payload with the key index and a fresh counter in its first bytes, so every
/// PUT stores distinct content (distinct ETags; no compression gift to anyone's index).
fn unique_body(payload: &Bytes, i: u64) -> Bytes {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    if payload.len() < 16 {
        return payload.clone();
    }
    let mut b = bytes::BytesMut::from(&payload[..]);
    b[..8].copy_from_slice(&i.to_le_bytes());
    b[8..16].copy_from_slice(&SEQ.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    b.freeze()
}

fn key_path(bucket: &str, prefix: &str, i: u64) -> String {
    format!(
        "/{bucket}/{}",
        sigv4::uri_encode(format!("{prefix}{i:08}").as_bytes(), true)
    )
}

#[derive(Serialize, Default)]
pub struct Report {
    pub label: String,
    pub workload: String,
    pub size_bytes: u64,
    pub concurrency: usize,
    pub ops: u64,
    pub errors: u64,
    pub seconds: f64,
    pub ops_per_sec: f64,
    pub mb_per_sec: f64,
    pub latency_us_p50: u64,
    pub latency_us_p90: u64,
    pub latency_us_p99: u64,
    pub latency_us_p999: u64,
    pub latency_us_max: u64,
    pub server_cpu_us_per_op: Option<f64>,
    /// This load generator's own CPU per operation: on one machine it shares the cores with
    /// the server, so a server's rate is bound by both.
    pub client_cpu_us_per_op: Option<f64>,
    pub server_rss_mib: Option<f64>,
    pub server_rss_peak_mib: Option<f64>,
    pub keys_listed: Option<u64>,
    /// Batch and stream workloads: TAR entries (samples) received, per second, and their
    /// payload MB/s (`mb_per_sec` is then the same payload figure).
    pub samples: Option<u64>,
    pub samples_per_sec: Option<f64>,
}

fn proc_cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields are counted after its closing parenthesis.
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines()
        .find(|l| l.starts_with(field))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Clock ticks per second of /proc/PID/stat (USER_HZ); 100 on every Linux this runs on.
const USER_HZ: f64 = 100.0;

pub async fn run(args: BenchArgs) -> Result<(), String> {
    let uri: http::Uri = args
        .endpoint
        .parse()
        .map_err(|e| format!("bad endpoint: {e}"))?;
    let authority = uri
        .authority()
        .ok_or("endpoint needs host:port")?
        .to_string();
    let addr = if authority.contains(':') {
        authority.clone()
    } else {
        format!("{authority}:80")
    };
    let client = Arc::new(Client {
        addr: addr.clone(),
        signer: Arc::new(Signer {
            host: authority.clone(),
            access_key: args.access_key.clone(),
            region: args.region.clone(),
            key_by_date: std::sync::Mutex::new((String::new(), [0; 32])),
            secret: args.secret_key.clone(),
        }),
    });
    let mut conn = connect(&addr).await?;
    let created = client
        .request(
            &mut conn,
            Method::PUT,
            &format!("/{}", args.bucket),
            "",
            Bytes::new(),
        )
        .await?;
    let body = String::from_utf8_lossy(&created.body);
    if !created.ok
        && !body.contains("BucketAlreadyOwnedByYou")
        && !body.contains("BucketAlreadyExists")
    {
        return Err(format!("cannot create bucket {}: {body}", args.bucket));
    }
    if args.versioning {
        let on = client
            .request(
                &mut conn,
                Method::PUT,
                &format!("/{}", args.bucket),
                "versioning=",
                Bytes::from_static(
                    b"<VersioningConfiguration><Status>Enabled</Status></VersioningConfiguration>",
                ),
            )
            .await?;
        if !on.ok {
            return Err(format!(
                "cannot enable versioning on {}: {}",
                args.bucket,
                String::from_utf8_lossy(&on.body)
            ));
        }
    }
    let payload = Bytes::from(
        (0..args.size)
            .map(|i| (i * 31 % 251) as u8)
            .collect::<Vec<u8>>(),
    );

    if args.prepare {
        prepare(&client, &args, payload.clone()).await?;
    }
    let direct = match args.direct {
        true => Some(Arc::new(
            direct::Direct::fetch(&client, &mut conn, &args.bucket).await?,
        )),
        false => None,
    };

    let stop = Arc::new(AtomicBool::new(false));
    let done_ops = Arc::new(AtomicU64::new(0));
    let done_errs = Arc::new(AtomicU64::new(0));
    let cpu0 = args.server_pid.and_then(proc_cpu_ticks);
    let own0 = proc_cpu_ticks(std::process::id());
    let started = Instant::now();
    let progress = {
        let (stop, ops, errs, quiet) =
            (stop.clone(), done_ops.clone(), done_errs.clone(), args.json);
        tokio::spawn(async move {
            let mut last = 0;
            while !stop.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let n = ops.load(Ordering::Relaxed);
                if !quiet {
                    eprint!(
                        "\r[{:>4.0}s] {n:>10} ops {:>9} ops/s  errors {}   ",
                        started.elapsed().as_secs_f64(),
                        n - last,
                        errs.load(Ordering::Relaxed)
                    );
                }
                last = n;
            }
        })
    };
    let chooser = Arc::new(KeyChooser::new(args.keys, args.zipf));
    let workers = if args.workload == Workload::List {
        1
    } else {
        args.concurrency.max(1)
    };
    let mut handles = Vec::new();
    for w in 0..workers {
        let (client, args, payload, chooser) = (
            client.clone(),
            args.clone(),
            payload.clone(),
            chooser.clone(),
        );
        let run = Run {
            stop: stop.clone(),
            done_ops: done_ops.clone(),
            done_errs: done_errs.clone(),
            started,
            direct: direct.clone(),
        };
        handles.push(tokio::spawn(async move {
            worker(w, client, args, payload, chooser, run).await
        }));
    }
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).map_err(|e| e.to_string())?;
    let (mut bytes, mut listed) = (0u64, 0u64);
    for h in handles {
        let (wh, wb, wl) = h.await.map_err(|e| e.to_string())??;
        hist.add(&wh).map_err(|e| e.to_string())?;
        bytes += wb;
        listed += wl;
    }
    // Measured before the progress task is stopped: it may be asleep for up to a second.
    let secs = started.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    progress.abort();
    if !args.json {
        eprintln!();
    }
    let ops = hist.len();
    let errors = done_errs.load(Ordering::Relaxed);
    let cpu1 = args.server_pid.and_then(proc_cpu_ticks);
    let own1 = proc_cpu_ticks(std::process::id());
    let per_op = |a: Option<u64>, b: Option<u64>| match (a, b) {
        (Some(a), Some(b)) if ops > 0 => Some((b - a) as f64 / USER_HZ * 1e6 / ops as f64),
        _ => None,
    };
    let report = Report {
        label: args.label.clone(),
        workload: format!("{:?}", args.workload).to_lowercase(),
        size_bytes: args.size,
        concurrency: workers,
        ops,
        errors,
        seconds: secs,
        ops_per_sec: ops as f64 / secs,
        mb_per_sec: bytes as f64 / secs / 1e6,
        latency_us_p50: hist.value_at_quantile(0.5),
        latency_us_p90: hist.value_at_quantile(0.9),
        latency_us_p99: hist.value_at_quantile(0.99),
        latency_us_p999: hist.value_at_quantile(0.999),
        latency_us_max: hist.max(),
        server_cpu_us_per_op: per_op(cpu0, cpu1),
        client_cpu_us_per_op: per_op(own0, own1),
        server_rss_mib: args
            .server_pid
            .and_then(|p| proc_status_kib(p, "VmRSS:"))
            .map(|k| k as f64 / 1024.0),
        server_rss_peak_mib: args
            .server_pid
            .and_then(|p| proc_status_kib(p, "VmHWM:"))
            .map(|k| k as f64 / 1024.0),
        keys_listed: (args.workload == Workload::List).then_some(listed),
        samples: matches!(args.workload, Workload::Batch | Workload::Stream).then_some(listed),
        samples_per_sec: matches!(args.workload, Workload::Batch | Workload::Stream)
            .then_some(listed as f64 / secs),
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string(&report).map_err(|e| e.to_string())?
        );
    } else {
        print_report(&report);
    }
    Ok(())
}

fn print_report(r: &Report) {
    println!(
        "workload      {} ({} bytes, {} connections){}",
        r.workload,
        r.size_bytes,
        r.concurrency,
        if r.label.is_empty() {
            String::new()
        } else {
            format!(" [{}]", r.label)
        }
    );
    println!(
        "operations    {} in {:.2} s, errors {}",
        r.ops, r.seconds, r.errors
    );
    println!(
        "throughput    {:.0} ops/s, {:.1} MB/s",
        r.ops_per_sec, r.mb_per_sec
    );
    println!(
        "latency (µs)  p50 {}  p90 {}  p99 {}  p99.9 {}  max {}",
        r.latency_us_p50, r.latency_us_p90, r.latency_us_p99, r.latency_us_p999, r.latency_us_max
    );
    if let Some(c) = r.server_cpu_us_per_op {
        println!(
            "server        {c:.1} µs CPU per op, RSS {:.0} MiB (peak {:.0} MiB)",
            r.server_rss_mib.unwrap_or(0.0),
            r.server_rss_peak_mib.unwrap_or(0.0)
        );
    }
    if let Some(c) = r.client_cpu_us_per_op {
        println!("load generator {c:.1} µs CPU per op (this process)");
    }
    if let Some(n) = r.keys_listed {
        println!("listed        {n} keys");
    }
    if let (Some(n), Some(rate)) = (r.samples, r.samples_per_sec) {
        println!("samples       {n} received, {rate:.0} samples/s (MB/s above is their payload)");
    }
}

async fn prepare(client: &Arc<Client>, args: &BenchArgs, payload: Bytes) -> Result<(), String> {
    let next = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    let started = Instant::now();
    for _ in 0..args.concurrency.clamp(1, 64) {
        let (client, next, payload, args) =
            (client.clone(), next.clone(), payload.clone(), args.clone());
        handles.push(tokio::spawn(async move {
            let mut conn = connect(&client.addr).await?;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= args.keys {
                    return Ok::<(), String>(());
                }
                let out = client
                    .request_tar(
                        &mut conn,
                        Method::PUT,
                        &key_path(&args.bucket, &args.prefix, i),
                        "",
                        unique_body(&payload, i),
                        Ask {
                            headers: put_headers(&args),
                            ..Ask::default()
                        },
                    )
                    .await?;
                if !out.ok {
                    return Err(format!(
                        "prepare: PUT of key {i} failed: {}",
                        String::from_utf8_lossy(&out.body)
                    ));
                }
                if !args.json && i % 10_000 == 0 && i > 0 {
                    eprint!(
                        "\rprepared {i}/{} keys ({:.0}/s)   ",
                        args.keys,
                        i as f64 / started.elapsed().as_secs_f64()
                    );
                }
            }
        }));
    }
    for h in handles {
        h.await.map_err(|e| e.to_string())??;
    }
    if !args.json {
        eprintln!(
            "\rprepared {} keys in {:.1} s          ",
            args.keys,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}

/// The headers an object PUT sends besides the signature's (`--sse`).
fn put_headers(args: &BenchArgs) -> &'static [(&'static str, &'static str)] {
    if args.sse {
        &[("x-amz-server-side-encryption", "AES256")]
    } else {
        &[]
    }
}

/// One multipart upload of key `i` (see [`Workload::Multipart`]): (success, bytes sent).
/// The parts' ETags are their MD5s, computed here.
async fn multipart_op(
    client: &Client,
    conn: &mut Conn,
    args: &BenchArgs,
    payload: &Bytes,
    i: u64,
) -> Result<(bool, u64), String> {
    use md5::Digest as _;
    use std::fmt::Write as _;
    let path = key_path(&args.bucket, &args.prefix, i);
    let created = client
        .request(conn, Method::POST, &path, "uploads=", Bytes::new())
        .await?;
    let text = String::from_utf8_lossy(&created.body);
    let upload_id = match (text.find("<UploadId>"), text.find("</UploadId>")) {
        (Some(a), Some(b)) if created.ok => text[a + "<UploadId>".len()..b].to_string(),
        _ => return Ok((false, 0)),
    };
    let body = unique_body(payload, i);
    let part_size = (args.part_size.max(1) as usize).min(body.len().max(1));
    let mut xml = String::from("<CompleteMultipartUpload>");
    for (n, start) in (0..body.len()).step_by(part_size).enumerate() {
        let part = body.slice(start..(start + part_size).min(body.len()));
        let etag = hex::encode(md5::Md5::digest(&part));
        let query = format!("partNumber={}&uploadId={upload_id}", n + 1);
        let sent = client
            .request(conn, Method::PUT, &path, &query, part)
            .await?;
        if !sent.ok {
            return Ok((false, 0));
        }
        let _ = write!(
            xml,
            "<Part><PartNumber>{}</PartNumber><ETag>\"{etag}\"</ETag></Part>",
            n + 1
        );
    }
    xml.push_str("</CompleteMultipartUpload>");
    let done = client
        .request(
            conn,
            Method::POST,
            &path,
            &format!("uploadId={upload_id}"),
            Bytes::from(xml),
        )
        .await?;
    // CompleteMultipartUpload may answer 200 with an error in the body.
    let ok = done.ok && !String::from_utf8_lossy(&done.body).contains("<Error>");
    Ok((ok, body.len() as u64))
}

/// One object operation on key `i`: (success, bytes moved). A GET counts as failed unless
/// the whole object came back.
async fn object_op(
    client: &Client,
    conn: &mut Conn,
    args: &BenchArgs,
    payload: &Bytes,
    method: Method,
    i: u64,
) -> Result<(bool, u64), String> {
    let body = if method == Method::PUT {
        unique_body(payload, i)
    } else {
        Bytes::new()
    };
    let path = key_path(&args.bucket, &args.prefix, i);
    let ask = Ask {
        headers: if method == Method::PUT {
            put_headers(args)
        } else {
            &[]
        },
        ..Ask::default()
    };
    let o = client
        .request_tar(conn, method.clone(), &path, "", body, ask)
        .await?;
    Ok(match method {
        Method::PUT => (o.ok, args.size * u64::from(o.ok)),
        Method::GET => (o.ok && o.bytes == args.size, o.bytes),
        _ => (o.ok, 0),
    })
}

/// What the workers of a run share: the stop flag, the operations begun and failed, the start.
struct Run {
    stop: Arc<AtomicBool>,
    done_ops: Arc<AtomicU64>,
    done_errs: Arc<AtomicU64>,
    started: Instant,
    /// With `--direct`: reads go to the nodes.
    direct: Option<Arc<direct::Direct>>,
}

async fn worker(
    w: usize,
    client: Arc<Client>,
    args: BenchArgs,
    payload: Bytes,
    chooser: Arc<KeyChooser>,
    run: Run,
) -> Result<(Histogram<u64>, u64, u64), String> {
    let Run {
        stop,
        done_ops,
        done_errs,
        started,
        direct,
    } = run;
    let mut nodes = direct::Conns::default();
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::SmallRng::seed_from_u64(w as u64 * 7919 + 1);
    let mut hist =
        Histogram::<u64>::new_with_bounds(1, 3_600_000_000, 3).map_err(|e| e.to_string())?;
    let mut conn = connect(&client.addr).await?;
    let (mut bytes, mut listed) = (0u64, 0u64);
    let mut token: Option<String> = None;
    loop {
        if stop.load(Ordering::Relaxed) || started.elapsed() >= args.duration {
            break;
        }
        let n = done_ops.fetch_add(1, Ordering::Relaxed);
        if args.ops.is_some_and(|max| n >= max) {
            done_ops.fetch_sub(1, Ordering::Relaxed);
            break;
        }
        let t = Instant::now();
        let (ok, b) = match args.workload {
            Workload::Put => {
                // The run's operation number: with `--ops` equal to `--keys`, every key is
                // written exactly once, whatever the connections' speeds.
                let i = n % args.keys.max(1);
                object_op(&client, &mut conn, &args, &payload, Method::PUT, i).await?
            }
            Workload::Get | Workload::Head if direct.is_some() => {
                let i = chooser.pick(&mut rng);
                let key = format!("{}{i:08}", args.prefix);
                let d = direct.as_deref().ok_or("no routes")?;
                let (node, conn) = nodes.to(d, &key).await?;
                let method = match args.workload {
                    Workload::Get => Method::GET,
                    _ => Method::HEAD,
                };
                object_op(node, conn, &args, &payload, method, i).await?
            }
            Workload::Get => {
                object_op(
                    &client,
                    &mut conn,
                    &args,
                    &payload,
                    Method::GET,
                    chooser.pick(&mut rng),
                )
                .await?
            }
            Workload::Multipart => {
                let i = n % args.keys.max(1);
                multipart_op(&client, &mut conn, &args, &payload, i).await?
            }
            Workload::Head => {
                object_op(
                    &client,
                    &mut conn,
                    &args,
                    &payload,
                    Method::HEAD,
                    chooser.pick(&mut rng),
                )
                .await?
            }
            Workload::Mixed => {
                let i = chooser.pick(&mut rng);
                let method = if rng.random::<f64>() < args.read_ratio {
                    Method::GET
                } else {
                    Method::PUT
                };
                object_op(&client, &mut conn, &args, &payload, method, i).await?
            }
            Workload::Soak => {
                let i = chooser.pick(&mut rng);
                let r = rng.random::<f64>();
                let path = key_path(&args.bucket, &args.prefix, i);
                if r < 0.60 {
                    let o = client
                        .request(&mut conn, Method::GET, &path, "", Bytes::new())
                        .await?;
                    ((o.ok && o.bytes == args.size) || o.status == 404, o.bytes)
                } else if r < 0.85 {
                    object_op(&client, &mut conn, &args, &payload, Method::PUT, i).await?
                } else if r < 0.95 {
                    let o = client
                        .request(&mut conn, Method::DELETE, &path, "", Bytes::new())
                        .await?;
                    (o.ok, 0)
                } else {
                    let q = format!(
                        "list-type=2&max-keys=100&prefix={}",
                        sigv4::uri_encode(args.prefix.as_bytes(), false)
                    );
                    let o = client
                        .request(
                            &mut conn,
                            Method::GET,
                            &format!("/{}", args.bucket),
                            &q,
                            Bytes::new(),
                        )
                        .await?;
                    (o.ok, o.bytes)
                }
            }
            Workload::Batch if direct.is_some() => {
                let keys: Vec<String> = (0..args.batch_size)
                    .map(|_| format!("{}{:08}", args.prefix, chooser.pick(&mut rng)))
                    .collect();
                let d = direct.as_deref().ok_or("no routes")?;
                let (ok, samples, bytes) = nodes.batch(d, &args, &keys).await?;
                listed += samples;
                (ok, bytes)
            }
            Workload::Batch => {
                let keys: Vec<String> = (0..args.batch_size)
                    .map(|_| format!("{}{:08}", args.prefix, chooser.pick(&mut rng)))
                    .collect();
                let body = batch_body(&keys, &args.batch_order);
                let o = client.batch(&mut conn, &args.bucket, body).await?;
                listed += o.samples;
                let complete = o.samples == args.batch_size as u64 && o.sample_errors == 0;
                (o.ok && complete, o.sample_bytes)
            }
            Workload::Stream => {
                let q = format!(
                    "prefix={}&seed=1&shard={w}%2F{}&stream=",
                    sigv4::uri_encode(args.prefix.as_bytes(), false),
                    args.concurrency.max(1)
                );
                let o = client
                    .request_tar(
                        &mut conn,
                        Method::GET,
                        &format!("/{}", args.bucket),
                        &q,
                        Bytes::new(),
                        Ask {
                            tar: true,
                            ..Ask::default()
                        },
                    )
                    .await?;
                listed += o.samples;
                hist.record(t.elapsed().as_micros().max(1) as u64)
                    .map_err(|e| e.to_string())?;
                bytes += o.sample_bytes;
                if !o.ok || o.sample_errors > 0 {
                    done_errs.fetch_add(1, Ordering::Relaxed);
                }
                // One stream per connection is the whole of its shard's epoch.
                break;
            }
            Workload::List => {
                let mut q = format!(
                    "list-type=2&max-keys=1000&prefix={}",
                    sigv4::uri_encode(args.prefix.as_bytes(), false)
                );
                if let Some(tk) = &token {
                    q = format!(
                        "continuation-token={}&{q}",
                        sigv4::uri_encode(tk.as_bytes(), false)
                    );
                }
                let o = client
                    .request(
                        &mut conn,
                        Method::GET,
                        &format!("/{}", args.bucket),
                        &q,
                        Bytes::new(),
                    )
                    .await?;
                let text = String::from_utf8_lossy(&o.body);
                listed += text.matches("<Key>").count() as u64;
                token = text
                    .split("<NextContinuationToken>")
                    .nth(1)
                    .and_then(|s| s.split('<').next())
                    .map(str::to_string);
                let finished = token.is_none();
                let r = (o.ok, o.bytes);
                if finished {
                    hist.record(t.elapsed().as_micros().max(1) as u64)
                        .map_err(|e| e.to_string())?;
                    bytes += r.1;
                    break;
                }
                r
            }
        };
        hist.record(t.elapsed().as_micros().max(1) as u64)
            .map_err(|e| e.to_string())?;
        bytes += b;
        if !ok {
            done_errs.fetch_add(1, Ordering::Relaxed);
        }
    }
    Ok((hist, bytes, listed))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_durations() {
        assert_eq!(parse_size("4KiB").unwrap(), 4096);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("x").is_err());
        assert_eq!(parse_duration("30s").unwrap(), Duration::from_secs(30));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
    }

    #[test]
    fn zipf_prefers_small_indices() {
        use rand::SeedableRng;
        let c = KeyChooser::new(1000, Some(1.0));
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let low = (0..10_000).filter(|_| c.pick(&mut rng) < 10).count();
        assert!(low > 3000, "{low}");
    }
}
