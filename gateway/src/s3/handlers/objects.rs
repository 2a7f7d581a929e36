//! Objects: put, copy, get (whole, ranged and multi-range), head and delete.

use super::*;

fn checksum_headers(
    mut b: http::response::Builder,
    c: &Option<ObjectChecksum>,
) -> http::response::Builder {
    if let Some(c) = c
        && let Ok(alg) = ChecksumAlgorithm::parse(&c.algorithm)
    {
        b = b.header(alg.header(), c.value.as_str());
        b = b.header("x-amz-checksum-type", c.kind.as_str());
    }
    b
}

pub(super) async fn handle_put_object(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Action::PUT_OBJECT).await?;
    let encryption = sse::for_write(state, req, &b).await?;
    if req.headers.has(headers::Kind::UserMeta)
        && req
            .header("x-amz-meta-snowball-auto-extract")
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
    {
        if encryption.is_some() {
            return Err(err(
                S3ErrorCode::NotImplemented,
                "packrat does not encrypt the members of an extracted TAR (snowball-auto-extract with server-side encryption, asked for or the bucket's default)",
            ));
        }
        // The members of an extracted TAR carry no ACLs of their own.
        headers::refuse_object_acl(&req.headers)?;
        return super::batch::handle_snowball_put(state, req, &b, key).await;
    }
    headers::body_length_given(&req.headers)?;
    let meta = object_meta(&req.headers, &|c| state.store.is_storage_class(c))?;
    let (alg, sent) = requested_checksum(&req.headers)?;
    let md5 = content_md5(&req.headers)?;
    let cond = write_condition(&req.headers)?;
    let mut attrs = meta.into_attrs(state.clock.now_ms());
    let caller = lock::Caller::of(req);
    tagging::may_tag_on_write(state, &caller, &b, key, &attrs.tags).await?;
    if b.object_lock.is_some() || headers::asks_object_lock(&req.headers) {
        lock::lock_new_version(state, &caller, &req.headers, &b, key, &mut attrs.headers).await?;
    }
    object_acl::acl_for_write(state, caller.identity, &b, &req.headers, &mut attrs.headers).await?;
    let put = PutObject {
        attrs,
        checksum: alg,
        expected_checksum: sent,
        content_md5: md5,
        condition: cond,
        on_staged: None,
        version_as: None,
    };
    if let Some(how) = encryption {
        let sealed = sse::put_sealed(&*state.store, &b, key, &mut req.body, &how, put).await?;
        let mut rb = version_header(
            Response::builder().header("etag", quoted(&sealed.stored.etag)),
            &sealed.stored,
        );
        for (h, v) in sealed.headers {
            rb = rb.header(h, v);
        }
        if let (Some(alg), Some(c)) = (alg, sealed.checksum.as_ref()) {
            rb = rb.header(
                alg.header(),
                base64::engine::general_purpose::STANDARD.encode(c),
            );
        }
        return rb
            .body(empty())
            .map_err(|e| S3Error::internal("response", e));
    }
    let stored = state.store.put_object(&b, key, &mut req.body, put).await?;
    checksum_headers(
        version_header(
            Response::builder().header("etag", quoted(&stored.etag)),
            &stored,
        ),
        &stored.checksum,
    )
    .body(empty())
    .map_err(|e| S3Error::internal("response", e))
}

/// `x-amz-version-id` for an object of a bucket that has (had) versioning.
pub(super) fn version_header(
    rb: http::response::Builder,
    obj: &ObjectInfo,
) -> http::response::Builder {
    match &obj.version_id {
        Some(v) => rb.header("x-amz-version-id", v.as_str()),
        None => rb,
    }
}

/// Loads the copy source (its current version, or the one `?versionId=` names) and checks
/// the `x-amz-copy-source-if-*` conditions.
pub(super) async fn load_copy_source(
    state: &AppState,
    req: &S3Request,
) -> S3Result<(String, String, ObjectInfo)> {
    let (sb, sk, version) = headers::copy_source(req.header("x-amz-copy-source").unwrap_or(""))?;
    let (sbucket, gate) = bucket_gated(
        state,
        &Facts::of(req),
        req.identity.as_ref(),
        &sb,
        if version.is_some() {
            Action::GET_OBJECT_VERSION
        } else {
            Action::GET_OBJECT
        },
        Some(&sk),
    )
    .await?;
    let src = versions::read_target(state, &sbucket, &sk, version.as_deref())
        .await
        .map_err(|e| gate.hide(e))?;
    gate.check(req.identity.as_ref(), &src)?;
    if !headers::copy_source_conditions_hold(
        &req.headers,
        &src.etag,
        src.attrs.last_modified_ms / 1000,
    ) {
        return Err(err(
            S3ErrorCode::PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold",
        ));
    }
    Ok((sb, sk, src))
}

