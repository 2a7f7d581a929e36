//! Chain steps relayed together: the small writes a gateway sends to a head and the steps a
//! member hands to the next one, queued for one node while the process was busy, go to it as
//! one request (`POST /w`), each with its own map epoch, method, path, headers and body; the
//! node runs each as if it had come alone (side by side) and answers each one's status and
//! body, in order (see [`crate::gather`] for when steps are gathered).
//!
//! On loopback, much of a chain PUT's cost at a node is the request around it: the HTTP
//! exchange with its predecessor and its successor, the task switches on both sides. Relayed
//! under load, those are paid once per request. Nothing is held back for a turn or a timer:
//! a chain step stays under way until the rest of its chain has synced it, so steps that
//! waited for a turn (as gathered lookups do, `ClusterStore::lookup`) raised the latency and
//! thinned the group commits more than the requests saved (docs/benchmark-log.md).

use crate::gather::{Dispatch, Queues};
use crate::wire::Call;
use crate::wire::{Answer, NodeClient};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::Method;
use packrat_store_api::{StoreError, StoreResult};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Steps with a larger body go alone: relaying saves per-request costs, which a large body
/// dwarfs, and a group is held in memory whole.
pub const RELAY_BODY_MAX: usize = 64 * 1024;
/// Most steps in one relayed request.
pub const RELAY_ITEMS_MAX: usize = 256;

/// One step of a relayed request: `u64 epoch, u8 method, u32 path length, u16 header count,
/// u64 body length`, the path (with its query), each header as `u16 name length, u32 value
/// length, name, value`, then the body; big-endian, one step after another.
#[derive(Debug, Clone, PartialEq)]
pub struct RelayItem {
    pub epoch: u64,
    pub method: Method,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: Bytes,
}

const METHODS: [Method; 4] = [Method::PUT, Method::DELETE, Method::PATCH, Method::POST];

/// Whether a request may be relayed: a chain step on an object or an upload (the sender asks
/// before it queues one, the node before it routes one).
pub fn relayable(method: &Method, path: &str) -> bool {
    METHODS.contains(method) && (path.starts_with("/o/") || path.starts_with("/u/"))
}

impl RelayItem {
    pub fn put(&self, out: &mut BytesMut) -> StoreResult<()> {
        let code = METHODS
            .iter()
            .position(|m| *m == self.method)
            .ok_or_else(|| StoreError::internal("relay", format!("{} not relayed", self.method)))?;
        out.put_u64(self.epoch);
        out.put_u8(code as u8);
        out.put_u32(self.path.len() as u32);
        out.put_u16(self.headers.len() as u16);
        out.put_u64(self.body.len() as u64);
        out.put_slice(self.path.as_bytes());
        for (k, v) in &self.headers {
            out.put_u16(k.len() as u16);
            out.put_u32(v.len() as u32);
            out.put_slice(k.as_bytes());
            out.put_slice(v.as_bytes());
        }
        out.put_slice(&self.body);
        Ok(())
    }

    /// The steps of a request body, at most [`RELAY_ITEMS_MAX`]; bodies are slices of it.
    pub fn parse_all(mut b: Bytes) -> StoreResult<Vec<RelayItem>> {
        let bad = |what: &str| StoreError::Invalid(format!("bad relayed step: {what}"));
        let mut items = Vec::new();
        while b.has_remaining() {
            if items.len() == RELAY_ITEMS_MAX {
                return Err(bad("too many steps"));
            }
            if b.remaining() < 27 {
                return Err(bad("cut"));
            }
            let epoch = b.get_u64();
            let method = METHODS
                .get(b.get_u8() as usize)
                .cloned()
                .ok_or_else(|| bad("unknown method"))?;
            let path_len = b.get_u32() as usize;
            let n_headers = b.get_u16();
            let body_len = usize::try_from(b.get_u64()).map_err(|_| bad("body length"))?;
            let text = |b: &mut Bytes, n: usize| -> StoreResult<String> {
                if b.remaining() < n {
                    return Err(bad("cut"));
                }
                String::from_utf8(b.split_to(n).to_vec()).map_err(|_| bad("not UTF-8"))
            };
            let path = text(&mut b, path_len)?;
            let mut headers = Vec::with_capacity(n_headers as usize);
            for _ in 0..n_headers {
                if b.remaining() < 6 {
                    return Err(bad("cut"));
                }
                let (k, v) = (b.get_u16() as usize, b.get_u32() as usize);
                headers.push((text(&mut b, k)?, text(&mut b, v)?));
            }
            if b.remaining() < body_len {
                return Err(bad("cut body"));
            }
            items.push(RelayItem {
                epoch,
                method,
                path,
                headers,
                body: b.split_to(body_len),
            });
        }
        Ok(items)
    }
}

