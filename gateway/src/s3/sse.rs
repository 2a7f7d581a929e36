//! Server-side encryption: SSE-S3 (`x-amz-server-side-encryption: AES256`, a data key per
//! object sealed with the store's master key) and SSE-C (`x-amz-server-side-encryption-customer-*`,
//! the customer's key, never stored).
//!
//! The S3 layer encrypts; a store keeps the sealed bytes and the envelope like any other
//! object's (see `packrat_store_api::sealed`). Each object gets its own AES-256-GCM key: a random
//! data key (SSE-S3), or one derived from the customer's key and a random salt with HMAC-SHA256
//! (SSE-C). The plaintext is sealed in blocks of 64 KiB, block `i` under the nonce
//! `i (8 bytes, big-endian) || 0 0 0 || last`, where `last` is 1 on the object's final block
//! only: a block moved, replaced or cut off fails its tag. A range read decrypts only the blocks
//! it touches.
//!
//! The envelope (the stored header `x-packrat-sse`), fields separated by spaces:
//! - `1 s3 <data key sealed with the master key, base64>`;
//! - `1 c <salt, base64> <check, base64> <key MD5, base64>`, where `check` is
//!   HMAC-SHA256(key, "packrat sse-c check" || salt): it tells a wrong key from the right one
//!   and reveals nothing of the key;
//! - either followed by ` parts` for an object a multipart upload made: it is sealed part by
//!   part, each part under its own key, HMAC-SHA256(object key, "packrat sse part key" ||
//!   part salt), the part salt stored in front of the part's blocks (random per part upload:
//!   a part sent again under the same number gets a new key, so no key ever seals two
//!   plaintexts under one nonce). Each part's blocks are numbered from 0, its last one marked.

use super::error::{S3Error, S3ErrorCode, S3Result};
use super::headers::{Kind, RequestHeaders};
use super::xml::{self, Xml};
use crate::state::{AppState, S3Request};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use bytes::{Bytes, BytesMut};
use hmac::{Hmac, Mac};
use http::HeaderMap;
use md5::{Digest as _, Md5};
use packrat_store_api::checksum::{ChecksumAlgorithm, Hasher};
use packrat_store_api::sealed::{self, BLOCK, SSE_HEADER, TAG};
use packrat_store_api::{
    Bucket, BucketConfig, ByteSource, Digest, ObjectInfo, ObjectRead, PutObject, Store, StoreError,
    StoreResult,
};
use std::sync::Arc;
// ring's AES-256-GCM (assembly, AES-NI and carry-less multiply) seals a 4 KiB block in about
// 0.9 µs on this project's machines; RustCrypto's `aes-gcm` took 6 to 10 µs in our one build
// profile (measured 2026-11-26, docs/benchmark-log.md). ring is already in the tree (rustls).
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use sha2::Sha256;

const SSE: &str = "x-amz-server-side-encryption";
const C_ALG: &str = "x-amz-server-side-encryption-customer-algorithm";
const C_KEY: &str = "x-amz-server-side-encryption-customer-key";
const C_MD5: &str = "x-amz-server-side-encryption-customer-key-md5";
const COPY_C_ALG: &str = "x-amz-copy-source-server-side-encryption-customer-algorithm";
const COPY_C_KEY: &str = "x-amz-copy-source-server-side-encryption-customer-key";
const COPY_C_MD5: &str = "x-amz-copy-source-server-side-encryption-customer-key-md5";
/// What an SSE-S3 data key is sealed against (the master key opens it for nothing else).
const DATA_KEY_CONTEXT: &[u8] = b"packrat sse-s3 data key v1";
const ENVELOPE_VERSION: &str = "1";

fn err(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::new(code, msg)
}

/// A key sent with SSE-C, checked against its MD5.
#[derive(Clone)]
pub struct CustomerKey {
    key: [u8; 32],
    md5_b64: String,
}

impl std::fmt::Debug for CustomerKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CustomerKey(md5 {})", self.md5_b64)
    }
}

/// The encryption a write asks for.
#[derive(Debug, Clone)]
pub enum Requested {
    /// SSE-S3 (`AES256`).
    S3,
    /// SSE-C.
    Customer(CustomerKey),
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).map(|v| v.to_str().unwrap_or("\u{fffd}"))
}

/// The SSE-C key named by the three headers `alg`, `key`, `md5` (of `kind`); `None` when none
/// is sent.
fn customer_key(
    h: &RequestHeaders,
    kind: Kind,
    [alg, key, md5]: [&str; 3],
    secure: bool,
) -> S3Result<Option<CustomerKey>> {
    if !h.has(kind) {
        return Ok(None);
    }
    let (a, k, m) = (header(h, alg), header(h, key), header(h, md5));
    if a.is_none() && k.is_none() && m.is_none() {
        return Ok(None);
    }
    if !secure {
        return Err(err(
            S3ErrorCode::InvalidRequest,
            "Requests specifying Server Side Encryption with Customer provided keys must be made over a secure connection.",
        ));
    }
    let (Some(a), Some(k)) = (a, k) else {
        return Err(err(
            S3ErrorCode::InvalidRequest,
            format!(
                "Requests specifying Server Side Encryption with Customer provided keys must provide both {alg} and {key}."
            ),
        ));
    };
    if a != "AES256" {
        return Err(err(
            S3ErrorCode::InvalidEncryptionAlgorithmError,
            "The encryption request you specified is not valid. The valid value is AES256.",
        ));
    }
    let key = B64
        .decode(k.trim())
        .ok()
        .and_then(|b| <[u8; 32]>::try_from(b).ok())
        .ok_or_else(|| {
            err(
                S3ErrorCode::InvalidArgument,
                "The secret key was invalid for the specified algorithm.",
            )
        })?;
    let md5_b64 = B64.encode(Md5::digest(key));
    if m.is_some_and(|m| m.trim() != md5_b64) {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "The calculated MD5 hash of the key did not match the hash that was provided.",
        ));
    }
    Ok(Some(CustomerKey { key, md5_b64 }))
}

