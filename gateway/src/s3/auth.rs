//! Request authentication: SigV4 (header and presigned) and legacy SigV2 presigned URLs,
//! checked against the caller's key. Pure over its inputs (the clock reading, the region and
//! the key lookup come in an [`AuthContext`]), so the fuzz targets drive the same code the
//! server runs, signature comparison included.

use super::body::{ChunkSigning, PayloadMode};
use super::error::{S3Error, S3ErrorCode, S3Result};
use super::sigv4;
use http::{HeaderMap, Method};
use packrat_store_api::Identity;

/// Query parameters that select a packrat extension (the epoch stream, batch GET and their
/// options): never accepted under SigV2, which would not sign them.
pub const EXTENSION_PARAMS: &[&str] = &[
    "stream", "batch", "shard", "worker", "seed", "epoch", "start", "order", "group", "tail",
    "listing", "window", "on_error",
];

/// What authentication needs from the server.
pub struct AuthContext<'a> {
    /// The server clock, in unix seconds.
    pub now_secs: i64,
    /// The one region this server answers for.
    pub region: &'a str,
    pub signing_keys: &'a sigv4::SigningKeyCache,
    /// Looks up an access key; `None` when it does not exist.
    pub access_key: &'a (dyn Fn(&str) -> S3Result<Option<Identity>> + Sync),
}

/// The caller (`None`: anonymous), how to check a signed streaming body, and the body's mode.
pub type AuthOutcome = (Option<Identity>, Option<ChunkSigning>, PayloadMode);

/// Verifies the request's signature (header or presigned) and returns the caller's key.
pub fn authenticate(
    ctx: &AuthContext<'_>,
    method: &Method,
    raw_path: &str,
    raw_query: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
) -> S3Result<AuthOutcome> {
    let sha_header = headers
        .get(&super::headers::X_AMZ_CONTENT_SHA256)
        .and_then(|v| v.to_str().ok());
    let auth_header = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let presigned = query.iter().any(|(k, _)| k == "X-Amz-Signature");
    let q = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    if auth_header.is_none()
        && !presigned
        && let (Some(ak), Some(sig), Some(expires)) =
            (q("AWSAccessKeyId"), q("Signature"), q("Expires"))
    {
        let claim = V2Claim {
            access_key: ak,
            signature: sig,
            expires,
        };
        return authenticate_sigv2_query(ctx, method, raw_path, query, headers, claim);
    }
    if let Some(v2) = auth_header.and_then(|h| h.strip_prefix("AWS ")) {
        if presigned {
            return Err(S3Error::new(
                S3ErrorCode::InvalidArgument,
                "Only one auth mechanism allowed",
            ));
        }
        return authenticate_sigv2_header(ctx, method, raw_path, query, headers, v2, sha_header);
    }
    let claim = match (auth_header, presigned) {
        (Some(_), true) => {
            return Err(S3Error::new(
                S3ErrorCode::InvalidArgument,
                "Only one auth mechanism allowed",
            ));
        }
        (Some(h), false) => sigv4::parse_authorization(h, headers)?,
        (None, true) => sigv4::parse_presigned(query)?,
        (None, false) => {
            let mode = PayloadMode::from_header(sha_header)?;
            if mode.is_chunked() && !matches!(mode, PayloadMode::StreamingUnsignedTrailer) {
                return Err(S3Error::new(
                    S3ErrorCode::AccessDenied,
                    "A signed streaming body needs a signed request",
                ));
            }
            return Ok((None, None, mode));
        }
    };
    sigv4::check_time(&claim, ctx.now_secs)?;
    if claim.service != "s3" {
        return Err(S3Error::new(
            S3ErrorCode::AuthorizationHeaderMalformed,
            format!(
                "The credential scope names service '{}'; expected 's3'",
                claim.service
            ),
        ));
    }
    if claim.region != ctx.region {
        return Err(S3Error::new(
            S3ErrorCode::AuthorizationHeaderMalformed,
            format!(
                "The authorization header is malformed; the region '{}' is wrong; expecting '{}'",
                claim.region, ctx.region
            ),
        ));
    }
    if !claim.signed_headers.iter().any(|h| h == "host") {
        return Err(S3Error::new(
            S3ErrorCode::AccessDenied,
            "The host header must be signed",
        ));
    }
    let key = (ctx.access_key)(&claim.access_key)?.ok_or_else(|| {
        S3Error::new(
            S3ErrorCode::InvalidAccessKeyId,
            "The AWS Access Key Id you provided does not exist in our records.",
        )
    })?;
    let payload_hash = if presigned {
        sha_header.unwrap_or(sigv4::UNSIGNED_PAYLOAD).to_string()
    } else {
        sha_header
            .ok_or_else(|| {
                S3Error::new(
                    S3ErrorCode::InvalidRequest,
                    "Missing required header for this request: x-amz-content-sha256",
                )
            })?
            .to_string()
    };
    let creq = sigv4::canonical_request(&sigv4::CanonicalInput {
        method: method.as_str(),
        raw_path,
        raw_query,
        headers,
        signed_headers: &claim.signed_headers,
        payload_hash: &payload_hash,
        presigned,
    });
    let scope = claim.scope();
    let sts = sigv4::string_to_sign(&claim.amz_date, &scope, &creq);
    let signing_key =
        ctx.signing_keys
            .get(&key.access_key, &key.secret_key, &claim.date, &claim.region);
    let want = sigv4::sign_hex(&signing_key, &sts);
    if !sigv4::signatures_equal(&want, &claim.signature) {
        tracing::debug!(canonical_request = %creq, "signature mismatch");
        return Err(S3Error::new(
            S3ErrorCode::SignatureDoesNotMatch,
            "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
        ));
    }
    let mode = if presigned {
        PayloadMode::Unsigned
    } else {
        PayloadMode::from_header(Some(&payload_hash))?
    };
    let signing = matches!(mode, PayloadMode::StreamingSigned { .. }).then(|| ChunkSigning {
        signing_key,
        amz_date: claim.amz_date.clone(),
        scope,
        seed_signature: claim.signature.clone(),
    });
    Ok((Some(key), signing, mode))
}

