//! Credentials: access keys, console sessions, sealing under the master key.

use super::*;

/// Web console sessions: one recorded is found by its token digest until it is ended; an
/// unknown digest finds nothing; ending it twice is no error; two sessions of one key are
/// apart.
pub async fn console_sessions(store: &dyn Store) {
    let ttl = std::time::Duration::from_secs(600);
    let (a, b) = ("a".repeat(64), "b".repeat(64));
    assert_eq!(store.session(&a).await.unwrap(), None);
    store.put_session(&a, "AKCONSOLE1", ttl).await.unwrap();
    store.put_session(&b, "AKCONSOLE1", ttl).await.unwrap();
    assert_eq!(
        store.session(&a).await.unwrap().as_deref(),
        Some("AKCONSOLE1")
    );
    store.end_session(&a).await.unwrap();
    assert_eq!(store.session(&a).await.unwrap(), None);
    store.end_session(&a).await.unwrap();
    assert_eq!(
        store.session(&b).await.unwrap().as_deref(),
        Some("AKCONSOLE1"),
        "ending one session leaves the key's other one"
    );
    store.end_session(&b).await.unwrap();
}

/// Access keys: created with given or generated secrets, found by access key, listed, refused
/// when the access key is taken or breaks the rules, deleted once; the last root key stays.
pub async fn access_keys(store: &dyn Store) {
    use crate::admin::NewKey;
    let given = NewKey {
        name: "conformance".into(),
        access_key: Some("AKCONFORMANCE01".into()),
        secret_key: Some("conformance-secret-0123456789".into()),
        user_id: None,
    };
    let made = store.create_key(given.clone()).await.unwrap();
    assert_eq!(
        (
            made.access_key.as_str(),
            made.secret_key.as_str(),
            made.is_root
        ),
        ("AKCONFORMANCE01", "conformance-secret-0123456789", false)
    );
    let who = store
        .access_key("AKCONFORMANCE01")
        .unwrap()
        .expect("the new key");
    assert_eq!(
        (who.secret_key.as_str(), who.name.as_str(), who.is_root),
        ("conformance-secret-0123456789", "conformance", false)
    );
    assert_eq!(who.owner_id, made.owner_id);
    assert!(matches!(
        store.create_key(given).await,
        Err(StoreError::Invalid(_))
    ));
    let bad = NewKey {
        name: "bad".into(),
        access_key: Some("has space".into()),
        secret_key: None,
        user_id: None,
    };
    assert!(matches!(
        store.create_key(bad).await,
        Err(StoreError::Invalid(_))
    ));
    let generated = store
        .create_key(NewKey {
            name: "generated".into(),
            ..NewKey::default()
        })
        .await
        .unwrap();
    assert!(generated.access_key.len() >= 16 && generated.secret_key.len() >= 16);
    assert_ne!(generated.owner_id, made.owner_id);
    // A user id given (a migration keeps it); a second key of that user gives it with the
    // user's name, and another name or a malformed id is refused.
    let with_id = |name: &str, ak: &str, id: &str| NewKey {
        name: name.into(),
        access_key: Some(ak.into()),
        user_id: Some(id.into()),
        ..NewKey::default()
    };
    let migrated = store
        .create_key(with_id("migrated", "AKMIGRATED01", "0123abcd-user_ID"))
        .await
        .unwrap();
    assert_eq!(migrated.owner_id, "0123abcd-user_ID");
    let second = store
        .create_key(with_id("migrated", "AKMIGRATED02", "0123abcd-user_ID"))
        .await
        .unwrap();
    assert_eq!(second.owner_id, migrated.owner_id);
    for (name, ak, id) in [
        ("someone-else", "AKMIGRATED03", "0123abcd-user_ID"),
        ("bad-id", "AKMIGRATED04", "has space"),
        ("bad-id", "AKMIGRATED05", ""),
    ] {
        assert!(
            matches!(
                store.create_key(with_id(name, ak, id)).await,
                Err(StoreError::Invalid(_))
            ),
            "{name} {id:?}"
        );
        assert!(store.access_key(ak).unwrap().is_none());
    }
    for k in [&migrated.access_key, &second.access_key] {
        store.delete_key(k).await.unwrap();
    }
    let listed: Vec<String> = store
        .list_keys()
        .await
        .unwrap()
        .into_iter()
        .map(|k| k.access_key)
        .collect();
    assert!(listed.contains(&made.access_key) && listed.contains(&generated.access_key));
    for k in [&made.access_key, &generated.access_key] {
        let gone = store.delete_key(k).await.unwrap().expect("a key to delete");
        assert_eq!(&gone.access_key, k);
        assert!(store.access_key(k).unwrap().is_none(), "{k} deleted");
        assert!(store.delete_key(k).await.unwrap().is_none());
    }
    let roots: Vec<_> = store
        .list_keys()
        .await
        .unwrap()
        .into_iter()
        .filter(|k| k.is_root)
        .collect();
    if let [root] = &roots[..] {
        assert!(matches!(
            store.delete_key(&root.access_key).await,
            Err(StoreError::Invalid(_))
        ));
        assert!(store.access_key(&root.access_key).unwrap().is_some());
    }
}

