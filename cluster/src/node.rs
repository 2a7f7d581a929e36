//! `packrat node`: a storage node. It keeps the objects of the PGs it serves in its own local
//! store (RocksDB index, segments, erasure coding across its disks), and answers the internal
//! API of [`crate::wire`]: chain writes and deletes, reads, PG listings.
//!
//! **Chain replication** (CRAQ, as DeepSeek's 3FS does it): a write enters at the PG's head,
//! which gives it a version (`cv`: microseconds since the epoch, above every version the key
//! had), makes it durable, forwards it to the next member and answers once the rest of the
//! chain has answered, so an acknowledged write is durable on every member. Each member marks
//! the key dirty while its write is on the way down the chain; a read of a dirty key goes to
//! the tail, whose copy is committed by definition; a step that could not be handed on is
//! re-sent down the chain until it is (see `unsettled`). A member applies a version only if it is
//! newer than what it has (a delete leaves a tombstone with its version), so replays, resyncs
//! and writes that overtake each other never bring back older data.
//!
//! A local bucket `o-<bucket id>` holds a cluster bucket's objects (the version is kept in the
//! object's metadata under [`CV_META`]), `t-<bucket id>` its tombstones.

use crate::map::{ClusterMap, Etcd};
use crate::placement::pg_of;
use crate::relay::RelayItem;
use crate::wire::meta_codec::{META_CODEC_HEADER, META_CODEC_V1};
use crate::wire::{
    BATCH_ITEMS_MAX, CV_HEADER, CV_META, EPOCH_HEADER, GatherItem, Gathered, MD5_META, META_HEADER,
    NodeClient, PUT_HEADER, SECRET_HEADER, VER_META, WireBatchItem, WireEntry, WireError,
    WireLockChange, WireMeta, WirePage, WirePut, WireRefusal, WireVersioning, decode, encode,
    hop_timeout, is_node_meta,
};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use packrat_store_api::batch::BatchOrder;
use packrat_store_api::checksum::ChecksumAlgorithm;
use packrat_store_api::{
    Bucket, ByteSource, ListQuery, NewBucket, ObjectInfo, ObjectStore, PutObject, StoreError,
    StoreResult,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

mod admin;
mod batch;
mod dropped;
pub(crate) use dropped::cluster_bucket_of;
mod edit;
mod epochs;
pub mod held;
mod lifecycle;
pub use lifecycle::LifecycleSchedule;
mod reports;
mod unsettled;
mod uploads;
mod versions;

type NodeResp = Response<http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>>;

/// A key's mark in [`Node::dirty`]: the version of its newest step here not yet acknowledged
/// by the rest of the chain, and the mark that step replaced, if an earlier step was not
/// handed on either. A step that fails before it is handed on (a conditional write refused,
/// a store error) puts the earlier mark back: before, it cleared the key, and this member
/// then answered reads with the earlier step's version, which the tail lacked, as committed
/// (a read went back once the tail answered again).
///
/// `epoch` is the map's when the mark was made: a member whose mark predates the chain it now
/// serves in may have been moved ahead of members that lack the version (the manager moves a
/// member to the head to spread heads), so as the tail it does not answer that version as
/// committed until it has re-sent it through the head (see `unsettled`).
#[derive(Clone, Copy, Debug, PartialEq)]
struct DirtyMark {
    cv: u64,
    before: Option<u64>,
    epoch: u64,
}

/// How long a connection may take to send a request's head (see [`Node::serve`]). hyper
/// counts it from the end of the previous answer too, so it also closes idle connections: it
/// is twice the time a client keeps a pooled connection unused, so that the client, not this
/// node, closes them (a request sent on a connection the node just closed would fail).
const NODE_HEADER_TIMEOUT: Duration = Duration::from_secs(2 * crate::wire::POOL_IDLE.as_secs());
/// Internal requests a node serves at once; past it, a request is answered 503 at once rather
/// than queued without bound (a gateway tries another member or gives the client 503).
const REQUESTS_MAX: usize = 2048;
/// Key locks at least: a node holds one lock per stripe of keys (see [`Node::lock_of`]).
const LOCK_STRIPES: u32 = 1024;
/// How often a node re-sends the chain steps it applied and could not hand on.
const RESEND_EVERY: Duration = Duration::from_secs(1);
/// How long a resync request may take.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(10);
/// Exact-version lookups kept for reads that follow a metadata request.
const RECENT_MAX: usize = 16_384;
/// PGs caught up on in one pass over the buckets (their numbers go in a listing's query).
const RESYNC_PGS: usize = 256;

pub struct Node {
    pub id: String,
    store: Arc<dyn ObjectStore>,
    map: watch::Receiver<Arc<ClusterMap>>,
    secret: String,
    client: NodeClient,
    /// Chain steps to successors, relayed together under load (see [`crate::relay`]).
    relay: crate::relay::Relay,
    /// Key locks by stripe, a whole number of stripes per PG (see [`Node::lock_of`]).
    locks: Vec<tokio::sync::Mutex<()>>,
    /// Keys whose newest write here is not yet acknowledged by the rest of the chain, with
    /// that write's version (and the mark it replaced, see [`DirtyMark`]).
    dirty: Mutex<HashMap<(u64, String), DirtyMark>>,
    /// When this node first found each version it marked lost (staged here, not made durable;
    /// see `unsettled`), so it settles only once a forward can no longer land after it.
    lost_since: Mutex<HashMap<(u64, String, u64), std::time::Instant>>,
    last_cv: AtomicU64,
    buckets: Mutex<HashMap<String, Bucket>>,
    /// Object versions handed out by metadata requests, so that the read that follows gets
    /// exactly that version even if a newer one landed in between.
    recent: Mutex<HashMap<(u64, String, u64), ObjectInfo>>,
    /// How long a delete's tombstone is kept (see [`Node::collect_tombstones`]).
    tombstone_keep: Duration,
    /// The operators' `/metrics` page, if served.
    metrics: Option<crate::MetricsPage>,
    /// Steps of keys' histories (deletes by version id) applied here and not yet handed on,
    /// the newest per key: a re-send makes the next member's history of the key this one's
    /// (see `versions`).
    history_steps: Mutex<HashMap<(u64, String), u64>>,
    /// Buckets this node applied a step of with versioning since it started: a step of
    /// theirs it could not hand on is re-sent as a copy of the key's whole history.
    versioned_bids: Mutex<HashSet<u64>>,
    /// Chain writes refused because their body did not match the CRC its sender sent.
    damaged: AtomicU64,
    /// Fault injection (tests): the next this many write bodies handed on to a successor
    /// have a byte changed after their CRC is taken (see `Node::hop_faults`).
    hop_flips: AtomicU64,
    /// Fault injection (tests): the next this many steps handed on to a successor are not
    /// sent, and fail as a successor that did not answer (see `Node::hop_faults`).
    hop_drops: AtomicU64,
    /// Local buckets dropped because their cluster bucket was deleted.
    buckets_dropped: AtomicU64,
    /// Held while the copies of PGs this node left are dropped, and while it catches up on
    /// PGs: a PG given back to it mid-drop is caught up on after the drop, never during it
    /// (see `dropped`).
    sweep: tokio::sync::Mutex<()>,
    /// PGs whose copies this node dropped after it left their chains, and the copies.
    pgs_dropped: AtomicU64,
    copies_dropped: AtomicU64,
    /// The PGs this node may hold copies of, kept in its data directory: a drop pass skips
    /// the others (see `held`).
    held: Arc<held::HeldPgs>,
    /// When this node's etcd lease was last known alive: it serves nothing once that is
    /// longer ago than [`crate::FENCE_MS`] (see [`Node::handle`]).
    lease: Arc<crate::LeaseClock>,
    /// Requests refused because the lease was not known alive.
    fenced: AtomicU64,
    /// This run's incarnation (see `NodeEntry::incarnation`), once registered; 0 before.
    incarnation: AtomicU64,
    /// Internal requests being served (see [`REQUESTS_MAX`]), and those refused past it.
    in_flight: std::sync::atomic::AtomicUsize,
    busy: AtomicU64,
    /// Members that failed their last probes (or did not answer a step), by id: probed on,
    /// and reported while unreachable (see `reports`).
    suspects: Mutex<HashMap<String, reports::Suspect>>,
    /// Whether this node stepped down: most of the other nodes cannot reach it, so it
    /// serves nothing until they can (see `reports`).
    stepped_down: std::sync::atomic::AtomicBool,
    /// Chain steps under way by the epoch they were routed by: a member catching up from this
    /// node waits for those of older maps to end before it lists (see `epochs`).
    steps: epochs::StepsByEpoch,
}

/// The start of a refusal's reason when the node is fenced (a gateway gives up sooner on it).
pub const FENCED: &str = "fenced";
/// The start of a refusal's reason when the node restarted and the map does not know it yet.
pub const RESTARTED: &str = "restarted";

/// The start of a refusal's reason when the tail holds a version of a key that the members
/// before it may lack (it took it before it became the tail): asked again shortly.
pub const UNSETTLED: &str = "unsettled";

/// The start of a refusal's reason when a chain step was applied here and could not be handed
/// on: the write may yet take effect (a gateway that tries it again may meet it).
pub const CHAIN_BROKEN: &str = "chain broken";

/// A place among the requests a node serves at once, given back when dropped.
struct InFlight<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> InFlight<'a> {
    fn take(count: &'a std::sync::atomic::AtomicUsize) -> Option<Self> {
        if count.fetch_add(1, Ordering::AcqRel) >= REQUESTS_MAX {
            count.fetch_sub(1, Ordering::AcqRel);
            return None;
        }
        Some(InFlight(count))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A request slot (see [`InFlight`]) kept by an answer that goes on after its handler
/// returned (a streamed one); given back when the answer is dropped.
struct HeldSlot(Arc<Node>);

impl Drop for HeldSlot {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Who asks for an object's metadata (see [`Node::read_meta`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Asker {
    /// A gateway's read: committed copies only.
    Reader,
    /// A member catching up on a PG.
    Resync,
    /// The next member of the chain, copying the version this node just made.
    Successor,
}

/// Why a request could not be served here.
enum Fail {
    /// 409: go elsewhere (an old epoch, not the head, a dirty copy).
    Refused(String),
    Store(StoreError),
}

impl From<StoreError> for Fail {
    fn from(e: StoreError) -> Self {
        Fail::Store(e)
    }
}

/// A chain step under way at one member (see [`Node::begin_step`]); the key stays locked
/// until it is dropped, so steps of one key reach every member in the head's order.
struct KeyStep<'a> {
    bid: u64,
    key: &'a str,
    chain: &'a [String],
    pos: usize,
    objects: Bucket,
    tombs: Bucket,
    /// The key's object here, and the version of its tombstone (0: none).
    obj: Option<ObjectInfo>,
    tomb: u64,
    /// The newest version this member has of the key (object or tombstone).
    have: u64,
    /// The step's version.
    cv: u64,
    _lock: tokio::sync::MutexGuard<'a, ()>,
    /// Counted under its map's epoch until it ends (see `epochs`).
    _epoch: epochs::StepOfEpoch<'a>,
}

impl KeyStep<'_> {
    fn at_head(&self) -> bool {
        self.pos == 0
    }
}

/// The JSON description a write, an edit or a part carries in `x-packrat-put`.
fn put_header<T: serde::de::DeserializeOwned, B>(
    req: &http::Request<B>,
    what: &str,
) -> StoreResult<T> {
    req.headers()
        .get(PUT_HEADER)
        .and_then(|v| serde_json::from_slice(v.as_bytes()).ok())
        .ok_or_else(|| StoreError::Invalid(format!("no {what} description")))
}

