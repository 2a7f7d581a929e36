//! The node's listener: each connection served as the multiplexed internal connection
//! (`crate::mux`) or as HTTP (operators, and gateways and nodes of older builds).

use super::*;

impl Node {
    /// Serves the internal API on `listener` until `stop` resolves.
    pub async fn serve(
        self: Arc<Self>,
        listener: tokio::net::TcpListener,
        stop: impl std::future::Future<Output = ()>,
    ) {
        let graceful = hyper_util::server::graceful::GracefulShutdown::new();
        tokio::pin!(stop);
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let _ = stream.set_nodelay(true);
                    let node = self.clone();
                    let watcher = graceful.watcher();
                    tokio::spawn(async move {
                        // Gateways and nodes of this build open a multiplexed connection
                        // (`crate::mux`); operators and older builds speak HTTP.
                        if !crate::mux::http_only()
                            && crate::mux::server::is_mux(&stream, NODE_HEADER_TIMEOUT).await
                        {
                            // Not drained at a stop: a peer's connection lives as long as the
                            // peer, and waiting for it held every stop for the full drain time
                            // (10 s). Requests under way on it fail as at a crash, which the
                            // cluster retries or re-sends.
                            drop(watcher);
                            let trust = node.trust.clone();
                            let handler = move |req| node.clone().handle(req);
                            crate::mux::server::serve(stream, trust, NODE_HEADER_TIMEOUT, handler)
                                .await;
                            return;
                        }
                        let svc = hyper::service::service_fn(move |req| {
                            let node = node.clone();
                            async move { Ok::<_, std::convert::Infallible>(node.handle(req).await) }
                        });
                        // A peer that opens a connection and never finishes a request's head
                        // (or leaves it idle) is dropped after NODE_HEADER_TIMEOUT.
                        let conn = hyper::server::conn::http1::Builder::new()
                            .timer(hyper_util::rt::TokioTimer::new())
                            .header_read_timeout(NODE_HEADER_TIMEOUT)
                            .serve_connection(hyper_util::rt::TokioIo::new(stream), svc);
                        let _ = watcher.watch(conn).await;
                    });
                }
                _ = &mut stop => break,
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), graceful.shutdown()).await;
    }
}
