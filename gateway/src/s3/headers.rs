//! Request headers an S3 operation reads: object metadata and stored headers, tagging,
//! checksums and Content-MD5, write and read conditions, the copy source and its conditions.
//! Pure functions of the header map, so the handlers and the `request_headers` fuzz target
//! run the same parsers.

use super::checksum::{self, ChecksumAlgorithm, ChecksumWire};
use super::error::{S3Error, S3ErrorCode, S3Result};
use super::tagging::Tags;
use crate::config;
use base64::Engine as _;
use http::{HeaderMap, HeaderName};
use packrat_store_api::{ObjectAttrs, WriteCondition, etag_matches};

fn err(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::new(code, msg)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Names looked up on every request of some kind, parsed once (a lookup by `&str` parses the
/// name each time).
pub static X_AMZ_CONTENT_SHA256: HeaderName = HeaderName::from_static("x-amz-content-sha256");
pub static X_AMZ_DATE: HeaderName = HeaderName::from_static("x-amz-date");
pub static X_AMZ_DECODED_CONTENT_LENGTH: HeaderName =
    HeaderName::from_static("x-amz-decoded-content-length");
pub static X_AMZ_COPY_SOURCE: HeaderName = HeaderName::from_static("x-amz-copy-source");
/// Every answer's request ids (named once: a name given as text is parsed on each use).
pub static X_AMZ_REQUEST_ID: HeaderName = HeaderName::from_static("x-amz-request-id");
pub static X_AMZ_ID_2: HeaderName = HeaderName::from_static("x-amz-id-2");

/// A request's headers and which optional kinds of header among them ([`Kind`]), found in one
/// pass over the names when the request is parsed. Most requests carry none of those kinds,
/// and each lookup by name parses and hashes the name (37 of them per plain PUT cost 4% of its
/// instructions: docs/benchmark-log.md, "Header kinds"), so a parser of optional headers looks
/// them up only when their kind is present. The only way to make one is [`RequestHeaders::new`],
/// so the kinds always describe the map; it dereferences to the map for every other use.
pub struct RequestHeaders {
    map: HeaderMap,
    kinds: u16,
}

/// Kinds of optional request header, as bits of [`RequestHeaders`].
#[derive(Clone, Copy)]
#[repr(u16)]
pub enum Kind {
    /// `x-amz-server-side-encryption*`.
    Encryption = 1,
    /// `x-amz-copy-source-server-side-encryption*`.
    CopySourceEncryption = 1 << 1,
    /// `x-amz-checksum-*`, `x-amz-trailer`, `x-amz-sdk-checksum-algorithm`.
    Checksum = 1 << 2,
    /// `x-amz-meta-*`.
    UserMeta = 1 << 3,
    /// The headers an object keeps ([`STORED_HEADERS`]).
    Stored = 1 << 4,
    /// `x-amz-acl`, `x-amz-grant-*`.
    Acl = 1 << 5,
    /// `x-amz-object-lock-*`.
    ObjectLock = 1 << 6,
    /// `x-amz-tagging`.
    Tagging = 1 << 7,
    /// `x-amz-storage-class`.
    StorageClass = 1 << 8,
    /// `if-match`, `if-none-match`, `if-modified-since`, `if-unmodified-since`.
    Condition = 1 << 9,
    /// `x-amz-copy-source-if-*`.
    CopySourceCondition = 1 << 10,
    /// `content-md5`.
    ContentMd5 = 1 << 11,
}

impl Kind {
    /// The kind of a header name, if it is one of them.
    fn of(name: &str) -> Option<Kind> {
        let Some(amz) = name.strip_prefix("x-amz-") else {
            return match name {
                "if-match" | "if-none-match" | "if-modified-since" | "if-unmodified-since" => {
                    Some(Kind::Condition)
                }
                "content-md5" => Some(Kind::ContentMd5),
                n if STORED_HEADERS.contains(&n) => Some(Kind::Stored),
                _ => None,
            };
        };
        if amz.starts_with("server-side-encryption") {
            Some(Kind::Encryption)
        } else if amz.starts_with("meta-") {
            Some(Kind::UserMeta)
        } else if amz.starts_with("checksum-")
            || amz == "trailer"
            || amz == "sdk-checksum-algorithm"
        {
            Some(Kind::Checksum)
        } else if let Some(src) = amz.strip_prefix("copy-source-") {
            if src.starts_with("server-side-encryption") {
                Some(Kind::CopySourceEncryption)
            } else if src.starts_with("if-") {
                Some(Kind::CopySourceCondition)
            } else {
                None
            }
        } else if amz == "acl" || amz.starts_with("grant-") {
            Some(Kind::Acl)
        } else if amz.starts_with("object-lock-") {
            Some(Kind::ObjectLock)
        } else if amz == "tagging" {
            Some(Kind::Tagging)
        } else if amz == "storage-class" {
            Some(Kind::StorageClass)
        } else {
            None
        }
    }
}

impl RequestHeaders {
    pub fn new(map: HeaderMap) -> Self {
        let kinds = map
            .keys()
            .filter_map(|k| Kind::of(k.as_str()))
            .fold(0, |acc, k| acc | k as u16);
        Self { map, kinds }
    }

    /// Every kind marked present, so every parser looks its headers up: what parsing did
    /// before kinds existed, kept for tests that compare the two.
    pub fn unscanned(map: HeaderMap) -> Self {
        Self {
            map,
            kinds: u16::MAX,
        }
    }

    /// Whether any header of `kind` is present.
    pub fn has(&self, kind: Kind) -> bool {
        self.kinds & kind as u16 != 0
    }

    pub fn map(&self) -> &HeaderMap {
        &self.map
    }
}

impl std::ops::Deref for RequestHeaders {
    type Target = HeaderMap;

    fn deref(&self) -> &HeaderMap {
        &self.map
    }
}

/// Metadata and stored headers taken from a PUT, COPY (REPLACE) or CreateMultipartUpload.
pub struct ObjectMeta {
    pub content_type: Option<String>,
    pub headers: Vec<(String, String)>,
    pub user_meta: Vec<(String, String)>,
    pub storage_class: Option<String>,
    /// From `x-amz-tagging`.
    pub tags: Tags,
}

impl ObjectMeta {
    pub fn into_attrs(self, last_modified_ms: i64) -> ObjectAttrs {
        ObjectAttrs {
            last_modified_ms,
            content_type: self.content_type,
            headers: self.headers,
            user_meta: self.user_meta,
            storage_class: self.storage_class,
            tags: self.tags,
        }
    }
}

pub const STORED_HEADERS: [&str; 5] = [
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
];

/// `is_storage_class` says whether a storage class other than STANDARD is configured.
pub fn object_meta(
    headers: &RequestHeaders,
    is_storage_class: &dyn Fn(&str) -> bool,
) -> S3Result<ObjectMeta> {
    let mut user_meta = Vec::new();
    let mut meta_bytes = 0;
    let meta = headers.has(Kind::UserMeta).then_some(headers.map());
    for (k, v) in meta.into_iter().flatten() {
        if let Some(n) = k.as_str().strip_prefix("x-amz-meta-") {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
            let v = super::rfc2047::decode(&v).unwrap_or(v);
            meta_bytes += n.len() + v.len();
            user_meta.push((n.to_string(), v));
        }
    }
    if meta_bytes > config::USER_METADATA_BYTES_MAX {
        return Err(err(
            S3ErrorCode::MetadataTooLarge,
            format!(
                "Your metadata headers exceed the maximum allowed metadata size of {} bytes",
                config::USER_METADATA_BYTES_MAX
            ),
        ));
    }
    user_meta.sort();
    let mut stored = Vec::new();
    let stored_names = if headers.has(Kind::Stored) {
        &STORED_HEADERS[..]
    } else {
        &[]
    };
    for &h in stored_names {
        if let Some(v) = headers.get(h).and_then(|v| v.to_str().ok()) {
            let v = if h == "content-encoding" {
                // aws-chunked describes the transfer, not the object: S3 drops it.
                v.split(',')
                    .map(str::trim)
                    .filter(|e| !e.eq_ignore_ascii_case("aws-chunked") && !e.is_empty())
                    .collect::<Vec<_>>()
                    .join(",")
            } else {
                v.to_string()
            };
            if !v.is_empty() {
                stored.push((h.to_string(), v));
            }
        }
    }
    let storage_class = match headers
        .has(Kind::StorageClass)
        .then(|| header(headers, "x-amz-storage-class"))
        .flatten()
    {
        None | Some("STANDARD") => None,
        Some(c) if is_storage_class(c) => Some(c.to_string()),
        Some(c) => {
            return Err(err(
                S3ErrorCode::InvalidStorageClass,
                format!(
                    "The storage class {c} is not configured on this server: STANDARD, or a tier given with packrat serve --tier CLASS=..."
                ),
            ));
        }
    };
    let tags = match headers
        .has(Kind::Tagging)
        .then(|| headers.get("x-amz-tagging"))
        .flatten()
    {
        None => Tags::new(),
        Some(v) => super::tagging::parse_header(v.to_str().map_err(|_| {
            err(
                S3ErrorCode::InvalidTag,
                "The x-amz-tagging header must be URL-encoded ASCII",
            )
        })?)?,
    };
    Ok(ObjectMeta {
        content_type: headers
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        headers: stored,
        user_meta,
        storage_class,
        tags,
    })
}

/// Whether a write carries any `x-amz-object-lock-*` header.
pub fn asks_object_lock(headers: &RequestHeaders) -> bool {
    headers.has(Kind::ObjectLock)
}

pub fn write_condition(headers: &RequestHeaders) -> S3Result<WriteCondition> {
    if !headers.has(Kind::Condition) {
        return Ok(WriteCondition::default());
    }
    let inm = headers.get("if-none-match").and_then(|v| v.to_str().ok());
    if let Some(v) = inm
        && v.trim() != "*"
    {
        return Err(err(
            S3ErrorCode::NotImplemented,
            "If-None-Match on writes supports only '*'",
        ));
    }
    Ok(WriteCondition {
        if_none_match_any: inm.is_some(),
        if_match: headers
            .get("if-match")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
    })
}

/// The checksum algorithm of a write and the value sent up front (header), if any. A
/// trailer-announced checksum is verified when the body ends.
pub fn requested_checksum(
    headers: &RequestHeaders,
) -> S3Result<(Option<ChecksumAlgorithm>, Option<Vec<u8>>)> {
    if !headers.has(Kind::Checksum) {
        return Ok((None, None));
    }
    let mut found: Option<(ChecksumAlgorithm, Vec<u8>)> = None;
    for alg in checksum::ALL {
        if let Some(v) = headers.get(alg.header()).and_then(|v| v.to_str().ok()) {
            if found.is_some() {
                return Err(err(
                    S3ErrorCode::InvalidRequest,
                    "Expecting a single x-amz-checksum- header. Multiple checksum Types are not allowed.",
                ));
            }
            found = Some((alg, checksum::decode_sent(alg, v)?));
        }
    }
    if let Some((alg, v)) = found {
        return Ok((Some(alg), Some(v)));
    }
    if let Some(t) = headers.get("x-amz-trailer").and_then(|v| v.to_str().ok()) {
        let alg = ChecksumAlgorithm::from_header(t.trim()).ok_or_else(|| {
            err(
                S3ErrorCode::InvalidRequest,
                format!("The trailer {t} is not a supported checksum"),
            )
        })?;
        return Ok((Some(alg), None));
    }
    match headers
        .get("x-amz-sdk-checksum-algorithm")
        .and_then(|v| v.to_str().ok())
    {
        Some(a) => Ok((Some(ChecksumAlgorithm::parse(a)?), None)),
        None => Ok((None, None)),
    }
}

pub fn content_md5(headers: &RequestHeaders) -> S3Result<Option<[u8; 16]>> {
    if !headers.has(Kind::ContentMd5) {
        return Ok(None);
    }
    match headers.get("content-md5").and_then(|v| v.to_str().ok()) {
        None => Ok(None),
        Some(v) => base64::engine::general_purpose::STANDARD
            .decode(v.trim())
            .ok()
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .map(Some)
            .ok_or_else(|| {
                err(
                    S3ErrorCode::InvalidDigest,
                    "The Content-MD5 you specified was invalid.",
                )
            }),
    }
}

/// Seconds since the epoch of an HTTP date (IMF-fixdate, RFC 850 or asctime form).
pub fn parse_http_date(s: &str) -> Option<i64> {
    let t = httpdate::parse_http_date(s.trim()).ok()?;
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs() as i64)
}

/// Parses `x-amz-copy-source` (`bucket/key` or `/bucket/key`, URL-encoded, optionally with
/// `?versionId=`): bucket, key and the version named.
pub fn copy_source(raw: &str) -> S3Result<(String, String, Option<String>)> {
    let (raw, version) = match raw.split_once("?versionId=") {
        Some((p, v)) if !v.is_empty() => (p, Some(v.to_string())),
        Some(_) => {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "Invalid version id specified",
            ));
        }
        None => (raw, None),
    };
    let decoded = String::from_utf8(super::encoding::percent_decode(raw))
        .map_err(|_| err(S3ErrorCode::InvalidArgument, "Invalid copy source encoding"))?;
    let s = decoded.strip_prefix('/').unwrap_or(&decoded);
    match s.split_once('/') {
        Some((b, k)) if !b.is_empty() && !k.is_empty() => {
            Ok((b.to_string(), k.to_string(), version))
        }
        _ => Err(err(
            S3ErrorCode::InvalidArgument,
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
        )),
    }
}

