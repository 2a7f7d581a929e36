//! Epoch streams: which samples one DataLoader worker of one rank reads in an epoch, and in
//! what order. Pure functions of the prefix's keys and the query, the same for every store,
//! so a seed gives the same epoch on one node or a cluster and in every packrat version.
//!
//! The rules, in order:
//!
//! 1. **Samples.** The keys under the prefix, in key order, are grouped into samples: keys
//!    that share a basename (the key up to the first `.` of its last path component, as
//!    WebDataset groups files: `a/000123.jpg` and `a/000123.cls` are sample `a/000123`) are one
//!    sample, and always travel together, in key order. A key whose last component has no `.`
//!    is a sample of its own. With `group=key`, every key is a sample.
//! 2. **Permutation.** The N samples are permuted by Fisher-Yates driven by SplitMix64 seeded
//!    from (seed, epoch): one uniform permutation of the whole prefix, a different one each
//!    epoch. With `order=sorted`, the permutation is the identity (key order; for evaluation).
//! 3. **Ranks** (`shard=r/n`) get equal counts, like PyTorch's `DistributedSampler`: with
//!    `tail=pad` (the default) the permuted list is extended to a multiple of n by repeating
//!    its first samples (so every sample is read at least once, and at most n-1 twice); with
//!    `tail=drop` it is cut to a multiple of n (at most n-1 samples are not read this epoch).
//!    Rank r takes positions r, r+n, r+2n, ... of that list.
//! 4. **Workers** (`worker=w/W`) split a rank's list the same way: worker w takes the rank's
//!    positions w, w+W, ...; worker counts differ by at most one (a DataLoader does not need
//!    them equal; ranks do, or the last all-reduce of an epoch waits forever).
//! 5. **Resuming.** Sample i of a worker's list is its `i`-th sample; `start=i` begins there.
//!    Every entry carries its sample's index, so a client that lost its connection asks again
//!    from the first sample it has not wholly received, and gets every sample exactly once,
//!    provided the prefix has not changed: `listing` (a hash of the listed keys, answered with
//!    the stream) lets it check that.

use crate::batch::SplitMix64;

/// The keys under a prefix, in key order, packed in one buffer (a listing of a million keys
/// costs their bytes and 8 bytes a key, not a `String` each).
#[derive(Debug, Default, Clone)]
pub struct KeyList {
    bytes: String,
    ends: Vec<usize>,
}

impl KeyList {
    pub fn push(&mut self, key: &str) {
        self.bytes.push_str(key);
        self.ends.push(self.bytes.len());
    }

    pub fn len(&self) -> usize {
        self.ends.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    pub fn get(&self, i: usize) -> &str {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.bytes[start..self.ends[i]]
    }

    /// A hash of every key (FNV-1a over the keys and their lengths): two listings with the
    /// same hash are, for any practical purpose, the same listing.
    pub fn hash(&self) -> u64 {
        let mut h = crate::batch::key_hash(&self.bytes);
        for e in &self.ends {
            h ^= *e as u64;
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
        h
    }
}

/// How keys form samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Grouping {
    /// Keys sharing a basename are one sample (the WebDataset convention).
    #[default]
    Basename,
    /// Every key is a sample.
    Key,
}

/// The order of samples in an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StreamOrder {
    /// A seeded permutation of the whole prefix.
    #[default]
    Shuffle,
    /// Key order.
    Sorted,
}

/// What to do with the samples left over when N is not a multiple of the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tail {
    /// Repeat the first samples of the epoch's order until every rank has as many.
    #[default]
    Pad,
    /// Leave the last N mod n samples of the epoch's order out.
    Drop,
}

/// One worker's share of an epoch (see the module's rules).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamQuery {
    pub prefix: String,
    /// Rank `shard` of `shards`.
    pub shard: u64,
    pub shards: u64,
    /// DataLoader worker `worker` of `workers` inside the rank.
    pub worker: u64,
    pub workers: u64,
    pub seed: u64,
    pub epoch: u64,
    /// The first sample (index in the worker's list) to send.
    pub start: u64,
    pub order: StreamOrder,
    pub group: Grouping,
    pub tail: Tail,
}

