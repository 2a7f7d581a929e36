//! The Rust AWS SDK against the real `packrat` binary: buckets, objects with the SDK's default
//! checksums, ranges, listings, copies, batch deletes, a multipart upload, object tags and
//! bucket configurations (tagging, CORS, policies).

use aws_sdk_s3::Client;
use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{
    ChecksumAlgorithm, ChecksumMode, CompletedMultipartUpload, CompletedPart, Delete,
    ObjectIdentifier, Tag, Tagging,
};
use md5::{Digest, Md5};
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const AK: &str = "PKRUSTSDKROOT";
const SK: &str = "rust-sdk-root-secret-0123456789";

struct Server {
    child: Child,
    endpoint: String,
    _dir: PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self._dir);
    }
}

fn binary() -> PathBuf {
    if let Ok(p) = std::env::var("PACKRAT_BIN") {
        return p.into();
    }
    let target = option_env!("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    target.join("debug").join("packrat")
}

fn start() -> Server {
    start_with(false)
}

/// A server, with (`tier`) a directory tier for STANDARD_IA inside its data directory.
fn start_with(tier: bool) -> Server {
    let dir = std::env::temp_dir().join(format!("packrat-sdk-{}", rand::random::<u64>()));
    let bin = binary();
    let mut cmd = Command::new(&bin);
    cmd.args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(&dir);
    if tier {
        cmd.arg("--tier")
            .arg(format!("STANDARD_IA=dir:{}", dir.join("hdd").display()));
    }
    let mut child = cmd
        .env("PACKRAT_ROOT_ACCESS_KEY", AK)
        .env("PACKRAT_ROOT_SECRET_KEY", SK)
        .env("PACKRAT_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start {} (run `cargo build` first): {e}",
                bin.display()
            )
        });
    let stdout = child.stdout.take().expect("piped stdout");
    let mut endpoint = None;
    for line in BufReader::new(stdout).lines() {
        let line = line.expect("server stdout");
        if let Some(ep) = line.split("listening on ").nth(1) {
            endpoint = Some(ep.trim().to_string());
            break;
        }
    }
    Server {
        child,
        endpoint: endpoint.expect("server printed its address"),
        _dir: dir,
    }
}

fn client(endpoint: &str) -> Client {
    let conf = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .endpoint_url(endpoint)
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(AK, SK, None, None, "packrat-tests"))
        .force_path_style(true)
        .http_client(aws_smithy_http_client::Builder::new().build_http())
        .build();
    Client::from_conf(conf)
}

fn md5_hex(b: &[u8]) -> String {
    hex::encode(Md5::digest(b))
}

/// Bytes `a..=z` of an object.
async fn get_range(s3: &Client, bucket: &str, key: &str, a: usize, z: usize) -> Vec<u8> {
    s3.get_object()
        .bucket(bucket)
        .key(key)
        .range(format!("bytes={a}-{z}"))
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .to_vec()
}

/// Uploads `parts` as parts 1, 2, ... of upload `uid` and completes it: the parts' ETags and
/// the object's.
async fn upload_parts(
    s3: &Client,
    bucket: &str,
    key: &str,
    uid: &str,
    parts: &[&[u8]],
) -> (Vec<String>, String) {
    let mut done = Vec::new();
    for (i, p) in parts.iter().enumerate() {
        let n = i as i32 + 1;
        let r = s3
            .upload_part()
            .bucket(bucket)
            .key(key)
            .upload_id(uid)
            .part_number(n)
            .body(ByteStream::from(p.to_vec()))
            .send()
            .await
            .unwrap();
        done.push(
            CompletedPart::builder()
                .part_number(n)
                .e_tag(r.e_tag().unwrap())
                .build(),
        );
    }
    let etags = done
        .iter()
        .map(|p| p.e_tag().unwrap().to_string())
        .collect();
    let complete = s3
        .complete_multipart_upload()
        .bucket(bucket)
        .key(key)
        .upload_id(uid)
        .multipart_upload(
            CompletedMultipartUpload::builder()
                .set_parts(Some(done))
                .build(),
        )
        .send()
        .await
        .unwrap();
    (etags, complete.e_tag().unwrap().to_string())
}

