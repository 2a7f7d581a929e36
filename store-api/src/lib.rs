//! packrat-store-api: the seam between the S3 layer and storage.
//!
//! Owns the vocabulary both sides speak: what can go wrong ([`StoreError`], by kind, never an
//! S3 code), the flexible checksums a write carries ([`checksum`]), lifecycle rules and their
//! evaluation ([`lifecycle`]), and where a write's bytes come from ([`ByteSource`]).
//!
//! It must never depend on RocksDB, files, the storage crates or HTTP: the S3 layer (and its
//! fuzz targets) build against it without the storage engine.

pub mod checksum;
pub mod error;
pub mod lifecycle;
pub mod source;

pub use error::{Digest, StoreError, StoreResult};
pub use source::ByteSource;
