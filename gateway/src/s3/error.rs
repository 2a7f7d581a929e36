//! S3 errors: the one place where a failure becomes an S3 error code and an HTTP status.

use http::StatusCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3ErrorCode {
    AccessDenied,
    BadDigest,
    BucketAlreadyExists,
    BadRequest,
    BucketAlreadyOwnedByYou,
    BucketNotEmpty,
    EntityTooLarge,
    EntityTooSmall,
    IncompleteBody,
    InternalError,
    InvalidAccessKeyId,
    InvalidArgument,
    InvalidBucketName,
    InvalidDigest,
    InvalidPart,
    InvalidPartOrder,
    InvalidRange,
    InvalidRequest,
    InvalidStorageClass,
    InvalidTag,
    InsufficientStorage,
    KeyTooLongError,
    MalformedXML,
    MalformedJSON,
    MetadataTooLarge,
    MethodNotAllowed,
    MissingContentLength,
    NoSuchBucket,
    NoSuchKey,
    NoSuchLifecycleConfiguration,
    NoSuchUpload,
    NotImplemented,
    NotModified,
    PreconditionFailed,
    RequestTimeTooSkewed,
    RequestTimeout,
    ServiceUnavailable,
    SignatureDoesNotMatch,
    SlowDown,
    XAmzContentSHA256Mismatch,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
}

