//! The storage node's internal API as both ends speak it: paths, headers, the JSON shapes of
//! object metadata and listings, and the HTTP client the gateway and the nodes use.
//!
//! Every request carries the cluster secret (`x-packrat-cluster-secret`) and the epoch of the
//! map it was routed by (`x-packrat-epoch`). S3 credentials mean nothing here. Only the
//! operators' `GET /metrics`, `/health/live` and `/health/ready` are answered without the
//! secret.
//!
//! | request | does |
//! |---|---|
//! | `PUT /o/{bucket id}/{pg}/{key}` | a chain write: at the head without `x-packrat-cv`, along the chain with it; [`WirePut`] in `x-packrat-put` carries the body's CRC32C and, from the head on, its MD5 |
//! | `DELETE /o/{bucket id}/{pg}/{key}` | a chain delete (a tombstone with the delete's version) |
//! | `PATCH /o/{bucket id}/{pg}/{key}?base=V` | a chain edit: version V gets the attributes in `x-packrat-put` (bytes untouched), as a new version |
//! | `GET /o/{bucket id}/{pg}/{key}?meta[&inline=N]` | the object's metadata ([`WireMeta`]); with `inline`, an object of at most N bytes comes whole, its metadata in `x-packrat-meta` |
//! | `GET /o/{bucket id}/{pg}/{key}?cv=V&start=S&end=E` | bytes `[S, E)` of version V |
//! | `POST /o/{bucket id}/{pg}/{key}?members&cv=V` | where the named TAR members lie in version V (JSON names in, `[[offset, size] or null]` out) |
//! | `GET /l/{bucket id}?pgs=..&prefix=..&after=..&delimiter=..&max=..` | a listing page of those PGs ([`WirePage`]) |
//! | `POST /b/{bucket id}?plan\|read[&order=storage][&crc]` | a node's share of a batch GET ([`WireBatchItem`]s in): with `plan` what it would send ([`WireBatchHead`]); with `read`, that and the entries ([`BatchRecord`]), read through the node's own batch plan; with `crc`, every part of the answer is followed by its CRC32C ([`BATCH_CRC_HEADER`]) |
//! | `POST /u/{bucket id}/{pg}/{key}?create&id=ID` | begins a multipart upload on the chain ([`WireUpload`]) |
//! | `PUT /u/{bucket id}/{pg}/{key}?id=ID&part=N` | a part, down the chain ([`WirePartPut`] in `x-packrat-put`, with the part's CRC32C and MD5 as a PUT's) |
//! | `POST /u/{bucket id}/{pg}/{key}?complete&id=ID` | completes it ([`WireComplete`]): a chain write with a version, as a PUT |
//! | `DELETE /u/{bucket id}/{pg}/{key}?id=ID` | aborts it on the chain |
//! | `GET /u/{bucket id}/{pg}/{key}?id=ID[&parts&after=N&max=M][&any]` | the upload and its parts, from the head (with `any`, from a caught-up member: a resync) ([`WireUploadState`]) |
//! | `GET /u/{bucket id}/{pg}/{key}?id=ID&copy` | what beginning the upload again elsewhere takes ([`WireUpload`]; a resync) |
//! | `GET /u/{bucket id}/{pg}/{key}?id=ID&part=N` | part N's bytes (a resync) |
//! | `POST /o/{bucket id}/{pg}/{key}?resend` | a step re-sent down the chain with its version: copied from the member before if missing ([`WireMeta`]) |
//! | `GET /ul/{bucket id}?pgs=..&prefix=..` | the uploads in progress of those PGs ([`WireUploadEntry`]; a gateway asks the heads) |
//! | `POST /g` | lookups gathered ([`GatherItem`]s in, a [`Gathered`] answer each, in order; with [`meta_codec::META_CODEC_HEADER`], the metadata in binary) |
//! | `GET /drain` | a catch-up's barrier: answered (204) once no chain step routed by a map older than the request's is under way at the node |
//! | `POST /w` | chain steps on `/o/` and `/u/` relayed together ([`crate::relay::RelayItem`]s in, each one's status and body out, in order) |
//!
//! Answers: 200 with the JSON or bytes; 404 for a missing object; 409 with a [`WireRefusal`]
//! when the request must go elsewhere (an old epoch, not the head, an uncommitted copy).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use packrat_store_api::batch::ItemRange;
use packrat_store_api::checksum::ChecksumAlgorithm;
use packrat_store_api::lock::{
    DefaultRetention, LockChange, LockConfig, LockMode, ObjectLock, Retention,
};
use packrat_store_api::{
    ObjectAttrs, ObjectChecksum, ObjectSummary, StoreError, StoreResult, WriteCondition,
};
use serde::{Deserialize, Serialize};
use std::time::Duration;

pub mod meta_codec;

pub const SECRET_HEADER: &str = "x-packrat-cluster-secret";
pub const EPOCH_HEADER: &str = "x-packrat-epoch";
pub const CV_HEADER: &str = "x-packrat-cv";
pub const PUT_HEADER: &str = "x-packrat-put";
/// The metadata of a small object whose bytes are the body (`?meta&inline=N`).
pub const META_HEADER: &str = "x-packrat-meta";
/// The user-metadata name a node keeps an object's cluster version under; gateways never show
/// it to clients.
pub const CV_META: &str = "packrat-cv";
/// Where a node keeps, in an object's user metadata, the MD5 of the bytes it stores when the
/// object's ETag shows another (an SSE-S3 object's shows its plaintext's MD5, as S3 does): a
/// copy between nodes is checked against the stored bytes' MD5.
pub const MD5_META: &str = "packrat-md5";
/// Where a node keeps, in an object's user metadata, the sequence of a version written while
/// its bucket had versioning (the write's `cv`, chosen by the head, so the same on every
/// replica; its id is that in 16 hex digits, or `null` when written while suspended). Kept
/// by attribute edits, whose own `cv` is newer: the version id stays. An object without it
/// is a plain one (its version id is `null`).
pub const VER_META: &str = "packrat-ver";

/// The sequence a version id names (`None` for `null` or an id a store never makes: it is a
/// sequence above 0 in 16 hex digits).
pub fn version_seq(id: &str) -> Option<u64> {
    (id.len() == 16 && id.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| u64::from_str_radix(id, 16).ok())
        .flatten()
        .filter(|s| *s != 0)
}

/// The versioning a write is made under (S3's bucket state at the gateway that took it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireVersioning {
    Enabled,
    Suspended,
}

impl WireVersioning {
    pub fn of(v: packrat_store_api::Versioning) -> Option<Self> {
        match v {
            packrat_store_api::Versioning::Unversioned => None,
            packrat_store_api::Versioning::Enabled => Some(Self::Enabled),
            packrat_store_api::Versioning::Suspended => Some(Self::Suspended),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Enabled => "enabled",
            Self::Suspended => "suspended",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "enabled" => Some(Self::Enabled),
            "suspended" => Some(Self::Suspended),
            _ => None,
        }
    }

