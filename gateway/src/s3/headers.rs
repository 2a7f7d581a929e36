//! Request headers an S3 operation reads: object metadata and stored headers, tagging,
//! checksums and Content-MD5, write and read conditions, the copy source and its conditions.
//! Pure functions of the header map, so the handlers and the `request_headers` fuzz target
//! run the same parsers.

use super::checksum::{self, ChecksumAlgorithm, ChecksumWire};
use super::error::{S3Error, S3ErrorCode, S3Result};
use super::tagging::Tags;
use crate::config;
use base64::Engine as _;
use http::HeaderMap;
use packrat_store_api::{ObjectAttrs, WriteCondition, etag_matches};

fn err(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::new(code, msg)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
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
    headers: &HeaderMap,
    is_storage_class: &dyn Fn(&str) -> bool,
) -> S3Result<ObjectMeta> {
    let mut user_meta = Vec::new();
    let mut meta_bytes = 0;
    for (k, v) in headers {
        if let Some(n) = k.as_str().strip_prefix("x-amz-meta-") {
            let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
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
    for h in STORED_HEADERS {
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
        .get("x-amz-storage-class")
        .and_then(|v| v.to_str().ok())
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
    let tags = match headers.get("x-amz-tagging") {
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
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string),
        headers: stored,
        user_meta,
        storage_class,
        tags,
    })
}

/// Whether a write carries any `x-amz-object-lock-*` header.
pub fn asks_object_lock(headers: &HeaderMap) -> bool {
    headers
        .keys()
        .any(|k| k.as_str().starts_with("x-amz-object-lock-"))
}

pub fn write_condition(headers: &HeaderMap) -> S3Result<WriteCondition> {
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
    headers: &HeaderMap,
) -> S3Result<(Option<ChecksumAlgorithm>, Option<Vec<u8>>)> {
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

pub fn content_md5(headers: &HeaderMap) -> S3Result<Option<[u8; 16]>> {
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
    let decoded = String::from_utf8(super::sigv4::percent_decode(raw))
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
    headers: &HeaderMap,
    etag: &str,
    last_modified_secs: i64,
) -> Result<(), ConditionFailure> {
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
    headers: &HeaderMap,
    etag: &str,
    last_modified_secs: i64,
) -> bool {
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
pub fn refuse_object_acl(headers: &HeaderMap) -> S3Result<()> {
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
