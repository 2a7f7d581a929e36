//! Members that cannot be reached, reported to the manager, and a node that steps down when
//! most of the others cannot reach it.
//!
//! A node cut off from the other nodes but not from etcd keeps its lease, so the manager
//! would keep it in its chains, and every chain through it would stay unwritable until the
//! cut healed. Instead, as Ceph's OSDs report peers their heartbeats miss:
//!
//! - Each node probes the members it shares a chain with (`GET /health/live`,
//!   [`PROBE_TIMEOUT`]) every [`ROUND`], as Ceph's OSDs heartbeat their peers; a step handed
//!   on that got no answer (a timeout, a refused or reset connection; not an error the
//!   successor answered) counts as a failed probe. A member that failed [`MISSES`] probes in
//!   a row is reported: `reports/<suspect>/<reporter>` in etcd, under a lease of
//!   [`REPORT_TTL_S`] put again each round, so a report lapses soon after the probes reach the
//!   suspect (or the reporter dies). It is probed on, in or out of the map, until it answers.
//! - Each node reads the reports every round. One reported by more than half of the other
//!   live nodes, none of which is itself so reported ([`crate::cut_off`]: two nodes cut from
//!   each other report each other, and neither steps down), **steps down**: it refuses every
//!   data request, as a fenced node does, and then says so (`stepped-down/<node>`, leased the
//!   same way).
//! - The manager takes a node that stepped down out of its chains as if it were gone (its
//!   places kept for the grace period). It acts on the node's own word only, so a node is
//!   never replaced in a chain while it may still serve it. Once the reports lapse, the node
//!   steps up and the manager puts it back, catching up on what it missed.
//!
//! A cut between two nodes that both reach a third is not a majority either way: the chains
//! through that link stay unwritable until it heals (docs/reliability.md).

use super::Node;
use crate::map::Etcd;
use crate::wire::Call;
use http::Method;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// How long a report (and a step-down notice) lasts unless put again.
pub(crate) const REPORT_TTL_S: u64 = 3;
/// How often a node probes its suspects and reads the reports.
const ROUND: Duration = Duration::from_millis(500);
/// How long a probe waits for an answer.
const PROBE_TIMEOUT: Duration = Duration::from_millis(1500);
/// Failed probes in a row before a member is reported: one slow answer is not a cut.
const MISSES: u32 = 2;

/// A member that failed its last probes (see the module's doc).
pub(super) struct Suspect {
    addr: String,
    misses: u32,
}

impl Node {
    /// Notes that `node`, at `addr`, did not answer a step handed on to it: a failed probe.
    pub(super) fn suspect(&self, node: &str, addr: &str) {
        let mut s = self.suspects.lock().unwrap_or_else(|e| e.into_inner());
        s.entry(node.to_string())
            .or_insert_with(|| Suspect {
                addr: addr.to_string(),
                misses: 0,
            })
            .misses += 1;
    }

    /// Whether this node stepped down (see the module's doc).
    pub(super) fn stepped_down(&self) -> bool {
        self.stepped_down.load(Ordering::Acquire)
    }

    /// Probes, reports and steps down or up, every [`ROUND`], for the node's life.
    pub async fn report_loop(self: Arc<Self>, etcd: Etcd) {
        loop {
            tokio::time::sleep(ROUND).await;
            if let Err(e) = self.report_round(&etcd).await {
                tracing::debug!("reports of unreachable members: {e}");
            }
        }
    }

