//! The tier worker: applies lifecycle rules, moves objects between local NVMe and the storage
//! tiers their classes name, and removes tier segments nothing references (the tiers
//! themselves, their catalog and reads: `tiers`).

use crate::engine::{Engine, Held, Relocation, blocking};
use crate::error::{EngineError, EngineResult};
pub use crate::tiers::RunProgress;
use crate::tiers::*;
use packrat_chunk_store::{IoOp, SegmentFileWriter};
use packrat_index::{ChunkRef, ObjectRecord};
use packrat_store_api::StoreError;
use packrat_store_api::lifecycle::{self, Action, Rule};
use packrat_tiering::Tier;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

// ---- the worker ----

/// Where an object's class says its bytes belong: a tier's class, or None for local NVMe.
fn wanted_tier(tiers: &Tiers, obj: &ObjectRecord) -> Option<String> {
    obj.storage_class
        .as_ref()
        .filter(|c| tiers.tiers.contains_key(*c))
        .cloned()
}

fn chunk_tier(tiers: &Tiers, c: &ChunkRef) -> Option<String> {
    if is_tier_segment(c.segment_id) {
        Some(
            tiers
                .segment(c.segment_id)
                .map_or_else(String::new, |s| s.tier),
        )
    } else {
        None
    }
}

/// An object (or a noncurrent version of one: `version_seq`) some of whose chunks must move,
/// and where to.
struct Pending {
    bucket_id: u64,
    key: String,
    version_seq: Option<u64>,
    obj: ObjectRecord,
    to: Option<String>,
    bytes: u64,
}

/// What `admin tier status` reports (types of the store seam).
pub use packrat_store_api::reports::{TierInfo, TierStatus};

pub async fn status(engine: &Arc<Engine>) -> EngineResult<TierStatus> {
    let e = engine.clone();
    let (per_tier, std_objects, std_bytes, pending) = blocking(move || {
        let t = &e.tiers;
        // Per tier: (objects, their bytes, versions, their bytes).
        let mut per: HashMap<String, [u64; 4]> = HashMap::new();
        let (mut so, mut sb) = (0u64, 0u64);
        let (mut po, mut pb) = (0u64, 0u64);
        e.index.for_each_record(|_, _, obj, version| {
            if version && obj.is_delete_marker() {
                return Ok(());
            }
            let want = wanted_tier(t, &obj);
            let mut on_tier: Option<String> = None;
            let mut local = false;
            let mut misplaced = false;
            for c in &obj.chunks {
                let where_ = chunk_tier(t, c);
                misplaced |= where_ != want;
                match where_ {
                    Some(name) => on_tier = Some(name),
                    None => local = true,
                }
            }
            if local || obj.chunks.is_empty() {
                if !version {
                    so += 1;
                    sb += obj.size;
                }
            } else if let Some(name) = on_tier {
                let p = per.entry(name).or_default();
                let at = if version { 2 } else { 0 };
                p[at] += 1;
                p[at + 1] += obj.size;
            }
            if misplaced {
                po += 1;
                pb += obj.size;
            }
            Ok(())
        })?;
        Ok((per, so, sb, (po, pb)))
    })
    .await?;
    let catalog = engine
        .tiers
        .catalog
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    let tiers = engine
        .tiers
        .tiers
        .iter()
        .map(|(class, t)| {
            let segs: Vec<&TierSegment> = catalog.values().filter(|s| &s.tier == class).collect();
            let [objects, object_bytes, versions, version_bytes] =
                per_tier.get(class).copied().unwrap_or_default();
            TierInfo {
                class: class.clone(),
                target: t.describe().to_string(),
                segments: segs.len() as u64,
                segment_bytes: segs.iter().map(|s| s.len).sum(),
                objects,
                object_bytes,
                versions,
                version_bytes,
            }
        })
        .collect();
    Ok(TierStatus {
        tiers,
        standard_objects: std_objects,
        standard_bytes: std_bytes,
        nvme_segment_bytes: engine.chunks.disk_bytes(),
        pending_objects: pending.0,
        pending_bytes: pending.1,
        cache_bytes: engine.tiers.cache.weight(),
        run: engine.tiers.progress(),
        nodes: None,
    })
}

