//! Batch GET and epoch streams through a cluster gateway: the items looked up on committed
//! replicas of their PGs, the entries emitted in the order planned.
//!
//! The items are grouped by the reader chosen for their PG (the caught-up members in turn, as
//! for a GET), and each group of up to [`KEYS_PER_LOOKUP`] keys is one request to its node
//! ([`NODE_LOOKUPS`] in flight), which answers every key's metadata and, for an object up to
//! [`INLINE_MAX`], its bytes (until the plan holds [`PLAN_INLINE_BYTES_MAX`] of them). A key
//! the node may not answer for (its copy is dirty: a write is on its way down the chain, and
//! only the tail's copy is committed), and every key of a request that failed (a node
//! unreachable, a map changed), is then looked up alone, the way a GET is ([`LOOKUPS`] at a
//! time), which follows the chain to the tail and the map through a failover.
//!
//! The payloads of the next [`READ_AHEAD`] entries are read while the current one is sent
//! (the inlined ones are already here). An object larger than [`PREFETCH_MAX`] is streamed
//! when its turn comes, so memory stays bounded whatever the batch. A TAR member is a range
//! of its archive: where it lies is asked of a node that has the archive's version (it builds
//! and keeps the member index, as one server does), once per archive and batch.

use crate::placement::pg_of;
use crate::store::{ClusterStore, INLINE_MAX};
use crate::wire::LOOKUP_KEYS_MAX;
use bytes::Bytes;
use futures_util::StreamExt;
use packrat_store_api::batch::resolve_item_range;
use packrat_store_api::batch::{BatchItem, BatchOrder, BatchPlan, EntryHead, EntrySink};
use packrat_store_api::{Bucket, ObjectInfo, ObjectStore, StoreError, StoreResult, sealed};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Keys of one request to a node.
const KEYS_PER_LOOKUP: usize = 128;
const _: () = assert!(KEYS_PER_LOOKUP <= LOOKUP_KEYS_MAX);
/// Requests to nodes in flight at once while planning.
const NODE_LOOKUPS: usize = 4;
/// Keys looked up alone in flight at once.
const LOOKUPS: usize = 64;
/// Entries whose payloads are read ahead of the one being sent.
const READ_AHEAD: usize = 32;
/// Payloads up to this size are read ahead whole; larger ones stream in their turn.
const PREFETCH_MAX: u64 = 1024 * 1024;
/// Bytes of small objects a plan holds (they come with their lookups); past it, lookups ask
/// for metadata only and the bytes are read in their turn. A batch may name 100,000 objects:
/// without the bound, one request could hold gigabytes in the gateway.
const PLAN_INLINE_BYTES_MAX: u64 = 64 * 1024 * 1024;

/// One planned entry: its name, the caller's label, and the object range to send (or why
/// not).
struct Entry {
    name: String,
    tag: Option<String>,
    body: Result<(ObjectInfo, u64, u64), StoreError>,
}

impl Entry {
    fn head(&self) -> EntryHead<'_> {
        EntryHead {
            name: &self.name,
            tag: self.tag.as_deref(),
        }
    }
}

