//! The multiplexed internal connection (`packrat_cluster::mux`) on real loopback sockets: many
//! requests in flight on one connection, streamed answers with their own flow control, and
//! what must fail cleanly: a cut, a corrupted frame, a wrong secret, a restarted node, and a
//! node that speaks only HTTP (an older build).

use bytes::{BufMut, Bytes, BytesMut};
use http_body_util::{BodyExt, Full, StreamBody};
use packrat_cluster::mux::client::{MuxPool, Sent};
use packrat_cluster::mux::{self, server};
use packrat_cluster::wire::Call;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type Resp = http::Response<http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>>;

const SECRET: &str = "the-cluster-secret";
const CLUSTER: &str = "cluster-0123";

fn trust(secret: &str, cluster: &str) -> packrat_cluster::Trust {
    packrat_cluster::Trust {
        secret: secret.into(),
        cluster: cluster.into(),
    }
}

/// The test node's answers: `/echo` sends back the path and body; `/stream/N` streams N
/// pieces of 1 KiB, then a trailer; `/slow` answers after a second.
async fn handle(req: http::Request<Full<Bytes>>) -> Resp {
    let path = req.uri().to_string();
    let epoch = req.headers()[packrat_cluster::wire::EPOCH_HEADER]
        .to_str()
        .unwrap()
        .to_string();
    let body = req.into_body().collect().await.unwrap().to_bytes();
    if let Some(n) = path.strip_prefix("/stream/") {
        let n: usize = n.parse().unwrap();
        let pieces = (0..n)
            .map(|i| {
                Ok::<_, std::io::Error>(http_body::Frame::data(Bytes::from(vec![i as u8; 1024])))
            })
            .chain(std::iter::once(Ok(http_body::Frame::trailers({
                let mut t = http::HeaderMap::new();
                t.insert("x-end", http::HeaderValue::from(n));
                t
            }))));
        let body = StreamBody::new(futures_util::stream::iter(pieces));
        return http::Response::new(body.boxed_unsync());
    }
    if path == "/big" {
        // Larger than one frame's piece: sent as several.
        let big: Vec<u8> = (0..9 << 20).map(|i: u32| (i % 251) as u8).collect();
        return http::Response::new(
            Full::new(Bytes::from(big))
                .map_err(|never| match never {})
                .boxed_unsync(),
        );
    }
    if path == "/slow" {
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let mut out = BytesMut::new();
    out.put_slice(format!("{path} {epoch} ").as_bytes());
    out.put_slice(&body);
    let mut r = http::Response::new(
        Full::new(out.freeze())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    r.headers_mut()
        .insert("x-seen", http::HeaderValue::from_static("yes"));
    r
}

/// A node serving the test handler on a loopback port; answers its address, how many
/// connections it accepted, and its task.
async fn node(secret: &str, port: u16) -> (String, Arc<AtomicUsize>, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    let trusted = trust(secret, CLUSTER);
    let task = tokio::spawn(async move {
        let mut conns = tokio::task::JoinSet::new();
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            count.fetch_add(1, Ordering::SeqCst);
            assert!(server::is_mux(&stream, Duration::from_secs(2)).await);
            conns.spawn(server::serve(
                stream,
                trusted.clone(),
                Duration::from_secs(2),
                handle,
            ));
        }
    });
    (addr, accepted, task)
}

fn call<'a>(path: &'a str, body: &'static [u8]) -> Call<'a> {
    Call {
        method: http::Method::POST,
        path,
        headers: &[],
        body: Bytes::from_static(body),
    }
}

async fn send(
    pool: &MuxPool,
    c: Call<'_>,
    addr: &str,
) -> Result<packrat_cluster::wire::Answer, String> {
    match pool.send(&c, addr, 7, Duration::from_secs(5)).await {
        Sent::Answered(a) => Ok(a),
        Sent::Failed(e) => Err(e.to_string()),
        Sent::HttpOnly => Err("http only".into()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_share_one_connection() {
    let (addr, accepted, task) = node(SECRET, 0).await;
    let pool = Arc::new(MuxPool::new(trust(SECRET, CLUSTER)));
    let mut all = tokio::task::JoinSet::new();
    for i in 0..300 {
        let (pool, addr) = (pool.clone(), addr.clone());
        all.spawn(async move {
            let path = format!("/echo/{i}");
            let a = send(&pool, call(&path, b"payload"), &addr).await.unwrap();
            assert_eq!(
                (a.status, a.headers["x-seen"].to_str().unwrap()),
                (200, "yes")
            );
            let got = a.body.collect().await.unwrap().to_bytes();
            assert_eq!(&got[..], format!("/echo/{i} 7 payload").as_bytes());
        });
    }
    // A slow answer holds back none of the others.
    let slow = {
        let (pool, addr) = (pool.clone(), addr.clone());
        tokio::spawn(async move {
            send(&pool, call("/slow", b""), &addr)
                .await
                .map(|a| a.status)
        })
    };
    while let Some(r) = all.join_next().await {
        r.unwrap();
    }
    assert!(!slow.is_finished(), "the fast ones finished first");
    assert_eq!(slow.await.unwrap(), Ok(200));
    assert_eq!(accepted.load(Ordering::SeqCst), 1, "one connection");
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_answers_keep_their_trailers_and_a_stalled_one_holds_back_no_other() {
    let (addr, _, task) = node(SECRET, 0).await;
    let pool = MuxPool::new(trust(SECRET, CLUSTER));
    // Not read: far more pieces than the window.
    let stalled = send(&pool, call("/stream/500", b""), &addr).await.unwrap();
    let a = send(&pool, call("/stream/300", b""), &addr).await.unwrap();
    let got = a.body.collect().await.unwrap();
    assert_eq!(got.trailers().unwrap()["x-end"], "300");
    let bytes = got.to_bytes();
    assert_eq!(bytes.len(), 300 * 1024);
    assert!(
        bytes
            .chunks(1024)
            .enumerate()
            .all(|(i, c)| c.iter().all(|b| *b == i as u8))
    );
    // The stalled one still reads whole, and one dropped unread is cancelled.
    let got = stalled.body.collect().await.unwrap().to_bytes();
    assert_eq!(got.len(), 500 * 1024);
    drop(send(&pool, call("/stream/1000", b""), &addr).await.unwrap());
    // A whole answer larger than a frame's piece comes in pieces, whole.
    let got = send(&pool, call("/big", b""), &addr)
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .to_bytes();
    assert_eq!(got.len(), 9 << 20);
    assert!(got.iter().enumerate().all(|(i, b)| *b == (i % 251) as u8));
    let a = send(&pool, call("/echo/after", b""), &addr).await.unwrap();
    assert_eq!(a.status, 200);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_secret_or_cluster_is_refused() {
    let (addr, _, task) = node(SECRET, 0).await;
    let pool = MuxPool::new(trust("another-secret", CLUSTER));
    let e = send(&pool, call("/echo/x", b""), &addr)
        .await
        .err()
        .unwrap();
    assert!(e.contains("cluster secret wrong"), "{e}");
    // The right secret of another cluster (a copied configuration): refused, both named.
    let pool = MuxPool::new(trust(SECRET, "cluster-4567"));
    let e = send(&pool, call("/echo/x", b""), &addr)
        .await
        .err()
        .unwrap();
    assert!(
        e.contains("this node is in cluster-0123, not in cluster-4567"),
        "{e}"
    );
    // The control: both right.
    let pool = MuxPool::new(trust(SECRET, CLUSTER));
    let a = send(&pool, call("/echo/x", b""), &addr).await.unwrap();
    assert_eq!(a.status, 200);
    task.abort();
}

/// A node that completes the preface, then answers every request with `bytes`, then closes.
async fn raw_node(bytes: Vec<u8>) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let bytes = bytes.clone();
            tokio::spawn(async move {
                let mut head = [0u8; 5];
                s.read_exact(&mut head).await.unwrap();
                for _ in 0..2 {
                    let mut len = [0u8; 2];
                    s.read_exact(&mut len).await.unwrap();
                    let mut part = vec![0u8; u16::from_be_bytes(len) as usize];
                    s.read_exact(&mut part).await.unwrap();
                }
                s.write_all(b"PKMX\x02\x00\x00\x00").await.unwrap();
                let mut req = [0u8; 16];
                s.read_exact(&mut req).await.unwrap();
                s.write_all(&bytes).await.unwrap();
            });
        }
    });
    addr
}

fn whole_answer(id: u64) -> BytesMut {
    let mut out = BytesMut::new();
    for p in mux::frame(
        id,
        mux::HEAD,
        mux::WHOLE,
        mux::head_payload(200, &http::HeaderMap::new(), Some(b"ok")),
    ) {
        out.put_slice(&p);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_frame_or_a_cut_fails_the_request_never_a_wrong_answer() {
    let pool = MuxPool::new(trust(SECRET, CLUSTER));
    // The control: the same answer, intact, is taken.
    let addr = raw_node(whole_answer(1).to_vec()).await;
    let a = send(&pool, call("/x", b""), &addr).await.unwrap();
    assert_eq!(&a.body.collect().await.unwrap().to_bytes()[..], b"ok");
    for (what, bytes) in [
        ("a changed byte", {
            let mut b = whole_answer(1);
            let at = b.len() - 6;
            b[at] ^= 1;
            b.to_vec()
        }),
        ("a cut mid-frame", whole_answer(1)[..20].to_vec()),
        ("an unknown kind", {
            let mut b = whole_answer(1);
            b[12] = 99;
            b.to_vec()
        }),
    ] {
        let addr = raw_node(bytes).await;
        let e = send(&pool, call("/x", b""), &addr).await.err();
        assert!(
            e.as_deref()
                .is_some_and(|e| e.contains("unavailable") || e.contains("storage node")),
            "{what}: {e:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_node_is_reconnected() {
    let (addr, _, task) = node(SECRET, 0).await;
    let port: u16 = addr.rsplit(':').next().unwrap().parse().unwrap();
    let pool = MuxPool::new(trust(SECRET, CLUSTER));
    assert_eq!(
        send(&pool, call("/echo/1", b""), &addr)
            .await
            .unwrap()
            .status,
        200
    );
    task.abort();
    let _ = task.await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, accepted, task) = node(SECRET, port).await;
    let a = send(&pool, call("/echo/2", b""), &addr).await.unwrap();
    assert_eq!(a.status, 200);
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_speaks_only_http_is_told_apart() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut b = [0u8; 64];
        let _ = s.read(&mut b).await;
        s.write_all(b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            .await
            .unwrap();
    });
    let pool = MuxPool::new(trust(SECRET, CLUSTER));
    assert!(matches!(
        pool.send(&call("/x", b""), &addr, 1, Duration::from_secs(2))
            .await,
        Sent::HttpOnly
    ));
    // Remembered: no second preface for a while.
    assert!(matches!(
        pool.send(&call("/x", b""), &addr, 1, Duration::from_secs(2))
            .await,
        Sent::HttpOnly
    ));
}

/// A node cut off from the caller (here: one that takes the connection and never answers its
/// preface, as a black-holed network leaves a connect hanging) holds up only its own calls,
/// and only for their own time: a probe of it fails within its timeout (not the 2 s of a
/// connect), and a call to another node meanwhile is answered at once. Before, one connect at
/// a time for the whole pool made every call to every node wait behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_does_not_answer_holds_up_only_its_own_calls_for_their_own_time() {
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_addr = silent.local_addr().unwrap().to_string();
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        loop {
            let (s, _) = silent.accept().await.unwrap();
            kept.push(s);
        }
    });
    let (addr, _, task) = node(SECRET, 0).await;
    let pool = Arc::new(MuxPool::new(trust(SECRET, CLUSTER)));
    let probe = {
        let (pool, silent_addr) = (pool.clone(), silent_addr.clone());
        tokio::spawn(async move {
            let t = std::time::Instant::now();
            let c = call("/probe", b"");
            let sent = pool
                .send(&c, &silent_addr, 7, Duration::from_millis(300))
                .await;
            (matches!(sent, Sent::Failed(_)), t.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    let t = std::time::Instant::now();
    let a = send(&pool, call("/echo/meanwhile", b""), &addr)
        .await
        .unwrap();
    assert_eq!(a.status, 200);
    assert!(
        t.elapsed() < Duration::from_millis(250),
        "a call to a healthy node waited {:?} behind a connect to a silent one",
        t.elapsed()
    );
    let (failed, took) = probe.await.unwrap();
    assert!(failed, "a call to a node that never answers fails");
    assert!(
        took < Duration::from_millis(1000),
        "a 300 ms call to a silent node took {took:?}"
    );
    held.abort();
    task.abort();
}
