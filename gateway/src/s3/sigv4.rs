//! AWS Signature Version 4: verification of header and presigned requests, the chunk and
//! trailer signatures of streaming uploads, and signing (for `packrat admin` and tests).
//!
//! The signature is recomputed from the request exactly as received: the canonical URI is the
//! decoded path encoded once with S3's rules (no dot-segment normalisation), the canonical
//! query re-encodes every decoded pair, and only the headers named in SignedHeaders are used.
//! Written here rather than with `aws-sigv4` because verification needs the intermediate
//! values (seed signature, signing key, scope) to check streaming chunks, and because the
//! derived signing key is cached per (access key, date, region): deriving it costs four
//! HMACs, which is most of the auth cost of a small GET.

use super::encoding::push_uri_encoded;
pub use super::encoding::{percent_decode, uri_encode};
use super::error::{S3Error, S3ErrorCode, S3Result};
use hmac::{Hmac, Mac};
use http::HeaderMap;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::Mutex;

type HmacSha256 = Hmac<Sha256>;

pub const ALGORITHM: &str = "AWS4-HMAC-SHA256";
pub const UNSIGNED_PAYLOAD: &str = "UNSIGNED-PAYLOAD";
pub const STREAMING_SIGNED: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD";
pub const STREAMING_SIGNED_TRAILER: &str = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER";
pub const STREAMING_UNSIGNED_TRAILER: &str = "STREAMING-UNSIGNED-PAYLOAD-TRAILER";
pub const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

/// Largest allowed difference between a request's X-Amz-Date and the server clock.
pub const CLOCK_SKEW_SECS_MAX: i64 = 15 * 60;
/// Longest validity of a presigned URL, as in S3 (seven days).
pub const PRESIGN_EXPIRES_SECS_MAX: i64 = 7 * 24 * 3600;
/// Bound on the signing-key cache; it is cleared when full (keys are re-derived on demand).
const SIGNING_KEY_CACHE_ENTRIES_MAX: usize = 4096;

pub fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut m = HmacSha256::new_from_slice(key).expect("HMAC takes keys of any length");
    m.update(data);
    m.finalize().into_bytes().into()
}

pub fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

pub fn derive_signing_key(secret: &str, date: &str, region: &str, service: &str) -> [u8; 32] {
    let k = hmac(format!("AWS4{secret}").as_bytes(), date.as_bytes());
    let k = hmac(&k, region.as_bytes());
    let k = hmac(&k, service.as_bytes());
    hmac(&k, b"aws4_request")
}

#[derive(Default)]
pub struct SigningKeyCache {
    map: Mutex<HashMap<(String, String, String), [u8; 32]>>,
}

impl SigningKeyCache {
    pub fn get(&self, access_key: &str, secret: &str, date: &str, region: &str) -> [u8; 32] {
        let id = (access_key.to_string(), date.to_string(), region.to_string());
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(k) = map.get(&id) {
            return *k;
        }
        let k = derive_signing_key(secret, date, region, "s3");
        if map.len() >= SIGNING_KEY_CACHE_ENTRIES_MAX {
            map.clear();
        }
        map.insert(id, k);
        k
    }

    /// Forgets every key derived for an access key (after the key is deleted or replaced).
    pub fn forget(&self, access_key: &str) {
        self.map
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(ak, _, _), _| ak != access_key);
    }
}

/// Decoded query pairs in the order they came.
pub fn parse_query(raw: &str) -> Vec<(String, String)> {
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (
                String::from_utf8_lossy(&percent_decode(k)).into_owned(),
                String::from_utf8_lossy(&percent_decode(v)).into_owned(),
            )
        })
        .collect()
}

fn canonical_query(raw: &str, skip_signature: bool) -> String {
    let mut pairs: Vec<(String, String)> = raw
        .split('&')
        .filter(|p| !p.is_empty())
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            let k = percent_decode(k);
            if skip_signature && k == b"X-Amz-Signature" {
                return None;
            }
            Some((uri_encode(&k, false), uri_encode(&percent_decode(v), false)))
        })
        .collect();
    pairs.sort();
    let mut out = String::new();
    for (i, (k, v)) in pairs.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

fn canonical_header_value(headers: &HeaderMap, name: &str) -> String {
    let mut out = String::new();
    push_canonical_header_value(&mut out, headers, name);
    out
}

