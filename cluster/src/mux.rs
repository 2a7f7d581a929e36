//! The internal API over one multiplexed binary connection per process pair (gateway to node,
//! node to node), in place of a pooled HTTP/1.1 connection per request in flight.
//!
//! The requests are the internal API's own (`wire.rs`: method, path, headers, body), so a node
//! answers them with the same code whichever way they came; what changes is the carriage: no
//! HTTP head to format and parse per request, the cluster secret checked once per connection,
//! many requests in flight on one socket, and the frames queued while one is written sent
//! together with one `writev` ([`Outbox`]).
//!
//! A node tells the two apart by a connection's first bytes: [`MAGIC`] starts a multiplexed
//! one, anything else is HTTP (operators' `/metrics` and `/health/*`, and older gateways and
//! nodes). A node of an older build answers the magic with an HTTP 400; the client then uses
//! HTTP with that node for a while ([`client`]), so a cluster can be upgraded node by node.
//!
//! The connection (all integers big-endian):
//!
//! - the client's preface: `PKMX`, version (2), the secret's length (u16) and the secret, the
//!   cluster id's length (u16) and the id (a connection to another cluster's node is refused
//!   with a message naming both);
//! - the node's answer: `PKMX`, version, 0 (welcome) or 1 (refused), a message's length (u16)
//!   and the message; a refused connection is closed;
//! - then frames both ways: a 16-byte head (payload length u32, request id u64, kind u8, flags
//!   u8, two zero bytes), the payload, and the CRC32C of head and payload (u32). A frame that
//!   fails its CRC, is too long or of an unknown kind ends the connection (its framing can no
//!   longer be trusted); every request in flight on it fails as unavailable and is retried
//!   as any failed request is.
//!
//! | kind | way | payload |
//! |---|---|---|
//! | `REQ` | to the node | method (u8), epoch (u64), path (u16 length + bytes), headers, body (the rest) |
//! | `HEAD` | to the client | status (u16), headers; with flag `WHOLE` the rest is the whole body, else `DATA` frames follow, then `END` or `FAIL` |
//! | `DATA` | to the client | a piece of a streamed answer |
//! | `END` | to the client | the streamed answer's trailers (headers) |
//! | `FAIL` | to the client | the streamed answer broke off (a message) |
//! | `CREDIT` | to the node | how many more `DATA` frames of a stream the client takes (u32) |
//! | `CANCEL` | to the node | the client dropped the answer: stop streaming it |
//!
//! Headers: a count (u16), then each name (u16 length + bytes) and value (u32 length + bytes).
//! A streamed answer is flow-controlled per stream: the node sends a `DATA` frame only against
//! a credit, [`WINDOW`] at the start and one more for each frame the client's reader takes, so
//! a slow reader of one answer holds back only its own stream, never the connection.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub mod client;
pub mod server;

pub const MAGIC: &[u8; 4] = b"PKMX";

/// `PACKRAT_INTERNAL_HTTP=1`: this process calls nodes over HTTP only and, as a node, answers
/// only HTTP (as a node of an older build does: a fallback, and how tests make a mixed-age
/// cluster).
pub fn http_only() -> bool {
    static ONLY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ONLY.get_or_init(|| std::env::var("PACKRAT_INTERNAL_HTTP").as_deref() == Ok("1"))
}
pub const VERSION: u8 = 2;
/// A frame's head: payload length, request id, kind, flags, two zero bytes.
pub const HEAD_BYTES: usize = 16;
/// The longest payload a frame may carry (a chain write of the largest single PUT, 256 MiB,
/// with room for its head).
pub const PAYLOAD_MAX: usize = 300 << 20;
/// The most an answer sends in one frame: a larger whole answer, or a larger piece of a
/// streamed one, goes as `DATA` frames of this size.
pub const PIECE_MAX: usize = 4 << 20;
/// `DATA` frames of a stream a node may send ahead of its reader.
pub const WINDOW: u32 = 16;

pub const REQ: u8 = 1;
pub const HEAD: u8 = 2;
pub const DATA: u8 = 3;
pub const END: u8 = 4;
pub const FAIL: u8 = 5;
pub const CREDIT: u8 = 6;
pub const CANCEL: u8 = 7;

/// `HEAD`'s flag: the rest of the payload is the whole body.
pub const WHOLE: u8 = 1;

