//! What a node keeps of a cluster bucket that was deleted: its local buckets (`o-<id>`, the
//! objects and their history and uploads; `t-<id>`, the tombstones) are emptied and removed.
//! A bucket is deleted only when it holds nothing, so on the nodes that were up this drops
//! empty local buckets and tombstones; a node that was away meanwhile still holds the objects
//! deleted while it was gone, which a resync (over the buckets that exist) never reaches.
//!
//! Only buckets named deleted in etcd (`map::DELETED_BUCKETS`, written with the removal of
//! the bucket's record) are dropped, never one merely missing from a listing, and only once
//! the delete is older than `--tombstone-keep`: writes a gateway sent before it saw the
//! delete have landed by then (a gateway's bucket cache lasts a second).
//!
//! Then the node marks the bucket dropped in etcd (`map::DROPPED_BUCKETS`), and once every
//! registered node has, the note and its marks go: a node away keeps the note until it is
//! back and has dropped its copies (or is removed with `packrat cluster remove-node`).
//!
//! The same pass drops the copies of PGs the node no longer holds a replica of: a node added
//! takes a share of every old node's PGs, a rebalance moves replicas, a node back after its
//! replicas were made elsewhere is given other PGs. Without this their copies stayed on the
//! old node's disks for good (adding a node freed no space). A PG's copies go only when, by
//! the map as etcd has it now (and this node serves by that map): the node is not in the PG's
//! chain, not catching up on it, not away with its place kept; the chain is whole (as many
//! members as the cluster can give it) and every member is caught up; and all of that has
//! held for `--tombstone-keep` (writes routed by an older map have landed by then). Only the
//! buckets etcd lists are swept (a deleted one goes by its note, above), and the drop holds
//! the node's sweep lock, which catching up takes too: a PG given back to this node mid-drop
//! is caught up on once the drop has stopped (it stops at the first key after the map
//! changes), so it copies back whatever the drop removed.

use super::{Node, now_micros, with_versions};
use crate::map::{ClusterMap, Etcd};
use crate::placement::pg_of;
use packrat_store_api::lock::LockCheck;
use packrat_store_api::{Bucket, ListQuery, StoreError, StoreResult, UploadQuery, VersionQuery};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// The PGs a node has left, as its drop passes follow them.
#[derive(Default)]
pub(super) struct LeftPgs {
    /// Since when each PG has been left (and its chain whole and caught up).
    since: HashMap<u32, Instant>,
    /// PGs whose copies were dropped since they were left (not swept again).
    dropped: HashSet<u32>,
}

/// Whether `node` has left `pg` by `map`, and the PG's copies are safe elsewhere: not a
/// member of its chain, not catching up on it, not away with a place kept in it; the chain as
/// long as the other nodes allow, every member caught up.
fn left_safely(map: &ClusterMap, node: &str, pg: u32) -> bool {
    let chain = map.chain(pg);
    let kept_for = map.away.get(node).is_some_and(|a| a.pgs.contains(&pg));
    if chain.is_empty() || chain.iter().any(|n| n == node) || map.is_syncing(node, pg) || kept_for {
        return false;
    }
    let others = map.nodes.keys().filter(|n| *n != node).count();
    chain.len() >= map.replicas.min(others) && chain.iter().all(|n| !map.is_syncing(n, pg))
}

/// The cluster buckets among `local` (ids of this node's local buckets) deleted without a
/// note this node could see: handed out once (`handed_out`, etcd's `bucket-seq`: ids are
/// never reused), no record in etcd now (`existing`) and no note of the delete (`noted`: those
/// go by their note), and so for `keep` (followed in `seen`: first seen, by id). A node that
/// was removed from the cluster while a bucket was deleted (`cluster remove-node` forgets the
/// notes it had not marked) and is added back with its old data directory has such buckets.
/// The data directory's cluster id (checked at start) makes sure those ids are this
/// cluster's.
fn orphans_due(
    local: impl Iterator<Item = u64>,
    existing: &HashSet<u64>,
    noted: &HashSet<u64>,
    handed_out: u64,
    seen: &mut HashMap<u64, Instant>,
    now: Instant,
    keep: Duration,
) -> HashSet<u64> {
    let orphans: HashSet<u64> = local
        .filter(|id| *id <= handed_out && !existing.contains(id) && !noted.contains(id))
        .collect();
    seen.retain(|id, _| orphans.contains(id));
    orphans
        .into_iter()
        .filter(|id| now.duration_since(*seen.entry(*id).or_insert(now)) >= keep)
        .collect()
}

/// The cluster bucket a local bucket belongs to (`o-<id>` or `t-<id>`).
pub(crate) fn cluster_bucket_of(local: &str) -> Option<u64> {
    let id = local
        .strip_prefix("o-")
        .or_else(|| local.strip_prefix("t-"))?;
    id.parse().ok()
}

