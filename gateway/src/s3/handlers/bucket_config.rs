//! Bucket configurations kept as documents (`BucketConfig`): bucket tagging, CORS and the
//! bucket policy (get, put, delete), a browser's preflight `OPTIONS`, and the
//! `Access-Control-*` headers added to the answers of requests that carry an `Origin`. The
//! store keeps each document as S3 writes it (the XML or JSON this module answers with),
//! checked on the way in.

use super::*;
use crate::s3::cors;
use crate::s3::policy::PublicAccessBlock;
use packrat_store_api::BucketConfig;

pub(super) async fn handle_put_bucket_tagging(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_BUCKET_TAGGING).await?;
    let body = read_xml_body(req).await?;
    let tags = crate::s3::tagging::parse_bucket_xml(&body)?;
    let doc = crate::s3::tagging::to_xml(&tags).finish().into_bytes();
    state
        .store
        .put_bucket_config(&b, BucketConfig::Tagging, Some(doc))
        .await?;
    no_content()
}

pub(super) async fn handle_put_bucket_cors(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_BUCKET_CORS).await?;
    let body = read_xml_body(req).await?;
    let rules = cors::parse(&body)?;
    let doc = cors::to_xml(&rules).finish().into_bytes();
    state
        .store
        .put_bucket_config(&b, BucketConfig::Cors, Some(doc))
        .await?;
    Ok(Response::new(empty()))
}

/// PutBucketPolicy: checked (`s3::policy::parse`) and kept as sent; it applies to the next
/// request through this gateway (and within `POLICY_CACHE_TTL` through others). A public
/// policy is refused while the bucket's BlockPublicPolicy is on.
pub(super) async fn handle_put_bucket_policy(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_BUCKET_POLICY).await?;
    let body = read_xml_body(req).await?;
    let policy = crate::s3::policy::parse(&body, &b.name)?;
    if policy.is_public()
        && public_access_block_of(state, &b)
            .await?
            .is_some_and(|p| p.block_public_policy)
    {
        return Err(err(
            S3ErrorCode::AccessDenied,
            "Access Denied: the bucket's BlockPublicPolicy setting refuses a public policy",
        ));
    }
    state
        .store
        .put_bucket_config(&b, BucketConfig::Policy, Some(body))
        .await?;
    state.policies.forget(b.id);
    no_content()
}

/// The bucket's Block Public Access settings, `None` if it has none.
pub(crate) async fn public_access_block_of(
    state: &AppState,
    b: &Bucket,
) -> S3Result<Option<PublicAccessBlock>> {
    let Some(doc) = state
        .store
        .get_bucket_config(b, BucketConfig::PublicAccessBlock)
        .await?
    else {
        return Ok(None);
    };
    parse_public_access_block(&doc)
        .map(Some)
        .map_err(|e| S3Error::internal("stored public access block", e.message))
}

fn parse_public_access_block(body: &[u8]) -> S3Result<PublicAccessBlock> {
    let c: xml::PublicAccessBlockConfiguration = xml::parse(body)?;
    let flag = |v: Option<String>| match v.as_deref().map(str::trim) {
        None | Some("false") => Ok(false),
        Some("true") => Ok(true),
        Some(_) => Err(err(
            S3ErrorCode::MalformedXML,
            "A public access block setting must be true or false",
        )),
    };
    Ok(PublicAccessBlock {
        block_public_acls: flag(c.block_public_acls)?,
        ignore_public_acls: flag(c.ignore_public_acls)?,
        block_public_policy: flag(c.block_public_policy)?,
        restrict_public_buckets: flag(c.restrict_public_buckets)?,
    })
}

/// PutPublicAccessBlock: the four settings, kept as S3 answers them; they apply to the next
/// request through this gateway (and within `POLICY_CACHE_TTL` through others).
pub(super) async fn handle_put_public_access_block(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_PUBLIC_ACCESS_BLOCK).await?;
    let body = read_xml_body(req).await?;
    let block = parse_public_access_block(&body)?;
    let mut x = Xml::new();
    x.root("PublicAccessBlockConfiguration");
    x.elem("BlockPublicAcls", &block.block_public_acls.to_string());
    x.elem("IgnorePublicAcls", &block.ignore_public_acls.to_string());
    x.elem("BlockPublicPolicy", &block.block_public_policy.to_string());
    x.elem(
        "RestrictPublicBuckets",
        &block.restrict_public_buckets.to_string(),
    );
    x.close("PublicAccessBlockConfiguration");
    state
        .store
        .put_bucket_config(
            &b,
            BucketConfig::PublicAccessBlock,
            Some(x.finish().into_bytes()),
        )
        .await?;
    state.policies.forget(b.id);
    Ok(Response::new(empty()))
}

