//! Object Ownership (a bucket's, and the server's default for new buckets).

/// A bucket's Object Ownership: who owns the objects written into it, and whether they carry
/// ACLs of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ownership {
    /// ACLs disabled; the bucket's owner owns every object (S3's default, and packrat's).
    BucketOwnerEnforced,
    /// ACLs enabled; the bucket's owner owns an object written with the canned ACL
    /// `bucket-owner-full-control`, the writer owns any other.
    BucketOwnerPreferred,
    /// ACLs enabled; the writer owns the object.
    ObjectWriter,
}

impl Ownership {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "BucketOwnerEnforced" => Some(Self::BucketOwnerEnforced),
            "BucketOwnerPreferred" => Some(Self::BucketOwnerPreferred),
            "ObjectWriter" => Some(Self::ObjectWriter),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::BucketOwnerEnforced => "BucketOwnerEnforced",
            Self::BucketOwnerPreferred => "BucketOwnerPreferred",
            Self::ObjectWriter => "ObjectWriter",
        }
    }

    pub fn acls_enabled(self) -> bool {
        self != Self::BucketOwnerEnforced
    }
}
