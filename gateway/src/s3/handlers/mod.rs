//! S3 operations: one `handle_<op>` per operation, and `dispatch` choosing among them.

use super::acl;
use super::checksum::{self, ChecksumAlgorithm, ChecksumWire};
use super::error::{S3Error, S3ErrorCode, S3Result};
use super::headers::{
    self, ObjectMeta, content_md5, object_meta, requested_checksum, write_condition,
};
use super::range::{multi_ranges, resolve_range};
use super::rfc2047;
use super::sigv4::uri_encode;
use super::sse;
use super::xml::{self, Xml};
use crate::config;
use crate::s3::tagging::Tags;
use crate::state::{AppState, RespBody, S3Request, empty, full};
use base64::Engine as _;
use bytes::Bytes;
use chrono::{DateTime, TimeZone, Utc};
use http::{Method, Response, StatusCode};
use http_body_util::BodyExt;
use md5::{Digest, Md5};
use packrat_store_api::{
    Bucket, CompletePart, Identity, ListQuery, NewBucket, NewUpload, ObjectChecksum, ObjectInfo,
    ObjectPage, ObjectRead, PutObject, PutPart, StoreError, Upload, UploadQuery, WriteCondition,
};
use std::sync::Arc;

mod access;
mod batch;
mod bucket_config;
mod buckets;
mod listing;
mod lock;
mod multipart;
mod object_acl;
mod objects;
mod post_object;
mod tagging;
mod versions;

pub(crate) use access::*;

type R = S3Result<Response<RespBody>>;

/// Sub-resources packrat does not implement; requests for them answer NotImplemented.
const UNSUPPORTED_SUBRESOURCES: &[&str] = &[
    "website",
    "torrent",
    "replication",
    "logging",
    "notification",
    "accelerate",
    "requestPayment",
    "analytics",
    "metrics",
    "inventory",
    "intelligent-tiering",
    "select",
    "restore",
    "session",
];

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
    ["\"", etag, "\""].concat()
}

/// Runs a request, then makes sure its connection can carry the next one: what the handler
/// left of the body (an error answered before reading it, say) is read and dropped, up to
/// [`config::UNREAD_BODY_DRAIN_BYTES_MAX`]; past that the answer says `Connection: close`. A
/// connection closed with unread bytes in it is reset, and a client reusing it sees its next
/// request fail (botocore without retries: "Connection was closed before we received a valid
/// response").
pub async fn dispatch(state: &Arc<AppState>, mut req: S3Request) -> (&'static str, R) {
    let (name, r) = route(state, &mut req).await;
    // A browser's request to a bucket with CORS rules: the answer (an error too) says which
    // origin may read it. Requests without an `Origin` pay nothing.
    let r = match (req.headers.get(http::header::ORIGIN), &req.bucket) {
        (Some(origin), Some(bucket)) if req.method != Method::OPTIONS => {
            let origin = origin.to_str().unwrap_or("").to_string();
            let cors = bucket_config::cors_headers(state, bucket, &origin, &req.method).await;
            with_headers(r, cors)
        }
        _ => r,
    };
    let drained = req
        .body
        .discard_rest(
            config::UNREAD_BODY_DRAIN_BYTES_MAX,
            std::time::Duration::from_secs(config::UNREAD_BODY_DRAIN_SECS),
        )
        .await;
    if drained {
        return (name, r);
    }
    let close = http::HeaderValue::from_static("close");
    let r = match r {
        Ok(mut resp) => {
            resp.headers_mut().insert(http::header::CONNECTION, close);
            Ok(resp)
        }
        Err(e) => Err(e.with_header("connection", "close".to_string())),
    };
    (name, r)
}

