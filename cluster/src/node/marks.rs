//! The marks a member keeps per key: steps applied here and not yet acknowledged by the rest
//! of the chain (dirty keys, see [`DirtyMark`]), history steps, and buckets with versioning.

use super::{Asker, DirtyMark, Fail, Node};
use std::collections::HashMap;

impl Node {
    /// Notes that bucket `bid` has versioning (see `Node::versioned_bids`).
    pub(super) fn note_versioned(&self, bid: u64) {
        if let Ok(mut v) = self.versioned_bids.lock() {
            v.insert(bid);
        }
    }

    pub(super) fn is_versioned(&self, bid: u64) -> bool {
        self.versioned_bids.lock().is_ok_and(|v| v.contains(&bid))
    }

    /// Forgets the history step `cv` of a key (see `Node::history_steps`) once handed on.
    pub(super) fn history_step_done(&self, bid: u64, key: &str, cv: u64) {
        if let Ok(mut h) = self.history_steps.lock() {
            let k = (bid, key.to_string());
            if h.get(&k) == Some(&cv) {
                h.remove(&k);
            }
        }
    }

    /// Marks a key's write `cv` as on its way down the chain (see `Node::dirty`).
    pub(super) fn mark_dirty(&self, bid: u64, key: &str, cv: u64) {
        let epoch = self.map.borrow().epoch;
        if let Ok(mut d) = self.dirty.lock() {
            let k = (bid, key.to_string());
            let before = d.get(&k).map(|m| m.cv).filter(|b| *b < cv);
            d.insert(k, DirtyMark { cv, before, epoch });
        }
    }

    /// Marks a version this member, catching up, copied (or found it already held) from a
    /// source that holds the key marked: a step not yet acknowledged by the rest of the chain,
    /// which the members after the source may lack. Unmarked, this member would serve it once
    /// caught up while another caught-up member serves the version before it, and reads would
    /// flip between the two. Marked, its reads go to the tail (or, at the tail, wait as
    /// unsettled) until the step is re-sent through the chain (see `unsettled`: this member's
    /// own re-send rounds, or the source's), which clears the mark.
    pub(super) fn mark_copied_unsettled(&self, bid: u64, key: &str, cv: u64) {
        tracing::debug!(bid, key, cv, "copied a version its source holds unsettled");
        self.mark_dirty(bid, key, cv);
    }

    /// On a copy given to a member catching up: whether this member holds the key marked
    /// ([`crate::wire::UNSETTLED_HEADER`]), judged after the lookup (see `read_meta`): a copy
    /// not marked now was committed; a marked one the member catching up marks too.
    pub(super) fn tell_unsettled(
        &self,
        resp: &mut super::NodeResp,
        who: Asker,
        bid: u64,
        key: &str,
    ) {
        if who == Asker::Resync && self.is_dirty(bid, key) {
            resp.headers_mut().insert(
                crate::wire::UNSETTLED_HEADER,
                http::HeaderValue::from_static("1"),
            );
        }
    }

    /// The epoch of a key's mark, if it is marked (see [`DirtyMark`]).
    pub(super) fn dirty_since(&self, bid: u64, key: &str) -> Option<u64> {
        self.dirty
            .lock()
            .ok()?
            .get(&(bid, key.to_string()))
            .map(|m| m.epoch)
    }

    /// Clears a key's mark once the rest of the chain holds version `cv` (or a newer one):
    /// an older step still marked is settled by it too.
    pub(super) fn clear_dirty(&self, bid: u64, key: &str, cv: u64) {
        if let Ok(mut d) = self.dirty.lock() {
            let k = (bid, key.to_string());
            if d.get(&k).is_some_and(|pending| pending.cv <= cv) {
                d.remove(&k);
            }
        }
    }

    /// Takes back the mark of step `cv`, which failed here before it was handed on: the key
    /// is marked as it was before the step (an earlier step not handed on yet stays marked).
    pub(super) fn undo_dirty(&self, bid: u64, key: &str, cv: u64) {
        if let Ok(mut d) = self.dirty.lock() {
            let k = (bid, key.to_string());
            match d.get(&k).copied() {
                Some(DirtyMark {
                    cv: marked,
                    before: Some(b),
                    epoch,
                }) if marked == cv => {
                    d.insert(
                        k,
                        DirtyMark {
                            cv: b,
                            before: None,
                            epoch,
                        },
                    );
                }
                Some(m) if m.cv == cv => {
                    d.remove(&k);
                }
                _ => {}
            }
        }
    }

    /// Whether a key's newest step here is still `cv`'s, not yet handed on.
    pub(super) fn dirty_at(&self, bid: u64, key: &str, cv: u64) -> bool {
        self.dirty
            .lock()
            .is_ok_and(|d| d.get(&(bid, key.to_string())).map(|m| m.cv) == Some(cv))
    }

    /// For each key given (`None`: not to be judged), whether it is dirty; one look at the
    /// marks for them all.
    pub(super) fn dirty_among<'k>(
        &self,
        bid: u64,
        keys: impl Iterator<Item = Option<&'k str>>,
    ) -> Vec<bool> {
        let Ok(d) = self.dirty.lock() else {
            return keys.map(|k| k.is_some()).collect();
        };
        if d.is_empty() {
            return keys.map(|_| false).collect();
        }
        keys.map(|k| k.is_some_and(|k| d.contains_key(&(bid, k.to_string()))))
            .collect()
    }

    /// With `settle` (a member catching up judges its own copy against this node's): refused
    /// while a step of the key is under way here. A member after this one in the chain may
    /// already hold that step's version, committed, while it is staged and not yet visible
    /// here; judged against what is visible, it would be dropped as one that never committed.
    /// Checked before the lookup that follows: a step's mark is set before the member after
    /// this one gets it, and cleared only once its version is visible here.
    pub(super) fn settled_here(
        &self,
        bid: u64,
        key: &str,
        q: &HashMap<String, String>,
    ) -> Result<(), Fail> {
        if q.contains_key("settle") && self.is_dirty(bid, key) {
            return Err(Fail::Refused(format!(
                "a step of {key} is under way at {}",
                self.id
            )));
        }
        Ok(())
    }

    pub(super) fn is_dirty(&self, bid: u64, key: &str) -> bool {
        self.dirty
            .lock()
            .is_ok_and(|d| d.contains_key(&(bid, key.to_string())))
    }
}