/// Why a read's conditions stop it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConditionFailure {
    /// 304: If-None-Match matched, or If-Modified-Since found it unmodified.
    NotModified,
    /// 412: If-Match did not match, or If-Unmodified-Since found it modified.
    PreconditionFailed,
}

/// Evaluates If-Match, If-None-Match, If-Modified-Since and If-Unmodified-Since against an
/// object's ETag and last-modified second, in RFC 9110's order, as S3 applies them.
pub fn read_conditions(
    headers: &RequestHeaders,
    etag: &str,
    last_modified_secs: i64,
) -> Result<(), ConditionFailure> {
    if !headers.has(Kind::Condition) {
        return Ok(());
    }
    let if_match = header(headers, "if-match");
    if let Some(m) = if_match
        && !etag_matches(m, etag)
    {
        return Err(ConditionFailure::PreconditionFailed);
    }
    if if_match.is_none()
        && let Some(t) = header(headers, "if-unmodified-since").and_then(parse_http_date)
        && last_modified_secs > t
    {
        return Err(ConditionFailure::PreconditionFailed);
    }
    let inm = header(headers, "if-none-match");
    if let Some(m) = inm
        && etag_matches(m, etag)
    {
        return Err(ConditionFailure::NotModified);
    }
    if inm.is_none()
        && let Some(t) = header(headers, "if-modified-since").and_then(parse_http_date)
        && last_modified_secs <= t
    {
        return Err(ConditionFailure::NotModified);
    }
    Ok(())
}