/// A header's canonical value (its values joined by commas, each trimmed, runs of spaces
/// folded into one) onto the end of `out`.
fn push_canonical_header_value(out: &mut String, headers: &HeaderMap, name: &str) {
    for (i, v) in headers.get_all(name).iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let s = String::from_utf8_lossy(v.as_bytes());
        let s = s.trim();
        // The usual value has no run of spaces: it goes in whole (a byte at a time, below,
        // was about a tenth of a small GET's instructions).
        if !s.contains("  ") {
            out.push_str(s);
            continue;
        }
        let mut last_space = false;
        for c in s.chars() {
            if c == ' ' {
                if !last_space {
                    out.push(' ');
                }
                last_space = true;
            } else {
                out.push(c);
                last_space = false;
            }
        }
    }
}

pub struct CanonicalInput<'a> {
    pub method: &'a str,
    pub raw_path: &'a str,
    pub raw_query: &'a str,
    pub headers: &'a HeaderMap,
    pub signed_headers: &'a [String],
    pub payload_hash: &'a str,
    pub presigned: bool,
}

pub fn canonical_request(c: &CanonicalInput<'_>) -> String {
    let mut s = String::with_capacity(512);
    s.push_str(c.method);
    s.push('\n');
    // A path without escapes decodes to itself.
    if c.raw_path.contains('%') {
        push_uri_encoded(&mut s, &percent_decode(c.raw_path), true);
    } else {
        push_uri_encoded(&mut s, c.raw_path.as_bytes(), true);
    }
    s.push('\n');
    if !c.raw_query.is_empty() {
        s.push_str(&canonical_query(c.raw_query, c.presigned));
    }
    s.push('\n');
    for h in c.signed_headers {
        s.push_str(h);
        s.push(':');
        push_canonical_header_value(&mut s, c.headers, h);
        s.push('\n');
    }
    s.push('\n');
    for (i, h) in c.signed_headers.iter().enumerate() {
        if i > 0 {
            s.push(';');
        }
        s.push_str(h);
    }
    s.push('\n');
    s.push_str(c.payload_hash);
    s
}

pub fn string_to_sign(amz_date: &str, scope: &str, canonical_request: &str) -> String {
    let mut hash = [0u8; 64];
    hex::encode_to_slice(Sha256::digest(canonical_request.as_bytes()), &mut hash)
        .expect("64 hex digits for 32 bytes");
    let hash = std::str::from_utf8(&hash).expect("hex digits");
    [ALGORITHM, "\n", amz_date, "\n", scope, "\n", hash].concat()
}

/// The parsed credential and signature of a request, before the key is looked up.
#[derive(Debug, Clone)]
pub struct SignatureClaim {
    pub access_key: String,
    pub date: String,
    pub region: String,
    pub service: String,
    pub signed_headers: Vec<String>,
    pub signature: String,
    pub amz_date: String,
    pub presigned_expires_secs: Option<i64>,
}

impl SignatureClaim {
    pub fn scope(&self) -> String {
        [
            &*self.date,
            "/",
            &self.region,
            "/",
            &self.service,
            "/aws4_request",
        ]
        .concat()
    }
}

fn malformed(msg: &str) -> S3Error {
    S3Error::new(S3ErrorCode::AuthorizationHeaderMalformed, msg)
}

fn parse_credential(cred: &str, query: bool) -> S3Result<(String, String, String, String)> {
    let err = |m: &str| {
        if query {
            S3Error::new(S3ErrorCode::AuthorizationQueryParametersError, m)
        } else {
            malformed(m)
        }
    };
    let parts: Vec<&str> = cred.split('/').collect();
    if parts.len() != 5 || parts[4] != "aws4_request" {
        return Err(err(
            "the Credential is not of the form AK/date/region/service/aws4_request",
        ));
    }
    if parts[1].len() != 8 || !parts[1].bytes().all(|b| b.is_ascii_digit()) {
        return Err(err("the Credential date is not YYYYMMDD"));
    }
    Ok((
        parts[0].to_string(),
        parts[1].to_string(),
        parts[2].to_string(),
        parts[3].to_string(),
    ))
}

