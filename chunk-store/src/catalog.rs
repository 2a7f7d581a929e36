//! The segment catalog: where each segment's bytes are (copies or shards), segment file names,
//! opening the store (rebuilding the catalog from the files on the disks and finishing or undoing
//! an interrupted seal), and retiring segments that compaction emptied.

use crate::append::ActiveSegment;
use crate::disks::Disk;
use crate::io::SegmentIo;
use crate::placement::{Placement, list_dir, parse_segment_name, segment_path, sync_dir};
use crate::segment_file::scan_segment;
use crate::{
    ChunkStore, ChunkStoreError, ChunkStoreOptions, ChunkStoreStats, EcCounters, IoBackend, Result,
    WriteTicket, ec, io_err, uring,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Mutex, RwLock};

impl ChunkStore {
    /// Opens (creating if needed) the segment directory and starts a new active segment.
    /// With `options.ec` set, `dir` is unused and the segments live on `options.disks`.
    pub fn open(dir: impl Into<PathBuf>, options: ChunkStoreOptions) -> Result<Self> {
        Self::open_mode(dir.into(), options, false)
    }

    /// Opens the segments for reading only, for offline tools (`packrat admin verify`): it
    /// creates, removes and writes nothing (no active segment; `append` fails), and reads
    /// fall back on redundancy exactly as in a running server.
    pub fn open_read_only(dir: impl Into<PathBuf>, options: ChunkStoreOptions) -> Result<Self> {
        Self::open_mode(dir.into(), options, true)
    }

    fn open_mode(dir: PathBuf, options: ChunkStoreOptions, read_only: bool) -> Result<Self> {
        let disks: Vec<Disk> = match options.ec {
            None => vec![Disk {
                root: dir.clone(),
                shards: dir.join("shards"),
                segments: dir,
                failed: Default::default(),
            }],
            Some((k, m)) => {
                if k == 0 || m == 0 || options.disks.len() < k + m {
                    return Err(ChunkStoreError::Config(format!(
                        "erasure coding {k}+{m} needs k >= 1, m >= 1 and at least {} disks ({} given)",
                        k + m,
                        options.disks.len()
                    )));
                }
                options
                    .disks
                    .iter()
                    .map(|root| Disk {
                        root: root.clone(),
                        segments: root.join("segments"),
                        shards: root.join("shards"),
                        failed: Default::default(),
                    })
                    .collect()
            }
        };
        for d in disks.iter().filter(|_| !read_only) {
            if options.ec.is_some() && !d.root.exists() {
                tracing::warn!(
                    disk = %d.root.display(),
                    "disk directory is missing: created empty (a replaced disk); its copies and \
                     shards are read around and rebuilt by repair"
                );
            }
            options
                .io
                .create_dir_all(&d.segments)
                .map_err(|e| io_err(&d.segments, e))?;
            if options.ec.is_some() {
                options
                    .io
                    .create_dir_all(&d.shards)
                    .map_err(|e| io_err(&d.shards, e))?;
            }
        }
        let catalog = Self::load_catalog(&*options.io, &disks, options.ec, read_only)?;
        let next_id = catalog.keys().next_back().map_or(1, |id| id + 1);
        if let Some((&last, Placement::Copies(on))) = catalog.iter().next_back()
            && let Some(&d) = on.first()
        {
            // Report the state of the segment that was active when the process stopped: a
            // crash may have left a torn tail there, which is never indexed and never read.
            match scan_segment(&segment_path(&disks[d].segments, last)) {
                Ok(scan) if scan.torn_tail_bytes > 0 => tracing::warn!(
                    segment = last,
                    records = scan.records.len(),
                    torn_tail_bytes = scan.torn_tail_bytes,
                    "previous active segment ends in a torn tail (crash); it is never read"
                ),
                Ok(scan) => tracing::info!(
                    segment = last,
                    records = scan.records.len(),
                    "previous active segment is intact"
                ),
                Err(e) => {
                    tracing::warn!(segment = last, error = %e, "cannot scan previous segment")
                }
            }
        }
        let segments = catalog.len() as u64;
        let store = Self {
            uring: None,
            mapped_paused_until_ms: AtomicU64::new(0),
            opened: std::time::Instant::now(),
            durable: Mutex::new(WriteTicket {
                segment_id: 0,
                end_offset: 0,
            }),
            stats: Mutex::new(ChunkStoreStats {
                segments,
                ..Default::default()
            }),
            active: Mutex::new(ActiveSegment {
                id: 0,
                copies: Vec::new(),
                offset: 0,
                poisoned: false,
                durable_below: 0,
                last_append: std::time::Instant::now(),
            }),
            catalog: Mutex::new(catalog),
            readers: RwLock::new(HashMap::new()),
            counters: EcCounters::default(),
            suspects: Mutex::new(BTreeSet::new()),
            retired: Mutex::new(Vec::new()),
            maintenance: Mutex::new(()),
            io: options.io.clone(),
            ec: options.ec,
            read_only,
            seal_blocked: Default::default(),
            disks,
            options,
        };
        if read_only {
            store.active.lock().unwrap_or_else(|p| p.into_inner()).id = u64::MAX;
            return Ok(store);
        }
        let active = store.create_segment(next_id)?;
        let first = active.copies[0].file.clone();
        let first_path = active.copies[0].path.clone();
        *store.durable.lock().unwrap_or_else(|p| p.into_inner()) = WriteTicket {
            segment_id: active.id,
            end_offset: active.offset,
        };
        *store.active.lock().unwrap_or_else(|p| p.into_inner()) = active;
        store
            .stats
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .segments += 1;
        let uring = match store.options.io_backend {
            // An I/O backend that must see every read gets no io_uring reads.
            _ if !store.io.raw_reads() => None,
            IoBackend::Pread => None,
            wanted => match uring::UringReader::start(&first) {
                Ok(r) => {
                    tracing::info!("reads use io_uring");
                    Some(r)
                }
                Err(e) if wanted == IoBackend::Auto => {
                    tracing::info!(error = %e, "io_uring unavailable; reads use pread");
                    None
                }
                Err(e) => return Err(io_err(&first_path, e)),
            },
        };
        if uring.is_none() {
            tracing::info!("reads use pread");
        }
        Ok(Self { uring, ..store })
    }

