//! Where segments are: a segment's placement on the disks (copies or shards), and the names
//! and directories of its files.

use crate::io::SegmentIo;
use crate::{Result, io_err};
use std::path::{Path, PathBuf};

/// Where a segment's bytes are: whole copies (the open segment, and sealed ones not yet
/// encoded) or erasure-coded shards. This is the segment catalog; it is derived at start-up
/// from the self-describing files on the disks (segment and shard headers), so it can never
/// disagree with them.
#[derive(Debug, Clone)]
pub(crate) enum Placement {
    /// Disks holding a full copy of the segment file.
    Copies(Vec<usize>),
    /// The disk of each shard (`None`: lost, to be rebuilt).
    Shards {
        layout: packrat_erasure::Layout,
        disks: Vec<Option<usize>>,
    },
}

pub(crate) fn segment_name(id: u64) -> String {
    format!("seg-{id:016x}.pkr")
}

pub(crate) fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(segment_name(id))
}

pub(crate) fn parse_segment_name(name: &str) -> Option<u64> {
    let hex = name.strip_prefix("seg-")?.strip_suffix(".pkr")?;
    u64::from_str_radix(hex, 16).ok()
}

/// fsync a directory so that a file created or renamed in it survives a crash.
pub(crate) fn sync_dir(io: &dyn SegmentIo, dir: &Path) -> Result<()> {
    io.sync_dir(dir).map_err(|e| io_err(dir, e))
}

pub(crate) fn list_dir<T>(dir: &Path, parse: impl Fn(&str) -> Option<T>) -> Result<Vec<(T, u64)>> {
    let mut out = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        // A lost disk (read-only opening creates nothing): no files there.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
        Err(e) => return Err(io_err(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_err(dir, e))?;
        if let Some(t) = entry.file_name().to_str().and_then(&parse) {
            let len = entry.metadata().map(|m| m.len()).unwrap_or(0);
            out.push((t, len));
        }
    }
    Ok(out)
}

pub(crate) fn tmp_path(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".tmp");
    PathBuf::from(s)
}
