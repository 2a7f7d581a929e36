//! Batch GET and epoch streams through a cluster gateway: each item read from a committed
//! replica of its PG, the entries emitted in the order planned.
//!
//! The items are grouped by the reader chosen for their PG (the caught-up members in turn, as
//! for a GET); each node gets its items in requests of up to [`NODE_BATCH_ITEMS`] (see
//! `Node::batch`). Planning asks every node what its share would send (`?plan`: the bytes, for
//! the batch's limit, and the items it may not answer for); reading asks again with `?read`,
//! and the node plans and reads its share with its own store's batch reader, answering
//! [`BatchRecord`]s in the order asked. The gateway follows the items in order, taking each
//! entry from the answer of its node (opened when first needed, a node's next request when
//! its last one is done) and copying it into the caller's frames once.
//!
//! An item a node refused (its copy is dirty: a write is on its way down the chain, and only
//! the tail's copy is committed; or it is not a caught-up member), every item of a request
//! that failed (a node unreachable, a map changed) or of an answer cut before it, and an item
//! a node failed to read (a checksum mismatch on its copy), is looked up alone, the way a GET
//! is, which follows the chain to the tail and the map through a failover. Items that are
//! looked up alone at planning come with their bytes when small (up to
//! [`PLAN_INLINE_BYTES_MAX`] in all); the bytes of larger ones are read in their turn.
//!
//! Beside a node (its S3 read endpoint, where a client sends each node the items of the PGs it
//! holds), the node plans the whole batch in its own store and its store reads it straight
//! into the caller's entries (`Node::batch_here`), unless some item must be read elsewhere.

use super::{ClusterStore, INLINE_MAX};
use crate::placement::pg_of;
use crate::wire::Call;
use crate::wire::{
    Answer, BATCH_CRC_HEADER, BATCH_ITEMS_MAX, BatchRecord, NearPlan, READ_TIMEOUT, WireBatchHead,
    WireBatchItem, body_crc32c, check_crc,
};
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;
use http::Method;
use http_body_util::BodyExt;
use packrat_store_api::batch::{
    BatchItem, BatchOrder, BatchPlan, EntryHead, EntrySink, ItemRange, resolve_item_range,
};
use packrat_store_api::{Bucket, ObjectInfo, ObjectStore, StoreError, StoreResult, sealed};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};

/// Items of one request to a node.
const NODE_BATCH_ITEMS: usize = 2048;
const _: () = assert!(NODE_BATCH_ITEMS <= BATCH_ITEMS_MAX);
/// Requests to nodes in flight at once while planning.
const NODE_PLANS: usize = 8;
/// Keys looked up alone in flight at once.
const LOOKUPS: usize = 64;
/// Payloads up to this size are taken whole from a node's answer before their entry is
/// emitted (so an answer cut in one leaves no half entry); larger ones stream through.
const GATHER_MAX: u64 = 1024 * 1024;
/// Bytes of small objects looked up alone that a plan holds (they come with their lookups);
/// past it, lookups ask for metadata only and the bytes are read in their turn. A batch may
/// name 100,000 objects: without the bound, one request could hold gigabytes in the gateway.
const PLAN_INLINE_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// One planned item, in the caller's order.
struct Item {
    /// Its entry's name: the key, or `key/member` for a TAR member, as on one server.
    name: String,
    tag: Option<String>,
    pg: u32,
    key: String,
    member: Option<String>,
    range: Option<ItemRange>,
    via: Via,
}

impl Item {
    /// The item as a node is asked for it.
    fn wire(&self) -> WireBatchItem<&str> {
        WireBatchItem {
            pg: self.pg,
            key: &self.key,
            member: self.member.as_deref(),
            range: self.range.map(Into::into),
        }
    }

    fn head(&self) -> EntryHead<'_> {
        EntryHead {
            name: &self.name,
            tag: self.tag.as_deref(),
        }
    }
}

/// Where an item's entry comes from.
enum Via {
    /// Position `at` of node request `req`.
    Node { req: usize, at: u32 },
    /// To be looked up alone (while planning).
    Alone,
    /// Looked up alone: the object range to send, or why not.
    Found(Box<Result<(ObjectInfo, u64, u64), StoreError>>),
}

/// One request to a node: for each of its items, the item's place in the batch.
struct NodeRequest {
    node: String,
    item_of: Vec<usize>,
}

