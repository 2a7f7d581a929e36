//! Records as objects are cut into them: written out in order (`RecordWriter`), read back
//! verified (`ObjectReader`).

use super::*;

/// Cuts a stream of bytes into chunk-store records synchronously, on the calling thread: for
/// callers that produce many small objects from one request (TAR extraction), where a trip
/// through the blocking pool per object would cost more than the page-cache write.
pub struct RecordWriter {
    record_id: [u8; 16],
    buf: Vec<u8>,
    chunks: Vec<ChunkRef>,
    size: u64,
    md5: Md5,
}

impl Default for RecordWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl RecordWriter {
    pub fn new() -> Self {
        Self {
            record_id: rand::random(),
            buf: Vec::new(),
            chunks: Vec::new(),
            size: 0,
            md5: Md5::new(),
        }
    }

    fn flush(&mut self, store: &ChunkStore) -> EngineResult<Option<WriteTicket>> {
        if self.buf.is_empty() {
            return Ok(None);
        }
        let idx = self.chunks.len() as u32;
        let (loc, ticket) = store.append(self.record_id, idx, &self.buf)?;
        self.buf.clear();
        self.chunks.push(ChunkRef {
            segment_id: loc.segment_id,
            offset: loc.offset,
            len: loc.len,
        });
        Ok(Some(ticket))
    }

    /// Adds bytes, appending each full chunk; returns the ticket of the last append, if any.
    pub fn push(
        &mut self,
        store: &ChunkStore,
        mut data: &[u8],
    ) -> EngineResult<Option<WriteTicket>> {
        self.md5.update(data);
        self.size += data.len() as u64;
        let mut ticket = None;
        while !data.is_empty() {
            let take = (CHUNK_BYTES - self.buf.len()).min(data.len());
            self.buf.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.buf.len() == CHUNK_BYTES {
                ticket = self.flush(store)?;
            }
        }
        Ok(ticket)
    }

    /// Appends the remainder and returns the written object's identity, chunks, size and MD5,
    /// with the ticket of its last append (`None` if this call appended nothing).
    pub fn finish(mut self, store: &ChunkStore) -> EngineResult<Written> {
        let ticket = self.flush(store)?;
        Ok(Written {
            _pin: None,
            record_id: self.record_id,
            chunks: self.chunks,
            ticket,
            size: self.size,
            md5: self.md5.finalize().into(),
            checksum: None,
        })
    }
}

/// Streams bytes `[start, end)` of an object, one verified chunk at a time.
pub struct ObjectReader {
    engine: Arc<Engine>,
    obj: Arc<ObjectRecord>,
    chunk: usize,
    chunk_start: u64,
    pos: u64,
    end: u64,
}

impl ObjectReader {
    #[inline]
    pub fn new(engine: Arc<Engine>, obj: Arc<ObjectRecord>, start: u64, end: u64) -> Self {
        let mut chunk = 0;
        let mut chunk_start = 0u64;
        while chunk < obj.chunks.len() && chunk_start + u64::from(obj.chunks[chunk].len) <= start {
            chunk_start += u64::from(obj.chunks[chunk].len);
            chunk += 1;
        }
        Self {
            engine,
            obj,
            chunk,
            chunk_start,
            pos: start,
            end,
        }
    }

    /// Whether the rest of the range lies in one chunk (one piece, one read).
    pub fn is_single_piece(&self) -> bool {
        match self.obj.chunks.get(self.chunk) {
            None => true,
            Some(c) => self.end <= self.chunk_start + u64::from(c.len),
        }
    }

    #[inline]
    pub async fn next(&mut self) -> EngineResult<Option<Bytes>> {
        if self.pos >= self.end || self.chunk >= self.obj.chunks.len() {
            return Ok(None);
        }
        let data = self.engine.read_chunk(&self.obj, self.chunk).await?;
        let from = (self.pos - self.chunk_start) as usize;
        let to = ((self.end - self.chunk_start) as usize).min(data.len());
        let out = data.slice(from..to);
        self.chunk_start += data.len() as u64;
        self.chunk += 1;
        self.pos = self.chunk_start.min(self.end);
        Ok(Some(out))
    }
}

/// A copy reads its payload from an existing object.
#[async_trait::async_trait]
impl ByteSource for ObjectReader {
    async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
        Ok(self.next().await?)
    }

    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }
}