pub(crate) async fn plan_batch(
    store: &ClusterStore,
    bucket: &Bucket,
    items: Vec<BatchItem>,
    order: BatchOrder,
) -> StoreResult<BatchPlan> {
    let keys: Vec<String> = items.iter().map(|it| it.key.clone()).collect();
    let found = look_up(store, bucket, &keys).await;
    let members = locate_members(store, bucket, &items, &found).await?;
    let mut bytes = 0u64;
    let mut entries: Vec<Entry> = Vec::with_capacity(items.len());
    for (it, obj) in items.into_iter().zip(found) {
        // An entry is named by its key, or `key/member` for a TAR member, as on one server.
        let name = match &it.member {
            None => it.key.clone(),
            Some(m) => format!("{}/{m}", it.key),
        };
        let body = match obj {
            Err(e) => Err(e),
            Ok(None) => Err(StoreError::NoSuchKey),
            Ok(Some(o)) if sealed::is_sealed(&o.attrs.headers) => Err(StoreError::Invalid(
                "the object is stored with server-side encryption: read it with GetObject".into(),
            )),
            Ok(Some(o)) => {
                let at = match &it.member {
                    None => Ok((0, o.size)),
                    Some(m) => match members.get(&(it.key.clone(), m.clone())) {
                        Some(Some(at)) => Ok(*at),
                        _ => Err(StoreError::NoSuchMember(m.clone())),
                    },
                };
                at.and_then(|(base, len)| {
                    let (s, e) = match it.range {
                        None => (0, len),
                        Some(r) => resolve_item_range(r, len)
                            .ok_or(StoreError::RangeNotSatisfiable { size: len })?,
                    };
                    bytes += e - s;
                    Ok((o, base + s, base + e))
                })
            }
        };
        entries.push(Entry {
            name,
            tag: it.tag,
            body,
        });
    }
    if order == BatchOrder::Storage {
        // No disk order to follow from here: errors first (they cost nothing), then as asked.
        entries.sort_by_key(|e| e.body.is_ok());
    }
    Ok(BatchPlan {
        entries: entries.len(),
        bytes,
        plan: Box::new(entries),
    })
}

