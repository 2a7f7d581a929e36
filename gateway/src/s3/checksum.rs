//! S3 flexible checksums (CRC32, CRC32C, CRC64NVME, SHA1, SHA256) on the wire: their headers
//! and XML names, parsing what the client sent, and how combined checksums are shown. Computing
//! them is the store's (`packrat_store_api::checksum`).

use super::error::{S3Error, S3ErrorCode, S3Result};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;

pub use packrat_store_api::checksum::{ALL, ChecksumAlgorithm, Hasher};

/// How a checksum algorithm travels in S3 requests and answers.
pub trait ChecksumWire: Sized {
    /// The header that carries this checksum, e.g. `x-amz-checksum-crc32`.
    fn header(self) -> &'static str;
    /// The XML element name in CompleteMultipartUpload and listings, e.g. `ChecksumCRC32`.
    fn xml_name(self) -> &'static str;
    /// The algorithm a request names (`x-amz-checksum-algorithm` and the like).
    fn parse(name: &str) -> S3Result<Self>;
    fn from_header(header: &str) -> Option<Self>;
}

impl ChecksumWire for ChecksumAlgorithm {
    fn header(self) -> &'static str {
        match self {
            Self::Crc32 => "x-amz-checksum-crc32",
            Self::Crc32c => "x-amz-checksum-crc32c",
            Self::Crc64Nvme => "x-amz-checksum-crc64nvme",
            Self::Sha1 => "x-amz-checksum-sha1",
            Self::Sha256 => "x-amz-checksum-sha256",
        }
    }

    fn xml_name(self) -> &'static str {
        match self {
            Self::Crc32 => "ChecksumCRC32",
            Self::Crc32c => "ChecksumCRC32C",
            Self::Crc64Nvme => "ChecksumCRC64NVME",
            Self::Sha1 => "ChecksumSHA1",
            Self::Sha256 => "ChecksumSHA256",
        }
    }

    fn parse(name: &str) -> S3Result<Self> {
        Self::from_name(name).ok_or_else(|| {
            S3Error::new(
                S3ErrorCode::InvalidRequest,
                format!("Checksum algorithm {name} is not supported"),
            )
        })
    }

    fn from_header(header: &str) -> Option<Self> {
        ALL.into_iter()
            .find(|a| a.header().eq_ignore_ascii_case(header))
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
    let raw = packrat_store_api::checksum::composite(alg, part_checksums);
    format!("{}-{}", b64(&raw), part_checksums.len())
}

/// The full-object CRC of a multipart upload, combined from the parts' CRCs and sizes.
pub fn combine_full(alg: ChecksumAlgorithm, parts: &[(u64, u64)]) -> Option<String> {
    packrat_store_api::checksum::combine_full(alg, parts).map(|raw| b64(&raw))
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
