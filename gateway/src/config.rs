//! Server configuration and the named limits every request is held to.

use std::path::PathBuf;

/// Largest object a single PutObject may carry (S3's limit: 5 GiB).
pub const OBJECT_BYTES_MAX: u64 = 5 * 1024 * 1024 * 1024;
// The smallest part that is not the last (5 MiB) is the store's to enforce at Complete
// (`packrat_store_api::PART_BYTES_MIN`).
/// Most parts an upload may have.
pub const PARTS_MAX: u32 = 10_000;
/// Longest key, in bytes of UTF-8.
pub const KEY_BYTES_MAX: usize = 1024;
/// Total size of user metadata (names and values), as in S3.
pub const USER_METADATA_BYTES_MAX: usize = 2048;
/// Largest XML body accepted (DeleteObjects with 1000 long keys fits).
pub const XML_BODY_BYTES_MAX: usize = 2 * 1024 * 1024;
/// Most keys in one DeleteObjects request.
pub const DELETE_OBJECTS_KEYS_MAX: usize = 1000;
/// Most entries in one listing page.
pub const LIST_KEYS_MAX: usize = 1000;
/// Default largest request head (request line plus headers) (`--max-header-bytes`).
pub const REQUEST_HEAD_BYTES_MAX: usize = 64 * 1024;
/// Default most headers in one request (`--max-headers`).
pub const REQUEST_HEADERS_MAX: usize = 100;
/// Default time a client has to send its request head (`--header-timeout`); it also bounds
/// how long a connection may sit idle between requests.
pub const HEADER_READ_TIMEOUT_SECS: u64 = 30;
/// Longest pause allowed between two pieces of a request body.
pub const BODY_IDLE_TIMEOUT_SECS: u64 = 30;
/// Largest batch GET request body (the JSON list of items).
pub const BATCH_JSON_BYTES_MAX: usize = 32 * 1024 * 1024;
/// Default bound on items per batch GET and members per extracted TAR (`--batch-items-max`).
pub const BATCH_ITEMS_MAX_DEFAULT: usize = 100_000;
/// Default bound on the bytes one batch GET may ask for (`--batch-bytes-max`).
pub const BATCH_BYTES_MAX_DEFAULT: u64 = 10 * 1024 * 1024 * 1024;
/// Default bound on open client connections; past it new connections get 503 SlowDown.
pub const CONNECTIONS_MAX_DEFAULT: usize = 4096;

#[derive(Debug, Clone)]
pub struct ServeConfig {
    pub data_dir: PathBuf,
    pub region: String,
    /// With a domain, `bucket.domain` hosts select buckets (virtual-host style).
    pub domain: Option<String>,
    /// Open client connections allowed at once.
    pub max_connections: usize,
    /// Longest pause allowed between two pieces of a request body.
    pub body_idle_timeout_secs: u64,
    /// Largest request head, most headers, and the time allowed to send the head.
    pub max_header_bytes: usize,
    pub max_headers: usize,
    pub header_timeout_secs: u64,
    /// Most items in one batch GET, and members in one extracted TAR.
    pub batch_items_max: usize,
    /// Most bytes one batch GET may ask for.
    pub batch_bytes_max: u64,
    /// Sealed segments with a smaller live share than this are compacted.
    pub compact_threshold: f64,
    /// Seconds a compacted segment stays readable through open handles.
    pub compact_grace_secs: u64,
    /// Enables `PUT /_packrat/admin/faults` (tests only).
    pub fault_injection: bool,
    /// One info line per request on the `packrat::access` target (`--no-access-log` clears it).
    pub access_log: bool,
    /// Log lines as JSON objects (`--log-format json`); the access log follows.
    pub log_json: bool,
    /// Takes SSE-C keys over plain HTTP too (refused there otherwise, as S3 does).
    pub allow_insecure_sse_c: bool,
    /// The Object Ownership of a bucket created without `x-amz-object-ownership`
    /// (`--default-object-ownership`): `BucketOwnerEnforced` (ACLs disabled) as AWS today.
    pub default_object_ownership: crate::s3::ownership::Ownership,
    /// A storage node's read endpoint (`packrat node --s3-listen`): only GetObject,
    /// HeadObject and batch GET of what the node holds; every other request is refused with
    /// 405 and sent to a gateway (see `s3::handlers::is_node_read`).
    pub reads_only: bool,
}

/// Most bytes of a request body left unread by its handler (an error answered before the body
/// was read) that are read and dropped so the connection stays usable; past it the answer
/// closes the connection.
pub const UNREAD_BODY_DRAIN_BYTES_MAX: u64 = 1024 * 1024;
/// Longest wait for that unread rest.
pub const UNREAD_BODY_DRAIN_SECS: u64 = 2;