struct Plan {
    bucket: Bucket,
    items: Vec<Item>,
    requests: Vec<NodeRequest>,
    /// The answers opened while planning (each node's first request).
    streams: Vec<Stream>,
    order: BatchOrder,
}

pub(crate) async fn plan_batch(
    store: &ClusterStore,
    bucket: &Bucket,
    items: Vec<BatchItem>,
    order: BatchOrder,
) -> StoreResult<BatchPlan> {
    let map = store.map();
    // Beside a node, every item is of a PG it serves (or the batch is misdirected): the node
    // plans it in its own store if it may answer every item itself.
    let items = match &store.beside {
        None => items,
        Some(me) => {
            let mut pgs = Vec::with_capacity(items.len());
            for it in &items {
                let pg = pg_of(bucket.id, &it.key, map.pgs);
                store.serves_here(&map, pg, &it.key)?;
                pgs.push(pg);
            }
            match (me.batches)(bucket.id, pgs, items, order).await {
                Ok(plan) => return Ok(plan),
                Err(items) => items,
            }
        }
    };
    let mut requests: Vec<NodeRequest> = Vec::new();
    // The request each node's items go to now.
    let mut filling: HashMap<String, usize> = HashMap::new();
    let mut planned: Vec<Item> = Vec::with_capacity(items.len());
    for (i, it) in items.into_iter().enumerate() {
        let pg = pg_of(bucket.id, &it.key, map.pgs);
        store.serves_here(&map, pg, &it.key)?;
        let name = match &it.member {
            None => it.key.clone(),
            Some(m) => format!("{}/{m}", it.key),
        };
        // A PG with no reader now is left to the lookups alone, which wait for a failover.
        let via = match store.pick_reader(&map, pg) {
            None => Via::Alone,
            Some(node) => {
                let r = match filling.get(&node) {
                    Some(&r) if requests[r].item_of.len() < NODE_BATCH_ITEMS => r,
                    _ => {
                        requests.push(NodeRequest {
                            node: node.clone(),
                            item_of: Vec::new(),
                        });
                        filling.insert(node, requests.len() - 1);
                        requests.len() - 1
                    }
                };
                let req = &mut requests[r];
                req.item_of.push(i);
                Via::Node {
                    req: r,
                    at: (req.item_of.len() - 1) as u32,
                }
            }
        };
        planned.push(Item {
            name,
            tag: it.tag,
            pg,
            key: it.key,
            member: it.member,
            range: it.range,
            via,
        });
    }
    // What each node's share would send; the items it refused, and those of a request that
    // failed, are looked up alone. A node's first request is sent to be read at once (its
    // entries wait in the connection until the plan is read, or are dropped with it); the
    // others are asked for their plan and sent again to be read in their turn.
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (r, req) in requests.iter().enumerate() {
        first.entry(req.node.as_str()).or_insert(r);
    }
    let heads: Vec<(usize, StoreResult<NodeStream>)> =
        futures_util::stream::iter(0..requests.len())
            .map(|r| {
                let req = &requests[r];
                let read = first.get(req.node.as_str()) == Some(&r);
                let items: Vec<_> = req.item_of.iter().map(|&i| planned[i].wire()).collect();
                async move { (r, open(store, bucket, &req.node, &items, order, read).await) }
            })
            .buffer_unordered(NODE_PLANS)
            .collect()
            .await;
    let mut streams: Vec<Stream> = requests.iter().map(|_| Stream::NotOpen).collect();
    let mut bytes = 0u64;
    for (r, head) in heads {
        let req = &requests[r];
        match head {
            Ok(s) => {
                bytes += s.head.bytes;
                for &at in &s.head.refused {
                    if let Some(&i) = req.item_of.get(at as usize) {
                        planned[i].via = Via::Alone;
                    }
                }
                if first.get(req.node.as_str()) == Some(&r) {
                    streams[r] = Stream::Open(Box::new(s));
                }
            }
            Err(e) => {
                tracing::debug!(node = %req.node, error = %e, "batch plan failed; items asked alone");
                for &i in &req.item_of {
                    planned[i].via = Via::Alone;
                }
                streams[r] = Stream::Gone;
            }
        }
    }
    bytes += look_up_alone(store, bucket, &mut planned).await?;
    Ok(BatchPlan {
        entries: planned.len(),
        bytes,
        plan: Box::new(Plan {
            bucket: bucket.clone(),
            items: planned,
            requests,
            streams,
            order,
        }),
    })
}

