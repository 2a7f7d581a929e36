//! Erasure-coded segments: the shard file format, reads straight from a data shard or rebuilt
//! from the others, sealing (encoding a mirrored segment into shards) and repair.
//!
//! Shard file `shards/seg-<id:016x>.<index:02>.pks`, format version 1:
//!
//! | offset                     | bytes           | field                                   |
//! |---------------------------:|----------------:|-----------------------------------------|
//! | 0                          | 64              | shard header (below), zero-padded       |
//! | 4096                       | shard length    | shard body                              |
//! | 4096 + shard length        | 4 per block     | crc32c of each 64 KiB block of the body |
//!
//! Shard header:
//!
//! | offset | bytes | field                                            |
//! |-------:|------:|--------------------------------------------------|
//! | 0      | 4     | magic `PKSH`                                     |
//! | 4      | 2     | format version, u16 LE (1)                       |
//! | 6      | 2     | shard index, u16 LE (0..k data, k..k+m parity)   |
//! | 8      | 8     | segment id, u64 LE                               |
//! | 16     | 2     | k, u16 LE                                        |
//! | 18     | 2     | m, u16 LE                                        |
//! | 20     | 4     | reserved, zero                                   |
//! | 24     | 8     | segment length in bytes, u64 LE                  |
//! | 32     | 8     | shard length in bytes, u64 LE                    |
//! | 40     | 8     | created, unix milliseconds, u64 LE               |
//! | 48     | 12    | reserved, zero                                   |
//! | 60     | 4     | crc32c of bytes 0..60, u32 LE                    |
//!
//! Data shard `i` is bytes `[i * shard_len, (i + 1) * shard_len)` of the segment file as it was
//! written (segment header and records), the last one zero-padded; a record is read from its
//! data shard at `4096 + (offset - i * shard_len)`, one read from one disk (two when it
//! straddles a shard boundary). Parity shards are Reed-Solomon (`packrat-erasure`) over the
//! data shards, byte by byte, so any range of a shard can be rebuilt from the same range of
//! any `k` others. The block crcs let a rebuild use only verified bytes, and let the scrubber
//! find rot without knowing where records are.

use crate::io::{SegmentIo, read_exact_at};
use crate::{ChunkStoreError, Result, crc32c, io_err};
use packrat_erasure::{Codec, Layout};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub const SHARD_HEADER_BYTES: u64 = 4096;
pub const SHARD_BLOCK_BYTES: u64 = 64 * 1024;
/// Rows processed at a time when sealing or rebuilding (a multiple of the block size).
const ROW_BYTES: u64 = 16 * SHARD_BLOCK_BYTES;
const SHARD_MAGIC: [u8; 4] = *b"PKSH";
const SHARD_FORMAT_V1: u16 = 1;
const HEADER_USED: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardHeader {
    pub segment_id: u64,
    pub index: u16,
    pub k: u16,
    pub m: u16,
    pub segment_len: u64,
    pub shard_len: u64,
    pub created_unix_ms: u64,
}