#[tokio::test]
async fn rust_sdk_end_to_end() {
    let server = start();
    let s3 = client(&server.endpoint);
    s3.create_bucket().bucket("rust-sdk").send().await.unwrap();
    let names: Vec<String> = s3
        .list_buckets()
        .send()
        .await
        .unwrap()
        .buckets()
        .iter()
        .filter_map(|b| b.name().map(str::to_string))
        .collect();
    assert_eq!(names, vec!["rust-sdk".to_string()]);

    // Small objects with the SDK's default checksum behaviour, then explicit CRC32C.
    let body: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    let put = s3
        .put_object()
        .bucket("rust-sdk")
        .key("dir/a b+c.bin")
        .body(ByteStream::from(body.clone()))
        .content_type("application/x-test")
        .metadata("origin", "rust")
        .send()
        .await
        .unwrap();
    assert_eq!(
        put.e_tag(),
        Some(format!("\"{}\"", md5_hex(&body)).as_str())
    );
    let put = s3
        .put_object()
        .bucket("rust-sdk")
        .key("crc32c")
        .checksum_algorithm(ChecksumAlgorithm::Crc32C)
        .body(ByteStream::from(body.clone()))
        .send()
        .await
        .unwrap();
    let crc = put.checksum_crc32_c().expect("CRC32C echoed").to_string();
    let got = s3
        .get_object()
        .bucket("rust-sdk")
        .key("crc32c")
        .checksum_mode(ChecksumMode::Enabled)
        .send()
        .await
        .unwrap();
    assert_eq!(got.checksum_crc32_c(), Some(crc.as_str()));
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().as_ref(),
        &body[..]
    );

    let got = s3
        .get_object()
        .bucket("rust-sdk")
        .key("dir/a b+c.bin")
        .send()
        .await
        .unwrap();
    assert_eq!(got.content_type(), Some("application/x-test"));
    assert_eq!(
        got.metadata()
            .and_then(|m| m.get("origin"))
            .map(String::as_str),
        Some("rust")
    );
    assert_eq!(
        got.body.collect().await.unwrap().into_bytes().as_ref(),
        &body[..]
    );

    let ranged = s3
        .get_object()
        .bucket("rust-sdk")
        .key("dir/a b+c.bin")
        .range("bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(ranged.content_range(), Some("bytes 10-19/100000"));
    assert_eq!(
        ranged.body.collect().await.unwrap().into_bytes().as_ref(),
        &body[10..20]
    );

    let listed = s3
        .list_objects_v2()
        .bucket("rust-sdk")
        .prefix("dir/")
        .send()
        .await
        .unwrap();
    let keys: Vec<&str> = listed.contents().iter().filter_map(|o| o.key()).collect();
    assert_eq!(keys, vec!["dir/a b+c.bin"]);

    s3.copy_object()
        .bucket("rust-sdk")
        .key("copied")
        .copy_source("rust-sdk/dir/a%20b%2Bc.bin")
        .send()
        .await
        .unwrap();
    let head = s3
        .head_object()
        .bucket("rust-sdk")
        .key("copied")
        .send()
        .await
        .unwrap();
    assert_eq!(head.content_length(), Some(100_000));

    // Multipart: two parts, the first at the 5 MiB minimum.
    let part1 = vec![7u8; 5 * 1024 * 1024];
    let part2 = vec![9u8; 1234];
    let up = s3
        .create_multipart_upload()
        .bucket("rust-sdk")
        .key("mp")
        .send()
        .await
        .unwrap();
    let uid = up.upload_id().unwrap().to_string();
    let (_, etag) = upload_parts(&s3, "rust-sdk", "mp", &uid, &[&part1, &part2]).await;
    let mut md5s = Md5::digest(&part1).to_vec();
    md5s.extend_from_slice(&Md5::digest(&part2));
    assert_eq!(etag, format!("\"{}-2\"", md5_hex(&md5s)));
    let whole = s3
        .get_object()
        .bucket("rust-sdk")
        .key("mp")
        .send()
        .await
        .unwrap()
        .body
        .collect()
        .await
        .unwrap()
        .into_bytes();
    assert_eq!(whole.len(), part1.len() + part2.len());
    assert_eq!(&whole[..part1.len()], &part1[..]);
    assert_eq!(&whole[part1.len()..], &part2[..]);

    // Errors come back typed.
    let err = s3
        .get_object()
        .bucket("rust-sdk")
        .key("missing")
        .send()
        .await
        .unwrap_err();
    assert!(err.into_service_error().is_no_such_key());

    let ids: Vec<ObjectIdentifier> = ["dir/a b+c.bin", "crc32c", "copied", "mp"]
        .iter()
        .map(|k| ObjectIdentifier::builder().key(*k).build().unwrap())
        .collect();
    let del = s3
        .delete_objects()
        .bucket("rust-sdk")
        .delete(Delete::builder().set_objects(Some(ids)).build().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(del.deleted().len(), 4);
    s3.delete_bucket().bucket("rust-sdk").send().await.unwrap();
}

/// Sends one signed request over a fresh connection and returns (status, body), decoding a
/// chunked body.
fn send_raw(endpoint: &str, req: http::Request<Vec<u8>>) -> (u16, Vec<u8>) {
    use std::io::{Read, Write};
    let addr = endpoint.trim_start_matches("http://");
    let mut s = std::net::TcpStream::connect(addr).expect("connect");
    let mut head = format!(
        "{} {} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        req.method(),
        req.uri()
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/"),
        req.body().len()
    );
    for (k, v) in req.headers() {
        if k != "host" {
            head.push_str(&format!("{k}: {}\r\n", v.to_str().unwrap()));
        }
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(req.body()).unwrap();
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).unwrap();
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
    let head = String::from_utf8_lossy(&raw[..split]).to_lowercase();
    let status: u16 = head[9..12].parse().unwrap();
    let mut body = raw[split + 4..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        let mut out = Vec::new();
        let mut rest = &body[..];
        loop {
            let eol = rest.windows(2).position(|w| w == b"\r\n").unwrap();
            let n = usize::from_str_radix(std::str::from_utf8(&rest[..eol]).unwrap().trim(), 16)
                .unwrap();
            if n == 0 {
                break;
            }
            out.extend_from_slice(&rest[eol + 2..eol + 2 + n]);
            rest = &rest[eol + 2 + n + 2..];
        }
        body = out;
    }
    (status, body)
}

/// (name, data) of the regular files of a TAR, with pax `path` records applied.
fn tar_files(tar: &[u8]) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut at = 0;
    let mut pax_path: Option<String> = None;
    while at + 512 <= tar.len() && tar[at..at + 512].iter().any(|&b| b != 0) {
        let h = &tar[at..at + 512];
        let field = |a: usize, b: usize| {
            let f = &h[a..b];
            let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
            String::from_utf8_lossy(&f[..end]).into_owned()
        };
        let size = u64::from_str_radix(field(124, 136).trim(), 8).unwrap() as usize;
        let data = &tar[at + 512..at + 512 + size];
        match h[156] {
            b'x' => {
                let text = String::from_utf8_lossy(data);
                pax_path = text
                    .lines()
                    .find_map(|l| l.split_once(" path=").map(|(_, p)| p.to_string()));
            }
            _ => out.push((
                pax_path.take().unwrap_or_else(|| field(0, 100)),
                data.to_vec(),
            )),
        }
        at += 512 + size.div_ceil(512) * 512;
    }
    out
}