pub(super) async fn handle_copy_object(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
    key: &str,
) -> R {
    let b = load_bucket(state, req, bname, Action::PUT_OBJECT).await?;
    let (sb, sk, src) = load_copy_source(state, req).await?;
    let src_cipher = sse::open_copy_source(&*state.store, req, &src)?;
    let encryption = sse::requested(req)?;
    let replace = match req.header("x-amz-metadata-directive") {
        None | Some("COPY") => false,
        Some("REPLACE") => true,
        Some(_) => {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "Unknown metadata directive.",
            ));
        }
    };
    let replace_tags = match req.header("x-amz-tagging-directive") {
        None | Some("COPY") => false,
        Some("REPLACE") => true,
        Some(_) => {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "Unknown tagging directive.",
            ));
        }
    };
    if sb == bname
        && sk == key
        && !replace
        && !replace_tags
        && !req.headers.contains_key("x-amz-storage-class")
        && encryption.is_none()
    {
        return Err(err(
            S3ErrorCode::InvalidRequest,
            "This copy request is illegal because it is trying to copy an object to itself without changing the object's metadata, storage class, website redirect location or encryption attributes.",
        ));
    }
    // A copy that asks for no encryption gets the bucket's default, as any write.
    let encryption = sse::or_default(state, &b, req.identity.as_ref(), encryption).await?;
    let sent = object_meta(&req.headers, &|c| state.store.is_storage_class(c))?;
    let tags = if replace_tags {
        sent.tags.clone()
    } else {
        src.attrs.tags.clone()
    };
    let meta = if replace {
        sent
    } else {
        ObjectMeta {
            content_type: src.attrs.content_type.clone(),
            // A copy was not completed from the source's upload.
            headers: (src.attrs.headers.iter())
                .filter(|(k, _)| k != packrat_store_api::UPLOAD_ID_HEADER)
                .cloned()
                .collect(),
            user_meta: src.attrs.user_meta.clone(),
            storage_class: sent.storage_class,
            tags: Tags::new(),
        }
    };
    let mut attrs = ObjectMeta { tags, ..meta }.into_attrs(state.clock.now_ms());
    // The copy's lock is the request's (or the bucket's default), never the source's.
    let caller = lock::Caller::of(req);
    if replace_tags {
        tagging::may_tag_on_write(state, &caller, &b, key, &attrs.tags).await?;
    }
    lock::lock_new_version(state, &caller, &req.headers, &b, key, &mut attrs.headers).await?;
    // The copy's ACL is the request's (or none), never the source's.
    object_acl::acl_for_write(state, caller.identity, &b, &req.headers, &mut attrs.headers).await?;
    let cond = write_condition(&req.headers)?;
    let alg = match req.header("x-amz-checksum-algorithm") {
        Some(a) => Some(ChecksumAlgorithm::parse(a)?),
        None => src
            .checksum
            .as_ref()
            .and_then(|c| ChecksumAlgorithm::parse(&c.algorithm).ok()),
    };
    // The stored bytes can be copied as they are when source and copy are both plain or
    // both SSE-S3 (the copy shares the source's sealed data key) and the source is not sealed
    // part by part (a copy is one piece); any other pair is decrypted and sealed again.
    let keep_bytes = match (&encryption, &src_cipher) {
        (None, None) => true,
        (Some(sse::Requested::S3), Some(c)) => c.is_sse_s3() && !sse::is_sealed_by_part(&src),
        _ => false,
    };
    if !keep_bytes {
        let put = PutObject {
            attrs,
            checksum: alg,
            condition: cond,
            ..Default::default()
        };
        return copy_through_cipher(state, &b, key, &src, src_cipher, encryption, put).await;
    }
    sse::set_envelope(&mut attrs.headers, sse::envelope(&src).map(str::to_string));
    // In a versioned bucket a copy onto itself makes a new version, as any write does.
    let self_copy =
        sb == bname && sk == key && b.versioning == packrat_store_api::Versioning::Unversioned;
    if self_copy
        && (alg.is_none()
            || src.checksum.as_ref().map(|c| c.algorithm.as_str()) == alg.map(|a| a.name()))
    {
        // A copy onto itself changes only attributes (metadata, storage class, tags): the
        // object keeps its bytes where they are (a new class moves them on the tier worker's
        // next pass). The edit applies to the record as it is under the key lock, and keeps
        // the encryption envelope of the bytes it holds then.
        let rec = state
            .store
            .update_object(
                &b,
                key,
                &cond,
                Box::new(move |cur| {
                    let env = packrat_store_api::sealed::envelope(&cur.headers).map(str::to_string);
                    *cur = attrs;
                    sse::set_envelope(&mut cur.headers, env);
                }),
            )
            .await?;
        // What the record holds now (a copy onto itself keeps the bytes there, whatever they
        // became since the source was read).
        return copy_answer(&rec, &src, sse::stored_headers(&rec));
    }
    let put = PutObject {
        attrs,
        checksum: alg,
        condition: cond,
        ..Default::default()
    };
    let rec = state.store.copy_object(&src, &b, key, put).await?;
    copy_answer(&rec, &src, sse::stored_headers(&rec))
}

