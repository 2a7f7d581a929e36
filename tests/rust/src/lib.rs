//! packrat-sdk-tests: no library code; `tests/sdk.rs` starts the real `packrat` binary and
//! drives it with the Rust AWS SDK over a loopback socket.
