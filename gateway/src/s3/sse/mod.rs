//! Server-side encryption: SSE-S3 (`x-amz-server-side-encryption: AES256`, a data key per
//! object sealed with the store's master key), SSE-KMS (`aws:kms`, a data key per object sealed
//! under a named key of the store's key provider, see `kms.rs`) and SSE-C
//! (`x-amz-server-side-encryption-customer-*`, the customer's key, never stored).
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
//! - `1 kms <key id> <data key sealed under that KMS key, base64>`;
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
use packrat_store_api::kms::KmsKey;
use packrat_store_api::sealed::{self, BLOCK, SSE_HEADER, TAG};
use packrat_store_api::{
    Bucket, BucketConfig, ByteSource, Digest, Identity, ObjectInfo, ObjectRead, PutObject, Store,
    StoreError, StoreResult,
};
use std::sync::Arc;
// ring's AES-256-GCM (assembly, AES-NI and carry-less multiply) seals a 4 KiB block in about
// 0.9 µs on this project's machines; RustCrypto's `aes-gcm` took 6 to 10 µs in our one build
// profile (measured 2026-11-26, docs/benchmark-log.md). ring is already in the tree (rustls).
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, Tag, UnboundKey};
use sha2::Sha256;

mod kms;
mod stream;
pub use kms::*;
pub use stream::*;

