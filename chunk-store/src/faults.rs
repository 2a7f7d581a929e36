//! What an injected fault does (the rules that inject them are [`crate::io::FaultyIo`]'s).

/// What an injected fault does to the operation it hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Fault {
    #[default]
    None,
    /// The operation fails with EIO.
    Eio,
    /// The operation fails with ENOSPC.
    Enospc,
    /// Half of the bytes are written, then the write fails with EIO (writes only; on other
    /// operations, EIO).
    Torn,
    /// The operation waits [`SLOW`], then runs and succeeds (a stalled disk: a sync that
    /// takes long keeps a write staged and not yet visible).
    Slow,
}

/// How long a [`Fault::Slow`] operation waits.
pub const SLOW: std::time::Duration = std::time::Duration::from_secs(1);
