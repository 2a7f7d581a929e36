//! Bucket lifecycle rules as stored, and what a rule does to one object at a given time.
//! Applying them is the tier worker's job (`tier.rs`); their XML form is the S3 layer's.

use serde::{Deserialize, Serialize};

/// S3's limit on rules per configuration.
pub const RULES_MAX: usize = 1000;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Rule {
    pub id: String,
    pub enabled: bool,
    pub prefix: String,
    pub size_greater_than: Option<u64>,
    pub size_less_than: Option<u64>,
    /// Tags the object must all carry (key, value).
    #[serde(default)]
    pub tags: Vec<(String, String)>,
    pub transitions: Vec<Transition>,
    pub expiration: Option<When>,
    /// AbortIncompleteMultipartUpload: days after initiation.
    pub abort_incomplete_days: Option<u32>,
    /// NoncurrentVersionExpiration (a bucket with versioning).
    #[serde(default)]
    pub noncurrent_expiration: Option<NoncurrentExpiration>,
    /// Expiration's ExpiredObjectDeleteMarker: a delete marker left as a key's only version
    /// is removed.
    #[serde(default)]
    pub expired_delete_markers: bool,
    /// NoncurrentVersionTransition (a bucket with versioning).
    #[serde(default)]
    pub noncurrent_transitions: Vec<NoncurrentTransition>,
}

/// NoncurrentVersionExpiration: a version is removed `days` after it became noncurrent (when
/// the version above it was written), except the `newer_versions` newest noncurrent versions
/// of its key, whatever their age.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoncurrentExpiration {
    pub days: u32,
    pub newer_versions: Option<u32>,
}

/// NoncurrentVersionTransition: a version moves to `storage_class` `days` after it became
/// noncurrent, except the `newer_versions` newest noncurrent versions of its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NoncurrentTransition {
    pub days: u32,
    pub newer_versions: Option<u32>,
    pub storage_class: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Transition {
    pub when: When,
    pub storage_class: String,
}

/// Days after the object's creation, or a date (unix ms, and the text as sent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum When {
    Days(u32),
    Date(i64, String),
}

impl When {
    fn reached(&self, created_ms: i64, now_ms: i64) -> bool {
        match self {
            When::Days(d) => now_ms - created_ms >= i64::from(*d) * 86_400_000,
            When::Date(ms, _) => now_ms >= *ms,
        }
    }

    /// For choosing among several transitions that apply: the latest one wins.
    fn order_key(&self) -> i64 {
        match self {
            When::Days(d) => i64::from(*d) * 86_400_000,
            When::Date(ms, _) => *ms,
        }
    }
}

/// What the rules say about one object now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Keep,
    Expire,
    /// Move to this storage class.
    Transition(String),
}

/// Relative coldness of storage classes: transitions only ever go colder.
pub fn class_rank(class: &str) -> u8 {
    match class {
        "STANDARD" => 0,
        "REDUCED_REDUNDANCY" | "INTELLIGENT_TIERING" => 1,
        "STANDARD_IA" | "ONEZONE_IA" => 2,
        "GLACIER_IR" => 3,
        "GLACIER" => 4,
        "DEEP_ARCHIVE" => 5,
        _ => 0,
    }
}

impl Rule {
    fn matches(&self, key: &str, size: u64, tags: &[(String, String)]) -> bool {
        self.enabled
            && key.starts_with(&self.prefix)
            && self.size_greater_than.is_none_or(|g| size > g)
            && self.size_less_than.is_none_or(|l| size < l)
            && self.tags.iter().all(|t| tags.contains(t))
    }
}

impl Rule {
    /// Whether the rule acts on a key's history (noncurrent versions, lone delete markers).
    pub fn acts_on_history(&self) -> bool {
        self.enabled
            && (self.noncurrent_expiration.is_some()
                || self.expired_delete_markers
                || !self.noncurrent_transitions.is_empty())
    }
}

