//! Storage tiers: objects whose storage class names a configured tier (`--tier CLASS=...`) are
//! regrouped into segments of that tier, and whole segments move there; reads of a tiered
//! object are ranged reads of its segment on the tier, through a bounded block cache.
//!
//! - **Placement.** The storage class is an object attribute (PutObject, CopyObject onto itself,
//!   CreateMultipartUpload, or a lifecycle Transition); a noncurrent version's class is its
//!   own (a NoncurrentVersionTransition sets it). New data is always written to the local
//!   NVMe tier (STANDARD); the tier worker moves it, current objects and noncurrent versions
//!   alike.
//! - **Moves** (`run`): the worker applies lifecycle rules, then finds objects whose chunks are
//!   not on the tier their class names, reads their records (verified), writes them into a new
//!   segment file (same format) in `<data-dir>/tiering/`, syncs it, uploads it to the tier,
//!   reads it back and checks length and crc32c, records the segment in the catalog, and only
//!   then points the objects at it (compare-and-set, so a concurrent overwrite or delete wins).
//!   The NVMe records left behind are dead bytes that compaction (run at the end) reclaims.
//!   Tier segments no object references any more are deleted from their tier.
//! - **Catalog.** Tier segments have ids from `TIER_SEGMENT_ID_BASE` up, so a location says by
//!   itself whether it is local; the index's `meta` column family maps each to its tier,
//!   length and crc32c (`tierseg/<id>`). The object index is not touched by the segment move
//!   itself: only the regrouping changes object locations.
//! - **Crash safety.** An object keeps pointing at its old, still-present records until its
//!   new segment is verified on the tier and cataloged; a crash at any point leaves every
//!   object readable, and the next run picks up what was not moved (leftover staging files are
//!   removed at start, unreferenced tier segments by the next run).

use crate::error::{EngineError, EngineResult};
use bytes::Bytes;
use packrat_chunk_store::{IoOp, RECORD_HEADER_BYTES, RecordLocation, SegmentIo, Span};
use packrat_index::RocksIndex;
use packrat_store_api::StoreError;
use packrat_store_api::admin::{Metric, MetricKind, MetricValue};
use packrat_store_api::lifecycle::Rule;
use packrat_tiering::{BlockCache, S3Credentials, Tier, TierSpec};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Instant;

/// Ids of segments that live on a tier start here; local segments never reach it.
pub const TIER_SEGMENT_ID_BASE: u64 = 1 << 56;
pub(crate) const META_NEXT_ID: &[u8] = b"tier-next-segment";
pub(crate) const META_SEGMENT: &str = "tierseg/";
pub(crate) const META_LIFECYCLE: &str = "lifecycle/";

/// The storage classes configured on this server (for validating `x-amz-storage-class`).
static CLASSES: OnceLock<Vec<String>> = OnceLock::new();

pub fn is_tier_class(class: &str) -> bool {
    CLASSES.get().is_some_and(|c| c.iter().any(|x| x == class))
}

pub fn is_tier_segment(id: u64) -> bool {
    id >= TIER_SEGMENT_ID_BASE
}

/// One segment on a tier, as cataloged.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TierSegment {
    pub tier: String,
    pub len: u64,
    pub crc32c: u32,
    /// Set once the copy on the tier is verified; only then may objects point at it.
    pub ready: bool,
    pub created_ms: i64,
}

/// What a tier run did (a type of the store seam).
pub use packrat_store_api::reports::TierRunReport as RunReport;

/// What `GET /_packrat/admin/tier/run` answers.
pub type RunProgress = crate::job::Progress<RunReport>;

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) bytes_moved: AtomicU64,
    pub(crate) objects_moved: AtomicU64,
    reads: AtomicU64,
    read_errors: AtomicU64,
    read_us_total: AtomicU64,
}

pub struct Tiers {
    pub(crate) tiers: BTreeMap<String, Arc<Tier>>,
    pub(crate) catalog: RwLock<HashMap<u64, TierSegment>>,
    pub(crate) cache: BlockCache,
    pub(crate) staging: PathBuf,
    pub(crate) segment_bytes: u64,
    pub(crate) rate: u64,
    pub(crate) job: crate::job::Job<RunReport>,
    /// A run an operator asked for while another was going (its days ahead): it starts as
    /// that one ends, so the answer the operator waits for is of a run begun after asking.
    pub(crate) asked: std::sync::Mutex<Option<u32>>,
    pub(crate) counters: Counters,
    /// One run at a time.
    pub(crate) running: tokio::sync::Mutex<()>,
    /// The store's file operations, asked before every tier transfer (fault rules in tests).
    pub(crate) io: Arc<dyn SegmentIo>,
}

pub struct TierOptions {
    pub specs: Vec<TierSpec>,
    pub cache_bytes: u64,
    pub segment_bytes: u64,
    /// Bytes per second a move may read and write (0: unthrottled).
    pub rate: u64,
    /// The store's file operations (the chunk store's): staged segment files are written
    /// through them, and tier transfers ask them first.
    pub io: Arc<dyn SegmentIo>,
}