impl ShardHeader {
    pub fn encode(&self) -> [u8; HEADER_USED] {
        let mut b = [0u8; HEADER_USED];
        b[0..4].copy_from_slice(&SHARD_MAGIC);
        b[4..6].copy_from_slice(&SHARD_FORMAT_V1.to_le_bytes());
        b[6..8].copy_from_slice(&self.index.to_le_bytes());
        b[8..16].copy_from_slice(&self.segment_id.to_le_bytes());
        b[16..18].copy_from_slice(&self.k.to_le_bytes());
        b[18..20].copy_from_slice(&self.m.to_le_bytes());
        b[24..32].copy_from_slice(&self.segment_len.to_le_bytes());
        b[32..40].copy_from_slice(&self.shard_len.to_le_bytes());
        b[40..48].copy_from_slice(&self.created_unix_ms.to_le_bytes());
        let crc = crc32c(&b[0..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8]) -> std::result::Result<Self, String> {
        if b.len() < HEADER_USED {
            return Err("short shard header".into());
        }
        if b[0..4] != SHARD_MAGIC {
            return Err("bad shard magic".into());
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u64_at = |i: usize| {
            let mut x = [0u8; 8];
            x.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(x)
        };
        let mut c = [0u8; 4];
        c.copy_from_slice(&b[60..64]);
        if crc32c(&b[0..60]) != u32::from_le_bytes(c) {
            return Err("shard header crc mismatch".into());
        }
        if u16_at(4) != SHARD_FORMAT_V1 {
            return Err(format!("unknown shard format version {}", u16_at(4)));
        }
        let h = Self {
            index: u16_at(6),
            segment_id: u64_at(8),
            k: u16_at(16),
            m: u16_at(18),
            segment_len: u64_at(24),
            shard_len: u64_at(32),
            created_unix_ms: u64_at(40),
        };
        let layout = h.layout()?;
        if layout.shard_len as u64 != h.shard_len || h.index >= h.k + h.m {
            return Err("shard header geometry is inconsistent".into());
        }
        Ok(h)
    }

    pub fn layout(&self) -> std::result::Result<Layout, String> {
        Layout::new(self.k as usize, self.m as usize, self.segment_len).map_err(|e| e.to_string())
    }
}

pub fn shard_file_name(id: u64, index: usize) -> String {
    format!("seg-{id:016x}.{index:02}.pks")
}

/// `(segment id, shard index)` of a shard file name.
pub fn parse_shard_name(name: &str) -> Option<(u64, usize)> {
    let rest = name.strip_prefix("seg-")?.strip_suffix(".pks")?;
    let (hex, idx) = rest.split_once('.')?;
    Some((u64::from_str_radix(hex, 16).ok()?, idx.parse().ok()?))
}

fn corrupt(id: u64, offset: u64, reason: impl Into<String>) -> ChunkStoreError {
    ChunkStoreError::Corrupt {
        segment_id: id,
        offset,
        reason: reason.into(),
    }
}

/// Reads the header of a shard file.
pub fn read_shard_header(io: &dyn SegmentIo, file: &File, path: &Path) -> Result<ShardHeader> {
    let mut b = [0u8; HEADER_USED];
    read_exact_at(io, file, path, &mut b, 0).map_err(|e| io_err(path, e))?;
    ShardHeader::decode(&b).map_err(|r| corrupt(0, 0, format!("{}: {r}", path.display())))
}

/// Reads body bytes `[from, to)` of a shard (block-aligned `from`) and checks every block
/// against its stored crc. `Err` carries the reason the range cannot be trusted.
fn read_verified(
    io: &dyn SegmentIo,
    file: &File,
    path: &Path,
    shard_len: u64,
    from: u64,
    to: u64,
    buf: &mut Vec<u8>,
) -> std::io::Result<()> {
    debug_assert_eq!(from % SHARD_BLOCK_BYTES, 0);
    buf.resize((to - from) as usize, 0);
    read_exact_at(io, file, path, buf, SHARD_HEADER_BYTES + from)?;
    let first = from / SHARD_BLOCK_BYTES;
    let count = (to - from).div_ceil(SHARD_BLOCK_BYTES);
    let mut crcs = vec![0u8; count as usize * 4];
    read_exact_at(
        io,
        file,
        path,
        &mut crcs,
        SHARD_HEADER_BYTES + shard_len + first * 4,
    )?;
    for (n, block) in buf.chunks(SHARD_BLOCK_BYTES as usize).enumerate() {
        let want = u32::from_le_bytes([
            crcs[n * 4],
            crcs[n * 4 + 1],
            crcs[n * 4 + 2],
            crcs[n * 4 + 3],
        ]);
        if crc32c(block) != want {
            return Err(std::io::Error::other(format!(
                "block {} fails its crc",
                first + n as u64
            )));
        }
    }
    Ok(())
}

/// The open shards of one encoded segment. A missing shard (lost disk) is `None`.
pub struct ShardSet {
    pub id: u64,
    pub layout: Layout,
    pub files: Vec<Option<Arc<File>>>,
    pub paths: Vec<PathBuf>,
    codec: Codec,
    io: Arc<dyn SegmentIo>,
}

impl ShardSet {
    pub fn new(
        io: Arc<dyn SegmentIo>,
        id: u64,
        layout: Layout,
        files: Vec<Option<Arc<File>>>,
        paths: Vec<PathBuf>,
    ) -> Result<Self> {
        let codec = Codec::new(layout.k, layout.m).map_err(|e| corrupt(id, 0, e.to_string()))?;
        Ok(Self {
            id,
            layout,
            files,
            paths,
            codec,
            io,
        })
    }

    fn shard_len(&self) -> u64 {
        self.layout.shard_len as u64
    }

    /// The data-shard pieces holding segment bytes `[offset, offset + len)`, clamped to the
    /// segment's length: `(shard, offset in the shard body, length)`.
    pub fn pieces(&self, offset: u64, len: u64) -> Vec<(usize, u64, usize)> {
        let end = (offset + len).min(self.layout.len);
        let s = self.shard_len();
        let mut out = Vec::new();
        let mut at = offset;
        while at < end {
            let shard = (at / s) as usize;
            let within = at % s;
            let n = (s - within).min(end - at);
            out.push((shard, within, n as usize));
            at += n;
        }
        out
    }

    /// The file and file offset holding segment bytes `[offset, offset + len)` when they are
    /// in one present data shard: the fast path's single positioned read.
    pub fn direct(&self, offset: u64, len: u64) -> Option<(Arc<File>, u64)> {
        let p = self.pieces(offset, len);
        match p.as_slice() {
            [(shard, within, n)] if *n as u64 == len => self.files[*shard]
                .as_ref()
                .map(|f| (f.clone(), SHARD_HEADER_BYTES + within)),
            _ => None,
        }
    }

    /// Reads segment bytes starting at `offset` into `dst` from the data shards, rebuilding
    /// from the other shards every piece whose shard is missing or unreadable (when
    /// `rebuild_all` is set: every piece, whatever its shard says). Returns the bytes read
    /// (short only at the end of the segment) and whether anything was rebuilt.
    pub fn read(&self, offset: u64, dst: &mut [u8], rebuild_all: bool) -> Result<(usize, bool)> {
        let mut at = 0usize;
        let mut rebuilt = false;
        for (shard, within, n) in self.pieces(offset, dst.len() as u64) {
            let out = &mut dst[at..at + n];
            let direct = match (&self.files[shard], rebuild_all) {
                (Some(f), false) => read_exact_at(
                    &*self.io,
                    f,
                    &self.paths[shard],
                    out,
                    SHARD_HEADER_BYTES + within,
                )
                .is_ok(),
                _ => false,
            };
            if !direct {
                let bytes = self.rebuild(shard, within, within + n as u64)?;
                out.copy_from_slice(&bytes);
                rebuilt = true;
            }
            at += n;
        }
        Ok((at, rebuilt))
    }

    /// Every shard's body bytes `[from, to)` (block-aligned `from`), rebuilt from up to `k`
    /// shards not in `skip` whose blocks in that range verify. The shards in `skip` (and any
    /// other missing one) come back rebuilt.
    fn reconstruct_range(
        &self,
        skip: &[usize],
        from: u64,
        to: u64,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        let s = self.shard_len();
        let mut pieces: Vec<Option<Vec<u8>>> = vec![None; self.files.len()];
        let mut have = 0;
        for (i, f) in self.files.iter().enumerate() {
            if skip.contains(&i) || have == self.layout.k {
                continue;
            }
            let Some(f) = f else { continue };
            let mut buf = Vec::new();
            match read_verified(&*self.io, f, &self.paths[i], s, from, to, &mut buf) {
                Ok(()) => {
                    pieces[i] = Some(buf);
                    have += 1;
                }
                Err(e) => tracing::warn!(
                    segment = self.id,
                    shard = i,
                    error = %e,
                    "shard range unusable for a rebuild"
                ),
            }
        }
        self.codec
            .reconstruct(&mut pieces)
            .map_err(|e| ChunkStoreError::Unrecoverable {
                segment_id: self.id,
                reason: e.to_string(),
            })?;
        Ok(pieces)
    }

    /// Rebuilds body bytes `[from, to)` of shard `t` from the other shards, using only
    /// blocks whose crc verifies.
    pub fn rebuild(&self, t: usize, from: u64, to: u64) -> Result<Vec<u8>> {
        let s = self.shard_len();
        let b0 = from / SHARD_BLOCK_BYTES * SHARD_BLOCK_BYTES;
        let b1 = (to.div_ceil(SHARD_BLOCK_BYTES) * SHARD_BLOCK_BYTES).min(s);
        let mut pieces = self.reconstruct_range(&[t], b0, b1)?;
        let bytes = pieces[t].take().unwrap_or_default();
        let a = (from - b0) as usize;
        let b = (to - b0) as usize;
        if bytes.len() < b {
            return Err(corrupt(self.id, from, "rebuilt range is short"));
        }
        Ok(bytes[a..b].to_vec())
    }

    /// Checks one shard end to end: header, geometry and every block crc. `pace` is called
    /// with the bytes read so far, to throttle a background scrub.
    pub fn check(&self, i: usize, pace: &mut dyn FnMut(u64)) -> std::result::Result<(), String> {
        let Some(f) = &self.files[i] else {
            return Err("missing".into());
        };
        let h = read_shard_header(&*self.io, f, &self.paths[i]).map_err(|e| e.to_string())?;
        if h.segment_id != self.id
            || h.index as usize != i
            || h.segment_len != self.layout.len
            || h.k as usize != self.layout.k
            || h.m as usize != self.layout.m
        {
            return Err("header belongs to another shard".into());
        }
        let s = self.shard_len();
        let mut buf = Vec::new();
        let mut row = 0;
        while row < s {
            let end = (row + ROW_BYTES).min(s);
            read_verified(&*self.io, f, &self.paths[i], s, row, end, &mut buf)
                .map_err(|e| e.to_string())?;
            pace(end - row);
            row = end;
        }
        Ok(())
    }

    /// Writes shards `targets` anew (to `tmp_paths`, synced, for the caller to rename), each
    /// rebuilt row by row from verified blocks of the other shards.
    pub fn rebuild_shards(&self, targets: &[usize], tmp_paths: &[PathBuf]) -> Result<()> {
        let s = self.shard_len();
        let mut writers = tmp_paths
            .iter()
            .map(|p| ShardWriter::create(self.io.clone(), p, s))
            .collect::<Result<Vec<_>>>()?;
        let mut row = 0;
        while row < s {
            let end = (row + ROW_BYTES).min(s);
            let pieces = self.reconstruct_range(targets, row, end)?;
            for (w, &t) in writers.iter_mut().zip(targets) {
                let bytes = pieces[t].as_deref().unwrap_or_default();
                w.write_row(row, bytes)?;
            }
            row = end;
        }
        for (w, &t) in writers.into_iter().zip(targets) {
            w.finish(self.header(t))?;
        }
        Ok(())
    }

    fn header(&self, index: usize) -> ShardHeader {
        header_for(self.id, &self.layout, index)
    }
}

fn header_for(id: u64, layout: &Layout, index: usize) -> ShardHeader {
    ShardHeader {
        segment_id: id,
        index: index as u16,
        k: layout.k as u16,
        m: layout.m as u16,
        segment_len: layout.len,
        shard_len: layout.shard_len as u64,
        created_unix_ms: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64),
    }
}

/// One shard file being written: rows in order, then the block crcs and the header.
struct ShardWriter {
    io: Arc<dyn SegmentIo>,
    file: File,
    path: PathBuf,
    shard_len: u64,
    crcs: Vec<u8>,
}

impl ShardWriter {
    fn create(io: Arc<dyn SegmentIo>, path: &Path, shard_len: u64) -> Result<Self> {
        let file = io.create(path).map_err(|e| io_err(path, e))?;
        Ok(Self {
            io,
            file,
            path: path.to_path_buf(),
            shard_len,
            crcs: Vec::new(),
        })
    }

