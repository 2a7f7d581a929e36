//! packrat's S3 gateway as a library: the S3 protocol layer (`s3`: SigV4, bodies, checksums
//! on the wire, XML, errors, the handlers and the batch extensions' TAR output), the HTTP
//! server (`server`) and what it shares with every handler (`state`), the admin API (`admin`), metrics (`metrics`), the access log
//! (`access_log`) and the limits (`config`). It reaches storage only through
//! `packrat_store_api::Store` and does not depend on the storage engine (RocksDB,
//! segment files) or the cluster: the `packrat` crate (the binary) opens a store and serves
//! it through this library.

pub mod access_log;
pub mod admin;
pub mod config;
pub mod console;
pub mod metrics;
pub mod s3;
pub mod server;
pub mod state;
