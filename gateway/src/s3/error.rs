//! S3 errors: the one place where a failure becomes an S3 error code and an HTTP status.

use http::StatusCode;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3ErrorCode {
    /// An object ACL other than the owner's full control: object ACLs are disabled (S3's
    /// "bucket owner enforced" Object Ownership).
    AccessControlListNotSupported,
    AccessDenied,
    /// A CORS request (preflight) that the bucket's rules do not allow.
    AccessForbidden,
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
    /// The bucket's state forbids the change (Object Lock and versioning).
    InvalidBucketState,
    InvalidDigest,
    /// SSE-C with an algorithm other than AES256.
    InvalidEncryptionAlgorithmError,
    InvalidPart,
    InvalidPartOrder,
    /// A form upload's policy document that does not parse.
    InvalidPolicyDocument,
    InvalidRange,
    InvalidRequest,
    /// An Object Lock default retention of zero, negative or too many days or years.
    InvalidRetentionPeriod,
    InvalidStorageClass,
    InvalidTag,
    InsufficientStorage,
    KeyTooLongError,
    /// An SSE-KMS key that does not exist (`KMS.NotFoundException`, as S3 answers it).
    KmsNotFound,
    MalformedXML,
    /// An ACL (a PutObjectAcl body or a grant header) that names no valid grantee or
    /// permission.
    MalformedACLError,
    MalformedJSON,
    /// A bucket policy that does not parse or names what packrat cannot evaluate.
    MalformedPolicy,
    /// A form upload's body that is not multipart/form-data.
    MalformedPOSTRequest,
    /// A form upload's fields before its file exceed 20 KiB.
    MaxPostPreDataLengthExceeded,
    MetadataTooLarge,
    MethodNotAllowed,
    /// A storage node's read endpoint asked for what it does not hold (421, with the node's
    /// map epoch in `x-packrat-map-epoch`): a client routing by an older map.
    Misdirected,
    MissingContentLength,
    NoSuchBucket,
    NoSuchKey,
    NoSuchLifecycleConfiguration,
    NoSuchUpload,
    NoSuchVersion,
    NotImplemented,
    NotModified,
    PreconditionFailed,
    RequestTimeTooSkewed,
    RequestTimeout,
    ServiceUnavailable,
    SignatureDoesNotMatch,
    SlowDown,
    /// A grant to an e-mail address: packrat's users have none.
    UnresolvableGrantByEmailAddress,
    XAmzContentSHA256Mismatch,
    AuthorizationHeaderMalformed,
    AuthorizationQueryParametersError,
    /// 404 for a bucket configuration packrat has and this bucket does not (S3 names each:
    /// `NoSuchCORSConfiguration`, `NoSuchBucketPolicy`, ...).
    NotConfigured(&'static str),
}

impl S3ErrorCode {
    /// The code string and HTTP status of every error, in one table.
    pub fn parts(self) -> (&'static str, StatusCode) {
        use S3ErrorCode::*;
        match self {
            AccessDenied => ("AccessDenied", StatusCode::FORBIDDEN),
            AccessControlListNotSupported => {
                ("AccessControlListNotSupported", StatusCode::BAD_REQUEST)
            }
            AccessForbidden => ("AccessForbidden", StatusCode::FORBIDDEN),
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
            InvalidBucketState => ("InvalidBucketState", StatusCode::CONFLICT),
            InvalidDigest => ("InvalidDigest", StatusCode::BAD_REQUEST),
            InvalidEncryptionAlgorithmError => {
                ("InvalidEncryptionAlgorithmError", StatusCode::BAD_REQUEST)
            }
            InvalidPart => ("InvalidPart", StatusCode::BAD_REQUEST),
            InvalidPartOrder => ("InvalidPartOrder", StatusCode::BAD_REQUEST),
            InvalidPolicyDocument => ("InvalidPolicyDocument", StatusCode::BAD_REQUEST),
            InvalidRange => ("InvalidRange", StatusCode::RANGE_NOT_SATISFIABLE),
            InvalidRequest => ("InvalidRequest", StatusCode::BAD_REQUEST),
            InvalidRetentionPeriod => ("InvalidRetentionPeriod", StatusCode::BAD_REQUEST),
            InvalidStorageClass => ("InvalidStorageClass", StatusCode::BAD_REQUEST),
            InvalidTag => ("InvalidTag", StatusCode::BAD_REQUEST),
            InsufficientStorage => ("InsufficientStorage", StatusCode::INSUFFICIENT_STORAGE),
            KeyTooLongError => ("KeyTooLongError", StatusCode::BAD_REQUEST),
            KmsNotFound => ("KMS.NotFoundException", StatusCode::BAD_REQUEST),
            MalformedXML => ("MalformedXML", StatusCode::BAD_REQUEST),
            MalformedACLError => ("MalformedACLError", StatusCode::BAD_REQUEST),
            MalformedJSON => ("MalformedJSON", StatusCode::BAD_REQUEST),
            MalformedPolicy => ("MalformedPolicy", StatusCode::BAD_REQUEST),
            MalformedPOSTRequest => ("MalformedPOSTRequest", StatusCode::BAD_REQUEST),
            MaxPostPreDataLengthExceeded => {
                ("MaxPostPreDataLengthExceededError", StatusCode::BAD_REQUEST)
            }
            MetadataTooLarge => ("MetadataTooLarge", StatusCode::BAD_REQUEST),
            MethodNotAllowed => ("MethodNotAllowed", StatusCode::METHOD_NOT_ALLOWED),
            Misdirected => ("PackratMisdirected", StatusCode::MISDIRECTED_REQUEST),
            MissingContentLength => ("MissingContentLength", StatusCode::LENGTH_REQUIRED),
            NoSuchBucket => ("NoSuchBucket", StatusCode::NOT_FOUND),
            NoSuchKey => ("NoSuchKey", StatusCode::NOT_FOUND),
            NoSuchLifecycleConfiguration => ("NoSuchLifecycleConfiguration", StatusCode::NOT_FOUND),
            NoSuchUpload => ("NoSuchUpload", StatusCode::NOT_FOUND),
            NoSuchVersion => ("NoSuchVersion", StatusCode::NOT_FOUND),
            NotImplemented => ("NotImplemented", StatusCode::NOT_IMPLEMENTED),
            NotModified => ("NotModified", StatusCode::NOT_MODIFIED),
            PreconditionFailed => ("PreconditionFailed", StatusCode::PRECONDITION_FAILED),
            RequestTimeTooSkewed => ("RequestTimeTooSkewed", StatusCode::FORBIDDEN),
            RequestTimeout => ("RequestTimeout", StatusCode::BAD_REQUEST),
            SlowDown => ("SlowDown", StatusCode::SERVICE_UNAVAILABLE),
            UnresolvableGrantByEmailAddress => {
                ("UnresolvableGrantByEmailAddress", StatusCode::BAD_REQUEST)
            }
            ServiceUnavailable => ("ServiceUnavailable", StatusCode::SERVICE_UNAVAILABLE),
            SignatureDoesNotMatch => ("SignatureDoesNotMatch", StatusCode::FORBIDDEN),
            XAmzContentSHA256Mismatch => ("XAmzContentSHA256Mismatch", StatusCode::BAD_REQUEST),
            AuthorizationHeaderMalformed => {
                ("AuthorizationHeaderMalformed", StatusCode::BAD_REQUEST)
            }
            AuthorizationQueryParametersError => {
                ("AuthorizationQueryParametersError", StatusCode::BAD_REQUEST)
            }
            NotConfigured(code) => (code, StatusCode::NOT_FOUND),
        }
    }
}

/// The map epoch a storage node's read endpoint answers a misdirected request with, and a
/// routing client's map epoch on its requests.
pub const MAP_EPOCH_HEADER: &str = "x-packrat-map-epoch";

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

impl std::fmt::Display for S3Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.code.parts().0, self.message)
    }
}

