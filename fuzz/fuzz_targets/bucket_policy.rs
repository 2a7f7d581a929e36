//! Bucket policies (PutBucketPolicy bodies): MalformedPolicy or a parsed policy, never a panic.
//! A policy that parses is evaluated for requests shaped by the input's first line (caller,
//! action, key, address, listing parameters), anonymous and signed, over http and https, which
//! must not panic either (wildcards, CIDR parsing and numeric conditions on any text; header and
//! tag conditions with the tags known and not).
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::policy::{self, RequestContext};
use packrat_store_api::Identity;

fuzz_target!(|data: &[u8]| {
    // The first line is the request's shape; the rest is the policy.
    let split = data.iter().position(|&b| b == b'\n').unwrap_or(0);
    let (shape, doc) = data.split_at(split);
    let Ok(p) = policy::parse(doc, "fuzz-bucket") else {
        return;
    };
    let shape = String::from_utf8_lossy(shape);
    let mut parts = shape.split('|');
    let mut next = || parts.next().unwrap_or("").to_string();
    let (name, action, key, ip, prefix) = (next(), next(), next(), next(), next());
    let who = Identity {
        access_key: "AK".into(),
        secret_key: "SK".into(),
        name: name.clone(),
        owner_id: name,
        is_root: false,
    };
    let resource = format!("arn:aws:s3:::fuzz-bucket/{key}");
    let mut headers = http::HeaderMap::new();
    if let Ok(v) = http::HeaderValue::from_str(&prefix) {
        headers.insert("x-amz-acl", v.clone());
        headers.insert("x-amz-server-side-encryption", v);
    }
    let tags = vec![(key.clone(), prefix.clone()), ("share".to_string(), key.clone())];
    for (principal, known) in [(None, None), (Some(&who), Some(&tags[..])), (None, Some(&tags[..1]))] {
        for secure in [false, true] {
            let ctx = RequestContext {
                principal,
                action: &action,
                resource: &resource,
                source_ip: ip.parse().ok(),
                secure_transport: secure,
                user_agent: Some(&key),
                referer: None,
                prefix: Some(&prefix),
                delimiter: Some("/"),
                max_keys: Some(&prefix),
                headers: Some(&headers),
                request_tags: known,
                existing_tags: known,
            };
            let _ = p.evaluate(&ctx);
        }
    }
});
