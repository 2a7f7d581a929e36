//! packrat-store: the storage engine of one packrat node, with no HTTP or S3 in it.
//!
//! Owns the write protocol (stream into records, verify digests, key locks and write
//! conditions, group commit: records durable, then the index entry, then the answer) in
//! `engine` (private to the crate); reads of object bytes (verified chunk by chunk, locally
//! or from a tier); batch reads and writes ([`batch`]); access keys ([`keys`]); status,
//! fault switches and metrics ([`admin`]); versioned meta records ([`meta`]); compaction ([`compact`]); storage tiers, the tier mover and lifecycle execution ([`tier`]);
//! erasure-coding upkeep (sealing, repair, disk probes, scrub: [`ec`]); the offline verifier
//! ([`verify`]); and the progress of long admin jobs ([`job`]).
//!
//! Main types: [`LocalStore`] (the engine behind the `ObjectStore` trait, opened from
//! [`local::LocalOptions`]) and [`EngineError`], a `packrat_store_api::StoreError` that
//! the index's, chunk store's and tiers' failures convert into. The vocabulary it shares with
//! the S3 layer (errors, checksums, lifecycle rules, the `ByteSource` a write reads from) is
//! in `packrat-store-api`.
//!
//! Depends on `packrat-store-api`, `packrat-index`, `packrat-chunk-store` and
//! `packrat-tiering`. It must never depend on hyper or the S3 layer: failures are `StoreError`
//! kinds, which the S3 layer maps to S3 codes in one place, and request bodies arrive through
//! `ByteSource`.

pub mod admin;
pub mod batch;
pub mod compact;
pub mod ec;
pub(crate) mod engine;
pub mod error;
pub use packrat_secrets::files;
pub mod job;
pub mod keys;
pub mod local;
pub use packrat_secrets::master_key;
pub mod meta;
pub mod multipart;
pub mod reports;
mod summary;
pub mod tier;
pub mod tiers;
pub mod verify;
pub(crate) mod versions;

pub use error::{EngineError, EngineResult};
pub use local::LocalStore;
