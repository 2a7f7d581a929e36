//! packrat-erasure: the Reed-Solomon codec for sealed segments (issue 5).
//!
//! Not built yet: packrat currently stores each segment once, on one data directory, and says
//! so in the README's compatibility table. When it lands this crate stays pure: byte slices in,
//! byte slices out, no I/O and no async. It must never depend on the other packrat crates.
