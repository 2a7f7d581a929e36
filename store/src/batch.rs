//! Batch reads and writes of one node: the plans behind batch GET and epoch streams, their
//! reads, TAR member indexes, and batch PUT's writer. The S3 layer formats the output (an
//! [`EntrySink`]); everything here is storage: which records, where they lie, how they are
//! read and verified.
//!
//! Reads are planned in windows, emitted in the order asked. Small entries that are whole
//! records (the usual sample) are read straight into their place in the sink's frame: the
//! frame's headers are written first, then one vectored read per run of neighbouring records
//! scatters the payloads into place, and each is checksum-verified there. Other entries that
//! lie inside one record are read through spans (neighbouring records merged into one
//! positioned read into a window buffer, each record then verified; large payloads go out as
//! slices of that buffer). Entries spanning records stream chunk by chunk. Memory per request
//! is bounded by the window and the frames, whatever the number of items or bytes in the batch.

use crate::engine::{Engine, ObjectReader, RecordWriter, WritePin, blocking};
use crate::error::EngineError;
use bytes::Bytes;
use packrat_chunk_store::{RecordLocation, RecordRead, Span, WriteTicket};
use packrat_index::{MemberRecord, ObjectRecord, TarIndexRecord};
use packrat_store_api::batch::{
    BatchItem, BatchOrder, BatchPlan, BatchWriter, EntryHead, EntrySink, StreamQuery, key_hash,
    resolve_item_range, shuffle,
};
use packrat_store_api::{StoreError, StoreResult};
use packrat_tar::{TarError, TarEvent, TarParser};
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
/// Keys listed at a time by an epoch stream.
const STREAM_PAGE_KEYS: usize = 1000;

/// What one entry carries: bytes `[start, end)` of an object, or why it cannot.
struct Entry {
    name: String,
    tag: Option<String>,
    body: Result<Piece, StoreError>,
}

impl Entry {
    fn head(&self) -> EntryHead<'_> {
        EntryHead {
            name: &self.name,
            tag: self.tag.as_deref(),
        }
    }
}

struct Piece {
    obj: Arc<ObjectRecord>,
    start: u64,
    end: u64,
    /// Set if the piece lies inside a single chunk (then it is span-read, or read in place).
    /// Worked out once, when the piece is made: the batch's later passes (windows, planning,
    /// reading) then do not go back to the record's chunk list, which by then has left the
    /// CPU caches (a batch of random keys misses them on nearly every record).
    single: Option<Single>,
}

#[derive(Clone, Copy)]
struct Single {
    /// The chunk's position in the object's chunk list, and its first byte in the object.
    chunk: usize,
    chunk_start: u64,
    loc: RecordLocation,
    /// The identity written into the chunk's record (record id, chunk index).
    identity: ([u8; 16], u32),
    /// What the entry's header carries, copied for the same reason.
    mtime_ms: i64,
    etag: InlineEtag,
}

/// An ETag short enough to keep inline (all of packrat's: 32 hex digits, plus `-N` for a
/// multipart object); longer ones are read from the record.
#[derive(Clone, Copy)]
struct InlineEtag {
    len: u8,
    bytes: [u8; 47],
}

impl InlineEtag {
    fn new(etag: &str) -> Self {
        let mut bytes = [0u8; 47];
        match bytes.get_mut(..etag.len()) {
            Some(b) => {
                b.copy_from_slice(etag.as_bytes());
                Self {
                    len: etag.len() as u8,
                    bytes,
                }
            }
            None => Self {
                len: u8::MAX,
                bytes,
            },
        }
    }

    fn get(&self) -> Option<&str> {
        let b = self.bytes.get(..usize::from(self.len))?;
        // Copied from a `str` whole, so always valid.
        std::str::from_utf8(b).ok()
    }
}