/// Parses `Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=..., Signature=...`.
pub fn parse_authorization(value: &str, headers: &HeaderMap) -> S3Result<SignatureClaim> {
    let rest = value
        .strip_prefix(ALGORITHM)
        .ok_or_else(|| {
            S3Error::new(
                S3ErrorCode::InvalidArgument,
                "Only AWS4-HMAC-SHA256 and SigV2 (AWS <access key>:<signature>) signatures are supported",
            )
        })?
        .trim();
    let (mut cred, mut signed, mut sig) = (None, None, None);
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(v) = part.strip_prefix("Credential=") {
            cred = Some(v);
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed = Some(v);
        } else if let Some(v) = part.strip_prefix("Signature=") {
            sig = Some(v);
        }
    }
    let (Some(cred), Some(signed), Some(sig)) = (cred, signed, sig) else {
        return Err(malformed(
            "the authorization header needs Credential, SignedHeaders and Signature",
        ));
    };
    let (access_key, date, region, service) = parse_credential(cred, false)?;
    let amz_date = headers
        .get(&super::headers::X_AMZ_DATE)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            S3Error::new(
                S3ErrorCode::AccessDenied,
                "AWS authentication requires a valid X-Amz-Date header",
            )
        })?
        .to_string();
    Ok(SignatureClaim {
        access_key,
        date,
        region,
        service,
        signed_headers: signed.split(';').map(|s| s.to_ascii_lowercase()).collect(),
        signature: sig.to_string(),
        amz_date,
        presigned_expires_secs: None,
    })
}

/// Parses the X-Amz-* query parameters of a presigned URL.
pub fn parse_presigned(query: &[(String, String)]) -> S3Result<SignatureClaim> {
    let get = |name: &str| {
        query
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
            .ok_or_else(|| {
                S3Error::new(
                    S3ErrorCode::AuthorizationQueryParametersError,
                    format!("presigned URL lacks {name}"),
                )
            })
    };
    if get("X-Amz-Algorithm")? != ALGORITHM {
        return Err(S3Error::new(
            S3ErrorCode::AuthorizationQueryParametersError,
            "X-Amz-Algorithm must be AWS4-HMAC-SHA256",
        ));
    }
    let (access_key, date, region, service) = parse_credential(get("X-Amz-Credential")?, true)?;
    let expires: i64 = get("X-Amz-Expires")?.parse().map_err(|_| {
        S3Error::new(
            S3ErrorCode::AuthorizationQueryParametersError,
            "X-Amz-Expires must be a number of seconds",
        )
    })?;
    if !(1..=PRESIGN_EXPIRES_SECS_MAX).contains(&expires) {
        return Err(S3Error::new(
            S3ErrorCode::AuthorizationQueryParametersError,
            "X-Amz-Expires must be between 1 and 604800 seconds",
        ));
    }
    Ok(SignatureClaim {
        access_key,
        date,
        region,
        service,
        signed_headers: get("X-Amz-SignedHeaders")?
            .split(';')
            .map(|s| s.to_ascii_lowercase())
            .collect(),
        signature: get("X-Amz-Signature")?.to_string(),
        amz_date: get("X-Amz-Date")?.to_string(),
        presigned_expires_secs: Some(expires),
    })
}

/// Parses `YYYYMMDDTHHMMSSZ` into unix seconds.
/// The fields are read by position (chrono's `parse_from_str` parses its format string again on
/// every call, 0.7% of a 4 KiB GET's CPU); chrono still checks the date and time are real.
pub fn parse_amz_date(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() != 16 || b[8] != b'T' || b[15] != b'Z' {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<u32> {
        b[r].iter().try_fold(0u32, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u32::from(c - b'0'))
        })
    };
    let date = chrono::NaiveDate::from_ymd_opt(num(0..4)? as i32, num(4..6)?, num(6..8)?)?;
    let (h, m, sec) = (num(9..11)?, num(11..13)?, num(13..15)?);
    // A leap second (:60) is read as chrono reads it, the last instant of second :59.
    let t = match sec {
        60 => date.and_hms_nano_opt(h, m, 59, 1_000_000_000)?,
        _ => date.and_hms_opt(h, m, sec)?,
    };
    Some(t.and_utc().timestamp())
}

