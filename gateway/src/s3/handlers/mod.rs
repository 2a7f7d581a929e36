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
    format!("\"{etag}\"")
}

/// Who may do what when no bucket policy speaks: the bucket's owner and canned ACL.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Access {
    /// Object bytes, HEAD and listings: anonymous callers too, on a public-read bucket.
    Read,
    /// Reading configuration and metadata beyond objects' bytes (ACL, location, lifecycle,
    /// object tags, multipart uploads and parts): the owner (or root) only, never anonymous.
    Owner,
    Write,
}

/// What a handler asks to do to a bucket: the action a bucket policy names (`s3:GetObject`),
/// what the owner and canned ACL allow without a policy, and whether the policy's resource is
/// the object (`arn:aws:s3:::bucket/key`) or the bucket.
#[derive(Clone, Copy)]
pub(crate) struct Action {
    pub iam: &'static str,
    access: Access,
    on_object: bool,
}

impl Action {
    const fn bucket(iam: &'static str, access: Access) -> Self {
        Self {
            iam,
            access,
            on_object: false,
        }
    }

    const fn object(iam: &'static str, access: Access) -> Self {
        Self {
            iam,
            access,
            on_object: true,
        }
    }

    pub const GET_OBJECT: Self = Self::object("s3:GetObject", Access::Read);
    pub const GET_OBJECT_VERSION: Self = Self::object("s3:GetObjectVersion", Access::Read);
    pub const DELETE_OBJECT_VERSION: Self = Self::object("s3:DeleteObjectVersion", Access::Write);
    pub const LIST_BUCKET_VERSIONS: Self = Self::bucket("s3:ListBucketVersions", Access::Read);
    pub const GET_BUCKET_VERSIONING: Self = Self::bucket("s3:GetBucketVersioning", Access::Owner);
    pub const PUT_BUCKET_VERSIONING: Self = Self::bucket("s3:PutBucketVersioning", Access::Write);
    pub const GET_OBJECT_ATTRIBUTES: Self = Self::object("s3:GetObjectAttributes", Access::Read);
    pub const PUT_OBJECT: Self = Self::object("s3:PutObject", Access::Write);
    pub const DELETE_OBJECT: Self = Self::object("s3:DeleteObject", Access::Write);
    pub const GET_OBJECT_TAGGING: Self = Self::object("s3:GetObjectTagging", Access::Owner);
    pub const GET_OBJECT_VERSION_TAGGING: Self =
        Self::object("s3:GetObjectVersionTagging", Access::Owner);
    pub const GET_OBJECT_ACL: Self = Self::object("s3:GetObjectAcl", Access::Owner);
    pub const PUT_OBJECT_ACL: Self = Self::object("s3:PutObjectAcl", Access::Write);
    pub const GET_OBJECT_VERSION_ACL: Self = Self::object("s3:GetObjectVersionAcl", Access::Owner);
    pub const PUT_OBJECT_VERSION_ACL: Self = Self::object("s3:PutObjectVersionAcl", Access::Write);
    pub const PUT_OBJECT_TAGGING: Self = Self::object("s3:PutObjectTagging", Access::Write);
    pub const DELETE_OBJECT_TAGGING: Self = Self::object("s3:DeleteObjectTagging", Access::Write);
    pub const PUT_OBJECT_VERSION_TAGGING: Self =
        Self::object("s3:PutObjectVersionTagging", Access::Write);
    pub const DELETE_OBJECT_VERSION_TAGGING: Self =
        Self::object("s3:DeleteObjectVersionTagging", Access::Write);
    pub const ABORT_MULTIPART_UPLOAD: Self = Self::object("s3:AbortMultipartUpload", Access::Write);
    pub const LIST_MULTIPART_UPLOAD_PARTS: Self =
        Self::object("s3:ListMultipartUploadParts", Access::Owner);
    pub const LIST_BUCKET: Self = Self::bucket("s3:ListBucket", Access::Read);
    pub const LIST_BUCKET_MULTIPART_UPLOADS: Self =
        Self::bucket("s3:ListBucketMultipartUploads", Access::Owner);
    pub const DELETE_BUCKET: Self = Self::bucket("s3:DeleteBucket", Access::Write);
    pub const GET_BUCKET_LOCATION: Self = Self::bucket("s3:GetBucketLocation", Access::Owner);
    pub const GET_BUCKET_ACL: Self = Self::bucket("s3:GetBucketAcl", Access::Owner);
    pub const PUT_BUCKET_ACL: Self = Self::bucket("s3:PutBucketAcl", Access::Write);
    pub const GET_LIFECYCLE: Self = Self::bucket("s3:GetLifecycleConfiguration", Access::Owner);
    pub const PUT_LIFECYCLE: Self = Self::bucket("s3:PutLifecycleConfiguration", Access::Write);
    pub const GET_BUCKET_TAGGING: Self = Self::bucket("s3:GetBucketTagging", Access::Owner);
    pub const PUT_BUCKET_TAGGING: Self = Self::bucket("s3:PutBucketTagging", Access::Write);
    pub const GET_BUCKET_CORS: Self = Self::bucket("s3:GetBucketCORS", Access::Owner);
    pub const PUT_BUCKET_CORS: Self = Self::bucket("s3:PutBucketCORS", Access::Write);
    pub const GET_BUCKET_POLICY: Self = Self::bucket("s3:GetBucketPolicy", Access::Owner);
    pub const GET_BUCKET_POLICY_STATUS: Self =
        Self::bucket("s3:GetBucketPolicyStatus", Access::Owner);
    pub const PUT_BUCKET_POLICY: Self = Self::bucket("s3:PutBucketPolicy", Access::Write);
    pub const DELETE_BUCKET_POLICY: Self = Self::bucket("s3:DeleteBucketPolicy", Access::Write);
    pub const PUT_ENCRYPTION: Self = Self::bucket("s3:PutEncryptionConfiguration", Access::Write);
    pub const GET_ENCRYPTION: Self = Self::bucket("s3:GetEncryptionConfiguration", Access::Owner);
    pub const PUT_BUCKET_OBJECT_LOCK: Self =
        Self::bucket("s3:PutBucketObjectLockConfiguration", Access::Write);
    pub const GET_BUCKET_OBJECT_LOCK: Self =
        Self::bucket("s3:GetBucketObjectLockConfiguration", Access::Owner);
    pub const PUT_OBJECT_RETENTION: Self = Self::object("s3:PutObjectRetention", Access::Write);
    pub const GET_OBJECT_RETENTION: Self = Self::object("s3:GetObjectRetention", Access::Owner);
    pub const PUT_OBJECT_LEGAL_HOLD: Self = Self::object("s3:PutObjectLegalHold", Access::Write);
    pub const GET_OBJECT_LEGAL_HOLD: Self = Self::object("s3:GetObjectLegalHold", Access::Owner);
    pub const BYPASS_GOVERNANCE_RETENTION: Self =
        Self::object("s3:BypassGovernanceRetention", Access::Write);
    pub const PUT_PUBLIC_ACCESS_BLOCK: Self =
        Self::bucket("s3:PutBucketPublicAccessBlock", Access::Write);
    pub const GET_PUBLIC_ACCESS_BLOCK: Self =
        Self::bucket("s3:GetBucketPublicAccessBlock", Access::Owner);
    pub const PUT_BUCKET_OWNERSHIP_CONTROLS: Self =
        Self::bucket("s3:PutBucketOwnershipControls", Access::Write);
    pub const GET_BUCKET_OWNERSHIP_CONTROLS: Self =
        Self::bucket("s3:GetBucketOwnershipControls", Access::Owner);
    /// Configurations packrat does not have (their "not configured" answers): the owner's.
    pub const GET_BUCKET_CONFIGURATION: Self =
        Self::bucket("s3:GetBucketConfiguration", Access::Owner);

