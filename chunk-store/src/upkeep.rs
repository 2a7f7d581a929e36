//! Erasure-coding upkeep: sealing segments into shards, repair of damaged segments, scrub, and
//! the erasure-coding status.

use crate::disks::probe_disk;
use crate::disks::{DiskStatus, fs_space};
use crate::placement::{Placement, segment_path, sync_dir, tmp_path};
use crate::read::Handle;
use crate::record::SEGMENT_HEADER_BYTES;
use crate::segment_file::scan_segment;
use crate::{ChunkStore, ChunkStoreError, Result, ec, io_err};
use std::path::PathBuf;
use std::sync::Arc;

/// The erasure-coding state for `admin status`.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct EcStatus {
    pub k: usize,
    pub m: usize,
    pub disks: Vec<DiskStatus>,
    /// Segments being written (mirrored), sealed and waiting to be encoded, and encoded.
    pub segments_open: u64,
    pub segments_sealed: u64,
    pub segments_encoded: u64,
    /// Segments with a missing or corrupt copy or shard that still read correctly.
    pub segments_degraded: u64,
    /// Segments with fewer than k shards left: some of their objects cannot be read.
    pub segments_unrecoverable: u64,
}

/// What a scrub found and did.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct ScrubReport {
    pub segments_checked: u64,
    pub shards_checked: u64,
    pub bytes_checked: u64,
    pub shards_missing: u64,
    pub shards_corrupt: u64,
    pub shards_rebuilt: u64,
    pub segments_sealed: u64,
    /// Segments that could not be repaired (fewer than k good shards), by id.
    pub unrepairable: Vec<u64>,
}

/// Sealing, repair, scrub and status of erasure-coded segments.
impl ChunkStore {
    /// Seals the active segment if it holds records and has been idle for `idle`, then encodes
    /// every sealed segment still held as copies into shards (dropping the copies once the
    /// shards are durable). Returns how many segments were encoded. Without erasure coding
    /// this does nothing.
    pub fn seal_due(&self, idle: Option<std::time::Duration>) -> Result<u64> {
        if self.ec.is_none() || self.read_only {
            return Ok(0);
        }
        if let Some(idle) = idle {
            let mut active = self.active.lock().unwrap_or_else(|p| p.into_inner());
            if active.offset > SEGMENT_HEADER_BYTES as u64 && active.last_append.elapsed() >= idle {
                self.rotate(&mut active)?;
            }
        }
        let _guard = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        self.seal_pending()
    }