/// A connection's sending side, shared by every task with a frame to send. Whoever finds no
/// one writing writes what is queued at once, from its own task, with non-blocking gathered
/// writes (`try_write_vectored`); frames queued meanwhile go out with the writer's next
/// write. Only when the socket is full does a flusher task take over and wait for room. So a
/// frame costs no hand-off to another task and thread, where a writer task behind a queue
/// cost one per request (the wake-ups showed in CPU time, not in instruction counts).
pub struct Outbox {
    wr: tokio::net::tcp::OwnedWriteHalf,
    state: std::sync::Mutex<OutState>,
    flusher: tokio::sync::Notify,
}

#[derive(Default)]
struct OutState {
    queue: std::collections::VecDeque<Bytes>,
    /// Someone is writing (a sender, or the flusher): the others only queue.
    writing: bool,
    closed: bool,
}

impl Outbox {
    /// The outbox of `wr`, and its flusher task (to spawn; it ends when the outbox closes or
    /// a write fails, answering why).
    pub fn new(
        wr: tokio::net::tcp::OwnedWriteHalf,
    ) -> (
        std::sync::Arc<Outbox>,
        impl std::future::Future<Output = std::io::Result<()>> + Send + 'static,
    ) {
        let out = std::sync::Arc::new(Outbox {
            wr,
            state: std::sync::Mutex::default(),
            flusher: tokio::sync::Notify::new(),
        });
        let flusher = out.clone().flush();
        (out, flusher)
    }

    fn state(&self) -> std::sync::MutexGuard<'_, OutState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sends a frame (or queues it behind a write under way); `false` once the outbox is closed.
    pub fn send(&self, frame: [Bytes; 3]) -> bool {
        let mut batch = {
            let mut st = self.state();
            if st.closed {
                return false;
            }
            st.queue.extend(frame);
            if st.writing {
                return true;
            }
            st.writing = true;
            std::mem::take(&mut st.queue)
        };
        loop {
            match write_some(&self.wr, &mut batch) {
                Ok(true) => {
                    let mut st = self.state();
                    if st.queue.is_empty() {
                        st.writing = false;
                        return true;
                    }
                    batch = std::mem::take(&mut st.queue);
                }
                Ok(false) => {
                    // The socket is full: the flusher goes on once there is room.
                    let mut st = self.state();
                    batch.extend(st.queue.drain(..));
                    st.queue = batch;
                    drop(st);
                    self.flusher.notify_one();
                    return true;
                }
                Err(_) => {
                    self.close();
                    return false;
                }
            }
        }
    }

    /// Stops sending: queued frames are dropped, the flusher ends.
    pub fn close(&self) {
        let mut st = self.state();
        st.closed = true;
        st.queue.clear();
        drop(st);
        self.flusher.notify_one();
    }

    pub fn is_closed(&self) -> bool {
        self.state().closed
    }

    async fn flush(self: std::sync::Arc<Self>) -> std::io::Result<()> {
        loop {
            self.flusher.notified().await;
            loop {
                if self.state().closed {
                    return Ok(());
                }
                if let Err(e) = self.wr.writable().await {
                    self.close();
                    return Err(e);
                }
                let mut batch = std::mem::take(&mut self.state().queue);
                match write_some(&self.wr, &mut batch) {
                    Ok(true) => {
                        let mut st = self.state();
                        if st.queue.is_empty() {
                            st.writing = false;
                            break;
                        }
                    }
                    Ok(false) => {
                        let mut st = self.state();
                        batch.extend(st.queue.drain(..));
                        st.queue = batch;
                    }
                    Err(e) => {
                        self.close();
                        return Err(e);
                    }
                }
            }
        }
    }
}

