//! Who may do what: the actions handlers ask for, the bucket's verdict (its policy, owner and
//! ACL), the object ACL's gate, and the facts of a request a policy reads.

use super::*;

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
    let object = key.filter(|_| action.on_object);
    let existing = existing_tags(state, &b, policy.as_deref(), facts, object).await?;
    let facts = &Facts {
        existing_tags: existing.as_deref().or(facts.existing_tags),
        ..*facts
    };
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

/// The tags of the object `key` (or the version the request's `versionId` names), for a
/// policy that judges them (`s3:ExistingObjectTag/KEY`): `None`, and no store read, for any
/// other policy or without a key; empty when there is no such object.
pub(super) async fn existing_tags(
    state: &AppState,
    b: &Bucket,
    policy: Option<&crate::s3::policy::Policy>,
    facts: &Facts<'_>,
    key: Option<&str>,
) -> S3Result<Option<Vec<(String, String)>>> {
    let (Some(key), true) = (key, policy.is_some_and(|p| p.reads_existing_tags())) else {
        return Ok(None);
    };
    let found = match facts.q("versionId") {
        None => state.store.head_object(b, key).await?,
        Some(v) => match state.store.find_version(b, key, Some(v)).await {
            Ok(Some(packrat_store_api::FoundVersion::Object(o))) => Some(*o),
            _ => None,
        },
    };
    Ok(Some(found.map(|o| o.attrs.tags).unwrap_or_default()))
}

/// The gate of a caller the bucket does not admit: an object ACL's, where the action is one
/// an ACL grants and the bucket has ACLs enabled; else Access Denied.
pub(super) async fn acl_gate(
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
#[derive(Clone, Copy)]
pub(crate) struct Facts<'a> {
    pub peer: Option<std::net::IpAddr>,
    pub secure: bool,
    pub headers: &'a http::HeaderMap,
    pub query: &'a [(String, String)],
    /// The tags the request sets when they are not its `x-amz-tagging` header (a
    /// PutObjectTagging body, a form upload's field), for `s3:RequestObjectTag/KEY`.
    pub tags: Option<&'a [(String, String)]>,
    /// The tags of the object the request acts on, read only for a policy that judges them
    /// (`s3:ExistingObjectTag/KEY`); `None` where they were not read.
    pub existing_tags: Option<&'a [(String, String)]>,
}

impl<'a> Facts<'a> {
    pub fn of(req: &'a S3Request) -> Self {
        Self {
            peer: req.peer,
            secure: req.secure,
            headers: &req.headers,
            query: &req.query,
            tags: None,
            existing_tags: None,
        }
    }

    fn header(&self, name: &str) -> Option<&'a str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub(super) fn q(&self, name: &str) -> Option<&'a str> {
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

pub(super) fn access_denied() -> S3Error {
    err(S3ErrorCode::AccessDenied, "Access Denied")
}

/// A bucket by name; an anonymous caller learns nothing of buckets that do not exist.
pub(super) fn lookup_bucket(
    state: &AppState,
    identity: Option<&Identity>,
    name: &str,
) -> S3Result<Bucket> {
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
pub(super) enum Verdict {
    Allow,
    Deny,
    NotGranted,
}

pub(super) fn verdict(
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
        existing_tags: req.existing_tags,
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

pub(super) fn need_identity(req: &S3Request) -> S3Result<&Identity> {
    req.identity
        .as_ref()
        .ok_or_else(|| err(S3ErrorCode::AccessDenied, "Access Denied"))
}