/// Looks up alone the items marked so (see the module's comment), [`LOOKUPS`] at a time, and
/// finds the TAR members they name; answers the bytes they will send.
async fn look_up_alone(
    store: &ClusterStore,
    bucket: &Bucket,
    items: &mut [Item],
) -> StoreResult<u64> {
    let alone: Vec<usize> = (0..items.len())
        .filter(|&i| matches!(items[i].via, Via::Alone))
        .collect();
    if alone.is_empty() {
        return Ok(0);
    }
    let held = &AtomicU64::new(0);
    let items_ref = &*items;
    let found: Vec<(usize, StoreResult<Option<ObjectInfo>>)> = futures_util::stream::iter(alone)
        .map(|i| async move {
            // Decided as a lookup starts: the bound is passed by at most what the lookups in
            // flight bring (LOOKUPS x INLINE_MAX).
            let inline = if held.load(Ordering::Relaxed) < PLAN_INLINE_BYTES_MAX {
                INLINE_MAX
            } else {
                0
            };
            let f = store.lookup(bucket, &items_ref[i].key, inline).await;
            if let Ok(Some(o)) = &f
                && inline > 0
                && o.size <= inline
            {
                held.fetch_add(o.size, Ordering::Relaxed);
            }
            (i, f)
        })
        .buffer_unordered(LOOKUPS)
        .collect()
        .await;
    let members = locate_members(store, bucket, items, &found).await?;
    let mut bytes = 0u64;
    for (i, obj) in found {
        let it = &mut items[i];
        let body = resolve(it, obj, |key, m| {
            members
                .get(&(key.to_string(), m.to_string()))
                .copied()
                .flatten()
        });
        if let Ok((_, s, e)) = &body {
            bytes += e - s;
        }
        it.via = Via::Found(Box::new(body));
    }
    Ok(bytes)
}

/// The object range an item looked up alone sends, or why not: its member located by
/// `member_at` (offset and size in the archive).
fn resolve(
    it: &Item,
    obj: StoreResult<Option<ObjectInfo>>,
    member_at: impl Fn(&str, &str) -> Option<(u64, u64)>,
) -> Result<(ObjectInfo, u64, u64), StoreError> {
    let o = match obj {
        Err(e) => return Err(e),
        Ok(None) => return Err(StoreError::NoSuchKey),
        Ok(Some(o)) => o,
    };
    if sealed::is_sealed(&o.attrs.headers) {
        return Err(StoreError::Invalid(
            "the object is stored with server-side encryption: read it with GetObject".into(),
        ));
    }
    let (base, len) = match &it.member {
        None => (0, o.size),
        Some(m) => member_at(&it.key, m).ok_or_else(|| StoreError::NoSuchMember(m.clone()))?,
    };
    let (s, e) = match it.range {
        None => (0, len),
        Some(r) => {
            resolve_item_range(r, len).ok_or(StoreError::RangeNotSatisfiable { size: len })?
        }
    };
    Ok((o, base + s, base + e))
}

/// Where the TAR members that items looked up alone name lie in their archives: one request
/// per archive to a node that has its version (which indexes it once), [`NODE_PLANS`] at a
/// time. An archive that is not a TAR fails the whole plan, as on one server.
async fn locate_members(
    store: &ClusterStore,
    bucket: &Bucket,
    items: &[Item],
    found: &[(usize, StoreResult<Option<ObjectInfo>>)],
) -> StoreResult<HashMap<(String, String), Option<(u64, u64)>>> {
    let mut wanted: HashMap<String, (ObjectInfo, Vec<String>)> = HashMap::new();
    for (i, obj) in found {
        let it = &items[*i];
        if let (Some(m), Ok(Some(o))) = (&it.member, obj)
            && !sealed::is_sealed(&o.attrs.headers)
        {
            let names = &mut wanted
                .entry(it.key.clone())
                .or_insert_with(|| (o.clone(), Vec::new()))
                .1;
            if !names.contains(m) {
                names.push(m.clone());
            }
        }
    }
    let asked: Vec<_> = wanted
        .into_iter()
        .map(|(key, (obj, names))| async move {
            let at = store.tar_members(bucket, &key, &obj, &names).await?;
            Ok::<_, StoreError>(
                names
                    .into_iter()
                    .zip(at)
                    .map(|(m, at)| ((key.clone(), m), at))
                    .collect::<Vec<_>>(),
            )
        })
        .collect();
    let mut out = HashMap::new();
    let mut answers = futures_util::stream::iter(asked).buffer_unordered(NODE_PLANS);
    while let Some(answer) = answers.next().await {
        out.extend(answer?);
    }
    Ok(out)
}

