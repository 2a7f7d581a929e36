//! The admin jobs through a cluster gateway: compaction, scrub and tier runs run on every
//! node's own store (each node compacts, scrubs and tiers its own segments); the gateway starts
//! them on every node of the map and answers one report, the nodes' figures added up
//! ([`packrat_store_api::reports::Sum`]), so `packrat admin compact|scrub|tier run|tier status
//! --endpoint GATEWAY` works as against one server.

use super::{ClusterStore, NODE_TIMEOUT, not_in_cluster};
use crate::wire::Call;
use bytes::Bytes;
use http::Method;
use packrat_store_api::admin::{JobKind, JobStart, Metric, Report};
use packrat_store_api::reports::{CompactReport, JobProgress, Progress, Sum, TierStatus, sum_all};
use packrat_store_api::{StoreAdmin, StoreError, StoreResult};
use serde::de::DeserializeOwned;
use std::sync::atomic::Ordering;
use std::time::Duration;

fn kind_name(kind: JobKind) -> &'static str {
    match kind {
        JobKind::Compact => "compact",
        JobKind::Scrub => "scrub",
        JobKind::TierRun => "tier",
    }
}

impl ClusterStore {
    /// The same admin request to every node of the map, all at once; their JSON answers.
    async fn ask_every_node<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
    ) -> StoreResult<Vec<T>> {
        Ok(self
            .ask_every_node_by_id(method, path)
            .await?
            .into_iter()
            .map(|(_, r)| r)
            .collect())
    }

    /// As [`Self::ask_every_node`], each answer with its node's id.
    async fn ask_every_node_by_id<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
    ) -> StoreResult<Vec<(String, T)>> {
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
                    200 => Ok((n.id.clone(), ans.json::<T>().await?)),
                    409 => Err(StoreError::Unavailable(
                        "the cluster map changed; retry".into(),
                    )),
                    _ => Err(ans.error().await),
                }
            }
        });
        futures_util::future::try_join_all(asks).await
    }

    /// Every node's tier status in one report (see [`TierStatus::of_nodes`]).
    pub(super) async fn tier_status_of_nodes(&self) -> StoreResult<TierStatus> {
        let nodes = self
            .ask_every_node_by_id(Method::GET, "/admin/tiers")
            .await?;
        TierStatus::of_nodes(nodes.into_iter().collect())
            .ok_or_else(|| StoreError::Unavailable("the cluster map holds no node".into()))
    }

    pub(super) async fn compact_nodes(
        &self,
        threshold: f64,
        grace: Duration,
    ) -> StoreResult<CompactReport> {
        let path = format!(
            "/admin/compact?threshold={threshold}&grace_ms={}",
            grace.as_millis()
        );
        let reports: Vec<CompactReport> = self.ask_every_node(Method::POST, &path).await?;
        Ok(sum_all(&reports).unwrap_or_default())
    }

    /// A job's progress on every node as one ([`Progress::sum`]), read as `kind`'s report.
    fn progress_of_nodes(
        &self,
        method: Method,
        path: &str,
        kind: JobKind,
    ) -> StoreResult<JobProgress> {
        Ok(match kind {
            JobKind::Scrub => JobProgress::Scrub(self.summed_progress(method, path)?),
            JobKind::TierRun => JobProgress::TierRun(self.summed_progress(method, path)?),
            JobKind::Compact => JobProgress::Compact(self.summed_progress(method, path)?),
        })
    }

    fn summed_progress<R: DeserializeOwned + Sum + Clone>(
        &self,
        method: Method,
        path: &str,
    ) -> StoreResult<Progress<R>> {
        let nodes: Vec<Progress<R>> = self.blocking(self.ask_every_node(method, path))?;
        Ok(Progress::sum(&nodes))
    }

    pub(super) fn start_job_on_nodes(&self, job: JobStart) -> StoreResult<JobProgress> {
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
        self.progress_of_nodes(Method::POST, &path, job.kind())
    }

    pub(super) fn job_progress_of_nodes(&self, kind: JobKind) -> StoreResult<JobProgress> {
        let path = format!("/admin/job?kind={}", kind_name(kind));
        self.progress_of_nodes(Method::GET, &path, kind)
    }
}

#[async_trait::async_trait]
impl StoreAdmin for ClusterStore {
    async fn status(&self, _flush: bool) -> StoreResult<Report> {
        Ok(crate::status_report(&self.map()))
    }

    async fn compact(&self, threshold: f64, grace: Duration) -> StoreResult<CompactReport> {
        self.compact_nodes(threshold, grace).await
    }

    fn start_job(&self, job: JobStart) -> StoreResult<JobProgress> {
        self.start_job_on_nodes(job)
    }

    fn job_progress(&self, kind: JobKind) -> StoreResult<JobProgress> {
        self.job_progress_of_nodes(kind)
    }

    async fn tier_status(&self) -> StoreResult<TierStatus> {
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
