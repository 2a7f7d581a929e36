//! The gateway's view of a cluster: `ClusterStore`, a second implementation of `ObjectStore`.
//! The S3 layer is the same as `packrat serve`'s; only where things are kept differs.
//!
//! Buckets and access keys live in etcd (cached here, followed by a watch; a miss asks etcd
//! before answering "no such bucket", so a bucket made through another gateway is seen at
//! once). Objects live on the storage nodes: a request goes to its PG's chain (writes to the
//! head, reads to any caught-up member, or to the tail for a key with a write under way), and
//! listings merge one sorted page per node, each PG listed by one member.
//!
//! A request that meets a dead node or a changed map is retried on the map as it becomes, for
//! up to [`FAILOVER_WAIT`]; after that it fails with 503 (`Unavailable`).
//!
//! Not yet through a cluster (answered with an error that says so, and listed in the README):
//! storage tiers. The admin jobs (compaction, scrub, tier runs) run on every node's own store
//! (`admin`).

use crate::map::{BucketRecord, ClusterMap, Etcd, bucket_records};
use crate::placement::pg_of;
use crate::wire::Call;
use crate::wire::{
    Answer, NodeClient, PUT_HEADER, READ_TIMEOUT, WireDeleted, WireLockChange, WireLockConfig,
    WireLocked, WireMeta, WirePage, WirePut, WireRefusal, WireVersioning, encode, hop_timeout,
    version_seq,
};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use http::Method;
use packrat_store_api::admin::{AccessKey, NewKey};
use packrat_store_api::batch::{BatchItem, BatchOrder, BatchPlan, BatchWriter, EntrySink};
use packrat_store_api::lifecycle::Rule;
use packrat_store_api::lock::{LockChange, LockCheck, LockConfig, ObjectLock};
use packrat_store_api::{
    AttrEdit, Bucket, BucketConfig, ByteSource, Clock, CompleteAs, CompletePart, Identity,
    ListQuery, NewBucket, NewUpload, ObjectInfo, ObjectPage, ObjectRead, ObjectStore,
    ObjectVersion, Part, PutObject, PutPart, StoreError, StoreResult, SystemClock, Upload,
    UploadPage, UploadQuery, WriteCondition, etag_matches,
};
use packrat_store_api::{
    Credentials, Deleted, FoundVersion, VersionPage, VersionQuery, VersionSummary, Versioning,
};
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::watch;

mod admin;
mod calls;
mod credentials;
mod follow;
mod kms;
mod lookups;
mod read;
use lookups::Gather;
use read::{ClusterRead, InlineRead};
mod batch_get;
#[cfg(test)]
pub(crate) use batch_get::NodeStream;
mod batch_put;
mod buckets;
mod uploads;
mod versions;

/// How long a request keeps trying while the cluster fails over (a lease of
/// [`crate::LEASE_SECS`] running out, then the manager's next round).
pub const FAILOVER_WAIT: Duration = Duration::from_secs(15);
/// How long a request keeps trying while the members it reaches are fenced (their leases not
/// known alive, see [`crate::FENCE_MS`]): a map without them comes within about a second of
/// the fence on the side of a partition that has etcd; on the other side none comes, and the
/// client is better told so (503) than kept waiting.
pub const FENCED_WAIT: Duration = Duration::from_secs(5);
/// Largest single PUT through a cluster gateway: the body is held in memory so that a write
/// can be retried on a new head after a failure.
pub const CLUSTER_PUT_MAX: u64 = 256 * 1024 * 1024;
/// Reads up to this size are fetched whole before the answer starts, so that a failure is a
/// clean error rather than a cut stream.
const SINGLE_PIECE_MAX: u64 = 1024 * 1024;
/// Listings and other requests that are not a single object's.
const NODE_TIMEOUT: Duration = Duration::from_secs(10);
/// Objects up to this size come whole with their metadata (one request to a node per GET
/// instead of two; a HEAD then carries bytes it does not need, cheap on a LAN next to a
/// second round trip).
pub(crate) const INLINE_MAX: u64 = 64 * 1024;

fn not_in_cluster(what: &str) -> StoreError {
    StoreError::Invalid(format!(
        "{what} is not yet supported through a packrat cluster gateway (see the README's compatibility table)"
    ))
}

/// Which version of an object an `ObjectInfo` from a node describes, and who described it.
#[derive(Clone)]
struct ClusterVersion {
    /// The whole object, when the node sent it with its metadata.
    inline: Option<Bytes>,
    bucket_id: u64,
    key: String,
    pg: u32,
    cv: u64,
    node: String,
    /// The ETag shows another MD5 than the stored bytes' (SSE-S3: its plaintext's).
    shown_etag: bool,
    /// A version asked for by id is read by it (it may not be the key's current one).
    by_id: Option<String>,
}

