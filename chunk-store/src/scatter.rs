//! Scattered and mapped reads: many records straight into one caller's buffer, from the page
//! cache only (vectored `preadv2(RWF_NOWAIT)`) or from a mapping of the segment file.

use crate::read::Handle;
use crate::record::{RECORD_HEADER_BYTES, decode_record_header};
use crate::{ChunkStore, IoBackend, RecordRead, crc32c, mapped};
use std::fs::File;
use std::sync::Arc;

/// How long mapped reads stay off after one of them waited for the disk.
const MAPPED_PAUSE: std::time::Duration = std::time::Duration::from_secs(1);
/// How many records ahead a mapped read asks for the next records' first bytes.
const MAPPED_PREFETCH_AHEAD: usize = 4;
/// A mapped copy of one record slower than this may have waited for the disk (a hot 4 KiB
/// record takes about a microsecond): whether the thread slept is checked.
const MAPPED_SLOW_COPY: std::time::Duration = std::time::Duration::from_micros(20);

/// Records at most this far apart in a file share one vectored read (the gap is read into a
/// discard buffer).
pub const SCATTER_GAP_BYTES_MAX: u64 = 4096;
/// Largest single vectored read of [`ChunkStore::read_cached_records_into`]...
const SCATTER_RUN_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// ...and most pieces in it (Linux accepts 1024).
const SCATTER_IOVECS_MAX: usize = 512;

/// Fills the buffers of `iov` from `file` at `offset`, in order, from the page cache only
/// (`RWF_NOWAIT`), and returns the bytes read: fewer than asked where the file or the cached
/// pages end (0 where the kernel cannot read without waiting). `iov` is consumed (advanced) as
/// it fills.
///
/// # Safety
///
/// Every iovec must point at memory valid for writes of its length, not accessed through any
/// other path for the duration of the call.
unsafe fn preadv_cached(
    file: &File,
    iov: &mut [libc::iovec],
    offset: u64,
) -> std::io::Result<usize> {
    use std::os::unix::io::AsRawFd;
    let mut first = 0usize;
    let mut done = 0usize;
    while first < iov.len() {
        let at = i64::try_from(offset + done as u64)
            .map_err(|_| std::io::Error::other("offset past i64"))?;
        let count = (iov.len() - first).min(1024) as libc::c_int;
        // SAFETY: the caller guarantees the iovecs; `first..first + count` is in bounds.
        let n = unsafe {
            libc::preadv2(
                file.as_raw_fd(),
                iov[first..].as_ptr(),
                count,
                at,
                libc::RWF_NOWAIT,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EAGAIN | libc::EOPNOTSUPP | libc::EINVAL | libc::ENOSYS) => break,
                _ => return Err(e),
            }
        }
        if n == 0 {
            break;
        }
        let mut n = n as usize;
        done += n;
        while n > 0 && first < iov.len() {
            let take = n.min(iov[first].iov_len);
            iov[first].iov_len -= take;
            // SAFETY: advancing within the same buffer by at most its remaining length.
            iov[first].iov_base = unsafe { iov[first].iov_base.cast::<u8>().add(take) }.cast();
            n -= take;
            if iov[first].iov_len == 0 {
                first += 1;
            }
        }
        // A short read stops where the cached pages end: what follows would wait.
        if first < iov.len() {
            break;
        }
    }
    Ok(done)
}

/// Panics if two records' payload slots overlap or one lies outside a buffer of `buf_len`
/// bytes.
fn check_slots(reads: &[RecordRead], buf_len: usize) {
    let mut by_dst: Vec<(usize, usize)> = reads
        .iter()
        .map(|r| (r.dst, r.dst + r.loc.len as usize))
        .collect();
    by_dst.sort_unstable();
    for w in by_dst.windows(2) {
        assert!(w[0].1 <= w[1].0, "record slots overlap");
    }
    if let Some(last) = by_dst.last() {
        assert!(last.1 <= buf_len, "record slot outside the buffer");
    }
}

