//! What crosses the seam: buckets, identities and object listings as the S3 layer sees them.
//! None of them carries a storage location (a segment, an offset, a node): where bytes live is
//! the store's business, so a cluster store answers with the same types as the local one.

/// A bucket. Its id is never reused, so a recreated bucket never sees its predecessor's
/// leftovers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    pub id: u64,
    pub name: String,
    pub owner_id: String,
    pub owner_name: String,
    pub created_ms: i64,
    /// Anonymous (unsigned) reads allowed: set by the `public-read` canned ACL.
    pub public_read: bool,
    pub versioning: Versioning,
    /// Object Lock, once enabled (never disabled); versioning is then `Enabled` for good.
    pub object_lock: Option<crate::lock::LockConfig>,
}

/// A bucket's versioning state (PutBucketVersioning). Once set, a bucket never returns to
/// `Unversioned`, as in S3.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Versioning {
    /// Never set: a write replaces the key's object, a delete removes it.
    #[default]
    Unversioned,
    /// A write keeps the version it replaces; a delete adds a delete marker.
    Enabled,
    /// Writes and deletes make the key's "null" version (replacing an earlier null one);
    /// versions made while enabled stay.
    Suspended,
}

/// What a DeleteObject did: the version it made (a delete marker) or removed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deleted {
    /// `None` in a bucket that never had versioning.
    pub version_id: Option<String>,
    /// The version made, or the one removed, is a delete marker.
    pub delete_marker: bool,
}

/// A version named by its id.
#[derive(Debug, Clone)]
pub enum FoundVersion {
    Object(Box<ObjectInfo>),
    DeleteMarker {
        version_id: String,
        last_modified_ms: i64,
    },
}

/// One page of a bucket's versions (ListObjectVersions): keys in byte order, each key's
/// versions newest first.
#[derive(Debug, Clone, Default)]
pub struct VersionQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
    /// Resume after this key (all of its versions), or, with `version_id_marker`, after that
    /// version of it.
    pub key_marker: Option<String>,
    pub version_id_marker: Option<String>,
    /// Most versions plus common prefixes in the page (at least 1).
    pub max_keys: usize,
}

/// A version as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionSummary {
    /// Key, size, ETag, ... (size 0 and an empty ETag for a delete marker).
    pub object: ObjectSummary,
    pub version_id: String,
    pub is_latest: bool,
    pub delete_marker: bool,
    /// The version's Object Lock as stored (the value of [`crate::lock::LOCK_HEADER`]), so
    /// copies of a key's history can be compared lock and all; never shown to clients.
    pub lock: Option<String>,
    /// The version's tags, for the same comparison (a version's tags can change after it
    /// was written); never shown in a listing.
    pub tags: Vec<(String, String)>,
    /// The version's object ACL as stored (the value of [`ACL_HEADER`]), for the same
    /// comparison (PutObjectAcl edits a version in place); never shown in a listing.
    pub acl: Option<String>,
}

/// The stored header holding an object's ACL (the S3 layer's, JSON; never shown to clients).
/// A store keeps it as any stored header; copies of a key's history compare it
/// ([`VersionSummary::acl`]).
pub const ACL_HEADER: &str = "x-packrat-acl";

/// The stored header naming the multipart upload an object was completed from (never shown
/// to clients): a second CompleteMultipartUpload of the same upload answers with the object,
/// as S3 does, instead of NoSuchUpload.
pub const UPLOAD_ID_HEADER: &str = "x-packrat-upload-id";

/// Whether `obj` is what completing upload `upload_id` from parts with these ETags made: it
/// was completed from that upload and its ETag is the one those parts give
/// (`md5(part md5s)-N`).
pub fn completed_from<'a>(
    obj: &ObjectInfo,
    upload_id: &str,
    part_etags: impl ExactSizeIterator<Item = &'a str>,
) -> bool {
    use md5::Digest;
    if !obj
        .attrs
        .headers
        .iter()
        .any(|(k, v)| k == UPLOAD_ID_HEADER && v == upload_id)
    {
        return false;
    }
    let n = part_etags.len();
    let mut md5s = md5::Md5::new();
    for e in part_etags {
        match hex::decode(e.trim().trim_matches('"')) {
            Ok(raw) => md5s.update(raw),
            Err(_) => return false,
        }
    }
    obj.etag == format!("{}-{n}", hex::encode(md5s.finalize()))
}

