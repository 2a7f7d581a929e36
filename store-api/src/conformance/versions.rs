//! Versions: the history of a key, Object Lock, and per-version ACLs, tags and classes.

use super::*;
use crate::lock::LockCheck;

/// Versioning: a write keeps what it replaces, a delete adds a delete marker, a version is
/// read and removed by id, and a suspended bucket keeps one `null` version per key.
pub async fn versions(store: &dyn Store) {
    let created = new_bucket(store, "versions").await;
    store
        .set_versioning(&created, Versioning::Enabled)
        .await
        .unwrap();
    let b = store.bucket(&created.name).unwrap().unwrap();
    assert_eq!(b.versioning, Versioning::Enabled);
    let v1 = put(store, &b, "k", b"first").await.version_id.unwrap();
    let v2 = put(store, &b, "k", b"second").await.version_id.unwrap();
    assert!(v1 != v2 && v1 != "null" && v2 != "null", "{v1} {v2}");
    let current = head(store, &b, "k").await.unwrap();
    assert_eq!(current.version_id.as_deref(), Some(v2.as_str()));
    match store.find_version(&b, "k", Some(&v1)).await.unwrap() {
        Some(FoundVersion::Object(o)) => {
            assert_eq!(o.version_id.as_deref(), Some(v1.as_str()));
            assert_eq!(read(store, &o, 0, o.size).await, b"first");
            assert_eq!(
                read(store, &o, 1, 4).await,
                b"irs",
                "a range of an older version"
            );
        }
        other => panic!("version {v1}: {other:?}"),
    }
    let d = store.delete_object(&b, "k").await.unwrap();
    assert!(d.delete_marker);
    let marker = d.version_id.unwrap();
    assert!(
        head(store, &b, "k").await.is_none(),
        "under a delete marker"
    );
    match store.find_version(&b, "k", None).await.unwrap() {
        Some(FoundVersion::DeleteMarker { version_id, .. }) => assert_eq!(version_id, marker),
        other => panic!("the latest version: {other:?}"),
    }
    let listed = |page: VersionPage| {
        page.versions
            .into_iter()
            .map(|v| (v.object.key, v.version_id, v.is_latest, v.delete_marker))
            .collect::<Vec<_>>()
    };
    let all = VersionQuery {
        max_keys: 100,
        ..Default::default()
    };
    let k = || "k".to_string();
    assert_eq!(
        listed(store.list_versions(&b, &all).await.unwrap()),
        vec![
            (k(), marker.clone(), true, true),
            (k(), v2.clone(), false, false),
            (k(), v1.clone(), false, false),
        ]
    );
    // Paged one version at a time, from the markers each page gives.
    let mut q = VersionQuery {
        max_keys: 1,
        ..Default::default()
    };
    let mut paged = Vec::new();
    loop {
        let page = store.list_versions(&b, &q).await.unwrap();
        let (more, key, vid) = (
            page.truncated,
            page.next_key_marker.clone(),
            page.next_version_id_marker.clone(),
        );
        paged.extend(listed(page));
        if !more {
            break;
        }
        q.key_marker = key;
        q.version_id_marker = vid;
    }
    assert_eq!(paged.len(), 3, "{paged:?}");
    // Removing the marker makes the newest object current again.
    store
        .delete_version(&b, "k", &marker, LockCheck::rules(false))
        .await
        .unwrap();
    let current = head(store, &b, "k").await.unwrap();
    assert_eq!(read(store, &current, 0, current.size).await, b"second");
    assert!(
        store
            .find_version(&b, "k", Some("0000000000000001"))
            .await
            .unwrap()
            .is_none()
    );
    assert!(matches!(
        store.find_version(&b, "k", Some("not-an-id")).await,
        Err(StoreError::Invalid(_))
    ));
    // Suspended: a write makes the key's null version, replacing the null one it had.
    store
        .set_versioning(&b, Versioning::Suspended)
        .await
        .unwrap();
    let b = store.bucket(&created.name).unwrap().unwrap();
    assert_eq!(b.versioning, Versioning::Suspended);
    for body in [&b"a"[..], b"bb"] {
        let v = put(store, &b, "n", body).await;
        assert_eq!(v.version_id.as_deref(), Some("null"));
    }
    let n = VersionQuery {
        prefix: "n".into(),
        max_keys: 100,
        ..Default::default()
    };
    let got = listed(store.list_versions(&b, &n).await.unwrap());
    assert_eq!(
        got,
        vec![("n".to_string(), "null".to_string(), true, false)]
    );
    // A delete while suspended makes the null version a delete marker; a bucket with any
    // version left (a marker too) is not empty.
    store.delete_object(&b, "n").await.unwrap();
    for id in [&v2, &v1] {
        store
            .delete_version(&b, "k", id, LockCheck::rules(false))
            .await
            .unwrap();
    }
    assert!(matches!(
        store.delete_bucket(&b).await,
        Err(StoreError::BucketNotEmpty)
    ));
    // The marker is removed by its id, `null`.
    store
        .delete_version(&b, "n", "null", LockCheck::rules(false))
        .await
        .unwrap();
    store.delete_bucket(&b).await.unwrap();
}