/// Where the TAR members the items name lie in their archives: one request per archive to a
/// node that has its version (which indexes it once), [`NODE_LOOKUPS`] at a time. An archive
/// that is not a TAR fails the whole plan, as on one server.
async fn locate_members(
    store: &ClusterStore,
    bucket: &Bucket,
    items: &[BatchItem],
    found: &[StoreResult<Option<ObjectInfo>>],
) -> StoreResult<HashMap<(String, String), Option<(u64, u64)>>> {
    let mut wanted: HashMap<String, (ObjectInfo, Vec<String>)> = HashMap::new();
    for (it, obj) in items.iter().zip(found) {
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
    let mut answers = futures_util::stream::iter(asked).buffer_unordered(NODE_LOOKUPS);
    while let Some(answer) = answers.next().await {
        out.extend(answer?);
    }
    Ok(out)
}

/// Every key's object (or none, or why not), in the order of `keys`: by node, then alone (see
/// the module's comment).
async fn look_up(
    store: &ClusterStore,
    bucket: &Bucket,
    keys: &[String],
) -> Vec<StoreResult<Option<ObjectInfo>>> {
    let held = &AtomicU64::new(0);
    // Decided as a request starts: the bound is passed by at most what the requests in flight
    // bring (NODE_LOOKUPS x KEYS_PER_LOOKUP x INLINE_MAX, or LOOKUPS x INLINE_MAX).
    let inline_now = || {
        if held.load(Ordering::Relaxed) < PLAN_INLINE_BYTES_MAX {
            INLINE_MAX
        } else {
            0
        }
    };
    let count = |found: &StoreResult<Option<ObjectInfo>>, inline: u64| {
        if let Ok(Some(o)) = found
            && inline > 0
            && o.size <= inline
        {
            held.fetch_add(o.size, Ordering::Relaxed);
        }
    };
    let map = &store.map();
    // Each key's index and PG, by the node asked.
    let mut by_node: HashMap<String, Vec<(usize, u32)>> = HashMap::new();
    for (i, k) in keys.iter().enumerate() {
        let pg = pg_of(bucket.id, k, map.pgs);
        // A PG with no reader now is left to the lookups alone, which wait for a failover.
        if let Some(node) = store.pick_reader(map, pg) {
            by_node.entry(node).or_default().push((i, pg));
        }
    }
    let groups: Vec<(String, Vec<(usize, u32)>)> = by_node
        .into_iter()
        .flat_map(|(node, idx)| {
            idx.chunks(KEYS_PER_LOOKUP)
                .map(|c| (node.clone(), c.to_vec()))
                .collect::<Vec<_>>()
        })
        .collect();
    let mut found: Vec<Option<StoreResult<Option<ObjectInfo>>>> =
        (0..keys.len()).map(|_| None).collect();
    let answers: Vec<_> = futures_util::stream::iter(groups)
        .map(|(node, idx)| async move {
            let inline = inline_now();
            let asked: Vec<(u32, &str)> =
                idx.iter().map(|&(i, pg)| (pg, keys[i].as_str())).collect();
            let answer = store.lookup_on(map, &node, bucket, &asked, inline).await;
            match &answer {
                Ok(each) => each.iter().flatten().for_each(|f| count(f, inline)),
                Err(e) => {
                    tracing::debug!(%node, error = %e, "batch lookup failed; keys asked alone")
                }
            }
            (idx, answer)
        })
        .buffer_unordered(NODE_LOOKUPS)
        .collect()
        .await;
    for (idx, answer) in answers {
        if let Ok(each) = answer {
            for ((i, _), f) in idx.into_iter().zip(each) {
                found[i] = f;
            }
        }
    }
    let alone: Vec<usize> = (0..keys.len()).filter(|&i| found[i].is_none()).collect();
    let singles: Vec<_> = futures_util::stream::iter(alone)
        .map(|i| async move {
            let inline = inline_now();
            let f = store.lookup(bucket, &keys[i], inline).await;
            count(&f, inline);
            (i, f)
        })
        .buffer_unordered(LOOKUPS)
        .collect()
        .await;
    for (i, f) in singles {
        found[i] = Some(f);
    }
    found
        .into_iter()
        .map(|f| f.unwrap_or_else(|| Err(StoreError::internal("batch", "a key not looked up"))))
        .collect()
}

/// The whole of a range (a payload read ahead).
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

pub(crate) async fn read_batch(store: &ClusterStore, plan: BatchPlan, sink: &mut dyn EntrySink) {
    let entries = match plan.plan.downcast::<Vec<Entry>>() {
        Ok(e) => *e,
        Err(_) => {
            sink.cut(&StoreError::internal("batch", "not a cluster plan"))
                .await;
            return;
        }
    };
    let reads = futures_util::stream::iter(entries.into_iter().map(|e| async move {
        let ahead = match &e.body {
            Ok((o, s, t)) if t - s <= PREFETCH_MAX => Some(read_all(store, o, *s, *t).await),
            _ => None,
        };
        (e, ahead)
    }))
    .buffered(READ_AHEAD);
    futures_util::pin_mut!(reads);
    while let Some((e, ahead)) = reads.next().await {
        if sink.stopped() {
            return;
        }
        let (obj, s, t) = match (&e.body, ahead) {
            (Err(err), _) => {
                if !error_entry(sink, e.head(), err).await {
                    return;
                }
                continue;
            }
            (Ok(_), Some(Err(err))) => {
                if !error_entry(sink, e.head(), &err).await {
                    return;
                }
                continue;
            }
            (Ok((obj, s, t)), Some(Ok(pieces))) => {
                sink.header(e.head(), t - s, obj.attrs.last_modified_ms, &obj.etag);
                for p in pieces {
                    sink.extend(&p);
                }
                sink.end_payload(t - s);
                if sink.frame_full() {
                    sink.flush().await;
                }
                continue;
            }
            (Ok((obj, s, t)), None) => (obj, *s, *t),
        };
        // A large payload streams after its header; a failure half-way cuts the stream.
        let mut reader = match store.read_object(obj, s, t) {
            Ok(r) => r,
            Err(err) => {
                if !error_entry(sink, e.head(), &err).await {
                    return;
                }
                continue;
            }
        };
        sink.header(e.head(), t - s, obj.attrs.last_modified_ms, &obj.etag);
        loop {
            match reader.next().await {
                Ok(Some(d)) => {
                    if !sink.send(d).await {
                        return;
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    tracing::error!(entry = %e.name, error = %err, "batch read failed mid-entry");
                    sink.cut(&err).await;
                    return;
                }
            }
        }
        sink.end_payload(t - s);
    }
    sink.finish().await;
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
