//! S3 operations: one `handle_<op>` per operation, and `dispatch` choosing among them.

use super::batch;
use super::checksum::{self, ChecksumAlgorithm, ChecksumWire};
use super::error::{S3Error, S3ErrorCode, S3Result};
use super::range::{multi_ranges, resolve_range};
use super::sigv4::uri_encode;
use super::tagging::{self, Tags};
use super::xml::{self, Xml};
use crate::config;
use crate::server::{AppState, RespBody, S3Request, empty, full};
use base64::Engine as _;
use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use http::{HeaderMap, Method, Response, StatusCode};
use http_body_util::BodyExt;
use md5::{Digest, Md5};
use packrat_store_api::{
    Bucket, CompletePart, Identity, ListQuery, NewBucket, NewUpload, ObjectAttrs, ObjectChecksum,
    ObjectInfo, ObjectPage, ObjectRead, PutObject, PutPart, StoreError, Upload, UploadQuery,
    WriteCondition, etag_matches,
};
use std::sync::Arc;

type R = S3Result<Response<RespBody>>;

/// Sub-resources packrat does not implement; requests for them answer NotImplemented.
const UNSUPPORTED_SUBRESOURCES: &[&str] = &[
    "tagging",
    "policy",
    "cors",
    "versioning",
    "versions",
    "website",
    "encryption",
    "object-lock",
    "retention",
    "legal-hold",
    "attributes",
    "torrent",
    "replication",
    "logging",
    "notification",
    "accelerate",
    "requestPayment",
    "ownershipControls",
    "publicAccessBlock",
    "analytics",
    "metrics",
    "inventory",
    "intelligent-tiering",
    "select",
    "restore",
    "policyStatus",
    "session",
];

pub(crate) fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

fn dt(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms).single().unwrap_or_default()
}

fn iso8601(ms: i64) -> String {
    dt(ms).format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

fn http_date(ms: i64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms.max(0) as u64);
    httpdate::fmt_http_date(t)
}

/// Seconds since the epoch of an HTTP date (IMF-fixdate, RFC 850 or asctime form).
fn parse_http_date(s: &str) -> Option<i64> {
    let t = httpdate::parse_http_date(s.trim()).ok()?;
    t.duration_since(std::time::UNIX_EPOCH)
        .ok()
        .map(|d| d.as_secs() as i64)
}

fn err(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::new(code, msg)
}

fn no_such_key() -> S3Error {
    err(S3ErrorCode::NoSuchKey, "The specified key does not exist.")
}

fn no_such_bucket() -> S3Error {
    err(
        S3ErrorCode::NoSuchBucket,
        "The specified bucket does not exist",
    )
}

fn no_such_upload() -> S3Error {
    err(
        S3ErrorCode::NoSuchUpload,
        "The specified upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
    )
}

fn xml_ok(x: Xml) -> R {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/xml")
        .body(full(x.finish()))
        .map_err(|e| S3Error::internal("response", e))
}

fn quoted(etag: &str) -> String {
    format!("\"{etag}\"")
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    Read,
    Write,
}

/// Loads a bucket and checks that the caller may use it. Anonymous callers may only read
/// buckets made public-read; a user touches only its own buckets; the root key touches all.
pub(crate) fn load_bucket(
    state: &AppState,
    req: &S3Request,
    name: &str,
    access: Access,
) -> S3Result<Bucket> {
    let b = state.store.bucket(name)?;
    match (&req.identity, b) {
        (None, Some(b)) if b.public_read && access == Access::Read => Ok(b),
        (None, _) => Err(err(S3ErrorCode::AccessDenied, "Access Denied")),
        (Some(_), None) => Err(no_such_bucket()),
        (Some(id), Some(b)) if id.is_root || id.owner_id == b.owner_id => Ok(b),
        (Some(_), Some(_)) => Err(err(S3ErrorCode::AccessDenied, "Access Denied")),
    }
}

fn need_identity(req: &S3Request) -> S3Result<&Identity> {
    req.identity
        .as_ref()
        .ok_or_else(|| err(S3ErrorCode::AccessDenied, "Access Denied"))
}

pub async fn dispatch(state: &Arc<AppState>, mut req: S3Request) -> (&'static str, R) {
    // Object tagging is implemented; bucket tagging is not.
    let object_tagging = |s: &&&str| **s == "tagging" && req.key.is_some();
    if let Some(sub) = UNSUPPORTED_SUBRESOURCES
        .iter()
        .filter(|s| !object_tagging(s))
        .find(|s| req.has_q(s))
    {
        return (
            "unsupported",
            Err(err(
                S3ErrorCode::NotImplemented,
                format!("packrat does not implement the '{sub}' sub-resource"),
            )),
        );
    }
    let m = req.method.clone();
    let bucket = req.bucket.clone();
    let key = req.key.clone();
    if let Some(k) = &key
        && k.len() > config::KEY_BYTES_MAX
    {
        return (
            "key",
            Err(err(S3ErrorCode::KeyTooLongError, "Your key is too long")),
        );
    }
    match (bucket.as_deref(), key.as_deref()) {
        (None, _) => match m {
            Method::GET => ("ListBuckets", handle_list_buckets(state, &req).await),
            _ => (
                "service",
                Err(err(
                    S3ErrorCode::MethodNotAllowed,
                    "The specified method is not allowed against this resource.",
                )),
            ),
        },
        (Some(b), None) => match m {
            Method::PUT if req.has_q("lifecycle") => (
                "PutBucketLifecycleConfiguration",
                handle_put_lifecycle(state, &mut req, b).await,
            ),
            Method::GET if req.has_q("lifecycle") => (
                "GetBucketLifecycleConfiguration",
                handle_get_lifecycle(state, &req, b).await,
            ),
            Method::DELETE if req.has_q("lifecycle") => (
                "DeleteBucketLifecycle",
                handle_delete_lifecycle(state, &req, b).await,
            ),
            Method::PUT if req.has_q("acl") => {
                ("PutBucketAcl", handle_put_bucket_acl(state, &req, b).await)
            }
            Method::PUT => (
                "CreateBucket",
                handle_create_bucket(state, &mut req, b).await,
            ),
            Method::HEAD => ("HeadBucket", handle_head_bucket(state, &req, b).await),
            Method::DELETE => ("DeleteBucket", handle_delete_bucket(state, &req, b).await),
            Method::GET if req.has_q("location") => (
                "GetBucketLocation",
                handle_get_bucket_location(state, &req, b).await,
            ),
            Method::GET if req.has_q("acl") => {
                ("GetBucketAcl", handle_get_bucket_acl(state, &req, b).await)
            }
            Method::GET if req.has_q("uploads") => (
                "ListMultipartUploads",
                handle_list_multipart_uploads(state, &req, b).await,
            ),
            Method::GET if req.has_q("stream") => (
                "EpochStream",
                batch::handle_epoch_stream(state, &req, b).await,
            ),
            Method::GET => ("ListObjects", handle_list_objects(state, &req, b).await),
            Method::POST if req.has_q("delete") => (
                "DeleteObjects",
                handle_delete_objects(state, &mut req, b).await,
            ),
            Method::POST if req.has_q("batch") => (
                "BatchGet",
                batch::handle_batch_get(state, &mut req, b).await,
            ),
            _ => (
                "bucket",
                Err(err(
                    S3ErrorCode::MethodNotAllowed,
                    "The specified method is not allowed against this resource.",
                )),
            ),
        },
        (Some(b), Some(k)) => match m {
            Method::GET if req.has_q("tagging") => (
                "GetObjectTagging",
                handle_get_object_tagging(state, &req, b, k).await,
            ),
            Method::PUT if req.has_q("tagging") => (
                "PutObjectTagging",
                handle_put_object_tagging(state, &mut req, b, k).await,
            ),
            Method::DELETE if req.has_q("tagging") => (
                "DeleteObjectTagging",
                handle_delete_object_tagging(state, &req, b, k).await,
            ),
            Method::PUT
                if req.has_q("uploadId") && req.headers.contains_key("x-amz-copy-source") =>
            {
                (
                    "UploadPartCopy",
                    handle_upload_part(state, &mut req, b, k, true).await,
                )
            }
            Method::PUT if req.has_q("uploadId") => (
                "UploadPart",
                handle_upload_part(state, &mut req, b, k, false).await,
            ),
            Method::PUT if req.has_q("acl") => (
                "PutObjectAcl",
                Err(err(
                    S3ErrorCode::NotImplemented,
                    "packrat does not implement object ACLs",
                )),
            ),
            Method::PUT if req.headers.contains_key("x-amz-copy-source") => (
                "CopyObject",
                handle_copy_object(state, &mut req, b, k).await,
            ),
            Method::PUT => ("PutObject", handle_put_object(state, &mut req, b, k).await),
            Method::GET if req.has_q("uploadId") => {
                ("ListParts", handle_list_parts(state, &req, b, k).await)
            }
            Method::GET if req.has_q("acl") => (
                "GetObjectAcl",
                Err(err(
                    S3ErrorCode::NotImplemented,
                    "packrat does not implement object ACLs",
                )),
            ),
            Method::GET => (
                "GetObject",
                handle_get_object(state, &req, b, k, false).await,
            ),
            Method::HEAD => (
                "HeadObject",
                handle_get_object(state, &req, b, k, true).await,
            ),
            Method::DELETE if req.has_q("uploadId") => (
                "AbortMultipartUpload",
                handle_abort_multipart_upload(state, &req, b, k).await,
            ),
            Method::DELETE => (
                "DeleteObject",
                handle_delete_object(state, &req, b, k).await,
            ),
            Method::POST if req.has_q("uploads") => (
                "CreateMultipartUpload",
                handle_create_multipart_upload(state, &req, b, k).await,
            ),
            Method::POST if req.has_q("uploadId") => (
                "CompleteMultipartUpload",
                handle_complete_multipart_upload(state, &mut req, b, k).await,
            ),
            _ => (
                "object",
                Err(err(
                    S3ErrorCode::MethodNotAllowed,
                    "The specified method is not allowed against this resource.",
                )),
            ),
        },
    }
}

