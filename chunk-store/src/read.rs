//! Checksum-verified reads of one record (pread, RWF_NOWAIT, io_uring) and of spans of
//! neighbouring records, with erasure coding's fallbacks to another copy or a rebuild.

use crate::io::read_exact_at;
use crate::placement::{Placement, segment_path};
use crate::record::{RECORD_HEADER_BYTES, decode_record_header};
use crate::{
    ChunkStore, ChunkStoreError, IoBackend, RecordDone, RecordLocation, Result, crc32c, ec, io_err,
    mapped,
};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Open files of one segment, cached for reads.
pub(crate) enum Handle {
    /// The files and their paths, and a mapping of the first, made on first use (`None`: it
    /// could not be).
    Copies(
        Vec<(Arc<File>, PathBuf)>,
        std::sync::OnceLock<Option<mapped::Mapping>>,
    ),
    Shards(Arc<ec::ShardSet>),
}

/// Reads `buf.len()` bytes at `offset` only if they are all in the page cache
/// (`preadv2` with `RWF_NOWAIT`); `None` means "not cached, or not supported": read otherwise.
pub(crate) fn read_if_cached(
    file: &File,
    buf: &mut [u8],
    offset: u64,
) -> Option<std::io::Result<()>> {
    let iov = [libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    }];
    // SAFETY: `iov` points at `buf`, which is valid for writes of its length for the call.
    unsafe { read_all_if_cached(file, &iov, offset) }
}

/// Reads a record at `offset` only if all of it is in the page cache, as [`read_if_cached`]:
/// its header into `header`, and its payload (`payload_len` bytes), answered.
///
/// Hand-written for the small GET's hot path: one call fills both parts, so the payload is
/// neither zeroed before the read nor moved down past the header after it (a memset and a
/// memmove of the whole record, about 8% of a cached 4 KiB GET's instructions in callgrind).
pub(crate) fn read_record_if_cached(
    file: &File,
    header: &mut [u8; RECORD_HEADER_BYTES],
    payload_len: usize,
    offset: u64,
) -> Option<std::io::Result<Vec<u8>>> {
    let mut payload: Vec<u8> = Vec::with_capacity(payload_len);
    let iov = [
        libc::iovec {
            iov_base: header.as_mut_ptr().cast(),
            iov_len: RECORD_HEADER_BYTES,
        },
        libc::iovec {
            iov_base: payload.as_mut_ptr().cast(),
            iov_len: payload_len,
        },
    ];
    // SAFETY: the first iovec points at `header`, the second at `payload`'s allocation of at
    // least `payload_len` bytes; both stay borrowed for the call, and the kernel only writes
    // there (uninitialized memory is a valid target for a read).
    let read = unsafe { read_all_if_cached(file, &iov, offset) }?;
    Some(read.map(|()| {
        // SAFETY: the read filled every byte of both iovecs, the payload's `payload_len`
        // bytes among them, within its capacity.
        unsafe { payload.set_len(payload_len) };
        payload
    }))
}

/// One `preadv2(RWF_NOWAIT)` into `iov` at `offset`: `Some(Ok)` only when every byte of every
/// iovec was read (a partly cached record is read again in full by the slow path).
///
/// # Safety
/// Every iovec must point at memory valid for writes of its length for the call.
unsafe fn read_all_if_cached(
    file: &File,
    iov: &[libc::iovec],
    offset: u64,
) -> Option<std::io::Result<()>> {
    use std::os::unix::io::AsRawFd;
    let want: usize = iov.iter().map(|v| v.iov_len).sum();
    let offset = i64::try_from(offset).ok()?;
    // SAFETY: the caller guarantees every iovec is valid for writes of its length.
    let n = unsafe {
        libc::preadv2(
            file.as_raw_fd(),
            iov.as_ptr(),
            iov.len() as libc::c_int,
            offset,
            libc::RWF_NOWAIT,
        )
    };
    if n < 0 {
        let e = std::io::Error::last_os_error();
        return match e.raw_os_error() {
            Some(libc::EAGAIN)
            | Some(libc::EOPNOTSUPP)
            | Some(libc::ENOSYS)
            | Some(libc::EINVAL) => None,
            _ => Some(Err(e)),
        };
    }
    (n as usize == want).then_some(Ok(()))
}

