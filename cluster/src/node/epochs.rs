//! The epoch barrier of a catch-up: chain steps under way here, counted by the epoch of the
//! map they were routed by, so a member catching up from this node can wait until none from
//! an older map is left before it lists what this node has.
//!
//! Why: a member that rejoins a chain in epoch E is absent from the chains of E-1. A write
//! routed by E-1 that this node admitted just before it took E in is still applied here after
//! it took E in. Listed before that, the rejoining member would lack an acknowledged write,
//! declare itself caught up, and later be the source that makes another member drop it.
//!
//! Soundness: a step counts itself under its epoch *before* it checks that epoch against this
//! node's map. So once the map is at E, a step of an older epoch is either counted (the
//! barrier waits for it to end) or sees E and is refused (it never applies anything).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::Notify;

/// How long a catch-up's barrier waits for older steps to end (under a fetch's timeout:
/// the member asking tries again).
pub(super) const DRAIN_WAIT: Duration = Duration::from_secs(8);

#[derive(Default)]
pub(super) struct StepsByEpoch {
    counts: Mutex<BTreeMap<u64, usize>>,
    ended: Notify,
}

/// One step under way, counted under its epoch until dropped.
pub(super) struct StepOfEpoch<'a> {
    steps: &'a StepsByEpoch,
    epoch: u64,
}

impl StepsByEpoch {
    /// Counts a step routed by `epoch`; check the epoch against the node's map after this.
    pub(super) fn enter(&self, epoch: u64) -> StepOfEpoch<'_> {
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        *counts.entry(epoch).or_default() += 1;
        StepOfEpoch { steps: self, epoch }
    }

    fn any_below(&self, epoch: u64) -> bool {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.range(..epoch).next().is_some()
    }

    /// Waits until no step routed by an epoch below `epoch` is under way, at most `within`:
    /// answers whether none is.
    pub(super) async fn drained_below(&self, epoch: u64, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            // Registered before the check, so an end between the check and the wait wakes it.
            ended.as_mut().enable();
            if !self.any_below(epoch) {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                return !self.any_below(epoch);
            }
        }
    }
}

impl Drop for StepOfEpoch<'_> {
    fn drop(&mut self) {
        let mut counts = self.steps.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.epoch) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.epoch);
                drop(counts);
                self.steps.ended.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_barrier_waits_for_older_steps_only() {
        let steps = StepsByEpoch::default();
        let old = steps.enter(4);
        let _current = steps.enter(5);
        let _newer = steps.enter(6);
        assert!(steps.drained_below(4, Duration::ZERO).await);
        assert!(!steps.drained_below(5, Duration::from_millis(20)).await);
        let wait = steps.drained_below(5, Duration::from_secs(5));
        let end = async {
            tokio::time::sleep(Duration::from_millis(30)).await;
            drop(old);
        };
        let (drained, ()) = tokio::join!(wait, end);
        assert!(drained, "the last older step ended");
        assert!(steps.drained_below(5, Duration::ZERO).await);
        assert!(!steps.drained_below(6, Duration::ZERO).await);
    }
}