impl Node {
    /// Drops the local buckets of deleted cluster buckets as often as tombstones are
    /// collected, for the node's life.
    pub async fn drop_deleted_buckets(self: Arc<Self>, etcd: Etcd) {
        let every = self
            .tombstone_keep
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
        let mut left = LeftPgs::default();
        let mut orphans = HashMap::new();
        loop {
            tokio::time::sleep(every).await;
            match self.drop_deleted_buckets_once(&etcd, &mut orphans).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(local_buckets = n, "dropped what deleted buckets left"),
                Err(e) => tracing::warn!("dropping deleted buckets: {e}"),
            }
            match self.drop_left_pgs_once(&etcd, &mut left).await {
                Ok((_, 0)) => {}
                Ok((pgs, copies)) => tracing::info!(
                    pgs,
                    copies,
                    "dropped the copies of placement groups this node no longer holds"
                ),
                Err(e) => tracing::warn!("dropping the copies of PGs left: {e}"),
            }
        }
    }

    /// One pass over the PGs this node has left (see the module's notes); answers how many
    /// PGs' copies it dropped, and how many copies.
    pub(super) async fn drop_left_pgs_once(
        &self,
        etcd: &Etcd,
        left: &mut LeftPgs,
    ) -> StoreResult<(usize, u64)> {
        let (map, _) = etcd.map().await.map_err(StoreError::Unavailable)?;
        if self.map.borrow().epoch != map.epoch {
            return Ok((0, 0)); // this node is not serving by that map yet (or etcd's moved on)
        }
        let now = Instant::now();
        let mut due = BTreeSet::new();
        for pg in 0..map.pgs {
            if !left_safely(&map, &self.id, pg) {
                left.since.remove(&pg);
                left.dropped.remove(&pg);
                continue;
            }
            if left.dropped.contains(&pg) || !self.held.may_hold(pg) {
                continue;
            }
            let since = *left.since.entry(pg).or_insert(now);
            if now.duration_since(since) >= self.tombstone_keep {
                due.insert(pg);
            }
        }
        if due.is_empty() {
            return Ok((0, 0));
        }
        let existing: HashSet<u64> = crate::map::bucket_records(etcd)
            .await
            .map_err(StoreError::Unavailable)?
            .iter()
            .map(|b| b.id)
            .collect();
        let _sweep = self.sweep.lock().await;
        let unchanged = || self.map.borrow().epoch == map.epoch;
        let mut copies = 0;
        for local in self.store.list_buckets().await? {
            let Some(bid) = cluster_bucket_of(&local.name).filter(|b| existing.contains(b)) else {
                continue;
            };
            let drop = |key: &str| due.contains(&pg_of(bid, key, map.pgs));
            let (n, finished) = self.empty_where(&local, &drop, &unchanged).await?;
            copies += n;
            self.copies_dropped.fetch_add(n, Ordering::Relaxed);
            if !finished {
                tracing::info!(
                    copies,
                    "the cluster map changed: dropping the copies of PGs left stops here"
                );
                return Ok((0, copies));
            }
        }
        self.pgs_dropped
            .fetch_add(due.len() as u64, Ordering::Relaxed);
        self.held.dropped(&due, map.epoch);
        let pgs = due.len();
        left.dropped.extend(due);
        Ok((pgs, copies))
    }

    /// One pass; answers how many local buckets it dropped. `orphans` follows the local
    /// buckets of cluster buckets gone without a note (see [`orphans_due`]).
    pub(super) async fn drop_deleted_buckets_once(
        &self,
        etcd: &Etcd,
        orphans: &mut HashMap<u64, Instant>,
    ) -> StoreResult<usize> {
        let unavailable = StoreError::Unavailable;
        let cutoff = (now_micros() / 1000) as i64 - self.tombstone_keep.as_millis() as i64;
        let notes = etcd.deleted_buckets().await.map_err(unavailable)?;
        let gone: HashSet<u64> = notes
            .iter()
            .filter(|(_, at)| *at < cutoff)
            .map(|(id, _)| *id)
            .collect();
        // The local buckets are listed before etcd's records are read: one whose record is
        // missing then was deleted (a local bucket is made by a write, after its record).
        let locals = self.store.list_buckets().await?;
        let existing: HashSet<u64> = crate::map::bucket_records(etcd)
            .await
            .map_err(unavailable)?
            .iter()
            .map(|b| b.id)
            .collect();
        let handed_out = match etcd.get("bucket-seq").await.map_err(unavailable)? {
            Some((v, _)) => String::from_utf8_lossy(&v).parse::<u64>().unwrap_or(0),
            None => 0,
        };
        let noted: HashSet<u64> = notes.iter().map(|(id, _)| *id).collect();
        let ids = locals.iter().filter_map(|l| cluster_bucket_of(&l.name));
        let orphaned = orphans_due(
            ids,
            &existing,
            &noted,
            handed_out,
            orphans,
            Instant::now(),
            self.tombstone_keep,
        );
        if gone.is_empty() && orphaned.is_empty() {
            return Ok(0);
        }
        let mut dropped = 0;
        for local in locals {
            let Some(id) = cluster_bucket_of(&local.name) else {
                continue;
            };
            if !gone.contains(&id) && !orphaned.contains(&id) {
                continue;
            }
            if orphaned.contains(&id) {
                tracing::info!(
                    bucket = id,
                    local = local.name,
                    "dropping the copies of a bucket deleted while this node was out of the cluster"
                );
            }
            if let Ok(mut cached) = self.buckets.lock() {
                cached.remove(&local.name);
                cached.remove(&format!("{}+v", local.name));
            }
            self.empty(&local).await?;
            self.store.delete_bucket(&local).await?;
            self.buckets_dropped.fetch_add(1, Ordering::Relaxed);
            dropped += 1;
        }
        if !gone.is_empty() {
            self.forget_dropped(etcd, &gone).await?;
        }
        Ok(dropped)
    }

    /// Marks the deleted buckets `gone` dropped here (this node holds nothing of them now),
    /// and forgets those every registered node has marked.
    async fn forget_dropped(&self, etcd: &Etcd, gone: &HashSet<u64>) -> StoreResult<()> {
        let unavailable = packrat_store_api::StoreError::Unavailable;
        // Every registered node, those away too: each drops its own copies.
        let members = etcd.registered_nodes().await.map_err(unavailable)?;
        let mut marks = etcd.dropped_buckets().await.map_err(unavailable)?;
        for id in gone {
            let marked = marks.entry(*id).or_default();
            if !marked.contains(&self.id) {
                etcd.mark_bucket_dropped(*id, &self.id)
                    .await
                    .map_err(unavailable)?;
                marked.insert(self.id.clone());
            }
            if members.iter().all(|n| marked.contains(&n.id)) {
                etcd.forget_deleted_bucket(*id).await.map_err(unavailable)?;
                tracing::info!(
                    bucket = id,
                    "every node dropped the deleted bucket: note removed"
                );
            }
        }
        Ok(())
    }

    /// Removes everything a local bucket holds: its current objects, the history its keys
    /// kept, its uploads in progress.
    async fn empty(&self, local: &Bucket) -> StoreResult<()> {
        self.empty_where(local, &|_| true, &|| true).await?;
        Ok(())
    }

    /// Removes what a local bucket holds of the keys `drop` names: their current objects, the
    /// history they kept, their uploads in progress. Stops before the next removal once
    /// `go_on` says no. Answers how many it removed, and whether it went to the end.
    async fn empty_where(
        &self,
        local: &Bucket,
        drop: &(dyn Fn(&str) -> bool + Sync),
        go_on: &(dyn Fn() -> bool + Sync),
    ) -> StoreResult<(u64, bool)> {
        let mut removed = 0u64;
        let mut query = ListQuery {
            max_keys: 1000,
            ..Default::default()
        };
        loop {
            let page = self.store.list_objects(local, &query).await?;
            for o in page.objects.iter().filter(|o| drop(&o.key)) {
                if !go_on() {
                    return Ok((removed, false));
                }
                self.store.delete_object(local, &o.key).await?;
                removed += 1;
            }
            if !page.truncated || page.objects.is_empty() {
                break;
            }
            query.after = page.objects.last().map(|o| o.key.clone());
        }
        // A deleted bucket held no versions; a node away then may still, and none is kept
        // for a bucket that is gone, whatever its lock said (nor for a PG this node left:
        // the chain's members keep theirs).
        let history = with_versions(local);
        let mut query = VersionQuery {
            max_keys: 1000,
            ..Default::default()
        };
        loop {
            let page = self.store.list_versions(&history, &query).await?;
            for v in page.versions.iter().filter(|v| drop(&v.object.key)) {
                if !go_on() {
                    return Ok((removed, false));
                }
                self.store
                    .delete_version(&history, &v.object.key, &v.version_id, LockCheck::Decided)
                    .await?;
                removed += 1;
            }
            if !page.truncated || page.versions.is_empty() {
                break;
            }
            query.key_marker = page.next_key_marker;
            query.version_id_marker = page.next_version_id_marker;
        }
        let mut query = UploadQuery {
            max_uploads: 1000,
            ..Default::default()
        };
        loop {
            let page = self.store.list_uploads(local, &query).await?;
            for u in page.uploads.iter().filter(|u| drop(&u.key)) {
                if !go_on() {
                    return Ok((removed, false));
                }
                self.store.abort_upload(local, &u.key, &u.upload_id).await?;
                removed += 1;
            }
            let Some(last) = page.uploads.last().filter(|_| page.truncated) else {
                break;
            };
            query.key_marker = Some(last.key.clone());
            query.upload_id_marker = Some(last.upload_id.clone());
        }
        Ok((removed, true))
    }
}

