//! [`WireMeta`] in binary, for the gathered lookups' answers (`POST /g`), where the JSON of
//! every answer cost a node about 5% of its CPU to write and a gateway about 4.5% of its own
//! to read under 4 KiB GETs (docs/benchmark-log.md). A gateway asks for it with
//! [`META_CODEC_HEADER`]; a node that does not know the header answers JSON, which the
//! gateway still reads (the answer kind says which), so nodes and gateways of either age
//! work together.
//!
//! Version 1, big-endian, fields in this order (`str` is `u32 length, UTF-8 bytes`; `opt X`
//! is `u8 0` for none or `u8 1` then X; `pairs` is `u32 count`, then each as `str, str`;
//! `bool` is `u8 0` or `u8 1`):
//!
//! | field | encoding |
//! |---|---|
//! | `size` | `u64` |
//! | `etag` | `str` |
//! | `put.last_modified_ms` | `i64` |
//! | `put.content_type` | `opt str` |
//! | `put.headers` | `pairs` |
//! | `put.user_meta` | `pairs` |
//! | `put.storage_class` | `opt str` |
//! | `put.tags` | `pairs` |
//! | `put.checksum` | `opt str` |
//! | `put.expected_checksum` | `opt str` |
//! | `put.content_md5` | `opt str` |
//! | `put.if_none_match_any` | `bool` |
//! | `put.if_match` | `opt str` |
//! | `put.shown_md5` | `opt str` |
//! | `put.versioning` | `opt u8` (0 enabled, 1 suspended) |
//! | `put.body_crc32c` | `opt u32` |
//! | `put.body_md5` | `opt str` |
//! | `checksum` | `opt (str, str, str)` |
//! | `part_sizes` | `u32 count`, then each `u64` |
//! | `cv` | `u64` |
//! | `stored_md5` | `opt str` |
//! | `version_seq` | `opt u64` |
//! | `version_id` | `opt str` |
//! | `marker` | `bool` |
//!
//! The encoder takes [`WireMeta`] and [`WirePut`] apart field by field and the decoder
//! builds them with every field named, so a field added to either does not compile until
//! it is given a place here; a changed layout is a new version (a new answer kind and
//! header value), while nodes still answer version 1 to gateways that ask for it.

use super::{WireMeta, WirePut, WireVersioning};
use bytes::{Buf, BufMut, BytesMut};

/// The header by which a gathered request asks for binary metadata, and its value: the
/// codec's version.
pub const META_CODEC_HEADER: &str = "x-packrat-meta-codec";
pub const META_CODEC_V1: &str = "1";

/// Writes `meta` as version 1.
pub fn encode(meta: &WireMeta, out: &mut BytesMut) {
    let WireMeta {
        size,
        etag,
        put,
        checksum,
        part_sizes,
        cv,
        stored_md5,
        version_seq,
        version_id,
        marker,
    } = meta;
    let WirePut {
        last_modified_ms,
        content_type,
        headers,
        user_meta,
        storage_class,
        tags,
        checksum: put_checksum,
        expected_checksum,
        content_md5,
        if_none_match_any,
        if_match,
        shown_md5,
        versioning,
        body_crc32c,
        body_md5,
    } = put;
    out.put_u64(*size);
    put_str(out, etag);
    out.put_i64(*last_modified_ms);
    put_opt_str(out, content_type);
    put_pairs(out, headers);
    put_pairs(out, user_meta);
    put_opt_str(out, storage_class);
    put_pairs(out, tags);
    put_opt_str(out, put_checksum);
    put_opt_str(out, expected_checksum);
    put_opt_str(out, content_md5);
    out.put_u8(u8::from(*if_none_match_any));
    put_opt_str(out, if_match);
    put_opt_str(out, shown_md5);
    put_opt(out, versioning, |out, v| {
        out.put_u8(match v {
            WireVersioning::Enabled => 0,
            WireVersioning::Suspended => 1,
        })
    });
    put_opt(out, body_crc32c, |out, c| out.put_u32(*c));
    put_opt_str(out, body_md5);
    put_opt(out, checksum, |out, (a, v, k)| {
        put_str(out, a);
        put_str(out, v);
        put_str(out, k);
    });
    out.put_u32(part_sizes.len() as u32);
    for s in part_sizes {
        out.put_u64(*s);
    }
    out.put_u64(*cv);
    put_opt_str(out, stored_md5);
    put_opt(out, version_seq, |out, s| out.put_u64(*s));
    put_opt_str(out, version_id);
    out.put_u8(u8::from(*marker));
}

