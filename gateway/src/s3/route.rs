//! Request routing: which bucket and key a request names, from its path (path style) or its
//! Host (virtual-host style under `--domain`). Pure, fuzzed (`fuzz/fuzz_targets/routing.rs`).

use super::error::{S3Error, S3ErrorCode, S3Result};
use super::sigv4;
use http::HeaderMap;

/// Splits the target into bucket and key (path style, or virtual-host style when a domain is
/// configured and the Host names a bucket under it).
pub fn split_target(
    domain: Option<&str>,
    headers: &HeaderMap,
    raw_path: &str,
) -> S3Result<(Option<String>, Option<String>)> {
    let decode = |s: &str| -> S3Result<String> {
        String::from_utf8(sigv4::percent_decode(s)).map_err(|_| {
            S3Error::new(
                S3ErrorCode::InvalidArgument,
                "The object key is not valid UTF-8",
            )
        })
    };
    let path = raw_path.strip_prefix('/').unwrap_or(raw_path);
    if let Some(domain) = domain {
        let host = headers
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("");
        let host = host.rsplit_once(':').map_or(host, |(h, _)| h);
        if let Some(bucket) = host.strip_suffix(&format!(".{domain}")) {
            let key = (!path.is_empty()).then(|| decode(path)).transpose()?;
            return Ok((Some(bucket.to_string()), key));
        }
    }
    if path.is_empty() {
        return Ok((None, None));
    }
    let (b, k) = path.split_once('/').unwrap_or((path, ""));
    let bucket = decode(b)?;
    let key = (!k.is_empty()).then(|| decode(k)).transpose()?;
    Ok((Some(bucket), key))
}
