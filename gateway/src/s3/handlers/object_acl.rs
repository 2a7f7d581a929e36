//! Object ACLs in the handlers: a bucket's Object Ownership (Get/Put/DeleteBucketOwnershipControls),
//! the ACL an object write stores, GetObjectAcl and PutObjectAcl. The model is
//! [`crate::s3::acl`]; reads judge an object's ACL through [`Gate`].

use super::*;
use crate::s3::acl::{Acl, Ownership, Person};
use crate::s3::headers::{Kind, RequestHeaders};
use packrat_store_api::BucketConfig;
use std::collections::HashMap;

/// The bucket's Object Ownership (`BucketOwnerEnforced` unless set otherwise).
pub(crate) async fn ownership_of(state: &AppState, b: &Bucket) -> S3Result<Ownership> {
    match state
        .store
        .get_bucket_config(b, BucketConfig::OwnershipControls)
        .await?
    {
        None => Ok(Ownership::BucketOwnerEnforced),
        Some(doc) => std::str::from_utf8(&doc)
            .ok()
            .and_then(Ownership::parse)
            .ok_or_else(|| S3Error::internal("stored object ownership", "not a known value")),
    }
}

pub(super) fn bucket_owner(b: &Bucket) -> Person {
    Person {
        id: b.owner_id.clone(),
        name: b.owner_name.clone(),
    }
}

/// The server's users by canonical id (their display names), read only when an ACL may name
/// one: grant headers in `asked`, or an ACL document `body`.
pub(super) async fn users(
    state: &AppState,
    asked: &RequestHeaders,
    body: &[u8],
) -> S3Result<HashMap<String, String>> {
    let grants = asked.keys().any(|h| h.as_str().starts_with("x-amz-grant-"));
    if !grants && body.is_empty() {
        return Ok(HashMap::new());
    }
    Ok(state
        .store
        .list_keys()
        .await?
        .into_iter()
        .map(|k| (k.owner_id, k.name))
        .collect())
}

/// The ACL a new object gets from its write (PutObject, CopyObject, CreateMultipartUpload, a
/// form upload), put among its stored headers: in a bucket with ACLs disabled, only an ACL
/// that says what already holds is accepted (see [`headers::refuse_object_acl`]); with ACLs
/// enabled, what `asked` (the request's headers) names, owned as the bucket's Object
/// Ownership says. The bucket owner's own writes without ACL headers (the common case) cost
/// no lookup: the object needs no ACL of its own.
pub(super) async fn acl_for_write(
    state: &AppState,
    caller: Option<&Identity>,
    b: &Bucket,
    asked: &RequestHeaders,
    stored: &mut Vec<(String, String)>,
) -> S3Result<()> {
    // What a copy carried over from its source is never the copy's.
    acl::forget(stored);
    let writer = caller.filter(|c| c.owner_id != b.owner_id).map(|c| Person {
        id: c.owner_id.clone(),
        name: c.name.clone(),
    });
    if !asked.has(Kind::Acl) && writer.is_none() {
        return Ok(());
    }
    // Boxed: the common write, done above, keeps a small future.
    Box::pin(acl_asked(state, writer, b, asked, stored)).await
}

async fn acl_asked(
    state: &AppState,
    writer: Option<Person>,
    b: &Bucket,
    asked: &RequestHeaders,
    stored: &mut Vec<(String, String)>,
) -> S3Result<()> {
    let ownership = ownership_of(state, b).await?;
    if !ownership.acls_enabled() {
        return headers::refuse_object_acl(asked);
    }
    let bucket_owner = bucket_owner(b);
    let canned = asked.get("x-amz-acl").and_then(|v| v.to_str().ok());
    let owner = match (ownership, writer) {
        (Ownership::BucketOwnerPreferred, Some(_))
            if canned == Some("bucket-owner-full-control") =>
        {
            bucket_owner.clone()
        }
        (_, Some(w)) => w,
        (_, None) => bucket_owner.clone(),
    };
    let names = users(state, asked, &[]).await?;
    let lookup = |id: &str| names.get(id).cloned();
    let acl = Acl::from_headers(asked, owner.clone(), &bucket_owner, &lookup)?
        .unwrap_or_else(|| Acl::private(owner));
    bucket_config::refuse_public_acl(state, b, acl.is_public()).await?;
    // The bucket owner's private object is what an object without an ACL is.
    if acl != Acl::private(bucket_owner) {
        acl.store_in(stored)?;
    }
    Ok(())
}

