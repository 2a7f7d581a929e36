//! packrat-tiering: where whole sealed segments go when their objects turn cold, and how bytes
//! come back from there.
//!
//! A tier is named by the S3 storage class it stands for (`STANDARD_IA`, `GLACIER_IR`, ...) and
//! is either a directory on slower disks (`dir:/mnt/hdd/packrat`) or a bucket of any S3 service
//! (`s3://bucket/prefix?endpoint=http://host:port&region=us-east-1`), reached with the AWS SDK
//! for Rust. A tier stores segment files exactly as the chunk store wrote them, one file or S3
//! object per segment (`seg-<id as 16 hex digits>.pkr`), so a record read from a tier is checked
//! with the same record checksums as one read from NVMe.
//!
//! This crate moves bytes only: it knows nothing of objects, keys or the index. The gateway
//! decides what to move (lifecycle rules, storage classes), builds the segment, and keeps the
//! catalog of which segment lives on which tier.

use bytes::Bytes;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

/// Multipart part size for uploads to an S3 tier.
const PART_BYTES: usize = 8 * 1024 * 1024;
/// Block size of the read cache: a read of a tiered record fetches (and caches) the aligned
/// blocks around it, so neighbouring records cost one remote request.
pub const CACHE_BLOCK_BYTES: u64 = 1024 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    /// The tier cannot be reached or answered with a server error: retry later.
    #[error("tier {tier} is unavailable: {reason}")]
    Unavailable { tier: String, reason: String },
    #[error("segment {id} is not on tier {tier}")]
    NotFound { tier: String, id: u64 },
    /// The copy on the tier does not match what was written (size or checksum).
    #[error("segment {id} on tier {tier} failed verification: {reason}")]
    Mismatch {
        tier: String,
        id: u64,
        reason: String,
    },
    #[error("tier configuration: {0}")]
    Config(String),
}

pub type Result<T> = std::result::Result<T, TierError>;

/// `CLASS=dir:/path` or `CLASS=s3://bucket/prefix?endpoint=URL&region=R`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TierSpec {
    pub class: String,
    pub target: Target,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Dir(PathBuf),
    S3 {
        bucket: String,
        /// Key prefix, empty or ending in `/`.
        prefix: String,
        endpoint: Option<String>,
        region: String,
    },
}

/// The S3 storage classes a tier may stand for (STANDARD is the local NVMe tier itself).
pub const STORAGE_CLASSES: &[&str] = &[
    "STANDARD_IA",
    "ONEZONE_IA",
    "INTELLIGENT_TIERING",
    "GLACIER_IR",
    "GLACIER",
    "DEEP_ARCHIVE",
    "REDUCED_REDUNDANCY",
];

impl FromStr for TierSpec {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        let (class, target) = s.split_once('=').ok_or_else(|| {
            format!("--tier wants CLASS=dir:/path or CLASS=s3://bucket/prefix, not {s:?}")
        })?;
        if !STORAGE_CLASSES.contains(&class) {
            return Err(format!(
                "--tier {class}: not an S3 storage class packrat can tier to (one of {})",
                STORAGE_CLASSES.join(", ")
            ));
        }
        let target = if let Some(path) = target.strip_prefix("dir:") {
            if path.is_empty() {
                return Err(format!("--tier {class}: empty directory"));
            }
            Target::Dir(PathBuf::from(path))
        } else if let Some(rest) = target.strip_prefix("s3://") {
            let (loc, query) = rest.split_once('?').unwrap_or((rest, ""));
            let (bucket, prefix) = loc.split_once('/').unwrap_or((loc, ""));
            if bucket.is_empty() {
                return Err(format!("--tier {class}: s3:// needs a bucket"));
            }
            let mut prefix = prefix.to_string();
            if !prefix.is_empty() && !prefix.ends_with('/') {
                prefix.push('/');
            }
            let (mut endpoint, mut region) = (None, "us-east-1".to_string());
            for kv in query.split('&').filter(|kv| !kv.is_empty()) {
                match kv.split_once('=') {
                    Some(("endpoint", v)) => endpoint = Some(v.to_string()),
                    Some(("region", v)) => region = v.to_string(),
                    _ => {
                        return Err(format!(
                            "--tier {class}: unknown option {kv:?} (endpoint=, region=)"
                        ));
                    }
                }
            }
            Target::S3 {
                bucket: bucket.to_string(),
                prefix,
                endpoint,
                region,
            }
        } else {
            return Err(format!(
                "--tier {class}: the target must start with dir: or s3://"
            ));
        };
        Ok(Self {
            class: class.to_string(),
            target,
        })
    }
}

