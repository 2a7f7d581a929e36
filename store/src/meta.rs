//! The store's own values in the index's `meta` column family: lifecycle configurations
//! (`lifecycle/<bucket id>`) and the tier segment catalog (`tierseg/<segment id>`).
//!
//! Each value is one format-version byte followed by the postcard encoding of the value, like
//! the index's own records (`index/src/records.rs`). Version 1 is the layout pinned by the
//! golden tests below; a change to `Rule`, `Transition`, `When` or `TierSegment` is a new
//! version whose decoder still reads the older ones. Version 2 (lifecycle rules only) added
//! `Rule::noncurrent_expiration` and `Rule::expired_delete_markers`; version 3 (lifecycle rules
//! only) added `Rule::noncurrent_transitions`; older rules read as rules without the newer
//! fields. Releases up to 7920cce wrote these values
//! as JSON (an array or an object, so the first byte is `[` or `{`, never a version byte):
//! they are still read, and replaced by version 1 the next time they are written.

use packrat_store_api::lifecycle::{NoncurrentExpiration, Rule, Transition, When};
use serde::Serialize;
use serde::de::DeserializeOwned;

pub const META_V1: u8 = 1;
pub const META_V2: u8 = 2;
pub const META_V3: u8 = 3;

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    encode_as(META_V1, value)
}

