//! The client end: one connection per node address, shared by every request to it; each
//! request writes its frame itself ([`Outbox`]), and a reader task hands each answer to the
//! request waiting for it.

use super::*;
use crate::wire::{Answer, Call};
use http_body_util::Full;
use packrat_store_api::{StoreError, StoreResult};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};

/// Requests one connection carries at once; past it a request is refused as unavailable
/// (the gateway answers 503, a client backs off), never queued without bound.
pub const IN_FLIGHT_MAX: usize = 4096;
/// How long a node that answered the preface with HTTP (an older build) is spoken to over
/// HTTP before the preface is tried again.
const HTTP_ONLY_FOR: Duration = Duration::from_secs(60);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// What a request over a multiplexed connection came to.
pub enum Sent {
    Answered(Answer),
    Failed(StoreError),
    /// The node speaks HTTP only: send it that way.
    HttpOnly,
}

/// Connections to every node this process calls.
pub struct MuxPool {
    trust: crate::Trust,
    conns: RwLock<HashMap<String, Arc<MuxConn>>>,
    /// One connect at a time per node (a connect takes at most [`CONNECT_TIMEOUT`]); a node
    /// that does not answer (cut off) holds up only its own requests.
    connecting: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    http_only: Mutex<HashMap<String, Instant>>,
}

impl MuxPool {
    pub fn new(trust: crate::Trust) -> Self {
        MuxPool {
            trust,
            conns: RwLock::default(),
            connecting: Mutex::default(),
            http_only: Mutex::default(),
        }
    }

    fn live(&self, addr: &str) -> Option<Arc<MuxConn>> {
        let conns = self.conns.read().ok()?;
        conns.get(addr).filter(|c| !c.is_dead()).cloned()
    }

    fn is_http_only(&self, addr: &str) -> bool {
        let mut m = self.http_only.lock().unwrap_or_else(|e| e.into_inner());
        match m.get(addr) {
            Some(until) if *until > Instant::now() => true,
            Some(_) => {
                m.remove(addr);
                false
            }
            None => false,
        }
    }

    async fn conn(&self, addr: &str) -> Result<Arc<MuxConn>, Sent> {
        if let Some(c) = self.live(addr) {
            return Ok(c);
        }
        if self.is_http_only(addr) {
            return Err(Sent::HttpOnly);
        }
        let one = {
            let mut m = self.connecting.lock().unwrap_or_else(|e| e.into_inner());
            m.entry(addr.to_string()).or_default().clone()
        };
        let _one = one.lock().await;
        if let Some(c) = self.live(addr) {
            return Ok(c);
        }
        match connect(addr, &self.trust).await {
            Ok(Some(c)) => {
                if let Ok(mut m) = self.conns.write() {
                    m.insert(addr.to_string(), c.clone());
                }
                Ok(c)
            }
            Ok(None) => {
                tracing::info!(node = addr, "the node speaks HTTP only (an older build)");
                if let Ok(mut m) = self.http_only.lock() {
                    m.insert(addr.to_string(), Instant::now() + HTTP_ONLY_FOR);
                }
                Err(Sent::HttpOnly)
            }
            Err(e) => Err(Sent::Failed(e)),
        }
    }

    /// Sends `call` to the node at `addr` over its connection (made if there is none).
    pub async fn send(&self, call: &Call<'_>, addr: &str, epoch: u64, timeout: Duration) -> Sent {
        // A body no frame may carry goes over HTTP, rather than end the shared connection.
        if call.body.len() + call.path.len() + 64 * 1024 > PAYLOAD_MAX {
            return Sent::HttpOnly;
        }
        // The call's time covers its connect too (as an HTTP request's does): a node cut off
        // black-holes the connect, and a probe or a step waiting 2 s on it (or behind others'
        // connects to it) would be late to find the node gone.
        let started = Instant::now();
        let conn = match tokio::time::timeout(timeout, self.conn(addr)).await {
            Ok(Ok(c)) => c,
            Ok(Err(s)) => return s,
            Err(_) => {
                return Sent::Failed(unavailable(
                    addr,
                    format!("no connection within {} ms", timeout.as_millis()),
                ));
            }
        };
        let timeout = timeout.saturating_sub(started.elapsed());
        match conn.request(call, epoch, timeout).await {
            Ok(a) => Sent::Answered(a),
            Err(e) => Sent::Failed(e),
        }
    }
}

