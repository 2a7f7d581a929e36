//! Buckets: list, create, head, delete, location, the canned ACL and lifecycle configuration.

use super::*;
use crate::s3::headers::{Kind, RequestHeaders};

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

/// ListBuckets: the caller's buckets (every bucket for a root key) by name, with `prefix`,
/// and pages of `max-buckets` (1 to 10,000) resumed by `continuation-token`. Without
/// `max-buckets` every bucket comes in one answer, as S3 gives an account's.
pub(super) async fn handle_list_buckets(state: &Arc<AppState>, req: &S3Request) -> R {
    let id = need_identity(req)?;
    let bad = |what: &str| err(S3ErrorCode::InvalidArgument, what.to_string());
    let max = match req.q("max-buckets") {
        None => usize::MAX,
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=10_000).contains(n))
            .ok_or_else(|| bad("max-buckets must be an integer from 1 to 10000"))?,
    };
    let after = match req.q("continuation-token") {
        None => None,
        Some(t) => Some(
            base64::engine::general_purpose::URL_SAFE_NO_PAD
                .decode(t)
                .ok()
                .and_then(|b| String::from_utf8(b).ok())
                .ok_or_else(|| bad("The continuation token provided is incorrect"))?,
        ),
    };
    let prefix = req.q("prefix").unwrap_or("");
    let region = req.q("bucket-region");
    // The store answers its buckets by name.
    let mut buckets: Vec<Bucket> = state
        .store
        .list_buckets()
        .await?
        .into_iter()
        .filter(|b| id.is_root || b.owner_id == id.owner_id)
        .filter(|b| b.name.starts_with(prefix))
        .filter(|b| after.as_deref().is_none_or(|a| b.name.as_str() > a))
        .filter(|_| region.is_none_or(|r| r == state.config.region))
        .collect();
    let truncated = buckets.len() > max;
    buckets.truncate(max);
    let mut x = Xml::new();
    x.root("ListAllMyBucketsResult");
    x.open("Owner");
    x.elem("ID", &id.owner_id);
    x.elem("DisplayName", &id.name);
    x.close("Owner");
    x.open("Buckets");
    for b in &buckets {
        x.open("Bucket");
        x.elem("Name", &b.name);
        x.elem("CreationDate", &iso8601(b.created_ms));
        x.elem("BucketRegion", &state.config.region);
        x.close("Bucket");
    }
    x.close("Buckets");
    if truncated && let Some(last) = buckets.last() {
        x.elem(
            "ContinuationToken",
            &base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(last.name.as_bytes()),
        );
    }
    if req.has_q("prefix") {
        x.elem("Prefix", prefix);
    }
    x.close("ListAllMyBucketsResult");
    xml_ok(x)
}

/// The bucket ACL a CreateBucket's or PutBucketAcl's headers (`x-amz-acl`, `x-amz-grant-*`)
/// or PutBucketAcl's body ask for, for a bucket of `owner`; `None` when they name none.
async fn asked_bucket_acl(
    state: &AppState,
    headers: &RequestHeaders,
    owner: acl::Person,
    body: &[u8],
) -> S3Result<Option<acl::Acl>> {
    let names = object_acl::users(state, headers, body).await?;
    let lookup = |id: &str| names.get(id).cloned();
    match (headers.has(Kind::Acl), body.is_empty()) {
        (true, false) => Err(err(
            S3ErrorCode::InvalidRequest,
            "PutBucketAcl takes its ACL from headers or from the body, not both",
        )),
        (true, true) => acl::Acl::bucket_from_headers(headers, owner, &lookup),
        (false, false) => acl::Acl::bucket_from_xml(body, owner, &lookup).map(Some),
        (false, true) => Ok(None),
    }
}

/// Whether the ACL is one the bucket's `public_read` says all of: the owner's full control,
/// with or without everyone's READ (`private`, `public-read`).
fn plain(acl: &acl::Acl) -> bool {
    use acl::{Grantee, Permission};
    acl.grants.iter().all(|(g, p)| match g {
        Grantee::User(u) => u.id == acl.owner.id && *p == Permission::FullControl,
        Grantee::AllUsers => *p == Permission::Read,
        Grantee::AuthenticatedUsers => false,
    })
}

/// Everyone's READ: the bucket's `public_read`, which anonymous reads check with no lookup.
fn public_read(acl: &acl::Acl) -> bool {
    acl.grants.iter().any(|(g, p)| {
        *g == acl::Grantee::AllUsers
            && matches!(p, acl::Permission::Read | acl::Permission::FullControl)
    })
}

