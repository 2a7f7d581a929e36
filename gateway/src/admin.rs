//! The admin API: SigV4-signed requests of a root key under `/_packrat/admin/` (a path no
//! bucket can take: `_` is not allowed in bucket names), answered through the store's
//! administration methods. The client side is `packrat admin ...` (`admin_client.rs` in the
//! binary), which signs such requests, or opens a stopped server's data directory directly
//! with `--data-dir`.

use crate::s3::body::BodyReader;
use crate::s3::error::{S3Error, S3ErrorCode, S3Result};
use crate::state::{AppState, RespBody, full};
use http::{Method, Response, StatusCode};
use packrat_store_api::StoreError;
use packrat_store_api::admin::{AccessKey, JobKind, JobStart, NewKey};
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::sync::atomic::Ordering;

pub const ADMIN_PREFIX: &str = "/_packrat/admin/";
const ADMIN_BODY_BYTES_MAX: usize = 64 * 1024;

/// A key as listed: everything but the secret.
#[derive(Debug, Serialize, Deserialize)]
pub struct KeyInfo {
    pub access_key: String,
    pub name: String,
    pub owner_id: String,
    pub is_root: bool,
    pub created_ms: i64,
}

impl From<&AccessKey> for KeyInfo {
    fn from(k: &AccessKey) -> Self {
        Self {
            access_key: k.access_key.clone(),
            name: k.name.clone(),
            owner_id: k.owner_id.clone(),
            is_root: k.is_root,
            created_ms: k.created_ms,
        }
    }
}