// ---------------------------------------------------------------- buckets

/// S3 bucket naming rules.
pub fn valid_bucket_name(name: &str) -> bool {
    let b = name.as_bytes();
    if !(3..=63).contains(&b.len()) {
        return false;
    }
    let ok_chars = b
        .iter()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'.' || *c == b'-');
    let ends = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let ip_like = name.split('.').count() == 4 && name.split('.').all(|p| p.parse::<u8>().is_ok());
    ok_chars
        && ends(b[0])
        && ends(b[b.len() - 1])
        && !name.contains("..")
        && !name.contains(".-")
        && !name.contains("-.")
        && !ip_like
        && !name.starts_with("xn--")
        && !name.starts_with("sthree-")
        && !name.ends_with("-s3alias")
        && !name.ends_with("--ol-s3")
}

async fn handle_list_buckets(state: &Arc<AppState>, req: &S3Request) -> R {
    let id = need_identity(req)?;
    let mut x = Xml::new();
    x.root("ListAllMyBucketsResult");
    x.open("Owner");
    x.elem("ID", &id.owner_id);
    x.elem("DisplayName", &id.name);
    x.close("Owner");
    x.open("Buckets");
    for b in state.store.list_buckets().await? {
        if id.is_root || b.owner_id == id.owner_id {
            x.open("Bucket");
            x.elem("Name", &b.name);
            x.elem("CreationDate", &iso8601(b.created_ms));
            x.elem("BucketRegion", &state.config.region);
            x.close("Bucket");
        }
    }
    x.close("Buckets");
    x.close("ListAllMyBucketsResult");
    xml_ok(x)
}

fn canned_acl_public(req: &S3Request) -> S3Result<Option<bool>> {
    match req.header("x-amz-acl") {
        None => Ok(None),
        Some("private") => Ok(Some(false)),
        Some("public-read") => Ok(Some(true)),
        Some(other) => Err(err(
            S3ErrorCode::NotImplemented,
            format!("packrat supports the canned ACLs 'private' and 'public-read', not '{other}'"),
        )),
    }
}

async fn handle_create_bucket(state: &Arc<AppState>, req: &mut S3Request, name: &str) -> R {
    let id = need_identity(req)?.clone();
    if !valid_bucket_name(name) {
        return Err(err(
            S3ErrorCode::InvalidBucketName,
            "The specified bucket is not valid.",
        ));
    }
    let public = canned_acl_public(req)?.unwrap_or(false);
    let body = req.body.read_to_end(config::XML_BODY_BYTES_MAX).await?;
    if !body.iter().all(u8::is_ascii_whitespace) {
        let conf: xml::CreateBucketConfiguration = xml::parse(&body)?;
        if let Some(loc) = conf.location_constraint.filter(|l| !l.is_empty())
            && loc != state.config.region
        {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                format!(
                    "This server serves region '{}', not '{loc}'",
                    state.config.region
                ),
            ));
        }
    }
    let result = state
        .store
        .create_bucket(NewBucket {
            name: name.to_string(),
            owner_id: id.owner_id.clone(),
            owner_name: id.name.clone(),
            created_ms: now_ms(),
            public_read: public,
        })
        .await;
    match result {
        Ok(_) => Response::builder()
            .header("location", format!("/{name}"))
            .body(empty())
            .map_err(|e| S3Error::internal("response", e)),
        Err(StoreError::BucketExists) => {
            let existing = state.store.bucket(name)?;
            let me = need_identity(req)?;
            if existing.is_some_and(|b| b.owner_id == me.owner_id) {
                Err(err(
                    S3ErrorCode::BucketAlreadyOwnedByYou,
                    "Your previous request to create the named bucket succeeded and you already own it.",
                ))
            } else {
                Err(err(
                    S3ErrorCode::BucketAlreadyExists,
                    "The requested bucket name is not available.",
                ))
            }
        }
        Err(e) => Err(e.into()),
    }
}

async fn handle_head_bucket(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    load_bucket(state, req, name, Access::Read)?;
    Response::builder()
        .header("x-amz-bucket-region", state.config.region.as_str())
        .body(empty())
        .map_err(|e| S3Error::internal("response", e))
}

async fn handle_delete_bucket(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Access::Write)?;
    state.store.delete_bucket(&b).await?;
    no_content()
}

fn no_content() -> R {
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(empty())
        .map_err(|e| S3Error::internal("response", e))
}