/// The prefixes whose keys' histories the rules act on: one per rule that does, none inside
/// another (so a listing of each visits every such key once), in order; `[""]` when a rule
/// covers every key. A bucket's history pass lists only these, not every version.
pub fn history_prefixes(rules: &[Rule]) -> Vec<String> {
    let mut prefixes: Vec<&str> = rules
        .iter()
        .filter(|r| r.acts_on_history())
        .map(|r| r.prefix.as_str())
        .collect();
    prefixes.sort_unstable();
    let mut out: Vec<String> = Vec::new();
    for p in prefixes {
        if !out.last().is_some_and(|q| p.starts_with(q.as_str())) {
            out.push(p.to_string());
        }
    }
    out
}

/// Whether a noncurrent-version action of `days` (keeping the `newer_versions` newest) has
/// reached a version noncurrent since `since_ms` and of `rank` among its key's noncurrent
/// versions (0 the newest), as of `now_ms`.
fn noncurrent_due(
    days: u32,
    newer_versions: Option<u32>,
    since_ms: i64,
    rank: usize,
    now_ms: i64,
) -> bool {
    now_ms - since_ms >= i64::from(days) * 86_400_000
        && newer_versions.is_none_or(|keep| rank as u64 >= u64::from(keep))
}

/// What the rules remove of one key's history (`versions`: every version of the key, newest
/// first, delete markers too, as a listing gives them), as of `now_ms`: the ids of noncurrent
/// versions a NoncurrentVersionExpiration has reached, and then the key's delete marker if it
/// would be left as its only version and a rule removes expired delete markers.
///
/// A version's noncurrent time is the time of the version above it; its rank among the key's
/// noncurrent versions (0 the newest) is what `newer_versions` keeps. Filters apply as to
/// objects: prefix, and each version's own size and tags.
pub fn history_removals(
    rules: &[Rule],
    key: &str,
    versions: &[crate::VersionSummary],
    now_ms: i64,
) -> Vec<String> {
    let mut out = Vec::new();
    for (rank, pair) in versions.windows(2).enumerate() {
        let (above, v) = (&pair[0], &pair[1]);
        let since = above.object.last_modified_ms;
        let due = rules.iter().any(|r| {
            r.matches(key, v.object.size, &v.tags)
                && r.noncurrent_expiration
                    .as_ref()
                    .is_some_and(|n| noncurrent_due(n.days, n.newer_versions, since, rank, now_ms))
        });
        if due {
            out.push(v.version_id.clone());
        }
    }
    if let Some(latest) = versions.first()
        && latest.delete_marker
        && out.len() + 1 == versions.len()
        && rules
            .iter()
            .any(|r| r.expired_delete_markers && r.matches(key, 0, &[]))
    {
        out.push(latest.version_id.clone());
    }
    out
}

/// What the rules move of one key's history (as [`history_removals`] takes it), as of
/// `now_ms`: the id and new storage class of each noncurrent version (not a delete marker,
/// not among `removed`) that a NoncurrentVersionTransition has reached, when that class is
/// colder than the version's own. Of several reached, the one with the most days applies, as
/// among an object's transitions; `newer_versions` and the filters work as for expirations.
pub fn history_transitions(
    rules: &[Rule],
    key: &str,
    versions: &[crate::VersionSummary],
    removed: &[String],
    now_ms: i64,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (rank, pair) in versions.windows(2).enumerate() {
        let (above, v) = (&pair[0], &pair[1]);
        if v.delete_marker || removed.contains(&v.version_id) {
            continue;
        }
        let since = above.object.last_modified_ms;
        let best = rules
            .iter()
            .filter(|r| r.matches(key, v.object.size, &v.tags))
            .flat_map(|r| &r.noncurrent_transitions)
            .filter(|t| noncurrent_due(t.days, t.newer_versions, since, rank, now_ms))
            .max_by_key(|t| t.days);
        let class = v.object.storage_class.as_deref().unwrap_or("STANDARD");
        if let Some(t) = best.filter(|t| class_rank(&t.storage_class) > class_rank(class)) {
            out.push((v.version_id.clone(), t.storage_class.clone()));
        }
    }
    out
}