    /// Builds the segment catalog from the files on the disks, finishing or undoing a seal
    /// that a crash interrupted: a segment with every shard and leftover copies lost its copies
    /// (the seal had finished); one with copies and an incomplete shard set loses the shards
    /// (the seal had not, and runs again).
    fn load_catalog(
        io: &dyn SegmentIo,
        disks: &[Disk],
        ec: Option<(usize, usize)>,
        read_only: bool,
    ) -> Result<BTreeMap<u64, Placement>> {
        let remove = |p: &Path| {
            if !read_only {
                let _ = io.remove_file(p);
            }
        };
        let mut copies: BTreeMap<u64, Vec<usize>> = BTreeMap::new();
        for (d, disk) in disks.iter().enumerate() {
            for (id, _) in list_dir(&disk.segments, parse_segment_name)? {
                copies.entry(id).or_default().push(d);
            }
        }
        let mut shards: BTreeMap<u64, Vec<(usize, usize, ec::ShardHeader)>> = BTreeMap::new();
        if ec.is_some() {
            for (d, disk) in disks.iter().enumerate() {
                for (name, _) in list_dir(&disk.shards, |n| Some(n.to_string()))? {
                    let path = disk.shards.join(&name);
                    if name.ends_with(".tmp") {
                        // A seal or repair that did not finish; it will run again.
                        remove(&path);
                        continue;
                    }
                    let Some((id, index)) = ec::parse_shard_name(&name) else {
                        continue;
                    };
                    let header = io
                        .open(&path)
                        .map_err(|e| io_err(&path, e))
                        .and_then(|f| ec::read_shard_header(io, &f, &path));
                    match header {
                        Ok(h) if h.segment_id == id && h.index as usize == index => {
                            shards.entry(id).or_default().push((index, d, h))
                        }
                        Ok(_) => {
                            tracing::warn!(path = %path.display(), "shard header does not match its name; ignored")
                        }
                        Err(e) => {
                            tracing::warn!(path = %path.display(), error = %e, "unreadable shard header; the shard counts as lost")
                        }
                    }
                }
            }
        }
        let mut catalog = BTreeMap::new();
        for (id, found) in shards {
            let h = found[0].2;
            let Ok(layout) = h.layout() else { continue };
            let mut on: Vec<Option<usize>> = vec![None; layout.k + layout.m];
            for (index, d, hh) in &found {
                if hh.segment_len == h.segment_len && hh.k == h.k && hh.m == h.m {
                    on[*index] = Some(*d);
                }
            }
            let complete = on.iter().all(Option::is_some);
            match copies.remove(&id) {
                Some(cs) if !complete => {
                    tracing::info!(
                        segment = id,
                        "incomplete seal found; the segment is sealed again"
                    );
                    for (index, d, _) in found {
                        remove(&disks[d].shards.join(ec::shard_file_name(id, index)));
                    }
                    catalog.insert(id, Placement::Copies(cs));
                    continue;
                }
                Some(cs) => {
                    for d in cs {
                        remove(&segment_path(&disks[d].segments, id));
                    }
                }
                None => {}
            }
            let lost = on.iter().filter(|d| d.is_none()).count();
            if lost > 0 {
                tracing::warn!(
                    segment = id,
                    lost,
                    "encoded segment is missing shards; reads rebuild them until repair"
                );
            }
            catalog.insert(id, Placement::Shards { layout, disks: on });
        }
        for (id, cs) in copies {
            catalog.insert(id, Placement::Copies(cs));
        }
        Ok(catalog)
    }