async fn handle_get_bucket_location(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    load_bucket(state, req, name, Access::Read)?;
    let mut x = Xml::new();
    // us-east-1 is reported as an empty constraint, as S3 does.
    let region = if state.config.region == "us-east-1" {
        ""
    } else {
        state.config.region.as_str()
    };
    x.root("LocationConstraint");
    x.text(region);
    x.close("LocationConstraint");
    xml_ok(x)
}

async fn handle_put_bucket_acl(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Access::Write)?;
    let Some(public) = canned_acl_public(req)? else {
        return Err(err(
            S3ErrorCode::NotImplemented,
            "packrat supports bucket ACLs only as the x-amz-acl canned header (private, public-read)",
        ));
    };
    state.store.set_bucket_public(&b, public).await?;
    Ok(Response::new(empty()))
}

async fn handle_get_bucket_acl(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Access::Read)?;
    let mut x = Xml::new();
    x.root("AccessControlPolicy");
    x.open("Owner");
    x.elem("ID", &b.owner_id);
    x.elem("DisplayName", &b.owner_name);
    x.close("Owner");
    x.open("AccessControlList");
    x.raw("<Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"CanonicalUser\">");
    x.elem("ID", &b.owner_id);
    x.elem("DisplayName", &b.owner_name);
    x.raw("</Grantee><Permission>FULL_CONTROL</Permission></Grant>");
    if b.public_read {
        x.raw("<Grant><Grantee xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\" xsi:type=\"Group\"><URI>http://acs.amazonaws.com/groups/global/AllUsers</URI></Grantee><Permission>READ</Permission></Grant>");
    }
    x.close("AccessControlList");
    x.close("AccessControlPolicy");
    xml_ok(x)
}

// ---------------------------------------------------------------- lifecycle

/// Reads a small XML request body, checking Content-MD5 and a flexible checksum if sent.
async fn read_xml_body(req: &mut S3Request) -> S3Result<Vec<u8>> {
    let body = req.body.read_to_end(config::XML_BODY_BYTES_MAX).await?;
    if let Some(want) = content_md5(&req.headers)?
        && <[u8; 16]>::from(Md5::digest(&body)) != want
    {
        return Err(err(
            S3ErrorCode::BadDigest,
            "The Content-MD5 you specified did not match what we received.",
        ));
    }
    let (alg, sent) = requested_checksum(&req.headers)?;
    if let (Some(alg), Some(sent)) = (alg, sent) {
        let mut h = checksum::Hasher::new(alg);
        h.update(&body);
        if h.finish().0 != sent {
            return Err(err(
                S3ErrorCode::BadDigest,
                "The checksum you specified did not match what we received.",
            ));
        }
    }
    Ok(body)
}

async fn handle_put_lifecycle(state: &Arc<AppState>, req: &mut S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Access::Write)?;
    let body = read_xml_body(req).await?;
    let is_tier = |class: &str| class != "STANDARD" && state.store.is_storage_class(class);
    let rules = super::lifecycle::parse(&body, &is_tier)?;
    state.store.put_lifecycle(&b, rules).await?;
    Ok(Response::new(empty()))
}

async fn handle_get_lifecycle(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Access::Read)?;
    let rules = state.store.get_lifecycle(&b).await?;
    let Some(rules) = rules else {
        return Err(err(
            S3ErrorCode::NoSuchLifecycleConfiguration,
            "The lifecycle configuration does not exist",
        ));
    };
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/xml")
        .body(full(super::lifecycle::to_xml(&rules)))
        .map_err(|e| S3Error::internal("response", e))
}

async fn handle_delete_lifecycle(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Access::Write)?;
    state.store.delete_lifecycle(&b).await?;
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(empty())
        .map_err(|e| S3Error::internal("response", e))
}

// ---------------------------------------------------------------- listing

fn parse_max(req: &S3Request, name: &str) -> S3Result<usize> {
    match req.q(name) {
        None => Ok(config::LIST_KEYS_MAX),
        Some(v) => v
            .parse::<i64>()
            .ok()
            .filter(|n| *n >= 0)
            .map(|n| (n as usize).min(config::LIST_KEYS_MAX))
            .ok_or_else(|| {
                err(
                    S3ErrorCode::InvalidArgument,
                    format!("{name} must be a non-negative integer"),
                )
            }),
    }
}

async fn handle_list_objects(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Access::Read)?;
    let v2 = req.q("list-type") == Some("2");
    let prefix = req.q("prefix").unwrap_or("");
    let delimiter = req.q("delimiter").filter(|d| !d.is_empty());
    let max_keys = parse_max(req, "max-keys")?;
    let url = match req.q("encoding-type") {
        None => false,
        Some("url") => true,
        Some(_) => {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "Invalid Encoding Method specified in Request",
            ));
        }
    };
    let enc = |s: &str| {
        if url {
            uri_encode(s.as_bytes(), true)
        } else {
            s.to_string()
        }
    };
    let token = req.q("continuation-token");
    let after: Option<String> = if v2 {
        match token {
            Some(t) => Some(
                String::from_utf8(
                    base64::engine::general_purpose::URL_SAFE_NO_PAD
                        .decode(t)
                        .map_err(|_| {
                            err(
                                S3ErrorCode::InvalidArgument,
                                "The continuation token provided is incorrect",
                            )
                        })?,
                )
                .map_err(|_| {
                    err(
                        S3ErrorCode::InvalidArgument,
                        "The continuation token provided is incorrect",
                    )
                })?,
            ),
            None => req.q("start-after").map(str::to_string),
        }
    } else {
        req.q("marker").map(str::to_string)
    };
    let page = if max_keys == 0 {
        ObjectPage::default()
    } else {
        let query = ListQuery {
            prefix: prefix.to_string(),
            delimiter: delimiter.map(str::to_string),
            after: after.clone(),
            max_keys,
        };
        state.store.list_objects(&b, &query).await?
    };
    let fetch_owner = !v2 || req.q("fetch-owner") == Some("true");
    let mut x = Xml::new();
    x.root("ListBucketResult");
    x.elem("Name", name);
    x.elem("Prefix", &enc(prefix));
    if let Some(d) = delimiter {
        x.elem("Delimiter", &enc(d));
    }
    x.elem("MaxKeys", &max_keys.to_string());
    if url {
        x.elem("EncodingType", "url");
    }
    x.elem("IsTruncated", if page.truncated { "true" } else { "false" });
    if v2 {
        if let Some(t) = token {
            x.elem("ContinuationToken", t);
        }
        if let Some(sa) = req.q("start-after") {
            x.elem("StartAfter", &enc(sa));
        }
        x.elem(
            "KeyCount",
            &(page.objects.len() + page.common_prefixes.len()).to_string(),
        );
        if page.truncated
            && let Some(last) = &page.last
        {
            x.elem(
                "NextContinuationToken",
                &base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(last.as_bytes()),
            );
        }
    } else {
        x.elem("Marker", &enc(after.as_deref().unwrap_or("")));
        if page.truncated
            && let Some(last) = &page.last
        {
            x.elem("NextMarker", &enc(last));
        }
    }
    for o in &page.objects {
        x.open("Contents");
        x.elem("Key", &enc(&o.key));
        x.elem("LastModified", &iso8601(o.last_modified_ms));
        x.elem("ETag", &quoted(&o.etag));
        if let Some((algorithm, kind)) = &o.checksum {
            x.elem("ChecksumAlgorithm", algorithm);
            x.elem("ChecksumType", kind);
        }
        x.elem("Size", &o.size.to_string());
        if fetch_owner {
            x.open("Owner");
            x.elem("ID", &b.owner_id);
            x.elem("DisplayName", &b.owner_name);
            x.close("Owner");
        }
        x.elem(
            "StorageClass",
            o.storage_class.as_deref().unwrap_or("STANDARD"),
        );
        x.close("Contents");
    }
    for cp in &page.common_prefixes {
        x.open("CommonPrefixes");
        x.elem("Prefix", &enc(cp));
        x.close("CommonPrefixes");
    }
    x.close("ListBucketResult");
    xml_ok(x)
}