/// The background worker's run, unless one is going. Its report is logged, not kept: the
/// report clients read is of the last run asked for ([`ask_run`]), which a background run
/// begun after it must not replace before its client has read it.
pub fn start_run(engine: &Arc<Engine>, days_ahead: u32) -> bool {
    let _asked = lock_asked(&engine.tiers);
    if !engine.tiers.job.try_start() {
        return false;
    }
    spawn_runs(engine.clone(), days_ahead, false);
    true
}

/// Starts a run now, or, if one is going, as soon as it ends (an operator's `admin tier run`:
/// a run begun before the ask, with other days ahead or before the rules just set, is not the
/// one asked for). The job stays running from one to the other, so a client following it
/// sees the asked run's report.
pub fn ask_run(engine: &Arc<Engine>, days_ahead: u32) {
    let mut asked = lock_asked(&engine.tiers);
    if engine.tiers.job.try_start() {
        drop(asked);
        spawn_runs(engine.clone(), days_ahead, true);
    } else {
        *asked = Some(days_ahead);
    }
}

fn lock_asked(tiers: &Tiers) -> std::sync::MutexGuard<'_, Option<u32>> {
    tiers.asked.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs as of `days_ahead`, then each run asked meanwhile, and ends the job.
fn spawn_runs(engine: Arc<Engine>, mut days_ahead: u32, mut was_asked: bool) {
    tokio::spawn(async move {
        let t = &engine.tiers;
        loop {
            let r = run(&engine, days_ahead).await.map_err(|e| e.to_string());
            match &r {
                Ok(rep) => tracing::info!(
                    days_ahead,
                    asked = was_asked,
                    moved = rep.objects_moved,
                    bytes = rep.bytes_moved,
                    transitions = rep.lifecycle_transitions,
                    expirations = rep.lifecycle_expirations,
                    segments = rep.segments_written,
                    seconds = rep.seconds,
                    "tier run finished"
                ),
                Err(e) => tracing::error!(error = %e, "tier run failed"),
            }
            let report = was_asked.then_some(r);
            // Under the lock an ask takes, so no ask falls between this run and the job's end.
            let mut asked = lock_asked(t);
            match (asked.take(), report) {
                (Some(next), report) => {
                    t.job.finish_and_go_on(report);
                    (days_ahead, was_asked) = (next, true);
                }
                (None, Some(r)) => return t.job.finish(r),
                (None, None) => return t.job.finish_unreported(),
            }
        }
    });
}

