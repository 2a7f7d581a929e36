//! The operators' pages of a node (`/metrics`, `/health/live`, `/health/ready`) and the
//! figures behind them.

use super::{Node, NodeResp, answer};
use std::sync::atomic::Ordering;

impl Node {
    /// `/metrics` and `/health/live|ready` for operators, without the cluster secret (they
    /// tell nothing of the data), as `packrat serve` answers them: Prometheus and a load
    /// balancer or orchestrator reach every node directly.
    pub(super) fn operator_page(&self, path: &str) -> Option<NodeResp> {
        let text = |status: u16, body: String, content_type: &str| {
            let mut resp = answer(status, body);
            if let Ok(v) = http::HeaderValue::from_str(content_type) {
                resp.headers_mut().insert(http::header::CONTENT_TYPE, v);
            }
            resp
        };
        let plain = "text/plain; charset=utf-8";
        match path {
            "/metrics" => {
                let page = self.metrics.as_ref()?;
                let (body, content_type) = page(self.figures());
                Some(text(200, body, content_type))
            }
            "/health/live" => Some(text(200, "ok\n".into(), plain)),
            "/health/ready" => Some(match self.store.write_readiness() {
                Ok(()) => text(200, "ready\n".into(), plain),
                Err(why) => text(503, format!("not ready: {why}\n"), plain),
            }),
            _ => None,
        }
    }

    /// This node's own figures for its `/metrics`: its places in the map, and the writes it
    /// has applied that the rest of their chains has not acknowledged yet.
    pub(super) fn figures(&self) -> Vec<packrat_store_api::admin::Metric> {
        use packrat_store_api::admin::Metric;
        let map = self.map.borrow().clone();
        let (mut member, mut head) = (0u64, 0u64);
        for pg in 0..map.pgs {
            let chain = map.chain(pg);
            member += u64::from(chain.contains(&self.id));
            head += u64::from(chain.first() == Some(&self.id));
        }
        let syncing = map.syncing.get(&self.id).map_or(0, |p| p.len() as u64);
        let unsettled = self.dirty.lock().map_or(0, |d| d.len() as u64);
        let (relayed, relays) = self.relay.counts();
        vec![
            Metric::counter(
                "packrat_node_steps_relayed_total",
                "Chain steps this node sent on to its successors relayed with others in one request.",
                relayed,
            ),
            Metric::counter(
                "packrat_node_relay_requests_total",
                "Requests that carried relayed chain steps from this node to its successors.",
                relays,
            ),
            Metric::counter(
                "packrat_node_damaged_writes_total",
                "Chain writes (PUTs and parts) this node refused because their body did not match the CRC32C its sender sent.",
                self.damaged.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_damaged_answers_total",
                "Answers from other nodes this node refused because their bytes did not match the CRC32C sent with them.",
                crate::wire::DAMAGED_ANSWERS.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_mux_connections_total",
                "Multiplexed internal connections (gateways' and other nodes') this node accepted; connections of older builds and operators come over HTTP.",
                crate::mux::server::ACCEPTED.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_mux_requests_total",
                "Internal requests this node took over multiplexed connections.",
                crate::mux::server::REQUESTS.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_buckets_dropped_total",
                "Local buckets (a cluster bucket's objects, or its tombstones) this node emptied and removed because their cluster bucket was deleted.",
                self.buckets_dropped.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_pgs_dropped_total",
                "Placement groups this node holds no replica of whose copies it swept away once their chains were whole elsewhere (a node added, a rebalance, a return after re-replication; a PG it never held counts too, with nothing to drop).",
                self.pgs_dropped.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_copies_dropped_total",
                "Objects, versions, tombstones and uploads in progress this node dropped with the placement groups it left.",
                self.copies_dropped.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_fenced_requests_total",
                "Requests this node refused because its etcd lease was not known alive (see the fence time in docs/ARCHITECTURE.md).",
                self.fenced.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_busy_requests_total",
                "Internal requests this node answered 503 because it was already serving its most at once.",
                self.busy.load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_batches_read_here_total",
                "Batch GETs at this node's S3 read endpoint that it planned and read in its own store.",
                self.near_batches[0].load(Ordering::Relaxed),
            ),
            Metric::counter(
                "packrat_node_batches_read_by_chain_total",
                "Batch GETs at this node's S3 read endpoint read the ordinary way, as through a gateway: some item was readable only elsewhere (a dirty copy, a PG this node is catching up).",
                self.near_batches[1].load(Ordering::Relaxed),
            ),
            Metric::gauge(
                "packrat_node_fenced",
                "1 while this node serves nothing because its last confirmed etcd lease renewal is older than the fence time.",
                u64::from(self.lease.fenced().is_some()),
            ),
            Metric::gauge(
                "packrat_node_stepped_down",
                "1 while this node serves nothing because most of the other nodes report that they cannot reach it.",
                u64::from(self.stepped_down()),
            ),
            Metric::gauge(
                "packrat_node_suspects",
                "Members that failed this node's last probes (or did not answer a step), probed until they answer; reported to the manager after two in a row.",
                self.suspects.lock().map_or(0, |s| s.len() as u64),
            ),
            Metric::gauge(
                "packrat_node_pgs",
                "Placement groups this node holds a replica of.",
                member,
            ),
            Metric::gauge(
                "packrat_node_pgs_head",
                "Placement groups whose chain this node heads (their writes enter here).",
                head,
            ),
            Metric::gauge(
                "packrat_node_pgs_syncing",
                "Placement groups this node is catching up on (no reads served there yet).",
                syncing,
            ),
            Metric::gauge(
                "packrat_node_writes_unsettled",
                "Keys whose newest write here the rest of the chain has not acknowledged yet: writes under way, and ones re-sent after a break.",
                unsettled,
            ),
            Metric::gauge(
                "packrat_node_pgs_held",
                "Placement groups this node may hold copies of (those of its chains, and those it left whose copies are not dropped yet); every PG when that is not known.",
                self.held.count() as u64,
            ),
            Metric::gauge(
                "packrat_node_map_epoch",
                "Epoch of the cluster map this node serves by.",
                map.epoch,
            ),
        ]
    }
}