impl std::error::Error for S3Error {}

// The store's failures as S3 errors: the one place where a storage failure gets its S3 code,
// status and message.
impl From<packrat_store_api::StoreError> for S3Error {
    fn from(e: packrat_store_api::StoreError) -> Self {
        use packrat_store_api::{Digest, StoreError as E};
        match e {
            E::NoSuchBucket => S3Error::new(
                S3ErrorCode::NoSuchBucket,
                "The specified bucket does not exist",
            ),
            E::BucketExists => S3Error::new(
                S3ErrorCode::BucketAlreadyExists,
                "The requested bucket name is not available.",
            ),
            E::BucketNotEmpty => S3Error::new(
                S3ErrorCode::BucketNotEmpty,
                "The bucket you tried to delete is not empty",
            ),
            E::NoSuchKey => {
                S3Error::new(S3ErrorCode::NoSuchKey, "The specified key does not exist.")
            }
            E::NoSuchMember(member) => S3Error::new(
                S3ErrorCode::NoSuchKey,
                format!("The TAR object has no member {member:?}."),
            ),
            E::RangeNotSatisfiable { size } => S3Error::new(
                S3ErrorCode::InvalidRange,
                format!("The requested range is not satisfiable (size {size})."),
            ),
            E::NoSuchUpload => S3Error::new(
                S3ErrorCode::NoSuchUpload,
                "The specified upload does not exist. The upload ID may be invalid, or the upload \
                 may have been aborted or completed.",
            ),
            E::InvalidPart(message) => S3Error::new(S3ErrorCode::InvalidPart, message),
            E::InvalidPartOrder => S3Error::new(
                S3ErrorCode::InvalidPartOrder,
                "The list of parts was not in ascending order. The parts list must be specified \
                 in order by part number.",
            ),
            E::EntityTooSmall => S3Error::new(
                S3ErrorCode::EntityTooSmall,
                "Your proposed upload is smaller than the minimum allowed object size.",
            ),
            E::PreconditionFailed => S3Error::new(
                S3ErrorCode::PreconditionFailed,
                "At least one of the pre-conditions you specified did not hold",
            ),
            E::BadDigest(Digest::ContentMd5) => S3Error::new(
                S3ErrorCode::BadDigest,
                "The Content-MD5 you specified did not match what we received.",
            ),
            E::BadDigest(Digest::Checksum(alg)) => S3Error::new(
                S3ErrorCode::BadDigest,
                format!(
                    "The {} you specified did not match the calculated checksum.",
                    alg.name()
                ),
            ),
            E::InsufficientStorage(_) => {
                tracing::error!(error = %e, "disk full");
                S3Error::new(
                    S3ErrorCode::InsufficientStorage,
                    "The server's data disk is full; nothing was stored.",
                )
            }
            E::Corrupt(_) => {
                tracing::error!(error = %e, "stored data failed verification; not served");
                S3Error::new(
                    S3ErrorCode::InternalError,
                    "Stored data failed checksum verification and was not served.",
                )
            }
            E::Unrecoverable(_) => {
                tracing::error!(error = %e, "object data lost beyond the erasure code's reach");
                S3Error::new(
                    S3ErrorCode::InternalError,
                    "The object's data is on more failed disks than the erasure code can rebuild \
                     from; it was not served. Other objects are unaffected.",
                )
            }
            E::TierData(_) => {
                tracing::error!(error = %e, "tiered data missing or wrong; not served");
                S3Error::new(
                    S3ErrorCode::InternalError,
                    "The object's data on its storage tier is missing or failed verification; it was not served.",
                )
            }
            E::Unavailable(message) => {
                tracing::warn!(error = %message, "unavailable");
                S3Error::new(S3ErrorCode::ServiceUnavailable, message)
            }
            E::Invalid(message) => S3Error::new(S3ErrorCode::InvalidRequest, message),
            E::Misdirected { what, epoch } => S3Error::new(
                S3ErrorCode::Misdirected,
                format!(
                    "This storage node does not serve {what} by its map (epoch {epoch}): fetch the map again, or send the request to a gateway."
                ),
            )
            .with_header(MAP_EPOCH_HEADER, epoch.to_string()),
            E::ObjectLocked(message) => S3Error::new(S3ErrorCode::AccessDenied, message),
            E::InvalidBucketState(message) => {
                S3Error::new(S3ErrorCode::InvalidBucketState, message)
            }
            E::Internal { context, detail } => S3Error::internal(context, detail),
            E::Source(source) => match source.downcast_ref::<S3Error>() {
                Some(s3) => s3.clone(),
                None => S3Error::internal("request body", source),
            },
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
            (S3ErrorCode::NoSuchVersion, "NoSuchVersion", 404),
            (S3ErrorCode::BucketNotEmpty, "BucketNotEmpty", 409),
            (S3ErrorCode::InvalidBucketState, "InvalidBucketState", 409),
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
                S3ErrorCode::AccessControlListNotSupported,
                "AccessControlListNotSupported",
                400,
            ),
            (S3ErrorCode::AccessForbidden, "AccessForbidden", 403),
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
            (S3ErrorCode::Misdirected, "PackratMisdirected", 421),
            (S3ErrorCode::MalformedXML, "MalformedXML", 400),
            (S3ErrorCode::MalformedACLError, "MalformedACLError", 400),
            (
                S3ErrorCode::UnresolvableGrantByEmailAddress,
                "UnresolvableGrantByEmailAddress",
                400,
            ),
            (S3ErrorCode::MalformedPolicy, "MalformedPolicy", 400),
            (S3ErrorCode::InvalidStorageClass, "InvalidStorageClass", 400),
            (S3ErrorCode::InvalidTag, "InvalidTag", 400),
            (
                S3ErrorCode::InvalidPolicyDocument,
                "InvalidPolicyDocument",
                400,
            ),
            (
                S3ErrorCode::MalformedPOSTRequest,
                "MalformedPOSTRequest",
                400,
            ),
            (
                S3ErrorCode::MaxPostPreDataLengthExceeded,
                "MaxPostPreDataLengthExceededError",
                400,
            ),
            (S3ErrorCode::BadRequest, "BadRequest", 400),
            (
                S3ErrorCode::InvalidEncryptionAlgorithmError,
                "InvalidEncryptionAlgorithmError",
                400,
            ),
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
