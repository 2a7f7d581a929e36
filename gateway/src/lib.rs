//! packrat's S3 gateway as a library: the S3 protocol layer (`s3`: SigV4, bodies, checksums
//! on the wire, XML, errors, the handlers and the batch extensions' TAR output), the HTTP
//! server (`server`), the admin API (`admin`), metrics (`metrics`), the access log
//! (`access_log`) and the limits
//! (`config`). It reaches storage only through `packrat_store_api::ObjectStore` and builds
//! without the storage engine (RocksDB, segment files): the fuzz targets depend on it with
//! default features off.
//!
//! The `packrat` binary (`main.rs`, with the `local` feature) opens a `LocalStore` and serves
//! it; `packrat admin` and `packrat bench` are its clients.

pub mod access_log;
pub mod admin;
pub mod config;
pub mod console;
pub mod metrics;
pub mod s3;
pub mod server;
