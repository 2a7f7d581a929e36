//! Compaction: reclaims the space of overwritten and deleted objects.
//!
//! Segments are append-only, so an overwrite or a delete leaves the old records in place as
//! dead bytes. Compaction picks sealed segments whose live share has fallen below a threshold,
//! copies their live records (of current objects, of the noncurrent versions a versioned
//! bucket keeps and of the parts of uploads in progress) to the active segment (same record
//! identity, so every check on read still holds), makes the copies durable, points the
//! entries at them with a
//! compare-and-set under each key's lock (a write or delete that raced the move always wins),
//! checks that nothing references the old segments any more, and only then removes them.
//!
//! A crash at any point leaves either the old references (the copies are garbage) or the new
//! ones (the old segment is garbage until the next run): nothing is lost either way.

use crate::engine::{Engine, Held, Relocation, blocking};
use crate::error::EngineResult;
use crate::job::Job;
use packrat_chunk_store::{RECORD_HEADER_BYTES, RecordLocation, SEGMENT_HEADER_BYTES, WriteTicket};
use packrat_index::ChunkRef;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Objects moved per commit (one fsync and one index batch for all of them)...
const BATCH_OBJECTS: usize = 256;
/// ...or this many bytes of records, whichever comes first.
const BATCH_BYTES: u64 = 16 * 1024 * 1024;

pub use crate::reports::{CompactReport, Space};

/// An entry's chunks in chosen segments: (bucket id, key, which entry of the key,
/// [(position, location, record id, chunk index)]).
type ToMove = (u64, String, Held, Vec<(usize, ChunkRef, [u8; 16], u32)>);

fn record_bytes(c: &ChunkRef) -> u64 {
    RECORD_HEADER_BYTES as u64 + u64::from(c.len)
}

/// Bytes referenced per segment (by current objects, noncurrent versions and the parts of
/// uploads in progress, as of one snapshot of the index), and the number of objects.
fn scan_live(engine: &Engine) -> EngineResult<(HashMap<u64, u64>, u64)> {
    let live = std::cell::RefCell::new(HashMap::<u64, u64>::new());
    let mut objects = 0u64;
    let count = |chunks: &[ChunkRef]| {
        let mut live = live.borrow_mut();
        for c in chunks {
            *live.entry(c.segment_id).or_default() += record_bytes(c);
        }
    };
    engine.index.scan_references(
        |_, _, obj| {
            objects += 1;
            count(&obj.chunks);
            Ok(())
        },
        |_, _, version| {
            count(&version.chunks);
            Ok(())
        },
        |_, part| {
            count(&part.chunks);
            Ok(())
        },
    )?;
    Ok((live.into_inner(), objects))
}

/// Starts a compaction as the admin job `JobKind::Compact` (followed with a progress bar:
/// bytes of live records moved of those to move), unless one is running. False if one is.
pub fn start(engine: &Arc<Engine>, threshold: f64, grace: Duration) -> bool {
    if !engine.compaction_job.try_start() {
        return false;
    }
    let engine = engine.clone();
    tokio::spawn(async move {
        let job = &engine.compaction_job;
        let r = compact(&engine, threshold, grace, Some(job)).await;
        job.finish(r.map_err(|e| e.to_string()));
    });
    true
}

