//! Buckets and objects: writes, reads, conditions, digests, copies, bucket configuration.

use super::*;

pub async fn buckets(store: &dyn Store) {
    let b = new_bucket(store, "buckets").await;
    assert_eq!(store.bucket(&b.name).unwrap().as_ref(), Some(&b));
    let again = store
        .create_bucket(NewBucket {
            name: b.name.clone(),
            owner_id: "owner-2".into(),
            owner_name: "two".into(),
            created_ms: 0,
            public_read: false,
            object_lock: false,
        })
        .await;
    assert!(
        matches!(again, Err(StoreError::BucketExists)),
        "a taken name: {again:?}"
    );
    assert!(store.list_buckets().await.unwrap().contains(&b));
    store.set_bucket_public(&b, true).await.unwrap();
    assert!(store.bucket(&b.name).unwrap().unwrap().public_read);
    put(store, &b, "k", b"x").await;
    let full = store.delete_bucket(&b).await;
    assert!(
        matches!(full, Err(StoreError::BucketNotEmpty)),
        "deleting a bucket with an object: {full:?}"
    );
    store.delete_object(&b, "k").await.unwrap();
    store.delete_bucket(&b).await.unwrap();
    assert_eq!(store.bucket(&b.name).unwrap(), None);
    let c = new_bucket(store, "buckets").await;
    assert_ne!(c.id, b.id, "bucket ids are never reused");
}

pub async fn read_after_write(store: &dyn Store) {
    let b = new_bucket(store, "raw").await;
    for (i, len) in [0usize, 1, 4096, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 17]
        .into_iter()
        .enumerate()
    {
        let key = format!("obj-{len}");
        let data = payload(len, i as u8);
        let put = put(store, &b, &key, &data).await;
        let info = head(store, &b, &key)
            .await
            .expect("the object just written");
        assert_eq!(info.size, len as u64);
        assert_eq!(info.etag, md5_hex(&data), "ETag of {len} bytes");
        assert_eq!(put.etag, info.etag);
        assert_eq!(read(store, &info, 0, info.size).await, data, "{len} bytes");
        if len > 10 {
            let (s, e) = (len as u64 / 3, len as u64 - 5);
            assert_eq!(
                read(store, &info, s, e).await,
                data[s as usize..e as usize],
                "range {s}..{e} of {len}"
            );
        }
    }
    assert!(head(store, &b, "absent").await.is_none());
}

pub async fn overwrite_and_delete(store: &dyn Store) {
    let b = new_bucket(store, "overwrite").await;
    put(store, &b, "k", b"first").await;
    put(store, &b, "k", b"second, longer").await;
    let info = head(store, &b, "k").await.unwrap();
    assert_eq!(read(store, &info, 0, info.size).await, b"second, longer");
    store.delete_object(&b, "k").await.unwrap();
    assert!(head(store, &b, "k").await.is_none(), "a deleted key");
    store
        .delete_object(&b, "k")
        .await
        .expect("deleting a missing key succeeds");
    store.delete_object(&b, "never-there").await.unwrap();
}

pub async fn conditional_writes(store: &dyn Store) {
    let b = new_bucket(store, "cond").await;
    let only_new = || PutObject {
        condition: WriteCondition {
            if_none_match_any: true,
            if_match: None,
        },
        ..Default::default()
    };
    put_with(store, &b, "k", b"one", only_new()).await.unwrap();
    let second = put_with(store, &b, "k", b"two", only_new()).await;
    assert!(
        matches!(second, Err(StoreError::PreconditionFailed)),
        "If-None-Match: * on an existing key: {second:?}"
    );
    let cur = head(store, &b, "k").await.unwrap();
    assert_eq!(read(store, &cur, 0, cur.size).await, b"one");
    let if_match = |etag: &str| PutObject {
        condition: WriteCondition {
            if_none_match_any: false,
            if_match: Some(format!("\"{etag}\"")),
        },
        ..Default::default()
    };
    let wrong = put_with(store, &b, "k", b"three", if_match("0123")).await;
    assert!(
        matches!(wrong, Err(StoreError::PreconditionFailed)),
        "If-Match with another ETag: {wrong:?}"
    );
    put_with(store, &b, "k", b"four", if_match(&cur.etag))
        .await
        .unwrap();
    let cur = head(store, &b, "k").await.unwrap();
    assert_eq!(read(store, &cur, 0, cur.size).await, b"four");
    let missing = put_with(store, &b, "absent", b"x", if_match(&cur.etag)).await;
    assert!(
        matches!(missing, Err(StoreError::NoSuchKey)),
        "If-Match on a missing key: {missing:?}"
    );
    assert!(head(store, &b, "absent").await.is_none());
}

