//! Batch GET bodies, item ranges and shard specs: parsed or refused, never a panic; a resolved
//! item range always lies inside the object.
#![no_main]

use libfuzzer_sys::fuzz_target;
use packrat_gateway::s3::batch_request as br;

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<br::BatchRequest>(data);
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let len = data.len() as u64 * 97;
    if let Ok(r) = br::parse_item_range(text)
        && let Some((a, b)) = packrat_store_api::batch::resolve_item_range(r, len)
    {
        assert!(a < b && b <= len);
    }
    if let Some((i, n)) = br::parse_shard(text) {
        assert!(i < n);
    }
    let _ = packrat_store_api::batch::key_hash(text);
});
