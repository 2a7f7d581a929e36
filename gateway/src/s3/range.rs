//! Range headers: one S3 range (`bytes=a-b`, `bytes=a-`, `bytes=-n`) resolved as S3 does
//! (a malformed header is ignored, an unsatisfiable one is 416), and several ranges for
//! packrat's multi-range GET. Pure functions, fuzzed (`fuzz/fuzz_targets/range.rs`).

use super::error::{S3Error, S3ErrorCode, S3Result};

fn err(code: S3ErrorCode, msg: impl Into<String>) -> S3Error {
    S3Error::new(code, msg)
}

/// A parsed single `Range` header, resolved against the object size: `[start, end)`.
/// `Ok(None)` means serve the whole object (no header, or one S3 ignores).
pub fn resolve_range(header: Option<&str>, size: u64) -> S3Result<Option<(u64, u64)>> {
    let Some(h) = header else { return Ok(None) };
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        // Several ranges are served by `multi_ranges` as multipart/byteranges.
        return Ok(None);
    }
    match resolve_one(spec, size) {
        RangeOutcome::Invalid => Ok(None),
        RangeOutcome::Unsatisfiable => Err(unsatisfiable(size)),
        RangeOutcome::Range(r) => Ok(Some(r)),
    }
}

/// Most ranges one multi-range GET may ask for.
const MULTI_RANGES_MAX: usize = 256;

enum RangeOutcome {
    Invalid,
    Unsatisfiable,
    Range((u64, u64)),
}

fn unsatisfiable(size: u64) -> S3Error {
    err(
        S3ErrorCode::InvalidRange,
        "The requested range is not satisfiable",
    )
    .with_header("content-range", format!("bytes */{size}"))
}

/// Several ranges (`bytes=0-99,4096-8191`), a packrat extension: `Some` with the satisfiable
/// ranges in request order when the header names more than one range, all of them valid
/// (RFC 9110: an invalid range set is ignored, and the whole object is served).
pub fn multi_ranges(header: Option<&str>, size: u64) -> S3Result<Option<Vec<(u64, u64)>>> {
    let Some(spec) = header.and_then(|h| h.trim().strip_prefix("bytes=")) else {
        return Ok(None);
    };
    if !spec.contains(',') {
        return Ok(None);
    }
    let specs: Vec<&str> = spec.split(',').map(str::trim).collect();
    if specs.len() > MULTI_RANGES_MAX {
        return Err(err(
            S3ErrorCode::InvalidArgument,
            format!("at most {MULTI_RANGES_MAX} ranges may be asked for in one request"),
        ));
    }
    let mut ranges = Vec::with_capacity(specs.len());
    for one in specs {
        match resolve_one(one, size) {
            RangeOutcome::Invalid => return Ok(None),
            RangeOutcome::Unsatisfiable => {}
            RangeOutcome::Range(r) => ranges.push(r),
        }
    }
    if ranges.is_empty() {
        return Err(unsatisfiable(size));
    }
    Ok(Some(coalesce(ranges)))
}

/// Ranges in request order, unless two overlap: then all of them sorted with overlapping and
/// adjacent ones merged (RFC 9110 section 14.2 lets a server coalesce), so one request never asks for the
/// same bytes twice and an answer is at most the object's size plus the part headers (256
/// copies of one range were 256 times the bytes).
fn coalesce(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut sorted = ranges.clone();
    sorted.sort_unstable();
    if sorted.windows(2).all(|w| w[0].1 <= w[1].0) {
        return ranges;
    }
    ranges.clear();
    for (a, b) in sorted {
        match ranges.last_mut() {
            Some(last) if a <= last.1 => last.1 = last.1.max(b),
            _ => ranges.push((a, b)),
        }
    }
    ranges
}