/// Object Lock: a bucket created with it has versioning enabled for good and keeps its
/// default retention; a version's lock (stored among its headers) refuses its removal and
/// shortening its retention unless the rules allow, is listed with the version, and goes
/// with the bypass once no legal hold is on.
pub async fn object_lock(store: &dyn Store) {
    use crate::lock::{
        DefaultRetention, LOCK_HEADER, LockChange, LockConfig, LockMode, ObjectLock, Retention,
    };
    let n = NEXT_BUCKET.fetch_add(1, Ordering::Relaxed);
    let created = store
        .create_bucket(NewBucket {
            name: format!("conf-lock-{n}"),
            owner_id: "owner-1".into(),
            owner_name: "one".into(),
            created_ms: 1_700_000_000_000,
            public_read: false,
            object_lock: true,
        })
        .await
        .expect("creating a bucket with Object Lock");
    let b = store.bucket(&created.name).unwrap().unwrap();
    assert_eq!(b.versioning, Versioning::Enabled);
    assert_eq!(b.object_lock, Some(LockConfig::default()));
    assert!(
        matches!(
            store.set_versioning(&b, Versioning::Suspended).await,
            Err(StoreError::InvalidBucketState(_))
        ),
        "Object Lock keeps versioning enabled"
    );
    let config = LockConfig {
        default_retention: Some(DefaultRetention {
            mode: LockMode::Governance,
            days: 3,
            years: 0,
        }),
    };
    store.set_lock_config(&b, config).await.unwrap();
    let b = store.bucket(&created.name).unwrap().unwrap();
    assert_eq!(b.object_lock, Some(config));

    let far = 4_000_000_000_000;
    let mut with_lock = PutObject::default();
    ObjectLock {
        retention: Some(Retention {
            mode: LockMode::Governance,
            until_ms: far,
        }),
        legal_hold: None,
    }
    .store(&mut with_lock.attrs.headers);
    let v1 = put_with(store, &b, "k", b"locked", with_lock)
        .await
        .unwrap()
        .version_id
        .unwrap();
    let v2 = put(store, &b, "k", b"free").await.version_id.unwrap();
    let lock_of = |found: Option<FoundVersion>| match found {
        Some(FoundVersion::Object(o)) => ObjectLock::of(&o.attrs.headers).unwrap(),
        other => panic!("{other:?}"),
    };
    let stored = lock_of(store.find_version(&b, "k", Some(&v1)).await.unwrap());
    assert_eq!(stored.retention.map(|r| r.until_ms), Some(far));
    let all = VersionQuery {
        max_keys: 1000,
        ..Default::default()
    };
    let listed = store.list_versions(&b, &all).await.unwrap();
    let locks: Vec<_> = listed
        .versions
        .iter()
        .map(|v| (v.version_id.clone(), v.lock.is_some()))
        .collect();
    assert_eq!(locks, [(v2.clone(), false), (v1.clone(), true)]);
    assert!(
        listed.versions[1]
            .lock
            .as_deref()
            .is_some_and(|l| l.starts_with("GOVERNANCE")),
        "{:?} ({LOCK_HEADER})",
        listed.versions[1].lock
    );

    let locked = |r: StoreResult<Deleted>| matches!(r, Err(StoreError::ObjectLocked(_)));
    assert!(locked(
        store
            .delete_version(&b, "k", &v1, LockCheck::rules(false))
            .await
    ));
    let shorter = LockChange::Retention(Some(Retention {
        mode: LockMode::Governance,
        until_ms: far - 1,
    }));
    assert!(matches!(
        store
            .update_lock(&b, "k", Some(&v1), shorter, LockCheck::rules(false))
            .await,
        Err(StoreError::ObjectLocked(_))
    ));
    let held = store
        .update_lock(
            &b,
            "k",
            Some(&v1),
            LockChange::LegalHold(true),
            LockCheck::rules(false),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(held.legal_hold, Some(true));
    assert!(
        locked(
            store
                .delete_version(&b, "k", &v1, LockCheck::rules(true))
                .await
        ),
        "the bypass never lifts a legal hold"
    );
    let now = store
        .update_lock(&b, "k", Some(&v1), shorter, LockCheck::rules(true))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.retention.map(|r| r.until_ms), Some(far - 1));
    assert_eq!(
        lock_of(store.find_version(&b, "k", Some(&v1)).await.unwrap()),
        now
    );
    // The current version by key alone; a version that is not there.
    let current = store
        .update_lock(
            &b,
            "k",
            None,
            LockChange::LegalHold(false),
            LockCheck::rules(false),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current.legal_hold, Some(false));
    assert_eq!(
        lock_of(store.find_version(&b, "k", Some(&v2)).await.unwrap()).legal_hold,
        Some(false)
    );
    assert_eq!(
        store
            .update_lock(
                &b,
                "k",
                Some("0000000000000001"),
                LockChange::LegalHold(true),
                LockCheck::rules(false),
            )
            .await
            .unwrap(),
        None
    );
    store
        .update_lock(
            &b,
            "k",
            Some(&v1),
            LockChange::LegalHold(false),
            LockCheck::rules(false),
        )
        .await
        .unwrap();
    store
        .delete_version(&b, "k", &v1, LockCheck::rules(true))
        .await
        .unwrap();
    assert!(
        store
            .find_version(&b, "k", Some(&v1))
            .await
            .unwrap()
            .is_none()
    );
    store
        .delete_version(&b, "k", &v2, LockCheck::rules(false))
        .await
        .unwrap();
    store.delete_bucket(&b).await.unwrap();
}