/// The encryption a PutObject, CopyObject or CreateMultipartUpload asks for with its headers.
pub fn requested(req: &S3Request) -> S3Result<Option<Requested>> {
    requested_in(&req.headers, req.sse_c_allowed)
}

/// The encryption headers `h` ask for (a request's, or a form upload's fields), on a
/// connection where SSE-C keys may be sent (`secure`) or not.
pub fn requested_in(h: &RequestHeaders, secure: bool) -> S3Result<Option<Requested>> {
    if !h.has(Kind::Encryption) {
        return Ok(None);
    }
    if let Some(k) = h.keys().find(|k| {
        let k = k.as_str();
        k.starts_with("x-amz-server-side-encryption-aws-kms")
            || k == "x-amz-server-side-encryption-context"
    }) {
        return Err(err(
            S3ErrorCode::NotImplemented,
            format!("packrat does not implement SSE-KMS ({k}); use SSE-S3 (AES256) or SSE-C"),
        ));
    }
    if header(h, "x-amz-server-side-encryption-bucket-key-enabled")
        .is_some_and(|v| !v.eq_ignore_ascii_case("false"))
    {
        return Err(err(
            S3ErrorCode::NotImplemented,
            "packrat does not implement S3 Bucket Keys (an SSE-KMS feature)",
        ));
    }
    let customer = customer_key(h, Kind::Encryption, [C_ALG, C_KEY, C_MD5], secure)?;
    match (header(h, SSE), customer) {
        (None, None) => Ok(None),
        (None, Some(c)) => Ok(Some(Requested::Customer(c))),
        (Some(_), Some(_)) => Err(err(
            S3ErrorCode::InvalidArgument,
            "Server Side Encryption with Customer provided key is incompatible with the encryption method specified",
        )),
        (Some("AES256"), None) => Ok(Some(Requested::S3)),
        (Some(v @ ("aws:kms" | "aws:kms:dsse")), None) => Err(err(
            S3ErrorCode::NotImplemented,
            format!("packrat does not implement SSE-KMS ({v}); use SSE-S3 (AES256) or SSE-C"),
        )),
        (Some(v), None) => Err(err(
            S3ErrorCode::InvalidArgument,
            format!("The encryption method specified is not supported: {v}"),
        )),
    }
}

/// The SSE-C key a CopyObject or UploadPartCopy sends for its source.
pub fn copy_source_key(req: &S3Request) -> S3Result<Option<CustomerKey>> {
    customer_key(
        &req.headers,
        Kind::CopySourceEncryption,
        [COPY_C_ALG, COPY_C_KEY, COPY_C_MD5],
        req.sse_c_allowed,
    )
}

/// The SSE-C key a GET, HEAD or multipart upload step sends; `x-amz-server-side-encryption`
/// there is refused (S3 takes it only on writes that choose an encryption).
pub fn read_key(req: &S3Request) -> S3Result<Option<CustomerKey>> {
    if !req.headers.has(Kind::Encryption) {
        return Ok(None);
    }
    if req.headers.contains_key(SSE) {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "x-amz-server-side-encryption is only valid on PutObject, CopyObject and CreateMultipartUpload; an SSE-S3 object or upload needs no key after that",
        ));
    }
    customer_key(
        &req.headers,
        Kind::Encryption,
        [C_ALG, C_KEY, C_MD5],
        req.sse_c_allowed,
    )
}

pub use crate::state::BucketDefault;

/// The encryption a write gets: what its headers ask for, else its bucket's default.
pub async fn for_write(
    state: &AppState,
    req: &S3Request,
    b: &Bucket,
) -> S3Result<Option<Requested>> {
    or_default(state, b, requested(req)?).await
}

/// `asked`, or the bucket's default when a write asks for no encryption.
pub async fn or_default(
    state: &AppState,
    b: &Bucket,
    asked: Option<Requested>,
) -> S3Result<Option<Requested>> {
    match asked {
        Some(r) => Ok(Some(r)),
        None => bucket_default(state, b).await,
    }
}

/// The bucket's default encryption, from this gateway's cache or the store.
async fn bucket_default(state: &AppState, b: &Bucket) -> S3Result<Option<Requested>> {
    let generation = match state.bucket_encryption.fresh(b.id) {
        Ok(d) => return Ok(d.map(|_| Requested::S3)),
        Err(g) => g,
    };
    let doc = state
        .store
        .get_bucket_config(b, BucketConfig::Encryption)
        .await?;
    let d = doc.map(|_| Arc::new(BucketDefault));
    state.bucket_encryption.store(b.id, d.clone(), generation);
    Ok(d.map(|_| Requested::S3))
}

