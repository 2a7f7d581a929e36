//! What a store's long jobs report (compaction, scrub, tier runs) and its tier status, as typed
//! documents: the local store fills them, a cluster adds up its nodes' ([`Sum`]), the admin API
//! answers them as JSON and the CLI reads them back into the same types.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Adds another store's report of the same kind to this one: what a cluster answers for its
/// nodes together. Counts add up, durations take the longest, lists are joined.
pub trait Sum {
    fn add(&mut self, other: &Self);
}

/// The sum of `reports` (the first one's shape, the others added), if there is one.
pub fn sum_all<R: Sum + Clone>(reports: &[R]) -> Option<R> {
    let (first, rest) = reports.split_first()?;
    let mut sum = first.clone();
    for r in rest {
        sum.add(r);
    }
    Some(sum)
}

/// Where a background job is, as the admin API answers it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Progress<R> {
    pub running: bool,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub finished_runs: u64,
    /// The report of the last run that finished.
    pub report: Option<R>,
    pub error: Option<String>,
}

impl<R: Sum + Clone> Progress<R> {
    /// A job over several stores (a cluster's nodes) as one: running while any runs, bytes
    /// added up, the runs finished those of the store that finished fewest (so a client
    /// waiting for the next run waits for every store's), the reports added up once every
    /// store has one, the first error.
    pub fn sum(nodes: &[Progress<R>]) -> Progress<R> {
        let reports: Option<Vec<R>> = nodes.iter().map(|p| p.report.clone()).collect();
        Progress {
            running: nodes.iter().any(|p| p.running),
            done_bytes: nodes.iter().map(|p| p.done_bytes).sum(),
            total_bytes: nodes.iter().map(|p| p.total_bytes).sum(),
            finished_runs: nodes.iter().map(|p| p.finished_runs).min().unwrap_or(0),
            report: reports.and_then(|r| sum_all(&r)),
            error: nodes.iter().find_map(|p| p.error.clone()),
        }
    }
}

/// The progress of one of the three jobs (see [`crate::admin::JobKind`]); answered as the
/// job's own [`Progress`] document.
#[derive(Debug, Clone, Serialize)]
#[serde(untagged)]
pub enum JobProgress {
    Scrub(Progress<ScrubReport>),
    TierRun(Progress<TierRunReport>),
    Compact(Progress<CompactReport>),
}

impl JobProgress {
    fn parts(&self) -> (bool, u64, Option<&str>) {
        match self {
            JobProgress::Scrub(p) => (p.running, p.finished_runs, p.error.as_deref()),
            JobProgress::TierRun(p) => (p.running, p.finished_runs, p.error.as_deref()),
            JobProgress::Compact(p) => (p.running, p.finished_runs, p.error.as_deref()),
        }
    }

    pub fn running(&self) -> bool {
        self.parts().0
    }

    /// Runs finished, failed ones included.
    pub fn finished_runs(&self) -> u64 {
        self.parts().1
    }

    /// The last run's error, if it failed.
    pub fn error(&self) -> Option<&str> {
        self.parts().2
    }
}

/// Live and dead bytes of the segments, as of a compaction scan.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Space {
    pub segment_bytes: u64,
    pub live_bytes: u64,
    pub dead_bytes: u64,
    /// Unix ms of the scan (of the latest, in a sum).
    pub measured_ms: i64,
}

impl Sum for Space {
    fn add(&mut self, o: &Self) {
        self.segment_bytes += o.segment_bytes;
        self.live_bytes += o.live_bytes;
        self.dead_bytes += o.dead_bytes;
        self.measured_ms = self.measured_ms.max(o.measured_ms);
    }
}

/// What a compaction found and did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CompactReport {
    pub objects_scanned: u64,
    pub sealed_segments: u64,
    /// Segments below the threshold, chosen for compaction.
    pub segments_chosen: u64,
    /// Segments removed.
    pub segments_removed: u64,
    /// Chosen segments kept because something still referenced them after the move (a
    /// record that could not be read), or a write in flight might still reach them.
    pub segments_kept: u64,
    pub records_moved: u64,
    pub bytes_moved: u64,
    pub objects_moved: u64,
    /// Objects overwritten or deleted while being moved (their new version won).
    pub objects_changed_meanwhile: u64,
    pub bytes_reclaimed: u64,
    pub before: Space,
    pub seconds: f64,
}

