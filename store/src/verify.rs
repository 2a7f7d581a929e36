//! `packrat admin verify`: an offline check that the index and the segments agree, on a
//! stopped server's data directory. Every chunk of every object and of every uploaded part is
//! read and verified (record identity, length, crc32c); object sizes must equal the sum of their
//! chunks; objects must belong to an existing bucket. It also measures live and dead bytes per
//! segment (what compaction would reclaim). It never writes: the index is opened read-only
//! (see `RocksIndex::open_read_only`) and the segments through `ChunkStore::open_read_only`.

use packrat_chunk_store::{
    ChunkStore, ChunkStoreOptions, RECORD_HEADER_BYTES, RecordLocation, SEGMENT_HEADER_BYTES,
};
use packrat_index::{ChunkRef, ObjectRecord, RocksIndex};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub buckets: u64,
    pub objects: u64,
    pub object_bytes: u64,
    pub parts: u64,
    pub records_checked: u64,
    pub segments: u64,
    pub segment_bytes: u64,
    /// Bytes of records some object or part references (headers included).
    pub live_bytes: u64,
    /// Segment bytes nothing references: overwritten or deleted data, torn tails, aborted
    /// writes (what compaction reclaims).
    pub dead_bytes: u64,
    /// Objects whose bucket no longer exists.
    pub orphaned_objects: u64,
    /// Erasure coding: records read from another copy or rebuilt from other shards, and
    /// segments missing a copy or shard (all still correct; `admin scrub` restores them).
    pub degraded_reads: u64,
    pub segments_degraded: u64,
    /// Records of objects moved to a storage tier (not read by the offline check).
    pub records_on_tiers: u64,
    /// Every problem found, one line each (at most 1000 kept).
    pub problems: Vec<String>,
    pub problem_count: u64,
}

impl Report {
    fn problem(&mut self, p: String) {
        self.problem_count += 1;
        if self.problems.len() < 1000 {
            self.problems.push(p);
        }
    }
}

struct Checker {
    segments: ChunkStore,
    live: BTreeMap<u64, u64>,
    report: Report,
    started: Instant,
    last_progress: Instant,
    quiet: bool,
}

impl Checker {
    fn chunks(&mut self, what: &str, ids: &[([u8; 16], u32)], chunks: &[ChunkRef]) {
        for (c, (rid, idx)) in chunks.iter().zip(ids) {
            let loc = RecordLocation {
                segment_id: c.segment_id,
                offset: c.offset,
                len: c.len,
            };
            if crate::tiers::is_tier_segment(c.segment_id) {
                // On a storage tier: checked when read, and by `admin tier run` when moved.
                self.report.records_on_tiers += 1;
                continue;
            }
            self.report.records_checked += 1;
            *self.live.entry(c.segment_id).or_default() +=
                RECORD_HEADER_BYTES as u64 + u64::from(c.len);
            if let Err(e) = self.segments.read(&loc, rid, *idx) {
                self.report.problem(format!("{what}: chunk {idx}: {e}"));
            }
        }
        if !self.quiet && self.last_progress.elapsed().as_secs() >= 1 {
            self.last_progress = Instant::now();
            eprint!(
                "\rverifying: {} objects, {} parts, {} records, {:.0} s   ",
                self.report.objects,
                self.report.parts,
                self.report.records_checked,
                self.started.elapsed().as_secs_f64()
            );
        }
    }
}

