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
use crate::wire::{BATCH_CRC_HEADER, BatchRecord, WireBatchHead, WireBatchItem, put_crc_of};
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
    /// Whether this node may read `key` of `pg` for a batch: a caught-up member of the key's
    /// PG by `map`. Answers whether it is the PG's tail (whose copy is committed by
    /// definition; another member's copy is checked for dirtiness after the plan).
    pub(super) fn batch_reader(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
    ) -> Option<bool> {
        let chain = map.chain(pg);
        let reader = pg_of(bid, key, map.pgs) == pg
            && chain.contains(&self.id)
            && !map.is_syncing(&self.id, pg);
        reader.then(|| chain.last().is_some_and(|n| *n == self.id))
    }

    /// Plans (and with `read`, reads) the items of a batch GET this node may answer for; with
    /// `crc`, the answer's parts are each followed by their CRC32C ([`BATCH_CRC_HEADER`]).
    pub(super) async fn batch(
        &self,
        map: &ClusterMap,
        bid: u64,
        items: Vec<WireBatchItem>,
        order: BatchOrder,
        read: bool,
        crc: bool,
    ) -> Result<NodeResp, Fail> {
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let mut refused = Vec::new();
        // (position in the request, whether this node is the PG's tail, the item)
        let mut asked: Vec<(u32, bool, BatchItem)> = Vec::with_capacity(items.len());
        for (at, it) in items.into_iter().enumerate() {
            let at = at as u32;
            let Some(tail) = self.batch_reader(map, bid, it.pg, &it.key) else {
                refused.push(at);
                continue;
            };
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
        if crc {
            put_crc_of(&mut first, 4);
        }
        let mut r = if read {
            let (tx, rx) = tokio::sync::mpsc::channel(FRAMES_QUEUED);
            let mut sink = WireSink {
                tx,
                buf: first,
                stopped: false,
                crc,
                reserved: Vec::new(),
                open: None,
                payload_in_frame: false,
            };
            let store = self.store.clone();
            tokio::spawn(async move { store.read_batch(plan, &mut sink).await });
            let frames = futures_util::stream::unfold(rx, |mut rx| async move {
                let f = rx.recv().await?;
                Some((f.map(hyper::body::Frame::data), rx))
            });
            Response::new(StreamBody::new(frames).boxed_unsync())
        } else {
            super::answer(200, first.freeze())
        };
        if crc {
            r.headers_mut()
                .insert(BATCH_CRC_HEADER, http::HeaderValue::from_static("1"));
        }
        Ok(r)
    }
}

/// The store's [`EntrySink`] for a node's batch answer: [`BatchRecord`]s laid out in frames
/// that go to the connection through a small queue.
struct WireSink {
    tx: tokio::sync::mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: BytesMut,
    stopped: bool,
    /// Whether each record's header and each payload are followed by their CRC32C.
    crc: bool,
    /// Payloads whose place in the frame was reserved, to be read into it later: where each
    /// lies, where its CRC goes (written when the frame is sent: it is filled by then), and
    /// the CRC the store checked it against, if told (then it is not hashed again).
    reserved: Vec<(usize, usize, Option<u32>)>,
    /// The payload being copied in or sent: where it starts in the frame, and the CRC of
    /// what of it was sent before.
    open: Option<(usize, crc_fast::Digest)>,
    /// Whether the frame holds payload bytes.
    payload_in_frame: bool,
}

