//! The on-disk record, segment and shard header decoders, and span verification, on arbitrary bytes:
//! an error or a verified payload, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_chunk_store::{RecordLocation, SegmentHeader, Span, decode_record_header};

fuzz_target!(|data: &[u8]| {
    let _ = decode_record_header(data);
    let _ = SegmentHeader::decode(data);
    let _ = packrat_chunk_store::ec::ShardHeader::decode(data);
    if data.len() >= 12 {
        let offset = u64::from(u32::from_le_bytes([data[0], data[1], data[2], data[3]]) % 4096);
        let len = u32::from_le_bytes([data[4], data[5], data[6], data[7]]) % 8192;
        let span = Span {
            segment_id: 1,
            offset: 0,
            bytes: &data[8..],
        };
        let loc = RecordLocation {
            segment_id: 1,
            offset,
            len,
        };
        if let Ok(payload) = span.record(&loc, &[0; 16], 0) {
            assert_eq!(payload.len(), len as usize);
        }
    }
});