// ---------------------------------------------------------------- writes

/// Metadata and stored headers taken from a PUT, COPY (REPLACE) or CreateMultipartUpload.
struct ObjectMeta {
    content_type: Option<String>,
    headers: Vec<(String, String)>,
    user_meta: Vec<(String, String)>,
    storage_class: Option<String>,
    /// From `x-amz-tagging`.
    tags: Tags,
}

impl ObjectMeta {
    fn into_attrs(self, last_modified_ms: i64) -> ObjectAttrs {
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

const STORED_HEADERS: [&str; 5] = [
    "content-encoding",
    "content-disposition",
    "content-language",
    "cache-control",
    "expires",
];

fn object_meta(state: &AppState, headers: &HeaderMap) -> S3Result<ObjectMeta> {
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
        Some(c) if state.store.is_storage_class(c) => Some(c.to_string()),
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
        Some(v) => tagging::parse_header(v.to_str().map_err(|_| {
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

/// The checksum algorithm of a write and the value sent up front (header), if any. A
/// trailer-announced checksum is verified when the body ends.
pub(crate) fn requested_checksum(
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

pub(crate) fn content_md5(headers: &HeaderMap) -> S3Result<Option<[u8; 16]>> {
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

fn write_condition(headers: &HeaderMap) -> S3Result<WriteCondition> {
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

fn checksum_headers(
    mut b: http::response::Builder,
    c: &Option<ObjectChecksum>,
) -> http::response::Builder {
    if let Some(c) = c
        && let Ok(alg) = ChecksumAlgorithm::parse(&c.algorithm)
    {
        b = b.header(alg.header(), c.value.as_str());
        b = b.header("x-amz-checksum-type", c.kind.as_str());
    }
    b
}

async fn handle_put_object(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    if req
        .header("x-amz-meta-snowball-auto-extract")
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return batch::handle_snowball_put(state, req, &b, key).await;
    }
    if !req.headers.contains_key("content-length")
        && !req.headers.contains_key("x-amz-decoded-content-length")
    {
        return Err(err(
            S3ErrorCode::MissingContentLength,
            "You must provide the Content-Length HTTP header.",
        ));
    }
    let meta = object_meta(state, &req.headers)?;
    let (alg, sent) = requested_checksum(&req.headers)?;
    let md5 = content_md5(&req.headers)?;
    let cond = write_condition(&req.headers)?;
    let put = PutObject {
        attrs: meta.into_attrs(now_ms()),
        checksum: alg,
        expected_checksum: sent,
        content_md5: md5,
        condition: cond,
    };
    let stored = state.store.put_object(&b, key, &mut req.body, put).await?;
    checksum_headers(
        Response::builder().header("etag", quoted(&stored.etag)),
        &stored.checksum,
    )
    .body(empty())
    .map_err(|e| S3Error::internal("response", e))
}

/// Parses `x-amz-copy-source` (`bucket/key` or `/bucket/key`, URL-encoded).
fn copy_source(req: &S3Request) -> S3Result<(String, String)> {
    let raw = req.header("x-amz-copy-source").unwrap_or("");
    let raw = raw.split_once("?versionId=").map_or(raw, |(p, _)| p);
    let decoded = String::from_utf8(super::sigv4::percent_decode(raw))
        .map_err(|_| err(S3ErrorCode::InvalidArgument, "Invalid copy source encoding"))?;
    let s = decoded.strip_prefix('/').unwrap_or(&decoded);
    match s.split_once('/') {
        Some((b, k)) if !b.is_empty() && !k.is_empty() => Ok((b.to_string(), k.to_string())),
        _ => Err(err(
            S3ErrorCode::InvalidArgument,
            "Copy Source must mention the source bucket and key: sourcebucket/sourcekey",
        )),
    }
}

/// Loads the copy source and checks the `x-amz-copy-source-if-*` conditions.
async fn load_copy_source(
    state: &AppState,
    req: &S3Request,
) -> S3Result<(String, String, ObjectInfo)> {
    let (sb, sk) = copy_source(req)?;
    let sbucket = load_bucket(state, req, &sb, Access::Read)?;
    let src = state
        .store
        .head_object(&sbucket, &sk)
        .await?
        .ok_or_else(no_such_key)?;
    let pre = || {
        err(
            S3ErrorCode::PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold",
        )
    };
    if let Some(m) = req.header("x-amz-copy-source-if-match")
        && !etag_matches(m, &src.etag)
    {
        return Err(pre());
    }
    if let Some(m) = req.header("x-amz-copy-source-if-none-match")
        && etag_matches(m, &src.etag)
    {
        return Err(pre());
    }
    let secs = src.attrs.last_modified_ms / 1000;
    if let Some(t) = req
        .header("x-amz-copy-source-if-unmodified-since")
        .and_then(parse_http_date)
        && secs > t
    {
        return Err(pre());
    }
    if let Some(t) = req
        .header("x-amz-copy-source-if-modified-since")
        .and_then(parse_http_date)
        && secs <= t
    {
        return Err(pre());
    }
    Ok((sb, sk, src))
}

async fn handle_copy_object(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    let (sb, sk, src) = load_copy_source(state, req).await?;
    let replace = match req.header("x-amz-metadata-directive") {
        None | Some("COPY") => false,
        Some("REPLACE") => true,
        Some(_) => {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "Unknown metadata directive.",
            ));
        }
    };
    let replace_tags = match req.header("x-amz-tagging-directive") {
        None | Some("COPY") => false,
        Some("REPLACE") => true,
        Some(_) => {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "Unknown tagging directive.",
            ));
        }
    };
    if sb == bname
        && sk == key
        && !replace
        && !replace_tags
        && !req.headers.contains_key("x-amz-storage-class")
    {
        return Err(err(
            S3ErrorCode::InvalidRequest,
            "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes.",
        ));
    }
    let sent = object_meta(state, &req.headers)?;
    let tags = if replace_tags {
        sent.tags.clone()
    } else {
        src.attrs.tags.clone()
    };
    let meta = if replace {
        sent
    } else {
        ObjectMeta {
            content_type: src.attrs.content_type.clone(),
            headers: src.attrs.headers.clone(),
            user_meta: src.attrs.user_meta.clone(),
            storage_class: sent.storage_class,
            tags: Tags::new(),
        }
    };
    let attrs = ObjectMeta { tags, ..meta }.into_attrs(now_ms());
    let cond = write_condition(&req.headers)?;
    let alg = match req.header("x-amz-checksum-algorithm") {
        Some(a) => Some(ChecksumAlgorithm::parse(a)?),
        None => src
            .checksum
            .as_ref()
            .and_then(|c| ChecksumAlgorithm::parse(&c.algorithm).ok()),
    };
    let self_copy = sb == bname && sk == key;
    if self_copy
        && (alg.is_none()
            || src.checksum.as_ref().map(|c| c.algorithm.as_str()) == alg.map(|a| a.name()))
    {
        // A copy onto itself changes only attributes (metadata, storage class, tags): the
        // object keeps its bytes where they are (a new class moves them on the tier worker's
        // next pass). The edit applies to the record as it is under the key lock.
        let rec = state
            .store
            .update_object(&b, key, &cond, Box::new(move |cur| *cur = attrs))
            .await?;
        return xml_ok(copy_result(&rec));
    }
    let put = PutObject {
        attrs,
        checksum: alg,
        condition: cond,
        ..Default::default()
    };
    let rec = state.store.copy_object(&src, &b, key, put).await?;
    xml_ok(copy_result(&rec))
}

fn copy_result(rec: &ObjectInfo) -> Xml {
    let mut x = Xml::new();
    x.root("CopyObjectResult");
    x.elem("LastModified", &iso8601(rec.attrs.last_modified_ms));
    x.elem("ETag", &quoted(&rec.etag));
    if let Some(c) = &rec.checksum
        && let Ok(a) = ChecksumAlgorithm::parse(&c.algorithm)
    {
        x.elem(a.xml_name(), &c.value);
    }
    x.close("CopyObjectResult");
    x
}

async fn handle_get_object_tagging(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Access::Read)?;
    let obj = state
        .store
        .head_object(&b, key)
        .await?
        .ok_or_else(no_such_key)?;
    xml_ok(tagging::to_xml(&obj.attrs.tags))
}

async fn handle_put_object_tagging(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    let body = read_xml_body(req).await?;
    let tags = tagging::parse_xml(&body)?;
    state
        .store
        .update_object(
            &b,
            key,
            &WriteCondition::default(),
            Box::new(move |cur| cur.tags = tags),
        )
        .await?;
    Ok(Response::new(empty()))
}

async fn handle_delete_object_tagging(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    state
        .store
        .update_object(
            &b,
            key,
            &WriteCondition::default(),
            Box::new(|cur| cur.tags.clear()),
        )
        .await?;
    no_content()
}

async fn handle_delete_object(state: &Arc<AppState>, req: &S3Request, bname: &str, key: &str) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    state.store.delete_object(&b, key).await?;
    no_content()
}

async fn handle_delete_objects(state: &Arc<AppState>, req: &mut S3Request, bname: &str) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    let body = read_xml_body(req).await?;
    let d: xml::Delete = xml::parse(&body)?;
    if d.objects.len() > config::DELETE_OBJECTS_KEYS_MAX {
        return Err(err(
            S3ErrorCode::MalformedXML,
            "A DeleteObjects request may name at most 1000 keys",
        ));
    }
    let quiet = d.quiet.unwrap_or(false);
    // All deletes go to group commit together, so a batch of 1000 keys costs about one
    // synced index write, not a thousand.
    let results = futures_util::future::join_all(d.objects.iter().map(|o| {
        let (store, b) = (&state.store, &b);
        async move {
            if o.key.is_empty() || o.key.len() > config::KEY_BYTES_MAX {
                Err(err(S3ErrorCode::InvalidArgument, "Invalid key"))
            } else if o.version_id.as_deref().is_some_and(|v| v != "null") {
                Err(err(
                    S3ErrorCode::NotImplemented,
                    "packrat does not keep object versions",
                ))
            } else {
                store.delete_object(b, &o.key).await.map_err(S3Error::from)
            }
        }
    }))
    .await;
    let mut x = Xml::new();
    x.root("DeleteResult");
    for (o, r) in d.objects.iter().zip(results) {
        match r {
            Ok(()) if !quiet => {
                x.open("Deleted");
                x.elem("Key", &o.key);
                x.close("Deleted");
            }
            Ok(()) => {}
            Err(e) => {
                x.open("Error");
                x.elem("Key", &o.key);
                x.elem("Code", e.code.parts().0);
                x.elem("Message", &e.message);
                x.close("Error");
            }
        }
    }
    x.close("DeleteResult");
    xml_ok(x)
}

// ---------------------------------------------------------------- reads

/// Evaluates If-Match, If-None-Match, If-Modified-Since and If-Unmodified-Since (RFC 9110
/// order, as S3 applies them).
fn check_read_conditions(req: &S3Request, obj: &ObjectInfo) -> S3Result<()> {
    let secs = obj.attrs.last_modified_ms / 1000;
    let etag = quoted(&obj.etag);
    let lm = http_date(obj.attrs.last_modified_ms);
    let not_modified = || {
        err(S3ErrorCode::NotModified, "Not Modified")
            .with_header("etag", etag.clone())
            .with_header("last-modified", lm.clone())
    };
    let failed = || {
        err(
            S3ErrorCode::PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold",
        )
    };
    let if_match = req.header("if-match");
    if let Some(m) = if_match
        && !etag_matches(m, &obj.etag)
    {
        return Err(failed());
    }
    if if_match.is_none()
        && let Some(t) = req.header("if-unmodified-since").and_then(parse_http_date)
        && secs > t
    {
        return Err(failed());
    }
    let inm = req.header("if-none-match");
    if let Some(m) = inm
        && etag_matches(m, &obj.etag)
    {
        return Err(not_modified());
    }
    if inm.is_none()
        && let Some(t) = req.header("if-modified-since").and_then(parse_http_date)
        && secs <= t
    {
        return Err(not_modified());
    }
    Ok(())
}

async fn handle_get_object(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
    head: bool,
) -> R {
    let b = load_bucket(state, req, bname, Access::Read)?;
    let obj = state
        .store
        .head_object(&b, key)
        .await?
        .ok_or_else(no_such_key)?;
    check_read_conditions(req, &obj)?;
    let part_number = match req.q("partNumber") {
        None => None,
        Some(p) => Some(p.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
            err(
                S3ErrorCode::InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive",
            )
        })?),
    };
    let size = obj.size;
    let range = match part_number {
        Some(n) => {
            if req.headers.contains_key("range") {
                return Err(err(
                    S3ErrorCode::InvalidRequest,
                    "Cannot specify both Range header and partNumber query parameter",
                ));
            }
            if obj.part_sizes.is_empty() {
                if n != 1 {
                    return Err(err(
                        S3ErrorCode::InvalidPart,
                        "The requested partnumber is not satisfiable",
                    ));
                }
                None
            } else {
                let idx = n as usize - 1;
                let Some(part_size) = obj.part_sizes.get(idx) else {
                    return Err(err(
                        S3ErrorCode::InvalidPart,
                        "The requested partnumber is not satisfiable",
                    ));
                };
                let start: u64 = obj.part_sizes[..idx].iter().sum();
                Some((start, start + part_size))
            }
        }
        None => resolve_range(req.header("range"), size)?,
    };
    let multi = match part_number {
        None => multi_ranges(req.header("range"), size)?,
        Some(_) => None,
    };
    let (start, end) = range.unwrap_or((0, size));
    let mut rb = Response::builder()
        .status(if range.is_some() {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        })
        .header("content-length", (end - start).to_string())
        .header("etag", quoted(&obj.etag))
        .header("last-modified", http_date(obj.attrs.last_modified_ms))
        .header("accept-ranges", "bytes");
    if range.is_some() && size > 0 {
        rb = rb.header(
            "content-range",
            format!("bytes {start}-{}/{size}", end.saturating_sub(1)),
        );
    }
    if part_number.is_some() && !obj.part_sizes.is_empty() {
        rb = rb.header("x-amz-mp-parts-count", obj.part_sizes.len().to_string());
    }
    for (k, v) in &req.query {
        if k.starts_with("response-") && http::HeaderValue::from_str(v).is_err() {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                format!("{k} is not a valid header value"),
            ));
        }
    }
    let override_of = |h: &str| req.q(&format!("response-{h}")).map(str::to_string);
    let ct = override_of("content-type")
        .or_else(|| obj.attrs.content_type.clone())
        .unwrap_or_else(|| "binary/octet-stream".to_string());
    rb = rb.header("content-type", ct);
    for h in STORED_HEADERS {
        let v = override_of(h).or_else(|| {
            obj.attrs
                .headers
                .iter()
                .find(|(k, _)| k == h)
                .map(|(_, v)| v.clone())
        });
        if let Some(v) = v {
            rb = rb.header(h, v);
        }
    }
    for (k, v) in &obj.attrs.user_meta {
        rb = rb.header(format!("x-amz-meta-{k}"), v.as_str());
    }
    if let Some(c) = &obj.attrs.storage_class {
        rb = rb.header("x-amz-storage-class", c.as_str());
    }
    if !obj.attrs.tags.is_empty() {
        rb = rb.header("x-amz-tagging-count", obj.attrs.tags.len());
    }
    if req
        .header("x-amz-checksum-mode")
        .is_some_and(|m| m.eq_ignore_ascii_case("ENABLED"))
        && range.is_none()
        && multi.is_none()
    {
        rb = checksum_headers(rb, &obj.checksum);
    }
    if let Some(ranges) = multi {
        return multi_range_response(state, rb, Arc::new(obj), ranges, head);
    }
    if head {
        return rb
            .body(empty())
            .map_err(|e| S3Error::internal("response", e));
    }
    // A range read in one piece is read (and verified) before the headers go out, so a
    // corrupt small object is a clean 500. Longer ranges stream; a failure mid-stream cuts the
    // connection so the client sees a short body, never wrong bytes. (A range the store knows
    // it cannot read is refused by `read_object` before anything is sent.)
    let mut reader = state.store.read_object(&obj, start, end)?;
    if reader.is_single_piece() {
        let data = reader.next().await?.unwrap_or_default();
        return rb
            .body(full(data))
            .map_err(|e| S3Error::internal("response", e));
    }
    let stream = futures_util::stream::unfold(reader, |mut r| async move {
        match r.next().await {
            Ok(Some(d)) => Some((Ok(http_body::Frame::data(d)), r)),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(S3Error::from(e).message)), r)),
        }
    });
    let body = http_body_util::StreamBody::new(stream).boxed_unsync();
    rb.body(body).map_err(|e| S3Error::internal("response", e))
}

