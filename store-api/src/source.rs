//! Where a write's bytes come from. The S3 layer's body reader (plain or aws-chunked) and an
//! existing object's reader (a copy) both implement [`ByteSource`], so a store streams a
//! request body without knowing anything of HTTP or S3.

use crate::checksum::ChecksumAlgorithm;
use crate::error::StoreResult;
use bytes::Bytes;

/// Used as `&mut dyn ByteSource` (the store trait is object-safe), so each piece's future is
/// boxed: one allocation per piece of a body (tens of KiB), nothing next to the copy.
#[async_trait::async_trait]
pub trait ByteSource: Send {
    /// The next piece of the payload, `None` at its end. A failure of the source itself comes
    /// back as `StoreError::Source`, carrying the source's own error.
    async fn next_piece(&mut self) -> StoreResult<Option<Bytes>>;

    /// A checksum that arrived after the payload (an aws-chunked trailer), as raw bytes, once
    /// the payload has ended; `None` if the source carried none for `alg`.
    fn trailing_checksum(&self, alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>>;

    /// The MD5 the object's ETag shows when it is not the stored bytes' MD5, once the payload
    /// has ended: an SSE-S3 object's plaintext MD5, as S3 shows it (tools such as rclone take
    /// an SSE-S3 ETag for the content's MD5). `None`: the stored bytes' MD5.
    fn shown_md5(&self) -> Option<[u8; 16]> {
        None
    }

    /// The MD5 of the bytes this source yields, when it is known before they are read (a
    /// cluster member's chain step carries the one its head computed, and the member checks
    /// the bytes against the head's CRC instead). A store may take it rather than hash the
    /// bytes again, so it must be the bytes' MD5.
    fn known_md5(&self) -> Option<[u8; 16]> {
        None
    }
}
