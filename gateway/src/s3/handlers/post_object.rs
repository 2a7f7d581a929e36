//! PostObject: a browser form upload (`POST /bucket`, `multipart/form-data`) signed by a
//! policy document (see `s3::post_policy`). The form is streamed: its fields are read up to
//! the `file` part (at most 20 KiB of them), the policy's signature and conditions are checked,
//! and the file part streams into the store with the policy's size range enforced as it
//! arrives, so a file too large or too small is never stored.

use super::*;
use crate::s3::headers::RequestHeaders;
use crate::s3::post_policy::{self, FORM_FIELDS_BYTES_MAX, Form};
use packrat_store_api::ByteSource;
use packrat_store_api::checksum::ChecksumAlgorithm;

pub(super) fn is_form_upload(req: &S3Request) -> bool {
    req.header("content-type").is_some_and(|ct| {
        ct.trim_start()
            .to_ascii_lowercase()
            .starts_with("multipart/form-data")
    })
}

fn malformed() -> S3Error {
    err(
        S3ErrorCode::MalformedPOSTRequest,
        "The body of your POST request is not well-formed multipart/form-data.",
    )
}

/// A multipart failure: the body's own error when the body failed (a timeout, a client gone),
/// else a malformed form.
fn form_error(e: multer::Error) -> S3Error {
    if let multer::Error::StreamReadFailed(inner) = &e
        && let Some(s3) = inner.downcast_ref::<S3Error>()
    {
        return s3.clone();
    }
    malformed()
}

fn source_error(e: S3Error) -> StoreError {
    StoreError::Source(Arc::new(e))
}

/// The `file` part as a write's bytes, held to the policy's size range.
struct FileSource<'r> {
    field: multer::Field<'r>,
    size: u64,
    min: u64,
    max: u64,
}

#[async_trait::async_trait]
impl ByteSource for FileSource<'_> {
    async fn next_piece(&mut self) -> packrat_store_api::StoreResult<Option<Bytes>> {
        match self
            .field
            .chunk()
            .await
            .map_err(|e| source_error(form_error(e)))?
        {
            Some(piece) => {
                self.size += piece.len() as u64;
                if self.size > self.max {
                    return Err(source_error(err(
                        S3ErrorCode::EntityTooLarge,
                        "Your proposed upload exceeds the maximum allowed size",
                    )));
                }
                Ok(Some(piece))
            }
            None if self.size < self.min => Err(source_error(err(
                S3ErrorCode::EntityTooSmall,
                "Your proposed upload is smaller than the minimum allowed size",
            ))),
            None => Ok(None),
        }
    }

    fn trailing_checksum(
        &self,
        _: ChecksumAlgorithm,
    ) -> packrat_store_api::StoreResult<Option<Vec<u8>>> {
        Ok(None)
    }
}

/// Form fields that become the object's headers and metadata, as a request's headers would.
fn is_object_header(name: &str) -> bool {
    matches!(
        name,
        "content-type"
            | "cache-control"
            | "content-disposition"
            | "content-encoding"
            | "content-language"
            | "expires"
            | "content-md5"
            | "x-amz-storage-class"
    ) || name.starts_with("x-amz-meta-")
        || name.starts_with("x-amz-checksum-")
        || name.starts_with("x-amz-object-lock-")
}

/// Reads the fields before the `file` part; answers them and the file part.
async fn read_fields<'r>(mp: &mut multer::Multipart<'r>) -> S3Result<(Form, multer::Field<'r>)> {
    let mut form = Form::default();
    let mut total = 0usize;
    loop {
        let Some(mut field) = mp.next_field().await.map_err(form_error)? else {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                "POST requires exactly one file upload per request.",
            ));
        };
        let name = field.name().unwrap_or("").to_ascii_lowercase();
        if name == "file" {
            return Ok((form, field));
        }
        total += name.len();
        let mut value = Vec::new();
        while let Some(chunk) = field.chunk().await.map_err(form_error)? {
            total += chunk.len();
            if total > FORM_FIELDS_BYTES_MAX {
                return Err(err(
                    S3ErrorCode::MaxPostPreDataLengthExceeded,
                    "Your POST request fields preceding the upload file were too large.",
                ));
            }
            value.extend_from_slice(&chunk);
        }
        let value = String::from_utf8(value).map_err(|_| malformed())?;
        if name.is_empty() || form.get(&name).is_some() {
            return Err(err(
                S3ErrorCode::InvalidArgument,
                format!("The form field \"{name}\" is empty or appears twice"),
            ));
        }
        form.fields.push((name, value));
    }
}