/// Credentials for an S3 tier.
#[derive(Clone)]
pub struct S3Credentials {
    pub access_key: String,
    pub secret_key: String,
}

enum Backend {
    Dir(PathBuf),
    S3 {
        client: aws_sdk_s3::Client,
        bucket: String,
        prefix: String,
    },
}

/// One configured tier.
pub struct Tier {
    pub class: String,
    backend: Backend,
    describe: String,
}

fn segment_name(id: u64) -> String {
    format!("seg-{id:016x}.pkr")
}

pub fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

/// crc32c of a file's bytes, read in 1 MiB pieces (for verifying a copy).
pub fn file_crc32c(path: &Path) -> std::io::Result<(u64, u32)> {
    use std::io::Read;
    let mut f = std::fs::File::open(path)?;
    let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
    let mut buf = vec![0u8; 1 << 20];
    let mut len = 0u64;
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        digest.update(&buf[..n]);
        len += n as u64;
    }
    Ok((len, digest.finalize() as u32))
}

async fn blocking_io<T: Send + 'static>(
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| std::io::Error::other(e.to_string()))?
}

impl Tier {
    /// Opens a tier: creates the directory, or builds the S3 client (nothing is contacted yet).
    pub fn open(spec: &TierSpec, creds: Option<S3Credentials>) -> Result<Self> {
        match &spec.target {
            Target::Dir(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    TierError::Config(format!("cannot create {}: {e}", dir.display()))
                })?;
                Ok(Self {
                    class: spec.class.clone(),
                    describe: format!("dir:{}", dir.display()),
                    backend: Backend::Dir(dir.clone()),
                })
            }
            Target::S3 {
                bucket,
                prefix,
                endpoint,
                region,
            } => {
                use aws_sdk_s3::config::{BehaviorVersion, Credentials, Region};
                let creds = creds.ok_or_else(|| {
                    TierError::Config(format!(
                        "tier {}: no credentials (set PACKRAT_TIER_{}_ACCESS_KEY_ID and _SECRET_ACCESS_KEY, or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY)",
                        spec.class, spec.class
                    ))
                })?;
                let mut b = aws_sdk_s3::Config::builder()
                    .behavior_version(BehaviorVersion::latest())
                    .region(Region::new(region.clone()))
                    .credentials_provider(Credentials::new(
                        creds.access_key,
                        creds.secret_key,
                        None,
                        None,
                        "packrat-tier",
                    ))
                    .force_path_style(true);
                // Plain HTTP for http:// endpoints (a LAN service, another packrat); rustls
                // with the system's root certificates for https:// and for AWS itself.
                b = if endpoint
                    .as_deref()
                    .is_some_and(|e| e.starts_with("http://"))
                {
                    b.http_client(aws_smithy_http_client::Builder::new().build_http())
                } else {
                    use aws_smithy_http_client::tls::{self, rustls_provider::CryptoMode};
                    b.http_client(
                        aws_smithy_http_client::Builder::new()
                            .tls_provider(tls::Provider::Rustls(CryptoMode::Ring))
                            .build_https(),
                    )
                };
                if let Some(e) = endpoint {
                    b = b.endpoint_url(e);
                }
                Ok(Self {
                    class: spec.class.clone(),
                    describe: format!(
                        "s3://{bucket}/{prefix} ({})",
                        endpoint.as_deref().unwrap_or("AWS")
                    ),
                    backend: Backend::S3 {
                        client: aws_sdk_s3::Client::from_conf(b.build()),
                        bucket: bucket.clone(),
                        prefix: prefix.clone(),
                    },
                })
            }
        }
    }

    pub fn describe(&self) -> &str {
        &self.describe
    }

    fn unavailable(&self, reason: impl std::fmt::Display) -> TierError {
        TierError::Unavailable {
            tier: self.class.clone(),
            reason: reason.to_string(),
        }
    }

    fn s3_err<E: std::error::Error + 'static, R: std::fmt::Debug>(
        &self,
        e: aws_sdk_s3::error::SdkError<E, R>,
    ) -> TierError {
        use aws_sdk_s3::error::DisplayErrorContext;
        // The SDK's full context names the innermost cause (connection refused, a status
        // code); it is kept short for an error message.
        let mut reason = DisplayErrorContext(&e).to_string();
        if reason.len() > 240 {
            let mut cut = 240;
            while !reason.is_char_boundary(cut) {
                cut -= 1;
            }
            reason.truncate(cut);
            reason.push_str("...");
        }
        self.unavailable(reason)
    }

    /// Stores the local segment file `local` as segment `id`, durably: a directory copy is
    /// synced and renamed into place; an S3 upload is complete when this returns.
    pub async fn upload(&self, id: u64, local: &Path) -> Result<()> {
        match &self.backend {
            Backend::Dir(dir) => {
                let (src, dst, dir) =
                    (local.to_path_buf(), dir.join(segment_name(id)), dir.clone());
                blocking_io(move || {
                    let tmp = dst.with_extension("pkr.tmp");
                    std::fs::copy(&src, &tmp)?;
                    std::fs::File::open(&tmp)?.sync_all()?;
                    std::fs::rename(&tmp, &dst)?;
                    std::fs::File::open(&dir)?.sync_all()
                })
                .await
                .map_err(|e| self.unavailable(e))
            }
            Backend::S3 {
                client,
                bucket,
                prefix,
            } => {
                let key = format!("{prefix}{}", segment_name(id));
                let data = {
                    let p = local.to_path_buf();
                    blocking_io(move || std::fs::read(p))
                        .await
                        .map_err(|e| self.unavailable(e))?
                };
                if data.len() <= PART_BYTES {
                    client
                        .put_object()
                        .bucket(bucket)
                        .key(&key)
                        .body(Bytes::from(data).into())
                        .send()
                        .await
                        .map_err(|e| self.s3_err(e))?;
                    return Ok(());
                }
                let up = client
                    .create_multipart_upload()
                    .bucket(bucket)
                    .key(&key)
                    .send()
                    .await
                    .map_err(|e| self.s3_err(e))?;
                let upload_id = up
                    .upload_id()
                    .ok_or_else(|| self.unavailable("no upload id in the answer"))?
                    .to_string();
                let data = Bytes::from(data);
                let mut parts = Vec::new();
                let result: Result<()> = async {
                    for (n, at) in (0..data.len()).step_by(PART_BYTES).enumerate() {
                        let piece = data.slice(at..(at + PART_BYTES).min(data.len()));
                        let r = client
                            .upload_part()
                            .bucket(bucket)
                            .key(&key)
                            .upload_id(&upload_id)
                            .part_number(n as i32 + 1)
                            .body(piece.into())
                            .send()
                            .await
                            .map_err(|e| self.s3_err(e))?;
                        parts.push(
                            aws_sdk_s3::types::CompletedPart::builder()
                                .part_number(n as i32 + 1)
                                .set_e_tag(r.e_tag().map(str::to_string))
                                .build(),
                        );
                    }
                    client
                        .complete_multipart_upload()
                        .bucket(bucket)
                        .key(&key)
                        .upload_id(&upload_id)
                        .multipart_upload(
                            aws_sdk_s3::types::CompletedMultipartUpload::builder()
                                .set_parts(Some(parts))
                                .build(),
                        )
                        .send()
                        .await
                        .map_err(|e| self.s3_err(e))?;
                    Ok(())
                }
                .await;
                if result.is_err() {
                    let _ = client
                        .abort_multipart_upload()
                        .bucket(bucket)
                        .key(&key)
                        .upload_id(&upload_id)
                        .send()
                        .await;
                }
                result
            }
        }
    }

    /// Reads segment `id` back from the tier in full and checks its length and crc32c
    /// against what was uploaded: the local copy may go only after this succeeds.
    pub async fn verify(&self, id: u64, len: u64, crc: u32) -> Result<()> {
        let mut digest = crc_fast::Digest::new(crc_fast::CrcAlgorithm::Crc32Iscsi);
        let mut got = 0u64;
        while got < len {
            let n = (len - got).min(8 * CACHE_BLOCK_BYTES);
            let bytes = self.read_at(id, got, n).await?;
            if bytes.is_empty() {
                break;
            }
            digest.update(&bytes);
            got += bytes.len() as u64;
        }
        let have = digest.finalize() as u32;
        if got != len || have != crc {
            return Err(TierError::Mismatch {
                tier: self.class.clone(),
                id,
                reason: format!(
                    "{got} bytes with crc32c {have:08x}, expected {len} with {crc:08x}"
                ),
            });
        }
        Ok(())
    }

    /// Bytes `[offset, offset + len)` of segment `id` (fewer at its end).
    pub async fn read_at(&self, id: u64, offset: u64, len: u64) -> Result<Bytes> {
        match &self.backend {
            Backend::Dir(dir) => {
                let path = dir.join(segment_name(id));
                let r = blocking_io(move || {
                    use std::os::unix::fs::FileExt;
                    let f = std::fs::File::open(&path)?;
                    let mut buf = vec![0u8; len as usize];
                    let mut filled = 0usize;
                    while filled < buf.len() {
                        match f.read_at(&mut buf[filled..], offset + filled as u64) {
                            Ok(0) => break,
                            Ok(n) => filled += n,
                            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                            Err(e) => return Err(e),
                        }
                    }
                    buf.truncate(filled);
                    Ok(Bytes::from(buf))
                })
                .await;
                match r {
                    Ok(b) => Ok(b),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        Err(TierError::NotFound {
                            tier: self.class.clone(),
                            id,
                        })
                    }
                    Err(e) => Err(self.unavailable(e)),
                }
            }
            Backend::S3 {
                client,
                bucket,
                prefix,
            } => {
                if len == 0 {
                    return Ok(Bytes::new());
                }
                let r = client
                    .get_object()
                    .bucket(bucket)
                    .key(format!("{prefix}{}", segment_name(id)))
                    .range(format!("bytes={offset}-{}", offset + len - 1))
                    .send()
                    .await;
                let out = match r {
                    Ok(o) => o,
                    Err(e) => {
                        if let Some(se) = e.as_service_error()
                            && se.is_no_such_key()
                        {
                            return Err(TierError::NotFound {
                                tier: self.class.clone(),
                                id,
                            });
                        }
                        return Err(self.s3_err(e));
                    }
                };
                let body = out.body.collect().await.map_err(|e| self.unavailable(e))?;
                Ok(body.into_bytes())
            }
        }
    }

    /// Removes segment `id` from the tier (missing is fine).
    pub async fn delete(&self, id: u64) -> Result<()> {
        match &self.backend {
            Backend::Dir(dir) => {
                let path = dir.join(segment_name(id));
                blocking_io(move || match std::fs::remove_file(&path) {
                    Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                    _ => Ok(()),
                })
                .await
                .map_err(|e| self.unavailable(e))
            }
            Backend::S3 {
                client,
                bucket,
                prefix,
            } => {
                client
                    .delete_object()
                    .bucket(bucket)
                    .key(format!("{prefix}{}", segment_name(id)))
                    .send()
                    .await
                    .map_err(|e| self.s3_err(e))?;
                Ok(())
            }
        }
    }
}

