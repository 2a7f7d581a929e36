//! Object versioning through a cluster: S3 versions of a key kept on every member of its
//! chain, with the same ids.
//!
//! A node's local buckets have no versioning of their own. A write into a cluster bucket that
//! has versioning carries the bucket's state (`WirePut::versioning`), and each member writes
//! it with the version the head chose (the store seam's `VersionAs`, sequence = the write's
//! `cv`), so the local store keeps the key's history (the version it replaces, delete
//! markers) exactly as one server does, and a version id names the same version on every
//! replica. A versioned delete leaves a delete marker of its `cv` over the object (and the
//! usual tombstone, which orders it against writes still on their way). A delete by version
//! id is a chain step of its own (`DELETE /o/..?version=ID`), applied by each member to its
//! copy of the history.
//!
//! Reads of a version by id (and of the latest version, to answer a delete marker) follow the
//! rule of plain reads: any caught-up member whose copy of the key is not dirty, else the
//! tail. Listings of versions merge one page per node, each PG listed once, as object
//! listings do.
//!
//! Copies between members (a member catching up, a step re-sent after a break) work on a
//! key's whole history: the member makes its list of versions the source's (`sync_history`),
//! under the key's lock, copying what it lacks into its place by sequence and removing what
//! the source does not have (a version deleted by id while it was away, or one that never
//! committed). A version it has whose tags or storage class alone differ is edited in place
//! (no bytes copied); one whose lock differs is copied again.

use super::uploads::Staged;
use super::{Asker, Fail, KeyAt, KeyStep, Node, NodeResp, cv_of, json, meta_of, with_versions};
use crate::map::ClusterMap;
use crate::placement::pg_of;
use crate::wire::Call;
use crate::wire::{
    CV_HEADER, WireDeleted, WireEntry, WireLockChange, WireLocked, WireMeta, WireVersionEntry,
    WireVersionPage, encode, version_seq,
};
use bytes::Bytes;
use http::Method;
use packrat_store_api::lock::{LockChange, LockCheck, ObjectLock};
use packrat_store_api::{
    Bucket, FoundVersion, StoreError, StoreResult, VersionAs, VersionQuery, VersionSummary,
};
use std::collections::{BTreeMap, HashMap, HashSet};

fn entry_of(v: &VersionSummary) -> WireVersionEntry {
    WireVersionEntry {
        entry: super::entry_of(&v.object),
        version_id: v.version_id.clone(),
        latest: v.is_latest,
        marker: v.delete_marker,
        lock: v.lock.clone(),
        tags: v.tags.clone(),
        acl: v.acl.clone(),
    }
}

/// Whether two listed versions are the same version, with the same Object Lock, tags,
/// storage class and object ACL.
fn same(a: &WireVersionEntry, b: &WireVersionEntry) -> bool {
    same_bytes(a, b)
        && a.entry.storage_class == b.entry.storage_class
        && a.lock == b.lock
        && a.tags == b.tags
        && a.acl == b.acl
}

/// Whether two listed versions are the same version's bytes (attributes aside).
fn same_bytes(a: &WireVersionEntry, b: &WireVersionEntry) -> bool {
    a.version_id == b.version_id
        && a.marker == b.marker
        && a.entry.etag == b.entry.etag
        && a.entry.last_modified_ms == b.entry.last_modified_ms
}

/// Whether this member's version `mine` becomes the source's `theirs` by edits of its
/// attributes alone (tags, storage class, lock), its bytes kept: the same version's bytes, and
/// a lock the edits can reach (see [`lock_changes`]).
fn editable(mine: &WireVersionEntry, theirs: &WireVersionEntry) -> bool {
    // An object ACL has no edit of a version by id: a version whose ACL changed while this
    // member was away is copied again (rare: an edit of the current version, superseded
    // before the member came back; the current one catches up by its newer `cv`).
    !mine.marker
        && mine.acl == theirs.acl
        && same_bytes(mine, theirs)
        && lock_changes(mine.lock.as_deref(), theirs.lock.as_deref()).is_some()
}

/// The lock changes that turn a version's stored lock `mine` into the source's `theirs` (each
/// as [`ObjectLock::stored_value`] writes it), applied as decided (the source's head judged
/// them); `None` when none can (an unreadable value, or a legal hold set here that the source
/// never had).
fn lock_changes(mine: Option<&str>, theirs: Option<&str>) -> Option<Vec<LockChange>> {
    let read = |v: Option<&str>| v.map_or(Ok(ObjectLock::default()), ObjectLock::from_stored);
    let (mine, theirs) = (read(mine).ok()?, read(theirs).ok()?);
    let mut changes = Vec::new();
    if mine.retention != theirs.retention {
        changes.push(LockChange::Retention(theirs.retention));
    }
    if mine.legal_hold != theirs.legal_hold {
        changes.push(LockChange::LegalHold(theirs.legal_hold?));
    }
    Some(changes)
}

