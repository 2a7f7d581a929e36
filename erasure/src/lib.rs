//! packrat-erasure: the Reed-Solomon codec for sealed segments.
//!
//! A pure codec: byte slices in, byte slices out, no I/O and no async. It never depends on the
//! other packrat crates. A segment of `len` bytes is cut into `k` contiguous data shards (so a
//! small object is still one read from one shard) plus `m` parity shards; any `k` of the `k + m`
//! shards rebuild the segment exactly.
//!
//! The arithmetic is `reed-solomon-erasure` (GF(2^8), Cauchy/Vandermonde matrices, with its
//! SIMD C kernels), chosen over `reed-solomon-simd` by measurement on this machine
//! (docs/benchmark-log.md, `examples/codec_bench.rs`): for the small shard counts packrat uses
//! (k + m up to 16) it encodes 2-4x faster and rebuilds 10-50x faster, where the GF(2^16)
//! FFT codec's fixed costs dominate. [`Layout`] records the exact geometry (shards are padded
//! to an even size, which keeps the layout valid for either codec).

use reed_solomon_erasure::galois_8::ReedSolomon;

/// Most shards (data plus parity) a layout may have (GF(2^8)).
pub const SHARDS_MAX: usize = 256;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ErasureError {
    #[error("invalid layout {k}+{m}: need k >= 1, m >= 1 and k + m <= {SHARDS_MAX}")]
    BadLayout { k: usize, m: usize },
    #[error("shard {index} has {got} bytes, expected {want}")]
    ShardSize {
        index: usize,
        got: usize,
        want: usize,
    },
    #[error("only {have} of the {k} shards needed to rebuild are present")]
    TooFewShards { have: usize, k: usize },
    #[error("codec: {0}")]
    Codec(String),
}

pub type Result<T> = std::result::Result<T, ErasureError>;

/// How a segment of `len` bytes is cut: `k` data shards of `shard_len` bytes each (the last
/// zero-padded), then `m` parity shards of the same length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    pub k: usize,
    pub m: usize,
    pub len: u64,
    pub shard_len: usize,
}

impl Layout {
    pub fn new(k: usize, m: usize, len: u64) -> Result<Self> {
        if k == 0 || m == 0 || k + m > SHARDS_MAX {
            return Err(ErasureError::BadLayout { k, m });
        }
        let per = len.div_ceil(k as u64).max(2);
        let shard_len = (per + per % 2) as usize;
        Ok(Self {
            k,
            m,
            len,
            shard_len,
        })
    }

    /// The data shard holding byte `offset` of the segment, and the offset inside it: a read
    /// of a small object is one read from one shard (two when it straddles a boundary).
    pub fn locate(&self, offset: u64) -> (usize, usize) {
        let s = self.shard_len as u64;
        ((offset / s) as usize, (offset % s) as usize)
    }
}

/// Encodes a whole segment: returns its `k` data shards (contiguous slices, the last padded)
/// followed by `m` parity shards.
pub fn encode(layout: &Layout, data: &[u8]) -> Result<Vec<Vec<u8>>> {
    if data.len() as u64 != layout.len {
        return Err(ErasureError::ShardSize {
            index: 0,
            got: data.len(),
            want: layout.len as usize,
        });
    }
    let mut shards: Vec<Vec<u8>> = (0..layout.k)
        .map(|i| {
            let from = (i * layout.shard_len).min(data.len());
            let to = ((i + 1) * layout.shard_len).min(data.len());
            let mut s = data[from..to].to_vec();
            s.resize(layout.shard_len, 0);
            s
        })
        .collect();
    shards.extend((0..layout.m).map(|_| vec![0u8; layout.shard_len]));
    codec(layout)?
        .encode(&mut shards)
        .map_err(|e| ErasureError::Codec(format!("{e:?}")))?;
    Ok(shards)
}

/// Rebuilds every missing shard (`None`) in place from any `k` present ones. Shards are in
/// layout order: `k` data shards, then `m` parity shards.
pub fn reconstruct(layout: &Layout, shards: &mut [Option<Vec<u8>>]) -> Result<()> {
    let (k, m) = (layout.k, layout.m);
    if shards.len() != k + m {
        return Err(ErasureError::BadLayout { k, m });
    }
    for (index, s) in shards.iter().enumerate() {
        if let Some(s) = s
            && s.len() != layout.shard_len
        {
            return Err(ErasureError::ShardSize {
                index,
                got: s.len(),
                want: layout.shard_len,
            });
        }
    }
    let have = shards.iter().filter(|s| s.is_some()).count();
    if have < k {
        return Err(ErasureError::TooFewShards { have, k });
    }
    if shards.iter().any(Option::is_none) {
        let mut work: Vec<Option<Vec<u8>>> = shards.iter_mut().map(Option::take).collect();
        codec(layout)?
            .reconstruct(&mut work)
            .map_err(|e| ErasureError::Codec(format!("{e:?}")))?;
        for (slot, s) in shards.iter_mut().zip(work) {
            *slot = s;
        }
    }
    Ok(())
}

/// A codec for streaming work on equal-length pieces of shards (a stripe row of a segment
/// being sealed, or the blocks around a damaged record): byte `j` of every piece belongs to the
/// same code word, so any range of the shards can be encoded or rebuilt on its own.
pub struct Codec {
    rs: ReedSolomon,
    k: usize,
    m: usize,
}

impl Codec {
    pub fn new(k: usize, m: usize) -> Result<Self> {
        if k == 0 || m == 0 || k + m > SHARDS_MAX {
            return Err(ErasureError::BadLayout { k, m });
        }
        let rs = ReedSolomon::new(k, m).map_err(|_| ErasureError::BadLayout { k, m })?;
        Ok(Self { rs, k, m })
    }

