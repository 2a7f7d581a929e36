//! Authentication as the server runs it (`s3::auth::authenticate`), on requests the fuzzer
//! shapes: any method, path, query and headers, signed as a client signs them (SigV4 header,
//! SigV4 presigned URL, SigV2 presigned URL), then optionally tampered with.
//!
//! - A request signed with the right key is accepted, as the key's owner.
//! - A changed signature, path or query parameter is refused with SignatureDoesNotMatch.
//! - SigV2 with a parameter of a packrat extension is refused with AccessDenied.
//! - Whatever else, an S3 error or an identity, never a panic.
#![no_main]

use http::{HeaderMap, HeaderValue, Method};
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::auth::{AuthContext, EXTENSION_PARAMS, authenticate};
use packrat_gateway::s3::error::{S3ErrorCode, S3Result};
use packrat_gateway::s3::sigv4::{self, SigningKeyCache};
use packrat_store_api::Identity;

const ACCESS_KEY: &str = "AKIDFUZZ";
const SECRET: &str = "fuzz/secret+key";
const REGION: &str = "us-east-1";
/// 2013-05-24T00:00:00Z.
const NOW_SECS: i64 = 1_369_353_600;

#[derive(Clone, Copy, PartialEq)]
enum Scheme {
    Header,
    Presigned,
    SigV2,
}

#[derive(Clone, Copy, PartialEq)]
enum Tamper {
    None,
    Signature,
    Path,
    Query,
}

fn identity(ak: &str) -> S3Result<Option<Identity>> {
    Ok((ak == ACCESS_KEY).then(|| Identity {
        access_key: ACCESS_KEY.into(),
        secret_key: SECRET.into(),
        name: "fuzz".into(),
        owner_id: "fuzz".into(),
        is_root: false,
    }))
}

/// Query keys that choose the auth scheme are the signer's, not the fuzzer's.
fn reserved(k: &str) -> bool {
    k.starts_with("X-Amz-") || matches!(k, "AWSAccessKeyId" | "Signature" | "Expires")
}