/// Writes `batch` without waiting: `true` when all of it went, `false` when the socket is full
/// (what is left stays in `batch`).
fn write_some(
    wr: &tokio::net::tcp::OwnedWriteHalf,
    batch: &mut std::collections::VecDeque<Bytes>,
) -> std::io::Result<bool> {
    loop {
        while batch.front().is_some_and(Bytes::is_empty) {
            batch.pop_front();
        }
        if batch.is_empty() {
            return Ok(true);
        }
        let slices: Vec<std::io::IoSlice<'_>> = batch
            .iter()
            .take(64)
            .map(|b| std::io::IoSlice::new(b))
            .collect();
        let mut n = match wr.try_write_vectored(&slices) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) => return Err(e),
        };
        while n > 0 {
            let front = batch.front_mut().expect("written bytes were queued");
            if front.len() <= n {
                n -= front.len();
                batch.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
}

/// A frame as read.
#[derive(Debug)]
pub struct Frame {
    pub id: u64,
    pub kind: u8,
    pub flags: u8,
    pub payload: Bytes,
}

fn crc32c(head: &[u8], payload: &[u8]) -> u32 {
    let mut d = crate::wire::crc32c_digest();
    d.update(head);
    d.update(payload);
    d.finalize() as u32
}

/// A frame ready to send: its head, its payload (given, not copied) and its CRC, as three
/// pieces for a gathered write.
pub fn frame(id: u64, kind: u8, flags: u8, payload: Bytes) -> [Bytes; 3] {
    let mut head = BytesMut::with_capacity(HEAD_BYTES);
    head.put_u32(payload.len() as u32);
    head.put_u64(id);
    head.put_u8(kind);
    head.put_u8(flags);
    head.put_u16(0);
    let crc = crc32c(&head, &payload);
    [
        head.freeze(),
        payload,
        Bytes::copy_from_slice(&crc.to_be_bytes()),
    ]
}

/// Why a connection's bytes cannot be framed.
#[derive(Debug, PartialEq)]
pub enum FrameError {
    TooLong(usize),
    Crc,
    Kind(u8),
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::TooLong(n) => write!(f, "a frame of {n} bytes (at most {PAYLOAD_MAX})"),
            FrameError::Crc => f.write_str("a frame that fails its CRC32C"),
            FrameError::Kind(k) => write!(f, "a frame of unknown kind {k}"),
        }
    }
}

/// The next whole frame at the front of `buf`, taken off it (its payload a slice of the
/// receive buffer, not a copy); `None` until one has arrived whole.
pub fn take_frame(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    if buf.len() < HEAD_BYTES {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > PAYLOAD_MAX {
        return Err(FrameError::TooLong(len));
    }
    let kind = buf[12];
    if !(REQ..=CANCEL).contains(&kind) {
        return Err(FrameError::Kind(kind));
    }
    let total = HEAD_BYTES + len + 4;
    if buf.len() < total {
        buf.reserve(total - buf.len());
        return Ok(None);
    }
    let mut whole = buf.split_to(total);
    let sent = u32::from_be_bytes([
        whole[total - 4],
        whole[total - 3],
        whole[total - 2],
        whole[total - 1],
    ]);
    if crc32c(&whole[..HEAD_BYTES], &whole[HEAD_BYTES..total - 4]) != sent {
        return Err(FrameError::Crc);
    }
    whole.truncate(total - 4);
    let mut head = whole.split_to(HEAD_BYTES);
    head.advance(4);
    let id = head.get_u64();
    let kind = head.get_u8();
    let flags = head.get_u8();
    Ok(Some(Frame {
        id,
        kind,
        flags,
        payload: whole.freeze(),
    }))
}

pub fn put_headers<'a>(out: &mut BytesMut, headers: impl Iterator<Item = (&'a str, &'a [u8])>) {
    let at = out.len();
    out.put_u16(0);
    let mut n: u16 = 0;
    for (k, v) in headers {
        out.put_u16(k.len() as u16);
        out.put_slice(k.as_bytes());
        out.put_u32(v.len() as u32);
        out.put_slice(v);
        n += 1;
    }
    out[at..at + 2].copy_from_slice(&n.to_be_bytes());
}

/// Headers read off the front of `p`; `None` if they do not parse.
pub fn get_headers(p: &mut Bytes) -> Option<http::HeaderMap> {
    let n = get_u16(p)?;
    let mut map = http::HeaderMap::with_capacity(n as usize);
    for _ in 0..n {
        let k = get_u16(p)? as usize;
        let name = take(p, k)?;
        let v = get_u32(p)? as usize;
        let value = take(p, v)?;
        map.append(
            http::HeaderName::from_bytes(&name).ok()?,
            http::HeaderValue::from_maybe_shared(value).ok()?,
        );
    }
    Some(map)
}

pub fn get_u16(p: &mut Bytes) -> Option<u16> {
    (p.remaining() >= 2).then(|| p.get_u16())
}

pub fn get_u32(p: &mut Bytes) -> Option<u32> {
    (p.remaining() >= 4).then(|| p.get_u32())
}

pub fn get_u64(p: &mut Bytes) -> Option<u64> {
    (p.remaining() >= 8).then(|| p.get_u64())
}

pub fn take(p: &mut Bytes, n: usize) -> Option<Bytes> {
    (p.remaining() >= n).then(|| p.split_to(n))
}