#[tokio::test]
async fn packrat_batch_get_from_rust() {
    use aws_sigv4::http_request::{
        PayloadChecksumKind, SignableBody, SignableRequest, SigningSettings, sign,
    };
    use aws_smithy_runtime_api::client::identity::Identity;
    let server = start();
    let s3 = client(&server.endpoint);
    s3.create_bucket().bucket("rustbatch").send().await.unwrap();
    let mut want = Vec::new();
    for i in 0..5 {
        let data: Vec<u8> = (0..1000 + i * 777).map(|j| (j * 7 + i) as u8).collect();
        let key = format!("train/{i:03}.bin");
        s3.put_object()
            .bucket("rustbatch")
            .key(&key)
            .body(ByteStream::from(data.clone()))
            .send()
            .await
            .unwrap();
        want.push((key, data));
    }
    let items: Vec<String> = want
        .iter()
        .map(|(k, _)| format!("{{\"key\":\"{k}\"}}"))
        .collect();
    let body = format!("{{\"items\":[{}]}}", items.join(",")).into_bytes();
    let url = format!("{}/rustbatch?batch", server.endpoint);

    // Sign with the SDK's SigV4 signer, exactly as the SDK signs its own calls.
    let identity: Identity = Credentials::new(AK, SK, None, None, "test").into();
    let mut settings = SigningSettings::default();
    settings.payload_checksum_kind = PayloadChecksumKind::XAmzSha256;
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region("us-east-1")
        .name("s3")
        .time(std::time::SystemTime::now())
        .settings(settings)
        .build()
        .unwrap()
        .into();
    let host = server.endpoint.trim_start_matches("http://").to_string();
    let headers = [
        ("host", host.as_str()),
        ("content-type", "application/json"),
    ];
    let signable = SignableRequest::new(
        "POST",
        &url,
        headers.iter().copied(),
        SignableBody::Bytes(&body),
    )
    .unwrap();
    let (instructions, _) = sign(signable, &params).unwrap().into_parts();
    let mut req = http::Request::builder()
        .method("POST")
        .uri(&url)
        .header("content-type", "application/json")
        .body(body.clone())
        .unwrap();
    instructions.apply_to_request_http1x(&mut req);
    let (status, tar) = send_raw(&server.endpoint, req);
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&tar));
    let files = tar_files(&tar);
    assert_eq!(files, want, "entries in request order, byte for byte");
}

#[tokio::test]
async fn rust_sdk_object_tagging() {
    let server = start();
    let s3 = client(&server.endpoint);
    s3.create_bucket().bucket("rust-tags").send().await.unwrap();
    s3.put_object()
        .bucket("rust-tags")
        .key("k")
        .tagging("split=train&owner=rust%20sdk")
        .body(ByteStream::from_static(b"tagged"))
        .send()
        .await
        .unwrap();
    let tags = |out: &aws_sdk_s3::operation::get_object_tagging::GetObjectTaggingOutput| {
        let mut t: Vec<(String, String)> = out
            .tag_set()
            .iter()
            .map(|t| (t.key().to_string(), t.value().to_string()))
            .collect();
        t.sort();
        t
    };
    let got = s3
        .get_object_tagging()
        .bucket("rust-tags")
        .key("k")
        .send()
        .await
        .unwrap();
    assert_eq!(
        tags(&got),
        vec![
            ("owner".to_string(), "rust sdk".to_string()),
            ("split".to_string(), "train".to_string())
        ]
    );
    let get = s3
        .get_object()
        .bucket("rust-tags")
        .key("k")
        .send()
        .await
        .unwrap();
    assert_eq!(get.tag_count(), Some(2));
    let tag = |k: &str, v: &str| Tag::builder().key(k).value(v).build().unwrap();
    let set = |n: usize| {
        let mut b = Tagging::builder();
        for i in 0..n {
            b = b.tag_set(tag(&format!("k{i}"), "v"));
        }
        b.build().unwrap()
    };
    s3.put_object_tagging()
        .bucket("rust-tags")
        .key("k")
        .tagging(set(3))
        .send()
        .await
        .unwrap();
    let got = s3
        .get_object_tagging()
        .bucket("rust-tags")
        .key("k")
        .send()
        .await
        .unwrap();
    assert_eq!(tags(&got).len(), 3);
    let too_many = s3
        .put_object_tagging()
        .bucket("rust-tags")
        .key("k")
        .tagging(set(11))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        too_many.into_service_error().meta().code(),
        Some("BadRequest")
    );
    s3.delete_object_tagging()
        .bucket("rust-tags")
        .key("k")
        .send()
        .await
        .unwrap();
    let got = s3
        .get_object_tagging()
        .bucket("rust-tags")
        .key("k")
        .send()
        .await
        .unwrap();
    assert!(got.tag_set().is_empty());
}

