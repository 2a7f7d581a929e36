//! `PutObject::on_staged`: a store tells a writer once its write is staged (stored, checked,
//! its condition decided), before it is durable, and never for a write refused before that.
//! A cluster member hands a write on to the next member at that point.

use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::conformance::{MemSource, new_bucket};
use packrat_store_api::{OnStaged, PutObject, ReplicaStore, StoreError, WriteCondition};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

fn counted() -> (Arc<AtomicUsize>, Option<OnStaged>) {
    let n = Arc::new(AtomicUsize::new(0));
    let told = n.clone();
    let f = OnStaged(Arc::new(move || {
        told.fetch_add(1, Ordering::SeqCst);
    }));
    (n, Some(f))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_is_told_staged_once_and_a_refused_one_never() {
    let dir = tempfile::tempdir().unwrap();
    let opened = LocalStore::open(LocalOptions {
        fault_injection: true,
        ..LocalOptions::new(dir.path().to_path_buf())
    })
    .unwrap();
    let store: Arc<dyn ReplicaStore> = Arc::new(opened.store);
    let b = new_bucket(&*store, "staged").await;
    let put = |body: &'static [u8], put: PutObject| {
        let (store, b) = (store.clone(), b.clone());
        async move {
            let mut src = MemSource::new(body.to_vec());
            store.put_object(&b, "k", &mut src, put).await
        }
    };

    let (n, on_staged) = counted();
    put(
        b"one",
        PutObject {
            on_staged,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(n.load(Ordering::SeqCst), 1, "told once for a stored write");

    // Refused before it is staged: a wrong Content-MD5, a condition that does not hold.
    let (n, on_staged) = counted();
    let bad = put(
        b"two",
        PutObject {
            content_md5: Some([0; 16]),
            on_staged,
            ..Default::default()
        },
    )
    .await;
    assert!(matches!(bad, Err(StoreError::BadDigest(_))), "{bad:?}");
    let (m, on_staged) = counted();
    let exists = put(
        b"two",
        PutObject {
            condition: WriteCondition {
                if_none_match_any: true,
                if_match: None,
            },
            on_staged,
            ..Default::default()
        },
    )
    .await;
    assert!(
        matches!(exists, Err(StoreError::PreconditionFailed)),
        "{exists:?}"
    );
    assert_eq!(
        (n.load(Ordering::SeqCst), m.load(Ordering::SeqCst)),
        (0, 0),
        "told for a refused write"
    );

    // Staged, then not durable: the group commit's sync fails after the writer was told.
    store
        .faults(Some(serde_json::json!({"sync": "eio"})))
        .await
        .unwrap();
    let (n, on_staged) = counted();
    let lost = put(
        b"three",
        PutObject {
            on_staged,
            ..Default::default()
        },
    )
    .await;
    assert!(lost.is_err(), "a write whose sync failed was acknowledged");
    assert_eq!(n.load(Ordering::SeqCst), 1, "not told before the sync");
    store.faults(Some(serde_json::json!({}))).await.unwrap();
    let cur = store.head_object(&b, "k").await.unwrap().unwrap();
    assert_eq!(cur.size, 3, "the object is the first write");
}
