//! What one gathered lookup's metadata costs to write at a node and read at a gateway, as
//! JSON and in the binary of `wire::meta_codec`, for the metadata of a plain 4 KiB object as
//! `packrat bench` writes it and of one with tags, user metadata and a checksum. Prints
//! nanoseconds per metadata (best of 5 runs of 200,000) for each.
//!
//!   cargo run -p packrat-cluster --example meta_codec_cost

use bytes::BytesMut;
use packrat_cluster::wire::meta_codec;
use packrat_cluster::wire::{WireMeta, WirePut};
use std::hint::black_box;
use std::time::Instant;

const ROUNDS: usize = 200_000;

fn best_ns(mut f: impl FnMut()) -> f64 {
    (0..5)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..ROUNDS {
                f();
            }
            t.elapsed().as_nanos() as f64 / ROUNDS as f64
        })
        .fold(f64::MAX, f64::min)
}

fn main() {
    let plain = WireMeta {
        size: 4096,
        etag: "\"5f363e0e58a95f06cbe9bbc662c5dfb6\"".into(),
        put: WirePut {
            last_modified_ms: 1_764_612_000_123,
            content_type: Some("application/octet-stream".into()),
            ..Default::default()
        },
        cv: 1_764_612_000_123_456,
        ..Default::default()
    };
    let mut rich = plain.clone();
    rich.put.user_meta = vec![
        ("camera".into(), "left-front".into()),
        ("split".into(), "train".into()),
    ];
    rich.put.tags = vec![("team".into(), "vision".into())];
    rich.checksum = Some(("CRC32C".into(), "yZRlqg==".into(), "FULL_OBJECT".into()));
    rich.version_id = Some("1764612000123456".into());
    rich.version_seq = Some(1_764_612_000_123_456);
    for (name, m) in [
        ("plain 4 KiB object", &plain),
        ("tags, user metadata, checksum", &rich),
    ] {
        let json = serde_json::to_vec(m).expect("JSON");
        let mut bin = BytesMut::new();
        meta_codec::encode(m, &mut bin);
        let json_write = best_ns(|| {
            black_box(serde_json::to_vec(black_box(m)).ok());
        });
        let json_read = best_ns(|| {
            black_box(serde_json::from_slice::<WireMeta>(black_box(&json)).ok());
        });
        let mut out = BytesMut::with_capacity(1024);
        let bin_write = best_ns(|| {
            out.clear();
            meta_codec::encode(black_box(m), &mut out);
            black_box(&out);
        });
        let bin_read = best_ns(|| {
            black_box(meta_codec::decode(black_box(&bin)).ok());
        });
        println!(
            "{name}: JSON {} bytes, write {json_write:.0} ns, read {json_read:.0} ns; \
             binary {} bytes, write {bin_write:.0} ns, read {bin_read:.0} ns; \
             write+read {:.2}x as fast",
            json.len(),
            bin.len(),
            (json_write + json_read) / (bin_write + bin_read)
        );
    }
}