/// A secret sealed under the master key opens with the same context only; changed bytes or
/// another context answer `Corrupt`.
pub async fn sealing(store: &dyn Store) {
    let sealed = store.seal_secret(b"a data key", b"bucket/key").unwrap();
    assert!(
        !sealed.windows(10).any(|w| w == b"a data key"),
        "sealed, not plain"
    );
    assert_eq!(
        store.open_secret(&sealed, b"bucket/key").unwrap(),
        b"a data key"
    );
    assert!(matches!(
        store.open_secret(&sealed, b"bucket/other"),
        Err(StoreError::Corrupt(_))
    ));
    let mut changed = sealed.clone();
    let last = changed.len() - 1;
    changed[last] ^= 1;
    assert!(matches!(
        store.open_secret(&changed, b"bucket/key"),
        Err(StoreError::Corrupt(_))
    ));
}

/// SSE-KMS keys: a key made is found by its id, name, alias and ARN and listed; a taken or
/// malformed name is refused; the default key is made once; a data key sealed under a key
/// opens under it with the same context only, and an unknown key neither seals nor opens.
pub async fn kms_keys(store: &dyn Store) {
    use crate::kms::{ANY_USER, DEFAULT_KEY_NAME, NewKmsKey};
    let name = format!(
        "conformance-{}-{}",
        std::process::id(),
        NEXT_BUCKET.fetch_add(1, Ordering::Relaxed)
    );
    let new = NewKmsKey {
        name: name.clone(),
        users: vec!["alice".into()],
    };
    let k = store.create_kms_key(new.clone()).await.unwrap();
    assert_eq!(
        (k.name.as_str(), &k.users[..]),
        (name.as_str(), &["alice".to_string()][..])
    );
    for reference in [k.id.clone(), name.clone(), format!("alias/{name}"), k.arn()] {
        assert_eq!(
            store.kms_key(&reference).unwrap().as_ref(),
            Some(&k),
            "{reference}"
        );
    }
    assert!(store.list_kms_keys().await.unwrap().contains(&k));
    assert!(matches!(
        store.create_kms_key(new).await,
        Err(StoreError::Invalid(_))
    ));
    for bad in ["", "aws/mine", "has space", DEFAULT_KEY_NAME] {
        let new = NewKmsKey {
            name: bad.into(),
            users: vec![],
        };
        assert!(
            matches!(store.create_kms_key(new).await, Err(StoreError::Invalid(_))),
            "{bad:?}"
        );
    }
    assert!(
        store
            .kms_key("alias/no-such-key-anywhere")
            .unwrap()
            .is_none()
    );

    let d = store.default_kms_key().await.unwrap();
    assert_eq!(
        (d.name.as_str(), &d.users[..]),
        (DEFAULT_KEY_NAME, &[ANY_USER.to_string()][..])
    );
    assert_eq!(store.default_kms_key().await.unwrap(), d);

    let sealed = store.kms_seal(&k.id, b"a data key", b"ctx").unwrap();
    assert!(!sealed.windows(10).any(|w| w == b"a data key"));
    assert_eq!(
        store.kms_open(&k.id, &sealed, b"ctx").unwrap(),
        b"a data key"
    );
    assert!(matches!(
        store.kms_open(&k.id, &sealed, b"other"),
        Err(StoreError::Corrupt(_))
    ));
    assert!(matches!(
        store.kms_open(&d.id, &sealed, b"ctx"),
        Err(StoreError::Corrupt(_))
    ));
    let unknown = "00000000-0000-0000-0000-000000000000";
    assert!(matches!(
        store.kms_seal(unknown, b"k", b"ctx"),
        Err(StoreError::Invalid(_))
    ));
    assert!(matches!(
        store.kms_open(unknown, &sealed, b"ctx"),
        Err(StoreError::Corrupt(_))
    ));
}
