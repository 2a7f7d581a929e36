//! Appends and durability: creating segments (header and directory entry synced), writing
//! records, rotation, and group commit (`sync_through`).

use crate::placement::{Placement, segment_path, sync_dir};
use crate::record::{RECORD_HEADER_BYTES, SEGMENT_HEADER_BYTES, SegmentHeader};
use crate::segment_file::record_header;
use crate::{ChunkStore, ChunkStoreError, RecordLocation, Result, WriteTicket, io_err};
use std::fs::File;
use std::path::Path;
use std::path::PathBuf;
use std::sync::Arc;

pub(crate) struct Copy {
    pub(crate) disk: usize,
    pub(crate) file: Arc<File>,
    pub(crate) path: PathBuf,
}

pub(crate) struct ActiveSegment {
    pub(crate) id: u64,
    /// The segment file on each of its disks (one without erasure coding; m + 1 with it),
    /// all written and synced alike.
    pub(crate) copies: Vec<Copy>,
    /// End of the last record written (the next append goes here).
    pub(crate) offset: u64,
    /// Set when a write or an fsync failed: the page cache of these files can no longer be
    /// trusted, so the next append starts a fresh segment.
    pub(crate) poisoned: bool,
    /// Every segment with a smaller id is fully durable (synced when it was rotated out). A
    /// segment abandoned after a failed fsync stays at or above this mark, so a writer still
    /// waiting on it is told its write failed instead of being acknowledged.
    pub(crate) durable_below: u64,
    pub(crate) last_append: std::time::Instant,
}

impl ChunkStore {
    /// Creates segment `id` on its disks; with erasure coding a disk that fails is marked
    /// failed and the segment is placed on the next healthy ones.
    pub(crate) fn create_segment(&self, id: u64) -> Result<ActiveSegment> {
        loop {
            match self.try_create_segment(id) {
                Err(e) if self.ec.is_some() && !matches!(e, ChunkStoreError::NoSpace { .. }) => {
                    // `try_create_segment` marked the disk at fault; `pick_disks` fails once
                    // too few healthy ones are left, which ends this loop.
                    tracing::warn!(segment = id, error = %e, "segment creation failed; retrying on other disks");
                    if self
                        .pick_disks(id, self.ec.map_or(1, |(_, m)| m + 1), &[])
                        .is_err()
                    {
                        return Err(e);
                    }
                }
                r => return r,
            }
        }
    }

    fn try_create_segment(&self, id: u64) -> Result<ActiveSegment> {
        let want = self.ec.map_or(1, |(_, m)| m + 1);
        let on = if self.ec.is_some() {
            self.pick_disks(id, want, &[])?
        } else {
            vec![0]
        };
        let header = SegmentHeader {
            segment_id: id,
            created_unix_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
        };
        let mut copies = Vec::with_capacity(on.len());
        for d in on {
            let dir = &self.disks[d].segments;
            let path = segment_path(dir, id);
            let io = &*self.io;
            let mut created = false;
            let made = (|| {
                let file = io.create_new(&path).map_err(|e| io_err(&path, e))?;
                created = true;
                io.write_at(&file, &path, &[&header.encode()], 0)
                    .map_err(|e| io_err(&path, e))?;
                // The header and the directory entry are made durable now, so that a later
                // fdatasync of appended records never depends on metadata that was not synced.
                io.sync(&file, &path, true).map_err(|e| io_err(&path, e))?;
                sync_dir(io, dir)?;
                Ok::<_, ChunkStoreError>(file)
            })();
            match made {
                Ok(file) => copies.push(Copy {
                    disk: d,
                    file: Arc::new(file),
                    path,
                }),
                Err(e) => {
                    if self.ec.is_some() && !matches!(e, ChunkStoreError::NoSpace { .. }) {
                        self.disks[d].fail(&e);
                    }
                    // Nothing was written to the copies made so far: they go, and so does this
                    // one if it was created.
                    for p in copies
                        .iter()
                        .map(|c| &c.path)
                        .chain(created.then_some(&path))
                    {
                        let _ = io.remove_file(p);
                    }
                    return Err(e);
                }
            }
        }
        self.catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(
                id,
                Placement::Copies(copies.iter().map(|c| c.disk).collect()),
            );
        Ok(ActiveSegment {
            id,
            copies,
            offset: SEGMENT_HEADER_BYTES as u64,
            poisoned: false,
            durable_below: id,
            last_append: std::time::Instant::now(),
        })
    }

