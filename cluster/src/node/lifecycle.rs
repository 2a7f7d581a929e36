//! Bucket lifecycle rules in a cluster: each node applies them to the PGs it heads, so every
//! object is looked at by one node. An expiration is a chain delete made only if the key still
//! has the version evaluated (a write that lands meanwhile is never expired by an older
//! judgement); a transition is a chain edit of the object's storage class, made on the same
//! condition (each member's own tier worker then moves its copy to its tier);
//! AbortIncompleteMultipartUpload is a chain abort. NoncurrentVersionExpiration and
//! ExpiredObjectDeleteMarker remove versions by id (a chain step each, as a client's removal
//! by id is), judged on the head's copy of each key's history; the head leaves a noncurrent
//! version alone if it has become the key's latest meanwhile. NoncurrentVersionTransition is
//! a chain edit of one version's storage class by id (the head leaves it if it has become
//! current); each member's tier worker moves its copy, as for objects.

use super::uploads::Step;
use super::{Fail, KeyAt, Node, cv_of, meta_of, now_micros, with_versions};
use crate::map::{ClusterMap, Etcd, bucket_records};
use crate::placement::pg_of;
use crate::wire::WireVersioning;
use packrat_store_api::lifecycle::{self, Action, Rule};
use packrat_store_api::{StoreError, UploadQuery, VersionQuery};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// When a node applies the lifecycle rules.
#[derive(Debug, Clone, Copy, Default)]
pub struct LifecycleSchedule {
    /// Between passes; zero: never.
    pub every: Duration,
    /// Rules are evaluated as if this many days had passed (tests and previews, as
    /// `packrat admin tier run --days-ahead` on one server); 0 in production.
    pub days_ahead: u32,
}

/// What one pass did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LifecyclePass {
    pub expired: usize,
    pub transitioned: usize,
    pub aborted: usize,
    /// Noncurrent versions and lone delete markers removed.
    pub versions_removed: usize,
    /// Noncurrent versions given a colder storage class.
    pub versions_transitioned: usize,
}

impl Node {
    /// Applies the buckets' lifecycle rules on `when`'s schedule for the node's life.
    pub async fn lifecycle_loop(self: Arc<Self>, etcd: Etcd, when: LifecycleSchedule) {
        if when.every.is_zero() {
            return;
        }
        loop {
            tokio::time::sleep(when.every).await;
            let now_ms = (now_micros() / 1000) as i64 + i64::from(when.days_ahead) * 86_400_000;
            match self.lifecycle_once(&etcd, now_ms).await {
                Ok(p) if p == LifecyclePass::default() => {}
                Ok(p) => tracing::info!(
                    expired = p.expired,
                    transitioned = p.transitioned,
                    uploads_aborted = p.aborted,
                    versions_removed = p.versions_removed,
                    versions_transitioned = p.versions_transitioned,
                    "lifecycle rules applied"
                ),
                Err(e) => tracing::warn!("lifecycle rules: {e}"),
            }
        }
    }

    /// One pass over the PGs this node heads, as of `now_ms`.
    pub async fn lifecycle_once(&self, etcd: &Etcd, now_ms: i64) -> Result<LifecyclePass, String> {
        let mut pass = LifecyclePass::default();
        let map = self.map.borrow().clone();
        let headed: HashSet<u32> = (0..map.pgs)
            .filter(|pg| map.chain(*pg).first() == Some(&self.id))
            .collect();
        if headed.is_empty() {
            return Ok(pass);
        }
        let records = bucket_records(etcd).await.map_err(|e| e.to_string())?;
        for rec in records {
            let Some(rules) = rec.lifecycle.filter(|r| r.iter().any(|r| r.enabled)) else {
                continue;
            };
            let (expired, transitioned) = self
                .expire_and_transition(&map, rec.id, rec.versioning, &rules, &headed, now_ms)
                .await
                .map_err(|e| format!("bucket {}: {e}", rec.name))?;
            pass.expired += expired;
            pass.transitioned += transitioned;
            if rec.versioning.is_some() && rules.iter().any(Rule::acts_on_history) {
                let (removed, moved) = self
                    .judge_history(&map, rec.id, &rules, &headed, now_ms)
                    .await
                    .map_err(|e| format!("bucket {}: {e}", rec.name))?;
                pass.versions_removed += removed;
                pass.versions_transitioned += moved;
            }
            pass.aborted += self
                .abort_stale_uploads(&map, rec.id, &rules, &headed, now_ms)
                .await
                .map_err(|e| format!("bucket {}: {e}", rec.name))?;
        }
        Ok(pass)
    }

