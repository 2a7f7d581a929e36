//! Request routing and query parsing: bucket and key from any path and Host, with and without a
//! virtual-host domain; the query string parsed as the server parses it. An S3 error or a
//! route, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::{route, sigv4};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (host, rest) = text.split_once('\n').unwrap_or(("", text));
    let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(host) {
        headers.insert("host", v);
    }
    for domain in [None, Some("s3.example.test")] {
        if let Ok((bucket, key)) = route::split_target(domain, &headers, path)
            && key.is_some()
        {
            assert!(bucket.is_some());
        }
    }
    let _ = sigv4::parse_query(query);
});