/// A node's answer to one relayed step, in the order sent: `u16 status, u64 length`, then
/// the body it would have answered the step alone.
pub fn put_answer(out: &mut BytesMut, status: u16, body: &[u8]) {
    out.put_u16(status);
    out.put_u64(body.len() as u64);
    out.put_slice(body);
}

/// The header by which a sender asks for a relayed request's answers as each step ends (and
/// a node says it answers so), with [`RELAY_ANSWERS_INDEXED`]: one step whose chain is slow
/// (a successor that hangs until its hop's timeout) then holds back no other step sent with
/// it. A node that does not know it answers in order, all at once ([`parse_answers`]).
pub const RELAY_ANSWERS_HEADER: &str = "x-packrat-relay-answers";
pub const RELAY_ANSWERS_INDEXED: &str = "indexed";

/// Whether a relayed request (or its answer) has its answers as each step ends.
pub fn indexed(headers: &http::HeaderMap) -> bool {
    headers
        .get(RELAY_ANSWERS_HEADER)
        .is_some_and(|v| v.as_bytes() == RELAY_ANSWERS_INDEXED.as_bytes())
}

/// One answer of a relayed request given as its step ended: `u32 index` (the step's place in
/// the request), `u16 status, u64 length`, the body, then the CRC32C of the frame before it.
pub fn put_indexed_answer(out: &mut BytesMut, index: u32, status: u16, body: &[u8]) {
    let from = out.len();
    out.put_u32(index);
    out.put_u16(status);
    out.put_u64(body.len() as u64);
    out.put_slice(body);
    let crc = crate::wire::body_crc32c(&out[from..]);
    out.put_u32(crc);
}

/// Takes the whole answers at the front of `buf` (see [`put_indexed_answer`]): (index,
/// status, body) each, leaving a partial one for more bytes. A frame damaged on its way (its
/// CRC32C differs) is an error.
pub fn take_indexed_answers(buf: &mut BytesMut) -> StoreResult<Vec<(u32, u16, Bytes)>> {
    const HEAD: usize = 4 + 2 + 8;
    let mut out = Vec::new();
    loop {
        if buf.len() < HEAD {
            return Ok(out);
        }
        let len = u64::from_be_bytes(buf[6..HEAD].try_into().unwrap_or_default());
        let whole = usize::try_from(len)
            .ok()
            .and_then(|l| l.checked_add(HEAD + 4))
            .ok_or_else(|| StoreError::Unavailable("storage node: a bad relayed answer".into()))?;
        if buf.len() < whole {
            return Ok(out);
        }
        let mut frame = buf.split_to(whole).freeze();
        let sent = u32::from_be_bytes(frame[whole - 4..].try_into().unwrap_or_default());
        if crate::wire::body_crc32c(&frame[..whole - 4]) != sent {
            return Err(StoreError::Unavailable(
                "storage node: a relayed answer damaged on its way".into(),
            ));
        }
        let index = frame.get_u32();
        let status = frame.get_u16();
        frame.advance(8);
        out.push((index, status, frame.slice(..whole - 4 - HEAD)));
    }
}

