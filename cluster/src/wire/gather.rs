//! Lookups gathered into one request (`POST /g`): the items in, one answer each out.

use super::*;

/// Most lookups in one gathered request (`POST /g`).
pub const GATHER_ITEMS_MAX: usize = 256;

const GATHER_FOUND: u8 = 0;

const GATHER_FOUND_BYTES: u8 = 1;

const GATHER_MISSING: u8 = 2;

const GATHER_ALONE: u8 = 3;

/// As `GATHER_FOUND` and `GATHER_FOUND_BYTES`, the metadata in [`meta_codec`]'s version 1,
/// answered to a gateway that asks for it.
const GATHER_FOUND_BIN: u8 = 4;

const GATHER_FOUND_BYTES_BIN: u8 = 5;

/// One object lookup of a gathered request (`POST /g`): the GETs and HEADs a gateway has for
/// one node while other lookups to it are under way go to it as one request (see
/// `ClusterStore::lookup`). Written `u64 bucket id, u32 PG, u64 inline limit, u32 key length,
/// key`, big-endian, one after another.
#[derive(Debug, Clone, PartialEq)]
pub struct GatherItem {
    pub bid: u64,
    pub pg: u32,
    /// The object's bytes come with its metadata when it has 1 to this many.
    pub inline: u64,
    pub key: String,
}

impl GatherItem {
    pub fn put(&self, out: &mut bytes::BytesMut) {
        out.extend_from_slice(&self.bid.to_be_bytes());
        out.extend_from_slice(&self.pg.to_be_bytes());
        out.extend_from_slice(&self.inline.to_be_bytes());
        out.extend_from_slice(&(self.key.len() as u32).to_be_bytes());
        out.extend_from_slice(self.key.as_bytes());
    }

    /// The items of a request body, at most [`GATHER_ITEMS_MAX`].
    pub fn parse_all(mut b: &[u8]) -> StoreResult<Vec<GatherItem>> {
        let bad = |what: &str| StoreError::Invalid(format!("bad gathered lookup: {what}"));
        let mut items = Vec::new();
        while !b.is_empty() {
            if items.len() == GATHER_ITEMS_MAX {
                return Err(bad("too many items"));
            }
            let head = b.get(..24).ok_or_else(|| bad("cut"))?;
            let n = u32::from_be_bytes(head[20..24].try_into().unwrap_or_default()) as usize;
            let key = b.get(24..24 + n).ok_or_else(|| bad("cut key"))?;
            items.push(GatherItem {
                bid: u64::from_be_bytes(head[..8].try_into().unwrap_or_default()),
                pg: u32::from_be_bytes(head[8..12].try_into().unwrap_or_default()),
                inline: u64::from_be_bytes(head[12..20].try_into().unwrap_or_default()),
                key: std::str::from_utf8(key)
                    .map_err(|_| bad("key not UTF-8"))?
                    .to_string(),
            });
            b = &b[24 + n..];
        }
        Ok(items)
    }
}

/// A node's answer to one [`GatherItem`], in the order asked: `u8 kind, u32 length, u64
/// byte count`, then `length` bytes (the [`WireMeta`] as JSON, or in [`meta_codec`]'s binary
/// when the request asked for it with [`meta_codec::META_CODEC_HEADER`], or why the item must
/// be asked alone) and the object's bytes when it came with them.
#[derive(Debug)]
pub enum Gathered {
    Found {
        meta: Box<WireMeta>,
        inline: Option<Bytes>,
    },
    /// No such key (or bucket) on the node: the answer a lookup alone gets as 404.
    Missing,
    /// Anything else (a dirty copy, a node not a reader, an error): the gateway asks for this
    /// one alone, where the refusal is followed (to the tail, or another member) or the
    /// error answered.
    Alone(String),
}

impl Gathered {
    pub fn put_found(out: &mut bytes::BytesMut, meta: &[u8], bytes: Option<&[u8]>) {
        Self::put_found_as(out, (GATHER_FOUND, GATHER_FOUND_BYTES), bytes, |o| {
            o.extend_from_slice(meta)
        });
    }