/// Several ranges of one object as `206 multipart/byteranges` (RFC 9110 section 14.6): each
/// part carries the object's content type and its own Content-Range; parts stream one verified
/// chunk at a time, in the order asked.
fn multi_range_response(
    state: &Arc<AppState>,
    mut rb: http::response::Builder,
    obj: Arc<ObjectInfo>,
    ranges: Vec<(u64, u64)>,
    head: bool,
) -> R {
    let size = obj.size;
    let boundary = format!("packrat-{}", hex::encode(rand::random::<[u8; 12]>()));
    let part_type = rb
        .headers_ref()
        .and_then(|h| h.get("content-type"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("binary/octet-stream")
        .to_string();
    enum Piece {
        Text(Bytes),
        Range(u64, u64),
    }
    let mut pieces = std::collections::VecDeque::new();
    let mut length = 0u64;
    for (start, end) in ranges {
        let head_text = format!(
            "--{boundary}\r\nContent-Type: {part_type}\r\nContent-Range: bytes {start}-{}/{size}\r\n\r\n",
            end - 1
        );
        length += head_text.len() as u64 + (end - start) + 2;
        pieces.push_back(Piece::Text(Bytes::from(head_text)));
        pieces.push_back(Piece::Range(start, end));
        pieces.push_back(Piece::Text(Bytes::from_static(b"\r\n")));
    }
    let tail = format!("--{boundary}--\r\n");
    length += tail.len() as u64;
    pieces.push_back(Piece::Text(Bytes::from(tail)));
    if let Some(h) = rb.headers_mut() {
        h.remove("content-range");
        if let Ok(v) =
            http::HeaderValue::from_str(&format!("multipart/byteranges; boundary={boundary}"))
        {
            h.insert("content-type", v);
        }
        h.insert("content-length", http::HeaderValue::from(length));
    }
    rb = rb.status(StatusCode::PARTIAL_CONTENT);
    if head {
        return rb
            .body(empty())
            .map_err(|e| S3Error::internal("response", e));
    }
    let store = state.store.clone();
    let stream = futures_util::stream::unfold(
        (pieces, None::<Box<dyn ObjectRead>>),
        move |(mut pieces, mut reader)| {
            let store = store.clone();
            let obj = obj.clone();
            async move {
                loop {
                    if let Some(r) = reader.as_mut() {
                        match r.next().await {
                            Ok(Some(d)) => {
                                return Some((Ok(http_body::Frame::data(d)), (pieces, reader)));
                            }
                            Ok(None) => reader = None,
                            Err(e) => {
                                return Some((
                                    Err(std::io::Error::other(S3Error::from(e).message)),
                                    (pieces, None),
                                ));
                            }
                        }
                    }
                    match pieces.pop_front()? {
                        Piece::Text(t) => {
                            return Some((Ok(http_body::Frame::data(t)), (pieces, reader)));
                        }
                        Piece::Range(start, end) => match store.read_object(&obj, start, end) {
                            Ok(r) => reader = Some(r),
                            Err(e) => {
                                return Some((
                                    Err(std::io::Error::other(S3Error::from(e).message)),
                                    (pieces, None),
                                ));
                            }
                        },
                    }
                }
            }
        },
    );
    let body = http_body_util::StreamBody::new(stream).boxed_unsync();
    rb.body(body).map_err(|e| S3Error::internal("response", e))
}

// ---------------------------------------------------------------- multipart

/// The upload named by `uploadId` (a malformed id is no upload at all).
async fn load_upload(state: &AppState, req: &S3Request, b: &Bucket, key: &str) -> S3Result<Upload> {
    let id = req.q("uploadId").unwrap_or("");
    if id.len() != 32 || !id.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(no_such_upload());
    }
    state
        .store
        .upload(b, key, id)
        .await?
        .ok_or_else(no_such_upload)
}

async fn handle_create_multipart_upload(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    let id = need_identity(req)?;
    let meta = object_meta(state, &req.headers)?;
    let alg = req
        .header("x-amz-checksum-algorithm")
        .map(ChecksumAlgorithm::parse)
        .transpose()?;
    let kind = match (req.header("x-amz-checksum-type"), alg) {
        (_, None) => None,
        (Some("FULL_OBJECT"), Some(a)) if a.is_crc() => Some("FULL_OBJECT"),
        (Some("FULL_OBJECT"), Some(_)) => {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "The FULL_OBJECT checksum type needs a CRC algorithm",
            ));
        }
        (Some("COMPOSITE"), Some(ChecksumAlgorithm::Crc64Nvme)) => {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "CRC64NVME supports only the FULL_OBJECT checksum type",
            ));
        }
        (Some("COMPOSITE"), Some(_)) => Some("COMPOSITE"),
        (None, Some(ChecksumAlgorithm::Crc64Nvme)) => Some("FULL_OBJECT"),
        (None, Some(_)) => Some("COMPOSITE"),
        (Some(_), Some(_)) => {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "Unknown x-amz-checksum-type",
            ));
        }
    };
    let new = NewUpload {
        owner_id: id.owner_id.clone(),
        initiated_ms: now_ms(),
        attrs: meta.into_attrs(0),
        checksum: alg,
        checksum_type: kind.map(str::to_string),
    };
    let upload_id = state.store.create_upload(&b, key, new).await?.upload_id;
    let mut x = Xml::new();
    x.root("InitiateMultipartUploadResult");
    x.elem("Bucket", bname);
    x.elem("Key", key);
    x.elem("UploadId", &upload_id);
    x.close("InitiateMultipartUploadResult");
    let mut rb = Response::builder().header("content-type", "application/xml");
    if let (Some(a), Some(k)) = (alg, kind) {
        rb = rb
            .header("x-amz-checksum-algorithm", a.name())
            .header("x-amz-checksum-type", k);
    }
    rb.body(full(x.finish()))
        .map_err(|e| S3Error::internal("response", e))
}