fn credentials(class: &str) -> Option<S3Credentials> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let (ak, sk) = (
        env(&format!("PACKRAT_TIER_{class}_ACCESS_KEY_ID")).or_else(|| env("AWS_ACCESS_KEY_ID")),
        env(&format!("PACKRAT_TIER_{class}_SECRET_ACCESS_KEY"))
            .or_else(|| env("AWS_SECRET_ACCESS_KEY")),
    );
    Some(S3Credentials {
        access_key: ak?,
        secret_key: sk?,
    })
}

pub(crate) fn seg_key(id: u64) -> Vec<u8> {
    let mut k = META_SEGMENT.as_bytes().to_vec();
    k.extend_from_slice(&id.to_be_bytes());
    k
}

fn lifecycle_key(bucket_id: u64) -> Vec<u8> {
    let mut k = META_LIFECYCLE.as_bytes().to_vec();
    k.extend_from_slice(&bucket_id.to_be_bytes());
    k
}

impl Tiers {
    pub fn open(
        opts: TierOptions,
        data_dir: &std::path::Path,
        index: &RocksIndex,
    ) -> Result<Self, String> {
        let mut tiers = BTreeMap::new();
        for spec in &opts.specs {
            if tiers.contains_key(&spec.class) {
                return Err(format!("--tier {} given twice", spec.class));
            }
            let t = Tier::open(spec, credentials(&spec.class)).map_err(|e| e.to_string())?;
            tracing::info!(class = %spec.class, target = t.describe(), "storage tier");
            tiers.insert(spec.class.clone(), Arc::new(t));
        }
        let _ = CLASSES.set(tiers.keys().cloned().collect());
        let staging = data_dir.join("tiering");
        if staging.exists() {
            // Segments being built when the process stopped: nothing points at them.
            for e in std::fs::read_dir(&staging)
                .map_err(|e| e.to_string())?
                .flatten()
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
        if !tiers.is_empty() {
            // Only a server with tiers builds tier segments (and has this directory).
            std::fs::create_dir_all(&staging)
                .map_err(|e| format!("cannot create {}: {e}", staging.display()))?;
        }
        let mut catalog = HashMap::new();
        for (k, v) in index
            .scan_meta(META_SEGMENT.as_bytes())
            .map_err(|e| e.to_string())?
        {
            let Some(id) = k[META_SEGMENT.len()..]
                .try_into()
                .ok()
                .map(u64::from_be_bytes)
            else {
                continue;
            };
            let seg: TierSegment = crate::meta::decode(&v)
                .map_err(|e| format!("tier segment {id} in the catalog: {e}"))?;
            if !tiers.contains_key(&seg.tier) {
                tracing::error!(segment = id, tier = %seg.tier, "a segment lives on a tier that is no longer configured: its objects cannot be read until --tier {} is given again", seg.tier);
            }
            catalog.insert(id, seg);
        }
        Ok(Self {
            tiers,
            catalog: RwLock::new(catalog),
            cache: BlockCache::new(opts.cache_bytes),
            staging,
            segment_bytes: opts.segment_bytes.max(1 << 20),
            rate: opts.rate,
            job: Default::default(),
            asked: std::sync::Mutex::new(None),
            counters: Counters::default(),
            running: tokio::sync::Mutex::new(()),
            io: opts.io,
        })
    }

    pub(crate) fn segment(&self, id: u64) -> Option<TierSegment> {
        self.catalog
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .cloned()
    }

    /// Asks the store's file operations before a transfer of segment `id` to or from `tier`;
    /// a refusal (an injected fault) fails it as an unreachable tier would.
    pub(crate) fn before_transfer(&self, op: IoOp, tier: &str, id: u64) -> EngineResult<()> {
        let what = PathBuf::from(format!("tier/{tier}/seg-{id:016x}.pkr"));
        self.io.before(op, &what).map_err(|e| {
            EngineError(StoreError::Unavailable(format!(
                "storage tier {tier} failed: {e}"
            )))
        })
    }

    pub(crate) fn tier_for(&self, id: u64) -> EngineResult<(Arc<Tier>, TierSegment)> {
        let seg = self.segment(id).ok_or_else(|| {
            EngineError::internal(
                "tier read",
                format!("segment {id} is not in the tier catalog"),
            )
        })?;
        let tier = self.tiers.get(&seg.tier).cloned().ok_or_else(|| {
            EngineError(StoreError::Unavailable(format!(
                "The object is on storage tier {} which this server is not configured for.",
                seg.tier
            )))
        })?;
        Ok((tier, seg))
    }

    /// Raw bytes of a tier segment, through the block cache.
    pub async fn read_range(&self, id: u64, offset: u64, len: u64) -> EngineResult<Bytes> {
        let (tier, seg) = self.tier_for(id)?;
        let t = Instant::now();
        // Every outcome is counted below, so failures are collected, not returned early.
        let r: EngineResult<Bytes> = async {
            self.before_transfer(IoOp::TierRead, &seg.tier, id)?;
            Ok(self.cache.read(&tier, id, seg.len, offset, len).await?)
        }
        .await;
        self.counters.reads.fetch_add(1, Relaxed);
        self.counters
            .read_us_total
            .fetch_add(t.elapsed().as_micros() as u64, Relaxed);
        if r.is_err() {
            self.counters.read_errors.fetch_add(1, Relaxed);
        }
        r
    }

    /// One record of a tier segment, verified exactly as a local one.
    pub async fn read_record(
        &self,
        loc: RecordLocation,
        rid: [u8; 16],
        idx: u32,
    ) -> EngineResult<Bytes> {
        let total = RECORD_HEADER_BYTES as u64 + u64::from(loc.len);
        let bytes = self.read_range(loc.segment_id, loc.offset, total).await?;
        let span = Span {
            segment_id: loc.segment_id,
            offset: loc.offset,
            bytes: &bytes[..],
        };
        span.record(&loc, &rid, idx)?;
        Ok(bytes.slice(RECORD_HEADER_BYTES..))
    }

    /// Blocking form of [`read_range`](Self::read_range) for the batch reader (runs on a
    /// blocking thread of the runtime).
    pub fn read_range_blocking(&self, id: u64, offset: u64, dst: &mut [u8]) -> EngineResult<usize> {
        let bytes = tokio::runtime::Handle::current().block_on(self.read_range(
            id,
            offset,
            dst.len() as u64,
        ))?;
        dst[..bytes.len()].copy_from_slice(&bytes);
        Ok(bytes.len())
    }

    pub fn progress(&self) -> RunProgress {
        self.job.progress()
    }

    /// The tier counters, in base units.
    pub fn metrics(&self) -> [Metric; 5] {
        let c = &self.counters;
        [
            Metric::counter(
                "packrat_tier_bytes_moved_total",
                "Bytes moved to storage tiers.",
                c.bytes_moved.load(Relaxed),
            ),
            Metric::counter(
                "packrat_tier_objects_moved_total",
                "Objects moved to storage tiers.",
                c.objects_moved.load(Relaxed),
            ),
            Metric::counter(
                "packrat_tier_reads_total",
                "Reads from storage tiers.",
                c.reads.load(Relaxed),
            ),
            Metric::counter(
                "packrat_tier_read_errors_total",
                "Reads from storage tiers that failed.",
                c.read_errors.load(Relaxed),
            ),
            Metric {
                name: "packrat_tier_read_seconds_total",
                help: "Time spent reading from storage tiers, in seconds.",
                kind: MetricKind::Counter,
                value: MetricValue::Value(c.read_us_total.load(Relaxed) as f64 / 1e6),
            },
        ]
    }

    pub(crate) fn allocate_id(&self, index: &RocksIndex) -> EngineResult<u64> {
        let next = index
            .get_meta(META_NEXT_ID)?
            .and_then(|v| v.try_into().ok().map(u64::from_le_bytes))
            .unwrap_or(TIER_SEGMENT_ID_BASE);
        index.put_meta(META_NEXT_ID, &(next + 1).to_le_bytes())?;
        Ok(next)
    }

    pub(crate) fn catalog_put(
        &self,
        index: &RocksIndex,
        id: u64,
        seg: TierSegment,
    ) -> EngineResult<()> {
        index.put_meta(&seg_key(id), &crate::meta::encode(&seg))?;
        self.catalog
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, seg);
        Ok(())
    }