#[derive(Debug, Clone, Default)]
pub struct VersionPage {
    pub versions: Vec<VersionSummary>,
    pub common_prefixes: Vec<String>,
    pub truncated: bool,
    /// Where the next page starts (S3's NextKeyMarker and NextVersionIdMarker).
    pub next_key_marker: Option<String>,
    pub next_version_id_marker: Option<String>,
}

/// A bucket configuration kept as a document the store does not read: the S3 layer checks it
/// on the way in and interprets it on the way out; the store keeps the bytes with the bucket
/// (and drops them with it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BucketConfig {
    /// The bucket's tags (PutBucketTagging).
    Tagging,
    /// Cross-origin rules (PutBucketCors).
    Cors,
    /// The bucket policy, JSON (PutBucketPolicy).
    Policy,
    /// Default encryption (PutBucketEncryption).
    Encryption,
    /// The Block Public Access settings (PutPublicAccessBlock).
    PublicAccessBlock,
    /// Object Ownership (PutBucketOwnershipControls): whether objects carry ACLs of their own.
    OwnershipControls,
    /// The bucket's ACL grants beyond its owner's full control and `public-read` (which the
    /// bucket's `public_read` keeps): PutBucketAcl's grants, JSON.
    Acl,
}

impl BucketConfig {
    pub const ALL: [BucketConfig; 7] = [
        BucketConfig::Tagging,
        BucketConfig::Cors,
        BucketConfig::Policy,
        BucketConfig::Encryption,
        BucketConfig::PublicAccessBlock,
        BucketConfig::OwnershipControls,
        BucketConfig::Acl,
    ];

    /// The configuration's stable name (a storage key; the S3 sub-resource).
    pub fn name(self) -> &'static str {
        match self {
            BucketConfig::Tagging => "tagging",
            BucketConfig::Cors => "cors",
            BucketConfig::Policy => "policy",
            BucketConfig::Encryption => "encryption",
            BucketConfig::PublicAccessBlock => "publicAccessBlock",
            BucketConfig::OwnershipControls => "ownershipControls",
            BucketConfig::Acl => "acl",
        }
    }
}

/// A bucket to create.
#[derive(Debug, Clone)]
pub struct NewBucket {
    pub name: String,
    pub owner_id: String,
    pub owner_name: String,
    pub created_ms: i64,
    pub public_read: bool,
    /// Created with Object Lock (`x-amz-bucket-object-lock-enabled`): versioning enabled and
    /// Object Lock on, with no default retention.
    pub object_lock: bool,
}

/// An access key and who holds it. The secret is here because SigV4 needs it to recompute a
/// request's signature; it never goes further than the authentication code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub access_key: String,
    pub secret_key: String,
    pub name: String,
    pub owner_id: String,
    pub is_root: bool,
}

/// One page of an object listing: keys in byte order from just after `after`, keys under a
/// common prefix (up to the first `delimiter` after `prefix`) rolled up into one entry.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
    /// Resume strictly after this key or common prefix.
    pub after: Option<String>,
    /// Most keys plus common prefixes in the page (at least 1).
    pub max_keys: usize,
}

/// What a listing shows of an object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectSummary {
    pub key: String,
    pub size: u64,
    pub etag: String,
    pub last_modified_ms: i64,
    /// The flexible checksum's algorithm (`CRC32`, ...) and type (`FULL_OBJECT`, `COMPOSITE`).
    pub checksum: Option<(String, String)>,
    /// `None` for STANDARD.
    pub storage_class: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct ObjectPage {
    pub objects: Vec<ObjectSummary>,
    pub common_prefixes: Vec<String>,
    pub truncated: bool,
    /// The last key or common prefix returned; the next page starts strictly after it.
    pub last: Option<String>,
}