/// Checks the request time against the clock (and, for presigned URLs, the expiry).
pub fn check_time(claim: &SignatureClaim, now_secs: i64) -> S3Result<()> {
    let t = parse_amz_date(&claim.amz_date).ok_or_else(|| {
        S3Error::new(
            S3ErrorCode::AccessDenied,
            "X-Amz-Date is not of the form YYYYMMDDTHHMMSSZ",
        )
    })?;
    if !claim.amz_date.starts_with(&claim.date) {
        return Err(S3Error::new(
            S3ErrorCode::SignatureDoesNotMatch,
            "the Credential date does not match X-Amz-Date",
        ));
    }
    match claim.presigned_expires_secs {
        Some(expires) => {
            if t - now_secs > CLOCK_SKEW_SECS_MAX {
                return Err(S3Error::new(
                    S3ErrorCode::RequestTimeTooSkewed,
                    "The presigned URL is dated in the future",
                ));
            }
            if now_secs > t + expires {
                return Err(S3Error::new(
                    S3ErrorCode::AccessDenied,
                    "Request has expired",
                ));
            }
        }
        None => {
            if (t - now_secs).abs() > CLOCK_SKEW_SECS_MAX {
                return Err(S3Error::new(
                    S3ErrorCode::RequestTimeTooSkewed,
                    "The difference between the request time and the current time is too large.",
                ));
            }
        }
    }
    Ok(())
}

