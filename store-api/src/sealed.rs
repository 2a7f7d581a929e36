//! Objects whose bytes the S3 layer encrypted (server-side encryption, SSE-S3 and SSE-C).
//!
//! A store keeps such an object as it keeps any other: its bytes are the sealed blocks and its
//! stored headers ([`crate::ObjectAttrs::headers`]) carry the S3 layer's envelope under
//! [`SSE_HEADER`]. What a store must know of them is only this module:
//!
//! - the size a listing shows is the plaintext's, derived from the stored size by the block
//!   layout below ([`shown_size`]);
//! - a batch GET or an epoch stream never hands out their bytes (they are ciphertext; only a
//!   GET with the object's key reads them).
//!
//! Layout: the plaintext is cut into blocks of [`BLOCK`] bytes (the last one shorter, an empty
//! object one empty block); each is stored sealed, followed by its [`TAG`]-byte AEAD tag.
//!
//! An object made by a multipart upload whose envelope ends with [`BY_PART`] is sealed part by
//! part: each part's stored bytes are a [`PART_SALT`]-byte salt (drawn when the part is
//! uploaded, so a part sent again is never sealed under the same key) followed by the part's
//! plaintext in blocks as above. Its stored part sizes give the plaintext's.

/// The stored header holding the S3 layer's encryption envelope (never shown to clients).
pub const SSE_HEADER: &str = "x-packrat-sse";
/// The last field of the envelope of an object sealed part by part.
pub const BY_PART: &str = "parts";
/// Salt bytes in front of each part of an object sealed part by part.
pub const PART_SALT: u64 = 32;
/// Plaintext bytes per sealed block.
pub const BLOCK: u64 = 64 * 1024;
/// Authentication tag bytes after each sealed block.
pub const TAG: u64 = 16;

/// The S3 layer's envelope among an object's stored headers, if its bytes are sealed.
pub fn envelope(headers: &[(String, String)]) -> Option<&str> {
    headers
        .iter()
        .find(|(k, _)| k == SSE_HEADER)
        .map(|(_, v)| v.as_str())
}

/// Whether an object's stored headers say its bytes are sealed.
pub fn is_sealed(headers: &[(String, String)]) -> bool {
    envelope(headers).is_some()
}

/// Whether an object's stored headers say its bytes are sealed part by part.
pub fn is_sealed_by_part(headers: &[(String, String)]) -> bool {
    envelope(headers).is_some_and(|e| e.rsplit(' ').next() == Some(BY_PART))
}

/// The plaintext size of a part stored as `stored` bytes (salt and blocks).
pub fn plain_part_len(stored: u64) -> Option<u64> {
    plain_len(stored.checked_sub(PART_SALT)?)
}

/// Sealed blocks of a plaintext of `plain` bytes (at least one).
pub fn blocks(plain: u64) -> u64 {
    plain.div_ceil(BLOCK).max(1)
}

/// The stored size of a plaintext of `plain` bytes.
pub fn sealed_len(plain: u64) -> u64 {
    plain + TAG * blocks(plain)
}

/// The plaintext size of `sealed` stored bytes; `None` if no plaintext seals to that size.
pub fn plain_len(sealed: u64) -> Option<u64> {
    let n = sealed.div_ceil(BLOCK + TAG).max(1);
    let plain = sealed.checked_sub(TAG * n)?;
    (sealed_len(plain) == sealed).then_some(plain)
}

/// The size a listing or HEAD shows for an object stored as `stored` bytes with `headers`, in
/// parts of `part_sizes` stored bytes (read only for an object sealed part by part).
pub fn shown_size<I: IntoIterator<Item = u64>>(
    headers: &[(String, String)],
    stored: u64,
    part_sizes: I,
) -> u64 {
    if is_sealed_by_part(headers) {
        part_sizes
            .into_iter()
            .map(|p| plain_part_len(p).unwrap_or(p))
            .sum()
    } else if is_sealed(headers) {
        plain_len(stored).unwrap_or(stored)
    } else {
        stored
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_trip() {
        for plain in [
            0,
            1,
            15,
            16,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            3 * BLOCK,
            5 * BLOCK + 17,
        ] {
            assert_eq!(plain_len(sealed_len(plain)), Some(plain), "{plain}");
        }
        assert_eq!(sealed_len(0), TAG);
        assert_eq!(sealed_len(BLOCK), BLOCK + TAG);
        assert_eq!(sealed_len(BLOCK + 1), BLOCK + 1 + 2 * TAG);
        // Sizes no plaintext seals to.
        for bad in [0, 15, BLOCK + TAG + 5] {
            assert_eq!(plain_len(bad), None, "{bad}");
        }
    }

    #[test]
    fn shown_size_only_changes_sealed_objects() {
        let sealed = vec![(SSE_HEADER.to_string(), "x".to_string())];
        assert_eq!(shown_size(&sealed, sealed_len(100), []), 100);
        assert_eq!(shown_size(&[], 116, []), 116);
        let by_part = vec![(SSE_HEADER.to_string(), format!("1 s3 k {BY_PART}"))];
        assert!(is_sealed_by_part(&by_part) && !is_sealed_by_part(&sealed));
        let parts = [PART_SALT + sealed_len(5 * BLOCK), PART_SALT + sealed_len(7)];
        assert_eq!(
            shown_size(&by_part, parts.iter().sum(), parts),
            5 * BLOCK + 7
        );
        assert_eq!(plain_part_len(PART_SALT - 1), None);
    }
}
