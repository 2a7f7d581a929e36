//! The node's end: the preface checked once (version, cluster id, secret), then each request handed to
//! the node's handler as an HTTP request would be, and its answer sent back whole in one
//! frame, or streamed against the client's credits.

use super::*;
use http_body::Body as _;
use http_body_util::{BodyExt, Full};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

/// Multiplexed connections this process accepted (welcomed), and the requests they carried.
pub static ACCEPTED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
pub static REQUESTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

type Resp = http::Response<http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>>;

/// Whether the connection's first bytes are [`MAGIC`]; `false` as soon as they cannot be (an
/// HTTP request), or after `wait` without them.
pub async fn is_mux(stream: &tokio::net::TcpStream, wait: Duration) -> bool {
    let look = async {
        let mut first = [0u8; 4];
        loop {
            let n = stream.peek(&mut first).await.unwrap_or(0);
            if n == 0 || first[..n] != MAGIC[..n] {
                return false;
            }
            if n == 4 {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(wait, look).await.unwrap_or(false)
}

/// Serves one multiplexed connection: `handle` answers each request (given the secret and
/// epoch headers an HTTP request carries, so the node's checks are the same).
pub async fn serve<H, F>(
    stream: tokio::net::TcpStream,
    trust: crate::Trust,
    preface_wait: Duration,
    handle: H,
) where
    H: Fn(http::Request<Full<Bytes>>) -> F + Send + Sync + 'static,
    F: Future<Output = Resp> + Send + 'static,
{
    let (mut rd, mut wr) = stream.into_split();
    let preface = async {
        let mut head = [0u8; 5];
        rd.read_exact(&mut head).await?;
        if head[4] != VERSION {
            return Ok::<_, std::io::Error>((head[4], Vec::new(), Vec::new()));
        }
        let mut parts = [Vec::new(), Vec::new()];
        for part in &mut parts {
            let mut len = [0u8; 2];
            rd.read_exact(&mut len).await?;
            part.resize(u16::from_be_bytes(len) as usize, 0);
            rd.read_exact(part).await?;
        }
        let [sent, cluster] = parts;
        Ok((head[4], sent, cluster))
    };
    let Ok(Ok((version, sent, cluster))) = tokio::time::timeout(preface_wait, preface).await else {
        return;
    };
    let refusal = if version != VERSION {
        Some(format!(
            "protocol version {version} (this node speaks {VERSION})"
        ))
    } else if cluster != trust.cluster.as_bytes() {
        Some(format!(
            "this node is in {}, not in {}",
            trust.cluster,
            String::from_utf8_lossy(&cluster)
        ))
    } else if !crate::constant_time_eq(&sent, trust.secret.as_bytes()) {
        Some("cluster secret wrong".to_string())
    } else {
        None
    };
    let mut welcome = BytesMut::new();
    welcome.put_slice(MAGIC);
    welcome.put_u8(VERSION);
    welcome.put_u8(refusal.is_some() as u8);
    let msg = refusal.clone().unwrap_or_default();
    welcome.put_u16(msg.len() as u16);
    welcome.put_slice(msg.as_bytes());
    if wr.write_all(&welcome).await.is_err() || refusal.is_some() {
        return;
    }
    ACCEPTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let (out, flusher) = Outbox::new(wr);
    tokio::spawn(flusher);
    // However this ends (the peer gone, or this task dropped), the flusher lets the socket go.
    let _closes = CloseOnDrop(out.clone());
    // What every request's secret header is: made once, each request gets a cheap clone.
    let Ok(secret_header) = http::HeaderValue::from_str(&trust.secret) else {
        return;
    };
    let streams: Arc<Mutex<HashMap<u64, Stream>>> = Arc::default();
    let handle = Arc::new(handle);
    let mut buf = BytesMut::with_capacity(256 * 1024);
    'conn: loop {
        loop {
            match take_frame(&mut buf) {
                Ok(Some(f)) => match f.kind {
                    REQ => {
                        REQUESTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(req) = request_of(f.payload, &secret_header) else {
                            break 'conn;
                        };
                        let (out, streams, handle) = (out.clone(), streams.clone(), handle.clone());
                        let id = f.id;
                        // Runs to its end even if the connection goes (a chain step is not
                        // cut short); only a stream's sending stops on CANCEL.
                        tokio::spawn(async move {
                            let resp = handle(req).await;
                            answer(id, resp, out, streams).await;
                        });
                    }
                    CREDIT => {
                        let n = get_u32(&mut f.payload.clone()).unwrap_or(0) as usize;
                        if let Some(s) = streams.lock().ok().and_then(|m| m.get(&f.id).cloned()) {
                            s.credits.add_permits(n.min(WINDOW as usize));
                        }
                    }
                    CANCEL => {
                        if let Some(s) = streams.lock().ok().and_then(|mut m| m.remove(&f.id)) {
                            s.cancelled.notify_one();
                        }
                    }
                    _ => break 'conn,
                },
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!("internal connection: {e}; closing it");
                    break 'conn;
                }
            }
        }
        if buf.capacity() - buf.len() < 64 * 1024 {
            buf.reserve(256 * 1024);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
    }
    // Streams still sending stop; requests still running finish, their answers dropped.
    if let Ok(mut m) = streams.lock() {
        for (_, s) in m.drain() {
            s.cancelled.notify_one();
        }
    }
}

struct CloseOnDrop(Arc<Outbox>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.close();
    }
}

#[derive(Clone)]
struct Stream {
    credits: Arc<Semaphore>,
    cancelled: Arc<tokio::sync::Notify>,
}

/// The HTTP request a `REQ` frame carries; `None` if it does not parse.
fn request_of(mut p: Bytes, secret: &http::HeaderValue) -> Option<http::Request<Full<Bytes>>> {
    let method = method_of(p.get_u8())?;
    let epoch = get_u64(&mut p)?;
    let n = get_u16(&mut p)? as usize;
    let path = take(&mut p, n)?;
    let mut headers = get_headers(&mut p)?;
    headers.insert(crate::wire::SECRET_HEADER, secret.clone());
    headers.insert(crate::wire::EPOCH_HEADER, http::HeaderValue::from(epoch));
    let mut req = http::Request::new(Full::new(p));
    *req.method_mut() = method;
    *req.uri_mut() = http::Uri::from_maybe_shared(path).ok()?;
    *req.headers_mut() = headers;
    Some(req)
}

/// Sends `resp` as request `id`'s answer: whole in its `HEAD` frame when the body is one
/// piece, else streamed.
async fn answer(id: u64, resp: Resp, out: Arc<Outbox>, streams: Arc<Mutex<HashMap<u64, Stream>>>) {
    let tx = &*out;
    let (parts, mut body) = resp.into_parts();
    let status = parts.status.as_u16();
    let first = if body.is_end_stream() {
        None
    } else {
        match body.frame().await {
            None => None,
            Some(Ok(f)) => match f.into_data() {
                Ok(d) => Some(d),
                Err(f) => {
                    // Trailers first: an empty body and its trailers.
                    let trailers = f.into_trailers().unwrap_or_default();
                    tx.send(frame(
                        id,
                        HEAD,
                        0,
                        head_payload(status, &parts.headers, None),
                    ));
                    tx.send(frame(id, END, 0, head_payload_trailers(&trailers)));
                    return;
                }
            },
            Some(Err(e)) => {
                tx.send(frame(
                    id,
                    HEAD,
                    0,
                    head_payload(status, &parts.headers, None),
                ));
                tx.send(frame(id, FAIL, 0, Bytes::from(e.to_string())));
                return;
            }
        }
    };
    if body.is_end_stream() && first.as_ref().is_none_or(|d| d.len() <= PIECE_MAX) {
        let whole = head_payload(
            status,
            &parts.headers,
            Some(first.as_deref().unwrap_or(&[])),
        );
        tx.send(frame(id, HEAD, WHOLE, whole));
        return;
    }
    let stream = Stream {
        credits: Arc::new(Semaphore::new(WINDOW as usize)),
        cancelled: Arc::new(tokio::sync::Notify::new()),
    };
    if let Ok(mut m) = streams.lock() {
        m.insert(id, stream.clone());
    }
    tx.send(frame(
        id,
        HEAD,
        0,
        head_payload(status, &parts.headers, None),
    ));
    let send = async {
        let mut next = first;
        loop {
            if let Some(mut d) = next.take() {
                while !d.is_empty() {
                    match stream.credits.acquire().await {
                        Ok(p) => p.forget(),
                        Err(_) => return,
                    }
                    let piece = d.split_to(d.len().min(PIECE_MAX));
                    tx.send(frame(id, DATA, 0, piece));
                }
            }
            match body.frame().await {
                None => {
                    tx.send(frame(
                        id,
                        END,
                        0,
                        head_payload_trailers(&http::HeaderMap::new()),
                    ));
                    return;
                }
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => next = Some(d),
                    Err(f) => {
                        let t = f.into_trailers().unwrap_or_default();
                        tx.send(frame(id, END, 0, head_payload_trailers(&t)));
                        return;
                    }
                },
                Some(Err(e)) => {
                    tx.send(frame(id, FAIL, 0, Bytes::from(e.to_string())));
                    return;
                }
            }
        }
    };
    tokio::select! {
        _ = send => {}
        _ = stream.cancelled.notified() => {}
    }
    if let Ok(mut m) = streams.lock() {
        m.remove(&id);
    }
}

fn head_payload_trailers(t: &http::HeaderMap) -> Bytes {
    let mut out = BytesMut::new();
    put_headers(&mut out, t.iter().map(|(k, v)| (k.as_str(), v.as_bytes())));
    out.freeze()
}
