//! packrat's extensions for data loaders, each a signed S3-style request answered (or sent) as
//! a TAR stream:
//!
//! - batch GET, `POST /{bucket}?batch` with a JSON list of items (keys, ranges, TAR members);
//! - epoch streams, `GET /{bucket}?stream&prefix=..&shard=i/n&worker=w/m&seed=s&epoch=e`: one
//!   worker's share of a seeded permutation of the prefix's samples, read as batches;
//! - TAR members: `member` names one file inside a TAR object, found through a member index
//!   the store builds on first use;
//! - batch PUT, a TAR sent by PutObject with `x-amz-meta-snowball-auto-extract: true`, which
//!   becomes one object per member, committed together.
//!
//! This side parses the requests and writes the TAR: [`Out`] is the store's [`EntrySink`],
//! laying out entries in frames that go to the connection through a small queue. Which
//! records, where they lie and how they are read is the store's business (the `batch` module
//! of the store crate).

use super::{Action, check_key, load_bucket, load_bucket_for_keys};
use crate::config;
use crate::s3::batch_request::{BatchRequest, OnError, Order, parse_item_range, parse_shard};
use crate::s3::checksum::{self, ChecksumWire, Hasher};
use crate::s3::error::{S3Error, S3ErrorCode, S3Result};
use crate::s3::headers::{content_md5, requested_checksum};
use crate::state::{AppState, RespBody, S3Request};
use bytes::{Bytes, BytesMut};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use md5::{Digest, Md5};
use packrat_store_api::batch::{BatchItem, BatchOrder, EntryHead, EntrySink};
use packrat_store_api::stream::{self, Grouping, StreamOrder, StreamQuery, Tail};
use packrat_store_api::{Bucket, StoreError};
use packrat_tar::{self as tar, TarError, TarEvent, TarParser};
use std::sync::Arc;

type R = S3Result<Response<RespBody>>;

/// Output is sent to the client in frames of about this size.
const FRAME_BYTES: usize = 1024 * 1024;
/// Frames buffered between the reader task and the connection.
const FRAMES_QUEUED: usize = 4;

impl From<TarError> for S3Error {
    fn from(e: TarError) -> Self {
        S3Error::new(
            S3ErrorCode::InvalidRequest,
            format!("The TAR archive is malformed: {}", e.0),
        )
    }
}

fn bad(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::new(code, msg)
}

/// The output side of a TAR stream: entries are written into a buffer that goes to the
/// connection in frames, through a small queue (the bound on memory ahead of the client).
/// Frame buffers are reused from a request-local pool, so a long stream does not churn the
/// allocator (buffers freed on other threads are slow to return to the system).
struct Out {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: BytesMut,
    /// Frames sent, kept so their buffers can be reused once the connection has written them.
    sent: std::collections::VecDeque<Bytes>,
    abort_on_error: bool,
    /// Set once the client is gone or the stream was cut or ended: nothing more is produced.
    stopped: bool,
    /// When the reply started (unix seconds): the time of its error entries.
    started_secs: i64,
    /// The pax record an entry's tag travels in: `packrat.tag` (a batch item's label) or
    /// `packrat.sample` (an epoch stream's sample index).
    tag_record: &'static str,
    /// Set while more batches follow: the end of one batch is not the end of the archive.
    hold_finish: bool,
}

/// Frame buffers kept for reuse.
const FRAME_POOL: usize = FRAMES_QUEUED + 4;

impl Out {
    /// A cleared frame buffer: the oldest sent frame's, if the connection is done with it.
    fn fresh_buffer(&mut self) -> BytesMut {
        if let Some(i) = self.sent.iter().position(|b| b.is_unique())
            && let Some(old) = self.sent.remove(i)
            && let Ok(mut b) = old.try_into_mut()
        {
            b.clear();
            return b;
        }
        if self.sent.len() >= FRAME_POOL {
            // Still being written: the connection frees it when done.
            self.sent.pop_front();
        }
        BytesMut::with_capacity(FRAME_BYTES + 64 * 1024)
    }

    fn end_archive(&mut self) {
        self.buf.extend_from_slice(&tar::END_OF_ARCHIVE);
    }
}

#[async_trait::async_trait]
impl EntrySink for Out {
    fn stopped(&self) -> bool {
        self.stopped
    }

    fn frame_len(&self) -> usize {
        self.buf.len()
    }

