//! Batch reads and writes through the store: what a batch GET, an epoch stream and a batch PUT
//! ask of storage, and the sink their entries are emitted into.
//!
//! The store plans and reads (record lookups, TAR member indexes, item ranges, the order of
//! the reads on disk, verification); the caller owns the output format. Entries go to an
//! [`EntrySink`], which the S3 layer implements as a TAR stream: a sink lays out each entry's
//! header and payload in a frame buffer that the store may read payloads straight into, so a
//! small sample is copied once, from the page cache into the frame.
//!
//! The order rules of epoch streams are in [`crate::stream`]; the generator they use
//! ([`SplitMix64`]) is here, part of the stream's contract (a seed gives the same order in
//! every packrat version and on every store).

use crate::StoreError;
use bytes::{Bytes, BytesMut};

/// One item of a batch GET: bytes of an object, or of one member of a TAR object. Its entry is
/// named by the key, or `key/member` for a member.
#[derive(Debug, Clone)]
pub struct BatchItem {
    pub key: String,
    /// A file inside the object, which must then be a TAR archive.
    pub member: Option<String>,
    /// A range of the object (or of the member).
    pub range: Option<ItemRange>,
    /// The caller's label, handed back with the entry.
    pub tag: Option<String>,
}

/// In what order a batch's entries are emitted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub enum BatchOrder {
    /// As asked.
    #[default]
    Request,
    /// Errors first, then in the order the bytes lie on disk (fastest to read).
    Storage,
}

/// An item's byte range, as asked: `bytes=a-b`, `bytes=a-` or `bytes=-n` (one range only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ItemRange {
    From(u64, Option<u64>),
    Suffix(u64),
}

/// `[start, end)` of a range within `len` bytes, or `None` if it is not satisfiable.
pub fn resolve_item_range(r: ItemRange, len: u64) -> Option<(u64, u64)> {
    match r {
        ItemRange::From(a, _) if a >= len => None,
        ItemRange::From(a, b) => Some((a, b.map_or(len, |b| b.saturating_add(1).min(len)))),
        ItemRange::Suffix(_) if len == 0 => None,
        ItemRange::Suffix(n) => Some((len - n.min(len), len)),
    }
}

/// A planned batch: made by [`crate::ObjectStore::plan_batch`], read by
/// [`crate::ObjectStore::read_batch`] of the same store.
pub struct BatchPlan {
    /// Entries to emit, error entries included.
    pub entries: usize,
    /// Payload bytes of the entries that are not errors.
    pub bytes: u64,
    /// The store's own plan (its records and where their bytes are).
    pub plan: Box<dyn std::any::Any + Send>,
}

/// An entry as the sink names it.
#[derive(Debug, Clone, Copy)]
pub struct EntryHead<'a> {
    pub name: &'a str,
    pub tag: Option<&'a str>,
}

/// Where a batch's entries go, in order: for each entry either a header and then its payload
/// (copied in, read into a reserved place, or sent as buffers), or an error.
///
/// The synchronous methods are called per entry; the async ones (flushes, large payloads,
/// errors) rarely, so a `dyn` sink costs no allocation per entry.
#[async_trait::async_trait]
pub trait EntrySink: Send {
    /// Whether nothing more is wanted (the client went away, or the stream was cut or ended).
    fn stopped(&self) -> bool;
    /// Bytes in the frame being filled.
    fn frame_len(&self) -> usize;
    /// Whether the frame is full enough to be sent (then the store calls [`Self::flush`]).
    fn frame_full(&self) -> bool;
    /// Writes an entry's header for a payload of `size` bytes.
    fn header(&mut self, entry: EntryHead<'_>, size: u64, mtime_ms: i64, etag: &str);
    /// Reserves the payload of `size` bytes after a header (and whatever the format puts
    /// after it); answers where in the frame the payload goes.
    fn reserve(&mut self, size: u64) -> usize;
    /// The frame, to read reserved payloads into.
    fn frame_mut(&mut self) -> &mut BytesMut;
    /// Drops the frame back to `len` bytes (a layout the store could not fill).
    fn truncate(&mut self, len: usize);
    /// Appends payload bytes to the frame.
    fn extend(&mut self, data: &[u8]);
    /// Ends a payload of `size` bytes that was copied in or sent.
    fn end_payload(&mut self, size: u64);
    /// Tells the CRC32C of the payload reserved at `at`, read into place and checked against
    /// it (the one its record holds), so a sink that sends a CRC with each payload need not
    /// hash the bytes again. Not told for every payload; the default ignores it.
    fn payload_crc32c(&mut self, _at: usize, _crc: u32) {}
    /// Sends the frame.
    async fn flush(&mut self);
    /// Sends payload bytes as they are (after the frame), without copying them; false if the
    /// client is gone.
    async fn send(&mut self, data: Bytes) -> bool;
    /// Writes an error entry in the entry's place; false if the stream ends here (the sink
    /// has then finished it).
    async fn error(&mut self, entry: EntryHead<'_>, error: &StoreError) -> bool;
    /// Ends the stream with an error: the client sees a cut stream, never wrong bytes.
    async fn cut(&mut self, error: &StoreError);
    /// Ends the stream after the last entry.
    async fn finish(&mut self);
}

/// A batch PUT: objects written one after the other, made visible together by
/// [`BatchWriter::commit`]. Dropped without a commit, it leaves nothing visible.
#[async_trait::async_trait]
pub trait BatchWriter: Send {
    /// Starts the next object (ending none: call [`Self::end`] first).
    fn begin(&mut self, key: String) -> Result<(), StoreError>;
    /// Appends bytes to the object begun last.
    fn write(&mut self, data: &[u8]) -> Result<(), StoreError>;
    /// Ends the object begun last; answers its size.
    fn end(&mut self) -> Result<u64, StoreError>;
    /// Objects ended so far.
    fn count(&self) -> usize;
    /// Makes every ended object durable, then visible at once (replacing what the keys held);
    /// answers how many.
    async fn commit(self: Box<Self>) -> Result<usize, StoreError>;
}

/// FNV-1a, 64-bit: a stable hash of a key (an epoch stream's listing hash is built on it).
/// Stable across versions and platforms.
pub fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64: a tiny, fixed pseudo-random generator, so a seed gives the same order in every
/// packrat version.
pub struct SplitMix64(pub u64);

impl SplitMix64 {
    #[allow(clippy::should_implement_trait)]
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: usize) -> usize {
        // Multiply-shift: unbiased enough for shuffling, and fixed.
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_ranges_resolve_inside_the_object() {
        use ItemRange::*;
        assert_eq!(resolve_item_range(From(0, Some(99)), 50), Some((0, 50)));
        assert_eq!(resolve_item_range(From(50, None), 50), None);
        assert_eq!(resolve_item_range(Suffix(10), 4), Some((0, 4)));
        assert_eq!(resolve_item_range(Suffix(10), 0), None);
        // The overflow the range fuzz target found in the Range header parser, here too.
        assert_eq!(resolve_item_range(From(0, Some(u64::MAX)), 5), Some((0, 5)));
    }

    #[test]
    fn the_hash_and_the_generator_are_fixed() {
        // Pinned values: both are part of the stream's contract.
        assert_eq!(key_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(key_hash("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(SplitMix64(0).next(), 0xe220_a839_7b1d_cdaf);
    }
}