/// A node's answer to its share of a batch: the head, then its records as they come.
pub(crate) struct NodeStream {
    pub(crate) head: WireBatchHead,
    body: crate::wire::AnswerBody,
    /// Received and not yet taken, in order.
    chunks: VecDeque<Bytes>,
    len: usize,
    /// Records still to come before the end record.
    left: usize,
    /// For a request sent with only some of its items: the position in the planned request
    /// of each item sent.
    sent: Option<Vec<u32>>,
    /// Whether the node follows each part of its answer with its CRC32C (an older node does
    /// not; see [`BATCH_CRC_HEADER`]).
    crc: bool,
    /// The CRC32C of the entry payload being taken, so far.
    payload: Option<crc_fast::Digest>,
}

/// Sends request `req` (with `read`: its entries follow the head).
async fn open(
    store: &ClusterStore,
    bucket: &Bucket,
    node: &str,
    items: &[WireBatchItem<&str>],
    order: BatchOrder,
    read: bool,
) -> StoreResult<NodeStream> {
    let map = store.map();
    let addr = map
        .addr(node)
        .ok_or_else(|| StoreError::Unavailable(format!("{node} is not in the map")))?;
    let body = serde_json::to_vec(items).map_err(|e| StoreError::internal("batch", e))?;
    let path = format!(
        "/b/{}?crc&{}{}",
        bucket.id,
        if read { "read" } else { "plan" },
        if order == BatchOrder::Storage {
            "&order=storage"
        } else {
            ""
        }
    );
    let ans: Answer = store
        .client
        .send(
            Call {
                method: Method::POST,
                path: &path,
                headers: &[],
                body: Bytes::from(body),
            },
            addr,
            map.epoch,
            READ_TIMEOUT,
        )
        .await?;
    if ans.status != 200 {
        return Err(match ans.status {
            409 => StoreError::Unavailable("the cluster map changed".into()),
            _ => ans.error().await,
        });
    }
    let crc = ans.headers.contains_key(BATCH_CRC_HEADER);
    let mut s = NodeStream::start(ans.body, crc).await?;
    s.left = items.len().saturating_sub(s.head.refused.len());
    Ok(s)
}

impl NodeStream {
    /// Reads the head of an answer `body` (whose parts are followed by CRCs if `crc`).
    pub(crate) async fn start(body: crate::wire::AnswerBody, crc: bool) -> StoreResult<Self> {
        let mut s = NodeStream {
            head: WireBatchHead::default(),
            crc,
            body,
            chunks: VecDeque::new(),
            len: 0,
            left: 0,
            sent: None,
            payload: None,
        };
        s.fill(4).await?;
        let n = u32::from_be_bytes(s.take(4)[..4].try_into().unwrap_or_default()) as usize;
        s.fill(n).await?;
        let head = s.take(n);
        s.check(&head).await?;
        s.head = serde_json::from_slice(&head)
            .map_err(|e| StoreError::internal("storage node batch answer", e))?;
        Ok(s)
    }

    /// Checks `got` (a part of the answer just taken) against the CRC32C after it, if the
    /// node sends them.
    async fn check(&mut self, got: &[u8]) -> StoreResult<()> {
        if !self.crc {
            return Ok(());
        }
        self.crc_after(body_crc32c(got)).await
    }

    /// Checks `got` (the CRC32C of what was just taken) against the four bytes that follow.
    async fn crc_after(&mut self, got: u32) -> StoreResult<()> {
        self.fill(4).await?;
        check_crc(&self.take(4), got)
    }

    /// Takes up to `n` bytes of an entry's payload (what is held, at most `n`; at least one
    /// byte is held when called).
    pub(crate) fn take_payload(&mut self, n: usize) -> Bytes {
        let b = self.take(n);
        if let Some(d) = self.payload.as_mut() {
            d.update(&b);
        }
        b
    }