/// Applies lifecycle rules as of `days_ahead` days from now, moves every object whose class
/// and location disagree, removes tier segments nothing references, and compacts NVMe.
pub async fn run(engine: &Arc<Engine>, days_ahead: u32) -> EngineResult<RunReport> {
    let tiers = &engine.tiers;
    let _one = tiers.running.lock().await;
    let started = Instant::now();
    let mut report = RunReport::default();
    let now = engine.clock.now_ms() + i64::from(days_ahead) * 86_400_000;
    apply_lifecycle(engine, now, &mut report).await?;
    if tiers.tiers.is_empty()
        && tiers
            .catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_empty()
    {
        // No tiers and nothing on one: lifecycle expirations were all there was to do.
        report.seconds = started.elapsed().as_secs_f64();
        return Ok(report);
    }

    // What must move, by destination: current objects, and the noncurrent versions kept in
    // versioned buckets' histories (a NoncurrentVersionTransition gives them their class).
    let e = engine.clone();
    let pending: Vec<Pending> = blocking(move || {
        let t = &e.tiers;
        let mut out = Vec::new();
        e.index.for_each_record(|bucket_id, key, obj, version| {
            let to = wanted_tier(t, &obj);
            let bytes: u64 = obj
                .chunks
                .iter()
                .filter(|c| chunk_tier(t, c) != to)
                .map(|c| u64::from(c.len))
                .sum();
            if bytes > 0 {
                out.push(Pending {
                    bucket_id,
                    key: key.to_string(),
                    version_seq: version.then_some(obj.version_seq),
                    obj,
                    to,
                    bytes,
                });
            }
            Ok(())
        })?;
        Ok(out)
    })
    .await?;
    let total: u64 = pending.iter().map(|p| p.bytes).sum();
    tiers.job.set_total(total);
    let mut by_dest: BTreeMap<Option<String>, Vec<Pending>> = BTreeMap::new();
    for p in pending {
        by_dest.entry(p.to.clone()).or_default().push(p);
    }
    let mut throttle = Throttle::new(tiers.rate);
    for (dest, objs) in by_dest {
        match dest {
            Some(class) => {
                let tier = tiers.tiers[&class].clone();
                move_to_tier(engine, &tier, objs, &mut report, &mut throttle).await?
            }
            None => move_to_nvme(engine, objs, &mut report, &mut throttle).await?,
        }
    }
    collect_garbage(engine, &mut report).await?;
    if report.objects_moved > 0 {
        // The moved records' old NVMe copies are dead now: reclaim them.
        let before = engine.chunks.disk_bytes();
        let e = engine.clone();
        blocking(move || Ok(e.chunks.seal_active()?)).await?;
        let grace = Duration::from_secs(60);
        crate::compact::compact(engine, 0.5, grace, None).await?;
        report.nvme_bytes_reclaimed = before.saturating_sub(engine.chunks.disk_bytes());
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

struct Throttle {
    rate: u64,
    start: Instant,
    bytes: u64,
}

impl Throttle {
    fn new(rate: u64) -> Self {
        Self {
            rate,
            start: Instant::now(),
            bytes: 0,
        }
    }

    async fn account(&mut self, n: u64) {
        self.bytes += n;
        if self.rate == 0 {
            return;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.rate as f64);
        if let Some(wait) = due.checked_sub(self.start.elapsed()) {
            tokio::time::sleep(wait).await;
        }
    }
}

/// NoncurrentVersionExpiration, NoncurrentVersionTransition and ExpiredObjectDeleteMarker in
/// one bucket with versioning: each key's history is judged as listed
/// ([`lifecycle::HistoryJudge`]); each version judged removable is removed by id, under the
/// key's lock, unless it has become the key's latest version since (a noncurrent one) or its
/// Object Lock protects it; each version judged to move gets its new storage class the same
/// way (its bytes move with the objects', below), unless it has become current.
async fn judge_history(
    engine: &Arc<Engine>,
    bucket_id: u64,
    rules: &[Rule],
    now: i64,
    report: &mut RunReport,
) -> EngineResult<()> {
    let (e, rules) = (engine.clone(), rules.to_vec());
    let doomed = blocking(move || {
        let mut judge = lifecycle::HistoryJudge::new(&rules, now);
        for prefix in lifecycle::history_prefixes(&rules) {
            let mut cursor = None;
            loop {
                let page =
                    e.index
                        .list_versions(bucket_id, &prefix, None, cursor.as_ref(), 1000)?;
                for (key, rec, latest) in page.versions {
                    judge.push(crate::summary::version_summary(key, rec, latest));
                }
                match page.next.filter(|_| page.truncated) {
                    Some(next) => cursor = Some(next),
                    None => break,
                }
            }
        }
        Ok(judge.finish())
    })
    .await?;
    for t in doomed.transitions {
        let vid = crate::versions::VersionId::parse(&t.version_id)?;
        match engine
            .set_version_class(bucket_id, &t.key, vid, &t.storage_class, true)
            .await
        {
            Ok(Some(())) => report.lifecycle_versions_transitioned += 1,
            // Gone, or current now: the next run judges it again.
            Ok(None) | Err(EngineError(StoreError::PreconditionFailed)) => {}
            Err(e) => return Err(e),
        }
    }
    for r in doomed.removals {
        let vid = crate::versions::VersionId::parse(&r.version_id)?;
        let check = packrat_store_api::lock::LockCheck::rules(false);
        match engine
            .delete_version(bucket_id, &r.key, vid, &r.version_id, check, !r.latest)
            .await
        {
            Ok(Some(_)) => report.lifecycle_versions_removed += 1,
            // Latest now (the versions above it removed meanwhile), or protected: kept.
            Ok(None) | Err(EngineError(StoreError::ObjectLocked(_))) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn apply_lifecycle(
    engine: &Arc<Engine>,
    now: i64,
    report: &mut RunReport,
) -> EngineResult<()> {
    let configs = all_lifecycles(&engine.index)?;
    if configs.is_empty() {
        return Ok(());
    }
    let e = engine.clone();
    let cfg = configs.clone();
    // (bucket, key, record id, action)
    let actions: Vec<(u64, String, [u8; 16], Action)> = blocking(move || {
        let mut out = Vec::new();
        e.index.for_each_object(|bucket_id, key, obj| {
            if let Some(rules) = cfg.get(&bucket_id) {
                let class = obj.storage_class.as_deref().unwrap_or("STANDARD");
                let a = lifecycle::evaluate(
                    rules,
                    key,
                    obj.size,
                    &obj.tags,
                    obj.last_modified_ms,
                    class,
                    now,
                );
                if a != Action::Keep {
                    out.push((bucket_id, key.to_string(), obj.record_id, a));
                }
            }
            Ok(())
        })?;
        Ok(out)
    })
    .await?;
    // In a versioned bucket an expiration adds a delete marker, as in S3: the data stays as a
    // noncurrent version.
    let versioning: HashMap<u64, u8> = engine
        .index
        .list_buckets()?
        .into_iter()
        .map(|b| (b.id, b.versioning))
        .collect();
    for (bucket_id, key, rid, action) in actions {
        match action {
            Action::Expire => {
                let mode = crate::versions::versioning_of(
                    versioning.get(&bucket_id).copied().unwrap_or(0),
                );
                let expired = match mode {
                    packrat_store_api::Versioning::Unversioned => {
                        engine.delete_if_unchanged(bucket_id, &key, rid).await?
                    }
                    mode => engine
                        .delete_versioned(bucket_id, &key, mode, Some(rid), None)
                        .await?
                        .is_some(),
                };
                if expired {
                    report.lifecycle_expirations += 1;
                }
            }
            Action::Transition(class) => {
                if engine
                    .set_storage_class_if_unchanged(bucket_id, &key, rid, &class)
                    .await?
                {
                    report.lifecycle_transitions += 1;
                }
            }
            Action::Keep => {}
        }
    }
    for (bucket_id, rules) in &configs {
        if versioning.get(bucket_id).copied().unwrap_or(0) != 0
            && rules.iter().any(Rule::acts_on_history)
        {
            judge_history(engine, *bucket_id, rules, now, report).await?;
        }
    }
    // AbortIncompleteMultipartUpload.
    for (bucket_id, rules) in &configs {
        for r in rules.iter().filter(|r| r.enabled) {
            let Some(days) = r.abort_incomplete_days else {
                continue;
            };
            let mut after: Option<(String, String)> = None;
            loop {
                let page = engine.index.list_uploads(
                    *bucket_id,
                    &r.prefix,
                    None,
                    after.as_ref().map(|(k, _)| k.as_str()),
                    after.as_ref().map(|(_, u)| u.as_str()),
                    1000,
                )?;
                for u in &page.uploads {
                    if now - u.initiated_ms >= i64::from(days) * 86_400_000 {
                        engine.index.abort_upload(u)?;
                        report.uploads_aborted += 1;
                    }
                }
                match page.uploads.last() {
                    Some(u) if page.truncated => after = Some((u.key.clone(), u.upload_id.clone())),
                    _ => break,
                }
            }
        }
    }
    Ok(())
}

/// Whether a failed read is about one object (a corrupt or missing record: skip it and go
/// on) rather than a whole tier being unreachable (stop the run; the next one retries).
fn affects_one_object(e: &EngineError) -> bool {
    !e.is_unavailable()
}

fn unreadable(p: &Pending, e: &EngineError, report: &mut RunReport) {
    tracing::error!(bucket_id = p.bucket_id, key = %p.key, error = %e,
        "tier move: an object could not be read; it stays where it is");
    report.objects_unreadable += 1;
}

async fn move_to_tier(
    engine: &Arc<Engine>,
    tier: &Arc<Tier>,
    objs: Vec<Pending>,
    report: &mut RunReport,
    throttle: &mut Throttle,
) -> EngineResult<()> {
    let tiers = &engine.tiers;
    let mut current: Option<(u64, SegmentFileWriter, PathBuf)> = None;
    let mut relocations: Vec<Relocation> = Vec::new();
    'objects: for p in objs {
        let mut moved = Vec::new();
        for (i, c) in p.obj.chunks.iter().enumerate() {
            if chunk_tier(tiers, c).as_deref() == Some(tier.class.as_str()) {
                continue;
            }
            if current.is_none() {
                let id = tiers.allocate_id(&engine.index)?;
                let path = tiers.staging.join(format!("seg-{id:016x}.pkr"));
                let w = SegmentFileWriter::create(tiers.io.clone(), &path, id)?;
                tiers.catalog_put(
                    &engine.index,
                    id,
                    TierSegment {
                        tier: tier.class.clone(),
                        len: 0,
                        crc32c: 0,
                        ready: false,
                        created_ms: engine.clock.now_ms(),
                    },
                )?;
                current = Some((id, w, path));
            }
            let data = match engine.read_chunk(&p.obj, i).await {
                Ok(d) => d,
                Err(e) if affects_one_object(&e) => {
                    // Records already copied for it stay in the tier segment, unreferenced.
                    unreadable(&p, &e, report);
                    continue 'objects;
                }
                Err(e) => return Err(e),
            };
            let (rid, idx) = p.obj.chunk_identity(i);
            let Some((_, w, _)) = current.as_mut() else {
                continue;
            };
            let loc = w.append(rid, idx, &data)?;
            moved.push((
                i,
                *c,
                ChunkRef {
                    segment_id: loc.segment_id,
                    offset: loc.offset,
                    len: loc.len,
                },
            ));
            tiers.job.add_done(u64::from(c.len));
            throttle.account(u64::from(c.len)).await;
        }
        if !moved.is_empty() {
            relocations.push(Relocation {
                bucket_id: p.bucket_id,
                key: p.key,
                held: Held::object(p.version_seq),
                moved,
            });
        }
        if current
            .as_ref()
            .is_some_and(|(_, w, _)| w.len() >= tiers.segment_bytes)
            && let Some(seg) = current.take()
        {
            finish_segment(engine, tier, seg, std::mem::take(&mut relocations), report).await?;
        }
    }
    if let Some(seg) = current.take() {
        finish_segment(engine, tier, seg, relocations, report).await?;
    }
    Ok(())
}

/// Seals a tier segment being built, copies it to its tier, verifies the copy, catalogs it,
/// and points its objects at it.
async fn finish_segment(
    engine: &Arc<Engine>,
    tier: &Arc<Tier>,
    (id, w, path): (u64, SegmentFileWriter, PathBuf),
    relocations: Vec<Relocation>,
    report: &mut RunReport,
) -> EngineResult<()> {
    let tiers = &engine.tiers;
    let p2 = path.clone();
    let (len, crc) = blocking(move || {
        let len = w.finish()?;
        let (n, crc) = packrat_tiering::file_crc32c(&p2)
            .map_err(|e| EngineError::internal("tier segment", e))?;
        if n != len {
            return Err(EngineError::internal(
                "tier segment",
                "length changed while syncing",
            ));
        }
        Ok((len, crc))
    })
    .await?;
    tiers.before_transfer(IoOp::TierUpload, &tier.class, id)?;
    tier.upload(id, &path).await?;
    tier.verify(id, len, crc).await?;
    tiers.catalog_put(
        &engine.index,
        id,
        TierSegment {
            tier: tier.class.clone(),
            len,
            crc32c: crc,
            ready: true,
            created_ms: engine.clock.now_ms(),
        },
    )?;
    let bytes: u64 = relocations
        .iter()
        .flat_map(|r| r.moved.iter())
        .map(|(_, _, n)| u64::from(n.len))
        .sum();
    let (updated, changed) = engine.commit_relocations(relocations, None).await?;
    let _ = std::fs::remove_file(&path);
    report.segments_written += 1;
    report.objects_moved += updated;
    report.objects_skipped += changed;
    report.bytes_moved += bytes;
    tiers.counters.objects_moved.fetch_add(updated, Relaxed);
    tiers.counters.bytes_moved.fetch_add(bytes, Relaxed);
    tracing::info!(segment = id, tier = %tier.class, bytes = len, objects = updated, "segment moved to its tier");
    Ok(())
}

/// Objects whose class is STANDARD again (a copy onto itself): their tiered chunks come back
/// into the local chunk store.
async fn move_to_nvme(
    engine: &Arc<Engine>,
    objs: Vec<Pending>,
    report: &mut RunReport,
    throttle: &mut Throttle,
) -> EngineResult<()> {
    'objects: for p in objs {
        let pin = engine.pin_write();
        let mut moved = Vec::new();
        let mut ticket = None;
        for (i, c) in p.obj.chunks.iter().enumerate() {
            if !is_tier_segment(c.segment_id) {
                continue;
            }
            let data = match engine.read_chunk(&p.obj, i).await {
                Ok(d) => d,
                Err(e) if affects_one_object(&e) => {
                    unreadable(&p, &e, report);
                    continue 'objects;
                }
                Err(e) => return Err(e),
            };
            let (rid, idx) = p.obj.chunk_identity(i);
            let e = engine.clone();
            let (loc, t) = blocking(move || Ok(e.chunks.append(rid, idx, &data)?)).await?;
            ticket = Some(t);
            moved.push((
                i,
                *c,
                ChunkRef {
                    segment_id: loc.segment_id,
                    offset: loc.offset,
                    len: loc.len,
                },
            ));
            engine.tiers.job.add_done(u64::from(c.len));
            throttle.account(u64::from(c.len)).await;
        }
        let bytes: u64 = moved.iter().map(|(_, _, n)| u64::from(n.len)).sum();
        let (updated, changed) = engine
            .commit_relocations(
                vec![Relocation {
                    bucket_id: p.bucket_id,
                    key: p.key,
                    held: Held::object(p.version_seq),
                    moved,
                }],
                ticket,
            )
            .await?;
        drop(pin);
        engine
            .tiers
            .counters
            .objects_moved
            .fetch_add(updated, Relaxed);
        engine.tiers.counters.bytes_moved.fetch_add(bytes, Relaxed);
        report.objects_moved += updated;
        report.objects_skipped += changed;
        report.bytes_moved += bytes;
    }
    Ok(())
}

/// Deletes tier segments no object references (everything in them was moved back,
/// overwritten or deleted, or a crash stopped their move before any object pointed there).
/// Noncurrent versions count: one may point at a tier segment its object moved to before it
/// was replaced.
async fn collect_garbage(engine: &Arc<Engine>, report: &mut RunReport) -> EngineResult<()> {
    let e = engine.clone();
    let referenced: HashSet<u64> = blocking(move || {
        let mut out = HashSet::new();
        e.index.for_each_record(|_, _, obj, _| {
            out.extend(
                obj.chunks
                    .iter()
                    .filter(|c| is_tier_segment(c.segment_id))
                    .map(|c| c.segment_id),
            );
            Ok(())
        })?;
        Ok(out)
    })
    .await?;
    let unused: Vec<(u64, TierSegment)> = engine
        .tiers
        .catalog
        .read()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter(|(id, _)| !referenced.contains(id))
        .map(|(id, s)| (*id, s.clone()))
        .collect();
    for (id, seg) in unused {
        let Some(tier) = engine.tiers.tiers.get(&seg.tier) else {
            continue;
        };
        engine
            .tiers
            .before_transfer(IoOp::TierDelete, &seg.tier, id)?;
        tier.delete(id).await?;
        engine.tiers.cache.forget(id, seg.len);
        engine.tiers.catalog_remove(&engine.index, id)?;
        report.segments_removed += 1;
    }
    Ok(())
}

/// Runs the worker every `interval` (first run shortly after start, so a move interrupted by a
/// crash resumes). Without tiers it still applies lifecycle expirations.
pub fn spawn_background(engine: Arc<Engine>, interval: Duration) {
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(10).min(interval)).await;
        loop {
            start_run(&engine, 0);
            tokio::time::sleep(interval).await;
        }
    });
}
