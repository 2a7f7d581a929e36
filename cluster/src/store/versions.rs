//! ListObjectVersions through a gateway: one page per node, each PG listed once (as object
//! listings are), merged in key order. A key's versions all live on its PG's chain, so they
//! come from one node, newest first, and are taken as that node sent them.

use super::*;
use crate::wire::Call;
use crate::wire::{WireVersionEntry, WireVersionPage, encode};
use packrat_store_api::{Bucket, StoreResult, VersionPage, VersionQuery, VersionSummary};

impl ClusterStore {
    pub(super) async fn versions_page(
        &self,
        bucket: &Bucket,
        query: &VersionQuery,
    ) -> StoreResult<VersionPage> {
        let map = self.map();
        let by_node = listing_plan(&map)?;
        let max = query.max_keys.max(1);
        let mut tail = format!("&max={max}&prefix={}", encode(&query.prefix));
        if let Some(d) = &query.delimiter {
            tail.push_str(&format!("&delimiter={}", encode(d)));
        }
        if let Some(k) = &query.key_marker {
            tail.push_str(&format!("&key={}", encode(k)));
            if let Some(v) = &query.version_id_marker {
                tail.push_str(&format!("&vid={}", encode(v)));
            }
        }
        let pages: Vec<WireVersionPage> = self
            .ask_nodes(&map, &format!("/lv/{}", bucket.id), &by_node, &tail)
            .await?;
        // Entries are valid up to the smallest last key of a truncated page (that key's
        // versions too: a key's versions come from one node, in order).
        let limit: Option<String> = pages
            .iter()
            .filter(|p| p.truncated)
            .filter_map(|p| p.entries.last().map(|e| e.entry.key.clone()))
            .min();
        let any_truncated = pages.iter().any(|p| p.truncated);
        let mut entries: Vec<WireVersionEntry> =
            pages.into_iter().flat_map(|p| p.entries).collect();
        // Stable: a key's versions keep their node's order.
        entries.sort_by(|a, b| a.entry.key.cmp(&b.entry.key));
        entries.dedup_by(|a, b| a.entry.prefix && b.entry.prefix && a.entry.key == b.entry.key);
        let mut page = VersionPage::default();
        let mut taken = 0;
        let mut last: Option<&WireVersionEntry> = None;
        for e in &entries {
            if limit.as_ref().is_some_and(|l| e.entry.key > *l) || taken == max {
                break;
            }
            taken += 1;
            if e.entry.prefix {
                page.common_prefixes.push(e.entry.key.clone());
            } else {
                page.versions.push(VersionSummary {
                    // A delete marker's summary is as the node's store lists it.
                    object: e.entry.summary(),
                    version_id: e.version_id.clone(),
                    is_latest: e.latest,
                    delete_marker: e.marker,
                    lock: e.lock.clone(),
                    tags: e.tags.clone(),
                    acl: e.acl.clone(),
                });
            }
            last = Some(e);
        }
        page.truncated = taken < entries.len() || any_truncated;
        if page.truncated
            && let Some(e) = last
        {
            page.next_key_marker = Some(e.entry.key.clone());
            if !e.entry.prefix {
                page.next_version_id_marker = Some(e.version_id.clone());
            }
        }
        Ok(page)
    }
}

impl ClusterStore {
    /// A change of one version's attributes by id: in a bucket with versioning a step of the
    /// key's history (`PUT /o/..?QUERY&version=ID` with `body`), where the head checks the
    /// version is there and every member edits its copy in place, as a lock change does; in
    /// one without, every object is its key's `null` version (no other exists) and the change
    /// is `edit` of it. `false` when there is no such version.
    pub(super) async fn change_version(
        &self,
        bucket: &Bucket,
        key: &str,
        version_id: &str,
        edit: AttrEdit,
        query: &str,
        body: Bytes,
    ) -> StoreResult<bool> {
        if version_id != "null" && version_seq(version_id).is_none() {
            return Err(StoreError::Invalid("Invalid version id specified".into()));
        }
        if bucket.versioning == Versioning::Unversioned {
            if version_id != "null" {
                return Ok(false);
            }
            return match self
                .update_object(bucket, key, &WriteCondition::default(), edit)
                .await
            {
                Ok(_) => Ok(true),
                Err(StoreError::NoSuchKey) => Ok(false),
                Err(e) => Err(e),
            };
        }
        let pg = pg_of(bucket.id, key, self.map().pgs);
        let path = format!(
            "/o/{}/{pg}/{}?{query}&version={}",
            bucket.id,
            encode(key),
            encode(version_id)
        );
        let (ans, _) = self
            .call(
                pg,
                Target::Head,
                Call {
                    method: Method::PUT,
                    path: &path,
                    headers: &[],
                    body,
                },
            )
            .await?;
        match ans.status {
            200 => Ok(true),
            404 => match ans.error().await {
                StoreError::NoSuchKey => Ok(false),
                e => Err(e),
            },
            _ => Err(ans.error().await),
        }
    }
}