impl Piece {
    fn new(obj: Arc<ObjectRecord>, start: u64, end: u64) -> Self {
        let mut p = Piece {
            obj,
            start,
            end,
            single: None,
        };
        p.single = p.first_chunk().and_then(|(chunk, chunk_start)| {
            let c = p.obj.chunks[chunk];
            (end <= chunk_start + u64::from(c.len)).then(|| Single {
                chunk,
                chunk_start,
                loc: RecordLocation {
                    segment_id: c.segment_id,
                    offset: c.offset,
                    len: c.len,
                },
                identity: p.obj.chunk_identity(chunk),
                mtime_ms: p.obj.last_modified_ms,
                etag: InlineEtag::new(&p.obj.etag),
            })
        });
        p
    }

    /// The chunk holding byte `start`, and that chunk's first byte in the object.
    fn first_chunk(&self) -> Option<(usize, u64)> {
        if let Some(s) = &self.single {
            return Some((s.chunk, s.chunk_start));
        }
        let mut at = 0u64;
        for (i, c) in self.obj.chunks.iter().enumerate() {
            let next = at + u64::from(c.len);
            if self.start < next {
                return Some((i, at));
            }
            at = next;
        }
        None
    }

    /// `(chunk, chunk start)` if the piece lies inside a single chunk (then it is span-read).
    fn single_chunk(&self) -> Option<(usize, u64)> {
        self.single.map(|s| (s.chunk, s.chunk_start))
    }

    fn location(&self, chunk: usize) -> RecordLocation {
        if let Some(s) = &self.single
            && s.chunk == chunk
        {
            return s.loc;
        }
        let c = self.obj.chunks[chunk];
        RecordLocation {
            segment_id: c.segment_id,
            offset: c.offset,
            len: c.len,
        }
    }

    fn chunk_identity(&self, chunk: usize) -> ([u8; 16], u32) {
        match &self.single {
            Some(s) if s.chunk == chunk => s.identity,
            _ => self.obj.chunk_identity(chunk),
        }
    }
}

/// The chunk of an entry that is one whole small record on local disk (not a range of it,
/// not on a tier): such a payload is read straight into its place in the output frame. Small
/// means below [`ZERO_COPY_BYTES_MIN`]: larger payloads go out as slices of the span buffer,
/// never copied into frames, so they gain nothing here.
fn whole_record(e: &Entry) -> Option<usize> {
    let p = e.body.as_ref().ok()?;
    let s = p.single?;
    let len = u64::from(s.loc.len);
    let whole = p.start == s.chunk_start && p.end == s.chunk_start + len;
    let small = len > 0 && len < ZERO_COPY_BYTES_MIN;
    (whole && small && !crate::tier::is_tier_segment(s.loc.segment_id)).then_some(s.chunk)
}

/// A batch's reading side: the engine, the sink entries go to, and the window buffer that span
/// reads land in, reused window after window (buffers freed on other threads are slow to
/// return to the system).
struct Emitter<'a> {
    engine: Arc<Engine>,
    sink: &'a mut dyn EntrySink,
    window_buf: Vec<u8>,
}