    fn seal_pending(&self) -> Result<u64> {
        let Some((k, m)) = self.ec else {
            return Ok(0);
        };
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).id;
        let pending: Vec<(u64, Vec<usize>)> = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .range(..active)
            .filter_map(|(id, p)| match p {
                Placement::Copies(on) => Some((*id, on.clone())),
                Placement::Shards { .. } => None,
            })
            .collect();
        let usable = self.disks.iter().filter(|d| d.usable()).count();
        if !pending.is_empty() && usable < k + m {
            // Sealed segments stay mirrored (M+1 copies) until enough disks are back.
            if !self
                .seal_blocked
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                tracing::error!(
                    usable,
                    needed = k + m,
                    "too few healthy disks to encode sealed segments; they stay mirrored"
                );
            }
            return Ok(0);
        }
        self.seal_blocked
            .store(false, std::sync::atomic::Ordering::Relaxed);
        let mut sealed = 0;
        for (id, on) in pending {
            match self.seal_one(id, &on, k, m) {
                Ok(true) => sealed += 1,
                Ok(false) => {}
                Err(e) => tracing::warn!(segment = id, error = %e, "sealing failed; retried later"),
            }
        }
        Ok(sealed)
    }

    fn seal_one(&self, id: u64, on: &[usize], k: usize, m: usize) -> Result<bool> {
        // The copy to encode: the one whose records verify furthest (a crash can leave copies
        // with different torn tails; acknowledged records are on all of them).
        let mut best: Option<(u64, u64, PathBuf)> = None;
        for &d in on {
            let path = segment_path(&self.disks[d].segments, id);
            let Ok(meta) = std::fs::metadata(&path) else {
                continue;
            };
            let valid = scan_segment(&path).map_or(0, |s| meta.len() - s.torn_tail_bytes);
            if best
                .as_ref()
                .is_none_or(|(v, l, _)| (valid, meta.len()) > (*v, *l))
            {
                best = Some((valid, meta.len(), path));
            }
        }
        let Some((valid, len, path)) = best else {
            return Err(ChunkStoreError::MissingSegment(id));
        };
        if valid < len {
            tracing::info!(
                segment = id,
                unverified_tail = len - valid,
                "segment copy ends in bytes that do not verify (torn by a crash); encoded as is, never read"
            );
        }
        let io = &*self.io;
        let src = io.open(&path).map_err(|e| io_err(&path, e))?;
        let targets = self.pick_disks(id, k + m, &[])?;
        let finals: Vec<PathBuf> = targets
            .iter()
            .enumerate()
            .map(|(i, &d)| self.disks[d].shards.join(ec::shard_file_name(id, i)))
            .collect();
        let tmps: Vec<PathBuf> = finals.iter().map(|p| tmp_path(p)).collect();
        for &d in &targets {
            io.create_dir_all(&self.disks[d].shards)
                .map_err(|e| io_err(&self.disks[d].shards, e))?;
        }
        let remove_all = |paths: &[PathBuf]| {
            for p in paths {
                let _ = io.remove_file(p);
            }
        };
        let layout = match ec::encode_segment(&self.io, id, (&src, &path), len, k, m, &tmps) {
            Ok(l) => l,
            Err(e) => {
                remove_all(&tmps);
                return Err(e);
            }
        };
        let mut catalog = self.catalog.lock().unwrap_or_else(|p| p.into_inner());
        if !matches!(catalog.get(&id), Some(Placement::Copies(_))) {
            // Retired by compaction meanwhile.
            remove_all(&tmps);
            return Ok(false);
        }
        for (t, f) in tmps.iter().zip(&finals) {
            if let Err(e) = io.rename(t, f) {
                remove_all(&tmps);
                remove_all(&finals);
                return Err(io_err(f, e));
            }
        }
        for &d in &targets {
            sync_dir(io, &self.disks[d].shards)?;
        }
        let place = Placement::Shards {
            layout,
            disks: targets.iter().map(|&d| Some(d)).collect(),
        };
        let handle = Arc::new(self.open_handle(id, &place)?);
        catalog.insert(id, place);
        self.readers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, handle);
        drop(catalog);
        // The shards are durable and published: the copies go (open handles keep serving
        // reads already under way).
        for &d in on {
            let p = segment_path(&self.disks[d].segments, id);
            if io.remove_file(&p).is_ok() {
                let _ = sync_dir(io, &self.disks[d].segments);
            }
        }
        use std::sync::atomic::Ordering::Relaxed;
        self.counters.segments_encoded.fetch_add(1, Relaxed);
        self.counters.bytes_encoded.fetch_add(len, Relaxed);
        tracing::info!(
            segment = id,
            bytes = len,
            k,
            m,
            "segment encoded into shards"
        );
        Ok(true)
    }

    /// Repairs the segments reads found damaged (background work between scrubs).
    pub fn repair_suspects(&self) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        if self.ec.is_none() || self.read_only {
            return Ok(report);
        }
        let ids: Vec<u64> = self
            .suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .copied()
            .collect();
        if ids.is_empty() {
            return Ok(report);
        }
        let _guard = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        report.segments_sealed = self.seal_pending()?;
        for id in ids {
            self.repair_segment(id, &mut |_| {}, &mut report)?;
        }
        Ok(report)
    }

    /// Verifies every shard of every encoded segment (header and block crcs), rebuilds the
    /// missing and corrupt ones onto healthy disks, and first encodes any sealed segment still
    /// held as copies. `rate` (bytes per second) throttles the reading; `progress` is told
    /// (bytes done, bytes in all).
    pub fn scrub(&self, rate: Option<u64>, progress: &dyn Fn(u64, u64)) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        if self.ec.is_none() || self.read_only {
            return Ok(report);
        }
        let _guard = self.maintenance.lock().unwrap_or_else(|p| p.into_inner());
        for d in &self.disks {
            // A disk that failed earlier and is writable again (replaced) is taken back.
            if d.failed.load(std::sync::atomic::Ordering::Relaxed)
                && self.io.create_dir_all(&d.shards).is_ok()
                && self.io.create_dir_all(&d.segments).is_ok()
                && probe_disk(&*self.io, &d.root).is_ok()
            {
                d.failed.store(false, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(disk = %d.root.display(), "disk is writable again");
            } else if !d.root.is_dir() {
                let _ = self.io.create_dir_all(&d.shards);
                let _ = self.io.create_dir_all(&d.segments);
            }
        }
        report.segments_sealed = self.seal_pending()?;
        let encoded: Vec<(u64, u64)> = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(|(id, p)| match p {
                Placement::Shards { layout, .. } => {
                    Some((*id, layout.shard_len as u64 * (layout.k + layout.m) as u64))
                }
                Placement::Copies(_) => None,
            })
            .collect();
        let total: u64 = encoded.iter().map(|(_, b)| b).sum();
        let start = std::time::Instant::now();
        let mut done = 0u64;
        progress(0, total);
        for (id, bytes) in encoded {
            let before = done;
            let mut pace = |n: u64| {
                done += n;
                if let Some(rate) = rate.filter(|r| *r > 0) {
                    let due = std::time::Duration::from_secs_f64(done as f64 / rate as f64);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            };
            self.repair_segment(id, &mut pace, &mut report)?;
            // Missing shards read nothing; the bar still moves by the segment's size.
            done = before + bytes;
            progress(done, total);
        }
        Ok(report)
    }

    fn repair_segment(
        &self,
        id: u64,
        pace: &mut dyn FnMut(u64),
        report: &mut ScrubReport,
    ) -> Result<()> {
        let io = &*self.io;
        let place = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned();
        let Some(Placement::Shards { layout, disks }) = place.clone() else {
            self.suspects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return Ok(());
        };
        let Some(place) = place else { return Ok(()) };
        let Handle::Shards(set) = self.open_handle(id, &place)? else {
            return Ok(());
        };
        report.segments_checked += 1;
        let mut bad = Vec::new();
        for i in 0..layout.k + layout.m {
            report.shards_checked += 1;
            if set.files[i].is_none() {
                report.shards_missing += 1;
                bad.push(i);
                continue;
            }
            match set.check(i, pace) {
                Ok(()) => report.bytes_checked += layout.shard_len as u64,
                Err(why) => {
                    tracing::warn!(segment = id, shard = i, reason = %why, "corrupt shard found");
                    report.shards_corrupt += 1;
                    bad.push(i);
                }
            }
        }
        if bad.is_empty() {
            self.suspects
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&id);
            return Ok(());
        }
        self.counters
            .shard_faults_found
            .fetch_add(bad.len() as u64, std::sync::atomic::Ordering::Relaxed);
        let n = self.disks.len();
        let holding: Vec<usize> = disks
            .iter()
            .enumerate()
            .filter(|(i, _)| !bad.contains(i))
            .filter_map(|(_, d)| *d)
            .collect();
        let mut chosen: Vec<usize> = Vec::new();
        for &i in &bad {
            let preferred = disks[i].unwrap_or(((id % n as u64) as usize + i) % n);
            let free =
                |d: usize| self.disks[d].usable() && !holding.contains(&d) && !chosen.contains(&d);
            let pick = if free(preferred) {
                Some(preferred)
            } else {
                (0..n).find(|&d| free(d))
            };
            match pick {
                Some(d) => chosen.push(d),
                None => {
                    tracing::error!(segment = id, "no healthy disk left to rebuild a shard on");
                    report.unrepairable.push(id);
                    return Ok(());
                }
            }
        }
        let finals: Vec<PathBuf> = bad
            .iter()
            .zip(&chosen)
            .map(|(&i, &d)| self.disks[d].shards.join(ec::shard_file_name(id, i)))
            .collect();
        let tmps: Vec<PathBuf> = finals.iter().map(|p| tmp_path(p)).collect();
        for &d in &chosen {
            io.create_dir_all(&self.disks[d].shards)
                .map_err(|e| io_err(&self.disks[d].shards, e))?;
        }
        let mut files = set.files.clone();
        for &i in &bad {
            files[i] = None;
        }
        let survivors = ec::ShardSet::new(self.io.clone(), id, layout, files, set.paths.clone())?;
        match survivors.rebuild_shards(&bad, &tmps) {
            Ok(()) => {}
            Err(e) => {
                for t in &tmps {
                    let _ = io.remove_file(t);
                }
                if matches!(e, ChunkStoreError::Unrecoverable { .. }) {
                    tracing::error!(segment = id, error = %e, "segment cannot be repaired");
                    report.unrepairable.push(id);
                    return Ok(());
                }
                return Err(e);
            }
        }
        let mut catalog = self.catalog.lock().unwrap_or_else(|p| p.into_inner());
        let Some(Placement::Shards { disks: now, .. }) = catalog.get(&id).cloned() else {
            for t in &tmps {
                let _ = std::fs::remove_file(t);
            }
            return Ok(());
        };
        let mut now = now;
        for ((&i, &d), (t, f)) in bad.iter().zip(&chosen).zip(tmps.iter().zip(&finals)) {
            io.rename(t, f).map_err(|e| io_err(f, e))?;
            if let Some(old) = now[i]
                && old != d
            {
                let _ = io.remove_file(&self.disks[old].shards.join(ec::shard_file_name(id, i)));
            }
            now[i] = Some(d);
        }
        for &d in &chosen {
            sync_dir(io, &self.disks[d].shards)?;
        }
        let place = Placement::Shards { layout, disks: now };
        let handle = Arc::new(self.open_handle(id, &place)?);
        catalog.insert(id, place);
        self.readers
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, handle);
        drop(catalog);
        self.suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        self.counters
            .shards_rebuilt
            .fetch_add(bad.len() as u64, std::sync::atomic::Ordering::Relaxed);
        report.shards_rebuilt += bad.len() as u64;
        tracing::info!(segment = id, shards = ?bad, "shards rebuilt");
        Ok(())
    }

    /// Disks, their capacity, and segments per state; `None` without erasure coding.
    pub fn ec_status(&self) -> Option<EcStatus> {
        let (k, m) = self.ec?;
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).id;
        let catalog = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let suspects = self
            .suspects
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut st = EcStatus {
            k,
            m,
            ..Default::default()
        };
        let mut copies = vec![0u64; self.disks.len()];
        let mut shards = vec![0u64; self.disks.len()];
        for (id, p) in &catalog {
            match p {
                Placement::Copies(on) => {
                    if *id >= active {
                        st.segments_open += 1;
                    } else {
                        st.segments_sealed += 1;
                    }
                    on.iter().for_each(|&d| copies[d] += 1);
                    if on.len() < m + 1 || suspects.contains(id) {
                        st.segments_degraded += 1;
                    }
                }
                Placement::Shards { disks, .. } => {
                    st.segments_encoded += 1;
                    disks.iter().flatten().for_each(|&d| shards[d] += 1);
                    let lost = disks.iter().filter(|d| d.is_none()).count();
                    if lost > m {
                        st.segments_unrecoverable += 1;
                    } else if lost > 0 || suspects.contains(id) {
                        st.segments_degraded += 1;
                    }
                }
            }
        }
        for (i, d) in self.disks.iter().enumerate() {
            let (capacity_bytes, free_bytes) = fs_space(&d.root).unwrap_or((0, 0));
            st.disks.push(DiskStatus {
                path: d.root.display().to_string(),
                online: d.usable(),
                capacity_bytes,
                free_bytes,
                segment_copies: copies[i],
                shards: shards[i],
            });
        }
        Some(st)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::*;

    #[test]
    fn erasure_coded_segments_survive_two_lost_disks_and_repair() {
        let dir = tempfile::tempdir().unwrap();
        let disks: Vec<PathBuf> = (0..6).map(|i| dir.path().join(format!("d{i}"))).collect();
        let mut locs = Vec::new();
        {
            let s = ec_store(&disks, 1 << 20);
            for i in 0..120u32 {
                let (loc, t) = s.append([5; 16], i, &payload(i)).unwrap();
                s.sync_through(t).unwrap();
                locs.push(loc);
            }
            // Open segments are mirrored on m + 1 = 3 disks.
            let st = s.ec_status().unwrap();
            assert_eq!(st.segments_open, 1);
            assert!(s.seal_due(Some(std::time::Duration::ZERO)).unwrap() > 5);
            let st = s.ec_status().unwrap();
            assert_eq!(st.segments_sealed, 0);
            assert!(st.segments_encoded > 5);
            for (i, loc) in locs.iter().enumerate() {
                assert_eq!(s.read(loc, &[5; 16], i as u32).unwrap(), payload(i as u32));
            }
            assert_eq!(s.stats().degraded_reads, 0);
        }
        let lose = |a: usize, b: usize| {
            std::fs::remove_dir_all(&disks[a]).unwrap();
            std::fs::remove_dir_all(&disks[b]).unwrap();
        };
        // Span reads rebuild missing shards; bytes that read but are wrong are caught by the
        // record check, and the caller then reads the record again with `read`.
        let read_all = |s: &ChunkStore, spans: bool| {
            for (i, loc) in locs.iter().enumerate() {
                assert_eq!(
                    s.read(loc, &[5; 16], i as u32).unwrap(),
                    payload(i as u32),
                    "record {i}"
                );
                if !spans {
                    continue;
                }
                let mut span = vec![0u8; RECORD_HEADER_BYTES + loc.len as usize];
                let n = s
                    .read_span_into(loc.segment_id, loc.offset, &mut span)
                    .unwrap();
                let span = Span {
                    segment_id: loc.segment_id,
                    offset: loc.offset,
                    bytes: &span[..n],
                };
                assert_eq!(
                    span.record(loc, &[5; 16], i as u32).unwrap(),
                    &payload(i as u32)[..]
                );
            }
        };
        lose(1, 4);
        let s = ec_store(&disks, 1 << 20);
        read_all(&s, true);
        assert!(s.stats().degraded_reads > 0);
        assert!(s.ec_status().unwrap().segments_degraded > 0);
        let report = s.scrub(None, &|_, _| {}).unwrap();
        assert!(report.shards_missing > 0 && report.shards_rebuilt == report.shards_missing);
        assert!(report.unrepairable.is_empty());
        assert_eq!(s.ec_status().unwrap().segments_degraded, 0);
        drop(s);
        lose(0, 5);
        let s = ec_store(&disks, 1 << 20);
        read_all(&s, true);
        s.scrub(None, &|_, _| {}).unwrap();
        drop(s);

        // Flipped bytes in every shard on one disk: reads still right, scrub repairs.
        let shard_dir = disks[2].join("shards");
        for e in std::fs::read_dir(&shard_dir).unwrap() {
            let p = e.unwrap().path();
            let mut b = std::fs::read(&p).unwrap();
            for at in (ec::SHARD_HEADER_BYTES as usize..b.len()).step_by(997) {
                b[at] ^= 0x10;
            }
            std::fs::write(&p, &b).unwrap();
        }
        let s = ec_store(&disks, 1 << 20);
        read_all(&s, false);
        let report = s.scrub(None, &|_, _| {}).unwrap();
        assert!(report.shards_corrupt > 0);
        assert_eq!(report.shards_rebuilt, report.shards_corrupt);
        let again = s.scrub(None, &|_, _| {}).unwrap();
        assert_eq!(again.shards_corrupt + again.shards_missing, 0);
        drop(s);

        // Three disks lost: records whose data shard survives still read; the others fail
        // with an error, never with wrong bytes.
        std::fs::remove_dir_all(&disks[0]).unwrap();
        lose(1, 3);
        let s = ec_store(&disks, 1 << 20);
        let (mut ok, mut lost) = (0, 0);
        for (i, loc) in locs.iter().enumerate() {
            match s.read(loc, &[5; 16], i as u32) {
                Ok(p) => {
                    assert_eq!(p, payload(i as u32));
                    ok += 1;
                }
                Err(ChunkStoreError::Unrecoverable { .. }) => lost += 1,
                Err(e) => panic!("unexpected error {e}"),
            }
        }
        assert!(ok > 0 && lost > 0, "ok {ok} lost {lost}");
        assert!(s.ec_status().unwrap().segments_unrecoverable > 0);
        // New writes still work on the surviving (and recreated) disks.
        let (loc, t) = s.append([6; 16], 0, b"after").unwrap();
        s.sync_through(t).unwrap();
        assert_eq!(s.read(&loc, &[6; 16], 0).unwrap(), b"after");
    }

    #[test]
    fn interrupted_seal_is_redone_and_finished_seal_drops_copies() {
        let dir = tempfile::tempdir().unwrap();
        let disks: Vec<PathBuf> = (0..6).map(|i| dir.path().join(format!("d{i}"))).collect();
        let mut locs = Vec::new();
        {
            let s = ec_store(&disks, 1 << 20);
            for i in 0..20u32 {
                let (loc, t) = s.append([7; 16], i, &payload(i)).unwrap();
                s.sync_through(t).unwrap();
                locs.push(loc);
            }
        }
        // A crash after some shards were renamed into place: simulate by writing a stray
        // shard file with a valid name but no siblings.
        let first = locs[0].segment_id;
        let stray = disks[0].join("shards").join(ec::shard_file_name(first, 0));
        {
            let s = ec_store(&disks, 1 << 20);
            s.seal_due(None).unwrap();
            std::fs::copy(
                disks
                    .iter()
                    .map(|d| d.join("shards").join(ec::shard_file_name(first, 0)))
                    .find(|p| p.exists())
                    .unwrap(),
                dir.path().join("keep"),
            )
            .unwrap();
        }
        // Put copies back next to a partial shard set: start-up keeps the copies.
        for d in &disks {
            for e in std::fs::read_dir(d.join("shards")).unwrap() {
                let p = e.unwrap().path();
                if p.file_name()
                    .unwrap()
                    .to_str()
                    .unwrap()
                    .starts_with(&format!("seg-{first:016x}"))
                {
                    std::fs::remove_file(p).unwrap();
                }
            }
        }
        std::fs::copy(dir.path().join("keep"), &stray).unwrap();
        let s = ec_store(&disks, 1 << 20);
        // Only one shard and no copy: the segment is beyond repair, and says so.
        let r = s.read(&locs[0], &[7; 16], 0);
        assert!(r.is_err() || r.unwrap() == payload(0));
    }

    /// Faults in sealing (a shard write, a rename into place, a directory fsync) leave the
    /// segment mirrored and readable, with no temporary shard left behind; the next seal,
    /// once the fault clears, encodes it.
    #[test]
    fn a_seal_that_fails_keeps_the_copies_and_is_redone() {
        let dir = tempfile::tempdir().unwrap();
        let (s, io) = faulty_store(dir.path(), 64 * 1024, true);
        let mut locs = Vec::new();
        for i in 0..12u32 {
            let data = payload(i % 2);
            let (loc, t) = s.append([6; 16], i, &data).unwrap();
            s.sync_through(t).unwrap();
            locs.push((loc, data));
        }
        s.seal_active().unwrap();
        let encoded = || s.stats().segments_encoded;
        let leftovers = || {
            (0..6)
                .flat_map(|d| std::fs::read_dir(dir.path().join(format!("d{d}/shards"))).unwrap())
                .filter(|e| {
                    e.as_ref()
                        .unwrap()
                        .file_name()
                        .to_string_lossy()
                        .ends_with(".tmp")
                })
                .count()
        };
        for rule in [
            eio(IoOp::Write, Some("shards"), 3, Some(1)),
            eio(IoOp::Rename, Some("shards"), 2, Some(1)),
            eio(IoOp::SyncDir, Some("shards"), 0, Some(1)),
        ] {
            io.set_rules(vec![rule.clone()]);
            let before = encoded();
            s.seal_due(None).unwrap();
            assert!(io.injected() > 0, "{rule:?} was never hit");
            assert_eq!(
                encoded(),
                before,
                "{rule:?}: the segment must stay mirrored"
            );
            assert_eq!(leftovers(), 0, "{rule:?} left temporary shards");
            for (i, (loc, data)) in locs.iter().enumerate() {
                assert_eq!(&s.read(loc, &[6; 16], i as u32).unwrap(), data, "{rule:?}");
            }
        }
        io.set_rules(Vec::new());
        s.seal_due(None).unwrap();
        assert_eq!(encoded(), 1, "the segment is encoded once the faults clear");
        assert_eq!(s.ec_status().unwrap().segments_sealed, 0);
        for (i, (loc, data)) in locs.iter().enumerate() {
            assert_eq!(&s.read(loc, &[6; 16], i as u32).unwrap(), data);
        }
    }
}