const METHODS: [http::Method; 6] = [
    http::Method::GET,
    http::Method::PUT,
    http::Method::POST,
    http::Method::DELETE,
    http::Method::PATCH,
    http::Method::HEAD,
];

pub fn method_code(m: &http::Method) -> Option<u8> {
    METHODS.iter().position(|x| x == m).map(|i| i as u8 + 1)
}

pub fn method_of(code: u8) -> Option<http::Method> {
    METHODS.get((code as usize).checked_sub(1)?).cloned()
}

/// A request's payload.
pub fn request_payload(
    method: u8,
    epoch: u64,
    path: &str,
    headers: &[(&str, String)],
    body: &[u8],
) -> Bytes {
    let mut out = BytesMut::with_capacity(
        16 + path.len()
            + headers
                .iter()
                .map(|(k, v)| 6 + k.len() + v.len())
                .sum::<usize>()
            + body.len(),
    );
    out.put_u8(method);
    out.put_u64(epoch);
    out.put_u16(path.len() as u16);
    out.put_slice(path.as_bytes());
    put_headers(&mut out, headers.iter().map(|(k, v)| (*k, v.as_bytes())));
    out.put_slice(body);
    out.freeze()
}

/// A `HEAD` payload: the status and headers, and with [`WHOLE`] the body after them.
pub fn head_payload(status: u16, headers: &http::HeaderMap, body: Option<&[u8]>) -> Bytes {
    let mut out = BytesMut::with_capacity(64 + body.map_or(0, <[u8]>::len));
    out.put_u16(status);
    put_headers(
        &mut out,
        headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())),
    );
    if let Some(b) = body {
        out.put_slice(b);
    }
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn joined(pieces: [Bytes; 3]) -> BytesMut {
        let mut b = BytesMut::new();
        for p in pieces {
            b.put_slice(&p);
        }
        b
    }

    #[test]
    fn frames_round_trip_and_wait_for_their_last_byte() {
        let mut buf = joined(frame(7, DATA, 0, Bytes::from_static(b"hello")));
        buf.put_slice(&joined(frame(8, END, 0, Bytes::new())));
        let whole = buf.clone();
        for cut in 0..HEAD_BYTES + 5 + 4 {
            let mut part = BytesMut::from(&whole[..cut]);
            assert!(take_frame(&mut part).unwrap().is_none(), "{cut}");
        }
        let f = take_frame(&mut buf).unwrap().unwrap();
        assert_eq!((f.id, f.kind, &f.payload[..]), (7, DATA, &b"hello"[..]));
        let f = take_frame(&mut buf).unwrap().unwrap();
        assert_eq!((f.id, f.kind, f.payload.len()), (8, END, 0));
        assert!(buf.is_empty());
    }

    #[test]
    fn a_changed_byte_anywhere_fails_the_frame() {
        let whole = joined(frame(1, HEAD, WHOLE, Bytes::from_static(b"payload")));
        for i in 0..whole.len() {
            let mut b = whole.clone();
            b[i] ^= 0x10;
            match take_frame(&mut b) {
                Err(_) => {}
                // A changed length may make the frame look unfinished; never a frame.
                Ok(None) => assert!(i < 4, "byte {i}"),
                Ok(Some(f)) => panic!("byte {i} changed and {f:?} was taken"),
            }
        }
    }

    #[test]
    fn requests_and_heads_encode_what_they_carry() {
        let p = request_payload(3, 42, "/o/1/2/k?meta", &[("x-a", "b".into())], b"body");
        let mut p = p;
        assert_eq!(method_of(p.get_u8()), Some(http::Method::POST));
        assert_eq!(get_u64(&mut p), Some(42));
        let n = get_u16(&mut p).unwrap() as usize;
        assert_eq!(&take(&mut p, n).unwrap()[..], b"/o/1/2/k?meta");
        assert_eq!(get_headers(&mut p).unwrap()["x-a"], "b");
        assert_eq!(&p[..], b"body");
        let mut h = http::HeaderMap::new();
        h.insert("x-packrat-crc", http::HeaderValue::from(5u32));
        let mut p = head_payload(404, &h, Some(b"gone"));
        assert_eq!(get_u16(&mut p), Some(404));
        assert_eq!(get_headers(&mut p).unwrap()["x-packrat-crc"], "5");
        assert_eq!(&p[..], b"gone");
        assert!(get_headers(&mut Bytes::from_static(&[0, 1, 0])).is_none());
    }
}