/// The cluster version an `ObjectInfo` from this store describes (`what`: the operation, for
/// the error if it came from another store).
fn cluster_version<'a>(
    info: &'a ObjectInfo,
    what: &'static str,
) -> StoreResult<&'a ClusterVersion> {
    info.version
        .0
        .downcast_ref::<ClusterVersion>()
        .ok_or_else(|| StoreError::internal(what, "not a cluster object version"))
}

/// The node a store runs beside (a node's S3 read endpoint, `packrat node --s3-listen`): its
/// id, its advertised internal address, its handler, called in-process, and its lookups and
/// batch plans, called directly.
pub struct Beside {
    pub id: String,
    pub addr: String,
    pub handler: crate::wire::InProcess,
    pub reads: crate::wire::NearReads,
    pub batches: crate::wire::NearBatches,
}

pub struct ClusterStore {
    /// The node this store serves reads of, in its process: reads go to it alone, and a
    /// request for a PG it does not serve is misdirected (see `Beside`); `None` in a gateway.
    beside: Option<Beside>,
    /// This store, for what outlives a call (a batch PUT's writer).
    me: std::sync::Weak<ClusterStore>,
    /// The cluster's master key (SSE-S3), kept in etcd (`Etcd::master_key`).
    master: packrat_secrets::master_key::MasterKey,
    etcd: Etcd,
    map: watch::Receiver<Arc<ClusterMap>>,
    pub(crate) client: NodeClient,
    /// Writes to heads, relayed together under load (see [`crate::relay`]).
    relay: crate::relay::Relay,
    buckets: Arc<RwLock<HashMap<String, BucketRecord>>>,
    keys: Arc<RwLock<HashMap<String, AccessKey>>>,
    /// SSE-KMS keys, opened (see `store/kms.rs`).
    kms: packrat_secrets::kms::KeyRing,
    next_reader: AtomicUsize,
    /// Lookups gathered per node (see [`ClusterStore::lookup`]); how many went gathered, in
    /// how many requests, and how many were then asked alone.
    gathers: RwLock<HashMap<String, Arc<Gather>>>,
    gathered_lookups: AtomicU64,
    gathered_requests: AtomicU64,
    gathered_alone: AtomicU64,
    clock: Arc<dyn Clock>,
    /// Changes this gateway made to its bucket and key caches itself (after writing them to
    /// etcd), counted under the cache's lock: a reload whose listing may predate one of them
    /// lists again rather than put an older record back (see [`ClusterStore::reload`]).
    local_edits: AtomicU64,
    /// Buckets and access keys etcd did not have, lately (see `misses`), and the etcd reads
    /// their misses made.
    misses: crate::misses::Misses,
    etcd_misses_asked: AtomicU64,
    /// When etcd last answered this gateway's health question (Unix ms).
    etcd_heard_ms: AtomicU64,
}

/// Where a request for a PG goes.
#[derive(Clone, Copy, PartialEq)]
enum Target {
    Head,
    Tail,
    Reader,
}

impl ClusterStore {
    async fn body_of(body: &mut dyn ByteSource) -> StoreResult<Bytes> {
        let mut buf = BytesMut::new();
        while let Some(piece) = body.next_piece().await? {
            if (buf.len() + piece.len()) as u64 > CLUSTER_PUT_MAX {
                return Err(StoreError::Invalid(format!(
                    "a single PUT through a cluster gateway is at most {CLUSTER_PUT_MAX} bytes"
                )));
            }
            buf.extend_from_slice(&piece);
        }
        Ok(buf.freeze())
    }

    async fn put_bytes(
        &self,
        bucket: &Bucket,
        key: &str,
        body: Bytes,
        wput: WirePut,
    ) -> StoreResult<ObjectInfo> {
        let pg = pg_of(bucket.id, key, self.map().pgs);
        let mut wput = wput;
        wput.versioning = WireVersioning::of(bucket.versioning);
        // The head checks the bytes it gets against this (see `Node::check_body`).
        wput.body_crc32c = Some(crate::wire::body_crc32c(&body));
        let header = serde_json::to_string(&wput).map_err(|e| StoreError::internal("write", e))?;
        let (ans, node) = self
            .call(
                pg,
                Target::Head,
                Call {
                    method: Method::PUT,
                    path: &format!("/o/{}/{pg}/{}", bucket.id, encode(key)),
                    headers: &[(PUT_HEADER, header)],
                    body,
                },
            )
            .await?;
        if ans.status != 200 {
            return Err(ans.error().await);
        }
        let meta: WireMeta = ans.json().await?;
        Ok(self.info_of(bucket, key, pg, node, meta, None))
    }
}