    /// As [`Gathered::put_found`], the metadata written in binary ([`meta_codec`]) straight
    /// into `out`.
    pub fn put_found_bin(out: &mut bytes::BytesMut, meta: &WireMeta, bytes: Option<&[u8]>) {
        Self::put_found_as(
            out,
            (GATHER_FOUND_BIN, GATHER_FOUND_BYTES_BIN),
            bytes,
            |o| meta_codec::encode(meta, o),
        );
    }

    /// A found answer: `kinds` without and with the object's bytes, the metadata as
    /// `write_meta` writes it (its length filled in after).
    fn put_found_as(
        out: &mut bytes::BytesMut,
        kinds: (u8, u8),
        bytes: Option<&[u8]>,
        write_meta: impl FnOnce(&mut bytes::BytesMut),
    ) {
        out.extend_from_slice(&[if bytes.is_some() { kinds.1 } else { kinds.0 }]);
        let bytes = bytes.unwrap_or_default();
        let len_at = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        let meta_at = out.len();
        write_meta(out);
        let len = (out.len() - meta_at) as u32;
        out[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
        out.extend_from_slice(bytes);
    }

    pub fn put_missing(out: &mut bytes::BytesMut) {
        out.extend_from_slice(&[GATHER_MISSING]);
        out.extend_from_slice(&[0; 12]);
    }

    pub fn put_alone(out: &mut bytes::BytesMut, why: &str) {
        out.extend_from_slice(&[GATHER_ALONE]);
        out.extend_from_slice(&(why.len() as u32).to_be_bytes());
        out.extend_from_slice(&0u64.to_be_bytes());
        out.extend_from_slice(why.as_bytes());
    }

    /// The `n` answers of a node's body (an object's bytes are slices of it, not copies).
    pub fn parse_all(b: Bytes, n: usize) -> StoreResult<Vec<Gathered>> {
        let cut = || StoreError::Unavailable("storage node: a cut gathered answer".into());
        let mut out = Vec::with_capacity(n);
        let mut at = 0;
        while out.len() < n {
            let head = b.get(at..at + 13).ok_or_else(cut)?;
            let len = u32::from_be_bytes(head[1..5].try_into().unwrap_or_default()) as usize;
            let count = u64::from_be_bytes(head[5..13].try_into().unwrap_or_default());
            let text_end = at + 13 + len;
            let end = usize::try_from(count)
                .ok()
                .and_then(|c| text_end.checked_add(c))
                .filter(|e| *e <= b.len())
                .ok_or_else(cut)?;
            let text = &b[at + 13..text_end];
            out.push(match head[0] {
                GATHER_FOUND | GATHER_FOUND_BYTES => Gathered::Found {
                    meta: Box::new(
                        serde_json::from_slice(text)
                            .map_err(|e| StoreError::internal("storage node answer", e))?,
                    ),
                    inline: (head[0] == GATHER_FOUND_BYTES).then(|| b.slice(text_end..end)),
                },
                GATHER_FOUND_BIN | GATHER_FOUND_BYTES_BIN => Gathered::Found {
                    meta: Box::new(
                        meta_codec::decode(text)
                            .map_err(|e| StoreError::internal("storage node answer", e))?,
                    ),
                    inline: (head[0] == GATHER_FOUND_BYTES_BIN).then(|| b.slice(text_end..end)),
                },
                GATHER_MISSING => Gathered::Missing,
                GATHER_ALONE => Gathered::Alone(String::from_utf8_lossy(text).into_owned()),
                k => {
                    return Err(StoreError::internal(
                        "storage node answer",
                        format!("unknown gathered answer kind {k}"),
                    ));
                }
            });
            at = end;
        }
        if at != b.len() {
            return Err(StoreError::internal(
                "storage node answer",
                "bytes after the last gathered answer",
            ));
        }
        Ok(out)
    }
}
