//! Where a write's bytes come from. The S3 layer's body reader (plain or aws-chunked) and an
//! existing object's reader (a copy) both implement [`ByteSource`], so the store streams a
//! request body without knowing anything of HTTP or S3.

use crate::checksum::ChecksumAlgorithm;
use crate::error::StoreResult;
use bytes::Bytes;

pub trait ByteSource: Send {
    /// The next piece of the payload, `None` at its end. A failure of the source itself comes
    /// back as `StoreError::Source`, carrying the source's own error.
    fn next_piece(&mut self) -> impl Future<Output = StoreResult<Option<Bytes>>> + Send;

    /// A checksum that arrived after the payload (an aws-chunked trailer), as raw bytes, once
    /// the payload has ended; `None` if the source carried none for `alg`.
    fn trailing_checksum(&self, alg: ChecksumAlgorithm) -> StoreResult<Option<Vec<u8>>>;
}