#[tokio::test]
async fn rust_sdk_bucket_tagging_and_cors() {
    use aws_sdk_s3::types::{CorsConfiguration, CorsRule};
    let server = start();
    let s3 = client(&server.endpoint);
    s3.create_bucket()
        .bucket("rust-bucket-config")
        .send()
        .await
        .unwrap();
    let missing = s3
        .get_bucket_tagging()
        .bucket("rust-bucket-config")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        missing.into_service_error().meta().code(),
        Some("NoSuchTagSet")
    );
    let tagging = Tagging::builder()
        .tag_set(Tag::builder().key("team").value("vision").build().unwrap())
        .build()
        .unwrap();
    s3.put_bucket_tagging()
        .bucket("rust-bucket-config")
        .tagging(tagging)
        .send()
        .await
        .unwrap();
    let got = s3
        .get_bucket_tagging()
        .bucket("rust-bucket-config")
        .send()
        .await
        .unwrap();
    let tags: Vec<(&str, &str)> = got.tag_set().iter().map(|t| (t.key(), t.value())).collect();
    assert_eq!(tags, vec![("team", "vision")]);
    let rule = CorsRule::builder()
        .allowed_origins("https://app.example.com")
        .allowed_methods("GET")
        .allowed_methods("PUT")
        .expose_headers("ETag")
        .max_age_seconds(60)
        .build()
        .unwrap();
    s3.put_bucket_cors()
        .bucket("rust-bucket-config")
        .cors_configuration(
            CorsConfiguration::builder()
                .cors_rules(rule)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let cors = s3
        .get_bucket_cors()
        .bucket("rust-bucket-config")
        .send()
        .await
        .unwrap();
    let r = &cors.cors_rules()[0];
    assert_eq!(r.allowed_origins(), ["https://app.example.com"]);
    assert_eq!(r.allowed_methods(), ["GET", "PUT"]);
    assert_eq!(r.expose_headers(), ["ETag"]);
    assert_eq!(r.max_age_seconds(), Some(60));
    let bad = CorsRule::builder()
        .allowed_origins("*")
        .allowed_methods("PATCH")
        .build()
        .unwrap();
    let refused = s3
        .put_bucket_cors()
        .bucket("rust-bucket-config")
        .cors_configuration(
            CorsConfiguration::builder()
                .cors_rules(bad)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        refused.into_service_error().meta().code(),
        Some("InvalidRequest")
    );
    s3.delete_bucket_cors()
        .bucket("rust-bucket-config")
        .send()
        .await
        .unwrap();
    s3.delete_bucket_tagging()
        .bucket("rust-bucket-config")
        .send()
        .await
        .unwrap();
    let gone = s3
        .get_bucket_cors()
        .bucket("rust-bucket-config")
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        gone.into_service_error().meta().code(),
        Some("NoSuchCORSConfiguration")
    );
}

