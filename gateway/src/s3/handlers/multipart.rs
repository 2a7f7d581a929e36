//! Multipart uploads: create, upload part (and part copy), complete, abort, list parts.

use super::*;
use packrat_store_api::{ByteSource, sealed};

/// The upload named by `uploadId` (a malformed id is no upload at all).
async fn load_upload(state: &AppState, req: &S3Request, b: &Bucket, key: &str) -> S3Result<Upload> {
    let id = req.q("uploadId").unwrap_or("");
    if id.len() != 32 || !id.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(no_such_upload());
    }
    state
        .store
        .upload(b, key, id)
        .await?
        .ok_or_else(no_such_upload)
}

pub(super) async fn handle_create_multipart_upload(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Action::PUT_OBJECT).await?;
    let id = need_identity(req)?;
    let encryption = sse::for_write(state, req, &b).await?;
    let meta = object_meta(&req.headers, &|c| state.store.is_storage_class(c))?;
    let alg = req
        .header("x-amz-checksum-algorithm")
        .map(ChecksumAlgorithm::parse)
        .transpose()?;
    let kind = match (req.header("x-amz-checksum-type"), alg) {
        (_, None) => None,
        (Some("FULL_OBJECT"), Some(a)) if a.is_crc() => Some("FULL_OBJECT"),
        (Some("FULL_OBJECT"), Some(_)) => {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "The FULL_OBJECT checksum type needs a CRC algorithm",
            ));
        }
        (Some("COMPOSITE"), Some(ChecksumAlgorithm::Crc64Nvme)) => {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "CRC64NVME supports only the FULL_OBJECT checksum type",
            ));
        }
        (Some("COMPOSITE"), Some(_)) => Some("COMPOSITE"),
        (None, Some(ChecksumAlgorithm::Crc64Nvme)) => Some("FULL_OBJECT"),
        (None, Some(_)) => Some("COMPOSITE"),
        (Some(_), Some(_)) => {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                "Unknown x-amz-checksum-type",
            ));
        }
    };
    let mut attrs = meta.into_attrs(0);
    // The object's lock (asked, or the bucket's default, counted from now) goes with the
    // upload's other attributes to the object that completes it.
    let caller = lock::Caller::of(req);
    tagging::may_tag_on_write(state, &caller, &b, key, &attrs.tags).await?;
    lock::lock_new_version(state, &caller, &req.headers, &b, key, &mut attrs.headers).await?;
    object_acl::acl_for_write(state, caller.identity, &b, &req.headers, &mut attrs.headers).await?;
    // An encrypted upload's parts are sealed here, part by part, under keys derived from the
    // object's (its envelope goes with the upload's attributes to the object). The store sees
    // only ciphertext, so it keeps no checksum of it: each part's checksum is checked on its
    // plaintext as it is sealed.
    let mut answer = Vec::new();
    if let Some(how) = &encryption {
        let (_, env) = sse::ObjectCipher::create_by_part(&*state.store, how)?;
        answer = sse::envelope_headers(&env);
        sse::set_envelope(&mut attrs.headers, Some(env));
    }
    let stored_checksum = encryption.is_none();
    let new = NewUpload {
        owner_id: id.owner_id.clone(),
        initiated_ms: state.clock.now_ms(),
        attrs,
        checksum: alg.filter(|_| stored_checksum),
        checksum_type: kind.filter(|_| stored_checksum).map(str::to_string),
        upload_id: None,
    };
    let upload_id = state.store.create_upload(&b, key, new).await?.upload_id;
    let mut x = Xml::new();
    x.root("InitiateMultipartUploadResult");
    x.elem("Bucket", bname);
    x.elem("Key", key);
    x.elem("UploadId", &upload_id);
    x.close("InitiateMultipartUploadResult");
    let mut rb = Response::builder().header("content-type", "application/xml");
    if let (Some(a), Some(k)) = (alg, kind) {
        rb = rb
            .header("x-amz-checksum-algorithm", a.name())
            .header("x-amz-checksum-type", k);
    }
    for (h, v) in answer {
        rb = rb.header(h, v);
    }
    rb.body(full(x.finish()))
        .map_err(|e| S3Error::internal("response", e))
}