/// The store's refusals as the admin API has always answered them: `InvalidArgument`.
fn admin_error(e: StoreError) -> S3Error {
    match e {
        StoreError::Invalid(m) => S3Error::new(S3ErrorCode::InvalidArgument, m),
        e => e.into(),
    }
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
    let store = &state.store;
    match (method, rest.split_once('/').unwrap_or((rest, ""))) {
        (&Method::GET, ("keys", "")) => {
            let keys = store.list_keys().await.map_err(admin_error)?;
            json(
                StatusCode::OK,
                &keys.iter().map(KeyInfo::from).collect::<Vec<_>>(),
            )
        }
        (&Method::POST, ("keys", "")) => {
            let raw = body.read_to_end(ADMIN_BODY_BYTES_MAX).await?;
            let req: NewKey = serde_json::from_slice(&raw).map_err(|e| {
                S3Error::new(S3ErrorCode::InvalidArgument, format!("bad JSON body: {e}"))
            })?;
            json(
                StatusCode::OK,
                &store.create_key(req).await.map_err(admin_error)?,
            )
        }
        (&Method::GET, ("kms", "keys")) => json(
            StatusCode::OK,
            &store.list_kms_keys().await.map_err(admin_error)?,
        ),
        (&Method::POST, ("kms", "keys")) => {
            let raw = body.read_to_end(ADMIN_BODY_BYTES_MAX).await?;
            let req: packrat_store_api::kms::NewKmsKey =
                serde_json::from_slice(&raw).map_err(|e| {
                    S3Error::new(S3ErrorCode::InvalidArgument, format!("bad JSON body: {e}"))
                })?;
            json(
                StatusCode::OK,
                &store.create_kms_key(req).await.map_err(admin_error)?,
            )
        }
        (&Method::GET, ("status", "")) => {
            let flush = query.iter().any(|(k, v)| k == "flush" && v == "true");
            json(
                StatusCode::OK,
                &store.status(flush).await.map_err(admin_error)?,
            )
        }
        (&Method::GET | &Method::PUT, ("faults", "http")) if state.config.fault_injection => {
            let f = &state.http_faults;
            if method == Method::PUT {
                let raw = body.read_to_end(ADMIN_BODY_BYTES_MAX).await?;
                let set: HttpFaultsSet = serde_json::from_slice(&raw).map_err(|e| {
                    S3Error::new(S3ErrorCode::InvalidArgument, format!("bad JSON body: {e}"))
                })?;
                f.slowdown.store(set.slowdown, Ordering::Relaxed);
                f.cuts.store(set.cuts, Ordering::Relaxed);
                f.cut_after_bytes
                    .store(set.cut_after_bytes, Ordering::Relaxed);
                tracing::warn!(?set, "HTTP fault rules set");
            }
            json(
                StatusCode::OK,
                &HttpFaultsSet {
                    slowdown: f.slowdown.load(Ordering::Relaxed),
                    cuts: f.cuts.load(Ordering::Relaxed),
                    cut_after_bytes: f.cut_after_bytes.load(Ordering::Relaxed),
                },
            )
        }
        (&Method::GET | &Method::PUT, ("faults", "")) if state.config.fault_injection => {
            let set = if method == Method::PUT {
                let raw = body.read_to_end(ADMIN_BODY_BYTES_MAX).await?;
                Some(serde_json::from_slice(&raw).map_err(|e| {
                    S3Error::new(S3ErrorCode::InvalidArgument, format!("bad JSON body: {e}"))
                })?)
            } else {
                None
            };
            json(
                StatusCode::OK,
                &store.faults(set).await.map_err(admin_error)?,
            )
        }
        (&Method::POST, ("compact", "")) => {
            let threshold = compact_threshold(state, query)?;
            let grace = std::time::Duration::from_secs(state.config.compact_grace_secs);
            let report = store.compact(threshold, grace).await.map_err(admin_error)?;
            json(StatusCode::OK, &report)
        }
        // The same as a job, followed with a progress bar by `packrat admin compact`.
        (&Method::POST, ("compact", "run")) => {
            let threshold = compact_threshold(state, query)?;
            let grace = std::time::Duration::from_secs(state.config.compact_grace_secs);
            json(
                StatusCode::OK,
                &store
                    .start_job(JobStart::Compact { threshold, grace })
                    .map_err(admin_error)?,
            )
        }
        (&Method::GET, ("compact", "run")) => json(
            StatusCode::OK,
            &store.job_progress(JobKind::Compact).map_err(admin_error)?,
        ),
        (&Method::POST, ("scrub", "")) => json(
            StatusCode::OK,
            &store.start_job(JobStart::Scrub).map_err(admin_error)?,
        ),
        (&Method::GET, ("scrub", "")) => json(
            StatusCode::OK,
            &store.job_progress(JobKind::Scrub).map_err(admin_error)?,
        ),
        (&Method::GET, ("tier", "")) => json(
            StatusCode::OK,
            &store.tier_status().await.map_err(admin_error)?,
        ),
        (&Method::POST, ("tier", "run")) => {
            let days_ahead = match query.iter().find(|(k, _)| k == "days_ahead") {
                None => 0,
                Some((_, v)) => v.parse::<u32>().map_err(|_| {
                    S3Error::new(
                        S3ErrorCode::InvalidArgument,
                        "days_ahead must be a whole number of days",
                    )
                })?,
            };
            json(
                StatusCode::OK,
                &store
                    .start_job(JobStart::TierRun { days_ahead })
                    .map_err(admin_error)?,
            )
        }
        (&Method::GET, ("tier", "run")) => json(
            StatusCode::OK,
            &store.job_progress(JobKind::TierRun).map_err(admin_error)?,
        ),
        (&Method::DELETE, ("keys", ak)) if !ak.is_empty() => {
            let gone = store.delete_key(ak).await.map_err(admin_error)?;
            let existing = gone.ok_or_else(|| {
                S3Error::new(
                    S3ErrorCode::InvalidAccessKeyId,
                    format!("no access key {ak}"),
                )
            })?;
            state.signing_keys.forget(ak);
            json(StatusCode::OK, &KeyInfo::from(&existing))
        }
        _ => Err(S3Error::new(
            S3ErrorCode::NotImplemented,
            "unknown administration request",
        )),
    }
}

/// `PUT /_packrat/admin/faults/http`: the HTTP layer's faults (see `server::HttpFaults`).
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct HttpFaultsSet {
    #[serde(default)]
    slowdown: u64,
    #[serde(default)]
    cuts: u64,
    #[serde(default)]
    cut_after_bytes: u64,
}

/// `?threshold=` of a compaction (0 to 1), else the server's --compact-threshold.
fn compact_threshold(state: &AppState, query: &[(String, String)]) -> S3Result<f64> {
    Ok(match query.iter().find(|(k, _)| k == "threshold") {
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
    })
}
