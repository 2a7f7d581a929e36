//! Names a gateway asked etcd for and etcd did not have (buckets, access keys), remembered
//! briefly so that requests naming unknown ones (a scan, a loop with a typo, forged access
//! keys) do not each read etcd. An entry holds for [`MISS_TTL`] and only until the gateway's
//! caches next reload: any bucket or key written anywhere reloads them (the watch in
//! `ClusterStore::follow`), so a bucket made through another gateway is seen as soon as it
//! would be without this, give or take the watch's delivery.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a miss is remembered at most.
pub const MISS_TTL: Duration = Duration::from_secs(2);
/// Misses remembered at most; past it the set starts again (a bound, not an eviction order).
pub const MISSES_MAX: usize = 4096;

#[derive(Default)]
pub struct Misses {
    seen: Mutex<HashMap<String, Instant>>,
}

impl Misses {
    /// Whether `name` was missing from etcd less than [`MISS_TTL`] ago (and no reload since).
    pub fn fresh(&self, name: &str, now: Instant) -> bool {
        self.seen
            .lock()
            .ok()
            .and_then(|s| s.get(name).copied())
            .is_some_and(|at| now.saturating_duration_since(at) < MISS_TTL)
    }

    /// `name` was missing from etcd at `now`.
    pub fn note(&self, name: &str, now: Instant) {
        if let Ok(mut s) = self.seen.lock() {
            if s.len() >= MISSES_MAX {
                s.clear();
            }
            s.insert(name.to_string(), now);
        }
    }

    /// The caches reloaded (or this gateway made the name): nothing remembered holds.
    pub fn forget_all(&self) {
        if let Ok(mut s) = self.seen.lock() {
            s.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_holds_for_its_time_until_a_reload_and_the_set_is_bounded() {
        let m = Misses::default();
        let t = Instant::now();
        assert!(!m.fresh("b", t));
        m.note("b", t);
        assert!(m.fresh("b", t + Duration::from_millis(100)));
        assert!(!m.fresh("b", t + MISS_TTL), "past its time");
        m.forget_all();
        assert!(!m.fresh("b", t), "a reload forgets it");
        for i in 0..MISSES_MAX {
            m.note(&i.to_string(), t);
        }
        assert!(m.fresh("0", t));
        m.note("one more", t);
        assert!(!m.fresh("0", t) && m.fresh("one more", t), "bounded");
    }
}
