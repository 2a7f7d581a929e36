//! The HTTP side: accepting connections, request ids, health and metrics, authentication, and
//! turning every result into a response. S3 semantics live in `s3::handlers`.

use crate::metrics::Observation;
use crate::s3::body::{BodyReader, BodySource, ChunkSigning, PayloadMode};
use crate::s3::error::{S3Error, S3ErrorCode, S3Result};
use crate::s3::headers::RequestHeaders;
use crate::s3::{auth, handlers, sigv4, xml};
pub use crate::state::{
    AppState, Conn, Handshake, Handshaken, HttpFaults, RespBody, S3Request, empty, full,
};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use packrat_store_api::Identity;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;
use tokio::net::TcpListener;

/// Serves until `stop` completes, then drains: no new connections are accepted, requests
/// under way run to their end (a streamed GET to its last byte, an upload to its answer), idle
/// keep-alive connections are closed, and after `drain` the ones still busy are cut. Returns
/// once every connection is closed (or cut), so the store can be closed behind it.
pub async fn serve(
    listener: TcpListener,
    state: Arc<AppState>,
    stop: impl std::future::Future<Output = ()>,
    drain: std::time::Duration,
) -> std::io::Result<()> {
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    tokio::pin!(stop);
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut stop => break,
        };
        let (stream, peer) = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Running out of file descriptors must not end the server.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let Ok(permit) = state.connections.clone().try_acquire_owned() else {
            // Over the connection limit: answer 503 SlowDown and close, so the client backs
            // off instead of hanging in the accept queue.
            state.metrics.connections_refused.inc();
            tokio::spawn(refuse_connection(stream));
            continue;
        };
        state.metrics.connections_accepted.inc();
        let open = OpenConnection::new(&state);
        let state = state.clone();
        let (header_timeout, max_headers, max_header_bytes) = (
            state.config.header_timeout_secs,
            state.config.max_headers,
            state.config.max_header_bytes,
        );
        let tls = state.tls.clone();
        let conn = ConnInfo {
            peer: Some(peer.ip()),
            secure: tls.is_some(),
        };
        let svc = hyper::service::service_fn(move |req| {
            let state = state.clone();
            async move { Ok::<_, Infallible>(handle(state, req, conn).await) }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(std::time::Duration::from_secs(header_timeout))
            .max_headers(max_headers)
            .max_buf_size(max_header_bytes);
        match tls {
            None => {
                let io = hyper_util::rt::TokioIo::new(stream);
                let conn = graceful.watch(builder.serve_connection(io, svc));
                tokio::spawn(async move {
                    let _held = (permit, open);
                    let _ = conn.await;
                });
            }
            Some(tls) => {
                // The handshake happens in the connection's task; a connection that never
                // completes it is dropped after the header timeout. Connections still in their
                // handshake when a stop begins are not drained (they have no request yet).
                let watcher = graceful.watcher();
                let limit = std::time::Duration::from_secs(header_timeout);
                tokio::spawn(async move {
                    let _held = (permit, open);
                    let io = match tokio::time::timeout(limit, tls.accept(stream)).await {
                        Ok(Ok(io)) => io,
                        Ok(Err(e)) => {
                            _held.1.state.metrics.tls_handshake_failures.inc();
                            tracing::debug!(error = %e, "TLS handshake failed");
                            return;
                        }
                        Err(_) => {
                            _held.1.state.metrics.tls_handshake_failures.inc();
                            return;
                        }
                    };
                    let conn = builder.serve_connection(hyper_util::rt::TokioIo::new(io), svc);
                    let _ = watcher.watch(conn).await;
                });
            }
        }
    }
    drop(listener);
    let open = state.open_connections();
    tracing::info!(
        connections = open,
        drain_secs = drain.as_secs(),
        "draining connections"
    );
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(drain) => {
            let open = state.open_connections();
            tracing::warn!(connections = open, "drain deadline passed; cutting the connections still open");
        }
    }
    if let Some(log) = &state.access_log {
        log.flush();
    }
    Ok(())
}