    /// The segments no longer written to (every one but the active one), with their sizes,
    /// by id.
    pub fn sealed_segments(&self) -> Result<Vec<(u64, u64)>> {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).id;
        let catalog = self
            .catalog
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut out = Vec::new();
        for (id, place) in catalog.range(..active) {
            let len = match place {
                Placement::Shards { layout, .. } => layout.len,
                Placement::Copies(on) => on
                    .iter()
                    .filter_map(|&d| {
                        std::fs::metadata(segment_path(&self.disks[d].segments, *id)).ok()
                    })
                    .map(|m| m.len())
                    .max()
                    .unwrap_or(0),
            };
            out.push((*id, len));
        }
        Ok(out)
    }

    /// Every file of segment `id` as the catalog knows it.
    fn segment_files(&self, id: u64, place: &Placement) -> Vec<(usize, PathBuf)> {
        match place {
            Placement::Copies(on) => on
                .iter()
                .map(|&d| (d, segment_path(&self.disks[d].segments, id)))
                .collect(),
            Placement::Shards { disks, .. } => disks
                .iter()
                .enumerate()
                .filter_map(|(i, d)| {
                    d.map(|d| (d, self.disks[d].shards.join(ec::shard_file_name(id, i))))
                })
                .collect(),
        }
    }

    /// Removes a sealed segment that nothing references any more (compaction moved its live
    /// records). Its files are unlinked now (their space returns once the last handle closes),
    /// but this store keeps its handles open for `grace`, so a read that looked the old
    /// location up just before the index changed still succeeds. The active segment is never
    /// removed.
    pub fn retire_segment(&self, segment_id: u64, grace: std::time::Duration) -> Result<()> {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).id;
        if segment_id >= active {
            return Err(ChunkStoreError::Io {
                path: self.seg_path(segment_id),
                source: std::io::Error::other("the active segment cannot be retired"),
            });
        }
        // Opened (and cached) before the unlink, so in-flight readers keep working.
        self.reader(segment_id)?;
        let mut catalog = self.catalog.lock().unwrap_or_else(|p| p.into_inner());
        let Some(place) = catalog.remove(&segment_id) else {
            return Err(ChunkStoreError::MissingSegment(segment_id));
        };
        let files = self.segment_files(segment_id, &place);
        let mut dirs = BTreeSet::new();
        for (_, path) in &files {
            match self.io.remove_file(path) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(io_err(path, e)),
            }
            if let Some(dir) = path.parent() {
                dirs.insert(dir.to_path_buf());
            }
        }
        drop(catalog);
        for dir in dirs {
            sync_dir(&*self.io, &dir)?;
        }
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((segment_id, std::time::Instant::now() + grace));
        let mut stats = self.stats.lock().unwrap_or_else(|p| p.into_inner());
        stats.segments = stats.segments.saturating_sub(1);
        drop(stats);
        self.reap_retired();
        Ok(())
    }

    /// Closes the handles of retired segments whose grace period is over.
    pub fn reap_retired(&self) {
        let now = std::time::Instant::now();
        let mut expired = Vec::new();
        self.retired
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|(id, until)| {
                if *until <= now {
                    expired.push(*id);
                    false
                } else {
                    true
                }
            });
        if !expired.is_empty() {
            let mut readers = self.readers.write().unwrap_or_else(|p| p.into_inner());
            for id in expired {
                readers.remove(&id);
            }
        }
    }

    /// Logical segment bytes: every segment's length as written (headers and records), once,
    /// whatever its redundancy on disk.
    pub fn segment_bytes(&self) -> u64 {
        let active = self.active.lock().unwrap_or_else(|p| p.into_inner()).offset;
        self.sealed_segments()
            .map(|s| s.iter().map(|(_, len)| len).sum::<u64>())
            .unwrap_or(0)
            + active
    }

    /// Bytes of all segment and shard files on disk.
    pub fn disk_bytes(&self) -> u64 {
        let mut total = 0;
        for d in &self.disks {
            for dir in [&d.segments, &d.shards] {
                let Ok(entries) = std::fs::read_dir(dir) else {
                    continue;
                };
                total += entries
                    .filter_map(|e| e.ok())
                    .filter(|e| {
                        e.file_name().to_str().is_some_and(|n| {
                            parse_segment_name(n).is_some() || ec::parse_shard_name(n).is_some()
                        })
                    })
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum::<u64>();
            }
        }
        total
    }
}