    fn frame_full(&self) -> bool {
        self.buf.len() >= FRAME_BYTES
    }

    fn header(&mut self, e: EntryHead<'_>, size: u64, mtime_ms: i64, etag: &str) {
        let name = entry_name(e.name);
        let mut pairs = [("packrat.etag", etag), ("", ""), ("", "")];
        let mut n = 1;
        if let Some(t) = e.tag {
            pairs[n] = (self.tag_record, t);
            n += 1;
        }
        if name != e.name {
            pairs[n] = ("packrat.key", e.name);
            n += 1;
        }
        tar::write_entry_header(&mut self.buf, &name, size, mtime_ms / 1000, &pairs[..n]);
    }

    fn reserve(&mut self, size: u64) -> usize {
        let at = self.buf.len();
        self.buf.resize(at + size as usize + tar::padding(size), 0);
        at
    }

    fn frame_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    fn end_payload(&mut self, size: u64) {
        self.buf.resize(self.buf.len() + tar::padding(size), 0);
    }

    async fn flush(&mut self) {
        if self.buf.is_empty() || self.stopped {
            return;
        }
        let next = self.fresh_buffer();
        let frame = std::mem::replace(&mut self.buf, next).freeze();
        self.sent.push_back(frame.clone());
        if self.tx.send(Ok(frame)).await.is_err() {
            self.stopped = true;
        }
    }

    async fn send(&mut self, data: Bytes) -> bool {
        self.flush().await;
        if self.stopped || self.tx.send(Ok(data)).await.is_err() {
            self.stopped = true;
        }
        !self.stopped
    }

    /// An error entry is named `__error__/{name}`, says `{code}: {message}` and carries the
    /// pax records `packrat.error` (the code) and `packrat.key` (the item's exact name); with
    /// `on_error: abort` the archive ends after it.
    async fn error(&mut self, e: EntryHead<'_>, error: &StoreError) -> bool {
        let err = S3Error::from(error.clone());
        let code = err.code.parts().0;
        let body = format!("{code}: {}\n", err.message);
        let name = format!("{ERROR_PREFIX}{}", entry_name(e.name));
        let mut extra = vec![("packrat.error", code), ("packrat.key", e.name)];
        if let Some(t) = e.tag {
            extra.push((self.tag_record, t));
        }
        tar::write_entry_header(
            &mut self.buf,
            &name,
            body.len() as u64,
            self.started_secs,
            &extra,
        );
        self.buf.extend_from_slice(body.as_bytes());
        self.end_payload(body.len() as u64);
        if self.abort_on_error {
            self.hold_finish = false;
            self.finish().await;
            self.stopped = true;
            return false;
        }
        true
    }

    async fn cut(&mut self, error: &StoreError) {
        let err = S3Error::from(error.clone());
        self.flush().await;
        let _ = self.tx.send(Err(std::io::Error::other(err.message))).await;
        self.stopped = true;
    }

    async fn finish(&mut self) {
        if self.hold_finish {
            self.flush().await;
            return;
        }
        if !self.stopped {
            self.end_archive();
            self.flush().await;
        }
    }
}

/// Where error entries live; no object entry is ever named under it (see [`entry_name`]).
pub const ERROR_PREFIX: &str = "__error__/";
/// Where entries of keys that are not safe to extract as named live.
pub const RENAMED_PREFIX: &str = "__key__/";

/// The TAR name of an entry for `name` (a key, or `key/member`): the name itself when `tar -x`
/// may create it as is, inside the directory it runs in; otherwise `__key__/` and the name
/// percent-encoded as in a URI path segment (`/` too: one path component, never `..`), its
/// exact form in the entry's `packrat.key` pax record. Unsafe: empty, an absolute path, a `..` component, a NUL,
/// or a name under `__error__/` or `__key__/`, which are packrat's, so an object entry can
/// never be taken for an error entry. Costs one scan of the name per entry.
pub fn entry_name(name: &str) -> std::borrow::Cow<'_, str> {
    let safe = !name.is_empty()
        && !name.starts_with('/')
        && !name.contains('\0')
        && !name.split('/').any(|c| c == "..")
        && !name.starts_with(ERROR_PREFIX)
        && !name.starts_with(RENAMED_PREFIX);
    if safe {
        return std::borrow::Cow::Borrowed(name);
    }
    let mut encoded = crate::s3::sigv4::uri_encode(name.as_bytes(), false);
    if encoded == ".." {
        encoded = "%2E%2E".into();
    }
    std::borrow::Cow::Owned(format!("{RENAMED_PREFIX}{encoded}"))
}

