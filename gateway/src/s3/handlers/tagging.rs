//! Object tagging: get (of the current object or a version by id), put and delete an object's
//! tag set.

use super::*;

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
    let mut resp = xml_ok(crate::s3::tagging::to_xml(&obj.attrs.tags))?;
    if let Some(v) = obj.version_id.as_deref().and_then(|v| v.parse().ok()) {
        resp.headers_mut().insert("x-amz-version-id", v);
    }
    Ok(resp)
}

pub(super) async fn handle_put_object_tagging(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Action::PUT_OBJECT_TAGGING).await?;
    let body = read_xml_body(req).await?;
    let tags = crate::s3::tagging::parse_xml(&body)?;
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

pub(super) async fn handle_delete_object_tagging(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Action::DELETE_OBJECT_TAGGING).await?;
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
