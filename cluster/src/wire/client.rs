//! The client gateways and nodes call each other with: one multiplexed connection per node
//! ([`crate::mux`]), or pooled HTTP connections to a node of an older build (and with
//! `PACKRAT_INTERNAL_HTTP=1`); timeouts by size, and answers read with their CRC32C checked.

use super::*;

pub type NodeBody = Full<Bytes>;

/// How long one node may take to answer a write of `bytes` to its successor: a hung node (a
/// stopped process, a machine that stalls) must not hold writes for longer than a failover.
pub fn hop_timeout(bytes: usize) -> Duration {
    Duration::from_secs(3) + Duration::from_secs_f64(bytes as f64 / (32.0 * 1024.0 * 1024.0))
}

/// How long a pooled connection to a node stays open unused.
pub const POOL_IDLE: Duration = Duration::from_secs(30);

/// How long a read may wait for a node's answer to start before another replica is tried.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// A request to a node: its method, its path with the query, headers of its own (the secret
/// and the epoch are added), its body.
#[derive(Clone)]
pub struct Call<'a> {
    pub method: http::Method,
    pub path: &'a str,
    pub headers: &'a [(&'a str, String)],
    pub body: Bytes,
}

impl<'a> Call<'a> {
    /// A request with no headers of its own and no body.
    pub fn new(method: http::Method, path: &'a str) -> Self {
        Call {
            method,
            path,
            headers: &[],
            body: Bytes::new(),
        }
    }
}

/// The internal API's client: a multiplexed connection to every node, HTTP where a node
/// speaks only that.
#[derive(Clone)]
pub struct NodeClient {
    http: Client<HttpConnector, NodeBody>,
    /// `None` with `PACKRAT_INTERNAL_HTTP=1`: every call over HTTP.
    mux: Option<std::sync::Arc<crate::mux::client::MuxPool>>,
    secret: String,
    /// In a node's own process (its S3 read endpoint's store): calls to the node itself, by
    /// its advertised address, go to its handler with no socket in between.
    beside: Option<(String, InProcess)>,
}

/// A node's handler, called in its own process (see [`NodeClient::beside`]): the same one a
/// connection's requests reach, so the fences, epoch checks and in-flight bound hold alike.
pub type InProcess = std::sync::Arc<
    dyn Fn(http::Request<Full<Bytes>>) -> futures_util::future::BoxFuture<'static, LocalAnswer>
        + Send
        + Sync,
>;

/// A lookup by the store beside a node, answered by the node with no request in between
/// (bucket id, PG, key, the largest object sent with its metadata).
pub type NearReads = std::sync::Arc<
    dyn Fn(u64, u32, String, u64) -> futures_util::future::BoxFuture<'static, NearRead>
        + Send
        + Sync,
>;

/// A batch GET planned by the node beside the store in its own store (see
/// `Node::batch_here`): bucket id, each item's PG, the items, their order. The items come
/// back when the node does not answer them all itself.
pub type NearBatches = std::sync::Arc<
    dyn Fn(
            u64,
            Vec<u32>,
            Vec<packrat_store_api::batch::BatchItem>,
            packrat_store_api::batch::BatchOrder,
        ) -> futures_util::future::BoxFuture<
            'static,
            Result<packrat_store_api::batch::BatchPlan, Vec<packrat_store_api::batch::BatchItem>>,
        > + Send
        + Sync,
>;

/// A node's plan of a batch in its own store, which reads it (the `plan` of a
/// [`NearBatches`] answer).
pub struct NearPlan {
    pub plan: packrat_store_api::batch::BatchPlan,
    pub store: std::sync::Arc<dyn packrat_store_api::replica::ReplicaStore>,
}

/// What a node's own lookup found.
pub enum NearRead {
    /// A committed copy: its metadata, and its bytes when it is small.
    Found(Box<WireMeta>, Option<Bytes>),
    /// No such key (committed: no write of it is under way here).
    Missing,
    /// Not answered here (a write under way, a fence, a refusal, an error): ask the chain.
    Elsewhere,
}

/// A node's answer to a call made in its own process.
pub type LocalAnswer =
    http::Response<http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>>;

/// A node's own answer body, made `Sync` (a batch reader holds its answers across awaits by
/// reference): the mutex is never locked, only reached through `&mut` (`get_mut`).
pub struct LocalBody(
    std::sync::Mutex<http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>>,
);

impl hyper::body::Body for LocalBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, std::io::Error>>> {
        let body = self
            .get_mut()
            .0
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        std::pin::Pin::new(body).poll_frame(cx)
    }
}

/// A node's answer.
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: AnswerBody,
}

/// An answer's body: over HTTP as it arrives; or whole (one of a relayed request's answers,
/// see [`crate::relay`], or one a multiplexed connection brought in one frame); or streamed
/// over a multiplexed connection; or the node's own body, in its own process.
pub type AnswerBody = http_body_util::Either<
    hyper::body::Incoming,
    http_body_util::Either<
        Full<Bytes>,
        http_body_util::Either<crate::mux::client::MuxBody, LocalBody>,
    >,
>;

