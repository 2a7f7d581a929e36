//! SigV4 Authorization headers, presigned queries, query strings and dates: an S3 error or a
//! parsed claim, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::sigv4;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let headers = http::HeaderMap::new();
    let _ = sigv4::parse_authorization(text, &headers);
    let query = sigv4::parse_query(text);
    let _ = sigv4::parse_presigned(&query);
    let _ = sigv4::parse_amz_date(text);
    let _ = sigv4::percent_decode(text);
    let _ = sigv4::uri_encode(data, true);
});