/// Checks a PutBucketEncryption body and answers the document GetBucketEncryption shows.
pub fn bucket_default_doc(doc: &xml::ServerSideEncryptionConfiguration) -> S3Result<Vec<u8>> {
    let malformed = |m: &str| err(S3ErrorCode::MalformedXML, m.to_string());
    let [rule] = doc.rules.as_slice() else {
        return Err(malformed(
            "A ServerSideEncryptionConfiguration has exactly one Rule",
        ));
    };
    let Some(by_default) = &rule.by_default else {
        return Err(malformed(
            "The Rule has no ApplyServerSideEncryptionByDefault",
        ));
    };
    let bucket_key = match rule.bucket_key_enabled.as_deref().map(str::trim) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(malformed("BucketKeyEnabled is true or false")),
    };
    match by_default.algorithm.as_deref().map(str::trim) {
        Some("AES256") if by_default.kms_key_id.is_some() => Err(err(
            S3ErrorCode::InvalidArgument,
            "KMSMasterKeyID is given only with the aws:kms algorithm",
        )),
        Some("AES256") => {
            let mut x = Xml::new();
            x.root("ServerSideEncryptionConfiguration");
            x.open("Rule");
            x.open("ApplyServerSideEncryptionByDefault");
            x.elem("SSEAlgorithm", "AES256");
            x.close("ApplyServerSideEncryptionByDefault");
            // Bucket keys are an SSE-KMS feature: kept and shown as S3 does, of no effect.
            x.elem(
                "BucketKeyEnabled",
                if bucket_key { "true" } else { "false" },
            );
            x.close("Rule");
            x.close("ServerSideEncryptionConfiguration");
            Ok(x.finish().into_bytes())
        }
        Some(v @ ("aws:kms" | "aws:kms:dsse")) => Err(err(
            S3ErrorCode::NotImplemented,
            format!(
                "packrat does not implement SSE-KMS ({v}); a bucket's default encryption can be SSE-S3 (AES256)"
            ),
        )),
        _ => Err(malformed("SSEAlgorithm is AES256, aws:kms or aws:kms:dsse")),
    }
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8; 32], label: &[u8], salt: &[u8]) -> [u8; 32] {
    let mut m = <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC takes any key length");
    m.update(label);
    m.update(salt);
    m.finalize().into_bytes().into()
}

/// An object's AES-256-GCM key.
fn aead_key(key: &[u8; 32]) -> LessSafeKey {
    LessSafeKey::new(UnboundKey::new(&AES_256_GCM, key).expect("AES-256 takes a 32-byte key"))
}

/// An object's cipher and what the answers to its reads and writes say of it.
#[derive(Clone)]
pub struct ObjectCipher {
    cipher: LessSafeKey,
    /// The key `cipher` holds, from which the parts' keys of an object sealed part by part
    /// are derived.
    key: [u8; 32],
    /// SSE-C's key MD5 (base64); `None` for SSE-S3.
    customer_md5: Option<String>,
}

impl ObjectCipher {
    fn new(key: [u8; 32], customer_md5: Option<String>) -> Self {
        Self {
            cipher: aead_key(&key),
            key,
            customer_md5,
        }
    }

    /// A new object's cipher and envelope (the stored header's value).
    pub fn create(store: &dyn Store, how: &Requested) -> S3Result<(Self, String)> {
        match how {
            Requested::S3 => {
                let data_key: [u8; 32] = rand::random();
                let sealed = store.seal_secret(&data_key, DATA_KEY_CONTEXT)?;
                let env = format!("{ENVELOPE_VERSION} s3 {}", B64.encode(sealed));
                Ok((Self::new(data_key, None), env))
            }
            Requested::Customer(c) => {
                let salt: [u8; 32] = rand::random();
                let object_key = hmac(&c.key, b"packrat sse-c object key", &salt);
                let check = hmac(&c.key, b"packrat sse-c check", &salt);
                let env = format!(
                    "{ENVELOPE_VERSION} c {} {} {}",
                    B64.encode(salt),
                    B64.encode(check),
                    c.md5_b64
                );
                Ok((Self::new(object_key, Some(c.md5_b64.clone())), env))
            }
        }
    }

    /// A multipart upload's cipher and envelope: its object is sealed part by part.
    pub fn create_by_part(store: &dyn Store, how: &Requested) -> S3Result<(Self, String)> {
        let (cipher, env) = Self::create(store, how)?;
        Ok((cipher, format!("{env} {}", sealed::BY_PART)))
    }

    /// The cipher of one part of an object sealed part by part, given the part's salt.
    fn part(&self, salt: &[u8]) -> Self {
        Self::new(
            hmac(&self.key, b"packrat sse part key", salt),
            self.customer_md5.clone(),
        )
    }

    /// The cipher of a stored object (`None` if it is not encrypted), given the SSE-C key the
    /// request sent for it. A key sent for an object that needs none, a missing key and a
    /// wrong key are refused as S3 refuses them.
    pub fn open(
        store: &dyn Store,
        obj: &ObjectInfo,
        key: Option<&CustomerKey>,
    ) -> S3Result<Option<Self>> {
        Self::open_envelope(store, envelope(obj), key)
    }