/// A noncurrent version the rules move to a colder storage class.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionTransition {
    pub key: String,
    pub version_id: String,
    pub storage_class: String,
}

/// What the rules do to the histories of a listing.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct HistoryVerdict {
    pub removals: Vec<Removal>,
    pub transitions: Vec<VersionTransition>,
}

/// A version the rules remove: its key, its id, and whether it is the key's latest version (a
/// delete marker left alone); any other is a noncurrent version, to be left if it has become
/// the latest by the time it is removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removal {
    pub key: String,
    pub version_id: String,
    pub latest: bool,
}

/// Judges a version listing (key order, newest first within a key, as listings give it) one
/// key's history at a time, as [`history_removals`] and [`history_transitions`] do, while
/// it is read page by page.
pub struct HistoryJudge<'r> {
    rules: &'r [Rule],
    now_ms: i64,
    history: Vec<crate::VersionSummary>,
    verdict: HistoryVerdict,
}

impl<'r> HistoryJudge<'r> {
    pub fn new(rules: &'r [Rule], now_ms: i64) -> Self {
        Self {
            rules,
            now_ms,
            history: Vec::new(),
            verdict: HistoryVerdict::default(),
        }
    }

    /// The next version of the listing.
    pub fn push(&mut self, v: crate::VersionSummary) {
        if self
            .history
            .first()
            .is_some_and(|h| h.object.key != v.object.key)
        {
            self.judge();
        }
        self.history.push(v);
    }

    /// What the rules do to the whole listing.
    pub fn finish(mut self) -> HistoryVerdict {
        self.judge();
        self.verdict
    }

    fn judge(&mut self) {
        let Some(latest) = self.history.first() else {
            return;
        };
        let key = &latest.object.key;
        let removed = history_removals(self.rules, key, &self.history, self.now_ms);
        for (version_id, storage_class) in
            history_transitions(self.rules, key, &self.history, &removed, self.now_ms)
        {
            self.verdict.transitions.push(VersionTransition {
                key: key.clone(),
                version_id,
                storage_class,
            });
        }
        for id in removed {
            self.verdict.removals.push(Removal {
                key: key.clone(),
                latest: latest.version_id == id,
                version_id: id,
            });
        }
        self.history.clear();
    }
}