    /// The version a write of version `cv` under this state is in a node's store.
    pub fn version_as(self, cv: u64) -> packrat_store_api::VersionAs {
        packrat_store_api::VersionAs {
            seq: cv,
            null: self == Self::Suspended,
        }
    }

    /// The version id S3 shows for version `cv` written under this state (see
    /// [`version_seq`] for the way back).
    pub fn version_id(self, cv: u64) -> String {
        match self {
            Self::Enabled => format!("{cv:016x}"),
            Self::Suspended => "null".into(),
        }
    }
}

/// What a write sets of an object, and how its bytes are checked (as `PutObject`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WirePut {
    pub last_modified_ms: i64,
    pub content_type: Option<String>,
    pub headers: Vec<(String, String)>,
    pub user_meta: Vec<(String, String)>,
    pub storage_class: Option<String>,
    pub tags: Vec<(String, String)>,
    pub checksum: Option<String>,
    /// Base64 of the checksum the client sent (up front or as a trailer).
    pub expected_checksum: Option<String>,
    pub content_md5: Option<String>,
    pub if_none_match_any: bool,
    pub if_match: Option<String>,
    /// Base64 of the MD5 the object's ETag shows when it is not the stored bytes' (see
    /// `ByteSource::shown_md5`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown_md5: Option<String>,
    /// The bucket's versioning, when it has some (see [`VER_META`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versioning: Option<WireVersioning>,
    /// CRC32C of the body as its sender holds it (a gateway, or the member before): the
    /// receiver refuses bytes that do not match (see `Node::check_body`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_crc32c: Option<u32>,
    /// Base64 of the body's MD5 as the chain's head computed it, handed down the chain with
    /// `body_crc32c`: a member whose bytes match the CRC takes it rather than hash them again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_md5: Option<String>,
}

/// The CRC32C a chain write's body is checked by at each hop ([`WirePut::body_crc32c`]), and
/// a node's answer by whoever reads it ([`ANSWER_CRC_HEADER`]).
pub fn body_crc32c(body: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, body) as u32
}

/// A running [`body_crc32c`], for bytes that come (or go) in pieces.
pub fn crc32c_digest() -> crc_fast::Digest {
    crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi)
}

/// The CRC32C of a node's answer body: a header on an answer sent whole, a trailer (announced
/// by `Trailer`) on one streamed. Whoever reads the answer checks it ([`Answer::bytes`],
/// [`AnswerCrc`]): the bytes between two processes are checked end to end, not by TCP alone.
pub const ANSWER_CRC_HEADER: &str = "x-packrat-answer-crc32c";

/// Answers from nodes this process refused because their bytes did not match their CRC32C.
pub static DAMAGED_ANSWERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn crc_in(v: Option<&http::HeaderValue>) -> Option<u32> {
    v?.to_str().ok()?.parse().ok()
}

/// Whether an answer's headers announce its CRC32C as a trailer.
fn crc_trails(headers: &http::HeaderMap) -> bool {
    headers
        .get_all(http::header::TRAILER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|n| n.trim().eq_ignore_ascii_case(ANSWER_CRC_HEADER))
}

/// Whether the CRC32C `got` of bytes received matches the one `sent` with them (none sent,
/// where one was announced, does not): a damaged answer is counted and refused.
fn crc_matches(sent: Option<u32>, got: u32) -> StoreResult<()> {
    if sent == Some(got) {
        return Ok(());
    }
    DAMAGED_ANSWERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    tracing::error!(
        ?sent,
        got,
        "a storage node's answer does not match its CRC32C: refused"
    );
    Err(StoreError::Unavailable(
        "a storage node's answer was damaged on its way (its CRC32C does not match); retry".into(),
    ))
}

/// The check of a streamed answer's bytes as they come: fed each data frame, then the
/// trailers; [`AnswerCrc::end`] fails if the bytes do not match, or the CRC announced never
/// came.
pub struct AnswerCrc {
    digest: Option<crc_fast::Digest>,
    sent: Option<u32>,
}

impl AnswerCrc {
    /// For an answer with `headers` (no check if it carries no CRC: an older node).
    pub fn new(headers: &http::HeaderMap) -> AnswerCrc {
        let sent = crc_in(headers.get(ANSWER_CRC_HEADER));
        let digest = (sent.is_some() || crc_trails(headers)).then(crc32c_digest);
        AnswerCrc { digest, sent }
    }

    pub fn data(&mut self, d: &[u8]) {
        if let Some(c) = self.digest.as_mut() {
            c.update(d);
        }
    }

    pub fn trailers(&mut self, t: &http::HeaderMap) {
        if let Some(v) = crc_in(t.get(ANSWER_CRC_HEADER)) {
            self.sent = Some(v);
        }
    }

    pub fn end(&self) -> StoreResult<()> {
        match &self.digest {
            Some(c) => crc_matches(self.sent, c.finalize() as u32),
            None => Ok(()),
        }
    }
}

/// Whether a user-metadata name is one a node keeps its own entries under.
pub fn is_node_meta(name: &str) -> bool {
    name == CV_META || name == MD5_META || name == VER_META
}

impl WirePut {
    /// The attributes a write sets, without user metadata under the names nodes keep their
    /// own entries under ([`CV_META`], [`MD5_META`]): a client's `x-amz-meta-packrat-cv` must
    /// not pass for a version, nor its `x-amz-meta-packrat-md5` for the stored bytes' MD5
    /// (copies between nodes would be checked against it). Such client entries are dropped.
    pub fn attrs(&self) -> ObjectAttrs {
        ObjectAttrs {
            last_modified_ms: self.last_modified_ms,
            content_type: self.content_type.clone(),
            headers: self.headers.clone(),
            user_meta: self
                .user_meta
                .iter()
                .filter(|(k, _)| !is_node_meta(k))
                .cloned()
                .collect(),
            storage_class: self.storage_class.clone(),
            tags: self.tags.clone(),
        }
    }

    /// As [`WirePut::attrs`], taking the strings rather than copying them.
    pub fn into_attrs(self) -> ObjectAttrs {
        let mut user_meta = self.user_meta;
        user_meta.retain(|(k, _)| !is_node_meta(k));
        ObjectAttrs {
            last_modified_ms: self.last_modified_ms,
            content_type: self.content_type,
            headers: self.headers,
            user_meta,
            storage_class: self.storage_class,
            tags: self.tags,
        }
    }

    pub fn set_attrs(&mut self, a: ObjectAttrs) {
        self.last_modified_ms = a.last_modified_ms;
        self.content_type = a.content_type;
        self.headers = a.headers;
        self.user_meta = a.user_meta;
        self.storage_class = a.storage_class;
        self.tags = a.tags;
    }

