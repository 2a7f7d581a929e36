//! Compaction moves noncurrent versions' records while a versioned bucket's histories change
//! under it: overwrites (a current object becomes a version mid-move), deletes by id (a
//! version becomes current again mid-move), delete markers and tag edits by id. Every version
//! the model holds reads back with its bytes, the histories are the model's, and the offline
//! verifier finds every record.

mod common;

use packrat_store::local::LocalOptions;
use packrat_store_api::lock::LockCheck;
use packrat_store_api::{
    Bucket, FoundVersion, ObjectStore, PutObject, ReplicaStore, StoreAdmin, VersionQuery,
    Versioning,
};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// A key's history in write order: (version id, bytes; `None` for a delete marker).
type Model = BTreeMap<String, Vec<(String, Option<Vec<u8>>)>>;

async fn put(store: &dyn ReplicaStore, b: &Bucket, key: &str, body: Vec<u8>) -> String {
    let mut src = common::Once(Some(bytes::Bytes::from(body)));
    store
        .put_object(b, key, &mut src, PutObject::default())
        .await
        .unwrap()
        .version_id
        .unwrap()
}

async fn read_version(store: &dyn ReplicaStore, b: &Bucket, key: &str, id: &str) -> Vec<u8> {
    let found = store.find_version(b, key, Some(id)).await.unwrap();
    let Some(FoundVersion::Object(info)) = found else {
        panic!("{key} {id}: {found:?}");
    };
    let mut r = store.read_object(&info, 0, info.size).unwrap();
    let mut out = Vec::new();
    while let Some(piece) = r.next().await.unwrap() {
        out.extend_from_slice(&piece);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_moves_versions_while_histories_change() {
    let dir = tempfile::tempdir().unwrap();
    let (store, created) = common::open_with_bucket(LocalOptions {
        segment_bytes_max: 256 << 10,
        ..LocalOptions::new(dir.path().to_path_buf())
    })
    .await;
    let store = Arc::new(store);
    store
        .set_versioning(&created, Versioning::Enabled)
        .await
        .unwrap();
    let b = store.bucket("b").unwrap().unwrap();

    let compactor = common::Compactor::start(store.clone());

    let mut rng = rand::rngs::StdRng::seed_from_u64(29);
    let mut model = Model::new();
    for step in 0..1500 {
        let key = format!("k{:02}", rng.random_range(0..30));
        let history = model.entry(key.clone()).or_default();
        match rng.random_range(0..10) {
            0..6 => {
                let body: Vec<u8> = (0..rng.random_range(4_000..20_000))
                    .map(|i| (i * 7 + step) as u8)
                    .collect();
                let id = put(store.as_ref(), &b, &key, body.clone()).await;
                history.push((id, Some(body)));
            }
            6 | 7 if !history.is_empty() => {
                // A version by id: when it is the newest, the one under it is current again.
                let at = rng.random_range(0..history.len());
                let (id, _) = history.remove(at);
                store
                    .delete_version(&b, &key, &id, LockCheck::rules(false))
                    .await
                    .unwrap();
            }
            8 => {
                let id = store
                    .delete_object(&b, &key)
                    .await
                    .unwrap()
                    .version_id
                    .unwrap();
                history.push((id, None));
            }
            _ => {
                // A tag edit of an older version: an in-place edit the move must not undo.
                if let Some((id, _)) = history.iter().find(|(_, body)| body.is_some()) {
                    let tags = vec![("step".to_string(), step.to_string())];
                    assert!(store.set_version_tags(&b, &key, id, tags).await.unwrap());
                }
            }
        }
    }
    let moved = compactor.stop().await;
    let last = store.compact(1.0, Duration::ZERO).await.unwrap();
    println!("moved while the histories changed: {moved}; at the end: {last:?}");
    assert!(moved + last.objects_moved > 0, "compaction moved nothing");
    assert_eq!(last.segments_kept, 0, "{last:?}");

    // The histories are the model's, newest first, and every version reads back.
    let page = store
        .list_versions(
            &b,
            &VersionQuery {
                max_keys: 100_000,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let listed: Vec<(String, String, bool)> = page
        .versions
        .iter()
        .map(|v| (v.object.key.clone(), v.version_id.clone(), v.delete_marker))
        .collect();
    let expected: Vec<(String, String, bool)> = model
        .iter()
        .flat_map(|(k, h)| {
            h.iter()
                .rev()
                .map(move |(id, body)| (k.clone(), id.clone(), body.is_none()))
        })
        .collect();
    assert_eq!(listed, expected);
    let mut versions = 0;
    for (key, history) in &model {
        for (id, body) in history {
            if let Some(body) = body {
                assert_eq!(&read_version(store.as_ref(), &b, key, id).await, body);
                versions += 1;
            }
        }
    }
    assert!(versions > 100, "{versions} versions");
    common::verify_offline(dir.path());
}