/// Who lists which PGs: each PG once, by one of its caught-up members; one request per node.
fn listing_plan(map: &ClusterMap) -> StoreResult<BTreeMap<String, Vec<u32>>> {
    let mut by_node: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for pg in 0..map.pgs {
        let readers: Vec<&String> = map.readers(pg).collect();
        if readers.is_empty() {
            return Err(StoreError::Unavailable(format!(
                "placement group {pg} has no member that can list it now; retry later"
            )));
        }
        by_node
            .entry(readers[pg as usize % readers.len()].clone())
            .or_default()
            .push(pg);
    }
    Ok(by_node)
}

fn b64(v: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(v)
}

fn wire_put(put: &PutObject, trailing: Option<Vec<u8>>) -> WirePut {
    let mut w = WirePut {
        checksum: put.checksum.map(|a| a.name().to_string()),
        expected_checksum: put
            .expected_checksum
            .as_deref()
            .or(trailing.as_deref())
            .map(b64),
        content_md5: put.content_md5.map(|m| b64(&m)),
        if_none_match_any: put.condition.if_none_match_any,
        if_match: put.condition.if_match.clone(),
        ..Default::default()
    };
    w.set_attrs(put.attrs.clone());
    w
}

#[async_trait::async_trait]
impl ObjectStore for ClusterStore {
    fn bucket(&self, name: &str) -> StoreResult<Option<Bucket>> {
        if let Some(b) = self
            .buckets
            .read()
            .ok()
            .and_then(|b| b.get(name).map(Self::bucket_of))
        {
            return Ok(Some(b));
        }
        let rec = self
            .uncached("buckets", name)?
            .and_then(|v| serde_json::from_slice::<BucketRecord>(&v).ok());
        Ok(rec.map(|r| Self::bucket_of(&r)))
    }

    async fn list_buckets(&self) -> StoreResult<Vec<Bucket>> {
        let mut all: Vec<Bucket> = bucket_records(&self.etcd)
            .await
            .map_err(StoreError::Unavailable)?
            .iter()
            .map(Self::bucket_of)
            .collect();
        all.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(all)
    }

    async fn create_bucket(&self, new: NewBucket) -> StoreResult<Bucket> {
        let unavailable = StoreError::Unavailable;
        let id = loop {
            let current = self.etcd.get("bucket-seq").await.map_err(unavailable)?;
            let (last, rev) = match current {
                Some((v, rev)) => (String::from_utf8_lossy(&v).parse::<u64>().unwrap_or(0), rev),
                None => (0, 0),
            };
            let next = last + 1;
            if self
                .etcd
                .put_if("bucket-seq", rev, next.to_string().into_bytes())
                .await
                .map_err(unavailable)?
            {
                break next;
            }
        };
        let rec = BucketRecord {
            id,
            name: new.name.clone(),
            owner_id: new.owner_id,
            owner_name: new.owner_name,
            created_ms: new.created_ms,
            public_read: new.public_read,
            lifecycle: None,
            configs: Default::default(),
            // Object Lock turns versioning on for good.
            versioning: new.object_lock.then_some(WireVersioning::Enabled),
            object_lock: new.object_lock.then(WireLockConfig::default),
        };
        let value = serde_json::to_vec(&rec).map_err(|e| StoreError::internal("bucket", e))?;
        if !self
            .etcd
            .put_if(&format!("buckets/{}", new.name), 0, value)
            .await
            .map_err(unavailable)?
        {
            return Err(StoreError::BucketExists);
        }
        self.edit_bucket_cache(|b| {
            b.insert(rec.name.clone(), rec.clone());
        });
        Ok(Self::bucket_of(&rec))
    }

    async fn delete_bucket(&self, bucket: &Bucket) -> StoreResult<()> {
        let probe = self
            .list_objects(
                bucket,
                &ListQuery {
                    max_keys: 1,
                    ..Default::default()
                },
            )
            .await?;
        if !probe.objects.is_empty() {
            return Err(StoreError::BucketNotEmpty);
        }
        // A bucket keeps its versions (and delete markers) until each is deleted by id.
        if bucket.versioning != Versioning::Unversioned {
            let versions = self
                .list_versions(
                    bucket,
                    &VersionQuery {
                        max_keys: 1,
                        ..Default::default()
                    },
                )
                .await?;
            if !versions.versions.is_empty() {
                return Err(StoreError::BucketNotEmpty);
            }
        }
        // Uploads in progress are aborted, as S3 does.
        packrat_store_api::abort_uploads(self, bucket).await?;
        let deleted = self.delete_bucket_record(bucket).await;
        self.edit_bucket_cache(|b| {
            b.remove(&bucket.name);
        });
        deleted
    }

    async fn set_versioning(&self, bucket: &Bucket, state: Versioning) -> StoreResult<()> {
        let Some(v) = WireVersioning::of(state) else {
            return Err(StoreError::Invalid(
                "a bucket's versioning can be Enabled or Suspended, never turned off".into(),
            ));
        };
        self.edit_bucket(bucket, |r| {
            if v == WireVersioning::Suspended && r.object_lock.is_some() {
                return Err(StoreError::InvalidBucketState(
                    "An Object Lock configuration is present on this bucket, so the versioning state cannot be changed.".into(),
                ));
            }
            r.versioning = Some(v);
            Ok(())
        })
        .await
    }