/// The ACL of a form upload's `acl` field.
pub(super) fn form_acl_headers(acl: Option<&str>) -> S3Result<RequestHeaders> {
    let mut h = http::HeaderMap::new();
    if let Some(a) = acl {
        let v = http::HeaderValue::from_str(a).map_err(|_| {
            err(
                S3ErrorCode::InvalidArgument,
                "the acl field is not a header value",
            )
        })?;
        h.insert("x-amz-acl", v);
    }
    Ok(RequestHeaders::new(h))
}

/// GetObjectAcl (of the current object or a version by id).
pub(super) async fn handle_get_object_acl(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
    key: &str,
) -> R {
    let version = versions::version_id(req)?;
    let action = match version {
        Some(_) => Action::GET_OBJECT_VERSION_ACL,
        None => Action::GET_OBJECT_ACL,
    };
    let (b, gate) = load_bucket_gated(state, req, name, action).await?;
    let target = versions::read_target(state, &b, key, version)
        .await
        .map_err(|e| gate.hide(e))?;
    gate.check(req.identity.as_ref(), &target)?;
    let answer = if ownership_of(state, &b).await?.acls_enabled() {
        let acl = Acl::of(&target.attrs.headers)?.unwrap_or_else(|| Acl::private(bucket_owner(&b)));
        xml_ok(acl.to_xml())?
    } else {
        buckets::acl_answer(&b)?
    };
    versions::with_version_id(answer, target.version_id)
}

/// PutObjectAcl (of the current object or a version by id). With ACLs disabled it is accepted
/// only when it asks for what already holds (a canned `private` or `bucket-owner-full-control`,
/// or a body granting only the bucket's owner FULL_CONTROL), else 400
/// AccessControlListNotSupported, as S3 answers. With ACLs enabled, the object's grants become
/// those of the `x-amz-acl` header, the `x-amz-grant-*` headers or the body; its owner stays.
pub(super) async fn handle_put_object_acl(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
    key: &str,
) -> R {
    let version = versions::version_id(req)?.map(str::to_string);
    let action = match version {
        Some(_) => Action::PUT_OBJECT_VERSION_ACL,
        None => Action::PUT_OBJECT_ACL,
    };
    let (b, gate) = load_bucket_gated(state, req, name, action).await?;
    let body = read_xml_body(req).await?;
    if !ownership_of(state, &b).await?.acls_enabled() {
        headers::refuse_object_acl(&req.headers)?;
        if !body.is_empty() {
            refuse_body_grants(&b, &body)?;
        }
        let target = versions::read_target(state, &b, key, version.as_deref()).await?;
        return versions::with_version_id(Response::new(empty()), target.version_id);
    }
    let target = versions::read_target(state, &b, key, version.as_deref())
        .await
        .map_err(|e| gate.hide(e))?;
    gate.check(req.identity.as_ref(), &target)?;
    let owner = Acl::of(&target.attrs.headers)?
        .map(|a| a.owner)
        .unwrap_or_else(|| bucket_owner(&b));
    let names = users(state, &req.headers, &body).await?;
    let lookup = |id: &str| names.get(id).cloned();
    let acl = match (req.headers.has(Kind::Acl), body.is_empty()) {
        (true, false) => {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "PutObjectAcl takes its ACL from headers or from the body, not both",
            ));
        }
        (true, true) => Acl::from_headers(&req.headers, owner.clone(), &bucket_owner(&b), &lookup)?
            .unwrap_or_else(|| Acl::private(owner)),
        (false, false) => Acl::from_xml(&body, owner, &lookup)?,
        (false, true) => {
            return Err(err(
                S3ErrorCode::MalformedACLError,
                "PutObjectAcl needs an x-amz-acl header, x-amz-grant-* headers or an AccessControlPolicy body",
            ));
        }
    };
    bucket_config::refuse_public_acl(state, &b, acl.is_public()).await?;
    // An edit in place reaches a key's current version only: a noncurrent one keeps its ACL.
    if let Some(v) = &version {
        let current = state.store.head_object(&b, key).await?;
        if current.and_then(|c| c.version_id).as_deref() != Some(v.as_str()) {
            return Err(err(
                S3ErrorCode::NotImplemented,
                "packrat changes the ACL of a key's current version only, not of a noncurrent one",
            ));
        }
    }
    let mut stored = Vec::new();
    acl.store_in(&mut stored)?;
    // The version that was judged, still current (its ETag) when the edit commits.
    let condition = WriteCondition {
        if_match: Some(target.etag.clone()),
        ..Default::default()
    };
    let edited = state
        .store
        .update_object(
            &b,
            key,
            &condition,
            Box::new(move |cur| {
                acl::forget(&mut cur.headers);
                cur.headers.extend(stored);
            }),
        )
        .await?;
    versions::with_version_id(Response::new(empty()), edited.version_id)
}