async fn handle_upload_part(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
    copy: bool,
) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    let part_number = req
        .q("partNumber")
        .and_then(|p| p.parse::<u32>().ok())
        .filter(|n| (1..=config::PARTS_MAX).contains(n))
        .ok_or_else(|| {
            err(
                S3ErrorCode::InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive",
            )
        })?;
    let upload = load_upload(state, req, &b, key).await?;
    let upload_alg = upload.checksum;
    let part = if copy {
        let (_, _, src) = load_copy_source(state, req).await?;
        let (start, end) = match req.header("x-amz-copy-source-range") {
            None => (0, src.size),
            Some(r) => match resolve_range(Some(r), src.size) {
                Ok(Some(r)) => r,
                _ => {
                    return Err(err(
                        S3ErrorCode::InvalidArgument,
                        "The x-amz-copy-source-range value must be of the form bytes=first-last within the source object",
                    ));
                }
            },
        };
        state
            .store
            .upload_part_copy(&b, key, &upload.upload_id, part_number, &src, start, end)
            .await?
    } else {
        if !req.headers.contains_key("content-length")
            && !req.headers.contains_key("x-amz-decoded-content-length")
        {
            return Err(err(
                S3ErrorCode::MissingContentLength,
                "You must provide the Content-Length HTTP header.",
            ));
        }
        let (alg, sent) = requested_checksum(&req.headers)?;
        if let (Some(a), Some(u)) = (alg, upload_alg)
            && a != u
        {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                format!(
                    "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum Type: {}",
                    u.name(),
                    a.name()
                ),
            ));
        }
        let put = PutPart {
            checksum: alg,
            expected_checksum: sent,
            content_md5: content_md5(&req.headers)?,
        };
        state
            .store
            .upload_part(&b, key, &upload.upload_id, part_number, &mut req.body, put)
            .await?
    };
    if copy {
        let mut x = Xml::new();
        x.root("CopyPartResult");
        x.elem("LastModified", &iso8601(part.last_modified_ms));
        x.elem("ETag", &quoted(&part.etag));
        x.close("CopyPartResult");
        return xml_ok(x);
    }
    let mut rb = Response::builder().header("etag", quoted(&part.etag));
    if let Some(c) = &part.checksum
        && let Ok(a) = ChecksumAlgorithm::parse(&c.algorithm)
    {
        rb = rb.header(a.header(), c.value.as_str());
    }
    rb.body(empty())
        .map_err(|e| S3Error::internal("response", e))
}