pub(super) async fn handle_upload_part(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
    copy: bool,
) -> R {
    let b = load_bucket(state, req, bname, Action::PUT_OBJECT).await?;
    let part_number = req
        .q("partNumber")
        .and_then(|p| p.parse::<u32>().ok())
        .filter(|n| (1..=config::PARTS_MAX).contains(n))
        .ok_or_else(|| {
            err(
                S3ErrorCode::InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive",
            )
        })?;
    let upload = load_upload(state, req, &b, key).await?;
    let upload_alg = upload.checksum;
    // The upload's cipher (SSE-C: the key must be sent with every part, as S3 asks).
    let cipher = sse::ObjectCipher::open_envelope(
        &*state.store,
        upload.envelope.as_deref(),
        sse::read_key(req)?.as_ref(),
        req.identity.as_ref(),
    )?;
    let answer = upload
        .envelope
        .as_deref()
        .map(sse::envelope_headers)
        .unwrap_or_default();
    // The checksum of a sealed part's plaintext (the store keeps none of it).
    let mut plain_checksum = None;
    // The source's version, named in an UploadPartCopy's answer as CopyObject names it.
    let mut source_version = None;
    let part = if copy {
        let (_, _, src) = objects::load_copy_source(state, req).await?;
        source_version = src.version_id.clone();
        let src_cipher = sse::open_copy_source(&*state.store, req, &src)?;
        let src_size = sse::shown_size(&src);
        let (start, end) = match req.header("x-amz-copy-source-range") {
            None => (0, src_size),
            Some(r) => copy_source_range(r, src_size)?,
        };
        let id = &upload.upload_id;
        match (&cipher, src_cipher) {
            (None, None) => {
                state
                    .store
                    .upload_part_copy(&b, key, id, part_number, &src, start..end)
                    .await?
            }
            // Either side encrypted: the source's plaintext, sealed again if the upload is.
            (upload_cipher, src_cipher) => {
                let mut plain =
                    sse::PlainSource::range(&*state.store, &src, src_cipher, start, end)?;
                let mut sealing;
                let body: &mut dyn ByteSource = match upload_cipher {
                    Some(c) => {
                        sealing = sse::Sealing::part(&mut plain, c, Default::default());
                        &mut sealing
                    }
                    None => &mut plain,
                };
                let put = PutPart::default();
                state
                    .store
                    .upload_part(&b, key, id, part_number, body, put)
                    .await?
            }
        }
    } else {
        headers::body_length_given(&req.headers)?;
        let (alg, sent) = requested_checksum(&req.headers)?;
        if let (Some(a), Some(u)) = (alg, upload_alg)
            && a != u
        {
            return Err(err(
                S3ErrorCode::InvalidRequest,
                format!(
                    "Checksum Type mismatch occurred, expected checksum Type: {}, actual checksum Type: {}",
                    u.name(),
                    a.name()
                ),
            ));
        }
        let md5 = content_md5(&req.headers)?;
        let id = &upload.upload_id;
        match &cipher {
            Some(c) => {
                let checks = sse::PlainChecks {
                    content_md5: md5,
                    checksum: alg,
                    expected_checksum: sent,
                };
                let mut body = sse::Sealing::part(&mut req.body, c, checks);
                let put = PutPart::default();
                let part = state
                    .store
                    .upload_part(&b, key, id, part_number, &mut body, put)
                    .await?;
                plain_checksum = alg.zip(body.computed_checksum.take());
                part
            }
            None => {
                let put = PutPart {
                    checksum: alg,
                    expected_checksum: sent,
                    content_md5: md5,
                };
                state
                    .store
                    .upload_part(&b, key, id, part_number, &mut req.body, put)
                    .await?
            }
        }
    };
    if copy {
        let mut x = Xml::new();
        x.root("CopyPartResult");
        x.elem("LastModified", &iso8601(part.last_modified_ms));
        x.elem("ETag", &quoted(&part.etag));
        x.close("CopyPartResult");
        let mut answer = answer;
        if let Some(v) = source_version {
            answer.push(("x-amz-copy-source-version-id", v));
        }
        return with_headers(xml_ok(x), answer);
    }
    let mut rb = Response::builder().header("etag", quoted(&part.etag));
    if let Some((a, raw)) = plain_checksum {
        rb = rb.header(
            a.header(),
            base64::engine::general_purpose::STANDARD.encode(raw),
        );
    } else if let Some(c) = &part.checksum
        && let Ok(a) = ChecksumAlgorithm::parse(&c.algorithm)
    {
        rb = rb.header(a.header(), c.value.as_str());
    }
    for (h, v) in answer {
        rb = rb.header(h, v);
    }
    rb.body(empty())
        .map_err(|e| S3Error::internal("response", e))
}