    /// Checks the payload taken since the entry's header against the CRC32C after it.
    pub(crate) async fn end_payload(&mut self) -> StoreResult<()> {
        match self.payload.take() {
            Some(d) => self.crc_after(d.finalize() as u32).await,
            None => Ok(()),
        }
    }

    /// Receives until at least `n` bytes are held; a node silent for [`READ_TIMEOUT`] or an
    /// answer that ends first is a failure.
    pub(crate) async fn fill(&mut self, n: usize) -> StoreResult<()> {
        while self.len < n {
            let frame = tokio::time::timeout(READ_TIMEOUT, self.body.frame())
                .await
                .map_err(|_| {
                    StoreError::Unavailable("storage node: a batch answer stalled".into())
                })?;
            match frame {
                None => {
                    return Err(StoreError::Unavailable(
                        "storage node: a batch answer cut short".into(),
                    ));
                }
                Some(Err(e)) => {
                    return Err(StoreError::Unavailable(format!("storage node: {e}")));
                }
                Some(Ok(f)) => {
                    if let Ok(d) = f.into_data()
                        && !d.is_empty()
                    {
                        self.len += d.len();
                        self.chunks.push_back(d);
                    }
                }
            }
        }
        Ok(())
    }

    /// The next `n` held bytes: a slice of what was received when they lie in one piece of
    /// it, else gathered.
    fn take(&mut self, n: usize) -> Bytes {
        let n = n.min(self.len);
        self.len -= n;
        if let Some(front) = self.chunks.front_mut()
            && front.len() >= n
        {
            let b = front.split_to(n);
            if front.is_empty() {
                self.chunks.pop_front();
            }
            return b;
        }
        let mut out = BytesMut::with_capacity(n);
        while out.len() < n {
            let Some(front) = self.chunks.front_mut() else {
                break;
            };
            let k = (n - out.len()).min(front.len());
            out.extend_from_slice(&front.split_to(k));
            if front.is_empty() {
                self.chunks.pop_front();
            }
        }
        out.freeze()
    }

    /// The first `n` held bytes, left in place.
    fn peek(&self, n: usize) -> std::borrow::Cow<'_, [u8]> {
        match self.chunks.front() {
            Some(f) if f.len() >= n => std::borrow::Cow::Borrowed(&f[..n]),
            _ => {
                let mut v = Vec::with_capacity(n);
                for c in &self.chunks {
                    let k = (n - v.len()).min(c.len());
                    v.extend_from_slice(&c[..k]);
                    if v.len() == n {
                        break;
                    }
                }
                std::borrow::Cow::Owned(v)
            }
        }
    }

    /// The next record's header (an entry's payload is then taken by the caller).
    pub(crate) async fn next_record(&mut self) -> StoreResult<BatchRecord> {
        let mut need = 4;
        loop {
            self.fill(need).await?;
            let n = BatchRecord::head_len(&self.peek(need))?;
            if n <= need {
                break;
            }
            need = n;
        }
        let head = self.take(need);
        let rec = BatchRecord::parse(&head)?;
        if !matches!(rec, BatchRecord::End) {
            self.check(&head).await?;
            self.left = self.left.saturating_sub(1);
        }
        if matches!(rec, BatchRecord::Entry { .. }) && self.crc {
            self.payload = Some(crate::wire::crc32c_digest());
        }
        Ok(rec)
    }

    /// Reads the end record once every record came, so the connection can be used again;
    /// true if the answer is over.
    async fn finish_if_done(&mut self) -> StoreResult<bool> {
        if self.left > 0 {
            return Ok(false);
        }
        match self.next_record().await? {
            BatchRecord::End => Ok(true),
            _ => Err(StoreError::Unavailable(
                "storage node: a batch answer ran on".into(),
            )),
        }
    }
}

/// A request's answer while reading.
enum Stream {
    NotOpen,
    Open(Box<NodeStream>),
    /// It failed (or ended): its remaining items are looked up alone.
    Gone,
}

/// Whether a node's error for an item is the item's answer (else the item is looked up
/// alone: another replica may read it).
fn is_final(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::NoSuchKey
            | StoreError::NoSuchMember(_)
            | StoreError::RangeNotSatisfiable { .. }
            | StoreError::Invalid(_)
    )
}