    pub fn condition(&self) -> WriteCondition {
        WriteCondition {
            if_none_match_any: self.if_none_match_any,
            if_match: self.if_match.clone(),
        }
    }

    pub fn checksum_algorithm(&self) -> StoreResult<Option<ChecksumAlgorithm>> {
        self.checksum
            .as_deref()
            .map(|n| {
                ChecksumAlgorithm::from_name(n)
                    .ok_or_else(|| StoreError::Invalid(format!("unknown checksum {n}")))
            })
            .transpose()
    }
}

/// A multipart upload as the gateway asks a PG's head to begin it
/// (`POST /u/{bucket id}/{pg}/{key}?create&id=ID`, this as the JSON body); every member of the
/// chain keeps it under the same id.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireUpload {
    pub owner_id: String,
    pub initiated_ms: i64,
    /// The object's attributes (the checks and conditions of `WirePut` are unused).
    pub put: WirePut,
    pub checksum: Option<String>,
    pub checksum_type: Option<String>,
}

/// An upload as a head describes it (`GET /u/...?id=ID[&parts&after=N&max=M]`): the upload
/// and, with `parts`, a page of its parts.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireUploadState {
    pub owner_id: String,
    pub initiated_ms: i64,
    pub storage_class: Option<String>,
    pub checksum: Option<String>,
    pub checksum_type: Option<String>,
    pub envelope: Option<String>,
    pub parts: Vec<WirePart>,
    pub truncated: bool,
}

/// One stored part.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WirePart {
    pub part_number: u32,
    pub etag: String,
    pub size: u64,
    pub last_modified_ms: i64,
    /// (algorithm, value, type) of the part's checksum.
    pub checksum: Option<(String, String, String)>,
}

/// How a part's bytes are checked (`PUT /u/...?id=ID&part=N`, in `x-packrat-put`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WirePartPut {
    pub checksum: Option<String>,
    pub expected_checksum: Option<String>,
    pub content_md5: Option<String>,
    /// As [`WirePut::body_crc32c`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_crc32c: Option<u32>,
    /// As [`WirePut::body_md5`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_md5: Option<String>,
}

/// CompleteMultipartUpload as the head gets it (`POST /u/...?complete&id=ID`, JSON body).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireComplete {
    pub parts: Vec<WireCompletePart>,
    pub if_none_match_any: bool,
    pub if_match: Option<String>,
    /// The bucket's versioning, when it has some (see [`VER_META`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versioning: Option<WireVersioning>,
}

/// A part as CompleteMultipartUpload names it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireCompletePart {
    pub number: u32,
    /// The ETag as the client sent it.
    pub etag: String,
    /// Checksums the client sent: algorithm and base64 value.
    pub checksums: Vec<(String, String)>,
}

/// One upload of a node's listing (`GET /ul/{bucket id}?pgs=..&prefix=..`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireUploadEntry {
    pub key: String,
    pub upload_id: String,
    pub owner_id: String,
    pub initiated_ms: i64,
    pub storage_class: Option<String>,
    pub checksum: Option<String>,
    pub checksum_type: Option<String>,
}

/// A page of a node's uploads in progress, in key and upload id order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireUploadPage {
    pub uploads: Vec<WireUploadEntry>,
    pub truncated: bool,
}

/// An object's metadata as a node answers it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireMeta {
    pub size: u64,
    pub etag: String,
    pub put: WirePut,
    /// (algorithm, value, type) of the stored flexible checksum.
    pub checksum: Option<(String, String, String)>,
    pub part_sizes: Vec<u64>,
    /// The version the PG's head gave the write; a tombstone has one too.
    pub cv: u64,
    /// Hex MD5 of the stored bytes when the ETag shows another ([`MD5_META`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stored_md5: Option<String>,
    /// The version's sequence in the node's store when it was written with versioning
    /// ([`VER_META`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_seq: Option<u64>,
    /// The version's id as S3 shows it (`null` for a plain object), to read it by; and
    /// whether it is a delete marker (then only `cv`, its sequence, and
    /// `put.last_modified_ms` mean anything).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version_id: Option<String>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub marker: bool,
}

impl WireMeta {
    pub fn object_checksum(&self) -> Option<ObjectChecksum> {
        self.checksum
            .clone()
            .map(|(algorithm, value, kind)| ObjectChecksum {
                algorithm,
                value,
                kind,
            })
    }
}

/// One entry of a node's listing page: an object or a common prefix, or (for a resync) a
/// tombstone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireEntry {
    pub key: String,
    #[serde(default)]
    pub prefix: bool,
    #[serde(default)]
    pub deleted: bool,
    pub size: u64,
    pub etag: String,
    pub last_modified_ms: i64,
    pub checksum: Option<(String, String)>,
    pub storage_class: Option<String>,
    pub cv: u64,
}

impl WireEntry {
    /// A listing's common prefix `cp`.
    pub fn common_prefix(cp: String) -> Self {
        WireEntry {
            key: cp,
            prefix: true,
            deleted: false,
            size: 0,
            etag: String::new(),
            last_modified_ms: 0,
            checksum: None,
            storage_class: None,
            cv: 0,
        }
    }

    /// Where a listing under `prefix` rolled up at `delimiter` resumes after `marker`: after
    /// everything under it when it is a common prefix. Answers whether it was one.
    pub fn resume_after_prefix(prefix: &str, delimiter: Option<&str>, marker: &mut String) -> bool {
        let Some(d) = delimiter else {
            return false;
        };
        let ends_prefix = marker
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.find(d).is_some_and(|i| i + d.len() == rest.len()));
        if ends_prefix {
            marker.push(char::MAX);
        }
        ends_prefix
    }

    pub fn summary(&self) -> ObjectSummary {
        ObjectSummary {
            key: self.key.clone(),
            size: self.size,
            etag: self.etag.clone(),
            last_modified_ms: self.last_modified_ms,
            checksum: self.checksum.clone(),
            storage_class: self.storage_class.clone(),
        }
    }
}

/// One entry of a node's version listing (`GET /lv/{bucket id}`), or of one key's versions
/// (`?versions`): a version (object or delete marker) or a common prefix, newest first within
/// a key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireVersionEntry {
    #[serde(flatten)]
    pub entry: WireEntry,
    #[serde(default)]
    pub version_id: String,
    #[serde(default)]
    pub latest: bool,
    #[serde(default)]
    pub marker: bool,
    /// The version's Object Lock as stored (`VersionSummary::lock`): copies between members
    /// compare it too, so a lock changed while a member was away is caught up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lock: Option<String>,
    /// The version's tags (`VersionSummary::tags`), compared for the same reason: a version's
    /// tags can be changed by id while a member is away.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tags: Vec<(String, String)>,
    /// The version's object ACL as stored (`VersionSummary::acl`), compared for the same
    /// reason: PutObjectAcl edits a version in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acl: Option<String>,
}