pub(super) async fn handle_complete_multipart_upload(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Action::PUT_OBJECT).await?;
    let body = req.body.read_to_end(config::XML_BODY_BYTES_MAX).await?;
    let cond = write_condition(&req.headers)?;
    let upload = match load_upload(state, req, &b, key).await {
        Err(e) if e.code == S3ErrorCode::NoSuchUpload => {
            let obj = completed_before(state, req, &b, key, &body)
                .await?
                .ok_or(e)?;
            return completed(bname, key, &obj);
        }
        r => r?,
    };
    // An SSE-C key is not needed to complete (nothing is sealed now), but one sent must be
    // the upload's.
    if let Some(k) = sse::read_key(req)? {
        sse::ObjectCipher::open_envelope(
            &*state.store,
            upload.envelope.as_deref(),
            Some(&k),
            req.identity.as_ref(),
        )?;
    }
    let parts = complete_parts(&body)?;
    let done = state
        .store
        .complete_upload(
            &b,
            key,
            &upload.upload_id,
            parts,
            &cond,
            &Default::default(),
        )
        .await;
    let obj = match done {
        // Completed meanwhile by a request like this one.
        Err(StoreError::NoSuchUpload) => completed_before(state, req, &b, key, &body)
            .await?
            .ok_or_else(no_such_upload)?,
        r => r?,
    };
    completed(bname, key, &obj)
}

/// The parts a CompleteMultipartUpload body names.
fn complete_parts(body: &[u8]) -> S3Result<Vec<CompletePart>> {
    let doc: xml::CompleteMultipartUpload = xml::parse(body)?;
    if doc.parts.is_empty() {
        return Err(err(
            S3ErrorCode::MalformedXML,
            "You must specify at least one part",
        ));
    }
    let parts = doc
        .parts
        .into_iter()
        .map(|p| {
            let sent = [
                (ChecksumAlgorithm::Crc32, p.crc32),
                (ChecksumAlgorithm::Crc32c, p.crc32c),
                (ChecksumAlgorithm::Crc64Nvme, p.crc64nvme),
                (ChecksumAlgorithm::Sha1, p.sha1),
                (ChecksumAlgorithm::Sha256, p.sha256),
            ];
            CompletePart {
                part_number: p.part_number,
                etag: p.etag,
                checksums: sent
                    .into_iter()
                    .filter_map(|(a, v)| v.map(|v| (a, v)))
                    .collect(),
            }
        })
        .collect();
    Ok(parts)
}

/// A CompleteMultipartUpload of an upload that is gone: S3 answers again with the object when
/// the key still holds what completing that upload with the same parts made (a client that
/// retries after a lost answer, or two that complete at once). `None` otherwise.
async fn completed_before(
    state: &AppState,
    req: &S3Request,
    b: &Bucket,
    key: &str,
    body: &[u8],
) -> S3Result<Option<ObjectInfo>> {
    let Some(id) = req.q("uploadId") else {
        return Ok(None);
    };
    let Ok(parts) = complete_parts(body) else {
        return Ok(None);
    };
    let Some(obj) = state.store.head_object(b, key).await? else {
        return Ok(None);
    };
    let etags = parts.iter().map(|p| p.etag.as_str());
    if !packrat_store_api::completed_from(&obj, id, etags) {
        return Ok(None);
    }
    Ok(Some(obj))
}