    async fn report_round(&self, etcd: &Etcd) -> Result<(), String> {
        // Whether to step down is decided first: a node cut off would otherwise wait for
        // its own probes of the others to time out before it reads the reports.
        self.step_down_or_up(etcd).await?;
        // The members this node shares a chain with, and those that failed probes before
        // (out of the map, they are probed on until they answer).
        let mut targets: BTreeMap<String, String> = BTreeMap::new();
        {
            let map = self.map.borrow().clone();
            for chain in map.chains.iter().filter(|c| c.contains(&self.id)) {
                for id in chain.iter().filter(|id| **id != self.id) {
                    if let Some(addr) = map.addr(id) {
                        targets.insert(id.clone(), addr.to_string());
                    }
                }
            }
            let s = self.suspects.lock().unwrap_or_else(|e| e.into_inner());
            for (id, sus) in s.iter() {
                targets.insert(id.clone(), sus.addr.clone());
            }
        }
        let probes = futures_util::future::join_all(targets.iter().map(|(id, addr)| async move {
            let ans = self
                .client
                .send(
                    Call::new(Method::GET, "/health/live"),
                    addr,
                    0,
                    PROBE_TIMEOUT,
                )
                .await;
            (id, addr, ans.is_ok_and(|a| a.status == 200))
        }))
        .await;
        let mut report = Vec::new();
        {
            let mut s = self.suspects.lock().unwrap_or_else(|e| e.into_inner());
            for (id, addr, reachable) in probes {
                if reachable {
                    if s.remove(id).is_some_and(|sus| sus.misses >= MISSES) {
                        tracing::info!(node = id, "a member reported unreachable answers again");
                    }
                    continue;
                }
                let sus = s.entry(id.clone()).or_insert_with(|| Suspect {
                    addr: addr.clone(),
                    misses: 0,
                });
                sus.misses += 1;
                if sus.misses == MISSES {
                    tracing::warn!(node = id, addr, "a member does not answer; reporting it");
                }
                if sus.misses >= MISSES {
                    report.push(id.clone());
                }
            }
        }
        for id in report {
            etcd.put_leased(
                &format!("reports/{id}/{}", self.id),
                crate::now_ms().to_string(),
                REPORT_TTL_S,
            )
            .await
            .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Reads the reports and steps down or up (see the module's doc).
    async fn step_down_or_up(&self, etcd: &Etcd) -> Result<(), String> {
        let live: BTreeSet<String> = etcd
            .list("live/")
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|(k, _)| k.trim_start_matches("live/").to_string())
            .collect();
        // Reports of this node made before this run started are of a run that is gone (a
        // restart: the probes failed while it was down), and lapse on their own.
        let started_ms = self.incarnation.load(Ordering::Relaxed) / 1000;
        let reports = reports_of(
            etcd.list("reports/")
                .await
                .map_err(|e| e.to_string())?
                .into_iter()
                .filter(|(k, v)| {
                    let about_me = k
                        .trim_start_matches("reports/")
                        .starts_with(&format!("{}/", self.id));
                    let at: u64 = String::from_utf8_lossy(v).parse().unwrap_or(0);
                    !about_me || at >= started_ms
                })
                .map(|(k, _)| k),
        );
        let down = crate::cut_off(&self.id, &live, &reports);
        let was = self.stepped_down.swap(down, Ordering::AcqRel);
        if down {
            // Refusing first, then saying so: the manager acts on the notice.
            etcd.put_leased(
                &format!("stepped-down/{}", self.id),
                crate::now_ms().to_string(),
                REPORT_TTL_S,
            )
            .await
            .map_err(|e| e.to_string())?;
            if !was {
                let by: Vec<&String> = reports.get(&self.id).into_iter().flatten().collect();
                tracing::warn!(
                    ?by,
                    "stepped down: most of the other nodes cannot reach this one"
                );
            }
        } else if was {
            let _ = etcd.delete(&format!("stepped-down/{}", self.id)).await;
            tracing::info!("stepped up: the other nodes reach this one again");
        }
        Ok(())
    }
}

/// The reports under `reports/` (keys `reports/<suspect>/<reporter>`): each suspect's
/// reporters.
pub(crate) fn reports_of(keys: impl Iterator<Item = String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for k in keys {
        if let Some((suspect, reporter)) = k.trim_start_matches("reports/").split_once('/') {
            out.entry(suspect.to_string())
                .or_default()
                .insert(reporter.to_string());
        }
    }
    out
}