/// `segments_dir` is the single-disk segment directory; with `ec`, the segments are on
/// `disks` instead (read with the same fallback on copies and shards as the server's).
pub fn run(
    index: &RocksIndex,
    segments_dir: &std::path::Path,
    disks: &[std::path::PathBuf],
    ec: Option<(usize, usize)>,
    quiet: bool,
) -> Result<Report, String> {
    let segments = ChunkStore::open_read_only(
        segments_dir,
        ChunkStoreOptions {
            disks: disks.to_vec(),
            ec,
            ..Default::default()
        },
    )
    .map_err(|e| format!("cannot open the segments: {e}"))?;
    let mut ck = Checker {
        segments,
        live: BTreeMap::new(),
        report: Report::default(),
        started: Instant::now(),
        last_progress: Instant::now(),
        quiet,
    };
    let buckets: HashSet<u64> = index.bucket_ids().map_err(|e| e.to_string())?;
    ck.report.buckets = buckets.len() as u64;
    let ck_cell = std::cell::RefCell::new(&mut ck);
    // An object's current version, or (`version` set) a noncurrent one or a delete marker.
    let visit = |bucket_id: u64, what: String, obj: ObjectRecord| {
        let mut ck = ck_cell.borrow_mut();
        ck.report.objects += 1;
        ck.report.object_bytes += obj.size;
        if !buckets.contains(&bucket_id) {
            ck.report.orphaned_objects += 1;
            ck.report
                .problem(format!("{what}: its bucket does not exist"));
        }
        let sum: u64 = obj.chunks.iter().map(|c| u64::from(c.len)).sum();
        if sum != obj.size {
            ck.report.problem(format!(
                "{what}: size {} but chunks hold {sum} bytes",
                obj.size
            ));
        }
        let ids: Vec<([u8; 16], u32)> = (0..obj.chunks.len())
            .map(|i| obj.chunk_identity(i))
            .collect();
        ck.chunks(&what, &ids, &obj.chunks);
        Ok(())
    };
    index
        .scan_references(
            |bucket_id, key, obj| {
                visit(
                    bucket_id,
                    format!("object {key:?} (bucket id {bucket_id})"),
                    obj,
                )
            },
            |bucket_id, key, obj| {
                let what = format!(
                    "version {} of {key:?} (bucket id {bucket_id})",
                    obj.version_id()
                );
                visit(bucket_id, what, obj)
            },
            |upload_id, part| {
                let mut ck = ck_cell.borrow_mut();
                ck.report.parts += 1;
                let what = format!("upload {upload_id} part {}", part.part_number);
                let ids: Vec<([u8; 16], u32)> = (0..part.chunks.len())
                    .map(|i| (part.record_id, i as u32))
                    .collect();
                ck.chunks(&what, &ids, &part.chunks);
                Ok(())
            },
        )
        .map_err(|e| e.to_string())?;
    let segs = ck.segments.sealed_segments().map_err(|e| e.to_string())?;
    let present: HashSet<u64> = segs.iter().map(|(id, _)| *id).collect();
    for (id, len) in &segs {
        ck.report.segments += 1;
        ck.report.segment_bytes += len;
        let live = ck.live.get(id).copied().unwrap_or(0);
        ck.report.live_bytes += live;
        ck.report.dead_bytes += len.saturating_sub(SEGMENT_HEADER_BYTES as u64 + live);
    }
    for id in ck.live.keys() {
        if !present.contains(id) {
            ck.report.problem(format!(
                "segment {id} is referenced by the index but missing"
            ));
        }
    }
    let st = ck.segments.stats();
    ck.report.degraded_reads = st.degraded_reads;
    if let Some(ec) = ck.segments.ec_status() {
        ck.report.segments_degraded = ec.segments_degraded;
    }
    if !quiet {
        eprintln!();
    }
    Ok(ck.report)
}

pub fn print(r: &Report) {
    println!(
        "objects       {} in {} buckets ({} bytes), {} uploaded parts, {} records verified",
        r.objects, r.buckets, r.object_bytes, r.parts, r.records_checked
    );
    println!(
        "segments      {} ({} bytes): {} live, {} dead ({:.1}%)",
        r.segments,
        r.segment_bytes,
        r.live_bytes,
        r.dead_bytes,
        if r.segment_bytes > 0 {
            r.dead_bytes as f64 * 100.0 / r.segment_bytes as f64
        } else {
            0.0
        }
    );
    if r.records_on_tiers > 0 {
        println!(
            "tiers         {} records on storage tiers (not read offline)",
            r.records_on_tiers
        );
    }
    if r.degraded_reads > 0 || r.segments_degraded > 0 {
        println!(
            "redundancy    {} segments degraded, {} records read from redundancy (run admin scrub)",
            r.segments_degraded, r.degraded_reads
        );
    }
    if r.problem_count == 0 {
        println!("result        OK: the index and the segments agree");
    } else {
        println!("result        {} PROBLEMS:", r.problem_count);
        for p in &r.problems {
            println!("  {p}");
        }
    }
}