impl Emitter<'_> {
    async fn maybe_flush(&mut self) {
        if self.sink.frame_full() {
            self.sink.flush().await;
        }
    }

    /// Emits an error entry; false if the stream ended there.
    async fn error(&mut self, e: &Entry, err: &StoreError) -> bool {
        let go_on = self.sink.error(e.head(), err).await;
        if go_on {
            self.maybe_flush().await;
        }
        go_on
    }

    /// Reads and emits one window of entries in the given order: runs of whole records through
    /// [`Self::scattered`], everything else through [`Self::spans`].
    async fn window(&mut self, window: Vec<Entry>) {
        let mut whole: Vec<(Entry, usize)> = Vec::new();
        let mut other: Vec<Entry> = Vec::new();
        for e in window {
            if self.sink.stopped() {
                return;
            }
            match whole_record(&e) {
                Some(c) => {
                    if !other.is_empty() {
                        self.spans(std::mem::take(&mut other)).await;
                    }
                    whole.push((e, c));
                }
                None => {
                    if !whole.is_empty() {
                        self.scattered(std::mem::take(&mut whole)).await;
                    }
                    other.push(e);
                }
            }
        }
        if !whole.is_empty() {
            self.scattered(whole).await;
        }
        if !other.is_empty() {
            self.spans(other).await;
        }
    }

    /// Emits entries that are whole records (entry, its chunk) a frame at a time: the frame
    /// is laid out first (headers written, each payload's place reserved), then every record
    /// is read straight into its place, neighbours on disk sharing one vectored read, and
    /// verified. One copy out of the page cache, none between buffers. A frame not wholly in
    /// the page cache is read with all its records in flight at once. If any record fails,
    /// the frame is laid out again through [`Self::spans`], which reports the failure as an
    /// error entry.
    async fn scattered(&mut self, entries: Vec<(Entry, usize)>) {
        let engine = self.engine.clone();
        let mut entries = entries.into_iter();
        loop {
            let base = self.sink.frame_len();
            let mut group = Vec::new();
            let mut chunks = Vec::new();
            let mut reads = Vec::new();
            while group.is_empty() || !self.sink.frame_full() {
                let Some((e, c)) = entries.next() else { break };
                let Ok(p) = &e.body else {
                    unreachable!("whole_record only admits entries with a body")
                };
                let size = p.end - p.start;
                let (mtime_ms, etag) = match &p.single {
                    Some(s) => (s.mtime_ms, s.etag.get().unwrap_or(&p.obj.etag)),
                    None => (p.obj.last_modified_ms, p.obj.etag.as_str()),
                };
                self.sink.header(e.head(), size, mtime_ms, etag);
                let dst = self.sink.reserve(size);
                let (object_id, chunk_index) = p.chunk_identity(c);
                reads.push(RecordRead {
                    loc: p.location(c),
                    object_id,
                    chunk_index,
                    dst,
                });
                group.push(e);
                chunks.push(c);
            }
            if group.is_empty() {
                return;
            }
            // Hot records are copied out of mappings of their segments (no syscall per
            // record; the first that had to wait for the disk pauses mapped reads for a
            // while). Otherwise from the page cache on this thread when every record is there
            // (a preadv2 that never waits). Otherwise every record of the frame is read at
            // once through the engine's read path (io_uring, or the blocking pool), so a frame
            // of cold samples waits for about one disk read rather than one per sample, then
            // copied into its place.
            let frame = self.sink.frame_mut();
            let in_place = engine
                .chunks
                .read_mapped_records_into(&reads, &mut frame[..]);
            if !in_place
                && !engine
                    .chunks
                    .read_cached_records_into(&reads, &mut frame[..])
            {
                let fetched =
                    futures_util::future::join_all(group.iter().zip(&chunks).map(|(e, c)| {
                        let engine = &engine;
                        async move {
                            match &e.body {
                                Ok(p) => engine.read_chunk(&p.obj, *c).await,
                                Err(_) => {
                                    Err(EngineError::internal("batch", "an entry without a body"))
                                }
                            }
                        }
                    }))
                    .await;
                if fetched.iter().all(Result::is_ok) {
                    let frame = self.sink.frame_mut();
                    for (r, data) in reads.iter().zip(fetched.into_iter().flatten()) {
                        frame[r.dst..r.dst + data.len()].copy_from_slice(&data);
                    }
                } else {
                    self.sink.truncate(base);
                    self.spans(group).await;
                }
            }
            self.maybe_flush().await;
            if self.sink.stopped() {
                return;
            }
        }
    }

    /// Reads and emits entries in the given order: every entry that lies inside one record is
    /// read through spans (merged neighbouring reads into one buffer, then each record
    /// verified and copied out); larger entries stream chunk by chunk.
    async fn spans(&mut self, window: Vec<Entry>) {
        let engine = self.engine.clone();
        // Plan the span reads of every entry that lies inside one record: (entry, chunk,
        // chunk's first byte in the object) and where that record is.
        let mut planned: Vec<(usize, usize, u64)> = Vec::new();
        let mut wanted: Vec<(usize, RecordLocation)> = Vec::new();
        for (i, e) in window.iter().enumerate() {
            if let Ok(p) = &e.body
                && p.end > p.start
                && let Some((c, chunk_start)) = p.single_chunk()
            {
                planned.push((i, c, chunk_start));
                wanted.push((i, p.location(c)));
            }
        }
        let (buf, spans, span_of) = if wanted.is_empty() {
            (std::mem::take(&mut self.window_buf), Vec::new(), Vec::new())
        } else {
            let e2 = engine.clone();
            let buf = std::mem::take(&mut self.window_buf);
            match blocking(move || Ok(read_spans(&e2, &wanted, buf))).await {
                Ok(v) => v,
                Err(e) => {
                    self.sink.cut(&e.0).await;
                    return;
                }
            }
        };
        // Shared, so large payloads can go to the connection as slices of it (no copy).
        let buf = Bytes::from(buf);
        // entry index -> (span index, chunk, chunk start)
        let mut span_read: Vec<Option<(usize, usize, u64)>> = vec![None; window.len()];
        for ((i, c, chunk_start), n) in planned.into_iter().zip(span_of) {
            span_read[i] = Some((n, c, chunk_start));
        }
        for (i, e) in window.iter().enumerate() {
            if self.sink.stopped() {
                return;
            }
            let p = match &e.body {
                Err(err) => {
                    if !self.error(e, err).await {
                        return;
                    }
                    continue;
                }
                Ok(p) => p,
            };
            let size = p.end - p.start;
            if size == 0 {
                self.sink
                    .header(e.head(), 0, p.obj.last_modified_ms, &p.obj.etag);
                self.maybe_flush().await;
                continue;
            }
            if let Some((n, c, chunk_start)) = span_read[i] {
                let (rid, idx) = p.chunk_identity(c);
                let loc = p.location(c);
                let span;
                let reread;
                let mut payload = match &spans[n] {
                    Ok(slot) => {
                        span = Span {
                            segment_id: slot.segment_id,
                            offset: slot.offset,
                            bytes: &buf[slot.at..slot.at + slot.len],
                        };
                        span.record(&loc, &rid, idx)
                            .map_err(|e| EngineError::from(e).0)
                    }
                    Err(err) => Err(err.clone()),
                };
                let from_window = payload.is_ok();
                if !from_window
                    && engine.chunks.has_redundancy()
                    && !crate::tier::is_tier_segment(loc.segment_id)
                {
                    // The merged read takes one place only; the record read falls back on the
                    // other copies or rebuilds from the other shards.
                    let e2 = engine.clone();
                    reread = blocking(move || Ok(e2.chunks.read(&loc, &rid, idx)?)).await;
                    payload = reread.as_deref().map_err(|e| e.0.clone());
                }
                match payload {
                    Ok(data) => {
                        let from = (p.start - chunk_start) as usize;
                        let to = (p.end - chunk_start) as usize;
                        self.sink
                            .header(e.head(), size, p.obj.last_modified_ms, &p.obj.etag);
                        if size >= ZERO_COPY_BYTES_MIN && from_window {
                            // Sent as a slice of the window buffer: no copy into a frame.
                            let at = data.as_ptr() as usize - buf.as_ptr() as usize;
                            let payload = buf.slice(at + from..at + to);
                            if !self.sink.send(payload).await {
                                return;
                            }
                        } else {
                            self.sink.extend(&data[from..to]);
                        }
                        self.sink.end_payload(size);
                        self.maybe_flush().await;
                    }
                    Err(err) => {
                        tracing::error!(entry = %e.name, error = %err, "batch read failed");
                        if !self.error(e, &err).await {
                            return;
                        }
                    }
                }
                continue;
            }
            // A multi-record piece streams chunk by chunk after its header; a failure half-way
            // cuts the stream.
            self.sink
                .header(e.head(), size, p.obj.last_modified_ms, &p.obj.etag);
            let mut reader = ObjectReader::new(engine.clone(), p.obj.clone(), p.start, p.end);
            loop {
                match reader.next().await {
                    Ok(Some(d)) => {
                        if !self.sink.send(d).await {
                            return;
                        }
                    }
                    Ok(None) => break,
                    Err(err) => {
                        tracing::error!(entry = %e.name, error = %err.0, "batch read failed mid-entry");
                        self.sink.cut(&err.0).await;
                        return;
                    }
                }
            }
            self.sink.end_payload(size);
        }
        // Kept for the next window if the connection is done with every slice of it, unless
        // an unusual window made it much larger than usual.
        drop(spans);
        if let Ok(b) = buf.try_into_mut()
            && b.capacity() <= 4 * WINDOW_BYTES_MAX as usize
        {
            self.window_buf = Vec::from(b);
        }
    }
}