/// A TAR answer streamed from `rx`. `cut_after`: a fault (`--fault-injection`) that ends the
/// body after that many bytes, as a dropped connection would.
fn tar_response(
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    extra: &[(&str, String)],
    cut_after: Option<u64>,
) -> R {
    let stream = futures_util::stream::unfold((rx, cut_after), |(mut rx, left)| async move {
        if left == Some(0) {
            // The body ends in an error: hyper drops the connection, as a crash would.
            return Some((Err(std::io::Error::other("injected cut")), (rx, left)));
        }
        let f = rx.recv().await?;
        match (f, left) {
            (Ok(b), Some(n)) => {
                let take = b.len().min(n as usize);
                let next = Some(n - take as u64);
                Some((Ok(http_body::Frame::data(b.slice(..take))), (rx, next)))
            }
            (f, left) => Some((f.map(http_body::Frame::data), (rx, left))),
        }
    });
    let mut rb = Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/x-tar");
    for (k, v) in extra {
        rb = rb.header(*k, v.as_str());
    }
    rb.body(http_body_util::StreamBody::new(stream).boxed_unsync())
        .map_err(|e| S3Error::internal("response", e))
}

/// The cut a fault rule asks of the next TAR answer, if any.
fn injected_cut(state: &AppState) -> Option<u64> {
    let f = &state.http_faults;
    (state.config.fault_injection && crate::state::HttpFaults::take(&f.cuts))
        .then(|| f.cut_after_bytes.load(std::sync::atomic::Ordering::Relaxed))
}

fn output(
    state: &AppState,
    abort_on_error: bool,
) -> (
    Out,
    tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(FRAMES_QUEUED);
    (
        Out {
            tx,
            buf: BytesMut::with_capacity(FRAME_BYTES + 64 * 1024),
            sent: Default::default(),
            abort_on_error,
            stopped: false,
            started_secs: state.clock.now_ms().div_euclid(1000),
            tag_record: "packrat.tag",
            hold_finish: false,
        },
        rx,
    )
}

// ---------------------------------------------------------------- batch GET

pub async fn handle_batch_get(state: &Arc<AppState>, req: &mut S3Request, bname: &str) -> R {
    // Every item names a key of this bucket: s3:GetObject on each. Under a bucket policy each
    // key is judged, and a batch with a key the caller may not read is refused whole (naming
    // the item), before anything is read.
    let (b, policy) = load_bucket_for_keys(state, req, bname, Action::GET_OBJECT).await?;
    let body = req.body.read_to_end(config::BATCH_JSON_BYTES_MAX).await?;
    let r: BatchRequest = serde_json::from_slice(&body).map_err(|e| {
        bad(
            S3ErrorCode::MalformedJSON,
            format!("The batch request is not valid: {e}"),
        )
    })?;
    let limits = &state.config;
    if r.items.len() > limits.batch_items_max {
        return Err(bad(
            S3ErrorCode::InvalidRequest,
            format!(
                "The batch has {} items; the limit is {} (--batch-items-max)",
                r.items.len(),
                limits.batch_items_max
            ),
        ));
    }
    let mut items = Vec::with_capacity(r.items.len());
    for (i, it) in r.items.into_iter().enumerate() {
        if it.key.is_empty() || it.key.len() > config::KEY_BYTES_MAX {
            return Err(bad(
                S3ErrorCode::InvalidArgument,
                format!(
                    "item {i}: a key must be 1 to {} bytes",
                    config::KEY_BYTES_MAX
                ),
            ));
        }
        check_key(req, &b, policy.as_deref(), Action::GET_OBJECT, &it.key).map_err(|e| {
            let msg = format!("item {i} ({}): {}", it.key, e.message);
            bad(e.code, msg)
        })?;
        if it.member.as_deref() == Some("") {
            return Err(bad(
                S3ErrorCode::InvalidArgument,
                format!("item {i}: an empty member name"),
            ));
        }
        let range = match &it.range {
            None => None,
            Some(s) => Some(
                parse_item_range(s)
                    .map_err(|m| bad(S3ErrorCode::InvalidArgument, format!("item {i}: {m}")))?,
            ),
        };
        items.push(BatchItem {
            key: it.key,
            member: it.member,
            range,
            tag: it.tag,
        });
    }
    let order = match r.order {
        Order::Request => BatchOrder::Request,
        Order::Storage => BatchOrder::Storage,
    };
    let plan = state.store.plan_batch(&b, items, order).await?;
    if plan.bytes > limits.batch_bytes_max {
        return Err(bad(
            S3ErrorCode::EntityTooLarge,
            format!(
                "The batch asks for {} bytes; the limit is {} (--batch-bytes-max)",
                plan.bytes, limits.batch_bytes_max
            ),
        ));
    }
    let count = plan.entries;
    let (mut out, rx) = output(state, r.on_error == OnError::Abort);
    let store = state.store.clone();
    tokio::spawn(async move { store.read_batch(plan, &mut out).await });
    tar_response(
        rx,
        &[("x-packrat-batch-items", count.to_string())],
        injected_cut(state),
    )
}