async fn handle_complete_multipart_upload(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    let body = req.body.read_to_end(config::XML_BODY_BYTES_MAX).await?;
    let cond = write_condition(&req.headers)?;
    let upload = load_upload(state, req, &b, key).await?;
    let doc: xml::CompleteMultipartUpload = xml::parse(&body)?;
    if doc.parts.is_empty() {
        return Err(err(
            S3ErrorCode::MalformedXML,
            "You must specify at least one part",
        ));
    }
    let parts = doc
        .parts
        .into_iter()
        .map(|p| {
            let sent = [
                (ChecksumAlgorithm::Crc32, p.crc32),
                (ChecksumAlgorithm::Crc32c, p.crc32c),
                (ChecksumAlgorithm::Crc64Nvme, p.crc64nvme),
                (ChecksumAlgorithm::Sha1, p.sha1),
                (ChecksumAlgorithm::Sha256, p.sha256),
            ];
            CompletePart {
                part_number: p.part_number,
                etag: p.etag,
                checksums: sent
                    .into_iter()
                    .filter_map(|(a, v)| v.map(|v| (a, v)))
                    .collect(),
            }
        })
        .collect();
    let obj = state
        .store
        .complete_upload(&b, key, &upload.upload_id, parts, &cond)
        .await?;
    let mut x = Xml::new();
    x.root("CompleteMultipartUploadResult");
    x.elem(
        "Location",
        &format!("/{bname}/{}", uri_encode(key.as_bytes(), true)),
    );
    x.elem("Bucket", bname);
    x.elem("Key", key);
    x.elem("ETag", &quoted(&obj.etag));
    if let Some(c) = &obj.checksum
        && let Ok(a) = ChecksumAlgorithm::parse(&c.algorithm)
    {
        x.elem(a.xml_name(), &c.value);
        x.elem("ChecksumType", &c.kind);
    }
    x.close("CompleteMultipartUploadResult");
    xml_ok(x)
}

async fn handle_abort_multipart_upload(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Access::Write)?;
    let upload = load_upload(state, req, &b, key).await?;
    state.store.abort_upload(&b, key, &upload.upload_id).await?;
    no_content()
}

fn owner_xml(x: &mut Xml, tag: &str, b: &Bucket) {
    x.open(tag);
    x.elem("ID", &b.owner_id);
    x.elem("DisplayName", &b.owner_name);
    x.close(tag);
}

