//! The conformance suite: what every [`ObjectStore`] must do, as checks any implementation
//! runs against itself (`LocalStore` in `store/tests/conformance.rs`; a cluster store the
//! same way). Each check makes its own buckets, so they can share one store; each panics with
//! what it saw when the store does something else. [`conformance_suite!`](crate::conformance_suite)
//! turns them into one `#[test]` each.
//!
//! Only with the `conformance` feature (it brings proptest and tokio).

use crate::checksum::{ChecksumAlgorithm, Hasher};
use crate::error::{Digest, StoreError, StoreResult};
use crate::lifecycle::Rule;
use crate::lock::LockCheck;
use crate::types::*;
use crate::{ByteSource, ObjectStore};
use bytes::Bytes;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};

/// A payload held in memory, handed out in pieces of `piece` bytes.
pub struct MemSource {
    data: Bytes,
    piece: usize,
    /// Fail (with the source's own error) instead of handing out more once no more than this
    /// many bytes remain.
    fail_after: Option<usize>,
}

impl MemSource {
    pub fn new(data: impl Into<Bytes>) -> Self {
        Self {
            data: data.into(),
            piece: 64 * 1024,
            fail_after: None,
        }
    }
}

#[derive(Debug)]
struct SourceBroke;

impl std::fmt::Display for SourceBroke {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the client went away")
    }
}

impl std::error::Error for SourceBroke {}

#[async_trait::async_trait]
impl ByteSource for MemSource {
    async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
        if self.fail_after.is_some_and(|n| self.data.len() <= n) {
            return Err(StoreError::Source(std::sync::Arc::new(SourceBroke)));
        }
        if self.data.is_empty() {
            return Ok(None);
        }
        let n = self.piece.min(self.data.len());
        Ok(Some(self.data.split_to(n)))
    }

    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }
}

static NEXT_BUCKET: AtomicU64 = AtomicU64::new(0);

/// A new bucket with a name no other check uses.
pub async fn new_bucket(store: &dyn ObjectStore, what: &str) -> Bucket {
    let n = NEXT_BUCKET.fetch_add(1, Ordering::Relaxed);
    store
        .create_bucket(NewBucket {
            name: format!("conf-{what}-{n}"),
            owner_id: "owner-1".into(),
            owner_name: "one".into(),
            created_ms: 1_700_000_000_000,
            public_read: false,
            object_lock: false,
        })
        .await
        .expect("creating a bucket")
}