impl Sum for CompactReport {
    fn add(&mut self, o: &Self) {
        self.objects_scanned += o.objects_scanned;
        self.sealed_segments += o.sealed_segments;
        self.segments_chosen += o.segments_chosen;
        self.segments_removed += o.segments_removed;
        self.segments_kept += o.segments_kept;
        self.records_moved += o.records_moved;
        self.bytes_moved += o.bytes_moved;
        self.objects_moved += o.objects_moved;
        self.objects_changed_meanwhile += o.objects_changed_meanwhile;
        self.bytes_reclaimed += o.bytes_reclaimed;
        self.before.add(&o.before);
        self.seconds = self.seconds.max(o.seconds);
    }
}

/// What a scrub of erasure-coded segments found and did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ScrubReport {
    pub segments_checked: u64,
    pub shards_checked: u64,
    pub bytes_checked: u64,
    pub shards_missing: u64,
    pub shards_corrupt: u64,
    pub shards_rebuilt: u64,
    pub segments_sealed: u64,
    /// Segments that could not be repaired (fewer than k good shards), by id.
    pub unrepairable: Vec<u64>,
}

impl Sum for ScrubReport {
    fn add(&mut self, o: &Self) {
        self.segments_checked += o.segments_checked;
        self.shards_checked += o.shards_checked;
        self.bytes_checked += o.bytes_checked;
        self.shards_missing += o.shards_missing;
        self.shards_corrupt += o.shards_corrupt;
        self.shards_rebuilt += o.shards_rebuilt;
        self.segments_sealed += o.segments_sealed;
        self.unrepairable.extend_from_slice(&o.unrepairable);
    }
}

/// What a tier run (lifecycle rules, then moves between tiers) did.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct TierRunReport {
    pub lifecycle_transitions: u64,
    pub lifecycle_expirations: u64,
    /// Versions removed by NoncurrentVersionExpiration, and delete markers left alone by it
    /// or otherwise removed by ExpiredObjectDeleteMarker.
    #[serde(default)]
    pub lifecycle_versions_removed: u64,
    /// Noncurrent versions given a colder class by NoncurrentVersionTransition (their bytes
    /// move with the objects', counted in `objects_moved`).
    #[serde(default)]
    pub lifecycle_versions_transitioned: u64,
    pub uploads_aborted: u64,
    pub objects_moved: u64,
    pub bytes_moved: u64,
    /// Objects that changed (overwritten, deleted) while being moved: left as they are.
    pub objects_skipped: u64,
    /// Objects with a record that failed to read (corrupt or lost): left where they are, and
    /// logged; the run goes on with the others.
    #[serde(default)]
    pub objects_unreadable: u64,
    pub segments_written: u64,
    pub segments_removed: u64,
    pub nvme_bytes_reclaimed: u64,
    pub seconds: f64,
}

impl Sum for TierRunReport {
    fn add(&mut self, o: &Self) {
        self.lifecycle_transitions += o.lifecycle_transitions;
        self.lifecycle_expirations += o.lifecycle_expirations;
        self.lifecycle_versions_removed += o.lifecycle_versions_removed;
        self.lifecycle_versions_transitioned += o.lifecycle_versions_transitioned;
        self.uploads_aborted += o.uploads_aborted;
        self.objects_moved += o.objects_moved;
        self.bytes_moved += o.bytes_moved;
        self.objects_skipped += o.objects_skipped;
        self.objects_unreadable += o.objects_unreadable;
        self.segments_written += o.segments_written;
        self.segments_removed += o.segments_removed;
        self.nvme_bytes_reclaimed += o.nvme_bytes_reclaimed;
        self.seconds = self.seconds.max(o.seconds);
    }
}

/// What `admin tier status` reports.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TierStatus {
    pub tiers: Vec<TierInfo>,
    /// Objects and bytes whose data is (entirely or partly) still on local NVMe.
    pub standard_objects: u64,
    pub standard_bytes: u64,
    pub nvme_segment_bytes: u64,
    /// Objects and noncurrent versions whose data is not where their class says, and their
    /// bytes.
    pub pending_objects: u64,
    pub pending_bytes: u64,
    pub cache_bytes: u64,
    pub run: Progress<TierRunReport>,
    /// A cluster's: each node's own status, by node id (absent for one store).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<BTreeMap<String, TierStatus>>,
}

