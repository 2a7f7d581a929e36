//! SigV4 Authorization headers, presigned queries, query strings and dates, with a real header
//! map: the first line is the Authorization value (and a query string), the rest are headers.
//! Parsed claims go on to the time check and the canonical request they name. An S3 error or a
//! parsed claim, never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::sigv4;

/// 2013-05-24T00:00:00Z, the date of AWS's documented examples.
const NOW_SECS: i64 = 1_369_353_600;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    let headers = packrat_fuzz::header_map(rest);
    let query = sigv4::parse_query(first);
    for claim in [
        sigv4::parse_authorization(first, &headers),
        sigv4::parse_presigned(&query),
    ]
    .into_iter()
    .flatten()
    {
        // A credential is split on '/' into exactly five parts: the scope has four.
        assert_eq!(claim.scope().split('/').count(), 4);
        let _ = sigv4::check_time(&claim, NOW_SECS);
        let creq = sigv4::canonical_request(&sigv4::CanonicalInput {
            method: "GET",
            raw_path: first,
            raw_query: first,
            headers: &headers,
            signed_headers: &claim.signed_headers,
            payload_hash: sigv4::UNSIGNED_PAYLOAD,
            presigned: claim.presigned_expires_secs.is_some(),
        });
        let _ = sigv4::string_to_sign(&claim.amz_date, &claim.scope(), &creq);
    }
    let _ = sigv4::sigv2_string_to_sign("GET", first, &query, &headers, "0");
    let _ = sigv4::parse_amz_date(first);
    let _ = sigv4::percent_decode(first);
    let _ = sigv4::uri_encode(data, true);
});