/// What a legacy SigV2 presigned URL claims: `AWSAccessKeyId`, `Signature` and `Expires`.
struct V2Claim<'a> {
    access_key: &'a str,
    signature: &'a str,
    expires: &'a str,
}

/// Legacy SigV2 presigned URLs, read-only use.
fn authenticate_sigv2_query(
    ctx: &AuthContext<'_>,
    method: &Method,
    raw_path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
    claim: V2Claim<'_>,
) -> S3Result<AuthOutcome> {
    let V2Claim {
        access_key,
        signature,
        expires,
    } = claim;
    let exp: i64 = expires.parse().map_err(|_| {
        S3Error::new(
            S3ErrorCode::AuthorizationQueryParametersError,
            "Expires must be a unix time",
        )
    })?;
    if ctx.now_secs > exp {
        return Err(S3Error::new(
            S3ErrorCode::AccessDenied,
            "Request has expired",
        ));
    }
    if exp - ctx.now_secs > sigv4::PRESIGN_EXPIRES_SECS_MAX {
        return Err(S3Error::new(
            S3ErrorCode::AuthorizationQueryParametersError,
            "Expires must be at most 7 days (604800 seconds) ahead",
        ));
    }
    let key = sigv2_signer(
        ctx,
        method,
        raw_path,
        query,
        headers,
        (access_key, signature),
        expires,
    )?;
    Ok((Some(key), None, PayloadMode::Unsigned))
}

