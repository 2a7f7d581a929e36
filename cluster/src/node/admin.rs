//! The admin jobs of a node's own store, started by a gateway for the whole cluster
//! (`crate::store`'s fan-out): compaction, scrub and tier runs run on each node's local store,
//! as on one server.

use super::{Fail, Node, NodeResp, answer, body_of_request, json};
use bytes::Bytes;
use http::Method;
use packrat_store_api::StoreError;
use packrat_store_api::admin::{JobKind, JobStart};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn job_kind(q: &HashMap<String, String>) -> Result<JobKind, StoreError> {
    match q.get("kind").map(String::as_str) {
        Some("compact") => Ok(JobKind::Compact),
        Some("scrub") => Ok(JobKind::Scrub),
        Some("tier") => Ok(JobKind::TierRun),
        other => Err(StoreError::Invalid(format!("no such job kind: {other:?}"))),
    }
}

/// A compaction's threshold and grace (`threshold=0.5&grace_ms=..`).
fn compaction(q: &HashMap<String, String>) -> Result<(f64, Duration), StoreError> {
    let threshold = q
        .get("threshold")
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|t| (0.0..=1.0).contains(t))
        .ok_or_else(|| StoreError::Invalid("threshold must be between 0 and 1".into()))?;
    let grace = q.get("grace_ms").and_then(|v| v.parse().ok()).unwrap_or(0);
    Ok((threshold, Duration::from_millis(grace)))
}

impl Node {
    /// `/admin/compact` (POST: a compaction, answered with its report), `/admin/job?kind=..`
    /// (POST: start a run or join the one going; GET: its progress) and `/admin/tiers` (GET:
    /// the node's tier status).
    pub(super) async fn admin(
        &self,
        what: &str,
        method: &Method,
        q: &HashMap<String, String>,
    ) -> Result<NodeResp, Fail> {
        match (method, what) {
            (&Method::POST, "compact") => {
                let (threshold, grace) = compaction(q)?;
                Ok(json(200, &self.store.compact(threshold, grace).await?))
            }
            (&Method::POST, "job") => {
                let job = match job_kind(q)? {
                    JobKind::Scrub => JobStart::Scrub,
                    JobKind::TierRun => JobStart::TierRun {
                        days_ahead: q
                            .get("days_ahead")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0),
                    },
                    JobKind::Compact => {
                        let (threshold, grace) = compaction(q)?;
                        JobStart::Compact { threshold, grace }
                    }
                };
                Ok(json(200, &self.store.start_job(job)?))
            }
            (&Method::GET, "job") => Ok(json(200, &self.store.job_progress(job_kind(q)?)?)),
            (&Method::GET, "tiers") => Ok(json(200, &self.store.tier_status().await?)),
            _ => Ok(answer(404, "no such admin route")),
        }
    }

    /// `/admin/faults`: disk faults injected under this node's store (`packrat node
    /// --fault-injection`, for tests). GET shows them, PUT sets them (the JSON of `packrat
    /// admin faults`).
    pub(super) async fn faults<B>(&self, req: http::Request<B>) -> Result<NodeResp, Fail>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        let set = if req.method() == Method::PUT {
            let body = body_of_request(req, "faults").await?;
            Some(
                serde_json::from_slice(&body)
                    .map_err(|e| StoreError::Invalid(format!("bad faults: {e}")))?,
            )
        } else {
            None
        };
        Ok(json(200, &self.store.faults(set).await?))
    }

    /// `/admin/faults/hop`: damage on the way between members (tests; allowed when the store's
    /// fault injection is). PUT `{"flip": N}`: the next N write bodies this node hands on to a
    /// successor have a byte changed after their CRC32C is taken; `"drop": N`: the next N
    /// steps it hands on are not sent, and fail as if the successor had not answered (a chain
    /// broken under a write, at once). Answers what is left of each.
    pub(super) async fn hop_faults<B>(&self, req: http::Request<B>) -> Result<NodeResp, Fail>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct HopFaults {
            /// Write bodies handed on to a successor.
            flip: u64,
            /// Answers of object bytes sent whole (to a gateway or a node).
            #[serde(default)]
            answers: u64,
            /// Steps handed on to a successor.
            #[serde(default)]
            drop: u64,
        }
        // Refused unless the node runs with `--fault-injection`.
        self.store.faults(None).await?;
        if req.method() == Method::PUT {
            let body = body_of_request(req, "hop faults").await?;
            let set: HopFaults = serde_json::from_slice(&body)
                .map_err(|e| StoreError::Invalid(format!("bad hop faults: {e}")))?;
            self.hop_flips.store(set.flip, Ordering::Relaxed);
            super::ANSWER_FLIPS.store(set.answers, Ordering::Relaxed);
            self.hop_drops.store(set.drop, Ordering::Relaxed);
        }
        Ok(json(
            200,
            &HopFaults {
                flip: self.hop_flips.load(Ordering::Relaxed),
                answers: super::ANSWER_FLIPS.load(Ordering::Relaxed),
                drop: self.hop_drops.load(Ordering::Relaxed),
            },
        ))
    }
}
