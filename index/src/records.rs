//! Index values. Each value is one format-version byte followed by the postcard encoding of
//! the record (varint integers, length-prefixed strings), so records stay compact: a small
//! object's entry is its ETag, sizes, one chunk location and a few bytes of framing.
//!
//! Versions: 1 for every record; an object's entry is version 2 when the object has tags
//! (version 1 followed by the tags), so untagged entries keep the version-1 bytes and older
//! builds still read them; it is version 3 when it belongs to a versioned bucket's history
//! (version 1, the tags, then its version sequence and flags), so records of buckets that
//! never had versioning keep their bytes. A bucket's record is version 2 when versioning was
//! ever set on it (version 1 followed by the state), version 3 when it has Object Lock
//! (version 2 followed by the lock configuration). An access key's record is version 2 when its secret is sealed
//! (version 1 with an empty secret, followed by the sealed bytes); version 1 holds the secret
//! in plaintext and is what packrat wrote before keys were sealed. A change to any struct here
//! is a new version whose decoder still reads the older ones.

use serde::{Deserialize, Serialize};

pub const FORMAT_V1: u8 = 1;
pub const FORMAT_V2: u8 = 2;
pub const FORMAT_V3: u8 = 3;

/// An index value: how it is encoded, and every version of it that can be decoded.
pub trait Record: Serialize + for<'a> Deserialize<'a> {
    fn encode(&self) -> Vec<u8> {
        let mut out = vec![FORMAT_V1];
        // Encoding plain structs into a Vec cannot fail.
        out.extend(postcard::to_stdvec(self).expect("postcard encodes plain structs"));
        out
    }

    fn decode_version(version: u8, rest: &[u8]) -> Result<Self, String> {
        match version {
            FORMAT_V1 => postcard::from_bytes(rest).map_err(|e| e.to_string()),
            v => Err(format!("unknown index record version {v}")),
        }
    }
}

pub fn encode<T: Record>(value: &T) -> Vec<u8> {
    value.encode()
}

pub fn decode<T: Record>(bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&v, rest)) => T::decode_version(v, rest),
        None => Err("empty index record".into()),
    }
}

impl Record for TarIndexRecord {}
impl Record for MemberRecord {}
impl Record for BucketRecord {
    fn encode(&self) -> Vec<u8> {
        let versioned = self.versioning != 0;
        let v = match (&self.object_lock, versioned) {
            (Some(_), _) => FORMAT_V3,
            (None, true) => FORMAT_V2,
            (None, false) => FORMAT_V1,
        };
        let mut out = vec![v];
        out.extend(postcard::to_stdvec(self).expect("postcard encodes plain structs"));
        if v != FORMAT_V1 {
            out.push(self.versioning);
        }
        if let Some(lock) = &self.object_lock {
            out.extend(postcard::to_stdvec(lock).expect("postcard encodes plain structs"));
        }
        out
    }

    fn decode_version(version: u8, rest: &[u8]) -> Result<Self, String> {
        match version {
            FORMAT_V1 => postcard::from_bytes(rest).map_err(|e| e.to_string()),
            FORMAT_V2 | FORMAT_V3 => {
                let (mut rec, rest): (BucketRecord, &[u8]) =
                    postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
                let (state, rest) = rest.split_first().ok_or("no versioning state")?;
                match (version, state) {
                    (FORMAT_V2, 1..=2) | (FORMAT_V3, 1) => rec.versioning = *state,
                    _ => return Err(format!("bad versioning state {state}")),
                }
                if version == FORMAT_V3 {
                    rec.object_lock = Some(postcard::from_bytes(rest).map_err(|e| e.to_string())?);
                } else if !rest.is_empty() {
                    return Err("bytes after the versioning state".into());
                }
                Ok(rec)
            }
            v => Err(format!("unknown index record version {v}")),
        }
    }
}
impl Record for KeyRecord {
    fn encode(&self) -> Vec<u8> {
        let sealed = !self.sealed_secret.is_empty();
        let mut out = vec![if sealed { FORMAT_V2 } else { FORMAT_V1 }];
        out.extend(postcard::to_stdvec(self).expect("postcard encodes plain structs"));
        if sealed {
            out.extend(
                postcard::to_stdvec(&self.sealed_secret).expect("postcard encodes plain structs"),
            );
        }
        out
    }

