//! Bucket lifecycle configurations: the `?lifecycle` XML (Put/Get/DeleteBucketLifecycleConfiguration).
//! The rules as stored and their evaluation are the store's (`packrat_store_api::lifecycle`).

use super::error::{S3Error, S3ErrorCode, S3Result};
use super::tagging::TagXml;
use super::xml::Xml;
use serde::Deserialize;

pub use packrat_store_api::lifecycle::{
    NoncurrentExpiration, NoncurrentTransition, RULES_MAX, Rule, Transition, When,
};

// ---- XML ----

#[derive(Debug, Deserialize)]
struct ConfigXml {
    #[serde(rename = "Rule", default)]
    rules: Vec<RuleXml>,
}

#[derive(Debug, Deserialize)]
struct RuleXml {
    #[serde(rename = "ID")]
    id: Option<String>,
    #[serde(rename = "Status")]
    status: String,
    #[serde(rename = "Prefix")]
    prefix: Option<String>,
    #[serde(rename = "Filter")]
    filter: Option<FilterXml>,
    #[serde(rename = "Transition", default)]
    transitions: Vec<TransitionXml>,
    #[serde(rename = "Expiration")]
    expiration: Option<ExpirationXml>,
    #[serde(rename = "AbortIncompleteMultipartUpload")]
    abort: Option<AbortXml>,
    #[serde(rename = "NoncurrentVersionTransition", default)]
    noncurrent_transitions: Vec<NoncurrentTransitionXml>,
    #[serde(rename = "NoncurrentVersionExpiration")]
    noncurrent_expiration: Option<NoncurrentXml>,
}

#[derive(Debug, Deserialize)]
struct NoncurrentXml {
    #[serde(rename = "NoncurrentDays")]
    days: Option<u32>,
    #[serde(rename = "NewerNoncurrentVersions")]
    newer_versions: Option<u32>,
}