/// Put/Get/DeleteBucketPolicy through the Rust SDK: the document comes back as put, a
/// malformed one is refused with `MalformedPolicy` (the stored one kept), a policy that
/// grants anyone `s3:GetObject` on a prefix opens exactly that prefix to unsigned requests,
/// and a deleted policy answers `NoSuchBucketPolicy`; an object ACL is refused with
/// `AccessControlListNotSupported`.
#[tokio::test]
async fn rust_sdk_bucket_policy() {
    let server = start();
    let s3 = client(&server.endpoint);
    let b = "rust-policy";
    s3.create_bucket().bucket(b).send().await.unwrap();
    for key in ["pub/a", "priv/b"] {
        s3.put_object()
            .bucket(b)
            .key(key)
            .body(ByteStream::from_static(b"bytes"))
            .send()
            .await
            .unwrap();
    }
    let anonymous = |key: &str| {
        let req = http::Request::get(format!("/{b}/{key}"))
            .body(Vec::new())
            .unwrap();
        send_raw(&server.endpoint, req).0
    };
    assert_eq!(anonymous("pub/a"), 403);
    let missing = s3.get_bucket_policy().bucket(b).send().await.unwrap_err();
    assert_eq!(
        missing.into_service_error().meta().code(),
        Some("NoSuchBucketPolicy")
    );
    let doc = format!(
        r#"{{"Version":"2012-10-17","Statement":[{{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::{b}/pub/*"}}]}}"#
    );
    s3.put_bucket_policy()
        .bucket(b)
        .policy(&doc)
        .send()
        .await
        .unwrap();
    let got = s3.get_bucket_policy().bucket(b).send().await.unwrap();
    assert_eq!(got.policy(), Some(doc.as_str()));
    assert_eq!(anonymous("pub/a"), 200);
    assert_eq!(anonymous("priv/b"), 403);
    let refused = s3
        .put_bucket_policy()
        .bucket(b)
        .policy(r#"{"Statement":[{"Effect":"Allow","Principal":"*","Action":"s3:GetObject","Resource":"arn:aws:s3:::another-bucket/*"}]}"#)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        refused.into_service_error().meta().code(),
        Some("MalformedPolicy")
    );
    assert_eq!(anonymous("pub/a"), 200, "the stored policy is kept");
    s3.delete_bucket_policy().bucket(b).send().await.unwrap();
    assert_eq!(anonymous("pub/a"), 403);
    let gone = s3.get_bucket_policy().bucket(b).send().await.unwrap_err();
    assert_eq!(
        gone.into_service_error().meta().code(),
        Some("NoSuchBucketPolicy")
    );
    // Object ACLs are disabled by default (S3's "bucket owner enforced").
    let refused = s3
        .put_object()
        .bucket(b)
        .key("acl")
        .acl(aws_sdk_s3::types::ObjectCannedAcl::PublicRead)
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        refused.into_service_error().meta().code(),
        Some("AccessControlListNotSupported")
    );
    assert_eq!(anonymous("acl"), 403, "nothing was stored");
    // Block Public Access: IgnorePublicAcls takes anonymous reads away from a public-read
    // bucket; BlockPublicPolicy refuses the public policy above.
    use aws_sdk_s3::types::PublicAccessBlockConfiguration;
    s3.put_bucket_acl()
        .bucket(b)
        .acl(aws_sdk_s3::types::BucketCannedAcl::PublicRead)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous("pub/a"), 200);
    let settings = PublicAccessBlockConfiguration::builder()
        .ignore_public_acls(true)
        .block_public_policy(true)
        .build();
    s3.put_public_access_block()
        .bucket(b)
        .public_access_block_configuration(settings)
        .send()
        .await
        .unwrap();
    let got = s3.get_public_access_block().bucket(b).send().await.unwrap();
    let got = got.public_access_block_configuration().unwrap();
    assert_eq!(
        (got.ignore_public_acls(), got.block_public_acls()),
        (Some(true), Some(false))
    );
    assert_eq!(anonymous("pub/a"), 403);
    let refused = s3.put_bucket_policy().bucket(b).policy(&doc).send().await;
    assert_eq!(
        refused.unwrap_err().into_service_error().meta().code(),
        Some("AccessDenied")
    );
    s3.delete_public_access_block()
        .bucket(b)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous("pub/a"), 200);
    // Object Ownership: ObjectWriter turns object ACLs on; a public-read object opens to
    // anonymous readers, PutObjectAcl closes it; BucketOwnerEnforced turns them off again.
    use aws_sdk_s3::types::{
        ObjectCannedAcl, ObjectOwnership, OwnershipControls, OwnershipControlsRule,
    };
    let controls = |o: ObjectOwnership| {
        let rule = OwnershipControlsRule::builder()
            .object_ownership(o)
            .build()
            .unwrap();
        OwnershipControls::builder().rules(rule).build().unwrap()
    };
    let ownership = || async {
        let got = s3
            .get_bucket_ownership_controls()
            .bucket(b)
            .send()
            .await
            .unwrap();
        let rules = got.ownership_controls().map(|c| c.rules().to_vec());
        rules.unwrap_or_default()[0].object_ownership().clone()
    };
    assert_eq!(ownership().await, ObjectOwnership::BucketOwnerEnforced);
    s3.put_bucket_acl()
        .bucket(b)
        .acl(aws_sdk_s3::types::BucketCannedAcl::Private)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous("pub/a"), 403);
    s3.put_bucket_ownership_controls()
        .bucket(b)
        .ownership_controls(controls(ObjectOwnership::ObjectWriter))
        .send()
        .await
        .unwrap();
    assert_eq!(ownership().await, ObjectOwnership::ObjectWriter);
    s3.put_object()
        .bucket(b)
        .key("acl")
        .acl(ObjectCannedAcl::PublicRead)
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous("acl"), 200);
    let acl = s3
        .get_object_acl()
        .bucket(b)
        .key("acl")
        .send()
        .await
        .unwrap();
    let permissions: Vec<_> = acl
        .grants()
        .iter()
        .map(|g| g.permission().unwrap().as_str().to_string())
        .collect();
    assert_eq!(permissions, ["FULL_CONTROL", "READ"]);
    s3.put_object_acl()
        .bucket(b)
        .key("acl")
        .acl(ObjectCannedAcl::Private)
        .send()
        .await
        .unwrap();
    assert_eq!(anonymous("acl"), 403);
    s3.put_bucket_ownership_controls()
        .bucket(b)
        .ownership_controls(controls(ObjectOwnership::BucketOwnerEnforced))
        .send()
        .await
        .unwrap();
    assert_eq!(ownership().await, ObjectOwnership::BucketOwnerEnforced);
}