/// What became of an item taken from a node's answer.
enum Took {
    /// Emitted (an entry or its error entry).
    Done,
    /// The sink stopped (the client went away, or an abort).
    Stopped,
    /// To be looked up alone.
    Alone,
}

struct Reader<'a> {
    store: &'a ClusterStore,
    plan: &'a Plan,
    streams: Vec<Stream>,
    sink: &'a mut dyn EntrySink,
}

pub(crate) async fn read_batch(store: &ClusterStore, plan: BatchPlan, sink: &mut dyn EntrySink) {
    let plan = match plan.plan.downcast::<NearPlan>() {
        Ok(near) => return near.store.read_batch(near.plan, sink).await,
        Err(p) => p,
    };
    let mut plan = match plan.downcast::<Plan>() {
        Ok(p) => *p,
        Err(_) => {
            sink.cut(&StoreError::internal("batch", "not a cluster plan"))
                .await;
            return;
        }
    };
    let streams = std::mem::take(&mut plan.streams);
    let mut rd = Reader {
        store,
        plan: &plan,
        streams,
        sink,
    };
    match plan.order {
        BatchOrder::Request => {
            for i in 0..plan.items.len() {
                if rd.sink.stopped() || !rd.item(i).await {
                    return;
                }
            }
        }
        BatchOrder::Storage => {
            // Each node's answer as it comes (in its disk order), then the items looked up
            // alone and those a node did not answer.
            let mut done = vec![false; plan.items.len()];
            for r in 0..plan.requests.len() {
                if !rd.drain(r, &mut done).await {
                    return;
                }
            }
            for (i, _) in done.iter().enumerate().filter(|(_, d)| !**d) {
                if rd.sink.stopped() || !rd.alone(i).await {
                    return;
                }
            }
        }
    }
    rd.sink.finish().await;
}

