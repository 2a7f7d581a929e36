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