/// An object's flexible checksum as stored and shown: the algorithm's name (`CRC32`, ...), the
/// base64 of its big-endian bytes (`-N` appended for a composite one), and its type
/// (`FULL_OBJECT` or `COMPOSITE`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectChecksum {
    pub algorithm: String,
    pub value: String,
    pub kind: String,
}

/// What a write sets of an object besides its bytes, and what an attribute edit may change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ObjectAttrs {
    pub last_modified_ms: i64,
    pub content_type: Option<String>,
    /// Stored response headers (Content-Encoding, Cache-Control, ...), by lower-case name.
    pub headers: Vec<(String, String)>,
    /// `x-amz-meta-*` metadata, names without the prefix.
    pub user_meta: Vec<(String, String)>,
    /// `None` for STANDARD.
    pub storage_class: Option<String>,
    pub tags: Vec<(String, String)>,
}

/// Which stored version of an object an [`ObjectInfo`] describes, in the store's own terms
/// (for the local store, the index record it was read from). Reads and copies of the info read
/// exactly that version, never a newer one written meanwhile.
#[derive(Clone)]
pub struct ObjectVersion(pub std::sync::Arc<dyn std::any::Any + Send + Sync>);

impl std::fmt::Debug for ObjectVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ObjectVersion(..)")
    }
}

/// An object as HEAD and GET see it.
#[derive(Debug, Clone)]
pub struct ObjectInfo {
    pub size: u64,
    /// Hex MD5 of the bytes, or of the parts' MD5s followed by `-N` for a multipart object.
    pub etag: String,
    pub attrs: ObjectAttrs,
    pub checksum: Option<ObjectChecksum>,
    /// Sizes of the parts of a multipart object, in order (empty otherwise).
    pub part_sizes: Vec<u64>,
    /// The S3 version id (`null` or an opaque id); `None` in a bucket that never had
    /// versioning, where S3 shows none.
    pub version_id: Option<String>,
    pub version: ObjectVersion,
}

/// Conditions on a write, checked atomically with its commit.
#[derive(Debug, Default, Clone)]
pub struct WriteCondition {
    /// `If-None-Match: *`: fail if the key exists.
    pub if_none_match_any: bool,
    /// `If-Match: "etag"`: fail unless the current ETag matches.
    pub if_match: Option<String>,
}

/// Whether an `If-Match`-style condition (a list of ETags, or `*`) names `etag`.
pub fn etag_matches(condition: &str, etag: &str) -> bool {
    condition.split(',').any(|c| {
        let c = c.trim();
        c == "*" || c.trim_start_matches("W/").trim_matches('"') == etag
    })
}

/// A new object's attributes, how to check its bytes, and when it may be written.
#[derive(Debug, Clone, Default)]
pub struct PutObject {
    pub attrs: ObjectAttrs,
    /// The flexible checksum to compute and store.
    pub checksum: Option<crate::checksum::ChecksumAlgorithm>,
    /// The checksum the client sent up front (raw bytes); one sent as a trailer comes from
    /// the byte source.
    pub expected_checksum: Option<Vec<u8>>,
    /// The Content-MD5 the client sent.
    pub content_md5: Option<[u8; 16]>,
    pub condition: WriteCondition,
    /// Told once the write is staged (see [`OnStaged`]); a store may not tell.
    pub on_staged: Option<OnStaged>,
    /// The version the caller chose for this write (see [`VersionAs`]); `None` for the
    /// store's own choice, by the bucket's versioning.
    pub version_as: Option<VersionAs>,
}

/// A version chosen by the caller rather than by the store: a cluster's head chooses one per
/// write, and every replica writes it with the same sequence, so a version id names the same
/// version on each. Written with one, an object or delete marker keeps the key's history as
/// in a bucket with versioning `Enabled` (or `Suspended`, for the `null` version) whatever
/// the bucket's own state, and lands where its sequence places it among the key's versions:
/// the current one if it is above every version the key has, else kept in its history (a
/// replica copying a version it missed), the current one untouched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VersionAs {
    /// Above 0; the version id shown is this in 16 hex digits (unless `null`).
    pub seq: u64,
    /// The key's `null` version (written while versioning is suspended), which replaces the
    /// null version the key had.
    pub null: bool,
}

