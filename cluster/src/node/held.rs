//! Which PGs a node may hold copies of, kept in its data directory (`held-pgs.json`), so that
//! a node that starts again, or starts for the first time, does not sweep its local buckets
//! for PGs it is known to hold nothing of (see `dropped`: the copies of a PG a node left are
//! dropped by a pass over every key it holds; without this file a restarted node made that
//! pass once more for every PG it does not hold, and found nothing).
//!
//! The set only grows before the node serves by a map (the map's publisher notes it first,
//! and writes the file durably), and only shrinks when a drop pass has emptied PGs under the
//! newest map noted. So at any time, on disk, every PG the node could have a copy of is in
//! it. When the set is not known (an old data directory without the file, or a write that
//! failed and could not even remove the file), every PG counts as held: the old behaviour.

use crate::map::ClusterMap;
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The file's name in a node's data directory.
pub const HELD_PGS_FILE: &str = "held-pgs.json";

#[derive(Serialize, Deserialize)]
struct OnDisk {
    /// The cluster's PG count (fixed for its life): a file for another count is ignored.
    pgs: u32,
    held: BTreeSet<u32>,
}

struct State {
    /// `None`: not known, every PG counts as held.
    held: Option<BTreeSet<u32>>,
    /// The PG count, once a map was noted.
    pgs: u32,
    /// The newest map epoch noted: a drop pass under an older map removes nothing.
    noted_epoch: u64,
}

pub struct HeldPgs {
    /// `None`: kept in memory only (no data directory given).
    path: Option<PathBuf>,
    state: Mutex<State>,
}

impl HeldPgs {
    /// What the file in `dir` says. Without a file, a node whose store has no cluster
    /// buckets yet (`fresh`) holds nothing; any other holds, as far as it knows, every PG.
    pub fn load(dir: Option<&Path>, fresh: bool) -> Self {
        let path = dir.map(|d| d.join(HELD_PGS_FILE));
        let (held, pgs) = match path.as_deref().map(std::fs::read) {
            Some(Ok(bytes)) => match serde_json::from_slice::<OnDisk>(&bytes) {
                Ok(d) => (Some(d.held), d.pgs),
                Err(e) => {
                    tracing::warn!("{HELD_PGS_FILE}: {e}; every PG counts as held");
                    (None, 0)
                }
            },
            _ if fresh => (Some(BTreeSet::new()), 0),
            _ => (None, 0),
        };
        HeldPgs {
            path,
            state: Mutex::new(State {
                held,
                pgs,
                noted_epoch: 0,
            }),
        }
    }

    /// Called with each map before this node serves by it: the PGs it puts on this node
    /// (in a chain, catching up, kept while away) join the set, on disk before the map is
    /// used.
    pub fn note_map(&self, map: &ClusterMap, node: &str) {
        let mut st = self.lock();
        st.noted_epoch = st.noted_epoch.max(map.epoch);
        if st.pgs != map.pgs {
            if st.pgs != 0 {
                st.held = None; // a file for another PG count says nothing of these PGs
            }
            st.pgs = map.pgs;
        }
        let Some(held) = st.held.as_mut() else {
            return;
        };
        let kept = map.away.get(node).map(|a| a.pgs.as_slice()).unwrap_or(&[]);
        let before = held.len();
        for pg in 0..map.pgs {
            if map.chain(pg).iter().any(|n| n == node) || map.is_syncing(node, pg) {
                held.insert(pg);
            }
        }
        held.extend(kept.iter().copied());
        if held.len() != before {
            self.save(&mut st);
        }
    }

    /// The copies of `pgs` were dropped by a pass under the map of `epoch`: they leave the
    /// set, unless a newer map was noted meanwhile (it may give one of them back).
    pub fn dropped(&self, pgs: &BTreeSet<u32>, epoch: u64) {
        let mut st = self.lock();
        if st.noted_epoch != epoch || st.pgs == 0 {
            return;
        }
        let all = st.pgs;
        let held = st.held.get_or_insert_with(|| (0..all).collect());
        let before = held.len();
        held.retain(|pg| !pgs.contains(pg));
        if held.len() != before {
            self.save(&mut st);
        }
    }

    /// Whether this node may hold copies of `pg`.
    pub fn may_hold(&self, pg: u32) -> bool {
        self.lock().held.as_ref().is_none_or(|h| h.contains(&pg))
    }