async fn handle_list_parts(state: &Arc<AppState>, req: &S3Request, bname: &str, key: &str) -> R {
    let b = load_bucket(state, req, bname, Access::Read)?;
    let upload = load_upload(state, req, &b, key).await?;
    let max = parse_max(req, "max-parts")?;
    let marker: u32 = match req.q("part-number-marker") {
        None => 0,
        Some(m) => m.parse().map_err(|_| {
            err(
                S3ErrorCode::InvalidArgument,
                "part-number-marker must be an integer",
            )
        })?,
    };
    let (parts, truncated) = state.store.list_parts(&upload, &b, marker, max).await?;
    let mut x = Xml::new();
    x.root("ListPartsResult");
    x.elem("Bucket", bname);
    x.elem("Key", key);
    x.elem("UploadId", &upload.upload_id);
    owner_xml(&mut x, "Initiator", &b);
    owner_xml(&mut x, "Owner", &b);
    x.elem(
        "StorageClass",
        upload.storage_class.as_deref().unwrap_or("STANDARD"),
    );
    x.elem("PartNumberMarker", &marker.to_string());
    if let Some(last) = parts.last() {
        x.elem("NextPartNumberMarker", &last.part_number.to_string());
    }
    x.elem("MaxParts", &max.to_string());
    x.elem("IsTruncated", if truncated { "true" } else { "false" });
    if let Some(a) = upload.checksum {
        x.elem("ChecksumAlgorithm", a.name());
    }
    if let Some(t) = &upload.checksum_type {
        x.elem("ChecksumType", t);
    }
    for p in &parts {
        x.open("Part");
        x.elem("PartNumber", &p.part_number.to_string());
        x.elem("LastModified", &iso8601(p.last_modified_ms));
        x.elem("ETag", &quoted(&p.etag));
        x.elem("Size", &p.size.to_string());
        if let Some(c) = &p.checksum
            && let Ok(a) = ChecksumAlgorithm::parse(&c.algorithm)
        {
            x.elem(a.xml_name(), &c.value);
        }
        x.close("Part");
    }
    x.close("ListPartsResult");
    xml_ok(x)
}

async fn handle_list_multipart_uploads(state: &Arc<AppState>, req: &S3Request, bname: &str) -> R {
    let b = load_bucket(state, req, bname, Access::Read)?;
    let prefix = req.q("prefix").unwrap_or("");
    let delimiter = req.q("delimiter").filter(|d| !d.is_empty());
    let max = parse_max(req, "max-uploads")?;
    let km = req.q("key-marker").filter(|s| !s.is_empty());
    let um = req.q("upload-id-marker").filter(|s| !s.is_empty());
    let query = UploadQuery {
        prefix: prefix.to_string(),
        delimiter: delimiter.map(str::to_string),
        key_marker: km.map(str::to_string),
        upload_id_marker: um.map(str::to_string),
        max_uploads: max,
    };
    let page = state.store.list_uploads(&b, &query).await?;
    let mut x = Xml::new();
    x.root("ListMultipartUploadsResult");
    x.elem("Bucket", bname);
    x.elem("KeyMarker", km.unwrap_or(""));
    x.elem("UploadIdMarker", um.unwrap_or(""));
    if let Some(last) = page.uploads.last() {
        x.elem("NextKeyMarker", &last.key);
        x.elem("NextUploadIdMarker", &last.upload_id);
    }
    x.elem("Prefix", prefix);
    if let Some(d) = delimiter {
        x.elem("Delimiter", d);
    }
    x.elem("MaxUploads", &max.to_string());
    x.elem("IsTruncated", if page.truncated { "true" } else { "false" });
    for u in &page.uploads {
        x.open("Upload");
        x.elem("Key", &u.key);
        x.elem("UploadId", &u.upload_id);
        owner_xml(&mut x, "Initiator", &b);
        owner_xml(&mut x, "Owner", &b);
        x.elem(
            "StorageClass",
            u.storage_class.as_deref().unwrap_or("STANDARD"),
        );
        x.elem("Initiated", &iso8601(u.initiated_ms));
        if let Some(a) = u.checksum {
            x.elem("ChecksumAlgorithm", a.name());
        }
        x.close("Upload");
    }
    for cp in &page.common_prefixes {
        x.open("CommonPrefixes");
        x.elem("Prefix", cp);
        x.close("CommonPrefixes");
    }
    x.close("ListMultipartUploadsResult");
    xml_ok(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The S3 handlers (and the batch extensions) see storage only through the
    /// `ObjectStore` trait: these files name no engine, index, chunk store or storage crate
    /// outside their tests.
    #[test]
    fn handlers_reach_storage_only_through_the_trait() {
        for (file, text) in [
            ("handlers.rs", include_str!("handlers.rs")),
            ("batch.rs", include_str!("batch.rs")),
        ] {
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for banned in [
                "state.engine",
                "packrat_index",
                "packrat_chunk_store",
                "packrat_store::",
            ] {
                assert!(!code.contains(banned), "{file} names {banned}");
            }
        }
    }

    #[test]
    fn bucket_names() {
        for ok in ["abc", "my-bucket.data", "a1b", "0ab"] {
            assert!(valid_bucket_name(ok), "{ok}");
        }
        for bad in [
            "ab",
            "ABC",
            "-abc",
            "abc-",
            "a..b",
            "192.168.1.1",
            "a_b",
            "xn--abc",
            &"a".repeat(64),
        ] {
            assert!(!valid_bucket_name(bad), "{bad}");
        }
    }

    #[test]
    fn multi_range_sets() {
        assert_eq!(multi_ranges(Some("bytes=0-9"), 100).unwrap(), None);
        assert_eq!(
            multi_ranges(Some("bytes=0-9, 20-, -5"), 100).unwrap(),
            Some(vec![(0, 10), (20, 100), (95, 100)])
        );
        assert_eq!(
            multi_ranges(Some("bytes=0-9,200-"), 100).unwrap(),
            Some(vec![(0, 10)])
        );
        assert_eq!(multi_ranges(Some("bytes=0-9,x-"), 100).unwrap(), None);
        assert_eq!(
            multi_ranges(Some("bytes=200-,300-"), 100).unwrap_err().code,
            S3ErrorCode::InvalidRange
        );
        let many = format!("bytes={}", vec!["0-0"; 300].join(","));
        assert_eq!(
            multi_ranges(Some(&many), 100).unwrap_err().code,
            S3ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn ranges() {
        assert_eq!(
            resolve_range(Some("bytes=0-9"), 100).unwrap(),
            Some((0, 10))
        );
        assert_eq!(
            resolve_range(Some("bytes=90-"), 100).unwrap(),
            Some((90, 100))
        );
        assert_eq!(
            resolve_range(Some("bytes=-10"), 100).unwrap(),
            Some((90, 100))
        );
        assert_eq!(
            resolve_range(Some("bytes=-500"), 100).unwrap(),
            Some((0, 100))
        );
        assert_eq!(
            resolve_range(Some("bytes=50-500"), 100).unwrap(),
            Some((50, 100))
        );
        assert_eq!(resolve_range(Some("bytes=0-1,5-6"), 100).unwrap(), None);
        assert_eq!(resolve_range(Some("items=0-1"), 100).unwrap(), None);
        assert_eq!(resolve_range(Some("bytes=9-3"), 100).unwrap(), None);
        assert_eq!(
            resolve_range(Some("bytes=100-"), 100).unwrap_err().code,
            S3ErrorCode::InvalidRange
        );
        assert_eq!(
            resolve_range(Some("bytes=0-0"), 0).unwrap_err().code,
            S3ErrorCode::InvalidRange
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        /// Range headers of any shape against any size: a range, none, or an S3 error.
        #[test]
        fn range_parsers_never_panic(h in "(bytes=)?[-0-9, ]{0,40}|\\PC{0,40}", size in 0u64..u64::MAX) {
            if let Ok(Some((a, b))) = resolve_range(Some(&h), size) {
                proptest::prop_assert!(a <= b && b <= size);
            }
            if let Ok(Some(v)) = multi_ranges(Some(&h), size) {
                for (a, b) in v {
                    proptest::prop_assert!(a < b && b <= size);
                }
            }
        }
    }
}