impl VersionAs {
    /// The versioning state a write with this version is made under.
    pub fn mode(&self) -> Versioning {
        if self.null {
            Versioning::Suspended
        } else {
            Versioning::Enabled
        }
    }
}

/// Called by a store once a write is staged, before it is durable: its bytes are stored and
/// checked against the digests sent, its condition holds, and its place among the key's
/// writes is fixed; what is left is durability (the group commit's sync), whose failure
/// means the device failed. A cluster member hands a write on to the next member at this
/// point, so the members of a chain sync at the same time rather than one after the other.
#[derive(Clone)]
pub struct OnStaged(pub std::sync::Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for OnStaged {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OnStaged")
    }
}

/// A multipart upload to begin: the object's attributes (given to it by Complete) and the
/// checksum its parts carry.
#[derive(Debug, Clone, Default)]
pub struct NewUpload {
    pub owner_id: String,
    pub initiated_ms: i64,
    pub attrs: ObjectAttrs,
    pub checksum: Option<crate::checksum::ChecksumAlgorithm>,
    /// `COMPOSITE` or `FULL_OBJECT` when `checksum` is set.
    pub checksum_type: Option<String>,
    /// The upload's id when the caller chooses it (a cluster gives every replica of an upload
    /// the same id); `None` for a new random one.
    pub upload_id: Option<String>,
}

/// What a caller fixes of the object a completed upload makes. The S3 layer fixes nothing
/// (`Default`); a cluster node fixes the modification time the chain's head chose and adds
/// the chain's version to the user metadata, so every replica's copy is the same.
#[derive(Debug, Clone, Default)]
pub struct CompleteAs {
    pub last_modified_ms: Option<i64>,
    pub user_meta: Vec<(String, String)>,
    /// The version the object gets (see [`VersionAs`]).
    pub version_as: Option<VersionAs>,
}

/// A multipart upload in progress.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upload {
    pub upload_id: String,
    pub key: String,
    pub owner_id: String,
    pub initiated_ms: i64,
    pub storage_class: Option<String>,
    pub checksum: Option<crate::checksum::ChecksumAlgorithm>,
    pub checksum_type: Option<String>,
    /// The S3 layer's encryption envelope for the object it makes (its parts are sealed by
    /// the S3 layer; see [`crate::sealed`]), `None` if it is not encrypted.
    pub envelope: Option<String>,
}

/// One uploaded part.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Part {
    pub part_number: u32,
    pub etag: String,
    pub size: u64,
    pub last_modified_ms: i64,
    pub checksum: Option<ObjectChecksum>,
}

/// How a part's bytes are checked (the upload's checksum algorithm applies when none is given).
#[derive(Debug, Clone, Default)]
pub struct PutPart {
    pub checksum: Option<crate::checksum::ChecksumAlgorithm>,
    pub expected_checksum: Option<Vec<u8>>,
    pub content_md5: Option<[u8; 16]>,
}

/// A part as CompleteMultipartUpload names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompletePart {
    pub part_number: u32,
    /// The part's ETag as the client sent it (quotes allowed).
    pub etag: String,
    /// Checksums the client sent for the part (base64, as S3 shows them).
    pub checksums: Vec<(crate::checksum::ChecksumAlgorithm, String)>,
}

/// Smallest part that is not the last (S3's 5 MiB).
pub const PART_BYTES_MIN: u64 = 5 * 1024 * 1024;

/// One page of a bucket's uploads in progress, by key then upload id.
#[derive(Debug, Clone, Default)]
pub struct UploadQuery {
    pub prefix: String,
    pub delimiter: Option<String>,
    pub key_marker: Option<String>,
    pub upload_id_marker: Option<String>,
    pub max_uploads: usize,
}

#[derive(Debug, Clone, Default)]
pub struct UploadPage {
    pub uploads: Vec<Upload>,
    pub common_prefixes: Vec<String>,
    pub truncated: bool,
}