fn encode_as<T: Serialize + ?Sized>(version: u8, value: &T) -> Vec<u8> {
    let mut out = vec![version];
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

/// A bucket's lifecycle rules, as version 3.
pub fn encode_rules(rules: &[Rule]) -> Vec<u8> {
    encode_as(META_V3, rules)
}

/// A bucket's lifecycle rules, of any version.
pub fn decode_rules(bytes: &[u8]) -> Result<Vec<Rule>, String> {
    match bytes.split_first() {
        Some((&META_V3, rest)) => postcard::from_bytes(rest).map_err(|e| e.to_string()),
        Some((&META_V2, rest)) => Ok(postcard::from_bytes::<Vec<RuleV2>>(rest)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(Rule::from)
            .collect()),
        Some((&META_V1, _)) => Ok(decode::<Vec<RuleV1>>(bytes)?
            .into_iter()
            .map(Rule::from)
            .collect()),
        // JSON names its fields: the newer ones default.
        _ => decode(bytes),
    }
}

/// `Rule` as version 1 lays it out.
#[derive(serde::Deserialize)]
struct RuleV1 {
    id: String,
    enabled: bool,
    prefix: String,
    size_greater_than: Option<u64>,
    size_less_than: Option<u64>,
    tags: Vec<(String, String)>,
    transitions: Vec<Transition>,
    expiration: Option<When>,
    abort_incomplete_days: Option<u32>,
}

/// `Rule` as version 2 lays it out.
#[derive(serde::Deserialize)]
struct RuleV2 {
    id: String,
    enabled: bool,
    prefix: String,
    size_greater_than: Option<u64>,
    size_less_than: Option<u64>,
    tags: Vec<(String, String)>,
    transitions: Vec<Transition>,
    expiration: Option<When>,
    abort_incomplete_days: Option<u32>,
    noncurrent_expiration: Option<NoncurrentExpiration>,
    expired_delete_markers: bool,
}

impl From<RuleV2> for Rule {
    fn from(r: RuleV2) -> Self {
        Rule {
            id: r.id,
            enabled: r.enabled,
            prefix: r.prefix,
            size_greater_than: r.size_greater_than,
            size_less_than: r.size_less_than,
            tags: r.tags,
            transitions: r.transitions,
            expiration: r.expiration,
            abort_incomplete_days: r.abort_incomplete_days,
            noncurrent_expiration: r.noncurrent_expiration,
            expired_delete_markers: r.expired_delete_markers,
            noncurrent_transitions: Vec::new(),
        }
    }
}

impl From<RuleV1> for Rule {
    fn from(r: RuleV1) -> Self {
        RuleV2 {
            id: r.id,
            enabled: r.enabled,
            prefix: r.prefix,
            size_greater_than: r.size_greater_than,
            size_less_than: r.size_less_than,
            tags: r.tags,
            transitions: r.transitions,
            expiration: r.expiration,
            abort_incomplete_days: r.abort_incomplete_days,
            noncurrent_expiration: None,
            expired_delete_markers: false,
        }
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tiers::TierSegment;
    use packrat_store_api::lifecycle::NoncurrentTransition;

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
                ..Default::default()
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
        // Rules are written as version 2 now; version 1's still read.
        assert_eq!(hex::encode(encode(&segment())), GOLDEN_SEGMENT);
        let back = decode_rules(&hex::decode(GOLDEN_RULES).unwrap()).unwrap();
        assert_eq!(back, rules());
        let seg: TierSegment = decode(&hex::decode(GOLDEN_SEGMENT).unwrap()).unwrap();
        assert_eq!(encode(&seg), encode(&segment()));
    }

    /// JSON as releases up to 7920cce wrote it (`serde_json::to_vec` of the same types).
    #[test]
    fn legacy_json_still_reads() {
        let rules_json = br#"[{"id":"to-cold","enabled":true,"prefix":"logs/","size_greater_than":1024,"size_less_than":null,"tags":[["tier","cold"]],"transitions":[{"when":{"Days":30},"storage_class":"COLD"}],"expiration":{"Date":[1767225600000,"2026-01-01T00:00:00Z"]},"abort_incomplete_days":7},{"id":"off","enabled":false,"prefix":"","size_greater_than":null,"size_less_than":null,"transitions":[],"expiration":null,"abort_incomplete_days":null}]"#;
        let back = decode_rules(rules_json).unwrap();
        assert_eq!(back, rules());
        let seg_json =
            br#"{"tier":"COLD","len":67108864,"crc32c":3735928559,"ready":true,"created_ms":1764000000000}"#;
        let seg: TierSegment = decode(seg_json).unwrap();
        assert_eq!(encode(&seg), encode(&segment()));
    }

    /// Version 2's bytes, pinned: version 1's rules and the noncurrent-version actions.
    #[test]
    fn golden_v2_rules() {
        let mut rules = rules();
        rules[0].noncurrent_expiration = Some(NoncurrentExpiration {
            days: 30,
            newer_versions: Some(2),
        });
        rules[1].expired_delete_markers = true;
        // Rules are written as version 3 now; version 2's still read.
        assert_eq!(
            decode_rules(&hex::decode(GOLDEN_RULES_V2).unwrap()).unwrap(),
            rules
        );
    }

    /// Version 3's bytes, pinned: version 2's rules and NoncurrentVersionTransition.
    #[test]
    fn golden_v3_rules() {
        let mut rules = rules();
        rules[0].noncurrent_expiration = Some(NoncurrentExpiration {
            days: 30,
            newer_versions: Some(2),
        });
        rules[1].expired_delete_markers = true;
        rules[1].noncurrent_transitions = vec![NoncurrentTransition {
            days: 7,
            newer_versions: Some(1),
            storage_class: "COLD".into(),
        }];
        assert_eq!(hex::encode(encode_rules(&rules)), GOLDEN_RULES_V3);
        assert_eq!(
            decode_rules(&hex::decode(GOLDEN_RULES_V3).unwrap()).unwrap(),
            rules
        );
    }

    #[test]
    fn unknown_versions_and_garbage_are_errors() {
        assert!(decode::<TierSegment>(&[]).is_err());
        assert!(decode::<TierSegment>(&[2, 0, 0]).is_err());
        assert!(decode::<TierSegment>(&[META_V1]).is_err());
        assert!(decode::<Vec<Rule>>(b"[{").is_err());
    }

    const GOLDEN_RULES: &str = "010207746f2d636f6c6401056c6f67732f0180080001047469657204636f6c6401001e04434f4c44010180a0d5edee6614323032362d30312d30315430303a30303a30305a0107036f66660000000000000000";
    const GOLDEN_RULES_V2: &str = "020207746f2d636f6c6401056c6f67732f0180080001047469657204636f6c6401001e04434f4c44010180a0d5edee6614323032362d30312d30315430303a30303a30305a0107011e010200036f666600000000000000000001";
    const GOLDEN_RULES_V3: &str = "030207746f2d636f6c6401056c6f67732f0180080001047469657204636f6c6401001e04434f4c44010180a0d5edee6614323032362d30312d30315430303a30303a30305a0107011e01020000036f6666000000000000000000010107010104434f4c44";
    const GOLDEN_SEGMENT: &str = "0104434f4c4480808020effdb6f50d0180a0bfe9d666";
}