/// Counts a connection in `packrat_connections_open` for as long as it lives.
struct OpenConnection {
    state: Arc<AppState>,
}

impl OpenConnection {
    fn new(state: &Arc<AppState>) -> Self {
        state.metrics.connections_open.inc();
        Self {
            state: state.clone(),
        }
    }
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.state.metrics.connections_open.dec();
    }
}

async fn refuse_connection(mut stream: tokio::net::TcpStream) {
    use tokio::io::AsyncWriteExt;
    let (code, status) = S3ErrorCode::SlowDown.parts();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>The server has too many open connections; please retry.</Message></Error>"
    );
    let resp = format!(
        "HTTP/1.1 {} {}\r\ncontent-type: application/xml\r\ncontent-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        status.as_u16(),
        status.canonical_reason().unwrap_or(""),
        body.len()
    );
    let write = stream.write_all(resp.as_bytes());
    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), write).await;
    let _ = stream.shutdown().await;
}

/// What a request's connection tells about it.
#[derive(Clone, Copy)]
pub struct ConnInfo {
    pub peer: Option<std::net::IpAddr>,
    pub secure: bool,
}

async fn handle(
    state: Arc<AppState>,
    req: Request<Incoming>,
    conn: ConnInfo,
) -> Response<RespBody> {
    let started = Instant::now();
    let request_id = state.next_request_id();
    let method = req.method().clone();
    let is_head = method == Method::HEAD;
    let bytes_in = req
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let mut who = Who::default();
    let (op, result) = route_and_run(&state, req, &mut who, conn).await;
    let mut resp = match result {
        Ok(r) => r,
        Err(e) => error_response(&e, &request_id, is_head),
    };
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        h.insert(&crate::s3::headers::X_AMZ_REQUEST_ID, v.clone());
        h.insert(&crate::s3::headers::X_AMZ_ID_2, v);
    }
    h.insert(http::header::SERVER, HeaderValue::from_static("packrat"));
    let status = resp.status().as_u16();
    let done = Finished {
        state,
        op,
        status,
        started,
        bytes_in,
        method,
        request_id,
        who,
    };
    resp.map(|body| Metered::new(body, done).boxed_unsync())
}

/// Who asked for what, for the access log (filled only when it is on).
#[derive(Default)]
pub struct Who {
    bucket: Option<String>,
    key: Option<String>,
    access_key: Option<String>,
}

/// What is known of a request once its reply is built; counted and logged when the reply's
/// body ends.
struct Finished {
    state: Arc<AppState>,
    op: &'static str,
    status: u16,
    started: Instant,
    bytes_in: u64,
    method: Method,
    request_id: String,
    who: Who,
}

impl Finished {
    fn record(self, bytes_out: u64, complete: bool) {
        let elapsed = self.started.elapsed();
        self.state.metrics.observe(&Observation {
            op: self.op,
            status: self.status,
            elapsed,
            bytes_in: self.bytes_in,
            bytes_out,
        });
        if let Some(log) = &self.state.access_log {
            // Never the secret, the signature or the query string (a presigned URL's
            // signature is a credential for as long as it lives).
            log.log(&crate::access_log::Entry {
                method: self.method.as_str(),
                op: self.op,
                bucket: self.who.bucket.as_deref().unwrap_or(""),
                key: self.who.key.as_deref().unwrap_or(""),
                status: self.status,
                bytes_in: self.bytes_in,
                bytes_out,
                complete,
                duration_ms: elapsed.as_secs_f64() * 1e3,
                request_id: &self.request_id,
                access_key: self.who.access_key.as_deref().unwrap_or(""),
            });
        }
    }
}

/// A reply body that counts what it sends and records the request when it ends: at its last
/// frame, or when hyper drops it (the client went away; `complete` is then false).
struct Metered {
    inner: RespBody,
    sent: u64,
    done: Option<Finished>,
}