impl Reader<'_> {
    fn opened(&self, r: usize, s: StoreResult<NodeStream>) -> Stream {
        match s {
            Ok(s) => Stream::Open(Box::new(s)),
            Err(e) => {
                let node = &self.plan.requests[r].node;
                tracing::debug!(%node, error = %e, "batch read failed; items asked alone");
                Stream::Gone
            }
        }
    }

    /// Opens request `r` if it is not yet, with the items still planned through it (those a
    /// node refused at planning were looked up alone).
    async fn ensure_open(&mut self, r: usize) {
        if !matches!(self.streams[r], Stream::NotOpen) {
            return;
        }
        let (plan, req) = (self.plan, &self.plan.requests[r]);
        let sent: Vec<u32> = (0..req.item_of.len() as u32)
            .filter(|&at| {
                let i = req.item_of[at as usize];
                matches!(plan.items[i].via, Via::Node { req: q, .. } if q == r)
            })
            .collect();
        if sent.is_empty() {
            self.streams[r] = Stream::Gone;
            return;
        }
        let items: Vec<_> = sent
            .iter()
            .map(|&at| plan.items[req.item_of[at as usize]].wire())
            .collect();
        let s = open(
            self.store,
            &plan.bucket,
            &req.node,
            &items,
            plan.order,
            true,
        )
        .await
        .map(|mut s| {
            // Positions in what was sent, made positions in the request.
            let refused = s.head.refused.iter();
            s.head.refused = refused
                .filter_map(|&p| sent.get(p as usize).copied())
                .collect();
            s.sent = Some(sent);
            s
        });
        self.streams[r] = self.opened(r, s);
    }

    /// Emits item `i` (in the caller's order); false if the stream ended there.
    async fn item(&mut self, i: usize) -> bool {
        let (req, at) = match &self.plan.items[i].via {
            Via::Node { req, at } => (*req, *at),
            _ => return self.alone(i).await,
        };
        self.ensure_open(req).await;
        let refused = match &self.streams[req] {
            Stream::Open(s) => s.head.refused.binary_search(&at).is_ok(),
            _ => true,
        };
        if refused {
            return self.alone(i).await;
        }
        match self.take(req, Some(at)).await {
            (Took::Done, _) => true,
            (Took::Stopped, _) => false,
            (Took::Alone, _) => self.alone(i).await,
        }
    }

    /// Emits the records of request `r` as they come, marking their items done; false if
    /// the stream ended.
    async fn drain(&mut self, r: usize, done: &mut [bool]) -> bool {
        self.ensure_open(r).await;
        while let Stream::Open(_) = self.streams[r] {
            match self.take(r, None).await {
                (Took::Stopped, _) => return false,
                (Took::Done, Some(i)) => done[i] = true,
                _ => {}
            }
        }
        true
    }

    /// Drops request `r`'s answer after a failure: its remaining items are looked up alone.
    fn fail(&mut self, r: usize, e: &StoreError) {
        let node = &self.plan.requests[r].node;
        tracing::warn!(%node, error = %e, "a batch answer failed; the rest of its items asked alone");
        self.streams[r] = Stream::Gone;
    }

    /// Takes the next record of request `r` (which must be position `want`, if given) and
    /// emits its entry; answers what became of it and the item it was.
    async fn take(&mut self, r: usize, want: Option<u32>) -> (Took, Option<usize>) {
        let Stream::Open(s) = &mut self.streams[r] else {
            return (Took::Alone, None);
        };
        let rec = match s.next_record().await {
            Ok(rec) => rec,
            Err(e) => {
                self.fail(r, &e);
                return (Took::Alone, None);
            }
        };
        let (at, body) = match rec {
            BatchRecord::End => {
                self.streams[r] = Stream::Gone;
                return (Took::Alone, None);
            }
            BatchRecord::Error { at, error } => (at, Err(error.into_store_error())),
            BatchRecord::Entry {
                at,
                size,
                mtime_ms,
                etag,
            } => (at, Ok((size, mtime_ms, etag))),
        };
        let at = match &s.sent {
            Some(sent) => sent.get(at as usize).copied().unwrap_or(u32::MAX),
            None => at,
        };
        let item = self.plan.requests[r].item_of.get(at as usize).copied();
        let i = match item {
            Some(i)
                if matches!(self.plan.items[i].via, Via::Node { req, at: a } if req == r && a == at)
                    && want.is_none_or(|w| w == at) =>
            {
                i
            }
            _ => {
                let e = StoreError::Unavailable(format!("storage node: entry {at} out of order"));
                self.fail(r, &e);
                return (Took::Alone, None);
            }
        };
        let head = self.plan.items[i].head();
        let took = match body {
            Err(e) if is_final(&e) => {
                if error_entry(self.sink, head, &e).await {
                    Took::Done
                } else {
                    Took::Stopped
                }
            }
            Err(e) => {
                tracing::warn!(entry = %head.name, error = %e, "a node failed to read a batch entry; asked alone");
                Took::Alone
            }
            Ok((size, mtime_ms, etag)) if size <= GATHER_MAX => {
                let mut got = s.fill(size as usize).await;
                let payload = s.take_payload(size as usize);
                if got.is_ok() {
                    got = s.end_payload().await;
                }
                if let Err(e) = got {
                    self.fail(r, &e);
                    return (Took::Alone, Some(i));
                }
                self.sink.header(head, size, mtime_ms, &etag);
                self.sink.extend(&payload);
                self.sink.end_payload(size);
                if self.sink.frame_full() {
                    self.sink.flush().await;
                }
                Took::Done
            }
            Ok((size, mtime_ms, etag)) => {
                // Streamed through after its header: a failure half-way cuts the stream. The
                // last piece is held back until the payload's CRC has matched, so a damaged
                // payload never reaches the client whole.
                self.sink.header(head, size, mtime_ms, &etag);
                let mut left = size as usize;
                let mut held: Option<Bytes> = None;
                let mut got = Ok(());
                while left > 0 {
                    got = s.fill(1).await;
                    if got.is_err() {
                        break;
                    }
                    let n = left.min(s.chunks.front().map_or(0, Bytes::len));
                    left -= n;
                    let piece = s.take_payload(n);
                    if let Some(p) = held.replace(piece)
                        && !self.sink.send(p).await
                    {
                        return (Took::Stopped, Some(i));
                    }
                }
                if got.is_ok() {
                    got = s.end_payload().await;
                }
                if let Err(e) = got {
                    tracing::error!(entry = %head.name, error = %e, "batch read failed mid-entry");
                    self.sink.cut(&e).await;
                    return (Took::Stopped, Some(i));
                }
                if let Some(p) = held
                    && !self.sink.send(p).await
                {
                    return (Took::Stopped, Some(i));
                }
                self.sink.end_payload(size);
                Took::Done
            }
        };
        if let Stream::Open(s) = &mut self.streams[r] {
            match s.finish_if_done().await {
                Ok(true) => self.streams[r] = Stream::Gone,
                Ok(false) => {}
                Err(e) => self.fail(r, &e),
            }
        }
        (took, Some(i))
    }

    /// Emits item `i` from a lookup alone (made while planning, or now); false if the
    /// stream ended there.
    async fn alone(&mut self, i: usize) -> bool {
        let it = &self.plan.items[i];
        let now;
        let body = match &it.via {
            Via::Found(b) => b,
            _ => {
                now = look_up_now(self.store, &self.plan.bucket, it).await;
                &now
            }
        };
        let (obj, s, t) = match body {
            Err(e) => return error_entry(self.sink, it.head(), e).await,
            Ok((o, s, t)) => (o, *s, *t),
        };
        if t - s <= GATHER_MAX {
            match read_all(self.store, obj, s, t).await {
                Ok(pieces) => {
                    self.sink
                        .header(it.head(), t - s, obj.attrs.last_modified_ms, &obj.etag);
                    for p in pieces {
                        self.sink.extend(&p);
                    }
                    self.sink.end_payload(t - s);
                    if self.sink.frame_full() {
                        self.sink.flush().await;
                    }
                    return true;
                }
                Err(e) => return error_entry(self.sink, it.head(), &e).await,
            }
        }
        // A large payload streams after its header; a failure half-way cuts the stream.
        let mut reader = match self.store.read_object(obj, s, t) {
            Ok(r) => r,
            Err(e) => return error_entry(self.sink, it.head(), &e).await,
        };
        self.sink
            .header(it.head(), t - s, obj.attrs.last_modified_ms, &obj.etag);
        loop {
            match reader.next().await {
                Ok(Some(d)) => {
                    if !self.sink.send(d).await {
                        return false;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(entry = %it.name, error = %e, "batch read failed mid-entry");
                    self.sink.cut(&e).await;
                    return false;
                }
            }
        }
        self.sink.end_payload(t - s);
        true
    }
}

