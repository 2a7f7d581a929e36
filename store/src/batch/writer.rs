//! Batch PUT's writer: members appended as records, one group commit for all.

use crate::engine::{Engine, RecordWriter, WritePin};
use packrat_chunk_store::WriteTicket;
use packrat_index::ObjectRecord;
use packrat_store_api::batch::BatchWriter;
use packrat_store_api::{StoreError, StoreResult, Versioning};
use std::sync::Arc;

/// A batch PUT into one bucket: each object cut into records as its bytes arrive, on the
/// calling thread (a trip through the blocking pool per small object would cost more than
/// its page-cache write), all committed in one index batch.
pub(crate) struct LocalBatchWriter {
    engine: Arc<Engine>,
    bucket_id: u64,
    versioning: Versioning,
    /// Keeps the objects' segments from compaction until they are indexed.
    pin: WritePin,
    now_ms: i64,
    objects: Vec<(String, ObjectRecord)>,
    current: Option<(String, RecordWriter)>,
    last_ticket: Option<WriteTicket>,
}

impl LocalBatchWriter {
    pub(crate) fn new(engine: Arc<Engine>, bucket_id: u64, versioning: Versioning) -> Self {
        Self {
            versioning,
            pin: engine.pin_write(),
            now_ms: engine.clock.now_ms(),
            engine,
            bucket_id,
            objects: Vec::new(),
            current: None,
            last_ticket: None,
        }
    }

    fn ticket(&mut self, t: Option<WriteTicket>) {
        if let Some(t) = t {
            self.last_ticket = Some(self.last_ticket.map_or(t, |l| l.max(t)));
        }
    }
}

#[async_trait::async_trait]
impl BatchWriter for LocalBatchWriter {
    fn begin(&mut self, key: String) -> StoreResult<()> {
        if self.current.is_some() {
            return Err(StoreError::internal(
                "batch PUT",
                "an object begun before the last ended",
            ));
        }
        self.current = Some((key, RecordWriter::new()));
        Ok(())
    }

    fn write(&mut self, data: &[u8]) -> StoreResult<()> {
        let Some((_, w)) = self.current.as_mut() else {
            return Err(StoreError::internal("batch PUT", "bytes before any object"));
        };
        let t = w.push(&self.engine.chunks, data)?;
        self.ticket(t);
        Ok(())
    }

    fn end(&mut self) -> StoreResult<u64> {
        let Some((key, w)) = self.current.take() else {
            return Err(StoreError::internal(
                "batch PUT",
                "an end without an object",
            ));
        };
        let written = w.finish(&self.engine.chunks)?;
        self.ticket(written.ticket);
        let size = written.size;
        self.objects.push((
            key,
            ObjectRecord {
                record_id: written.record_id,
                size,
                etag: hex::encode(written.md5),
                last_modified_ms: self.now_ms,
                chunks: written.chunks,
                ..Default::default()
            },
        ));
        Ok(size)
    }

    fn count(&self) -> usize {
        self.objects.len()
    }

    async fn commit(self: Box<Self>) -> StoreResult<usize> {
        let Self {
            engine,
            bucket_id,
            versioning,
            pin,
            objects,
            last_ticket,
            ..
        } = *self;
        let count = objects.len();
        engine
            .commit_objects(bucket_id, objects, last_ticket, versioning)
            .await?;
        drop(pin);
        Ok(count)
    }
}