/// Whether the `x-amz-copy-source-if-*` conditions hold for the source object.
pub fn copy_source_conditions_hold(
    headers: &RequestHeaders,
    etag: &str,
    last_modified_secs: i64,
) -> bool {
    if !headers.has(Kind::CopySourceCondition) {
        return true;
    }
    let h = |n: &str| header(headers, n);
    !(h("x-amz-copy-source-if-match").is_some_and(|m| !etag_matches(m, etag))
        || h("x-amz-copy-source-if-none-match").is_some_and(|m| etag_matches(m, etag))
        || h("x-amz-copy-source-if-unmodified-since")
            .and_then(parse_http_date)
            .is_some_and(|t| last_modified_secs > t)
        || h("x-amz-copy-source-if-modified-since")
            .and_then(parse_http_date)
            .is_some_and(|t| last_modified_secs <= t))
}

/// Whether a header asks for server-side encryption (SSE-S3, SSE-KMS, SSE-C, or SSE-C of a
/// copy source).
pub fn is_encryption_header(name: &str) -> bool {
    name.starts_with("x-amz-server-side-encryption")
        || name.starts_with("x-amz-copy-source-server-side-encryption")
}

/// The canned ACLs an object write may name: packrat's objects have no ACLs of their own (S3's
/// "bucket owner enforced" Object Ownership, the default for new S3 buckets), so only the ones
/// that say what already holds are accepted: the bucket's owner has full control and nobody
/// gains anything by the object.
pub const OBJECT_CANNED_ACLS_ACCEPTED: &[&str] = &["private", "bucket-owner-full-control"];