    /// Expirations and transitions of the keys of the PGs this node heads: (expired,
    /// transitioned).
    async fn expire_and_transition(
        &self,
        map: &ClusterMap,
        bid: u64,
        versioning: Option<WireVersioning>,
        rules: &[Rule],
        headed: &HashSet<u32>,
        now_ms: i64,
    ) -> Result<(usize, usize), StoreError> {
        let acting: Vec<&Rule> = rules
            .iter()
            .filter(|r| r.enabled && (r.expiration.is_some() || !r.transitions.is_empty()))
            .collect();
        if acting.is_empty() {
            return Ok((0, 0));
        }
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let (mut expired, mut transitioned) = (0, 0);
        let mut after: Option<String> = None;
        loop {
            let page = self.local_page(&objects, "", &after).await?;
            for o in &page.objects {
                let pg = pg_of(bid, &o.key, map.pgs);
                // Only keys an acting rule's prefix covers need their tags and time looked up.
                if !headed.contains(&pg) || !acting.iter().any(|r| o.key.starts_with(&r.prefix)) {
                    continue;
                }
                let Some(info) = self.store.head_object(&objects, &o.key).await? else {
                    continue;
                };
                let action = lifecycle::evaluate(
                    rules,
                    &o.key,
                    info.size,
                    &info.attrs.tags,
                    info.attrs.last_modified_ms,
                    info.attrs.storage_class.as_deref().unwrap_or("STANDARD"),
                    now_ms,
                );
                let base = cv_of(&info);
                let done = match action {
                    Action::Keep => continue,
                    Action::Expire => self
                        // With versioning, an expiration adds a delete marker, as in S3.
                        .write(
                            map,
                            KeyAt {
                                bid,
                                pg,
                                key: &o.key,
                            },
                            None,
                            None,
                            versioning,
                            Some(base),
                        )
                        .await
                        .map(|_| &mut expired),
                    Action::Transition(class) => {
                        let mut wput = meta_of(&info).put;
                        wput.storage_class = Some(class);
                        self.edit(
                            map,
                            KeyAt {
                                bid,
                                pg,
                                key: &o.key,
                            },
                            None,
                            base,
                            wput,
                        )
                        .await
                        .map(|_| &mut transitioned)
                    }
                };
                match done {
                    Ok(count) => *count += 1,
                    // Written again meanwhile, or the chain changed: the next pass decides.
                    Err(Fail::Store(StoreError::PreconditionFailed)) | Err(Fail::Refused(_)) => {}
                    Err(Fail::Store(e)) => return Err(e),
                }
            }
            after = page.objects.last().map(|o| o.key.clone());
            if !page.truncated {
                return Ok((expired, transitioned));
            }
        }
    }

    /// NoncurrentVersionExpiration, NoncurrentVersionTransition and ExpiredObjectDeleteMarker
    /// over the keys of the PGs this node heads ([`lifecycle::HistoryJudge`] on this node's
    /// copy of each key's history): the numbers of versions removed and moved.
    async fn judge_history(
        &self,
        map: &ClusterMap,
        bid: u64,
        rules: &[Rule],
        headed: &HashSet<u32>,
        now_ms: i64,
    ) -> Result<(usize, usize), StoreError> {
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let shown = with_versions(&objects);
        let mut judge = lifecycle::HistoryJudge::new(rules, now_ms);
        for prefix in lifecycle::history_prefixes(rules) {
            let mut query = VersionQuery {
                prefix,
                max_keys: 1000,
                ..Default::default()
            };
            loop {
                let page = self.store.list_versions(&shown, &query).await?;
                // Only the keys of the PGs this node heads (a key's versions all come
                // together).
                for v in page.versions {
                    if headed.contains(&pg_of(bid, &v.object.key, map.pgs)) {
                        judge.push(v);
                    }
                }
                if !page.truncated {
                    break;
                }
                query.key_marker = page.next_key_marker;
                query.version_id_marker = page.next_version_id_marker;
            }
        }
        let verdict = judge.finish();
        let mut moved = 0;
        for t in verdict.transitions {
            let pg = pg_of(bid, &t.key, map.pgs);
            match self
                .change_class(
                    map,
                    KeyAt {
                        bid,
                        pg,
                        key: &t.key,
                    },
                    None,
                    &t.version_id,
                    &t.storage_class,
                    true,
                )
                .await
            {
                Ok(()) => moved += 1,
                // Gone, current now, or the chain changed: the next pass decides.
                Err(Fail::Store(StoreError::PreconditionFailed | StoreError::NoSuchKey))
                | Err(Fail::Refused(_)) => {}
                Err(Fail::Store(e)) => return Err(e),
            }
        }
        let mut removed = 0;
        for r in verdict.removals {
            let pg = pg_of(bid, &r.key, map.pgs);
            match self
                .delete_version(
                    map,
                    KeyAt {
                        bid,
                        pg,
                        key: &r.key,
                    },
                    None,
                    &r.version_id,
                    false,
                    !r.latest,
                )
                .await
            {
                Ok(_) => removed += 1,
                // Latest now, protected by its lock, or the chain changed: the next pass decides.
                Err(Fail::Store(StoreError::PreconditionFailed | StoreError::ObjectLocked(_)))
                | Err(Fail::Refused(_)) => {}
                Err(Fail::Store(e)) => return Err(e),
            }
        }
        Ok((removed, moved))
    }

    async fn abort_stale_uploads(
        &self,
        map: &ClusterMap,
        bid: u64,
        rules: &[Rule],
        headed: &HashSet<u32>,
        now_ms: i64,
    ) -> Result<usize, StoreError> {
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let mut aborted = 0;
        for r in rules.iter().filter(|r| r.enabled) {
            let Some(days) = r.abort_incomplete_days else {
                continue;
            };
            let mut query = UploadQuery {
                prefix: r.prefix.clone(),
                max_uploads: 1000,
                ..Default::default()
            };
            loop {
                let page = self.store.list_uploads(&objects, &query).await?;
                for u in &page.uploads {
                    let pg = pg_of(bid, &u.key, map.pgs);
                    if !headed.contains(&pg)
                        || now_ms - u.initiated_ms < i64::from(days) * 86_400_000
                    {
                        continue;
                    }
                    match self
                        .upload_step(
                            map,
                            KeyAt {
                                bid,
                                pg,
                                key: &u.key,
                            },
                            &u.upload_id,
                            true,
                            Step::Abort,
                        )
                        .await
                    {
                        Ok(_) => aborted += 1,
                        Err(Fail::Store(StoreError::NoSuchUpload)) | Err(Fail::Refused(_)) => {}
                        Err(Fail::Store(e)) => return Err(e),
                    }
                }
                match page.uploads.last() {
                    Some(u) if page.truncated => {
                        query.key_marker = Some(u.key.clone());
                        query.upload_id_marker = Some(u.upload_id.clone());
                    }
                    _ => break,
                }
            }
        }
        Ok(aborted)
    }
}