    async fn set_lock_config(&self, bucket: &Bucket, config: LockConfig) -> StoreResult<()> {
        let lock = WireLockConfig::of(&config);
        self.edit_bucket(bucket, |r| {
            if r.versioning != Some(WireVersioning::Enabled) {
                return Err(StoreError::InvalidBucketState(
                    "Versioning must be 'Enabled' on the bucket to apply a Object Lock configuration".into(),
                ));
            }
            r.object_lock = Some(lock);
            Ok(())
        })
        .await
    }

    async fn set_bucket_public(&self, bucket: &Bucket, public: bool) -> StoreResult<()> {
        self.edit_bucket(bucket, |r| {
            r.public_read = public;
            Ok(())
        })
        .await
    }

    async fn put_lifecycle(&self, bucket: &Bucket, rules: Vec<Rule>) -> StoreResult<()> {
        self.edit_bucket(bucket, |r| {
            r.lifecycle = Some(rules.clone());
            Ok(())
        })
        .await
    }

    async fn get_lifecycle(&self, bucket: &Bucket) -> StoreResult<Option<Vec<Rule>>> {
        let rec = self
            .etcd
            .get(&format!("buckets/{}", bucket.name))
            .await
            .map_err(StoreError::Unavailable)?
            .and_then(|(v, _)| serde_json::from_slice::<BucketRecord>(&v).ok())
            .ok_or(StoreError::NoSuchBucket)?;
        Ok(rec.lifecycle)
    }

    async fn delete_lifecycle(&self, bucket: &Bucket) -> StoreResult<()> {
        self.edit_bucket(bucket, |r| {
            r.lifecycle = None;
            Ok(())
        })
        .await
    }

    async fn put_bucket_config(
        &self,
        bucket: &Bucket,
        kind: BucketConfig,
        doc: Option<Vec<u8>>,
    ) -> StoreResult<()> {
        use base64::Engine as _;
        let doc = doc.map(|d| base64::engine::general_purpose::STANDARD.encode(d));
        self.edit_bucket(bucket, |r| {
            match &doc {
                Some(d) => r.configs.insert(kind.name().to_string(), d.clone()),
                None => r.configs.remove(kind.name()),
            };
            Ok(())
        })
        .await
    }

    async fn get_bucket_config(
        &self,
        bucket: &Bucket,
        kind: BucketConfig,
    ) -> StoreResult<Option<Vec<u8>>> {
        use base64::Engine as _;
        // The watched cache first (a browser asks on every request); etcd when it misses.
        let cached = self
            .buckets
            .read()
            .ok()
            .and_then(|b| b.get(&bucket.name).filter(|r| r.id == bucket.id).cloned());
        let rec = match cached {
            Some(r) => r,
            None => self
                .etcd
                .get(&format!("buckets/{}", bucket.name))
                .await
                .map_err(StoreError::Unavailable)?
                .and_then(|(v, _)| serde_json::from_slice::<BucketRecord>(&v).ok())
                .filter(|r| r.id == bucket.id)
                .ok_or(StoreError::NoSuchBucket)?,
        };
        rec.configs
            .get(kind.name())
            .map(|d| {
                base64::engine::general_purpose::STANDARD
                    .decode(d)
                    .map_err(|e| StoreError::internal("bucket configuration", e))
            })
            .transpose()
    }

    fn is_storage_class(&self, class: &str) -> bool {
        // A class every node in the map has a tier for: each member keeps its copy of such an
        // object there (its own tier worker moves it).
        let map = self.map();
        class == "STANDARD"
            || (!map.nodes.is_empty()
                && map
                    .nodes
                    .values()
                    .all(|n| n.classes.iter().any(|c| c == class)))
    }

    async fn head_object(&self, bucket: &Bucket, key: &str) -> StoreResult<Option<ObjectInfo>> {
        self.lookup(bucket, key, INLINE_MAX).await
    }

    fn read_object(
        &self,
        object: &ObjectInfo,
        start: u64,
        end: u64,
    ) -> StoreResult<Box<dyn ObjectRead>> {
        let v = cluster_version(object, "read")?;
        if let Some(all) = &v.inline {
            let (s, e) = (start.min(all.len() as u64), end.min(all.len() as u64));
            return Ok(Box::new(InlineRead(Some(
                all.slice(s as usize..e as usize),
            ))));
        }
        let mut path = format!(
            "/o/{}/{}/{}?cv={}&start={start}&end={end}",
            v.bucket_id,
            v.pg,
            encode(&v.key),
            v.cv
        );
        if let Some(id) = &v.by_id {
            path.push_str(&format!("&version={}", encode(id)));
        }
        Ok(Box::new(ClusterRead {
            client: self.client.clone(),
            map: self.map.clone(),
            path,
            node: v.node.clone(),
            pg: v.pg,
            single: end.saturating_sub(start) <= SINGLE_PIECE_MAX,
            started: false,
            body: None,
            crc: None,
            held: None,
        }))
    }