/// Checks a record read from disk (magic, version, header crc, identity, length, payload
/// crc32c) and returns its payload.
fn verify_record(
    loc: &RecordLocation,
    read: std::io::Result<Vec<u8>>,
    object_id: &[u8; 16],
    chunk_index: u32,
    path: &Path,
) -> Result<Vec<u8>> {
    let corrupt = |reason: String| ChunkStoreError::Corrupt {
        segment_id: loc.segment_id,
        offset: loc.offset,
        reason,
    };
    let mut buf = match read {
        Ok(b) if b.len() == RECORD_HEADER_BYTES + loc.len as usize => b,
        Ok(_) => return Err(corrupt("short read".into())),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            return Err(corrupt("record extends past the end of the segment".into()));
        }
        Err(e) => return Err(io_err(path, e)),
    };
    check_record(&buf, loc, object_id, chunk_index)?;
    buf.drain(..RECORD_HEADER_BYTES);
    Ok(buf)
}

/// Verifies one whole record (header then payload, exactly `RECORD_HEADER_BYTES + loc.len`
/// bytes): magic, version and header crc, the expected identity and length, and the payload
/// crc32c. Returns the payload. Every read path ends here (or in [`check_parts`]).
fn check_record<'a>(
    record: &'a [u8],
    loc: &RecordLocation,
    object_id: &[u8; 16],
    chunk_index: u32,
) -> Result<&'a [u8]> {
    let payload = &record[RECORD_HEADER_BYTES..RECORD_HEADER_BYTES + loc.len as usize];
    check_parts(
        &record[..RECORD_HEADER_BYTES],
        payload,
        loc,
        object_id,
        chunk_index,
    )?;
    Ok(payload)
}

/// [`check_record`] of a record read as its header and its payload (`loc.len` bytes).
fn check_parts(
    header: &[u8],
    payload: &[u8],
    loc: &RecordLocation,
    object_id: &[u8; 16],
    chunk_index: u32,
) -> Result<()> {
    let corrupt = |reason: String| ChunkStoreError::Corrupt {
        segment_id: loc.segment_id,
        offset: loc.offset,
        reason,
    };
    let header = decode_record_header(header).map_err(corrupt)?;
    if header.object_id != *object_id || header.chunk_index != chunk_index {
        return Err(corrupt("record belongs to another object".into()));
    }
    if header.payload_len != loc.len {
        return Err(corrupt(format!(
            "length {} does not match the index ({})",
            header.payload_len, loc.len
        )));
    }
    let crc = crc32c(payload);
    if crc != header.payload_crc32c {
        return Err(corrupt(format!(
            "payload crc32c {crc:08x} != stored {:08x}",
            header.payload_crc32c
        )));
    }
    Ok(())
}

/// A run of bytes read from one segment by [`ChunkStore::read_span_into`]: several
/// neighbouring records in one read, in any byte container (an owned buffer, or a slice of a
/// larger one). Each record in it is verified when it is taken out with [`Span::record`].
#[derive(Debug)]
pub struct Span<B = Vec<u8>> {
    pub segment_id: u64,
    /// Offset in the segment of `bytes[0]`.
    pub offset: u64,
    pub bytes: B,
}

impl<B: AsRef<[u8]>> Span<B> {
    /// Whether the whole record at `loc` (header and payload) lies inside this span.
    pub fn covers(&self, loc: &RecordLocation) -> bool {
        loc.segment_id == self.segment_id
            && loc.offset >= self.offset
            && loc.offset + RECORD_HEADER_BYTES as u64 + u64::from(loc.len)
                <= self.offset + self.bytes.as_ref().len() as u64
    }

    /// The verified payload of the record at `loc`, borrowed from the span: header magic,
    /// version and crc, the expected identity and length, and the payload crc32c are all
    /// checked, exactly as [`ChunkStore::read`] does.
    pub fn record(
        &self,
        loc: &RecordLocation,
        object_id: &[u8; 16],
        chunk_index: u32,
    ) -> Result<&[u8]> {
        let corrupt = |reason: String| ChunkStoreError::Corrupt {
            segment_id: loc.segment_id,
            offset: loc.offset,
            reason,
        };
        if !self.covers(loc) {
            return Err(corrupt("record extends past the end of the segment".into()));
        }
        let at = (loc.offset - self.offset) as usize;
        let end = at + RECORD_HEADER_BYTES + loc.len as usize;
        check_record(&self.bytes.as_ref()[at..end], loc, object_id, chunk_index)
    }
}