/// A copy whose bytes change on the way: the source decrypted (if it is encrypted) and the
/// copy sealed (if it asks for encryption).
async fn copy_through_cipher(
    state: &Arc<AppState>,
    b: &Bucket,
    key: &str,
    src: &ObjectInfo,
    src_cipher: Option<sse::ObjectCipher>,
    encryption: Option<sse::Requested>,
    mut put: PutObject,
) -> R {
    let mut source = sse::PlainSource::new(&*state.store, src, src_cipher)?;
    match encryption {
        Some(how) => {
            let sealed = sse::put_sealed(&*state.store, b, key, &mut source, &how, put).await?;
            copy_answer(&sealed.stored, src, sealed.headers)
        }
        None => {
            sse::set_envelope(&mut put.attrs.headers, None);
            let rec = state.store.put_object(b, key, &mut source, put).await?;
            copy_answer(&rec, src, Vec::new())
        }
    }
}

/// CopyObject's answer, with the copy's encryption headers and version ids.
fn copy_answer(rec: &ObjectInfo, src: &ObjectInfo, encryption: Vec<(&'static str, String)>) -> R {
    let mut rb = version_header(
        Response::builder()
            .status(StatusCode::OK)
            .header("content-type", "application/xml"),
        rec,
    );
    if let Some(v) = &src.version_id {
        rb = rb.header("x-amz-copy-source-version-id", v.as_str());
    }
    for (h, v) in encryption {
        rb = rb.header(h, v);
    }
    rb.body(full(copy_result(rec).finish()))
        .map_err(|e| S3Error::internal("response", e))
}

fn copy_result(rec: &ObjectInfo) -> Xml {
    let mut x = Xml::new();
    x.root("CopyObjectResult");
    x.elem("LastModified", &iso8601(rec.attrs.last_modified_ms));
    x.elem("ETag", &quoted(&rec.etag));
    if let Some(c) = &rec.checksum
        && let Ok(a) = ChecksumAlgorithm::parse(&c.algorithm)
    {
        x.elem(a.xml_name(), &c.value);
    }
    x.close("CopyObjectResult");
    x
}

pub(super) async fn handle_delete_object(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let deleted = match versions::version_id(req)? {
        Some(v) => {
            let b = load_bucket(state, req, bname, Action::DELETE_OBJECT_VERSION).await?;
            let bypass = lock::bypass_governance(state, req, &b, key).await?;
            versions::delete_version(state, &b, key, v, bypass).await?
        }
        None => {
            let b = load_bucket(state, req, bname, Action::DELETE_OBJECT).await?;
            state.store.delete_object(&b, key).await?
        }
    };
    with_headers(no_content(), versions::deleted_headers(&deleted))
}

pub(super) async fn handle_delete_objects(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
) -> R {
    let (b, policy) = load_bucket_for_keys(state, req, bname, Action::DELETE_OBJECT).await?;
    let body = read_xml_body(req).await?;
    let d: xml::Delete = xml::parse(&body)?;
    if d.objects.len() > config::DELETE_OBJECTS_KEYS_MAX {
        return Err(err(
            S3ErrorCode::MalformedXML,
            "A DeleteObjects request may name at most 1000 keys",
        ));
    }
    let quiet = d.quiet.unwrap_or(false);
    // All deletes go to group commit together, so a batch of 1000 keys costs about one
    // synced index write, not a thousand.
    let results = futures_util::future::join_all(d.objects.iter().map(|o| {
        let (store, b, req, policy) = (&state.store, &b, &*req, policy.as_deref());
        async move {
            if o.key.is_empty() || o.key.len() > config::KEY_BYTES_MAX {
                Err(err(S3ErrorCode::InvalidArgument, "Invalid key"))
            } else if let Some(v) = o.version_id.as_deref() {
                check_key(req, b, policy, Action::DELETE_OBJECT_VERSION, &o.key)?;
                let bypass = lock::bypass_for_key(req, b, policy, &o.key);
                versions::delete_version(state, b, &o.key, v, bypass).await
            } else {
                check_key(req, b, policy, Action::DELETE_OBJECT, &o.key)?;
                store.delete_object(b, &o.key).await.map_err(S3Error::from)
            }
        }
    }))
    .await;
    let mut x = Xml::new();
    x.root("DeleteResult");
    for (o, r) in d.objects.iter().zip(results) {
        match r {
            Ok(d) if !quiet => {
                x.open("Deleted");
                x.elem("Key", &o.key);
                if let Some(v) = &o.version_id {
                    x.elem("VersionId", v);
                }
                if d.delete_marker {
                    x.elem("DeleteMarker", "true");
                    if let Some(v) = d.version_id.as_ref().filter(|_| o.version_id.is_none()) {
                        x.elem("DeleteMarkerVersionId", v);
                    }
                }
                x.close("Deleted");
            }
            Ok(_) => {}
            Err(e) => {
                x.open("Error");
                x.elem("Key", &o.key);
                x.elem("Code", e.code.parts().0);
                x.elem("Message", &e.message);
                x.close("Error");
            }
        }
    }
    x.close("DeleteResult");
    xml_ok(x)
}

// ---------------------------------------------------------------- reads

/// The read conditions of a GET or HEAD, as S3 answers them (304 with the ETag and
/// Last-Modified, or 412).
fn check_read_conditions(req: &S3Request, obj: &ObjectInfo) -> S3Result<()> {
    match headers::read_conditions(&req.headers, &obj.etag, obj.attrs.last_modified_ms / 1000) {
        Ok(()) => Ok(()),
        Err(headers::ConditionFailure::NotModified) => {
            Err(err(S3ErrorCode::NotModified, "Not Modified")
                .with_header("etag", quoted(&obj.etag))
                .with_header("last-modified", http_date(obj.attrs.last_modified_ms)))
        }
        Err(headers::ConditionFailure::PreconditionFailed) => Err(err(
            S3ErrorCode::PreconditionFailed,
            "At least one of the pre-conditions you specified did not hold",
        )),
    }
}

pub(super) async fn handle_get_object(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
    head: bool,
) -> R {
    let version = versions::version_id(req)?;
    let action = match version {
        Some(_) => Action::GET_OBJECT_VERSION,
        None => Action::GET_OBJECT,
    };
    let (b, gate) = load_bucket_gated(state, req, bname, action).await?;
    // The current version straight from the store; what else may answer (a version by id, a
    // delete marker's 404) is boxed, so the common GET's future stays as small as it was.
    let obj = match version {
        None => match state.store.head_object(&b, key).await? {
            Some(o) => o,
            None => return Err(gate.hide(Box::pin(versions::missing(state, &b, key)).await)),
        },
        Some(v) => Box::pin(versions::read_version(state, &b, key, v))
            .await
            .map_err(|e| gate.hide(e))?,
    };
    gate.check(req.identity.as_ref(), &obj)?;
    let cipher = sse::open_for_read(&*state.store, req, &obj)?;
    check_read_conditions(req, &obj)?;
    let part_number = match req.q("partNumber") {
        None => None,
        Some(p) => Some(p.parse::<u32>().ok().filter(|n| *n >= 1).ok_or_else(|| {
            err(
                S3ErrorCode::InvalidArgument,
                "Part number must be an integer between 1 and 10000, inclusive",
            )
        })?),
    };
    let size = sse::shown_size(&obj);
    let range = match part_number {
        Some(n) => {
            if req.headers.contains_key("range") {
                return Err(err(
                    S3ErrorCode::InvalidRequest,
                    "Cannot specify both Range header and partNumber query parameter",
                ));
            }
            let part_sizes = sse::shown_part_sizes(&obj);
            if part_sizes.is_empty() {
                if n != 1 {
                    return Err(err(
                        S3ErrorCode::InvalidPart,
                        "The requested partnumber is not satisfiable",
                    ));
                }
                None
            } else {
                let idx = n as usize - 1;
                let Some(part_size) = part_sizes.get(idx) else {
                    return Err(err(
                        S3ErrorCode::InvalidPart,
                        "The requested partnumber is not satisfiable",
                    ));
                };
                let start: u64 = part_sizes[..idx].iter().sum();
                Some((start, start + part_size))
            }
        }
        None => resolve_range(req.header(http::header::RANGE), size)?,
    };
    let multi = match part_number {
        None => multi_ranges(req.header(http::header::RANGE), size)?,
        Some(_) => None,
    };
    let (start, end) = range.unwrap_or((0, size));
    let mut rb = Response::builder()
        .status(if range.is_some() {
            StatusCode::PARTIAL_CONTENT
        } else {
            StatusCode::OK
        })
        .header(http::header::CONTENT_LENGTH, end - start)
        .header(http::header::ETAG, quoted(&obj.etag))
        .header(
            http::header::LAST_MODIFIED,
            http_date(obj.attrs.last_modified_ms),
        )
        .header(http::header::ACCEPT_RANGES, "bytes");
    rb = version_header(rb, &obj);
    if range.is_some() && size > 0 {
        rb = rb.header(
            "content-range",
            format!("bytes {start}-{}/{size}", end.saturating_sub(1)),
        );
    }
    if part_number.is_some() && !obj.part_sizes.is_empty() {
        rb = rb.header("x-amz-mp-parts-count", obj.part_sizes.len().to_string());
    }
    for (k, v) in &req.query {
        if k.starts_with("response-") && http::HeaderValue::from_str(v).is_err() {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                format!("{k} is not a valid header value"),
            ));
        }
    }
    // Most GETs override nothing: then no `response-*` name is formed and looked for.
    let overrides = req.query.iter().any(|(k, _)| k.starts_with("response-"));
    let override_of = |h: &str| {
        overrides
            .then(|| req.q(&format!("response-{h}")).map(str::to_string))
            .flatten()
    };
    let ct = override_of("content-type")
        .or_else(|| obj.attrs.content_type.clone())
        .unwrap_or_else(|| "binary/octet-stream".to_string());
    rb = rb.header(http::header::CONTENT_TYPE, ct);
    for h in headers::STORED_HEADERS {
        let v = override_of(h).or_else(|| {
            obj.attrs
                .headers
                .iter()
                .find(|(k, _)| k == h)
                .map(|(_, v)| v.clone())
        });
        if let Some(v) = v {
            rb = rb.header(h, v);
        }
    }
    for (k, v) in &obj.attrs.user_meta {
        rb = rb.header(format!("x-amz-meta-{k}"), &*rfc2047::encode(v));
    }
    if let Some(c) = &obj.attrs.storage_class {
        rb = rb.header("x-amz-storage-class", c.as_str());
    }
    for (h, v) in cipher.iter().flat_map(sse::ObjectCipher::response_headers) {
        rb = rb.header(h, v);
    }
    // Tags are the owner's to read (GetObjectTagging); an anonymous reader is not told of them.
    if !obj.attrs.tags.is_empty() && req.identity.is_some() {
        rb = rb.header("x-amz-tagging-count", obj.attrs.tags.len());
    }
    if lock::has_lock(&obj) {
        for (h, v) in Box::pin(lock::answer_headers(state, req, &b, key, &obj)).await? {
            rb = rb.header(h, v);
        }
    }
    if req.headers.has(headers::Kind::Checksum)
        && req
            .header("x-amz-checksum-mode")
            .is_some_and(|m| m.eq_ignore_ascii_case("ENABLED"))
        && range.is_none()
        && multi.is_none()
    {
        rb = checksum_headers(rb, &obj.checksum);
    }
    if let Some(ranges) = multi {
        return multi_range_response(state, rb, Arc::new(obj), cipher, size, ranges, head);
    }
    if head {
        return rb
            .body(empty())
            .map_err(|e| S3Error::internal("response", e));
    }
    // A range read in one piece is read (and verified) before the headers go out, so a
    // corrupt small object is a clean 500. Longer ranges stream; a failure mid-stream cuts the
    // connection so the client sees a short body, never wrong bytes. (A range the store knows
    // it cannot read is refused by `read_object` before anything is sent.)
    let mut reader = match cipher {
        Some(c) => sse::read_plain(&*state.store, &obj, c, start, end)?,
        None => state.store.read_object(&obj, start, end)?,
    };
    if reader.is_single_piece() {
        let data = reader.next().await?.unwrap_or_default();
        return rb
            .body(full(data))
            .map_err(|e| S3Error::internal("response", e));
    }
    let stream = futures_util::stream::unfold(reader, |mut r| async move {
        match r.next().await {
            Ok(Some(d)) => Some((Ok(http_body::Frame::data(d)), r)),
            Ok(None) => None,
            Err(e) => Some((Err(std::io::Error::other(S3Error::from(e).message)), r)),
        }
    });
    let body = http_body_util::StreamBody::new(stream).boxed_unsync();
    rb.body(body).map_err(|e| S3Error::internal("response", e))
}