impl ChunkStore {
    /// Reads whole records straight into the caller's buffer, from the page cache only and
    /// never waiting for the disk, so it may run on an async worker thread: the payload of
    /// `reads[i]` goes to `buf[dst..dst + len]`. Records that are neighbours in one file (gaps
    /// of at most [`SCATTER_GAP_BYTES_MAX`]) share one vectored read that scatters headers
    /// aside, payloads into place and gap bytes into a discard buffer, so a run of records
    /// costs one syscall and one copy, out of the page cache into `buf`. Every record is
    /// checked as [`read`](Self::read) checks it. Returns the positions in `reads` of the
    /// records not in place (not cached, not directly readable such as a shard piece, an I/O
    /// error, a failed check), in increasing order: the caller reads those another way. Empty
    /// when every record is in place and verified. For each record in place, `crcs[i]` is set
    /// to its payload's CRC32C (the one its header holds, which the check found the bytes in
    /// `buf` to have), so a caller that sends the bytes on need not hash them again.
    ///
    /// Panics if two slots overlap, a slot is outside `buf` or `crcs` is not as long as
    /// `reads` (a caller's bug).
    pub fn read_cached_records_into(
        &self,
        reads: &[RecordRead],
        buf: &mut [u8],
        crcs: &mut [u32],
    ) -> Vec<usize> {
        if !self.io.raw_reads() {
            return (0..reads.len()).collect();
        }
        check_slots(reads, buf.len());
        assert_eq!(crcs.len(), reads.len(), "one CRC slot per record");
        let mut missed = Vec::new();
        // Where each record is: (record, file, offset of its header in the file).
        let mut placed: Vec<(usize, Arc<File>, u64)> = Vec::with_capacity(reads.len());
        for (i, r) in reads.iter().enumerate() {
            match self.direct(&r.loc) {
                Ok(Some((file, at))) => placed.push((i, file, at)),
                _ => missed.push(i),
            }
        }
        placed.sort_unstable_by_key(|(_, f, at)| (Arc::as_ptr(f) as usize, *at));
        let mut headers = vec![[0u8; RECORD_HEADER_BYTES]; reads.len()];
        let mut discard = vec![0u8; SCATTER_GAP_BYTES_MAX as usize];
        let rec_len = |i: usize| RECORD_HEADER_BYTES as u64 + u64::from(reads[i].loc.len);
        let mut iov: Vec<libc::iovec> = Vec::with_capacity(SCATTER_IOVECS_MAX);
        let mut run = 0usize;
        while run < placed.len() {
            // The run: placed[run..end], one file, each record at most a small gap after the
            // previous one's end.
            let (_, file, start) = &placed[run];
            let mut end = run + 1;
            let mut run_end = start + rec_len(placed[run].0);
            while end < placed.len() {
                let (i, f, at) = &placed[end];
                let fits = Arc::ptr_eq(f, file)
                    && *at >= run_end
                    && at - run_end <= SCATTER_GAP_BYTES_MAX
                    && at + rec_len(*i) - start <= SCATTER_RUN_BYTES_MAX
                    && (end - run) * 3 + 3 <= SCATTER_IOVECS_MAX;
                if !fits {
                    break;
                }
                run_end = at + rec_len(*i);
                end += 1;
            }
            iov.clear();
            let mut at_end = *start;
            for (i, _, at) in &placed[run..end] {
                let gap = (at - at_end) as usize;
                if gap > 0 {
                    iov.push(libc::iovec {
                        iov_base: discard.as_mut_ptr().cast(),
                        iov_len: gap,
                    });
                }
                iov.push(libc::iovec {
                    iov_base: headers[*i].as_mut_ptr().cast(),
                    iov_len: RECORD_HEADER_BYTES,
                });
                let len = reads[*i].loc.len as usize;
                if len > 0 {
                    iov.push(libc::iovec {
                        // In bounds: asserted above.
                        iov_base: buf[reads[*i].dst..].as_mut_ptr().cast(),
                        iov_len: len,
                    });
                }
                at_end = at + rec_len(*i);
            }
            let wanted = (run_end - start) as usize;
            // SAFETY: every iovec points into `buf`, `headers` or `discard`, all exclusively
            // borrowed by this function and not otherwise touched until the call returns.
            let got = unsafe { preadv_cached(file, &mut iov, *start) };
            let whole = matches!(got, Ok(n) if n == wanted);
            for (i, _, _) in &placed[run..end] {
                match whole.then(|| self.check_scattered(&reads[*i], &headers[*i], buf)) {
                    Some(Ok(crc)) => crcs[*i] = crc,
                    _ => missed.push(*i),
                }
            }
            run = end;
        }
        missed.sort_unstable();
        missed
    }