/// The `n` answers of a relayed request's body (each body a slice of it).
pub fn parse_answers(mut b: Bytes, n: usize) -> StoreResult<Vec<(u16, Bytes)>> {
    let cut = || StoreError::Unavailable("storage node: a cut relayed answer".into());
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        if b.remaining() < 10 {
            return Err(cut());
        }
        let status = b.get_u16();
        let len = usize::try_from(b.get_u64()).map_err(|_| cut())?;
        if b.remaining() < len {
            return Err(cut());
        }
        out.push((status, b.split_to(len)));
    }
    if b.has_remaining() {
        return Err(StoreError::internal(
            "storage node answer",
            "bytes after the last relayed answer",
        ));
    }
    Ok(out)
}

/// A step waiting to be relayed; its answer comes on `tx`.
struct Waiting {
    item: RelayItem,
    timeout: Duration,
    tx: oneshot::Sender<StoreResult<(u16, Bytes)>>,
}

/// The relays of one process to every node it sends chain steps to.
#[derive(Clone)]
pub struct Relay {
    client: NodeClient,
    queues: Arc<Queues<Waiting>>,
    relayed: Arc<AtomicU64>,
    requests: Arc<AtomicU64>,
}

impl Relay {
    pub fn new(client: NodeClient) -> Relay {
        Relay {
            client,
            queues: Arc::default(),
            relayed: Arc::default(),
            requests: Arc::default(),
        }
    }

    /// Steps sent in relayed requests, and those requests.
    pub fn counts(&self) -> (u64, u64) {
        (
            self.relayed.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
        )
    }

    /// Sends a chain step to the node at `addr`, alone or relayed with the steps queued for it
    /// meanwhile (see [`crate::gather`]): [`NodeClient::send`] for the caller, whose failures
    /// to reach the node are `Unavailable` either way.
    pub async fn send(
        &self,
        call: Call<'_>,
        addr: &str,
        epoch: u64,
        timeout: Duration,
    ) -> StoreResult<Answer> {
        if call.body.len() > RELAY_BODY_MAX || !relayable(&call.method, call.path) {
            return self.client.send(call, addr, epoch, timeout).await;
        }
        let (tx, rx) = oneshot::channel();
        let waiting = Waiting {
            item: RelayItem {
                epoch,
                method: call.method.clone(),
                path: call.path.to_string(),
                headers: call
                    .headers
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.clone()))
                    .collect(),
                body: call.body.clone(),
            },
            timeout,
            tx,
        };
        let dispatch = || -> Dispatch<Waiting> {
            let (relay, addr) = (self.clone(), addr.to_string());
            Box::new(move |batch| relay.spawn_batches(&addr, batch))
        };
        if let Some(gatherer) = self.queues.join(addr, waiting, dispatch) {
            let batch = gatherer.gather().await;
            if batch.len() == 1 {
                // Only this step: sent alone, from here.
                return self.client.send(call, addr, epoch, timeout).await;
            }
            self.spawn_batches(addr, batch);
        }
        match rx.await {
            Ok(Ok((status, body))) => Ok(Answer::whole(status, body)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(StoreError::Unavailable(format!(
                "storage node {addr}: a relayed step was dropped"
            ))),
        }
    }

    /// Sends `batch` to `addr`, in requests of at most [`RELAY_ITEMS_MAX`] steps, each on a
    /// task of its own (so a gatherer that goes away does not take them with it). Outside a
    /// runtime (one shutting down), the steps are dropped: each caller gets `Unavailable`.
    fn spawn_batches(&self, addr: &str, mut batch: Vec<Waiting>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        while !batch.is_empty() {
            let rest = batch.split_off(batch.len().min(RELAY_ITEMS_MAX));
            let (relay, addr) = (self.clone(), addr.to_string());
            let one = std::mem::replace(&mut batch, rest);
            rt.spawn(async move { relay.send_batch(&addr, one).await });
        }
    }

    async fn send_batch(&self, addr: &str, batch: Vec<Waiting>) {
        let started = Instant::now();
        let mut body = BytesMut::new();
        let mut timeout = Duration::ZERO;
        let mut put = Ok(());
        for w in &batch {
            timeout = timeout.max(w.timeout);
            put = put.and_then(|()| w.item.put(&mut body));
        }
        let as_they_end = [(RELAY_ANSWERS_HEADER, RELAY_ANSWERS_INDEXED.to_string())];
        let answers = match put {
            Ok(()) => {
                self.client
                    .send(
                        Call {
                            method: Method::POST,
                            path: "/w",
                            headers: &as_they_end,
                            body: body.freeze(),
                        },
                        addr,
                        0,
                        timeout,
                    )
                    .await
            }
            Err(e) => Err(e),
        };
        let answers = match answers {
            Ok(ans) if ans.status == 200 && indexed(&ans.headers) => {
                return self.take_as_they_end(addr, ans, batch, started).await;
            }
            Ok(ans) if ans.status == 200 => match ans.bytes().await {
                Ok(b) => parse_answers(b, batch.len()),
                Err(e) => Err(e),
            },
            Ok(ans) => Err(ans.error().await),
            Err(e) => Err(e),
        };
        match answers {
            Ok(answers) => {
                self.requests.fetch_add(1, Ordering::Relaxed);
                self.relayed
                    .fetch_add(batch.len() as u64, Ordering::Relaxed);
                for (w, a) in batch.into_iter().zip(answers) {
                    let _ = w.tx.send(Ok(a));
                }
            }
            Err(e) => {
                // Each step fails as it would have alone: a node unreachable is `Unavailable`.
                let why = e.to_string();
                for w in batch {
                    let _ = w.tx.send(Err(match &e {
                        StoreError::Unavailable(_) => StoreError::Unavailable(why.clone()),
                        _ => StoreError::internal("relayed steps", why.clone()),
                    }));
                }
            }
        }
    }
}