/// A bucket's Object Lock configuration in its etcd record: enabled (for good), with the
/// default retention if one is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct WireLockConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<WireLockMode>,
    #[serde(default)]
    pub days: u32,
    #[serde(default)]
    pub years: u32,
}

/// A retention mode on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireLockMode {
    Governance,
    Compliance,
}

impl WireLockMode {
    fn of(m: LockMode) -> Self {
        match m {
            LockMode::Governance => Self::Governance,
            LockMode::Compliance => Self::Compliance,
        }
    }

    fn mode(self) -> LockMode {
        match self {
            Self::Governance => LockMode::Governance,
            Self::Compliance => LockMode::Compliance,
        }
    }
}

impl WireLockConfig {
    pub fn of(c: &LockConfig) -> Self {
        match c.default_retention {
            None => Self::default(),
            Some(d) => Self {
                mode: Some(WireLockMode::of(d.mode)),
                days: d.days,
                years: d.years,
            },
        }
    }

    pub fn config(&self) -> LockConfig {
        LockConfig {
            default_retention: self.mode.map(|m| DefaultRetention {
                mode: m.mode(),
                days: self.days,
                years: self.years,
            }),
        }
    }
}

/// A change of a version's lock as a chain step carries it (`PUT /o/..?lock&version=ID`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireLockChange {
    /// A new retention (mode and end, ms since the epoch), or none.
    Retention(Option<(WireLockMode, i64)>),
    LegalHold(bool),
}

impl WireLockChange {
    pub fn of(c: LockChange) -> Self {
        match c {
            LockChange::Retention(r) => {
                Self::Retention(r.map(|r| (WireLockMode::of(r.mode), r.until_ms)))
            }
            LockChange::LegalHold(on) => Self::LegalHold(on),
        }
    }

    pub fn change(self) -> LockChange {
        match self {
            Self::Retention(r) => LockChange::Retention(r.map(|(mode, until_ms)| Retention {
                mode: mode.mode(),
                until_ms,
            })),
            Self::LegalHold(on) => LockChange::LegalHold(on),
        }
    }
}

/// What a lock change left (`PUT /o/..?lock`): the version it changed and its lock now, as
/// stored (`None` once nothing is kept).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireLocked {
    pub version_id: String,
    pub lock: Option<String>,
}

impl WireLocked {
    /// The lock, read back.
    pub fn lock(&self) -> StoreResult<ObjectLock> {
        self.lock
            .as_deref()
            .map_or(Ok(ObjectLock::default()), ObjectLock::from_stored)
            .map_err(|e| StoreError::internal("object lock", e))
    }
}

/// What a delete by version id removed (`DELETE /o/..?version=ID`).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireDeleted {
    pub version_id: Option<String>,
    pub delete_marker: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireVersionPage {
    pub entries: Vec<WireVersionEntry>,
    /// More entries follow the last one.
    pub truncated: bool,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WirePage {
    pub entries: Vec<WireEntry>,
    /// More entries follow the last one.
    pub truncated: bool,
}

/// One item of a node's share of a batch GET: `POST /b/{bucket id}?plan|read[&order=storage]`
/// with a JSON array of these (at most [`BATCH_ITEMS_MAX`]). The gateway sends them borrowed
/// from its plan (`S = &str`); the node reads them owned.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireBatchItem<S = String> {
    pub pg: u32,
    pub key: S,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member: Option<S>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub range: Option<WireRange>,
}

/// An item's range as asked (see `ItemRange`).
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub enum WireRange {
    From(u64, Option<u64>),
    Suffix(u64),
}

impl From<ItemRange> for WireRange {
    fn from(r: ItemRange) -> Self {
        match r {
            ItemRange::From(a, b) => WireRange::From(a, b),
            ItemRange::Suffix(n) => WireRange::Suffix(n),
        }
    }
}

impl From<WireRange> for ItemRange {
    fn from(r: WireRange) -> Self {
        match r {
            WireRange::From(a, b) => ItemRange::From(a, b),
            WireRange::Suffix(n) => ItemRange::Suffix(n),
        }
    }
}

/// Set (to `1`) on a node's batch answer when it carries CRCs, which the gateway asks for with
/// `crc` in the query: a 4-byte big-endian CRC32C after the head's JSON, after each record's
/// header, and after each entry's payload ([`BatchRecord`]). Entries go on to the client as
/// they arrive, so one CRC for the whole answer (a trailer, as other streamed answers carry)
/// would come too late; each payload is checked before it is handed on (a large one's last
/// piece is held back until its CRC has matched). An older node, which sends none, is read
/// unchecked.
pub const BATCH_CRC_HEADER: &str = "x-packrat-batch-crc32c";

/// Appends the CRC32C of `out[from..]` to `out` (see [`BATCH_CRC_HEADER`]).
pub fn put_crc_of(out: &mut bytes::BytesMut, from: usize) {
    let crc = body_crc32c(&out[from..]);
    out.extend_from_slice(&crc.to_be_bytes());
}

/// The check of `got` (the CRC32C of bytes received) against the 4 bytes `sent` after them.
pub fn check_crc(sent: &[u8], got: u32) -> StoreResult<()> {
    crc_matches(<[u8; 4]>::try_from(sent).map(u32::from_be_bytes).ok(), got)
}

/// Items one node batch may name.
pub const BATCH_ITEMS_MAX: usize = 4096;

/// How a node answers its share of a batch GET, before any entry: the payload bytes of what it
/// will send, and the items (positions in the request) it may not answer for (its copy is
/// dirty, or it is not a caught-up member of the item's PG), which the gateway then asks for
/// alone, the way a GET does. The answer's body starts with a 4-byte big-endian length and
/// that many bytes of this as JSON; with `read`, the entries follow (see [`BatchRecord`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WireBatchHead {
    pub bytes: u64,
    pub refused: Vec<u32>,
}

/// The record that ends a node's batch answer (in the place of an item's position).
const BATCH_END: u32 = u32::MAX;
const RECORD_ENTRY: u8 = 0;
const RECORD_ERROR: u8 = 1;
/// Bytes of an entry record before its etag: position, kind, size, mtime, etag length.
const ENTRY_HEAD_BYTES: usize = 4 + 1 + 8 + 8 + 2;

/// One record of a node's batch answer after its head, in the order the node emits them. An
/// entry is `u32 position, u8 0, u64 size, i64 mtime (ms), u16 etag length, etag`, then
/// `size` payload bytes; an error is `u32 position, u8 1, u32 length`, then that many bytes
/// of a [`WireError`] as JSON; the answer ends with `u32::MAX` (a body that stops before it
/// was cut). All integers big-endian. In an answer that carries CRCs ([`BATCH_CRC_HEADER`]),
/// the head's JSON, each record's header (an error's with its JSON) and each entry's payload
/// are each followed by their CRC32C.
#[derive(Debug)]
pub enum BatchRecord {
    Entry {
        at: u32,
        size: u64,
        mtime_ms: i64,
        etag: String,
    },
    Error {
        at: u32,
        error: WireError,
    },
    End,
}