// ---------------------------------------------------------------- epoch streams

/// Samples planned and read as one batch by an epoch stream.
const STREAM_BATCH_SAMPLES: usize = 1024;

fn stream_param<T>(
    req: &S3Request,
    name: &str,
    default: T,
    what: &str,
    parse: impl Fn(&str) -> Option<T>,
) -> S3Result<T> {
    match req.q(name) {
        None => Ok(default),
        Some(s) => parse(s).ok_or_else(|| {
            bad(
                S3ErrorCode::InvalidArgument,
                format!("{name}={s:?} must be {what}"),
            )
        }),
    }
}

/// An epoch stream's query (see [`packrat_store_api::stream`]), its `on_error` and the
/// listing hash a resuming client expects.
fn stream_query(req: &S3Request) -> S3Result<(StreamQuery, bool, Option<u64>)> {
    if req.q("window").is_some() {
        return Err(bad(
            S3ErrorCode::InvalidArgument,
            "window= is no longer supported: an epoch stream is a permutation of the whole \
             prefix (order=shuffle), or key order (order=sorted)",
        ));
    }
    let u64_param = |s: &str| s.parse::<u64>().ok();
    let (shard, shards) = stream_param(req, "shard", (0, 1), "i/n with 0 <= i < n", parse_shard)?;
    let (worker, workers) =
        stream_param(req, "worker", (0, 1), "w/n with 0 <= w < n", parse_shard)?;
    let q = StreamQuery {
        prefix: req.q("prefix").unwrap_or("").to_string(),
        shard,
        shards,
        worker,
        workers,
        seed: stream_param(req, "seed", 0, "an unsigned 64-bit integer", u64_param)?,
        epoch: stream_param(req, "epoch", 0, "an unsigned 64-bit integer", u64_param)?,
        start: stream_param(req, "start", 0, "an unsigned 64-bit integer", u64_param)?,
        order: stream_param(
            req,
            "order",
            StreamOrder::Shuffle,
            "shuffle or sorted",
            |s| match s {
                "shuffle" => Some(StreamOrder::Shuffle),
                "sorted" => Some(StreamOrder::Sorted),
                _ => None,
            },
        )?,
        group: stream_param(
            req,
            "group",
            Grouping::Basename,
            "basename or key",
            |s| match s {
                "basename" => Some(Grouping::Basename),
                "key" => Some(Grouping::Key),
                _ => None,
            },
        )?,
        tail: stream_param(req, "tail", Tail::Pad, "pad or drop", |s| match s {
            "pad" => Some(Tail::Pad),
            "drop" => Some(Tail::Drop),
            _ => None,
        })?,
    };
    let abort = stream_param(req, "on_error", false, "continue or abort", |s| match s {
        "continue" => Some(false),
        "abort" => Some(true),
        _ => None,
    })?;
    let listing = stream_param(req, "listing", None, "16 hex digits", |s| {
        // Digits only: `from_str_radix` alone would take a leading `+`.
        (s.len() == 16 && s.bytes().all(|b| b.is_ascii_hexdigit()))
            .then(|| u64::from_str_radix(s, 16).ok().map(Some))
            .flatten()
    })?;
    Ok((q, abort, listing))
}

