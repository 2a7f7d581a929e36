//! A node's share of a batch GET on the wire: the items in, the entries out as records.

use super::*;

/// One item of a node's share of a batch GET: `POST /b/{bucket id}?plan|read[&order=storage]`
/// with a JSON array of these (at most [`BATCH_ITEMS_MAX`]). The gateway sends them borrowed
/// from its plan (`S = &str`); the node reads them owned.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireBatchItem<S = String> {
    pub pg: u32,
    pub key: S,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<S>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<WireRange>,
}

/// An item's range as asked (see `ItemRange`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum WireRange {
    From(u64, Option<u64>),
    Suffix(u64),
}

impl From<ItemRange> for WireRange {
    fn from(r: ItemRange) -> Self {
        match r {
            ItemRange::From(a, b) => WireRange::From(a, b),
            ItemRange::Suffix(n) => WireRange::Suffix(n),
        }
    }
}

/// Set (to `1`) on a node's batch answer when it carries CRCs, which the gateway asks for with
/// `crc` in the query: a 4-byte big-endian CRC32C after the head's JSON, after each record's
/// header, and after each entry's payload ([`BatchRecord`]). Entries go on to the client as
/// they arrive, so one CRC for the whole answer (a trailer, as other streamed answers carry)
/// would come too late; each payload is checked before it is handed on (a large one's last
/// piece is held back until its CRC has matched). An older node, which sends none, is read
/// unchecked.
pub const BATCH_CRC_HEADER: &str = "x-packrat-batch-crc32c";

/// Appends the CRC32C of `out[from..]` to `out` (see [`BATCH_CRC_HEADER`]).
pub fn put_crc_of(out: &mut bytes::BytesMut, from: usize) {
    let crc = body_crc32c(&out[from..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// The check of `got` (the CRC32C of bytes received) against the 4 bytes `sent` after them.
pub fn check_crc(sent: &[u8], got: u32) -> StoreResult<()> {
    crc_matches(<[u8; 4]>::try_from(sent).map(u32::from_be_bytes).ok(), got)
}

/// Items one node batch may name.
pub const BATCH_ITEMS_MAX: usize = 4096;

/// How a node answers its share of a batch GET, before any entry: the payload bytes of what it
/// will send, and the items (positions in the request) it may not answer for (its copy is
/// dirty, or it is not a caught-up member of the item's PG), which the gateway then asks for
/// alone, the way a GET does. The answer's body starts with a 4-byte big-endian length and
/// that many bytes of this as JSON; with `read`, the entries follow (see [`BatchRecord`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireBatchHead {
    pub bytes: u64,
    pub refused: Vec<u32>,
}

/// The record that ends a node's batch answer (in the place of an item's position).
const BATCH_END: u32 = u32::MAX;

const RECORD_ENTRY: u8 = 0;

const RECORD_ERROR: u8 = 1;

/// Bytes of an entry record before its etag: position, kind, size, mtime, etag length.
const ENTRY_HEAD_BYTES: usize = 4 + 1 + 8 + 8 + 2;

/// One record of a node's batch answer after its head, in the order the node emits them. An
/// entry is `u32 position, u8 0, u64 size, i64 mtime (ms), u16 etag length, etag`, then
/// `size` payload bytes; an error is `u32 position, u8 1, u32 length`, then that many bytes
/// of a [`WireError`] as JSON; the answer ends with `u32::MAX` (a body that stops before it
/// was cut). All integers big-endian. In an answer that carries CRCs ([`BATCH_CRC_HEADER`]),
/// the head's JSON, each record's header (an error's with its JSON) and each entry's payload
/// are each followed by their CRC32C.
#[derive(Debug)]
pub enum BatchRecord {
    Entry {
        at: u32,
        size: u64,
        mtime_ms: i64,
        etag: String,
    },
    Error {
        at: u32,
        error: WireError,
    },
    End,
}

impl BatchRecord {
    /// Writes an entry record's header (its payload follows).
    pub fn put_entry(out: &mut bytes::BytesMut, at: u32, size: u64, mtime_ms: i64, etag: &str) {
        let etag = &etag.as_bytes()[..etag.len().min(u16::MAX as usize)];
        out.extend_from_slice(&at.to_be_bytes());
        out.extend_from_slice(&[RECORD_ENTRY]);
        out.extend_from_slice(&size.to_be_bytes());
        out.extend_from_slice(&mtime_ms.to_be_bytes());
        out.extend_from_slice(&(etag.len() as u16).to_be_bytes());
        out.extend_from_slice(etag);
    }

    pub fn put_error(out: &mut bytes::BytesMut, at: u32, e: &StoreError) {
        let json = serde_json::to_vec(&WireError::of(e).1).unwrap_or_default();
        out.extend_from_slice(&at.to_be_bytes());
        out.extend_from_slice(&[RECORD_ERROR]);
        out.extend_from_slice(&(json.len() as u32).to_be_bytes());
        out.extend_from_slice(&json);
    }

    pub fn put_end(out: &mut bytes::BytesMut) {
        out.extend_from_slice(&BATCH_END.to_be_bytes());
    }

    /// How many bytes the record starting at `b` takes before any payload, as far as `b`
    /// tells: called with at least that many bytes, it answers the same number; with fewer,
    /// a larger one (read that many and ask again). `Err` if it is not a record.
    pub fn head_len(b: &[u8]) -> StoreResult<usize> {
        if b.len() < 4 {
            return Ok(4);
        }
        if b[..4] == BATCH_END.to_be_bytes() {
            return Ok(4);
        }
        let (fixed, at) = match b.get(4) {
            None => return Ok(5),
            Some(&RECORD_ENTRY) => (ENTRY_HEAD_BYTES, ENTRY_HEAD_BYTES - 2),
            Some(&RECORD_ERROR) => (9, 5),
            Some(k) => return Err(bad_answer(format!("a record of kind {k}"))),
        };
        if b.len() < fixed {
            return Ok(fixed);
        }
        let n = if fixed == 9 {
            u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
        } else {
            u16::from_be_bytes([b[at], b[at + 1]]) as usize
        };
        Ok(fixed + n)
    }

    /// Parses a record's header (exactly the [`Self::head_len`] bytes).
    pub fn parse(b: &[u8]) -> StoreResult<BatchRecord> {
        let be64 = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            x
        };
        let at = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if at == BATCH_END {
            return Ok(BatchRecord::End);
        }
        match b[4] {
            RECORD_ENTRY => Ok(BatchRecord::Entry {
                at,
                size: u64::from_be_bytes(be64(5)),
                mtime_ms: i64::from_be_bytes(be64(13)),
                etag: String::from_utf8_lossy(&b[ENTRY_HEAD_BYTES..]).into_owned(),
            }),
            _ => Ok(BatchRecord::Error {
                at,
                error: serde_json::from_slice(&b[9..])
                    .map_err(|e| bad_answer(format!("an error record: {e}")))?,
            }),
        }
    }
}