    /// How many PGs this node may hold copies of (every PG when that is not known).
    pub fn count(&self) -> usize {
        let st = self.lock();
        st.held.as_ref().map_or(st.pgs as usize, BTreeSet::len)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Writes the set durably (`replace_durably`). This runs on the map's publishing task,
    /// once per map that adds PGs here and once per drop pass: a few KiB and an fsync,
    /// rarely. If it fails, the set becomes unknown and the file goes, so the disk never says
    /// less than the node holds.
    fn save(&self, st: &mut State) {
        let Some(path) = &self.path else {
            return;
        };
        let Some(held) = &st.held else {
            return;
        };
        let body = OnDisk {
            pgs: st.pgs,
            held: held.clone(),
        };
        let written = serde_json::to_vec(&body)
            .map_err(std::io::Error::from)
            .and_then(|bytes| packrat_secrets::files::replace_durably(path, &bytes, 0o644));
        if let Err(e) = written {
            tracing::error!(
                "cannot write {}: {e}; every PG now counts as held (a start sweeps them all)",
                path.display()
            );
            st.held = None;
            if let Err(e) = std::fs::remove_file(path)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::error!("cannot remove {}: {e}", path.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::map::Away;

    fn map(epoch: u64, chains: &[&[&str]]) -> ClusterMap {
        let mut m = ClusterMap::new(chains.len() as u32, 2);
        m.epoch = epoch;
        m.chains = chains
            .iter()
            .map(|c| c.iter().map(|s| s.to_string()).collect())
            .collect();
        m
    }

    #[test]
    fn the_set_grows_with_maps_shrinks_with_drops_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let held = HeldPgs::load(Some(dir.path()), true);
        assert_eq!(held.count(), 0);
        held.note_map(
            &map(1, &[&["a", "b"], &["b", "c"], &["c", "a"], &["b", "c"]]),
            "a",
        );
        assert_eq!(held.count(), 2);
        assert!(held.may_hold(0) && held.may_hold(2) && !held.may_hold(1));
        // PG 2 moves away; the set keeps it until a pass under the newest map drops it.
        held.note_map(
            &map(2, &[&["a", "b"], &["b", "c"], &["c", "b"], &["b", "c"]]),
            "a",
        );
        assert!(held.may_hold(2));
        held.dropped(&BTreeSet::from([2]), 1); // a pass under an older map: nothing
        assert!(held.may_hold(2));
        held.dropped(&BTreeSet::from([2]), 2);
        assert!(!held.may_hold(2));
        // Restarted: the file says PG 0 only, though the store is not fresh.
        let again = HeldPgs::load(Some(dir.path()), false);
        assert_eq!(again.count(), 1);
        assert!(again.may_hold(0) && !again.may_hold(1) && !again.may_hold(3));
        // A PG kept for this node while it is away counts as held.
        let mut m = map(3, &[&["b", "c"], &["b", "c"], &["c", "b"], &["b", "c"]]);
        m.away.insert(
            "a".into(),
            Away {
                since_ms: 0,
                pgs: vec![3],
            },
        );
        again.note_map(&m, "a");
        assert!(again.may_hold(3) && again.may_hold(0));
    }

    #[test]
    fn without_a_file_an_old_store_holds_everything_until_a_drop() {
        let dir = tempfile::tempdir().unwrap();
        let held = HeldPgs::load(Some(dir.path()), false);
        held.note_map(&map(5, &[&["a"], &["b"], &["b"]]), "a");
        assert_eq!(held.count(), 3);
        assert!(held.may_hold(1) && held.may_hold(2));
        assert!(!dir.path().join(HELD_PGS_FILE).exists());
        held.dropped(&BTreeSet::from([1, 2]), 5);
        assert_eq!(held.count(), 1);
        let again = HeldPgs::load(Some(dir.path()), false);
        assert!(again.may_hold(0) && !again.may_hold(1) && !again.may_hold(2));
    }

    #[test]
    fn a_file_that_cannot_be_written_leaves_every_pg_held() {
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("missing-dir");
        let held = HeldPgs::load(Some(&gone), true);
        held.note_map(&map(1, &[&["a"], &["b"]]), "a");
        assert!(
            held.may_hold(1),
            "a failed write must not leave a set smaller than the truth"
        );
        assert_eq!(held.count(), 2);
    }
}