    /// Whether [`read_mapped_records_into`](Self::read_mapped_records_into) may be tried now:
    /// the backend is `Auto` and no mapped read has waited for the disk within the last
    /// second.
    pub fn mapped_reads_enabled(&self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.options.io_backend == IoBackend::Auto
            && self.io.raw_reads()
            && self.opened.elapsed().as_millis() as u64 >= self.mapped_paused_until_ms.load(Relaxed)
    }

    /// Like [`read_cached_records_into`](Self::read_cached_records_into), but copies each
    /// record out of a mapping of its segment file: no system call per record. A page that is
    /// not in the page cache makes the copy wait for the disk (the page fault sleeps), so this
    /// stops after the first record whose copy slept and pauses mapped reads for
    /// [`MAPPED_PAUSE`]: cold data then goes the non-blocking way, and an async worker calling
    /// this waits for at most one disk read per pause. Records of erasure-coded segments are
    /// not mapped. Returns, like [`read_cached_records_into`](Self::read_cached_records_into),
    /// the positions of the records not in place (from the first that could not be read on);
    /// empty when every record is in place and verified; and sets `crcs[i]` of each record in
    /// place as it does.
    ///
    /// Panics if two slots overlap, a slot is outside `buf` or `crcs` is not as long as
    /// `reads` (a caller's bug).
    pub fn read_mapped_records_into(
        &self,
        reads: &[RecordRead],
        buf: &mut [u8],
        crcs: &mut [u32],
    ) -> Vec<usize> {
        use std::sync::atomic::Ordering::Relaxed;
        if !self.mapped_reads_enabled() {
            return (0..reads.len()).collect();
        }
        check_slots(reads, buf.len());
        assert_eq!(crcs.len(), reads.len(), "one CRC slot per record");
        // One getrusage per call (not per record): the count to compare a slow copy against.
        let waits_before = mapped::thread_waits();
        let mut last: Option<(u64, Arc<Handle>)> = None;
        let rest = |i: usize| (i..reads.len()).collect();
        for (i, r) in reads.iter().enumerate() {
            if last.as_ref().is_none_or(|(id, _)| *id != r.loc.segment_id) {
                match self.reader(r.loc.segment_id) {
                    Ok(h) => last = Some((r.loc.segment_id, h)),
                    Err(_) => return rest(i),
                }
            }
            let Some((_, handle)) = &last else {
                return rest(i);
            };
            let Handle::Copies(files, map) = &**handle else {
                return rest(i);
            };
            let Some(map) = map.get_or_init(|| {
                let len = files[0]
                    .0
                    .metadata()
                    .ok()?
                    .len()
                    .max(self.options.segment_bytes_max);
                mapped::Mapping::new(&files[0].0, usize::try_from(len).ok()?).ok()
            }) else {
                return rest(i);
            };
            // The next records of this segment are asked for now (their first lines: the
            // hardware prefetcher follows on with the rest), so their misses overlap this copy.
            // (Each once: the first record asks for the next few, each later one for the
            // record that many places after it.)
            let from = if i == 0 { 1 } else { i + MAPPED_PREFETCH_AHEAD };
            for next in reads.iter().take(i + MAPPED_PREFETCH_AHEAD + 1).skip(from) {
                if next.loc.segment_id == r.loc.segment_id {
                    map.prefetch(next.loc.offset, RECORD_HEADER_BYTES + 128);
                }
            }
            let len = r.loc.len as usize;
            let mut header = [0u8; RECORD_HEADER_BYTES];
            let started = std::time::Instant::now();
            let copied = map.copy_to(r.loc.offset, &mut header)
                && map.copy_to(
                    r.loc.offset + RECORD_HEADER_BYTES as u64,
                    &mut buf[r.dst..r.dst + len],
                );
            // Slow: preempted, or the disk was read (the thread slept: stop after this one).
            let slept =
                started.elapsed() > MAPPED_SLOW_COPY && mapped::thread_waits() != waits_before;
            if slept {
                let until = self.opened.elapsed() + MAPPED_PAUSE;
                self.mapped_paused_until_ms
                    .store(until.as_millis() as u64, Relaxed);
            }
            let checked = copied.then(|| self.check_scattered(r, &header, buf));
            if let Some(Ok(crc)) = checked {
                crcs[i] = crc;
            } else {
                // A fault or a failed check: this mapping may now hold a zero page where the
                // file had an unreadable one. Forget the handle (and with it the mapping) so
                // later reads open the file afresh; this frame is read the other way, which
                // reports the error or serves the record from another copy.
                let mut readers = self.readers.write().unwrap_or_else(|p| p.into_inner());
                if readers
                    .get(&r.loc.segment_id)
                    .is_some_and(|h| Arc::ptr_eq(h, handle))
                {
                    readers.remove(&r.loc.segment_id);
                }
                return rest(i);
            }
            if slept {
                return rest(i + 1);
            }
        }
        Vec::new()
    }

