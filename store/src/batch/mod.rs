//! Batch reads and writes of one node: the plans behind batch GET (epoch streams are read as
//! batches too), their reads, TAR member indexes, and batch PUT's writer. The S3 layer formats
//! the output (an [`EntrySink`]); everything here is storage: which records, where they lie,
//! how they are read and verified.
//!
//! Reads are planned in windows, emitted in the order asked. Small entries that are whole
//! records (the usual sample) are read straight into their place in the sink's frame: the
//! frame's headers are written first, then one vectored read per run of neighbouring records
//! scatters the payloads into place, and each is checksum-verified there. Other entries that
//! lie inside one record are read through spans (neighbouring records merged into one
//! positioned read into a window buffer, each record then verified; large payloads go out as
//! slices of that buffer). Entries spanning records stream chunk by chunk. Memory per request
//! is bounded by the window and the frames, whatever the number of items or bytes in the batch.

mod emit;
mod members;
mod writer;

pub(crate) use writer::LocalBatchWriter;

use emit::{Emitter, Entry, Piece};
use members::tar_index;

use crate::engine::{Engine, blocking};
use packrat_index::ObjectRecord;
use packrat_store_api::batch::{BatchItem, BatchOrder, BatchPlan, EntrySink, resolve_item_range};
use packrat_store_api::{StoreError, StoreResult, sealed};
use std::collections::HashMap;
use std::sync::Arc;

/// Entries read and emitted together: at most this many...
const WINDOW_ITEMS_MAX: usize = 1024;
/// ...and at most this many bytes of span-read entries.
const WINDOW_BYTES_MAX: u64 = 8 * 1024 * 1024;
/// Records at most this far apart are read in one span (the gap is read and discarded).
const SPAN_GAP_BYTES_MAX: u64 = 64 * 1024;
/// Largest single span read.
const SPAN_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// Payloads at least this large go to the connection as slices of the read buffer; smaller
/// ones are copied into frames (fewer, larger writes).
const ZERO_COPY_BYTES_MIN: u64 = 32 * 1024;
/// Keys looked up at a time by a batch GET (a cached block costs the worker ~0.2 ms).
const LOOKUP_BLOCK: usize = 1024;

/// Entries per window: up to [`WINDOW_ITEMS_MAX`] entries and [`WINDOW_BYTES_MAX`] bytes of
/// span-read data (a multi-record entry streams and does not count).
fn windows(entries: &[Entry]) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut bytes = 0u64;
    for (i, e) in entries.iter().enumerate() {
        let b = match &e.body {
            Ok(p) if p.single_chunk().is_some() => p.end - p.start,
            _ => 0,
        };
        if i > start && (i - start >= WINDOW_ITEMS_MAX || bytes + b > WINDOW_BYTES_MAX) {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += b;
    }
    if start < entries.len() {
        out.push(start..entries.len());
    }
    out
}