/// PutBucketEncryption: SSE-S3 or SSE-KMS as the default of writes that ask for no encryption
/// (PutObject, CopyObject, CreateMultipartUpload, form uploads). A named KMS key must exist
/// (S3 finds out only at the first write; an early answer is kinder); whether a writer may use
/// it is checked at each write, as S3 does.
pub(super) async fn handle_put_bucket_encryption(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_ENCRYPTION).await?;
    let body = read_xml_body(req).await?;
    let (doc, default) = sse::bucket_default_doc(&xml::parse(&body)?)?;
    match default {
        sse::BucketDefault::S3 => {
            sse::ObjectCipher::create(&*state.store, &sse::Requested::S3)?;
        }
        sse::BucketDefault::Kms(Some(key)) => {
            sse::find(&*state.store, &key)?;
        }
        sse::BucketDefault::Kms(None) => {}
    }
    state
        .store
        .put_bucket_config(&b, BucketConfig::Encryption, Some(doc))
        .await?;
    state.bucket_encryption.forget(b.id);
    Ok(Response::new(empty()))
}

/// GetBucketPolicyStatus: whether the bucket's policy is public as S3 judges it (it allows
/// anyone, not only fixed source networks); NoSuchBucketPolicy when there is none.
pub(super) async fn handle_get_policy_status(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::GET_BUCKET_POLICY_STATUS).await?;
    let doc = state
        .store
        .get_bucket_config(&b, BucketConfig::Policy)
        .await?
        .ok_or_else(|| {
            err(
                S3ErrorCode::NotConfigured("NoSuchBucketPolicy"),
                "The bucket policy does not exist",
            )
        })?;
    let policy = crate::s3::policy::parse(&doc, &b.name)
        .map_err(|e| S3Error::internal("stored bucket policy", e.message))?;
    let mut x = Xml::new();
    x.root("PolicyStatus");
    x.elem(
        "IsPublic",
        if policy.is_public() { "true" } else { "false" },
    );
    x.close("PolicyStatus");
    xml_ok(x)
}

/// The action that reads (`change` false) or replaces and deletes a configuration.
fn config_action(kind: BucketConfig, change: bool) -> Action {
    match (kind, change) {
        (BucketConfig::Tagging, false) => Action::GET_BUCKET_TAGGING,
        (BucketConfig::Tagging, true) => Action::PUT_BUCKET_TAGGING,
        (BucketConfig::Cors, false) => Action::GET_BUCKET_CORS,
        (BucketConfig::Cors, true) => Action::PUT_BUCKET_CORS,
        (BucketConfig::Policy, false) => Action::GET_BUCKET_POLICY,
        (BucketConfig::Policy, true) => Action::DELETE_BUCKET_POLICY,
        (BucketConfig::Encryption, false) => Action::GET_ENCRYPTION,
        (BucketConfig::Encryption, true) => Action::PUT_ENCRYPTION,
        (BucketConfig::PublicAccessBlock, false) => Action::GET_PUBLIC_ACCESS_BLOCK,
        (BucketConfig::PublicAccessBlock, true) => Action::PUT_PUBLIC_ACCESS_BLOCK,
        (BucketConfig::OwnershipControls, false) => Action::GET_BUCKET_OWNERSHIP_CONTROLS,
        (BucketConfig::OwnershipControls, true) => Action::PUT_BUCKET_OWNERSHIP_CONTROLS,
        (BucketConfig::Acl, false) => Action::GET_BUCKET_ACL,
        (BucketConfig::Acl, true) => Action::PUT_BUCKET_ACL,
    }
}

/// GetBucketTagging, GetBucketCors, GetBucketPolicy and GetBucketEncryption: the stored document, or S3's 404 for
/// one never set.
pub(super) async fn handle_get_bucket_config(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
    kind: BucketConfig,
) -> R {
    let b = load_bucket(state, req, name, config_action(kind, false)).await?;
    let (code, what) = match kind {
        BucketConfig::Tagging => ("NoSuchTagSet", "The TagSet does not exist"),
        BucketConfig::Cors => (
            "NoSuchCORSConfiguration",
            "The CORS configuration does not exist",
        ),
        BucketConfig::Policy => ("NoSuchBucketPolicy", "The bucket policy does not exist"),
        BucketConfig::Encryption => (
            "ServerSideEncryptionConfigurationNotFoundError",
            "The server side encryption configuration was not found",
        ),
        BucketConfig::PublicAccessBlock => (
            "NoSuchPublicAccessBlockConfiguration",
            "The public access block configuration was not found",
        ),
        BucketConfig::OwnershipControls => (
            "OwnershipControlsNotFoundError",
            "The bucket ownership controls were not found",
        ),
        // Never routed here: GetBucketAcl answers what holds (`handle_get_bucket_acl`).
        BucketConfig::Acl => ("NoSuchAcl", "The bucket has no ACL of its own"),
    };
    let doc = state
        .store
        .get_bucket_config(&b, kind)
        .await?
        .ok_or_else(|| err(S3ErrorCode::NotConfigured(code), what))?;
    match kind {
        BucketConfig::Policy => Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/json")
            .body(full(doc))
            .map_err(|e| S3Error::internal("response", e)),
        _ => xml_doc(doc),
    }
}