    /// [`Self::open`] for an envelope (an object's or a multipart upload's).
    pub fn open_envelope(
        store: &dyn Store,
        env: Option<&str>,
        key: Option<&CustomerKey>,
    ) -> S3Result<Option<Self>> {
        let Some(env) = env else {
            if key.is_some() {
                return Err(not_applicable());
            }
            return Ok(None);
        };
        let corrupt = || {
            S3Error::from(StoreError::Corrupt(
                "an unreadable encryption envelope".into(),
            ))
        };
        let mut f: Vec<&str> = env.split(' ').collect();
        if f.last() == Some(&sealed::BY_PART) {
            f.pop();
        }
        match f.as_slice() {
            [ENVELOPE_VERSION, "s3", sealed] => {
                if key.is_some() {
                    return Err(not_applicable());
                }
                let sealed = B64.decode(sealed).map_err(|_| corrupt())?;
                let data_key = store.open_secret(&sealed, DATA_KEY_CONTEXT)?;
                let data_key = <[u8; 32]>::try_from(data_key).map_err(|_| corrupt())?;
                Ok(Some(Self::new(data_key, None)))
            }
            [ENVELOPE_VERSION, "c", salt, check, md5] => {
                let Some(k) = key else {
                    return Err(err(
                        S3ErrorCode::InvalidRequest,
                        "The object was stored using a form of Server Side Encryption. The correct parameters must be provided to retrieve the object.",
                    ));
                };
                let salt = B64.decode(salt).map_err(|_| corrupt())?;
                let check = B64.decode(check).map_err(|_| corrupt())?;
                let mut m =
                    <HmacSha256 as Mac>::new_from_slice(&k.key).expect("HMAC takes any key length");
                m.update(b"packrat sse-c check");
                m.update(&salt);
                // Constant time: how much of the check matched says nothing.
                if m.verify_slice(&check).is_err() {
                    return Err(err(
                        S3ErrorCode::AccessDenied,
                        "The customer key given does not match the key the object was stored with",
                    ));
                }
                let object_key = hmac(&k.key, b"packrat sse-c object key", &salt);
                Ok(Some(Self::new(object_key, Some((*md5).to_string()))))
            }
            _ => Err(corrupt()),
        }
    }

    /// Whether the object is SSE-S3 (its data key sealed with the master key).
    pub fn is_sse_s3(&self) -> bool {
        self.customer_md5.is_none()
    }

    /// The headers an answer about the object carries (S3's names and values).
    pub fn response_headers(&self) -> Vec<(&'static str, String)> {
        match &self.customer_md5 {
            None => vec![(SSE, "AES256".to_string())],
            Some(md5) => vec![(C_ALG, "AES256".to_string()), (C_MD5, md5.clone())],
        }
    }

    /// Block `block`'s nonce. Unique under the key: a key seals one object once (SSE-S3 draws
    /// a data key per object, SSE-C derives one per salt).
    fn nonce(block: u64, last: bool) -> Nonce {
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&block.to_be_bytes());
        n[11] = last as u8;
        Nonce::assume_unique_for_key(n)
    }
}

fn not_applicable() -> S3Error {
    err(
        S3ErrorCode::InvalidRequest,
        "The encryption parameters are not applicable to this object.",
    )
}

/// An object's envelope, if it is encrypted.
pub fn envelope(obj: &ObjectInfo) -> Option<&str> {
    sealed::envelope(&obj.attrs.headers)
}

/// The encryption headers an answer about a stored object carries, read from its envelope
/// (without opening it).
pub fn stored_headers(obj: &ObjectInfo) -> Vec<(&'static str, String)> {
    let Some(env) = envelope(obj) else {
        return Vec::new();
    };
    envelope_headers(env)
}

/// The encryption headers an answer about an object or upload with envelope `env` carries.
pub fn envelope_headers(env: &str) -> Vec<(&'static str, String)> {
    let f: Vec<&str> = env.split(' ').collect();
    match f.as_slice() {
        [_, "c", _, _, md5, ..] => {
            vec![(C_ALG, "AES256".to_string()), (C_MD5, (*md5).to_string())]
        }
        _ => vec![(SSE, "AES256".to_string())],
    }
}

/// The size the client sees (the plaintext's).
pub fn shown_size(obj: &ObjectInfo) -> u64 {
    sealed::shown_size(&obj.attrs.headers, obj.size, obj.part_sizes.iter().copied())
}

/// The sizes of a multipart object's parts the client sees (the plaintexts').
pub fn shown_part_sizes(obj: &ObjectInfo) -> Vec<u64> {
    if sealed::is_sealed_by_part(&obj.attrs.headers) {
        obj.part_sizes
            .iter()
            .map(|p| sealed::plain_part_len(*p).unwrap_or(*p))
            .collect()
    } else {
        obj.part_sizes.clone()
    }
}

/// Whether the object's bytes are sealed part by part (so they cannot be copied as they are
/// into an object that is not made of the same parts).
pub fn is_sealed_by_part(obj: &ObjectInfo) -> bool {
    sealed::is_sealed_by_part(&obj.attrs.headers)
}

