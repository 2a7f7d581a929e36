//! Versioning: GetBucketVersioning, PutBucketVersioning, ListObjectVersions, and how GET,
//! HEAD, copies and deletes name a version (`versionId`).

use super::*;
use packrat_store_api::lock::LockCheck;
use packrat_store_api::{FoundVersion, VersionQuery, Versioning};

pub(super) async fn handle_get_versioning(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Action::GET_BUCKET_VERSIONING).await?;
    let mut x = Xml::new();
    x.root("VersioningConfiguration");
    // A bucket that never had versioning answers an empty document, as S3 does.
    match b.versioning {
        Versioning::Unversioned => {}
        Versioning::Enabled => x.elem("Status", "Enabled"),
        Versioning::Suspended => x.elem("Status", "Suspended"),
    }
    x.close("VersioningConfiguration");
    xml_ok(x)
}

pub(super) async fn handle_put_versioning(
    state: &Arc<AppState>,
    req: &mut S3Request,
    name: &str,
) -> R {
    let b = load_bucket(state, req, name, Action::PUT_BUCKET_VERSIONING).await?;
    let body = read_xml_body(req).await?;
    let c: xml::VersioningConfiguration = xml::parse(&body)?;
    if c.mfa_delete.as_deref() == Some("Enabled") {
        return Err(err(
            S3ErrorCode::NotImplemented,
            "packrat does not implement MFA delete",
        ));
    }
    let state_asked = match c.status.as_deref() {
        Some("Enabled") => Versioning::Enabled,
        Some("Suspended") => Versioning::Suspended,
        // No status changes nothing (S3 accepts it, for an MfaDelete-only document).
        None => return Ok(Response::new(empty())),
        Some(_) => {
            return Err(err(
                S3ErrorCode::MalformedXML,
                "The versioning Status must be Enabled or Suspended",
            ));
        }
    };
    state.store.set_versioning(&b, state_asked).await?;
    Ok(Response::new(empty()))
}

/// The `versionId` a request names, if any (an empty one is malformed).
pub(super) fn version_id(req: &S3Request) -> S3Result<Option<&str>> {
    match req.q("versionId") {
        Some("") => Err(invalid_version()),
        v => Ok(v),
    }
}

fn invalid_version() -> S3Error {
    err(S3ErrorCode::InvalidArgument, "Invalid version id specified")
}

/// A store's refusal of a version id it never makes, as S3 words it.
fn version_error(e: StoreError) -> S3Error {
    match e {
        StoreError::Invalid(_) => invalid_version(),
        e => e.into(),
    }
}

/// The object a GET, HEAD or copy reads: the key's current one, or the version named.
pub(super) async fn read_target(
    state: &AppState,
    b: &Bucket,
    key: &str,
    version: Option<&str>,
) -> S3Result<ObjectInfo> {
    match version {
        None => match state.store.head_object(b, key).await? {
            Some(o) => Ok(o),
            None => Err(missing(state, b, key).await),
        },
        Some(v) => read_version(state, b, key, v).await,
    }
}

/// The 404 for a key with no current object: with `x-amz-delete-marker` and the marker's id
/// when its latest version is a delete marker, as in S3.
pub(super) async fn missing(state: &AppState, b: &Bucket, key: &str) -> S3Error {
    if b.versioning == Versioning::Unversioned {
        return no_such_key();
    }
    match state.store.find_version(b, key, None).await {
        Ok(Some(FoundVersion::DeleteMarker { version_id, .. })) => no_such_key()
            .with_header("x-amz-delete-marker", "true".into())
            .with_header("x-amz-version-id", version_id),
        Ok(_) => no_such_key(),
        Err(e) => e.into(),
    }
}

/// The version a `versionId` names; one that is a delete marker is 405, as in S3.
pub(super) async fn read_version(
    state: &AppState,
    b: &Bucket,
    key: &str,
    v: &str,
) -> S3Result<ObjectInfo> {
    match state
        .store
        .find_version(b, key, Some(v))
        .await
        .map_err(version_error)?
    {
        Some(FoundVersion::Object(o)) => Ok(*o),
        Some(FoundVersion::DeleteMarker { version_id, .. }) => Err(method_not_allowed()
            .with_header("x-amz-delete-marker", "true".into())
            .with_header("x-amz-version-id", version_id)
            .with_header("allow", "DELETE".into())),
        None => Err(no_such_version()),
    }
}

