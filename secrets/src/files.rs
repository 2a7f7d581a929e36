//! Small files a data directory keeps beside its index (the master key, a cluster node's
//! held PGs), replaced durably.

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

/// Replaces `path` with `bytes` so that a crash leaves the old file or the new one, never a
/// part: written aside (`<name>.tmp`, with `mode`), synced, renamed over, and the directory
/// synced (a rename is durable only once its directory is).
pub fn replace_durably(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => std::fs::File::open(dir)?.sync_all(),
        _ => Ok(()),
    }
}