impl BatchRecord {
    /// Writes an entry record's header (its payload follows).
    pub fn put_entry(out: &mut bytes::BytesMut, at: u32, size: u64, mtime_ms: i64, etag: &str) {
        let etag = &etag.as_bytes()[..etag.len().min(u16::MAX as usize)];
        out.extend_from_slice(&at.to_be_bytes());
        out.extend_from_slice(&[RECORD_ENTRY]);
        out.extend_from_slice(&size.to_be_bytes());
        out.extend_from_slice(&mtime_ms.to_be_bytes());
        out.extend_from_slice(&(etag.len() as u16).to_be_bytes());
        out.extend_from_slice(etag);
    }

    pub fn put_error(out: &mut bytes::BytesMut, at: u32, e: &StoreError) {
        let json = serde_json::to_vec(&WireError::of(e).1).unwrap_or_default();
        out.extend_from_slice(&at.to_be_bytes());
        out.extend_from_slice(&[RECORD_ERROR]);
        out.extend_from_slice(&(json.len() as u32).to_be_bytes());
        out.extend_from_slice(&json);
    }

    pub fn put_end(out: &mut bytes::BytesMut) {
        out.extend_from_slice(&BATCH_END.to_be_bytes());
    }

    /// How many bytes the record starting at `b` takes before any payload, as far as `b`
    /// tells: called with at least that many bytes, it answers the same number; with fewer,
    /// a larger one (read that many and ask again). `Err` if it is not a record.
    pub fn head_len(b: &[u8]) -> StoreResult<usize> {
        if b.len() < 4 {
            return Ok(4);
        }
        if b[..4] == BATCH_END.to_be_bytes() {
            return Ok(4);
        }
        let (fixed, at) = match b.get(4) {
            None => return Ok(5),
            Some(&RECORD_ENTRY) => (ENTRY_HEAD_BYTES, ENTRY_HEAD_BYTES - 2),
            Some(&RECORD_ERROR) => (9, 5),
            Some(k) => return Err(bad_answer(format!("a record of kind {k}"))),
        };
        if b.len() < fixed {
            return Ok(fixed);
        }
        let n = if fixed == 9 {
            u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]]) as usize
        } else {
            u16::from_be_bytes([b[at], b[at + 1]]) as usize
        };
        Ok(fixed + n)
    }

    /// Parses a record's header (exactly the [`Self::head_len`] bytes).
    pub fn parse(b: &[u8]) -> StoreResult<BatchRecord> {
        let be64 = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            x
        };
        let at = u32::from_be_bytes([b[0], b[1], b[2], b[3]]);
        if at == BATCH_END {
            return Ok(BatchRecord::End);
        }
        match b[4] {
            RECORD_ENTRY => Ok(BatchRecord::Entry {
                at,
                size: u64::from_be_bytes(be64(5)),
                mtime_ms: i64::from_be_bytes(be64(13)),
                etag: String::from_utf8_lossy(&b[ENTRY_HEAD_BYTES..]).into_owned(),
            }),
            _ => Ok(BatchRecord::Error {
                at,
                error: serde_json::from_slice(&b[9..])
                    .map_err(|e| bad_answer(format!("an error record: {e}")))?,
            }),
        }
    }
}

fn bad_answer(what: String) -> StoreError {
    StoreError::Unavailable(format!("storage node: a malformed batch answer ({what})"))
}

/// Why a node sent a request elsewhere (409).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireRefusal {
    pub reason: String,
    /// The node's map epoch.
    pub epoch: u64,
}

/// A store error as it crosses the wire (status 4xx/5xx with this JSON).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WireError {
    pub kind: String,
    pub detail: String,
}

impl WireError {
    pub fn of(e: &StoreError) -> (u16, WireError) {
        let (status, kind) = match e {
            StoreError::NoSuchKey => (404, "NoSuchKey"),
            StoreError::NoSuchBucket => (404, "NoSuchBucket"),
            StoreError::PreconditionFailed => (412, "PreconditionFailed"),
            StoreError::BadDigest(packrat_store_api::Digest::ContentMd5) => (400, "BadDigestMd5"),
            StoreError::BadDigest(packrat_store_api::Digest::Checksum(a)) => (400, a.name()),
            StoreError::RangeNotSatisfiable { .. } => (416, "RangeNotSatisfiable"),
            StoreError::InsufficientStorage(_) => (507, "InsufficientStorage"),
            StoreError::Invalid(_) => (400, "Invalid"),
            StoreError::NoSuchUpload => (404, "NoSuchUpload"),
            StoreError::NoSuchMember(_) => (404, "NoSuchMember"),
            StoreError::InvalidPart(_) => (400, "InvalidPart"),
            StoreError::InvalidPartOrder => (400, "InvalidPartOrder"),
            StoreError::EntityTooSmall => (400, "EntityTooSmall"),
            StoreError::Unavailable(_) => (503, "Unavailable"),
            StoreError::ObjectLocked(_) => (403, "ObjectLocked"),
            StoreError::Corrupt(_) | StoreError::Unrecoverable(_) | StoreError::TierData(_) => {
                (500, "Corrupt")
            }
            _ => (500, "Internal"),
        };
        let detail = match e {
            // The text is the client's, passed on as it is.
            StoreError::InvalidPart(m) | StoreError::Invalid(m) | StoreError::NoSuchMember(m) => {
                m.clone()
            }
            e => e.to_string(),
        };
        (
            status,
            WireError {
                kind: kind.to_string(),
                detail,
            },
        )
    }

    pub fn into_store_error(self) -> StoreError {
        match self.kind.as_str() {
            "NoSuchKey" => StoreError::NoSuchKey,
            "NoSuchBucket" => StoreError::NoSuchBucket,
            "PreconditionFailed" => StoreError::PreconditionFailed,
            "BadDigestMd5" => StoreError::BadDigest(packrat_store_api::Digest::ContentMd5),
            "Invalid" => StoreError::Invalid(self.detail),
            "NoSuchUpload" => StoreError::NoSuchUpload,
            "NoSuchMember" => StoreError::NoSuchMember(self.detail),
            "InvalidPart" => StoreError::InvalidPart(self.detail),
            "InvalidPartOrder" => StoreError::InvalidPartOrder,
            "EntityTooSmall" => StoreError::EntityTooSmall,
            "Unavailable" => StoreError::Unavailable(self.detail),
            "InsufficientStorage" => StoreError::InsufficientStorage(self.detail),
            "Corrupt" => StoreError::Corrupt(self.detail),
            // The reason's text is the one the lock module gives (the client reads it).
            "ObjectLocked" => StoreError::ObjectLocked(packrat_store_api::lock::PROTECTED),
            k => match ChecksumAlgorithm::from_name(k) {
                Some(a) => StoreError::BadDigest(packrat_store_api::Digest::Checksum(a)),
                None => StoreError::internal("storage node", self.detail),
            },
        }
    }
}