/// Sets (or clears, with `None`) the envelope among a write's stored headers.
pub fn set_envelope(headers: &mut Vec<(String, String)>, env: Option<String>) {
    headers.retain(|(k, _)| k != SSE_HEADER);
    if let Some(e) = env {
        headers.push((SSE_HEADER.to_string(), e));
    }
}

/// What a sealed write stored, and what its answer says of it.
pub struct SealedPut {
    pub stored: ObjectInfo,
    /// The encryption headers of the answer.
    pub headers: Vec<(&'static str, String)>,
    /// The plaintext's flexible checksum (raw bytes), when `put` asked for one.
    pub checksum: Option<Vec<u8>>,
}

/// Stores `source`'s plaintext sealed as `how` asks, under a new key whose envelope joins
/// `put`'s stored headers. `put` is what a plain write would send: its Content-MD5 and
/// flexible checksum are checked on the plaintext as it is sealed (the store sees only
/// ciphertext, so it cannot).
pub async fn put_sealed(
    store: &dyn Store,
    bucket: &Bucket,
    key: &str,
    source: &mut dyn ByteSource,
    how: &Requested,
    put: PutObject,
) -> S3Result<SealedPut> {
    let (cipher, envelope) = ObjectCipher::create(store, how)?;
    let headers = cipher.response_headers();
    let PutObject {
        mut attrs,
        checksum,
        expected_checksum,
        content_md5,
        condition,
        on_staged,
        version_as,
    } = put;
    set_envelope(&mut attrs.headers, Some(envelope));
    let checks = PlainChecks {
        content_md5,
        checksum,
        expected_checksum,
    };
    let mut body = Sealing::new(source, cipher, checks);
    let put = PutObject {
        attrs,
        condition,
        on_staged,
        version_as,
        ..Default::default()
    };
    let stored = store.put_object(bucket, key, &mut body, put).await?;
    Ok(SealedPut {
        stored,
        headers,
        checksum: body.computed_checksum.take(),
    })
}

/// What a sealed write checks of its plaintext, as a store checks a plain one's bytes.
#[derive(Default)]
pub struct PlainChecks {
    pub content_md5: Option<[u8; 16]>,
    pub checksum: Option<ChecksumAlgorithm>,
    /// Sent up front; one sent as a trailer comes from the inner source at the end.
    pub expected_checksum: Option<Vec<u8>>,
}

/// A byte source that seals another's plaintext block by block, checking its Content-MD5 and
/// flexible checksum as it goes (the store sees only ciphertext, so it cannot).
pub struct Sealing<'a> {
    inner: &'a mut dyn ByteSource,
    cipher: ObjectCipher,
    buf: BytesMut,
    block: u64,
    ended: bool,
    md5: Option<Md5>,
    hasher: Option<Hasher>,
    checks: PlainChecks,
    /// The plaintext's checksum (raw bytes) once it has ended.
    pub computed_checksum: Option<Vec<u8>>,
    /// The plaintext's MD5 once it has ended, when it is computed.
    plain_md5: Option<[u8; 16]>,
    /// Bytes handed out before the first block (a part's salt).
    prefix: Option<Bytes>,
}

impl<'a> Sealing<'a> {
    pub fn new(inner: &'a mut dyn ByteSource, cipher: ObjectCipher, checks: PlainChecks) -> Self {
        let is_sse_s3 = cipher.is_sse_s3();
        Self {
            inner,
            cipher,
            buf: BytesMut::new(),
            block: 0,
            ended: false,
            // SSE-S3 shows the plaintext's MD5 as its ETag, so it is always computed then.
            md5: (checks.content_md5.is_some() || is_sse_s3).then(Md5::new),
            hasher: checks.checksum.map(Hasher::new),
            checks,
            computed_checksum: None,
            plain_md5: None,
            prefix: None,
        }
    }

    /// A source that seals one part of an upload whose object cipher is `upload`: a new salt,
    /// then the part's blocks under the part's key.
    pub fn part(inner: &'a mut dyn ByteSource, upload: &ObjectCipher, checks: PlainChecks) -> Self {
        let salt: [u8; sealed::PART_SALT as usize] = rand::random();
        let mut s = Self::new(inner, upload.part(&salt), checks);
        s.prefix = Some(Bytes::copy_from_slice(&salt));
        s
    }

    /// Seals the first `n` buffered bytes as the next block.
    fn seal(&mut self, n: usize, last: bool) -> Bytes {
        let mut blk = self.buf.split_to(n);
        let nonce = ObjectCipher::nonce(self.block, last);
        self.block += 1;
        let tag = self
            .cipher
            .cipher
            .seal_in_place_separate_tag(nonce, Aad::empty(), &mut blk)
            .expect("AES-GCM seals any block shorter than 64 GiB");
        blk.extend_from_slice(tag.as_ref());
        blk.freeze()
    }