    fn write_row(&mut self, at: u64, bytes: &[u8]) -> Result<()> {
        debug_assert_eq!(at % SHARD_BLOCK_BYTES, 0);
        self.io
            .write_at(&self.file, &self.path, &[bytes], SHARD_HEADER_BYTES + at)
            .map_err(|e| io_err(&self.path, e))?;
        for block in bytes.chunks(SHARD_BLOCK_BYTES as usize) {
            self.crcs.extend_from_slice(&crc32c(block).to_le_bytes());
        }
        Ok(())
    }

    fn finish(self, header: ShardHeader) -> Result<()> {
        let io = &self.io;
        io.write_at(
            &self.file,
            &self.path,
            &[&self.crcs],
            SHARD_HEADER_BYTES + self.shard_len,
        )
        .map_err(|e| io_err(&self.path, e))?;
        io.write_at(&self.file, &self.path, &[&header.encode()], 0)
            .map_err(|e| io_err(&self.path, e))?;
        io.sync(&self.file, &self.path, true)
            .map_err(|e| io_err(&self.path, e))
    }
}

/// Encodes the first `len` bytes of a segment copy into `k` data and `m` parity shard files
/// (`tmp_paths`, in shard order, synced; the caller renames them into place).
pub fn encode_segment(
    io: &Arc<dyn SegmentIo>,
    id: u64,
    (src, src_path): (&File, &Path),
    len: u64,
    k: usize,
    m: usize,
    tmp_paths: &[PathBuf],
) -> Result<Layout> {
    let layout = Layout::new(k, m, len).map_err(|e| corrupt(id, 0, e.to_string()))?;
    let codec = Codec::new(k, m).map_err(|e| corrupt(id, 0, e.to_string()))?;
    let s = layout.shard_len as u64;
    let mut writers = tmp_paths
        .iter()
        .map(|p| ShardWriter::create(io.clone(), p, s))
        .collect::<Result<Vec<_>>>()?;
    let mut pieces: Vec<Vec<u8>> = vec![Vec::new(); k + m];
    let mut row = 0;
    while row < s {
        let n = (ROW_BYTES.min(s - row)) as usize;
        for (i, piece) in pieces.iter_mut().enumerate() {
            piece.clear();
            piece.resize(n, 0);
            if i >= k {
                continue;
            }
            let start = i as u64 * s + row;
            if start < len {
                let avail = (len - start).min(n as u64) as usize;
                read_exact_at(&**io, src, src_path, &mut piece[..avail], start)
                    .map_err(|e| io_err(src_path, e))?;
            }
        }
        codec
            .encode(&mut pieces)
            .map_err(|e| corrupt(id, row, e.to_string()))?;
        for (w, p) in writers.iter_mut().zip(&pieces) {
            w.write_row(row, p)?;
        }
        row += n as u64;
    }
    for (i, w) in writers.into_iter().enumerate() {
        w.finish(header_for(id, &layout, i))?;
    }
    Ok(layout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_read_rebuild_and_check() {
        let dir = tempfile::tempdir().unwrap();
        let len = 3 * ROW_BYTES + 12_345;
        let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 977) as u8).collect();
        let src_path = dir.path().join("src");
        std::fs::write(&src_path, &data).unwrap();
        let src = File::open(&src_path).unwrap();
        let paths: Vec<PathBuf> = (0..6).map(|i| dir.path().join(format!("s{i}"))).collect();
        let io: Arc<dyn SegmentIo> = Arc::new(crate::io::RealIo);
        let layout = encode_segment(&io, 9, (&src, &src_path), len, 4, 2, &paths).unwrap();
        let open = |p: &PathBuf| File::open(p).ok().map(Arc::new);
        let mut set = ShardSet::new(
            io.clone(),
            9,
            layout,
            paths.iter().map(open).collect(),
            paths.clone(),
        )
        .unwrap();
        for (i, path) in paths.iter().enumerate() {
            set.check(i, &mut |_| {}).unwrap();
            let h = read_shard_header(&*io, set.files[i].as_ref().unwrap(), path).unwrap();
            assert_eq!(h.index as usize, i);
        }
        // Direct reads, across a shard boundary, and past the end.
        let s = layout.shard_len as u64;
        for (off, n) in [
            (0u64, 100usize),
            (s - 50, 100),
            (len - 10, 100),
            (77, 500_000),
        ] {
            let mut buf = vec![0u8; n];
            let (got, rebuilt) = set.read(off, &mut buf, false).unwrap();
            let want = &data[off as usize..(off as usize + n).min(len as usize)];
            assert_eq!(&buf[..got], want);
            assert!(!rebuilt);
        }
        // Two shards gone: every byte still comes back.
        set.files[1] = None;
        set.files[4] = None;
        let mut buf = vec![0u8; len as usize];
        let (got, rebuilt) = set.read(0, &mut buf, false).unwrap();
        assert_eq!(got as u64, len);
        assert!(rebuilt);
        assert_eq!(buf, data);
        // A flipped byte in shard 2: its check fails, and rebuilding skips it.
        let mut b2 = std::fs::read(&paths[2]).unwrap();
        b2[SHARD_HEADER_BYTES as usize + 1000] ^= 1;
        std::fs::write(&paths[2], &b2).unwrap();
        set.files[2] = open(&paths[2]);
        assert!(set.check(2, &mut |_| {}).is_err());
        set.files[1] = open(&paths[1]);
        let mut buf = vec![0u8; 100];
        set.read(2 * s + 900, &mut buf, true).unwrap();
        assert_eq!(
            &buf[..],
            &data[(2 * s + 900) as usize..(2 * s + 1000) as usize]
        );
        // Repair shards 2 and 4 from the rest; they check again and hold the right bytes.
        let tmp: Vec<PathBuf> = [2, 4]
            .iter()
            .map(|i| dir.path().join(format!("t{i}")))
            .collect();
        set.rebuild_shards(&[2, 4], &tmp).unwrap();
        std::fs::rename(&tmp[0], &paths[2]).unwrap();
        std::fs::rename(&tmp[1], &paths[4]).unwrap();
        let set = ShardSet::new(
            io.clone(),
            9,
            layout,
            paths.iter().map(open).collect(),
            paths.clone(),
        )
        .unwrap();
        for i in 0..6 {
            set.check(i, &mut |_| {}).unwrap();
        }
        // Three shards gone is an error, never wrong bytes.
        let mut set = set;
        set.files[0] = None;
        set.files[1] = None;
        set.files[5] = None;
        let mut buf = vec![0u8; 10];
        assert!(matches!(
            set.read(5, &mut buf, false),
            Err(ChunkStoreError::Unrecoverable { .. })
        ));
        assert_eq!(parse_shard_name(&shard_file_name(9, 4)), Some((9, 4)));
    }
}