const SSE: &str = "x-amz-server-side-encryption";
const C_ALG: &str = "x-amz-server-side-encryption-customer-algorithm";
const C_KEY: &str = "x-amz-server-side-encryption-customer-key";
const C_MD5: &str = "x-amz-server-side-encryption-customer-key-md5";
const COPY_C_ALG: &str = "x-amz-copy-source-server-side-encryption-customer-algorithm";
const COPY_C_KEY: &str = "x-amz-copy-source-server-side-encryption-customer-key";
const COPY_C_MD5: &str = "x-amz-copy-source-server-side-encryption-customer-key-md5";
/// What an SSE-S3 data key is sealed against (the master key opens it for nothing else).
const DATA_KEY_CONTEXT: &[u8] = b"packrat sse-s3 data key v1";
const KMS_KEY_ID: &str = "x-amz-server-side-encryption-aws-kms-key-id";
const KMS_CONTEXT: &str = "x-amz-server-side-encryption-context";
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
    /// SSE-KMS under the key the request names (`None`: the default key), as asked: a write
    /// seals only after [`resolve`] has found the key and checked that the writer may use it.
    KmsAsked(Option<String>),
    /// SSE-KMS under this key, which the writer may use.
    Kms(KmsKey),
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
    if h.contains_key(KMS_CONTEXT) {
        return Err(err(
            S3ErrorCode::NotImplemented,
            format!("packrat does not implement SSE-KMS encryption contexts ({KMS_CONTEXT})"),
        ));
    }
    let kms = header(h, SSE) == Some("aws:kms");
    if header(h, KMS_KEY_ID).is_some() && !kms {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            format!("{KMS_KEY_ID} is given only with {SSE}: aws:kms"),
        ));
    }
    // Bucket keys save AWS KMS calls; packrat's provider is in the server, so they change
    // nothing there and are taken with SSE-KMS.
    if !kms
        && header(h, "x-amz-server-side-encryption-bucket-key-enabled")
            .is_some_and(|v| !v.eq_ignore_ascii_case("false"))
    {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "S3 Bucket Keys are an SSE-KMS feature: send them with x-amz-server-side-encryption: aws:kms",
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
        (Some("aws:kms"), None) => Ok(Some(Requested::KmsAsked(
            header(h, KMS_KEY_ID).map(|k| k.trim().to_string()),
        ))),
        (Some("aws:kms:dsse"), None) => Err(err(
            S3ErrorCode::NotImplemented,
            "packrat does not implement dual-layer SSE-KMS (aws:kms:dsse); use aws:kms, AES256 or SSE-C",
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

/// The cipher of a CopyObject's or UploadPartCopy's source, opened with the SSE-C key and for
/// the caller the request sends.
pub fn open_copy_source(
    store: &dyn Store,
    req: &S3Request,
    src: &ObjectInfo,
) -> S3Result<Option<ObjectCipher>> {
    ObjectCipher::open(
        store,
        src,
        copy_source_key(req)?.as_ref(),
        req.identity.as_ref(),
    )
}

/// The cipher of an object a GET, HEAD or GetObjectAttributes reads, opened with the SSE-C
/// key and for the caller the request sends.
pub fn open_for_read(
    store: &dyn Store,
    req: &S3Request,
    obj: &ObjectInfo,
) -> S3Result<Option<ObjectCipher>> {
    ObjectCipher::open(store, obj, read_key(req)?.as_ref(), req.identity.as_ref())
}

pub use crate::state::BucketDefault;

/// The encryption a write gets: what its headers ask for, else its bucket's default, with an
/// SSE-KMS key found and the writer's use of it checked.
pub async fn for_write(
    state: &AppState,
    req: &S3Request,
    b: &Bucket,
) -> S3Result<Option<Requested>> {
    or_default(state, b, req.identity.as_ref(), requested(req)?).await
}

/// `asked`, or the bucket's default when a write asks for no encryption, resolved for the
/// writer `who` (see [`resolve`]).
pub async fn or_default(
    state: &AppState,
    b: &Bucket,
    who: Option<&Identity>,
    asked: Option<Requested>,
) -> S3Result<Option<Requested>> {
    let how = match asked {
        Some(r) => Some(r),
        None => bucket_default(state, b).await?,
    };
    resolve(state, who, how).await
}

/// The bucket's default encryption, from this gateway's cache or the store.
async fn bucket_default(state: &AppState, b: &Bucket) -> S3Result<Option<Requested>> {
    let asked = |d: &BucketDefault| match d {
        BucketDefault::S3 => Requested::S3,
        BucketDefault::Kms(key) => Requested::KmsAsked(key.clone()),
    };
    let generation = match state.bucket_encryption.fresh(b.id) {
        Ok(d) => return Ok(d.as_deref().map(asked)),
        Err(g) => g,
    };
    let doc = state
        .store
        .get_bucket_config(b, BucketConfig::Encryption)
        .await?;
    let d = match doc {
        None => None,
        Some(doc) => Some(Arc::new(bucket_default_doc(&xml::parse(&doc)?)?.1)),
    };
    state.bucket_encryption.store(b.id, d.clone(), generation);
    Ok(d.as_deref().map(asked))
}

/// Checks a PutBucketEncryption body: the document GetBucketEncryption shows, and the default
/// it sets.
pub fn bucket_default_doc(
    doc: &xml::ServerSideEncryptionConfiguration,
) -> S3Result<(Vec<u8>, BucketDefault)> {
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
    let kms_key = by_default
        .kms_key_id
        .as_deref()
        .map(str::trim)
        .filter(|k| !k.is_empty());
    let default = match by_default.algorithm.as_deref().map(str::trim) {
        Some("AES256") if kms_key.is_some() => {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "KMSMasterKeyID is given only with the aws:kms algorithm",
            ));
        }
        Some("AES256") => BucketDefault::S3,
        Some("aws:kms") => BucketDefault::Kms(kms_key.map(str::to_string)),
        Some("aws:kms:dsse") => {
            return Err(err(
                S3ErrorCode::NotImplemented,
                "packrat does not implement dual-layer SSE-KMS (aws:kms:dsse); a bucket's default encryption can be AES256 or aws:kms",
            ));
        }
        _ => return Err(malformed("SSEAlgorithm is AES256, aws:kms or aws:kms:dsse")),
    };
    let mut x = Xml::new();
    x.root("ServerSideEncryptionConfiguration");
    x.open("Rule");
    x.open("ApplyServerSideEncryptionByDefault");
    match &default {
        BucketDefault::S3 => x.elem("SSEAlgorithm", "AES256"),
        BucketDefault::Kms(key) => {
            x.elem("SSEAlgorithm", "aws:kms");
            if let Some(k) = key {
                x.elem("KMSMasterKeyID", k);
            }
        }
    }
    x.close("ApplyServerSideEncryptionByDefault");
    // Bucket keys save AWS KMS calls: kept and shown as S3 does, of no effect here.
    x.elem(
        "BucketKeyEnabled",
        if bucket_key { "true" } else { "false" },
    );
    x.close("Rule");
    x.close("ServerSideEncryptionConfiguration");
    Ok((x.finish().into_bytes(), default))
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
    /// SSE-C's key MD5 (base64); `None` for SSE-S3 and SSE-KMS.
    customer_md5: Option<String>,
    /// SSE-KMS's key id; `None` for SSE-S3 and SSE-C.
    kms_key: Option<String>,
}

impl ObjectCipher {
    fn new(key: [u8; 32], customer_md5: Option<String>) -> Self {
        Self {
            cipher: aead_key(&key),
            key,
            customer_md5,
            kms_key: None,
        }
    }

    /// A new object's cipher and envelope (the stored header's value).
    pub fn create(store: &dyn Store, how: &Requested) -> S3Result<(Self, String)> {
        match how {
            Requested::Kms(k) => Ok(kms::create(store, k)?),
            Requested::KmsAsked(_) => Err(StoreError::internal(
                "SSE-KMS",
                "a write sealed before its KMS key was resolved",
            )
            .into()),
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
        Self {
            kms_key: self.kms_key.clone(),
            ..Self::new(
                hmac(&self.key, b"packrat sse part key", salt),
                self.customer_md5.clone(),
            )
        }
    }

    /// The cipher of a stored object (`None` if it is not encrypted), given the SSE-C key the
    /// request sent for it, for the caller `who`. A key sent for an object that needs none, a
    /// missing key, a wrong key and an SSE-KMS key the caller may not use are refused as S3
    /// refuses them.
    pub fn open(
        store: &dyn Store,
        obj: &ObjectInfo,
        key: Option<&CustomerKey>,
        who: Option<&Identity>,
    ) -> S3Result<Option<Self>> {
        Self::open_envelope(store, envelope(obj), key, who)
    }

    /// [`Self::open`] for an envelope (an object's or a multipart upload's).
    pub fn open_envelope(
        store: &dyn Store,
        env: Option<&str>,
        key: Option<&CustomerKey>,
        who: Option<&Identity>,
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
            [ENVELOPE_VERSION, "kms", id, sealed] => {
                if key.is_some() {
                    return Err(not_applicable());
                }
                let sealed = B64.decode(sealed).map_err(|_| corrupt())?;
                Ok(Some(kms::open(store, id, &sealed, who)?))
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
        self.customer_md5.is_none() && self.kms_key.is_none()
    }

    /// The headers an answer about the object carries (S3's names and values).
    pub fn response_headers(&self) -> Vec<(&'static str, String)> {
        match (&self.customer_md5, &self.kms_key) {
            (Some(md5), _) => vec![(C_ALG, "AES256".to_string()), (C_MD5, md5.clone())],
            (None, Some(id)) => kms::response_headers(id),
            (None, None) => vec![(SSE, "AES256".to_string())],
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
        [_, "kms", id, ..] => kms::response_headers(id),
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