    fn finish_checks(&mut self) -> StoreResult<()> {
        if let Some(m) = self.md5.take() {
            let got: [u8; 16] = m.finalize().into();
            if self.checks.content_md5.is_some_and(|want| want != got) {
                return Err(StoreError::BadDigest(Digest::ContentMd5));
            }
            self.plain_md5 = Some(got);
        }
        if let (Some(h), Some(alg)) = (self.hasher.take(), self.checks.checksum) {
            let (got, _) = h.finish();
            let want = match self.checks.expected_checksum.take() {
                Some(w) => Some(w),
                None => self.inner.trailing_checksum(alg)?,
            };
            if want.is_some_and(|w| w != got) {
                return Err(StoreError::BadDigest(Digest::Checksum(alg)));
            }
            self.computed_checksum = Some(got);
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ByteSource for Sealing<'_> {
    async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
        if let Some(p) = self.prefix.take() {
            return Ok(Some(p));
        }
        let block = BLOCK as usize;
        loop {
            // A full block is sealed only once more follows: the last block is marked.
            if self.buf.len() > block {
                let mut out = BytesMut::new();
                while self.buf.len() > block {
                    out.extend_from_slice(&self.seal(block, false));
                }
                return Ok(Some(out.freeze()));
            }
            if self.ended {
                return Ok(None);
            }
            match self.inner.next_piece().await? {
                Some(p) => {
                    if let Some(m) = self.md5.as_mut() {
                        m.update(&p);
                    }
                    if let Some(h) = self.hasher.as_mut() {
                        h.update(&p);
                    }
                    self.buf.extend_from_slice(&p);
                }
                None => {
                    self.ended = true;
                    self.finish_checks()?;
                    let n = self.buf.len();
                    return Ok(Some(self.seal(n, true)));
                }
            }
        }
    }

    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        // The store is asked for no checksum of the ciphertext.
        Ok(None)
    }

    /// An SSE-S3 object's ETag is its plaintext's MD5, as in S3; an SSE-C object's stays the
    /// stored bytes' (S3's is not the plaintext's MD5 either); the same for a part. A cluster
    /// store takes it for whole objects (its nodes keep the stored bytes' MD5 beside it for
    /// the checks of their copies), not for parts.
    fn shown_md5(&self) -> Option<[u8; 16]> {
        if self.cipher.is_sse_s3() {
            self.plain_md5
        } else {
            None
        }
    }
}

/// Plaintext bytes `[start, end)` of a sealed object (`size` is the plaintext's), reading and
/// authenticating only the blocks they fall in.
pub fn read_plain(
    store: &dyn Store,
    obj: &ObjectInfo,
    cipher: ObjectCipher,
    start: u64,
    end: u64,
) -> StoreResult<Box<dyn ObjectRead>> {
    if is_sealed_by_part(obj) {
        return read_plain_parts(store, obj, cipher, start, end);
    }
    let size = shown_size(obj);
    let last_block = sealed::blocks(size) - 1;
    let first = if end > start { start / BLOCK } else { 0 };
    let last = if end > start { (end - 1) / BLOCK } else { 0 };
    let cstart = first * (BLOCK + TAG);
    let cend = ((last + 1) * (BLOCK + TAG)).min(obj.size);
    let inner = store.read_object(obj, cstart, cend)?;
    Ok(Box::new(Opening {
        inner,
        cipher,
        buf: BytesMut::new(),
        block: first,
        last_block,
        object_size: size,
        skip: (start - first * BLOCK) as usize,
        remaining: end - start,
    }))
}

struct Opening {
    inner: Box<dyn ObjectRead>,
    cipher: ObjectCipher,
    buf: BytesMut,
    /// The next block to open.
    block: u64,
    last_block: u64,
    object_size: u64,
    /// Plaintext bytes still to drop from the front (the start of the first block).
    skip: usize,
    /// Plaintext bytes still to hand out.
    remaining: u64,
}

impl Opening {
    /// The sealed length of block `b`.
    fn sealed_block_len(&self, b: u64) -> usize {
        let plain = if b == self.last_block {
            self.object_size - b * BLOCK
        } else {
            BLOCK
        };
        (plain + TAG) as usize
    }

    /// Opens every whole block buffered, handing out the plaintext asked for.
    fn open_buffered(&mut self, out: &mut BytesMut) -> StoreResult<()> {
        while self.remaining > 0 {
            let n = self.sealed_block_len(self.block);
            if self.buf.len() < n {
                break;
            }
            let mut blk = self.buf.split_to(n);
            let tag = blk.split_off(n - TAG as usize);
            let nonce = ObjectCipher::nonce(self.block, self.block == self.last_block);
            let tag = Tag::try_from(&tag[..]).expect("a tag is TAG bytes");
            self.cipher
                .cipher
                .open_in_place_separate_tag(nonce, Aad::empty(), tag, &mut blk, 0..)
                .map_err(|_| {
                    StoreError::Corrupt(format!(
                        "encrypted block {} fails its authentication tag",
                        self.block
                    ))
                })?;
            self.block += 1;
            let from = self.skip.min(blk.len());
            self.skip -= from;
            let take = ((blk.len() - from) as u64).min(self.remaining) as usize;
            out.extend_from_slice(&blk[from..from + take]);
            self.remaining -= take as u64;
        }
        Ok(())
    }
}

#[async_trait::async_trait]
impl ObjectRead for Opening {
    async fn next(&mut self) -> StoreResult<Option<Bytes>> {
        loop {
            if self.remaining == 0 {
                return Ok(None);
            }
            // What is buffered first (a part's blocks may come with its salt).
            let mut out = BytesMut::new();
            self.open_buffered(&mut out)?;
            if !out.is_empty() {
                return Ok(Some(out.freeze()));
            }
            match self.inner.next().await? {
                Some(p) => self.buf.extend_from_slice(&p),
                None => {
                    return Err(StoreError::Corrupt(
                        "an encrypted object shorter than its blocks".into(),
                    ));
                }
            }
        }
    }

