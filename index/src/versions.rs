//! Column family `versions`: the history of keys in versioned buckets. A key's current
//! version stays in `objects` (so GET, listings, batch reads and streams never look here);
//! the versions it replaced, and delete markers, live here under the key and the complement
//! of their sequence, newest first. A key whose newest version is a delete marker has no
//! entry in `objects`. Buckets that never had versioning have nothing here.

use crate::layout::{
    escaped_object_key, object_key, prefix_successor, scan_upper_bound, split_version_key,
    version_key, versions_prefix,
};
use crate::records::ObjectRecord;
use crate::{CF_OBJECTS, CF_VERSIONS, IndexError, Result, RocksIndex, records};
use rocksdb::ReadOptions;

/// Where a version listing resumes: after every version of `key` (S3's key-marker alone),
/// or after one version of it (key-marker and version-id-marker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionCursor {
    AfterKey(String),
    /// After the key's current version (in `objects`).
    AfterCurrent(String),
    /// After the key's version of this sequence (in `versions`).
    AfterSeq(String, u64),
}

/// One page of a version listing: (key, record, whether it is the key's latest version), in
/// key order and newest first within a key.
#[derive(Debug, Default)]
pub struct VersionListPage {
    pub versions: Vec<(String, ObjectRecord, bool)>,
    pub common_prefixes: Vec<String>,
    pub truncated: bool,
    /// Where the next page starts.
    pub next: Option<VersionCursor>,
}

fn corrupt(reason: impl Into<String>) -> IndexError {
    IndexError::Corrupt {
        cf: CF_VERSIONS,
        reason: reason.into(),
    }
}

fn decode(v: &[u8]) -> Result<ObjectRecord> {
    records::decode(v).map_err(corrupt)
}

/// Adds to `page` the entries of `key` in `versions` from where `vers` stands, newest first
/// (the first of them the key's latest if `latest`); false once the page is full.
fn push_kept_versions(
    vers: &mut rocksdb::DBRawIterator,
    key: &str,
    mut latest: bool,
    page: &mut VersionListPage,
    max: usize,
) -> Result<bool> {
    while let (Some(raw), Some(v)) = (vers.key(), vers.value()) {
        let (_, k, seq) = split_version_key(raw).ok_or_else(|| corrupt("bad key"))?;
        if k != key {
            break;
        }
        if page.is_full(max) {
            page.truncated = true;
            return Ok(false);
        }
        page.next = Some(VersionCursor::AfterSeq(k.clone(), seq));
        page.versions.push((k, decode(v)?, latest));
        latest = false;
        vers.next();
    }
    Ok(true)
}

impl VersionListPage {
    fn is_full(&self, max: usize) -> bool {
        self.versions.len() + self.common_prefixes.len() >= max
    }
}

impl RocksIndex {
    /// One noncurrent version or delete marker of a key.
    pub fn get_version(&self, bucket_id: u64, key: &str, seq: u64) -> Result<Option<ObjectRecord>> {
        self.get_decoded(CF_VERSIONS, &version_key(bucket_id, key, seq))
    }

    /// The key's versions in `versions` (not its current one), newest first, at most `max`.
    pub fn key_versions(&self, bucket_id: u64, key: &str, max: usize) -> Result<Vec<ObjectRecord>> {
        let prefix = versions_prefix(bucket_id, key);
        let mut ro = ReadOptions::default();
        if let Some(upper) = prefix_successor(&prefix) {
            ro.set_iterate_upper_bound(upper);
        }
        let mut it = self.db.raw_iterator_cf_opt(self.cf(CF_VERSIONS), ro);
        it.seek(&prefix);
        let mut out = Vec::new();
        while out.len() < max {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            debug_assert!(k.starts_with(&prefix));
            out.push(decode(v)?);
            it.next();
        }
        it.status()?;
        Ok(out)
    }