fn unavailable(addr: &str, what: impl std::fmt::Display) -> StoreError {
    StoreError::Unavailable(format!("storage node {addr}: {what}"))
}

/// Opens a connection and sends the preface: `None` if the node answers it as HTTP.
async fn connect(addr: &str, trust: &crate::Trust) -> StoreResult<Option<Arc<MuxConn>>> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| unavailable(addr, "no connection within 2 s"))?
        .map_err(|e| unavailable(addr, e))?;
    let _ = stream.set_nodelay(true);
    // A connection cut off by the network is found dead by the kernel's keepalive probes.
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(5))
        .with_interval(Duration::from_secs(2))
        .with_retries(3);
    let _ = socket2::SockRef::from(&stream).set_tcp_keepalive(&keepalive);
    let (mut rd, mut wr) = stream.into_split();
    let preface = preface(trust);
    let welcome = async {
        wr.write_all(&preface).await?;
        let mut head = [0u8; 4];
        rd.read_exact(&mut head).await?;
        if &head != MAGIC {
            return Ok::<_, std::io::Error>(Err(head));
        }
        let mut rest = [0u8; 4];
        rd.read_exact(&mut rest).await?;
        let mut msg = vec![0u8; u16::from_be_bytes([rest[2], rest[3]]) as usize];
        rd.read_exact(&mut msg).await?;
        Ok(Ok((rest[1], String::from_utf8_lossy(&msg).into_owned())))
    };
    let answer = tokio::time::timeout(CONNECT_TIMEOUT, welcome)
        .await
        .map_err(|_| unavailable(addr, "no answer to the connection's preface within 2 s"))?
        .map_err(|e| unavailable(addr, e))?;
    match answer {
        Err(head) if &head == b"HTTP" => Ok(None),
        Err(head) => Err(unavailable(
            addr,
            format!("an answer to the preface that is neither packrat's nor HTTP: {head:?}"),
        )),
        Ok((0, _)) => Ok(Some(MuxConn::start(addr, rd, wr))),
        Ok((_, msg)) => Err(unavailable(addr, format!("refused the connection: {msg}"))),
    }
}

/// The client's preface: the magic, the version, the cluster's secret and its identity.
pub fn preface(trust: &crate::Trust) -> Bytes {
    let mut p = BytesMut::with_capacity(9 + trust.secret.len() + trust.cluster.len());
    p.put_slice(MAGIC);
    p.put_u8(VERSION);
    for part in [&trust.secret, &trust.cluster] {
        p.put_u16(part.len() as u16);
        p.put_slice(part.as_bytes());
    }
    p.freeze()
}

/// A piece of a streamed answer, as the reader hands it on.
enum Piece {
    Data(Bytes),
    End(http::HeaderMap),
    Fail(String),
}

/// Who waits for a request's answer.
enum Waiter {
    Head(oneshot::Sender<StoreResult<Answer>>),
    Stream(mpsc::UnboundedSender<Piece>),
}

/// One connection to a node.
pub struct MuxConn {
    addr: String,
    out: Arc<Outbox>,
    pending: Mutex<HashMap<u64, Waiter>>,
    next_id: AtomicU64,
    dead: AtomicBool,
    /// When a frame last came in (ms since `born`).
    heard_ms: AtomicU64,
    born: Instant,
}