    fn decode_version(version: u8, rest: &[u8]) -> Result<Self, String> {
        match version {
            FORMAT_V1 => postcard::from_bytes(rest).map_err(|e| e.to_string()),
            FORMAT_V2 => {
                let (mut rec, sealed): (KeyRecord, &[u8]) =
                    postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
                rec.sealed_secret = postcard::from_bytes(sealed).map_err(|e| e.to_string())?;
                if rec.sealed_secret.is_empty() {
                    return Err("a version-2 access key record without its sealed secret".into());
                }
                Ok(rec)
            }
            v => Err(format!("unknown index record version {v}")),
        }
    }
}
impl Record for UploadRecord {}
impl Record for PartRecord {}

impl Record for ObjectRecord {
    fn encode(&self) -> Vec<u8> {
        let tagged = !self.tags.is_empty();
        let versioned = self.version_seq != 0 || self.version_flags != 0;
        let v = match (versioned, tagged) {
            (true, _) => FORMAT_V3,
            (false, true) => FORMAT_V2,
            (false, false) => FORMAT_V1,
        };
        let mut out = vec![v];
        out.extend(postcard::to_stdvec(self).expect("postcard encodes plain structs"));
        if tagged || versioned {
            out.extend(postcard::to_stdvec(&self.tags).expect("postcard encodes plain structs"));
        }
        if versioned {
            out.extend(
                postcard::to_stdvec(&(self.version_seq, self.version_flags))
                    .expect("postcard encodes plain structs"),
            );
        }
        out
    }

    fn decode_version(version: u8, rest: &[u8]) -> Result<Self, String> {
        match version {
            FORMAT_V1 => postcard::from_bytes(rest).map_err(|e| e.to_string()),
            FORMAT_V2 | FORMAT_V3 => {
                let (mut rec, rest): (ObjectRecord, &[u8]) =
                    postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
                let (tags, rest): (Vec<(String, String)>, &[u8]) =
                    postcard::take_from_bytes(rest).map_err(|e| e.to_string())?;
                rec.tags = tags;
                if version == FORMAT_V3 {
                    (rec.version_seq, rec.version_flags) =
                        postcard::from_bytes(rest).map_err(|e| e.to_string())?;
                }
                Ok(rec)
            }
            v => Err(format!("unknown index record version {v}")),
        }
    }
}

/// Where one chunk of an object lives in the chunk store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ChunkRef {
    pub segment_id: u64,
    pub offset: u64,
    pub len: u32,
}

/// A flexible checksum kept with an object or part: algorithm (`CRC32`, `CRC32C`,
/// `CRC64NVME`, `SHA1`, `SHA256`), the base64 value as S3 returns it, and its type
/// (`FULL_OBJECT` or `COMPOSITE`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct StoredChecksum {
    pub algorithm: String,
    pub value: String,
    pub kind: String,
}

/// A run of an object's chunks written by one multipart part, under that part's record id.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PartExtent {
    pub record_id: [u8; 16],
    pub chunk_count: u32,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct ObjectRecord {
    /// Identity written into every record of a single-PUT object (chunk i has index i).
    pub record_id: [u8; 16],
    pub size: u64,
    /// Hex MD5 (single PUT) or `md5-of-part-md5s-N` (multipart), without quotes.
    pub etag: String,
    pub last_modified_ms: i64,
    pub content_type: Option<String>,
    /// Content-Encoding, Content-Disposition, Content-Language, Cache-Control, Expires, as sent.
    pub headers: Vec<(String, String)>,
    /// `x-amz-meta-*` entries, names lower-cased and without the prefix.
    pub user_meta: Vec<(String, String)>,
    pub checksum: Option<StoredChecksum>,
    pub storage_class: Option<String>,
    pub chunks: Vec<ChunkRef>,
    /// Empty for a single PUT. For a multipart object, the parts in order: part j owns the
    /// next `chunk_count` chunks, whose records carry `record_id` and indices from 0.
    pub parts: Vec<PartExtent>,
    /// Object tags (key, value), in the order set. Not part of the version-1 bytes: encoded
    /// after them, in a version-2 entry, when there are any.
    #[serde(skip)]
    pub tags: Vec<(String, String)>,
    /// The version's place in its key's history (microseconds, strictly increasing per key);
    /// 0 for an object written while its bucket had no versioning (S3's "null" version).
    /// Encoded after the tags, in a version-3 entry, like `version_flags`.
    #[serde(skip)]
    pub version_seq: u64,
    /// [`VERSION_NULL`], [`VERSION_DELETE_MARKER`].
    #[serde(skip)]
    pub version_flags: u8,
}

