//! The requests of packrat's batch extensions, parsed and resolved without touching storage:
//! the batch GET JSON body, item ranges and shard specs. What they resolve to, and the fixed
//! hash and shuffle of epoch streams, are in `packrat_store_api::batch`. Pure functions,
//! fuzzed (`fuzz/fuzz_targets/batch_request.rs`).

pub use packrat_store_api::batch::ItemRange;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    pub items: Vec<BatchItem>,
    #[serde(default)]
    pub order: Order,
    #[serde(default)]
    pub on_error: OnError,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchItem {
    pub key: String,
    pub range: Option<String>,
    pub member: Option<String>,
    pub tag: Option<String>,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Order {
    #[default]
    Request,
    Storage,
}

#[derive(Debug, Default, Deserialize, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum OnError {
    #[default]
    Continue,
    Abort,
}

pub fn parse_item_range(spec: &str) -> Result<ItemRange, String> {
    let bad = || format!("the range {spec:?} is not of the form bytes=A-B, bytes=A- or bytes=-N");
    let r = spec.trim().strip_prefix("bytes=").ok_or_else(bad)?;
    if r.contains(',') {
        return Err(format!(
            "the range {spec:?} has several ranges; an item takes one"
        ));
    }
    let (a, b) = r.split_once('-').ok_or_else(bad)?;
    let num = |s: &str| s.trim().parse::<u64>().map_err(|_| bad());
    match (a.trim().is_empty(), b.trim().is_empty()) {
        (true, true) => Err(bad()),
        (true, false) => match num(b)? {
            0 => Err(format!("the range {spec:?} is empty")),
            n => Ok(ItemRange::Suffix(n)),
        },
        (false, true) => Ok(ItemRange::From(num(a)?, None)),
        (false, false) => {
            let (a, b) = (num(a)?, num(b)?);
            if b < a {
                return Err(format!("the range {spec:?} ends before it starts"));
            }
            Ok(ItemRange::From(a, Some(b)))
        }
    }
}

pub fn parse_shard(s: &str) -> Option<(u64, u64)> {
    let (i, n) = s.split_once('/')?;
    let (i, n): (u64, u64) = (i.parse().ok()?, n.parse().ok()?);
    (n >= 1 && i < n).then_some((i, n))
}