    /// The owner may always read, replace or remove the policy, whatever it denies, so that
    /// no policy locks its bucket's owner out for good (AWS keeps the same door open).
    fn manages_policy(self) -> bool {
        matches!(
            self.iam,
            "s3:GetBucketPolicy" | "s3:PutBucketPolicy" | "s3:DeleteBucketPolicy"
        )
    }

    /// What an object's ACL must grant for this action, for the actions one can grant.
    /// What a bucket's ACL must grant for this action: READ for reads and listings (as the
    /// canned `public-read` opens them), WRITE for object writes and deletes, READ_ACP and
    /// WRITE_ACP for the bucket's ACL.
    fn bucket_permission(self) -> Option<acl::Permission> {
        match self.iam {
            _ if self.access == Access::Read => Some(acl::Permission::Read),
            "s3:PutObject"
            | "s3:DeleteObject"
            | "s3:DeleteObjectVersion"
            | "s3:AbortMultipartUpload" => Some(acl::Permission::Write),
            "s3:GetBucketAcl" => Some(acl::Permission::ReadAcp),
            "s3:PutBucketAcl" => Some(acl::Permission::WriteAcp),
            _ => None,
        }
    }

    fn acl_permission(self) -> Option<acl::Permission> {
        match self.iam {
            "s3:GetObject" | "s3:GetObjectVersion" | "s3:GetObjectAttributes" => {
                Some(acl::Permission::Read)
            }
            "s3:GetObjectAcl" | "s3:GetObjectVersionAcl" => Some(acl::Permission::ReadAcp),
            "s3:PutObjectAcl" | "s3:PutObjectVersionAcl" => Some(acl::Permission::WriteAcp),
            _ => None,
        }
    }
}