    async fn put_object(
        &self,
        bucket: &Bucket,
        key: &str,
        body: &mut dyn ByteSource,
        put: PutObject,
    ) -> StoreResult<ObjectInfo> {
        let bytes = Self::body_of(body).await?;
        let trailing = match put.checksum {
            Some(alg) if put.expected_checksum.is_none() => body.trailing_checksum(alg)?,
            _ => None,
        };
        let mut wput = wire_put(&put, trailing);
        wput.shown_md5 = body.shown_md5().map(|m| b64(&m));
        self.put_bytes(bucket, key, bytes, wput).await
    }

    async fn copy_object(
        &self,
        source: &ObjectInfo,
        bucket: &Bucket,
        key: &str,
        put: PutObject,
    ) -> StoreResult<ObjectInfo> {
        if source.size > CLUSTER_PUT_MAX {
            return Err(not_in_cluster("copying an object over 256 MiB"));
        }
        let bytes = self.read_all(source).await?;
        let mut wput = wire_put(&put, None);
        // A copy of the same bytes shows the ETag its source shows.
        if cluster_version(source, "copy").is_ok_and(|v| v.shown_etag) {
            wput.shown_md5 = hex::decode(&source.etag).ok().map(|m| b64(&m));
        }
        self.put_bytes(bucket, key, bytes, wput).await
    }

    async fn update_object(
        &self,
        bucket: &Bucket,
        key: &str,
        condition: &WriteCondition,
        edit: AttrEdit,
    ) -> StoreResult<ObjectInfo> {
        // A chain edit of the version read (its bytes stay where they are, on every member):
        // if a write lands meanwhile the head refuses the edit, which is then made again on
        // what the key holds now.
        let mut edit = Some(edit);
        for _ in 0..8 {
            let current = self
                .head_object(bucket, key)
                .await?
                .ok_or(StoreError::NoSuchKey)?;
            if condition.if_none_match_any
                || condition
                    .if_match
                    .as_deref()
                    .is_some_and(|c| !etag_matches(c, &current.etag))
            {
                return Err(StoreError::PreconditionFailed);
            }
            let base = cluster_version(&current, "edit")?.cv;
            let mut attrs = current.attrs.clone();
            if let Some(f) = edit.take() {
                f(&mut attrs);
                // Kept for a retry: the edit is applied to the attributes once.
                let fixed = attrs.clone();
                edit = Some(Box::new(move |a| *a = fixed));
            }
            let mut wput = WirePut::default();
            wput.set_attrs(attrs);
            let header =
                serde_json::to_string(&wput).map_err(|e| StoreError::internal("edit", e))?;
            let pg = pg_of(bucket.id, key, self.map().pgs);
            let (ans, node) = self
                .call(
                    pg,
                    Target::Head,
                    Call {
                        method: Method::PATCH,
                        path: &format!("/o/{}/{pg}/{}?base={base}", bucket.id, encode(key)),
                        headers: &[(PUT_HEADER, header)],
                        body: Bytes::new(),
                    },
                )
                .await?;
            if ans.status != 200 {
                match ans.error().await {
                    StoreError::PreconditionFailed => continue,
                    e => return Err(e),
                }
            }
            let meta: WireMeta = ans.json().await?;
            return Ok(self.info_of(bucket, key, pg, node, meta, None));
        }
        Err(StoreError::Unavailable(
            "the object keeps changing; retry".into(),
        ))
    }

    async fn delete_object(&self, bucket: &Bucket, key: &str) -> StoreResult<Deleted> {
        let pg = pg_of(bucket.id, key, self.map().pgs);
        let versioning = WireVersioning::of(bucket.versioning);
        let mut path = format!("/o/{}/{pg}/{}", bucket.id, encode(key));
        if let Some(v) = versioning {
            path.push_str(&format!("?versioning={}", v.name()));
        }
        let (ans, _) = self
            .call(pg, Target::Head, Call::new(Method::DELETE, &path))
            .await?;
        if !(200..300).contains(&ans.status) {
            return Err(ans.error().await);
        }
        if versioning.is_none() {
            return Ok(Deleted::default());
        }
        // The delete marker the chain made.
        let marker: WireMeta = ans.json().await?;
        Ok(Deleted {
            version_id: Some(marker.version_id.unwrap_or_else(|| "null".into())),
            delete_marker: true,
        })
    }