/// Tags changed on one version by id: that version's alone (an older one, the current one,
/// the `null` object of an unversioned bucket), bytes and place kept; listings carry them.
/// A version's stored object ACL ([`crate::ACL_HEADER`]) shows in the version listing (copies
/// of a key's history compare it), set on a write and by an attribute edit of the current
/// version, which leaves the older version's as it was.
pub async fn version_acl(store: &dyn Store) {
    use crate::ACL_HEADER;
    let created = new_bucket(store, "version-acl").await;
    store
        .set_versioning(&created, Versioning::Enabled)
        .await
        .unwrap();
    let b = store.bucket(&created.name).unwrap().unwrap();
    let mut first = PutObject::default();
    first
        .attrs
        .headers
        .push((ACL_HEADER.to_string(), "acl-1".to_string()));
    let v1 = put_with(store, &b, "k", b"first", first)
        .await
        .unwrap()
        .version_id
        .unwrap();
    let v2 = put(store, &b, "k", b"second").await.version_id.unwrap();
    let all = VersionQuery {
        max_keys: 1000,
        ..Default::default()
    };
    let acls = |page: VersionPage| -> Vec<(String, Option<String>)> {
        page.versions
            .into_iter()
            .map(|v| (v.version_id, v.acl))
            .collect()
    };
    let listed = acls(store.list_versions(&b, &all).await.unwrap());
    assert_eq!(
        listed,
        [(v2.clone(), None), (v1.clone(), Some("acl-1".into()))]
    );
    store
        .update_object(
            &b,
            "k",
            &WriteCondition::default(),
            Box::new(|a| {
                a.headers
                    .push((ACL_HEADER.to_string(), "acl-2".to_string()))
            }),
        )
        .await
        .unwrap();
    let listed = acls(store.list_versions(&b, &all).await.unwrap());
    assert_eq!(
        listed,
        [(v2, Some("acl-2".into())), (v1, Some("acl-1".into()))]
    );
}

