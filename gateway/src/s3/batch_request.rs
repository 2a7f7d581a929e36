//! The requests of packrat's batch extensions, parsed and resolved without touching storage:
//! the batch GET JSON body, item ranges, shard specs, and the fixed hash and shuffle of epoch
//! streams. Pure functions, fuzzed (`fuzz/fuzz_targets/batch_request.rs`).

use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchRequest {
    pub items: Vec<BatchItem>,
    #[serde(default)]
    pub order: Order,
    #[serde(default)]
    pub on_error: OnError,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct BatchItem {
    pub key: String,
    pub range: Option<String>,
    pub member: Option<String>,
    pub tag: Option<String>,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Order {
    #[default]
    Request,
    Storage,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(crate) enum OnError {
    #[default]
    Continue,
    Abort,
}

/// An item's byte range, as asked: `bytes=a-b`, `bytes=a-` or `bytes=-n` (one range only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ItemRange {
    From(u64, Option<u64>),
    Suffix(u64),
}

pub(crate) fn parse_item_range(spec: &str) -> Result<ItemRange, String> {
    let bad = || format!("the range {spec:?} is not of the form bytes=A-B, bytes=A- or bytes=-N");
    let r = spec.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    if r.contains(',') {
        return Err(format!(
            "the range {spec:?} has several ranges; an item takes one"
        ));
    }
    let (a, b) = r.split_once('-').ok_or_else(bad)?;
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, true) => Err(bad()),
        (true, false) => match num(b)? {
            0 => Err(format!("the range {spec:?} is empty")),
            n => Ok(ItemRange::Suffix(n)),
        },
        (false, true) => Ok(ItemRange::From(num(a)?, None)),
        (false, false) => {
            let (a, b) = (num(a)?, num(b)?);
            if b < a {
                return Err(format!("the range {spec:?} ends before it starts"));
            }
            Ok(ItemRange::From(a, Some(b)))
        }
    }
}

/// `[start, end)` of a range within `len` bytes, or `None` if it is not satisfiable.
pub(crate) fn resolve_item_range(r: ItemRange, len: u64) -> Option<(u64, u64)> {
    match r {
        ItemRange::From(a, _) if a >= len => None,
        ItemRange::From(a, b) => Some((a, b.map_or(len, |b| b.saturating_add(1).min(len)))),
        ItemRange::Suffix(_) if len == 0 => None,
        ItemRange::Suffix(n) => Some((len - n.min(len), len)),
    }
}

/// FNV-1a, 64-bit: the stable hash that assigns keys to shards (`hash(key) % n == i`). Stable
/// across versions and platforms, so a shard's membership never changes for a given key.
pub fn key_hash(key: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in key.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// SplitMix64: a tiny, fixed pseudo-random generator, so a seed gives the same order in every
/// packrat version.
pub(crate) struct SplitMix64(pub(crate) u64);

impl SplitMix64 {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub(crate) fn below(&mut self, n: usize) -> usize {
        // Multiply-shift: unbiased enough for shuffling, and fixed.
        ((u128::from(self.next()) * n as u128) >> 64) as usize
    }
}

pub(crate) fn shuffle<T>(v: &mut [T], seed: u64, window_no: u64) {
    let mut rng = SplitMix64(seed ^ window_no.wrapping_mul(0xd1b5_4a32_d192_ed03));
    for i in (1..v.len()).rev() {
        let j = rng.below(i + 1);
        v.swap(i, j);
    }
}

pub(crate) fn parse_shard(s: &str) -> Option<(u64, u64)> {
    let (i, n) = s.split_once('/')?;
    let (i, n): (u64, u64) = (i.parse().ok()?, n.parse().ok()?);
    (n >= 1 && i < n).then_some((i, n))
}