/// Constant-time comparison of two signatures, so timing does not reveal a prefix match.
pub fn signatures_equal(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

pub fn sign_hex(signing_key: &[u8; 32], string_to_sign: &str) -> String {
    hex::encode(hmac(signing_key, string_to_sign.as_bytes()))
}

/// Signature of one chunk of a `STREAMING-AWS4-HMAC-SHA256-PAYLOAD` body.
pub fn chunk_signature(
    signing_key: &[u8; 32],
    amz_date: &str,
    scope: &str,
    previous: &str,
    chunk_sha256_hex: &str,
) -> String {
    let sts = format!(
        "AWS4-HMAC-SHA256-PAYLOAD\n{amz_date}\n{scope}\n{previous}\n{EMPTY_SHA256}\n{chunk_sha256_hex}"
    );
    sign_hex(signing_key, &sts)
}

/// Signature of the trailing headers of a signed streaming body.
pub fn trailer_signature(
    signing_key: &[u8; 32],
    amz_date: &str,
    scope: &str,
    previous: &str,
    canonical_trailers: &str,
) -> String {
    let sts = format!(
        "AWS4-HMAC-SHA256-TRAILER\n{amz_date}\n{scope}\n{previous}\n{}",
        sha256_hex(canonical_trailers.as_bytes())
    );
    sign_hex(signing_key, &sts)
}

/// Query parameters that are part of a SigV2 canonical resource.
const SIGV2_SUBRESOURCES: &[&str] = &[
    "acl",
    "delete",
    "location",
    "logging",
    "notification",
    "partNumber",
    "policy",
    "requestPayment",
    "response-cache-control",
    "response-content-disposition",
    "response-content-encoding",
    "response-content-language",
    "response-content-type",
    "response-expires",
    "torrent",
    "uploadId",
    "uploads",
    "versionId",
    "versioning",
    "versions",
    "website",
    "lifecycle",
    "tagging",
    "cors",
];

/// The string a legacy (SigV2) presigned URL signs. boto3 still generates these by default
/// for `generate_presigned_url` unless told `signature_version='s3v4'`.
pub fn sigv2_string_to_sign(
    method: &str,
    raw_path: &str,
    query: &[(String, String)],
    headers: &HeaderMap,
    expires: &str,
) -> String {
    let h = |n: &str| {
        headers
            .get(n)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .trim()
            .to_string()
    };
    let mut amz: Vec<(String, String)> = headers
        .keys()
        .map(|k| k.as_str())
        .filter(|k| k.starts_with("x-amz-"))
        .map(|k| (k.to_string(), canonical_header_value(headers, k)))
        .collect();
    amz.sort();
    amz.dedup();
    let mut s = format!(
        "{method}\n{}\n{}\n{expires}\n",
        h("content-md5"),
        h("content-type")
    );
    for (k, v) in amz {
        s.push_str(&format!("{k}:{v}\n"));
    }
    s.push_str(raw_path);
    let mut subs: Vec<&(String, String)> = query
        .iter()
        .filter(|(k, _)| SIGV2_SUBRESOURCES.contains(&k.as_str()))
        .collect();
    subs.sort();
    for (i, (k, v)) in subs.iter().enumerate() {
        s.push(if i == 0 { '?' } else { '&' });
        s.push_str(k);
        if !v.is_empty() {
            s.push('=');
            s.push_str(v);
        }
    }
    s
}

pub fn sigv2_signature(secret: &str, string_to_sign: &str) -> String {
    use base64::Engine as _;
    let mut m = Hmac::<sha1::Sha1>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes keys of any length");
    m.update(string_to_sign.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(m.finalize().into_bytes())
}

/// Who signs a request, and for which region.
pub struct Signer<'a> {
    pub access_key: &'a str,
    pub secret: &'a str,
    pub region: &'a str,
}

/// Signs a request with header authentication (used by `packrat admin`). Adds `host`,
/// `x-amz-date`, `x-amz-content-sha256` and `authorization` to `headers`.
pub fn sign_request(
    method: &str,
    raw_path: &str,
    raw_query: &str,
    headers: &mut HeaderMap,
    body: &[u8],
    signer: &Signer<'_>,
    now: chrono::DateTime<chrono::Utc>,
) {
    let Signer {
        access_key,
        secret,
        region,
    } = *signer;
    let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
    let date = &amz_date[..8];
    let payload_hash = sha256_hex(body);
    let insert = |h: &mut HeaderMap, k: &'static str, v: &str| {
        if let Ok(v) = http::HeaderValue::from_str(v) {
            h.insert(k, v);
        }
    };
    insert(headers, "x-amz-date", &amz_date);
    insert(headers, "x-amz-content-sha256", &payload_hash);
    let mut signed: Vec<String> = headers
        .keys()
        .map(|k| k.as_str().to_string())
        .filter(|k| k == "host" || k.starts_with("x-amz-") || k == "content-type")
        .collect();
    signed.sort();
    signed.dedup();
    let creq = canonical_request(&CanonicalInput {
        method,
        raw_path,
        raw_query,
        headers,
        signed_headers: &signed,
        payload_hash: &payload_hash,
        presigned: false,
    });
    let scope = format!("{date}/{region}/s3/aws4_request");
    let key = derive_signing_key(secret, date, region, "s3");
    let sig = sign_hex(&key, &string_to_sign(&amz_date, &scope, &creq));
    insert(
        headers,
        "authorization",
        &format!(
            "{ALGORITHM} Credential={access_key}/{scope}, SignedHeaders={}, Signature={sig}",
            signed.join(";")
        ),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GET-object example from the AWS SigV4 documentation for S3.
    #[test]
    fn aws_documented_get_object_example() {
        let mut h = HeaderMap::new();
        h.insert("host", "examplebucket.s3.amazonaws.com".parse().unwrap());
        h.insert("range", "bytes=0-9".parse().unwrap());
        h.insert("x-amz-content-sha256", EMPTY_SHA256.parse().unwrap());
        h.insert("x-amz-date", "20130524T000000Z".parse().unwrap());
        let signed: Vec<String> = ["host", "range", "x-amz-content-sha256", "x-amz-date"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let creq = canonical_request(&CanonicalInput {
            method: "GET",
            raw_path: "/test.txt",
            raw_query: "",
            headers: &h,
            signed_headers: &signed,
            payload_hash: EMPTY_SHA256,
            presigned: false,
        });
        let key = derive_signing_key(
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "20130524",
            "us-east-1",
            "s3",
        );
        let sts = string_to_sign(
            "20130524T000000Z",
            "20130524/us-east-1/s3/aws4_request",
            &creq,
        );
        assert_eq!(
            sign_hex(&key, &sts),
            "f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41"
        );
    }

    /// The first chunk signature of the AWS streaming-upload example.
    #[test]
    fn aws_documented_chunk_signature() {
        let key = derive_signing_key(
            "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
            "20130524",
            "us-east-1",
            "s3",
        );
        let chunk = vec![b'a'; 65536];
        let sig = chunk_signature(
            &key,
            "20130524T000000Z",
            "20130524/us-east-1/s3/aws4_request",
            "4f232c4386841ef735655705268965c44a0e4690baa4adea153f7db9fa80a0a9",
            &sha256_hex(&chunk),
        );
        assert_eq!(
            sig,
            "ad80c730a21e5b8d04586a2213dd63b9a0e99e0e2307b0ade35a65485a288648"
        );
    }

    #[test]
    fn uri_encoding_rules() {
        assert_eq!(uri_encode("a b/c~d".as_bytes(), true), "a%20b/c~d");
        assert_eq!(uri_encode("a b/c".as_bytes(), false), "a%20b%2Fc");
        assert_eq!(uri_encode("é".as_bytes(), true), "%C3%A9");
        assert_eq!(
            canonical_query("b=2&a=1&prefix=x%2Fy", false),
            "a=1&b=2&prefix=x%2Fy"
        );
    }

    /// The canonical request's fast paths (a path without escapes, a header value without a
    /// run of spaces) give what the general ones give.
    #[test]
    fn canonical_forms_with_and_without_the_fast_paths() {
        let mut h = HeaderMap::new();
        h.insert("host", "h".parse().unwrap());
        h.insert("x-amz-meta-a", "  one   two  three ".parse().unwrap());
        h.append("x-amz-meta-b", " x ".parse().unwrap());
        h.append("x-amz-meta-b", "y  z".parse().unwrap());
        assert_eq!(canonical_header_value(&h, "x-amz-meta-a"), "one two three");
        assert_eq!(canonical_header_value(&h, "x-amz-meta-b"), "x,y z");
        let signed: Vec<String> = ["host", "x-amz-meta-a"].map(String::from).to_vec();
        let creq = |raw_path| {
            canonical_request(&CanonicalInput {
                method: "PUT",
                raw_path,
                raw_query: "",
                headers: &h,
                signed_headers: &signed,
                payload_hash: "p",
                presigned: false,
            })
        };
        let want = "PUT\n/b/a%20b~c\n\nhost:h\nx-amz-meta-a:one two three\n\nhost;x-amz-meta-a\np";
        assert_eq!(creq("/b/a%20b~c"), want);
        assert_eq!(
            creq("/b/a%20b%7Ec"),
            want,
            "escapes decoded, then encoded again"
        );
        assert_eq!(creq("/b/a b~c"), want, "a raw space is encoded");
    }

    #[test]
    fn time_checks() {
        let claim = |d: &str, exp: Option<i64>| SignatureClaim {
            access_key: String::new(),
            date: d[..8].to_string(),
            region: String::new(),
            service: String::new(),
            signed_headers: vec![],
            signature: String::new(),
            amz_date: d.to_string(),
            presigned_expires_secs: exp,
        };
        let t = parse_amz_date("20240101T000000Z").unwrap();
        assert!(check_time(&claim("20240101T000000Z", None), t + 60).is_ok());
        assert!(check_time(&claim("20240101T000000Z", None), t + 3600).is_err());
        assert!(check_time(&claim("20240101T000000Z", Some(10)), t + 5).is_ok());
        assert!(check_time(&claim("20240101T000000Z", Some(10)), t + 11).is_err());
    }

    #[test]
    fn amz_dates_parse_as_chrono_parses_them() {
        let chrono = |s: &str| {
            chrono::NaiveDateTime::parse_from_str(s, "%Y%m%dT%H%M%SZ")
                .ok()
                .map(|d| d.and_utc().timestamp())
        };
        for s in [
            "20240101T000000Z",
            "20241231T235959Z",
            "20240229T120000Z",
            "20230229T120000Z",
            "20241301T000000Z",
            "20240132T000000Z",
            "20240101T240000Z",
            "20240101T006000Z",
            "20240101T235960Z",
            "20240101T120060Z",
            "20240101T120061Z",
            "2024010lT000000Z",
            "20240101 000000Z",
            "20240101T000000",
            "20240101T000000ZZ",
            "+2024101T000000Z",
            "",
        ] {
            assert_eq!(parse_amz_date(s), chrono(s), "{s:?}");
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(1024))]
        /// Any 16 characters of the date's alphabet parse exactly as chrono's own parser does.
        #[test]
        fn amz_date_parser_agrees_with_chrono(s in "[0-9]{8}T[0-9]{6}Z|[0-9TZ+ -]{14,17}") {
            let chrono = chrono::NaiveDateTime::parse_from_str(&s, "%Y%m%dT%H%M%SZ")
                .ok()
                .map(|d| d.and_utc().timestamp());
            proptest::prop_assert_eq!(parse_amz_date(&s), chrono);
        }

        /// Authorization headers, presigned queries, query strings and dates of any shape are
        /// refused or parsed, never a panic.
        #[test]
        fn auth_parsers_never_panic(
            value in "\\PC{0,300}",
            raw_query in "[a-zA-Z0-9%=&-_.~/+ ]{0,200}",
            pairs in proptest::collection::vec(("X-Amz-[A-Za-z]{0,12}|\\PC{0,10}", "\\PC{0,80}"), 0..8),
        ) {
            let _ = parse_authorization(&value, &HeaderMap::new());
            let _ = parse_authorization(&format!("AWS4-HMAC-SHA256 {value}"), &HeaderMap::new());
            let _ = parse_presigned(&pairs);
            let _ = parse_query(&raw_query);
            let _ = canonical_query(&raw_query, true);
            let _ = parse_amz_date(&value);
            let _ = percent_decode(&value);
        }
    }
}