/// Refuses an object write that asks for an object ACL (`x-amz-acl` other than
/// [`OBJECT_CANNED_ACLS_ACCEPTED`], or any `x-amz-grant-*`) with 400
/// AccessControlListNotSupported, as S3 does for a bucket with ACLs disabled: storing the object
/// while ignoring the ACL would leave the client believing it granted (or withheld) access.
pub fn refuse_object_acl(headers: &RequestHeaders) -> S3Result<()> {
    if !headers.has(Kind::Acl) {
        return Ok(());
    }
    let acl = headers.get("x-amz-acl").map(|v| v.to_str().unwrap_or("?"));
    let grant = headers
        .keys()
        .find(|h| h.as_str().starts_with("x-amz-grant-"));
    match (acl, grant) {
        (Some(a), _) if !OBJECT_CANNED_ACLS_ACCEPTED.contains(&a) => {
            Err(acl_not_supported(&format!("the canned ACL '{a}'")))
        }
        (_, Some(g)) => Err(acl_not_supported(&format!("the header {g}"))),
        _ => Ok(()),
    }
}

/// 400 AccessControlListNotSupported, naming what was asked.
pub fn acl_not_supported(what: &str) -> S3Error {
    S3Error::new(
        S3ErrorCode::AccessControlListNotSupported,
        format!(
            "The bucket does not allow ACLs ({what}): packrat's objects have no ACLs of their own; grant access with a bucket policy or the bucket's canned ACL"
        ),
    )
}