/// With ACLs disabled, a PutObjectAcl body may grant only the bucket's owner FULL_CONTROL.
fn refuse_body_grants(b: &Bucket, body: &[u8]) -> S3Result<()> {
    let policy: xml::AccessControlPolicy = xml::parse(body)?;
    let grants = policy.list.map(|l| l.grants).unwrap_or_default();
    if let Some(g) = grants.iter().find(|g| {
        g.permission != "FULL_CONTROL" || g.grantee.id.as_deref() != Some(b.owner_id.as_str())
    }) {
        let who = g
            .grantee
            .id
            .as_deref()
            .or(g.grantee.uri.as_deref())
            .or(g.grantee.email.as_deref())
            .unwrap_or("?");
        return Err(headers::acl_not_supported(&format!(
            "a {} grant to {who}",
            g.permission
        )));
    }
    Ok(())
}

/// PutBucketOwnershipControls: `BucketOwnerEnforced` (ACLs disabled, the default),
/// `BucketOwnerPreferred` or `ObjectWriter` (objects carry ACLs).
pub(super) async fn handle_put_ownership_controls(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_BUCKET_OWNERSHIP_CONTROLS).await?;
    let body = read_xml_body(req).await?;
    let controls: xml::OwnershipControls = xml::parse(&body)?;
    let [rule] = controls.rules.as_slice() else {
        return Err(err(
            S3ErrorCode::MalformedXML,
            "OwnershipControls takes exactly one Rule",
        ));
    };
    let ownership = Ownership::parse(&rule.object_ownership).ok_or_else(|| {
        err(
            S3ErrorCode::MalformedXML,
            format!("Unknown ObjectOwnership '{}'", rule.object_ownership),
        )
    })?;
    let doc = ownership
        .acls_enabled()
        .then(|| ownership.name().as_bytes().to_vec());
    state
        .store
        .put_bucket_config(&b, BucketConfig::OwnershipControls, doc)
        .await?;
    Ok(Response::new(empty()))
}

/// GetBucketOwnershipControls: what is set, `BucketOwnerEnforced` when nothing is.
pub(super) async fn handle_get_ownership_controls(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::GET_BUCKET_OWNERSHIP_CONTROLS).await?;
    let ownership = ownership_of(state, &b).await?;
    let mut x = Xml::new();
    x.root("OwnershipControls");
    x.open("Rule");
    x.elem("ObjectOwnership", ownership.name());
    x.close("Rule");
    x.close("OwnershipControls");
    xml_ok(x)
}

/// DeleteBucketOwnershipControls: back to packrat's default, `BucketOwnerEnforced` (S3 would
/// fall back to `ObjectWriter`; README's compatibility table says so).
pub(super) async fn handle_delete_ownership_controls(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_BUCKET_OWNERSHIP_CONTROLS).await?;
    state
        .store
        .put_bucket_config(&b, BucketConfig::OwnershipControls, None)
        .await?;
    no_content()
}