/// Several ranges of one object as `206 multipart/byteranges` (RFC 9110 section 14.6): each
/// part carries the object's content type and its own Content-Range; parts stream one verified
/// chunk at a time, in the order asked.
fn multi_range_response(
    state: &Arc<AppState>,
    mut rb: http::response::Builder,
    obj: Arc<ObjectInfo>,
    cipher: Option<sse::ObjectCipher>,
    size: u64,
    ranges: Vec<(u64, u64)>,
    head: bool,
) -> R {
    let boundary = format!("packrat-{}", hex::encode(rand::random::<[u8; 12]>()));
    let part_type = rb
        .headers_ref()
        .and_then(|h| h.get("content-type"))
        .and_then(|v| v.to_str().ok())
        .unwrap_or("binary/octet-stream")
        .to_string();
    enum Piece {
        Text(Bytes),
        Range(u64, u64),
    }
    let mut pieces = std::collections::VecDeque::new();
    let mut length = 0u64;
    for (start, end) in ranges {
        let head_text = format!(
            "--{boundary}\r\nContent-Type: {part_type}\r\nContent-Range: bytes {start}-{}/{size}\r\n\r\n",
            end - 1
        );
        length += head_text.len() as u64 + (end - start) + 2;
        pieces.push_back(Piece::Text(Bytes::from(head_text)));
        pieces.push_back(Piece::Range(start, end));
        pieces.push_back(Piece::Text(Bytes::from_static(b"\r\n")));
    }
    let tail = format!("--{boundary}--\r\n");
    length += tail.len() as u64;
    pieces.push_back(Piece::Text(Bytes::from(tail)));
    if let Some(h) = rb.headers_mut() {
        h.remove("content-range");
        if let Ok(v) =
            http::HeaderValue::from_str(&format!("multipart/byteranges; boundary={boundary}"))
        {
            h.insert("content-type", v);
        }
        h.insert("content-length", http::HeaderValue::from(length));
    }
    rb = rb.status(StatusCode::PARTIAL_CONTENT);
    if head {
        return rb
            .body(empty())
            .map_err(|e| S3Error::internal("response", e));
    }
    let store = state.store.clone();
    let stream = futures_util::stream::unfold(
        (pieces, None::<Box<dyn ObjectRead>>),
        move |(mut pieces, mut reader)| {
            let store = store.clone();
            let obj = obj.clone();
            let cipher = cipher.clone();
            async move {
                loop {
                    if let Some(r) = reader.as_mut() {
                        match r.next().await {
                            Ok(Some(d)) => {
                                return Some((Ok(http_body::Frame::data(d)), (pieces, reader)));
                            }
                            Ok(None) => reader = None,
                            Err(e) => {
                                return Some((
                                    Err(std::io::Error::other(S3Error::from(e).message)),
                                    (pieces, None),
                                ));
                            }
                        }
                    }
                    match pieces.pop_front()? {
                        Piece::Text(t) => {
                            return Some((Ok(http_body::Frame::data(t)), (pieces, reader)));
                        }
                        Piece::Range(start, end) => match match &cipher {
                            Some(c) => sse::read_plain(&*store, &obj, c.clone(), start, end),
                            None => store.read_object(&obj, start, end),
                        } {
                            Ok(r) => reader = Some(r),
                            Err(e) => {
                                return Some((
                                    Err(std::io::Error::other(S3Error::from(e).message)),
                                    (pieces, None),
                                ));
                            }
                        },
                    }
                }
            }
        },
    );
    let body = http_body_util::StreamBody::new(stream).boxed_unsync();
    rb.body(body).map_err(|e| S3Error::internal("response", e))
}

