//! packrat's extensions for data loaders, each a signed S3-style request answered (or sent) as
//! a TAR stream:
//!
//! - batch GET, `POST /{bucket}?batch` with a JSON list of items (keys, ranges, TAR members);
//! - epoch streams, `GET /{bucket}?stream&prefix=..&shard=i/n&seed=s`: one shard of a prefix
//!   in a seeded pseudo-random order;
//! - TAR members: `member` names one file inside a TAR object, found through a member index
//!   built on first use and kept in the index;
//! - batch PUT, a TAR sent by PutObject with `x-amz-meta-snowball-auto-extract: true`, which
//!   becomes one object per member, committed together.
//!
//! Reads are planned in windows, emitted in the order asked. Small entries that are whole
//! records (the usual sample) are read straight into their place in the output frame: the
//! frame's TAR headers are written first, then one vectored read per run of neighbouring
//! records scatters the payloads into place, and each is checksum-verified there. Other entries
//! that lie inside one record are read through spans (neighbouring records merged into one
//! positioned read into a window buffer, each record then verified; large payloads go out as
//! slices of that buffer). Entries spanning records stream chunk by chunk. Memory per request
//! is bounded by the window and the frames, whatever the number of items or bytes in the batch.

use super::batch_request::{
    BatchRequest, OnError, Order, key_hash, parse_item_range, parse_shard, resolve_item_range,
    shuffle,
};
use super::checksum::{self, ChecksumWire, Hasher};
use super::error::{S3Error, S3ErrorCode, S3Result};
use super::handlers::{Access, content_md5, load_bucket, now_ms, requested_checksum};
use crate::config;
use crate::server::blocking;
use crate::server::{AppState, RespBody, S3Request};
use crate::tar::{self, TarError, TarEvent, TarParser};
use bytes::{Bytes, BytesMut};
use http::{Response, StatusCode};
use http_body_util::BodyExt;
use md5::{Digest, Md5};
use packrat_chunk_store::{RecordLocation, RecordRead, Span};
use packrat_index::{MemberRecord, ObjectRecord, TarIndexRecord};
use packrat_store::EngineError;
use packrat_store::engine::{Engine, ObjectReader, RecordWriter};
use std::collections::HashMap;
use std::sync::Arc;

type R = S3Result<Response<RespBody>>;

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
/// Output is sent to the client in frames of about this size.
const FRAME_BYTES: usize = 1024 * 1024;
/// Frames buffered between the reader task and the connection.
const FRAMES_QUEUED: usize = 4;
/// Epoch streams shuffle within windows of this many entries by default, and at most this many.
const STREAM_WINDOW_DEFAULT: usize = 1024;
const STREAM_WINDOW_MAX: usize = 65_536;

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

// ---------------------------------------------------------------- requests

// ---------------------------------------------------------------- entries and their reading