/// Stores a bucket's ACL: everyone's READ as the bucket's `public_read`, any other grant as
/// the bucket's ACL document (none for `private` and `public-read`). The bucket's
/// BlockPublicAcls refuses a public one.
async fn set_bucket_acl(state: &AppState, b: &Bucket, acl: &acl::Acl) -> S3Result<()> {
    bucket_config::refuse_public_acl(state, b, acl.is_public()).await?;
    let doc = match plain(acl) {
        true => None,
        false => Some(serde_json::to_vec(acl).map_err(|e| S3Error::internal("bucket ACL", e))?),
    };
    state
        .store
        .put_bucket_config(b, packrat_store_api::BucketConfig::Acl, doc)
        .await?;
    if public_read(acl) != b.public_read {
        state.store.set_bucket_public(b, public_read(acl)).await?;
    }
    state.policies.forget(b.id);
    Ok(())
}

/// The bucket's stored ACL document (grants beyond `private` and `public-read`), if any.
pub(super) async fn stored_bucket_acl(state: &AppState, b: &Bucket) -> S3Result<Option<acl::Acl>> {
    let doc = state
        .store
        .get_bucket_config(b, packrat_store_api::BucketConfig::Acl)
        .await?;
    doc.map(|d| serde_json::from_slice(&d).map_err(|e| S3Error::internal("stored bucket ACL", e)))
        .transpose()
}

pub(super) async fn handle_create_bucket(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let id = need_identity(req)?.clone();
    if !valid_bucket_name(name) {
        return Err(err(
            S3ErrorCode::InvalidBucketName,
            "The specified bucket is not valid.",
        ));
    }
    let me = acl::Person {
        id: id.owner_id.clone(),
        name: id.name.clone(),
    };
    let asked = asked_bucket_acl(state, &req.headers, me, &[]).await?;
    let public = asked.as_ref().is_some_and(public_read);
    let ownership = match req.header("x-amz-object-ownership") {
        None => state.config.default_object_ownership,
        Some(v) => acl::Ownership::parse(v).ok_or_else(|| {
            err(
                S3ErrorCode::InvalidArgument,
                format!("Invalid x-amz-object-ownership header: {v}"),
            )
        })?,
    };
    let object_lock = match req.header("x-amz-bucket-object-lock-enabled") {
        None => false,
        Some(v) if v.eq_ignore_ascii_case("true") => true,
        Some(v) if v.eq_ignore_ascii_case("false") => false,
        Some(_) => {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "x-amz-bucket-object-lock-enabled must be true or false",
            ));
        }
    };
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
            created_ms: state.clock.now_ms(),
            public_read: public,
            object_lock,
        })
        .await;
    match result {
        Ok(b) => {
            if let Some(acl) = asked.filter(|a| !plain(a)) {
                set_bucket_acl(state, &b, &acl).await?;
            }
            if ownership.acls_enabled() {
                let doc = ownership.name().as_bytes().to_vec();
                (state.store)
                    .put_bucket_config(
                        &b,
                        packrat_store_api::BucketConfig::OwnershipControls,
                        Some(doc),
                    )
                    .await?;
            }
            Response::builder()
                .header("location", format!("/{name}"))
                .body(empty())
                .map_err(|e| S3Error::internal("response", e))
        }
        Err(StoreError::BucketExists) => {
            let existing = state.store.bucket(name)?;
            let me = need_identity(req)?;
            let mine = existing.is_some_and(|b| b.owner_id == me.owner_id);
            if mine && state.config.region == "us-east-1" {
                // S3's legacy answer in us-east-1: creating a bucket you own succeeds again
                // (and changes nothing); every other region answers 409.
                return Response::builder()
                    .header("location", format!("/{name}"))
                    .body(empty())
                    .map_err(|e| S3Error::internal("response", e));
            }
            if mine {
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

pub(super) async fn handle_head_bucket(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    load_bucket(state, req, name, Action::LIST_BUCKET).await?;
    Response::builder()
        .header("x-amz-bucket-region", state.config.region.as_str())
        .body(empty())
        .map_err(|e| S3Error::internal("response", e))
}

pub(super) async fn handle_delete_bucket(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Action::DELETE_BUCKET).await?;
    state.store.delete_bucket(&b).await?;
    state.policies.forget(b.id);
    state.bucket_encryption.forget(b.id);
    no_content()
}

pub(super) async fn handle_get_bucket_location(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
) -> R {
    load_bucket(state, req, name, Action::GET_BUCKET_LOCATION).await?;
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

/// PutBucketAcl: a canned ACL, grant headers or an AccessControlPolicy body. Grantees are the
/// server's users by canonical id (an unknown id is 400 InvalidArgument), the AllUsers and
/// AuthenticatedUsers groups; the bucket's owner stays its owner, with full control.
pub(super) async fn handle_put_bucket_acl(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_BUCKET_ACL).await?;
    let body = read_xml_body(req).await?;
    let owner = object_acl::bucket_owner(&b);
    let Some(acl) = asked_bucket_acl(state, &req.headers, owner, &body).await? else {
        return Err(err(
            S3ErrorCode::MalformedACLError,
            "PutBucketAcl needs an x-amz-acl header, x-amz-grant-* headers or an AccessControlPolicy body",
        ));
    };
    set_bucket_acl(state, &b, &acl).await?;
    Ok(Response::new(empty()))
}

pub(super) async fn handle_get_bucket_acl(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Action::GET_BUCKET_ACL).await?;
    match stored_bucket_acl(state, &b).await? {
        Some(acl) => xml_ok(acl.to_xml()),
        None => acl_answer(&b),
    }
}

/// GetObjectAcl (of the current object or a version by id): objects have no ACLs of their
/// own, so an object's is what holds for it, the bucket's (the owner's full control, and
/// anyone's READ on a public-read bucket), as S3 answers for a bucket with ACLs disabled.
/// The ACL answer of a bucket, and of an object in a bucket with ACLs disabled: the owner's
/// full control, and anonymous READ on a public-read bucket.
pub(super) fn acl_answer(b: &Bucket) -> R {
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

pub(super) async fn handle_put_lifecycle(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_LIFECYCLE).await?;
    let body = read_xml_body(req).await?;
    let is_tier = |class: &str| class != "STANDARD" && state.store.is_storage_class(class);
    let rules = crate::s3::lifecycle::parse(&body, &is_tier)?;
    state.store.put_lifecycle(&b, rules).await?;
    Ok(Response::new(empty()))
}

pub(super) async fn handle_get_lifecycle(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Action::GET_LIFECYCLE).await?;
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
        .body(full(crate::s3::lifecycle::to_xml(&rules)))
        .map_err(|e| S3Error::internal("response", e))
}