fn md5_hex(data: &[u8]) -> String {
    use md5::Digest as _;
    md5::Md5::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

pub async fn put(store: &dyn ObjectStore, b: &Bucket, key: &str, data: &[u8]) -> ObjectInfo {
    put_with(store, b, key, data, PutObject::default())
        .await
        .unwrap_or_else(|e| panic!("PUT {key}: {e}"))
}

pub async fn put_with(
    store: &dyn ObjectStore,
    b: &Bucket,
    key: &str,
    data: &[u8],
    put: PutObject,
) -> StoreResult<ObjectInfo> {
    let mut src = MemSource::new(data.to_vec());
    store.put_object(b, key, &mut src, put).await
}

/// Every byte of `[start, end)` of `info`'s version.
pub async fn read(store: &dyn ObjectStore, info: &ObjectInfo, start: u64, end: u64) -> Vec<u8> {
    let mut r = store
        .read_object(info, start, end)
        .unwrap_or_else(|e| panic!("read_object: {e}"));
    let mut out = Vec::new();
    while let Some(piece) = r.next().await.unwrap_or_else(|e| panic!("read: {e}")) {
        out.extend_from_slice(&piece);
    }
    out
}

pub async fn head(store: &dyn ObjectStore, b: &Bucket, key: &str) -> Option<ObjectInfo> {
    store
        .head_object(b, key)
        .await
        .unwrap_or_else(|e| panic!("HEAD {key}: {e}"))
}

fn payload(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

// ---------------------------------------------------------------- the checks

pub async fn buckets(store: &dyn ObjectStore) {
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

pub async fn read_after_write(store: &dyn ObjectStore) {
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

pub async fn overwrite_and_delete(store: &dyn ObjectStore) {
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

/// Versioning: a write keeps what it replaces, a delete adds a delete marker, a version is
/// read and removed by id, and a suspended bucket keeps one `null` version per key.
pub async fn versions(store: &dyn ObjectStore) {
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

pub async fn conditional_writes(store: &dyn ObjectStore) {
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

pub async fn digests_and_checksums(store: &dyn ObjectStore) {
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

pub async fn failed_body_stores_nothing(store: &dyn ObjectStore) {
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

pub async fn copies_and_attribute_edits(store: &dyn ObjectStore) {
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

pub async fn lifecycle_configuration(store: &dyn ObjectStore) {
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

pub async fn bucket_configuration(store: &dyn ObjectStore) {
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

pub async fn multipart_uploads(store: &dyn ObjectStore) {
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
        .upload_part_copy(&b, "copied", &up3.upload_id, 1, &info, 10, 5010)
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

/// A ustar archive of `files`, written here so the suite needs no TAR crate: a 512-byte
/// header per file (name, octal size, checksum), the bytes padded to 512, two zero blocks.
pub fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, data) in files {
        let mut h = [0u8; 512];
        h[..name.len()].copy_from_slice(name.as_bytes());
        h[100..107].copy_from_slice(b"0000644");
        h[108..115].copy_from_slice(b"0000000");
        h[116..123].copy_from_slice(b"0000000");
        h[124..135].copy_from_slice(format!("{:011o}", data.len()).as_bytes());
        h[136..147].copy_from_slice(b"00000000000");
        h[156] = b'0';
        h[257..263].copy_from_slice(b"ustar\0");
        h[263..265].copy_from_slice(b"00");
        h[148..156].fill(b' ');
        let sum: u32 = h.iter().map(|b| u32::from(*b)).sum();
        h[148..155].copy_from_slice(format!("{sum:06o}\0").as_bytes());
        out.extend_from_slice(&h);
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

pub async fn tar_members(store: &dyn ObjectStore) {
    let b = new_bucket(store, "tar-members").await;
    let big = payload(100_000, 7);
    let tar = tar_of(&[("a.jpg", &big), ("a.cls", b"7"), ("dir/b.txt", b"hello")]);
    let info = put(store, &b, "shard.tar", &tar).await;
    let names: Vec<String> = ["a.cls", "dir/b.txt", "missing", "a.jpg"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // Twice: the second answer comes from the member index the first built.
    for _ in 0..2 {
        let at = store
            .tar_members(&b, "shard.tar", &info, &names)
            .await
            .unwrap();
        assert_eq!(at.len(), 4);
        assert_eq!(at[2], None, "a member the archive lacks");
        assert_eq!(at[3], Some((512, big.len() as u64)));
        for (i, want) in [(0, &b"7"[..]), (1, &b"hello"[..])] {
            let (off, size) = at[i].expect("a member the archive has");
            assert_eq!(read(store, &info, off, off + size).await, want);
        }
    }
    let plain = put(store, &b, "plain.bin", b"not a tar at all").await;
    let r = store
        .tar_members(&b, "plain.bin", &plain, &names[..1])
        .await;
    assert!(
        matches!(&r, Err(StoreError::Invalid(m)) if m.contains("not a TAR")),
        "{r:?}"
    );
}

fn b64(raw: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(raw)
}

/// Lists `bucket` page by page and returns every key and common prefix, in order.
pub async fn list_all(
    store: &dyn ObjectStore,
    b: &Bucket,
    prefix: &str,
    delimiter: Option<&str>,
    page: usize,
) -> (Vec<String>, Vec<String>) {
    let (mut keys, mut prefixes) = (Vec::new(), Vec::new());
    let mut after = None;
    for _ in 0..10_000 {
        let p = store
            .list_objects(
                b,
                &ListQuery {
                    prefix: prefix.into(),
                    delimiter: delimiter.map(str::to_string),
                    after: after.clone(),
                    max_keys: page,
                },
            )
            .await
            .unwrap();
        assert!(
            p.objects.len() + p.common_prefixes.len() <= page,
            "a page holds at most max_keys entries"
        );
        keys.extend(p.objects.into_iter().map(|o| o.key));
        prefixes.extend(p.common_prefixes);
        if !p.truncated {
            return (keys, prefixes);
        }
        after = p.last;
        assert!(after.is_some(), "a truncated page says where it ended");
    }
    panic!("listing did not end");
}

/// What a listing must answer, worked out from the set of keys.
pub fn list_model(
    keys: &BTreeSet<String>,
    prefix: &str,
    delimiter: Option<&str>,
) -> (Vec<String>, Vec<String>) {
    let (mut out, mut prefixes) = (Vec::new(), BTreeSet::new());
    for k in keys.iter().filter(|k| k.starts_with(prefix)) {
        match delimiter.and_then(|d| k[prefix.len()..].find(d).map(|i| (i, d.len()))) {
            Some((i, dl)) => {
                prefixes.insert(k[..prefix.len() + i + dl].to_string());
            }
            None => out.push(k.clone()),
        }
    }
    (out, prefixes.into_iter().collect())
}

/// Listings, page by page, equal the model for random key sets, prefixes, delimiters and
/// page sizes (proptest; a failure shrinks to a small key set).
pub fn listing_matches_model(rt: &tokio::runtime::Runtime, store: &dyn ObjectStore) {
    use proptest::prelude::*;
    let key = proptest::string::string_regex("[ab/]{1,6}").unwrap();
    let strategy = (
        proptest::collection::btree_set(key, 0..40),
        proptest::string::string_regex("[ab/]{0,2}").unwrap(),
        proptest::option::of(prop_oneof![Just("/".to_string()), Just("b".to_string())]),
        1usize..7,
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |(keys, prefix, delimiter, page)| {
            rt.block_on(async {
                let b = new_bucket(store, "list").await;
                for k in &keys {
                    put(store, &b, k, k.as_bytes()).await;
                }
                let got = list_all(store, &b, &prefix, delimiter.as_deref(), page).await;
                let want = list_model(&keys, &prefix, delimiter.as_deref());
                prop_assert_eq!(got, want);
                Ok(())
            })
        })
        .unwrap_or_else(|e| panic!("listing differs from the model: {e}"));
}

/// Listing summaries carry what was stored.
pub async fn listing_summaries(store: &dyn ObjectStore) {
    let b = new_bucket(store, "summary").await;
    let mut want = BTreeMap::new();
    for (i, k) in ["a", "b/c", "d"].into_iter().enumerate() {
        let info = put(store, &b, k, &payload(100 + i, 1)).await;
        want.insert(k.to_string(), info);
    }
    let p = store
        .list_objects(
            &b,
            &ListQuery {
                max_keys: 1000,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(!p.truncated);
    assert_eq!(p.objects.len(), 3);
    for o in &p.objects {
        let w = &want[&o.key];
        assert_eq!((o.size, &o.etag), (w.size, &w.etag), "{}", o.key);
        assert_eq!(o.storage_class, None);
    }
}

/// Object Lock: a bucket created with it has versioning enabled for good and keeps its
/// default retention; a version's lock (stored among its headers) refuses its removal and
/// shortening its retention unless the rules allow, is listed with the version, and goes
/// with the bypass once no legal hold is on.
pub async fn object_lock(store: &dyn ObjectStore) {
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

/// Web console sessions: one recorded is found by its token digest until it is ended; an
/// unknown digest finds nothing; ending it twice is no error; two sessions of one key are
/// apart.
pub async fn console_sessions(store: &dyn ObjectStore) {
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

/// Tags changed on one version by id: that version's alone (an older one, the current one,
/// the `null` object of an unversioned bucket), bytes and place kept; listings carry them.
/// A version's stored object ACL ([`crate::ACL_HEADER`]) shows in the version listing (copies
/// of a key's history compare it), set on a write and by an attribute edit of the current
/// version, which leaves the older version's as it was.
pub async fn version_acl(store: &dyn ObjectStore) {
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

pub async fn version_tags(store: &dyn ObjectStore) {
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
pub async fn version_class(store: &dyn ObjectStore) {
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

/// One `#[test]` per check against the store that `$make` (an `async fn() -> Arc<dyn
/// ObjectStore>`, called once per test) opens.
#[macro_export]
macro_rules! conformance_suite {
    ($make:path) => {
        $crate::conformance_suite!(@checks $make;
            buckets, read_after_write, overwrite_and_delete, conditional_writes,
            digests_and_checksums, failed_body_stores_nothing, copies_and_attribute_edits,
            lifecycle_configuration, bucket_configuration, listing_summaries,
            multipart_uploads, tar_members, versions, version_tags, version_acl,
            version_class, object_lock, console_sessions);
        #[test]
        fn listing_matches_model() {
            let rt = tokio::runtime::Runtime::new().unwrap();
            let store = rt.block_on($make());
            $crate::conformance::listing_matches_model(&rt, &*store);
        }
    };
    (@checks $make:path; $($check:ident),*) => {
        $(
            #[test]
            fn $check() {
                let rt = tokio::runtime::Runtime::new().unwrap();
                rt.block_on(async {
                    let store = $make().await;
                    $crate::conformance::$check(&*store).await;
                });
            }
        )*
    };
}