fn with_headers(r: R, extra: Vec<(&'static str, String)>) -> R {
    if extra.is_empty() {
        return r;
    }
    match r {
        Ok(mut resp) => {
            for (n, v) in extra {
                if let Ok(v) = http::HeaderValue::from_str(&v) {
                    resp.headers_mut().insert(n, v);
                }
            }
            Ok(resp)
        }
        Err(e) => Err(extra.into_iter().fold(e, |e, (n, v)| e.with_header(n, v))),
    }
}

/// Whether a storage node's read endpoint answers `req` (see `ServeConfig::reads_only`): a
/// GetObject or HeadObject of the current version (with ranges, part numbers and response
/// headers, signed in a header or a presigned URL), or a batch GET. Training readers route
/// these by the cluster map; everything else has one place, the gateways.
pub fn is_node_read(req: &S3Request) -> bool {
    let plain_object_read = || {
        req.query.iter().all(|(k, _)| {
            k == "partNumber"
                || k == "x-id"
                || k.starts_with("response-")
                || k.starts_with("X-Amz-")
        })
    };
    match (&req.method, &req.bucket, &req.key) {
        (&Method::GET | &Method::HEAD, Some(_), Some(_)) => plain_object_read(),
        (&Method::POST, Some(_), None) => req.has_q("batch") && req.query.len() == 1,
        _ => false,
    }
}

/// The answer of a storage node's read endpoint to what it does not serve.
pub fn not_a_node_read() -> S3Error {
    err(
        S3ErrorCode::MethodNotAllowed,
        "This is a storage node's read endpoint: it answers GetObject, HeadObject and batch GET of the objects it holds. Send every other request to a gateway.",
    )
}

async fn route(state: &Arc<AppState>, req: &mut S3Request) -> (&'static str, R) {
    if state.config.reads_only && !is_node_read(req) {
        return ("NotANodeRead", Err(not_a_node_read()));
    }
    if state.config.fault_injection && crate::state::HttpFaults::take(&state.http_faults.slowdown) {
        return (
            "fault",
            Err(err(
                S3ErrorCode::SlowDown,
                "Please reduce your request rate. (injected by --fault-injection)",
            )),
        );
    }
    if let (Some(sub), Some(bucket)) = (buckets::not_configured_subresource(req), &req.bucket) {
        return (
            "NotConfigured",
            buckets::handle_not_configured(state, req, bucket, sub).await,
        );
    }
    if let Some(sub) = UNSUPPORTED_SUBRESOURCES.iter().find(|s| req.has_q(s)) {
        return (
            "unsupported",
            Err(err(
                S3ErrorCode::NotImplemented,
                format!("packrat does not implement the '{sub}' sub-resource"),
            )),
        );
    }
    // A client that asks for encryption must not believe its bytes are encrypted: an
    // operation that does not take encryption headers refuses them rather than ignore them.
    if !takes_encryption_headers(req)
        && let Some(h) = req
            .headers
            .keys()
            .find(|h| headers::is_encryption_header(h.as_str()))
    {
        return (
            "unsupported",
            Err(err(
                S3ErrorCode::NotImplemented,
                format!(
                    "packrat does not implement server-side encryption for this operation ({h}); the request was refused rather than stored unencrypted (see the README's compatibility table)"
                ),
            )),
        );
    }
    // Object versions are named on reads, copies and deletes; elsewhere a versionId would
    // be ignored and act on the current version, so it is refused instead.
    if req.key.is_some() && req.has_q("versionId") && !names_versions(req) {
        return (
            "unsupported",
            Err(err(
                S3ErrorCode::NotImplemented,
                "packrat names object versions on GetObject, HeadObject, GetObjectAttributes, DeleteObject, Get/Put/DeleteObjectTagging, Get/PutObjectAcl, a version's retention and legal hold, and CopyObject's and UploadPartCopy's source (x-amz-copy-source ?versionId=), not on this request",
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
            Method::GET => (
                "ListBuckets",
                buckets::handle_list_buckets(state, req).await,
            ),
            _ => ("service", Err(method_not_allowed())),
        },
        (Some(b), _) if m == Method::OPTIONS => (
            "PreflightCORS",
            bucket_config::handle_preflight(state, req, b).await,
        ),
        (Some(b), None) => match m {
            Method::PUT if req.has_q("object-lock") => (
                "PutObjectLockConfiguration",
                lock::handle_put_lock_config(state, req, b).await,
            ),
            Method::GET if req.has_q("object-lock") => (
                "GetObjectLockConfiguration",
                lock::handle_get_lock_config(state, req, b).await,
            ),
            _ if req.has_q("object-lock") => ("bucket", Err(method_not_allowed())),
            Method::PUT if req.has_q("encryption") => (
                "PutBucketEncryption",
                bucket_config::handle_put_bucket_encryption(state, req, b).await,
            ),
            Method::GET if req.has_q("encryption") => (
                "GetBucketEncryption",
                bucket_config::handle_get_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::Encryption,
                )
                .await,
            ),
            Method::DELETE if req.has_q("encryption") => (
                "DeleteBucketEncryption",
                bucket_config::handle_delete_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::Encryption,
                )
                .await,
            ),
            _ if req.has_q("encryption") => ("bucket", Err(method_not_allowed())),
            Method::PUT if req.has_q("tagging") => (
                "PutBucketTagging",
                bucket_config::handle_put_bucket_tagging(state, req, b).await,
            ),
            Method::GET if req.has_q("tagging") => (
                "GetBucketTagging",
                bucket_config::handle_get_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::Tagging,
                )
                .await,
            ),
            Method::DELETE if req.has_q("tagging") => (
                "DeleteBucketTagging",
                bucket_config::handle_delete_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::Tagging,
                )
                .await,
            ),
            Method::GET if req.has_q("policyStatus") => (
                "GetBucketPolicyStatus",
                bucket_config::handle_get_policy_status(state, req, b).await,
            ),
            Method::PUT if req.has_q("policy") => (
                "PutBucketPolicy",
                bucket_config::handle_put_bucket_policy(state, req, b).await,
            ),
            Method::GET if req.has_q("policy") => (
                "GetBucketPolicy",
                bucket_config::handle_get_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::Policy,
                )
                .await,
            ),
            Method::DELETE if req.has_q("policy") => (
                "DeleteBucketPolicy",
                bucket_config::handle_delete_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::Policy,
                )
                .await,
            ),
            Method::PUT if req.has_q("ownershipControls") => (
                "PutBucketOwnershipControls",
                object_acl::handle_put_ownership_controls(state, req, b).await,
            ),
            Method::GET if req.has_q("ownershipControls") => (
                "GetBucketOwnershipControls",
                object_acl::handle_get_ownership_controls(state, req, b).await,
            ),
            Method::DELETE if req.has_q("ownershipControls") => (
                "DeleteBucketOwnershipControls",
                object_acl::handle_delete_ownership_controls(state, req, b).await,
            ),
            Method::PUT if req.has_q("publicAccessBlock") => (
                "PutPublicAccessBlock",
                bucket_config::handle_put_public_access_block(state, req, b).await,
            ),
            Method::GET if req.has_q("publicAccessBlock") => (
                "GetPublicAccessBlock",
                bucket_config::handle_get_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::PublicAccessBlock,
                )
                .await,
            ),
            Method::DELETE if req.has_q("publicAccessBlock") => (
                "DeletePublicAccessBlock",
                bucket_config::handle_delete_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::PublicAccessBlock,
                )
                .await,
            ),
            Method::PUT if req.has_q("cors") => (
                "PutBucketCors",
                bucket_config::handle_put_bucket_cors(state, req, b).await,
            ),
            Method::GET if req.has_q("cors") => (
                "GetBucketCors",
                bucket_config::handle_get_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::Cors,
                )
                .await,
            ),
            Method::DELETE if req.has_q("cors") => (
                "DeleteBucketCors",
                bucket_config::handle_delete_bucket_config(
                    state,
                    req,
                    b,
                    packrat_store_api::BucketConfig::Cors,
                )
                .await,
            ),
            Method::PUT if req.has_q("versioning") => (
                "PutBucketVersioning",
                versions::handle_put_versioning(state, req, b).await,
            ),
            Method::GET if req.has_q("versioning") => (
                "GetBucketVersioning",
                versions::handle_get_versioning(state, req, b).await,
            ),
            Method::GET if req.has_q("versions") => (
                "ListObjectVersions",
                versions::handle_list_versions(state, req, b).await,
            ),
            Method::PUT if req.has_q("lifecycle") => (
                "PutBucketLifecycleConfiguration",
                buckets::handle_put_lifecycle(state, req, b).await,
            ),
            Method::GET if req.has_q("lifecycle") => (
                "GetBucketLifecycleConfiguration",
                buckets::handle_get_lifecycle(state, req, b).await,
            ),
            Method::DELETE if req.has_q("lifecycle") => (
                "DeleteBucketLifecycle",
                buckets::handle_delete_lifecycle(state, req, b).await,
            ),
            Method::PUT if req.has_q("acl") => (
                "PutBucketAcl",
                buckets::handle_put_bucket_acl(state, req, b).await,
            ),
            Method::PUT => (
                "CreateBucket",
                buckets::handle_create_bucket(state, req, b).await,
            ),
            Method::HEAD => (
                "HeadBucket",
                buckets::handle_head_bucket(state, req, b).await,
            ),
            Method::DELETE => (
                "DeleteBucket",
                buckets::handle_delete_bucket(state, req, b).await,
            ),
            Method::GET if req.has_q("location") => (
                "GetBucketLocation",
                buckets::handle_get_bucket_location(state, req, b).await,
            ),
            Method::GET if req.has_q("acl") => (
                "GetBucketAcl",
                buckets::handle_get_bucket_acl(state, req, b).await,
            ),
            Method::GET if req.has_q("uploads") => (
                "ListMultipartUploads",
                listing::handle_list_multipart_uploads(state, req, b).await,
            ),
            Method::GET if req.has_q("routes") => {
                ("GetRoutes", batch::handle_routes(state, req, b).await)
            }
            Method::GET if req.has_q("stream") => (
                "EpochStream",
                batch::handle_epoch_stream(state, req, b).await,
            ),
            Method::GET => (
                "ListObjects",
                listing::handle_list_objects(state, req, b).await,
            ),
            Method::POST if req.has_q("delete") => (
                "DeleteObjects",
                objects::handle_delete_objects(state, req, b).await,
            ),
            Method::POST if req.has_q("batch") => {
                ("BatchGet", batch::handle_batch_get(state, req, b).await)
            }
            Method::POST if req.query.is_empty() && post_object::is_form_upload(req) => (
                "PostObject",
                post_object::handle_post_object(state, req, b).await,
            ),
            _ => ("bucket", Err(method_not_allowed())),
        },
        (Some(b), Some(k)) => match m {
            Method::PUT if req.has_q("retention") => (
                "PutObjectRetention",
                lock::handle_put_retention(state, req, b, k).await,
            ),
            Method::GET if req.has_q("retention") => (
                "GetObjectRetention",
                lock::handle_get_retention(state, req, b, k).await,
            ),
            Method::PUT if req.has_q("legal-hold") => (
                "PutObjectLegalHold",
                lock::handle_put_legal_hold(state, req, b, k).await,
            ),
            Method::GET if req.has_q("legal-hold") => (
                "GetObjectLegalHold",
                lock::handle_get_legal_hold(state, req, b, k).await,
            ),
            _ if req.has_q("retention") || req.has_q("legal-hold") => {
                ("object", Err(method_not_allowed()))
            }
            Method::GET if req.has_q("tagging") => (
                "GetObjectTagging",
                tagging::handle_get_object_tagging(state, req, b, k).await,
            ),
            Method::PUT if req.has_q("tagging") => (
                "PutObjectTagging",
                tagging::handle_put_object_tagging(state, req, b, k).await,
            ),
            Method::DELETE if req.has_q("tagging") => (
                "DeleteObjectTagging",
                tagging::handle_delete_object_tagging(state, req, b, k).await,
            ),
            Method::PUT
                if req.has_q("uploadId")
                    && req.headers.contains_key(&headers::X_AMZ_COPY_SOURCE) =>
            {
                (
                    "UploadPartCopy",
                    multipart::handle_upload_part(state, req, b, k, true).await,
                )
            }
            Method::PUT if req.has_q("uploadId") => (
                "UploadPart",
                multipart::handle_upload_part(state, req, b, k, false).await,
            ),
            Method::PUT if req.has_q("acl") => (
                "PutObjectAcl",
                object_acl::handle_put_object_acl(state, req, b, k).await,
            ),
            Method::PUT if req.headers.contains_key(&headers::X_AMZ_COPY_SOURCE) => (
                "CopyObject",
                objects::handle_copy_object(state, req, b, k).await,
            ),
            Method::PUT => (
                "PutObject",
                objects::handle_put_object(state, req, b, k).await,
            ),
            Method::GET if req.has_q("uploadId") => (
                "ListParts",
                multipart::handle_list_parts(state, req, b, k).await,
            ),
            Method::GET if req.has_q("attributes") => (
                "GetObjectAttributes",
                objects::handle_get_object_attributes(state, req, b, k).await,
            ),
            Method::GET if req.has_q("acl") => (
                "GetObjectAcl",
                object_acl::handle_get_object_acl(state, req, b, k).await,
            ),
            Method::GET => (
                "GetObject",
                objects::handle_get_object(state, req, b, k, false).await,
            ),
            Method::HEAD => (
                "HeadObject",
                objects::handle_get_object(state, req, b, k, true).await,
            ),
            Method::DELETE if req.has_q("uploadId") => (
                "AbortMultipartUpload",
                multipart::handle_abort_multipart_upload(state, req, b, k).await,
            ),
            Method::DELETE => (
                "DeleteObject",
                objects::handle_delete_object(state, req, b, k).await,
            ),
            Method::POST if req.has_q("uploads") => (
                "CreateMultipartUpload",
                multipart::handle_create_multipart_upload(state, req, b, k).await,
            ),
            Method::POST if req.has_q("uploadId") => (
                "CompleteMultipartUpload",
                multipart::handle_complete_multipart_upload(state, req, b, k).await,
            ),
            _ => ("object", Err(method_not_allowed())),
        },
    }
}