pub async fn version_tags(store: &dyn Store) {
    let created = new_bucket(store, "version-tags").await;
    store
        .set_versioning(&created, Versioning::Enabled)
        .await
        .unwrap();
    let b = store.bucket(&created.name).unwrap().unwrap();
    let tag = |k: &str, v: &str| vec![(k.to_string(), v.to_string())];
    let mut first = PutObject::default();
    first.attrs.tags = tag("a", "1");
    let v1 = put_with(store, &b, "k", b"first", first)
        .await
        .unwrap()
        .version_id
        .unwrap();
    let v2 = put(store, &b, "k", b"second").await.version_id.unwrap();
    let tags_of = |found: Option<FoundVersion>| match found {
        Some(FoundVersion::Object(o)) => o.attrs.tags,
        other => panic!("not an object: {other:?}"),
    };
    assert!(
        store
            .set_version_tags(&b, "k", &v1, tag("b", "2"))
            .await
            .unwrap()
    );
    let old = store.find_version(&b, "k", Some(&v1)).await.unwrap();
    let Some(FoundVersion::Object(old)) = old else {
        panic!("version {v1}: {old:?}");
    };
    assert_eq!(old.attrs.tags, tag("b", "2"));
    assert_eq!(read(store, &old, 0, old.size).await, b"first");
    let current = head(store, &b, "k").await.unwrap();
    assert_eq!(current.version_id.as_deref(), Some(v2.as_str()));
    assert!(current.attrs.tags.is_empty(), "the current version's stay");
    // The current version, named by id: still current, with the same id.
    assert!(
        store
            .set_version_tags(&b, "k", &v2, tag("c", "3"))
            .await
            .unwrap()
    );
    let current = head(store, &b, "k").await.unwrap();
    assert_eq!(current.version_id.as_deref(), Some(v2.as_str()));
    assert_eq!(current.attrs.tags, tag("c", "3"));
    assert_eq!(read(store, &current, 0, current.size).await, b"second");
    let all = VersionQuery {
        max_keys: 100,
        ..Default::default()
    };
    let listed: Vec<_> = store
        .list_versions(&b, &all)
        .await
        .unwrap()
        .versions
        .into_iter()
        .map(|v| (v.version_id, v.is_latest, v.tags))
        .collect();
    assert_eq!(
        listed,
        vec![
            (v2.clone(), true, tag("c", "3")),
            (v1.clone(), false, tag("b", "2"))
        ]
    );
    // Emptied; a version not there; an id never made; a delete marker.
    assert!(
        store
            .set_version_tags(&b, "k", &v1, Vec::new())
            .await
            .unwrap()
    );
    assert!(
        tags_of(store.find_version(&b, "k", Some(&v1)).await.unwrap()).is_empty(),
        "emptied"
    );
    assert!(
        !store
            .set_version_tags(&b, "k", "0000000000000001", tag("x", "y"))
            .await
            .unwrap()
    );
    assert!(matches!(
        store
            .set_version_tags(&b, "k", "not-an-id", tag("x", "y"))
            .await,
        Err(StoreError::Invalid(_))
    ));
    let marker = store
        .delete_object(&b, "k")
        .await
        .unwrap()
        .version_id
        .unwrap();
    assert!(matches!(
        store
            .set_version_tags(&b, "k", &marker, tag("x", "y"))
            .await,
        Err(StoreError::Invalid(_))
    ));
    for id in [&marker, &v2, &v1] {
        store
            .delete_version(&b, "k", id, LockCheck::rules(false))
            .await
            .unwrap();
    }
    store.delete_bucket(&b).await.unwrap();
    // Unversioned: the object is the key's `null` version, the only one.
    let u = new_bucket(store, "version-tags-null").await;
    put(store, &u, "k", b"plain").await;
    assert!(
        store
            .set_version_tags(&u, "k", "null", tag("d", "4"))
            .await
            .unwrap()
    );
    assert_eq!(
        head(store, &u, "k").await.unwrap().attrs.tags,
        tag("d", "4")
    );
    assert!(
        !store
            .set_version_tags(&u, "k", "0000000000000001", tag("x", "y"))
            .await
            .unwrap()
    );
    assert!(
        !store
            .set_version_tags(&u, "gone", "null", tag("x", "y"))
            .await
            .unwrap()
    );
    store.delete_object(&u, "k").await.unwrap();
    store.delete_bucket(&u).await.unwrap();
}