/// SSE-S3 from the Rust SDK: a round trip, ranges across the 64 KiB blocks, the header on
/// HEAD, the plaintext's size in a listing, a copy to a plain object, a multipart upload and
/// the bucket's default encryption. SSE-C from the SDK is
/// refused over plain http (these tests build no TLS stack; tests/test_sse.py runs SSE-C over
/// https with boto3 and aws-cli).
#[tokio::test]
async fn rust_sdk_server_side_encryption() {
    use aws_sdk_s3::types::ServerSideEncryption;
    let server = start();
    let s3 = client(&server.endpoint);
    let b = "rust-sse";
    s3.create_bucket().bucket(b).send().await.unwrap();
    let body: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    let put = s3
        .put_object()
        .bucket(b)
        .key("enc")
        .server_side_encryption(ServerSideEncryption::Aes256)
        .body(ByteStream::from(body.clone()))
        .send()
        .await
        .unwrap();
    assert_eq!(
        put.server_side_encryption(),
        Some(&ServerSideEncryption::Aes256)
    );
    let got = s3.get_object().bucket(b).key("enc").send().await.unwrap();
    assert_eq!(
        got.server_side_encryption(),
        Some(&ServerSideEncryption::Aes256)
    );
    assert_eq!(got.content_length(), Some(body.len() as i64));
    assert_eq!(got.body.collect().await.unwrap().into_bytes(), body);
    for (a, z) in [(0usize, 0usize), (65_530, 65_545), (131_000, 199_999)] {
        let bytes = get_range(&s3, b, "enc", a, z).await;
        assert_eq!(&bytes[..], &body[a..=z], "{a}-{z}");
    }
    let head = s3.head_object().bucket(b).key("enc").send().await.unwrap();
    assert_eq!(
        head.server_side_encryption(),
        Some(&ServerSideEncryption::Aes256)
    );
    let listed = s3.list_objects_v2().bucket(b).send().await.unwrap();
    assert_eq!(listed.contents()[0].size(), Some(body.len() as i64));
    s3.copy_object()
        .bucket(b)
        .key("plain")
        .copy_source(format!("{b}/enc"))
        .send()
        .await
        .unwrap();
    let plain = s3.get_object().bucket(b).key("plain").send().await.unwrap();
    assert_eq!(plain.server_side_encryption(), None);
    // An SSE-S3 object's ETag is its plaintext's MD5, as the plain copy's is.
    assert_eq!(put.e_tag(), plain.e_tag());
    assert_eq!(plain.body.collect().await.unwrap().into_bytes(), body);

    let refused = s3
        .put_object()
        .bucket(b)
        .key("ssec")
        .sse_customer_algorithm("AES256")
        .sse_customer_key("MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=")
        .sse_customer_key_md5("hRasmdxgYDKV3nvbahU1MA==")
        .body(ByteStream::from_static(b"secret"))
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        refused.into_service_error().meta().code(),
        Some("InvalidRequest")
    );
    let missing = s3.head_object().bucket(b).key("ssec").send().await;
    assert!(missing.is_err(), "nothing was stored");

    // An SSE-S3 multipart upload: the parts are sealed one by one, the ETag is S3's (the MD5
    // of the parts' plaintext MD5s), and a range across the two parts reads back.
    let up = s3
        .create_multipart_upload()
        .bucket(b)
        .key("mp")
        .server_side_encryption(ServerSideEncryption::Aes256)
        .send()
        .await
        .unwrap();
    assert_eq!(
        up.server_side_encryption(),
        Some(&ServerSideEncryption::Aes256)
    );
    let uid = up.upload_id().unwrap().to_string();
    let parts: Vec<Vec<u8>> = vec![
        (0..5 * 1024 * 1024u32).map(|i| (i % 253) as u8).collect(),
        (0..70_000u32).map(|i| (i % 241) as u8).collect(),
    ];
    let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
    let (part_etags, etag) = upload_parts(&s3, b, "mp", &uid, &slices).await;
    let mut md5s = Vec::new();
    for (p, e) in parts.iter().zip(&part_etags) {
        assert_eq!(e, &format!("\"{}\"", md5_hex(p)));
        md5s.extend_from_slice(&Md5::digest(p));
    }
    assert_eq!(etag, format!("\"{}-2\"", md5_hex(&md5s)));
    let whole: Vec<u8> = parts.concat();
    let head = s3.head_object().bucket(b).key("mp").send().await.unwrap();
    assert_eq!(head.content_length(), Some(whole.len() as i64));
    let (a, z) = (parts[0].len() - 100, parts[0].len() + 65_600);
    let bytes = get_range(&s3, b, "mp", a, z).await;
    assert_eq!(&bytes[..], &whole[a..=z]);

    // Bucket default encryption: a PUT that names none is SSE-S3 until it is deleted.
    use aws_sdk_s3::types::{
        ServerSideEncryptionByDefault, ServerSideEncryptionConfiguration, ServerSideEncryptionRule,
    };
    let missing = s3
        .get_bucket_encryption()
        .bucket(b)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        missing.into_service_error().meta().code(),
        Some("ServerSideEncryptionConfigurationNotFoundError")
    );
    let rule = ServerSideEncryptionRule::builder()
        .apply_server_side_encryption_by_default(
            ServerSideEncryptionByDefault::builder()
                .sse_algorithm(ServerSideEncryption::Aes256)
                .build()
                .unwrap(),
        )
        .build();
    s3.put_bucket_encryption()
        .bucket(b)
        .server_side_encryption_configuration(
            ServerSideEncryptionConfiguration::builder()
                .rules(rule)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let got = s3.get_bucket_encryption().bucket(b).send().await.unwrap();
    let rules = got.server_side_encryption_configuration().unwrap().rules();
    assert_eq!(
        rules[0]
            .apply_server_side_encryption_by_default()
            .map(|d| d.sse_algorithm()),
        Some(&ServerSideEncryption::Aes256)
    );
    let put = s3
        .put_object()
        .bucket(b)
        .key("by-default")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap();
    assert_eq!(
        put.server_side_encryption(),
        Some(&ServerSideEncryption::Aes256)
    );
    s3.delete_bucket_encryption()
        .bucket(b)
        .send()
        .await
        .unwrap();
    let put = s3
        .put_object()
        .bucket(b)
        .key("plain-again")
        .body(ByteStream::from_static(b"x"))
        .send()
        .await
        .unwrap();
    assert_eq!(put.server_side_encryption(), None);
}

