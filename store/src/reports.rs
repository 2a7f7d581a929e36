//! What the store's background jobs report and keep between runs: plain data, so the engine
//! that holds them needs none of the jobs' code.

pub use packrat_store_api::reports::{CompactReport, Space};
