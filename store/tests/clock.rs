//! The store reads the date from the clock it is given: with a manual clock, lifecycle rules
//! act on days that pass on that clock (not on the system's), and what the store dates itself
//! (keys it creates, tier segments) carries the clock's time.

use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::admin::{JobKind, JobStart, NewKey};
use packrat_store_api::conformance::{MemSource, new_bucket};
use packrat_store_api::lifecycle::{Rule, When};
use packrat_store_api::{Clock, ManualClock, ObjectAttrs, PutObject, ReplicaStore};
use std::sync::Arc;
use std::time::Duration;

const DAY_MS: i64 = 86_400_000;
/// 2031-01-01, far from the system clock's date.
const START_MS: i64 = 1_924_992_000_000;

fn open(clock: Arc<ManualClock>) -> Arc<dyn ReplicaStore> {
    let dir = tempfile::tempdir().unwrap().keep();
    let opened = LocalStore::open(LocalOptions {
        clock,
        ..LocalOptions::new(dir)
    })
    .unwrap();
    Arc::new(opened.store)
}

/// Runs a tier run (lifecycle rules, with no tiers) to its end.
async fn tier_run(store: &dyn ReplicaStore) {
    let before = store
        .job_progress(JobKind::TierRun)
        .unwrap()
        .finished_runs();
    store
        .start_job(JobStart::TierRun { days_ahead: 0 })
        .unwrap();
    for _ in 0..500 {
        let p = store.job_progress(JobKind::TierRun).unwrap();
        if p.finished_runs() > before {
            assert!(p.error().is_none(), "tier run failed: {p:?}");
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the tier run did not finish");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_expiration_follows_the_store_clock() {
    let clock = Arc::new(ManualClock::new(START_MS));
    let store = open(clock.clone());
    assert_eq!(
        store.clock().now_ms(),
        START_MS,
        "the store answers the clock it was given"
    );
    let b = new_bucket(&*store, "clock").await;
    let put = |key: &'static str| {
        let store = store.clone();
        let b = b.clone();
        let now = clock.now_ms();
        async move {
            let mut src = MemSource::new(vec![7u8; 1000]);
            let put = PutObject {
                attrs: ObjectAttrs {
                    last_modified_ms: now,
                    ..Default::default()
                },
                ..Default::default()
            };
            store.put_object(&b, key, &mut src, put).await.unwrap()
        }
    };
    put("logs/old").await;
    clock.advance(DAY_MS);
    put("logs/new").await;
    store
        .put_lifecycle(
            &b,
            vec![Rule {
                id: "expire".into(),
                enabled: true,
                prefix: "logs/".into(),
                expiration: Some(When::Days(2)),
                ..Default::default()
            }],
        )
        .await
        .unwrap();
    // The system clock is years before START_MS: nothing is due by it, and nothing by this
    // clock yet either (the older object is one day old).
    tier_run(&*store).await;
    assert!(store.head_object(&b, "logs/old").await.unwrap().is_some());
    // One more day on this clock: the older object is two days old, the newer one is not.
    clock.advance(DAY_MS);
    tier_run(&*store).await;
    assert!(store.head_object(&b, "logs/old").await.unwrap().is_none());
    assert!(store.head_object(&b, "logs/new").await.unwrap().is_some());
    clock.advance(DAY_MS);
    tier_run(&*store).await;
    assert!(store.head_object(&b, "logs/new").await.unwrap().is_none());
    // Keys the store creates are dated by the same clock.
    let k = store
        .create_key(NewKey {
            name: "dated".into(),
            ..NewKey::default()
        })
        .await
        .unwrap();
    assert_eq!(k.created_ms, clock.now_ms());
}