    fn is_single_piece(&self) -> bool {
        self.inner.is_single_piece()
    }
}

/// [`read_plain`] of an object sealed part by part: for each part the range touches, its salt
/// (read with the blocks when the range starts in the part's first block, else on its own)
/// and the blocks the range falls in.
fn read_plain_parts(
    store: &dyn Store,
    obj: &ObjectInfo,
    cipher: ObjectCipher,
    start: u64,
    end: u64,
) -> StoreResult<Box<dyn ObjectRead>> {
    let mut plans = std::collections::VecDeque::new();
    let (mut stored_at, mut plain_at) = (0u64, 0u64);
    for &stored in &obj.part_sizes {
        let plain = sealed::plain_part_len(stored).ok_or_else(|| {
            StoreError::Corrupt("an encrypted part of a size no plaintext seals to".into())
        })?;
        let (a, z) = (start.max(plain_at), end.min(plain_at + plain));
        if a < z {
            let (a, z) = (a - plain_at, z - plain_at);
            let (first, last) = (a / BLOCK, (z - 1) / BLOCK);
            let blocks_at = stored_at + sealed::PART_SALT;
            let cend = (blocks_at + (last + 1) * (BLOCK + TAG)).min(stored_at + stored);
            let (salt, blocks) = if first == 0 {
                (None, store.read_object(obj, stored_at, cend)?)
            } else {
                (
                    Some(store.read_object(obj, stored_at, blocks_at)?),
                    store.read_object(obj, blocks_at + first * (BLOCK + TAG), cend)?,
                )
            };
            plans.push_back(PartPlan {
                salt,
                blocks,
                first,
                last_block: sealed::blocks(plain) - 1,
                plain,
                skip: (a - first * BLOCK) as usize,
                remaining: z - a,
            });
        }
        stored_at += stored;
        plain_at += plain;
    }
    Ok(Box::new(OpeningParts {
        cipher,
        plans,
        current: None,
    }))
}

/// What [`OpeningParts`] reads of one part.
struct PartPlan {
    /// The part's salt, when it is not in front of `blocks`.
    salt: Option<Box<dyn ObjectRead>>,
    blocks: Box<dyn ObjectRead>,
    first: u64,
    last_block: u64,
    plain: u64,
    skip: usize,
    remaining: u64,
}

struct OpeningParts {
    /// The object's cipher (each part's is derived from it and the part's salt).
    cipher: ObjectCipher,
    plans: std::collections::VecDeque<PartPlan>,
    current: Option<Opening>,
}

#[async_trait::async_trait]
impl ObjectRead for OpeningParts {
    async fn next(&mut self) -> StoreResult<Option<Bytes>> {
        loop {
            if let Some(cur) = self.current.as_mut() {
                if let Some(p) = cur.next().await? {
                    return Ok(Some(p));
                }
                self.current = None;
            }
            let Some(mut plan) = self.plans.pop_front() else {
                return Ok(None);
            };
            let salt_len = sealed::PART_SALT as usize;
            let mut buf = BytesMut::new();
            let mut blocks = plan.blocks;
            let from: &mut Box<dyn ObjectRead> = match plan.salt.as_mut() {
                Some(s) => s,
                None => &mut blocks,
            };
            while buf.len() < salt_len {
                match from.next().await? {
                    Some(p) => buf.extend_from_slice(&p),
                    None => {
                        return Err(StoreError::Corrupt(
                            "an encrypted part shorter than its salt".into(),
                        ));
                    }
                }
            }
            let salt = buf.split_to(salt_len);
            if plan.salt.is_some() {
                buf.clear();
            }
            self.current = Some(Opening {
                inner: blocks,
                cipher: self.cipher.part(&salt),
                buf,
                block: plan.first,
                last_block: plan.last_block,
                object_size: plan.plain,
                skip: plan.skip,
                remaining: plan.remaining,
            });
        }
    }

    fn is_single_piece(&self) -> bool {
        false
    }
}

/// A byte source of an object's plaintext (a copy's source), decrypted if it is sealed.
pub struct PlainSource {
    reader: Box<dyn ObjectRead>,
}

impl PlainSource {
    pub fn new(
        store: &dyn Store,
        obj: &ObjectInfo,
        cipher: Option<ObjectCipher>,
    ) -> StoreResult<Self> {
        Self::range(store, obj, cipher, 0, shown_size(obj))
    }

    /// Plaintext bytes `[start, end)` (an UploadPartCopy's source range).
    pub fn range(
        store: &dyn Store,
        obj: &ObjectInfo,
        cipher: Option<ObjectCipher>,
        start: u64,
        end: u64,
    ) -> StoreResult<Self> {
        let reader = match cipher {
            Some(c) => read_plain(store, obj, c, start, end)?,
            None => store.read_object(obj, start, end)?,
        };
        Ok(Self { reader })
    }
}

