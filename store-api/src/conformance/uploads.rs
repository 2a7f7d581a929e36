//! Multipart uploads.

use super::listing::b64;
use super::*;

pub async fn multipart_uploads(store: &dyn Store) {
    let b = new_bucket(store, "multipart").await;
    let new = NewUpload {
        owner_id: "owner-1".into(),
        initiated_ms: 1_700_000_000_000,
        attrs: ObjectAttrs {
            content_type: Some("application/x-tar".into()),
            tags: vec![("split".into(), "train & test".into())],
            ..Default::default()
        },
        checksum: Some(ChecksumAlgorithm::Crc32c),
        checksum_type: Some("FULL_OBJECT".into()),
        upload_id: None,
    };
    let up = store.create_upload(&b, "big", new.clone()).await.unwrap();
    assert_eq!(
        store
            .upload(&b, "big", &up.upload_id)
            .await
            .unwrap()
            .as_ref(),
        Some(&up)
    );
    let p1 = payload(PART_BYTES_MIN as usize, 1);
    let p2 = payload(PART_BYTES_MIN as usize + 1000, 2);
    let p3 = payload(777, 3);
    let mut parts = Vec::new();
    for (n, data) in [(1u32, &p1), (2, &p2), (3, &p3)] {
        let mut src = MemSource::new(data.clone());
        let part = store
            .upload_part(&b, "big", &up.upload_id, n, &mut src, PutPart::default())
            .await
            .unwrap();
        assert_eq!((part.part_number, part.size), (n, data.len() as u64));
        assert_eq!(part.etag, md5_hex(data));
        parts.push(part);
    }
    let (listed, more) = store.list_parts(&up, &b, 0, 2).await.unwrap();
    assert_eq!((listed.len(), more), (2, true));
    let (rest, more) = store.list_parts(&up, &b, 2, 1000).await.unwrap();
    assert_eq!((rest.len(), more), (1, false));
    let named = |ps: &[&Part]| -> Vec<CompletePart> {
        ps.iter()
            .map(|p| CompletePart {
                part_number: p.part_number,
                etag: format!("\"{}\"", p.etag),
                checksums: Vec::new(),
            })
            .collect()
    };
    let always = WriteCondition::default();
    let stamp = crate::CompleteAs::default();
    let complete = |ps: Vec<CompletePart>| {
        store.complete_upload(&b, "big", &up.upload_id, ps, &always, &stamp)
    };
    let out_of_order = complete(named(&[&parts[1], &parts[0]])).await;
    assert!(
        matches!(out_of_order, Err(StoreError::InvalidPartOrder)),
        "{out_of_order:?}"
    );
    let mut wrong_etag = named(&[&parts[0], &parts[2]]);
    wrong_etag[1].etag = "\"0123\"".into();
    let r = complete(wrong_etag).await;
    assert!(matches!(r, Err(StoreError::InvalidPart(_))), "{r:?}");
    let repeated = complete(named(&[&parts[2], &parts[2]])).await;
    assert!(
        matches!(repeated, Err(StoreError::InvalidPartOrder)),
        "{repeated:?}"
    );
    // A small part that is not the last (part 3 is 777 bytes).
    let up2 = store.create_upload(&b, "small", new).await.unwrap();
    for (n, data) in [(1u32, &p3), (2, &p3)] {
        let mut src = MemSource::new(data.clone());
        store
            .upload_part(&b, "small", &up2.upload_id, n, &mut src, PutPart::default())
            .await
            .unwrap();
    }
    let (small_parts, _) = store.list_parts(&up2, &b, 0, 10).await.unwrap();
    let r = store
        .complete_upload(
            &b,
            "small",
            &up2.upload_id,
            named(&small_parts.iter().collect::<Vec<_>>()),
            &WriteCondition::default(),
            &Default::default(),
        )
        .await;
    assert!(matches!(r, Err(StoreError::EntityTooSmall)), "{r:?}");
    let page = store
        .list_uploads(
            &b,
            &UploadQuery {
                max_uploads: 100,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let keys: Vec<_> = page.uploads.iter().map(|u| u.key.as_str()).collect();
    assert_eq!(keys, ["big", "small"]);
    // Complete with parts 1 and 3 (part 2 is left out and dropped).
    let obj = complete(named(&[&parts[0], &parts[2]])).await.unwrap();
    let mut whole = p1.clone();
    whole.extend_from_slice(&p3);
    let info = head(store, &b, "big").await.unwrap();
    assert_eq!(info.etag, obj.etag);
    assert!(info.etag.ends_with("-2"), "a multipart ETag: {}", info.etag);
    assert_eq!(info.part_sizes, [p1.len() as u64, p3.len() as u64]);
    assert_eq!(
        info.attrs.tags,
        [("split".to_string(), "train & test".to_string())]
    );
    assert_eq!(
        info.attrs.content_type.as_deref(),
        Some("application/x-tar")
    );
    let c = info
        .checksum
        .as_ref()
        .expect("the upload's full-object CRC32C");
    let mut h = Hasher::new(ChecksumAlgorithm::Crc32c);
    h.update(&whole);
    assert_eq!(
        (c.algorithm.as_str(), c.kind.as_str()),
        ("CRC32C", "FULL_OBJECT")
    );
    assert_eq!(c.value, b64(&h.finish().0));
    assert_eq!(read(store, &info, 0, info.size).await, whole);
    assert_eq!(
        store.upload(&b, "big", &up.upload_id).await.unwrap(),
        None,
        "a completed upload is gone"
    );
    let again = complete(named(&[&parts[0]])).await;
    assert!(matches!(again, Err(StoreError::NoSuchUpload)), "{again:?}");
    let mut late = MemSource::new(p3.clone());
    let r = store
        .upload_part(&b, "big", &up.upload_id, 4, &mut late, PutPart::default())
        .await;
    assert!(
        matches!(r, Err(StoreError::NoSuchUpload)),
        "a part for an ended upload: {r:?}"
    );
    store
        .abort_upload(&b, "small", &up2.upload_id)
        .await
        .unwrap();
    let r = store.abort_upload(&b, "small", &up2.upload_id).await;
    assert!(matches!(r, Err(StoreError::NoSuchUpload)), "{r:?}");
    // UploadPartCopy: a part made of a range of another object.
    let up3 = store
        .create_upload(&b, "copied", NewUpload::default())
        .await
        .unwrap();
    let part = store
        .upload_part_copy(&b, "copied", &up3.upload_id, 1, &info, 10..5010)
        .await
        .unwrap();
    assert_eq!(part.size, 5000);
    let obj = store
        .complete_upload(
            &b,
            "copied",
            &up3.upload_id,
            named(&[&part]),
            &WriteCondition::default(),
            &Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(read(store, &obj, 0, obj.size).await, whole[10..5010]);
}

/// Deleting a bucket aborts its uploads in progress, as S3 does; a bucket that holds an object
/// or a version (a delete marker too) is not deleted, and its uploads stay.
pub async fn delete_bucket_with_uploads(store: &dyn Store) {
    let open_upload = |b: Bucket, key: &'static str| async move {
        let new = NewUpload {
            owner_id: "owner-1".into(),
            initiated_ms: 1_700_000_000_000,
            attrs: ObjectAttrs::default(),
            checksum: None,
            checksum_type: None,
            upload_id: None,
        };
        let up = store.create_upload(&b, key, new).await.unwrap();
        let mut src = MemSource::new(payload(1000, 9));
        store
            .upload_part(&b, key, &up.upload_id, 1, &mut src, PutPart::default())
            .await
            .unwrap();
        up
    };
    let open = |b: Bucket, up: Upload| async move {
        store
            .upload(&b, &up.key, &up.upload_id)
            .await
            .unwrap()
            .is_some()
    };

    let b = new_bucket(store, "uploads-only").await;
    for i in 0..3 {
        open_upload(b.clone(), ["a", "b/c", "b/c"][i]).await;
    }
    store.delete_bucket(&b).await.unwrap();
    assert!(store.bucket(&b.name).unwrap().is_none(), "bucket deleted");

    let b = new_bucket(store, "object-and-upload").await;
    put(store, &b, "kept", b"bytes").await;
    let up = open_upload(b.clone(), "big").await;
    assert!(matches!(
        store.delete_bucket(&b).await,
        Err(StoreError::BucketNotEmpty)
    ));
    assert!(open(b.clone(), up.clone()).await, "the upload stays");
    store.delete_object(&b, "kept").await.unwrap();
    store.delete_bucket(&b).await.unwrap();
    assert!(store.bucket(&b.name).unwrap().is_none());

    let b = new_bucket(store, "marker-and-upload").await;
    store.set_versioning(&b, Versioning::Enabled).await.unwrap();
    let b = store.bucket(&b.name).unwrap().unwrap();
    put(store, &b, "gone", b"bytes").await;
    store.delete_object(&b, "gone").await.unwrap();
    let up = open_upload(b.clone(), "big").await;
    assert!(matches!(
        store.delete_bucket(&b).await,
        Err(StoreError::BucketNotEmpty)
    ));
    assert!(open(b.clone(), up).await, "the upload stays");
}
