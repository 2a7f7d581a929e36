//! The on-disk formats of the chunk store, version 1. Frozen: a change is a new version that
//! still reads this one.
//!
//! Segment header, at offset 0 of every segment file (32 bytes):
//!
//! | offset | bytes | field                                            |
//! |-------:|------:|--------------------------------------------------|
//! | 0      | 4     | magic `PKRS`                                     |
//! | 4      | 2     | format version, u16 LE (1)                       |
//! | 6      | 2     | reserved, zero                                   |
//! | 8      | 8     | segment id, u64 LE                               |
//! | 16     | 8     | created, unix milliseconds, u64 LE               |
//! | 24     | 4     | reserved, zero                                   |
//! | 28     | 4     | crc32c of bytes 0..28, u32 LE                    |
//!
//! Record ("needle") header, followed directly by `payload length` bytes (40 bytes):
//!
//! | offset | bytes | field                                            |
//! |-------:|------:|--------------------------------------------------|
//! | 0      | 4     | magic `PKRN`                                     |
//! | 4      | 2     | format version, u16 LE (1)                       |
//! | 6      | 2     | reserved, zero                                   |
//! | 8      | 16    | object id (random, one per stored object version)|
//! | 24     | 4     | chunk index within the object, u32 LE            |
//! | 28     | 4     | payload length, u32 LE                           |
//! | 32     | 4     | crc32c of the payload, u32 LE                    |
//! | 36     | 4     | crc32c of header bytes 0..36, u32 LE             |
//!
//! The header has its own checksum so a scan can trust the length before reading the payload.

use crate::crc32c;

pub const SEGMENT_HEADER_BYTES: usize = 32;
pub const RECORD_HEADER_BYTES: usize = 40;

const SEGMENT_MAGIC: [u8; 4] = *b"PKRS";
const RECORD_MAGIC: [u8; 4] = *b"PKRN";
const FORMAT_V1: u16 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    pub segment_id: u64,
    pub created_unix_ms: u64,
}

impl SegmentHeader {
    pub fn encode(&self) -> [u8; SEGMENT_HEADER_BYTES] {
        let mut b = [0u8; SEGMENT_HEADER_BYTES];
        b[0..4].copy_from_slice(&SEGMENT_MAGIC);
        b[4..6].copy_from_slice(&FORMAT_V1.to_le_bytes());
        b[8..16].copy_from_slice(&self.segment_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.created_unix_ms.to_le_bytes());
        let crc = crc32c(&b[0..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> Result<Self, String> {
        if b.len() < SEGMENT_HEADER_BYTES {
            return Err("short segment header".into());
        }
        if b[0..4] != SEGMENT_MAGIC {
            return Err("bad segment magic".into());
        }
        if crc32c(&b[0..28]) != le_u32(&b[28..32]) {
            return Err("segment header crc mismatch".into());
        }
        let version = u16::from_le_bytes([b[4], b[5]]);
        if version != FORMAT_V1 {
            return Err(format!("unknown segment format version {version}"));
        }
        Ok(Self {
            segment_id: le_u64(&b[8..16]),
            created_unix_ms: le_u64(&b[16..24]),
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordHeader {
    pub object_id: [u8; 16],
    pub chunk_index: u32,
    pub payload_len: u32,
    pub payload_crc32c: u32,
}

impl RecordHeader {
    pub fn encode(&self) -> [u8; RECORD_HEADER_BYTES] {
        let mut b = [0u8; RECORD_HEADER_BYTES];
        b[0..4].copy_from_slice(&RECORD_MAGIC);
        b[4..6].copy_from_slice(&FORMAT_V1.to_le_bytes());
        b[8..24].copy_from_slice(&self.object_id);
        b[24..28].copy_from_slice(&self.chunk_index.to_le_bytes());
        b[28..32].copy_from_slice(&self.payload_len.to_le_bytes());
        b[32..36].copy_from_slice(&self.payload_crc32c.to_le_bytes());
        let crc = crc32c(&b[0..36]);
        b[36..40].copy_from_slice(&crc.to_le_bytes());
        b
    }
}

/// Decodes and verifies a record header (magic, version, header checksum).
pub fn decode_record_header(b: &[u8]) -> Result<RecordHeader, String> {
    if b.len() < RECORD_HEADER_BYTES {
        return Err("short record header".into());
    }
    if b[0..4] != RECORD_MAGIC {
        return Err("bad record magic".into());
    }
    if crc32c(&b[0..36]) != le_u32(&b[36..40]) {
        return Err("record header crc mismatch".into());
    }
    let version = u16::from_le_bytes([b[4], b[5]]);
    if version != FORMAT_V1 {
        return Err(format!("unknown record format version {version}"));
    }
    let mut object_id = [0u8; 16];
    object_id.copy_from_slice(&b[8..24]);
    Ok(RecordHeader {
        object_id,
        chunk_index: le_u32(&b[24..28]),
        payload_len: le_u32(&b[28..32]),
        payload_crc32c: le_u32(&b[32..36]),
    })
}

fn le_u32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Pins the v1 byte layout: if this test changes, a new format version is needed.
    #[test]
    fn record_header_golden_bytes() {
        let h = RecordHeader {
            object_id: [0xab; 16],
            chunk_index: 2,
            payload_len: 5,
            payload_crc32c: crc32c(b"hello"),
        };
        let b = h.encode();
        assert_eq!(&b[0..8], &[b'P', b'K', b'R', b'N', 1, 0, 0, 0]);
        assert_eq!(&b[24..32], &[2, 0, 0, 0, 5, 0, 0, 0]);
        assert_eq!(le_u32(&b[32..36]), 0x9a71bb4c, "crc32c(\"hello\")");
        assert_eq!(decode_record_header(&b).unwrap(), h);
    }

    #[test]
    fn segment_header_golden_bytes() {
        let h = SegmentHeader {
            segment_id: 0x0102,
            created_unix_ms: 7,
        };
        let b = h.encode();
        assert_eq!(
            &b[0..16],
            &[b'P', b'K', b'R', b'S', 1, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(SegmentHeader::decode(&b).unwrap(), h);
    }

    proptest! {
        #[test]
        fn record_header_roundtrip_and_any_flip_detected(
            id in any::<[u8; 16]>(), idx in any::<u32>(), len in any::<u32>(), crc in any::<u32>(),
            flip in 0usize..RECORD_HEADER_BYTES * 8,
        ) {
            let h = RecordHeader { object_id: id, chunk_index: idx, payload_len: len, payload_crc32c: crc };
            let mut b = h.encode();
            prop_assert_eq!(decode_record_header(&b).unwrap(), h);
            b[flip / 8] ^= 1 << (flip % 8);
            prop_assert!(decode_record_header(&b).is_err());
        }

        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = decode_record_header(&bytes);
            let _ = SegmentHeader::decode(&bytes);
        }
    }
}