/// The version is S3's "null" version (written while versioning was suspended).
pub const VERSION_NULL: u8 = 1;
/// The version is a delete marker: no bytes, it hides the versions under it.
pub const VERSION_DELETE_MARKER: u8 = 2;

/// Asks the CPU to start loading the cache lines of the `len` bytes at `p`: a hint, which
/// never faults and never waits, for code about to touch many scattered records (a batch GET of
/// random keys misses the CPU caches on nearly every one; started early, the misses overlap).
#[inline]
pub fn prefetch_bytes(p: *const u8, len: usize) {
    #[cfg(target_arch = "x86_64")]
    {
        let mut off = 0;
        while off < len {
            // SAFETY: SSE is part of the x86_64 baseline, and a prefetch is only a hint: it
            // reads nothing the program sees and never faults, whatever the address.
            unsafe {
                core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(
                    p.wrapping_add(off).cast(),
                )
            };
            off += 64;
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (p, len);
}

impl ObjectRecord {
    /// Whether this is S3's "null" version of its key (written without versioning, or while
    /// it was suspended).
    pub fn is_null_version(&self) -> bool {
        self.version_seq == 0 || self.version_flags & VERSION_NULL != 0
    }

    pub fn is_delete_marker(&self) -> bool {
        self.version_flags & VERSION_DELETE_MARKER != 0
    }

    /// The version id S3 clients see: `null`, or the sequence as 16 hex digits.
    pub fn version_id(&self) -> String {
        if self.is_null_version() {
            "null".to_string()
        } else {
            format!("{:016x}", self.version_seq)
        }
    }

    /// The sequence a version id names (`None` for `null` or a malformed id).
    pub fn parse_version_id(id: &str) -> Option<u64> {
        if id.len() != 16 {
            return None;
        }
        u64::from_str_radix(id, 16)
            .ok()
            .filter(|s| *s != 0 && id.bytes().all(|b| b.is_ascii_hexdigit()))
    }

    /// Starts loading a shared record's own bytes (and its reference counts) into the CPU
    /// caches. Call it some records ahead of use, then [`prefetch_heap`](Self::prefetch_heap).
    pub fn prefetch(rec: &std::sync::Arc<ObjectRecord>) {
        let p = std::sync::Arc::as_ptr(rec).cast::<u8>();
        // The counts sit just before the record.
        prefetch_bytes(p.wrapping_sub(16), std::mem::size_of::<ObjectRecord>() + 16);
    }

    /// Starts loading what a read of the record follows out of it: its chunk list (the first
    /// few chunks) and its ETag. Reads the record itself, so prefetch that first.
    pub fn prefetch_heap(&self) {
        let chunks = self.chunks.len().min(4) * std::mem::size_of::<ChunkRef>();
        prefetch_bytes(self.chunks.as_ptr().cast(), chunks);
        prefetch_bytes(self.etag.as_ptr(), self.etag.len());
    }

    /// The record identity and chunk index of the chunk at position `i` of `chunks`.
    pub fn chunk_identity(&self, i: usize) -> ([u8; 16], u32) {
        if self.parts.is_empty() {
            return (self.record_id, i as u32);
        }
        let mut first = 0usize;
        for p in &self.parts {
            let n = p.chunk_count as usize;
            if i < first + n {
                return (p.record_id, (i - first) as u32);
            }
            first += n;
        }
        (self.record_id, i as u32)
    }
}

/// The member index of a TAR object: written once, on the first member read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct TarIndexRecord {
    /// Regular-file members indexed.
    pub members: u64,
    /// Why the object is not a readable TAR, if it is not.
    pub not_a_tar: Option<String>,
}

/// Where one member's bytes lie inside its TAR object.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct MemberRecord {
    pub offset: u64,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BucketRecord {
    /// Never reused, so a recreated bucket never sees its predecessor's leftovers.
    pub id: u64,
    pub name: String,
    pub owner_id: String,
    pub owner_name: String,
    pub created_ms: i64,
    /// Anonymous (unsigned) reads allowed: set by the `public-read` canned ACL.
    pub public_read: bool,
    /// 0 never versioned, 1 enabled, 2 suspended. Encoded after the rest, in versions 2 and 3.
    #[serde(skip)]
    pub versioning: u8,
    /// Object Lock, once enabled. Encoded after the versioning state, in version 3 only.
    #[serde(skip)]
    pub object_lock: Option<BucketLock>,
}

/// A bucket's Object Lock configuration: its default retention's mode (0 none, 1 GOVERNANCE,
/// 2 COMPLIANCE) and period (days or years, as set).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BucketLock {
    pub default_mode: u8,
    pub days: u32,
    pub years: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct KeyRecord {
    pub access_key: String,
    /// The secret in plaintext: empty in a stored version-2 record, whose secret is sealed.
    pub secret_key: String,
    pub name: String,
    pub owner_id: String,
    pub is_root: bool,
    pub created_ms: i64,
    /// The secret sealed with the data directory's master key (the store seals and opens it;
    /// the index only keeps the bytes). Encoded after the rest, in version 2 only.
    #[serde(skip)]
    pub sealed_secret: Vec<u8>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct UploadRecord {
    pub upload_id: String,
    pub bucket_id: u64,
    pub key: String,
    pub owner_id: String,
    pub initiated_ms: i64,
    pub content_type: Option<String>,
    pub headers: Vec<(String, String)>,
    pub user_meta: Vec<(String, String)>,
    pub checksum_algorithm: Option<String>,
    /// `COMPOSITE` or `FULL_OBJECT` when a checksum algorithm was chosen.
    pub checksum_type: Option<String>,
    pub storage_class: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct PartRecord {
    pub part_number: u32,
    pub record_id: [u8; 16],
    pub etag: String,
    pub size: u64,
    pub last_modified_ms: i64,
    pub chunks: Vec<ChunkRef>,
    pub checksum: Option<StoredChecksum>,
    /// The part's CRC as an integer when its algorithm is a CRC, for full-object combination.
    pub crc: Option<u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins the v1 encoding of a small object's entry: a change here is a format change.
    #[test]
    fn small_object_record_golden_bytes() {
        let rec = ObjectRecord {
            record_id: [1; 16],
            size: 4096,
            etag: "ab".into(),
            last_modified_ms: 1,
            chunks: vec![ChunkRef {
                segment_id: 2,
                offset: 300,
                len: 4096,
            }],
            ..Default::default()
        };
        let b = encode(&rec);
        assert_eq!(b[0], FORMAT_V1);
        assert_eq!(&b[1..17], &[1; 16]);
        assert_eq!(
            &b[17..20],
            &[0x80, 0x20, 2],
            "size 4096 as varint, etag length 2"
        );
        assert_eq!(decode::<ObjectRecord>(&b).unwrap(), rec);
        assert!(b.len() < 40, "small entries stay small: {} bytes", b.len());
    }

    #[test]
    fn tagged_objects_are_version_2_and_untagged_stay_version_1() {
        let mut rec = ObjectRecord {
            record_id: [1; 16],
            size: 4096,
            etag: "ab".into(),
            ..Default::default()
        };
        let v1 = encode(&rec);
        assert_eq!(v1[0], FORMAT_V1);
        rec.tags = vec![
            ("project".into(), "x".into()),
            ("split".into(), "train".into()),
        ];
        let v2 = encode(&rec);
        assert_eq!(v2[0], FORMAT_V2);
        // Version 2 is version 1's bytes, then the tags.
        assert_eq!(&v2[1..v1.len()], &v1[1..]);
        assert_eq!(decode::<ObjectRecord>(&v2).unwrap(), rec);
        assert!(decode::<ObjectRecord>(&v2[..v2.len() - 1]).is_err());
        // A version-2 entry is refused for records that have no version 2.
        assert!(decode::<UploadRecord>(&[FORMAT_V2, 0]).is_err());
    }

    /// Pins both encodings of an access key: version 1 (plaintext secret, still read) and
    /// version 2 (the secret empty, the sealed bytes after the record).
    #[test]
    fn key_record_golden_bytes() {
        let mut rec = KeyRecord {
            access_key: "AK".into(),
            secret_key: "secret12".into(),
            name: "n".into(),
            owner_id: "o".into(),
            is_root: true,
            created_ms: 1,
            sealed_secret: Vec::new(),
        };
        let v1 = encode(&rec);
        assert_eq!(
            v1,
            [
                1, 2, b'A', b'K', 8, b's', b'e', b'c', b'r', b'e', b't', b'1', b'2', 1, b'n', 1,
                b'o', 1, 2
            ]
        );
        assert_eq!(decode::<KeyRecord>(&v1).unwrap(), rec);
        rec.secret_key.clear();
        rec.sealed_secret = vec![7, 8, 9];
        let v2 = encode(&rec);
        assert_eq!(
            v2,
            [2, 2, b'A', b'K', 0, 1, b'n', 1, b'o', 1, 2, 3, 7, 8, 9]
        );
        assert_eq!(decode::<KeyRecord>(&v2).unwrap(), rec);
        assert!(decode::<KeyRecord>(&v2[..v2.len() - 1]).is_err());
        // Version 2 with nothing sealed is corrupt, not a key with an empty secret.
        assert!(decode::<KeyRecord>(&[2, 2, b'A', b'K', 0, 1, b'n', 1, b'o', 1, 2, 0]).is_err());
    }

    /// Pins a bucket record's three encodings: version 1 (never versioned), version 2 (the
    /// versioning state after it), version 3 (then the Object Lock configuration).
    #[test]
    fn bucket_record_golden_bytes() {
        let mut rec = BucketRecord {
            id: 7,
            name: "b".into(),
            owner_id: "o".into(),
            owner_name: "n".into(),
            created_ms: 1,
            public_read: false,
            versioning: 0,
            object_lock: None,
        };
        let v1 = encode(&rec);
        assert_eq!(v1, [1, 7, 1, b'b', 1, b'o', 1, b'n', 2, 0]);
        rec.versioning = 2;
        let v2 = encode(&rec);
        assert_eq!(&v2[..], &[&[2][..], &v1[1..], &[2]].concat()[..]);
        assert_eq!(decode::<BucketRecord>(&v2).unwrap(), rec);
        rec.versioning = 1;
        rec.object_lock = Some(BucketLock {
            default_mode: 2,
            days: 30,
            years: 0,
        });
        let v3 = encode(&rec);
        assert_eq!(&v3[..], &[&[3][..], &v1[1..], &[1, 2, 30, 0]].concat()[..]);
        assert_eq!(decode::<BucketRecord>(&v3).unwrap(), rec);
        assert!(decode::<BucketRecord>(&v3[..v3.len() - 1]).is_err());
        // Object Lock without versioning enabled is corrupt.
        let mut suspended = v3.clone();
        suspended[v1.len()] = 2;
        assert!(decode::<BucketRecord>(&suspended).is_err());
        assert!(decode::<BucketRecord>(&[&v2[..], &[0]].concat()).is_err());
    }

    #[test]
    fn unknown_version_is_refused() {
        assert!(decode::<ObjectRecord>(&[9, 0]).is_err());
        assert!(decode::<ObjectRecord>(&[]).is_err());
    }
}