/// Whether a caller reached an object through its bucket, or may only through the object's
/// own ACL (in a bucket with ACLs enabled, where the bucket said neither yes nor an explicit
/// no): the handler then checks the object it loads with [`Gate::check`].
#[derive(Clone, Copy)]
pub(crate) enum Gate {
    Open,
    ObjectAcl {
        wanted: acl::Permission,
        /// The bucket's IgnorePublicAcls.
        ignore_public: bool,
    },
}

impl Gate {
    /// Whether `caller` may act on `obj` (loaded through this gate).
    pub fn check(self, caller: Option<&Identity>, obj: &ObjectInfo) -> S3Result<()> {
        let Gate::ObjectAcl {
            wanted,
            ignore_public,
        } = self
        else {
            return Ok(());
        };
        match acl::Acl::of(&obj.attrs.headers)? {
            Some(a) if a.allows(caller, wanted, ignore_public) => Ok(()),
            _ => Err(access_denied()),
        }
    }

    /// What a lookup of the object answers: through an ACL gate, every failure (no such
    /// key, a delete marker, ...) is Access Denied, so a caller the bucket does not admit
    /// learns nothing of which keys exist.
    pub fn hide(self, e: S3Error) -> S3Error {
        match self {
            Gate::Open => e,
            Gate::ObjectAcl { .. } => access_denied(),
        }
    }
}

/// [`load_bucket`] for an action an object's ACL can grant: where the bucket denies the
/// caller (but not by an explicit Deny) and its Object Ownership enables ACLs, the answer is
/// a gate that the object's ACL must then open.
pub(crate) async fn load_bucket_gated(
    state: &AppState,
    req: &S3Request,
    name: &str,
    action: Action,
) -> S3Result<(Bucket, Gate)> {
    let key = req.key.as_deref().filter(|_| action.on_object);
    bucket_gated(
        state,
        &Facts::of(req),
        req.identity.as_ref(),
        name,
        action,
        key,
    )
    .await
}

/// [`bucket_for`] with an object ACL's gate: see [`load_bucket_gated`].
pub(crate) async fn bucket_gated(
    state: &AppState,
    facts: &Facts<'_>,
    identity: Option<&Identity>,
    name: &str,
    action: Action,
    key: Option<&str>,
) -> S3Result<(Bucket, Gate)> {
    let b = lookup_bucket(state, identity, name)?;
    if identity.is_some_and(|i| i.is_root) {
        return Ok((b, Gate::Open));
    }
    let policy = policy_of(state, &b).await?;
    match verdict(facts, identity, &b, policy.as_deref(), action, key) {
        Verdict::Allow => Ok((b, Gate::Open)),
        Verdict::Deny => Err(access_denied()),
        Verdict::NotGranted => {
            let ignore_public = policy.is_some_and(|p| p.block.ignore_public_acls);
            // Boxed: the common caller, admitted above, keeps a small future.
            Box::pin(acl_gate(state, b, action, ignore_public)).await
        }
    }
}

/// The gate of a caller the bucket does not admit: an object ACL's, where the action is one
/// an ACL grants and the bucket has ACLs enabled; else Access Denied.
async fn acl_gate(
    state: &AppState,
    b: Bucket,
    action: Action,
    ignore_public: bool,
) -> S3Result<(Bucket, Gate)> {
    let Some(wanted) = action.acl_permission() else {
        return Err(access_denied());
    };
    if !object_acl::ownership_of(state, &b).await?.acls_enabled() {
        return Err(access_denied());
    }
    Ok((
        b,
        Gate::ObjectAcl {
            wanted,
            ignore_public,
        },
    ))
}

/// Loads a bucket and checks that the caller may do `action` to it (to the request's key, for
/// an object action): see [`bucket_for`].
pub(crate) async fn load_bucket(
    state: &AppState,
    req: &S3Request,
    name: &str,
    action: Action,
) -> S3Result<Bucket> {
    match load_bucket_gated(state, req, name, action).await? {
        (b, Gate::Open) => Ok(b),
        (_, Gate::ObjectAcl { .. }) => Err(access_denied()),
    }
}