pub async fn digests_and_checksums(store: &dyn Store) {
    let b = new_bucket(store, "digest").await;
    let bad_md5 = put_with(
        store,
        &b,
        "k",
        b"payload",
        PutObject {
            content_md5: Some([0; 16]),
            ..Default::default()
        },
    )
    .await;
    assert!(
        matches!(bad_md5, Err(StoreError::BadDigest(Digest::ContentMd5))),
        "a wrong Content-MD5: {bad_md5:?}"
    );
    assert!(head(store, &b, "k").await.is_none(), "nothing stored");
    let mut h = Hasher::new(ChecksumAlgorithm::Crc32c);
    h.update(b"payload");
    let (crc, _) = h.finish();
    let mut wrong = crc.clone();
    wrong[0] ^= 1;
    let bad = put_with(
        store,
        &b,
        "k",
        b"payload",
        PutObject {
            checksum: Some(ChecksumAlgorithm::Crc32c),
            expected_checksum: Some(wrong),
            ..Default::default()
        },
    )
    .await;
    assert!(
        matches!(
            bad,
            Err(StoreError::BadDigest(Digest::Checksum(
                ChecksumAlgorithm::Crc32c
            )))
        ),
        "a wrong CRC32C: {bad:?}"
    );
    assert!(head(store, &b, "k").await.is_none(), "nothing stored");
    let ok = put_with(
        store,
        &b,
        "k",
        b"payload",
        PutObject {
            checksum: Some(ChecksumAlgorithm::Crc32c),
            expected_checksum: Some(crc),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let c = head(store, &b, "k").await.unwrap().checksum.unwrap();
    assert_eq!(Some(&c), ok.checksum.as_ref());
    assert_eq!(
        (c.algorithm.as_str(), c.kind.as_str()),
        ("CRC32C", "FULL_OBJECT")
    );
}

pub async fn failed_body_stores_nothing(store: &dyn Store) {
    let b = new_bucket(store, "broken").await;
    put(store, &b, "k", b"old").await;
    let mut src = MemSource::new(payload(300_000, 7));
    src.piece = 50_000;
    src.fail_after = Some(150_000);
    let r = store
        .put_object(&b, "k", &mut src, PutObject::default())
        .await;
    match r {
        Err(StoreError::Source(e)) => assert!(
            e.downcast_ref::<SourceBroke>().is_some(),
            "the source's own error comes back: {e}"
        ),
        other => panic!("a body that broke: {other:?}"),
    }
    let cur = head(store, &b, "k").await.unwrap();
    assert_eq!(read(store, &cur, 0, cur.size).await, b"old");
}

pub async fn copies_and_attribute_edits(store: &dyn Store) {
    let b = new_bucket(store, "copy").await;
    let data = payload(2 * (1 << 20) + 3, 9);
    let attrs = ObjectAttrs {
        last_modified_ms: 1_700_000_000_000,
        content_type: Some("image/jpeg".into()),
        user_meta: vec![("label".into(), "cat".into())],
        tags: vec![("split".into(), "train".into())],
        ..Default::default()
    };
    put_with(
        store,
        &b,
        "src",
        &data,
        PutObject {
            attrs: attrs.clone(),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let src = head(store, &b, "src").await.unwrap();
    assert_eq!(src.attrs, attrs);
    let other = new_bucket(store, "copy").await;
    let copied = store
        .copy_object(&src, &other, "dst", PutObject::default())
        .await
        .unwrap();
    assert_eq!(copied.etag, src.etag);
    let dst = head(store, &other, "dst").await.unwrap();
    assert_eq!(read(store, &dst, 0, dst.size).await, data);
    let edited = store
        .update_object(
            &b,
            "src",
            &WriteCondition::default(),
            Box::new(|a| a.tags = vec![("split".into(), "val".into())]),
        )
        .await
        .unwrap();
    assert_eq!(
        edited.attrs.tags,
        [("split".to_string(), "val".to_string())]
    );
    let now = head(store, &b, "src").await.unwrap();
    assert_eq!(now.attrs.tags, edited.attrs.tags);
    assert_eq!(now.attrs.content_type, attrs.content_type, "the rest kept");
    assert_eq!(now.etag, src.etag);
    assert_eq!(read(store, &now, 0, now.size).await, data, "bytes kept");
    let gone = store
        .update_object(
            &b,
            "absent",
            &WriteCondition::default(),
            Box::new(|a| a.tags.clear()),
        )
        .await;
    assert!(
        matches!(gone, Err(StoreError::NoSuchKey)),
        "editing a missing key: {gone:?}"
    );
}

pub async fn lifecycle_configuration(store: &dyn Store) {
    let b = new_bucket(store, "lifecycle").await;
    assert_eq!(store.get_lifecycle(&b).await.unwrap(), None);
    let rules = vec![Rule {
        id: "expire-tmp".into(),
        enabled: true,
        prefix: "tmp/".into(),
        expiration: Some(crate::lifecycle::When::Days(3)),
        ..Default::default()
    }];
    store.put_lifecycle(&b, rules.clone()).await.unwrap();
    assert_eq!(store.get_lifecycle(&b).await.unwrap(), Some(rules));
    // The versioned-bucket actions are kept too.
    let rules = vec![Rule {
        id: "history".into(),
        enabled: true,
        noncurrent_expiration: Some(crate::lifecycle::NoncurrentExpiration {
            days: 30,
            newer_versions: Some(2),
        }),
        expired_delete_markers: true,
        ..Default::default()
    }];
    store.put_lifecycle(&b, rules.clone()).await.unwrap();
    assert_eq!(store.get_lifecycle(&b).await.unwrap(), Some(rules));
    store.delete_lifecycle(&b).await.unwrap();
    assert_eq!(store.get_lifecycle(&b).await.unwrap(), None);
    assert!(store.is_storage_class("STANDARD"));
    assert!(!store.is_storage_class("NO_SUCH_CLASS"));
}

pub async fn bucket_configuration(store: &dyn Store) {
    use crate::BucketConfig;
    let b = new_bucket(store, "bucket-config").await;
    for kind in BucketConfig::ALL {
        assert_eq!(store.get_bucket_config(&b, kind).await.unwrap(), None);
    }
    store
        .put_bucket_config(&b, BucketConfig::Tagging, Some(b"tags".to_vec()))
        .await
        .unwrap();
    store
        .put_bucket_config(&b, BucketConfig::Cors, Some(b"cors-1".to_vec()))
        .await
        .unwrap();
    store
        .put_bucket_config(&b, BucketConfig::Cors, Some(b"cors-2".to_vec()))
        .await
        .unwrap();
    // Each kind is its own document; a put replaces.
    assert_eq!(
        store
            .get_bucket_config(&b, BucketConfig::Tagging)
            .await
            .unwrap()
            .as_deref(),
        Some(&b"tags"[..])
    );
    assert_eq!(
        store
            .get_bucket_config(&b, BucketConfig::Cors)
            .await
            .unwrap()
            .as_deref(),
        Some(&b"cors-2"[..])
    );
    store
        .put_bucket_config(&b, BucketConfig::Tagging, None)
        .await
        .unwrap();
    assert_eq!(
        store
            .get_bucket_config(&b, BucketConfig::Tagging)
            .await
            .unwrap(),
        None
    );
    store
        .put_bucket_config(&b, BucketConfig::Policy, Some(b"{}".to_vec()))
        .await
        .unwrap();
    // A bucket deleted and made again starts with none: no other owner's policy grants
    // anything on it.
    store.delete_bucket(&b).await.unwrap();
    let again = store
        .create_bucket(NewBucket {
            name: b.name.clone(),
            owner_id: "owner-1".into(),
            owner_name: "one".into(),
            created_ms: 1_700_000_000_000,
            public_read: false,
            object_lock: false,
        })
        .await
        .expect("creating the bucket again");
    for kind in [BucketConfig::Cors, BucketConfig::Policy] {
        assert_eq!(store.get_bucket_config(&again, kind).await.unwrap(), None);
    }
}