// ---------------------------------------------------------------- shared helpers

/// Whether the request is an operation that understands server-side encryption headers:
/// PutObject, CopyObject, GetObject, HeadObject, GetObjectAttributes and the multipart upload
/// steps but ListParts and AbortMultipartUpload.
fn takes_encryption_headers(req: &S3Request) -> bool {
    if req.key.is_none()
        || ["tagging", "acl", "retention", "legal-hold"]
            .iter()
            .any(|q| req.has_q(q))
    {
        return false;
    }
    match req.method {
        // PutObject, CopyObject, UploadPart, UploadPartCopy.
        Method::PUT => !req.has_q("uploads"),
        // GetObject, HeadObject, GetObjectAttributes (not ListParts).
        Method::GET | Method::HEAD => !req.has_q("uploadId") && !req.has_q("uploads"),
        // CreateMultipartUpload, CompleteMultipartUpload.
        Method::POST => req.has_q("uploads") || req.has_q("uploadId"),
        _ => false,
    }
}

/// Whether an object request names a version where packrat reads one (GET, HEAD, DELETE of
/// the object itself; a version's retention and legal hold).
fn names_versions(req: &S3Request) -> bool {
    if req.has_q("retention") || req.has_q("legal-hold") {
        return matches!(req.method, Method::GET | Method::PUT);
    }
    if req.has_q("tagging") {
        return matches!(req.method, Method::GET | Method::PUT | Method::DELETE);
    }
    if req.has_q("acl") {
        return matches!(req.method, Method::GET | Method::PUT);
    }
    matches!(req.method, Method::GET | Method::HEAD | Method::DELETE)
        && !["uploadId", "uploads"].iter().any(|q| req.has_q(q))
}