/// A bounded cache of tier blocks (`CACHE_BLOCK_BYTES`, aligned), weighed by their bytes.
pub struct BlockCache {
    cache: quick_cache::sync::Cache<(u64, u64), Bytes, BytesWeighter>,
}

#[derive(Clone)]
struct BytesWeighter;

impl quick_cache::Weighter<(u64, u64), Bytes> for BytesWeighter {
    fn weight(&self, _: &(u64, u64), v: &Bytes) -> u64 {
        v.len().max(1) as u64
    }
}

impl BlockCache {
    pub fn new(capacity_bytes: u64) -> Self {
        let items = (capacity_bytes / CACHE_BLOCK_BYTES).max(1) as usize;
        Self {
            cache: quick_cache::sync::Cache::with_weighter(
                items,
                capacity_bytes.max(1),
                BytesWeighter,
            ),
        }
    }

    pub fn weight(&self) -> u64 {
        self.cache.weight()
    }

    /// Bytes `[offset, offset + len)` of segment `id` (of length `seg_len`) on `tier`, from
    /// cached blocks where possible; missing blocks are fetched whole and cached.
    pub async fn read(
        &self,
        tier: &Arc<Tier>,
        id: u64,
        seg_len: u64,
        offset: u64,
        len: u64,
    ) -> Result<Bytes> {
        let end = (offset + len).min(seg_len);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let first = offset / CACHE_BLOCK_BYTES;
        let last = (end - 1) / CACHE_BLOCK_BYTES;
        let mut blocks = Vec::with_capacity((last - first + 1) as usize);
        for b in first..=last {
            let block = match self.cache.get(&(id, b)) {
                Some(v) => v,
                None => {
                    let at = b * CACHE_BLOCK_BYTES;
                    let n = CACHE_BLOCK_BYTES.min(seg_len - at);
                    let v = tier.read_at(id, at, n).await?;
                    if (v.len() as u64) < n {
                        return Err(TierError::Mismatch {
                            tier: tier.class.clone(),
                            id,
                            reason: format!("short read at {at}: {} of {n} bytes", v.len()),
                        });
                    }
                    self.cache.insert((id, b), v.clone());
                    v
                }
            };
            blocks.push(block);
        }
        let skip = (offset - first * CACHE_BLOCK_BYTES) as usize;
        let want = (end - offset) as usize;
        if blocks.len() == 1 {
            return Ok(blocks[0].slice(skip..skip + want));
        }
        let mut out = Vec::with_capacity(want);
        let mut skip = skip;
        for b in blocks {
            let take = (b.len() - skip).min(want - out.len());
            out.extend_from_slice(&b[skip..skip + take]);
            skip = 0;
        }
        Ok(Bytes::from(out))
    }