    /// Appends one record. The bytes are not durable until `sync_through` returns.
    pub fn append(
        &self,
        object_id: [u8; 16],
        chunk_index: u32,
        payload: &[u8],
    ) -> Result<(RecordLocation, WriteTicket)> {
        let (len, header) = record_header(object_id, chunk_index, payload)?;
        let record_bytes = RECORD_HEADER_BYTES as u64 + u64::from(len);
        if self.read_only {
            return Err(ChunkStoreError::Config(
                "the store was opened read-only".into(),
            ));
        }

        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if active.poisoned
            || (active.offset + record_bytes > self.options.segment_bytes_max
                && active.offset > SEGMENT_HEADER_BYTES as u64)
        {
            self.rotate(&mut active)?;
        }
        let offset = active.offset;
        for c in &active.copies {
            if let Err(e) = self
                .io
                .write_at(&c.file, &c.path, &[&header, payload], offset)
            {
                // A failed write may have left part of the record in the file; the offset is
                // not advanced past it, and the next record overwrites it. With several
                // copies the segment is abandoned: its copies may now differ.
                let err = io_err(&c.path, e);
                if self.ec.is_some() {
                    if !matches!(err, ChunkStoreError::NoSpace { .. }) {
                        self.disks[c.disk].fail(&err);
                    }
                    active.poisoned = true;
                }
                return Err(err);
            }
        }
        active.offset += record_bytes;
        active.last_append = std::time::Instant::now();
        {
            let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
            stats.appends += 1;
            stats.appended_bytes += record_bytes;
        }
        Ok((
            RecordLocation {
                segment_id: active.id,
                offset,
                len,
            },
            WriteTicket {
                segment_id: active.id,
                end_offset: active.offset,
            },
        ))
    }

    /// Closes the active segment (syncing it fully) and starts the next one.
    pub(crate) fn rotate(&self, active: &mut ActiveSegment) -> Result<()> {
        if !active.poisoned {
            // Everything in the old segment becomes durable here, so `sync_through` can treat
            // any ticket of an older segment as already synced.
            for c in &active.copies {
                if let Err(e) = self.io.sync(&c.file, &c.path, false) {
                    // As in `sync_through`: the segment's unsynced bytes cannot be trusted, and
                    // its waiting writers are told their writes failed; the next append retries
                    // the rotation without this sync.
                    active.poisoned = true;
                    let err = io_err(&c.path, e);
                    if self.ec.is_some() && !matches!(err, ChunkStoreError::NoSpace { .. }) {
                        self.disks[c.disk].fail(&err);
                    }
                    return Err(err);
                }
            }
        }
        let mut next = self.create_segment(active.id + 1)?;
        if active.poisoned {
            next.durable_below = active.durable_below;
        }
        *active = next;
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.segments += 1;
        Ok(())
    }