#[cfg(test)]
mod tests {
    use super::{cluster_bucket_of, left_safely, orphans_due};
    use std::collections::{HashMap, HashSet};
    use std::time::{Duration, Instant};

    /// A local bucket goes without a note only when its id was handed out, has no record and
    /// no note, and has been so for the keeping time.
    #[test]
    fn orphans_are_due_after_the_keeping_time() {
        let existing: HashSet<u64> = [1, 3].into();
        let noted: HashSet<u64> = [4].into();
        let keep = Duration::from_secs(5);
        let mut seen = HashMap::new();
        let t0 = Instant::now();
        let local = || [1, 2, 2, 3, 4, 9].into_iter();
        // 2: deleted, no note; 9: above the last id handed out (not this cluster's, or not yet).
        assert!(orphans_due(local(), &existing, &noted, 5, &mut seen, t0, keep).is_empty());
        assert_eq!(seen.keys().copied().collect::<Vec<_>>(), vec![2]);
        let later = t0 + keep;
        let due = orphans_due(local(), &existing, &noted, 5, &mut seen, later, keep);
        assert_eq!(due, [2].into());
        // Seen with a record again (a flicker of the listing): the clock starts over.
        let with_2: HashSet<u64> = [1, 2, 3].into();
        assert!(orphans_due(local(), &with_2, &noted, 5, &mut seen, later, keep).is_empty());
        assert!(seen.is_empty());
        assert!(orphans_due(local(), &existing, &noted, 5, &mut seen, later, keep).is_empty());
    }
    use crate::map::{Away, ClusterMap, NodeEntry, NodeState};