    /// Lists the versions of a bucket's keys that start with `prefix`, from `after`: for each
    /// key, its current version (from `objects`) then its older ones (from `versions`), newest
    /// first; keys with `delimiter` after the prefix rolled up into common prefixes. At most
    /// `max` versions plus common prefixes.
    pub fn list_versions(
        &self,
        bucket_id: u64,
        prefix: &str,
        delimiter: Option<&str>,
        after: Option<&VersionCursor>,
        max: usize,
    ) -> Result<VersionListPage> {
        let delimiter = delimiter.filter(|d| !d.is_empty());
        let iter = |cf: &'static str, upper: Vec<u8>| {
            let mut ro = ReadOptions::default();
            ro.set_iterate_upper_bound(upper);
            self.db.raw_iterator_cf_opt(self.cf(cf), ro)
        };
        let mut objs = iter(
            CF_OBJECTS,
            scan_upper_bound(bucket_id, &object_key(bucket_id, prefix)),
        );
        let mut vers = iter(
            CF_VERSIONS,
            scan_upper_bound(bucket_id, &escaped_object_key(bucket_id, prefix)),
        );
        let mut page = VersionListPage::default();
        let (cut_key, from_seq) = match after {
            None => (None, None),
            Some(VersionCursor::AfterKey(k)) => (Some(k.as_str()), None),
            Some(VersionCursor::AfterCurrent(k)) => (Some(k.as_str()), Some(None)),
            Some(VersionCursor::AfterSeq(k, s)) => (Some(k.as_str()), Some(Some(*s))),
        };
        match cut_key {
            Some(k) if k.as_bytes() >= prefix.as_bytes() => {
                // The rest of the versions of a key the cursor cut, before any other key:
                // after its current one, all of them; after a kept one, the older ones
                // (sequences below it, which sort after it).
                if let Some(from) = from_seq
                    && k.starts_with(prefix)
                {
                    let mut start = versions_prefix(bucket_id, k);
                    if let Some(s) = from {
                        start.extend_from_slice(&(!s.saturating_sub(1)).to_be_bytes());
                    }
                    vers.seek(&start);
                    if !push_kept_versions(&mut vers, k, false, &mut page, max)? {
                        return Ok(page);
                    }
                }
                // Then the first key after it, in both families: in `versions`, past the
                // key's own entries (ended by 0x00 0x00) and before any longer key's.
                let mut o = object_key(bucket_id, k);
                o.push(0);
                objs.seek(&o);
                let mut v = escaped_object_key(bucket_id, k);
                v.extend_from_slice(&[0, 1]);
                vers.seek(&v);
            }
            _ => {
                objs.seek(object_key(bucket_id, prefix));
                vers.seek(escaped_object_key(bucket_id, prefix));
            }
        }
        loop {
            // The smallest key left in either family (both are in key order).
            let next_obj = match objs.key() {
                Some(k) => Some(
                    std::str::from_utf8(&k[8..])
                        .map_err(|_| corrupt("key is not UTF-8"))?
                        .to_string(),
                ),
                None => None,
            };
            let next_ver = match vers.key() {
                Some(k) => Some(split_version_key(k).ok_or_else(|| corrupt("bad key"))?.1),
                None => None,
            };
            let key = match (next_obj.as_ref(), next_ver.as_ref()) {
                (None, None) => break,
                (Some(o), None) => o.clone(),
                (None, Some(v)) => v.clone(),
                (Some(o), Some(v)) => o.min(v).clone(),
            };
            if let Some(d) = delimiter
                && let Some(pos) = key[prefix.len()..].find(d)
            {
                let cp = key[..prefix.len() + pos + d.len()].to_string();
                if cut_key.is_none_or(|a| cp.as_str() > a) {
                    if page.is_full(max) {
                        page.truncated = true;
                        return Ok(page);
                    }
                    page.next = Some(VersionCursor::AfterKey(cp.clone()));
                    page.common_prefixes.push(cp.clone());
                }
                // Every key under the common prefix is skipped.
                let Some(o) = prefix_successor(&object_key(bucket_id, &cp)) else {
                    break;
                };
                objs.seek(&o);
                match prefix_successor(&escaped_object_key(bucket_id, &cp)) {
                    Some(v) => vers.seek(&v),
                    None => break,
                }
                continue;
            }
            let has_current = next_obj.as_ref() == Some(&key);
            if has_current {
                if page.is_full(max) {
                    page.truncated = true;
                    return Ok(page);
                }
                let rec: ObjectRecord =
                    records::decode(objs.value().unwrap_or_default()).map_err(|reason| {
                        IndexError::Corrupt {
                            cf: CF_OBJECTS,
                            reason,
                        }
                    })?;
                page.next = Some(VersionCursor::AfterCurrent(key.clone()));
                page.versions.push((key.clone(), rec, true));
                objs.next();
            }
            if !push_kept_versions(&mut vers, &key, !has_current, &mut page, max)? {
                return Ok(page);
            }
        }
        objs.status()?;
        vers.status()?;
        Ok(page)
    }
}