/// What a bucket policy's conditions read of a request, borrowed field by field (a handler
/// may hold the body).
pub(crate) struct Facts<'a> {
    pub peer: Option<std::net::IpAddr>,
    pub secure: bool,
    pub headers: &'a http::HeaderMap,
    pub query: &'a [(String, String)],
    /// The tags the request sets when they are not its `x-amz-tagging` header (a
    /// PutObjectTagging body, a form upload's field), for `s3:RequestObjectTag/KEY`.
    pub tags: Option<&'a [(String, String)]>,
}

impl<'a> Facts<'a> {
    pub fn of(req: &'a S3Request) -> Self {
        Self {
            peer: req.peer,
            secure: req.secure,
            headers: &req.headers,
            query: &req.query,
            tags: None,
        }
    }

    fn header(&self, name: &str) -> Option<&'a str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn q(&self, name: &str) -> Option<&'a str> {
        self.query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// Loads a bucket and checks that `identity` may do `action` to it, or to `key` in it. The
/// root key may do anything. Otherwise the bucket's policy decides first: an explicit Deny
/// refuses, an Allow permits; where it says nothing (or there is none), the owner may do
/// anything and anyone may read (objects, HEAD, listings) a public-read bucket.
pub(crate) async fn bucket_for(
    state: &AppState,
    req: &Facts<'_>,
    identity: Option<&Identity>,
    name: &str,
    action: Action,
    key: Option<&str>,
) -> S3Result<Bucket> {
    match bucket_gated(state, req, identity, name, action, key).await? {
        (b, Gate::Open) => Ok(b),
        (_, Gate::ObjectAcl { .. }) => Err(access_denied()),
    }
}

fn access_denied() -> S3Error {
    err(S3ErrorCode::AccessDenied, "Access Denied")
}

/// A bucket by name; an anonymous caller learns nothing of buckets that do not exist.
fn lookup_bucket(state: &AppState, identity: Option<&Identity>, name: &str) -> S3Result<Bucket> {
    match (identity, state.store.bucket(name)?) {
        (None, None) => Err(access_denied()),
        (Some(_), None) => Err(no_such_bucket()),
        (_, Some(b)) => Ok(b),
    }
}

/// For requests that name many keys (DeleteObjects, batch GET, epoch streams): the bucket, and
/// its policy when it has one (not for the root key), for the caller to judge each key with
/// [`permits`]. Without a policy every key is judged alike, so the request is judged once,
/// here.
pub(crate) async fn load_bucket_for_keys(
    state: &AppState,
    req: &S3Request,
    name: &str,
    action: Action,
) -> S3Result<(Bucket, Option<Arc<crate::s3::policy::Policy>>)> {
    let identity = req.identity.as_ref();
    let b = lookup_bucket(state, identity, name)?;
    if identity.is_some_and(|i| i.is_root) {
        return Ok((b, None));
    }
    let policy = policy_of(state, &b).await?;
    if policy.is_none() && !permits(&Facts::of(req), identity, &b, None, action, None) {
        return Err(access_denied());
    }
    Ok((b, policy))
}

/// [`permits`] for one key of a many-key request, as an error to report.
pub(crate) fn check_key(
    req: &S3Request,
    b: &Bucket,
    policy: Option<&crate::s3::policy::Policy>,
    action: Action,
    key: &str,
) -> S3Result<()> {
    match policy {
        Some(p)
            if !permits(
                &Facts::of(req),
                req.identity.as_ref(),
                b,
                Some(p),
                action,
                Some(key),
            ) =>
        {
            Err(access_denied())
        }
        _ => Ok(()),
    }
}

/// The bucket's policy, from this gateway's cache or the store.
pub(crate) async fn policy_of(
    state: &AppState,
    b: &Bucket,
) -> S3Result<Option<Arc<crate::s3::policy::Policy>>> {
    let generation = match state.policies.fresh(b.id) {
        Ok(p) => return Ok(p),
        Err(g) => g,
    };
    let doc = state
        .store
        .get_bucket_config(b, packrat_store_api::BucketConfig::Policy)
        .await?;
    // A stored policy that no longer parses refuses every request it would have judged
    // (a 500), rather than letting them through with its denials forgotten.
    let policy = match doc {
        None => None,
        Some(d) => Some(
            crate::s3::policy::parse(&d, &b.name)
                .map_err(|e| S3Error::internal("stored bucket policy", e.message))?,
        ),
    };
    // The bucket's Block Public Access settings travel with its policy (one cache, one
    // lookup per request); settings without a policy make a policy of no statements.
    let block = bucket_config::public_access_block_of(state, b).await?;
    // So do the bucket's ACL grants.
    let bucket_acl = buckets::stored_bucket_acl(state, b).await?;
    let policy = match (policy, block, bucket_acl) {
        (None, None, None) => None,
        (policy, block, bucket_acl) => {
            let mut p =
                policy.unwrap_or_else(|| crate::s3::policy::Policy::blocking(Default::default()));
            if let Some(block) = block {
                p.block = block;
            }
            p.bucket_acl = bucket_acl;
            Some(Arc::new(p))
        }
    };
    state.policies.store(b.id, policy.clone(), generation);
    Ok(policy)
}

/// Whether a caller (not the root key) may do `action` to a loaded bucket, or to `key` in it.
pub(crate) fn permits(
    req: &Facts<'_>,
    identity: Option<&Identity>,
    b: &Bucket,
    policy: Option<&crate::s3::policy::Policy>,
    action: Action,
    key: Option<&str>,
) -> bool {
    verdict(req, identity, b, policy, action, key) == Verdict::Allow
}

/// What the bucket says of a caller's action: yes, an explicit no (a policy's Deny), or not
/// yes (which an object's ACL may still turn into yes: [`load_bucket_gated`]).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Allow,
    Deny,
    NotGranted,
}

fn verdict(
    req: &Facts<'_>,
    identity: Option<&Identity>,
    b: &Bucket,
    policy: Option<&crate::s3::policy::Policy>,
    action: Action,
    key: Option<&str>,
) -> Verdict {
    use crate::s3::policy::{Decision, RequestContext};
    let owner = identity.is_some_and(|i| i.owner_id == b.owner_id);
    // IgnorePublicAcls: a public ACL grants nobody anything.
    let ignore_public = policy.is_some_and(|p| p.block.ignore_public_acls);
    let by_acl = if owner
        || (b.public_read && !ignore_public && action.access == Access::Read)
        || action.bucket_permission().is_some_and(|wanted| {
            (policy.and_then(|p| p.bucket_acl.as_ref()))
                .is_some_and(|a| a.allows(identity, wanted, ignore_public))
        }) {
        Verdict::Allow
    } else {
        Verdict::NotGranted
    };
    let Some(policy) = policy else {
        return by_acl;
    };
    let resource = match key {
        Some(k) if action.on_object => format!("arn:aws:s3:::{}/{k}", b.name),
        _ => format!("arn:aws:s3:::{}", b.name),
    };
    let listing = action.iam == "s3:ListBucket";
    // The tags a request sets, parsed from its header only for a policy that reads them.
    let header_tags = match (req.tags, policy.reads_request_tags()) {
        (None, true) => req
            .header("x-amz-tagging")
            .and_then(|v| crate::s3::tagging::parse_header(v).ok()),
        _ => None,
    };
    let ctx = RequestContext {
        principal: identity,
        action: action.iam,
        resource: &resource,
        source_ip: req.peer,
        secure_transport: req.secure,
        user_agent: req.header("user-agent"),
        referer: req.header("referer"),
        prefix: req.q("prefix").filter(|_| listing),
        delimiter: req.q("delimiter").filter(|_| listing),
        max_keys: req.q("max-keys").filter(|_| listing),
        headers: Some(req.headers),
        request_tags: req.tags.or(header_tags.as_deref()),
    };
    match policy.evaluate(&ctx) {
        Decision::Deny if owner && action.manages_policy() => Verdict::Allow,
        Decision::Deny => Verdict::Deny,
        // RestrictPublicBuckets: while the policy is public, it grants anonymous callers
        // nothing (the server's own users, S3's "within the account", keep what it gives).
        Decision::Allow
            if identity.is_none() && policy.block.restrict_public_buckets && policy.is_public() =>
        {
            Verdict::NotGranted
        }
        Decision::Allow => Verdict::Allow,
        Decision::Silent => by_acl,
    }
}

fn need_identity(req: &S3Request) -> S3Result<&Identity> {
    req.identity
        .as_ref()
        .ok_or_else(|| err(S3ErrorCode::AccessDenied, "Access Denied"))
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

async fn route(state: &Arc<AppState>, req: &mut S3Request) -> (&'static str, R) {
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