/// Most lookups in one gathered request (`POST /g`).
pub const GATHER_ITEMS_MAX: usize = 256;
const GATHER_FOUND: u8 = 0;
const GATHER_FOUND_BYTES: u8 = 1;
const GATHER_MISSING: u8 = 2;
const GATHER_ALONE: u8 = 3;
/// As `GATHER_FOUND` and `GATHER_FOUND_BYTES`, the metadata in [`meta_codec`]'s version 1,
/// answered to a gateway that asks for it.
const GATHER_FOUND_BIN: u8 = 4;
const GATHER_FOUND_BYTES_BIN: u8 = 5;

/// One object lookup of a gathered request (`POST /g`): the GETs and HEADs a gateway has for
/// one node while other lookups to it are under way go to it as one request (see
/// `ClusterStore::lookup`). Written `u64 bucket id, u32 PG, u64 inline limit, u32 key length,
/// key`, big-endian, one after another.
#[derive(Debug, Clone, PartialEq)]
pub struct GatherItem {
    pub bid: u64,
    pub pg: u32,
    /// The object's bytes come with its metadata when it has 1 to this many.
    pub inline: u64,
    pub key: String,
}

impl GatherItem {
    pub fn put(&self, out: &mut bytes::BytesMut) {
        out.extend_from_slice(&self.bid.to_be_bytes());
        out.extend_from_slice(&self.pg.to_be_bytes());
        out.extend_from_slice(&self.inline.to_be_bytes());
        out.extend_from_slice(&(self.key.len() as u32).to_be_bytes());
        out.extend_from_slice(self.key.as_bytes());
    }

    /// The items of a request body, at most [`GATHER_ITEMS_MAX`].
    pub fn parse_all(mut b: &[u8]) -> StoreResult<Vec<GatherItem>> {
        let bad = |what: &str| StoreError::Invalid(format!("bad gathered lookup: {what}"));
        let mut items = Vec::new();
        while !b.is_empty() {
            if items.len() == GATHER_ITEMS_MAX {
                return Err(bad("too many items"));
            }
            let head = b.get(..24).ok_or_else(|| bad("cut"))?;
            let n = u32::from_be_bytes(head[20..24].try_into().unwrap_or_default()) as usize;
            let key = b.get(24..24 + n).ok_or_else(|| bad("cut key"))?;
            items.push(GatherItem {
                bid: u64::from_be_bytes(head[..8].try_into().unwrap_or_default()),
                pg: u32::from_be_bytes(head[8..12].try_into().unwrap_or_default()),
                inline: u64::from_be_bytes(head[12..20].try_into().unwrap_or_default()),
                key: std::str::from_utf8(key)
                    .map_err(|_| bad("key not UTF-8"))?
                    .to_string(),
            });
            b = &b[24 + n..];
        }
        Ok(items)
    }
}

/// A node's answer to one [`GatherItem`], in the order asked: `u8 kind, u32 length, u64
/// byte count`, then `length` bytes (the [`WireMeta`] as JSON, or in [`meta_codec`]'s binary
/// when the request asked for it with [`meta_codec::META_CODEC_HEADER`], or why the item must
/// be asked alone) and the object's bytes when it came with them.
#[derive(Debug)]
pub enum Gathered {
    Found {
        meta: Box<WireMeta>,
        inline: Option<Bytes>,
    },
    /// No such key (or bucket) on the node: the answer a lookup alone gets as 404.
    Missing,
    /// Anything else (a dirty copy, a node not a reader, an error): the gateway asks for this
    /// one alone, where the refusal is followed (to the tail, or another member) or the
    /// error answered.
    Alone(String),
}

impl Gathered {
    pub fn put_found(out: &mut bytes::BytesMut, meta: &[u8], bytes: Option<&[u8]>) {
        Self::put_found_as(out, (GATHER_FOUND, GATHER_FOUND_BYTES), bytes, |o| {
            o.extend_from_slice(meta)
        });
    }

    /// As [`Gathered::put_found`], the metadata written in binary ([`meta_codec`]) straight
    /// into `out`.
    pub fn put_found_bin(out: &mut bytes::BytesMut, meta: &WireMeta, bytes: Option<&[u8]>) {
        Self::put_found_as(
            out,
            (GATHER_FOUND_BIN, GATHER_FOUND_BYTES_BIN),
            bytes,
            |o| meta_codec::encode(meta, o),
        );
    }

    /// A found answer: `kinds` without and with the object's bytes, the metadata as
    /// `write_meta` writes it (its length filled in after).
    fn put_found_as(
        out: &mut bytes::BytesMut,
        kinds: (u8, u8),
        bytes: Option<&[u8]>,
        write_meta: impl FnOnce(&mut bytes::BytesMut),
    ) {
        out.extend_from_slice(&[if bytes.is_some() { kinds.1 } else { kinds.0 }]);
        let bytes = bytes.unwrap_or_default();
        let len_at = out.len();
        out.extend_from_slice(&[0; 4]);
        out.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        let meta_at = out.len();
        write_meta(out);
        let len = (out.len() - meta_at) as u32;
        out[len_at..len_at + 4].copy_from_slice(&len.to_be_bytes());
        out.extend_from_slice(bytes);
    }

    pub fn put_missing(out: &mut bytes::BytesMut) {
        out.extend_from_slice(&[GATHER_MISSING]);
        out.extend_from_slice(&[0; 12]);
    }

    pub fn put_alone(out: &mut bytes::BytesMut, why: &str) {
        out.extend_from_slice(&[GATHER_ALONE]);
        out.extend_from_slice(&(why.len() as u32).to_be_bytes());
        out.extend_from_slice(&0u64.to_be_bytes());
        out.extend_from_slice(why.as_bytes());
    }

