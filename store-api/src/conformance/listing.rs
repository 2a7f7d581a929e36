//! Listings: pages against a model, and what a listing shows of an object.

use super::*;

pub(super) fn b64(raw: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(raw)
}

/// Lists `bucket` page by page and returns every key and common prefix, in order.
pub async fn list_all(
    store: &dyn Store,
    b: &Bucket,
    prefix: &str,
    delimiter: Option<&str>,
    page: usize,
) -> (Vec<String>, Vec<String>) {
    let (mut keys, mut prefixes) = (Vec::new(), Vec::new());
    let mut after = None;
    for _ in 0..10_000 {
        let p = store
            .list_objects(
                b,
                &ListQuery {
                    prefix: prefix.into(),
                    delimiter: delimiter.map(str::to_string),
                    after: after.clone(),
                    max_keys: page,
                },
            )
            .await
            .unwrap();
        assert!(
            p.objects.len() + p.common_prefixes.len() <= page,
            "a page holds at most max_keys entries"
        );
        keys.extend(p.objects.into_iter().map(|o| o.key));
        prefixes.extend(p.common_prefixes);
        if !p.truncated {
            return (keys, prefixes);
        }
        after = p.last;
        assert!(after.is_some(), "a truncated page says where it ended");
    }
    panic!("listing did not end");
}

/// What a listing must answer, worked out from the set of keys.
pub fn list_model(
    keys: &BTreeSet<String>,
    prefix: &str,
    delimiter: Option<&str>,
) -> (Vec<String>, Vec<String>) {
    let (mut out, mut prefixes) = (Vec::new(), BTreeSet::new());
    for k in keys.iter().filter(|k| k.starts_with(prefix)) {
        match delimiter.and_then(|d| k[prefix.len()..].find(d).map(|i| (i, d.len()))) {
            Some((i, dl)) => {
                prefixes.insert(k[..prefix.len() + i + dl].to_string());
            }
            None => out.push(k.clone()),
        }
    }
    (out, prefixes.into_iter().collect())
}

/// Listings, page by page, equal the model for random key sets, prefixes, delimiters and
/// page sizes (proptest; a failure shrinks to a small key set).
pub fn listing_matches_model(rt: &tokio::runtime::Runtime, store: &dyn Store) {
    use proptest::prelude::*;
    let key = proptest::string::string_regex("[ab/]{1,6}").unwrap();
    let strategy = (
        proptest::collection::btree_set(key, 0..40),
        proptest::string::string_regex("[ab/]{0,2}").unwrap(),
        proptest::option::of(prop_oneof![Just("/".to_string()), Just("b".to_string())]),
        1usize..7,
    );
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 24,
        ..ProptestConfig::default()
    });
    runner
        .run(&strategy, |(keys, prefix, delimiter, page)| {
            rt.block_on(async {
                let b = new_bucket(store, "list").await;
                for k in &keys {
                    put(store, &b, k, k.as_bytes()).await;
                }
                let got = list_all(store, &b, &prefix, delimiter.as_deref(), page).await;
                let want = list_model(&keys, &prefix, delimiter.as_deref());
                prop_assert_eq!(got, want);
                Ok(())
            })
        })
        .unwrap_or_else(|e| panic!("listing differs from the model: {e}"));
}

/// Listing summaries carry what was stored.
pub async fn listing_summaries(store: &dyn Store) {
    let b = new_bucket(store, "summary").await;
    let mut want = BTreeMap::new();
    for (i, k) in ["a", "b/c", "d"].into_iter().enumerate() {
        let info = put(store, &b, k, &payload(100 + i, 1)).await;
        want.insert(k.to_string(), info);
    }
    let p = store
        .list_objects(
            &b,
            &ListQuery {
                max_keys: 1000,
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(!p.truncated);
    assert_eq!(p.objects.len(), 3);
    for o in &p.objects {
        let w = &want[&o.key];
        assert_eq!((o.size, &o.etag), (w.size, &w.etag), "{}", o.key);
        assert_eq!(o.storage_class, None);
    }
}