fn encode_pairs(pairs: &[(String, String)]) -> String {
    pairs
        .iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                sigv4::uri_encode(k.as_bytes(), false),
                sigv4::uri_encode(v.as_bytes(), false)
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn flip_signature(sig: &str) -> String {
    let mut b = sig.as_bytes().to_vec();
    b[0] = if b[0] == b'a' { b'b' } else { b'a' };
    String::from_utf8(b).expect("signatures are ASCII")
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let scheme = *u.choose(&[Scheme::Header, Scheme::Presigned, Scheme::SigV2])?;
    let tamper = *u.choose(&[Tamper::None, Tamper::Signature, Tamper::Path, Tamper::Query])?;
    let method = u
        .choose(&[
            Method::GET,
            Method::PUT,
            Method::HEAD,
            Method::DELETE,
            Method::POST,
        ])?
        .clone();
    let path = format!("/{}", u.arbitrary::<String>()?);
    let mut query: Vec<(String, String)> = u.arbitrary()?;
    query.retain(|(k, _)| !k.is_empty() && !reserved(k));
    query.truncate(8);
    // SigV2 would leave an extension's parameters unsigned: such a request is refused whatever
    // its signature.
    let extension = scheme == Scheme::SigV2
        && query
            .iter()
            .any(|(k, _)| EXTENSION_PARAMS.contains(&k.as_str()));
    let mut headers = HeaderMap::new();
    headers.insert("host", HeaderValue::from_static("127.0.0.1:9000"));
    for _ in 0..u.int_in_range(0..=5)? {
        let name = *u.choose(&[
            "content-type",
            "content-md5",
            "x-amz-meta-a",
            "x-amz-meta-b",
            "x-amz-tagging",
            "x-amz-copy-source",
            "range",
        ])?;
        if let Ok(v) = HeaderValue::from_str(&u.arbitrary::<String>()?) {
            headers.append(name, v);
        }
    }
    let now = chrono::DateTime::from_timestamp(NOW_SECS + u.int_in_range(-60..=60)?, 0)
        .expect("a date in range");
    let amz_date = now.format("%Y%m%dT%H%M%SZ").to_string();
    let (raw_query, signature) = match scheme {
        Scheme::Header => {
            sigv4::sign_request(
                method.as_str(),
                &path,
                &encode_pairs(&query),
                &mut headers,
                b"",
                &sigv4::Signer {
                    access_key: ACCESS_KEY,
                    secret: SECRET,
                    region: REGION,
                },
                now,
            );
            let auth = headers["authorization"]
                .to_str()
                .expect("ASCII")
                .to_string();
            let sig = auth
                .rsplit_once("Signature=")
                .expect("signed")
                .1
                .to_string();
            if tamper == Tamper::Signature {
                let forged = auth.replace(&sig, &flip_signature(&sig));
                headers.insert(
                    "authorization",
                    HeaderValue::from_str(&forged).expect("ASCII"),
                );
            }
            (encode_pairs(&query), sig)
        }
        Scheme::Presigned => {
            let date = &amz_date[..8];
            let mut signed = query.clone();
            signed.extend([
                ("X-Amz-Algorithm".into(), sigv4::ALGORITHM.into()),
                (
                    "X-Amz-Credential".into(),
                    format!("{ACCESS_KEY}/{date}/{REGION}/s3/aws4_request"),
                ),
                ("X-Amz-Date".into(), amz_date.clone()),
                (
                    "X-Amz-Expires".into(),
                    u.int_in_range(61..=604_800u32)?.to_string(),
                ),
                ("X-Amz-SignedHeaders".into(), "host".into()),
            ]);
            let raw = encode_pairs(&signed);
            let creq = sigv4::canonical_request(&sigv4::CanonicalInput {
                method: method.as_str(),
                raw_path: &path,
                raw_query: &raw,
                headers: &headers,
                signed_headers: &["host".to_string()],
                payload_hash: sigv4::UNSIGNED_PAYLOAD,
                presigned: true,
            });
            let scope = format!("{date}/{REGION}/s3/aws4_request");
            let key = sigv4::derive_signing_key(SECRET, date, REGION, "s3");
            let sig = sigv4::sign_hex(&key, &sigv4::string_to_sign(&amz_date, &scope, &creq));
            let sent = match tamper {
                Tamper::Signature => flip_signature(&sig),
                _ => sig.clone(),
            };
            (format!("{raw}&X-Amz-Signature={sent}"), sig)
        }
        Scheme::SigV2 => {
            let expires = (NOW_SECS + u.int_in_range(1..=86_400)?).to_string();
            let mut signed = query.clone();
            signed.push(("AWSAccessKeyId".into(), ACCESS_KEY.into()));
            signed.push(("Expires".into(), expires.clone()));
            let sts =
                sigv4::sigv2_string_to_sign(method.as_str(), &path, &signed, &headers, &expires);
            let sig = sigv4::sigv2_signature(SECRET, &sts);
            let sent = match tamper {
                Tamper::Signature => flip_signature(&sig),
                _ => sig.clone(),
            };
            signed.push(("Signature".into(), sent));
            (encode_pairs(&signed), sig)
        }
    };
    let (path, raw_query) = match tamper {
        Tamper::Path => (format!("{path}x"), raw_query),
        // SigV2 signs only AWS's sub-resources: `acl` is one, so adding it changes what is signed.
        Tamper::Query => (path, format!("{raw_query}&acl=")),
        _ => (path, raw_query),
    };
    let parsed = sigv4::parse_query(&raw_query);
    let keys = SigningKeyCache::default();
    let ctx = AuthContext {
        now_secs: NOW_SECS,
        region: REGION,
        signing_keys: &keys,
        access_key: &identity,
    };
    let got = authenticate(&ctx, &method, &path, &raw_query, &parsed, &headers);
    if extension {
        let e = got
            .err()
            .expect("SigV2 with an extension parameter was accepted");
        assert_eq!(e.code, S3ErrorCode::AccessDenied, "{e:?}");
        return Ok(());
    }
    match tamper {
        Tamper::None => {
            let (who, _, _) = got.unwrap_or_else(|e| {
                panic!("a correctly signed request was refused: {e:?} (signature {signature})")
            });
            assert_eq!(who.expect("signed, not anonymous").access_key, ACCESS_KEY);
        }
        _ => match got {
            Err(e) => assert_eq!(e.code, S3ErrorCode::SignatureDoesNotMatch, "{e:?}"),
            Ok(_) => panic!("a tampered request was accepted"),
        },
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