/// `GET /{bucket}?routes`: where the bucket's objects can be read straight from the storage
/// nodes that hold them (a cluster's map, see [`packrat_store_api::routes`]), for a caller who
/// may list the bucket. One server answers 501: every read has one place, here.
pub async fn handle_routes(state: &Arc<AppState>, req: &S3Request, bname: &str) -> R {
    let b = load_bucket(state, req, bname, Action::LIST_BUCKET).await?;
    let Some(routes) = state.store.route_map(&b).await? else {
        return Err(bad(
            S3ErrorCode::NotImplemented,
            "This server is not a cluster: every read has one place, here.",
        ));
    };
    let body = serde_json::to_vec(&routes).map_err(|e| S3Error::internal("routes", e))?;
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(crate::state::full(body))
        .map_err(|e| S3Error::internal("response", e))
}

/// An epoch stream: the worker's samples planned from a listing of the prefix (see
/// [`packrat_store_api::stream`]), then read as batches of [`STREAM_BATCH_SAMPLES`] samples in
/// the planned order, into one TAR. Each entry carries its sample's index (`packrat.sample`).
pub async fn handle_epoch_stream(state: &Arc<AppState>, req: &S3Request, bname: &str) -> R {
    // s3:ListBucket (with the stream's prefix), then s3:GetObject on every key it will send:
    // under a bucket policy a stream over a key the caller may not read is refused whole.
    let b = load_bucket(state, req, bname, Action::LIST_BUCKET).await?;
    let (_, policy) = load_bucket_for_keys(state, req, bname, Action::GET_OBJECT).await?;
    let (query, abort, listing) = stream_query(req)?;
    let keys = state.store.stream_keys(&b, &query.prefix).await?;
    if let Some(p) = policy.as_deref() {
        for i in 0..keys.len() {
            let key = keys.get(i);
            check_key(req, &b, Some(p), Action::GET_OBJECT, key).map_err(|e| {
                bad(
                    e.code,
                    format!("{} ({key}): the bucket policy does not let this caller read every object under the prefix", e.message),
                )
            })?;
        }
    }
    let (keys, plan) = {
        let q = query.clone();
        tokio::task::spawn_blocking(move || {
            let p = stream::plan(&keys, &q);
            (keys, p)
        })
        .await
        .map_err(|e| S3Error::internal("stream plan", e))?
    };
    let plan = plan.map_err(|m| bad(S3ErrorCode::InvalidRequest, m))?;
    if listing.is_some_and(|l| l != plan.listing) {
        return Err(bad(
            S3ErrorCode::PreconditionFailed,
            "The objects under the prefix changed since the stream began (listing= does not \
             match): a resumed stream would not continue the same epoch; start it again",
        ));
    }
    let headers = [
        (
            "x-packrat-shard",
            format!("{}/{}", query.shard, query.shards),
        ),
        (
            "x-packrat-worker",
            format!("{}/{}", query.worker, query.workers),
        ),
        ("x-packrat-seed", query.seed.to_string()),
        ("x-packrat-epoch", query.epoch.to_string()),
        ("x-packrat-start", query.start.to_string()),
        ("x-packrat-samples", plan.worker_samples.to_string()),
        ("x-packrat-samples-per-rank", plan.per_rank.to_string()),
        ("x-packrat-samples-total", plan.total.to_string()),
        ("x-packrat-listing", format!("{:016x}", plan.listing)),
    ];
    if req.has_q("plan") {
        return stream_plan_answer(&plan, &keys, &headers);
    }
    let (mut out, rx) = output(state, abort);
    out.tag_record = "packrat.sample";
    out.hold_finish = true;
    let store = state.store.clone();
    tokio::spawn(async move {
        // The records in one sequential pass before the permuted lookups (a cold cache would
        // make each a random index read); a failure here only costs speed.
        let positions = plan.samples.iter().flat_map(|s| s.first..s.end).collect();
        if let Err(e) = store.warm_listing(&b, &query.prefix, positions).await {
            tracing::warn!(error = %e, "epoch stream: warming the records failed");
        }
        for batch in plan.samples.chunks(STREAM_BATCH_SAMPLES) {
            let mut items = Vec::with_capacity(batch.len() * 2);
            for s in batch {
                let tag = s.index.to_string();
                for i in s.first..s.end {
                    items.push(BatchItem {
                        key: keys.get(i).to_string(),
                        member: None,
                        range: None,
                        tag: Some(tag.clone()),
                    });
                }
            }
            match store.plan_batch(&b, items, BatchOrder::Request).await {
                Ok(p) => store.read_batch(p, &mut out).await,
                Err(e) => {
                    out.cut(&e).await;
                    return;
                }
            }
            if out.stopped {
                return;
            }
        }
        out.hold_finish = false;
        out.finish().await;
    });
    tar_response(rx, &headers, injected_cut(state))
}