impl Relay {
    /// Hands each step of `batch` its answer as the node sends it (see
    /// [`RELAY_ANSWERS_HEADER`]); a step whose own timeout (from `started`) passes first, or
    /// that the answer ends without, fails `Unavailable` as it would have alone.
    async fn take_as_they_end(
        &self,
        addr: &str,
        ans: Answer,
        batch: Vec<Waiting>,
        started: Instant,
    ) {
        use http_body_util::BodyExt;
        let n = batch.len();
        let mut waiting: Vec<Option<Waiting>> = batch.into_iter().map(Some).collect();
        let mut body = ans.body;
        let mut buf = BytesMut::new();
        let failure = loop {
            if waiting.iter().all(Option::is_none) {
                self.requests.fetch_add(1, Ordering::Relaxed);
                self.relayed.fetch_add(n as u64, Ordering::Relaxed);
                return;
            }
            // The steps past their timeout fail now; the rest wait for the next frame until
            // the nearest of their timeouts.
            let now = Instant::now();
            let mut next = None::<Instant>;
            for slot in waiting.iter_mut() {
                let Some(w) = slot else { continue };
                let due = started + w.timeout;
                if due <= now {
                    if let Some(w) = slot.take() {
                        let _ = w.tx.send(Err(StoreError::Unavailable(format!(
                            "storage node {addr} did not answer"
                        ))));
                    }
                } else {
                    next = Some(next.map_or(due, |d| d.min(due)));
                }
            }
            let Some(next) = next else { continue };
            let frame = match tokio::time::timeout_at(next.into(), body.frame()).await {
                Err(_) => continue,
                Ok(None) => {
                    break StoreError::Unavailable(format!(
                        "storage node {addr}: a relayed answer ended early"
                    ));
                }
                Ok(Some(Err(e))) => {
                    break StoreError::Unavailable(format!("storage node {addr}: {e}"));
                }
                Ok(Some(Ok(frame))) => frame,
            };
            let Ok(data) = frame.into_data() else {
                continue;
            };
            buf.extend_from_slice(&data);
            match take_indexed_answers(&mut buf) {
                Ok(done) => {
                    for (i, status, b) in done {
                        if let Some(w) = waiting.get_mut(i as usize).and_then(Option::take) {
                            let _ = w.tx.send(Ok((status, b)));
                        }
                    }
                }
                Err(e) => break e,
            }
        };
        let why = failure.to_string();
        for w in waiting.into_iter().flatten() {
            let _ = w.tx.send(Err(StoreError::Unavailable(why.clone())));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Relayed steps and their answers read back as written; cut input is an error, never a
    /// step or an answer.
    #[test]
    fn relayed_steps_and_answers_read_back_as_written() {
        let items = vec![
            RelayItem {
                epoch: 9,
                method: Method::PUT,
                path: "/o/7/3/a%20b.jpg".into(),
                headers: vec![
                    ("x-packrat-cv".into(), "123".into()),
                    ("x-packrat-put".into(), "{\"a\":\"é\"}".into()),
                ],
                body: Bytes::from_static(b"bytes of the object"),
            },
            RelayItem {
                epoch: u64::MAX,
                method: Method::DELETE,
                path: "/o/1/0/k?versioning=Enabled".into(),
                headers: vec![],
                body: Bytes::new(),
            },
        ];
        let mut out = BytesMut::new();
        for i in &items {
            i.put(&mut out).unwrap();
        }
        let all = out.freeze();
        assert_eq!(RelayItem::parse_all(all.clone()).unwrap(), items);
        let mut first = BytesMut::new();
        items[0].put(&mut first).unwrap();
        for cut in 1..all.len() {
            // Cut between the two steps: the first one, whole; anywhere else an error.
            if let Ok(read) = RelayItem::parse_all(all.slice(..cut)) {
                assert_eq!((cut, read), (first.len(), items[..1].to_vec()));
            }
        }
        let get = RelayItem {
            method: Method::GET,
            ..items[1].clone()
        };
        assert!(get.put(&mut BytesMut::new()).is_err());

        let mut ans = BytesMut::new();
        put_answer(&mut ans, 200, b"{\"cv\":1}");
        put_answer(&mut ans, 409, b"");
        let ans = ans.freeze();
        assert_eq!(
            parse_answers(ans.clone(), 2).unwrap(),
            vec![
                (200, Bytes::from_static(b"{\"cv\":1}")),
                (409, Bytes::new())
            ]
        );
        assert!(parse_answers(ans.clone(), 3).is_err());
        assert!(parse_answers(ans.clone(), 1).is_err());
        assert!(parse_answers(ans.slice(..ans.len() - 1), 2).is_err());
    }

    /// Answers given as their steps end come back whole however the bytes are split on their
    /// way, in the order sent, each with its step's index; a damaged one is an error.
    #[test]
    fn answers_as_their_steps_end_read_back_whole_from_any_split() {
        let sent = [
            (2u32, 200u16, Bytes::from_static(b"{\"cv\":7}")),
            (0, 409, Bytes::from_static(b"{\"reason\":\"chain broken\"}")),
            (1, 204, Bytes::new()),
        ];
        let mut all = BytesMut::new();
        for (i, status, body) in &sent {
            put_indexed_answer(&mut all, *i, *status, body);
        }
        let all = all.freeze();
        for step in [1, 3, 7, all.len()] {
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for piece in all.chunks(step) {
                buf.extend_from_slice(piece);
                got.extend(take_indexed_answers(&mut buf).unwrap());
            }
            assert!(buf.is_empty());
            assert_eq!(got, sent.to_vec(), "split every {step} bytes");
        }
        let mut damaged = BytesMut::from(&all[..]);
        damaged[20] ^= 1;
        assert!(take_indexed_answers(&mut damaged).is_err());
    }
}
