//! Compaction moves the records of parts of uploads in progress while the uploads change under
//! it: parts uploaded again under the same number (the move must not undo the new part), uploads
//! completed (the parts become the object's chunks mid-move) and aborted, among overwrites of
//! plain objects that leave dead bytes beside the parts. Every part in progress and every
//! completed object reads back with its bytes, no chosen segment is kept, and the offline
//! verifier finds every record.

mod common;

use common::Once;
use packrat_store::local::LocalOptions;
use packrat_store_api::{
    Bucket, CompletePart, NewUpload, ObjectStore, PutObject, PutPart, ReplicaStore, StoreAdmin,
};
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// An upload in progress: its id and its parts' bytes and ETags by number.
struct InProgress {
    id: String,
    parts: BTreeMap<u32, (Vec<u8>, String)>,
}

async fn read_all(mut r: Box<dyn packrat_store_api::ObjectRead>) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(piece) = r.next().await.unwrap() {
        out.extend_from_slice(&piece);
    }
    out
}

async fn part_bytes(store: &dyn ReplicaStore, b: &Bucket, key: &str, id: &str, n: u32) -> Vec<u8> {
    let (_, reader) = store
        .read_part(b, key, id, n)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("{key} {id} part {n} is gone"));
    read_all(reader).await
}

/// Completes an upload with its last part alone (the others become dead bytes); answers the
/// object's bytes, or `None` for an upload without parts (left as it is).
async fn complete_with_last(
    store: &dyn ReplicaStore,
    b: &Bucket,
    key: &str,
    up: &InProgress,
) -> Option<Vec<u8>> {
    let (&n, (bytes, etag)) = up.parts.last_key_value()?;
    let named = vec![CompletePart {
        part_number: n,
        etag: etag.clone(),
        checksums: Vec::new(),
    }];
    let (cond, stamp) = (Default::default(), Default::default());
    store
        .complete_upload(b, key, &up.id, named, &cond, &stamp)
        .await
        .unwrap();
    Some(bytes.clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compaction_moves_parts_while_uploads_change() {
    let dir = tempfile::tempdir().unwrap();
    let (store, _) = common::open_with_bucket(LocalOptions {
        segment_bytes_max: 256 << 10,
        ..LocalOptions::new(dir.path().to_path_buf())
    })
    .await;
    let store = Arc::new(store);
    let b = store.bucket("b").unwrap().unwrap();

    let compactor = common::Compactor::start(store.clone());

    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let mut uploads: BTreeMap<String, InProgress> = BTreeMap::new();
    let mut completed: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    let (mut parts_written, mut completions, mut aborts) = (0, 0, 0);
    for step in 0..1200u32 {
        let key = format!("u{}", rng.random_range(0..8));
        let body: Vec<u8> = (0..rng.random_range(4_000..30_000u32))
            .map(|i| (i * 13 + step) as u8)
            .collect();
        match (rng.random_range(0..10), uploads.contains_key(&key)) {
            (0..2, false) => {
                let new = NewUpload {
                    owner_id: "o".into(),
                    initiated_ms: 1,
                    ..Default::default()
                };
                let up = store.create_upload(&b, &key, new).await.unwrap();
                let parts = BTreeMap::new();
                uploads.insert(
                    key,
                    InProgress {
                        id: up.upload_id,
                        parts,
                    },
                );
            }
            (0..5, true) => {
                // A part, often one uploaded before under the same number.
                let up = uploads.get_mut(&key).unwrap();
                let n = rng.random_range(1..5);
                let mut src = Once(Some(body.clone().into()));
                let part = store
                    .upload_part(&b, &key, &up.id, n, &mut src, PutPart::default())
                    .await
                    .unwrap();
                up.parts.insert(n, (body, part.etag));
                parts_written += 1;
            }
            (5, true) => {
                // Completed with its last part alone: the others become dead bytes.
                let up = uploads.remove(&key).unwrap();
                match complete_with_last(store.as_ref(), &b, &key, &up).await {
                    Some(bytes) => {
                        completed.insert(key, bytes);
                        completions += 1;
                    }
                    None => {
                        uploads.insert(key, up);
                    }
                }
            }
            (6, true) => {
                let up = uploads.remove(&key).unwrap();
                store.abort_upload(&b, &key, &up.id).await.unwrap();
                aborts += 1;
            }
            _ => {
                // Plain objects overwritten and deleted beside the parts: dead bytes.
                let plain = format!("c{}", rng.random_range(0..6));
                if rng.random_bool(0.2) {
                    store.delete_object(&b, &plain).await.unwrap();
                } else {
                    let mut src = Once(Some(body.into()));
                    let put = PutObject::default();
                    store.put_object(&b, &plain, &mut src, put).await.unwrap();
                }
            }
        }
    }
    let moved = compactor.stop().await;
    // Dead bytes beside every part still in progress: each is overwritten once more.
    for i in 0..6 {
        let mut src = Once(Some(vec![i as u8; 1000].into()));
        let key = format!("c{i}");
        let put = PutObject::default();
        store.put_object(&b, &key, &mut src, put).await.unwrap();
    }
    let last = store.compact(1.0, Duration::ZERO).await.unwrap();
    println!(
        "{parts_written} parts, {completions} completions, {aborts} aborts; moved while \
         uploads changed: {moved}; at the end: {last:?}"
    );
    let in_progress: usize = uploads.values().map(|u| u.parts.len()).sum();
    assert!(in_progress >= 5, "{in_progress} parts left in progress");
    assert!(completions >= 10 && aborts >= 5, "{completions} / {aborts}");
    assert!(last.segments_chosen > 0, "{last:?}");
    assert_eq!(last.segments_kept, 0, "{last:?}");
    assert!(last.objects_moved > 0, "{last:?}");

    for (key, up) in &uploads {
        for (&n, (bytes, _)) in &up.parts {
            assert_eq!(&part_bytes(store.as_ref(), &b, key, &up.id, n).await, bytes);
        }
    }
    for (key, bytes) in &completed {
        let read = common::get(store.as_ref(), &b, key).await.unwrap().unwrap();
        assert_eq!(&read, bytes, "{key}");
    }
    // Parts in progress can still be completed into the object they hold.
    for (key, up) in &uploads {
        if let Some(bytes) = complete_with_last(store.as_ref(), &b, key, up).await {
            let read = common::get(store.as_ref(), &b, key).await.unwrap().unwrap();
            assert_eq!(read, bytes, "{key}");
        }
    }
    drop(store);
    common::verify_offline(dir.path());
}