fn method_not_allowed() -> S3Error {
    err(
        S3ErrorCode::MethodNotAllowed,
        "The specified method is not allowed against this resource.",
    )
}

fn no_content() -> R {
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(empty())
        .map_err(|e| S3Error::internal("response", e))
}
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

/// Whether a listing asks for `encoding-type=url` (anything else but none is refused).
fn url_encoding(req: &S3Request) -> S3Result<bool> {
    match req.q("encoding-type") {
        None => Ok(false),
        Some("url") => Ok(true),
        Some(_) => Err(err(
            S3ErrorCode::InvalidArgument,
            "Invalid Encoding Method specified in Request",
        )),
    }
}

/// A key or prefix as a listing shows it: URL-encoded under `encoding-type=url`.
fn listed_name(url: bool, s: &str) -> String {
    if url {
        uri_encode(s.as_bytes(), true)
    } else {
        s.to_string()
    }
}

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

fn owner_xml(x: &mut Xml, tag: &str, b: &Bucket) {
    x.open(tag);
    x.elem("ID", &b.owner_id);
    x.elem("DisplayName", &b.owner_name);
    x.close(tag);
}

#[cfg(test)]
mod tests {
    /// The gateway library (the S3 handlers, the batch extensions, the server, the admin API)
    /// sees storage only through the `ObjectStore` trait: no file of it names the engine, the
    /// index, the chunk store or the store crate outside its tests (the `packrat` crate opens
    /// a `LocalStore`; this crate does not even depend on one).
    #[test]
    fn handlers_reach_storage_only_through_the_trait() {
        fn walk(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(dir).expect("read src") {
                let p = e.expect("dir entry").path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|x| x == "rs") {
                    out.push(p);
                }
            }
        }
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut library = Vec::new();
        walk(&src, &mut library);
        assert!(
            library
                .iter()
                .any(|f| f.ends_with("s3/handlers/objects.rs")),
            "the walk found the handlers: {library:?}"
        );
        for file in library {
            let text = std::fs::read_to_string(&file).expect("read source");
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
            for banned in [
                "state.engine",
                "packrat_index",
                "packrat_chunk_store",
                "packrat_store::",
                "packrat_tiering",
            ] {
                assert!(!code.contains(banned), "{} names {banned}", file.display());
            }
        }
    }
}