fn body_of(
    b: impl Into<Bytes>,
) -> http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error> {
    http_body_util::Full::new(b.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

/// The whole body of a request to this node (`what` names it in the error).
async fn body_of_request<B>(req: http::Request<B>, what: &str) -> StoreResult<Bytes>
where
    B: hyper::body::Body<Data = Bytes>,
    B::Error: std::fmt::Display,
{
    // A sender that stops mid-body (hung, or cut off by the network) would hold this request,
    // and its place among the node's requests, for as long as the connection lives: the body
    // must arrive within a hop's time for its size, as its sender waits for the answer.
    let limit = crate::wire::hop_timeout(req.body().size_hint().lower() as usize);
    match tokio::time::timeout(limit, req.into_body().collect()).await {
        Ok(body) => Ok(body
            .map_err(|e| StoreError::Unavailable(format!("{what} body: {e}")))?
            .to_bytes()),
        Err(_) => Err(StoreError::Unavailable(format!(
            "{what} body not received within {} ms",
            limit.as_millis()
        ))),
    }
}

/// An answer sent whole, with its CRC32C ([`crate::wire::ANSWER_CRC_HEADER`]).
fn answer(status: u16, body: impl Into<Bytes>) -> NodeResp {
    let body = body.into();
    let crc = crate::wire::body_crc32c(&body);
    answer_crc(status, body, crc)
}

/// An answer of object bytes, sent whole: as [`answer`], and the bytes of the next
/// [`ANSWER_FLIPS`] of them (and of streamed pieces) change after their CRC is taken (fault
/// injection).
fn answer_bytes(body: Bytes) -> NodeResp {
    let crc = crate::wire::body_crc32c(&body);
    answer_crc(200, flip_next(&ANSWER_FLIPS, body), crc)
}

/// Fault injection: `b` with a byte changed while `left` (flips still to make) is above 0,
/// taking one; else `b`.
fn flip_next(left: &AtomicU64, b: Bytes) -> Bytes {
    if b.is_empty()
        || left
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err()
    {
        return b;
    }
    let mut damaged = b.to_vec();
    damaged[b.len() / 2] ^= 0x20;
    Bytes::from(damaged)
}

fn answer_crc(status: u16, body: Bytes, crc: u32) -> NodeResp {
    let mut r = Response::new(body_of(body));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut()
        .insert(crate::wire::ANSWER_CRC_HEADER, http::HeaderValue::from(crc));
    r
}

/// Fault injection (tests): the next this many answers of object bytes (or pieces of a
/// streamed one, or frames of a batch answer that hold object bytes) this process sends
/// change on their way, after their CRC is taken (see `Node::hop_faults`).
static ANSWER_FLIPS: AtomicU64 = AtomicU64::new(0);

/// A streamed answer of `frames`, its CRC32C sent as a trailer once they are all sent
/// ([`crate::wire::ANSWER_CRC_HEADER`]); a frame that fails ends it without one.
fn streamed(
    frames: impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
) -> NodeResp {
    use futures_util::StreamExt;
    let digest = crate::wire::crc32c_digest();
    let frames = frames
        .map(Some)
        .chain(futures_util::stream::once(async { None }));
    let body = frames.scan((digest, false), |(digest, failed), f| {
        let out = match f {
            Some(Ok(b)) => {
                digest.update(&b);
                Some(Ok(hyper::body::Frame::data(flip_next(&ANSWER_FLIPS, b))))
            }
            Some(Err(e)) => {
                *failed = true;
                Some(Err(e))
            }
            None if *failed => None,
            None => {
                let mut t = http::HeaderMap::new();
                t.insert(
                    crate::wire::ANSWER_CRC_HEADER,
                    http::HeaderValue::from(digest.finalize() as u32),
                );
                Some(Ok(hyper::body::Frame::trailers(t)))
            }
        };
        futures_util::future::ready(out)
    });
    let mut r = Response::new(StreamBody::new(body).boxed_unsync());
    r.headers_mut().insert(
        http::header::TRAILER,
        http::HeaderValue::from_static(crate::wire::ANSWER_CRC_HEADER),
    );
    r
}

fn json<T: serde::Serialize>(status: u16, v: &T) -> NodeResp {
    answer(status, serde_json::to_vec(v).unwrap_or_default())
}

/// The PGs a listing request asks for (`pgs=1,5,..`) and its page size (`max`, 1,000 by
/// default, at most 10,000).
fn listing_scope(q: &HashMap<String, String>) -> (HashSet<u32>, usize) {
    let pgs = q
        .get("pgs")
        .map(|s| s.split(',').filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default();
    let max = q
        .get("max")
        .and_then(|m| m.parse().ok())
        .unwrap_or(1000)
        .clamp(1, 10_000);
    (pgs, max)
}

/// A digest the gateway sent in base64.
fn digest_of(v: &Option<String>) -> StoreResult<Option<Vec<u8>>> {
    v.as_deref()
        .map(|v| base64::engine::general_purpose::STANDARD.decode(v))
        .transpose()
        .map_err(|_| StoreError::Invalid("bad base64 digest".into()))
}

/// Chain-write bodies above this are hashed on the blocking pool. An 8 MiB part's MD5 takes
/// about 16 ms here; on a runtime thread it holds up every other request that thread serves
/// (with one runtime thread per node, GETs beside multipart uploads waited 26-28 ms at p99
/// instead of 10-11: docs/benchmarks.md). Below it, the trip to the pool costs more than the
/// hash.
const HASH_INLINE_BYTES_MAX: usize = 256 * 1024;

/// Room for one gathered answer besides the object's bytes: its 13-byte head and the JSON of
/// a plain object's metadata (about 300 bytes; more only grows the buffer).
const GATHERED_META_ROOM: usize = 512;

/// A chain-write body's CRC32C and MD5: `known` if given, else hashed.
fn hash_body(body: &[u8], known: Option<[u8; 16]>) -> (u32, [u8; 16]) {
    use md5::Digest;
    let crc = crate::wire::body_crc32c(body);
    (crc, known.unwrap_or_else(|| md5::Md5::digest(body).into()))
}

/// A Content-MD5 the gateway sent in base64.
fn md5_of(v: &Option<String>) -> StoreResult<Option<[u8; 16]>> {
    digest_of(v)?
        .map(|v| <[u8; 16]>::try_from(v.as_slice()))
        .transpose()
        .map_err(|_| StoreError::Invalid("bad Content-MD5".into()))
}

/// One piece of bytes as a write's source; its ETag shows the second field when that is set
/// (see `ByteSource::shown_md5`), the bytes' MD5 otherwise; the third is the bytes' MD5 when
/// it is known (see `ByteSource::known_md5`).
pub struct OnePiece(
    pub Option<Bytes>,
    pub Option<[u8; 16]>,
    pub Option<[u8; 16]>,
);

/// The stored bytes' MD5 of an object whose ETag shows another ([`MD5_META`]).
pub fn stored_md5_of(info: &ObjectInfo) -> Option<String> {
    info.attrs
        .user_meta
        .iter()
        .find(|(k, _)| k == MD5_META)
        .map(|(_, v)| v.clone())
}

#[async_trait::async_trait]
impl ByteSource for OnePiece {
    async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
        Ok(self.0.take())
    }
    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }
    fn shown_md5(&self) -> Option<[u8; 16]> {
        self.1
    }
    fn known_md5(&self) -> Option<[u8; 16]> {
        self.2
    }
}

pub fn cv_of(info: &ObjectInfo) -> u64 {
    info.attrs
        .user_meta
        .iter()
        .find(|(k, _)| k == CV_META)
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0)
}

/// An object's metadata on the wire, without the version and stored-MD5 entries in its user
/// metadata (they have fields of their own).
pub fn meta_of(info: &ObjectInfo) -> WireMeta {
    let mut put = WirePut::default();
    let mut attrs = info.attrs.clone();
    let version_seq = attrs
        .user_meta
        .iter()
        .find(|(k, _)| k == VER_META)
        .and_then(|(_, v)| v.parse().ok());
    attrs.user_meta.retain(|(k, _)| !is_node_meta(k));
    put.set_attrs(attrs);
    WireMeta {
        size: info.size,
        etag: info.etag.clone(),
        put,
        checksum: info
            .checksum
            .as_ref()
            .map(|c| (c.algorithm.clone(), c.value.clone(), c.kind.clone())),
        part_sizes: info.part_sizes.clone(),
        cv: cv_of(info),
        stored_md5: stored_md5_of(info),
        version_seq,
        version_id: info.version_id.clone().filter(|v| v != "null"),
        marker: false,
    }
}

/// The node's own user-metadata entries of an object that an attribute edit keeps: the
/// stored bytes' MD5 ([`MD5_META`]) and the version's sequence ([`VER_META`]).
pub fn kept_entries(info: &ObjectInfo) -> impl Iterator<Item = (String, String)> + '_ {
    info.attrs
        .user_meta
        .iter()
        .filter(|(k, _)| k == MD5_META || k == VER_META)
        .cloned()
}

/// The local bucket `b` as its versions are read: a node's local buckets never have
/// versioning of their own (a version is chosen by the chain's head and written with
/// `VersionAs`), so version reads and removals name it as a versioned bucket.
pub fn with_versions(b: &Bucket) -> Bucket {
    Bucket {
        versioning: packrat_store_api::Versioning::Enabled,
        ..b.clone()
    }
}

/// An answer with an object's metadata: a small object's bytes are the body and the
/// metadata rides in a header, so a GET through a gateway is one request to a node, not two.
fn with_meta(meta: &WireMeta, body: Option<Bytes>) -> StoreResult<NodeResp> {
    let Some(body) = body else {
        return Ok(json(200, meta));
    };
    let meta = serde_json::to_string(meta).map_err(|e| StoreError::internal("metadata", e))?;
    let mut resp = answer_bytes(body);
    // JSON escapes control characters; other bytes of UTF-8 text are valid in a header value
    // (obs-text).
    let value = http::HeaderValue::from_bytes(meta.as_bytes())
        .map_err(|e| StoreError::internal("metadata header", e))?;
    resp.headers_mut().insert(META_HEADER, value);
    Ok(resp)
}

fn query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            Some((decode(k)?, decode(v)?))
        })
        .collect()
}

pub(crate) fn now_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

impl Node {
    pub fn new(
        id: String,
        store: Arc<dyn ObjectStore>,
        map: watch::Receiver<Arc<ClusterMap>>,
        secret: String,
        tombstone_keep: Duration,
        metrics: Option<crate::MetricsPage>,
        held: Arc<held::HeldPgs>,
    ) -> Arc<Node> {
        let stripes = crate::placement::slots_within_pgs(map.borrow().pgs, LOCK_STRIPES);
        let client = NodeClient::new(secret.clone());
        Arc::new(Node {
            id,
            store,
            map,
            relay: crate::relay::Relay::new(client.clone()),
            client,
            secret,
            locks: (0..stripes).map(|_| tokio::sync::Mutex::new(())).collect(),
            dirty: Mutex::new(HashMap::new()),
            lost_since: Mutex::new(HashMap::new()),
            last_cv: AtomicU64::new(0),
            buckets: Mutex::new(HashMap::new()),
            recent: Mutex::new(HashMap::new()),
            tombstone_keep,
            metrics,
            history_steps: Mutex::new(HashMap::new()),
            versioned_bids: Mutex::new(HashSet::new()),
            damaged: AtomicU64::new(0),
            hop_flips: AtomicU64::new(0),
            hop_drops: AtomicU64::new(0),
            buckets_dropped: AtomicU64::new(0),
            sweep: tokio::sync::Mutex::new(()),
            pgs_dropped: AtomicU64::new(0),
            copies_dropped: AtomicU64::new(0),
            held,
            lease: Arc::new(crate::LeaseClock::default()),
            fenced: AtomicU64::new(0),
            incarnation: AtomicU64::new(0),
            in_flight: std::sync::atomic::AtomicUsize::new(0),
            busy: AtomicU64::new(0),
            suspects: Mutex::new(HashMap::new()),
            stepped_down: std::sync::atomic::AtomicBool::new(false),
            steps: epochs::StepsByEpoch::default(),
        })
    }

    /// Notes the incarnation this run registered with: until the map knows it, the node
    /// serves nothing (see [`Node::handle`]).
    pub fn set_incarnation(&self, incarnation: u64) {
        self.incarnation.store(incarnation, Ordering::Relaxed);
    }

    /// Whether the map this node serves by has taken in this run of it. Until it has, the map
    /// still counts the node as it was before it restarted: caught up where it was, though it
    /// may lack writes that were under way when it stopped (its marks of keys whose newest
    /// write the chain had not acknowledged are gone with the process), so its answers could
    /// differ from its chain's; the manager marks it catching up at its next round.
    fn known_to_map(&self) -> bool {
        let mine = self.incarnation.load(Ordering::Relaxed);
        mine == 0
            || self
                .map
                .borrow()
                .nodes
                .get(&self.id)
                .is_none_or(|n| n.incarnation == mine)
    }