    async fn find_version(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: Option<&str>,
    ) -> StoreResult<Option<FoundVersion>> {
        if bucket.versioning == Versioning::Unversioned {
            // Every object is its key's "null" version, the only one, as in an S3 bucket
            // that never had versioning.
            return match version_id {
                None | Some("null") => Ok(self
                    .head_object(bucket, key)
                    .await?
                    .map(|o| FoundVersion::Object(Box::new(o)))),
                // An id of the form this store makes names no version here.
                Some(id) if version_seq(id).is_some() => Ok(None),
                Some(_) => Err(StoreError::Invalid("Invalid version id specified".into())),
            };
        }
        let pg = pg_of(bucket.id, key, self.map().pgs);
        let which = match version_id {
            Some(id) => format!("version={}", encode(id)),
            None => "latest".to_string(),
        };
        let (ans, node) = self
            .call(
                pg,
                Target::Reader,
                Call {
                    method: Method::GET,
                    path: &format!(
                        "/o/{}/{pg}/{}?meta&{which}&inline={INLINE_MAX}",
                        bucket.id,
                        encode(key)
                    ),
                    headers: &[],
                    body: Bytes::new(),
                },
            )
            .await?;
        match ans.status {
            200 => {}
            404 => return Ok(None),
            _ => return Err(ans.error().await),
        }
        let (meta, inline) = Self::meta_answer(ans).await?;
        if meta.marker {
            return Ok(Some(FoundVersion::DeleteMarker {
                version_id: meta.version_id.unwrap_or_else(|| "null".into()),
                last_modified_ms: meta.put.last_modified_ms,
            }));
        }
        let by_id = meta.version_id.clone();
        let mut info = self.info_of(bucket, key, pg, node, meta, inline);
        if let Ok(v) = cluster_version(&info, "version") {
            let mut v = v.clone();
            v.by_id = by_id;
            info.version = ObjectVersion(Arc::new(v));
        }
        Ok(Some(FoundVersion::Object(Box::new(info))))
    }

    async fn delete_version(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        check: LockCheck,
    ) -> StoreResult<Deleted> {
        // The head judges the version's lock, once, at its clock; the other members remove
        // their copies as it decided.
        let LockCheck::Rules { bypass_governance } = check else {
            return Err(StoreError::Invalid(
                "a gateway's removal is judged by its chain's head".into(),
            ));
        };
        if version_id != "null" && version_seq(version_id).is_none() {
            return Err(StoreError::Invalid("Invalid version id specified".into()));
        }
        if bucket.versioning == Versioning::Unversioned {
            // Every object is its key's null version; no other version exists.
            if version_id == "null" {
                self.delete_object(bucket, key).await?;
            }
            return Ok(Deleted {
                version_id: Some(version_id.into()),
                delete_marker: false,
            });
        }
        let pg = pg_of(bucket.id, key, self.map().pgs);
        let mut path = format!(
            "/o/{}/{pg}/{}?version={}",
            bucket.id,
            encode(key),
            encode(version_id)
        );
        if bypass_governance {
            path.push_str("&bypass");
        }
        let (ans, _) = self
            .call(pg, Target::Head, Call::new(Method::DELETE, &path))
            .await?;
        if ans.status != 200 {
            return Err(ans.error().await);
        }
        let d: WireDeleted = ans.json().await?;
        Ok(Deleted {
            version_id: d.version_id,
            delete_marker: d.delete_marker,
        })
    }

    async fn update_lock(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: Option<&str>,
        change: LockChange,
        check: LockCheck,
    ) -> StoreResult<Option<ObjectLock>> {
        let LockCheck::Rules { bypass_governance } = check else {
            return Err(StoreError::Invalid(
                "a gateway's lock change is judged by its chain's head".into(),
            ));
        };
        if bucket.object_lock.is_none() {
            return Err(StoreError::InvalidBucketState(
                "Bucket is missing Object Lock Configuration".into(),
            ));
        }
        let pg = pg_of(bucket.id, key, self.map().pgs);
        let mut path = format!("/o/{}/{pg}/{}?lock", bucket.id, encode(key));
        if let Some(id) = version_id {
            path.push_str(&format!("&version={}", encode(id)));
        }
        if bypass_governance {
            path.push_str("&bypass");
        }
        let body = serde_json::to_vec(&WireLockChange::of(change))
            .map_err(|e| StoreError::internal("lock change", e))?;
        let (ans, _) = self
            .call(
                pg,
                Target::Head,
                Call {
                    method: Method::PUT,
                    path: &path,
                    headers: &[],
                    body: Bytes::from(body),
                },
            )
            .await?;
        match ans.status {
            200 => {
                let locked: WireLocked = ans.json().await?;
                Ok(Some(locked.lock()?))
            }
            404 => match ans.error().await {
                StoreError::NoSuchKey => Ok(None),
                e => Err(e),
            },
            _ => Err(ans.error().await),
        }
    }

    async fn set_version_tags(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        tags: Vec<(String, String)>,
    ) -> StoreResult<bool> {
        let body = serde_json::to_vec(&tags).map_err(|e| StoreError::internal("tags", e))?;
        let edit: AttrEdit = Box::new(move |a| a.tags = tags);
        self.change_version(bucket, key, version_id, edit, "tags", Bytes::from(body))
            .await
    }