    fn map_of(nodes: &[&str], chains: &[&[&str]]) -> ClusterMap {
        let mut map = ClusterMap::new(chains.len() as u32, 3);
        for n in nodes {
            let entry = NodeEntry {
                id: n.to_string(),
                addr: String::new(),
                zone: None,
                weight: 1.0,
                state: NodeState::Active,
                incarnation: 0,
                classes: Vec::new(),
                s3: None,
            };
            map.nodes.insert(n.to_string(), entry);
        }
        map.chains = chains
            .iter()
            .map(|c| c.iter().map(|n| n.to_string()).collect())
            .collect();
        map
    }

    /// A node's copies of a PG go only once it is out of the PG's chain and the chain is
    /// whole and caught up without it.
    #[test]
    fn a_pg_is_left_safely_only_when_whole_elsewhere() {
        let nodes = ["a", "b", "c", "d"];
        let mut map = map_of(
            &nodes,
            &[&["b", "c", "d"], &["a", "b", "c"], &["b", "c"], &[]],
        );
        assert!(left_safely(&map, "a", 0));
        assert!(!left_safely(&map, "a", 1), "a member");
        assert!(!left_safely(&map, "a", 2), "a chain a member short");
        assert!(!left_safely(&map, "a", 3), "no chain at all");
        // A member of the chain still catching up: not yet.
        map.syncing.entry("d".into()).or_default().insert(0, 1);
        assert!(!left_safely(&map, "a", 0));
        map.syncing.clear();
        // Catching up on it itself, or away with its place kept: its own.
        map.syncing.entry("a".into()).or_default().insert(0, 1);
        assert!(!left_safely(&map, "a", 0));
        map.syncing.clear();
        let away = Away {
            since_ms: 0,
            pgs: vec![0],
        };
        map.away.insert("a".into(), away);
        assert!(!left_safely(&map, "a", 0));
        // With fewer other nodes than replicas, a chain of all of them is whole.
        let small = map_of(&["a", "b", "c"], &[&["b", "c"]]);
        assert!(left_safely(&small, "a", 0));
    }

    #[test]
    fn only_local_buckets_of_cluster_buckets_are_named() {
        assert_eq!(cluster_bucket_of("o-17"), Some(17));
        assert_eq!(cluster_bucket_of("t-17"), Some(17));
        assert_eq!(cluster_bucket_of("o-17+v"), None);
        assert_eq!(cluster_bucket_of("datasets"), None);
        assert_eq!(cluster_bucket_of("x-17"), None);
    }
}