/// Legacy SigV2 in the `Authorization` header (`AWS <access key>:<signature>`), as boto3
/// signs with `signature_version="s3"`: the request's `Date` is signed (or, when it carries
/// `x-amz-date`, that, among the `x-amz-*` headers), and must be within 15 minutes of now. The
/// body is not signed: a `Content-MD5` or `x-amz-content-sha256` it carries is checked.
fn authenticate_sigv2_header(
    ctx: &AuthContext<'_>,
    method: &Method,
    raw_path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
    credential: &str,
    sha_header: Option<&str>,
) -> S3Result<AuthOutcome> {
    let (access_key, signature) = credential.trim().split_once(':').ok_or_else(|| {
        S3Error::new(
            S3ErrorCode::AuthorizationHeaderMalformed,
            "A SigV2 authorization header is AWS <access key>:<signature>",
        )
    })?;
    let value = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    // With `x-amz-date`, the date line of the string to sign is empty (it is signed among the
    // `x-amz-*` headers).
    let (dated, date_slot) = match (value("x-amz-date"), value("date")) {
        (Some(d), _) => (Some(d), ""),
        (None, d) => (d, d.unwrap_or("")),
    };
    let when = dated
        .and_then(|d| {
            sigv4::parse_amz_date(d).or_else(|| {
                chrono::DateTime::parse_from_rfc2822(d)
                    .ok()
                    .map(|t| t.timestamp())
            })
        })
        .ok_or_else(|| {
            S3Error::new(
                S3ErrorCode::AccessDenied,
                "AWS authentication requires a valid Date or x-amz-date header",
            )
        })?;
    if (when - ctx.now_secs).abs() > sigv4::CLOCK_SKEW_SECS_MAX {
        return Err(S3Error::new(
            S3ErrorCode::RequestTimeTooSkewed,
            "The difference between the request time and the current time is too large.",
        ));
    }
    let mode = PayloadMode::from_header(sha_header)?;
    if mode.is_chunked() {
        return Err(S3Error::new(
            S3ErrorCode::InvalidRequest,
            "An aws-chunked body needs a SigV4 signature",
        ));
    }
    let key = sigv2_signer(
        ctx,
        method,
        raw_path,
        query,
        headers,
        (access_key, signature),
        date_slot,
    )?;
    Ok((Some(key), None, mode))
}

/// The key that signed a SigV2 request (`signature` of `access_key`, over the string to sign
/// with `dated` in its date line), or the error S3 answers.
fn sigv2_signer(
    ctx: &AuthContext<'_>,
    method: &Method,
    raw_path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
    (access_key, signature): (&str, &str),
    dated: &str,
) -> S3Result<Identity> {
    // SigV2 signs only AWS's own sub-resources: a parameter that turns a request into one of
    // packrat's extensions (a listing into an epoch stream of the objects' bytes) would ride
    // along unsigned, so those need SigV4.
    if let Some((k, _)) = query
        .iter()
        .find(|(k, _)| EXTENSION_PARAMS.contains(&k.as_str()))
    {
        return Err(S3Error::new(
            S3ErrorCode::AccessDenied,
            format!(
                "'{k}' selects a packrat extension, which SigV2 would leave unsigned: sign the request with SigV4"
            ),
        ));
    }
    let key = (ctx.access_key)(access_key)?.ok_or_else(|| {
        S3Error::new(
            S3ErrorCode::InvalidAccessKeyId,
            "The AWS Access Key Id you provided does not exist in our records.",
        )
    })?;
    let signed_as = |path: &str| {
        let sts = sigv4::sigv2_string_to_sign(method.as_str(), path, query, headers, dated);
        sigv4::signatures_equal(&sigv4::sigv2_signature(&key.secret_key, &sts), signature)
    };
    // A bucket's canonical resource is `/bucket/` to botocore and `/bucket` to others.
    let bucket_only = raw_path.len() > 1 && !raw_path[1..].contains('/');
    let signed = signed_as(raw_path) || (bucket_only && signed_as(&format!("{raw_path}/")));
    if !signed {
        return Err(S3Error::new(
            S3ErrorCode::SignatureDoesNotMatch,
            "The request signature we calculated does not match the signature you provided. Check your key and signing method.",
        ));
    }
    Ok(key)
}
