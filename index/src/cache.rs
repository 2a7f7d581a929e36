//! A bounded cache of decoded object records, for point lookups (GET, HEAD, batch GET).
//!
//! A RocksDB lookup of a cached key, with the decoding of its record, cost ~3 µs of CPU on the
//! benchmark host even with the block and row caches warm: a third of what a 4 KiB sample of a
//! batch GET costs the server. A hit here is one hash lookup and a reference count.
//!
//! Layout: what a lookup touches is kept to as few cache lines as possible, because a batch GET
//! of random keys misses the CPU caches (and, with 4 KiB pages, the TLB) on nearly every one,
//! at ~200 ns each on the benchmark host. One hash (foldhash) picks the shard and the slot; each
//! slot is one 64-byte node holding the record's `Arc` and the key itself (inline up to
//! [`INLINE_KEY`] bytes), so comparing the key does not chase a pointer. An earlier version
//! (`HashMap<Vec<u8>, Arc<_>>`, SipHash twice) spent ~0.9 µs per lookup there.
//!
//! Coherence: the objects column family is written only by [`crate::RocksIndex`], and every
//! such write calls [`ObjectCache::invalidate`] for each key it wrote, after the write
//! returned (and before the writer's caller is told). A lookup that misses remembers its
//! shard's epoch before reading RocksDB, and [`ObjectCache::insert`] only stores what it read
//! if no invalidation hit that shard since: a record read before a write can therefore never
//! be stored after that write's invalidation. Between a write and its invalidation, a lookup
//! may still return the record the write replaced, exactly as if it had run just before the
//! write; once the writer returns, no lookup can. Absent keys are not cached.

use crate::records::ObjectRecord;
use hashbrown::HashTable;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

pub(crate) const SHARDS: usize = 16;

/// Keys up to this many bytes (bucket id included) are stored in the node itself.
const INLINE_KEY: usize = 54;

/// A cached key: inline when short (the common case for sample keys), boxed otherwise.
enum Key {
    Inline { len: u8, bytes: [u8; INLINE_KEY] },
    Heap(Box<[u8]>),
}

impl Key {
    fn new(k: &[u8]) -> Self {
        if k.len() <= INLINE_KEY {
            let mut bytes = [0u8; INLINE_KEY];
            bytes[..k.len()].copy_from_slice(k);
            Key::Inline {
                len: k.len() as u8,
                bytes,
            }
        } else {
            Key::Heap(k.into())
        }
    }

    fn as_bytes(&self) -> &[u8] {
        match self {
            Key::Inline { len, bytes } => &bytes[..usize::from(*len)],
            Key::Heap(b) => b,
        }
    }
}

struct Node {
    rec: Arc<ObjectRecord>,
    key: Key,
}

pub(crate) struct ObjectCache {
    shards: Vec<Mutex<Shard>>,
    per_shard_max: usize,
    /// Seeded per process: keys are chosen by clients, so their slots must not be predictable.
    hasher: foldhash::fast::RandomState,
}

#[derive(Default)]
struct Shard {
    table: HashTable<Node>,
    /// Invalidations of this shard so far.
    epoch: u64,
    /// Advances with every eviction, to pick the next victim.
    evictions: u64,
}

/// What a lookup found: the record, or the shard's epoch to hand to `insert` after reading
/// the index.
pub(crate) enum Lookup {
    Hit(Arc<ObjectRecord>),
    Miss(u64),
}