/// Compacts every sealed segment whose live bytes are below `threshold` (0 to 1) of its
/// record bytes. Removed segments stay readable through open handles for `grace`. `progress`,
/// when given, is told the bytes to move and the bytes moved as batches commit.
pub async fn compact(
    engine: &Arc<Engine>,
    threshold: f64,
    grace: Duration,
    progress: Option<&Job<CompactReport>>,
) -> EngineResult<CompactReport> {
    let _one_at_a_time = engine.compaction.lock().await;
    let started = Instant::now();
    let mut report = CompactReport::default();
    let e = engine.clone();
    let (sealed, live, objects) = blocking(move || {
        let sealed = e.chunks.sealed_segments()?;
        let (live, objects) = scan_live(&e)?;
        Ok((sealed, live, objects))
    })
    .await?;
    report.objects_scanned = objects;
    report.sealed_segments = sealed.len() as u64;
    // Logical bytes (each segment once): with erasure coding the files on disk hold more.
    let all_bytes = engine.chunks.segment_bytes();
    let live_total: u64 = live.values().sum();
    report.before = Space {
        segment_bytes: all_bytes,
        live_bytes: live_total,
        dead_bytes: all_bytes.saturating_sub(live_total),
        measured_ms: engine.clock.now_ms(),
    };
    *engine.last_space.lock().unwrap_or_else(|p| p.into_inner()) = Some(report.before);
    // Segments holding records of writes not yet indexed are off limits (they would look
    // unreferenced). Every in-flight write registered before its first append, with the then
    // active segment, so every segment it can write to is at or above the floor.
    let floor = engine.inflight_floor();
    let mut victims: HashMap<u64, u64> = HashMap::new(); // id -> file size
    for (id, size) in sealed.iter().filter(|(id, _)| *id < floor) {
        let records = size.saturating_sub(SEGMENT_HEADER_BYTES as u64);
        let l = live.get(id).copied().unwrap_or(0);
        if (l as f64) < threshold * records as f64 {
            report.segments_chosen += 1;
            victims.insert(*id, *size);
        }
    }
    if victims.is_empty() {
        report.seconds = started.elapsed().as_secs_f64();
        return Ok(report);
    }

    // Every entry with a chunk in a victim, and which chunks.
    let e = engine.clone();
    let v: HashSet<u64> = victims.keys().copied().collect();
    let to_move: Vec<ToMove> = blocking(move || {
        let mut out = Vec::new();
        let in_victims = |chunks: &[ChunkRef], identity: &dyn Fn(usize) -> ([u8; 16], u32)| {
            chunks
                .iter()
                .enumerate()
                .filter(|(_, c)| v.contains(&c.segment_id))
                .map(|(i, c)| {
                    let (rid, idx) = identity(i);
                    (i, *c, rid, idx)
                })
                .collect::<Vec<_>>()
        };
        e.index.for_each_record(|bucket_id, key, obj, version| {
            let moved = in_victims(&obj.chunks, &|i| obj.chunk_identity(i));
            if !moved.is_empty() {
                let held = Held::object(version.then_some(obj.version_seq));
                out.push((bucket_id, key.to_string(), held, moved));
            }
            Ok(())
        })?;
        e.index.for_each_upload_part(|upload, part| {
            let moved = in_victims(&part.chunks, &|i| (part.record_id, i as u32));
            if !moved.is_empty() {
                let held = Held::Part {
                    upload_id: upload.upload_id.clone(),
                    number: part.part_number,
                };
                out.push((upload.bucket_id, upload.key.clone(), held, moved));
            }
            Ok(())
        })?;
        Ok(out)
    })
    .await?;

    if let Some(p) = progress {
        p.set_total(
            to_move
                .iter()
                .flat_map(|(_, _, _, chunks)| chunks.iter().map(|(_, c, _, _)| record_bytes(c)))
                .sum(),
        );
    }
    // Copy in batches: read and verify each record, append it to the active segment, then
    // one durable commit per batch.
    let mut batch: Vec<ToMove> = Vec::new();
    let mut batch_bytes = 0u64;
    let mut pending = to_move.into_iter().peekable();
    while pending.peek().is_some() || !batch.is_empty() {
        while let Some(next) =
            pending.next_if(|_| batch.len() < BATCH_OBJECTS && batch_bytes < BATCH_BYTES)
        {
            batch_bytes += next
                .3
                .iter()
                .map(|(_, c, _, _)| record_bytes(c))
                .sum::<u64>();
            batch.push(next);
        }
        let work = std::mem::take(&mut batch);
        batch_bytes = 0;
        let e = engine.clone();
        let (relocations, ticket, moved, bytes) = blocking(move || {
            let mut relocations = Vec::with_capacity(work.len());
            let mut ticket: Option<WriteTicket> = None;
            let (mut moved, mut bytes) = (0u64, 0u64);
            for (bucket_id, key, held, chunks) in work {
                let mut r = Relocation {
                    bucket_id,
                    key,
                    held,
                    moved: Vec::with_capacity(chunks.len()),
                };
                let mut ok = true;
                for (i, c, rid, idx) in chunks {
                    let loc = RecordLocation {
                        segment_id: c.segment_id,
                        offset: c.offset,
                        len: c.len,
                    };
                    let data = match e.chunks.read(&loc, &rid, idx) {
                        Ok(d) => d,
                        Err(err) => {
                            // Not moved: its segment is kept (the final check finds the
                            // reference), and the read error stays visible to clients.
                            tracing::error!(key = %r.key, error = %err, "compaction cannot read a live record; its segment is kept");
                            ok = false;
                            break;
                        }
                    };
                    let (new, t) = e.chunks.append(rid, idx, &data)?;
                    ticket = Some(ticket.map_or(t, |old| old.max(t)));
                    moved += 1;
                    bytes += record_bytes(&c);
                    r.moved.push((
                        i,
                        c,
                        ChunkRef {
                            segment_id: new.segment_id,
                            offset: new.offset,
                            len: new.len,
                        },
                    ));
                }
                if ok {
                    relocations.push(r);
                }
            }
            Ok((relocations, ticket, moved, bytes))
        })
        .await?;
        let (updated, changed) = engine.commit_relocations(relocations, ticket).await?;
        report.records_moved += moved;
        report.bytes_moved += bytes;
        if let Some(p) = progress {
            p.add_done(bytes);
        }
        report.objects_moved += updated;
        report.objects_changed_meanwhile += changed;
    }

    // Nothing may reference a segment that is about to go: checked against the index as it
    // is now, after every move committed.
    let e = engine.clone();
    let (live_after, _) = blocking(move || scan_live(&e)).await?;
    let floor = engine.inflight_floor();
    for (id, size) in victims {
        if live_after.get(&id).copied().unwrap_or(0) > 0 || id >= floor {
            report.segments_kept += 1;
            continue;
        }
        let e = engine.clone();
        match blocking(move || Ok(e.chunks.retire_segment(id, grace)?)).await {
            Ok(()) => {
                report.segments_removed += 1;
                report.bytes_reclaimed += size;
            }
            Err(err) => {
                tracing::error!(segment = id, error = %err, "cannot remove a compacted segment");
                report.segments_kept += 1;
            }
        }
    }
    report.seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        segments_removed = report.segments_removed,
        bytes_reclaimed = report.bytes_reclaimed,
        records_moved = report.records_moved,
        objects_changed_meanwhile = report.objects_changed_meanwhile,
        seconds = report.seconds,
        "compaction finished"
    );
    Ok(report)
}

/// Runs compaction every `interval` in the background (errors are logged, never fatal).
pub fn spawn_background(engine: Arc<Engine>, interval: Duration, threshold: f64, grace: Duration) {
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(interval).await;
            engine.chunks.reap_retired();
            if let Err(e) = compact(&engine, threshold, grace, None).await {
                tracing::error!(error = %e, "background compaction failed");
            }
        }
    });
}
