//! Reading planned entries into an `EntrySink`: single records (inline, zero-copy or scattered
//! into the frame), spans of neighbouring records, streamed multi-record entries; every payload
//! verified.

use super::{SPAN_BYTES_MAX, SPAN_GAP_BYTES_MAX, WINDOW_BYTES_MAX, ZERO_COPY_BYTES_MIN};
use crate::engine::{Engine, ObjectReader, blocking};
use crate::error::EngineError;
use bytes::Bytes;
use packrat_chunk_store::{RecordLocation, RecordRead, Span};
use packrat_index::ObjectRecord;
use packrat_store_api::batch::{EntryHead, EntrySink};
use packrat_store_api::{StoreError, StoreResult};
use std::sync::Arc;

/// What one entry carries: bytes `[start, end)` of an object, or why it cannot.
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) tag: Option<String>,
    pub(super) body: Result<Piece, StoreError>,
}

impl Entry {
    fn head(&self) -> EntryHead<'_> {
        EntryHead {
            name: &self.name,
            tag: self.tag.as_deref(),
        }
    }
}

pub(super) struct Piece {
    pub(super) obj: Arc<ObjectRecord>,
    pub(super) start: u64,
    pub(super) end: u64,
    /// Set if the piece lies inside a single chunk (then it is span-read, or read in place).
    /// Worked out once, when the piece is made: the batch's later passes (windows, planning,
    /// reading) then do not go back to the record's chunk list, which by then has left the
    /// CPU caches (a batch of random keys misses them on nearly every record).
    pub(super) single: Option<Single>,
}

#[derive(Clone, Copy)]
pub(super) struct Single {
    /// The chunk's position in the object's chunk list, and its first byte in the object.
    pub(super) chunk: usize,
    chunk_start: u64,
    loc: RecordLocation,
    /// The identity written into the chunk's record (record id, chunk index).
    pub(super) identity: ([u8; 16], u32),
    /// What the entry's header carries, copied for the same reason.
    mtime_ms: i64,
    etag: InlineEtag,
}

/// An ETag short enough to keep inline (all of packrat's: 32 hex digits, plus `-N` for a
/// multipart object); longer ones are read from the record.
#[derive(Clone, Copy)]
struct InlineEtag {
    pub(super) len: u8,
    pub(super) bytes: [u8; 47],
}

