//! Administration: access keys. The server side answers SigV4-signed requests of the root key
//! under `/_packrat/admin/` (a path no bucket can take: `_` is not allowed in bucket names);
//! the client side is `packrat admin ...`, which signs such requests, or opens a stopped
//! server's data directory directly with `--data-dir`.

use crate::s3::body::BodyReader;
use crate::s3::error::{S3Error, S3ErrorCode, S3Result};
use crate::s3::sigv4;
use crate::server::{AppState, RespBody, full};
use http::{Method, Response, StatusCode};
use packrat_index::{KeyRecord, RocksIndex};
use packrat_store::job::Progress;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub const ADMIN_PREFIX: &str = "/_packrat/admin/";
const ADMIN_BODY_BYTES_MAX: usize = 64 * 1024;

#[derive(Debug, Serialize, Deserialize, Default)]
pub struct CreateKeyRequest {
    pub name: String,
    pub access_key: Option<String>,
    pub secret_key: Option<String>,
}

/// A key as listed: everything but the secret.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeyInfo {
    pub access_key: String,
    pub name: String,
    pub owner_id: String,
    pub is_root: bool,
    pub created_ms: i64,
}

impl From<&KeyRecord> for KeyInfo {
    fn from(k: &KeyRecord) -> Self {
        Self {
            access_key: k.access_key.clone(),
            name: k.name.clone(),
            owner_id: k.owner_id.clone(),
            is_root: k.is_root,
            created_ms: k.created_ms,
        }
    }
}

fn random_token(len: usize, alphabet: &[u8]) -> String {
    (0..len)
        .map(|_| alphabet[rand::random_range(0..alphabet.len())] as char)
        .collect()
}

pub fn generate_access_key() -> String {
    format!(
        "PK{}",
        random_token(18, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
    )
}

pub fn generate_secret_key() -> String {
    random_token(
        40,
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
    )
}

/// Creates a key record in the index (shared by the server endpoint and offline admin).
pub fn create_key(index: &RocksIndex, req: CreateKeyRequest, is_root: bool) -> S3Result<KeyRecord> {
    let bad = |m: &str| S3Error::new(S3ErrorCode::InvalidArgument, m);
    if req.name.is_empty() || req.name.len() > 64 {
        return Err(bad("a key needs a name of 1 to 64 characters"));
    }
    let access_key = req.access_key.unwrap_or_else(generate_access_key);
    let secret_key = req.secret_key.unwrap_or_else(generate_secret_key);
    if !(3..=128).contains(&access_key.len())
        || !access_key.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err(bad("an access key is 3 to 128 letters and digits"));
    }
    if !(8..=128).contains(&secret_key.len()) || !secret_key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(bad("a secret key is 8 to 128 printable characters"));
    }
    if index.get_key(&access_key)?.is_some() {
        return Err(S3Error::new(
            S3ErrorCode::InvalidArgument,
            format!("access key {access_key} already exists"),
        ));
    }
    let rec = KeyRecord {
        access_key,
        secret_key,
        name: req.name,
        owner_id: hex::encode(rand::random::<[u8; 16]>()),
        is_root,
        created_ms: chrono::Utc::now().timestamp_millis(),
    };
    index.put_key(&rec)?;
    Ok(rec)
}

fn json<T: Serialize>(status: StatusCode, v: &T) -> S3Result<Response<RespBody>> {
    let body = serde_json::to_vec(v).map_err(|e| S3Error::internal("json", e))?;
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(full(body))
        .map_err(|e| S3Error::internal("response", e))
}