impl ObjectCache {
    /// A cache of at most about `entries_max` records (0: caches nothing).
    pub(crate) fn new(entries_max: usize) -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            per_shard_max: entries_max.div_ceil(SHARDS),
            hasher: foldhash::fast::RandomState::default(),
        }
    }

    /// The key's hash and its shard, locked. The shard is chosen by middle bits of the hash,
    /// which the table does not use (it places entries by the low bits, tags them with the
    /// top 7).
    fn shard(&self, key: &[u8]) -> (u64, std::sync::MutexGuard<'_, Shard>) {
        let h = self.hasher.hash_one(key);
        let i = Self::shard_of(h);
        (h, self.shards[i].lock().unwrap_or_else(|p| p.into_inner()))
    }

    fn shard_of(h: u64) -> usize {
        (h >> 40) as usize % SHARDS
    }

    pub(crate) fn lookup(&self, key: &[u8]) -> Lookup {
        let (h, s) = self.shard(key);
        match s.table.find(h, |n| n.key.as_bytes() == key) {
            Some(n) => Lookup::Hit(n.rec.clone()),
            None => Lookup::Miss(s.epoch),
        }
    }

    /// Whether the cache holds `key` (no reference taken).
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        let (h, s) = self.shard(key);
        s.table.find(h, |n| n.key.as_bytes() == key).is_some()
    }

    /// Looks every key up: `keys[i]`'s record, or `None` where the cache does not hold it. Each
    /// shard is locked once, and its keys' slots are all found before any record is touched (the
    /// record's reference count is a locked increment, which would wait for every earlier
    /// miss): the cache misses of different keys overlap instead of following one another.
    pub(crate) fn lookup_all(&self, keys: &[&[u8]]) -> Vec<Option<Arc<ObjectRecord>>> {
        // (shard, hash, position) of every key, grouped by shard.
        let mut order: Vec<(u8, u64, u32)> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                let h = self.hasher.hash_one(k);
                (Self::shard_of(h) as u8, h, i as u32)
            })
            .collect();
        order.sort_unstable_by_key(|&(s, _, _)| s);
        let mut found: Vec<Option<Arc<ObjectRecord>>> = vec![None; keys.len()];
        for run in order.chunk_by(|a, b| a.0 == b.0) {
            let s = self.shards[usize::from(run[0].0)]
                .lock()
                .unwrap_or_else(|p| p.into_inner());
            let mut nodes: Vec<(u32, &Node)> = Vec::with_capacity(run.len());
            for &(_, h, i) in run {
                let key = keys[i as usize];
                if let Some(n) = s.table.find(h, |n| n.key.as_bytes() == key) {
                    ObjectRecord::prefetch(&n.rec);
                    nodes.push((i, n));
                }
            }
            for (i, n) in nodes {
                found[i as usize] = Some(n.rec.clone());
            }
        }
        found
    }

    /// Stores `rec`, read from the index for `key` after a lookup that returned
    /// `Lookup::Miss(epoch)`, unless the shard was invalidated since.
    pub(crate) fn insert(&self, key: &[u8], epoch: u64, rec: &Arc<ObjectRecord>) {
        if self.per_shard_max == 0 {
            return;
        }
        let (h, mut s) = self.shard(key);
        if s.epoch != epoch {
            return;
        }
        let hasher = &self.hasher;
        let rehash = |n: &Node| hasher.hash_one(n.key.as_bytes());
        if let Ok(mut e) = s.table.find_entry(h, |n| n.key.as_bytes() == key) {
            e.get_mut().rec = rec.clone();
            return;
        }
        if s.table.len() >= self.per_shard_max {
            s.evict_one(hasher);
        }
        s.table.insert_unique(
            h,
            Node {
                rec: rec.clone(),
                key: Key::new(key),
            },
            rehash,
        );
    }

    /// Every shard's epoch, to take before a scan whose records go to
    /// [`insert_scanned`](Self::insert_scanned).
    pub(crate) fn epochs(&self) -> [u64; SHARDS] {
        std::array::from_fn(|i| {
            self.shards[i]
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .epoch
        })
    }

    /// Whether `insert_scanned` would store anything at all (a cache of 0 entries does not).
    pub(crate) fn capacity(&self) -> usize {
        self.per_shard_max * SHARDS
    }

    /// Stores `rec`, read by a scan that began after [`epochs`](Self::epochs) returned
    /// `epochs`, unless the key's shard was invalidated since. A scan reads a snapshot taken
    /// when it began: a write after that moves the shard's epoch, so the scan's older record is
    /// never stored over it.
    pub(crate) fn insert_scanned(
        &self,
        key: &[u8],
        epochs: &[u64; SHARDS],
        rec: &Arc<ObjectRecord>,
    ) {
        let h = self.hasher.hash_one(key);
        self.insert(key, epochs[Self::shard_of(h)], rec);
    }

    /// Forgets `key`: called after every write of it to the index.
    pub(crate) fn invalidate(&self, key: &[u8]) {
        let (h, mut s) = self.shard(key);
        if let Ok(e) = s.table.find_entry(h, |n| n.key.as_bytes() == key) {
            e.remove();
        }
        s.epoch += 1;
    }
}

