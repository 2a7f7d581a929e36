//! A node's share of a batch GET (`POST /b/{bucket id}?plan|read`): the items it is a
//! committed reader for, planned and read by its own store's batch reader (one record lookup
//! per key from the record cache, neighbouring records read together and written straight
//! into the answer's frames), answered as [`BatchRecord`]s the gateway turns into TAR entries.
//!
//! An item is refused (named in the answer's head, for the gateway to ask alone, the way a GET
//! does) when this node is not a caught-up member of its PG, or when its copy is dirty (a
//! write on its way down the chain: only the tail's copy is committed). Dirtiness is judged
//! after the records are looked up, so a record the plan holds was committed: a write marks a
//! key dirty before it stores its version, and the mark is cleared once the tail has it.

use super::{Fail, Node, NodeResp};
use crate::map::ClusterMap;
use crate::placement::pg_of;
use crate::wire::{BatchRecord, WireBatchHead, WireBatchItem};
use bytes::{Bytes, BytesMut};
use http::Response;
use http_body_util::{BodyExt, StreamBody};
use packrat_store_api::StoreError;
use packrat_store_api::batch::{BatchItem, BatchOrder, EntryHead, EntrySink};

/// The answer goes to the gateway in frames of about this size.
const FRAME_BYTES: usize = 256 * 1024;
/// Frames queued between the reader and the connection.
const FRAMES_QUEUED: usize = 2;

impl Node {
    /// Plans (and with `read`, reads) the items of a batch GET this node may answer for.
    pub(super) async fn batch(
        &self,
        map: &ClusterMap,
        bid: u64,
        items: Vec<WireBatchItem>,
        order: BatchOrder,
        read: bool,
    ) -> Result<NodeResp, Fail> {
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let mut refused = Vec::new();
        // (position in the request, whether this node is the PG's tail, the item)
        let mut asked: Vec<(u32, bool, BatchItem)> = Vec::with_capacity(items.len());
        for (at, it) in items.into_iter().enumerate() {
            let at = at as u32;
            let chain = map.chain(it.pg);
            let reader = pg_of(bid, &it.key, map.pgs) == it.pg
                && chain.contains(&self.id)
                && !map.is_syncing(&self.id, it.pg);
            if !reader {
                refused.push(at);
                continue;
            }
            let tail = chain.last().is_some_and(|n| *n == self.id);
            asked.push((
                at,
                tail,
                BatchItem {
                    key: it.key,
                    member: it.member,
                    range: it.range.map(Into::into),
                    // The position travels as the entry's tag, back to `WireSink::header`.
                    tag: Some(at.to_string()),
                },
            ));
        }
        let plan = loop {
            let wanted = asked.iter().map(|(_, _, it)| it.clone()).collect();
            let plan = self.store.plan_batch(&objects, wanted, order).await?;
            let dirty = self.dirty_among(
                bid,
                asked
                    .iter()
                    .map(|(_, tail, it)| (!*tail).then_some(it.key.as_str())),
            );
            if !dirty.iter().any(|d| *d) {
                break plan;
            }
            // Rare (a write of one of the keys under way): planned again without them.
            let mut d = dirty.into_iter();
            asked.retain(|(at, _, _)| {
                let dirty = d.next().unwrap_or(false);
                if dirty {
                    refused.push(*at);
                }
                !dirty
            });
        };
        refused.sort_unstable();
        let head = serde_json::to_vec(&WireBatchHead {
            bytes: plan.bytes,
            refused,
        })
        .map_err(|e| StoreError::internal("batch answer", e))?;
        // With `read`, the first frame of the entries.
        let mut first = BytesMut::with_capacity(if read {
            FRAME_BYTES + 64 * 1024
        } else {
            4 + head.len()
        });
        first.extend_from_slice(&(head.len() as u32).to_be_bytes());
        first.extend_from_slice(&head);
        if !read {
            return Ok(super::answer(200, first.freeze()));
        }
        let (tx, rx) = tokio::sync::mpsc::channel(FRAMES_QUEUED);
        let mut sink = WireSink {
            tx,
            buf: first,
            stopped: false,
        };
        let store = self.store.clone();
        tokio::spawn(async move { store.read_batch(plan, &mut sink).await });
        let frames = futures_util::stream::unfold(rx, |mut rx| async move {
            let f = rx.recv().await?;
            Some((f.map(hyper::body::Frame::data), rx))
        });
        Ok(Response::new(StreamBody::new(frames).boxed_unsync()))
    }
}

/// The store's [`EntrySink`] for a node's batch answer: [`BatchRecord`]s laid out in frames
/// that go to the connection through a small queue.
struct WireSink {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: BytesMut,
    stopped: bool,
}

/// The item's position in the request, which [`Node::batch`] put in its tag.
fn position(e: &EntryHead<'_>) -> u32 {
    e.tag.and_then(|t| t.parse().ok()).unwrap_or(u32::MAX - 1)
}

#[async_trait::async_trait]
impl EntrySink for WireSink {
    fn stopped(&self) -> bool {
        self.stopped
    }

    fn frame_len(&self) -> usize {
        self.buf.len()
    }

    fn frame_full(&self) -> bool {
        self.buf.len() >= FRAME_BYTES
    }

    fn header(&mut self, e: EntryHead<'_>, size: u64, mtime_ms: i64, etag: &str) {
        BatchRecord::put_entry(&mut self.buf, position(&e), size, mtime_ms, etag);
    }

    fn reserve(&mut self, size: u64) -> usize {
        let at = self.buf.len();
        self.buf.resize(at + size as usize, 0);
        at
    }

    fn frame_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
    }

    fn extend(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    fn end_payload(&mut self, _size: u64) {}

    async fn flush(&mut self) {
        if self.buf.is_empty() || self.stopped {
            return;
        }
        let frame = std::mem::replace(
            &mut self.buf,
            BytesMut::with_capacity(FRAME_BYTES + 64 * 1024),
        );
        if self.tx.send(Ok(frame.freeze())).await.is_err() {
            self.stopped = true;
        }
    }

    async fn send(&mut self, data: Bytes) -> bool {
        self.flush().await;
        if self.stopped || self.tx.send(Ok(data)).await.is_err() {
            self.stopped = true;
        }
        !self.stopped
    }

    async fn error(&mut self, e: EntryHead<'_>, error: &StoreError) -> bool {
        BatchRecord::put_error(&mut self.buf, position(&e), error);
        true
    }

    /// The body ends in an error, without its end record: the gateway sees a cut answer.
    async fn cut(&mut self, error: &StoreError) {
        self.flush().await;
        let _ = self
            .tx
            .send(Err(std::io::Error::other(error.to_string())))
            .await;
        self.stopped = true;
    }

    async fn finish(&mut self) {
        if !self.stopped {
            BatchRecord::put_end(&mut self.buf);
            self.flush().await;
            self.stopped = true;
        }
    }
}