impl Default for StreamQuery {
    fn default() -> Self {
        StreamQuery {
            prefix: String::new(),
            shard: 0,
            shards: 1,
            worker: 0,
            workers: 1,
            seed: 0,
            epoch: 0,
            start: 0,
            order: StreamOrder::Shuffle,
            group: Grouping::Basename,
            tail: Tail::Pad,
        }
    }
}

/// One sample of a worker's list: its index in the list and the keys that form it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedSample {
    pub index: u64,
    /// Keys `first..end` of the [`KeyList`].
    pub first: usize,
    pub end: usize,
}

/// What a worker reads this epoch.
#[derive(Debug, Clone)]
pub struct StreamPlan {
    /// Samples under the prefix (N).
    pub total: u64,
    /// Samples each rank reads this epoch.
    pub per_rank: u64,
    /// Samples in this worker's list (from index 0).
    pub worker_samples: u64,
    /// The hash of the listing (see [`KeyList::hash`]).
    pub listing: u64,
    /// The samples still to send, from `start`, in order.
    pub samples: Vec<PlannedSample>,
}

/// The sample a key belongs to: its basename (up to the first `.` of the last path
/// component), or the key itself (flagged, so `a` and `a.jpg` are not one sample).
fn basename(key: &str) -> (&str, bool) {
    let dir = key.rfind('/').map_or(0, |i| i + 1);
    match key[dir..].find('.') {
        Some(dot) => (&key[..dir + dot], true),
        None => (key, false),
    }
}

/// Where each sample starts in `keys` (plus `keys.len()` at the end). Keys that share a
/// basename are contiguous in key order (all of them start with `basename.`), so one pass
/// finds the groups.
pub fn sample_bounds(keys: &KeyList, group: Grouping) -> Vec<usize> {
    let mut bounds = Vec::with_capacity(keys.len() + 1);
    let mut prev: Option<(&str, bool)> = None;
    for i in 0..keys.len() {
        let k = keys.get(i);
        let b = basename(k);
        let same = group == Grouping::Basename && b.1 && prev == Some(b);
        if !same {
            bounds.push(i);
        }
        prev = Some(b);
    }
    bounds.push(keys.len());
    bounds
}

/// The epoch's order of `n` samples (indices into the sample list).
pub fn epoch_order(n: usize, order: StreamOrder, seed: u64, epoch: u64) -> Vec<u32> {
    let mut v: Vec<u32> = (0..n as u32).collect();
    if order == StreamOrder::Shuffle {
        // Seed and epoch mixed through one SplitMix64 step each, so nearby seeds and epochs
        // give unrelated permutations.
        let mut mix = SplitMix64(seed);
        let s = mix.next() ^ SplitMix64(epoch ^ 0x6a09_e667_f3bc_c909).next();
        let mut rng = SplitMix64(s);
        for i in (1..v.len()).rev() {
            let j = rng.below(i + 1);
            v.swap(i, j);
        }
    }
    v
}