impl Shard {
    /// Drops an arbitrary entry: the first whose slot tag matches a pseudo-random hash (a probe
    /// from a pseudo-random slot, so victims spread over the table), or else the first entry.
    fn evict_one(&mut self, hasher: &foldhash::fast::RandomState) {
        for _ in 0..8 {
            self.evictions += 1;
            let probe = hasher.hash_one(self.evictions);
            if let Ok(e) = self.table.find_entry(probe, |_| true) {
                e.remove();
                return;
            }
        }
        // Otherwise the first entry in table order: its own probe finds an entry (maybe an
        // earlier one of the same tag), so something is always dropped.
        let Some(h) = self
            .table
            .iter()
            .next()
            .map(|n| hasher.hash_one(n.key.as_bytes()))
        else {
            return;
        };
        if let Ok(e) = self.table.find_entry(h, |_| true) {
            e.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(size: u64) -> Arc<ObjectRecord> {
        Arc::new(ObjectRecord {
            size,
            ..Default::default()
        })
    }

    /// A record read by a scan that began before a write of its key is not stored.
    #[test]
    fn a_scan_older_than_a_write_is_not_cached() {
        let c = ObjectCache::new(100);
        let epochs = c.epochs();
        c.invalidate(b"k");
        c.insert_scanned(b"k", &epochs, &rec(1));
        assert!(matches!(c.lookup(b"k"), Lookup::Miss(_)));
        c.insert_scanned(b"k", &c.epochs(), &rec(2));
        assert!(matches!(c.lookup(b"k"), Lookup::Hit(r) if r.size == 2));
    }

    #[test]
    fn nodes_are_one_cache_line() {
        assert_eq!(std::mem::size_of::<Node>(), 64);
    }

    #[test]
    fn a_read_older_than_an_invalidation_is_not_stored() {
        let c = ObjectCache::new(100);
        let Lookup::Miss(e) = c.lookup(b"k") else {
            panic!("empty cache hit")
        };
        // A write lands between the lookup and the insert of what was read before it.
        c.invalidate(b"k");
        c.insert(b"k", e, &rec(1));
        assert!(matches!(c.lookup(b"k"), Lookup::Miss(_)));
        // A read after the write is stored, and served.
        let Lookup::Miss(e) = c.lookup(b"k") else {
            panic!()
        };
        c.insert(b"k", e, &rec(2));
        assert!(matches!(c.lookup(b"k"), Lookup::Hit(r) if r.size == 2));
        c.invalidate(b"k");
        assert!(matches!(c.lookup(b"k"), Lookup::Miss(_)));
    }

    #[test]
    fn long_and_short_keys_are_kept_apart() {
        let c = ObjectCache::new(100);
        let long = [7u8; INLINE_KEY + 1];
        let short = [7u8; INLINE_KEY];
        for (i, k) in [&long[..], &short[..], &long[..3], &[][..]]
            .into_iter()
            .enumerate()
        {
            let Lookup::Miss(e) = c.lookup(k) else {
                panic!("key {i} hit before it was stored")
            };
            c.insert(k, e, &rec(i as u64));
        }
        for (i, k) in [&long[..], &short[..], &long[..3], &[][..]]
            .into_iter()
            .enumerate()
        {
            assert!(matches!(c.lookup(k), Lookup::Hit(r) if r.size == i as u64));
        }
        c.invalidate(&long);
        assert!(matches!(c.lookup(&long), Lookup::Miss(_)));
        assert!(matches!(c.lookup(&short), Lookup::Hit(r) if r.size == 1));
    }

    #[test]
    fn many_lookups_keep_their_order_across_shards() {
        let c = ObjectCache::new(10_000);
        let keys: Vec<[u8; 4]> = (0..500u32).map(u32::to_be_bytes).collect();
        let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
        assert!(c.lookup_all(&refs).iter().all(Option::is_none));
        for (i, k) in keys.iter().enumerate() {
            let Lookup::Miss(e) = c.lookup(k) else {
                panic!()
            };
            c.insert(k, e, &rec(i as u64));
        }
        // The same key twice, in any order: each position gets its own key's record.
        let mut mixed = refs.clone();
        mixed.reverse();
        mixed.push(refs[7]);
        let got = c.lookup_all(&mixed);
        let want: Vec<Option<u64>> = mixed
            .iter()
            .map(|k| Some(u64::from(u32::from_be_bytes((*k).try_into().unwrap()))))
            .collect();
        assert_eq!(
            got.iter()
                .map(|r| r.as_ref().map(|r| r.size))
                .collect::<Vec<_>>(),
            want
        );
        // One key not held: no answer for it (the caller asks the index), the rest answered.
        c.invalidate(&keys[250]);
        let got = c.lookup_all(&refs);
        for (i, r) in got.iter().enumerate() {
            assert_eq!(r.as_ref().map(|r| r.size), (i != 250).then_some(i as u64));
        }
        assert!(c.lookup_all(&[]).is_empty());
    }

    #[test]
    fn stays_bounded() {
        let c = ObjectCache::new(64);
        for i in 0..10_000u32 {
            let k = i.to_be_bytes();
            if let Lookup::Miss(e) = c.lookup(&k) {
                c.insert(&k, e, &rec(u64::from(i)));
            }
        }
        let held: usize = c.shards.iter().map(|s| s.lock().unwrap().table.len()).sum();
        assert!(held <= 64, "{held} entries held");
        assert!(held > 32, "{held} entries held");
        // What is held is what was stored under that key.
        for i in 0..10_000u32 {
            if let Lookup::Hit(r) = c.lookup(&i.to_be_bytes()) {
                assert_eq!(r.size, u64::from(i));
            }
        }
        let off = ObjectCache::new(0);
        if let Lookup::Miss(e) = off.lookup(b"k") {
            off.insert(b"k", e, &rec(1));
        }
        assert!(matches!(off.lookup(b"k"), Lookup::Miss(_)));
    }
}