/// One `first-last`, `first-` or `-suffix` range spec against an object of `size` bytes.
fn resolve_one(spec: &str, size: u64) -> RangeOutcome {
    let Some((a, b)) = spec.split_once('-') else {
        return RangeOutcome::Invalid;
    };
    let (a, b) = (a.trim(), b.trim());
    if a.is_empty() {
        return match b.parse::<u64>() {
            Ok(0) => RangeOutcome::Unsatisfiable,
            Ok(_) if size == 0 => RangeOutcome::Unsatisfiable,
            Ok(n) => RangeOutcome::Range((size.saturating_sub(n), size)),
            Err(_) => RangeOutcome::Invalid,
        };
    }
    let Ok(start) = a.parse::<u64>() else {
        return RangeOutcome::Invalid;
    };
    let end = if b.is_empty() {
        size
    } else {
        match b.parse::<u64>() {
            Ok(e) if e >= start => e.saturating_add(1).min(size),
            _ => return RangeOutcome::Invalid,
        }
    };
    if start >= size {
        return RangeOutcome::Unsatisfiable;
    }
    RangeOutcome::Range((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by `fuzz/fuzz_targets/range_headers.rs`: a last byte of u64::MAX overflowed `e + 1`
    /// (a panic in the request path with overflow checks on, a backwards range without).
    #[test]
    fn last_byte_at_u64_max_is_clamped_not_overflowed() {
        let max = u64::MAX.to_string();
        assert_eq!(
            resolve_range(Some(&format!("bytes=0-{max}")), 10).unwrap(),
            Some((0, 10))
        );
        assert_eq!(
            multi_ranges(Some(&format!("bytes=0-{max},12-13")), 10).unwrap(),
            Some(vec![(0, 10)])
        );
        assert_eq!(
            resolve_range(Some(&format!("bytes={max}-{max}")), u64::MAX)
                .unwrap_err()
                .code,
            S3ErrorCode::InvalidRange
        );
    }

    #[test]
    fn multi_range_sets() {
        assert_eq!(multi_ranges(Some("bytes=0-9"), 100).unwrap(), None);
        assert_eq!(
            multi_ranges(Some("bytes=50-59, 0-9, -5"), 100).unwrap(),
            Some(vec![(50, 60), (0, 10), (95, 100)])
        );
        // Overlapping ranges are merged, sorted.
        assert_eq!(
            multi_ranges(Some("bytes=0-9, 20-, -5"), 100).unwrap(),
            Some(vec![(0, 10), (20, 100)])
        );
        assert_eq!(
            multi_ranges(Some("bytes=30-39,0-9,5-14,15-19"), 100).unwrap(),
            Some(vec![(0, 20), (30, 40)])
        );
        let same = format!("bytes={}", vec!["0-"; 256].join(","));
        assert_eq!(
            multi_ranges(Some(&same), 100).unwrap(),
            Some(vec![(0, 100)])
        );
        assert_eq!(
            multi_ranges(Some("bytes=0-9,200-"), 100).unwrap(),
            Some(vec![(0, 10)])
        );
        assert_eq!(multi_ranges(Some("bytes=0-9,x-"), 100).unwrap(), None);
        assert_eq!(
            multi_ranges(Some("bytes=200-,300-"), 100).unwrap_err().code,
            S3ErrorCode::InvalidRange
        );
        let many = format!("bytes={}", vec!["0-0"; 300].join(","));
        assert_eq!(
            multi_ranges(Some(&many), 100).unwrap_err().code,
            S3ErrorCode::InvalidArgument
        );
    }

    #[test]
    fn ranges() {
        assert_eq!(
            resolve_range(Some("bytes=0-9"), 100).unwrap(),
            Some((0, 10))
        );
        assert_eq!(
            resolve_range(Some("bytes=90-"), 100).unwrap(),
            Some((90, 100))
        );
        assert_eq!(
            resolve_range(Some("bytes=-10"), 100).unwrap(),
            Some((90, 100))
        );
        assert_eq!(
            resolve_range(Some("bytes=-500"), 100).unwrap(),
            Some((0, 100))
        );
        assert_eq!(
            resolve_range(Some("bytes=50-500"), 100).unwrap(),
            Some((50, 100))
        );
        assert_eq!(resolve_range(Some("bytes=0-1,5-6"), 100).unwrap(), None);
        assert_eq!(resolve_range(Some("items=0-1"), 100).unwrap(), None);
        assert_eq!(resolve_range(Some("bytes=9-3"), 100).unwrap(), None);
        assert_eq!(
            resolve_range(Some("bytes=100-"), 100).unwrap_err().code,
            S3ErrorCode::InvalidRange
        );
        assert_eq!(
            resolve_range(Some("bytes=0-0"), 0).unwrap_err().code,
            S3ErrorCode::InvalidRange
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
        /// Range headers of any shape against any size: a range, none, or an S3 error.
        #[test]
        fn range_parsers_never_panic(h in "(bytes=)?[-0-9, ]{0,40}|\\PC{0,40}", size in 0u64..u64::MAX) {
            if let Ok(Some((a, b))) = resolve_range(Some(&h), size) {
                proptest::prop_assert!(a <= b && b <= size);
            }
            if let Ok(Some(v)) = multi_ranges(Some(&h), size) {
                for (a, b) in v {
                    proptest::prop_assert!(a < b && b <= size);
                }
            }
        }
    }
}