/// An answer about one version of an object: `x-amz-version-id` names it (none for an object
/// of a bucket that never had versioning).
pub(super) fn with_version_id(mut resp: Response<RespBody>, id: Option<String>) -> R {
    if let Some(v) = id.and_then(|v| v.parse().ok()) {
        resp.headers_mut().insert("x-amz-version-id", v);
    }
    Ok(resp)
}

pub(super) fn no_such_version() -> S3Error {
    err(
        S3ErrorCode::NoSuchVersion,
        "The specified version does not exist.",
    )
}

/// DeleteObject with a `versionId`: that version goes for good.
pub(super) async fn delete_version(
    state: &AppState,
    b: &Bucket,
    key: &str,
    version: &str,
    bypass_governance: bool,
) -> S3Result<packrat_store_api::Deleted> {
    state
        .store
        .delete_version(b, key, version, LockCheck::rules(bypass_governance))
        .await
        .map_err(version_error)
}

/// The headers of a DeleteObject's answer.
pub(super) fn deleted_headers(d: &packrat_store_api::Deleted) -> Vec<(&'static str, String)> {
    let mut h = Vec::new();
    if let Some(v) = &d.version_id {
        h.push(("x-amz-version-id", v.clone()));
    }
    if d.delete_marker {
        h.push(("x-amz-delete-marker", "true".to_string()));
    }
    h
}

pub(super) async fn handle_list_versions(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Action::LIST_BUCKET_VERSIONS).await?;
    let prefix = req.q("prefix").unwrap_or("");
    let delimiter = req.q("delimiter").filter(|d| !d.is_empty());
    let max_keys = parse_max(req, "max-keys")?;
    let url = url_encoding(req)?;
    let enc = |s: &str| listed_name(url, s);
    let key_marker = req.q("key-marker").filter(|k| !k.is_empty());
    let version_marker = req.q("version-id-marker").filter(|v| !v.is_empty());
    if version_marker.is_some() && key_marker.is_none() {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "A version-id marker cannot be specified without a key marker.",
        ));
    }
    let page = if max_keys == 0 {
        Default::default()
    } else {
        let query = VersionQuery {
            prefix: prefix.to_string(),
            delimiter: delimiter.map(str::to_string),
            key_marker: key_marker.map(str::to_string),
            version_id_marker: version_marker.map(str::to_string),
            max_keys,
        };
        state
            .store
            .list_versions(&b, &query)
            .await
            .map_err(version_error)?
    };
    let mut x = Xml::new();
    x.root("ListVersionsResult");
    x.elem("Name", name);
    x.elem("Prefix", &enc(prefix));
    x.elem("KeyMarker", &enc(key_marker.unwrap_or("")));
    x.elem("VersionIdMarker", version_marker.unwrap_or(""));
    if let Some(d) = delimiter {
        x.elem("Delimiter", &enc(d));
    }
    x.elem("MaxKeys", &max_keys.to_string());
    if url {
        x.elem("EncodingType", "url");
    }
    x.elem("IsTruncated", if page.truncated { "true" } else { "false" });
    if page.truncated {
        if let Some(k) = &page.next_key_marker {
            x.elem("NextKeyMarker", &enc(k));
        }
        if let Some(v) = &page.next_version_id_marker {
            x.elem("NextVersionIdMarker", v);
        }
    }
    for v in &page.versions {
        let o = &v.object;
        x.open(if v.delete_marker {
            "DeleteMarker"
        } else {
            "Version"
        });
        x.elem("Key", &enc(&o.key));
        x.elem("VersionId", &v.version_id);
        x.elem("IsLatest", if v.is_latest { "true" } else { "false" });
        x.elem("LastModified", &iso8601(o.last_modified_ms));
        if !v.delete_marker {
            x.elem("ETag", &quoted(&o.etag));
            if let Some((algorithm, kind)) = &o.checksum {
                x.elem("ChecksumAlgorithm", algorithm);
                x.elem("ChecksumType", kind);
            }
            x.elem("Size", &o.size.to_string());
            x.elem(
                "StorageClass",
                o.storage_class.as_deref().unwrap_or("STANDARD"),
            );
        }
        owner_xml(&mut x, "Owner", &b);
        x.close(if v.delete_marker {
            "DeleteMarker"
        } else {
            "Version"
        });
    }
    for cp in &page.common_prefixes {
        x.open("CommonPrefixes");
        x.elem("Prefix", &enc(cp));
        x.close("CommonPrefixes");
    }
    x.close("ListVersionsResult");
    xml_ok(x)
}
