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
}

/// A bucket to create.
#[derive(Debug, Clone)]
pub struct NewBucket {
    pub name: String,
    pub owner_id: String,
    pub owner_name: String,
    pub created_ms: i64,
    pub public_read: bool,
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