/// Plans a batch GET (see `ObjectStore::plan_batch`).
pub(crate) async fn plan_batch(
    engine: &Arc<Engine>,
    bucket_id: u64,
    items: Vec<BatchItem>,
    order: BatchOrder,
) -> StoreResult<BatchPlan> {
    // The records, a block of keys at a time: from the record cache on this task (the records
    // are then in this core's caches for what follows); the keys it does not hold in one
    // batched multi-get on a blocking thread.
    let mut objects: Vec<Option<Arc<ObjectRecord>>> = Vec::with_capacity(items.len());
    for block in items.chunks(LOOKUP_BLOCK) {
        let refs: Vec<&str> = block.iter().map(|i| i.key.as_str()).collect();
        let mut found = engine.index.cached_objects(bucket_id, &refs);
        let missing: Vec<usize> = (0..found.len()).filter(|&i| found[i].is_none()).collect();
        if !missing.is_empty() {
            let engine = engine.clone();
            let keys: Vec<String> = missing.iter().map(|&i| block[i].key.clone()).collect();
            let read = blocking(move || {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                Ok(engine.index.multi_get_objects(bucket_id, &refs)?)
            })
            .await?;
            for (i, rec) in missing.into_iter().zip(read) {
                found[i] = rec;
            }
        }
        objects.extend(found);
        if items.len() > LOOKUP_BLOCK {
            // Let the worker's other tasks run between blocks of a large batch.
            tokio::task::yield_now().await;
        }
    }
    // Member indexes of the TAR objects that items name members of.
    let mut tar_ids: HashMap<String, [u8; 16]> = HashMap::new();
    for (it, obj) in items.iter().zip(&objects) {
        if let (Some(_), Some(obj)) = (&it.member, obj)
            && !tar_ids.contains_key(&it.key)
            && !sealed::is_sealed(&obj.headers)
        {
            let id = tar_index(engine, &it.key, obj).await?;
            tar_ids.insert(it.key.clone(), id);
        }
    }
    let mut entries = Vec::with_capacity(items.len());
    let mut total = 0u64;
    // Each record's lines are asked for 16 items ahead and what it points to 8 ahead, so the
    // cache misses of a batch of random keys overlap (see `ObjectRecord::prefetch`).
    for (i, it) in items.into_iter().enumerate() {
        if let Some(Some(o)) = objects.get(i + 16) {
            ObjectRecord::prefetch(o);
        }
        if let Some(Some(o)) = objects.get(i + 8) {
            o.prefetch_heap();
        }
        let obj = objects[i].take();
        let BatchItem {
            key,
            member,
            range,
            tag,
        } = it;
        // An entry is named by its key, or `key/member` for a TAR member.
        let (name, member) = match member {
            None => (key, None),
            Some(m) => {
                let id = tar_ids.get(&key).copied();
                (format!("{key}/{m}"), Some((id, m)))
            }
        };
        let mut entry = Entry {
            name,
            tag,
            body: Err(StoreError::NoSuchKey),
        };
        let Some(obj) = obj else {
            entries.push(entry);
            continue;
        };
        if sealed::is_sealed(&obj.headers) {
            // Its bytes are ciphertext that only a GET with its key decrypts.
            entry.body = Err(StoreError::Invalid(
                "the object is stored with server-side encryption: read it with GetObject".into(),
            ));
            entries.push(entry);
            continue;
        }
        let (base, len) = match member {
            None => (0, obj.size),
            Some((id, m)) => {
                // Every existing object named with a member was indexed above.
                let id = id.ok_or_else(|| StoreError::internal("batch", "a TAR not indexed"))?;
                let engine = engine.clone();
                let m2 = m.clone();
                match blocking(move || Ok(engine.index.get_member(&id, &m2)?)).await? {
                    Some(mr) => (mr.offset, mr.size),
                    None => {
                        entry.body = Err(StoreError::NoSuchMember(m));
                        entries.push(entry);
                        continue;
                    }
                }
            }
        };
        let (start, end) = match range {
            None => (0, len),
            Some(r) => match resolve_item_range(r, len) {
                Some(x) => x,
                None => {
                    entry.body = Err(StoreError::RangeNotSatisfiable { size: len });
                    entries.push(entry);
                    continue;
                }
            },
        };
        total += end - start;
        entry.body = Ok(Piece::new(obj, base + start, base + end));
        entries.push(entry);
    }
    if order == BatchOrder::Storage {
        // Errors first (they cost nothing), then in disk order.
        entries.sort_by_cached_key(|e| match &e.body {
            Err(_) => (0, 0, 0),
            Ok(p) => match p.first_chunk() {
                Some((c, _)) => {
                    let l = p.location(c);
                    (1, l.segment_id, l.offset)
                }
                None => (0, 0, 1),
            },
        });
    }
    Ok(BatchPlan {
        entries: entries.len(),
        bytes: total,
        plan: Box::new(entries),
    })
}

/// Reads a plan made by [`plan_batch`] (see `ObjectStore::read_batch`).
pub(crate) async fn read_batch(engine: &Arc<Engine>, plan: BatchPlan, sink: &mut dyn EntrySink) {
    let Ok(entries) = plan.plan.downcast::<Vec<Entry>>() else {
        let err = StoreError::internal("batch", "a plan made by another store");
        sink.cut(&err).await;
        return;
    };
    let mut em = Emitter {
        engine: engine.clone(),
        sink,
        window_buf: Vec::new(),
    };
    for w in windows(&entries) {
        em.window(&entries[w]).await;
        if em.sink.stopped() {
            return;
        }
    }
    em.sink.finish().await;
}

/// Where members of the TAR object `obj` (key `key`) lie in it: (offset, size) per name, `None`
/// for a name it lacks (see `ObjectStore::tar_members`).
pub(crate) async fn tar_members(
    engine: &Arc<Engine>,
    key: &str,
    obj: &Arc<ObjectRecord>,
    names: &[String],
) -> StoreResult<Vec<Option<(u64, u64)>>> {
    if sealed::is_sealed(&obj.headers) {
        return Err(StoreError::Invalid(
            "the object is stored with server-side encryption: read it with GetObject".into(),
        ));
    }
    let id = tar_index(engine, key, obj).await?;
    let engine = engine.clone();
    let names = names.to_vec();
    let found = blocking(move || {
        names
            .iter()
            .map(|m| Ok(engine.index.get_member(&id, m)?.map(|r| (r.offset, r.size))))
            .collect()
    })
    .await?;
    Ok(found)
}
