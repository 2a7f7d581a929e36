//! Measures the two maintained Reed-Solomon crates on this machine, one core, for the codec
//! choice recorded in docs/benchmark-log.md:
//!
//!     cargo run -p packrat-erasure --example codec_bench
//!
//! For each layout (4+2, 8+3, 10+4) and shard size (64 KiB, 1 MiB): encode (parity from data)
//! and reconstruct (M data shards lost), in GB/s of data shards per core.

use std::time::Instant;

fn shards(k: usize, size: usize) -> Vec<Vec<u8>> {
    (0..k)
        .map(|i| (0..size).map(|j| (i * 131 + j * 7 % 251) as u8).collect())
        .collect()
}

fn rate(bytes: usize, iters: usize, secs: f64) -> f64 {
    (bytes * iters) as f64 / secs / 1e9
}

fn iters_for(bytes: usize) -> usize {
    (2_000_000_000 / bytes).clamp(4, 20_000)
}

fn bench_simd(k: usize, m: usize, size: usize) -> (f64, f64) {
    use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
    let data = shards(k, size);
    let n = iters_for(k * size);
    // Encoder and decoder are built once and reused, as a long-running server would.
    let mut enc = ReedSolomonEncoder::new(k, m, size).expect("encoder");
    let mut parity: Vec<Vec<u8>> = Vec::new();
    let t = Instant::now();
    for _ in 0..n {
        for s in &data {
            enc.add_original_shard(s).expect("shard");
        }
        let r = enc.encode().expect("encode");
        parity = r.recovery_iter().map(<[u8]>::to_vec).collect();
    }
    let enc_rate = rate(k * size, n, t.elapsed().as_secs_f64());
    // Lose the first m data shards; rebuild them from the rest plus all parity.
    let mut dec = ReedSolomonDecoder::new(k, m, size).expect("decoder");
    let t = Instant::now();
    for _ in 0..n {
        for (i, s) in data.iter().enumerate().skip(m) {
            dec.add_original_shard(i, s).expect("shard");
        }
        for (i, p) in parity.iter().enumerate() {
            dec.add_recovery_shard(i, p).expect("shard");
        }
        let r = dec.decode().expect("decode");
        assert_eq!(r.restored_original_iter().count(), m);
    }
    let dec_rate = rate(k * size, n, t.elapsed().as_secs_f64());
    (enc_rate, dec_rate)
}

fn bench_erasure(k: usize, m: usize, size: usize) -> (f64, f64) {
    use reed_solomon_erasure::galois_8::ReedSolomon;
    let rs = ReedSolomon::new(k, m).expect("layout");
    let mut all = shards(k, size);
    all.extend((0..m).map(|_| vec![0u8; size]));
    let n = iters_for(k * size);
    let t = Instant::now();
    for _ in 0..n {
        rs.encode(&mut all).expect("encode");
    }
    let enc = rate(k * size, n, t.elapsed().as_secs_f64());
    let mut opt: Vec<Option<Vec<u8>>> = all.iter().cloned().map(Some).collect();
    let t = Instant::now();
    for _ in 0..n {
        for s in opt.iter_mut().take(m) {
            *s = None;
        }
        rs.reconstruct_data(&mut opt).expect("reconstruct");
    }
    let dec = rate(k * size, n, t.elapsed().as_secs_f64());
    (enc, dec)
}

fn main() {
    println!(
        "| layout | shard | reed-solomon-simd encode | decode | reed-solomon-erasure (simd-accel) encode | decode |"
    );
    println!("|---|---|---|---|---|---|");
    for (k, m) in [(4, 2), (8, 3), (10, 4)] {
        for size in [64 * 1024, 1024 * 1024] {
            let (se, sd) = bench_simd(k, m, size);
            let (ee, ed) = bench_erasure(k, m, size);
            println!(
                "| {k}+{m} | {} KiB | {se:.2} GB/s | {sd:.2} GB/s | {ee:.2} GB/s | {ed:.2} GB/s |",
                size / 1024
            );
        }
    }
}