/// Where one span of a window landed in the window's buffer.
struct SpanSlot {
    segment_id: u64,
    /// Offset in the segment of the span's first byte.
    offset: u64,
    /// Position and length (as read) in the window buffer.
    at: usize,
    len: usize,
}

/// Reads the spans covering the records `wanted` (entry, location) into `buf`, one after the
/// other: records sorted by disk position; a record joins the previous span when the gap
/// between them is at most [`SPAN_GAP_BYTES_MAX`] and at most the record's own size (or 4 KiB),
/// so the bytes read and thrown away never exceed about the bytes wanted, and a span stays
/// under [`SPAN_BYTES_MAX`]. Returns the buffer, the spans, and for each wanted record in
/// order the index of its span.
fn read_spans(
    engine: &Engine,
    wanted: &[(usize, RecordLocation)],
    mut buf: Vec<u8>,
) -> (Vec<u8>, Vec<StoreResult<SpanSlot>>, Vec<usize>) {
    let mut order: Vec<usize> = (0..wanted.len()).collect();
    order.sort_unstable_by_key(|&i| (wanted[i].1.segment_id, wanted[i].1.offset));
    let rec_len =
        |l: &RecordLocation| packrat_chunk_store::RECORD_HEADER_BYTES as u64 + u64::from(l.len);
    // Plan: (segment, start, end) per span.
    let mut plans: Vec<(u64, u64, u64)> = Vec::new();
    let mut span_of = vec![0usize; wanted.len()];
    for n in order {
        let loc = wanted[n].1;
        let end_of = loc.offset + rec_len(&loc);
        match plans.last_mut() {
            Some((seg, start, end))
                if *seg == loc.segment_id
                    && loc.offset >= *start
                    && loc.offset <= *end + SPAN_GAP_BYTES_MAX.min(rec_len(&loc).max(4096))
                    && end_of.max(*end) - *start <= SPAN_BYTES_MAX =>
            {
                *end = (*end).max(end_of);
            }
            _ => plans.push((loc.segment_id, loc.offset, end_of)),
        }
        span_of[n] = plans.len() - 1;
    }
    let total: u64 = plans.iter().map(|(_, a, b)| b - a).sum();
    // Grown (and zeroed) only when a window needs more than any before; every byte used is
    // overwritten by a read.
    if buf.len() < total as usize {
        buf.resize(total as usize, 0);
    }
    let mut at = 0usize;
    let mut spans = Vec::with_capacity(plans.len());
    for (seg, start, end) in plans {
        let len = (end - start) as usize;
        let read = engine
            .read_span_into(seg, start, &mut buf[at..at + len])
            .map_err(|e| e.0)
            .map(|n| SpanSlot {
                segment_id: seg,
                offset: start,
                at,
                len: n,
            });
        spans.push(read);
        at += len;
    }
    (buf, spans, span_of)
}