fn required<'a>(form: &'a Form, name: &str) -> S3Result<&'a str> {
    form.get(name).ok_or_else(|| {
        err(
            S3ErrorCode::InvalidArgument,
            format!("Bucket POST must contain a field named '{name}'."),
        )
    })
}

/// Who signed the form: the policy's signature checked against the credential's key. SigV4
/// (`x-amz-signature`, what boto3 makes with `signature_version='s3v4'`) or SigV2
/// (`AWSAccessKeyId` and `signature`, boto3's default): either signs the whole policy, whose
/// conditions bind every field, so SigV2 leaves nothing unsigned here.
fn signer(state: &AppState, form: &Form) -> S3Result<Identity> {
    let policy = form.get("policy").ok_or_else(|| {
        err(
            S3ErrorCode::AccessDenied,
            "A form upload needs a signed policy (no bucket takes anonymous writes)",
        )
    })?;
    let identity = |ak: &str| -> S3Result<Identity> {
        state.store.access_key(ak)?.ok_or_else(|| {
            err(
                S3ErrorCode::InvalidAccessKeyId,
                "The AWS Access Key Id you provided does not exist in our records.",
            )
        })
    };
    let mismatch = || {
        err(
            S3ErrorCode::SignatureDoesNotMatch,
            "The request signature we calculated does not match the signature you provided.",
        )
    };
    if let Some(ak) = form.get("awsaccesskeyid") {
        let id = identity(ak)?;
        let want = crate::s3::sigv4::sigv2_signature(&id.secret_key, policy);
        if !post_policy::equal_in_constant_time(&want, required(form, "signature")?) {
            return Err(mismatch());
        }
        return Ok(id);
    }
    if required(form, "x-amz-algorithm")? != "AWS4-HMAC-SHA256" {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "x-amz-algorithm must be AWS4-HMAC-SHA256",
        ));
    }
    let (ak, date, region) = post_policy::credential(required(form, "x-amz-credential")?)?;
    if region != state.config.region {
        return Err(err(
            S3ErrorCode::AuthorizationHeaderMalformed,
            format!(
                "the credential names region '{region}'; this server is '{}'",
                state.config.region
            ),
        ));
    }
    if !required(form, "x-amz-date")?.starts_with(date) {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "x-amz-date is not the day of x-amz-credential",
        ));
    }
    let signature = required(form, "x-amz-signature")?;
    let id = identity(ak)?;
    let key = state.signing_keys.get(ak, &id.secret_key, date, region);
    if !post_policy::signature_matches(&key, policy, signature) {
        return Err(mismatch());
    }
    Ok(id)
}

/// Fields packrat cannot honour: refused rather than ignored.
fn refuse_unsupported(form: &Form) -> S3Result<()> {
    for (name, value) in &form.fields {
        let unsupported = name.starts_with("x-amz-copy-source-");
        if unsupported {
            return Err(err(
                S3ErrorCode::NotImplemented,
                format!(
                    "packrat does not implement the form field '{name}' (value '{value}') on a form upload"
                ),
            ));
        }
    }
    Ok(())
}

