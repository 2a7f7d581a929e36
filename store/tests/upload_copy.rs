//! What a cluster node copies of an upload in progress from another node's store (the store
//! seam's `upload_to_copy` and `read_part`): the upload as begun, under its id, and each
//! part's bytes, checked as they are read.

mod common;

use common::Once;
use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store_api::checksum::ChecksumAlgorithm;
use packrat_store_api::{NewBucket, NewUpload, ObjectAttrs, ObjectStore, PutPart, ReplicaStore};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_and_its_parts_are_read_back_as_begun() {
    let dirs = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let open = |d: &tempfile::TempDir| {
        LocalStore::open(LocalOptions::new(d.path().to_path_buf()))
            .unwrap()
            .store
    };
    let (from, to) = (open(&dirs.0), open(&dirs.1));
    let bucket = |name: &str| NewBucket {
        name: name.into(),
        owner_id: "o".into(),
        owner_name: "o".into(),
        created_ms: 1,
        public_read: false,
        object_lock: false,
    };
    let (b1, b2) = (
        from.create_bucket(bucket("b")).await.unwrap(),
        to.create_bucket(bucket("b")).await.unwrap(),
    );
    let begun = NewUpload {
        owner_id: "owner".into(),
        initiated_ms: 1234,
        attrs: ObjectAttrs {
            last_modified_ms: 1234,
            content_type: Some("application/x-test".into()),
            headers: vec![("cache-control".into(), "no-cache".into())],
            user_meta: vec![("k".into(), "v".into())],
            storage_class: None,
            tags: vec![("t".into(), "1".into())],
        },
        checksum: Some(ChecksumAlgorithm::Crc32c),
        checksum_type: Some("COMPOSITE".into()),
        upload_id: Some("upload-1".into()),
    };
    from.create_upload(&b1, "key", begun).await.unwrap();
    let body = bytes::Bytes::from((0..300_000u32).map(|i| (i % 251) as u8).collect::<Vec<_>>());
    let part = from
        .upload_part(
            &b1,
            "key",
            "upload-1",
            3,
            &mut Once(Some(body.clone())),
            PutPart::default(),
        )
        .await
        .unwrap();

    // Begun again in another store from what the first answers: the same upload.
    let copy = from
        .upload_to_copy(&b1, "key", "upload-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(copy.upload_id.as_deref(), Some("upload-1"));
    assert_eq!(copy.checksum, Some(ChecksumAlgorithm::Crc32c));
    to.create_upload(&b2, "key", copy).await.unwrap();
    let (a, b) = (
        from.upload(&b1, "key", "upload-1").await.unwrap().unwrap(),
        to.upload(&b2, "key", "upload-1").await.unwrap().unwrap(),
    );
    assert_eq!(
        (a.owner_id, a.initiated_ms, a.checksum, a.checksum_type),
        (b.owner_id, b.initiated_ms, b.checksum, b.checksum_type)
    );

    // The part's bytes, stored there as a part: the same ETag and checksum.
    let (listed, mut reader) = from
        .read_part(&b1, "key", "upload-1", 3)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(listed, part);
    let mut read = Vec::new();
    while let Some(piece) = reader.next().await.unwrap() {
        read.extend_from_slice(&piece);
    }
    assert_eq!(read, body);
    let copied = to
        .upload_part(
            &b2,
            "key",
            "upload-1",
            3,
            &mut Once(Some(read.into())),
            PutPart::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        (&copied.etag, &copied.checksum),
        (&part.etag, &part.checksum)
    );

    // The object completed from the copy has what the upload was begun with.
    let done = to
        .complete_upload(
            &b2,
            "key",
            "upload-1",
            vec![packrat_store_api::CompletePart {
                part_number: 3,
                etag: part.etag.clone(),
                checksums: Vec::new(),
            }],
            &Default::default(),
            &Default::default(),
        )
        .await
        .unwrap();
    assert_eq!(
        done.attrs.content_type.as_deref(),
        Some("application/x-test")
    );
    assert_eq!(
        done.attrs.user_meta,
        vec![("k".to_string(), "v".to_string())]
    );
    assert_eq!(done.attrs.tags, vec![("t".to_string(), "1".to_string())]);

    // Nothing there: no part, no upload.
    assert!(
        from.read_part(&b1, "key", "upload-1", 2)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        from.read_part(&b1, "key", "nope", 3)
            .await
            .unwrap()
            .is_none()
    );
    assert!(
        from.upload_to_copy(&b1, "key", "nope")
            .await
            .unwrap()
            .is_none()
    );
}
