//! Where a client may read a bucket's objects straight from the storage nodes that hold them
//! (a cluster's map, as a training reader needs it), so that a gateway is not a proxy in the
//! byte path of every sample.
//!
//! A client computes each key's placement group as a cluster node does ([`pg_of`]: FNV-1a of
//! the key, mixed with the bucket's id, through SplitMix64's finaliser, onto `pgs` groups),
//! sends the read to a node of the group's `readers`, signed as for the gateway, with the map's
//! epoch in `x-packrat-map-epoch`. A node that does not hold the group by its own map answers
//! 421 with its epoch; the client fetches the map again, or asks a gateway.

use crate::batch::{SplitMix64, key_hash};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A bucket's routes in a cluster, as of one map epoch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteMap {
    /// The cluster map's epoch these routes are from.
    pub epoch: u64,
    /// The cluster's placement group count (fixed for its life).
    pub pgs: u32,
    /// The bucket's id, which placement mixes into every key's hash.
    pub bucket_id: u64,
    /// Each node's S3 read endpoint (`http://host:port`); a node without one is absent.
    pub nodes: BTreeMap<String, String>,
    /// For each placement group, the nodes that serve its reads (caught up), in chain order.
    pub readers: Vec<Vec<String>>,
}

/// The placement group of `key` in bucket `bucket_id` among `pgs` (the same function a
/// cluster places objects with; fixed for the life of a cluster).
pub fn pg_of(bucket_id: u64, key: &str, pgs: u32) -> u32 {
    // FNV-1a of the key, mixed with the bucket id, through SplitMix64's finaliser so that every
    // bit of the result depends on every byte (FNV-1a alone, taken modulo a power of two,
    // depends only on the low bits of the key's bytes).
    let mut mix = SplitMix64(key_hash(key) ^ bucket_id.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    ((u128::from(mix.next()) * u128::from(pgs.max(1))) >> 64) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed values: clients in other languages (`packrat_client`'s `pg_of`) are checked
    /// against the same ones.
    #[test]
    fn placement_is_fixed() {
        assert_eq!(pg_of(1, "a", 1024), pg_of(1, "a", 1024));
        let got: Vec<u32> = ["", "a", "train/000001.jpg", "ünï"]
            .iter()
            .map(|k| pg_of(7, k, 1024))
            .collect();
        assert_eq!(got, PINNED);
        assert_eq!(pg_of(7, "a", 1), 0);
    }

    const PINNED: [u32; 4] = [254, 641, 25, 299];
}
