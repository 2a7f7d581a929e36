//! Versions chosen by the caller (the store seam's `VersionAs`), as a cluster node writes
//! them: every replica of a key gets the same version ids, and a version a replica missed is
//! copied into its place in the key's history without touching the current one.

mod common;

use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::{
    Bucket, CompleteAs, CompletePart, FoundVersion, NewBucket, NewUpload, PutObject, PutPart,
    ReplicaStore, VersionAs, VersionQuery, Versioning,
};

use common::Once;

async fn put(store: &dyn ReplicaStore, b: &Bucket, key: &str, body: &str, v: VersionAs) -> String {
    let info = store
        .put_object(
            b,
            key,
            &mut Once(Some(bytes::Bytes::from(body.to_string()))),
            PutObject {
                version_as: Some(v),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    info.version_id.unwrap()
}

/// (version id, latest, delete marker, size) of a key's versions, newest first.
async fn history(store: &dyn ReplicaStore, b: &Bucket) -> Vec<(String, bool, bool, u64)> {
    let page = store
        .list_versions(
            b,
            &VersionQuery {
                max_keys: 1000,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    page.versions
        .iter()
        .map(|v| {
            (
                v.version_id.clone(),
                v.is_latest,
                v.delete_marker,
                v.object.size,
            )
        })
        .collect()
}

fn v(seq: u64) -> VersionAs {
    VersionAs { seq, null: false }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chosen_versions_land_where_their_sequence_places_them() {
    let dir = tempfile::tempdir().unwrap();
    let (store, plain) = common::store_with_bucket(dir.path()).await;
    // The bucket itself never had versioning: the chosen versions keep the history anyway,
    // and reads of it name versions once asked as a versioned bucket.
    let b = Bucket {
        versioning: Versioning::Enabled,
        ..plain.clone()
    };
    let s: &dyn ReplicaStore = &store;
    assert_eq!(put(s, &plain, "k", "one", v(100)).await, "0000000000000064");
    assert_eq!(
        put(s, &plain, "k", "three", v(300)).await,
        "000000000000012c"
    );
    // Below the newest: kept in history, the current one untouched.
    assert_eq!(
        put(s, &plain, "k", "two!", v(200)).await,
        "00000000000000c8"
    );
    let current = s.head_object(&plain, "k").await.unwrap().unwrap();
    assert_eq!(current.size, 5, "the current version is still the newest");
    assert_eq!(
        history(s, &b).await,
        vec![
            ("000000000000012c".into(), true, false, 5),
            ("00000000000000c8".into(), false, false, 4),
            ("0000000000000064".into(), false, false, 3),
        ]
    );
    // A version that is the current one cannot be written again under its sequence.
    let again = s
        .put_object(
            &plain,
            "k",
            &mut Once(Some(bytes::Bytes::from_static(b"x"))),
            PutObject {
                version_as: Some(v(300)),
                ..Default::default()
            },
        )
        .await;
    assert!(
        matches!(again, Err(packrat_store_api::StoreError::Invalid(_))),
        "{again:?}"
    );

    // A delete marker above everything: the latest, the object kept under it.
    let d = s.put_delete_marker(&plain, "k", v(400), 7).await.unwrap();
    assert_eq!(d.version_id.as_deref(), Some("0000000000000190"));
    assert!(d.delete_marker);
    assert!(s.head_object(&plain, "k").await.unwrap().is_none());
    // One below the newest: history only.
    s.put_delete_marker(&plain, "k", v(150), 8).await.unwrap();
    let h = history(s, &b).await;
    assert_eq!(
        h.iter()
            .map(|x| (x.0.as_str(), x.1, x.2))
            .collect::<Vec<_>>(),
        vec![
            ("0000000000000190", true, true),
            ("000000000000012c", false, false),
            ("00000000000000c8", false, false),
            ("0000000000000096", false, true),
            ("0000000000000064", false, false),
        ]
    );
    match s
        .find_version(&b, "k", Some("0000000000000096"))
        .await
        .unwrap()
    {
        Some(FoundVersion::DeleteMarker {
            last_modified_ms, ..
        }) => assert_eq!(last_modified_ms, 8),
        other => panic!("{other:?}"),
    }

    // The null version: a newer one replaces the older; an older one below a newer null
    // version is refused.
    assert_eq!(
        put(
            s,
            &plain,
            "n",
            "a",
            VersionAs {
                seq: 10,
                null: true
            }
        )
        .await,
        "null"
    );
    assert_eq!(
        put(
            s,
            &plain,
            "n",
            "bb",
            VersionAs {
                seq: 20,
                null: true
            }
        )
        .await,
        "null"
    );
    let h = history(s, &b).await;
    assert_eq!(
        h.iter().filter(|x| x.0 == "null").count(),
        1,
        "one null version: {h:?}"
    );
    let below = s
        .put_object(
            &plain,
            "n",
            &mut Once(Some(bytes::Bytes::from_static(b"c"))),
            PutObject {
                version_as: Some(VersionAs { seq: 5, null: true }),
                ..Default::default()
            },
        )
        .await;
    assert!(below.is_err(), "{below:?}");

    // A completed upload: above the newest it becomes current; below, it goes to history.
    for (seq, current_after) in [(1000u64, 1000u64), (900, 1000)] {
        let id = format!("up-{seq}");
        s.create_upload(
            &plain,
            "m",
            NewUpload {
                upload_id: Some(id.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
        let part = s
            .upload_part(
                &plain,
                "m",
                &id,
                1,
                &mut Once(Some(bytes::Bytes::from(vec![seq as u8; 10]))),
                PutPart::default(),
            )
            .await
            .unwrap();
        let done = s
            .complete_upload(
                &plain,
                "m",
                &id,
                vec![CompletePart {
                    part_number: 1,
                    etag: part.etag.clone(),
                    checksums: Vec::new(),
                }],
                &Default::default(),
                &CompleteAs {
                    version_as: Some(v(seq)),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
        assert_eq!(done.version_id, Some(format!("{seq:016x}")));
        let cur = s.find_version(&b, "m", None).await.unwrap();
        match cur {
            Some(FoundVersion::Object(o)) => {
                assert_eq!(o.version_id, Some(format!("{current_after:016x}")))
            }
            other => panic!("{other:?}"),
        }
    }
}

/// A lock judged elsewhere (`LockCheck::Decided`, as a chain's later members apply what the
/// head decided): the store removes a version whose COMPLIANCE retention and legal hold would
/// refuse it by S3's rules, and applies a change the rules refuse at its own clock; the same
/// requests under the rules are refused and change nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decided_lock_check_does_as_asked() {
    use packrat_store_api::lock::{LockChange, LockCheck, LockMode, ObjectLock, Retention};
    let dir = tempfile::tempdir().unwrap();
    let store = LocalStore::open(LocalOptions::new(dir.path().to_path_buf()))
        .unwrap()
        .store;
    let s: &dyn ReplicaStore = &store;
    let b = s
        .create_bucket(NewBucket {
            name: "held".into(),
            owner_id: "o".into(),
            owner_name: "o".into(),
            created_ms: 1,
            public_read: false,
            object_lock: true,
        })
        .await
        .unwrap();
    let far = Retention {
        mode: LockMode::Compliance,
        until_ms: 4_000_000_000_000,
    };
    let mut with_lock = PutObject {
        version_as: Some(v(10)),
        ..Default::default()
    };
    ObjectLock {
        retention: Some(far),
        legal_hold: Some(true),
    }
    .store(&mut with_lock.attrs.headers);
    let id = s
        .put_object(
            &b,
            "k",
            &mut Once(Some(bytes::Bytes::from_static(b"kept"))),
            with_lock,
        )
        .await
        .unwrap()
        .version_id
        .unwrap();
    let shorter = LockChange::Retention(Some(Retention {
        until_ms: far.until_ms - 1,
        ..far
    }));
    assert!(
        s.update_lock(&b, "k", Some(&id), shorter, LockCheck::rules(true))
            .await
            .is_err()
    );
    assert!(
        s.delete_version(&b, "k", &id, LockCheck::rules(true))
            .await
            .is_err()
    );
    assert_eq!(history(s, &b).await.len(), 1, "refusals change nothing");
    let now = s
        .update_lock(&b, "k", Some(&id), shorter, LockCheck::Decided)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.retention.map(|r| r.until_ms), Some(far.until_ms - 1));
    assert_eq!(now.legal_hold, Some(true));
    s.delete_version(&b, "k", &id, LockCheck::Decided)
        .await
        .unwrap();
    assert!(history(s, &b).await.is_empty());
}