    /// The clock this node's lease renewals are noted on (see [`crate::register`]).
    pub fn lease_clock(&self) -> Arc<crate::LeaseClock> {
        self.lease.clone()
    }

    /// Serves the internal API on `listener` until `stop` resolves.
    pub async fn serve(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let _ = stream.set_nodelay(true);
                    let node = self.clone();
                    let svc = hyper::service::service_fn(move |req| {
                        let node = node.clone();
                        async move { Ok::<_, std::convert::Infallible>(node.handle(req).await) }
                    });
                    // A peer that opens a connection and never finishes a request's head
                    // (or leaves it idle) is dropped after NODE_HEADER_TIMEOUT.
                    let conn = hyper::server::conn::http1::Builder::new()
                        .timer(hyper_util::rt::TokioTimer::new())
                        .header_read_timeout(NODE_HEADER_TIMEOUT)
                        .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                    let conn = graceful.watch(conn);
                    tokio::spawn(async move {
                        let _ = conn.await;
                    });
                }
                _ = &mut stop => break,
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
    }

    async fn handle(self: Arc<Self>, req: http::Request<hyper::body::Incoming>) -> NodeResp {
        if req.method() == Method::GET
            && let Some(page) = self.operator_page(req.uri().path())
        {
            return page;
        }
        let secret_ok = req
            .headers()
            .get(SECRET_HEADER)
            .is_some_and(|v| constant_time_eq(v.as_bytes(), self.secret.as_bytes()));
        if !secret_ok {
            return answer(403, "cluster secret missing or wrong");
        }
        let epoch: u64 = req
            .headers()
            .get(EPOCH_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        // Self-fencing: a node whose lease is not known alive may already have been replaced
        // in its chains by a manager on the other side of a partition, so it serves no reads
        // (they could be stale) and takes no chain steps (they could be lost) until etcd
        // confirms a renewal again. The fault switches stay open for tests.
        let path = req.uri().path();
        let probe = path.starts_with("/admin/faults");
        // Operators' and jobs' requests (`/admin/...`) are not the data path.
        let admin = path.starts_with("/admin/");
        if !probe && let Some(since) = self.lease.fenced() {
            self.fenced.fetch_add(1, Ordering::Relaxed);
            return self.respond(Err(Fail::Refused(format!(
                "{FENCED}: {} has not renewed its etcd lease for {} ms",
                self.id,
                since.as_millis()
            ))));
        }
        if !probe && !admin && self.stepped_down() {
            self.fenced.fetch_add(1, Ordering::Relaxed);
            return self.respond(Err(Fail::Refused(format!(
                "{FENCED}: {} stepped down: most of the other nodes cannot reach it",
                self.id
            ))));
        }
        if !admin && !self.known_to_map() {
            return self.respond(Err(Fail::Refused(format!(
                "{RESTARTED}: {} restarted and the map has not taken it in yet",
                self.id
            ))));
        }
        let slot = match InFlight::take(&self.in_flight) {
            Some(slot) => slot,
            None => {
                self.busy.fetch_add(1, Ordering::Relaxed);
                return self.respond(Err(Fail::Store(StoreError::Unavailable(format!(
                    "{} is serving {REQUESTS_MAX} internal requests; retry later",
                    self.id
                )))));
            }
        };
        if req.method() == Method::POST
            && req.uri().path() == "/w"
            && crate::relay::indexed(req.headers())
        {
            // The answer outlives this call: the slot goes with it.
            std::mem::forget(slot);
            let held = HeldSlot(self.clone());
            return self.relayed_as_they_end(req, held).await;
        }
        let changes = req.method() != Method::GET;
        let result = self.route(req, epoch).await;
        if changes
            && !probe
            && result.as_ref().is_ok_and(|r| r.status().is_success())
            && let Some(e) = self.fenced_meanwhile()
        {
            return self.respond(Err(e.into()));
        }
        drop(slot);
        self.respond(result)
    }

    /// A change that ended after the fence began is answered as of unknown outcome (it was
    /// applied, and may be superseded by the chain that replaces this node's): the error to
    /// answer instead of its success, if the fence has begun.
    fn fenced_meanwhile(&self) -> Option<StoreError> {
        let since = self.lease.fenced()?;
        self.fenced.fetch_add(1, Ordering::Relaxed);
        Some(StoreError::Unavailable(format!(
            "{FENCED}: {} lost its etcd lease for {} ms while the request was under way; its outcome is unknown",
            self.id,
            since.as_millis()
        )))
    }

    /// A relayed request (`POST /w`) whose sender takes each step's answer as the step ends
    /// (see [`crate::relay::RELAY_ANSWERS_HEADER`]): the steps run side by side, and each
    /// answer goes out as soon as its step is over, so a step whose chain is slow holds back
    /// none of the others. Before, the answer waited for the slowest step: one PG with a hung
    /// successor held every write relayed with it for the hop's timeout.
    async fn relayed_as_they_end(
        self: Arc<Self>,
        req: http::Request<hyper::body::Incoming>,
        held: HeldSlot,
    ) -> NodeResp {
        use futures_util::StreamExt;
        let items = match body_of_request(req, "relayed steps").await {
            Ok(body) => RelayItem::parse_all(body),
            Err(e) => Err(e),
        };
        let items = match items {
            Ok(items) => items,
            Err(e) => return self.respond(Err(e.into())),
        };
        let steps: futures_util::stream::FuturesUnordered<_> = items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                let me = self.clone();
                async move {
                    let (status, body) = me.relayed_step(item).await;
                    let (status, body) = match me.fenced_meanwhile() {
                        Some(e) if (200..300).contains(&status) => {
                            let (status, err) = WireError::of(&e);
                            (
                                status,
                                Bytes::from(serde_json::to_vec(&err).unwrap_or_default()),
                            )
                        }
                        _ => (status, body),
                    };
                    let mut out = BytesMut::with_capacity(body.len() + 18);
                    crate::relay::put_indexed_answer(&mut out, i as u32, status, &body);
                    Ok::<_, std::io::Error>(hyper::body::Frame::data(out.freeze()))
                }
            })
            .collect();
        let frames = steps.map(move |frame| {
            let _held = &held;
            frame
        });
        let mut r = Response::new(StreamBody::new(frames).boxed_unsync());
        r.headers_mut().insert(
            crate::relay::RELAY_ANSWERS_HEADER,
            http::HeaderValue::from_static(crate::relay::RELAY_ANSWERS_INDEXED),
        );
        r
    }

    /// The answer to a request routed here: its own, or its failure's.
    fn respond(&self, result: Result<NodeResp, Fail>) -> NodeResp {
        match result {
            Ok(resp) => resp,
            Err(Fail::Refused(reason)) => json(
                409,
                &WireRefusal {
                    reason,
                    epoch: self.map.borrow().epoch,
                },
            ),
            Err(Fail::Store(e)) => {
                let (status, body) = WireError::of(&e);
                if status >= 500 {
                    tracing::warn!("internal API: {e}");
                }
                json(status, &body)
            }
        }
    }

    async fn route<B>(&self, req: http::Request<B>, epoch: u64) -> Result<NodeResp, Fail>
    where
        B: hyper::body::Body<Data = Bytes> + Send,
        B::Error: std::fmt::Display,
    {
        let path = req.uri().path().to_string();
        let q = query(req.uri().query());
        let method = req.method().clone();
        let bucket_id = |rest: &str| {
            rest.parse::<u64>()
                .map_err(|_| StoreError::Invalid("bad bucket id".into()))
        };
        if let Some(rest) = path.strip_prefix("/lv/") {
            let bid = bucket_id(rest)?;
            let map = self.map_at(epoch).await?;
            return Ok(json(200, &self.list_versions(&map, bid, &q).await?));
        }
        if let Some(rest) = path.strip_prefix("/l/") {
            let bid = bucket_id(rest)?;
            let map = self.map_at(epoch).await?;
            return Ok(json(200, &self.list(&map, bid, &q).await?));
        }
        if let Some(rest) = path.strip_prefix("/b/")
            && method == Method::POST
        {
            let bid = bucket_id(rest)?;
            let map = self.map_at(epoch).await?;
            let order = match q.get("order").map(String::as_str) {
                Some("storage") => BatchOrder::Storage,
                _ => BatchOrder::Request,
            };
            let (read, crc) = (q.contains_key("read"), q.contains_key("crc"));
            let body = body_of_request(req, "batch").await?;
            let items: Vec<WireBatchItem> = serde_json::from_slice(&body)
                .map_err(|e| StoreError::Invalid(format!("bad batch items: {e}")))?;
            if items.len() > BATCH_ITEMS_MAX {
                return Ok(answer(400, "too many items in one batch"));
            }
            return self.batch(&map, bid, items, order, read, crc).await;
        }
        if path == "/g" && method == Method::POST {
            let map = self.map_at(epoch).await?;
            let binary = req
                .headers()
                .get(META_CODEC_HEADER)
                .is_some_and(|v| v.as_bytes() == META_CODEC_V1.as_bytes());
            let body = body_of_request(req, "lookups").await?;
            let items = GatherItem::parse_all(&body)?;
            return Ok(self.gathered(&map, &items, binary).await);
        }
        if path == "/w" && method == Method::POST {
            let body = body_of_request(req, "relayed steps").await?;
            return self.relayed(body).await;
        }
        if path == "/drain" && method == Method::GET {
            // A catch-up's barrier (see `epochs`): answered once no step of an older map is
            // under way here.
            let map = self.map_at(epoch).await?;
            if !self
                .steps
                .drained_below(map.epoch, epochs::DRAIN_WAIT)
                .await
            {
                return Err(StoreError::Unavailable(format!(
                    "steps routed by maps older than epoch {} still under way at {}",
                    map.epoch, self.id
                ))
                .into());
            }
            return Ok(answer(204, Bytes::new()));
        }
        if path == "/admin/faults" {
            return self.faults(req).await;
        }
        if path == "/admin/faults/hop" {
            return self.hop_faults(req).await;
        }
        if let Some(what) = path.strip_prefix("/admin/") {
            return self.admin(what, &method, &q).await;
        }
        if let Some(rest) = path.strip_prefix("/ul/") {
            let bid = bucket_id(rest)?;
            let map = self.map_at(epoch).await?;
            return Ok(json(200, &self.list_uploads(&map, bid, &q).await?));
        }
        let (rest, uploads) = match (path.strip_prefix("/o/"), path.strip_prefix("/u/")) {
            (Some(rest), _) => (rest, false),
            (_, Some(rest)) => (rest, true),
            _ => return Ok(answer(404, "no such route")),
        };
        let mut parts = rest.splitn(3, '/');
        let (Some(bid), Some(pg), Some(key)) = (parts.next(), parts.next(), parts.next()) else {
            return Ok(answer(404, "no such route"));
        };
        let (Ok(bid), Ok(pg), Some(key)) = (bid.parse::<u64>(), pg.parse::<u32>(), decode(key))
        else {
            return Ok(answer(400, "bad object path"));
        };
        // A change is counted under its epoch before the epoch is checked (see `epochs`).
        let _step =
            (method != Method::GET && method != Method::HEAD).then(|| self.steps.enter(epoch));
        let map = self.map_at(epoch).await?;
        if pg_of(bid, &key, map.pgs) != pg {
            return Ok(answer(400, "the key is not in that PG"));
        }
        if uploads {
            return self.upload_route(req, &map, (bid, pg, &key), &q).await;
        }
        let cv: Option<u64> = req
            .headers()
            .get(CV_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        match method {
            Method::PUT if q.contains_key("lock") => {
                let body = body_of_request(req, "lock change").await?;
                let change: WireLockChange = serde_json::from_slice(&body)
                    .map_err(|e| StoreError::Invalid(format!("bad lock change: {e}")))?;
                let id = q.get("version").map(String::as_str);
                let bypass = q.contains_key("bypass");
                let locked = self
                    .change_lock(&map, bid, pg, &key, cv, id, change, bypass)
                    .await?;
                Ok(json(200, &locked))
            }
            Method::PUT if q.contains_key("class") => {
                let (Some(class), Some(id)) = (q.get("class"), q.get("version")) else {
                    return Ok(answer(400, "a class change names its version"));
                };
                let noncurrent = q.contains_key("noncurrent");
                self.change_class(&map, bid, pg, &key, cv, id, class, noncurrent)
                    .await?;
                Ok(json(200, &()))
            }
            Method::PUT if q.contains_key("tags") => {
                let Some(id) = q.get("version") else {
                    return Ok(answer(400, "a tag change names its version"));
                };
                let body = body_of_request(req, "tags").await?;
                self.change_tags(&map, bid, pg, &key, cv, id, body).await?;
                Ok(json(200, &()))
            }
            Method::PUT => {
                let put: WirePut = put_header(&req, "write")?;
                let body = body_of_request(req, "write").await?;
                let meta = self
                    .write(&map, bid, pg, &key, cv, Some((put, body)), None, None)
                    .await?;
                Ok(json(200, &meta))
            }
            Method::PATCH => {
                let put: WirePut = put_header(&req, "edit")?;
                let Some(base) = q.get("base").and_then(|v| v.parse().ok()) else {
                    return Ok(answer(400, "base is needed"));
                };
                let meta = self.edit(&map, bid, pg, &key, cv, base, put).await?;
                Ok(json(200, &meta))
            }
            Method::POST if q.contains_key("members") => {
                let Some(want) = q.get("cv").and_then(|v| v.parse().ok()) else {
                    return Ok(answer(400, "cv is needed"));
                };
                let body = body_of_request(req, "member names").await?;
                let names: Vec<String> = serde_json::from_slice(&body)
                    .map_err(|e| StoreError::Invalid(format!("bad member names: {e}")))?;
                self.tar_members(bid, &key, want, &names).await
            }
            Method::POST if q.contains_key("resend") => {
                let Some(cv) = cv else {
                    return Ok(answer(400, "a re-sent step needs its version"));
                };
                let from = q.get("from").cloned();
                self.resent(&map, bid, pg, &key, cv, from).await
            }
            Method::DELETE if q.contains_key("version") => {
                let id = q.get("version").cloned().unwrap_or_default();
                let bypass = q.contains_key("bypass");
                let deleted = self
                    .delete_version(&map, bid, pg, &key, cv, &id, bypass, false)
                    .await?;
                Ok(json(200, &deleted))
            }
            Method::DELETE if q.contains_key("resend") && cv.is_some() => {
                let (Some(cv), Some(from)) = (cv, q.get("from")) else {
                    return Ok(answer(400, "a re-sent delete needs its version and sender"));
                };
                self.resent_delete(&map, bid, pg, &key, cv, from).await
            }
            Method::DELETE => {
                let versioning = match q.get("versioning") {
                    None => None,
                    Some(v) => match WireVersioning::parse(v) {
                        Some(v) => Some(v),
                        None => return Ok(answer(400, "bad versioning")),
                    },
                };
                let meta = self
                    .write(&map, bid, pg, &key, cv, None, versioning, None)
                    .await?;
                match (versioning, meta) {
                    (Some(_), Some(meta)) => Ok(json(200, &meta)),
                    _ => Ok(answer(204, Bytes::new())),
                }
            }
            Method::POST if q.contains_key("hsync") => {
                let Some(cv) = cv else {
                    return Ok(answer(400, "a re-sent step needs its version"));
                };
                self.history_resent(&map, bid, pg, &key, cv).await
            }
            Method::GET if q.contains_key("versions") => {
                self.settled_here(bid, &key, &q)?;
                Ok(json(200, &self.key_versions(bid, &key).await?))
            }
            Method::GET
                if q.contains_key("meta")
                    && (q.contains_key("version") || q.contains_key("latest")) =>
            {
                let inline: u64 = q.get("inline").and_then(|v| v.parse().ok()).unwrap_or(0);
                let who = if q.contains_key("any") {
                    Asker::Resync
                } else {
                    Asker::Reader
                };
                let (meta, body) = self
                    .read_version(
                        &map,
                        bid,
                        pg,
                        &key,
                        who,
                        q.get("version").map(String::as_str),
                        inline,
                    )
                    .await?;
                Ok(with_meta(&meta, body)?)
            }
            Method::GET if q.contains_key("meta") => {
                self.settled_here(bid, &key, &q)?;
                let inline: u64 = q.get("inline").and_then(|v| v.parse().ok()).unwrap_or(0);
                let who = match (q.contains_key("pull"), q.contains_key("any")) {
                    (true, _) => Asker::Successor,
                    (false, true) => Asker::Resync,
                    (false, false) => Asker::Reader,
                };
                let (info, body) = self
                    .meta_and_bytes(&map, bid, pg, &key, who, inline)
                    .await?;
                Ok(with_meta(&meta_of(&info), body)?)
            }
            Method::GET => {
                let num = |k: &str| q.get(k).and_then(|v| v.parse::<u64>().ok());
                let (Some(want), Some(start), Some(end)) = (num("cv"), num("start"), num("end"))
                else {
                    return Ok(answer(400, "cv, start and end are needed"));
                };
                self.read_bytes(
                    bid,
                    &key,
                    want,
                    q.get("version").map(String::as_str),
                    start,
                    end,
                )
                .await
            }
            _ => Ok(answer(405, "method not allowed")),
        }
    }

    /// `/metrics` and `/health/live|ready` for operators, without the cluster secret (they
    /// tell nothing of the data), as `packrat serve` answers them: Prometheus and a load
    /// balancer or orchestrator reach every node directly.
    fn operator_page(&self, path: &str) -> Option<NodeResp> {
        let text = |status: u16, body: String, content_type: &str| {
            let mut resp = answer(status, body);
            if let Ok(v) = http::HeaderValue::from_str(content_type) {
                resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
            }
            resp
        };
        let plain = "text/plain; charset=utf-8";
        match path {
            "/metrics" => {
                let page = self.metrics.as_ref()?;
                let (body, content_type) = page(self.figures());
                Some(text(200, body, content_type))
            }
            "/health/live" => Some(text(200, "ok\n".into(), plain)),
            "/health/ready" => Some(match self.store.write_readiness() {
                Ok(()) => text(200, "ready\n".into(), plain),
                Err(why) => text(503, format!("not ready: {why}\n"), plain),
            }),
            _ => None,
        }
    }

    /// This node's own figures for its `/metrics`: its places in the map, and the writes it
    /// has applied that the rest of their chains has not acknowledged yet.
    fn figures(&self) -> Vec<packrat_store_api::admin::Metric> {
        use packrat_store_api::admin::Metric;
        let map = self.map.borrow().clone();
        let (mut member, mut head) = (0u64, 0u64);
        for pg in 0..map.pgs {
            let chain = map.chain(pg);
            member += u64::from(chain.contains(&self.id));
            head += u64::from(chain.first() == Some(&self.id));
        }
        let syncing = map.syncing.get(&self.id).map_or(0, |p| p.len() as u64);
        let unsettled = self.dirty.lock().map_or(0, |d| d.len() as u64);
        let (relayed, relays) = self.relay.counts();
        vec![
            Metric::counter(
                "packrat_node_steps_relayed_total",
                "Chain steps this node sent on to its successors relayed with others in one request.",
                relayed,
            ),
            Metric::counter(
                "packrat_node_relay_requests_total",
                "Requests that carried relayed chain steps from this node to its successors.",
                relays,
            ),
            Metric::counter(
                "packrat_node_damaged_writes_total",
                "Chain writes (PUTs and parts) this node refused because their body did not match the CRC32C its sender sent.",
                self.damaged.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_damaged_answers_total",
                "Answers from other nodes this node refused because their bytes did not match the CRC32C sent with them.",
                crate::wire::DAMAGED_ANSWERS.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_buckets_dropped_total",
                "Local buckets (a cluster bucket's objects, or its tombstones) this node emptied and removed because their cluster bucket was deleted.",
                self.buckets_dropped.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_pgs_dropped_total",
                "Placement groups this node holds no replica of whose copies it swept away once their chains were whole elsewhere (a node added, a rebalance, a return after re-replication; a PG it never held counts too, with nothing to drop).",
                self.pgs_dropped.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_copies_dropped_total",
                "Objects, versions, tombstones and uploads in progress this node dropped with the placement groups it left.",
                self.copies_dropped.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_fenced_requests_total",
                "Requests this node refused because its etcd lease was not known alive (see the fence time in docs/ARCHITECTURE.md).",
                self.fenced.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_busy_requests_total",
                "Internal requests this node answered 503 because it was already serving its most at once.",
                self.busy.load(Ordering::Relaxed),
            ),
            Metric::gauge(
                "packrat_node_fenced",
                "1 while this node serves nothing because its last confirmed etcd lease renewal is older than the fence time.",
                u64::from(self.lease.fenced().is_some()),
            ),
            Metric::gauge(
                "packrat_node_stepped_down",
                "1 while this node serves nothing because most of the other nodes report that they cannot reach it.",
                u64::from(self.stepped_down()),
            ),
            Metric::gauge(
                "packrat_node_suspects",
                "Members that failed this node's last probes (or did not answer a step), probed until they answer; reported to the manager after two in a row.",
                self.suspects.lock().map_or(0, |s| s.len() as u64),
            ),
            Metric::gauge(
                "packrat_node_pgs",
                "Placement groups this node holds a replica of.",
                member,
            ),
            Metric::gauge(
                "packrat_node_pgs_head",
                "Placement groups whose chain this node heads (their writes enter here).",
                head,
            ),
            Metric::gauge(
                "packrat_node_pgs_syncing",
                "Placement groups this node is catching up on (no reads served there yet).",
                syncing,
            ),
            Metric::gauge(
                "packrat_node_writes_unsettled",
                "Keys whose newest write here the rest of the chain has not acknowledged yet: writes under way, and ones re-sent after a break.",
                unsettled,
            ),
            Metric::gauge(
                "packrat_node_pgs_held",
                "Placement groups this node may hold copies of (those of its chains, and those it left whose copies are not dropped yet); every PG when that is not known.",
                self.held.count() as u64,
            ),
            Metric::gauge(
                "packrat_node_map_epoch",
                "Epoch of the cluster map this node serves by.",
                map.epoch,
            ),
        ]
    }

    /// The map a request was routed by: ours if the epochs agree. A request from a newer map
    /// waits (briefly) for ours to catch up; one from an older map is refused, so a node or
    /// gateway that missed a change cannot act on it (fencing).
    async fn map_at(&self, epoch: u64) -> Result<Arc<ClusterMap>, Fail> {
        let current = self.map.borrow().clone();
        if current.epoch == epoch {
            return Ok(current);
        }
        if epoch < current.epoch {
            return Err(Fail::Refused(format!(
                "epoch {epoch} is older than this node's {}",
                current.epoch
            )));
        }
        let mut rx = self.map.clone();
        let caught_up =
            tokio::time::timeout(Duration::from_secs(2), rx.wait_for(|m| m.epoch >= epoch)).await;
        let current = self.map.borrow().clone();
        match caught_up {
            Ok(Ok(_)) if current.epoch == epoch => Ok(current),
            _ => Err(Fail::Refused(format!(
                "epoch {epoch} is not this node's ({})",
                current.epoch
            ))),
        }
    }

    /// A key's lock. Keys share a lock only if they share a PG (see
    /// `placement::slots_within_pgs`): a chain step holds its key's lock at each member while
    /// the next one answers, so two keys of one stripe in PGs whose chains order two nodes
    /// oppositely would wait for each other until the hop timed out.
    fn lock_of(&self, bid: u64, key: &str) -> &tokio::sync::Mutex<()> {
        let h = pg_of(bid, key, self.locks.len() as u32);
        &self.locks[h as usize]
    }

    /// The local bucket `name`, created on first use.
    async fn local_bucket(&self, name: String) -> StoreResult<Bucket> {
        if let Some(b) = self.buckets.lock().ok().and_then(|m| m.get(&name).cloned()) {
            return Ok(b);
        }
        let b = match self.store.bucket(&name)? {
            Some(b) => b,
            None => match self
                .store
                .create_bucket(NewBucket {
                    name: name.clone(),
                    owner_id: "packrat-cluster".into(),
                    owner_name: "packrat-cluster".into(),
                    created_ms: (now_micros() / 1000) as i64,
                    public_read: false,
                    object_lock: false,
                })
                .await
            {
                Ok(b) => b,
                Err(StoreError::BucketExists) => {
                    self.store.bucket(&name)?.ok_or(StoreError::NoSuchBucket)?
                }
                Err(e) => return Err(e),
            },
        };
        if let Ok(mut m) = self.buckets.lock() {
            m.insert(name, b.clone());
        }
        Ok(b)
    }

    /// The local bucket of a cluster bucket's objects as reads name its versions (see
    /// [`with_versions`]), kept beside the local bucket itself.
    async fn reading_bucket(&self, bid: u64) -> StoreResult<Bucket> {
        let name = format!("o-{bid}+v");
        if let Some(b) = self.buckets.lock().ok().and_then(|m| m.get(&name).cloned()) {
            return Ok(b);
        }
        let b = with_versions(&self.local_bucket(format!("o-{bid}")).await?);
        if let Ok(mut m) = self.buckets.lock() {
            m.insert(name, b.clone());
        }
        Ok(b)
    }

    /// The object and the tombstone versions this node has of a key.
    async fn current(
        &self,
        objects: &Bucket,
        tombs: &Bucket,
        key: &str,
    ) -> StoreResult<(Option<ObjectInfo>, u64)> {
        let obj = self.store.head_object(objects, key).await?;
        let tomb = self
            .store
            .head_object(tombs, key)
            .await?
            .map_or(0, |t| cv_of(&t));
        Ok((obj, tomb))
    }

    fn next_cv(&self, above: u64) -> u64 {
        let mut prev = self.last_cv.load(Ordering::Relaxed);
        loop {
            let next = now_micros().max(prev + 1).max(above + 1);
            match self
                .last_cv
                .compare_exchange(prev, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return next,
                Err(p) => prev = p,
            }
        }
    }

    /// Starts a chain step (a write, a delete, a completion, an attribute edit) of `key` at
    /// this member: its place in the chain (`cv` is `None` at the head, the step's version
    /// further down), the key's lock, what this member has of the key, and the step's version
    /// (chosen here at the head, above everything this member has of the key). With
    /// `versioned` (a step of a bucket with versioning), a delete marker that is the key's
    /// latest version counts as a tombstone of its sequence (the tombstone a versioned delete
    /// leaves is dropped after `--tombstone-keep`; the marker stays).
    async fn begin_step<'a>(
        &'a self,
        map: &'a ClusterMap,
        bid: u64,
        pg: u32,
        key: &'a str,
        cv: Option<u64>,
        versioned: bool,
    ) -> Result<KeyStep<'a>, Fail> {
        self.begin_step_as(map, bid, pg, key, cv, versioned, cv.is_none())
            .await
    }

    /// [`Node::begin_step`], at the head (`at_head`) or further down the chain: a step with
    /// its version given at the head is one re-sent through it (see `unsettled`).
    #[allow(clippy::too_many_arguments)]
    async fn begin_step_as<'a>(
        &'a self,
        map: &'a ClusterMap,
        bid: u64,
        pg: u32,
        key: &'a str,
        cv: Option<u64>,
        versioned: bool,
        at_head: bool,
    ) -> Result<KeyStep<'a>, Fail> {
        // Counted before the map is checked (see `epochs`): a job's step begun on a map this
        // node has since replaced is refused here, before anything is applied.
        let epoch = self.steps.enter(map.epoch);
        let current = self.map.borrow().epoch;
        if current != map.epoch {
            return Err(Fail::Refused(format!(
                "epoch {} is not this node's ({current})",
                map.epoch
            )));
        }
        let (chain, pos) = self.chain_position(map, pg, at_head)?;
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let tombs = self.local_bucket(format!("t-{bid}")).await?;
        let lock = self.lock_of(bid, key).lock().await;
        let (obj, mut tomb) = self.current(&objects, &tombs, key).await?;
        if versioned && obj.is_none() {
            tomb = tomb.max(self.latest_marker(&objects, key).await?);
        }
        let have = obj.as_ref().map_or(0, cv_of).max(tomb);
        let cv = cv.unwrap_or_else(|| self.next_cv(have));
        Ok(KeyStep {
            bid,
            key,
            chain,
            pos,
            objects,
            tombs,
            obj,
            tomb,
            have,
            cv,
            _lock: lock,
            _epoch: epoch,
        })
    }

    /// A chain write (`Some((put, body))`) or delete (`None`): applied here if newer than
    /// what this node has, then forwarded to the next member; answers once the chain has.
    /// `expect` (at the head): only if the key's version here is still that one, else
    /// `PreconditionFailed` (a lifecycle expiration of the version it evaluated).
    #[allow(clippy::too_many_arguments)]
    async fn write(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        cv: Option<u64>,
        put: Option<(WirePut, Bytes)>,
        versioning: Option<WireVersioning>,
        expect: Option<u64>,
    ) -> Result<Option<WireMeta>, Fail> {
        let versioned = put.as_ref().map_or(versioning, |(p, _)| p.versioning);
        if versioned.is_some() {
            self.note_versioned(bid);
        }
        // The body is checked before the key is locked.
        let (put, md5) = match put {
            Some((mut wput, body)) => {
                let md5 = self
                    .check_body(
                        &mut wput.body_crc32c,
                        &mut wput.body_md5,
                        &body,
                        cv.is_none(),
                        key,
                    )
                    .await?;
                (Some((wput, body)), md5)
            }
            None => (None, [0; 16]),
        };
        let step = self
            .begin_step(map, bid, pg, key, cv, versioned.is_some())
            .await?;
        let (at_head, cv) = (step.at_head(), step.cv);
        if at_head && expect.is_some_and(|v| v != step.have) {
            return Err(StoreError::PreconditionFailed.into());
        }
        let mut headers = vec![(CV_HEADER, cv.to_string())];
        let path = format!("/o/{bid}/{pg}/{}", encode(key));
        let Some((wput, body)) = put else {
            let mut path = path;
            if let Some(v) = versioning {
                path.push_str(&format!("?versioning={}", v.name()));
            }
            let meta = if cv > step.have {
                self.bury_step(&step, versioning).await?;
                // A versioned delete answers the delete marker it made.
                versioning.map(|v| WireMeta {
                    cv,
                    marker: true,
                    version_id: Some(v.version_id(cv)).filter(|id| id != "null"),
                    ..Default::default()
                })
            } else {
                step.obj.as_ref().map(meta_of)
            };
            return self
                .end_step(
                    map,
                    step,
                    Method::DELETE,
                    &path,
                    &headers,
                    Bytes::new(),
                    meta,
                )
                .await;
        };
        let mut next = wput.clone();
        next.if_match = None;
        next.if_none_match_any = false;
        headers.push((
            PUT_HEADER,
            serde_json::to_string(&next)
                .map_err(|e| StoreError::internal("write description", e))?,
        ));
        if cv <= step.have {
            // Not newer than what this member has: handed on only.
            let meta = step.obj.as_ref().map(meta_of);
            return self
                .end_step(map, step, Method::PUT, &path, &headers, body, meta)
                .await;
        }
        let shown = md5_of(&wput.shown_md5)?;
        self.mark_dirty(bid, key, cv);
        let mut attrs = wput.attrs();
        attrs.user_meta.push((CV_META.to_string(), cv.to_string()));
        let version_as = wput.versioning.map(|v| v.version_as(cv));
        if version_as.is_some() {
            attrs.user_meta.push((VER_META.to_string(), cv.to_string()));
        }
        if shown.is_some() {
            // The ETag will show another MD5: the stored bytes' is kept for copies' checks.
            attrs
                .user_meta
                .push((MD5_META.to_string(), hex::encode(md5)));
        }
        let staged = Arc::new(tokio::sync::Notify::new());
        let tell = staged.clone();
        let put = PutObject {
            attrs,
            checksum: wput.checksum_algorithm()?,
            expected_checksum: digest_of(&wput.expected_checksum)?,
            content_md5: md5_of(&wput.content_md5)?,
            // Decided once, at the head, against its committed copy.
            condition: if at_head {
                wput.condition()
            } else {
                Default::default()
            },
            on_staged: Some(packrat_store_api::OnStaged(Arc::new(move || {
                tell.notify_one()
            }))),
            version_as,
        };
        let mut piece = OnePiece(Some(body.clone()), shown, Some(md5));
        let objects = step.objects.clone();
        let local = self.store.put_object(&objects, key, &mut piece, put);
        tokio::pin!(local);
        // The write goes on to the next member once it is staged here (stored, checked, its
        // condition decided, its order among the key's writes fixed), while this member makes
        // it durable: the members of a chain sync at the same time, not one after the other.
        // A write that fails before it is staged goes no further. The key stays locked here
        // until the rest of the chain has answered, so writes of one key reach every member
        // in the head's order.
        let staged_first = tokio::select! {
            biased;
            done = &mut local => Err(done),
            () = staged.notified() => Ok(()),
        };
        let (made, forwarded) = match staged_first {
            Err(done) => {
                // Done before it was staged: a refusal (nothing stored), or a store that does
                // not tell; either way it is handed on now, if at all.
                let meta = self.applied(&step, done.map_err(Fail::from)).await?;
                return self
                    .end_step(map, step, Method::PUT, &path, &headers, body, Some(meta))
                    .await;
            }
            Ok(()) => {
                let forward = self.forward(
                    map,
                    step.chain,
                    step.pos,
                    Method::PUT,
                    &path,
                    &headers,
                    body,
                );
                tokio::join!(local, forward)
            }
        };
        let made = match (made, &forwarded, step.chain.get(step.pos + 1)) {
            (Ok(info), _, _) => info,
            // Staged here but not made durable (the device failed its sync), while the rest
            // of the chain has the version: it is copied back from the next member. If that
            // fails too, the key stays marked here (reads of it go to the tail, whose copy is
            // the committed one) and the re-send rounds copy it back (see `unsettled.rs`).
            (Err(e), Ok(()), Some(next)) => {
                tracing::warn!(key, cv, "a staged write failed to become durable here: {e}");
                match self
                    .pull_version(map, next, &step.objects, bid, pg, key, cv)
                    .await
                {
                    Ok(info) => info,
                    Err(_) => return Err(e.into()),
                }
            }
            // At the tail, nothing was handed on: a failed write like any other.
            (Err(e), Ok(()), None) => {
                self.undo_dirty(bid, key, cv);
                return Err(e.into());
            }
            // Neither here nor (as far as this member knows) further on: the key stays marked
            // for the re-send rounds, which copy the version back from the next member if it
            // has it.
            (Err(e), Err(_), _) => return Err(e.into()),
        };
        let meta = self.applied(&step, Ok(made)).await?;
        forwarded?;
        self.clear_dirty(bid, key, cv);
        drop(step);
        Ok(Some(WireMeta {
            cv: meta.cv.max(cv),
            ..meta
        }))
    }

    /// Checks a chain write's body (a PUT's or a part's) against the CRC32C its sender sent (a
    /// gateway's, or the member's before: `crc_sent`), then sets what the next member checks
    /// and takes: the body's CRC and MD5 (`crc_sent`, `md5_sent`). The MD5 (the ETag every
    /// member shows) is computed once, at the head (`at_head`); a member takes the head's
    /// (`md5_sent`) rather than hash the bytes again, since the CRC vouches at each
    /// hop that they are the bytes the head hashed. Before, each member hashed what it got and
    /// nothing compared it with the head's, so bytes damaged between two members were stored
    /// as a different object under the same version. A step whose sender sends no CRC (an
    /// older node or gateway) is hashed here. A body above [`HASH_INLINE_BYTES_MAX`] is
    /// hashed on the blocking pool. Returns the body's MD5.
    async fn check_body(
        &self,
        crc_sent: &mut Option<u32>,
        md5_sent: &mut Option<String>,
        body: &Bytes,
        at_head: bool,
        key: &str,
    ) -> Result<[u8; 16], Fail> {
        let given = match (at_head, *crc_sent) {
            (false, Some(_)) => md5_of(md5_sent),
            _ => Ok(None),
        };
        let known = given.as_ref().ok().copied().flatten();
        let (crc, md5) = if body.len() > HASH_INLINE_BYTES_MAX {
            let b = body.clone();
            tokio::task::spawn_blocking(move || hash_body(&b, known))
                .await
                .map_err(|e| StoreError::internal("chain write", format!("hashing: {e}")))?
        } else {
            hash_body(body, known)
        };
        if let Some(sent) = *crc_sent
            && sent != crc
        {
            self.damaged.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                key,
                sent,
                crc,
                "a chain write's body does not match its CRC32C: refused"
            );
            return Err(StoreError::internal(
                "chain write",
                format!(
                    "the body of {key} was damaged on its way here (its CRC32C does not match)"
                ),
            )
            .into());
        }
        // A malformed MD5 from the member before is refused once the bytes are known good.
        given?;
        *crc_sent = Some(crc);
        *md5_sent = Some(base64::engine::general_purpose::STANDARD.encode(md5));
        Ok(md5)
    }

    /// What a version a chain step made here (`made`) leaves: on failure, the step's dirty
    /// mark cleared and the failure answered; else the key's tombstone (if it had one)
    /// dropped and the version's metadata answered.
    async fn applied(
        &self,
        step: &KeyStep<'_>,
        made: Result<ObjectInfo, Fail>,
    ) -> Result<WireMeta, Fail> {
        let info = match made {
            Ok(i) => i,
            Err(e) => {
                self.undo_dirty(step.bid, step.key, step.cv);
                return Err(e);
            }
        };
        if step.tomb > 0 {
            self.store.delete_object(&step.tombs, step.key).await?;
        }
        Ok(meta_of(&info))
    }

    /// Ends a chain step applied at this member: sends it on to the next member (`method`
    /// `path` with `headers` and `body`; the key stays locked until the rest of the chain has
    /// answered), clears the key's dirty mark, and answers `meta` (what this member holds now)
    /// with the step's version at least.
    #[allow(clippy::too_many_arguments)]
    async fn end_step(
        &self,
        map: &ClusterMap,
        step: KeyStep<'_>,
        method: Method,
        path: &str,
        headers: &[(&str, String)],
        body: Bytes,
        meta: Option<WireMeta>,
    ) -> Result<Option<WireMeta>, Fail> {
        self.forward(map, step.chain, step.pos, method, path, headers, body)
            .await?;
        self.clear_dirty(step.bid, step.key, step.cv);
        let cv = step.cv;
        drop(step);
        Ok(meta.map(|mut m| {
            m.cv = m.cv.max(cv);
            m
        }))
    }

    /// This node's place in `pg`'s chain, if it may take a chain write there: the head when
    /// the write comes from a gateway (`at_head`), a later member when it is forwarded; and a
    /// write at the head needs the chain to have its write quorum.
    fn chain_position<'m>(
        &self,
        map: &'m ClusterMap,
        pg: u32,
        at_head: bool,
    ) -> Result<(&'m [String], usize), Fail> {
        let chain = map.chain(pg);
        let Some(pos) = chain.iter().position(|n| *n == self.id) else {
            return Err(Fail::Refused(format!("not a member of PG {pg}")));
        };
        if at_head != (pos == 0) {
            return Err(Fail::Refused(format!(
                "{} the head of PG {pg}",
                if at_head { "not" } else { "already" }
            )));
        }
        // A head still catching up decides writes (conditional ones too) against a copy that
        // may be partial: the manager heads a chain with a caught-up member whenever it has
        // one, so this is a PG waiting for one (see `ClusterMap::waiting`).
        if at_head && map.is_syncing(&self.id, pg) {
            return Err(StoreError::Unavailable(format!(
                "PG {pg} has no caught-up member now (waiting for {}); retry later",
                map.holders(pg).join(", ")
            ))
            .into());
        }
        if at_head && chain.len() < map.write_quorum() {
            return Err(StoreError::Unavailable(format!(
                "PG {pg} has {} of {} replicas alive, fewer than the {} a write needs",
                chain.len(),
                map.replicas,
                map.write_quorum()
            ))
            .into());
        }
        Ok((chain, pos))
    }

    /// Sends a chain write on to the member after `pos` (if any) and waits for the rest of
    /// the chain's answer (read to its end, so the connection is kept). An unreachable
    /// successor is a broken chain, not a failed write: the gateway retries on the map that
    /// replaces it.
    #[allow(clippy::too_many_arguments)]
    async fn forward(
        &self,
        map: &ClusterMap,
        chain: &[String],
        pos: usize,
        method: Method,
        path: &str,
        headers: &[(&str, String)],
        body: Bytes,
    ) -> Result<(), Fail> {
        let Some(next) = chain.get(pos + 1) else {
            return Ok(());
        };
        let addr = map
            .addr(next)
            .ok_or_else(|| StoreError::internal("cluster map", format!("no address for {next}")))?;
        let body_len = body.len();
        // Fault injection: a step that never reaches the next member.
        if self
            .hop_drops
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Fail::Refused(format!(
                "{CHAIN_BROKEN} at {next}: dropped (fault injection)"
            )));
        }
        // Fault injection: a write's bytes change on their way, after their CRC was taken.
        let body = if method == Method::PUT {
            flip_next(&self.hop_flips, body)
        } else {
            body
        };
        let sent = self
            .relay
            .send(
                method,
                addr,
                path,
                map.epoch,
                headers,
                body,
                // The rest of the chain answers within a hop's time per member.
                hop_timeout(body_len) * (chain.len() - pos - 1) as u32,
            )
            .await;
        let ans = match sent {
            Ok(a) => a,
            Err(StoreError::Unavailable(why)) => {
                // No answer at all: probed, and reported while it stays so (see `reports`).
                self.suspect(next, addr);
                return Err(Fail::Refused(format!("{CHAIN_BROKEN} at {next}: {why}")));
            }
            Err(e) => return Err(e.into()),
        };
        if ans.status == 409 {
            let r: WireRefusal = ans.json().await?;
            return Err(Fail::Refused(format!(
                "{CHAIN_BROKEN} at {next}: {}",
                r.reason
            )));
        }
        if !(200..300).contains(&ans.status) {
            return Err(ans.error().await.into());
        }
        ans.bytes().await?;
        Ok(())
    }

    /// The steps of a relayed request (`POST /w`, see [`crate::relay`]), each run as if it
    /// had come alone, side by side; their answers in the order sent.
    ///
    /// Boxed: each step is routed by [`Node::route`], whose own future holds this one.
    fn relayed(&self, body: Bytes) -> BoxFuture<'_, Result<NodeResp, Fail>> {
        Box::pin(async move {
            let items = RelayItem::parse_all(body)?;
            let answers =
                futures_util::future::join_all(items.into_iter().map(|i| self.relayed_step(i)))
                    .await;
            let mut out = BytesMut::new();
            for (status, body) in &answers {
                crate::relay::put_answer(&mut out, *status, body);
            }
            Ok(answer(200, out.freeze()))
        })
    }

    async fn relayed_step(&self, item: RelayItem) -> (u16, Bytes) {
        if !crate::relay::relayable(&item.method, &item.path) {
            return (400, Bytes::from_static(b"not a relayed route"));
        }
        let mut req = http::Request::builder().method(item.method).uri(item.path);
        for (k, v) in &item.headers {
            req = req.header(k, v);
        }
        let Ok(req) = req.body(http_body_util::Full::new(item.body)) else {
            return (400, Bytes::from_static(b"bad relayed step"));
        };
        let resp = self.respond(self.route(req, item.epoch).await);
        let status = resp.status().as_u16();
        match resp.into_body().collect().await {
            Ok(b) => (status, b.to_bytes()),
            Err(e) => (500, Bytes::from(format!("answer body: {e}"))),
        }
    }

    /// Applies a delete step here (its key marked dirty until the chain has it; the mark taken
    /// back if the delete fails).
    async fn bury_step(
        &self,
        step: &KeyStep<'_>,
        versioning: Option<WireVersioning>,
    ) -> Result<(), Fail> {
        let (bid, key, cv) = (step.bid, step.key, step.cv);
        self.mark_dirty(bid, key, cv);
        let buried = self
            .bury(
                &step.objects,
                &step.tombs,
                key,
                cv,
                step.obj.is_some(),
                versioning,
            )
            .await;
        if let Err(e) = buried {
            self.undo_dirty(bid, key, cv);
            return Err(e.into());
        }
        Ok(())
    }

    /// Deletes a key here as of version `cv`: a tombstone with the version, then the object if
    /// there is one, or (with `versioning`) a delete marker of that version over it.
    async fn bury(
        &self,
        objects: &Bucket,
        tombs: &Bucket,
        key: &str,
        cv: u64,
        has_object: bool,
        versioning: Option<WireVersioning>,
    ) -> StoreResult<()> {
        let mut attrs = packrat_store_api::ObjectAttrs {
            last_modified_ms: (now_micros() / 1000) as i64,
            ..Default::default()
        };
        attrs.user_meta.push((CV_META.to_string(), cv.to_string()));
        let tomb = PutObject {
            attrs,
            ..Default::default()
        };
        self.store
            .put_object(tombs, key, &mut OnePiece(None, None, None), tomb)
            .await?;
        if let Some(v) = versioning {
            // The object is kept in the key's history, under a delete marker of this version,
            // dated by it (the head's clock, in µs) so that every member lists the same marker:
            // a member's own clock would make copies of the key differ, and each catching up
            // would remove and copy the key's markers again.
            let dated = i64::try_from(cv / 1000).unwrap_or(i64::MAX);
            self.store
                .put_delete_marker(objects, key, v.version_as(cv), dated)
                .await?;
        } else if has_object {
            self.store.delete_object(objects, key).await?;
        }
        Ok(())
    }

    /// Drops tombstones older than `--tombstone-keep`, every minute (or as often as that, if
    /// shorter), for the node's life. A
    /// tombstone orders a delete against writes still on their way down a chain (seconds at
    /// most); a node that was away longer than that learns of the delete by the object's
    /// absence on the member it resyncs from (a resync drops what the source does not have).
    pub async fn collect_tombstones(self: Arc<Self>) {
        let every = self
            .tombstone_keep
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
        loop {
            tokio::time::sleep(every).await;
            match self.collect_tombstones_once(self.tombstone_keep).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(tombstones = n, "collected"),
                Err(e) => tracing::warn!("collecting tombstones: {e}"),
            }
        }
    }

    async fn collect_tombstones_once(&self, keep: Duration) -> StoreResult<usize> {
        let cutoff = (now_micros() / 1000) as i64 - keep.as_millis() as i64;
        let mut dropped = 0;
        for tombs in self.store.list_buckets().await? {
            if !tombs.name.starts_with("t-") {
                continue;
            }
            let mut after: Option<String> = None;
            loop {
                let page = self.local_page(&tombs, "", &after).await?;
                for t in page.objects.iter().filter(|t| t.last_modified_ms < cutoff) {
                    let bid: u64 = tombs.name[2..].parse().unwrap_or(0);
                    let _g = self.lock_of(bid, &t.key).lock().await;
                    if let Some(now) = self.store.head_object(&tombs, &t.key).await?
                        && now.attrs.last_modified_ms < cutoff
                    {
                        self.store.delete_object(&tombs, &t.key).await?;
                        dropped += 1;
                    }
                }
                after = page.objects.last().map(|o| o.key.clone());
                if !page.truncated {
                    break;
                }
            }
        }
        Ok(dropped)
    }

    /// A page of up to 1000 keys of a local bucket under `prefix`, after `after`.
    async fn local_page(
        &self,
        bucket: &Bucket,
        prefix: &str,
        after: &Option<String>,
    ) -> StoreResult<packrat_store_api::ObjectPage> {
        let query = ListQuery {
            prefix: prefix.to_string(),
            delimiter: None,
            after: after.clone(),
            max_keys: 1000,
        };
        self.store.list_objects(bucket, &query).await
    }

    /// A GET from another member answered with JSON (`Unavailable` if it cannot be reached,
    /// its error if it refuses).
    async fn fetch_json<T: serde::de::DeserializeOwned>(
        &self,
        addr: &str,
        path: &str,
        epoch: u64,
    ) -> Result<T, Fail> {
        let ans = self
            .fetch(addr, path, epoch)
            .await
            .map_err(|why| Fail::Store(StoreError::Unavailable(why)))?;
        if ans.status != 200 {
            return Err(ans.error().await.into());
        }
        Ok(ans.json().await?)
    }

    /// A resync's GET from a caught-up member.
    async fn fetch(
        &self,
        addr: &str,
        path: &str,
        epoch: u64,
    ) -> Result<crate::wire::Answer, String> {
        self.client
            .send(
                Method::GET,
                addr,
                path,
                epoch,
                &[],
                Bytes::new(),
                FORWARD_TIMEOUT,
            )
            .await
            .map_err(|e| e.to_string())
    }

    /// Notes that bucket `bid` has versioning (see `Node::versioned_bids`).
    fn note_versioned(&self, bid: u64) {
        if let Ok(mut v) = self.versioned_bids.lock() {
            v.insert(bid);
        }
    }

    fn is_versioned(&self, bid: u64) -> bool {
        self.versioned_bids.lock().is_ok_and(|v| v.contains(&bid))
    }

    /// Forgets the history step `cv` of a key (see `Node::history_steps`) once handed on.
    fn history_step_done(&self, bid: u64, key: &str, cv: u64) {
        if let Ok(mut h) = self.history_steps.lock() {
            let k = (bid, key.to_string());
            if h.get(&k) == Some(&cv) {
                h.remove(&k);
            }
        }
    }

    /// Marks a key's write `cv` as on its way down the chain (see `Node::dirty`).
    fn mark_dirty(&self, bid: u64, key: &str, cv: u64) {
        let epoch = self.map.borrow().epoch;
        if let Ok(mut d) = self.dirty.lock() {
            let k = (bid, key.to_string());
            let before = d.get(&k).map(|m| m.cv).filter(|b| *b < cv);
            d.insert(k, DirtyMark { cv, before, epoch });
        }
    }

    /// The epoch of a key's mark, if it is marked (see [`DirtyMark`]).
    fn dirty_since(&self, bid: u64, key: &str) -> Option<u64> {
        self.dirty
            .lock()
            .ok()?
            .get(&(bid, key.to_string()))
            .map(|m| m.epoch)
    }

    /// Clears a key's mark once the rest of the chain holds version `cv` (or a newer one):
    /// an older step still marked is settled by it too.
    fn clear_dirty(&self, bid: u64, key: &str, cv: u64) {
        if let Ok(mut d) = self.dirty.lock() {
            let k = (bid, key.to_string());
            if d.get(&k).is_some_and(|pending| pending.cv <= cv) {
                d.remove(&k);
            }
        }
    }

    /// Takes back the mark of step `cv`, which failed here before it was handed on: the key
    /// is marked as it was before the step (an earlier step not handed on yet stays marked).
    fn undo_dirty(&self, bid: u64, key: &str, cv: u64) {
        if let Ok(mut d) = self.dirty.lock() {
            let k = (bid, key.to_string());
            match d.get(&k).copied() {
                Some(DirtyMark {
                    cv: marked,
                    before: Some(b),
                    epoch,
                }) if marked == cv => {
                    d.insert(
                        k,
                        DirtyMark {
                            cv: b,
                            before: None,
                            epoch,
                        },
                    );
                }
                Some(m) if m.cv == cv => {
                    d.remove(&k);
                }
                _ => {}
            }
        }
    }

    /// Whether a key's newest step here is still `cv`'s, not yet handed on.
    fn dirty_at(&self, bid: u64, key: &str, cv: u64) -> bool {
        self.dirty
            .lock()
            .is_ok_and(|d| d.get(&(bid, key.to_string())).map(|m| m.cv) == Some(cv))
    }

    /// For each key given (`None`: not to be judged), whether it is dirty; one look at the
    /// marks for them all.
    fn dirty_among<'k>(&self, bid: u64, keys: impl Iterator<Item = Option<&'k str>>) -> Vec<bool> {
        let Ok(d) = self.dirty.lock() else {
            return keys.map(|k| k.is_some()).collect();
        };
        if d.is_empty() {
            return keys.map(|_| false).collect();
        }
        keys.map(|k| k.is_some_and(|k| d.contains_key(&(bid, k.to_string()))))
            .collect()
    }

    /// With `settle` (a member catching up judges its own copy against this node's): refused
    /// while a step of the key is under way here. A member after this one in the chain may
    /// already hold that step's version, committed, while it is staged and not yet visible
    /// here; judged against what is visible, it would be dropped as one that never committed.
    /// Checked before the lookup that follows: a step's mark is set before the member after
    /// this one gets it, and cleared only once its version is visible here.
    fn settled_here(&self, bid: u64, key: &str, q: &HashMap<String, String>) -> Result<(), Fail> {
        if q.contains_key("settle") && self.is_dirty(bid, key) {
            return Err(Fail::Refused(format!(
                "a step of {key} is under way at {}",
                self.id
            )));
        }
        Ok(())
    }

    fn is_dirty(&self, bid: u64, key: &str) -> bool {
        self.dirty
            .lock()
            .is_ok_and(|d| d.contains_key(&(bid, key.to_string())))
    }

    /// An object's metadata, if this node may answer `who` for it: a reader gets it from a
    /// caught-up member whose copy is committed (the tail's always is); a resync also gets a
    /// dirty copy; the next member of the chain, copying the version this node just made
    /// (see `uploads`), gets it from a member still syncing too.
    async fn read_meta(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        who: Asker,
    ) -> Result<ObjectInfo, Fail> {
        let chain = map.chain(pg);
        if !chain.contains(&self.id) || (who != Asker::Successor && map.is_syncing(&self.id, pg)) {
            return Err(Fail::Refused(format!("not a reader of PG {pg}")));
        }
        let is_tail = chain.last().is_some_and(|n| *n == self.id);
        let objects = self.reading_bucket(bid).await?;
        let info = self.store.head_object(&objects, key).await?;
        // Judged after the lookup: a write marks the key before it stores its version and
        // clears the mark once the tail has it, so a copy found here and not dirty now was
        // committed (judged before, a write could land between the two).
        if who == Asker::Reader {
            match self.dirty_since(bid, key) {
                Some(_) if !is_tail => return Err(Fail::Refused("dirty: ask the tail".into())),
                // A version this member took before it became the tail may be missing at the
                // members before it: it is committed once re-sent through the head.
                Some(epoch) if epoch < map.epoch => {
                    return Err(Fail::Refused(format!(
                        "{UNSETTLED}: the tail's version of {key} is not yet at every member"
                    )));
                }
                _ => {}
            }
        }
        info.ok_or_else(|| StoreError::NoSuchKey.into())
    }

    /// An object's metadata (see [`Node::read_meta`]) and, when it has 1 to `inline` bytes,
    /// its bytes; a version handed out without them is remembered for the read that follows.
    async fn meta_and_bytes(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        who: Asker,
        inline: u64,
    ) -> Result<(ObjectInfo, Option<Bytes>), Fail> {
        let info = self.read_meta(map, bid, pg, key, who).await?;
        if info.size > inline || info.size == 0 {
            self.remember(bid, key, &info);
            return Ok((info, None));
        }
        let reader = self.store.read_object(&info, 0, info.size)?;
        let body = read_whole(reader, info.size).await?;
        Ok((info, Some(body)))
    }

    /// The answers to a gathered request's lookups, in the order asked (see [`GatherItem`]):
    /// each as [`Node::meta_and_bytes`] answers a reader, looked up side by side; the
    /// metadata in binary when the gateway asked for it (`binary`), else JSON.
    async fn gathered(&self, map: &ClusterMap, items: &[GatherItem], binary: bool) -> NodeResp {
        let answers = futures_util::future::join_all(items.iter().map(|it| async move {
            if pg_of(it.bid, &it.key, map.pgs) != it.pg {
                return Err(Fail::Refused("the key is not in that PG".into()));
            }
            self.meta_and_bytes(map, it.bid, it.pg, &it.key, Asker::Reader, it.inline)
                .await
        }))
        .await;
        // Sized up front: growing it copied every answer already in it again (about 3% of a
        // node's CPU under 4 KiB GETs at 64 connections).
        let room = answers
            .iter()
            .map(|a| match a {
                Ok((_, bytes)) => GATHERED_META_ROOM + bytes.as_ref().map_or(0, Bytes::len),
                Err(_) => GATHERED_META_ROOM,
            })
            .sum();
        let mut out = BytesMut::with_capacity(room);
        for a in answers {
            match a {
                Ok((info, bytes)) if binary => {
                    Gathered::put_found_bin(&mut out, &meta_of(&info), bytes.as_deref())
                }
                Ok((info, bytes)) => match serde_json::to_vec(&meta_of(&info)) {
                    Ok(meta) => Gathered::put_found(&mut out, &meta, bytes.as_deref()),
                    Err(e) => Gathered::put_alone(&mut out, &e.to_string()),
                },
                Err(Fail::Store(StoreError::NoSuchKey | StoreError::NoSuchBucket)) => {
                    Gathered::put_missing(&mut out)
                }
                Err(Fail::Refused(why)) => Gathered::put_alone(&mut out, &why),
                Err(Fail::Store(e)) => Gathered::put_alone(&mut out, &e.to_string()),
            }
        }
        answer(200, out.freeze())
    }

    /// Keeps a version handed out without its bytes for the read that follows.
    fn remember(&self, bid: u64, key: &str, info: &ObjectInfo) {
        if let Ok(mut r) = self.recent.lock() {
            if r.len() >= RECENT_MAX {
                r.clear();
            }
            r.insert((bid, key.to_string(), cv_of(info)), info.clone());
        }
    }

    /// Version `want` of a key as this node has it (remembered from the lookup that handed it
    /// out, or its current object); refused if it is gone.
    async fn version_here(&self, bid: u64, key: &str, want: u64) -> Result<ObjectInfo, Fail> {
        let cached = self
            .recent
            .lock()
            .ok()
            .and_then(|r| r.get(&(bid, key.to_string(), want)).cloned());
        if let Some(i) = cached {
            return Ok(i);
        }
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let info = self
            .store
            .head_object(&objects, key)
            .await?
            .ok_or(StoreError::NoSuchKey)?;
        if cv_of(&info) != want {
            return Err(Fail::Refused("the version asked for is gone".into()));
        }
        Ok(info)
    }

    /// Where the named members of version `want` of a TAR object lie in it (see
    /// `ObjectStore::tar_members`).
    async fn tar_members(
        &self,
        bid: u64,
        key: &str,
        want: u64,
        names: &[String],
    ) -> Result<NodeResp, Fail> {
        let info = self.version_here(bid, key, want).await?;
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let found = self.store.tar_members(&objects, key, &info, names).await?;
        Ok(json(200, &found))
    }

    /// Bytes `[start, end)` of version `want` of a key, streamed as the local store verifies
    /// them.
    async fn read_bytes(
        &self,
        bid: u64,
        key: &str,
        want: u64,
        version: Option<&str>,
        start: u64,
        end: u64,
    ) -> Result<NodeResp, Fail> {
        let info = match version {
            Some(id) => self.version_by_id(bid, key, id, want).await?,
            None => self.version_here(bid, key, want).await?,
        };
        let mut reader = self.store.read_object(&info, start, end)?;
        // A single piece is read before answering, so a failed read is an error, not a cut.
        if reader.is_single_piece() {
            let piece = reader.next().await?.unwrap_or_default();
            return Ok(answer_bytes(piece));
        }
        let stream = futures_util::stream::unfold(reader, |mut r| async move {
            match r.next().await {
                Ok(Some(b)) => Some((Ok(b), r)),
                Ok(None) => None,
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), r)),
            }
        });
        Ok(streamed(stream))
    }

    /// A page of this node's objects (or, with `tombstones`, tombstones) of the PGs asked.
    async fn list(
        &self,
        map: &ClusterMap,
        bid: u64,
        q: &HashMap<String, String>,
    ) -> Result<WirePage, Fail> {
        let (pgs, max) = listing_scope(q);
        let tombstones = q.contains_key("tombstones");
        let with_cv = q.contains_key("cv");
        let prefix = q.get("prefix").cloned().unwrap_or_default();
        let delimiter = q.get("delimiter").filter(|d| !d.is_empty()).cloned();
        let mut after = q.get("after").cloned();
        // A page that ended on a common prefix resumes after everything under it.
        if let Some(a) = after.as_mut() {
            WireEntry::resume_after_prefix(&prefix, delimiter.as_deref(), a);
        }
        let bucket = self
            .local_bucket(format!("{}-{bid}", if tombstones { "t" } else { "o" }))
            .await?;
        let mut page = WirePage::default();
        'pages: loop {
            let local = self.local_page(&bucket, &prefix, &after).await?;
            for o in &local.objects {
                after = Some(o.key.clone());
                if !pgs.contains(&pg_of(bid, &o.key, map.pgs)) {
                    continue;
                }
                if page.entries.len() >= max {
                    page.truncated = true;
                    break 'pages;
                }
                if let Some(d) = &delimiter
                    && let Some(i) = o.key[prefix.len()..].find(d.as_str())
                {
                    let cp = o.key[..prefix.len() + i + d.len()].to_string();
                    page.entries.push(WireEntry::common_prefix(cp.clone()));
                    // Skip the rest of the common prefix.
                    after = Some(format!("{cp}{}", char::MAX));
                    continue 'pages;
                }
                // A tombstone's version, or with `cv` an object's (a resync compares it with its
                // own before it asks for the object).
                let cv = if tombstones || with_cv {
                    self.store
                        .head_object(&bucket, &o.key)
                        .await?
                        .map_or(0, |t| cv_of(&t))
                } else {
                    0
                };
                page.entries.push(WireEntry {
                    deleted: tombstones,
                    cv,
                    prefix: false,
                    ..entry_of(o)
                });
            }
            if !local.truncated {
                break;
            }
        }
        Ok(page)
    }

    /// Catches up on the PGs this node joined, from caught-up members, and reports each one
    /// done in etcd. Runs for the node's life.
    pub async fn resync_loop(self: Arc<Self>, etcd: Etcd) {
        let mut rx = self.map.clone();
        let mut done: HashSet<(u32, u64)> = HashSet::new();
        loop {
            let map = rx.borrow_and_update().clone();
            let todo: Vec<(u32, u64)> = map
                .syncing
                .get(&self.id)
                .into_iter()
                .flatten()
                .map(|(p, e)| (*p, *e))
                .filter(|pe| !done.contains(pe))
                .collect();
            let mut pending = false;
            for batch in todo.chunks(RESYNC_PGS) {
                let bids = match crate::map::bucket_records(&etcd).await {
                    Ok(b) => b
                        .into_iter()
                        .map(|b| (b.id, b.versioning.is_some()))
                        .collect::<Vec<(u64, bool)>>(),
                    Err(e) => {
                        tracing::debug!("resync: {e}");
                        pending = true;
                        break;
                    }
                };
                let pgs: Vec<u32> = batch.iter().map(|(pg, _)| *pg).collect();
                let sweep = self.sweep.lock().await;
                let copied = self.resync_pgs(&map, &pgs, &bids).await;
                drop(sweep);
                let copied = match copied {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(?pgs, "resync: {e}");
                        pending = true;
                        continue;
                    }
                };
                for (pg, since) in batch {
                    let Some(n) = copied.get(pg) else {
                        pending = true; // no caught-up member to copy from yet
                        continue;
                    };
                    tracing::info!(pg, objects = n, "caught up");
                    if etcd
                        .put(&format!("synced/{}/{pg}", self.id), since.to_string())
                        .await
                        .is_ok()
                    {
                        done.insert((*pg, *since));
                    } else {
                        pending = true;
                    }
                }
                if rx.has_changed().unwrap_or(false) {
                    break;
                }
            }
            let wait = if pending {
                Duration::from_millis(500)
            } else {
                Duration::from_secs(3600)
            };
            let _ = tokio::time::timeout(wait, rx.changed()).await;
        }
    }

    /// Copies what caught-up members have of `pgs` and this node lacks (newer versions,
    /// tombstones), and gives up copies that never committed (newer here than there, or
    /// unknown there: see `unsettled`), taking theirs or none. One listing per bucket and source for all
    /// the PGs it is the source of, not one per PG: a bucket's listing on a node scans all of
    /// it, so a node back from a reboot with hundreds of PGs to catch up on would otherwise
    /// scan every bucket hundreds of times. Answers the objects copied per PG; a PG without a
    /// caught-up member to copy from is left out.
    async fn resync_pgs(
        &self,
        map: &ClusterMap,
        pgs: &[u32],
        bids: &[(u64, bool)],
    ) -> Result<HashMap<u32, usize>, String> {
        let mut by_source: BTreeMap<String, HashSet<u32>> = BTreeMap::new();
        let mut copied = HashMap::new();
        for pg in pgs {
            match map.readers(*pg).find(|n| **n != self.id) {
                Some(source) => {
                    by_source.entry(source.clone()).or_default().insert(*pg);
                    copied.insert(*pg, 0);
                }
                None => tracing::debug!(pg, "resync: no caught-up member to copy from"),
            }
        }
        for (source, group) in by_source {
            let addr = map.addr(&source).ok_or("no address")?.to_string();
            // The source's steps of older maps (chains without this node) land before it is
            // listed, or never (see `epochs`). A node from before the barrier answers 404.
            let ans = self.fetch(&addr, "/drain", map.epoch).await?;
            if !matches!(ans.status, 204 | 404) {
                return Err(format!("barrier at {source}: {}", ans.error().await));
            }
            for &(bid, versioned) in bids {
                if versioned {
                    self.note_versioned(bid);
                    self.resync_versions(map, &group, bid, &addr, &mut copied)
                        .await?;
                } else {
                    self.resync_bucket(map, &group, bid, &addr, &mut copied)
                        .await?;
                }
                let parts = self.resync_uploads(map, &group, bid, &addr).await?;
                if parts > 0 {
                    tracing::info!(bid, parts, %source, "copied parts of uploads in progress");
                }
            }
        }
        Ok(copied)
    }

    async fn resync_bucket(
        &self,
        map: &ClusterMap,
        pgs: &HashSet<u32>,
        bid: u64,
        addr: &str,
        copied: &mut HashMap<u32, usize>,
    ) -> Result<(), String> {
        let pg_list = pgs.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let e = |e: StoreError| e.to_string();
        let source_keys = |tombstones: bool| {
            let addr = addr.to_string();
            let pg_list = &pg_list;
            async move {
                let mut out = Vec::new();
                let mut after: Option<String> = None;
                loop {
                    let mut path = format!("/l/{bid}?pgs={pg_list}&max=1000&cv");
                    if tombstones {
                        path.push_str("&tombstones");
                    }
                    if let Some(a) = &after {
                        path.push_str(&format!("&after={}", encode(a)));
                    }
                    let ans = self.fetch(&addr, &path, map.epoch).await?;
                    if ans.status != 200 {
                        return Err(format!("listing from {addr}: {}", ans.error().await));
                    }
                    let page: WirePage = ans.json().await.map_err(e)?;
                    after = page.entries.last().map(|x| x.key.clone());
                    out.extend(page.entries);
                    if !page.truncated {
                        return Ok(out);
                    }
                }
            }
        };
        let objects = self.local_bucket(format!("o-{bid}")).await.map_err(e)?;
        let tombs = self.local_bucket(format!("t-{bid}")).await.map_err(e)?;
        let settle = |key: &str| {
            let (objects, tombs) = (&objects, &tombs);
            let key = key.to_string();
            async move {
                match self.settle_with(map, addr, objects, tombs, bid, &key).await {
                    Ok(changed) => Ok(changed),
                    // Overwritten on the source meanwhile: the newer write comes by the chain.
                    Err(Fail::Refused(_)) => Ok(false),
                    Err(Fail::Store(err)) => Err(format!("{key}: {err}")),
                }
            }
        };
        let theirs = source_keys(false).await?;
        let their_tombs = source_keys(true).await?;
        let mut known: HashSet<&str> = theirs.iter().map(|x| x.key.as_str()).collect();
        known.extend(their_tombs.iter().map(|x| x.key.as_str()));
        for t in &their_tombs {
            let _g = self.lock_of(bid, &t.key).lock().await;
            let (obj, tomb) = self.current(&objects, &tombs, &t.key).await.map_err(e)?;
            if t.cv > obj.as_ref().map_or(0, cv_of).max(tomb) {
                self.bury(&objects, &tombs, &t.key, t.cv, obj.is_some(), None)
                    .await
                    .map_err(e)?;
            }
        }
        for o in &theirs {
            let pg = pg_of(bid, &o.key, map.pgs);
            // Only what is newer on the source is asked for: a node back from a short absence
            // copies what it missed, not the whole PG. A copy newer here may be one that
            // never committed.
            {
                let (obj, tomb) = self.current(&objects, &tombs, &o.key).await.map_err(e)?;
                let mine = obj.as_ref().map_or(0, cv_of).max(tomb);
                if o.cv != 0 && o.cv <= mine {
                    if o.cv < mine && settle(&o.key).await? {
                        *copied.entry(pg).or_default() += 1;
                    }
                    continue;
                }
            }
            let path = format!("/o/{bid}/{pg}/{}?meta&any", encode(&o.key));
            let ans = self.fetch(addr, &path, map.epoch).await?;
            if ans.status == 404 {
                continue;
            }
            if ans.status != 200 {
                return Err(format!("{}: {}", o.key, ans.error().await));
            }
            let meta: WireMeta = ans.json().await.map_err(e)?;
            {
                let (obj, tomb) = self.current(&objects, &tombs, &o.key).await.map_err(e)?;
                if meta.cv <= obj.as_ref().map_or(0, cv_of).max(tomb) {
                    continue;
                }
            }
            // The bytes are read without the key's lock; the copy is made visible under it
            // if it is still newer than what this node has.
            let staged = match self
                .stage_version(map, addr, &objects, bid, pg, &o.key, &meta)
                .await
            {
                Ok(s) => s,
                // Overwritten meanwhile: the newer write reaches this node by the chain.
                Err(Fail::Refused(_)) => continue,
                Err(Fail::Store(err)) => return Err(format!("{}: {err}", o.key)),
            };
            let _g = self.lock_of(bid, &o.key).lock().await;
            let (obj, tomb) = self.current(&objects, &tombs, &o.key).await.map_err(e)?;
            if meta.cv <= obj.as_ref().map_or(0, cv_of).max(tomb) {
                self.drop_staged(&objects, &o.key, staged).await;
                continue;
            }
            if let Err(f) = self.commit_version(&objects, &o.key, &meta, staged).await {
                return Err(match f {
                    Fail::Refused(r) => format!("{}: {r}", o.key),
                    Fail::Store(err) => format!("{}: {err}", o.key),
                });
            }
            if tomb > 0 {
                self.store.delete_object(&tombs, &o.key).await.map_err(e)?;
            }
            *copied.entry(pg).or_default() += 1;
        }
        // What this node holds of the PG that the source did not list: writes that never
        // committed, or ones that came down the chain since the listing (the source has them
        // now).
        let mut after: Option<String> = None;
        loop {
            let page = self.local_page(&objects, "", &after).await.map_err(e)?;
            for o in &page.objects {
                if pgs.contains(&pg_of(bid, &o.key, map.pgs)) && !known.contains(o.key.as_str()) {
                    settle(&o.key).await?;
                }
            }
            after = page.objects.last().map(|o| o.key.clone());
            if !page.truncated {
                break;
            }
        }
        Ok(())
    }
}