/// Entries per window: up to [`WINDOW_ITEMS_MAX`] entries and [`WINDOW_BYTES_MAX`] bytes of
/// span-read data (a multi-record entry streams and does not count).
fn windows(entries: Vec<Entry>) -> Vec<Vec<Entry>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    let mut bytes = 0u64;
    for e in entries {
        let b = match &e.body {
            Ok(p) if p.single_chunk().is_some() => p.end - p.start,
            _ => 0,
        };
        if !cur.is_empty() && (cur.len() >= WINDOW_ITEMS_MAX || bytes + b > WINDOW_BYTES_MAX) {
            out.push(std::mem::take(&mut cur));
            bytes = 0;
        }
        bytes += b;
        cur.push(e);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// The member index of a TAR object: built on first use by reading the object once, then kept
/// in the index under the identity of the object's bytes.
async fn tar_index(
    engine: &Arc<Engine>,
    key: &str,
    obj: &Arc<ObjectRecord>,
) -> StoreResult<[u8; 16]> {
    let not_tar = |why: &str| {
        StoreError::Invalid(format!(
            "The object {key:?} is not a TAR archive ({why}); `member` needs one"
        ))
    };
    if obj.chunks.is_empty() {
        return Err(not_tar("it is empty"));
    }
    let id = obj.chunk_identity(0).0;
    let known = {
        let engine = engine.clone();
        blocking(move || Ok(engine.index.get_tar_index(&id)?)).await?
    };
    if let Some(t) = known {
        return match t.not_a_tar {
            Some(why) => Err(not_tar(&why)),
            None => Ok(id),
        };
    }
    let mut parser = TarParser::new();
    let mut members: Vec<(String, MemberRecord)> = Vec::new();
    let mut reader = ObjectReader::new(engine.clone(), obj.clone(), 0, obj.size);
    let mut parsed: Result<(), TarError> = Ok(());
    while let Some(d) = reader.next().await? {
        parsed = parser.push(&d, &mut |ev| {
            if let TarEvent::File { name, size, offset } = ev
                && !name.is_empty()
            {
                members.push((name, MemberRecord { offset, size }));
            }
            Ok::<(), TarError>(())
        });
        if parsed.is_err() || parser.is_done() {
            break;
        }
    }
    let parsed = parsed.and_then(|()| parser.finish());
    let summary = TarIndexRecord {
        members: members.len() as u64,
        not_a_tar: parsed.as_ref().err().map(|e| e.0.clone()),
    };
    if summary.not_a_tar.is_some() {
        members.clear();
    }
    let result = summary.not_a_tar.clone();
    let count = summary.members;
    {
        let engine = engine.clone();
        blocking(move || Ok(engine.index.put_tar_index(&id, &summary, &members)?)).await?;
    }
    tracing::info!(key, members = count, not_a_tar = ?result, "indexed TAR members");
    match result {
        Some(why) => Err(not_tar(&why)),
        None => Ok(id),
    }
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
    for w in windows(*entries) {
        em.window(w).await;
        if em.sink.stopped() {
            return;
        }
    }
    em.sink.finish().await;
}

/// Reads one shard of an epoch stream (see `ObjectStore::read_stream`).
pub(crate) async fn read_stream(
    engine: &Arc<Engine>,
    bucket_id: u64,
    query: StreamQuery,
    sink: &mut dyn EntrySink,
) {
    let mut em = Emitter {
        engine: engine.clone(),
        sink,
        window_buf: Vec::new(),
    };
    let mut after: Option<String> = None;
    let mut window: Vec<Entry> = Vec::new();
    let mut window_bytes = 0u64;
    let mut window_no = 0u64;
    // Entries with more than one record stream without being held, so only span-read entries
    // count toward the window's bytes; the shuffle window is bounded by both.
    let shuffle_bytes_max = WINDOW_BYTES_MAX * 4;
    loop {
        let page = {
            let engine = engine.clone();
            let prefix = query.prefix.clone();
            let after2 = after.clone();
            blocking(move || {
                Ok(engine.index.list_objects(
                    bucket_id,
                    &prefix,
                    None,
                    after2.as_deref(),
                    STREAM_PAGE_KEYS,
                )?)
            })
            .await
        };
        let page = match page {
            Ok(p) => p,
            Err(e) => {
                em.sink.cut(&e.0).await;
                return;
            }
        };
        for (key, rec) in page.objects {
            if key_hash(&key) % query.shards != query.shard {
                continue;
            }
            let size = rec.size;
            let piece = Piece::new(Arc::new(rec), 0, size);
            if piece.single_chunk().is_some() {
                window_bytes += size;
            }
            window.push(Entry {
                name: key,
                tag: None,
                body: Ok(piece),
            });
            if window.len() >= query.window || window_bytes >= shuffle_bytes_max {
                shuffle(&mut window, query.seed, window_no);
                window_no += 1;
                window_bytes = 0;
                for w in windows(std::mem::take(&mut window)) {
                    em.window(w).await;
                    if em.sink.stopped() {
                        return;
                    }
                }
            }
        }
        if !page.truncated {
            break;
        }
        after = page.last;
    }
    shuffle(&mut window, query.seed, window_no);
    for w in windows(window) {
        em.window(w).await;
        if em.sink.stopped() {
            return;
        }
    }
    em.sink.finish().await;
}

/// A batch PUT into one bucket: each object cut into records as its bytes arrive, on the
/// calling thread (a trip through the blocking pool per small object would cost more than
/// its page-cache write), all committed in one index batch.
pub(crate) struct LocalBatchWriter {
    engine: Arc<Engine>,
    bucket_id: u64,
    /// Keeps the objects' segments from compaction until they are indexed.
    pin: WritePin,
    now_ms: i64,
    objects: Vec<(String, ObjectRecord)>,
    current: Option<(String, RecordWriter)>,
    last_ticket: Option<WriteTicket>,
}

impl LocalBatchWriter {
    pub(crate) fn new(engine: Arc<Engine>, bucket_id: u64) -> Self {
        Self {
            pin: engine.pin_write(),
            now_ms: engine.clock.now_ms(),
            engine,
            bucket_id,
            objects: Vec::new(),
            current: None,
            last_ticket: None,
        }
    }

    fn ticket(&mut self, t: Option<WriteTicket>) {
        if let Some(t) = t {
            self.last_ticket = Some(self.last_ticket.map_or(t, |l| l.max(t)));
        }
    }
}

#[async_trait::async_trait]
impl BatchWriter for LocalBatchWriter {
    fn begin(&mut self, key: String) -> StoreResult<()> {
        if self.current.is_some() {
            return Err(StoreError::internal(
                "batch PUT",
                "an object begun before the last ended",
            ));
        }
        self.current = Some((key, RecordWriter::new()));
        Ok(())
    }

    fn write(&mut self, data: &[u8]) -> StoreResult<()> {
        let Some((_, w)) = self.current.as_mut() else {
            return Err(StoreError::internal("batch PUT", "bytes before any object"));
        };
        let t = w.push(&self.engine.chunks, data)?;
        self.ticket(t);
        Ok(())
    }

    fn end(&mut self) -> StoreResult<u64> {
        let Some((key, w)) = self.current.take() else {
            return Err(StoreError::internal(
                "batch PUT",
                "an end without an object",
            ));
        };
        let written = w.finish(&self.engine.chunks)?;
        self.ticket(written.ticket);
        let size = written.size;
        self.objects.push((
            key,
            ObjectRecord {
                record_id: written.record_id,
                size,
                etag: hex::encode(written.md5),
                last_modified_ms: self.now_ms,
                chunks: written.chunks,
                ..Default::default()
            },
        ));
        Ok(size)
    }

    fn count(&self) -> usize {
        self.objects.len()
    }

    async fn commit(self: Box<Self>) -> StoreResult<usize> {
        let Self {
            engine,
            bucket_id,
            pin,
            objects,
            last_ticket,
            ..
        } = *self;
        let count = objects.len();
        engine
            .commit_objects(bucket_id, objects, last_ticket)
            .await?;
        drop(pin);
        Ok(count)
    }
}