/// Versioning from the Rust SDK: enable it, overwrite and read both versions by id, delete
/// (a delete marker), list versions and markers, and restore by deleting the marker.
#[tokio::test]
async fn rust_sdk_versioning() {
    use aws_sdk_s3::types::{BucketVersioningStatus, VersioningConfiguration};
    let server = start_with(true);
    let s3 = client(&server.endpoint);
    let b = "rust-versions";
    s3.create_bucket().bucket(b).send().await.unwrap();
    let before = s3.get_bucket_versioning().bucket(b).send().await.unwrap();
    assert_eq!(before.status(), None, "a new bucket never had versioning");
    s3.put_bucket_versioning()
        .bucket(b)
        .versioning_configuration(
            VersioningConfiguration::builder()
                .status(BucketVersioningStatus::Enabled)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let got = s3.get_bucket_versioning().bucket(b).send().await.unwrap();
    assert_eq!(got.status(), Some(&BucketVersioningStatus::Enabled));
    let mut ids = Vec::new();
    for body in [&b"first"[..], &b"second"[..]] {
        let put = s3
            .put_object()
            .bucket(b)
            .key("k")
            .body(ByteStream::from(body.to_vec()))
            .tagging(format!("v={}", body.len()))
            .send()
            .await
            .unwrap();
        ids.push(put.version_id().expect("a version id").to_string());
    }
    assert_ne!(ids[0], ids[1]);
    let tags_of = |id: &str| {
        s3.get_object_tagging()
            .bucket(b)
            .key("k")
            .version_id(id)
            .send()
    };
    // The tags of the first version, not the current one's.
    let tags = tags_of(&ids[0]).await.unwrap();
    assert_eq!(tags.version_id(), Some(ids[0].as_str()));
    assert_eq!(tags.tag_set().len(), 1);
    assert_eq!(tags.tag_set()[0].value(), "5");
    // Put and DeleteObjectTagging by version: the first version's tags change, the current
    // one's stay.
    use aws_sdk_s3::types::{Tag, Tagging};
    let split = Tag::builder().key("split").value("val").build().unwrap();
    let put = s3
        .put_object_tagging()
        .bucket(b)
        .key("k")
        .version_id(&ids[0])
        .tagging(Tagging::builder().tag_set(split).build().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(put.version_id(), Some(ids[0].as_str()));
    let first = tags_of(&ids[0]).await.unwrap();
    assert_eq!(
        (first.tag_set()[0].key(), first.tag_set()[0].value()),
        ("split", "val")
    );
    assert_eq!(tags_of(&ids[1]).await.unwrap().tag_set()[0].value(), "6");
    let del = s3
        .delete_object_tagging()
        .bucket(b)
        .key("k")
        .version_id(&ids[0])
        .send()
        .await
        .unwrap();
    assert_eq!(del.version_id(), Some(ids[0].as_str()));
    assert!(tags_of(&ids[0]).await.unwrap().tag_set().is_empty());
    assert_eq!(tags_of(&ids[1]).await.unwrap().tag_set().len(), 1);
    for (id, want) in ids.iter().zip([&b"first"[..], &b"second"[..]]) {
        let got = s3
            .get_object()
            .bucket(b)
            .key("k")
            .version_id(id)
            .send()
            .await
            .unwrap();
        assert_eq!(got.version_id(), Some(id.as_str()));
        assert_eq!(
            got.body.collect().await.unwrap().into_bytes().as_ref(),
            want
        );
    }
    let del = s3.delete_object().bucket(b).key("k").send().await.unwrap();
    assert_eq!(del.delete_marker(), Some(true));
    let marker = del.version_id().expect("the marker's id").to_string();
    let gone = s3.get_object().bucket(b).key("k").send().await.unwrap_err();
    assert_eq!(gone.into_service_error().meta().code(), Some("NoSuchKey"));
    let listed = s3.list_object_versions().bucket(b).send().await.unwrap();
    let mut versions: Vec<&str> = listed
        .versions()
        .iter()
        .filter_map(|v| v.version_id())
        .collect();
    versions.sort();
    let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(versions, want);
    let markers: Vec<(&str, bool)> = listed
        .delete_markers()
        .iter()
        .map(|m| (m.version_id().unwrap_or(""), m.is_latest().unwrap_or(false)))
        .collect();
    assert_eq!(markers, vec![(marker.as_str(), true)]);
    s3.delete_object()
        .bucket(b)
        .key("k")
        .version_id(&marker)
        .send()
        .await
        .unwrap();
    let back = s3.get_object().bucket(b).key("k").send().await.unwrap();
    assert_eq!(back.version_id(), Some(ids[1].as_str()));
    assert_eq!(
        back.body.collect().await.unwrap().into_bytes().as_ref(),
        b"second"
    );
    // An older version's ACL (what holds: the owner's full control).
    let acl = s3
        .get_object_acl()
        .bucket(b)
        .key("k")
        .version_id(&ids[0])
        .send()
        .await
        .unwrap();
    assert_eq!(acl.grants().len(), 1);
    // A lifecycle rule on noncurrent versions (moved to the tier, then expired), read back
    // as set.
    use aws_sdk_s3::types::{
        BucketLifecycleConfiguration, ExpirationStatus, LifecycleRule, LifecycleRuleFilter,
        NoncurrentVersionExpiration, NoncurrentVersionTransition, TransitionStorageClass,
    };
    let rule = LifecycleRule::builder()
        .id("history")
        .status(ExpirationStatus::Enabled)
        .filter(LifecycleRuleFilter::builder().prefix("").build())
        .noncurrent_version_transitions(
            NoncurrentVersionTransition::builder()
                .noncurrent_days(7)
                .storage_class(TransitionStorageClass::StandardIa)
                .build(),
        )
        .noncurrent_version_expiration(
            NoncurrentVersionExpiration::builder()
                .noncurrent_days(30)
                .newer_noncurrent_versions(2)
                .build(),
        )
        .build()
        .unwrap();
    s3.put_bucket_lifecycle_configuration()
        .bucket(b)
        .lifecycle_configuration(
            BucketLifecycleConfiguration::builder()
                .rules(rule)
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    let got = s3
        .get_bucket_lifecycle_configuration()
        .bucket(b)
        .send()
        .await
        .unwrap();
    let nc = got.rules()[0]
        .noncurrent_version_expiration()
        .expect("the noncurrent-version expiration");
    assert_eq!(
        (nc.noncurrent_days(), nc.newer_noncurrent_versions()),
        (Some(30), Some(2))
    );
    let moving = &got.rules()[0].noncurrent_version_transitions()[0];
    assert_eq!(
        (moving.noncurrent_days(), moving.storage_class()),
        (Some(7), Some(&TransitionStorageClass::StandardIa))
    );
}

/// Object Lock from the Rust SDK: a bucket created with it, a default retention, a version
/// under GOVERNANCE retention and a legal hold that refuse its removal, the bypass, and each
/// operation's answer read back.
#[tokio::test]
async fn rust_sdk_object_lock() {
    use aws_sdk_s3::primitives::DateTime;
    use aws_sdk_s3::types::{
        DefaultRetention, ObjectLockConfiguration, ObjectLockEnabled, ObjectLockLegalHold,
        ObjectLockLegalHoldStatus, ObjectLockRetention, ObjectLockRetentionMode, ObjectLockRule,
    };
    let server = start();
    let s3 = client(&server.endpoint);
    let b = "rust-lock";
    s3.create_bucket()
        .bucket(b)
        .object_lock_enabled_for_bucket(true)
        .send()
        .await
        .unwrap();
    let config = ObjectLockConfiguration::builder()
        .object_lock_enabled(ObjectLockEnabled::Enabled)
        .rule(
            ObjectLockRule::builder()
                .default_retention(
                    DefaultRetention::builder()
                        .mode(ObjectLockRetentionMode::Governance)
                        .days(1)
                        .build(),
                )
                .build(),
        )
        .build();
    s3.put_object_lock_configuration()
        .bucket(b)
        .object_lock_configuration(config.clone())
        .send()
        .await
        .unwrap();
    let got = s3
        .get_object_lock_configuration()
        .bucket(b)
        .send()
        .await
        .unwrap();
    assert_eq!(got.object_lock_configuration(), Some(&config));
    let put = s3
        .put_object()
        .bucket(b)
        .key("k")
        .body(ByteStream::from_static(b"kept"))
        .object_lock_legal_hold_status(ObjectLockLegalHoldStatus::On)
        .send()
        .await
        .unwrap();
    let v = put.version_id().expect("a version id").to_string();
    let head = s3.head_object().bucket(b).key("k").send().await.unwrap();
    assert_eq!(
        head.object_lock_mode(),
        Some(&aws_sdk_s3::types::ObjectLockMode::Governance),
        "the bucket's default retention"
    );
    assert_eq!(
        head.object_lock_legal_hold_status(),
        Some(&ObjectLockLegalHoldStatus::On)
    );
    let refused = s3
        .delete_object()
        .bucket(b)
        .key("k")
        .version_id(&v)
        .bypass_governance_retention(true)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        refused.into_service_error().meta().code(),
        Some("AccessDenied")
    );
    s3.put_object_legal_hold()
        .bucket(b)
        .key("k")
        .legal_hold(
            ObjectLockLegalHold::builder()
                .status(ObjectLockLegalHoldStatus::Off)
                .build(),
        )
        .send()
        .await
        .unwrap();
    let hold = s3
        .get_object_legal_hold()
        .bucket(b)
        .key("k")
        .send()
        .await
        .unwrap();
    assert_eq!(
        hold.legal_hold().and_then(|h| h.status()),
        Some(&ObjectLockLegalHoldStatus::Off)
    );
    let until = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64
        + 2 * 86_400;
    s3.put_object_retention()
        .bucket(b)
        .key("k")
        .version_id(&v)
        .retention(
            ObjectLockRetention::builder()
                .mode(ObjectLockRetentionMode::Governance)
                .retain_until_date(DateTime::from_secs(until))
                .build(),
        )
        .send()
        .await
        .unwrap();
    let got = s3
        .get_object_retention()
        .bucket(b)
        .key("k")
        .send()
        .await
        .unwrap();
    let r = got.retention().expect("a retention");
    assert_eq!(r.mode(), Some(&ObjectLockRetentionMode::Governance));
    assert_eq!(r.retain_until_date().map(|d| d.secs()), Some(until));
    let refused = s3
        .delete_object()
        .bucket(b)
        .key("k")
        .version_id(&v)
        .send()
        .await
        .unwrap_err();
    assert_eq!(
        refused.into_service_error().meta().code(),
        Some("AccessDenied")
    );
    s3.delete_object()
        .bucket(b)
        .key("k")
        .version_id(&v)
        .bypass_governance_retention(true)
        .send()
        .await
        .unwrap();
    s3.delete_bucket().bucket(b).send().await.unwrap();
}