    async fn set_version_class(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        class: &str,
        noncurrent_only: bool,
    ) -> StoreResult<bool> {
        if noncurrent_only && bucket.versioning == Versioning::Unversioned && version_id == "null" {
            // The null version is the key's only one, and current.
            return match self.head_object(bucket, key).await? {
                Some(_) => Err(StoreError::PreconditionFailed),
                None => Ok(false),
            };
        }
        let query = format!(
            "class={}{}",
            encode(class),
            if noncurrent_only { "&noncurrent" } else { "" }
        );
        let class = (class != "STANDARD").then(|| class.to_string());
        let edit: AttrEdit = Box::new(move |a| a.storage_class = class);
        self.change_version(bucket, key, version_id, edit, &query, Bytes::new())
            .await
    }

    async fn list_versions(
        &self,
        bucket: &Bucket,
        query: &VersionQuery,
    ) -> StoreResult<VersionPage> {
        if bucket.versioning != Versioning::Unversioned {
            return self.versions_page(bucket, query).await;
        }
        let page = self
            .list_objects(
                bucket,
                &ListQuery {
                    prefix: query.prefix.clone(),
                    delimiter: query.delimiter.clone(),
                    after: query.key_marker.clone(),
                    max_keys: query.max_keys,
                },
            )
            .await?;
        let next = page.truncated.then(|| page.last.clone()).flatten();
        Ok(VersionPage {
            next_version_id_marker: next
                .as_ref()
                .filter(|n| page.objects.last().is_some_and(|o| &o.key == *n))
                .map(|_| "null".to_string()),
            next_key_marker: next,
            versions: page
                .objects
                .into_iter()
                .map(|object| VersionSummary {
                    object,
                    version_id: "null".into(),
                    is_latest: true,
                    delete_marker: false,
                    // Object Lock needs versioning.
                    lock: None,
                    // Only copies between members compare them; a client's listing never
                    // shows them.
                    tags: Vec::new(),
                    acl: None,
                })
                .collect(),
            common_prefixes: page.common_prefixes,
            truncated: page.truncated,
        })
    }