/// Plans one worker's epoch (see the module's rules). `Err` says why the query cannot be
/// served (too many samples for one stream).
pub fn plan(keys: &KeyList, q: &StreamQuery) -> Result<StreamPlan, String> {
    let bounds = sample_bounds(keys, q.group);
    let n = bounds.len() - 1;
    if n > u32::MAX as usize {
        return Err(format!(
            "the prefix holds {n} samples; an epoch stream serves at most {}",
            u32::MAX
        ));
    }
    let order = epoch_order(n, q.order, q.seed, q.epoch);
    let (ranks, workers) = (q.shards.max(1), q.workers.max(1));
    let n64 = n as u64;
    let per_rank = match q.tail {
        Tail::Pad => n64.div_ceil(ranks),
        Tail::Drop => n64 / ranks,
    };
    let worker_samples = per_rank.saturating_sub(q.worker).div_ceil(workers);
    let mut samples = Vec::new();
    if n > 0 {
        samples.reserve(worker_samples.saturating_sub(q.start) as usize);
        for i in q.start..worker_samples {
            // The worker's i-th sample is its rank's (worker + i * workers)-th, which is
            // position (shard + j * ranks) of the padded (or cut) epoch order.
            let j = q.worker + i * workers;
            let pos = q.shard + j * ranks;
            let s = order[(pos % n64) as usize] as usize;
            samples.push(PlannedSample {
                index: i,
                first: bounds[s],
                end: bounds[s + 1],
            });
        }
    }
    Ok(StreamPlan {
        total: n64,
        per_rank,
        worker_samples,
        listing: keys.hash(),
        samples,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn keys(names: &[String]) -> KeyList {
        let mut sorted = names.to_vec();
        sorted.sort();
        let mut k = KeyList::default();
        for n in &sorted {
            k.push(n);
        }
        k
    }

    fn q(shard: u64, shards: u64, worker: u64, workers: u64) -> StreamQuery {
        StreamQuery {
            shard,
            shards,
            worker,
            workers,
            seed: 7,
            ..Default::default()
        }
    }

    /// Sample keys (first key of each sample) read by every (rank, worker) pair.
    fn read_all(k: &KeyList, base: &StreamQuery) -> Vec<Vec<String>> {
        let mut out = Vec::new();
        for r in 0..base.shards {
            let mut rank = Vec::new();
            for w in 0..base.workers {
                let p = plan(
                    k,
                    &StreamQuery {
                        shard: r,
                        worker: w,
                        ..base.clone()
                    },
                )
                .unwrap();
                assert_eq!(p.samples.len() as u64, p.worker_samples);
                rank.extend(p.samples.iter().map(|s| k.get(s.first).to_string()));
            }
            out.push(rank);
        }
        out
    }

    #[test]
    fn ranks_are_equal_and_every_sample_is_read() {
        // ImageNet-style names: the old key-hash shards gave 12,346 to 12,654 of 100,000.
        for (n, ranks, workers) in [
            (10_007u64, 1u64, 1u64),
            (10_007, 8, 1),
            (10_007, 8, 4),
            (10_007, 3, 5),
            (7, 7, 1),
            (7, 16, 3),
        ] {
            let names: Vec<String> = (0..n)
                .map(|i| format!("train/n{:08}/n{:08}_{i}.JPEG", i % 37, i % 37))
                .collect();
            let k = keys(&names);
            let base = q(0, ranks, 0, workers);
            let all = read_all(&k, &base);
            let per = all[0].len();
            assert!(all.iter().all(|r| r.len() == per), "{ranks}x{workers}");
            assert_eq!(per as u64, n.div_ceil(ranks));
            let mut count: HashMap<&str, usize> = HashMap::new();
            for s in all.iter().flatten() {
                *count.entry(s).or_default() += 1;
            }
            assert_eq!(
                count.len() as u64,
                n,
                "every sample read ({ranks}x{workers})"
            );
            let repeated: usize = count.values().map(|c| c - 1).sum();
            assert_eq!(repeated as u64, per as u64 * ranks - n);
            // Dropping the tail: equal, nothing twice, fewer than `ranks` left out.
            let drop = read_all(
                &k,
                &StreamQuery {
                    tail: Tail::Drop,
                    ..base
                },
            );
            let per = drop[0].len();
            assert!(drop.iter().all(|r| r.len() == per));
            let mut seen = std::collections::HashSet::new();
            assert!(drop.iter().flatten().all(|s| seen.insert(s.clone())));
            assert!(n - (seen.len() as u64) < ranks);
        }
    }

    #[test]
    fn samples_stay_whole() {
        let mut names = Vec::new();
        for i in 0..4000 {
            for ext in ["jpg", "cls", "json"] {
                names.push(format!("shard/{i:06}.{ext}"));
            }
        }
        // Neighbours that must not merge: no extension, a name that is a prefix of another.
        names.push("shard/000001".into());
        names.push("shard/000001-x.jpg".into());
        names.push("shard/a.b/c".into());
        let k = keys(&names);
        let bounds = sample_bounds(&k, Grouping::Basename);
        assert_eq!(bounds.len() - 1, 4003);
        for w in bounds.windows(2) {
            let (first, last) = (k.get(w[0]), k.get(w[1] - 1));
            assert_eq!(basename(first), basename(last));
        }
        assert_eq!(bounds.windows(2).filter(|w| w[1] - w[0] == 3).count(), 4000);
        // With 4 ranks, every part of a sample goes to the same rank: each key's rank, by
        // basename, is one rank.
        let mut rank_of: HashMap<(&str, bool), u64> = HashMap::new();
        let mut read = 0;
        for r in 0..4 {
            let p = plan(
                &k,
                &StreamQuery {
                    tail: Tail::Drop,
                    ..q(r, 4, 0, 1)
                },
            )
            .unwrap();
            for s in &p.samples {
                for i in s.first..s.end {
                    read += 1;
                    let b = basename(k.get(i));
                    assert_eq!(*rank_of.entry(b).or_insert(r), r, "{}", k.get(i));
                }
            }
        }
        assert!(read >= names.len() - 3 * 3);
        assert_eq!(sample_bounds(&k, Grouping::Key).len() - 1, names.len());
    }

    #[test]
    fn epochs_and_seeds_differ_and_repeat() {
        let a = epoch_order(1000, StreamOrder::Shuffle, 1, 0);
        assert_eq!(a, epoch_order(1000, StreamOrder::Shuffle, 1, 0));
        assert_ne!(a, epoch_order(1000, StreamOrder::Shuffle, 1, 1));
        assert_ne!(a, epoch_order(1000, StreamOrder::Shuffle, 2, 0));
        let mut s = a.clone();
        s.sort();
        assert_eq!(s, (0..1000).collect::<Vec<u32>>());
        assert_eq!(
            epoch_order(5, StreamOrder::Sorted, 9, 9),
            vec![0, 1, 2, 3, 4]
        );
        // Fixed across versions: the first positions of seed 42, epoch 0.
        assert_eq!(&epoch_order(10, StreamOrder::Shuffle, 42, 0)[..], FIXED);
    }
    const FIXED: &[u32] = &[6, 8, 7, 0, 9, 5, 3, 2, 4, 1];

    /// Every sample is about equally likely at every position: over 20,000 (seed, epoch)
    /// pairs, each of 10 samples lands at each of 10 positions 2,000 times expected; a
    /// chi-square over the 100 cells stays under the 0.1% critical value for 81 degrees of
    /// freedom (124.8).
    #[test]
    fn the_shuffle_is_uniform() {
        let n = 10;
        let mut cells = vec![0u64; n * n];
        let trials = 20_000u64;
        for t in 0..trials {
            let o = epoch_order(n, StreamOrder::Shuffle, t / 7, t % 7);
            for (pos, s) in o.iter().enumerate() {
                cells[pos * n + *s as usize] += 1;
            }
        }
        let expect = trials as f64 / n as f64;
        let chi: f64 = cells
            .iter()
            .map(|&c| (c as f64 - expect).powi(2) / expect)
            .sum();
        assert!(chi < 124.8, "chi-square {chi}");
        // The first position of a large shuffle over the class-per-folder layout is not
        // bunched: 100 consecutive samples come from many classes.
        let names: Vec<String> = (0..100_000)
            .map(|i| format!("train/c{:03}/{i:06}.jpg", i / 1000))
            .collect();
        let k = keys(&names);
        let p = plan(&k, &q(0, 1, 0, 1)).unwrap();
        let classes: std::collections::HashSet<&str> = p.samples[..100]
            .iter()
            .map(|s| &k.get(s.first)[..10])
            .collect();
        assert!(
            classes.len() > 50,
            "{} classes in 100 samples",
            classes.len()
        );
    }

    #[test]
    fn a_resumed_stream_continues_where_it_stopped() {
        let names: Vec<String> = (0..1000).map(|i| format!("{i:04}.bin")).collect();
        let k = keys(&names);
        let from = |start| {
            plan(
                &k,
                &StreamQuery {
                    start,
                    ..q(1, 3, 1, 2)
                },
            )
            .unwrap()
        };
        let whole = from(0);
        let rest = from(57);
        assert_eq!(&whole.samples[57..], &rest.samples[..]);
        assert_eq!(rest.worker_samples, whole.worker_samples);
        let past = from(10_000);
        assert!(past.samples.is_empty());
        assert_eq!(whole.listing, rest.listing);
        let mut other = k.clone();
        other.push("9999.bin");
        assert_ne!(other.hash(), k.hash());
    }

    #[test]
    fn an_empty_prefix_plans_nothing() {
        let p = plan(&KeyList::default(), &q(2, 4, 1, 3)).unwrap();
        assert_eq!((p.total, p.per_rank, p.worker_samples), (0, 0, 0));
        assert!(p.samples.is_empty());
    }
}