/// DeleteBucketTagging, DeleteBucketCors, DeleteBucketPolicy and DeleteBucketEncryption: 204 whether or not there
/// was one.
pub(super) async fn handle_delete_bucket_config(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
    kind: BucketConfig,
) -> R {
    let b = load_bucket(state, req, name, config_action(kind, true)).await?;
    state.store.put_bucket_config(&b, kind, None).await?;
    match kind {
        BucketConfig::Policy | BucketConfig::PublicAccessBlock => state.policies.forget(b.id),
        BucketConfig::Encryption => state.bucket_encryption.forget(b.id),
        _ => {}
    }
    no_content()
}

/// Refuses a public ACL (`public`: a bucket's public-read, an object's public grant) in a
/// bucket whose Block Public Access says BlockPublicAcls.
pub(super) async fn refuse_public_acl(state: &AppState, b: &Bucket, public: bool) -> S3Result<()> {
    if public
        && public_access_block_of(state, b)
            .await?
            .is_some_and(|p| p.block_public_acls)
    {
        return Err(err(
            S3ErrorCode::AccessDenied,
            "Access Denied: the bucket's BlockPublicAcls setting refuses a public ACL",
        ));
    }
    Ok(())
}

fn xml_doc(doc: Vec<u8>) -> R {
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/xml")
        .body(full(doc))
        .map_err(|e| S3Error::internal("response", e))
}

fn forbidden(msg: &str) -> S3Error {
    err(S3ErrorCode::AccessForbidden, format!("CORSResponse: {msg}"))
}

/// The bucket's CORS rules, `None` if it has none (or there is no such bucket: a browser
/// learns nothing more from a preflight than from a bucket without rules).
async fn rules_of(state: &AppState, name: &str) -> S3Result<Option<Vec<cors::Rule>>> {
    let Some(b) = state.store.bucket(name)? else {
        return Ok(None);
    };
    match state
        .store
        .get_bucket_config(&b, BucketConfig::Cors)
        .await?
    {
        None => Ok(None),
        Some(doc) => cors::parse(&doc)
            .map(Some)
            .map_err(|e| S3Error::internal("stored CORS configuration", e.message)),
    }
}

/// A browser's preflight (`OPTIONS` on a bucket or object, unsigned): 200 with the
/// `Access-Control-*` headers of the first rule that allows the origin, the method and every
/// requested header; 403 `AccessForbidden` otherwise, as S3 answers.
pub(super) async fn handle_preflight(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let h = |n: &str| req.headers.get(n).and_then(|v| v.to_str().ok());
    let (Some(origin), Some(method)) = (h("origin"), h("access-control-request-method")) else {
        return Err(err(
            S3ErrorCode::BadRequest,
            "Insufficient information. Origin request header needed.",
        ));
    };
    let requested = cors::requested_headers(h("access-control-request-headers").unwrap_or(""));
    let requested: Vec<&str> = requested.iter().map(String::as_str).collect();
    let Some(rules) = rules_of(state, name).await? else {
        return Err(forbidden("CORS is not enabled for this bucket."));
    };
    let Some(rule) = cors::matching(&rules, origin, method, &requested) else {
        return Err(forbidden(
            "This CORS request is not allowed. This is usually because the evalution of Origin, request method / Access-Control-Request-Method or Access-Control-Request-Headers are not whitelisted by the resource's CORS spec.",
        ));
    };
    let mut resp = Response::new(empty());
    for (n, v) in cors::answer_headers(rule, origin, &requested) {
        if let Ok(v) = http::HeaderValue::from_str(&v) {
            resp.headers_mut().insert(n, v);
        }
    }
    Ok(resp)
}

/// The `Access-Control-*` headers for the answer to a request with an `Origin` (an actual
/// request, not a preflight), from the bucket's rules; none when no rule allows it (the
/// browser then withholds the answer from the page). `HEAD` is matched as itself.
pub(super) async fn cors_headers(
    state: &AppState,
    bucket: &str,
    origin: &str,
    method: &Method,
) -> Vec<(&'static str, String)> {
    match rules_of(state, bucket).await {
        Ok(Some(rules)) => cors::matching(&rules, origin, method.as_str(), &[])
            .map(|r| cors::answer_headers(r, origin, &[]))
            .unwrap_or_default(),
        _ => Vec::new(),
    }
}