/// Every piece of a read of `size` bytes, in one buffer (a read in one piece as it came, not
/// copied).
async fn read_whole(
    mut reader: Box<dyn packrat_store_api::ObjectRead>,
    size: u64,
) -> StoreResult<Bytes> {
    if reader.is_single_piece() {
        return Ok(reader.next().await?.unwrap_or_default());
    }
    let mut body = bytes::BytesMut::with_capacity(size as usize);
    while let Some(piece) = reader.next().await? {
        body.extend_from_slice(&piece);
    }
    Ok(body.freeze())
}

fn entry_of(o: &packrat_store_api::ObjectSummary) -> WireEntry {
    WireEntry {
        key: o.key.clone(),
        prefix: false,
        deleted: false,
        size: o.size,
        etag: o.etag.clone(),
        last_modified_ms: o.last_modified_ms,
        checksum: o.checksum.clone(),
        storage_class: o.storage_class.clone(),
        cv: 0,
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_serves_at_most_its_bound_of_requests_at_once() {
        let count = std::sync::atomic::AtomicUsize::new(0);
        let mut held: Vec<InFlight> = (0..REQUESTS_MAX)
            .map(|_| InFlight::take(&count).expect("a place below the bound"))
            .collect();
        assert!(InFlight::take(&count).is_none(), "one past the bound");
        assert_eq!(count.load(Ordering::Relaxed), REQUESTS_MAX);
        held.pop();
        assert!(
            InFlight::take(&count).is_some(),
            "a place given back is taken again"
        );
        drop(held);
        assert_eq!(count.load(Ordering::Relaxed), 0);
    }
}