pub(super) async fn handle_post_object(
    state: &Arc<AppState>,
    req: &mut S3Request,
    bname: &str,
) -> R {
    let boundary = multer::parse_boundary(req.header("content-type").unwrap_or(""))
        .map_err(|_| malformed())?;
    let host = req.header("host").unwrap_or("localhost").to_string();
    let body = &mut req.body;
    let stream = futures_util::stream::unfold(body, |b| async move {
        match b.next().await {
            Ok(Some(piece)) => Some((Ok::<Bytes, S3Error>(piece), b)),
            Ok(None) => None,
            Err(e) => Some((Err(e), b)),
        }
    });
    let mut mp = multer::Multipart::new(stream, boundary);
    let (form, file) = read_fields(&mut mp).await?;
    let id = signer(state, &form)?;
    let policy = post_policy::parse(required(&form, "policy")?)?;
    let key_field = required(&form, "key")?;
    let file_name = file.file_name().unwrap_or("").to_string();
    let key = key_field.replace("${filename}", &file_name);
    if key.is_empty() {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            "User key must have a length greater than 0.",
        ));
    }
    if key.len() > config::KEY_BYTES_MAX {
        return Err(err(S3ErrorCode::KeyTooLongError, "Your key is too long"));
    }
    let (min, max) = policy.check(&form, bname, &key, state.clock.now_ms())?;
    refuse_unsupported(&form)?;
    // The `tagging` field: a Tagging document, as PutObjectTagging takes.
    let form_tags = (form.get("tagging"))
        .map(|doc| crate::s3::tagging::parse_xml(doc.as_bytes()))
        .transpose()?;
    let b = bucket_for(
        state,
        &Facts {
            peer: req.peer,
            secure: req.secure,
            headers: &req.headers,
            query: &req.query,
            tags: form_tags.as_deref(),
            existing_tags: None,
        },
        Some(&id),
        bname,
        Action::PUT_OBJECT,
        Some(&key),
    )
    .await?;
    let mut meta_headers = http::HeaderMap::new();
    let mut encryption_fields = http::HeaderMap::new();
    for (name, value) in &form.fields {
        if let (true, Ok(n), Ok(v)) = (
            headers::is_encryption_header(name),
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_str(value),
        ) {
            encryption_fields.insert(n, v);
        }
    }
    let encryption = sse::or_default(
        state,
        &b,
        Some(&id),
        sse::requested_in(&RequestHeaders::new(encryption_fields), req.sse_c_allowed)?,
    )
    .await?;
    for (name, value) in form.fields.iter().filter(|(n, _)| is_object_header(n)) {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            // As bytes: a metadata field may be UTF-8 text.
            http::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            meta_headers.insert(n, v);
        }
    }
    let meta_headers = RequestHeaders::new(meta_headers);
    let meta = object_meta(&meta_headers, &|c| state.store.is_storage_class(c))?;
    let (alg, sent) = requested_checksum(&meta_headers)?;
    let mut attrs = meta.into_attrs(state.clock.now_ms());
    if let Some(tags) = &form_tags {
        attrs.tags = tags.clone();
    }
    let caller = lock::Caller {
        facts: Facts {
            peer: req.peer,
            secure: req.secure,
            headers: &req.headers,
            query: &req.query,
            tags: form_tags.as_deref(),
            existing_tags: None,
        },
        identity: Some(&id),
    };
    tagging::may_tag_on_write(state, &caller, &b, &key, &attrs.tags).await?;
    lock::lock_new_version(state, &caller, &meta_headers, &b, &key, &mut attrs.headers).await?;
    // The `acl` field: a canned ACL, as `x-amz-acl` gives one.
    let acl_asked = object_acl::form_acl_headers(form.get("acl"))?;
    object_acl::acl_for_write(state, Some(&id), &b, &acl_asked, &mut attrs.headers).await?;
    let put = PutObject {
        attrs,
        checksum: alg,
        expected_checksum: sent,
        content_md5: content_md5(&meta_headers)?,
        condition: WriteCondition::default(),
        on_staged: None,
        version_as: None,
    };
    let mut source = FileSource {
        field: file,
        size: 0,
        min,
        max,
    };
    // The form's encryption fields (SSE-S3 or SSE-C), else the bucket's default.
    let (stored, answer) = match encryption {
        Some(how) => {
            let sealed = sse::put_sealed(&*state.store, &b, &key, &mut source, &how, put).await?;
            (sealed.stored, sealed.headers)
        }
        None => (
            state.store.put_object(&b, &key, &mut source, put).await?,
            Vec::new(),
        ),
    };
    let etag = quoted(&stored.etag);
    let scheme = if state.tls.is_some() { "https" } else { "http" };
    let location = format!(
        "{scheme}://{host}/{}/{}",
        uri_encode(bname.as_bytes(), false),
        uri_encode(key.as_bytes(), true)
    );
    let redirect = form
        .get("success_action_redirect")
        .or_else(|| form.get("redirect"))
        .filter(|r| r.starts_with("http://") || r.starts_with("https://"));
    let mut builder = objects::version_header(Response::builder().header("etag", &etag), &stored);
    for (h, v) in answer {
        builder = builder.header(h, v);
    }
    if let Some(to) = redirect {
        // One Location only: the redirect (a browser refuses an answer with two).
        let sep = if to.contains('?') { '&' } else { '?' };
        let to = format!(
            "{to}{sep}bucket={}&key={}&etag={}",
            uri_encode(bname.as_bytes(), false),
            uri_encode(key.as_bytes(), false),
            uri_encode(etag.as_bytes(), false)
        );
        return builder
            .status(StatusCode::SEE_OTHER)
            .header("location", to)
            .body(empty())
            .map_err(|e| S3Error::internal("response", e));
    }
    let builder = builder.header("location", &location);
    match form.get("success_action_status") {
        Some("200") => builder.status(StatusCode::OK).body(empty()),
        Some("201") => {
            let mut x = Xml::new();
            x.root("PostResponse");
            x.elem("Location", &location);
            x.elem("Bucket", bname);
            x.elem("Key", &key);
            x.elem("ETag", &etag);
            x.close("PostResponse");
            builder
                .status(StatusCode::CREATED)
                .header("content-type", "application/xml")
                .body(full(x.finish()))
        }
        _ => builder.status(StatusCode::NO_CONTENT).body(empty()),
    }
    .map_err(|e| S3Error::internal("response", e))
}