    async fn create_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        new: NewUpload,
    ) -> StoreResult<Upload> {
        self.begin_upload(bucket, key, new).await
    }

    async fn upload(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
    ) -> StoreResult<Option<Upload>> {
        self.find_upload(bucket, key, upload_id).await
    }

    async fn upload_part(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        body: &mut dyn ByteSource,
        put: PutPart,
    ) -> StoreResult<Part> {
        self.put_part(bucket, key, upload_id, part_number, body, put)
            .await
    }

    async fn upload_part_copy(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        source: &ObjectInfo,
        range: std::ops::Range<u64>,
    ) -> StoreResult<Part> {
        self.copy_part(bucket, key, upload_id, part_number, source, range)
            .await
    }

    async fn complete_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletePart>,
        condition: &WriteCondition,
        _: &CompleteAs,
    ) -> StoreResult<ObjectInfo> {
        self.finish_upload(bucket, key, upload_id, parts, condition)
            .await
    }

    async fn abort_upload(&self, bucket: &Bucket, key: &str, upload_id: &str) -> StoreResult<()> {
        self.end_upload(bucket, key, upload_id).await
    }

    async fn list_parts(
        &self,
        upload: &Upload,
        bucket: &Bucket,
        after: u32,
        max: usize,
    ) -> StoreResult<(Vec<Part>, bool)> {
        self.parts_of(upload, bucket, after, max).await
    }

    async fn list_uploads(&self, bucket: &Bucket, query: &UploadQuery) -> StoreResult<UploadPage> {
        self.uploads_page(bucket, query).await
    }

    async fn list_objects(&self, bucket: &Bucket, query: &ListQuery) -> StoreResult<ObjectPage> {
        let map = self.map();
        let by_node = listing_plan(&map)?;
        let max = query.max_keys.max(1);
        let mut path_tail = format!("&max={max}&prefix={}", encode(&query.prefix));
        if let Some(d) = &query.delimiter {
            path_tail.push_str(&format!("&delimiter={}", encode(d)));
        }
        if let Some(a) = &query.after {
            path_tail.push_str(&format!("&after={}", encode(a)));
        }
        let pages: Vec<WirePage> = self
            .ask_nodes(&map, &format!("/l/{}", bucket.id), &by_node, &path_tail)
            .await?;
        // Entries are valid up to the smallest last entry of a truncated page.
        let limit: Option<String> = pages
            .iter()
            .filter(|p| p.truncated)
            .filter_map(|p| p.entries.last().map(|e| e.key.clone()))
            .min();
        let any_truncated = pages.iter().any(|p| p.truncated);
        let mut entries: Vec<crate::wire::WireEntry> =
            pages.into_iter().flat_map(|p| p.entries).collect();
        entries.sort_by(|a, b| a.key.cmp(&b.key));
        entries.dedup_by(|a, b| a.key == b.key);
        let mut page = ObjectPage::default();
        let mut taken = 0;
        for e in &entries {
            if limit.as_ref().is_some_and(|l| e.key > *l) || taken == max {
                break;
            }
            taken += 1;
            if e.prefix {
                page.common_prefixes.push(e.key.clone());
            } else {
                page.objects.push(e.summary());
            }
            page.last = Some(e.key.clone());
        }
        page.truncated = taken < entries.len() || any_truncated;
        Ok(page)
    }

    async fn tar_members(
        &self,
        _bucket: &Bucket,
        _key: &str,
        object: &ObjectInfo,
        names: &[String],
    ) -> StoreResult<Vec<Option<(u64, u64)>>> {
        let v = cluster_version(object, "members")?;
        let body = Bytes::from(
            serde_json::to_vec(names).map_err(|e| StoreError::internal("member names", e))?,
        );
        let path = format!(
            "/o/{}/{}/{}?members&cv={}",
            v.bucket_id,
            v.pg,
            encode(&v.key),
            v.cv
        );
        // The node that described the version indexes the archive (once: it keeps the index);
        // if it is gone, a caught-up member of the chain has the same bytes.
        let map = self.map();
        let mut nodes = vec![v.node.clone()];
        nodes.extend(map.readers(v.pg).filter(|n| **n != v.node).cloned());
        let mut last = StoreError::Unavailable("no member of the chain".into());
        for node in nodes {
            let Some(addr) = map.addr(&node) else {
                continue;
            };
            match self
                .client
                .send(
                    Call {
                        method: Method::POST,
                        path: &path,
                        headers: &[],
                        body: body.clone(),
                    },
                    addr,
                    map.epoch,
                    NODE_TIMEOUT,
                )
                .await
            {
                Ok(a) if a.status == 200 => return a.json().await,
                Ok(a) if a.status == 409 => {
                    last = StoreError::Unavailable(
                        "the object changed while it was read; retry".into(),
                    );
                }
                Ok(a) => return Err(a.error().await),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    async fn plan_batch(
        &self,
        bucket: &Bucket,
        items: Vec<BatchItem>,
        order: BatchOrder,
    ) -> StoreResult<BatchPlan> {
        batch_get::plan_batch(self, bucket, items, order).await
    }

    async fn read_batch(&self, plan: BatchPlan, sink: &mut dyn EntrySink) {
        batch_get::read_batch(self, plan, sink).await
    }

    async fn route_map(
        &self,
        bucket: &Bucket,
    ) -> StoreResult<Option<packrat_store_api::routes::RouteMap>> {
        let map = self.map();
        Ok(Some(packrat_store_api::routes::RouteMap {
            epoch: map.epoch,
            pgs: map.pgs,
            bucket_id: bucket.id,
            nodes: map
                .nodes
                .values()
                .filter_map(|n| Some((n.id.clone(), n.s3.clone()?)))
                .collect(),
            readers: (0..map.pgs)
                .map(|pg| map.readers(pg).cloned().collect())
                .collect(),
        }))
    }

    async fn stream_keys(
        &self,
        bucket: &Bucket,
        prefix: &str,
    ) -> StoreResult<packrat_store_api::stream::KeyList> {
        batch_get::stream_keys(self, bucket, prefix).await
    }

    fn batch_writer(&self, bucket: &Bucket) -> StoreResult<Box<dyn BatchWriter>> {
        // As on one server. With versioning, each member written is a version of its key
        // (the writes carry the bucket's versioning, as any PUT's).
        if bucket.object_lock.is_some() {
            return Err(StoreError::Invalid(
                "batch PUT into a bucket with Object Lock is not supported (its default retention would not be applied); use PutObject".into(),
            ));
        }
        let store = self
            .me
            .upgrade()
            .ok_or_else(|| StoreError::Unavailable("the gateway is stopping".into()))?;
        Ok(Box::new(batch_put::ClusterBatchWriter {
            store,
            bucket: bucket.clone(),
            now_ms: self.clock.now_ms(),
            members: Vec::new(),
            current: None,
            total: 0,
        }))
    }

    fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }
}

/// Stores a new access key in etcd; `Invalid` if it exists.
pub async fn put_key(etcd: &Etcd, key: &AccessKey) -> StoreResult<()> {
    let value = serde_json::to_vec(key).map_err(|e| StoreError::internal("access key", e))?;
    if !etcd
        .put_if(&format!("keys/{}", key.access_key), 0, value)
        .await
        .map_err(StoreError::Unavailable)?
    {
        return Err(StoreError::Invalid(format!(
            "access key {} already exists",
            key.access_key
        )));
    }
    Ok(())
}
