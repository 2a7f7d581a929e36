//! Standalone segment files (the tier mover's) and segment scans (start-up and offline verify).

use crate::io::SegmentIo;
use crate::record::{
    RECORD_HEADER_BYTES, RecordHeader, SEGMENT_HEADER_BYTES, SegmentHeader, decode_record_header,
};
use crate::{ChunkStoreError, RECORD_PAYLOAD_BYTES_MAX, RecordLocation, Result, crc32c, io_err};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The payload length and encoded header of a record (refusing oversized payloads): the one
/// place both the store's appends and standalone segment files build records.
pub(crate) fn record_header(
    object_id: [u8; 16],
    chunk_index: u32,
    payload: &[u8],
) -> Result<(u32, [u8; RECORD_HEADER_BYTES])> {
    let len = u32::try_from(payload.len())
        .ok()
        .filter(|&l| l <= RECORD_PAYLOAD_BYTES_MAX)
        .ok_or(ChunkStoreError::RecordTooLarge(payload.len()))?;
    let header = RecordHeader {
        object_id,
        chunk_index,
        payload_len: len,
        payload_crc32c: crc32c(payload),
    }
    .encode();
    Ok((len, header))
}

/// Writes one standalone segment file (segment header, then records) outside the store's own
/// directories: the tier mover builds the segments it sends to slower tiers with it, in the
/// same format, so their records verify exactly like local ones.
pub struct SegmentFileWriter {
    io: Arc<dyn SegmentIo>,
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) id: u64,
    pub(crate) offset: u64,
}

impl SegmentFileWriter {
    /// Creates (or truncates) the file at `path` through `io` (a store's: [`crate::ChunkStore::io`]).
    pub fn create(io: Arc<dyn SegmentIo>, path: &Path, id: u64) -> Result<Self> {
        let file = io.create(path).map_err(|e| io_err(path, e))?;
        let header = SegmentHeader {
            segment_id: id,
            created_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        io.write_at(&file, path, &[&header.encode()], 0)
            .map_err(|e| io_err(path, e))?;
        Ok(Self {
            io,
            file,
            path: path.to_path_buf(),
            id,
            offset: SEGMENT_HEADER_BYTES as u64,
        })
    }

    /// Bytes written so far (the segment's length).
    pub fn len(&self) -> u64 {
        self.offset
    }

    pub fn is_empty(&self) -> bool {
        self.offset <= SEGMENT_HEADER_BYTES as u64
    }

    pub fn append(
        &mut self,
        object_id: [u8; 16],
        chunk_index: u32,
        payload: &[u8],
    ) -> Result<RecordLocation> {
        let (len, header) = record_header(object_id, chunk_index, payload)?;
        self.io
            .write_at(&self.file, &self.path, &[&header, payload], self.offset)
            .map_err(|e| io_err(&self.path, e))?;
        let loc = RecordLocation {
            segment_id: self.id,
            offset: self.offset,
            len,
        };
        self.offset += RECORD_HEADER_BYTES as u64 + u64::from(len);
        Ok(loc)
    }

    /// Makes the file durable and returns its length.
    pub fn finish(self) -> Result<u64> {
        self.io
            .sync(&self.file, &self.path, true)
            .map_err(|e| io_err(&self.path, e))?;
        Ok(self.offset)
    }
}

/// The outcome of scanning a segment file from the start.
#[derive(Debug, Default)]
pub struct SegmentScan {
    pub records: Vec<(RecordLocation, RecordHeader)>,
    /// Bytes after the last valid record (a torn write, or never written).
    pub torn_tail_bytes: u64,
}

/// Walks a segment record by record, verifying every header and payload checksum, and stops at
/// the first record that does not verify. Used at start-up and by offline verification.
pub fn scan_segment(path: &Path) -> Result<SegmentScan> {
    let file = File::open(path).map_err(|e| io_err(path, e))?;
    let size = file.metadata().map_err(|e| io_err(path, e))?.len();
    let mut hdr = [0u8; SEGMENT_HEADER_BYTES];
    file.read_exact_at(&mut hdr, 0)
        .map_err(|e| io_err(path, e))?;
    let seg = SegmentHeader::decode(&hdr).map_err(|reason| ChunkStoreError::Corrupt {
        segment_id: 0,
        offset: 0,
        reason,
    })?;
    let mut scan = SegmentScan::default();
    let mut offset = SEGMENT_HEADER_BYTES as u64;
    let mut rh = [0u8; RECORD_HEADER_BYTES];
    let mut payload = Vec::new();
    while offset + RECORD_HEADER_BYTES as u64 <= size {
        if file.read_exact_at(&mut rh, offset).is_err() {
            break;
        }
        let Ok(header) = decode_record_header(&rh) else {
            break;
        };
        let end = offset + RECORD_HEADER_BYTES as u64 + u64::from(header.payload_len);
        if end > size {
            break;
        }
        payload.resize(header.payload_len as usize, 0);
        if file
            .read_exact_at(&mut payload, offset + RECORD_HEADER_BYTES as u64)
            .is_err()
            || crc32c(&payload) != header.payload_crc32c
        {
            break;
        }
        scan.records.push((
            RecordLocation {
                segment_id: seg.segment_id,
                offset,
                len: header.payload_len,
            },
            header,
        ));
        offset = end;
    }
    scan.torn_tail_bytes = size - offset;
    Ok(scan)
}
