//! Range headers (single and multi-range) against any object size: a range inside the object,
//! none, or an S3 error; never a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::range;

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let size = u64::from_le_bytes(data[..8].try_into().unwrap());
    let Ok(h) = std::str::from_utf8(&data[8..]) else {
        return;
    };
    if let Ok(Some((a, b))) = range::resolve_range(Some(h), size) {
        assert!(a <= b && b <= size);
    }
    if let Ok(Some(v)) = range::multi_ranges(Some(h), size) {
        for &(a, b) in &v {
            assert!(a < b && b <= size);
        }
        // Overlaps are merged: an answer never holds more than the object.
        let total: u128 = v.iter().map(|&(a, b)| u128::from(b - a)).sum();
        assert!(total <= u128::from(size));
    }
});