impl S3ErrorCode {
    /// The code string and HTTP status of every error, in one table.
    pub fn parts(self) -> (&'static str, StatusCode) {
        use S3ErrorCode::*;
        match self {
            AccessDenied => ("AccessDenied", StatusCode::FORBIDDEN),
            BadDigest => ("BadDigest", StatusCode::BAD_REQUEST),
            BucketAlreadyExists => ("BucketAlreadyExists", StatusCode::CONFLICT),
            BucketAlreadyOwnedByYou => ("BucketAlreadyOwnedByYou", StatusCode::CONFLICT),
            BucketNotEmpty => ("BucketNotEmpty", StatusCode::CONFLICT),
            EntityTooLarge => ("EntityTooLarge", StatusCode::BAD_REQUEST),
            EntityTooSmall => ("EntityTooSmall", StatusCode::BAD_REQUEST),
            IncompleteBody => ("IncompleteBody", StatusCode::BAD_REQUEST),
            InternalError => ("InternalError", StatusCode::INTERNAL_SERVER_ERROR),
            InvalidAccessKeyId => ("InvalidAccessKeyId", StatusCode::FORBIDDEN),
            InvalidArgument => ("InvalidArgument", StatusCode::BAD_REQUEST),
            BadRequest => ("BadRequest", StatusCode::BAD_REQUEST),
            InvalidBucketName => ("InvalidBucketName", StatusCode::BAD_REQUEST),
            InvalidDigest => ("InvalidDigest", StatusCode::BAD_REQUEST),
            InvalidPart => ("InvalidPart", StatusCode::BAD_REQUEST),
            InvalidPartOrder => ("InvalidPartOrder", StatusCode::BAD_REQUEST),
            InvalidRange => ("InvalidRange", StatusCode::RANGE_NOT_SATISFIABLE),
            InvalidRequest => ("InvalidRequest", StatusCode::BAD_REQUEST),
            InvalidStorageClass => ("InvalidStorageClass", StatusCode::BAD_REQUEST),
            InvalidTag => ("InvalidTag", StatusCode::BAD_REQUEST),
            InsufficientStorage => ("InsufficientStorage", StatusCode::INSUFFICIENT_STORAGE),
            KeyTooLongError => ("KeyTooLongError", StatusCode::BAD_REQUEST),
            MalformedXML => ("MalformedXML", StatusCode::BAD_REQUEST),
            MalformedJSON => ("MalformedJSON", StatusCode::BAD_REQUEST),
            MetadataTooLarge => ("MetadataTooLarge", StatusCode::BAD_REQUEST),
            MethodNotAllowed => ("MethodNotAllowed", StatusCode::METHOD_NOT_ALLOWED),
            MissingContentLength => ("MissingContentLength", StatusCode::LENGTH_REQUIRED),
            NoSuchBucket => ("NoSuchBucket", StatusCode::NOT_FOUND),
            NoSuchKey => ("NoSuchKey", StatusCode::NOT_FOUND),
            NoSuchLifecycleConfiguration => ("NoSuchLifecycleConfiguration", StatusCode::NOT_FOUND),
            NoSuchUpload => ("NoSuchUpload", StatusCode::NOT_FOUND),
            NotImplemented => ("NotImplemented", StatusCode::NOT_IMPLEMENTED),
            NotModified => ("NotModified", StatusCode::NOT_MODIFIED),
            PreconditionFailed => ("PreconditionFailed", StatusCode::PRECONDITION_FAILED),
            RequestTimeTooSkewed => ("RequestTimeTooSkewed", StatusCode::FORBIDDEN),
            RequestTimeout => ("RequestTimeout", StatusCode::BAD_REQUEST),
            SlowDown => ("SlowDown", StatusCode::SERVICE_UNAVAILABLE),
            ServiceUnavailable => ("ServiceUnavailable", StatusCode::SERVICE_UNAVAILABLE),
            SignatureDoesNotMatch => ("SignatureDoesNotMatch", StatusCode::FORBIDDEN),
            XAmzContentSHA256Mismatch => ("XAmzContentSHA256Mismatch", StatusCode::BAD_REQUEST),
            AuthorizationHeaderMalformed => {
                ("AuthorizationHeaderMalformed", StatusCode::BAD_REQUEST)
            }
            AuthorizationQueryParametersError => {
                ("AuthorizationQueryParametersError", StatusCode::BAD_REQUEST)
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct S3Error {
    pub code: S3ErrorCode,
    pub message: String,
    /// Extra headers the error must carry (for example `Content-Range` on 416).
    pub headers: Vec<(&'static str, String)>,
}

impl S3Error {
    pub fn new(code: S3ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            headers: Vec::new(),
        }
    }

    pub fn with_header(mut self, name: &'static str, value: String) -> Self {
        self.headers.push((name, value));
        self
    }

    pub fn internal(context: &str, e: impl std::fmt::Display) -> Self {
        tracing::error!(error = %e, "{context}");
        Self::new(
            S3ErrorCode::InternalError,
            "We encountered an internal error. Please try again.",
        )
    }
}

// Not in fuzz builds, which compile this file on its own without the index (and RocksDB).
#[cfg(not(fuzzing))]
impl From<packrat_index::IndexError> for S3Error {
    fn from(e: packrat_index::IndexError) -> Self {
        use packrat_index::IndexError as E;
        match e {
            E::BucketExists => S3Error::new(
                S3ErrorCode::BucketAlreadyExists,
                "The requested bucket name is not available.",
            ),
            E::NoSuchBucket => S3Error::new(
                S3ErrorCode::NoSuchBucket,
                "The specified bucket does not exist",
            ),
            E::BucketNotEmpty => S3Error::new(
                S3ErrorCode::BucketNotEmpty,
                "The bucket you tried to delete is not empty",
            ),
            E::Rocks(_) | E::Corrupt { .. } | E::Injected => S3Error::internal("index error", e),
        }
    }
}

impl From<packrat_chunk_store::ChunkStoreError> for S3Error {
    fn from(e: packrat_chunk_store::ChunkStoreError) -> Self {
        use packrat_chunk_store::ChunkStoreError as E;
        match e {
            E::NoSpace { .. } => {
                tracing::error!(error = %e, "disk full");
                S3Error::new(
                    S3ErrorCode::InsufficientStorage,
                    "The server's data disk is full; nothing was stored.",
                )
            }
            E::Corrupt { .. } | E::MissingSegment(_) => {
                tracing::error!(error = %e, "stored data failed verification; not served");
                S3Error::new(
                    S3ErrorCode::InternalError,
                    "Stored data failed checksum verification and was not served.",
                )
            }
            E::Unrecoverable { .. } => {
                tracing::error!(error = %e, "object data lost beyond the erasure code's reach");
                S3Error::new(
                    S3ErrorCode::InternalError,
                    "The object's data is on more failed disks than the erasure code can rebuild \
                     from; it was not served. Other objects are unaffected.",
                )
            }
            E::Io { .. } | E::RecordTooLarge(_) | E::Config(_) => {
                S3Error::internal("chunk store error", e)
            }
        }
    }
}

pub type S3Result<T> = Result<T, S3Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_table() {
        let cases = [
            (S3ErrorCode::NoSuchKey, "NoSuchKey", 404),
            (S3ErrorCode::NoSuchBucket, "NoSuchBucket", 404),
            (S3ErrorCode::NoSuchUpload, "NoSuchUpload", 404),
            (S3ErrorCode::BucketNotEmpty, "BucketNotEmpty", 409),
            (
                S3ErrorCode::BucketAlreadyOwnedByYou,
                "BucketAlreadyOwnedByYou",
                409,
            ),
            (
                S3ErrorCode::SignatureDoesNotMatch,
                "SignatureDoesNotMatch",
                403,
            ),
            (S3ErrorCode::InvalidAccessKeyId, "InvalidAccessKeyId", 403),
            (S3ErrorCode::AccessDenied, "AccessDenied", 403),
            (
                S3ErrorCode::RequestTimeTooSkewed,
                "RequestTimeTooSkewed",
                403,
            ),
            (S3ErrorCode::InvalidRange, "InvalidRange", 416),
            (S3ErrorCode::PreconditionFailed, "PreconditionFailed", 412),
            (S3ErrorCode::NotModified, "NotModified", 304),
            (S3ErrorCode::NotImplemented, "NotImplemented", 501),
            (S3ErrorCode::InsufficientStorage, "InsufficientStorage", 507),
            (S3ErrorCode::MalformedXML, "MalformedXML", 400),
            (S3ErrorCode::InvalidStorageClass, "InvalidStorageClass", 400),
            (S3ErrorCode::InvalidTag, "InvalidTag", 400),
            (S3ErrorCode::BadRequest, "BadRequest", 400),
            (S3ErrorCode::ServiceUnavailable, "ServiceUnavailable", 503),
            (
                S3ErrorCode::NoSuchLifecycleConfiguration,
                "NoSuchLifecycleConfiguration",
                404,
            ),
            (
                S3ErrorCode::XAmzContentSHA256Mismatch,
                "XAmzContentSHA256Mismatch",
                400,
            ),
        ];
        for (code, name, status) in cases {
            assert_eq!(code.parts(), (name, StatusCode::from_u16(status).unwrap()));
        }
    }
}
