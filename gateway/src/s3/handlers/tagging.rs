//! Object tagging: get, put and delete the tag set of a key's current object or of a version
//! named by id.

use super::*;

/// A write that gives its new object tags (`x-amz-tagging` on PutObject or
/// CreateMultipartUpload, a form upload's `tagging` field, CopyObject's `REPLACE` tagging
/// directive) also needs `s3:PutObjectTagging`, as in S3: a policy that allows PutObject but
/// not tagging lets no tags in through the write.
pub(super) async fn may_tag_on_write(
    state: &AppState,
    caller: &lock::Caller<'_>,
    b: &Bucket,
    key: &str,
    tags: &crate::s3::tagging::Tags,
) -> S3Result<()> {
    if tags.is_empty()
        || caller
            .may(state, b, Action::PUT_OBJECT_TAGGING, key)
            .await?
    {
        return Ok(());
    }
    Err(access_denied())
}

pub(super) async fn handle_get_object_tagging(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let version = versions::version_id(req)?;
    let action = match version {
        Some(_) => Action::GET_OBJECT_VERSION_TAGGING,
        None => Action::GET_OBJECT_TAGGING,
    };
    let b = load_bucket(state, req, bname, action).await?;
    let obj = versions::read_target(state, &b, key, version).await?;
    versions::with_version_id(
        xml_ok(crate::s3::tagging::to_xml(&obj.attrs.tags))?,
        obj.version_id,
    )
}

pub(super) async fn handle_put_object_tagging(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
) -> R {
    let version = versions::version_id(req)?.map(str::to_string);
    let action = match version {
        Some(_) => Action::PUT_OBJECT_VERSION_TAGGING,
        None => Action::PUT_OBJECT_TAGGING,
    };
    // The body first: a policy may judge the tags it sets (`s3:RequestObjectTag/KEY`).
    let body = read_xml_body(req).await?;
    let tags = crate::s3::tagging::parse_xml(&body)?;
    let facts = Facts {
        tags: Some(&tags),
        ..Facts::of(req)
    };
    let b = bucket_for(
        state,
        &facts,
        req.identity.as_ref(),
        bname,
        action,
        Some(key),
    )
    .await?;
    let id = set_tags(state, &b, key, version.as_deref(), tags).await?;
    versions::with_version_id(Response::new(empty()), id)
}

pub(super) async fn handle_delete_object_tagging(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let version = versions::version_id(req)?;
    let action = match version {
        Some(_) => Action::DELETE_OBJECT_VERSION_TAGGING,
        None => Action::DELETE_OBJECT_TAGGING,
    };
    let b = load_bucket(state, req, bname, action).await?;
    let id = set_tags(state, &b, key, version, Vec::new()).await?;
    versions::with_version_id(no_content()?, id)
}

/// Gives the key's current object, or the version `version` names, the tag set `tags`;
/// answers the version's id to show (none for an object of a bucket that never had
/// versioning).
async fn set_tags(
    state: &AppState,
    b: &Bucket,
    key: &str,
    version: Option<&str>,
    tags: Vec<(String, String)>,
) -> S3Result<Option<String>> {
    let Some(v) = version else {
        let edited = state
            .store
            .update_object(
                b,
                key,
                &WriteCondition::default(),
                Box::new(move |cur| cur.tags = tags),
            )
            .await?;
        return Ok(edited.version_id);
    };
    // S3's answers for a version that is a delete marker (405) or not there.
    let target = versions::read_version(state, b, key, v).await?;
    let id = target.version_id.as_deref().unwrap_or("null");
    if !state.store.set_version_tags(b, key, id, tags).await? {
        // Removed since it was read.
        return Err(versions::no_such_version());
    }
    Ok(target.version_id)
}