#[async_trait::async_trait]
impl ByteSource for PlainSource {
    async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
        self.reader.next().await
    }

    fn trailing_checksum(&self, _alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A source of fixed pieces.
    struct Pieces(std::collections::VecDeque<Bytes>);

    #[async_trait::async_trait]
    impl ByteSource for Pieces {
        async fn next_piece(&mut self) -> StoreResult<Option<Bytes>> {
            Ok(self.0.pop_front())
        }
        fn trailing_checksum(&self, _: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>> {
            Ok(None)
        }
    }

    struct Reader(std::collections::VecDeque<Bytes>);

    #[async_trait::async_trait]
    impl ObjectRead for Reader {
        async fn next(&mut self) -> StoreResult<Option<Bytes>> {
            Ok(self.0.pop_front())
        }
        fn is_single_piece(&self) -> bool {
            false
        }
    }

    fn cipher(key: [u8; 32]) -> ObjectCipher {
        ObjectCipher::new(key, None)
    }

    fn seal_all(plain: &[u8], piece: usize) -> Vec<u8> {
        let pieces = plain
            .chunks(piece.max(1))
            .map(Bytes::copy_from_slice)
            .collect();
        let mut src = Pieces(pieces);
        let mut s = Sealing::new(&mut src, cipher([7; 32]), PlainChecks::default());
        let mut out = Vec::new();
        futures_executor_block_on(async {
            while let Some(p) = s.next_piece().await.unwrap() {
                out.extend_from_slice(&p);
            }
        });
        out
    }

    fn futures_executor_block_on<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(f)
    }

    fn open_range(sealed_bytes: &[u8], size: u64, start: u64, end: u64) -> StoreResult<Vec<u8>> {
        let first = if end > start { start / BLOCK } else { 0 };
        let last = if end > start { (end - 1) / BLOCK } else { 0 };
        let cstart = (first * (BLOCK + TAG)) as usize;
        let cend = (((last + 1) * (BLOCK + TAG)) as usize).min(sealed_bytes.len());
        // Hand the sealed bytes over in odd-sized pieces.
        let pieces = sealed_bytes[cstart..cend]
            .chunks(10_007)
            .map(Bytes::copy_from_slice)
            .collect();
        let mut r = Opening {
            inner: Box::new(Reader(pieces)),
            cipher: cipher([7; 32]),
            buf: BytesMut::new(),
            block: first,
            last_block: sealed::blocks(size) - 1,
            object_size: size,
            skip: (start - first * BLOCK) as usize,
            remaining: end - start,
        };
        futures_executor_block_on(async {
            let mut out = Vec::new();
            while let Some(p) = r.next().await? {
                out.extend_from_slice(&p);
            }
            Ok(out)
        })
    }

    #[test]
    fn sealed_sizes_follow_the_layout_and_ranges_round_trip() {
        let b = BLOCK as usize;
        for size in [0usize, 1, 100, b - 1, b, b + 1, 3 * b + 77] {
            let plain: Vec<u8> = (0..size).map(|i| (i * 31 % 251) as u8).collect();
            for piece in [1000, b, 3 * b] {
                let s = seal_all(&plain, piece);
                assert_eq!(
                    s.len() as u64,
                    sealed::sealed_len(size as u64),
                    "{size}/{piece}"
                );
                assert_eq!(open_range(&s, size as u64, 0, size as u64).unwrap(), plain);
            }
            let s = seal_all(&plain, 4096);
            for (a, z) in [(0, 1), (5, 70_000), (b - 3, b + 3), (size / 2, size)] {
                if a < z && z <= size {
                    let got = open_range(&s, size as u64, a as u64, z as u64).unwrap();
                    assert_eq!(got, &plain[a..z], "{size} {a}-{z}");
                }
            }
        }
    }

    #[test]
    fn a_changed_moved_or_cut_block_fails() {
        let b = BLOCK as usize;
        let plain = vec![9u8; 2 * b + 10];
        let s = seal_all(&plain, b);
        let n = plain.len() as u64;
        let mut flipped = s.clone();
        flipped[5] ^= 1;
        assert!(open_range(&flipped, n, 0, n).is_err());
        // Blocks 0 and 1 swapped (same length).
        let bl = b + TAG as usize;
        let mut swapped = s[bl..2 * bl].to_vec();
        swapped.extend_from_slice(&s[..bl]);
        swapped.extend_from_slice(&s[2 * bl..]);
        assert!(open_range(&swapped, n, 0, n).is_err());
        // Cut after two whole blocks: block 1 read as the last one fails.
        let cut = &s[..2 * bl];
        assert!(open_range(cut, 2 * BLOCK, 0, 2 * BLOCK).is_err());
    }

    #[test]
    fn plaintext_checks_run_on_the_plaintext() {
        let plain = b"hello world".to_vec();
        let md5: [u8; 16] = Md5::digest(&plain).into();
        for (sent, ok) in [(md5, true), ([0u8; 16], false)] {
            let mut src = Pieces([Bytes::from(plain.clone())].into());
            let checks = PlainChecks {
                content_md5: Some(sent),
                ..Default::default()
            };
            let mut s = Sealing::new(&mut src, cipher([1; 32]), checks);
            let r = futures_executor_block_on(async {
                while s.next_piece().await?.is_some() {}
                Ok::<_, StoreError>(())
            });
            assert_eq!(r.is_ok(), ok);
        }
    }
}