impl TierStatus {
    /// A cluster's nodes' tier status as one: their figures added up (objects and bytes count
    /// every replica, each node tiering its own copies), tiers merged by class, the tier run's
    /// progress as [`Progress::sum`] sums it, and each node's own status under `nodes`.
    pub fn of_nodes(nodes: BTreeMap<String, TierStatus>) -> Option<TierStatus> {
        let mut all = nodes.values();
        let mut sum = all.next()?.clone();
        sum.tiers.clear();
        sum.standard_objects = 0;
        sum.standard_bytes = 0;
        sum.nvme_segment_bytes = 0;
        sum.pending_objects = 0;
        sum.pending_bytes = 0;
        sum.cache_bytes = 0;
        for n in nodes.values() {
            for t in &n.tiers {
                match sum.tiers.iter_mut().find(|m| m.class == t.class) {
                    Some(m) => m.add(t),
                    None => sum.tiers.push(t.clone()),
                }
            }
            sum.standard_objects += n.standard_objects;
            sum.standard_bytes += n.standard_bytes;
            sum.nvme_segment_bytes += n.nvme_segment_bytes;
            sum.pending_objects += n.pending_objects;
            sum.pending_bytes += n.pending_bytes;
            sum.cache_bytes += n.cache_bytes;
        }
        for t in &mut sum.tiers {
            // Each node has its own target for a class (its directory, its prefix).
            t.target = "each node's own (see nodes)".into();
        }
        let runs: Vec<_> = nodes.values().map(|n| n.run.clone()).collect();
        sum.run = Progress::sum(&runs);
        sum.nodes = Some(nodes);
        Some(sum)
    }
}

/// One storage tier's share of the data.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TierInfo {
    pub class: String,
    pub target: String,
    pub segments: u64,
    pub segment_bytes: u64,
    pub objects: u64,
    pub object_bytes: u64,
    /// Noncurrent versions (of versioned buckets) whose data is on this tier.
    #[serde(default)]
    pub versions: u64,
    #[serde(default)]
    pub version_bytes: u64,
}

impl Sum for TierInfo {
    fn add(&mut self, o: &Self) {
        self.segments += o.segments;
        self.segment_bytes += o.segment_bytes;
        self.objects += o.objects;
        self.object_bytes += o.object_bytes;
        self.versions += o.versions;
        self.version_bytes += o.version_bytes;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(
        running: bool,
        done: u64,
        finished: u64,
        report: Option<u64>,
    ) -> Progress<ScrubReport> {
        Progress {
            running,
            done_bytes: done,
            total_bytes: 10,
            finished_runs: finished,
            report: report.map(|n| ScrubReport {
                segments_checked: n,
                unrepairable: vec![n],
                ..Default::default()
            }),
            error: None,
        }
    }

    #[test]
    fn a_job_over_nodes_adds_up_as_one() {
        let sum = Progress::sum(&[
            progress(false, 10, 3, Some(2)),
            progress(true, 4, 2, Some(5)),
        ]);
        assert!(sum.running, "running while one node runs");
        assert_eq!(
            (sum.done_bytes, sum.total_bytes, sum.finished_runs),
            (14, 20, 2)
        );
        let r = sum.report.expect("every node has a report");
        assert_eq!((r.segments_checked, r.unrepairable), (7, vec![2, 5]));
        let none = Progress::sum(&[progress(false, 0, 1, Some(1)), progress(false, 0, 0, None)]);
        assert!(
            none.report.is_none(),
            "no sum until every node has finished a run"
        );
    }

    #[test]
    fn a_cluster_tier_status_merges_tiers_by_class_and_keeps_each_node() {
        let node = |objects, class: &str| TierStatus {
            tiers: vec![TierInfo {
                class: class.into(),
                target: "/x".into(),
                segments: 1,
                segment_bytes: 100,
                objects,
                object_bytes: 10 * objects,
                versions: 0,
                version_bytes: 0,
            }],
            standard_objects: objects,
            standard_bytes: 1,
            nvme_segment_bytes: 2,
            pending_objects: 0,
            pending_bytes: 0,
            cache_bytes: 3,
            run: Progress {
                running: false,
                done_bytes: 0,
                total_bytes: 0,
                finished_runs: 1,
                report: Some(TierRunReport::default()),
                error: None,
            },
            nodes: None,
        };
        let nodes = BTreeMap::from([
            ("n0".to_string(), node(2, "COLD")),
            ("n1".to_string(), node(3, "COLD")),
            ("n2".to_string(), node(4, "GLACIER")),
        ]);
        let sum = TierStatus::of_nodes(nodes).expect("three nodes");
        assert_eq!(sum.standard_objects, 9);
        assert_eq!(sum.cache_bytes, 9);
        let cold = sum.tiers.iter().find(|t| t.class == "COLD").expect("COLD");
        assert_eq!((cold.objects, cold.segments), (5, 2));
        assert_eq!(cold.target, "each node's own (see nodes)");
        assert_eq!(sum.tiers.len(), 2);
        assert_eq!(sum.nodes.as_ref().map(BTreeMap::len), Some(3));
        let json = serde_json::to_value(&sum).expect("json");
        assert_eq!(json["nodes"]["n1"]["standard_objects"], 3);
    }
}
