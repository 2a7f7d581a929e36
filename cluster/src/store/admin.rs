//! The admin jobs through a cluster gateway: compaction, scrub and tier runs run on every
//! node's own store (each node compacts, scrubs and tiers its own segments); the gateway starts
//! them on every node of the map and answers one report, the nodes' figures added up, so
//! `packrat admin compact|scrub|tier run|tier status --endpoint GATEWAY` works as against one
//! server.

use super::{ClusterStore, NODE_TIMEOUT, not_in_cluster};
use crate::wire::Call;
use bytes::Bytes;
use http::Method;
use packrat_store_api::admin::{JobKind, JobStart, Metric, Report};
use packrat_store_api::{StoreAdmin, StoreError, StoreResult};
use serde_json::Value;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn kind_name(kind: JobKind) -> &'static str {
    match kind {
        JobKind::Compact => "compact",
        JobKind::Scrub => "scrub",
        JobKind::TierRun => "tier",
    }
}

/// Adds a node's report to the sum: numbers added (durations, `seconds`, the longest), lists
/// joined, objects merged field by field, anything else kept from the first node.
fn add_report(sum: &mut Value, node: &Value, field: &str) {
    match (sum, node) {
        (Value::Number(a), Value::Number(b)) => {
            let total = match (a.as_u64(), b.as_u64()) {
                (Some(x), Some(y)) if field != "seconds" => Value::from(x.saturating_add(y)),
                _ => {
                    let (x, y) = (a.as_f64().unwrap_or(0.0), b.as_f64().unwrap_or(0.0));
                    Value::from(if field == "seconds" { x.max(y) } else { x + y })
                }
            };
            *a = match total {
                Value::Number(n) => n,
                _ => a.clone(),
            };
        }
        (Value::Array(a), Value::Array(b)) => a.extend(b.iter().cloned()),
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in b {
                match a.get_mut(k) {
                    Some(mine) => add_report(mine, v, k),
                    None => {
                        a.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (Value::Bool(a), Value::Bool(b)) => *a |= *b,
        (s @ Value::Null, n) => *s = n.clone(),
        _ => {}
    }
}

fn sum_reports(reports: Vec<Value>) -> Value {
    let mut it = reports.into_iter();
    let mut sum = it.next().unwrap_or(Value::Null);
    for r in it {
        add_report(&mut sum, &r, "");
    }
    sum
}

/// A job's progress over the nodes (`Progress` as one store answers it): running while any
/// node runs, bytes added up, the runs finished those of the node that finished fewest (so a
/// client waiting for the next run waits for every node's), the report summed once every node
/// has one, the first error.
fn sum_progress(nodes: Vec<Value>) -> Value {
    let field = |v: &Value, k: &str| v.get(k).cloned().unwrap_or(Value::Null);
    let running = nodes.iter().any(|p| p["running"].as_bool() == Some(true));
    let bytes = |k: &str| nodes.iter().filter_map(|p| p[k].as_u64()).sum::<u64>();
    let finished = nodes
        .iter()
        .map(|p| p["finished_runs"].as_u64().unwrap_or(0))
        .min()
        .unwrap_or(0);
    let reports: Vec<Value> = nodes.iter().map(|p| field(p, "report")).collect();
    let report = match reports.iter().any(Value::is_null) {
        true => Value::Null,
        false => sum_reports(reports),
    };
    let error = nodes
        .iter()
        .map(|p| field(p, "error"))
        .find(|e| !e.is_null())
        .unwrap_or(Value::Null);
    serde_json::json!({
        "running": running,
        "done_bytes": bytes("done_bytes"),
        "total_bytes": bytes("total_bytes"),
        "finished_runs": finished,
        "report": report,
        "error": error,
    })
}

/// The nodes' tier status reports as one: their figures added up (objects and bytes count
/// every replica, each node tiering its own copies), tiers merged by class, the tier run's
/// progress as [`sum_progress`] sums it, and each node's own report under `nodes`.
fn merge_tier_status(nodes: Vec<(String, Value)>) -> Value {
    let mut tiers: Vec<Value> = Vec::new();
    let mut runs = Vec::new();
    let mut rest = Vec::new();
    for (_, r) in &nodes {
        let mut r = r.clone();
        for t in r["tiers"].as_array().cloned().unwrap_or_default() {
            match tiers.iter_mut().find(|m| m["class"] == t["class"]) {
                Some(m) => add_report(m, &t, ""),
                None => tiers.push(t),
            }
        }
        if let Some(o) = r.as_object_mut() {
            o.remove("tiers");
            runs.push(o.remove("run").unwrap_or(Value::Null));
        }
        rest.push(r);
    }
    for t in &mut tiers {
        // Each node has its own target for a class (its directory, its prefix).
        t["target"] = Value::from("each node's own (see nodes)");
    }
    let mut sum = sum_reports(rest);
    sum["tiers"] = Value::from(tiers);
    sum["run"] = sum_progress(runs);
    sum["nodes"] = Value::Object(nodes.into_iter().collect());
    sum
}

impl ClusterStore {
    /// The same admin request to every node of the map, all at once; their JSON answers.
    async fn ask_every_node(&self, method: Method, path: &str) -> StoreResult<Vec<Report>> {
        Ok(self
            .ask_every_node_by_id(method, path)
            .await?
            .into_iter()
            .map(|(_, r)| r)
            .collect())
    }

    /// As [`Self::ask_every_node`], each answer with its node's id.
    async fn ask_every_node_by_id(
        &self,
        method: Method,
        path: &str,
    ) -> StoreResult<Vec<(String, Report)>> {
        let map = self.map();
        let asks = map.nodes.values().map(|n| {
            let (client, method, epoch) = (self.client.clone(), method.clone(), map.epoch);
            async move {
                let ans = client
                    .send(
                        Call {
                            method,
                            path,
                            headers: &[],
                            body: Bytes::new(),
                        },
                        &n.addr,
                        epoch, // A compaction answers when it is done.
                        NODE_TIMEOUT * 60,
                    )
                    .await
                    .map_err(|e| StoreError::Unavailable(format!("node {}: {e}", n.id)))?;
                match ans.status {
                    200 => Ok((n.id.clone(), ans.json::<Report>().await?)),
                    409 => Err(StoreError::Unavailable(
                        "the cluster map changed; retry".into(),
                    )),
                    _ => Err(ans.error().await),
                }
            }
        });
        futures_util::future::try_join_all(asks).await
    }

    /// Every node's tier status in one report (see [`merge_tier_status`]).
    pub(super) async fn tier_status_of_nodes(&self) -> StoreResult<Report> {
        let nodes = self
            .ask_every_node_by_id(Method::GET, "/admin/tiers")
            .await?;
        Ok(merge_tier_status(nodes))
    }

    pub(super) async fn compact_nodes(
        &self,
        threshold: f64,
        grace: Duration,
    ) -> StoreResult<Report> {
        let path = format!(
            "/admin/compact?threshold={threshold}&grace_ms={}",
            grace.as_millis()
        );
        Ok(sum_reports(self.ask_every_node(Method::POST, &path).await?))
    }

    pub(super) fn start_job_on_nodes(&self, job: JobStart) -> StoreResult<Report> {
        let path = match job {
            JobStart::Scrub => "/admin/job?kind=scrub".to_string(),
            JobStart::TierRun { days_ahead } => {
                format!("/admin/job?kind=tier&days_ahead={days_ahead}")
            }
            JobStart::Compact { threshold, grace } => format!(
                "/admin/job?kind=compact&threshold={threshold}&grace_ms={}",
                grace.as_millis()
            ),
        };
        let nodes = self.blocking(self.ask_every_node(Method::POST, &path))?;
        Ok(sum_progress(nodes))
    }

    pub(super) fn job_progress_of_nodes(&self, kind: JobKind) -> StoreResult<Report> {
        let path = format!("/admin/job?kind={}", kind_name(kind));
        let nodes = self.blocking(self.ask_every_node(Method::GET, &path))?;
        Ok(sum_progress(nodes))
    }
}

#[async_trait::async_trait]
impl StoreAdmin for ClusterStore {
    async fn status(&self, _flush: bool) -> StoreResult<Report> {
        Ok(crate::status_report(&self.map()))
    }

    async fn compact(&self, threshold: f64, grace: Duration) -> StoreResult<Report> {
        self.compact_nodes(threshold, grace).await
    }

    fn start_job(&self, job: JobStart) -> StoreResult<Report> {
        self.start_job_on_nodes(job)
    }

    fn job_progress(&self, kind: JobKind) -> StoreResult<Report> {
        self.job_progress_of_nodes(kind)
    }

    async fn tier_status(&self) -> StoreResult<Report> {
        self.tier_status_of_nodes().await
    }

    async fn faults(&self, _: Option<Report>) -> StoreResult<Report> {
        Err(not_in_cluster("fault injection"))
    }

    fn metrics(&self) -> Vec<Metric> {
        let mut m = crate::map_metrics(&self.map());
        m.push(Metric::counter(
            "packrat_cluster_lookups_gathered_total",
            "Object lookups (GET, HEAD) sent to nodes gathered with others in one request.",
            self.gathered_lookups.load(Ordering::Relaxed),
        ));
        m.push(Metric::counter(
            "packrat_cluster_etcd_cache_misses_total",
            "Bucket and access key lookups this gateway's caches did not hold and asked etcd for (a name etcd lately did not have is not asked again for a while).",
            self.etcd_misses_asked.load(Ordering::Relaxed),
        ));
        m.push(Metric::gauge(
            "packrat_cluster_etcd_silent",
            "1 while etcd has not answered this gateway for longer than a node's fence time (a request then waits 5 s for a failover, not 15 s).",
            u64::from(self.etcd_silent()),
        ));
        m.push(Metric::counter(
            "packrat_cluster_gathered_requests_total",
            "Requests that carried gathered lookups to nodes.",
            self.gathered_requests.load(Ordering::Relaxed),
        ));
        let (relayed, relays) = self.relay.counts();
        m.push(Metric::counter(
            "packrat_cluster_writes_relayed_total",
            "Writes sent to heads relayed with others in one request.",
            relayed,
        ));
        m.push(Metric::counter(
            "packrat_cluster_relay_requests_total",
            "Requests that carried relayed writes to heads.",
            relays,
        ));
        m.push(Metric::counter(
            "packrat_cluster_damaged_answers_total",
            "Answers from storage nodes this gateway refused because their bytes did not match the CRC32C sent with them.",
            crate::wire::DAMAGED_ANSWERS.load(Ordering::Relaxed),
        ));
        m.push(Metric::counter(
            "packrat_cluster_lookups_gathered_alone_total",
            "Lookups waiting to be gathered then asked alone (a dirty copy, a refusal, an error).",
            self.gathered_alone.load(Ordering::Relaxed),
        ));
        m
    }

    fn write_readiness(&self) -> Result<(), String> {
        let map = self.map();
        match (0..map.pgs).find(|pg| map.chain(*pg).is_empty()) {
            Some(pg) => Err(format!("placement group {pg} has no live storage node")),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_add_up_and_progress_waits_for_every_node() {
        let a = serde_json::json!({"segments_checked": 3, "unrepairable": [7], "seconds": 1.5});
        let b = serde_json::json!({"segments_checked": 4, "unrepairable": [9], "seconds": 0.5});
        assert_eq!(
            sum_reports(vec![a.clone(), b.clone()]),
            serde_json::json!({"segments_checked": 7, "unrepairable": [7, 9], "seconds": 1.5})
        );
        let p = |running: bool, runs: u64, report: Value| {
            serde_json::json!({"running": running, "done_bytes": 10, "total_bytes": 20,
                               "finished_runs": runs, "report": report, "error": null})
        };
        let both = sum_progress(vec![p(false, 2, a.clone()), p(true, 1, Value::Null)]);
        assert_eq!(both["running"], true);
        assert_eq!(both["finished_runs"], 1);
        assert_eq!(both["report"], Value::Null);
        assert_eq!(both["done_bytes"], 20);
        let done = sum_progress(vec![p(false, 2, a), p(false, 2, b)]);
        assert_eq!(
            (done["running"].clone(), done["finished_runs"].clone()),
            (false.into(), 2.into())
        );
        assert_eq!(done["report"]["segments_checked"], 7);
    }

    #[test]
    fn tier_status_merges_tiers_by_class_and_keeps_each_node() {
        let node = |ia: u64, glacier: Option<u64>, pending: u64| {
            let mut tiers = vec![
                serde_json::json!({"class": "STANDARD_IA", "target": "dir:/a",
                                                     "segments": 1, "objects": ia}),
            ];
            if let Some(g) = glacier {
                tiers.push(
                    serde_json::json!({"class": "GLACIER_IR", "target": "s3://b",
                                              "segments": 2, "objects": g}),
                );
            }
            serde_json::json!({"tiers": tiers, "pending_objects": pending,
                               "run": {"running": false, "done_bytes": 0, "total_bytes": 0,
                                       "finished_runs": 3, "report": null, "error": null}})
        };
        let st = merge_tier_status(vec![
            ("n1".into(), node(4, Some(1), 0)),
            ("n2".into(), node(5, None, 2)),
        ]);
        assert_eq!(st["pending_objects"], 2);
        let tiers = st["tiers"].as_array().unwrap();
        assert_eq!(tiers.len(), 2);
        assert_eq!(
            (tiers[0]["class"].clone(), tiers[0]["objects"].clone()),
            ("STANDARD_IA".into(), 9.into())
        );
        assert_eq!(
            (tiers[1]["objects"].clone(), tiers[1]["segments"].clone()),
            (1.into(), 2.into())
        );
        assert_eq!(st["run"]["finished_runs"], 3);
        assert_eq!(st["nodes"]["n2"]["pending_objects"], 2);
        assert_eq!(st["nodes"]["n1"]["tiers"][1]["class"], "GLACIER_IR");
    }
}