impl Metered {
    fn new(inner: RespBody, done: Finished) -> Self {
        Self {
            inner,
            sent: 0,
            done: Some(done),
        }
    }

    fn finish(&mut self, complete: bool) {
        if let Some(done) = self.done.take() {
            done.record(self.sent, complete);
        }
    }
}

impl http_body::Body for Metered {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, std::io::Error>>> {
        let this = &mut *self;
        let frame = std::task::ready!(std::pin::Pin::new(&mut this.inner).poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(d) = f.data_ref() {
                    this.sent += d.len() as u64;
                }
                if this.inner.is_end_stream() {
                    this.finish(true);
                }
            }
            Some(Err(_)) => this.finish(false),
            None => this.finish(true),
        }
        std::task::Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Metered {
    fn drop(&mut self) {
        // An empty body is never polled: it is complete when dropped.
        let complete = http_body::Body::is_end_stream(&self.inner);
        self.finish(complete);
    }
}

pub fn error_response(e: &S3Error, request_id: &str, is_head: bool) -> Response<RespBody> {
    let (code, status) = e.code.parts();
    let mut b = Response::builder().status(status);
    for (k, v) in &e.headers {
        b = b.header(*k, v.as_str());
    }
    if is_head || status == StatusCode::NOT_MODIFIED {
        return b.body(empty()).unwrap_or_else(|_| Response::new(empty()));
    }
    let mut x = xml::Xml::new();
    x.open("Error");
    x.elem("Code", code);
    x.elem("Message", &e.message);
    x.elem("RequestId", request_id);
    x.close("Error");
    b.header("content-type", "application/xml")
        .body(full(x.finish()))
        .unwrap_or_else(|_| Response::new(empty()))
}

async fn route_and_run(
    state: &Arc<AppState>,
    req: Request<Incoming>,
    who: &mut Who,
    conn: ConnInfo,
) -> (&'static str, S3Result<Response<RespBody>>) {
    let (parts, body) = req.into_parts();
    let raw_path = parts.uri.path().to_string();
    let raw_query = parts.uri.query().unwrap_or("").to_string();
    let signed = parts.headers.contains_key(http::header::AUTHORIZATION)
        || raw_query.contains("X-Amz-Signature=");
    // Health and metrics answer unsigned requests only, so a bucket named `health` or `metrics`
    // stays reachable through signed S3 requests.
    if !signed && parts.method == Method::GET {
        match raw_path.as_str() {
            "/health/live" => return ("health", Ok(text(StatusCode::OK, "ok\n"))),
            // Ready once the store is open (recovery is done before the listener exists) and
            // while it can take writes; the reason otherwise, with 503.
            "/health/ready" => {
                let r = match state.store.write_readiness() {
                    Ok(()) => text(StatusCode::OK, "ready\n"),
                    Err(why) => text(
                        StatusCode::SERVICE_UNAVAILABLE,
                        &format!("not ready: {why}\n"),
                    ),
                };
                return ("health", Ok(r));
            }
            "/metrics" => {
                return (
                    "metrics",
                    Ok(text_as(
                        StatusCode::OK,
                        &state.metrics.render(),
                        crate::metrics::CONTENT_TYPE,
                    )),
                );
            }
            _ => {}
        }
    }
    if !signed
        && !state.config.reads_only
        && crate::console::is_route(&parts.method, &raw_path, &raw_query)
    {
        let r = crate::console::handle(state, &parts.method, &raw_path, &parts.headers, body).await;
        return ("console", Ok(r));
    }
    let query = sigv4::parse_query(&raw_query);
    let keys = |ak: &str| -> S3Result<Option<Identity>> { Ok(state.store.access_key(ak)?) };
    let ctx = auth::AuthContext {
        now_secs: state.clock.now_ms().div_euclid(1000),
        region: &state.config.region,
        signing_keys: &state.signing_keys,
        access_key: &keys,
    };
    // A CORS preflight carries no credentials by definition (a browser sends none, though a
    // presigned URL's query rides along, signed for another method): it is answered from the
    // bucket's rules alone, and `OPTIONS` does nothing else.
    let outcome = if parts.method == Method::OPTIONS {
        Ok((None, None, crate::s3::body::PayloadMode::Unsigned))
    } else {
        auth::authenticate(
            &ctx,
            &parts.method,
            &raw_path,
            &raw_query,
            &query,
            &parts.headers,
        )
    };
    let identity = match outcome {
        Ok(i) => i,
        Err(e) => return ("auth", Err(e)),
    };
    let (identity, signing, payload_mode) = identity;
    // An unsigned request from a signed-in web console acts as the session's key.
    let identity = match identity {
        Some(id) => Some(id),
        None if !signed => match crate::console::identity(state, &parts.headers).await {
            Ok(id) => id,
            Err(e) => return ("auth", Err(e)),
        },
        None => None,
    };
    if state.access_log.is_some() {
        who.access_key = identity.as_ref().map(|i| i.access_key.clone());
    }
    let body_reader = match make_body_reader(&parts.headers, body, payload_mode, signing) {
        Ok(b) => b.with_idle_timeout(std::time::Duration::from_secs(
            state.config.body_idle_timeout_secs,
        )),
        Err(e) => return ("body", Err(e)),
    };
    if raw_path.starts_with(crate::admin::ADMIN_PREFIX) {
        if state.config.reads_only {
            return ("admin", Err(crate::s3::handlers::not_a_node_read()));
        }
        let r = crate::admin::handle(
            state,
            &parts.method,
            &raw_path,
            &query,
            identity.as_ref(),
            body_reader,
        )
        .await;
        return ("admin", r);
    }
    let (bucket, key) = match crate::s3::route::split_target(
        state.config.domain.as_deref(),
        &parts.headers,
        &raw_path,
    ) {
        Ok(t) => t,
        Err(e) => return ("route", Err(e)),
    };
    if state.access_log.is_some() {
        who.bucket.clone_from(&bucket);
        who.key.clone_from(&key);
    }
    let s3req = S3Request {
        method: parts.method,
        query,
        headers: RequestHeaders::new(parts.headers),
        bucket,
        key,
        body: body_reader,
        identity,
        peer: conn.peer,
        secure: conn.secure,
        sse_c_allowed: conn.secure || state.config.allow_insecure_sse_c,
    };
    handlers::dispatch(state, s3req).await
}

fn text(status: StatusCode, s: &str) -> Response<RespBody> {
    text_as(status, s, "text/plain; charset=utf-8")
}

fn text_as(status: StatusCode, s: &str, content_type: &'static str) -> Response<RespBody> {
    let mut r = Response::new(full(s.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static(content_type));
    r
}

fn make_body_reader(
    headers: &HeaderMap,
    body: Incoming,
    mode: PayloadMode,
    signing: Option<ChunkSigning>,
) -> S3Result<BodyReader> {
    let num = |name: &HeaderName| -> S3Result<Option<u64>> {
        match headers.get(name) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .map(Some)
                .ok_or_else(|| {
                    S3Error::new(
                        S3ErrorCode::InvalidArgument,
                        format!("{name} is not a number"),
                    )
                }),
        }
    };
    let expected = if mode.is_chunked() {
        num(&crate::s3::headers::X_AMZ_DECODED_CONTENT_LENGTH)?
    } else {
        num(&http::header::CONTENT_LENGTH)?
    };
    if expected.is_some_and(|n| n > crate::config::OBJECT_BYTES_MAX) {
        return Err(S3Error::new(
            S3ErrorCode::EntityTooLarge,
            "Your proposed upload exceeds the maximum allowed size",
        ));
    }
    Ok(BodyReader::new(
        Some(BodySource::Hyper(body)),
        mode,
        signing,
        expected,
        crate::config::OBJECT_BYTES_MAX,
    ))
}