/// Who judges a history step's lock at this member: the head, by S3's rules at its clock
/// (with the caller's bypass); every later member does as the head decided.
fn lock_check(at_head: bool, bypass_governance: bool) -> LockCheck {
    if at_head {
        LockCheck::rules(bypass_governance)
    } else {
        LockCheck::Decided
    }
}

/// Copies of versions made before a key's lock was taken (see [`Node::prestage`]), by
/// version id: the source's list entry they were made for, its metadata and the copy.
pub(super) type Prestaged = HashMap<String, (WireVersionEntry, WireMeta, Staged)>;

/// How many bytes of small versions (copied whole, into memory) one key's catching up copies
/// before taking the key's lock; the rest are copied under it.
const PRESTAGE_BYTES: u64 = 64 << 20;

impl Node {
    /// The sequence of the delete marker that is the key's latest version here (0: none,
    /// or a `null` one, whose sequence a listing does not show).
    pub(super) async fn latest_marker(&self, objects: &Bucket, key: &str) -> StoreResult<u64> {
        Ok(
            match self
                .store
                .find_version(&with_versions(objects), key, None)
                .await?
            {
                Some(FoundVersion::DeleteMarker { version_id, .. }) => {
                    version_seq(&version_id).unwrap_or(0)
                }
                _ => 0,
            },
        )
    }

