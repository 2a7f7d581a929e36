//! The on-disk decoders on arbitrary bytes: record, segment and shard headers, span
//! verification, and every index record (the RocksDB values of buckets, objects, uploads,
//! parts, TAR members and keys). An error or a value, never a panic; an index record that
//! decodes encodes to bytes that decode to the same record.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_chunk_store::{RecordLocation, SegmentHeader, Span, decode_record_header};
use packrat_index::records::{self, Record};
use packrat_index::{
    BucketRecord, KeyRecord, MemberRecord, ObjectRecord, PartRecord, TarIndexRecord, UploadRecord,
};

fn index_record<T: Record + PartialEq + std::fmt::Debug>(data: &[u8]) {
    if let Ok(r) = records::decode::<T>(data) {
        let again: T = records::decode(&records::encode(&r)).expect("an encoded record decodes");
        assert_eq!(again, r);
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = decode_record_header(data);
    let _ = SegmentHeader::decode(data);
    let _ = packrat_chunk_store::ec::ShardHeader::decode(data);
    index_record::<ObjectRecord>(data);
    index_record::<BucketRecord>(data);
    index_record::<UploadRecord>(data);
    index_record::<PartRecord>(data);
    index_record::<MemberRecord>(data);
    index_record::<TarIndexRecord>(data);
    index_record::<KeyRecord>(data);
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
