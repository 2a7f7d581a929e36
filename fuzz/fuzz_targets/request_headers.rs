//! The request headers an operation reads, from a header map the fuzzer writes (`name: value`
//! lines): object metadata and stored headers, `x-amz-tagging`, flexible checksums and
//! Content-MD5, write conditions, read conditions against an object, `x-amz-copy-source` and
//! its conditions. An S3 error or a parsed value, never a panic.
//!
//! - Accepted tags obey S3's rules (the validator passes on them again).
//! - An accepted checksum value has its algorithm's width; Content-MD5 is 16 bytes.
//! - Without condition headers a read goes ahead.
//! - Each parser answers the same whether it looks its headers up only when their kind is
//!   present (as requests are served) or always.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::headers;
use packrat_gateway::s3::tagging;

const ETAG: &str = "9b2cf535f27731c974343645a3985328";
/// 2013-05-24T00:00:00Z.
const LAST_MODIFIED_SECS: i64 = 1_369_353_600;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let map = packrat_fuzz::header_map(text);
    let all = headers::RequestHeaders::unscanned(map.clone());
    let h = headers::RequestHeaders::new(map);
    let meta = |h: &headers::RequestHeaders| {
        headers::object_meta(h, &|c| c == "COLD").map(|m| {
            let attrs = m.into_attrs(0);
            format!("{attrs:?}")
        })
    };
    assert_eq!(format!("{:?}", meta(&h)), format!("{:?}", meta(&all)));
    assert_eq!(
        format!("{:?}", headers::requested_checksum(&h)),
        format!("{:?}", headers::requested_checksum(&all))
    );
    assert_eq!(
        format!("{:?}", headers::content_md5(&h)),
        format!("{:?}", headers::content_md5(&all))
    );
    assert_eq!(
        format!("{:?}", headers::write_condition(&h)),
        format!("{:?}", headers::write_condition(&all))
    );
    assert_eq!(
        headers::read_conditions(&h, ETAG, LAST_MODIFIED_SECS),
        headers::read_conditions(&all, ETAG, LAST_MODIFIED_SECS)
    );
    assert_eq!(
        headers::copy_source_conditions_hold(&h, ETAG, LAST_MODIFIED_SECS),
        headers::copy_source_conditions_hold(&all, ETAG, LAST_MODIFIED_SECS)
    );
    assert_eq!(
        format!("{:?}", headers::refuse_object_acl(&h)),
        format!("{:?}", headers::refuse_object_acl(&all))
    );
    assert_eq!(
        format!("{:?}", packrat_gateway::s3::sse::requested_in(&h, true)),
        format!("{:?}", packrat_gateway::s3::sse::requested_in(&all, true))
    );
    if let Ok(meta) = headers::object_meta(&h, &|c| c == "COLD") {
        tagging::validate(&meta.tags).expect("accepted tags obey S3's rules");
        assert!(meta.storage_class.is_none_or(|c| c == "COLD"));
    }
    if let Ok((alg, sent)) = headers::requested_checksum(&h)
        && let (Some(alg), Some(sent)) = (alg, sent)
    {
        assert_eq!(sent.len(), alg.width());
    }
    if let Ok(Some(md5)) = headers::content_md5(&h) {
        assert_eq!(md5.len(), 16);
    }
    let _ = headers::write_condition(&h);
    let read = headers::read_conditions(&h, ETAG, LAST_MODIFIED_SECS);
    let conditional = [
        "if-match",
        "if-none-match",
        "if-modified-since",
        "if-unmodified-since",
    ]
    .iter()
    .any(|n| h.contains_key(*n));
    if !conditional {
        assert_eq!(read, Ok(()));
    }
    if let Some(v) = h.get("x-amz-copy-source").and_then(|v| v.to_str().ok())
        && let Ok((bucket, key, version)) = headers::copy_source(v)
    {
        assert!(!bucket.is_empty() && !key.is_empty() && !bucket.contains('/'));
        assert!(version.is_none_or(|v| !v.is_empty()));
    }
    let _ = headers::copy_source_conditions_hold(&h, ETAG, LAST_MODIFIED_SECS);
    if let Some(v) = h.get("x-amz-tagging").and_then(|v| v.to_str().ok()) {
        let _ = tagging::parse_header(v);
    }
    for line in text.lines() {
        let _ = headers::parse_http_date(line);
        let _ = tagging::parse_header(line);
        let _ = headers::copy_source(line);
    }
});
