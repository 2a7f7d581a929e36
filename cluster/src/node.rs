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

use crate::map::ClusterMap;
use crate::placement::pg_of;
use crate::wire::meta_codec::{META_CODEC_HEADER, META_CODEC_V1};
use crate::wire::{
    BATCH_ITEMS_MAX, CV_HEADER, CV_META, EPOCH_HEADER, GatherItem, MD5_META, META_HEADER,
    NodeClient, PUT_HEADER, SECRET_HEADER, VER_META, WireBatchItem, WireError, WireLockChange,
    WireMeta, WirePut, WireRefusal, WireVersioning, decode, encode, is_node_meta,
};
use base64::Engine;
use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use packrat_store_api::batch::BatchOrder;
use packrat_store_api::checksum::ChecksumAlgorithm;
use packrat_store_api::{
    Bucket, ByteSource, NewBucket, ObjectInfo, ReplicaStore, StoreError, StoreResult,
};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;

mod admin;
use reads::{entry_of, read_whole};
mod batch;
mod chain;
mod dropped;
mod figures;
mod marks;
mod reads;
mod resync;
pub(crate) use dropped::cluster_bucket_of;
mod beside;
mod edit;
mod epochs;
pub mod held;
mod lifecycle;
mod listen;
pub use lifecycle::LifecycleSchedule;
mod reports;
mod unsettled;
mod uploads;
mod versions;

type NodeResp = Response<http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>>;

pub(crate) use chain::KeyAt;

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
    store: Arc<dyn ReplicaStore>,
    map: watch::Receiver<Arc<ClusterMap>>,
    trust: crate::Trust,
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
    /// Batch GETs at this node's S3 read endpoint it planned and read in its own store
    /// (`batch_here`), and those it sent the ordinary way (some item not answerable here).
    near_batches: [AtomicU64; 2],
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
/// instead of 10-11: docs/benchmark-log.md). Below it, the trip to the pool costs more than the
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
        store: Arc<dyn ReplicaStore>,
        map: watch::Receiver<Arc<ClusterMap>>,
        trust: crate::Trust,
        tombstone_keep: Duration,
        metrics: Option<crate::MetricsPage>,
        held: Arc<held::HeldPgs>,
    ) -> Arc<Node> {
        let stripes = crate::placement::slots_within_pgs(map.borrow().pgs, LOCK_STRIPES);
        let client = NodeClient::new(&trust);
        Arc::new(Node {
            id,
            store,
            map,
            relay: crate::relay::Relay::new(client.clone()),
            client,
            trust,
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
            near_batches: Default::default(),
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

    pub(super) async fn handle<B>(self: Arc<Self>, req: http::Request<B>) -> NodeResp
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: std::fmt::Display,
    {
        if req.method() == Method::GET
            && let Some(page) = self.operator_page(req.uri().path())
        {
            return page;
        }
        let secret_ok = req
            .headers()
            .get(SECRET_HEADER)
            .is_some_and(|v| crate::constant_time_eq(v.as_bytes(), self.trust.secret.as_bytes()));
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
        if !probe && let Err(refused) = self.may_serve(admin) {
            return self.respond(Err(refused));
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

    /// Whether this node may serve a request now (`admin`: an operator's or a job's, not the
    /// data path): not while its lease is not known alive, nor once it stepped down, nor
    /// before the map has taken in its restart (see [`Node::handle`]).
    fn may_serve(&self, admin: bool) -> Result<(), Fail> {
        if let Some(since) = self.lease.fenced() {
            self.fenced.fetch_add(1, Ordering::Relaxed);
            return Err(Fail::Refused(format!(
                "{FENCED}: {} has not renewed its etcd lease for {} ms",
                self.id,
                since.as_millis()
            )));
        }
        if !admin && self.stepped_down() {
            self.fenced.fetch_add(1, Ordering::Relaxed);
            return Err(Fail::Refused(format!(
                "{FENCED}: {} stepped down: most of the other nodes cannot reach it",
                self.id
            )));
        }
        if !admin && !self.known_to_map() {
            return Err(Fail::Refused(format!(
                "{RESTARTED}: {} restarted and the map has not taken it in yet",
                self.id
            )));
        }
        Ok(())
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
                    .change_lock(&map, KeyAt { bid, pg, key: &key }, cv, id, change, bypass)
                    .await?;
                Ok(json(200, &locked))
            }
            Method::PUT if q.contains_key("class") => {
                let (Some(class), Some(id)) = (q.get("class"), q.get("version")) else {
                    return Ok(answer(400, "a class change names its version"));
                };
                let noncurrent = q.contains_key("noncurrent");
                self.change_class(
                    &map,
                    KeyAt { bid, pg, key: &key },
                    cv,
                    id,
                    class,
                    noncurrent,
                )
                .await?;
                Ok(json(200, &()))
            }
            Method::PUT if q.contains_key("tags") => {
                let Some(id) = q.get("version") else {
                    return Ok(answer(400, "a tag change names its version"));
                };
                let body = body_of_request(req, "tags").await?;
                self.change_tags(&map, KeyAt { bid, pg, key: &key }, cv, id, body)
                    .await?;
                Ok(json(200, &()))
            }
            Method::PUT => {
                let put: WirePut = put_header(&req, "write")?;
                let body = body_of_request(req, "write").await?;
                let meta = self
                    .write(
                        &map,
                        KeyAt { bid, pg, key: &key },
                        cv,
                        Some((put, body)),
                        None,
                        None,
                    )
                    .await?;
                Ok(json(200, &meta))
            }
            Method::PATCH => {
                let put: WirePut = put_header(&req, "edit")?;
                let Some(base) = q.get("base").and_then(|v| v.parse().ok()) else {
                    return Ok(answer(400, "base is needed"));
                };
                let meta = self
                    .edit(&map, KeyAt { bid, pg, key: &key }, cv, base, put)
                    .await?;
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
                    .delete_version(&map, KeyAt { bid, pg, key: &key }, cv, &id, bypass, false)
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
                    .write(
                        &map,
                        KeyAt { bid, pg, key: &key },
                        cv,
                        None,
                        versioning,
                        None,
                    )
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
                let who = match (q.contains_key("pull"), q.contains_key("any")) {
                    (true, _) => Asker::Successor,
                    (false, true) => Asker::Resync,
                    (false, false) => Asker::Reader,
                };
                let (meta, body) = self
                    .read_version(
                        &map,
                        KeyAt { bid, pg, key: &key },
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
                let mut resp = with_meta(&meta_of(&info), body)?;
                self.tell_unsettled(&mut resp, who, bid, &key);
                Ok(resp)
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
