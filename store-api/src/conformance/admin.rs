//! Administration: reports, jobs, fault switches, figures, readiness and the clock.

use super::*;
use crate::admin::{JobKind, JobStart};
use crate::reports::JobProgress;

/// What an operator asks: a status report, a compaction and its job, the tier report, the
/// store's figures (named `packrat_*`, each once), readiness for writes, and a clock that
/// tells the time. Fault injection is off in a store opened as the suite opens it.
pub async fn administration(store: &dyn Store) {
    assert!(store.status(false).await.unwrap().is_object());
    assert!(store.status(true).await.unwrap().is_object());
    let no_grace = std::time::Duration::ZERO;
    let compacted = store.compact(0.0, no_grace).await.unwrap();
    assert!(compacted.seconds >= 0.0);
    let started = store
        .start_job(JobStart::Compact {
            threshold: 0.0,
            grace: no_grace,
        })
        .unwrap();
    assert!(matches!(started, JobProgress::Compact(_)), "{started:?}");
    assert!(matches!(
        store.job_progress(JobKind::Compact).unwrap(),
        JobProgress::Compact(_)
    ));
    assert!(matches!(
        store.job_progress(JobKind::TierRun).unwrap(),
        JobProgress::TierRun(_)
    ));
    let tiers = store.tier_status().await.unwrap();
    assert!(tiers.run.error.is_none(), "{tiers:?}");
    assert!(matches!(
        store.faults(None).await,
        Err(StoreError::Invalid(_))
    ));
    let metrics = store.metrics();
    assert!(!metrics.is_empty());
    let mut names = BTreeSet::new();
    for m in &metrics {
        assert!(m.name.starts_with("packrat_"), "{}", m.name);
        assert!(!m.help.is_empty(), "{} has no help", m.name);
        assert!(names.insert(m.name), "{} twice", m.name);
    }
    store.write_readiness().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((store.clock().now_ms() - now).abs() < 60_000);
}
