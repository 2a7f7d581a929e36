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

mod batch;
mod client;
mod gather;
pub mod meta_codec;

pub use batch::*;
pub use client::*;
pub use gather::*;

pub const SECRET_HEADER: &str = "x-packrat-cluster-secret";
pub const EPOCH_HEADER: &str = "x-packrat-epoch";
pub const CV_HEADER: &str = "x-packrat-cv";
pub const PUT_HEADER: &str = "x-packrat-put";
/// The metadata of a small object whose bytes are the body (`?meta&inline=N`).
pub const META_HEADER: &str = "x-packrat-meta";
/// On a copy a member catching up is given (`?meta&any`): the source holds the key marked (a
/// step of it not yet acknowledged by the rest of its chain), so the copy may not be
/// committed anywhere else; the member catching up marks it too (see `Node::resync_bucket`).
pub const UNSETTLED_HEADER: &str = "x-packrat-unsettled";
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
    /// In a resync's listing (`cv`, `tombstones`): the source holds the key marked (see
    /// [`UNSETTLED_HEADER`]).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsettled: bool,
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
            unsettled: false,
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

impl From<WireRange> for ItemRange {
    fn from(r: WireRange) -> Self {
        match r {
            WireRange::From(a, b) => ItemRange::From(a, b),
            WireRange::Suffix(n) => ItemRange::Suffix(n),
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