#[cfg(test)]
mod tests {
    use crate::ObjectOp;
    use crate::testing::*;

    fn ver(size: u64, seq: u64, marker: bool) -> ObjectRecord {
        ObjectRecord {
            version_seq: seq,
            version_flags: if marker {
                crate::records::VERSION_DELETE_MARKER
            } else {
                0
            },
            ..obj(size)
        }
    }

    fn put_version(i: &RocksIndex, key: &str, rec: ObjectRecord) {
        i.apply_object_ops(&[&ObjectOp::PutVersion {
            bucket_id: 1,
            key: key.into(),
            record: Box::new(rec),
        }])
        .unwrap();
    }

    /// A listing read page by page gives every version once, in key order and newest first,
    /// with exactly one latest per key; keys that extend another with 0x00 stay apart.
    #[test]
    fn versions_list_in_order_across_pages() {
        let (_d, i) = idx();
        // "a": current (seq 30) over 20 and 10; "a\0x": only a delete marker (latest);
        // "b/c": current only; "d": delete marker (latest) over an object.
        i.put_object(1, "a", &ver(3, 30, false)).unwrap();
        put_version(&i, "a", ver(2, 20, false));
        put_version(&i, "a", ver(1, 10, false));
        put_version(&i, "a\0x", ver(0, 5, true));
        i.put_object(1, "b/c", &ver(4, 40, false)).unwrap();
        put_version(&i, "d", ver(0, 60, true));
        put_version(&i, "d", ver(5, 50, false));
        // Another bucket never shows.
        i.put_object(2, "a", &ver(9, 90, false)).unwrap();
        let want: Vec<(String, u64, bool)> = vec![
            ("a".into(), 30, true),
            ("a".into(), 20, false),
            ("a".into(), 10, false),
            ("a\0x".into(), 5, true),
            ("b/c".into(), 40, true),
            ("d".into(), 60, true),
            ("d".into(), 50, false),
        ];
        for page_size in 1..=8 {
            let mut got = Vec::new();
            let mut after = None;
            loop {
                let p = i
                    .list_versions(1, "", None, after.as_ref(), page_size)
                    .unwrap();
                assert!(p.versions.len() <= page_size);
                got.extend(
                    p.versions
                        .iter()
                        .map(|(k, r, l)| (k.clone(), r.version_seq, *l)),
                );
                if !p.truncated {
                    break;
                }
                after = p.next;
            }
            assert_eq!(got, want, "page size {page_size}");
        }
        // A delimiter rolls "b/" up; a prefix narrows.
        let p = i.list_versions(1, "", Some("/"), None, 100).unwrap();
        assert_eq!(p.common_prefixes, vec!["b/".to_string()]);
        assert_eq!(p.versions.len(), 6);
        let p = i.list_versions(1, "d", None, None, 100).unwrap();
        assert_eq!(p.versions.len(), 2);
        assert_eq!(i.key_versions(1, "a", 10).unwrap().len(), 2);
        assert_eq!(i.key_versions(1, "a\0x", 10).unwrap().len(), 1);
        assert_eq!(i.get_version(1, "a", 20).unwrap().map(|r| r.size), Some(2));
        // A bucket with versions left is not empty.
        let b = i
            .create_bucket("vb", |id| crate::BucketRecord {
                id,
                name: "vb".into(),
                ..Default::default()
            })
            .unwrap();
        i.apply_object_ops(&[&ObjectOp::PutVersion {
            bucket_id: b.id,
            key: "k".into(),
            record: Box::new(ver(0, 1, true)),
        }])
        .unwrap();
        assert!(matches!(
            i.delete_bucket("vb"),
            Err(IndexError::BucketNotEmpty)
        ));
    }
}