/// A version's storage class set by id (NoncurrentVersionTransition): in place, only that
/// version, and refused for the current one when asked for noncurrent versions only.
pub async fn version_class(store: &dyn Store) {
    let created = new_bucket(store, "version-class").await;
    store
        .set_versioning(&created, Versioning::Enabled)
        .await
        .unwrap();
    let b = store.bucket(&created.name).unwrap().unwrap();
    let v1 = put(store, &b, "k", b"first").await.version_id.unwrap();
    let v2 = put(store, &b, "k", b"second").await.version_id.unwrap();
    let class_of = |found: Option<FoundVersion>| match found {
        Some(FoundVersion::Object(o)) => o.attrs.storage_class,
        other => panic!("not an object: {other:?}"),
    };
    let cold = || Some("STANDARD_IA".to_string());
    assert!(
        store
            .set_version_class(&b, "k", &v1, "STANDARD_IA", true)
            .await
            .unwrap()
    );
    let old = store.find_version(&b, "k", Some(&v1)).await.unwrap();
    let Some(FoundVersion::Object(old)) = old else {
        panic!("version {v1}: {old:?}");
    };
    assert_eq!(old.attrs.storage_class, cold());
    assert_eq!(read(store, &old, 0, old.size).await, b"first");
    // The current version: left as it is when only noncurrent ones may change.
    assert!(matches!(
        store
            .set_version_class(&b, "k", &v2, "STANDARD_IA", true)
            .await,
        Err(StoreError::PreconditionFailed)
    ));
    let current = head(store, &b, "k").await.unwrap();
    assert_eq!(current.version_id.as_deref(), Some(v2.as_str()));
    assert_eq!(current.attrs.storage_class, None);
    let all = VersionQuery {
        max_keys: 100,
        ..Default::default()
    };
    let listed: Vec<_> = store
        .list_versions(&b, &all)
        .await
        .unwrap()
        .versions
        .into_iter()
        .map(|v| (v.version_id, v.object.storage_class))
        .collect();
    assert_eq!(listed, vec![(v2.clone(), None), (v1.clone(), cold())]);
    // Back to STANDARD; a version not there; a malformed id; a delete marker.
    assert!(
        store
            .set_version_class(&b, "k", &v1, "STANDARD", false)
            .await
            .unwrap()
    );
    assert_eq!(
        class_of(store.find_version(&b, "k", Some(&v1)).await.unwrap()),
        None
    );
    assert!(
        !store
            .set_version_class(&b, "k", "0000000000000001", "STANDARD_IA", true)
            .await
            .unwrap()
    );
    assert!(matches!(
        store
            .set_version_class(&b, "k", "not-an-id", "STANDARD_IA", true)
            .await,
        Err(StoreError::Invalid(_))
    ));
    let marker = store
        .delete_object(&b, "k")
        .await
        .unwrap()
        .version_id
        .unwrap();
    assert!(matches!(
        store
            .set_version_class(&b, "k", &marker, "STANDARD_IA", false)
            .await,
        Err(StoreError::Invalid(_))
    ));
    for id in [&marker, &v2, &v1] {
        store
            .delete_version(&b, "k", id, LockCheck::rules(false))
            .await
            .unwrap();
    }
    store.delete_bucket(&b).await.unwrap();
}