impl MuxConn {
    fn start(
        addr: &str,
        rd: tokio::net::tcp::OwnedReadHalf,
        wr: tokio::net::tcp::OwnedWriteHalf,
    ) -> Arc<MuxConn> {
        let (out, flusher) = Outbox::new(wr);
        let conn = Arc::new(MuxConn {
            addr: addr.to_string(),
            out,
            pending: Mutex::default(),
            next_id: AtomicU64::new(1),
            dead: AtomicBool::new(false),
            heard_ms: AtomicU64::new(0),
            born: Instant::now(),
        });
        let w = conn.clone();
        tokio::spawn(async move {
            if let Err(e) = flusher.await {
                w.fail_all(&format!("sending: {e}"));
            }
        });
        let r = conn.clone();
        tokio::spawn(async move {
            let e = r.read_frames(rd).await;
            r.fail_all(&e);
        });
        conn
    }

    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    /// Ends the connection: every request waiting on it fails as unavailable.
    fn fail_all(&self, why: &str) {
        if self.dead.swap(true, Ordering::AcqRel) {
            return;
        }
        self.out.close();
        tracing::debug!(node = %self.addr, "multiplexed connection ended: {why}");
        let waiters: Vec<Waiter> = match self.pending.lock() {
            Ok(mut p) => p.drain().map(|(_, w)| w).collect(),
            Err(_) => Vec::new(),
        };
        for w in waiters {
            match w {
                Waiter::Head(tx) => {
                    let _ = tx.send(Err(unavailable(
                        &self.addr,
                        format!("connection lost: {why}"),
                    )));
                }
                Waiter::Stream(tx) => {
                    let _ = tx.send(Piece::Fail(format!("connection lost: {why}")));
                }
            }
        }
    }

    fn send_frame(&self, id: u64, kind: u8, payload: Bytes) {
        if !self.out.send(frame(id, kind, 0, payload)) {
            self.fail_all("sending failed");
        }
    }

