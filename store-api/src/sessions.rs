//! Web console sessions: what a store keeps so that a signed-in browser is known to every
//! gateway that serves it. The gateway hands the store a digest of the session's token
//! (never the token) with the access key it acts as and how long it lasts; one process's
//! store keeps them in memory ([`MemorySessions`]), a cluster's in etcd under a lease.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Most live sessions one process keeps; past it the one nearest its end is dropped.
pub const SESSIONS_MAX: usize = 10_000;

struct Session {
    access_key: String,
    expires: Instant,
}

/// Console sessions in one process's memory (a restart ends them), by token digest.
#[derive(Default)]
pub struct MemorySessions {
    map: Mutex<HashMap<String, Session>>,
}

impl MemorySessions {
    /// Records a session of `access_key` under `token_id` for `ttl`.
    pub fn put(&self, token_id: &str, access_key: &str, ttl: Duration) {
        let now = Instant::now();
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.retain(|_, s| s.expires > now);
        if map.len() >= SESSIONS_MAX
            && let Some(oldest) = map
                .iter()
                .min_by_key(|(_, s)| s.expires)
                .map(|(t, _)| t.clone())
        {
            map.remove(&oldest);
        }
        map.insert(
            token_id.to_string(),
            Session {
                access_key: access_key.to_string(),
                expires: now + ttl,
            },
        );
    }

    /// The access key of a live session.
    pub fn get(&self, token_id: &str) -> Option<String> {
        let map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.get(token_id)
            .filter(|s| s.expires > Instant::now())
            .map(|s| s.access_key.clone())
    }

    /// Ends a session (nothing if there is none).
    pub fn end(&self, token_id: &str) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(token_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_end_expire_and_are_bounded() {
        let s = MemorySessions::default();
        s.put("a", "AK1", Duration::from_secs(60));
        s.put("b", "AK2", Duration::ZERO);
        assert_eq!(s.get("a").as_deref(), Some("AK1"));
        assert_eq!(s.get("b"), None, "an expired session is not live");
        s.end("a");
        assert_eq!(s.get("a"), None);
        for i in 0..SESSIONS_MAX + 5 {
            s.put(&i.to_string(), "AK", Duration::from_secs(60 + i as u64));
        }
        let held = s.map.lock().map(|m| m.len()).unwrap_or_default();
        assert_eq!(held, SESSIONS_MAX);
        assert_eq!(s.get("0"), None, "the session nearest its end went first");
        assert!(s.get(&(SESSIONS_MAX + 4).to_string()).is_some());
    }
}