    /// Returns once the record behind `ticket` is durable. Concurrent callers share one
    /// `fdatasync` (one per copy): whoever holds the `durable` lock syncs everything written
    /// so far, and the callers queued behind it usually find their ticket covered when they
    /// get the lock.
    pub fn sync_through(&self, ticket: WriteTicket) -> Result<()> {
        let mut durable = self.durable.lock().unwrap_or_else(|p| p.into_inner());
        // The common case, without the append lock: this segment is synced past the ticket.
        if durable.segment_id == ticket.segment_id && durable.end_offset >= ticket.end_offset {
            return Ok(());
        }
        let (files, written) = {
            let active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            // An older segment's ticket is answered by how that segment ended, never by the
            // durable mark (a later segment's sync moves past it): a segment abandoned after a
            // failed fsync stays not durable.
            if ticket.segment_id < active.durable_below {
                // Rotation synced the whole older segment before it switched.
                return Ok(());
            }
            if ticket.segment_id < active.id {
                return Err(ChunkStoreError::Io {
                    path: self.seg_path(ticket.segment_id),
                    source: std::io::Error::other(
                        "an fsync of this segment failed; the write is not durable",
                    ),
                });
            }
            if *durable >= ticket {
                return Ok(());
            }
            (
                active
                    .copies
                    .iter()
                    .map(|c| (c.disk, c.file.clone(), c.path.clone()))
                    .collect::<Vec<_>>(),
                WriteTicket {
                    segment_id: active.id,
                    end_offset: active.offset,
                },
            )
        };
        let sync_one = |file: &File, path: &Path| self.io.sync(file, path, false);
        let results: Vec<std::io::Result<()>> = if files.len() == 1 {
            vec![sync_one(&files[0].1, &files[0].2)]
        } else {
            // Copies sit on different disks: their syncs run side by side.
            std::thread::scope(|s| {
                let hs: Vec<_> = files
                    .iter()
                    .map(|(_, f, p)| s.spawn(|| sync_one(f, p)))
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err(std::io::Error::other("sync thread panicked")))
                    })
                    .collect()
            })
        };
        for ((disk, _, path), r) in files.iter().zip(results) {
            if let Err(e) = r {
                // After a failed fsync the kernel may have dropped dirty pages: nothing in this
                // segment past the last durable point may be trusted, so appends move on.
                let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
                if active.id == written.segment_id {
                    active.poisoned = true;
                }
                let err = io_err(path, e);
                if self.ec.is_some() && !matches!(err, ChunkStoreError::NoSpace { .. }) {
                    self.disks[*disk].fail(&err);
                }
                return Err(err);
            }
        }
        *durable = written;
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.syncs += 1;
        Ok(())
    }

    /// Seals the active segment now if it holds records (a new one takes over), so that
    /// compaction may reclaim its dead records. Returns whether it did.
    pub fn seal_active(&self) -> Result<bool> {
        if self.read_only {
            return Ok(false);
        }
        let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
        if active.offset <= SEGMENT_HEADER_BYTES as u64 {
            return Ok(false);
        }
        self.rotate(&mut active)?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn append_sync_read_roundtrip_and_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 4096);
        let mut locs = Vec::new();
        for i in 0..50u32 {
            let data = vec![i as u8; 300 + i as usize];
            let (loc, t) = s.append([7; 16], i, &data).unwrap();
            s.sync_through(t).unwrap();
            locs.push((loc, data));
        }
        assert!(s.stats().segments > 3, "small segment size must rotate");
        for (i, (loc, data)) in locs.iter().enumerate() {
            assert_eq!(&s.read(loc, &[7; 16], i as u32).unwrap(), data);
        }
        // A wrong identity is refused.
        assert!(matches!(
            s.read(&locs[0].0, &[8; 16], 0),
            Err(ChunkStoreError::Corrupt { .. })
        ));
    }

    #[test]
    fn flipped_byte_is_detected_and_restart_opens_new_segment() {
        let dir = tempfile::tempdir().unwrap();
        let (loc, _) = {
            let s = store(dir.path(), SEGMENT_BYTES_DEFAULT);
            let (loc, t) = s.append([1; 16], 0, b"hello world").unwrap();
            s.sync_through(t).unwrap();
            (loc, t)
        };
        let path = segment_path(dir.path(), loc.segment_id);
        let mut bytes = std::fs::read(&path).unwrap();
        let at = (loc.offset as usize) + RECORD_HEADER_BYTES + 3;
        bytes[at] ^= 0x40;
        // Append a torn half record too.
        bytes.extend_from_slice(&[0x50, 0x4b, 0x52]);
        std::fs::write(&path, &bytes).unwrap();
        let s = store(dir.path(), SEGMENT_BYTES_DEFAULT);
        assert!(s.stats().active_segment_id > loc.segment_id);
        assert!(matches!(
            s.read(&loc, &[1; 16], 0),
            Err(ChunkStoreError::Corrupt { .. })
        ));
        let scan = scan_segment(&path).unwrap();
        assert_eq!(scan.records.len(), 0);
        assert!(scan.torn_tail_bytes > 0);
    }

    #[test]
    fn concurrent_appends_share_syncs() {
        let dir = tempfile::tempdir().unwrap();
        let s = Arc::new(store(dir.path(), SEGMENT_BYTES_DEFAULT));
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for i in 0..100u32 {
                        let (loc, tk) = s.append([t as u8; 16], i, &[t as u8; 1000]).unwrap();
                        s.sync_through(tk).unwrap();
                        assert_eq!(
                            s.read(&loc, &[t as u8; 16], i).unwrap(),
                            vec![t as u8; 1000]
                        );
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let st = s.stats();
        assert!(st.syncs <= 800);
    }

    /// Segment creation, its directory fsync and the rotation's fsync each fail a write
    /// cleanly: the append that hit the fault is refused, nothing acknowledged before it is
    /// lost, a half-made segment file is removed, and appends work again once the fault clears.
    #[test]
    fn faults_in_segment_creation_and_rotation_refuse_the_write_and_lose_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let (s, io) = faulty_store(dir.path(), 4096, false);
        let mut acked = Vec::new();
        type Acked = Vec<(RecordLocation, u32, Vec<u8>)>;
        fn put(s: &ChunkStore, acked: &mut Acked, i: u32) -> Result<()> {
            let data = vec![i as u8; 1500];
            let (loc, t) = s.append([3; 16], i, &data)?;
            s.sync_through(t)?;
            acked.push((loc, i, data));
            Ok(())
        }
        let files = |d: &Path| std::fs::read_dir(d).unwrap().count();
        for (n, rule) in [
            eio(IoOp::Create, Some("seg-"), 0, Some(1)),
            eio(IoOp::Write, Some("seg-"), 0, Some(1)),
            eio(IoOp::Sync, None, 0, Some(1)),
            eio(IoOp::SyncDir, None, 0, Some(1)),
        ]
        .into_iter()
        .enumerate()
        {
            let before = files(dir.path());
            let op = rule.op;
            // Fill the active segment so that the next append rotates, then fail the rotation.
            let at_rotation = s.stats().active_segment_id;
            while s.stats().active_segment_id == at_rotation
                && s.stats().active_segment_bytes + 1540 <= 4096
            {
                let i = 100 * n as u32 + acked.len() as u32;
                put(&s, &mut acked, i).unwrap();
            }
            io.set_rules(vec![rule]);
            let injected = io.injected();
            assert!(
                put(&s, &mut acked, 9999).is_err(),
                "{op:?} fault must refuse the write"
            );
            assert_eq!(io.injected(), injected + 1, "{op:?}");
            io.set_rules(Vec::new());
            if op != IoOp::Sync {
                // A failed creation leaves no file behind (the rotation's own sync, which
                // fails before any creation, makes none).
                assert!(
                    files(dir.path()) <= before + 1,
                    "{op:?}: stray segment files"
                );
            }
            put(&s, &mut acked, 5000 + n as u32).unwrap();
        }
        for (loc, i, data) in &acked {
            assert_eq!(&s.read(loc, &[3; 16], *i).unwrap(), data);
        }
        // After a restart every acknowledged record still reads.
        drop(s);
        let s = store(dir.path(), 4096);
        for (loc, i, data) in &acked {
            assert_eq!(&s.read(loc, &[3; 16], *i).unwrap(), data);
        }
    }

    /// A failed fsync in a rotation poisons the old segment: a writer still waiting on it is
    /// told its write failed (it was never synced), and appends move to a new segment.
    #[test]
    fn a_failed_rotation_sync_fails_the_writers_still_waiting() {
        let dir = tempfile::tempdir().unwrap();
        let (s, io) = faulty_store(dir.path(), 4096, false);
        let (_, waiting) = s.append([4; 16], 0, &[1u8; 1500]).unwrap();
        s.append([4; 16], 1, &[2u8; 1500]).unwrap();
        io.set_rules(vec![eio(IoOp::Sync, None, 0, Some(1))]);
        // This append rotates; the rotation's sync fails.
        assert!(s.append([4; 16], 2, &[3u8; 1500]).is_err());
        io.set_rules(Vec::new());
        let (loc, t) = s.append([4; 16], 3, &[4u8; 1500]).unwrap();
        s.sync_through(t).unwrap();
        assert!(
            s.sync_through(waiting).is_err(),
            "a write whose segment failed to sync must not be acknowledged"
        );
        assert_ne!(loc.segment_id, waiting.segment_id);
    }
}
