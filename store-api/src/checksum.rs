//! The flexible checksums a write may carry (CRC32, CRC32C, CRC64NVME, SHA1, SHA256), computed
//! over a stream, and combined over the parts of a multipart upload. Raw big-endian bytes only:
//! how they travel (headers, base64, XML names) is the S3 layer's business.

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
    /// The algorithm's name as S3 spells it (`CRC32`, ..., `SHA256`); also how it is stored.
    pub fn name(self) -> &'static str {
        match self {
            Self::Crc32 => "CRC32",
            Self::Crc32c => "CRC32C",
            Self::Crc64Nvme => "CRC64NVME",
            Self::Sha1 => "SHA1",
            Self::Sha256 => "SHA256",
        }
    }

    /// The algorithm of a stored name (case-insensitive).
    pub fn from_name(name: &str) -> Option<Self> {
        ALL.into_iter()
            .find(|a| a.name().eq_ignore_ascii_case(name))
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

/// The checksum of checksums of a multipart upload, `H(c1 || c2 || ...)` (raw bytes; S3
/// shows it as base64 followed by `-N`).
pub fn composite(alg: ChecksumAlgorithm, part_checksums: &[Vec<u8>]) -> Vec<u8> {
    let mut h = Hasher::new(alg);
    for c in part_checksums {
        h.update(c);
    }
    h.finish().0
}

/// The full-object CRC of a multipart upload, combined from the parts' CRCs and sizes (raw
/// bytes); `None` for an algorithm that is not a CRC.
pub fn combine_full(alg: ChecksumAlgorithm, parts: &[(u64, u64)]) -> Option<Vec<u8>> {
    let crc = alg.crc()?;
    let mut acc: Option<u64> = None;
    for &(value, len) in parts {
        acc = Some(match acc {
            None => value,
            Some(a) => crc_fast::checksum_combine(crc, a, value, len),
        });
    }
    Some(crc_bytes(alg, acc.unwrap_or(0)))
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
        // base64 "DUoRhQ==".
        assert_eq!(
            of(ChecksumAlgorithm::Crc32, b"hello world").0,
            [0x0d, 0x4a, 0x11, 0x85]
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
            assert_eq!(combine_full(alg, &parts).unwrap(), of(alg, &data).0);
        }
    }
}