impl InlineEtag {
    pub(super) fn new(etag: &str) -> Self {
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

    pub(super) fn get(&self) -> Option<&str> {
        let b = self.bytes.get(..usize::from(self.len))?;
        // Copied from a `str` whole, so always valid.
        std::str::from_utf8(b).ok()
    }
}

impl Piece {
    pub(super) fn new(obj: Arc<ObjectRecord>, start: u64, end: u64) -> Self {
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
    pub(super) fn first_chunk(&self) -> Option<(usize, u64)> {
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
    pub(super) fn single_chunk(&self) -> Option<(usize, u64)> {
        self.single.map(|s| (s.chunk, s.chunk_start))
    }

    pub(super) fn location(&self, chunk: usize) -> RecordLocation {
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

    pub(super) fn chunk_identity(&self, chunk: usize) -> ([u8; 16], u32) {
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
    (whole && small && !crate::tiers::is_tier_segment(s.loc.segment_id)).then_some(s.chunk)
}

/// A batch's reading side: the engine, the sink entries go to, and the window buffer that span
/// reads land in, reused window after window (buffers freed on other threads are slow to
/// return to the system).
pub(super) struct Emitter<'a> {
    pub(super) engine: Arc<Engine>,
    pub(super) sink: &'a mut dyn EntrySink,
    pub(super) window_buf: Vec<u8>,
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
    /// [`Self::scattered`], everything else through [`Self::spans`]. Entries are read where
    /// they lie: an entry is a few hundred bytes, and moving each into a run of its own cost
    /// batch GET a measurable share of its memory copies.
    pub(super) async fn window(&mut self, window: &[Entry]) {
        let mut i = 0;
        while i < window.len() {
            if self.sink.stopped() {
                return;
            }
            let whole = whole_record(&window[i]).is_some();
            let run = window[i..]
                .iter()
                .position(|e| whole_record(e).is_some() != whole)
                .map_or(window.len(), |n| i + n);
            if whole {
                self.scattered(&window[i..run]).await;
            } else {
                self.spans(&window[i..run]).await;
            }
            i = run;
        }
    }

    /// Emits entries that are whole records (see [`whole_record`]) a frame at a time: the frame
    /// is laid out first (headers written, each payload's place reserved), then every record
    /// is read straight into its place, neighbours on disk sharing one vectored read, and
    /// verified. One copy out of the page cache, none between buffers. A frame not wholly in
    /// the page cache is read with all its records in flight at once. If any record fails,
    /// the frame is laid out again through [`Self::spans`], which reports the failure as an
    /// error entry.
    async fn scattered(&mut self, entries: &[Entry]) {
        let engine = self.engine.clone();
        let mut next = 0;
        loop {
            let base = self.sink.frame_len();
            let first = next;
            let mut chunks = Vec::new();
            let mut reads = Vec::new();
            while next == first || !self.sink.frame_full() {
                let Some(e) = entries.get(next) else { break };
                let (Ok(p), Some(c)) = (&e.body, whole_record(e)) else {
                    unreachable!("only whole records are passed here")
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
                chunks.push(c);
                next += 1;
            }
            let group = &entries[first..next];
            if group.is_empty() {
                return;
            }
            // Hot records are copied out of mappings of their segments (no syscall per
            // record; the first that had to wait for the disk pauses mapped reads for a
            // while). The others from the page cache on this thread where they are there (a
            // preadv2 that never waits). The rest, records that are not in the page cache, are
            // read at once through the engine's read path (io_uring, or the blocking pool), so
            // a frame of cold samples waits for about one disk read rather than one per
            // sample, then copied into place. Each step takes only what the one before left:
            // a few cold records among a frame of random samples (as in an epoch stream's
            // permuted order) cost their own reads, not the frame's.
            let frame = self.sink.frame_mut();
            let mut crcs = vec![0u32; reads.len()];
            let mut left =
                engine
                    .chunks
                    .read_mapped_records_into(&reads, &mut frame[..], &mut crcs);
            if !left.is_empty() {
                let sub: Vec<RecordRead> = left.iter().map(|&i| reads[i]).collect();
                let mut sub_crcs = vec![0u32; sub.len()];
                let missed =
                    engine
                        .chunks
                        .read_cached_records_into(&sub, &mut frame[..], &mut sub_crcs);
                // A missed record's CRC (none) is never told: it stays in `left`.
                for (&i, crc) in left.iter().zip(sub_crcs) {
                    crcs[i] = crc;
                }
                left = missed.into_iter().map(|j| left[j]).collect();
            }
            // The checked CRC of every record read in place (one whole payload each) goes to
            // the sink; those read the slow way below are not told.
            let mut left_at = left.iter().peekable();
            for (i, r) in reads.iter().enumerate() {
                if left_at.next_if_eq(&&i).is_none() {
                    self.sink.payload_crc32c(r.dst, crcs[i]);
                }
            }
            if !left.is_empty() {
                let fetched = futures_util::future::join_all(left.iter().map(|&i| {
                    let (engine, chunks) = (&engine, &chunks);
                    async move {
                        match &group[i].body {
                            Ok(p) => engine.read_chunk(&p.obj, chunks[i]).await,
                            Err(_) => {
                                Err(EngineError::internal("batch", "an entry without a body"))
                            }
                        }
                    }
                }))
                .await;
                if fetched.iter().all(Result::is_ok) {
                    let frame = self.sink.frame_mut();
                    for (&i, data) in left.iter().zip(fetched.into_iter().flatten()) {
                        let r = &reads[i];
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
    pub(super) async fn spans(&mut self, window: &[Entry]) {
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
                    && !crate::tiers::is_tier_segment(loc.segment_id)
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
    pub(super) segment_id: u64,
    /// Offset in the segment of the span's first byte.
    pub(super) offset: u64,
    /// Position and length (as read) in the window buffer.
    pub(super) at: usize,
    pub(super) len: usize,
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