    /// The `n` answers of a node's body (an object's bytes are slices of it, not copies).
    pub fn parse_all(b: Bytes, n: usize) -> StoreResult<Vec<Gathered>> {
        let cut = || StoreError::Unavailable("storage node: a cut gathered answer".into());
        let mut out = Vec::with_capacity(n);
        let mut at = 0;
        while out.len() < n {
            let head = b.get(at..at + 13).ok_or_else(cut)?;
            let len = u32::from_be_bytes(head[1..5].try_into().unwrap_or_default()) as usize;
            let count = u64::from_be_bytes(head[5..13].try_into().unwrap_or_default());
            let text_end = at + 13 + len;
            let end = usize::try_from(count)
                .ok()
                .and_then(|c| text_end.checked_add(c))
                .filter(|e| *e <= b.len())
                .ok_or_else(cut)?;
            let text = &b[at + 13..text_end];
            out.push(match head[0] {
                GATHER_FOUND | GATHER_FOUND_BYTES => Gathered::Found {
                    meta: Box::new(
                        serde_json::from_slice(text)
                            .map_err(|e| StoreError::internal("storage node answer", e))?,
                    ),
                    inline: (head[0] == GATHER_FOUND_BYTES).then(|| b.slice(text_end..end)),
                },
                GATHER_FOUND_BIN | GATHER_FOUND_BYTES_BIN => Gathered::Found {
                    meta: Box::new(
                        meta_codec::decode(text)
                            .map_err(|e| StoreError::internal("storage node answer", e))?,
                    ),
                    inline: (head[0] == GATHER_FOUND_BYTES_BIN).then(|| b.slice(text_end..end)),
                },
                GATHER_MISSING => Gathered::Missing,
                GATHER_ALONE => Gathered::Alone(String::from_utf8_lossy(text).into_owned()),
                k => {
                    return Err(StoreError::internal(
                        "storage node answer",
                        format!("unknown gathered answer kind {k}"),
                    ));
                }
            });
            at = end;
        }
        if at != b.len() {
            return Err(StoreError::internal(
                "storage node answer",
                "bytes after the last gathered answer",
            ));
        }
        Ok(out)
    }
}

pub type NodeBody = Full<Bytes>;

/// How long one node may take to answer a write of `bytes` to its successor: a hung node (a
/// stopped process, a machine that stalls) must not hold writes for longer than a failover.
pub fn hop_timeout(bytes: usize) -> Duration {
    Duration::from_secs(3) + Duration::from_secs_f64(bytes as f64 / (32.0 * 1024.0 * 1024.0))
}

/// How long a pooled connection to a node stays open unused.
pub const POOL_IDLE: Duration = Duration::from_secs(30);

/// How long a read may wait for a node's answer to start before another replica is tried.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

/// The internal API's HTTP client: pooled keep-alive connections to every node.
#[derive(Clone)]
pub struct NodeClient {
    http: Client<HttpConnector, NodeBody>,
    secret: String,
}

/// A node's answer.
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: AnswerBody,
}

/// An answer's body: as it arrives, or whole (one of a relayed request's answers, see
/// [`crate::relay`]).
pub type AnswerBody = http_body_util::Either<hyper::body::Incoming, Full<Bytes>>;

impl Answer {
    /// An answer already received whole (no headers).
    pub fn whole(status: u16, body: Bytes) -> Answer {
        Answer {
            status,
            headers: http::HeaderMap::new(),
            body: http_body_util::Either::Right(Full::new(body)),
        }
    }

    /// The whole body, checked against the CRC32C the node sent with it.
    pub async fn bytes(self) -> StoreResult<Bytes> {
        let mut crc = AnswerCrc::new(&self.headers);
        let collected = self
            .body
            .collect()
            .await
            .map_err(|e| StoreError::Unavailable(format!("storage node: {e}")))?;
        if let Some(t) = collected.trailers() {
            crc.trailers(t);
        }
        let b = collected.to_bytes();
        crc.data(&b);
        crc.end()?;
        Ok(b)
    }

    pub async fn json<T: serde::de::DeserializeOwned>(self) -> StoreResult<T> {
        let b = self.bytes().await?;
        serde_json::from_slice(&b).map_err(|e| StoreError::internal("storage node answer", e))
    }

    /// The store error a 4xx/5xx answer carries.
    pub async fn error(self) -> StoreError {
        let status = self.status;
        match self.bytes().await {
            Ok(b) => match serde_json::from_slice::<WireError>(&b) {
                Ok(e) => e.into_store_error(),
                Err(_) => StoreError::Unavailable(format!(
                    "storage node answered {status}: {}",
                    String::from_utf8_lossy(&b)
                )),
            },
            Err(e) => e,
        }
    }
}

impl NodeClient {
    pub fn new(secret: String) -> Self {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(Duration::from_secs(2)));
        // A pooled connection to a node cut off by the network is found dead by the kernel's
        // keepalive probes, not kept for a request to hang on until its timeout.
        connector.set_keepalive(Some(Duration::from_secs(5)));
        connector.set_keepalive_interval(Some(Duration::from_secs(2)));
        connector.set_keepalive_retries(Some(3));
        let http = Client::builder(hyper_util::rt::TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        NodeClient { http, secret }
    }

    /// Sends a request to the node at `addr`. Connection failures (a dead node) are
    /// `Unavailable`; so is a node that does not answer within `timeout`.
    #[allow(clippy::too_many_arguments)]
    pub async fn send(
        &self,
        method: http::Method,
        addr: &str,
        path_and_query: &str,
        epoch: u64,
        headers: &[(&str, String)],
        body: Bytes,
        timeout: Duration,
    ) -> StoreResult<Answer> {
        let mut req = http::Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path_and_query}"))
            .header(SECRET_HEADER, &self.secret)
            .header(EPOCH_HEADER, epoch.to_string())
            // A streamed answer's CRC32C comes as a trailer (see `ANSWER_CRC_HEADER`).
            .header(http::header::TE, "trailers");
        for (k, v) in headers {
            req = req.header(*k, v);
        }
        let req = req
            .body(Full::new(body))
            .map_err(|e| StoreError::internal("node request", e))?;
        let resp = tokio::time::timeout(timeout, self.http.request(req))
            .await
            .map_err(|_| StoreError::Unavailable(format!("storage node {addr} did not answer")))?
            .map_err(|e| StoreError::Unavailable(format!("storage node {addr}: {e}")))?;
        let (parts, body) = resp.into_parts();
        Ok(Answer {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body: http_body_util::Either::Left(body),
        })
    }
}

/// Everything but unreserved characters and `/` is escaped in keys put in paths and queries.
const KEY_SET: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~')
    .remove(b'/');

pub fn encode(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, KEY_SET).to_string()
}