    /// Begins a step of a key's history that is not a write (a removal by version id, a
    /// lock change): the key is marked dirty and the step kept for a re-send until it is
    /// handed on.
    async fn begin_history_step<'a>(
        &'a self,
        map: &'a ClusterMap,
        bid: u64,
        pg: u32,
        key: &'a str,
        cv: Option<u64>,
    ) -> Result<KeyStep<'a>, Fail> {
        self.note_versioned(bid);
        let step = self.begin_step(map, bid, pg, key, cv, true).await?;
        self.mark_dirty(bid, key, step.cv);
        if let Ok(mut h) = self.history_steps.lock() {
            h.insert((bid, key.to_string()), step.cv);
        }
        Ok(step)
    }

    /// A history step this member refused (or could not apply): nothing to hand on.
    fn drop_history_step(&self, step: KeyStep<'_>) {
        self.undo_dirty(step.bid, step.key, step.cv);
        self.history_step_done(step.bid, step.key, step.cv);
    }

    /// Hands a history step applied here on down the chain (`method path body`).
    async fn end_history_step(
        &self,
        map: &ClusterMap,
        step: KeyStep<'_>,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<(), Fail> {
        let (bid, key, cv) = (step.bid, step.key.to_string(), step.cv);
        let headers = [(CV_HEADER, cv.to_string())];
        self.end_step(
            map,
            step,
            Call {
                method,
                path,
                headers: &headers,
                body,
            },
            None,
        )
        .await?;
        self.history_step_done(bid, &key, cv);
        Ok(())
    }

    /// `DELETE /o/..?version=ID[&bypass]`: removes one version of a key for good, on every
    /// member (a chain step: the head gives it a `cv` and judges the version's lock, each
    /// member removes its copy and hands it on). Removing a version a member does not have is
    /// not an error, so a retried step is harmless.
    pub(super) async fn delete_version(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        cv: Option<u64>,
        id: &str,
        bypass_governance: bool,
        noncurrent_only: bool,
    ) -> Result<WireDeleted, Fail> {
        let KeyAt { bid, pg, key } = at;
        let step = self.begin_history_step(map, bid, pg, key, cv).await?;
        if noncurrent_only && step.at_head() {
            // A lifecycle expiration judged on an older listing: a version that is the key's
            // latest now (those above it removed meanwhile) stays.
            let latest = self
                .store
                .find_version(&with_versions(&step.objects), key, None)
                .await;
            let is_latest = match latest {
                Ok(Some(FoundVersion::Object(o))) => {
                    o.version_id.as_deref().unwrap_or("null") == id
                }
                Ok(Some(FoundVersion::DeleteMarker { version_id, .. })) => version_id == id,
                Ok(None) => false,
                Err(e) => {
                    self.drop_history_step(step);
                    return Err(e.into());
                }
            };
            if is_latest {
                self.drop_history_step(step);
                return Err(StoreError::PreconditionFailed.into());
            }
        }
        let check = lock_check(step.at_head(), bypass_governance);
        let removed = self
            .store
            .delete_version(&with_versions(&step.objects), key, id, check)
            .await;
        let removed = match removed {
            Ok(d) => d,
            Err(e) => {
                self.drop_history_step(step);
                return Err(e.into());
            }
        };
        let path = format!("/o/{bid}/{pg}/{}?version={}", encode(key), encode(id));
        self.end_history_step(map, step, Method::DELETE, &path, Bytes::new())
            .await?;
        Ok(WireDeleted {
            version_id: removed.version_id,
            delete_marker: removed.delete_marker,
        })
    }

    /// `PUT /o/..?lock[&version=ID][&bypass]` with a [`WireLockChange`]: changes the Object
    /// Lock of one version (the current object without an id) on every member. The head
    /// names the version (a change by key alone acts on the version current there) and
    /// judges the change by S3's rules at its clock; each member applies it as decided.
    /// `NoSuchKey` when the head has no such version.
    pub(super) async fn change_lock(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        cv: Option<u64>,
        id: Option<&str>,
        change: WireLockChange,
        bypass_governance: bool,
    ) -> Result<WireLocked, Fail> {
        let KeyAt { bid, pg, key } = at;
        let body =
            serde_json::to_vec(&change).map_err(|e| StoreError::internal("lock change", e))?;
        let step = self.begin_history_step(map, bid, pg, key, cv).await?;
        let (id, lock) = match self
            .apply_lock_change(&step, id, change, bypass_governance)
            .await
        {
            Ok(applied) => applied,
            Err(e) => {
                self.drop_history_step(step);
                return Err(e);
            }
        };
        let path = format!("/o/{bid}/{pg}/{}?lock&version={}", encode(key), encode(&id));
        self.end_history_step(map, step, Method::PUT, &path, Bytes::from(body))
            .await?;
        Ok(WireLocked {
            version_id: id,
            lock: lock.and_then(|l| l.stored_value()),
        })
    }

    /// `PUT /o/..?tags&version=ID` with a JSON list of (key, value): gives one version of a
    /// key that tag set on every member (see [`Node::version_edit_step`]).
    pub(super) async fn change_tags(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        cv: Option<u64>,
        id: &str,
        body: Bytes,
    ) -> Result<(), Fail> {
        let KeyAt { bid, pg, key } = at;
        let tags: Vec<(String, String)> = serde_json::from_slice(&body)
            .map_err(|e| StoreError::Invalid(format!("bad tags: {e}")))?;
        let edit = |shown: Bucket, _| async move {
            self.store.set_version_tags(&shown, key, id, tags).await
        };
        self.version_edit_step(map, KeyAt { bid, pg, key }, cv, id, ("tags", body), edit)
            .await
    }

    /// `PUT /o/..?class=CLASS&version=ID[&noncurrent]`: gives one version of a key that
    /// storage class on every member (a NoncurrentVersionTransition; each member's tier
    /// worker then moves its copy). With `noncurrent`, the head also checks the version is not
    /// the key's current one (`PreconditionFailed`). See [`Node::version_edit_step`].
    pub(super) async fn change_class(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        cv: Option<u64>,
        id: &str,
        class: &str,
        noncurrent_only: bool,
    ) -> Result<(), Fail> {
        let KeyAt { bid, pg, key } = at;
        let edit = |shown: Bucket, at_head: bool| async move {
            self.store
                .set_version_class(&shown, key, id, class, noncurrent_only && at_head)
                .await
        };
        let query = format!("class={}", encode(class));
        let at = KeyAt { bid, pg, key };
        self.version_edit_step(map, at, cv, id, (&query, Bytes::new()), edit)
            .await
    }

    /// An in-place edit of one version of a key on every member (`edit` of this member's copy,
    /// given its bucket with versions and whether this member is the head), as a chain step
    /// like a lock change: the head gives it a `cv` and checks the version is there
    /// (`NoSuchKey` if not); each member edits its copy and hands the step on as `PUT
    /// /o/..?QUERY&version=ID` with `body` (a member that lacks the version skips it: its
    /// catching up copies the version, edit and all).
    async fn version_edit_step<F, Fut>(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        cv: Option<u64>,
        id: &str,
        (query, body): (&str, Bytes),
        edit: F,
    ) -> Result<(), Fail>
    where
        F: FnOnce(Bucket, bool) -> Fut,
        Fut: std::future::Future<Output = StoreResult<bool>>,
    {
        let KeyAt { bid, pg, key } = at;
        let step = self.begin_history_step(map, bid, pg, key, cv).await?;
        let at_head = step.at_head();
        match edit(with_versions(&step.objects), at_head).await {
            Ok(true) => {}
            Ok(false) if !at_head => {}
            Ok(false) => {
                self.drop_history_step(step);
                return Err(StoreError::NoSuchKey.into());
            }
            Err(e) => {
                self.drop_history_step(step);
                return Err(e.into());
            }
        }
        let path = format!(
            "/o/{bid}/{pg}/{}?{query}&version={}",
            encode(key),
            encode(id)
        );
        self.end_history_step(map, step, Method::PUT, &path, body)
            .await
    }

    /// [`Node::change_lock`]'s change at this member: the version it acts on (named here at
    /// the head when the change came by key alone) and its lock now (`None`: a later member
    /// that lacks the version, which catching up will copy, lock and all).
    async fn apply_lock_change(
        &self,
        step: &KeyStep<'_>,
        id: Option<&str>,
        change: WireLockChange,
        bypass_governance: bool,
    ) -> Result<(String, Option<ObjectLock>), Fail> {
        let shown = with_versions(&step.objects);
        let id = match id {
            Some(id) => id.to_string(),
            None => match self.store.find_version(&shown, step.key, None).await? {
                Some(FoundVersion::Object(info)) => {
                    info.version_id.unwrap_or_else(|| "null".into())
                }
                _ => return Err(StoreError::NoSuchKey.into()),
            },
        };
        let check = lock_check(step.at_head(), bypass_governance);
        match self
            .store
            .update_lock(&shown, step.key, Some(&id), change.change(), check)
            .await?
        {
            Some(lock) => Ok((id, Some(lock))),
            None if !step.at_head() => Ok((id, None)),
            None => Err(StoreError::NoSuchKey.into()),
        }
    }

    /// A version of a key by id (`None`: its latest, which may be a delete marker), as
    /// [`Node::read_meta`] answers a reader: from a caught-up member whose copy of the key is
    /// not dirty (the tail's always is). The bytes come too when the version has 1 to
    /// `inline` of them.
    pub(super) async fn read_version(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        who: Asker,
        id: Option<&str>,
        inline: u64,
    ) -> Result<(WireMeta, Option<Bytes>), Fail> {
        let KeyAt { bid, pg, key } = at;
        let chain = map.chain(pg);
        if !chain.contains(&self.id) || (who != Asker::Successor && map.is_syncing(&self.id, pg)) {
            return Err(Fail::Refused(format!("not a reader of PG {pg}")));
        }
        let is_tail = chain.last().is_some_and(|n| *n == self.id);
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let found = self
            .store
            .find_version(&with_versions(&objects), key, id)
            .await?;
        if who == Asker::Reader && !is_tail && self.is_dirty(bid, key) {
            return Err(Fail::Refused("dirty: ask the tail".into()));
        }
        match found.ok_or(StoreError::NoSuchKey)? {
            FoundVersion::DeleteMarker {
                version_id,
                last_modified_ms,
            } => {
                let mut meta = WireMeta {
                    cv: version_seq(&version_id).unwrap_or(0),
                    marker: true,
                    version_id: Some(version_id),
                    ..Default::default()
                };
                meta.put.last_modified_ms = last_modified_ms;
                Ok((meta, None))
            }
            FoundVersion::Object(info) => {
                let mut meta = meta_of(&info);
                // Named even when `null`: the bytes are read by it.
                meta.version_id = info.version_id.clone();
                if info.size > inline || info.size == 0 {
                    return Ok((meta, None));
                }
                let reader = self.store.read_object(&info, 0, info.size)?;
                let body = super::read_whole(reader, info.size).await?;
                Ok((meta, Some(body)))
            }
        }
    }

    /// Version `id` of a key, if its cluster version is still `want`; refused if it is gone.
    pub(super) async fn version_by_id(
        &self,
        bid: u64,
        key: &str,
        id: &str,
        want: u64,
    ) -> Result<packrat_store_api::ObjectInfo, Fail> {
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        match self
            .store
            .find_version(&with_versions(&objects), key, Some(id))
            .await?
        {
            Some(FoundVersion::Object(info)) if cv_of(&info) == want => Ok(*info),
            _ => Err(Fail::Refused("the version asked for is gone".into())),
        }
    }

    /// Every version this node has of one key, newest first.
    pub(super) async fn key_versions(
        &self,
        bid: u64,
        key: &str,
    ) -> StoreResult<Vec<WireVersionEntry>> {
        let objects = with_versions(&self.local_bucket(format!("o-{bid}")).await?);
        let mut query = VersionQuery {
            prefix: key.to_string(),
            max_keys: 1000,
            ..Default::default()
        };
        let mut out = Vec::new();
        loop {
            let page = self.store.list_versions(&objects, &query).await?;
            let mut past = false;
            for v in &page.versions {
                match v.object.key.as_str().cmp(key) {
                    std::cmp::Ordering::Equal => out.push(entry_of(v)),
                    std::cmp::Ordering::Greater => past = true,
                    std::cmp::Ordering::Less => {}
                }
            }
            if past || !page.truncated {
                return Ok(out);
            }
            query.key_marker = page.next_key_marker;
            query.version_id_marker = page.next_version_id_marker;
            if query.key_marker.as_deref() != Some(key) {
                return Ok(out);
            }
        }
    }

    /// A page of this node's versions of the PGs asked (`GET /lv/{bucket id}?pgs=..`): keys
    /// in order, each key's versions newest first, after `key` (and `vid`, a version of
    /// it), under `prefix`, rolled up at `delimiter`.
    pub(super) async fn list_versions(
        &self,
        map: &ClusterMap,
        bid: u64,
        q: &HashMap<String, String>,
    ) -> Result<WireVersionPage, Fail> {
        let (pgs, max) = super::listing_scope(q);
        let prefix = q.get("prefix").cloned().unwrap_or_default();
        let delimiter = q.get("delimiter").filter(|d| !d.is_empty()).cloned();
        let objects = with_versions(&self.local_bucket(format!("o-{bid}")).await?);
        let mut query = VersionQuery {
            prefix: prefix.clone(),
            delimiter: None,
            key_marker: q.get("key").cloned(),
            version_id_marker: q.get("vid").cloned(),
            max_keys: 1000,
        };
        // A page that ended on a common prefix resumes after everything under it.
        if let Some(k) = query.key_marker.as_mut()
            && WireEntry::resume_after_prefix(&prefix, delimiter.as_deref(), k)
        {
            query.version_id_marker = None;
        }
        let mut page = WireVersionPage::default();
        'pages: loop {
            let local = self.store.list_versions(&objects, &query).await?;
            for v in &local.versions {
                query.key_marker = Some(v.object.key.clone());
                query.version_id_marker = Some(v.version_id.clone());
                if !pgs.contains(&pg_of(bid, &v.object.key, map.pgs)) {
                    continue;
                }
                if page.entries.len() >= max {
                    page.truncated = true;
                    break 'pages;
                }
                if let Some(d) = &delimiter
                    && let Some(i) = v.object.key[prefix.len()..].find(d.as_str())
                {
                    let cp = v.object.key[..prefix.len() + i + d.len()].to_string();
                    page.entries.push(WireVersionEntry {
                        entry: WireEntry::common_prefix(cp.clone()),
                        version_id: String::new(),
                        latest: false,
                        marker: false,
                        lock: None,
                        tags: Vec::new(),
                        acl: None,
                    });
                    // Skip the rest of the common prefix.
                    query.key_marker = Some(format!("{cp}{}", char::MAX));
                    query.version_id_marker = None;
                    continue 'pages;
                }
                page.entries.push(entry_of(v));
            }
            if !local.truncated {
                break;
            }
            query.key_marker = local.next_key_marker;
            query.version_id_marker = local.next_version_id_marker;
        }
        Ok(page)
    }

    /// Makes this node's history of a key the one the member at `addr` has now (the caller
    /// holds the key's lock): versions it lacks are copied into their place by sequence
    /// (taken from `prestaged` when a copy made before the lock is of the version as the
    /// source lists it now), versions the source does not have are removed. Answers whether
    /// anything changed.
    pub(super) async fn sync_history(
        &self,
        map: &ClusterMap,
        addr: &str,
        objects: &Bucket,
        at: KeyAt<'_>,
        prestaged: &mut Prestaged,
        catching_up: bool,
    ) -> Result<bool, Fail> {
        let KeyAt { bid, pg, key } = at;
        // A member catching up asks for the source's history only once no step of the key is
        // under way there (see `Node::settled_here`); a re-send comes from a member that has
        // one under way by definition.
        let mut path = format!("/o/{bid}/{pg}/{}?versions", encode(key));
        if catching_up {
            path.push_str("&settle");
        }
        let theirs: Vec<WireVersionEntry> = self.fetch_json(addr, &path, map.epoch).await?;
        let mut mine = self.key_versions(bid, key).await?;
        if theirs.len() == mine.len() && theirs.iter().zip(&mine).all(|(a, b)| same(a, b)) {
            return Ok(false);
        }
        let shown = with_versions(objects);
        if self.edit_attributes(&shown, key, &theirs, &mine).await? {
            mine = self.key_versions(bid, key).await?;
        }
        for m in mine.iter().filter(|m| !theirs.iter().any(|t| same(t, m))) {
            tracing::info!(
                bucket = bid,
                key,
                version = m.version_id,
                lock = m.lock,
                "removing a version the source lacks (or has otherwise)"
            );
            // As the source has it: a version that never committed goes, lock or not.
            self.store
                .delete_version(&shown, key, &m.version_id, LockCheck::Decided)
                .await?;
        }
        // Where each of the source's versions goes: its own sequence, or for a `null` one,
        // whose sequence a listing does not show, a place just under the version above it.
        let mut seqs = Vec::with_capacity(theirs.len());
        for t in &theirs {
            let above = seqs.last().map_or(u64::MAX, |s: &u64| s.saturating_sub(1));
            let derived = ((t.entry.last_modified_ms.max(0) as u64).saturating_mul(1000))
                .clamp(1, above.max(1));
            seqs.push(version_seq(&t.version_id).unwrap_or(derived));
        }
        for (t, seq) in theirs.iter().zip(seqs).rev() {
            if mine.iter().any(|m| same(m, t)) {
                continue;
            }
            let null = t.version_id == "null";
            if t.marker {
                self.store
                    .put_delete_marker(
                        objects,
                        key,
                        VersionAs { seq, null },
                        t.entry.last_modified_ms,
                    )
                    .await?;
                continue;
            }
            let (meta, staged) = match prestaged.remove(&t.version_id) {
                Some((listed, meta, staged)) if same(&listed, t) => (meta, staged),
                stale => {
                    if let Some((_, _, staged)) = stale {
                        self.drop_staged(objects, key, staged).await;
                    }
                    let asker = if catching_up { "any" } else { "pull" };
                    let meta = self
                        .version_meta(map, addr, (bid, pg, key), t, asker)
                        .await?;
                    let staged = self
                        .stage_version(map, addr, objects, KeyAt { bid, pg, key }, &meta)
                        .await?;
                    (meta, staged)
                }
            };
            let version = VersionAs {
                seq: meta.version_seq.unwrap_or(seq),
                null,
            };
            self.commit_version_as(objects, key, &meta, staged, Some(version))
                .await?;
        }
        // A tombstone here newer than the source's latest version is a delete that never
        // committed: it would make this member skip the key's next steps below it.
        if theirs.first().is_some_and(|t| !t.marker) {
            let tombs = self.local_bucket(format!("t-{bid}")).await?;
            self.store.delete_object(&tombs, key).await?;
        }
        Ok(true)
    }

    /// Versions this member has with the source's bytes but other tags, storage class or
    /// Object Lock (a change made while it was away): their attributes are edited in place, so
    /// catching up copies no bytes for them. True if any was.
    async fn edit_attributes(
        &self,
        shown: &Bucket,
        key: &str,
        theirs: &[WireVersionEntry],
        mine: &[WireVersionEntry],
    ) -> Result<bool, Fail> {
        let mut edited = false;
        for m in mine {
            let Some(t) = theirs.iter().find(|t| editable(m, t) && !same(t, m)) else {
                continue;
            };
            let id = &m.version_id;
            if t.lock != m.lock {
                let changes =
                    lock_changes(m.lock.as_deref(), t.lock.as_deref()).unwrap_or_default();
                for change in changes {
                    self.store
                        .update_lock(shown, key, Some(id), change, LockCheck::Decided)
                        .await?;
                }
            }
            if t.tags != m.tags {
                self.store
                    .set_version_tags(shown, key, id, t.tags.clone())
                    .await?;
            }
            if t.entry.storage_class != m.entry.storage_class {
                let class = t.entry.storage_class.as_deref().unwrap_or("STANDARD");
                self.store
                    .set_version_class(shown, key, id, class, false)
                    .await?;
            }
            edited = true;
        }
        Ok(edited)
    }

    /// The metadata of the source's version `t` of a key.
    /// `asker`: `any` for a member catching up (from a caught-up member), `pull` for the next
    /// member of a chain copying a key's history from the one before it, which may itself be
    /// catching up: it made its history of the key its own predecessor's in the same step.
    async fn version_meta(
        &self,
        map: &ClusterMap,
        addr: &str,
        (bid, pg, key): (u64, u32, &str),
        t: &WireVersionEntry,
        asker: &str,
    ) -> Result<WireMeta, Fail> {
        let path = format!(
            "/o/{bid}/{pg}/{}?meta&{asker}&version={}",
            encode(key),
            encode(&t.version_id)
        );
        self.fetch_json(addr, &path, map.epoch).await
    }

    /// Copies, without the key's lock, the versions of the source's list `theirs` that this
    /// node's list `mine` lacks, up to [`PRESTAGE_BYTES`] of them held in memory (a copy of
    /// a multipart version is staged as parts in the store), so that [`Node::sync_history`]
    /// holds the lock only to place them: a write of the key then waits for no transfer. A
    /// copy that fails is left to `sync_history`, which makes it under the lock as before.
    async fn prestage(
        &self,
        map: &ClusterMap,
        addr: &str,
        objects: &Bucket,
        at: KeyAt<'_>,
        theirs: &[WireVersionEntry],
        mine: &[WireVersionEntry],
    ) -> Prestaged {
        let KeyAt { bid, pg, key } = at;
        let mut out = Prestaged::new();
        let mut held = 0u64;
        for t in theirs {
            // Not for a version whose attributes alone differ: `sync_history` edits those.
            if t.marker || mine.iter().any(|m| same(m, t) || editable(m, t)) {
                continue;
            }
            let copy = async {
                let meta = self
                    .version_meta(map, addr, (bid, pg, key), t, "any")
                    .await?;
                if meta.part_sizes.is_empty() && held + meta.size > PRESTAGE_BYTES {
                    return Ok(None);
                }
                let staged = self
                    .stage_version(map, addr, objects, KeyAt { bid, pg, key }, &meta)
                    .await?;
                Ok::<_, Fail>(Some((meta, staged)))
            };
            match copy.await {
                Ok(Some((meta, staged))) => {
                    if let Staged::Whole(b) = &staged {
                        held += b.len() as u64;
                    }
                    out.insert(t.version_id.clone(), (t.clone(), meta, staged));
                }
                Ok(None) => break,
                Err(e) => {
                    let why = match e {
                        Fail::Refused(r) => r,
                        Fail::Store(e) => e.to_string(),
                    };
                    tracing::debug!(key, version = t.version_id, why, "no copy before the lock");
                    break;
                }
            }
        }
        if !out.is_empty() {
            tracing::debug!(key, versions = out.len(), "copied before the key's lock");
        }
        out
    }

    /// `POST /o/..?hsync` with version `cv`: the member before this one re-sends a step of a
    /// key's history it could not hand on (a delete by version id, or any step of a bucket
    /// with versioning); this member makes its history of the key that member's, and hands
    /// the step on.
    pub(super) async fn history_resent(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        cv: u64,
    ) -> Result<NodeResp, Fail> {
        self.note_versioned(bid);
        let step = self.begin_step(map, bid, pg, key, Some(cv), true).await?;
        let from = &step.chain[step.pos - 1];
        let addr = map
            .addr(from)
            .ok_or_else(|| StoreError::internal("cluster map", format!("no address for {from}")))?
            .to_string();
        self.mark_dirty(bid, key, cv);
        if let Err(e) = self
            .sync_history(
                map,
                &addr,
                &step.objects,
                KeyAt { bid, pg, key },
                &mut Prestaged::new(),
                false,
            )
            .await
        {
            self.undo_dirty(bid, key, cv);
            return Err(e);
        }
        let path = format!("/o/{bid}/{pg}/{}?hsync", encode(key));
        let headers = [(CV_HEADER, cv.to_string())];
        self.end_step(
            map,
            step,
            Call {
                method: Method::POST,
                path: &path,
                headers: &headers,
                body: Bytes::new(),
            },
            None,
        )
        .await?;
        Ok(json(200, &()))
    }

    /// Catches up on a bucket with versioning: for each key of `pgs` whose versions differ
    /// between the source at `addr` and here, the key's history is made the source's
    /// ([`Node::sync_history`], under the key's lock: the source's history is read again
    /// there, so a step that reached the source since its listing is taken too). A key
    /// with a step under way here is left to that step and the re-send rounds.
    pub(super) async fn resync_versions(
        &self,
        map: &ClusterMap,
        pgs: &HashSet<u32>,
        bid: u64,
        addr: &str,
        copied: &mut HashMap<u32, usize>,
    ) -> Result<(), String> {
        let pg_list = pgs.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let mut theirs: BTreeMap<String, Vec<WireVersionEntry>> = BTreeMap::new();
        let mut marker: Option<(String, String)> = None;
        loop {
            let mut path = format!("/lv/{bid}?pgs={pg_list}&max=1000");
            if let Some((k, v)) = &marker {
                path.push_str(&format!("&key={}&vid={}", encode(k), encode(v)));
            }
            let ans = self.fetch(addr, &path, map.epoch).await?;
            if ans.status != 200 {
                return Err(format!(
                    "version listing from {addr}: {}",
                    ans.error().await
                ));
            }
            let page: WireVersionPage = ans.json().await.map_err(|e| e.to_string())?;
            marker = page
                .entries
                .last()
                .map(|e| (e.entry.key.clone(), e.version_id.clone()));
            for e in page.entries {
                theirs.entry(e.entry.key.clone()).or_default().push(e);
            }
            if !page.truncated || marker.is_none() {
                break;
            }
        }
        let mut mine: BTreeMap<String, Vec<WireVersionEntry>> = BTreeMap::new();
        let all: HashMap<String, String> = [
            ("pgs".to_string(), pg_list.clone()),
            ("max".to_string(), "1000".to_string()),
        ]
        .into();
        let mut q = all.clone();
        loop {
            let page = self
                .list_versions(map, bid, &q)
                .await
                .map_err(|f| match f {
                    Fail::Refused(r) => r,
                    Fail::Store(e) => e.to_string(),
                })?;
            let last = page
                .entries
                .last()
                .map(|e| (e.entry.key.clone(), e.version_id.clone()));
            for e in page.entries {
                mine.entry(e.entry.key.clone()).or_default().push(e);
            }
            match last {
                Some((k, v)) if page.truncated => {
                    q = all.clone();
                    q.insert("key".into(), k);
                    q.insert("vid".into(), v);
                }
                _ => break,
            }
        }
        let objects = self
            .local_bucket(format!("o-{bid}"))
            .await
            .map_err(|e| e.to_string())?;
        let keys: HashSet<&String> = theirs.keys().chain(mine.keys()).collect();
        for key in keys {
            let (t, m) = (theirs.get(key), mine.get(key));
            let differ = match (t, m) {
                (Some(t), Some(m)) => {
                    t.len() != m.len() || !t.iter().zip(m).all(|(a, b)| same(a, b))
                }
                _ => true,
            };
            if !differ {
                continue;
            }
            let pg = pg_of(bid, key, map.pgs);
            let (t, m) = (
                t.map_or(&[][..], Vec::as_slice),
                m.map_or(&[][..], Vec::as_slice),
            );
            let mut prestaged = self
                .prestage(map, addr, &objects, KeyAt { bid, pg, key }, t, m)
                .await;
            let synced = {
                let _g = self.lock_of(bid, key).lock().await;
                if self.is_dirty(bid, key) {
                    Ok(false)
                } else {
                    self.sync_history(
                        map,
                        addr,
                        &objects,
                        KeyAt { bid, pg, key },
                        &mut prestaged,
                        true,
                    )
                    .await
                }
            };
            for (_, (_, _, staged)) in prestaged {
                self.drop_staged(&objects, key, staged).await;
            }
            match synced {
                Ok(true) => *copied.entry(pg).or_default() += 1,
                Ok(false) => {}
                Err(Fail::Refused(r)) => return Err(format!("{key}: {r}")),
                Err(Fail::Store(e)) => return Err(format!("{key}: {e}")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use packrat_store_api::lock::{LockMode, Retention};

    fn stored(retention: Option<(LockMode, i64)>, legal_hold: Option<bool>) -> Option<String> {
        ObjectLock {
            retention: retention.map(|(mode, until_ms)| Retention { mode, until_ms }),
            legal_hold,
        }
        .stored_value()
    }

    /// Every change a client can make to a version's lock while a member is away is reached
    /// by edits, and applying them gives the source's stored value exactly.
    #[test]
    fn lock_changes_reach_the_sources_lock() {
        let (gov, comp) = (LockMode::Governance, LockMode::Compliance);
        let cases = [
            (None, stored(None, Some(true))),
            (stored(None, Some(true)), stored(None, Some(false))),
            (
                stored(Some((gov, 10)), None),
                stored(Some((comp, 20)), None),
            ),
            (
                stored(Some((gov, 10)), Some(true)),
                stored(None, Some(true)),
            ),
            (
                stored(Some((comp, 10)), None),
                stored(Some((comp, 30)), Some(true)),
            ),
            (None, stored(Some((gov, 5)), None)),
        ];
        for (mine, theirs) in cases {
            let changes = lock_changes(mine.as_deref(), theirs.as_deref())
                .unwrap_or_else(|| panic!("{mine:?} -> {theirs:?}"));
            let mut lock = mine.as_deref().map_or(ObjectLock::default(), |v| {
                ObjectLock::from_stored(v).unwrap()
            });
            for c in changes {
                lock.apply_by(c, 0, LockCheck::Decided).unwrap();
            }
            assert_eq!(lock.stored_value(), theirs, "{mine:?}");
        }
        // A legal hold here that the source never had, or a value this code cannot read: no
        // edit, the version is copied again.
        assert!(lock_changes(stored(None, Some(false)).as_deref(), None).is_none());
        assert!(lock_changes(Some("??"), None).is_none());
        assert_eq!(lock_changes(None, None), Some(Vec::new()));
    }
}
