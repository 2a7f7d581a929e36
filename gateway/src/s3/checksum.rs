//! S3 flexible checksums (CRC32, CRC32C, CRC64NVME, SHA1, SHA256): computing them over a
//! stream, parsing what the client sent, and combining part checksums of multipart uploads.

use super::error::{S3Error, S3ErrorCode, S3Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use crc_fast::{CrcAlgorithm, Digest as CrcDigest};
use sha1::Sha1;
use sha2::{Digest, Sha256};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumAlgorithm {
    Crc32,
    Crc32c,
    Crc64Nvme,
    Sha1,
    Sha256,
}

pub const ALL: [ChecksumAlgorithm; 5] = [
    ChecksumAlgorithm::Crc32,
    ChecksumAlgorithm::Crc32c,
    ChecksumAlgorithm::Crc64Nvme,
    ChecksumAlgorithm::Sha1,
    ChecksumAlgorithm::Sha256,
];

impl ChecksumAlgorithm {
    pub fn name(self) -> &'static str {
        match self {
            Self::Crc32 => "CRC32",
            Self::Crc32c => "CRC32C",
            Self::Crc64Nvme => "CRC64NVME",
            Self::Sha1 => "SHA1",
            Self::Sha256 => "SHA256",
        }
    }

    /// The header that carries this checksum, e.g. `x-amz-checksum-crc32`.
    pub fn header(self) -> &'static str {
        match self {
            Self::Crc32 => "x-amz-checksum-crc32",
            Self::Crc32c => "x-amz-checksum-crc32c",
            Self::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Self::Sha1 => "x-amz-checksum-sha1",
            Self::Sha256 => "x-amz-checksum-sha256",
        }
    }

    /// The XML element name in CompleteMultipartUpload and listings, e.g. `ChecksumCRC32`.
    pub fn xml_name(self) -> &'static str {
        match self {
            Self::Crc32 => "ChecksumCRC32",
            Self::Crc32c => "ChecksumCRC32C",
            Self::Crc64Nvme => "ChecksumCRC64NVME",
            Self::Sha1 => "ChecksumSHA1",
            Self::Sha256 => "ChecksumSHA256",
        }
    }

    pub fn parse(name: &str) -> S3Result<Self> {
        ALL.into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
            .ok_or_else(|| {
                S3Error::new(
                    S3ErrorCode::InvalidRequest,
                    format!("Checksum algorithm {name} is not supported"),
                )
            })
    }

    pub fn from_header(header: &str) -> Option<Self> {
        ALL.into_iter()
            .find(|a| a.header().eq_ignore_ascii_case(header))
    }

    fn crc(self) -> Option<CrcAlgorithm> {
        match self {
            Self::Crc32 => Some(CrcAlgorithm::Crc32IsoHdlc),
            Self::Crc32c => Some(CrcAlgorithm::Crc32Iscsi),
            Self::Crc64Nvme => Some(CrcAlgorithm::Crc64Nvme),
            Self::Sha1 | Self::Sha256 => None,
        }
    }

    pub fn is_crc(self) -> bool {
        self.crc().is_some()
    }

    /// Width of the raw checksum in bytes.
    pub fn width(self) -> usize {
        match self {
            Self::Crc32 | Self::Crc32c => 4,
            Self::Crc64Nvme => 8,
            Self::Sha1 => 20,
            Self::Sha256 => 32,
        }
    }
}

pub enum Hasher {
    Crc(ChecksumAlgorithm, CrcDigest),
    Sha1(Sha1),
    Sha256(Sha256),
}

impl Hasher {
    pub fn new(alg: ChecksumAlgorithm) -> Self {
        match alg.crc() {
            Some(c) => Hasher::Crc(alg, CrcDigest::new(c)),
            None if alg == ChecksumAlgorithm::Sha1 => Hasher::Sha1(Sha1::new()),
            None => Hasher::Sha256(Sha256::new()),
        }
    }

    pub fn update(&mut self, data: &[u8]) {
        match self {
            Hasher::Crc(_, d) => d.update(data),
            Hasher::Sha1(h) => h.update(data),
            Hasher::Sha256(h) => h.update(data),
        }
    }

    /// The raw big-endian checksum bytes, and the CRC as an integer for CRC algorithms.
    pub fn finish(self) -> (Vec<u8>, Option<u64>) {
        match self {
            Hasher::Crc(alg, d) => {
                let v = d.finalize();
                (crc_bytes(alg, v), Some(v))
            }
            Hasher::Sha1(h) => (h.finalize().to_vec(), None),
            Hasher::Sha256(h) => (h.finalize().to_vec(), None),
        }
    }
}

fn crc_bytes(alg: ChecksumAlgorithm, v: u64) -> Vec<u8> {
    if alg.width() == 4 {
        (v as u32).to_be_bytes().to_vec()
    } else {
        v.to_be_bytes().to_vec()
    }
}

pub fn b64(bytes: &[u8]) -> String {
    B64.encode(bytes)
}

/// Decodes a checksum sent by a client, checking its width.
pub fn decode_sent(alg: ChecksumAlgorithm, value: &str) -> S3Result<Vec<u8>> {
    match B64.decode(value.trim()) {
        Ok(b) if b.len() == alg.width() => Ok(b),
        _ => Err(S3Error::new(
            S3ErrorCode::InvalidRequest,
            format!("Value for {} header is invalid.", alg.header()),
        )),
    }
}

/// The checksum of checksums of a multipart upload: `base64(H(c1 || c2 || ...))-N`.
pub fn composite(alg: ChecksumAlgorithm, part_checksums: &[Vec<u8>]) -> String {
    let mut h = Hasher::new(alg);
    for c in part_checksums {
        h.update(c);
    }
    format!("{}-{}", b64(&h.finish().0), part_checksums.len())
}

/// The full-object CRC of a multipart upload, combined from the parts' CRCs and sizes.
pub fn combine_full(alg: ChecksumAlgorithm, parts: &[(u64, u64)]) -> Option<String> {
    let crc = alg.crc()?;
    let mut acc: Option<u64> = None;
    for &(value, len) in parts {
        acc = Some(match acc {
            None => value,
            Some(a) => crc_fast::checksum_combine(crc, a, value, len),
        });
    }
    Some(b64(&crc_bytes(alg, acc.unwrap_or(0))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(alg: ChecksumAlgorithm, data: &[u8]) -> (Vec<u8>, Option<u64>) {
        let mut h = Hasher::new(alg);
        h.update(data);
        h.finish()
    }

    #[test]
    fn known_values() {
        // Standard check values over "123456789".
        let d = b"123456789";
        assert_eq!(of(ChecksumAlgorithm::Crc32, d).1, Some(0xcbf43926));
        assert_eq!(of(ChecksumAlgorithm::Crc32c, d).1, Some(0xe3069283));
        assert_eq!(
            of(ChecksumAlgorithm::Crc64Nvme, d).1,
            Some(0xae8b14860a799888)
        );
        assert_eq!(
            b64(&of(ChecksumAlgorithm::Crc32, b"hello world").0),
            "DUoRhQ=="
        );
    }

    #[test]
    fn full_object_combination_matches_whole() {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        for alg in [
            ChecksumAlgorithm::Crc32,
            ChecksumAlgorithm::Crc32c,
            ChecksumAlgorithm::Crc64Nvme,
        ] {
            let parts: Vec<(u64, u64)> = data
                .chunks(30_000)
                .map(|c| (of(alg, c).1.unwrap(), c.len() as u64))
                .collect();
            assert_eq!(combine_full(alg, &parts).unwrap(), b64(&of(alg, &data).0));
        }
    }
}