/// The inverse of [`encode`]; `None` if the result is not UTF-8.
pub fn decode(s: &str) -> Option<String> {
    percent_encoding::percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_is_checked_whole_or_in_pieces() {
        let body = b"a storage node's answer, in pieces".as_slice();
        let mut headers = http::HeaderMap::new();
        headers.insert(
            ANSWER_CRC_HEADER,
            http::HeaderValue::from(body_crc32c(body)),
        );
        let mut whole = AnswerCrc::new(&headers);
        whole.data(body);
        assert!(whole.end().is_ok());
        // Announced as a trailer, fed in pieces.
        let mut announced = http::HeaderMap::new();
        announced.insert(http::header::TRAILER, ANSWER_CRC_HEADER.parse().unwrap());
        let mut pieces = AnswerCrc::new(&announced);
        pieces.data(&body[..5]);
        pieces.data(&body[5..]);
        assert!(pieces.end().is_err(), "the trailer never came");
        pieces.trailers(&headers);
        assert!(pieces.end().is_ok());
        let mut damaged = AnswerCrc::new(&headers);
        damaged.data(b"a storage node's answer, in pieceS");
        assert!(damaged.end().is_err());
        for n in [0usize, 1, 15, 16, 63, 64, 255, 256, 4096, 65536] {
            let big: Vec<u8> = (0..n).map(|i| (i * 7 + 3) as u8).collect();
            let mut h = http::HeaderMap::new();
            h.insert(
                ANSWER_CRC_HEADER,
                http::HeaderValue::from(body_crc32c(&big)),
            );
            let mut c = AnswerCrc::new(&h);
            c.data(&big);
            assert!(c.end().is_ok(), "{n} bytes");
        }
        // An answer without a CRC (an older node) is not checked.
        assert!(AnswerCrc::new(&http::HeaderMap::new()).end().is_ok());
    }

    /// Gathered lookups and their answers read back as written; a cut answer, bytes after
    /// the last answer and a cut request are errors, never items.
    #[test]
    fn gathered_lookups_and_answers_read_back_as_written() {
        let items = vec![
            GatherItem {
                bid: 7,
                pg: 3,
                inline: 65536,
                key: "a/b.jpg".into(),
            },
            GatherItem {
                bid: u64::MAX,
                pg: 0,
                inline: 0,
                key: String::new(),
            },
        ];
        let mut body = bytes::BytesMut::new();
        for it in &items {
            it.put(&mut body);
        }
        assert_eq!(GatherItem::parse_all(&body).unwrap(), items);
        assert!(GatherItem::parse_all(&body[..body.len() - 1]).is_err());
        assert!(GatherItem::parse_all(&body[..30]).is_err());

        let meta = WireMeta {
            size: 3,
            etag: "e".into(),
            put: WirePut::default(),
            checksum: None,
            part_sizes: vec![],
            cv: 42,
            ..Default::default()
        };
        let json = serde_json::to_vec(&meta).unwrap();
        let mut out = bytes::BytesMut::new();
        Gathered::put_found(&mut out, &json, Some(b"xyz"));
        Gathered::put_missing(&mut out);
        Gathered::put_alone(&mut out, "dirty: ask the tail");
        Gathered::put_found(&mut out, &json, None);
        Gathered::put_found(&mut out, &json, Some(b""));
        let b = out.freeze();
        let got = Gathered::parse_all(b.clone(), 5).unwrap();
        assert!(
            matches!(&got[0], Gathered::Found { meta, inline: Some(i) } if meta.cv == 42 && &i[..] == b"xyz")
        );
        assert!(matches!(got[1], Gathered::Missing));
        assert!(matches!(&got[2], Gathered::Alone(w) if w == "dirty: ask the tail"));
        assert!(matches!(&got[3], Gathered::Found { inline: None, .. }));
        assert!(matches!(&got[4], Gathered::Found { inline: Some(i), .. } if i.is_empty()));
        // Fewer answers than asked, more bytes than answered, a cut body.
        assert!(Gathered::parse_all(b.clone(), 6).is_err());
        assert!(Gathered::parse_all(b.clone(), 4).is_err());
        assert!(Gathered::parse_all(b.slice(..b.len() - 1), 5).is_err());

        // Binary metadata, beside JSON in one answer (a gateway reads either kind).
        let mut out = bytes::BytesMut::new();
        Gathered::put_found_bin(&mut out, &meta, Some(b"xyz"));
        Gathered::put_found(&mut out, &json, None);
        Gathered::put_found_bin(&mut out, &meta, None);
        Gathered::put_found_bin(&mut out, &meta, Some(b""));
        let b = out.freeze();
        let got = Gathered::parse_all(b.clone(), 4).unwrap();
        assert!(
            matches!(&got[0], Gathered::Found { meta, inline: Some(i) } if meta.cv == 42 && meta.etag == "e" && &i[..] == b"xyz")
        );
        assert!(matches!(&got[1], Gathered::Found { meta, inline: None } if meta.cv == 42));
        assert!(matches!(&got[2], Gathered::Found { meta, inline: None } if meta.size == 3));
        assert!(matches!(&got[3], Gathered::Found { inline: Some(i), .. } if i.is_empty()));
        for n in 0..b.len() {
            assert!(Gathered::parse_all(b.slice(..n), 4).is_err(), "cut at {n}");
        }
        // Damaged binary metadata inside a well-framed answer is an error, not a guess.
        let mut bad = b.to_vec();
        bad[13 + 8] = 0xff; // the first ETag's length
        assert!(Gathered::parse_all(bytes::Bytes::from(bad), 4).is_err());
    }

    /// Reads records the way a gateway does: the head's length asked with more and more of
    /// the bytes, then parsed; every split of the stream gives the same records.
    #[test]
    fn batch_records_read_back_as_written_from_any_prefix() {
        let mut out = bytes::BytesMut::new();
        BatchRecord::put_entry(&mut out, 7, 3, -5, "0123abcd");
        out.extend_from_slice(b"xyz");
        BatchRecord::put_error(&mut out, 8, &StoreError::NoSuchMember("a.jpg".into()));
        BatchRecord::put_entry(&mut out, 9, 0, 1_700_000_000_000, "");
        BatchRecord::put_end(&mut out);
        let b = out.freeze();
        let mut at = 0;
        let mut got = Vec::new();
        while at < b.len() {
            let mut need = 4;
            loop {
                let n = BatchRecord::head_len(&b[at..at + need]).unwrap();
                // Given everything left, it answers the same once it has enough.
                let all = BatchRecord::head_len(&b[at..]).unwrap();
                if n <= need {
                    assert_eq!(all, n);
                    break;
                }
                need = n;
            }
            let rec = BatchRecord::parse(&b[at..at + need]).unwrap();
            at += need;
            if let BatchRecord::Entry { size, .. } = &rec {
                at += *size as usize;
            }
            got.push(rec);
        }
        assert!(
            matches!(&got[0], BatchRecord::Entry { at: 7, size: 3, mtime_ms: -5, etag } if etag == "0123abcd")
        );
        assert!(
            matches!(&got[1], BatchRecord::Error { at: 8, error } if error.kind == "NoSuchMember" && error.detail == "a.jpg")
        );
        assert!(
            matches!(&got[2], BatchRecord::Entry { at: 9, size: 0, etag, .. } if etag.is_empty())
        );
        assert!(matches!(got[3], BatchRecord::End));
        assert_eq!(got.len(), 4);
        // Not a record: an unknown kind.
        assert!(BatchRecord::head_len(&[0, 0, 0, 1, 9]).is_err());
    }
}