    /// Drops the cached blocks of a segment (removed from its tier).
    pub fn forget(&self, id: u64, seg_len: u64) {
        for b in 0..seg_len.div_ceil(CACHE_BLOCK_BYTES) {
            self.cache.remove(&(id, b));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs() {
        let t: TierSpec = "STANDARD_IA=dir:/mnt/hdd/packrat".parse().unwrap();
        assert_eq!(t.target, Target::Dir("/mnt/hdd/packrat".into()));
        let t: TierSpec = "GLACIER_IR=s3://cold/pk?endpoint=http://127.0.0.1:9001&region=eu-west-1"
            .parse()
            .unwrap();
        assert_eq!(
            t.target,
            Target::S3 {
                bucket: "cold".into(),
                prefix: "pk/".into(),
                endpoint: Some("http://127.0.0.1:9001".into()),
                region: "eu-west-1".into()
            }
        );
        assert!("STANDARD=dir:/x".parse::<TierSpec>().is_err());
        assert!("GLACIER=ftp://x".parse::<TierSpec>().is_err());
        assert!("GLACIER".parse::<TierSpec>().is_err());
        assert!("GLACIER=s3://b?bogus=1".parse::<TierSpec>().is_err());
        assert!(
            "GLACIER=s3://b?endpoint=https://s3.example"
                .parse::<TierSpec>()
                .is_ok()
        );
    }

    #[tokio::test]
    async fn https_and_http_s3_tiers_build_clients() {
        let creds = || {
            Some(S3Credentials {
                access_key: "a".into(),
                secret_key: "b".into(),
            })
        };
        for spec in [
            "GLACIER_IR=s3://b/p?endpoint=https://s3.eu-west-1.amazonaws.com&region=eu-west-1",
            "GLACIER_IR=s3://b/p?region=us-east-1",
            "GLACIER_IR=s3://b/p?endpoint=http://127.0.0.1:1",
        ] {
            let t = Tier::open(&spec.parse().unwrap(), creds()).unwrap();
            assert!(t.describe().starts_with("s3://b/p/"));
        }
        // No credentials: a clear configuration error.
        assert!(matches!(
            Tier::open(&"GLACIER_IR=s3://b".parse().unwrap(), None),
            Err(TierError::Config(_))
        ));
    }

    #[tokio::test]
    async fn dir_tier_roundtrip_and_cache() {
        let d = tempfile::tempdir().unwrap();
        let spec: TierSpec = format!("STANDARD_IA=dir:{}", d.path().join("hdd").display())
            .parse()
            .unwrap();
        let tier = Arc::new(Tier::open(&spec, None).unwrap());
        let data: Vec<u8> = (0..3 * CACHE_BLOCK_BYTES + 77)
            .map(|i| (i * 13) as u8)
            .collect();
        let local = d.path().join("local.pkr");
        std::fs::write(&local, &data).unwrap();
        tier.upload(5, &local).await.unwrap();
        let (len, crc) = file_crc32c(&local).unwrap();
        tier.verify(5, len, crc).await.unwrap();
        assert!(tier.verify(5, len, crc ^ 1).await.is_err());
        let cache = BlockCache::new(8 * CACHE_BLOCK_BYTES);
        let off = CACHE_BLOCK_BYTES - 10;
        let got = cache.read(&tier, 5, len, off, 100).await.unwrap();
        assert_eq!(&got[..], &data[off as usize..off as usize + 100]);
        assert!(cache.weight() >= 2 * CACHE_BLOCK_BYTES);
        let tail = cache.read(&tier, 5, len, len - 5, 100).await.unwrap();
        assert_eq!(&tail[..], &data[len as usize - 5..]);
        tier.delete(5).await.unwrap();
        assert!(matches!(
            tier.read_at(5, 0, 10).await,
            Err(TierError::NotFound { .. })
        ));
        tier.delete(5).await.unwrap();
    }
}
