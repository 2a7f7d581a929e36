//! packrat-store: the storage engine of one packrat node, with no HTTP or S3 in it.
//!
//! Owns the write protocol (stream into records, verify digests, key locks and write
//! conditions, group commit: records durable, then the index entry, then the answer) in
//! [`engine`]; reads of object bytes (verified chunk by chunk, locally or from a tier);
//! compaction ([`compact`]); storage tiers, the tier mover and lifecycle execution ([`tier`],
//! [`lifecycle`]); erasure-coding upkeep (sealing, repair, disk probes, scrub: [`ec`]); the
//! offline verifier ([`verify`]); and the progress of long admin jobs ([`job`]).
//!
//! Main types: [`engine::Engine`], [`StoreError`], the [`ByteSource`] a write reads from.
//!
//! Depends on `packrat-index`, `packrat-chunk-store` and `packrat-tiering`. It must never
//! depend on HTTP, hyper or the S3 layer: failures are [`StoreError`] kinds, which the S3 layer
//! maps to S3 codes in one place, and request bodies arrive through [`ByteSource`].

pub mod checksum;
pub mod compact;
pub mod ec;
pub mod engine;
pub mod error;
pub mod job;
pub mod lifecycle;
pub mod source;
pub mod tier;
pub mod verify;

pub use error::{Digest, StoreError, StoreResult};
pub use source::ByteSource;