/// Reads version 1; anything cut, left over or out of range is an error, never a guess.
pub fn decode(mut b: &[u8]) -> Result<WireMeta, String> {
    let r = &mut b;
    let size = u64_of(r)?;
    let etag = str_of(r)?;
    let put = WirePut {
        last_modified_ms: i64_of(r)?,
        content_type: opt_str_of(r)?,
        headers: pairs_of(r)?,
        user_meta: pairs_of(r)?,
        storage_class: opt_str_of(r)?,
        tags: pairs_of(r)?,
        checksum: opt_str_of(r)?,
        expected_checksum: opt_str_of(r)?,
        content_md5: opt_str_of(r)?,
        if_none_match_any: flag_of(r)?,
        if_match: opt_str_of(r)?,
        shown_md5: opt_str_of(r)?,
        versioning: opt_of(r, |r| match u8_of(r)? {
            0 => Ok(WireVersioning::Enabled),
            1 => Ok(WireVersioning::Suspended),
            v => Err(format!("unknown versioning {v}")),
        })?,
        body_crc32c: opt_of(r, u32_of)?,
        body_md5: opt_str_of(r)?,
    };
    let checksum = opt_of(r, |r| Ok((str_of(r)?, str_of(r)?, str_of(r)?)))?;
    let n = u32_of(r)? as usize;
    need(r, n.saturating_mul(8))?;
    let part_sizes = (0..n).map(|_| r.get_u64()).collect();
    let meta = WireMeta {
        size,
        etag,
        put,
        checksum,
        part_sizes,
        cv: u64_of(r)?,
        stored_md5: opt_str_of(r)?,
        version_seq: opt_of(r, u64_of)?,
        version_id: opt_str_of(r)?,
        marker: flag_of(r)?,
    };
    if r.has_remaining() {
        return Err(format!("{} bytes after the metadata", r.remaining()));
    }
    Ok(meta)
}

fn put_str(out: &mut BytesMut, s: &str) {
    out.put_u32(s.len() as u32);
    out.put_slice(s.as_bytes());
}

/// An `opt X`: `u8 0`, or `u8 1` then X as `put` writes it.
fn put_opt<T>(out: &mut BytesMut, v: &Option<T>, put: impl FnOnce(&mut BytesMut, &T)) {
    match v {
        None => out.put_u8(0),
        Some(v) => {
            out.put_u8(1);
            put(out, v);
        }
    }
}

fn put_opt_str(out: &mut BytesMut, s: &Option<String>) {
    put_opt(out, s, |out, s| put_str(out, s));
}

fn put_pairs(out: &mut BytesMut, pairs: &[(String, String)]) {
    out.put_u32(pairs.len() as u32);
    for (k, v) in pairs {
        put_str(out, k);
        put_str(out, v);
    }
}

fn cut() -> String {
    "cut metadata".into()
}

/// Fails unless `r` holds at least `n` more bytes.
fn need(r: &[u8], n: usize) -> Result<(), String> {
    if r.len() < n { Err(cut()) } else { Ok(()) }
}

fn u8_of(r: &mut &[u8]) -> Result<u8, String> {
    need(r, 1).map(|()| r.get_u8())
}

fn u32_of(r: &mut &[u8]) -> Result<u32, String> {
    need(r, 4).map(|()| r.get_u32())
}

fn u64_of(r: &mut &[u8]) -> Result<u64, String> {
    need(r, 8).map(|()| r.get_u64())
}

fn i64_of(r: &mut &[u8]) -> Result<i64, String> {
    need(r, 8).map(|()| r.get_i64())
}

/// A `u8` that must be 0 or 1 (a bool, or an option's presence).
fn flag_of(r: &mut &[u8]) -> Result<bool, String> {
    match u8_of(r)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(format!("a flag of {v}")),
    }
}

fn str_of(r: &mut &[u8]) -> Result<String, String> {
    let n = u32_of(r)? as usize;
    need(r, n)?;
    let (s, rest) = r.split_at(n);
    *r = rest;
    String::from_utf8(s.to_vec()).map_err(|_| "a string not UTF-8".to_string())
}

/// An `opt X`, X read by `read`.
fn opt_of<T>(
    r: &mut &[u8],
    read: impl FnOnce(&mut &[u8]) -> Result<T, String>,
) -> Result<Option<T>, String> {
    match flag_of(r)? {
        false => Ok(None),
        true => read(r).map(Some),
    }
}

fn opt_str_of(r: &mut &[u8]) -> Result<Option<String>, String> {
    opt_of(r, str_of)
}

