//! Listings: ListObjects (v1 and v2 pages, common prefixes) and ListMultipartUploads.

use super::*;

pub(super) async fn handle_list_objects(state: &Arc<AppState>, req: &S3Request, name: &str) -> R {
    let b = load_bucket(state, req, name, Action::LIST_BUCKET).await?;
    let v2 = req.q("list-type") == Some("2");
    let prefix = req.q("prefix").unwrap_or("");
    let delimiter = req.q("delimiter").filter(|d| !d.is_empty());
    let max_keys = parse_max(req, "max-keys")?;
    let url = url_encoding(req)?;
    let enc = |s: &str| listed_name(url, s);
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

pub(super) async fn handle_list_multipart_uploads(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
) -> R {
    let b = load_bucket(state, req, bname, Action::LIST_BUCKET_MULTIPART_UPLOADS).await?;
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
