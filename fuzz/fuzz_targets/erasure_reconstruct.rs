//! The erasure codec with arbitrary layouts, data and lost shards: any k of k+m shards rebuild
//! the data exactly; fewer is an error, never wrong data or a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_erasure::{Layout, encode, join, reconstruct};

fuzz_target!(|input: &[u8]| {
    if input.len() < 3 {
        return;
    }
    let k = usize::from(input[0] % 12) + 1;
    let m = usize::from(input[1] % 5) + 1;
    let lost_mask = input[2];
    let data = &input[3..];
    if data.is_empty() {
        return;
    }
    let layout = Layout::new(k, m, data.len() as u64).expect("valid layout");
    let full = encode(&layout, data).expect("encode");
    let mut shards: Vec<Option<Vec<u8>>> = full.iter().cloned().map(Some).collect();
    let mut lost = 0;
    for (i, s) in shards.iter_mut().enumerate() {
        if i < 8 && lost_mask & (1 << i) != 0 {
            *s = None;
            lost += 1;
        }
    }
    match reconstruct(&layout, &mut shards) {
        Ok(()) => {
            assert!(lost <= m);
            let rebuilt: Vec<Vec<u8>> = shards.into_iter().map(Option::unwrap).collect();
            assert_eq!(rebuilt, full);
            assert_eq!(join(&layout, &rebuilt[..k]), data);
        }
        Err(_) => assert!(lost > m),
    }
});