#[derive(Debug, Deserialize)]
struct NoncurrentTransitionXml {
    #[serde(rename = "NoncurrentDays")]
    days: Option<u32>,
    #[serde(rename = "NewerNoncurrentVersions")]
    newer_versions: Option<u32>,
    #[serde(rename = "StorageClass")]
    storage_class: String,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct FilterXml {
    #[serde(rename = "Prefix")]
    prefix: Option<String>,
    #[serde(rename = "Tag")]
    tag: Option<TagXml>,
    #[serde(rename = "And")]
    and: Option<AndXml>,
    #[serde(rename = "ObjectSizeGreaterThan")]
    size_gt: Option<u64>,
    #[serde(rename = "ObjectSizeLessThan")]
    size_lt: Option<u64>,
}

#[derive(Debug, Deserialize, Default)]
#[serde(default)]
struct AndXml {
    #[serde(rename = "Prefix")]
    prefix: Option<String>,
    #[serde(rename = "Tag", default)]
    tags: Vec<TagXml>,
    #[serde(rename = "ObjectSizeGreaterThan")]
    size_gt: Option<u64>,
    #[serde(rename = "ObjectSizeLessThan")]
    size_lt: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct TransitionXml {
    #[serde(rename = "Days")]
    days: Option<u32>,
    #[serde(rename = "Date")]
    date: Option<String>,
    #[serde(rename = "StorageClass")]
    storage_class: String,
}

#[derive(Debug, Deserialize)]
struct ExpirationXml {
    #[serde(rename = "Days")]
    days: Option<u32>,
    #[serde(rename = "Date")]
    date: Option<String>,
    #[serde(rename = "ExpiredObjectDeleteMarker")]
    delete_marker: Option<String>,
}

#[derive(Debug, Deserialize)]
struct AbortXml {
    #[serde(rename = "DaysAfterInitiation")]
    days: u32,
}

fn invalid(msg: impl Into<String>) -> S3Error {
    S3Error::new(S3ErrorCode::InvalidArgument, msg)
}

fn when(days: Option<u32>, date: Option<String>, what: &str) -> S3Result<When> {
    match (days, date) {
        (Some(0), _) => Err(invalid(format!(
            "'Days' in the {what} action must be a positive integer"
        ))),
        (Some(d), None) => Ok(When::Days(d)),
        (None, Some(text)) => {
            let t = chrono::DateTime::parse_from_rfc3339(text.trim())
                .map_err(|_| invalid(format!("'Date' in the {what} action must be an ISO 8601 date, e.g. 2026-12-01T00:00:00Z")))?;
            Ok(When::Date(t.timestamp_millis(), text))
        }
        _ => Err(invalid(format!(
            "the {what} action needs exactly one of 'Days' and 'Date'"
        ))),
    }
}

/// A transition's class must be a tier this server has (STANDARD is no transition).
fn refuse_unknown_class(class: &str, what: &str, is_tier: &dyn Fn(&str) -> bool) -> S3Result<()> {
    if is_tier(class) {
        return Ok(());
    }
    Err(S3Error::new(
        S3ErrorCode::InvalidStorageClass,
        format!(
            "{what} to {class} is not possible: it is not a storage class configured on this server (packrat serve --tier CLASS=...)."
        ),
    ))
}

fn noncurrent_days(days: Option<u32>, what: &str) -> S3Result<u32> {
    days.filter(|d| *d > 0).ok_or_else(|| {
        invalid(format!(
            "'NoncurrentDays' in {what} must be a positive integer"
        ))
    })
}

fn newer_versions(n: Option<u32>) -> S3Result<Option<u32>> {
    if n.is_some_and(|v| !(1..=100).contains(&v)) {
        return Err(invalid(
            "'NewerNoncurrentVersions' must be between 1 and 100",
        ));
    }
    Ok(n)
}

/// Parses and validates a lifecycle configuration. `is_tier` says whether a storage class is
/// configured on this server (transitions to any other class are refused).
pub fn parse(body: &[u8], is_tier: &dyn Fn(&str) -> bool) -> S3Result<Vec<Rule>> {
    let cfg: ConfigXml = super::xml::parse(body)?;
    if cfg.rules.is_empty() {
        return Err(S3Error::new(
            S3ErrorCode::MalformedXML,
            "A lifecycle configuration needs at least one Rule.",
        ));
    }
    if cfg.rules.len() > RULES_MAX {
        return Err(invalid(format!(
            "at most {RULES_MAX} rules per configuration"
        )));
    }
    let mut rules = Vec::with_capacity(cfg.rules.len());
    let mut ids = std::collections::HashSet::new();
    for (n, r) in cfg.rules.into_iter().enumerate() {
        let enabled = match r.status.as_str() {
            "Enabled" => true,
            "Disabled" => false,
            _ => {
                return Err(S3Error::new(
                    S3ErrorCode::MalformedXML,
                    "Rule Status must be Enabled or Disabled.",
                ));
            }
        };
        let noncurrent_expiration = match r.noncurrent_expiration {
            None => None,
            Some(n) => Some(NoncurrentExpiration {
                days: noncurrent_days(n.days, "NoncurrentVersionExpiration")?,
                newer_versions: newer_versions(n.newer_versions)?,
            }),
        };
        let mut noncurrent_transitions: Vec<NoncurrentTransition> = Vec::new();
        for t in r.noncurrent_transitions {
            refuse_unknown_class(&t.storage_class, "NoncurrentVersionTransition", is_tier)?;
            if noncurrent_transitions
                .iter()
                .any(|o| o.storage_class == t.storage_class)
            {
                return Err(invalid(
                    "'StorageClass' must be different for 'NoncurrentVersionTransition' actions in the same 'Rule'.",
                ));
            }
            noncurrent_transitions.push(NoncurrentTransition {
                days: noncurrent_days(t.days, "NoncurrentVersionTransition")?,
                newer_versions: newer_versions(t.newer_versions)?,
                storage_class: t.storage_class,
            });
        }
        if let Some(e) = &noncurrent_expiration
            && noncurrent_transitions.iter().any(|t| t.days >= e.days)
        {
            return Err(invalid(
                "'NoncurrentDays' in the NoncurrentVersionExpiration action must be greater than 'NoncurrentDays' in the NoncurrentVersionTransition action.",
            ));
        }
        let f = r.filter.unwrap_or_default();
        let a = f.and.unwrap_or_default();
        let tags: Vec<(String, String)> = f
            .tag
            .into_iter()
            .chain(a.tags)
            .map(|t| (t.key, t.value))
            .collect();
        if tags
            .iter()
            .enumerate()
            .any(|(i, (k, _))| tags[..i].iter().any(|(o, _)| o == k))
        {
            return Err(invalid("Duplicate Tag Keys are not allowed."));
        }
        if tags
            .iter()
            .any(|(k, v)| k.is_empty() || k.chars().count() > 128 || v.chars().count() > 256)
        {
            return Err(S3Error::new(
                S3ErrorCode::InvalidTag,
                "A lifecycle Tag needs a key of 1 to 128 characters and a value of at most 256.",
            ));
        }
        let prefix = r.prefix.or(f.prefix).or(a.prefix).unwrap_or_default();
        let mut transitions = Vec::new();
        for t in r.transitions {
            refuse_unknown_class(&t.storage_class, "Transition", is_tier)?;
            transitions.push(Transition {
                when: when(t.days, t.date, "Transition")?,
                storage_class: t.storage_class,
            });
        }
        let (expiration, expired_delete_markers) = match r.expiration {
            Some(e) if e.delete_marker.is_some() => {
                if e.days.is_some() || e.date.is_some() {
                    return Err(S3Error::new(
                        S3ErrorCode::MalformedXML,
                        "ExpiredObjectDeleteMarker cannot be specified with Days or Date in a Lifecycle Expiration Policy.",
                    ));
                }
                let on = match e.delete_marker.as_deref().map(str::trim) {
                    Some("true") => true,
                    Some("false") => false,
                    _ => {
                        return Err(S3Error::new(
                            S3ErrorCode::MalformedXML,
                            "ExpiredObjectDeleteMarker is true or false.",
                        ));
                    }
                };
                if on && !tags.is_empty() {
                    return Err(invalid(
                        "ExpiredObjectDeleteMarker cannot be specified with a Tag filter (delete markers have no tags).",
                    ));
                }
                (None, on)
            }
            Some(e) => (Some(when(e.days, e.date, "Expiration")?), false),
            None => (None, false),
        };
        let abort_incomplete_days = r.abort.map(|a| a.days);
        if transitions.is_empty()
            && expiration.is_none()
            && abort_incomplete_days.is_none()
            && noncurrent_expiration.is_none()
            && noncurrent_transitions.is_empty()
            && !expired_delete_markers
        {
            return Err(invalid(
                "Each rule needs at least one action (Transition, Expiration, NoncurrentVersionTransition, NoncurrentVersionExpiration or AbortIncompleteMultipartUpload).",
            ));
        }
        let id = r.id.unwrap_or_else(|| format!("rule-{}", n + 1));
        if id.len() > 255 || !ids.insert(id.clone()) {
            return Err(invalid(
                "Rule IDs must be unique and at most 255 characters.",
            ));
        }
        rules.push(Rule {
            id,
            enabled,
            prefix,
            size_greater_than: f.size_gt.or(a.size_gt),
            size_less_than: f.size_lt.or(a.size_lt),
            tags,
            transitions,
            expiration,
            abort_incomplete_days,
            noncurrent_expiration,
            expired_delete_markers,
            noncurrent_transitions,
        });
    }
    Ok(rules)
}

/// The configuration as GetBucketLifecycleConfiguration returns it.
pub fn to_xml(rules: &[Rule]) -> String {
    let mut x = Xml::new();
    x.root("LifecycleConfiguration");
    let when = |x: &mut Xml, w: &When| match w {
        When::Days(d) => x.elem("Days", &d.to_string()),
        When::Date(_, text) => x.elem("Date", text),
    };
    for r in rules {
        x.open("Rule");
        x.elem("ID", &r.id);
        x.open("Filter");
        let sized = r.size_greater_than.is_some() || r.size_less_than.is_some();
        let tag = |x: &mut Xml, (k, v): &(String, String)| {
            x.open("Tag");
            x.elem("Key", k);
            x.elem("Value", v);
            x.close("Tag");
        };
        if let [only] = r.tags.as_slice()
            && !sized
            && r.prefix.is_empty()
        {
            tag(&mut x, only);
        } else {
            let and = sized || !r.tags.is_empty();
            if and {
                x.open("And");
            }
            x.elem("Prefix", &r.prefix);
            for t in &r.tags {
                tag(&mut x, t);
            }
            if let Some(g) = r.size_greater_than {
                x.elem("ObjectSizeGreaterThan", &g.to_string());
            }
            if let Some(l) = r.size_less_than {
                x.elem("ObjectSizeLessThan", &l.to_string());
            }
            if and {
                x.close("And");
            }
        }
        x.close("Filter");
        x.elem("Status", if r.enabled { "Enabled" } else { "Disabled" });
        for t in &r.transitions {
            x.open("Transition");
            when(&mut x, &t.when);
            x.elem("StorageClass", &t.storage_class);
            x.close("Transition");
        }
        for t in &r.noncurrent_transitions {
            x.open("NoncurrentVersionTransition");
            x.elem("NoncurrentDays", &t.days.to_string());
            x.elem("StorageClass", &t.storage_class);
            if let Some(v) = t.newer_versions {
                x.elem("NewerNoncurrentVersions", &v.to_string());
            }
            x.close("NoncurrentVersionTransition");
        }
        if let Some(e) = &r.expiration {
            x.open("Expiration");
            when(&mut x, e);
            x.close("Expiration");
        } else if r.expired_delete_markers {
            x.open("Expiration");
            x.elem("ExpiredObjectDeleteMarker", "true");
            x.close("Expiration");
        }
        if let Some(n) = &r.noncurrent_expiration {
            x.open("NoncurrentVersionExpiration");
            x.elem("NoncurrentDays", &n.days.to_string());
            if let Some(v) = n.newer_versions {
                x.elem("NewerNoncurrentVersions", &v.to_string());
            }
            x.close("NoncurrentVersionExpiration");
        }
        if let Some(d) = r.abort_incomplete_days {
            x.open("AbortIncompleteMultipartUpload");
            x.elem("DaysAfterInitiation", &d.to_string());
            x.close("AbortIncompleteMultipartUpload");
        }
        x.close("Rule");
    }
    x.close("LifecycleConfiguration");
    x.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use packrat_store_api::lifecycle::{Action, evaluate};

    fn tiers(c: &str) -> bool {
        c == "STANDARD_IA" || c == "GLACIER_IR"
    }

    #[test]
    fn parse_evaluate_and_render() {
        let body = br#"<LifecycleConfiguration xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
          <Rule><ID>cold</ID><Filter><Prefix>train/</Prefix></Filter><Status>Enabled</Status>
            <Transition><Days>30</Days><StorageClass>STANDARD_IA</StorageClass></Transition>
            <Transition><Days>90</Days><StorageClass>GLACIER_IR</StorageClass></Transition>
          </Rule>
          <Rule><Filter><And><Prefix>tmp/</Prefix><ObjectSizeGreaterThan>10</ObjectSizeGreaterThan></And></Filter>
            <Status>Enabled</Status><Expiration><Days>7</Days></Expiration>
            <AbortIncompleteMultipartUpload><DaysAfterInitiation>2</DaysAfterInitiation></AbortIncompleteMultipartUpload></Rule>
          <Rule><ID>off</ID><Filter/><Status>Disabled</Status><Expiration><Date>2020-01-01T00:00:00Z</Date></Expiration></Rule>
        </LifecycleConfiguration>"#;
        let rules = parse(body, &tiers).unwrap();
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[1].id, "rule-2");
        assert_eq!(rules[1].size_greater_than, Some(10));
        let day = 86_400_000i64;
        let ev = |key: &str, size: u64, age_days: i64, class: &str| {
            evaluate(&rules, key, size, &[], 0, class, age_days * day)
        };
        assert_eq!(ev("train/a", 5, 10, "STANDARD"), Action::Keep);
        assert_eq!(
            ev("train/a", 5, 31, "STANDARD"),
            Action::Transition("STANDARD_IA".into())
        );
        assert_eq!(
            ev("train/a", 5, 100, "STANDARD"),
            Action::Transition("GLACIER_IR".into())
        );
        assert_eq!(ev("train/a", 5, 100, "GLACIER_IR"), Action::Keep);
        assert_eq!(
            ev("train/a", 5, 31, "GLACIER_IR"),
            Action::Keep,
            "never warmer"
        );
        assert_eq!(ev("tmp/x", 50, 8, "STANDARD"), Action::Expire);
        assert_eq!(ev("tmp/x", 5, 8, "STANDARD"), Action::Keep, "size filter");
        assert_eq!(
            ev("other", 50, 10_000, "STANDARD"),
            Action::Keep,
            "disabled rule"
        );
        // Round trip through the XML GetBucketLifecycleConfiguration returns.
        let again = parse(to_xml(&rules).as_bytes(), &tiers).unwrap();
        assert_eq!(again, rules);
    }