pub async fn handle(
    state: &Arc<AppState>,
    method: &Method,
    raw_path: &str,
    query: &[(String, String)],
    identity: Option<&packrat_store_api::Identity>,
    mut body: BodyReader,
) -> S3Result<Response<RespBody>> {
    if !identity.is_some_and(|k| k.is_root) {
        return Err(S3Error::new(
            S3ErrorCode::AccessDenied,
            "Administration needs the root key",
        ));
    }
    let rest = &raw_path[ADMIN_PREFIX.len()..];
    let index = &state.engine.index;
    match (method, rest.split_once('/').unwrap_or((rest, ""))) {
        (&Method::GET, ("keys", "")) => {
            let keys: Vec<KeyInfo> = index.list_keys()?.iter().map(KeyInfo::from).collect();
            json(StatusCode::OK, &keys)
        }
        (&Method::POST, ("keys", "")) => {
            let raw = body.read_to_end(ADMIN_BODY_BYTES_MAX).await?;
            let req: CreateKeyRequest = serde_json::from_slice(&raw).map_err(|e| {
                S3Error::new(S3ErrorCode::InvalidArgument, format!("bad JSON body: {e}"))
            })?;
            let rec = create_key(index, req, false)?;
            state.engine.forget_access_key(&rec.access_key);
            json(StatusCode::OK, &rec)
        }
        (&Method::GET, ("status", "")) => {
            if query.iter().any(|(k, v)| k == "flush" && v == "true") {
                let engine = state.engine.clone();
                crate::server::blocking(move || Ok(engine.index.flush_and_compact_objects()?))
                    .await?;
            }
            json(StatusCode::OK, &status(&state.engine))
        }
        (&Method::GET | &Method::PUT, ("faults", "")) if state.config.fault_injection => {
            use packrat_chunk_store::Fault;
            #[derive(Serialize, Deserialize, Default)]
            #[serde(deny_unknown_fields, default)]
            struct Faults {
                write: Fault,
                sync: Fault,
                read: Fault,
                index_write: Fault,
                injected: u64,
            }
            let chunks = &state.engine.chunks;
            if method == Method::PUT {
                let raw = body.read_to_end(ADMIN_BODY_BYTES_MAX).await?;
                let f: Faults = serde_json::from_slice(&raw).map_err(|e| {
                    S3Error::new(S3ErrorCode::InvalidArgument, format!("bad JSON body: {e}"))
                })?;
                chunks.faults().set(f.write, f.sync, f.read);
                index.fail_writes.store(
                    f.index_write != Fault::None,
                    std::sync::atomic::Ordering::Relaxed,
                );
                tracing::warn!(write = ?f.write, sync = ?f.sync, read = ?f.read, index_write = ?f.index_write, "faults set");
            }
            let (write, sync, read) = chunks.faults().get();
            json(
                StatusCode::OK,
                &Faults {
                    write,
                    sync,
                    read,
                    index_write: if index.fail_writes.load(std::sync::atomic::Ordering::Relaxed) {
                        Fault::Eio
                    } else {
                        Fault::None
                    },
                    injected: chunks
                        .faults()
                        .injected
                        .load(std::sync::atomic::Ordering::Relaxed),
                },
            )
        }
        (&Method::POST, ("compact", "")) => {
            let threshold = match query.iter().find(|(k, _)| k == "threshold") {
                None => state.config.compact_threshold,
                Some((_, v)) => v
                    .parse::<f64>()
                    .ok()
                    .filter(|t| (0.0..=1.0).contains(t))
                    .ok_or_else(|| {
                        S3Error::new(
                            S3ErrorCode::InvalidArgument,
                            "threshold must be a number from 0 to 1",
                        )
                    })?,
            };
            let grace = std::time::Duration::from_secs(state.config.compact_grace_secs);
            let report = packrat_store::compact::compact(&state.engine, threshold, grace).await?;
            json(StatusCode::OK, &report)
        }
        (&Method::POST, ("scrub", "")) => {
            if !state.engine.chunks.has_redundancy() {
                return Err(S3Error::new(
                    S3ErrorCode::InvalidArgument,
                    "scrub needs erasure coding (serve with --disk ... --ec K+M)",
                ));
            }
            packrat_store::ec::start_scrub(&state.engine, None);
            json(StatusCode::OK, &state.engine.scrub.progress())
        }
        (&Method::GET, ("scrub", "")) => json(StatusCode::OK, &state.engine.scrub.progress()),
        (&Method::GET, ("tier", "")) => json(
            StatusCode::OK,
            &packrat_store::tier::status(&state.engine).await?,
        ),
        (&Method::POST, ("tier", "run")) => {
            let days = match query.iter().find(|(k, _)| k == "days_ahead") {
                None => 0,
                Some((_, v)) => v.parse::<u32>().map_err(|_| {
                    S3Error::new(
                        S3ErrorCode::InvalidArgument,
                        "days_ahead must be a whole number of days",
                    )
                })?,
            };
            packrat_store::tier::start_run(&state.engine, days);
            json(StatusCode::OK, &state.engine.tiers.progress())
        }
        (&Method::GET, ("tier", "run")) => json(StatusCode::OK, &state.engine.tiers.progress()),
        (&Method::DELETE, ("keys", ak)) if !ak.is_empty() => {
            let existing = index.get_key(ak)?.ok_or_else(|| {
                S3Error::new(
                    S3ErrorCode::InvalidAccessKeyId,
                    format!("no access key {ak}"),
                )
            })?;
            if existing.is_root && index.list_keys()?.iter().filter(|k| k.is_root).count() <= 1 {
                return Err(S3Error::new(
                    S3ErrorCode::InvalidArgument,
                    "refusing to delete the last root key",
                ));
            }
            index.delete_key(ak)?;
            state.engine.forget_access_key(ak);
            state.signing_keys.forget(ak);
            json(StatusCode::OK, &KeyInfo::from(&existing))
        }
        _ => Err(S3Error::new(
            S3ErrorCode::NotImplemented,
            "unknown administration request",
        )),
    }
}