    /// Computes the `m` parity pieces (the last `m` of `pieces`) from the first `k`.
    pub fn encode(&self, pieces: &mut [Vec<u8>]) -> Result<()> {
        self.check(pieces.len())?;
        self.rs
            .encode(pieces)
            .map_err(|e| ErasureError::Codec(format!("{e:?}")))
    }

    /// Rebuilds every missing piece (`None`) from any `k` present ones of equal length.
    pub fn reconstruct(&self, pieces: &mut [Option<Vec<u8>>]) -> Result<()> {
        self.check(pieces.len())?;
        let have = pieces.iter().filter(|s| s.is_some()).count();
        if have < self.k {
            return Err(ErasureError::TooFewShards { have, k: self.k });
        }
        if have == pieces.len() {
            return Ok(());
        }
        self.rs
            .reconstruct(pieces)
            .map_err(|e| ErasureError::Codec(format!("{e:?}")))
    }

    fn check(&self, n: usize) -> Result<()> {
        if n == self.k + self.m {
            Ok(())
        } else {
            Err(ErasureError::BadLayout {
                k: self.k,
                m: self.m,
            })
        }
    }
}

fn codec(layout: &Layout) -> Result<ReedSolomon> {
    ReedSolomon::new(layout.k, layout.m).map_err(|_| ErasureError::BadLayout {
        k: layout.k,
        m: layout.m,
    })
}

/// The segment's bytes from its data shards (the padding dropped).
pub fn join(layout: &Layout, data_shards: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(layout.len as usize);
    for s in data_shards.iter().take(layout.k) {
        out.extend_from_slice(s);
    }
    out.truncate(layout.len as usize);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn layouts() {
        let l = Layout::new(4, 2, 1000).unwrap();
        assert_eq!(l.shard_len, 250);
        assert_eq!(l.locate(0), (0, 0));
        assert_eq!(l.locate(251), (1, 1));
        assert_eq!(Layout::new(4, 2, 1001).unwrap().shard_len, 252);
        assert_eq!(Layout::new(3, 1, 1).unwrap().shard_len, 2);
        assert!(Layout::new(0, 2, 10).is_err());
        assert!(Layout::new(200, 100, 10).is_err());
        assert!(Layout::new(200, 56, 10).is_ok());
    }

    #[test]
    fn too_few_shards_is_an_error_not_wrong_data() {
        let l = Layout::new(4, 2, 4096).unwrap();
        let data: Vec<u8> = (0..4096u32).map(|i| i as u8).collect();
        let mut shards: Vec<Option<Vec<u8>>> =
            encode(&l, &data).unwrap().into_iter().map(Some).collect();
        shards[0] = None;
        shards[1] = None;
        shards[5] = None;
        assert_eq!(
            reconstruct(&l, &mut shards),
            Err(ErasureError::TooFewShards { have: 3, k: 4 })
        );
    }

    #[test]
    fn codec_pieces_match_whole_shard_encoding() {
        let l = Layout::new(4, 2, 10_000).unwrap();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + 7) as u8).collect();
        let full = encode(&l, &data).unwrap();
        let c = Codec::new(4, 2).unwrap();
        // Any sub-range of the shards encodes and rebuilds on its own.
        let (a, b) = (100, 1_300);
        let mut pieces: Vec<Vec<u8>> = (0..6)
            .map(|i| {
                if i < 4 {
                    full[i][a..b].to_vec()
                } else {
                    vec![0; b - a]
                }
            })
            .collect();
        c.encode(&mut pieces).unwrap();
        for i in 0..6 {
            assert_eq!(pieces[i], full[i][a..b]);
        }
        let mut opt: Vec<Option<Vec<u8>>> = pieces.iter().cloned().map(Some).collect();
        opt[1] = None;
        opt[4] = None;
        c.reconstruct(&mut opt).unwrap();
        assert_eq!(opt[1].as_deref(), Some(&full[1][a..b]));
        opt[0] = None;
        opt[2] = None;
        opt[3] = None;
        assert!(matches!(
            c.reconstruct(&mut opt),
            Err(ErasureError::TooFewShards { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Any k of the k+m shards rebuild the data exactly, for any layout and length.
        #[test]
        fn any_k_shards_rebuild(
            k in 1usize..12,
            m in 1usize..5,
            len in 1usize..20_000,
            seed in any::<u64>(),
        ) {
            let l = Layout::new(k, m, len as u64).unwrap();
            let data: Vec<u8> = (0..len).map(|i| (i as u64).wrapping_mul(seed | 1).rotate_left(7) as u8).collect();
            let full = encode(&l, &data).unwrap();
            prop_assert_eq!(join(&l, &full[..k]), data.clone());
            // Drop m shards chosen by the seed.
            let mut order: Vec<usize> = (0..k + m).collect();
            let mut s = seed;
            for i in (1..order.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                order.swap(i, (s >> 33) as usize % (i + 1));
            }
            let mut shards: Vec<Option<Vec<u8>>> = full.iter().cloned().map(Some).collect();
            for &i in order.iter().take(m) {
                shards[i] = None;
            }
            reconstruct(&l, &mut shards).unwrap();
            let rebuilt: Vec<Vec<u8>> = shards.into_iter().map(|s| s.unwrap()).collect();
            prop_assert_eq!(&rebuilt, &full);
            prop_assert_eq!(join(&l, &rebuilt[..k]), data);
        }
    }
}