    #[test]
    fn tag_filters_select_by_tags() {
        let body = br#"<LifecycleConfiguration>
          <Rule><ID>one-tag</ID><Filter><Tag><Key>stage</Key><Value>raw</Value></Tag></Filter>
            <Status>Enabled</Status><Expiration><Days>1</Days></Expiration></Rule>
          <Rule><ID>and</ID><Filter><And><Prefix>ckpt/</Prefix><Tag><Key>keep</Key><Value>no</Value></Tag>
            <Tag><Key>run</Key><Value>7</Value></Tag><ObjectSizeGreaterThan>100</ObjectSizeGreaterThan></And></Filter>
            <Status>Enabled</Status><Transition><Days>1</Days><StorageClass>STANDARD_IA</StorageClass></Transition></Rule>
        </LifecycleConfiguration>"#;
        let rules = parse(body, &tiers).unwrap();
        assert_eq!(rules[0].tags, vec![("stage".into(), "raw".into())]);
        assert_eq!(rules[1].tags.len(), 2);
        let t = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<Vec<_>>()
        };
        let day = 86_400_000i64;
        let ev = |key: &str, size: u64, tags: &[(String, String)]| {
            evaluate(&rules, key, size, tags, 0, "STANDARD", 2 * day)
        };
        assert_eq!(ev("x", 1, &t(&[("stage", "raw")])), Action::Expire);
        assert_eq!(ev("x", 1, &t(&[("stage", "clean")])), Action::Keep);
        assert_eq!(ev("x", 1, &[]), Action::Keep);
        let both = t(&[("run", "7"), ("keep", "no"), ("other", "1")]);
        assert_eq!(
            ev("ckpt/a", 500, &both),
            Action::Transition("STANDARD_IA".into())
        );
        assert_eq!(ev("ckpt/a", 50, &both), Action::Keep, "size");
        assert_eq!(ev("ckpt/a", 500, &both[..1]), Action::Keep, "all tags");
        assert_eq!(ev("data/a", 500, &both), Action::Keep, "prefix");
        let again = parse(to_xml(&rules).as_bytes(), &tiers).unwrap();
        assert_eq!(again, rules);
        assert!(to_xml(&rules).contains("<Filter><Tag><Key>stage</Key>"));
    }