/// What `admin status` reports.
#[derive(Debug, Serialize, Deserialize)]
pub struct Status {
    pub index: packrat_index::IndexStats,
    pub segments: u64,
    pub active_segment_id: u64,
    pub active_segment_bytes: u64,
    pub segment_disk_bytes: u64,
    pub appends: u64,
    pub appended_bytes: u64,
    pub syncs: u64,
    /// Live and dead segment bytes as of the last compaction scan (none yet: null).
    pub space: Option<packrat_store::compact::Space>,
    /// Erasure coding: disks, capacity and segments per state (null without --ec).
    pub erasure: Option<packrat_chunk_store::EcStatus>,
    pub degraded_reads: u64,
    pub unrecoverable_reads: u64,
    pub segments_encoded: u64,
    pub shards_rebuilt: u64,
    pub shard_faults_found: u64,
    #[serde(default)]
    pub disk_probe_failures: u64,
}

pub fn status(engine: &packrat_store::engine::Engine) -> Status {
    let st = engine.chunks.stats();
    Status {
        index: engine.index.object_stats(),
        segments: st.segments,
        active_segment_id: st.active_segment_id,
        active_segment_bytes: st.active_segment_bytes,
        segment_disk_bytes: engine.chunks.disk_bytes(),
        appends: st.appends,
        appended_bytes: st.appended_bytes,
        syncs: st.syncs,
        space: *engine.last_space.lock().unwrap_or_else(|p| p.into_inner()),
        erasure: engine.chunks.ec_status(),
        degraded_reads: st.degraded_reads,
        unrecoverable_reads: st.unrecoverable_reads,
        segments_encoded: st.segments_encoded,
        shards_rebuilt: st.shards_rebuilt,
        shard_faults_found: st.shard_faults_found,
        disk_probe_failures: st.disk_probe_failures,
    }
}

/// Client side of `packrat admin tier run`: starts a run (or joins the one going), shows a
/// progress bar of the bytes to move, then prints the report.
pub async fn run_tier(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    days_ahead: u32,
) -> Result<(), String> {
    let r: packrat_store::tier::RunReport = follow(
        endpoint,
        region,
        access_key,
        secret_key,
        "tier run",
        &format!("tier/run?days_ahead={days_ahead}"),
        "tier/run",
    )
    .await?;
    println!(
        "lifecycle: {} transitions, {} expirations, {} incomplete uploads aborted; moved {} objects ({} bytes) in {} segments; {} skipped (changed meanwhile); {} unreadable (left in place, see the server log); {} unused tier segments removed; {} NVMe bytes reclaimed; {:.1} s",
        r.lifecycle_transitions,
        r.lifecycle_expirations,
        r.uploads_aborted,
        r.objects_moved,
        r.bytes_moved,
        r.segments_written,
        r.objects_skipped,
        r.objects_unreadable,
        r.segments_removed,
        r.nvme_bytes_reclaimed,
        r.seconds
    );
    Ok(())
}

