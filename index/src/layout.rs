//! Key layouts of every column family, in one place (the table is in `docs/ARCHITECTURE.md`;
//! `key_layouts_are_pinned` holds them to golden bytes).

pub(crate) fn object_key(bucket_id: u64, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len());
    object_key_into(&mut k, bucket_id, key);
    k
}

/// [`object_key`] into a reused buffer.
pub(crate) fn object_key_into(k: &mut Vec<u8>, bucket_id: u64, key: &str) {
    k.clear();
    k.extend_from_slice(&bucket_id.to_be_bytes());
    k.extend_from_slice(key.as_bytes());
}

/// A key's bytes in `versions`: the bucket id, then the key with each 0x00 written as
/// 0x00 0xff. Order-preserving, so that a key's versions, ended by 0x00 0x00, sort before every
/// longer key that starts with it (even one that continues with 0x00).
pub(crate) fn escaped_object_key(bucket_id: u64, key: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(8 + key.len() + 10);
    k.extend_from_slice(&bucket_id.to_be_bytes());
    for &b in key.as_bytes() {
        k.push(b);
        if b == 0 {
            k.push(0xff);
        }
    }
    k
}

/// A version's key in `versions`: the escaped key, 0x00 0x00, then the bitwise complement of
/// its sequence (u64 BE), so a key's versions sort together, newest first, and keys in order.
pub(crate) fn version_key(bucket_id: u64, key: &str, seq: u64) -> Vec<u8> {
    let mut k = versions_prefix(bucket_id, key);
    k.extend_from_slice(&(!seq).to_be_bytes());
    k
}

/// The prefix of exactly the version entries of `key`.
pub(crate) fn versions_prefix(bucket_id: u64, key: &str) -> Vec<u8> {
    let mut k = escaped_object_key(bucket_id, key);
    k.extend_from_slice(&[0, 0]);
    k
}

/// The bucket id, key and sequence of a `versions` entry.
pub(crate) fn split_version_key(k: &[u8]) -> Option<(u64, String, u64)> {
    let (head, seq) = k.split_last_chunk::<8>()?;
    let head = head.strip_suffix(&[0, 0])?;
    let (bucket, escaped) = head.split_first_chunk::<8>()?;
    let mut key = Vec::with_capacity(escaped.len());
    let mut bytes = escaped.iter();
    while let Some(&b) = bytes.next() {
        key.push(b);
        if b == 0 && bytes.next() != Some(&0xff) {
            return None;
        }
    }
    Some((
        u64::from_be_bytes(*bucket),
        String::from_utf8(key).ok()?,
        !u64::from_be_bytes(*seq),
    ))
}

pub(crate) fn upload_key(bucket_id: u64, key: &str, upload_id: &str) -> Vec<u8> {
    let mut k = object_key(bucket_id, key);
    k.push(0);
    k.extend_from_slice(upload_id.as_bytes());
    k
}

/// A TAR member's key in `members`: the identity of the TAR's bytes, then the member name.
pub(crate) fn member_key(id: &[u8; 16], name: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(16 + name.len());
    k.extend_from_slice(id);
    k.extend_from_slice(name.as_bytes());
    k
}

pub(crate) fn part_key(upload_id: &str, part_number: u32) -> Vec<u8> {
    let mut k = Vec::with_capacity(upload_id.len() + 5);
    k.extend_from_slice(upload_id.as_bytes());
    k.push(0);
    k.extend_from_slice(&part_number.to_be_bytes());
    k
}

/// The upper bound of a scan of the bucket's entries that start with `full_prefix` (an object
/// key or escaped key prefix): its successor, or past every key of the bucket when it has none.
pub(crate) fn scan_upper_bound(bucket_id: u64, full_prefix: &[u8]) -> Vec<u8> {
    prefix_successor(full_prefix).unwrap_or_else(|| {
        let mut u = bucket_id.to_be_bytes().to_vec();
        u.extend_from_slice(&[0xff; 9]);
        u
    })
}

/// The smallest byte string greater than every string that starts with `prefix`, if any.
pub(crate) fn prefix_successor(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut p = prefix.to_vec();
    while let Some(last) = p.pop() {
        if last < 0xff {
            p.push(last + 1);
            return Some(p);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The key layouts of ARCHITECTURE.md's column family table, pinned: a change here makes
    /// existing data directories unreadable, so it needs a migration, not a new test value.
    #[test]
    fn key_layouts_are_pinned() {
        let hex = |v: Vec<u8>| v.iter().map(|b| format!("{b:02x}")).collect::<String>();
        // objects: bucket id (u64 BE) ++ key bytes.
        assert_eq!(hex(object_key(0x0102, "a/b")), "0000000000000102612f62");
        // uploads: bucket id ++ key ++ 0x00 ++ upload id.
        assert_eq!(hex(upload_key(7, "k", "U1")), "00000000000000076b005531");
        // versions: bucket id ++ key (0x00 as 0x00 0xff) ++ 0x00 0x00 ++ !sequence (u64 BE).
        assert_eq!(
            hex(version_key(7, "k", 1)),
            "00000000000000076b0000fffffffffffffffe"
        );
        assert_eq!(
            hex(version_key(7, "a\0", 0)),
            "00000000000000076100ff0000ffffffffffffffff"
        );
        // Newest first; a key's versions before any longer key's, whatever follows.
        assert!(version_key(7, "k", 9) < version_key(7, "k", 8));
        assert!(version_key(7, "a", 1) < version_key(7, "a\0", u64::MAX));
        assert!(version_key(7, "a\0", 1) < version_key(7, "a\0x", u64::MAX));
        assert!(version_key(7, "a\0x", 1) < version_key(7, "a\x01", u64::MAX));
        assert_eq!(
            split_version_key(&version_key(7, "a\0b", 5)),
            Some((7, "a\0b".to_string(), 5))
        );
        // parts: upload id ++ 0x00 ++ part number (u32 BE).
        assert_eq!(hex(part_key("U1", 258)), "55310000000102");
        // members: the TAR's byte identity (16 bytes) ++ member name.
        assert_eq!(
            hex(member_key(&[0xab; 16], "x.jpg")),
            "abababababababababababababababab782e6a7067"
        );
        // Keys of one bucket sort together and by key bytes, so a prefix listing is one scan.
        assert!(object_key(1, "zz") < object_key(2, ""));
        assert!(object_key(1, "a") < object_key(1, "a/"));
    }
}