    #[test]
    fn noncurrent_versions_and_delete_markers() {
        let body = br#"<LifecycleConfiguration>
          <Rule><ID>history</ID><Filter><Prefix>ds/</Prefix></Filter><Status>Enabled</Status>
            <NoncurrentVersionExpiration><NoncurrentDays>30</NoncurrentDays>
              <NewerNoncurrentVersions>3</NewerNoncurrentVersions></NoncurrentVersionExpiration></Rule>
          <Rule><ID>markers</ID><Filter/><Status>Enabled</Status>
            <Expiration><ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Expiration>
            <NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays></NoncurrentVersionExpiration></Rule>
        </LifecycleConfiguration>"#;
        let rules = parse(body, &tiers).unwrap();
        assert_eq!(
            rules[0].noncurrent_expiration,
            Some(NoncurrentExpiration {
                days: 30,
                newer_versions: Some(3)
            })
        );
        assert!(!rules[0].expired_delete_markers && rules[1].expired_delete_markers);
        assert_eq!(rules[1].expiration, None);
        assert_eq!(parse(to_xml(&rules).as_bytes(), &tiers).unwrap(), rules);
        let refused = |rule: &str| {
            let body = format!(
                "<LifecycleConfiguration><Rule><Status>Enabled</Status>{rule}</Rule></LifecycleConfiguration>"
            );
            parse(body.as_bytes(), &tiers).unwrap_err().code
        };
        let days = |d: &str| {
            format!(
                "<NoncurrentVersionExpiration><NoncurrentDays>{d}</NoncurrentDays></NoncurrentVersionExpiration>"
            )
        };
        assert_eq!(refused(&days("0")), S3ErrorCode::InvalidArgument);
        assert_eq!(
            refused(
                "<NoncurrentVersionExpiration><NewerNoncurrentVersions>2</NewerNoncurrentVersions></NoncurrentVersionExpiration>"
            ),
            S3ErrorCode::InvalidArgument
        );
        assert_eq!(
            refused(
                "<NoncurrentVersionExpiration><NoncurrentDays>1</NoncurrentDays><NewerNoncurrentVersions>101</NewerNoncurrentVersions></NoncurrentVersionExpiration>"
            ),
            S3ErrorCode::InvalidArgument
        );
        assert_eq!(
            refused(
                "<Expiration><Days>1</Days><ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Expiration>"
            ),
            S3ErrorCode::MalformedXML
        );
        assert_eq!(
            refused(
                "<Filter><Tag><Key>a</Key><Value>b</Value></Tag></Filter><Expiration><ExpiredObjectDeleteMarker>true</ExpiredObjectDeleteMarker></Expiration>"
            ),
            S3ErrorCode::InvalidArgument
        );
        let moving = |d: &str, class: &str| {
            format!(
                "<NoncurrentVersionTransition><NoncurrentDays>{d}</NoncurrentDays><StorageClass>{class}</StorageClass></NoncurrentVersionTransition>"
            )
        };
        assert_eq!(
            refused(&moving("0", "STANDARD_IA")),
            S3ErrorCode::InvalidArgument
        );
        assert_eq!(
            refused(&moving("1", "GLACIER")),
            S3ErrorCode::InvalidStorageClass
        );
        assert_eq!(
            refused(&format!(
                "{}{}",
                moving("1", "STANDARD_IA"),
                moving("5", "STANDARD_IA")
            )),
            S3ErrorCode::InvalidArgument
        );
        // The versions must expire after they move.
        assert_eq!(
            refused(&format!("{}{}", moving("30", "STANDARD_IA"), days("30"))),
            S3ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn noncurrent_versions_move_to_tiers() {
        let body = br#"<LifecycleConfiguration>
          <Rule><ID>old-to-cold</ID><Filter><Prefix>ds/</Prefix></Filter><Status>Enabled</Status>
            <NoncurrentVersionTransition><NoncurrentDays>7</NoncurrentDays><StorageClass>STANDARD_IA</StorageClass></NoncurrentVersionTransition>
            <NoncurrentVersionTransition><NoncurrentDays>30</NoncurrentDays><StorageClass>GLACIER_IR</StorageClass>
              <NewerNoncurrentVersions>2</NewerNoncurrentVersions></NoncurrentVersionTransition>
            <NoncurrentVersionExpiration><NoncurrentDays>365</NoncurrentDays></NoncurrentVersionExpiration></Rule>
        </LifecycleConfiguration>"#;
        let rules = parse(body, &tiers).unwrap();
        assert_eq!(
            rules[0].noncurrent_transitions,
            [
                NoncurrentTransition {
                    days: 7,
                    newer_versions: None,
                    storage_class: "STANDARD_IA".into()
                },
                NoncurrentTransition {
                    days: 30,
                    newer_versions: Some(2),
                    storage_class: "GLACIER_IR".into()
                }
            ]
        );
        assert!(rules[0].acts_on_history());
        assert!(to_xml(&rules).contains("<NoncurrentVersionTransition><NoncurrentDays>7</NoncurrentDays><StorageClass>STANDARD_IA</StorageClass></NoncurrentVersionTransition>"));
        assert_eq!(parse(to_xml(&rules).as_bytes(), &tiers).unwrap(), rules);
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(512))]
        /// Any body, and any text inside a well-formed rule, is an S3 error or a parsed
        /// configuration, never a panic.
        #[test]
        fn lifecycle_bodies_never_panic(
            body in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
            text in "\\PC{0,60}",
        ) {
            let _ = parse(&body, &tiers);
            for xml in [
                format!("<LifecycleConfiguration><Rule><Status>Enabled</Status><Expiration><Days>{text}</Days></Expiration></Rule></LifecycleConfiguration>"),
                format!("<LifecycleConfiguration><Rule><Status>Enabled</Status><Expiration><Date>{text}</Date></Expiration></Rule></LifecycleConfiguration>"),
                format!("<LifecycleConfiguration><Rule><ID>{text}</ID><Filter><Prefix>{text}</Prefix></Filter><Status>Enabled</Status><Transition><Days>1</Days><StorageClass>{text}</StorageClass></Transition></Rule></LifecycleConfiguration>"),
            ] {
                if let Ok(rules) = parse(xml.as_bytes(), &tiers) {
                    let _ = evaluate(&rules, &text, 1, &[], 0, "STANDARD", i64::MAX / 2);
                    let _ = to_xml(&rules);
                }
            }
        }
    }