fn pairs_of(r: &mut &[u8]) -> Result<Vec<(String, String)>, String> {
    let n = u32_of(r)? as usize;
    // Each pair takes at least 8 bytes: a count past what is left is cut input, not a
    // reason to reserve memory.
    need(r, n.saturating_mul(8))?;
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        out.push((str_of(r)?, str_of(r)?));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field set to something other than its default, so a field the codec dropped or
    /// swapped with another reads back different.
    fn full() -> WireMeta {
        WireMeta {
            size: 4096,
            etag: "\"0123abcd\"".into(),
            put: WirePut {
                last_modified_ms: -12,
                content_type: Some("image/jpeg".into()),
                headers: vec![("cache-control".into(), "no-store".into())],
                user_meta: vec![("packrat-cv".into(), "99".into()), ("é".into(), "ü".into())],
                storage_class: Some("COLD".into()),
                tags: vec![("team".into(), "vision".into())],
                checksum: Some("CRC32C".into()),
                expected_checksum: Some("AAAAAA==".into()),
                content_md5: Some("md5==".into()),
                if_none_match_any: true,
                if_match: Some("\"e\"".into()),
                shown_md5: Some("shown==".into()),
                versioning: Some(WireVersioning::Suspended),
                body_crc32c: Some(0xdead_beef),
                body_md5: Some("body==".into()),
            },
            checksum: Some(("CRC32C".into(), "v==".into(), "FULL_OBJECT".into())),
            part_sizes: vec![5 << 20, 7],
            cv: 1_733_000_000_000_001,
            stored_md5: Some("abc".into()),
            version_seq: Some(77),
            version_id: Some("v77".into()),
            marker: true,
        }
    }

    fn json(m: &WireMeta) -> serde_json::Value {
        serde_json::to_value(m).unwrap()
    }

    #[test]
    fn every_field_reads_back_as_written() {
        let m = full();
        let mut out = BytesMut::new();
        encode(&m, &mut out);
        assert_eq!(json(&decode(&out).unwrap()), json(&m));
        // And the defaults (every option none, every list empty).
        let d = WireMeta::default();
        let mut out = BytesMut::new();
        encode(&d, &mut out);
        assert_eq!(json(&decode(&out).unwrap()), json(&d));
        // A version other than suspended, which the full one carries.
        let mut e = full();
        e.put.versioning = Some(WireVersioning::Enabled);
        let mut out = BytesMut::new();
        encode(&e, &mut out);
        assert_eq!(json(&decode(&out).unwrap()), json(&e));
    }

    /// The bytes of version 1 are pinned: a change to the layout fails here, and is a new
    /// version rather than an edit of this one.
    #[test]
    fn version_1_bytes_are_pinned() {
        let m = WireMeta {
            size: 3,
            etag: "e".into(),
            cv: 5,
            put: WirePut {
                last_modified_ms: 1,
                body_crc32c: Some(2),
                ..Default::default()
            },
            ..Default::default()
        };
        let mut out = BytesMut::new();
        encode(&m, &mut out);
        let want: Vec<u8> = [
            &3u64.to_be_bytes()[..],
            &[0, 0, 0, 1, b'e'],
            &1i64.to_be_bytes(),
            &[0],          // content_type
            &[0, 0, 0, 0], // headers
            &[0, 0, 0, 0], // user_meta
            &[0],          // storage_class
            &[0, 0, 0, 0], // tags
            &[0, 0, 0],    // checksum, expected_checksum, content_md5
            &[0],          // if_none_match_any
            &[0, 0, 0],    // if_match, shown_md5, versioning
            &[1, 0, 0, 0, 2],
            &[0],          // body_md5
            &[0],          // checksum
            &[0, 0, 0, 0], // part_sizes
            &5u64.to_be_bytes(),
            &[0, 0, 0, 0], // stored_md5, version_seq, version_id, marker
        ]
        .concat();
        assert_eq!(&out[..], &want[..]);
    }

    /// Cut, padded or damaged input is an error, never metadata that differs from what was
    /// written.
    #[test]
    fn cut_or_damaged_input_is_refused() {
        let m = full();
        let mut out = BytesMut::new();
        encode(&m, &mut out);
        for n in 0..out.len() {
            assert!(decode(&out[..n]).is_err(), "cut at {n}");
        }
        let mut padded = out.to_vec();
        padded.push(0);
        assert!(decode(&padded).is_err());
        let want = json(&m);
        for i in 0..out.len() {
            let mut bad = out.to_vec();
            bad[i] ^= 0x80;
            if let Ok(read) = decode(&bad) {
                // A flipped bit inside a number or a string's bytes can read as other valid
                // metadata (the answer's CRC32C is what catches those), never as the same.
                assert_ne!(json(&read), want, "byte {i}");
            }
        }
    }
}
