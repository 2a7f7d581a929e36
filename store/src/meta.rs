//! The store's own values in the index's `meta` column family: lifecycle configurations
//! (`lifecycle/<bucket id>`) and the tier segment catalog (`tierseg/<segment id>`).
//!
//! Each value is one format-version byte followed by the postcard encoding of the value, like
//! the index's own records (`index/src/records.rs`). Version 1 is the layout pinned by the
//! golden tests below; a change to `Rule`, `Transition`, `When` or `TierSegment` is a new
//! version whose decoder still reads the older ones. Releases up to 7920cce wrote these values
//! as JSON (an array or an object, so the first byte is `[` or `{`, never a version byte):
//! they are still read, and replaced by version 1 the next time they are written.

use serde::Serialize;
use serde::de::DeserializeOwned;

pub const META_V1: u8 = 1;

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![META_V1];
    // Encoding plain structs into a Vec cannot fail.
    out.extend(postcard::to_stdvec(value).expect("postcard encodes plain structs"));
    out
}

pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, String> {
    match bytes.split_first() {
        Some((&META_V1, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
        // Written as JSON by releases up to 7920cce.
        Some((b'[' | b'{', _)) => serde_json::from_slice(bytes).map_err(|e| e.to_string()),
        Some((v, _)) => Err(format!("unknown meta record version {v}")),
        None => Err("empty meta record".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tier::TierSegment;
    use packrat_store_api::lifecycle::{Rule, Transition, When};

    fn rules() -> Vec<Rule> {
        vec![
            Rule {
                id: "to-cold".into(),
                enabled: true,
                prefix: "logs/".into(),
                size_greater_than: Some(1024),
                size_less_than: None,
                tags: vec![("tier".into(), "cold".into())],
                transitions: vec![Transition {
                    when: When::Days(30),
                    storage_class: "COLD".into(),
                }],
                expiration: Some(When::Date(1_767_225_600_000, "2026-01-01T00:00:00Z".into())),
                abort_incomplete_days: Some(7),
            },
            Rule {
                id: "off".into(),
                ..Default::default()
            },
        ]
    }

    fn segment() -> TierSegment {
        TierSegment {
            tier: "COLD".into(),
            len: 67_108_864,
            crc32c: 0xdead_beef,
            ready: true,
            created_ms: 1_764_000_000_000,
        }
    }

    /// Version 1's bytes, pinned: a change here is a format change and needs a new version.
    #[test]
    fn golden_v1_bytes() {
        assert_eq!(hex::encode(encode(&rules())), GOLDEN_RULES);
        assert_eq!(hex::encode(encode(&segment())), GOLDEN_SEGMENT);
        let back: Vec<Rule> = decode(&hex::decode(GOLDEN_RULES).unwrap()).unwrap();
        assert_eq!(back, rules());
        let seg: TierSegment = decode(&hex::decode(GOLDEN_SEGMENT).unwrap()).unwrap();
        assert_eq!(encode(&seg), encode(&segment()));
    }

    /// JSON as releases up to 7920cce wrote it (`serde_json::to_vec` of the same types).
    #[test]
    fn legacy_json_still_reads() {
        let rules_json = br#"[{"id":"to-cold","enabled":true,"prefix":"logs/","size_greater_than":1024,"size_less_than":null,"tags":[["tier","cold"]],"transitions":[{"when":{"Days":30},"storage_class":"COLD"}],"expiration":{"Date":[1767225600000,"2026-01-01T00:00:00Z"]},"abort_incomplete_days":7},{"id":"off","enabled":false,"prefix":"","size_greater_than":null,"size_less_than":null,"transitions":[],"expiration":null,"abort_incomplete_days":null}]"#;
        let back: Vec<Rule> = decode(rules_json).unwrap();
        assert_eq!(back, rules());
        let seg_json =
            br#"{"tier":"COLD","len":67108864,"crc32c":3735928559,"ready":true,"created_ms":1764000000000}"#;
        let seg: TierSegment = decode(seg_json).unwrap();
        assert_eq!(encode(&seg), encode(&segment()));
    }

    #[test]
    fn unknown_versions_and_garbage_are_errors() {
        assert!(decode::<TierSegment>(&[]).is_err());
        assert!(decode::<TierSegment>(&[2, 0, 0]).is_err());
        assert!(decode::<TierSegment>(&[META_V1]).is_err());
        assert!(decode::<Vec<Rule>>(b"[{").is_err());
    }

    const GOLDEN_RULES: &str = "010207746f2d636f6c6401056c6f67732f0180080001047469657204636f6c6401001e04434f4c44010180a0d5edee6614323032362d30312d30315430303a30303a30305a0107036f66660000000000000000";
    const GOLDEN_SEGMENT: &str = "0104434f4c4480808020effdb6f50d0180a0bfe9d666";
}