    async fn request(
        self: &Arc<Self>,
        call: &Call<'_>,
        epoch: u64,
        timeout: Duration,
    ) -> StoreResult<Answer> {
        let method = method_code(&call.method)
            .ok_or_else(|| StoreError::internal("node request", "an unknown method"))?;
        let payload = request_payload(method, epoch, call.path, call.headers, &call.body);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            if p.len() >= IN_FLIGHT_MAX {
                return Err(unavailable(
                    &self.addr,
                    format!("SlowDown: {IN_FLIGHT_MAX} requests in flight on its connection"),
                ));
            }
            p.insert(id, Waiter::Head(tx));
        }
        // Checked after the waiter is in: a connection that ends from here on fails it.
        if self.is_dead() {
            self.forget(id);
            return Err(unavailable(&self.addr, "connection lost"));
        }
        let sent_ms = self.now_ms();
        let gone = Forget { conn: self, id };
        self.send_frame(id, REQ, payload);
        let got = tokio::time::timeout(timeout, rx).await;
        match got {
            Ok(Ok(answer)) => {
                std::mem::forget(gone);
                answer
            }
            Ok(Err(_)) => Err(unavailable(&self.addr, "connection lost")),
            Err(_) => {
                // Nothing at all heard since the request went: the connection is likely cut
                // off (a partition); the next request makes a new one rather than wait too.
                if self.heard_ms.load(Ordering::Relaxed) < sent_ms {
                    self.fail_all("no frame heard within a request's timeout");
                }
                Err(unavailable(&self.addr, "did not answer"))
            }
        }
    }

    fn forget(&self, id: u64) -> Option<Waiter> {
        self.pending.lock().ok()?.remove(&id)
    }

    /// Reads frames until the connection ends; answers why.
    async fn read_frames(self: &Arc<Self>, mut rd: tokio::net::tcp::OwnedReadHalf) -> String {
        let mut buf = BytesMut::with_capacity(256 * 1024);
        loop {
            loop {
                match take_frame(&mut buf) {
                    Ok(Some(f)) => {
                        self.heard_ms.store(self.now_ms(), Ordering::Relaxed);
                        self.dispatch(f);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        crate::wire::DAMAGED_ANSWERS.fetch_add(1, Ordering::Relaxed);
                        return format!("{e}");
                    }
                }
            }
            if buf.capacity() - buf.len() < 64 * 1024 {
                buf.reserve(256 * 1024);
            }
            match rd.read_buf(&mut buf).await {
                Ok(0) => return "closed by the node".into(),
                Ok(_) => {}
                Err(e) => return e.to_string(),
            }
        }
    }

    fn dispatch(self: &Arc<Self>, f: Frame) {
        match f.kind {
            HEAD => {
                let Some(Waiter::Head(tx)) = self.forget(f.id) else {
                    // Its request gave up waiting: a stream it would start is not wanted.
                    if f.flags & WHOLE == 0 {
                        self.send_frame(f.id, CANCEL, Bytes::new());
                    }
                    return;
                };
                // If the request was dropped as its answer came, the answer is dropped here (a
                // stream's body then cancels it).
                let _ = tx.send(self.answer(f));
            }
            DATA | END | FAIL => {
                let mut p = self.pending.lock().unwrap_or_else(|e| e.into_inner());
                let Some(Waiter::Stream(tx)) = p.get(&f.id) else {
                    return;
                };
                let piece = match f.kind {
                    DATA => Piece::Data(f.payload),
                    END => {
                        let mut payload = f.payload;
                        Piece::End(get_headers(&mut payload).unwrap_or_default())
                    }
                    _ => Piece::Fail(String::from_utf8_lossy(&f.payload).into_owned()),
                };
                let last = !matches!(piece, Piece::Data(_));
                let _ = tx.send(piece);
                if last {
                    p.remove(&f.id);
                }
            }
            _ => {}
        }
    }

    /// The answer a `HEAD` frame starts.
    fn answer(self: &Arc<Self>, f: Frame) -> StoreResult<Answer> {
        let mut p = f.payload;
        let parsed = get_u16(&mut p).and_then(|s| Some((s, get_headers(&mut p)?)));
        let Some((status, headers)) = parsed else {
            return Err(StoreError::internal(
                "storage node answer",
                "a HEAD frame that does not parse",
            ));
        };
        let body = if f.flags & WHOLE != 0 {
            http_body_util::Either::Left(Full::new(p))
        } else {
            let (tx, rx) = mpsc::unbounded_channel();
            if let Ok(mut pending) = self.pending.lock() {
                pending.insert(f.id, Waiter::Stream(tx));
            }
            http_body_util::Either::Right(http_body_util::Either::Left(MuxBody {
                conn: self.clone(),
                id: f.id,
                rx,
                ended: false,
            }))
        };
        Ok(Answer {
            status,
            headers,
            body: http_body_util::Either::Right(body),
        })
    }
}

/// Takes a request's waiter out if the request is dropped before its answer came.
struct Forget<'a> {
    conn: &'a MuxConn,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        self.conn.forget(self.id);
    }
}

/// A streamed answer's body: its pieces as the reader hands them on, each taken granting the
/// node one more (see [`WINDOW`]).
pub struct MuxBody {
    conn: Arc<MuxConn>,
    id: u64,
    rx: mpsc::UnboundedReceiver<Piece>,
    ended: bool,
}

impl http_body::Body for MuxBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::task::Poll;
        if self.ended {
            return Poll::Ready(None);
        }
        match self.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Some(Piece::Data(b))) => {
                self.conn
                    .send_frame(self.id, CREDIT, Bytes::from_static(&[0, 0, 0, 1]));
                Poll::Ready(Some(Ok(http_body::Frame::data(b))))
            }
            Poll::Ready(Some(Piece::End(trailers))) => {
                self.ended = true;
                Poll::Ready(Some(Ok(http_body::Frame::trailers(trailers))))
            }
            Poll::Ready(Some(Piece::Fail(why))) => {
                self.ended = true;
                Poll::Ready(Some(Err(std::io::Error::other(why))))
            }
            Poll::Ready(None) => {
                self.ended = true;
                Poll::Ready(Some(Err(std::io::Error::other("connection lost"))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

impl Drop for MuxBody {
    fn drop(&mut self) {
        if !self.ended && self.conn.forget(self.id).is_some() {
            self.conn.send_frame(self.id, CANCEL, Bytes::new());
        }
    }
}