    #[test]
    fn bad_configurations_are_refused() {
        let p = |b: &str| parse(b.as_bytes(), &tiers).map_err(|e| e.code);
        assert_eq!(
            p("<LifecycleConfiguration/>"),
            Err(S3ErrorCode::MalformedXML)
        );
        assert_eq!(
            p(
                "<LifecycleConfiguration><Rule><Status>On</Status><Expiration><Days>1</Days></Expiration></Rule></LifecycleConfiguration>"
            ),
            Err(S3ErrorCode::MalformedXML)
        );
        assert_eq!(
            p(
                "<LifecycleConfiguration><Rule><Status>Enabled</Status><Transition><Days>1</Days><StorageClass>GLACIER</StorageClass></Transition></Rule></LifecycleConfiguration>"
            ),
            Err(S3ErrorCode::InvalidStorageClass)
        );
        assert_eq!(
            p(
                "<LifecycleConfiguration><Rule><Status>Enabled</Status><Expiration><Days>0</Days></Expiration></Rule></LifecycleConfiguration>"
            ),
            Err(S3ErrorCode::InvalidArgument)
        );
        assert_eq!(
            p(
                "<LifecycleConfiguration><Rule><Status>Enabled</Status></Rule></LifecycleConfiguration>"
            ),
            Err(S3ErrorCode::InvalidArgument)
        );
        assert_eq!(
            p(
                "<LifecycleConfiguration><Rule><Filter><And><Tag><Key>a</Key><Value>b</Value></Tag><Tag><Key>a</Key><Value>c</Value></Tag></And></Filter><Status>Enabled</Status><Expiration><Days>3</Days></Expiration></Rule></LifecycleConfiguration>"
            ),
            Err(S3ErrorCode::InvalidArgument)
        );
        assert_eq!(
            p(
                "<LifecycleConfiguration><Rule><Status>Enabled</Status><Expiration><Date>soon</Date></Expiration></Rule></LifecycleConfiguration>"
            ),
            Err(S3ErrorCode::InvalidArgument)
        );
        assert_eq!(p("not xml"), Err(S3ErrorCode::MalformedXML));
    }
}
