//! Wall-clock time, injectable: the one source the store and the S3 layer read the time from.
//!
//! Everything that acts on the date goes through a [`Clock`]: objects' and uploads'
//! last-modified and initiated times, bucket and key creation times, lifecycle ages and dates,
//! tier segment and compaction timestamps, SigV4 request-time and presigned-expiry checks.
//! [`SystemClock`] is the system's; tests use a [`ManualClock`] to move a store through days of
//! lifecycle rules, or a request out of its signature's validity, without waiting. (Monotonic
//! intervals, such as idle and grace periods, pacing and timeouts, use `Instant` and are not
//! dates. The chunk store's segment and shard headers carry a creation stamp from the system
//! clock that nothing reads back to decide anything.)

use std::sync::atomic::{AtomicI64, Ordering::Relaxed};

/// The current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    /// Milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
}

/// The system clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64)
    }
}

/// A clock that stands still until it is set or advanced (tests).
#[derive(Debug)]
pub struct ManualClock(AtomicI64);

impl ManualClock {
    pub fn new(now_ms: i64) -> Self {
        Self(AtomicI64::new(now_ms))
    }

    /// Starts at the system clock's time.
    pub fn now() -> Self {
        Self::new(SystemClock.now_ms())
    }

    pub fn set(&self, now_ms: i64) {
        self.0.store(now_ms, Relaxed);
    }

    pub fn advance(&self, ms: i64) {
        self.0.fetch_add(ms, Relaxed);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.0.load(Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let c = ManualClock::new(1_000);
        assert_eq!(c.now_ms(), 1_000);
        c.advance(86_400_000);
        assert_eq!(c.now_ms(), 86_401_000);
        c.set(5);
        assert_eq!(c.now_ms(), 5);
        let sys = SystemClock.now_ms();
        assert!(sys > 1_700_000_000_000, "{sys}");
    }
}