/// An item's object range, looked up alone as a GET would (an item a node did not
/// answer).
async fn look_up_now(
    store: &ClusterStore,
    bucket: &Bucket,
    it: &Item,
) -> Result<(ObjectInfo, u64, u64), StoreError> {
    let obj = store.lookup(bucket, &it.key, INLINE_MAX).await;
    let at = match (&it.member, &obj) {
        (Some(m), Ok(Some(o))) if !sealed::is_sealed(&o.attrs.headers) => store
            .tar_members(bucket, &it.key, o, std::slice::from_ref(m))
            .await?
            .pop()
            .flatten(),
        _ => None,
    };
    resolve(it, obj, |_, _| at)
}

/// The whole of a range (a payload of an item looked up alone).
async fn read_all(
    store: &ClusterStore,
    obj: &ObjectInfo,
    s: u64,
    e: u64,
) -> StoreResult<Vec<Bytes>> {
    let mut r = store.read_object(obj, s, e)?;
    let mut out = Vec::new();
    while let Some(p) = r.next().await? {
        out.push(p);
    }
    Ok(out)
}

/// Emits an error entry (and the frame, once full); false if the stream ended there.
async fn error_entry(sink: &mut dyn EntrySink, head: EntryHead<'_>, err: &StoreError) -> bool {
    if !sink.error(head, err).await {
        return false;
    }
    if sink.frame_full() {
        sink.flush().await;
    }
    true
}

/// Every key under `prefix`, in key order, for an epoch stream: the merged listing, a page at
/// a time.
pub(crate) async fn stream_keys(
    store: &ClusterStore,
    bucket: &Bucket,
    prefix: &str,
) -> StoreResult<packrat_store_api::stream::KeyList> {
    let mut keys = packrat_store_api::stream::KeyList::default();
    let mut query = packrat_store_api::ListQuery {
        prefix: prefix.to_string(),
        delimiter: None,
        after: None,
        max_keys: 1000,
    };
    loop {
        let page = store.list_objects(bucket, &query).await?;
        for o in &page.objects {
            keys.push(&o.key);
        }
        if !page.truncated || page.last.is_none() {
            return Ok(keys);
        }
        query.after = page.last;
    }
}
