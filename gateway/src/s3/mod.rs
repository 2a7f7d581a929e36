//! The S3 protocol layer: signatures, bodies, checksums, XML, errors and the handlers. It sees
//! storage only through the `ObjectStore` trait (`packrat_store_api`) and never names RocksDB,
//! the engine or a file.

pub mod acl;
pub mod auth;
pub mod batch_request;
pub mod body;
pub mod checksum;
pub mod cors;
pub mod encoding;
pub mod error;
pub mod handlers;
pub mod headers;
pub mod lifecycle;
pub mod ownership;
pub mod policy;
pub mod post_policy;
pub mod range;
pub mod rfc2047;
pub mod route;
pub mod sigv4;
pub mod sse;
pub mod tagging;
pub mod xml;
