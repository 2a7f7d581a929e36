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