/// CompleteMultipartUpload's answer for the object it made.
fn completed(bname: &str, key: &str, obj: &ObjectInfo) -> R {
    let mut x = Xml::new();
    x.root("CompleteMultipartUploadResult");
    x.elem(
        "Location",
        &format!("/{bname}/{}", uri_encode(key.as_bytes(), true)),
    );
    x.elem("Bucket", bname);
    x.elem("Key", key);
    x.elem("ETag", &quoted(&obj.etag));
    if let Some(c) = &obj.checksum
        && let Ok(a) = ChecksumAlgorithm::parse(&c.algorithm)
    {
        x.elem(a.xml_name(), &c.value);
        x.elem("ChecksumType", &c.kind);
    }
    x.close("CompleteMultipartUploadResult");
    let mut answer: Vec<(&'static str, String)> = obj
        .version_id
        .iter()
        .map(|v| ("x-amz-version-id", v.clone()))
        .collect();
    answer.extend(sse::stored_headers(obj));
    with_headers(xml_ok(x), answer)
}

pub(super) async fn handle_abort_multipart_upload(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Action::ABORT_MULTIPART_UPLOAD).await?;
    let upload = load_upload(state, req, &b, key).await?;
    state.store.abort_upload(&b, key, &upload.upload_id).await?;
    no_content()
}

pub(super) async fn handle_list_parts(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Action::LIST_MULTIPART_UPLOAD_PARTS).await?;
    let upload = load_upload(state, req, &b, key).await?;
    let max = parse_max(req, "max-parts")?;
    let marker: u32 = match req.q("part-number-marker") {
        None => 0,
        Some(m) => m.parse().map_err(|_| {
            err(
                S3ErrorCode::InvalidArgument,
                "part-number-marker must be an integer",
            )
        })?,
    };
    let (parts, truncated) = state.store.list_parts(&upload, &b, marker, max).await?;
    let mut x = Xml::new();
    x.root("ListPartsResult");
    x.elem("Bucket", bname);
    x.elem("Key", key);
    x.elem("UploadId", &upload.upload_id);
    owner_xml(&mut x, "Initiator", &b);
    owner_xml(&mut x, "Owner", &b);
    x.elem(
        "StorageClass",
        upload.storage_class.as_deref().unwrap_or("STANDARD"),
    );
    x.elem("PartNumberMarker", &marker.to_string());
    if let Some(last) = parts.last() {
        x.elem("NextPartNumberMarker", &last.part_number.to_string());
    }
    x.elem("MaxParts", &max.to_string());
    x.elem("IsTruncated", if truncated { "true" } else { "false" });
    if let Some(a) = upload.checksum {
        x.elem("ChecksumAlgorithm", a.name());
    }
    if let Some(t) = &upload.checksum_type {
        x.elem("ChecksumType", t);
    }
    for p in &parts {
        x.open("Part");
        x.elem("PartNumber", &p.part_number.to_string());
        x.elem("LastModified", &iso8601(p.last_modified_ms));
        x.elem("ETag", &quoted(&p.etag));
        // An encrypted part shows its plaintext's size.
        let size = match upload.envelope {
            Some(_) => sealed::plain_part_len(p.size).unwrap_or(p.size),
            None => p.size,
        };
        x.elem("Size", &size.to_string());
        if let Some(c) = &p.checksum
            && let Ok(a) = ChecksumAlgorithm::parse(&c.algorithm)
        {
            x.elem(a.xml_name(), &c.value);
        }
        x.close("Part");
    }
    x.close("ListPartsResult");
    xml_ok(x)
}

/// The bytes `[start, end)` an UploadPartCopy's `x-amz-copy-source-range` names: exactly
/// `bytes=first-last`, both offsets zero-based and inclusive (else 400 InvalidArgument), inside
/// the source (else 416 InvalidRange). Unlike a GET's range, it is never cut to the object.
fn copy_source_range(value: &str, size: u64) -> S3Result<(u64, u64)> {
    let digits = |s: &str| -> Option<u64> {
        (!s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
            .then(|| s.parse().ok())
            .flatten()
    };
    let parsed = value
        .strip_prefix("bytes=")
        .and_then(|r| r.split_once('-'))
        .and_then(|(a, b)| Some((digits(a)?, digits(b)?)))
        .filter(|(first, last)| first <= last);
    let Some((first, last)) = parsed else {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "The x-amz-copy-source-range value must be of the form bytes=first-last where first and last are the zero-based offsets of the first and last bytes to copy",
        ));
    };
    if last >= size {
        return Err(err(
            S3ErrorCode::InvalidRange,
            format!("Range specified is not valid for source object of size: {size}"),
        ));
    }
    Ok((first, last + 1))
}