/// The action of the first matching rule that acts, S3-style: expiration wins over
/// transition; among transitions the latest reached one applies, and only to a colder class.
pub fn evaluate(
    rules: &[Rule],
    key: &str,
    size: u64,
    tags: &[(String, String)],
    created_ms: i64,
    class: &str,
    now_ms: i64,
) -> Action {
    let mut best: Option<&Transition> = None;
    for r in rules.iter().filter(|r| r.matches(key, size, tags)) {
        if r.expiration
            .as_ref()
            .is_some_and(|w| w.reached(created_ms, now_ms))
        {
            return Action::Expire;
        }
        for t in r
            .transitions
            .iter()
            .filter(|t| t.when.reached(created_ms, now_ms))
        {
            if best.is_none_or(|b| t.when.order_key() > b.when.order_key()) {
                best = Some(t);
            }
        }
    }
    match best {
        Some(t) if class_rank(&t.storage_class) > class_rank(class) => {
            Action::Transition(t.storage_class.clone())
        }
        _ => Action::Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ObjectSummary, VersionSummary};

    const DAY: i64 = 86_400_000;

    /// A key's history, newest first: (id, written on day, delete marker).
    fn history(vs: &[(&str, i64, bool)]) -> Vec<VersionSummary> {
        vs.iter()
            .enumerate()
            .map(|(i, (id, day, marker))| VersionSummary {
                object: ObjectSummary {
                    key: "data/k".into(),
                    size: if *marker { 0 } else { 100 },
                    etag: String::new(),
                    last_modified_ms: day * DAY,
                    checksum: None,
                    storage_class: None,
                },
                version_id: id.to_string(),
                is_latest: i == 0,
                delete_marker: *marker,
                lock: None,
                acl: None,
                tags: Vec::new(),
            })
            .collect()
    }

    fn noncurrent(days: u32, newer_versions: Option<u32>) -> Rule {
        Rule {
            id: "nc".into(),
            enabled: true,
            prefix: "data/".into(),
            noncurrent_expiration: Some(NoncurrentExpiration {
                days,
                newer_versions,
            }),
            ..Default::default()
        }
    }

    #[test]
    fn noncurrent_versions_expire_counted_from_their_successor() {
        // v3 (current, day 10), v2 (noncurrent since day 10), v1 (since day 5).
        let h = history(&[("v3", 10, false), ("v2", 5, false), ("v1", 1, false)]);
        let rules = [noncurrent(3, None)];
        assert!(history_removals(&rules, "data/k", &h, 7 * DAY).is_empty());
        assert_eq!(history_removals(&rules, "data/k", &h, 8 * DAY), ["v1"]);
        assert_eq!(
            history_removals(&rules, "data/k", &h, 13 * DAY),
            ["v2", "v1"]
        );
        // The newest noncurrent version is kept whatever its age.
        let keep_one = [noncurrent(3, Some(1))];
        assert_eq!(history_removals(&keep_one, "data/k", &h, 99 * DAY), ["v1"]);
        // Other prefixes, disabled rules and the current version are never touched.
        assert!(history_removals(&rules, "other/k", &h, 99 * DAY).is_empty());
        let mut off = noncurrent(3, None);
        off.enabled = false;
        assert!(history_removals(&[off], "data/k", &h, 99 * DAY).is_empty());
    }

    #[test]
    fn a_listing_is_judged_key_by_key() {
        let mut listing = history(&[("a2", 10, false), ("a1", 1, false)]);
        let mut b = history(&[("m1", 10, true)]);
        b[0].object.key = "data/l".into();
        listing.extend(b);
        let rules = [
            noncurrent(1, None),
            Rule {
                id: "m".into(),
                enabled: true,
                prefix: "data/".into(),
                expired_delete_markers: true,
                ..Default::default()
            },
        ];
        let mut judge = HistoryJudge::new(&rules, 20 * DAY);
        for v in listing {
            judge.push(v);
        }
        let removal = |key: &str, id: &str, latest| Removal {
            key: key.into(),
            version_id: id.into(),
            latest,
        };
        assert_eq!(
            judge.finish().removals,
            [
                removal("data/k", "a1", false),
                removal("data/l", "m1", true)
            ]
        );
    }

    #[test]
    fn a_delete_marker_goes_once_it_is_alone() {
        let markers = Rule {
            id: "m".into(),
            enabled: true,
            prefix: "data/".into(),
            expired_delete_markers: true,
            ..Default::default()
        };
        let h = history(&[("m1", 10, true), ("v1", 1, false)]);
        assert!(
            history_removals(std::slice::from_ref(&markers), "data/k", &h, 99 * DAY).is_empty()
        );
        // With the version under it expiring in the same pass, the marker goes too.
        let both = [markers.clone(), noncurrent(1, None)];
        assert_eq!(
            history_removals(&both, "data/k", &h, 11 * DAY),
            ["v1", "m1"]
        );
        let alone = history(&[("m1", 10, true)]);
        assert_eq!(
            history_removals(&[markers], "data/k", &alone, 10 * DAY),
            ["m1"]
        );
        // A noncurrent delete marker is a noncurrent version like any other.
        let h = history(&[("v2", 10, false), ("m1", 5, true), ("v1", 1, false)]);
        assert_eq!(
            history_removals(&[noncurrent(1, None)], "data/k", &h, 11 * DAY),
            ["m1", "v1"]
        );
    }

    fn moving(days: u32, newer_versions: Option<u32>, class: &str) -> NoncurrentTransition {
        NoncurrentTransition {
            days,
            newer_versions,
            storage_class: class.into(),
        }
    }

    #[test]
    fn noncurrent_versions_move_colder_counted_from_their_successor() {
        // v3 (current, day 10), v2 (noncurrent since day 10), m1 (a marker), v1 (since day 4).
        let h = history(&[
            ("v3", 10, false),
            ("v2", 6, false),
            ("m1", 4, true),
            ("v1", 1, false),
        ]);
        let rule = Rule {
            id: "cold".into(),
            enabled: true,
            prefix: "data/".into(),
            noncurrent_transitions: vec![
                moving(2, None, "STANDARD_IA"),
                moving(30, None, "GLACIER_IR"),
            ],
            ..Default::default()
        };
        let rules = std::slice::from_ref(&rule);
        let moves = |now: i64, removed: &[String]| {
            history_transitions(rules, "data/k", &h, removed, now * DAY)
        };
        let to = |id: &str, class: &str| (id.to_string(), class.to_string());
        assert!(moves(5, &[]).is_empty());
        // The marker never moves; v1 noncurrent since day 4 (m1's time).
        assert_eq!(moves(6, &[]), [to("v1", "STANDARD_IA")]);
        assert_eq!(
            moves(12, &[]),
            [to("v2", "STANDARD_IA"), to("v1", "STANDARD_IA")]
        );
        // The step with the most days reached applies; a version removed in the same pass
        // does not move.
        assert_eq!(moves(34, &["v2".into()]), [to("v1", "GLACIER_IR")]);
        // Never warmer, nor to the class it has.
        let mut cold = h.clone();
        cold[1].object.storage_class = Some("GLACIER_IR".into());
        cold[3].object.storage_class = Some("STANDARD_IA".into());
        assert_eq!(
            history_transitions(rules, "data/k", &cold, &[], 12 * DAY),
            Vec::<(String, String)>::new()
        );
        // NewerNoncurrentVersions keeps the newest noncurrent ones where they are (m1 counts).
        let keep = Rule {
            noncurrent_transitions: vec![moving(2, Some(2), "STANDARD_IA")],
            ..rule.clone()
        };
        assert_eq!(
            history_transitions(&[keep], "data/k", &h, &[], 99 * DAY),
            [to("v1", "STANDARD_IA")]
        );
        // The judge gives both: an expiration wins over a transition of the same version.
        let both = Rule {
            noncurrent_expiration: Some(NoncurrentExpiration {
                days: 20,
                newer_versions: None,
            }),
            ..rule
        };
        let mut judge = HistoryJudge::new(std::slice::from_ref(&both), 26 * DAY);
        for v in h.clone() {
            judge.push(v);
        }
        let verdict = judge.finish();
        let removed: Vec<&str> = verdict
            .removals
            .iter()
            .map(|r| r.version_id.as_str())
            .collect();
        assert_eq!(removed, ["m1", "v1"]);
        assert_eq!(
            verdict.transitions,
            [VersionTransition {
                key: "data/k".into(),
                version_id: "v2".into(),
                storage_class: "STANDARD_IA".into(),
            }]
        );
    }

    #[test]
    fn history_is_listed_under_the_acting_rules_prefixes_only() {
        let rule = |prefix: &str, acting: bool| Rule {
            id: prefix.into(),
            enabled: true,
            prefix: prefix.into(),
            expired_delete_markers: acting,
            ..Default::default()
        };
        let rules = [
            rule("logs/2026/", true),
            rule("data/", true),
            rule("logs/", true),
            rule("tmp/", false),
            rule("datasets/", true),
        ];
        assert_eq!(history_prefixes(&rules), ["data/", "datasets/", "logs/"]);
        assert_eq!(history_prefixes(&[rule("a/", true), rule("", true)]), [""]);
        assert!(history_prefixes(&[rule("", false)]).is_empty());
    }
}