/// The attributes GetObjectAttributes may be asked for.
const OBJECT_ATTRIBUTES: [&str; 5] = [
    "ETag",
    "Checksum",
    "ObjectParts",
    "StorageClass",
    "ObjectSize",
];

/// GetObjectAttributes: what `x-amz-object-attributes` names, from the object's index entry
/// (no byte is read). Parts are listed with their sizes, up to `x-amz-max-parts` (1000).
pub(super) async fn handle_get_object_attributes(
    state: &Arc<AppState>,
    req: &S3Request,
    bname: &str,
    key: &str,
) -> R {
    let (b, gate) = load_bucket_gated(state, req, bname, Action::GET_OBJECT_ATTRIBUTES).await?;
    let wanted: Vec<&str> = req
        .headers
        .get_all("x-amz-object-attributes")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|a| !a.is_empty())
        .collect();
    if wanted.is_empty() {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "x-amz-object-attributes must name at least one of ETag, Checksum, ObjectParts, StorageClass, ObjectSize",
        ));
    }
    if let Some(bad) = wanted.iter().find(|a| !OBJECT_ATTRIBUTES.contains(a)) {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            format!("Invalid attribute name specified: {bad}"),
        ));
    }
    let number = |name: &str, default: usize| -> S3Result<usize> {
        req.header(name).map_or(Ok(default), |v| {
            v.trim().parse().map_err(|_| {
                err(
                    S3ErrorCode::InvalidArgument,
                    format!("{name} must be a whole number"),
                )
            })
        })
    };
    let max_parts = number("x-amz-max-parts", 1000)?;
    let marker = number("x-amz-part-number-marker", 0)?;
    let obj = versions::read_target(state, &b, key, versions::version_id(req)?)
        .await
        .map_err(|e| gate.hide(e))?;
    gate.check(req.identity.as_ref(), &obj)?;
    // An SSE-C object's attributes need its key, as its HEAD does.
    sse::open_for_read(&*state.store, req, &obj)?;
    let has = |a: &str| wanted.contains(&a);
    let mut x = Xml::new();
    x.root("GetObjectAttributesResponse");
    if has("ETag") {
        x.elem("ETag", &obj.etag);
    }
    if has("Checksum")
        && let Some(c) = &obj.checksum
        && let Ok(alg) = ChecksumAlgorithm::parse(&c.algorithm)
    {
        x.open("Checksum");
        x.elem(&format!("Checksum{}", alg.name()), &c.value);
        x.elem("ChecksumType", &c.kind);
        x.close("Checksum");
    }
    if has("ObjectParts") && !obj.part_sizes.is_empty() {
        let total = obj.part_sizes.len();
        let page: Vec<(usize, u64)> = sse::shown_part_sizes(&obj)
            .iter()
            .enumerate()
            .map(|(i, s)| (i + 1, *s))
            .filter(|(n, _)| *n > marker)
            .take(max_parts)
            .collect();
        let last = page.last().map_or(marker, |(n, _)| *n);
        x.open("ObjectParts");
        // The SDKs' TotalPartsCount is PartsCount on the wire.
        x.elem("PartsCount", &total.to_string());
        x.elem("PartNumberMarker", &marker.to_string());
        x.elem("NextPartNumberMarker", &last.to_string());
        x.elem("MaxParts", &max_parts.to_string());
        x.elem("IsTruncated", if last < total { "true" } else { "false" });
        for (n, size) in page {
            x.open("Part");
            x.elem("PartNumber", &n.to_string());
            x.elem("Size", &size.to_string());
            x.close("Part");
        }
        x.close("ObjectParts");
    }
    if has("StorageClass") {
        x.elem(
            "StorageClass",
            obj.attrs.storage_class.as_deref().unwrap_or("STANDARD"),
        );
    }
    if has("ObjectSize") {
        x.elem("ObjectSize", &sse::shown_size(&obj).to_string());
    }
    x.close("GetObjectAttributesResponse");
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/xml")
        .header("last-modified", http_date(obj.attrs.last_modified_ms))
        .body(full(x.finish()))
        .map_err(|e| S3Error::internal("response", e))
}