pub(super) async fn handle_delete_lifecycle(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_LIFECYCLE).await?;
    state.store.delete_lifecycle(&b).await?;
    Response::builder()
        .status(StatusCode::NO_CONTENT)
        .body(empty())
        .map_err(|e| S3Error::internal("response", e))
}

/// Bucket configurations packrat does not implement, read or deleted: what S3 answers for a
/// bucket that never had one, since none of packrat's buckets can. Tools that probe every
/// configuration (Terraform, backup tools) get S3's answers; setting one stays 501.
/// Each entry: sub-resource, and either the 404 code or the empty document of a GET.
const NOT_CONFIGURED: &[(&str, Result<&str, &str>)] = &[
    ("website", Err("NoSuchWebsiteConfiguration")),
    ("replication", Err("ReplicationConfigurationNotFoundError")),
    ("logging", Ok("BucketLoggingStatus")),
    ("notification", Ok("NotificationConfiguration")),
    ("accelerate", Ok("AccelerateConfiguration")),
    ("requestPayment", Ok("RequestPaymentConfiguration")),
];

/// The sub-resource of a GET or DELETE of a bucket configuration no packrat bucket has.
pub(super) fn not_configured_subresource(req: &S3Request) -> Option<&'static str> {
    if req.key.is_some() || !matches!(req.method, Method::GET | Method::DELETE) {
        return None;
    }
    NOT_CONFIGURED
        .iter()
        .map(|(sub, _)| *sub)
        .find(|sub| req.has_q(sub))
}

/// GET: the 404 S3 gives for a configuration that was never set, or its empty document;
/// DELETE: 204, there being nothing to delete. The owner's only, as S3 has it.
pub(super) async fn handle_not_configured(
    state: &Arc<AppState>,
    req: &S3Request,
    name: &str,
    sub: &str,
) -> R {
    load_bucket(state, req, name, Action::GET_BUCKET_CONFIGURATION).await?;
    let answer = NOT_CONFIGURED
        .iter()
        .find(|(s, _)| *s == sub)
        .map(|(_, a)| *a)
        .ok_or_else(|| S3Error::internal("sub-resource", sub))?;
    if req.method == Method::DELETE {
        return no_content();
    }
    match answer {
        Err(code) => Err(err(
            S3ErrorCode::NotConfigured(code),
            format!("The bucket has no {sub} configuration"),
        )),
        Ok(root) => {
            let mut x = Xml::new();
            x.root(root);
            if sub == "requestPayment" {
                x.elem("Payer", "BucketOwner");
            }
            x.close(root);
            xml_ok(x)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