impl ChunkStore {
    pub(crate) fn reader(&self, segment_id: u64) -> Result<Arc<Handle>> {
        if let Some(h) = self
            .readers
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&segment_id)
        {
            return Ok(h.clone());
        }
        let place = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&segment_id)
            .cloned()
            .ok_or(ChunkStoreError::MissingSegment(segment_id))?;
        let handle = Arc::new(self.open_handle(segment_id, &place)?);
        self.readers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(segment_id, handle.clone());
        Ok(handle)
    }

    pub(crate) fn open_handle(&self, id: u64, place: &Placement) -> Result<Handle> {
        let open = |path: &Path| match self.io.open(path) {
            Ok(f) => Ok(Some(Arc::new(f))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(path, e)),
        };
        match place {
            Placement::Copies(on) => {
                let mut files = Vec::new();
                let mut last_err = None;
                for &d in on {
                    let path = segment_path(&self.disks[d].segments, id);
                    match open(&path) {
                        Ok(Some(f)) => files.push((f, path)),
                        Ok(None) => {}
                        Err(e) => last_err = Some(e),
                    }
                }
                if files.is_empty() {
                    return Err(last_err.unwrap_or(ChunkStoreError::MissingSegment(id)));
                }
                Ok(Handle::Copies(files, std::sync::OnceLock::new()))
            }
            Placement::Shards { layout, disks } => {
                let mut files = Vec::with_capacity(disks.len());
                let mut paths = Vec::with_capacity(disks.len());
                for (i, d) in disks.iter().enumerate() {
                    let path = d.map_or_else(PathBuf::new, |d| {
                        self.disks[d].shards.join(ec::shard_file_name(id, i))
                    });
                    files.push(if d.is_some() {
                        open(&path).ok().flatten()
                    } else {
                        None
                    });
                    paths.push(path);
                }
                Ok(Handle::Shards(Arc::new(ec::ShardSet::new(
                    self.io.clone(),
                    id,
                    *layout,
                    files,
                    paths,
                )?)))
            }
        }
    }

    /// The one file and offset holding a whole record, when the fast paths can read it with
    /// one positioned read: the first copy, or the data shard that holds it.
    pub(crate) fn direct(&self, loc: &RecordLocation) -> Result<Option<(Arc<File>, u64)>> {
        let total = RECORD_HEADER_BYTES as u64 + u64::from(loc.len);
        Ok(match &*self.reader(loc.segment_id)? {
            Handle::Copies(files, _) => Some((files[0].0.clone(), loc.offset)),
            Handle::Shards(set) => set.direct(loc.offset, total),
        })
    }

    /// Whether the record at `loc` can be read without I/O errors as far as the catalog knows:
    /// a copy exists, or its data shard does, or enough shards to rebuild it. A check of open
    /// handles only (no reads), for refusing a multi-chunk GET up front.
    pub fn can_read(&self, loc: &RecordLocation) -> bool {
        match self.reader(loc.segment_id).as_deref() {
            Err(_) => false,
            Ok(Handle::Copies(files, _)) => !files.is_empty(),
            Ok(Handle::Shards(set)) => {
                let total = RECORD_HEADER_BYTES as u64 + u64::from(loc.len);
                set.pieces(loc.offset, total)
                    .iter()
                    .all(|(shard, _, _)| set.files[*shard].is_some())
                    || set.files.iter().filter(|f| f.is_some()).count() >= set.layout.k
            }
        }
    }

    fn note_degraded(&self, segment_id: u64, why: &dyn std::fmt::Display) {
        use std::sync::atomic::Ordering::Relaxed;
        self.counters.degraded_reads.fetch_add(1, Relaxed);
        if self
            .suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(segment_id)
        {
            self.counters.shard_faults_found.fetch_add(1, Relaxed);
            tracing::warn!(
                segment = segment_id,
                reason = %why,
                "degraded read: served from redundancy; the segment is queued for repair"
            );
        }
    }

    /// Reads one whole record, checks its header against the expected identity and its
    /// payload against the stored crc32c, and returns the payload. Always positioned reads on
    /// the calling thread. With erasure coding a record that is missing, unreadable or fails
    /// its checks is read from another copy or rebuilt from the other shards (and checked
    /// again); a record is never served unless it verifies.
    pub fn read(
        &self,
        loc: &RecordLocation,
        object_id: &[u8; 16],
        chunk_index: u32,
    ) -> Result<Vec<u8>> {
        let total = RECORD_HEADER_BYTES + loc.len as usize;
        let path = self.seg_path(loc.segment_id);
        let handle = self.reader(loc.segment_id)?;
        match &*handle {
            Handle::Copies(files, _) => {
                let mut first_err = None;
                for (f, path) in files {
                    let mut buf = vec![0u8; total];
                    let read = read_exact_at(&*self.io, f, path, &mut buf, loc.offset);
                    match verify_record(loc, read.map(|()| buf), object_id, chunk_index, path) {
                        Ok(p) => {
                            if let Some(e) = first_err {
                                self.note_degraded(loc.segment_id, &e);
                            }
                            return Ok(p);
                        }
                        Err(e) => {
                            if first_err.is_none() {
                                first_err = Some(e);
                            }
                        }
                    }
                }
                Err(first_err.unwrap_or(ChunkStoreError::MissingSegment(loc.segment_id)))
            }
            Handle::Shards(set) => {
                let mut first_err = None;
                for rebuild_all in [false, true] {
                    let mut buf = vec![0u8; total];
                    let got = set.read(loc.offset, &mut buf, rebuild_all);
                    let read = match got {
                        Ok((n, rebuilt)) if n == total => Ok((buf, rebuilt)),
                        Ok(_) => Err(ChunkStoreError::Corrupt {
                            segment_id: loc.segment_id,
                            offset: loc.offset,
                            reason: "record extends past the end of the segment".into(),
                        }),
                        Err(e) => Err(e),
                    };
                    let verified = read.and_then(|(buf, rebuilt)| {
                        verify_record(loc, Ok(buf), object_id, chunk_index, &path)
                            .map(|p| (p, rebuilt))
                    });
                    match verified {
                        Ok((p, rebuilt)) => {
                            if rebuilt || first_err.is_some() {
                                let why = first_err.map_or_else(
                                    || "a shard is missing".to_string(),
                                    |e: ChunkStoreError| e.to_string(),
                                );
                                self.note_degraded(loc.segment_id, &why);
                            }
                            return Ok(p);
                        }
                        Err(e) => {
                            if matches!(e, ChunkStoreError::Unrecoverable { .. }) {
                                self.counters
                                    .unrecoverable_reads
                                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                tracing::error!(segment = loc.segment_id, error = %e, "record lost: too few shards left to rebuild it");
                                return Err(e);
                            }
                            if first_err.is_none() {
                                first_err = Some(e);
                            }
                        }
                    }
                }
                Err(first_err.unwrap_or(ChunkStoreError::MissingSegment(loc.segment_id)))
            }
        }
    }

    /// With [`IoBackend::Auto`] and io_uring in use: reads and verifies the record on the
    /// calling thread if it is entirely in the page cache, without ever blocking on the disk.
    /// `None` means the caller should use [`read_with`](Self::read_with).
    pub fn read_cached(
        &self,
        loc: &RecordLocation,
        object_id: &[u8; 16],
        chunk_index: u32,
    ) -> Option<Result<Vec<u8>>> {
        if self.uring.is_none()
            || self.options.io_backend != IoBackend::Auto
            || !self.io.raw_reads()
        {
            return None;
        }
        let (file, at) = match self.direct(loc) {
            Ok(Some(d)) => d,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let mut header = [0u8; RECORD_HEADER_BYTES];
        let read = read_record_if_cached(&file, &mut header, loc.len as usize, at)?;
        Some(match read {
            Ok(payload) => {
                check_parts(&header, &payload, loc, object_id, chunk_index).map(|()| payload)
            }
            Err(e) => Err(io_err(&self.seg_path(loc.segment_id), e)),
        })
    }

    /// Like [`read`](Self::read), but through io_uring when the store uses it: `done` is then
    /// called on the io_uring thread once the record is read and verified. With `pread` it is
    /// called before this returns. This is the fast path only: with erasure coding, a failure
    /// here (or a record the fast path cannot reach in one read) is for the caller to retry
    /// with [`read`](Self::read), which falls back on redundancy, off the async threads.
    pub fn read_with(
        &self,
        loc: RecordLocation,
        object_id: [u8; 16],
        chunk_index: u32,
        done: RecordDone,
    ) {
        let Some(uring) = &self.uring else {
            return done(self.read(&loc, &object_id, chunk_index));
        };
        let (file, at) = match self.direct(&loc) {
            Ok(Some(d)) => d,
            Ok(None) => return done(Err(ChunkStoreError::MissingSegment(loc.segment_id))),
            Err(e) => return done(Err(e)),
        };
        let path = self.seg_path(loc.segment_id);
        let total = RECORD_HEADER_BYTES + loc.len as usize;
        uring.read(
            file,
            at,
            total,
            Box::new(move |r| done(verify_record(&loc, r, &object_id, chunk_index, &path))),
        );
    }

    /// Reads raw bytes of a segment from `offset` into `dst` with one positioned read (a
    /// page-cache hit without blocking when possible, else a `pread`) and returns how many
    /// were read: fewer than `dst.len()` only at the end of the segment. The batch read path
    /// merges neighbouring records into one such read and verifies each with [`Span::record`].
    /// Blocks the calling thread on a cache miss. With erasure coding, pieces on a missing or
    /// unreadable shard are rebuilt; bytes that read but fail a record check are for the
    /// caller to read again with [`read`](Self::read).
    pub fn read_span_into(&self, segment_id: u64, offset: u64, dst: &mut [u8]) -> Result<usize> {
        let handle = self.reader(segment_id)?;
        let files = match &*handle {
            Handle::Copies(files, _) => files,
            Handle::Shards(set) => {
                let (n, rebuilt) = set.read(offset, dst, false)?;
                if rebuilt {
                    self.note_degraded(segment_id, &"a shard is missing or unreadable");
                }
                return Ok(n);
            }
        };
        if self.io.raw_reads()
            && let Some(r) = read_if_cached(&files[0].0, dst, offset)
        {
            r.map_err(|e| io_err(&files[0].1, e))?;
            return Ok(dst.len());
        }
        let mut last_err = None;
        for (file, path) in files {
            let mut filled = 0usize;
            let mut failed = false;
            while filled < dst.len() {
                match self
                    .io
                    .read_at(file, path, &mut dst[filled..], offset + filled as u64)
                {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) => {
                        last_err = Some(io_err(path, e));
                        failed = true;
                        break;
                    }
                }
            }
            if !failed {
                return Ok(filled);
            }
        }
        Err(last_err.unwrap_or(ChunkStoreError::MissingSegment(segment_id)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn span_reads_verify_each_record() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 30);
        let mut locs = Vec::new();
        for i in 0..20u32 {
            let data = vec![i as u8; 100 + i as usize * 7];
            let (loc, t) = s.append([3; 16], i, &data).unwrap();
            s.sync_through(t).unwrap();
            locs.push((loc, data));
        }
        let first = locs[0].0;
        let last = locs[19].0;
        let end = last.offset + RECORD_HEADER_BYTES as u64 + u64::from(last.len);
        let read = |offset: u64, len: usize| {
            let mut bytes = vec![0u8; len];
            let n = s
                .read_span_into(first.segment_id, offset, &mut bytes)
                .unwrap();
            bytes.truncate(n);
            Span {
                segment_id: first.segment_id,
                offset,
                bytes,
            }
        };
        let span = read(first.offset, (end - first.offset) as usize);
        for (i, (loc, data)) in locs.iter().enumerate() {
            assert!(span.covers(loc));
            assert_eq!(span.record(loc, &[3; 16], i as u32).unwrap(), &data[..]);
        }
        // A borrowed span works the same.
        let borrowed = Span {
            segment_id: span.segment_id,
            offset: span.offset,
            bytes: &span.bytes[..],
        };
        assert!(borrowed.record(&locs[4].0, &[3; 16], 4).is_ok());
        // Wrong identity, and a record beyond the span, are refused.
        assert!(span.record(&locs[1].0, &[3; 16], 0).is_err());
        let short = read(first.offset, 50);
        assert!(short.record(&locs[0].0, &[3; 16], 0).is_err());
        // A flipped payload byte inside the span is caught.
        let mut bad = span;
        let at = (locs[5].0.offset - bad.offset) as usize + RECORD_HEADER_BYTES + 3;
        bad.bytes[at] ^= 0x40;
        assert!(matches!(
            bad.record(&locs[5].0, &[3; 16], 5),
            Err(ChunkStoreError::Corrupt { .. })
        ));
        assert!(bad.record(&locs[6].0, &[3; 16], 6).is_ok());
        // Reading past the end of the segment returns a short span.
        assert_eq!(read(end - 10, 4096).bytes.len(), 10);
    }

    #[test]
    fn io_uring_reads_verify_like_pread() {
        let dir = tempfile::tempdir().unwrap();
        let s = match ChunkStore::open(
            dir.path(),
            ChunkStoreOptions {
                segment_bytes_max: SEGMENT_BYTES_DEFAULT,
                io_backend: IoBackend::Uring,
                ..Default::default()
            },
        ) {
            Ok(s) => s,
            Err(e) => {
                // Kernels or sandboxes without io_uring: the pread path is covered elsewhere.
                eprintln!("io_uring unavailable here: {e}");
                return;
            }
        };
        assert!(s.uses_uring());
        let mut locs = Vec::new();
        for i in 0..64u32 {
            let data: Vec<u8> = (0..(i as usize * 997 + 1))
                .map(|b| (b as u32 ^ i) as u8)
                .collect();
            let (loc, t) = s.append([3; 16], i, &data).unwrap();
            s.sync_through(t).unwrap();
            locs.push((loc, data));
        }
        let (tx, rx) = std::sync::mpsc::channel();
        for (i, (loc, _)) in locs.iter().enumerate() {
            let tx = tx.clone();
            s.read_with(
                *loc,
                [3; 16],
                i as u32,
                Box::new(move |r| tx.send((i, r)).unwrap()),
            );
        }
        for _ in 0..locs.len() {
            let (i, r) = rx.recv().unwrap();
            assert_eq!(r.unwrap(), locs[i].1);
        }
        let tx2 = tx.clone();
        s.read_with(
            locs[5].0,
            [4; 16],
            5,
            Box::new(move |r| tx2.send((0, r)).unwrap()),
        );
        assert!(matches!(
            rx.recv().unwrap().1,
            Err(ChunkStoreError::Corrupt { .. })
        ));
    }

    /// Read faults hit the chosen reads only: a run of reads fails from the Nth on (as in the
    /// middle of a streamed GET) and reads again once the fault clears; with erasure coding,
    /// a disk whose reads fail is read around, and every record still verifies.
    #[test]
    fn read_faults_fail_the_chosen_reads_and_redundancy_reads_around_them() {
        let dir = tempfile::tempdir().unwrap();
        let (s, io) = faulty_store(dir.path(), 1 << 20, false);
        let mut locs = Vec::new();
        for i in 0..6u32 {
            let (loc, t) = s.append([8; 16], i, &payload(i)).unwrap();
            s.sync_through(t).unwrap();
            locs.push(loc);
        }
        io.set_rules(vec![eio(IoOp::Read, None, 3, None)]);
        let got: Vec<bool> = (0..6u32)
            .map(|i| s.read(&locs[i as usize], &[8; 16], i).is_ok())
            .collect();
        assert_eq!(got, [true, true, true, false, false, false]);
        // No fast path reads around the rules.
        let mut buf = vec![0u8; locs[0].len as usize];
        let one = [crate::RecordRead {
            loc: locs[0],
            object_id: [8; 16],
            chunk_index: 0,
            dst: 0,
        }];
        assert_eq!(s.read_cached_records_into(&one, &mut buf, &mut [0]), [0]);
        assert_eq!(s.read_mapped_records_into(&one, &mut buf, &mut [0]), [0]);
        assert!(s.read_cached(&locs[0], &[8; 16], 0).is_none());
        io.set_rules(Vec::new());
        for (i, loc) in locs.iter().enumerate() {
            assert_eq!(s.read(loc, &[8; 16], i as u32).unwrap(), payload(i as u32));
        }

        let dir = tempfile::tempdir().unwrap();
        let (s, io) = faulty_store(dir.path(), 256 * 1024, true);
        let mut locs = Vec::new();
        for i in 0..8u32 {
            let (loc, t) = s.append([9; 16], i, &payload(i)).unwrap();
            s.sync_through(t).unwrap();
            locs.push(loc);
        }
        s.seal_active().unwrap();
        s.seal_due(None).unwrap();
        for d in 0..6 {
            io.set_rules(vec![eio(IoOp::Read, Some(&format!("/d{d}/")), 0, None)]);
            for (i, loc) in locs.iter().enumerate() {
                assert_eq!(
                    s.read(loc, &[9; 16], i as u32).unwrap(),
                    payload(i as u32),
                    "disk {d} failing reads"
                );
            }
        }
        assert!(s.stats().degraded_reads > 0);
    }
}