impl Answer {
    /// An answer already received whole (no headers).
    pub fn whole(status: u16, body: Bytes) -> Answer {
        Answer {
            status,
            headers: http::HeaderMap::new(),
            body: http_body_util::Either::Right(http_body_util::Either::Left(Full::new(body))),
        }
    }

    /// The whole body, checked against the CRC32C the node sent with it.
    pub async fn bytes(self) -> StoreResult<Bytes> {
        let mut crc = AnswerCrc::new(&self.headers);
        let collected = self
            .body
            .collect()
            .await
            .map_err(|e| StoreError::Unavailable(format!("storage node: {e}")))?;
        if let Some(t) = collected.trailers() {
            crc.trailers(t);
        }
        let b = collected.to_bytes();
        crc.data(&b);
        crc.end()?;
        Ok(b)
    }

    pub async fn json<T: serde::de::DeserializeOwned>(self) -> StoreResult<T> {
        let b = self.bytes().await?;
        serde_json::from_slice(&b).map_err(|e| StoreError::internal("storage node answer", e))
    }

    /// The store error a 4xx/5xx answer carries.
    pub async fn error(self) -> StoreError {
        let status = self.status;
        match self.bytes().await {
            Ok(b) => match serde_json::from_slice::<WireError>(&b) {
                Ok(e) => e.into_store_error(),
                Err(_) => StoreError::Unavailable(format!(
                    "storage node answered {status}: {}",
                    String::from_utf8_lossy(&b)
                )),
            },
            Err(e) => e,
        }
    }
}

impl NodeClient {
    pub fn new(trust: &crate::Trust) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        // A pooled connection to a node cut off by the network is found dead by the kernel's
        // keepalive probes, not kept for a request to hang on until its timeout.
        connector.set_keepalive(Some(Duration::from_secs(5)));
        connector.set_keepalive_interval(Some(Duration::from_secs(2)));
        connector.set_keepalive_retries(Some(3));
        let http = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        let mux = (!crate::mux::http_only())
            .then(|| std::sync::Arc::new(crate::mux::client::MuxPool::new(trust.clone())));
        NodeClient {
            http,
            mux,
            secret: trust.secret.clone(),
            beside: None,
        }
    }

    /// This client, in the process of the node that answers at `addr` with `handler`: its
    /// calls to that address are made in-process.
    pub fn beside(mut self, addr: String, handler: InProcess) -> Self {
        self.beside = Some((addr, handler));
        self
    }

    /// `call` as an HTTP request to `uri`, with the secret and the epoch a node checks.
    fn request(
        &self,
        call: Call<'_>,
        uri: String,
        epoch: u64,
    ) -> StoreResult<http::Request<Full<Bytes>>> {
        let mut req = http::Request::builder()
            .method(call.method)
            .uri(uri)
            .header(SECRET_HEADER, &self.secret)
            .header(EPOCH_HEADER, epoch)
            // A streamed answer's CRC32C comes as a trailer (see `ANSWER_CRC_HEADER`).
            .header(http::header::TE, "trailers");
        for (k, v) in call.headers {
            req = req.header(*k, v);
        }
        req.body(Full::new(call.body))
            .map_err(|e| StoreError::internal("node request", e))
    }

    /// A call to the node this client runs beside, made in-process.
    async fn send_beside(
        &self,
        handler: &InProcess,
        call: Call<'_>,
        epoch: u64,
        timeout: Duration,
    ) -> StoreResult<Answer> {
        let uri = call.path.to_string();
        let req = self.request(call, uri, epoch)?;
        let resp = tokio::time::timeout(timeout, handler(req))
            .await
            .map_err(|_| StoreError::Unavailable("this storage node did not answer".into()))?;
        let (parts, body) = resp.into_parts();
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: http_body_util::Either::Right(http_body_util::Either::Right(
                http_body_util::Either::Right(LocalBody(std::sync::Mutex::new(body))),
            )),
        })
    }

    /// Sends a request to the node at `addr`. Connection failures (a dead node) are
    /// `Unavailable`; so is a node that does not answer within `timeout`.
    pub async fn send(
        &self,
        call: Call<'_>,
        addr: &str,
        epoch: u64,
        timeout: Duration,
    ) -> StoreResult<Answer> {
        if let Some((own, handler)) = &self.beside
            && own == addr
        {
            return self.send_beside(handler, call, epoch, timeout).await;
        }
        if let Some(mux) = &self.mux {
            match mux.send(&call, addr, epoch, timeout).await {
                crate::mux::client::Sent::Answered(a) => return Ok(a),
                crate::mux::client::Sent::Failed(e) => return Err(e),
                crate::mux::client::Sent::HttpOnly => {}
            }
        }
        let uri = format!("http://{addr}{}", call.path);
        let req = self.request(call, uri, epoch)?;
        let resp = tokio::time::timeout(timeout, self.http.request(req))
            .await
            .map_err(|_| StoreError::Unavailable(format!("storage node {addr} did not answer")))?
            .map_err(|e| StoreError::Unavailable(format!("storage node {addr}: {e}")))?;
        let (parts, body) = resp.into_parts();
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: http_body_util::Either::Left(body),
        })
    }
}