/// An epoch stream's plan instead of its samples (`?stream&plan`): the worker's samples from
/// `start`, each `[index, [key, ...]]`, with the stream's headers; a client that reads
/// straight from the nodes (see `handle_routes`) reads them by batch GET.
fn stream_plan_answer(
    plan: &stream::StreamPlan,
    keys: &stream::KeyList,
    headers: &[(&'static str, String)],
) -> R {
    let samples: Vec<serde_json::Value> = plan
        .samples
        .iter()
        .map(|s| {
            serde_json::json!([
                s.index,
                (s.first..s.end).map(|i| keys.get(i)).collect::<Vec<_>>()
            ])
        })
        .collect();
    let body = serde_json::to_vec(&serde_json::json!({ "samples": samples }))
        .map_err(|e| S3Error::internal("stream plan", e))?;
    let mut r = Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json");
    for (name, value) in headers {
        r = r.header(*name, value);
    }
    r.body(crate::state::full(body))
        .map_err(|e| S3Error::internal("response", e))
}

// ---------------------------------------------------------------- batch PUT

/// The target prefix of an extracted TAR: `x-amz-meta-snowball-prefix` (or MinIO's
/// `x-minio-snowball-prefix`) if sent, else the PUT key's "directory" (up to its last `/`).
fn snowball_prefix(req: &S3Request, key: &str) -> String {
    if let Some(p) = req
        .header("x-amz-meta-snowball-prefix")
        .or_else(|| req.header("x-minio-snowball-prefix"))
    {
        let p = p.trim_matches('/');
        return if p.is_empty() {
            String::new()
        } else {
            format!("{p}/")
        };
    }
    match key.rfind('/') {
        Some(i) => key[..=i].to_string(),
        None => String::new(),
    }
}

/// A member name as an object key under `prefix`: leading `./` and `/` are dropped; names with
/// NUL or that end up empty are refused.
fn member_key(prefix: &str, name: &str) -> Result<String, String> {
    let mut n = name;
    loop {
        if let Some(r) = n.strip_prefix("./") {
            n = r;
        } else if let Some(r) = n.strip_prefix('/') {
            n = r;
        } else {
            break;
        }
    }
    if n.is_empty() || n.contains('\0') {
        return Err(format!("the member name {name:?} cannot be an object key"));
    }
    let key = format!("{prefix}{n}");
    if key.len() > config::KEY_BYTES_MAX {
        return Err(format!(
            "the member name {name:?} gives a key longer than {} bytes",
            config::KEY_BYTES_MAX
        ));
    }
    Ok(key)
}

pub async fn handle_snowball_put(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bucket: &Bucket,
    key: &str,
) -> R {
    let prefix = snowball_prefix(req, key);
    let (alg, sent) = requested_checksum(&req.headers)?;
    let want_md5 = content_md5(&req.headers)?;
    let mut md5 = Md5::new();
    let mut hasher = alg.map(Hasher::new);
    let items_max = state.config.batch_items_max;
    let mut parser = TarParser::new();
    let mut writer = state.store.batch_writer(bucket)?;
    let mut open = false;
    let mut skipped: Vec<String> = Vec::new();
    let mut bytes = 0u64;
    while let Some(piece) = req.body.next().await? {
        md5.update(&piece);
        if let Some(h) = hasher.as_mut() {
            h.update(&piece);
        }
        parser.push(&piece, &mut |ev| -> S3Result<()> {
            match ev {
                TarEvent::File { name, .. } => {
                    let k = member_key(&prefix, &name)
                        .map_err(|m| bad(S3ErrorCode::InvalidRequest, m))?;
                    if writer.count() >= items_max {
                        return Err(bad(
                            S3ErrorCode::InvalidRequest,
                            format!(
                                "The TAR has more than {items_max} members (--batch-items-max)"
                            ),
                        ));
                    }
                    writer.begin(k)?;
                    open = true;
                }
                TarEvent::Data(d) => {
                    if open {
                        writer.write(d)?;
                    }
                }
                TarEvent::FileEnd => {
                    if open {
                        bytes += writer.end()?;
                        open = false;
                    }
                }
                TarEvent::Skipped { name } => skipped.push(name),
            }
            Ok(())
        })?;
    }
    parser.finish()?;
    let md5: [u8; 16] = md5.finalize().into();
    if want_md5.is_some_and(|w| w != md5) {
        return Err(bad(
            S3ErrorCode::BadDigest,
            "The Content-MD5 you specified did not match what we received.",
        ));
    }
    if let (Some(alg), Some(h)) = (alg, hasher) {
        let got = h.finish().0;
        let want = match sent {
            Some(w) => Some(w),
            None => match req.body.trailer(alg.header()) {
                Some(v) => Some(checksum::decode_sent(alg, v)?),
                None => None,
            },
        };
        if want.is_some_and(|w| w != got) {
            return Err(bad(
                S3ErrorCode::BadDigest,
                format!(
                    "The {} you specified did not match the calculated checksum.",
                    alg.name()
                ),
            ));
        }
    }
    let count = writer.commit().await?;
    // The summary is XML like every S3 answer: SDKs check a PutObject body for an S3 error
    // document and refuse anything they cannot parse as XML.
    let mut x = crate::s3::xml::Xml::new();
    x.root("ExtractResult");
    x.elem("Prefix", &prefix);
    x.elem("Objects", &count.to_string());
    x.elem("Bytes", &bytes.to_string());
    for s in &skipped {
        x.elem("Skipped", s);
    }
    x.close("ExtractResult");
    Response::builder()
        .status(StatusCode::OK)
        .header("etag", format!("\"{}\"", hex::encode(md5)))
        .header("content-type", "application/xml")
        .header("x-packrat-extracted-objects", count.to_string())
        .body(crate::state::full(x.finish()))
        .map_err(|e| S3Error::internal("response", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use packrat_store_api::batch::{ItemRange, resolve_item_range};

    #[test]
    fn entry_names_are_safe_to_extract() {
        for ok in [
            "a",
            "train/000001.jpg",
            "a/b..c/.d",
            "..x",
            "x/...",
            "__errors__/x",
        ] {
            assert_eq!(entry_name(ok), ok);
        }
        for (bad, want) in [
            ("../escape.txt", "__key__/..%2Fescape.txt"),
            ("/etc/passwd", "__key__/%2Fetc%2Fpasswd"),
            ("a/../../b", "__key__/a%2F..%2F..%2Fb"),
            ("a/..", "__key__/a%2F.."),
            ("..", "__key__/%2E%2E"),
            ("__error__/fake", "__key__/__error__%2Ffake"),
            ("__key__/x", "__key__/__key__%2Fx"),
        ] {
            let got = entry_name(bad);
            assert_eq!(got, want, "{bad}");
            assert!(!got.split('/').any(|c| c == ".." || c.is_empty()));
        }
    }

    #[test]
    fn item_ranges_parse() {
        use ItemRange::*;
        assert_eq!(parse_item_range("bytes=0-99"), Ok(From(0, Some(99))));
        assert_eq!(parse_item_range("bytes=5-"), Ok(From(5, None)));
        assert_eq!(parse_item_range("bytes=-10"), Ok(Suffix(10)));
        for bad in [
            "0-9",
            "bytes=9-0",
            "bytes=-",
            "bytes=a-b",
            "bytes=0-1,4-5",
            "bytes=-0",
        ] {
            assert!(parse_item_range(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn member_keys() {
        assert_eq!(member_key("p/", "./a/b.jpg").unwrap(), "p/a/b.jpg");
        assert_eq!(member_key("", "/x").unwrap(), "x");
        assert!(member_key("p/", "./").is_err());
        assert!(member_key("p/", "a\0b").is_err());
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]
        /// Batch request bodies and item ranges of any shape: parsed or refused, never a panic;
        /// a resolved range always lies inside the object.
        #[test]
        fn batch_inputs_never_panic(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            range in "(bytes=)?[-0-9,]{0,30}|\\PC{0,30}",
            len in 0u64..1_000_000,
            shard in "\\PC{0,12}",
        ) {
            let _ = serde_json::from_slice::<BatchRequest>(&body);
            if let Ok(r) = parse_item_range(&range)
                && let Some((a, b)) = resolve_item_range(r, len)
            {
                proptest::prop_assert!(a < b && b <= len);
            }
            if let Some((i, n)) = parse_shard(&shard) {
                proptest::prop_assert!(i < n);
            }
        }
    }
}