/// Client side of `packrat admin scrub`: starts a scrub (or joins the one running), shows a
/// progress bar until it ends, then prints what it found and fixed. Fails if a segment could
/// not be repaired.
pub async fn run_scrub(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
) -> Result<(), String> {
    let r: packrat_chunk_store::ScrubReport = follow(
        endpoint, region, access_key, secret_key, "scrub", "scrub", "scrub",
    )
    .await?;
    println!(
        "checked {} segments ({} shards, {} bytes): {} shards missing, {} corrupt; {} rebuilt; {} sealed segments encoded",
        r.segments_checked,
        r.shards_checked,
        r.bytes_checked,
        r.shards_missing,
        r.shards_corrupt,
        r.shards_rebuilt,
        r.segments_sealed
    );
    if r.unrepairable.is_empty() {
        println!("full redundancy: every encoded segment has all its shards");
        Ok(())
    } else {
        Err(format!(
            "{} segments could not be repaired (fewer than k good shards, or no healthy disk \
             to rebuild on): {:?}",
            r.unrepairable.len(),
            r.unrepairable
        ))
    }
}

/// [`call`] without a body, for an answer that must be a success: its body, or the server's
/// error as a message.
pub async fn call_ok(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    method: Method,
    path: &str,
) -> Result<Vec<u8>, String> {
    let (status, body) = call(
        endpoint,
        region,
        access_key,
        secret_key,
        method,
        path,
        Vec::new(),
    )
    .await?;
    if !status.is_success() {
        return Err(format!(
            "server answered {status}: {}",
            String::from_utf8_lossy(&body)
        ));
    }
    Ok(body)
}

/// Client side: one signed request to a running server's admin API.
pub async fn call(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    method: Method,
    path: &str,
    body: Vec<u8>,
) -> Result<(StatusCode, Vec<u8>), String> {
    use http_body_util::{BodyExt, Full};
    let base: http::Uri = endpoint
        .parse()
        .map_err(|e| format!("bad --endpoint: {e}"))?;
    let authority = base
        .authority()
        .ok_or("the endpoint needs a host, e.g. http://127.0.0.1:9000")?
        .clone();
    let (path, query) = path.split_once('?').unwrap_or((path, ""));
    let full_path = format!("{ADMIN_PREFIX}{path}");
    let mut headers = http::HeaderMap::new();
    headers.insert("host", authority.as_str().parse().map_err(|_| "bad host")?);
    sigv4::sign_request(
        method.as_str(),
        &full_path,
        query,
        &mut headers,
        &body,
        access_key,
        secret_key,
        region,
        chrono::Utc::now(),
    );
    let uri = if query.is_empty() {
        format!("http://{authority}{full_path}")
    } else {
        format!("http://{authority}{full_path}?{query}")
    };
    let mut req = http::Request::builder().method(method).uri(uri);
    for (k, v) in &headers {
        req = req.header(k, v);
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<bytes::Bytes>>();
    let resp = client
        .request(req)
        .await
        .map_err(|e| format!("cannot reach {endpoint}: {e}"))?;
    let status = resp.status();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, bytes.to_vec()))
}

/// Client side: starts a job with a POST to `start` (or joins the run going), polls `poll`
/// with a progress bar named `what` until a run that began after the first poll has finished,
/// and returns its report.
pub async fn follow<R: DeserializeOwned>(
    endpoint: &str,
    region: &str,
    access_key: &str,
    secret_key: &str,
    what: &str,
    start: &str,
    poll: &str,
) -> Result<R, String> {
    use http::Method;
    let ask = |method: Method, path: String| async move {
        let body = call_ok(endpoint, region, access_key, secret_key, method, &path).await?;
        serde_json::from_slice::<Progress<R>>(&body)
            .map_err(|e| format!("unexpected answer from the server: {e}"))
    };
    let before = ask(Method::GET, poll.to_string()).await?.finished_runs;
    let mut p = ask(Method::POST, start.to_string()).await?;
    let bar = indicatif::ProgressBar::new(p.total_bytes.max(1));
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{what} [{{elapsed_precise}}] {{wide_bar}} {{bytes}}/{{total_bytes}} ({{bytes_per_sec}}, eta {{eta}})"
        ))
        .map_err(|e| e.to_string())?,
    );
    loop {
        bar.set_length(p.total_bytes.max(1));
        bar.set_position(p.done_bytes);
        if !p.running && p.finished_runs > before {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        p = ask(Method::GET, poll.to_string()).await?;
    }
    bar.finish();
    if let Some(e) = p.error {
        return Err(format!("{what} failed: {e}"));
    }
    p.report
        .ok_or_else(|| format!("the server kept no {what} report"))
}