impl WireSink {
    /// Sends `b` to the connection; `b` with object bytes in it changes on its way while
    /// faults are set, after its CRCs were taken (see `Node::hop_faults`).
    async fn send_on(&mut self, b: Bytes, has_payload: bool) {
        let b = if has_payload {
            super::flip_next(&super::ANSWER_FLIPS, b)
        } else {
            b
        };
        if self.tx.send(Ok(b)).await.is_err() {
            self.stopped = true;
        }
    }
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
        let from = self.buf.len();
        BatchRecord::put_entry(&mut self.buf, position(&e), size, mtime_ms, etag);
        if self.crc {
            put_crc_of(&mut self.buf, from);
            self.open = Some((self.buf.len(), crate::wire::crc32c_digest()));
        }
    }

    fn reserve(&mut self, size: u64) -> usize {
        let at = self.buf.len();
        let end = at + size as usize;
        self.payload_in_frame |= size > 0;
        if self.crc {
            self.open = None;
            self.reserved.push((at, end, None));
            self.buf.resize(end + 4, 0);
        } else {
            self.buf.resize(end, 0);
        }
        at
    }

    fn frame_mut(&mut self) -> &mut BytesMut {
        &mut self.buf
    }

    fn truncate(&mut self, len: usize) {
        self.buf.truncate(len);
        self.reserved.retain(|&(_, crc_at, _)| crc_at + 4 <= len);
        self.open = self.open.take().filter(|(from, _)| *from <= len);
    }

    fn extend(&mut self, data: &[u8]) {
        self.payload_in_frame |= !data.is_empty();
        self.buf.extend_from_slice(data);
    }

    fn payload_crc32c(&mut self, at: usize, crc: u32) {
        // Reserved in frame order, so sorted by place.
        if let Ok(i) = self.reserved.binary_search_by_key(&at, |r| r.0) {
            self.reserved[i].2 = Some(crc);
        }
    }

    fn end_payload(&mut self, _size: u64) {
        if let Some((from, mut digest)) = self.open.take() {
            digest.update(&self.buf[from..]);
            let crc = digest.finalize() as u32;
            self.buf.extend_from_slice(&crc.to_be_bytes());
        }
    }

    async fn flush(&mut self) {
        if self.buf.is_empty() || self.stopped {
            return;
        }
        for (from, crc_at, told) in self.reserved.drain(..) {
            let crc = told.unwrap_or_else(|| crate::wire::body_crc32c(&self.buf[from..crc_at]));
            self.buf[crc_at..crc_at + 4].copy_from_slice(&crc.to_be_bytes());
        }
        if let Some((from, digest)) = self.open.as_mut() {
            digest.update(&self.buf[*from..]);
            *from = 0;
        }
        let frame = std::mem::replace(
            &mut self.buf,
            BytesMut::with_capacity(FRAME_BYTES + 64 * 1024),
        );
        let has_payload = std::mem::take(&mut self.payload_in_frame);
        self.send_on(frame.freeze(), has_payload).await;
    }

    async fn send(&mut self, data: Bytes) -> bool {
        self.flush().await;
        if let Some((_, digest)) = self.open.as_mut() {
            digest.update(&data);
        }
        if !self.stopped {
            self.send_on(data, true).await;
        }
        !self.stopped
    }

    async fn error(&mut self, e: EntryHead<'_>, error: &StoreError) -> bool {
        let from = self.buf.len();
        BatchRecord::put_error(&mut self.buf, position(&e), error);
        if self.crc {
            put_crc_of(&mut self.buf, from);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::NodeStream;
    use http_body_util::{Either, Full};

    fn at(n: u32) -> String {
        n.to_string()
    }

    fn entry(tag: &str) -> EntryHead<'_> {
        EntryHead {
            name: "k",
            tag: Some(tag),
        }
    }

    /// A node's answer laid out as the store lays one out: an entry copied in, one read into
    /// a reserved place (its CRC `told` by the store, or not), a layout dropped back and
    /// answered with an error, one sent as buffers across frames, the end.
    async fn answer(told: Option<u32>) -> Bytes {
        let (tx, mut rx) = tokio::sync::mpsc::channel(64);
        let head = serde_json::to_vec(&WireBatchHead {
            bytes: 16,
            refused: vec![9],
        })
        .unwrap();
        let mut first = BytesMut::new();
        first.extend_from_slice(&(head.len() as u32).to_be_bytes());
        first.extend_from_slice(&head);
        put_crc_of(&mut first, 4);
        let mut sink = WireSink {
            tx,
            buf: first,
            stopped: false,
            crc: true,
            reserved: Vec::new(),
            open: None,
            payload_in_frame: false,
        };
        let (t0, t1, t2, t3) = (at(0), at(1), at(2), at(3));
        sink.header(entry(&t0), 5, 7, "e0");
        sink.extend(b"hello");
        sink.end_payload(5);
        sink.header(entry(&t1), 4, 7, "e1");
        let dst = sink.reserve(4);
        let base = sink.frame_len();
        sink.header(entry(&t2), 3, 7, "e2");
        let dropped = sink.reserve(3);
        sink.payload_crc32c(dropped, 0);
        sink.truncate(base);
        sink.frame_mut()[dst..dst + 4].copy_from_slice(b"abcd");
        if let Some(crc) = told {
            sink.payload_crc32c(dst, crc);
        }
        sink.error(entry(&t2), &StoreError::NoSuchKey).await;
        sink.header(entry(&t3), 7, 7, "e3");
        sink.send(Bytes::from_static(b"big")).await;
        sink.extend(b"g");
        sink.flush().await;
        sink.send(Bytes::from_static(b"est")).await;
        sink.end_payload(7);
        sink.finish().await;
        drop(sink);
        let mut out = BytesMut::new();
        while let Some(f) = rx.recv().await {
            out.extend_from_slice(&f.unwrap());
        }
        out.freeze()
    }

    /// The records of an answer, read as the gateway reads them.
    async fn read(
        body: Bytes,
    ) -> packrat_store_api::StoreResult<Vec<(u32, Result<Bytes, String>)>> {
        let mut s = NodeStream::start(Either::Right(Either::Left(Full::new(body))), true).await?;
        assert_eq!(s.head.refused, vec![9]);
        let mut out = Vec::new();
        loop {
            match s.next_record().await? {
                BatchRecord::End => return Ok(out),
                BatchRecord::Error { at, error } => out.push((at, Err(error.kind))),
                BatchRecord::Entry { at, size, .. } => {
                    let mut got = BytesMut::new();
                    while got.len() < size as usize {
                        s.fill(1).await?;
                        got.extend_from_slice(&s.take_payload(size as usize - got.len()));
                    }
                    s.end_payload().await?;
                    out.push((at, Ok(got.freeze())));
                }
            }
        }
    }

    #[tokio::test]
    async fn every_part_of_a_batch_answer_is_checked() {
        let body = answer(None).await;
        let got = read(body.clone()).await.unwrap();
        let want: Vec<(u32, Result<Bytes, String>)> = vec![
            (0, Ok(Bytes::from_static(b"hello"))),
            (1, Ok(Bytes::from_static(b"abcd"))),
            (
                2,
                Err(crate::wire::WireError::of(&StoreError::NoSuchKey).1.kind),
            ),
            (3, Ok(Bytes::from_static(b"biggest"))),
        ];
        assert_eq!(got, want);
        // Any byte changed anywhere (the head, a record's header, a payload, a CRC, the end)
        // fails the read rather than giving other records.
        for i in 0..body.len() {
            let mut damaged = body.to_vec();
            damaged[i] ^= 0x20;
            let r = read(Bytes::from(damaged)).await;
            assert!(r.is_err(), "byte {i} changed, yet read as {r:?}");
        }
    }

    /// A payload whose CRC the store told (the one its record holds, checked against the
    /// bytes read into place) is sent with that CRC, not hashed again: the answer is the same
    /// as with the CRC computed, and a told CRC that is wrong fails the gateway's read.
    #[tokio::test]
    async fn a_told_payload_crc_is_sent_as_told() {
        let computed = answer(None).await;
        let told = answer(Some(crate::wire::body_crc32c(b"abcd"))).await;
        assert_eq!(told, computed);
        let wrong = answer(Some(crate::wire::body_crc32c(b"abce"))).await;
        let r = read(wrong).await;
        assert!(r.is_err(), "a wrong CRC was sent, yet read as {r:?}");
    }
}