/// A body to store must say how long it is (`Content-Length`, or `x-amz-decoded-content-length`
/// for an aws-chunked one), or be a plain body sent with `Transfer-Encoding: chunked` (its end
/// is then the last chunk, as Ceph's gateway accepts; the size limit still holds while it
/// streams): else 411 MissingContentLength.
pub fn body_length_given(h: &HeaderMap) -> S3Result<()> {
    // A body with a length (nearly every one) is decided by the first lookup.
    if h.contains_key(http::header::CONTENT_LENGTH) || h.contains_key(&X_AMZ_DECODED_CONTENT_LENGTH)
    {
        return Ok(());
    }
    let value = |name| h.get(name).and_then(|v| v.to_str().ok());
    let http_chunked = value(http::header::TRANSFER_ENCODING.as_str()).is_some_and(|v| {
        v.split(',')
            .any(|t| t.trim().eq_ignore_ascii_case("chunked"))
    });
    let aws_chunked = value("x-amz-content-sha256").is_some_and(|v| v.starts_with("STREAMING-"));
    if http_chunked && !aws_chunked {
        Ok(())
    } else {
        Err(S3Error::new(
            S3ErrorCode::MissingContentLength,
            "You must provide the Content-Length HTTP header.",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderName, HeaderValue};

    /// Every header name a parser of optional headers reads, by kind (`None`: read on every
    /// request, or by no such parser).
    const BY_KIND: &[(Option<Kind>, &[&str])] = &[
        (
            Some(Kind::Encryption),
            &[
                "x-amz-server-side-encryption",
                "x-amz-server-side-encryption-customer-algorithm",
                "x-amz-server-side-encryption-customer-key",
                "x-amz-server-side-encryption-customer-key-md5",
                "x-amz-server-side-encryption-aws-kms-key-id",
                "x-amz-server-side-encryption-context",
                "x-amz-server-side-encryption-bucket-key-enabled",
            ],
        ),
        (
            Some(Kind::CopySourceEncryption),
            &[
                "x-amz-copy-source-server-side-encryption-customer-algorithm",
                "x-amz-copy-source-server-side-encryption-customer-key",
                "x-amz-copy-source-server-side-encryption-customer-key-md5",
            ],
        ),
        (
            Some(Kind::Checksum),
            &[
                "x-amz-checksum-crc32",
                "x-amz-checksum-crc32c",
                "x-amz-checksum-crc64nvme",
                "x-amz-checksum-sha1",
                "x-amz-checksum-sha256",
                "x-amz-checksum-mode",
                "x-amz-trailer",
                "x-amz-sdk-checksum-algorithm",
            ],
        ),
        (
            Some(Kind::UserMeta),
            &["x-amz-meta-colour", "x-amz-meta-snowball-auto-extract"],
        ),
        (Some(Kind::Stored), &STORED_HEADERS),
        (Some(Kind::Acl), &["x-amz-acl", "x-amz-grant-read"]),
        (
            Some(Kind::ObjectLock),
            &["x-amz-object-lock-mode", "x-amz-object-lock-legal-hold"],
        ),
        (Some(Kind::Tagging), &["x-amz-tagging"]),
        (Some(Kind::StorageClass), &["x-amz-storage-class"]),
        (
            Some(Kind::Condition),
            &[
                "if-match",
                "if-none-match",
                "if-modified-since",
                "if-unmodified-since",
            ],
        ),
        (
            Some(Kind::CopySourceCondition),
            &[
                "x-amz-copy-source-if-match",
                "x-amz-copy-source-if-none-match",
                "x-amz-copy-source-if-modified-since",
                "x-amz-copy-source-if-unmodified-since",
            ],
        ),
        (Some(Kind::ContentMd5), &["content-md5"]),
        (
            None,
            &[
                "content-type",
                "x-amz-date",
                "x-amz-content-sha256",
                "x-amz-copy-source",
                "authorization",
            ],
        ),
    ];

    fn named() -> Vec<(&'static str, Option<Kind>)> {
        BY_KIND
            .iter()
            .flat_map(|(kind, names)| names.iter().map(move |n| (*n, *kind)))
            .collect()
    }

    const VALUES: &[&str] = &[
        "AES256",
        "aws:kms",
        "true",
        "*",
        "\"9b2cf535f27731c974343645a3985328\"",
        "Wed, 21 Oct 2015 07:28:00 GMT",
        "1B2M2Y8AsgTpgAmY7PhCfg==",
        "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
        "CRC32",
        "x-amz-checksum-crc32",
        "COLD",
        "GLACIER",
        "a=b&c=d",
        "private",
        "public-read",
        "aws-chunked,gzip",
        "",
    ];

    fn meta_summary(r: S3Result<ObjectMeta>) -> String {
        match r {
            Ok(m) => format!(
                "{:?} {:?} {:?} {:?} {:?}",
                m.content_type, m.headers, m.user_meta, m.storage_class, m.tags
            ),
            Err(e) => format!("{e:?}"),
        }
    }

    #[test]
    fn each_header_name_has_the_kind_its_parser_checks() {
        for (name, kind) in named() {
            assert_eq!(
                Kind::of(name).map(|k| k as u16),
                kind.map(|k| k as u16),
                "{name}"
            );
        }
    }

    /// Looking headers up only when their kind is present never changes what a parser answers:
    /// every name a parser reads, alone and beside each other name, with values it takes and
    /// values it refuses.
    #[test]
    fn parsers_answer_the_same_with_and_without_kinds() {
        let mut maps = Vec::new();
        let named = named();
        for (i, (a, _)) in named.iter().enumerate() {
            for v in VALUES {
                let mut m = HeaderMap::new();
                m.insert(HeaderName::from_static(a), HeaderValue::from_static(v));
                maps.push(m.clone());
                let (b, _) = named[(i * 7 + v.len()) % named.len()];
                m.append(HeaderName::from_static(b), HeaderValue::from_static(v));
                maps.push(m);
            }
        }
        let is_class = |c: &str| c == "COLD";
        let etag = "9b2cf535f27731c974343645a3985328";
        let lm = 1_445_412_480;
        type Check<'a> = (&'a str, &'a dyn Fn(&RequestHeaders) -> String);
        let checks: &[Check] = &[
            ("object_meta", &|h| meta_summary(object_meta(h, &is_class))),
            ("requested_checksum", &|h| {
                format!("{:?}", requested_checksum(h))
            }),
            ("content_md5", &|h| format!("{:?}", content_md5(h))),
            ("write_condition", &|h| format!("{:?}", write_condition(h))),
            ("read_conditions", &|h| {
                format!("{:?}", read_conditions(h, etag, lm))
            }),
            ("copy_source_conditions_hold", &|h| {
                format!("{:?}", copy_source_conditions_hold(h, etag, lm))
            }),
            ("refuse_object_acl", &|h| {
                format!("{:?}", refuse_object_acl(h))
            }),
            ("sse::requested_in", &|h| {
                format!(
                    "{:?} {:?}",
                    super::super::sse::requested_in(h, false),
                    super::super::sse::requested_in(h, true)
                )
            }),
        ];
        for m in maps {
            let (s, u) = (RequestHeaders::new(m.clone()), RequestHeaders::unscanned(m));
            for (what, check) in checks {
                assert_eq!(check(&s), check(&u), "{what} of {:?}", s.map());
            }
            let lock = s
                .keys()
                .any(|k| k.as_str().starts_with("x-amz-object-lock-"));
            assert_eq!(
                asks_object_lock(&s),
                lock,
                "asks_object_lock of {:?}",
                s.map()
            );
        }
    }
}