    pub(crate) fn catalog_remove(&self, index: &RocksIndex, id: u64) -> EngineResult<()> {
        index.delete_meta(&seg_key(id))?;
        self.catalog
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        Ok(())
    }
}

// ---- lifecycle configurations (stored in the index's meta column family) ----

pub fn put_lifecycle(index: &RocksIndex, bucket_id: u64, rules: &[Rule]) -> EngineResult<()> {
    Ok(index.put_meta(&lifecycle_key(bucket_id), &crate::meta::encode_rules(rules))?)
}

pub fn get_lifecycle(index: &RocksIndex, bucket_id: u64) -> EngineResult<Option<Vec<Rule>>> {
    match index.get_meta(&lifecycle_key(bucket_id))? {
        None => Ok(None),
        Some(v) => crate::meta::decode_rules(&v)
            .map(Some)
            .map_err(|e| EngineError::internal("lifecycle", e)),
    }
}

pub fn delete_lifecycle(index: &RocksIndex, bucket_id: u64) -> EngineResult<()> {
    Ok(index.delete_meta(&lifecycle_key(bucket_id))?)
}

pub(crate) fn all_lifecycles(index: &RocksIndex) -> EngineResult<HashMap<u64, Vec<Rule>>> {
    let mut out = HashMap::new();
    for (k, v) in index.scan_meta(META_LIFECYCLE.as_bytes())? {
        let Some(id) = k[META_LIFECYCLE.len()..]
            .try_into()
            .ok()
            .map(u64::from_be_bytes)
        else {
            continue;
        };
        let rules =
            crate::meta::decode_rules(&v).map_err(|e| EngineError::internal("lifecycle", e))?;
        out.insert(id, rules);
    }
    Ok(out)
}