    /// Checks a record read into `buf` against its header; answers its payload's CRC32C.
    fn check_scattered(
        &self,
        r: &RecordRead,
        header: &[u8; RECORD_HEADER_BYTES],
        buf: &[u8],
    ) -> std::result::Result<u32, String> {
        let h = decode_record_header(header)?;
        if h.object_id != r.object_id || h.chunk_index != r.chunk_index {
            return Err("record belongs to another object".into());
        }
        if h.payload_len != r.loc.len {
            return Err("length does not match the index".into());
        }
        if crc32c(&buf[r.dst..r.dst + r.loc.len as usize]) != h.payload_crc32c {
            return Err("payload crc32c mismatch".into());
        }
        Ok(h.payload_crc32c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::read::read_if_cached;
    use crate::testing::*;
    use std::fs::OpenOptions;
    use std::os::unix::fs::FileExt;

    /// Writes 60 records of 0 to 9 KiB (some neighbours more than a gap apart) across a
    /// sealed and the active segment, and has `read` place them (every other one skipped
    /// between 10 and 20, so runs have gaps) into slots laid out in reverse order with 3
    /// sentinel bytes between them; checks every slot and the CRC32C answered for it, then
    /// that a flipped payload byte on disk fails the read of that record (and, with `stops`,
    /// of those after it) and of no record before it. Returns the store for more checks.
    fn check_record_reads(
        stops: bool,
        read: impl Fn(&ChunkStore, &[RecordRead], &mut [u8], &mut [u32]) -> Vec<usize>,
    ) -> (tempfile::TempDir, ChunkStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 30);
        let mut recs = Vec::new();
        for i in 0..60u32 {
            let data = vec![i as u8 ^ 0x5a; (i as usize * 157) % 9000];
            let (loc, t) = s.append([7; 16], i, &data).unwrap();
            s.sync_through(t).unwrap();
            recs.push((loc, data));
            if i == 30 {
                assert!(s.seal_active().unwrap());
            }
        }
        let mut reads = Vec::new();
        let mut at = 0usize;
        for (i, (loc, _)) in recs.iter().enumerate().rev() {
            if (10..20).contains(&i) && i % 2 == 1 {
                continue;
            }
            reads.push(RecordRead {
                loc: *loc,
                object_id: [7; 16],
                chunk_index: i as u32,
                dst: at,
            });
            at += loc.len as usize + 3;
        }
        // Just written, so in the page cache.
        let mut buf = vec![0xeeu8; at];
        let mut crcs = vec![0u32; reads.len()];
        assert_eq!(read(&s, &reads, &mut buf, &mut crcs), Vec::<usize>::new());
        for (r, crc) in reads.iter().zip(&crcs) {
            let data = &recs[r.chunk_index as usize].1;
            assert_eq!(&buf[r.dst..r.dst + data.len()], &data[..]);
            assert_eq!(&buf[r.dst + data.len()..r.dst + data.len() + 3], &[0xee; 3]);
            assert_eq!(*crc, crc32c(data), "record {}", r.chunk_index);
        }
        let (bad, _) = recs[12];
        let file = OpenOptions::new()
            .write(true)
            .open(s.seg_path(bad.segment_id))
            .unwrap();
        let at = bad.offset + RECORD_HEADER_BYTES as u64 + 5;
        file.write_all_at(&[0xff], at).unwrap();
        let bad_at = reads.iter().position(|r| r.chunk_index == 12).unwrap();
        let want: Vec<usize> = match stops {
            true => (bad_at..reads.len()).collect(),
            false => vec![bad_at],
        };
        assert_eq!(read(&s, &reads, &mut buf, &mut crcs), want);
        let without: Vec<RecordRead> = reads
            .iter()
            .copied()
            .filter(|r| r.chunk_index != 12)
            .collect();
        let mut crcs = vec![0u32; without.len()];
        assert_eq!(read(&s, &without, &mut buf, &mut crcs), Vec::<usize>::new());
        (dir, s)
    }

    #[test]
    fn scattered_reads_place_and_verify_each_record() {
        check_record_reads(false, |s, reads, buf, crcs| {
            s.read_cached_records_into(reads, buf, crcs)
        });
    }

    /// A mapped read that is expected to succeed. A copy that a busy machine slowed down (these
    /// tests run beside others, on two cores in CI) pauses mapped reads by design, and the read
    /// answers false without a fault: that pause is waited out and the read tried once more,
    /// so only records missed without a pause fail the caller's assertion.
    fn mapped_read(
        s: &ChunkStore,
        reads: &[RecordRead],
        buf: &mut [u8],
        crcs: &mut [u32],
    ) -> Vec<usize> {
        assert_eq!(s.options.io_backend, IoBackend::Auto);
        let missed = s.read_mapped_records_into(reads, buf, crcs);
        if missed.is_empty() || s.mapped_reads_enabled() {
            return missed;
        }
        std::thread::sleep(MAPPED_PAUSE + std::time::Duration::from_millis(100));
        s.read_mapped_records_into(reads, buf, crcs)
    }

    #[test]
    fn mapped_reads_place_and_verify_each_record() {
        let (_dir, s) = check_record_reads(true, mapped_read);
        // Appended after the active segment was mapped: still inside the mapping.
        let late = vec![0x42u8; 3000];
        let (loc, t) = s.append([7; 16], 99, &late).unwrap();
        s.sync_through(t).unwrap();
        let one = [RecordRead {
            loc,
            object_id: [7; 16],
            chunk_index: 99,
            dst: 0,
        }];
        let mut small = vec![0u8; late.len()];
        assert!(mapped_read(&s, &one, &mut small, &mut [0]).is_empty());
        assert_eq!(small, late);
        // Another object's identity fails the read.
        let wrong = [RecordRead {
            object_id: [8; 16],
            ..one[0]
        }];
        assert_eq!(
            s.read_mapped_records_into(&wrong, &mut small, &mut [0]),
            [0]
        );
    }

    /// A record the file no longer holds (the page behind it raises SIGBUS, as a page with an
    /// I/O error does) fails the mapped read instead of killing the process; the ordinary
    /// read then reports the error.
    #[test]
    fn a_mapped_read_of_an_unreadable_page_fails_cleanly() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 30);
        let mut locs = Vec::new();
        for i in 0..8u32 {
            let (loc, t) = s.append([7; 16], i, &vec![i as u8; 20_000]).unwrap();
            s.sync_through(t).unwrap();
            locs.push(loc);
        }
        let read = |i: usize| RecordRead {
            loc: locs[i],
            object_id: [7; 16],
            chunk_index: i as u32,
            dst: 0,
        };
        let mut buf = vec![0u8; 20_000];
        assert!(mapped_read(&s, &[read(7)], &mut buf, &mut [0]).is_empty());
        // Cut the file in the middle of record 6 (a fault, not a checksum: the pages past
        // the new end are gone).
        let file = OpenOptions::new()
            .write(true)
            .open(s.seg_path(locs[6].segment_id))
            .unwrap();
        file.set_len(locs[6].offset + 100).unwrap();
        assert_eq!(
            s.read_mapped_records_into(&[read(7)], &mut buf, &mut [0]),
            [0]
        );
        assert_eq!(
            s.read_mapped_records_into(&[read(6)], &mut buf, &mut [0]),
            [0]
        );
        assert!(s.read(&locs[7], &[7; 16], 7).is_err());
        // Records before the cut still read, mapped and not.
        assert!(mapped_read(&s, &[read(5)], &mut buf, &mut [0]).is_empty());
        assert_eq!(buf, vec![5u8; 20_000]);
        assert_eq!(s.read(&locs[5], &[7; 16], 5).unwrap(), vec![5u8; 20_000]);
    }

    /// Records not in the page cache make a mapped copy wait for the disk: the read stops
    /// and mapped reads pause, so an async worker does not keep waiting.
    #[test]
    fn a_mapped_read_that_waits_for_the_disk_pauses_mapped_reads() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 30);
        let mut reads = Vec::new();
        let mut at = 0;
        for i in 0..64u32 {
            let (loc, t) = s.append([7; 16], i, &vec![i as u8; 64 * 1024]).unwrap();
            s.sync_through(t).unwrap();
            reads.push(RecordRead {
                loc,
                object_id: [7; 16],
                chunk_index: i,
                dst: at,
            });
            at += 64 * 1024;
        }
        // Synced, so clean: the kernel may drop the file's pages.
        let path = s.seg_path(reads[0].loc.segment_id);
        let file = File::open(&path).unwrap();
        file.sync_all().unwrap();
        // SAFETY: advice on an open file descriptor.
        unsafe {
            libc::posix_fadvise(
                std::os::unix::io::AsRawFd::as_raw_fd(&file),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
        let mut probe = [0u8; 1];
        if read_if_cached(&file, &mut probe, reads[0].loc.offset).is_some() {
            // This file system keeps the pages (tmpfs): nothing to wait for here.
            eprintln!("pages not evicted; skipping the cold-read check");
            return;
        }
        let mut buf = vec![0u8; at];
        // The copy that waited is in place; the rest is left to the caller.
        assert_eq!(
            s.read_mapped_records_into(&reads, &mut buf, &mut vec![0; reads.len()]),
            (1..reads.len()).collect::<Vec<_>>()
        );
        assert!(!s.mapped_reads_enabled());
        // The usual path still reads them.
        assert_eq!(
            s.read(&reads[3].loc, &[7; 16], 3).unwrap(),
            vec![3u8; 64 * 1024]
        );
    }
}