/// What one TAR entry carries: bytes `[start, end)` of an object, or an error report.
struct Entry {
    name: String,
    tag: Option<String>,
    body: Result<Piece, (&'static str, String)>,
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

fn error_entry(name: &str, code: &'static str, message: String) -> Entry {
    Entry {
        name: name.to_string(),
        tag: None,
        body: Err((code, message)),
    }
}

/// The output side of a TAR stream: entries are written into a buffer that goes to the
/// connection in frames, through a small queue (the bound on memory ahead of the client).
/// Frame and span buffers are reused from request-local pools, so a long stream does not
/// churn the allocator (buffers freed on other threads are slow to return to the system).
struct Out {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: BytesMut,
    /// Frames sent, kept so their buffers can be reused once the connection has written them.
    sent: std::collections::VecDeque<Bytes>,
    /// The buffer each window's span reads land in, reused window after window.
    window_buf: Vec<u8>,
    abort_on_error: bool,
    /// Set once the client is gone or the stream was cut: nothing more is produced.
    stopped: bool,
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

    async fn maybe_flush(&mut self) {
        if self.buf.len() >= FRAME_BYTES {
            self.flush().await;
        }
    }

    /// Ends the stream with an error: the client sees a cut connection, never wrong bytes.
    async fn cut(&mut self, why: String) {
        self.flush().await;
        let _ = self.tx.send(Err(std::io::Error::other(why))).await;
        self.stopped = true;
    }

    fn header(&mut self, e: &Entry, size: u64, mtime_ms: i64, etag: Option<&str>) {
        let mut pairs = [("", ""); 2];
        let mut n = 0;
        if let Some(t) = etag {
            pairs[n] = ("packrat.etag", t);
            n += 1;
        }
        if let Some(t) = &e.tag {
            pairs[n] = ("packrat.tag", t);
            n += 1;
        }
        let extra = &pairs[..n];
        tar::write_entry_header(&mut self.buf, &e.name, size, mtime_ms / 1000, extra);
    }

    fn pad(&mut self, size: u64) {
        self.buf.resize(self.buf.len() + tar::padding(size), 0);
    }

    /// Writes an error entry; returns false if the stream must stop here (`on_error: abort`).
    async fn error(&mut self, e: &Entry, code: &str, message: &str) -> bool {
        let body = format!("{code}: {message}\n");
        let name = format!("__error__/{}", e.name);
        let mut extra = vec![("packrat.error", code)];
        if let Some(t) = &e.tag {
            extra.push(("packrat.tag", t.as_str()));
        }
        tar::write_entry_header(
            &mut self.buf,
            &name,
            body.len() as u64,
            now_ms() / 1000,
            &extra,
        );
        self.buf.extend_from_slice(body.as_bytes());
        self.pad(body.len() as u64);
        self.maybe_flush().await;
        !self.abort_on_error
    }

    async fn finish(&mut self) {
        if !self.stopped {
            self.buf.extend_from_slice(&tar::END_OF_ARCHIVE);
            self.flush().await;
        }
    }

    /// Ends the archive after an abort (the error entry is already written).
    async fn stopped_by_abort(&mut self) {
        self.finish().await;
        self.stopped = true;
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
    (whole && small && !packrat_store::tier::is_tier_segment(s.loc.segment_id)).then_some(s.chunk)
}

/// Reads and emits one window of entries in the given order: runs of whole records through
/// [`emit_scattered`], everything else through [`emit_spans`].
async fn emit_window(engine: &Arc<Engine>, window: Vec<Entry>, out: &mut Out) {
    let mut whole: Vec<(Entry, usize)> = Vec::new();
    let mut other: Vec<Entry> = Vec::new();
    for e in window {
        if out.stopped {
            return;
        }
        match whole_record(&e) {
            Some(c) => {
                if !other.is_empty() {
                    emit_spans(engine, std::mem::take(&mut other), out).await;
                }
                whole.push((e, c));
            }
            None => {
                if !whole.is_empty() {
                    emit_scattered(engine, std::mem::take(&mut whole), out).await;
                }
                other.push(e);
            }
        }
    }
    if !whole.is_empty() {
        emit_scattered(engine, whole, out).await;
    }
    if !other.is_empty() {
        emit_spans(engine, other, out).await;
    }
}

/// Emits entries that are whole records (entry, its chunk) a frame at a time: the frame is
/// laid out first (TAR headers written, each payload's place reserved), then every record is
/// read straight into its place, neighbours on disk sharing one vectored read, and verified.
/// One copy out of the page cache, none between buffers. A frame not wholly in the page cache
/// is read with all its records in flight at once. If any record fails, the frame is laid out
/// again through [`emit_spans`], which reports the failure as an error entry.
async fn emit_scattered(engine: &Arc<Engine>, entries: Vec<(Entry, usize)>, out: &mut Out) {
    let mut entries = entries.into_iter();
    loop {
        let base = out.buf.len();
        let mut group = Vec::new();
        let mut chunks = Vec::new();
        let mut reads = Vec::new();
        while group.is_empty() || out.buf.len() < FRAME_BYTES {
            let Some((e, c)) = entries.next() else { break };
            let Ok(p) = &e.body else {
                unreachable!("whole_record only admits entries with a body")
            };
            let size = p.end - p.start;
            let (mtime_ms, etag) = match &p.single {
                Some(s) => (s.mtime_ms, s.etag.get().unwrap_or(&p.obj.etag)),
                None => (p.obj.last_modified_ms, p.obj.etag.as_str()),
            };
            out.header(&e, size, mtime_ms, Some(etag));
            let dst = out.buf.len();
            out.buf.resize(dst + size as usize + tar::padding(size), 0);
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
        // Hot records are copied out of mappings of their segments (no syscall per record;
        // the first that had to wait for the disk pauses mapped reads for a while). Otherwise
        // from the page cache on this thread when every record is there (a preadv2 that never
        // waits). Otherwise every record of the frame is read at once through the engine's
        // read path (io_uring, or the blocking pool), so a frame of cold samples waits for
        // about one disk read rather than one per sample, then copied into its place.
        let in_place = engine
            .chunks
            .read_mapped_records_into(&reads, &mut out.buf[..]);
        if !in_place
            && !engine
                .chunks
                .read_cached_records_into(&reads, &mut out.buf[..])
        {
            let fetched = futures_util::future::join_all(group.iter().zip(&chunks).map(
                |(e, c)| async move {
                    match &e.body {
                        Ok(p) => engine.read_chunk(&p.obj, *c).await,
                        Err(_) => Err(EngineError::internal("batch", "an entry without a body")),
                    }
                },
            ))
            .await;
            if fetched.iter().all(Result::is_ok) {
                for (r, data) in reads.iter().zip(fetched.into_iter().flatten()) {
                    out.buf[r.dst..r.dst + data.len()].copy_from_slice(&data);
                }
            } else {
                out.buf.truncate(base);
                emit_spans(engine, group, out).await;
            }
        }
        out.maybe_flush().await;
        if out.stopped {
            return;
        }
    }
}

/// Reads and emits entries in the given order: every entry that lies inside one record is
/// read through spans (merged neighbouring reads into one buffer, then each record verified
/// and copied out); larger entries stream chunk by chunk.
async fn emit_spans(engine: &Arc<Engine>, window: Vec<Entry>, out: &mut Out) {
    // Plan the span reads of every entry that lies inside one record: (entry, chunk, chunk's
    // first byte in the object) and where that record is.
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
        (std::mem::take(&mut out.window_buf), Vec::new(), Vec::new())
    } else {
        let e2 = engine.clone();
        let buf = std::mem::take(&mut out.window_buf);
        match blocking(move || Ok(read_spans(&e2, &wanted, buf))).await {
            Ok(v) => v,
            Err(e) => {
                out.cut(e.message).await;
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
        if out.stopped {
            return;
        }
        let p = match &e.body {
            Err((code, msg)) => {
                if !out.error(e, code, msg).await {
                    out.stopped_by_abort().await;
                    return;
                }
                continue;
            }
            Ok(p) => p,
        };
        let size = p.end - p.start;
        if size == 0 {
            out.header(e, 0, p.obj.last_modified_ms, Some(&p.obj.etag));
            out.maybe_flush().await;
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
                    span.record(&loc, &rid, idx).map_err(S3Error::from)
                }
                Err(err) => Err(err.clone()),
            };
            let from_window = payload.is_ok();
            if !from_window
                && engine.chunks.has_redundancy()
                && !packrat_store::tier::is_tier_segment(loc.segment_id)
            {
                // The merged read takes one place only; the record read falls back on the
                // other copies or rebuilds from the other shards.
                let e2 = engine.clone();
                reread = blocking(move || Ok(e2.chunks.read(&loc, &rid, idx)?)).await;
                payload = reread.as_deref().map_err(Clone::clone);
            }
            match payload {
                Ok(data) => {
                    let from = (p.start - chunk_start) as usize;
                    let to = (p.end - chunk_start) as usize;
                    out.header(e, size, p.obj.last_modified_ms, Some(&p.obj.etag));
                    if size >= ZERO_COPY_BYTES_MIN && from_window {
                        // Sent as a slice of the window buffer: no copy into a frame.
                        let at = data.as_ptr() as usize - buf.as_ptr() as usize;
                        let payload = buf.slice(at + from..at + to);
                        out.flush().await;
                        if out.stopped || out.tx.send(Ok(payload)).await.is_err() {
                            out.stopped = true;
                            return;
                        }
                    } else {
                        out.buf.extend_from_slice(&data[from..to]);
                    }
                    out.pad(size);
                    out.maybe_flush().await;
                }
                Err(err) => {
                    tracing::error!(entry = %e.name, error = %err.message, "batch read failed");
                    if !out.error(e, "InternalError", &err.message).await {
                        out.stopped_by_abort().await;
                        return;
                    }
                }
            }
            continue;
        }
        // A multi-record piece streams chunk by chunk after its header; a failure half-way
        // cuts the stream.
        out.header(e, size, p.obj.last_modified_ms, Some(&p.obj.etag));
        out.flush().await;
        let mut reader = ObjectReader::new(engine.clone(), p.obj.clone(), p.start, p.end);
        loop {
            match reader.next().await {
                Ok(Some(d)) => {
                    if out.stopped || out.tx.send(Ok(d)).await.is_err() {
                        out.stopped = true;
                        return;
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    let err = S3Error::from(err);
                    tracing::error!(entry = %e.name, error = %err.message, "batch read failed mid-entry");
                    out.cut(err.message).await;
                    return;
                }
            }
        }
        out.pad(size);
    }
    // Kept for the next window if the connection is done with every slice of it, unless an
    // unusual window made it much larger than usual.
    drop(spans);
    if let Ok(b) = buf.try_into_mut()
        && b.capacity() <= 4 * WINDOW_BYTES_MAX as usize
    {
        out.window_buf = Vec::from(b);
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
) -> (Vec<u8>, Vec<S3Result<SpanSlot>>, Vec<usize>) {
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
            .map_err(S3Error::from)
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

fn tar_response(
    rx: tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
    extra: &[(&str, String)],
) -> R {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|f| (f.map(http_body::Frame::data), rx))
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

fn output() -> (
    Out,
    tokio::sync::mpsc::Receiver<Result<Bytes, std::io::Error>>,
) {
    let (tx, rx) = tokio::sync::mpsc::channel(FRAMES_QUEUED);
    (
        Out {
            tx,
            buf: BytesMut::with_capacity(FRAME_BYTES + 64 * 1024),
            sent: Default::default(),
            window_buf: Vec::new(),
            abort_on_error: false,
            stopped: false,
        },
        rx,
    )
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

// ---------------------------------------------------------------- batch GET

/// The member index of a TAR object: built on first use by reading the object once, then kept
/// in the index under the identity of the object's bytes.
async fn tar_index(engine: &Arc<Engine>, key: &str, obj: &Arc<ObjectRecord>) -> S3Result<[u8; 16]> {
    let not_tar = |why: &str| {
        bad(
            S3ErrorCode::InvalidRequest,
            format!("The object {key:?} is not a TAR archive ({why}); `member` needs one"),
        )
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

/// Keys looked up at a time by a batch GET (a cached block costs the worker ~0.2 ms).
const LOOKUP_BLOCK: usize = 1024;

pub async fn handle_batch_get(state: &Arc<AppState>, req: &mut S3Request, bname: &str) -> R {
    // Read permission on the bucket covers every item: all items name keys of this bucket.
    let b = load_bucket(state, req, bname, Access::Read)?;
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
    let mut ranges = Vec::with_capacity(r.items.len());
    for (i, it) in r.items.iter().enumerate() {
        if it.key.is_empty() || it.key.len() > config::KEY_BYTES_MAX {
            return Err(bad(
                S3ErrorCode::InvalidArgument,
                format!(
                    "item {i}: a key must be 1 to {} bytes",
                    config::KEY_BYTES_MAX
                ),
            ));
        }
        if it.member.as_deref() == Some("") {
            return Err(bad(
                S3ErrorCode::InvalidArgument,
                format!("item {i}: an empty member name"),
            ));
        }
        ranges.push(match &it.range {
            None => None,
            Some(s) => Some(
                parse_item_range(s)
                    .map_err(|m| bad(S3ErrorCode::InvalidArgument, format!("item {i}: {m}")))?,
            ),
        });
    }
    // The records, a block of keys at a time: from the record cache on this task (the records
    // are then in this core's caches for what follows); the keys it does not hold in one
    // batched multi-get on a blocking thread.
    let mut objects: Vec<Option<Arc<ObjectRecord>>> = Vec::with_capacity(r.items.len());
    for block in r.items.chunks(LOOKUP_BLOCK) {
        let refs: Vec<&str> = block.iter().map(|i| i.key.as_str()).collect();
        let mut found = state.engine.index.cached_objects(b.id, &refs);
        let missing: Vec<usize> = (0..found.len()).filter(|&i| found[i].is_none()).collect();
        if !missing.is_empty() {
            let engine = state.engine.clone();
            let keys: Vec<String> = missing.iter().map(|&i| block[i].key.clone()).collect();
            let bid = b.id;
            let read = blocking(move || {
                let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
                Ok(engine.index.multi_get_objects(bid, &refs)?)
            })
            .await?;
            for (i, rec) in missing.into_iter().zip(read) {
                found[i] = rec;
            }
        }
        objects.extend(found);
        if r.items.len() > LOOKUP_BLOCK {
            // Let the worker's other tasks run between blocks of a large batch.
            tokio::task::yield_now().await;
        }
    }
    // Member indexes of the TAR objects that items name members of.
    let mut tar_ids: HashMap<&str, [u8; 16]> = HashMap::new();
    for (it, obj) in r.items.iter().zip(&objects) {
        if let (Some(_), Some(obj)) = (&it.member, obj)
            && !tar_ids.contains_key(it.key.as_str())
        {
            let id = tar_index(&state.engine, &it.key, obj).await?;
            tar_ids.insert(&it.key, id);
        }
    }
    let mut entries = Vec::with_capacity(r.items.len());
    let mut total = 0u64;
    // Each record's lines are asked for 16 items ahead and what it points to 8 ahead, so the
    // cache misses of a batch of random keys overlap (see `ObjectRecord::prefetch`).
    for (i, (it, range)) in r.items.iter().zip(ranges).enumerate() {
        if let Some(Some(o)) = objects.get(i + 16) {
            ObjectRecord::prefetch(o);
        }
        if let Some(Some(o)) = objects.get(i + 8) {
            o.prefetch_heap();
        }
        let obj = objects[i].take();
        let name = match &it.member {
            Some(m) => format!("{}/{m}", it.key),
            None => it.key.clone(),
        };
        let Some(obj) = obj else {
            entries.push(Entry {
                tag: it.tag.clone(),
                ..error_entry(
                    &name,
                    "NoSuchKey",
                    "The specified key does not exist.".into(),
                )
            });
            continue;
        };
        let (base, len) = match &it.member {
            None => (0, obj.size),
            Some(m) => {
                let id = tar_ids[it.key.as_str()];
                let engine = state.engine.clone();
                let m2 = m.clone();
                match blocking(move || Ok(engine.index.get_member(&id, &m2)?)).await? {
                    Some(mr) => (mr.offset, mr.size),
                    None => {
                        entries.push(Entry {
                            tag: it.tag.clone(),
                            ..error_entry(
                                &name,
                                "NoSuchKey",
                                format!("The TAR object has no member {m:?}."),
                            )
                        });
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
                    entries.push(Entry {
                        tag: it.tag.clone(),
                        ..error_entry(
                            &name,
                            "InvalidRange",
                            format!("The requested range is not satisfiable (size {len})."),
                        )
                    });
                    continue;
                }
            },
        };
        total += end - start;
        entries.push(Entry {
            name,
            tag: it.tag.clone(),
            body: Ok(Piece::new(obj, base + start, base + end)),
        });
    }
    if total > limits.batch_bytes_max {
        return Err(bad(
            S3ErrorCode::EntityTooLarge,
            format!(
                "The batch asks for {total} bytes; the limit is {} (--batch-bytes-max)",
                limits.batch_bytes_max
            ),
        ));
    }
    if r.order == Order::Storage {
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
    let count = entries.len();
    let (mut out, rx) = output();
    out.abort_on_error = r.on_error == OnError::Abort;
    let engine = state.engine.clone();
    tokio::spawn(async move {
        for w in windows(entries) {
            emit_window(&engine, w, &mut out).await;
            if out.stopped {
                return;
            }
        }
        out.finish().await;
    });
    tar_response(rx, &[("x-packrat-batch-items", count.to_string())])
}

// ---------------------------------------------------------------- epoch streams

pub async fn handle_epoch_stream(state: &Arc<AppState>, req: &S3Request, bname: &str) -> R {
    let b = load_bucket(state, req, bname, Access::Read)?;
    let prefix = req.q("prefix").unwrap_or("").to_string();
    let (shard, shards) = match req.q("shard") {
        None => (0, 1),
        Some(s) => parse_shard(s).ok_or_else(|| {
            bad(
                S3ErrorCode::InvalidArgument,
                format!("shard={s:?} must be i/n with 0 <= i < n"),
            )
        })?,
    };
    let seed: u64 = match req.q("seed") {
        None => 0,
        Some(s) => s.parse().map_err(|_| {
            bad(
                S3ErrorCode::InvalidArgument,
                format!("seed={s:?} must be an unsigned 64-bit integer"),
            )
        })?,
    };
    let window_items: usize = match req.q("window") {
        None => STREAM_WINDOW_DEFAULT,
        Some(s) => s
            .parse()
            .ok()
            .filter(|w| (1..=STREAM_WINDOW_MAX).contains(w))
            .ok_or_else(|| {
                bad(
                    S3ErrorCode::InvalidArgument,
                    format!("window={s:?} must be 1 to {STREAM_WINDOW_MAX}"),
                )
            })?,
    };
    let abort = match req.q("on_error") {
        None | Some("continue") => false,
        Some("abort") => true,
        Some(s) => {
            return Err(bad(
                S3ErrorCode::InvalidArgument,
                format!("on_error={s:?} must be continue or abort"),
            ));
        }
    };
    let (mut out, rx) = output();
    out.abort_on_error = abort;
    let engine = state.engine.clone();
    let bid = b.id;
    tokio::spawn(async move {
        let mut after: Option<String> = None;
        let mut window: Vec<Entry> = Vec::new();
        let mut window_bytes = 0u64;
        let mut window_no = 0u64;
        // Entries with more than one record stream without being held, so only span-read
        // entries count toward the window's bytes; the shuffle window is bounded by both.
        let shuffle_bytes_max = WINDOW_BYTES_MAX * 4;
        loop {
            let page = {
                let engine = engine.clone();
                let prefix = prefix.clone();
                let after2 = after.clone();
                blocking(move || {
                    Ok(engine.index.list_objects(
                        bid,
                        &prefix,
                        None,
                        after2.as_deref(),
                        config::LIST_KEYS_MAX,
                    )?)
                })
                .await
            };
            let page = match page {
                Ok(p) => p,
                Err(e) => {
                    out.cut(e.message).await;
                    return;
                }
            };
            for (key, rec) in page.objects {
                if key_hash(&key) % shards != shard {
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
                if window.len() >= window_items || window_bytes >= shuffle_bytes_max {
                    shuffle(&mut window, seed, window_no);
                    window_no += 1;
                    window_bytes = 0;
                    for w in windows(std::mem::take(&mut window)) {
                        emit_window(&engine, w, &mut out).await;
                        if out.stopped {
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
        shuffle(&mut window, seed, window_no);
        for w in windows(window) {
            emit_window(&engine, w, &mut out).await;
            if out.stopped {
                return;
            }
        }
        out.finish().await;
    });
    tar_response(
        rx,
        &[
            ("x-packrat-shard", format!("{shard}/{shards}")),
            ("x-packrat-seed", seed.to_string()),
        ],
    )
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
    bucket_id: u64,
    key: &str,
) -> R {
    let prefix = snowball_prefix(req, key);
    // Keeps the members' segments from compaction until they are indexed.
    let _pin = state.engine.pin_write();
    let (alg, sent) = requested_checksum(&req.headers)?;
    let want_md5 = content_md5(&req.headers)?;
    let mut md5 = Md5::new();
    let mut hasher = alg.map(Hasher::new);
    let engine = state.engine.clone();
    let items_max = state.config.batch_items_max;
    let mut parser = TarParser::new();
    let mut objects: Vec<(String, ObjectRecord)> = Vec::new();
    let mut skipped: Vec<String> = Vec::new();
    let mut current: Option<(String, RecordWriter)> = None;
    let mut last_ticket = None;
    let mut bytes = 0u64;
    let now = now_ms();
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
                    if objects.len() >= items_max {
                        return Err(bad(
                            S3ErrorCode::InvalidRequest,
                            format!(
                                "The TAR has more than {items_max} members (--batch-items-max)"
                            ),
                        ));
                    }
                    current = Some((k, RecordWriter::new()));
                }
                TarEvent::Data(d) => {
                    if let Some((_, w)) = current.as_mut()
                        && let Some(t) = w.push(&engine.chunks, d)?
                    {
                        last_ticket = Some(
                            last_ticket.map_or(t, |l: packrat_chunk_store::WriteTicket| l.max(t)),
                        );
                    }
                }
                TarEvent::FileEnd => {
                    if let Some((k, w)) = current.take() {
                        let written = w.finish(&engine.chunks)?;
                        if let Some(t) = written.ticket {
                            last_ticket = Some(
                                last_ticket
                                    .map_or(t, |l: packrat_chunk_store::WriteTicket| l.max(t)),
                            );
                        }
                        bytes += written.size;
                        objects.push((
                            k,
                            ObjectRecord {
                                record_id: written.record_id,
                                size: written.size,
                                etag: hex::encode(written.md5),
                                last_modified_ms: now,
                                chunks: written.chunks,
                                ..Default::default()
                            },
                        ));
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
    let count = objects.len();
    state
        .engine
        .commit_objects(bucket_id, objects, last_ticket)
        .await?;
    // The summary is XML like every S3 answer: SDKs check a PutObject body for an S3 error
    // document and refuse anything they cannot parse as XML.
    let mut x = super::xml::Xml::new();
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
        .body(crate::server::full(x.finish()))
        .map_err(|e| S3Error::internal("response", e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::s3::batch_request::{ItemRange, SplitMix64};

    #[test]
    fn item_ranges() {
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
        assert_eq!(resolve_item_range(From(0, Some(99)), 50), Some((0, 50)));
        assert_eq!(resolve_item_range(From(50, None), 50), None);
        assert_eq!(resolve_item_range(Suffix(10), 4), Some((0, 4)));
        assert_eq!(resolve_item_range(Suffix(10), 0), None);
        // The overflow the range fuzz target found in the Range header parser, here too.
        assert_eq!(resolve_item_range(From(0, Some(u64::MAX)), 5), Some((0, 5)));
    }

    #[test]
    fn shards_partition_and_shuffles_are_fixed() {
        let keys: Vec<String> = (0..1000).map(|i| format!("train/{i:06}.jpg")).collect();
        let mut seen = vec![0u32; keys.len()];
        for s in 0..8 {
            for (i, k) in keys.iter().enumerate() {
                if key_hash(k) % 8 == s {
                    seen[i] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&n| n == 1));
        // Pinned values: the hash and the generator are part of the stream's contract.
        assert_eq!(key_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(key_hash("a"), 0xaf63_dc4c_8601_ec8c);
        let mut a: Vec<u32> = (0..10).collect();
        shuffle(&mut a, 42, 0);
        let mut b: Vec<u32> = (0..10).collect();
        shuffle(&mut b, 42, 0);
        assert_eq!(a, b);
        let mut c: Vec<u32> = (0..10).collect();
        shuffle(&mut c, 43, 0);
        assert_ne!(a, c);
        assert_eq!(SplitMix64(0).next(), 0xe220_a839_7b1d_cdaf);
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
