//! Object versioning in the engine: what a write, a delete and a delete-by-version do to a
//! key's history in a versioned bucket, as index ops committed with the write itself (one
//! group-commit job, under the key's lock). A bucket that never had versioning never comes
//! here: its writes take the engine's plain paths, unchanged.
//!
//! The key's current version stays in `objects`; what it replaces, and delete markers, go to
//! `versions` (see `packrat_index::versions`). Sequences are microseconds from the store's
//! clock, kept strictly increasing per key (and across the engine), so newest-first order is
//! the order of writes even if the clock steps back.

use crate::engine::Engine;
use crate::error::{EngineError, EngineResult};
use packrat_index::records::{VERSION_DELETE_MARKER, VERSION_NULL};
use packrat_index::{BucketLock, ObjectOp, ObjectRecord};
use packrat_store_api::lock::{
    DefaultRetention, LockChange, LockCheck, LockConfig, LockMode, ObjectLock, PROTECTED,
};
use packrat_store_api::{Deleted, StoreError, Versioning};
use std::sync::atomic::Ordering;

/// Which version a version id names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum VersionId {
    Null,
    Seq(u64),
}

impl VersionId {
    /// `Invalid` for an id packrat never hands out (S3's "Invalid version id specified").
    pub(crate) fn parse(id: &str) -> EngineResult<Self> {
        if id == "null" {
            return Ok(Self::Null);
        }
        ObjectRecord::parse_version_id(id)
            .map(Self::Seq)
            .ok_or_else(|| EngineError(StoreError::Invalid("Invalid version id specified".into())))
    }

    fn names(self, rec: &ObjectRecord) -> bool {
        match self {
            Self::Null => rec.is_null_version(),
            Self::Seq(s) => !rec.is_null_version() && rec.version_seq == s,
        }
    }
}

/// A bucket's versioning state from its index record's code (0 never, 1 enabled, 2
/// suspended), and back.
pub(crate) fn versioning_of(code: u8) -> Versioning {
    match code {
        1 => Versioning::Enabled,
        2 => Versioning::Suspended,
        _ => Versioning::Unversioned,
    }
}

pub(crate) fn versioning_code(v: Versioning) -> u8 {
    match v {
        Versioning::Unversioned => 0,
        Versioning::Enabled => 1,
        Versioning::Suspended => 2,
    }
}

/// A bucket's Object Lock configuration from its index record, and back.
pub(crate) fn lock_config_of(l: BucketLock) -> LockConfig {
    let mode = match l.default_mode {
        1 => Some(LockMode::Governance),
        2 => Some(LockMode::Compliance),
        _ => None,
    };
    LockConfig {
        default_retention: mode.map(|mode| DefaultRetention {
            mode,
            days: l.days,
            years: l.years,
        }),
    }
}

pub(crate) fn bucket_lock_of(c: &LockConfig) -> BucketLock {
    match c.default_retention {
        None => BucketLock::default(),
        Some(d) => BucketLock {
            default_mode: match d.mode {
                LockMode::Governance => 1,
                LockMode::Compliance => 2,
            },
            days: d.days,
            years: d.years,
        },
    }
}

/// `ObjectLocked` unless the version's lock lets it be removed now. A lock that cannot be
/// read protects its version (removal is the one thing that cannot be taken back).
fn check_removal(rec: &ObjectRecord, now_ms: i64, check: LockCheck) -> EngineResult<()> {
    // Judged already: not even an unreadable lock stops it.
    let LockCheck::Rules { bypass_governance } = check else {
        return Ok(());
    };
    ObjectLock::of(&rec.headers)
        .map_err(|_| PROTECTED)
        .and_then(|l| l.check_removal(now_ms, bypass_governance))
        .map_err(|why| EngineError(StoreError::ObjectLocked(why)))
}

/// A version found by id: the record, and whether it is the key's current one (in `objects`).
pub(crate) struct Located {
    pub record: ObjectRecord,
    pub current: bool,
}

impl Engine {
    /// A sequence above `floor` and above every sequence this engine handed out.
    fn next_version_seq(&self, floor: u64) -> u64 {
        let now = (self.clock.now_ms().max(0) as u64).saturating_mul(1000);
        let mut next = 0;
        let _ = self
            .last_version_seq
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |last| {
                next = now.max(last + 1).max(floor + 1);
                Some(next)
            });
        next
    }

    /// The newest sequence the key has (0 if none). A current version with a sequence is
    /// newer than every kept one; only without one (none, or one written before versioning,
    /// which counts as 1 so the new version has room above it) are the kept ones read.
    fn newest_seq(
        &self,
        bucket_id: u64,
        key: &str,
        current: Option<&ObjectRecord>,
    ) -> EngineResult<u64> {
        match current {
            Some(c) if c.version_seq != 0 => return Ok(c.version_seq),
            _ => {}
        }
        let newest_kept = self
            .index
            .key_versions(bucket_id, key, 1)?
            .first()
            .map_or(0, |r| r.version_seq);
        Ok(newest_kept.max(u64::from(current.is_some())))
    }

    /// The ops that keep (or, for a null version being replaced while suspended, drop) the
    /// key's current version before something new takes its place, and drop an older null
    /// version when a new null one is made. `seq` is the new version's sequence.
    fn history_ops(
        &self,
        bucket_id: u64,
        key: &str,
        mode: Versioning,
        current: Option<ObjectRecord>,
        seq: u64,
    ) -> EngineResult<Vec<ObjectOp>> {
        let mut ops = Vec::new();
        let suspended = mode == Versioning::Suspended;
        if let Some(mut cur) = current
            && !(suspended && cur.is_null_version())
        {
            if cur.version_seq == 0 {
                // Written before versioning: it gets a place just under the new version.
                cur.version_seq = (cur.last_modified_ms.max(0) as u64 * 1000).clamp(1, seq - 1);
                cur.version_flags |= VERSION_NULL;
            }
            ops.push(ObjectOp::PutVersion {
                bucket_id,
                key: key.to_string(),
                record: Box::new(cur),
            });
        }
        if suspended {
            for old in self.index.key_versions(bucket_id, key, usize::MAX)? {
                if old.is_null_version() {
                    ops.push(ObjectOp::DeleteVersion {
                        bucket_id,
                        key: key.to_string(),
                        seq: old.version_seq,
                    });
                }
            }
        }
        Ok(ops)
    }

    /// The ops of a new version `rec` of a key in a versioned bucket (its sequence and flags
    /// are set here), and whether it becomes the key's current version. With `given` (a
    /// version the caller chose: a cluster's head chose it for every replica), that sequence
    /// is used: above every version the key has, it is the new current version as usual;
    /// below the newest, it is kept in the key's history and the current one is untouched (a
    /// replica copying a version it missed). The returned ops leave out `rec`'s own op (a
    /// Put if current, a PutVersion if not). Call under the key's lock with the queue before
    /// it applied.
    pub(crate) fn placed_version_ops(
        &self,
        bucket_id: u64,
        key: &str,
        mode: Versioning,
        given: Option<u64>,
        rec: &mut ObjectRecord,
    ) -> EngineResult<(Vec<ObjectOp>, bool)> {
        let current = self.index.get_object(bucket_id, key)?;
        let newest = self.newest_seq(bucket_id, key, current.as_ref())?;
        let suspended = mode == Versioning::Suspended;
        rec.version_flags =
            (rec.version_flags & VERSION_DELETE_MARKER) | if suspended { VERSION_NULL } else { 0 };
        let seq = match given {
            Some(0) => {
                return Err(EngineError(StoreError::Invalid(
                    "a version's sequence is above 0".into(),
                )));
            }
            Some(s) if s <= newest => {
                rec.version_seq = s;
                let ops = self.kept_version_ops(bucket_id, key, current.as_ref(), rec)?;
                return Ok((ops, false));
            }
            Some(s) => {
                // The engine's own sequences stay above every one it was given.
                self.last_version_seq.fetch_max(s, Ordering::AcqRel);
                s
            }
            None => self.next_version_seq(newest),
        };
        rec.version_seq = seq;
        let ops = self.history_ops(bucket_id, key, mode, current, seq)?;
        Ok((ops, true))
    }

    /// The op that keeps `prev`, a new version of a key placed earlier in the same commit
    /// job, when `rec` comes after it (a batch PUT naming the key again, into a bucket with
    /// versioning enabled): `rec` gets the next sequence, and `prev` becomes a noncurrent
    /// version, as a later PutObject would make it.
    pub(crate) fn repeated_version_op(
        &self,
        bucket_id: u64,
        key: &str,
        prev: ObjectRecord,
        rec: &mut ObjectRecord,
    ) -> ObjectOp {
        rec.version_flags &= VERSION_DELETE_MARKER;
        rec.version_seq = self.next_version_seq(prev.version_seq);
        ObjectOp::PutVersion {
            bucket_id,
            key: key.to_string(),
            record: Box::new(prev),
        }
    }

    /// The ops that go with a chosen version `rec` below the key's newest, kept in its
    /// history (see [`Self::placed_version_ops`]): refused if it is the current one, or a
    /// `null` version older than the key's null version (one per key, the newer wins);
    /// else an older null version is dropped.
    fn kept_version_ops(
        &self,
        bucket_id: u64,
        key: &str,
        current: Option<&ObjectRecord>,
        rec: &ObjectRecord,
    ) -> EngineResult<Vec<ObjectOp>> {
        let s = rec.version_seq;
        let refused = |why: String| Err(EngineError(StoreError::Invalid(why)));
        if current.is_some_and(|c| c.version_seq == s) {
            return refused(format!(
                "version {} is the key's current one",
                rec.version_id()
            ));
        }
        let mut ops = Vec::new();
        if !rec.is_null_version() {
            return Ok(ops);
        }
        if current.is_some_and(ObjectRecord::is_null_version) {
            return refused("the key's current version is a newer null version".into());
        }
        for old in self.index.key_versions(bucket_id, key, usize::MAX)? {
            if !old.is_null_version() || old.version_seq == s {
                continue;
            }
            if old.version_seq > s {
                return refused("the key has a newer null version".into());
            }
            ops.push(ObjectOp::DeleteVersion {
                bucket_id,
                key: key.to_string(),
                seq: old.version_seq,
            });
        }
        Ok(ops)
    }

    /// The ops of a new current version `rec` of a key in a versioned bucket (its sequence and
    /// flags are set here; see [`Self::placed_version_ops`] for `given`). Call under the key's
    /// lock with the queue before it applied.
    pub(crate) fn versioned_put_ops(
        &self,
        bucket_id: u64,
        key: &str,
        mode: Versioning,
        given: Option<u64>,
        rec: &mut ObjectRecord,
    ) -> EngineResult<Vec<ObjectOp>> {
        let (mut ops, current) = self.placed_version_ops(bucket_id, key, mode, given, rec)?;
        let (key, record) = (key.to_string(), Box::new(rec.clone()));
        ops.push(if current {
            ObjectOp::Put {
                bucket_id,
                key,
                record,
            }
        } else {
            ObjectOp::PutVersion {
                bucket_id,
                key,
                record,
            }
        });
        Ok(ops)
    }

    /// A DeleteObject without a version in a versioned bucket: the current version is kept
    /// (or, if it is the null one while suspended, dropped) and a delete marker becomes the
    /// latest. With `only_if`, only if the current object is still the one with that record
    /// id (a lifecycle expiration); `None` if it was not. With `given`, the marker has that
    /// sequence and modification time (see [`Self::placed_version_ops`]: below the key's
    /// newest version, it is only kept in its history).
    pub(crate) async fn delete_versioned(
        &self,
        bucket_id: u64,
        key: &str,
        mode: Versioning,
        only_if: Option<[u8; 16]>,
        given: Option<(u64, i64)>,
    ) -> EngineResult<Option<Deleted>> {
        let (guard, stripe) = self.lock_key_current(bucket_id, key).await;
        let current = self.index.get_object(bucket_id, key)?;
        if let Some(rid) = only_if
            && current.as_ref().is_none_or(|c| c.record_id != rid)
        {
            return Ok(None);
        }
        let had_current = current.is_some();
        let mut marker = ObjectRecord {
            version_flags: VERSION_DELETE_MARKER,
            last_modified_ms: given.map_or_else(|| self.clock.now_ms(), |(_, t)| t),
            ..Default::default()
        };
        let (mut ops, latest) =
            self.placed_version_ops(bucket_id, key, mode, given.map(|(s, _)| s), &mut marker)?;
        if had_current && latest {
            ops.push(ObjectOp::Delete {
                bucket_id,
                key: key.to_string(),
            });
        }
        let deleted = Deleted {
            version_id: Some(marker.version_id()),
            delete_marker: true,
        };
        ops.push(ObjectOp::PutVersion {
            bucket_id,
            key: key.to_string(),
            record: Box::new(marker),
        });
        self.commit_locked(guard, None, ops, &[stripe]).await?;
        Ok(Some(deleted))
    }

    /// Finds a version of a key by id, current or kept. Reads the index as it is (no lock).
    pub(crate) fn locate_version(
        &self,
        bucket_id: u64,
        key: &str,
        id: VersionId,
    ) -> EngineResult<Option<Located>> {
        if let Some(cur) = self.index.get_object(bucket_id, key)?
            && id.names(&cur)
        {
            return Ok(Some(Located {
                record: cur,
                current: true,
            }));
        }
        let kept = match id {
            VersionId::Seq(s) => self
                .index
                .get_version(bucket_id, key, s)?
                .filter(|r| id.names(r)),
            VersionId::Null => self
                .index
                .key_versions(bucket_id, key, usize::MAX)?
                .into_iter()
                .find(|r| r.is_null_version()),
        };
        Ok(kept.map(|record| Located {
            record,
            current: false,
        }))
    }

    /// The key's latest version, which may be a delete marker.
    pub(crate) fn latest_version(
        &self,
        bucket_id: u64,
        key: &str,
    ) -> EngineResult<Option<ObjectRecord>> {
        if let Some(cur) = self.index.get_object(bucket_id, key)? {
            return Ok(Some(cur));
        }
        Ok(self
            .index
            .key_versions(bucket_id, key, 1)?
            .into_iter()
            .next())
    }

    /// Whether `record`, kept in the key's history, is its latest version: the key has no
    /// current object and nothing kept above it (a delete marker on top).
    fn is_latest_kept(
        &self,
        bucket_id: u64,
        key: &str,
        record: &ObjectRecord,
    ) -> EngineResult<bool> {
        if self.index.get_object(bucket_id, key)?.is_some() {
            return Ok(false);
        }
        Ok(self
            .index
            .key_versions(bucket_id, key, 1)?
            .first()
            .is_some_and(|r| r.version_seq == record.version_seq))
    }

    /// Removes one version for good. When the key is left without a current object, its
    /// newest remaining version becomes current if it is an object (not a delete marker), as
    /// in S3. With `noncurrent_only` (a lifecycle expiration judged on an older reading), a
    /// version that is the key's latest now is left alone: `None`.
    pub(crate) async fn delete_version(
        &self,
        bucket_id: u64,
        key: &str,
        id: VersionId,
        shown_id: &str,
        check: LockCheck,
        noncurrent_only: bool,
    ) -> EngineResult<Option<Deleted>> {
        let (guard, stripe) = self.lock_key_current(bucket_id, key).await;
        let Some(found) = self.locate_version(bucket_id, key, id)? else {
            return Ok(Some(Deleted {
                version_id: Some(shown_id.to_string()),
                delete_marker: false,
            }));
        };
        if noncurrent_only
            && (found.current || self.is_latest_kept(bucket_id, key, &found.record)?)
        {
            return Ok(None);
        }
        check_removal(&found.record, self.clock.now_ms(), check)?;
        let k = || key.to_string();
        let mut ops = Vec::new();
        let current_left = if found.current {
            ops.push(ObjectOp::Delete {
                bucket_id,
                key: k(),
            });
            false
        } else {
            ops.push(ObjectOp::DeleteVersion {
                bucket_id,
                key: k(),
                seq: found.record.version_seq,
            });
            self.index.get_object(bucket_id, key)?.is_some()
        };
        if !current_left {
            let newest = self
                .index
                .key_versions(bucket_id, key, 2)?
                .into_iter()
                .find(|r| found.current || r.version_seq != found.record.version_seq);
            if let Some(next) = newest.filter(|r| !r.is_delete_marker()) {
                ops.push(ObjectOp::DeleteVersion {
                    bucket_id,
                    key: k(),
                    seq: next.version_seq,
                });
                ops.push(ObjectOp::Put {
                    bucket_id,
                    key: k(),
                    record: Box::new(next),
                });
            }
        }
        self.commit_locked(guard, None, ops, &[stripe]).await?;
        Ok(Some(Deleted {
            version_id: Some(found.record.version_id()),
            delete_marker: found.record.is_delete_marker(),
        }))
    }

    /// Changes the lock of one version (the current object when `id` is `None`) under the
    /// key's lock, as S3's rules allow; answers the lock as written. `None` if there is no such
    /// version (or, without an id, no current object).
    pub(crate) async fn update_lock(
        &self,
        bucket_id: u64,
        key: &str,
        id: Option<VersionId>,
        change: LockChange,
        check: LockCheck,
    ) -> EngineResult<Option<ObjectLock>> {
        let now_ms = self.clock.now_ms();
        self.edit_version(bucket_id, key, id, "Object Lock", |record, _| {
            let mut lock = ObjectLock::of(&record.headers)
                .map_err(|e| EngineError(StoreError::internal("object lock", e)))?;
            lock.apply_by(change, now_ms, check)
                .map_err(|why| EngineError(StoreError::ObjectLocked(why)))?;
            lock.store(&mut record.headers);
            Ok(lock)
        })
        .await
    }

    /// Gives one version the tag set `tags`, under the key's lock. `None` if there is no
    /// such version.
    pub(crate) async fn set_version_tags(
        &self,
        bucket_id: u64,
        key: &str,
        id: VersionId,
        tags: Vec<(String, String)>,
    ) -> EngineResult<Option<()>> {
        self.edit_version(bucket_id, key, Some(id), "tags", |record, _| {
            record.tags = tags;
            Ok(())
        })
        .await
    }

    /// Gives one version the storage class `class` (its bytes move on the tier worker's next
    /// run), under the key's lock. `None` if there is no such version. With
    /// `noncurrent_only` (a NoncurrentVersionTransition judged on an older listing), a version
    /// that has become the key's current one meanwhile is left alone: `PreconditionFailed`.
    pub(crate) async fn set_version_class(
        &self,
        bucket_id: u64,
        key: &str,
        id: VersionId,
        class: &str,
        noncurrent_only: bool,
    ) -> EngineResult<Option<()>> {
        self.edit_version(
            bucket_id,
            key,
            Some(id),
            "storage class",
            |record, current| {
                if noncurrent_only && current {
                    return Err(EngineError(StoreError::PreconditionFailed));
                }
                record.storage_class = (class != "STANDARD").then(|| class.to_string());
                Ok(())
            },
        )
        .await
    }

    /// Edits the record of one version in place (its bytes and its place in the history
    /// stay), under the key's lock, committing only if `edit` (given the record and whether it
    /// is the key's current version) succeeds. `None` if there is no
    /// such version (or, without an id, no current object); a delete marker has no `what`
    /// (`Invalid`).
    async fn edit_version<T>(
        &self,
        bucket_id: u64,
        key: &str,
        id: Option<VersionId>,
        what: &str,
        edit: impl FnOnce(&mut ObjectRecord, bool) -> EngineResult<T>,
    ) -> EngineResult<Option<T>> {
        let (guard, stripe) = self.lock_key_current(bucket_id, key).await;
        let found = match id {
            Some(id) => self.locate_version(bucket_id, key, id)?,
            None => self
                .index
                .get_object(bucket_id, key)?
                .map(|record| Located {
                    record,
                    current: true,
                }),
        };
        let Some(Located {
            mut record,
            current,
        }) = found
        else {
            return Ok(None);
        };
        if record.is_delete_marker() {
            return Err(EngineError(StoreError::Invalid(format!(
                "A delete marker has no {what}"
            ))));
        }
        let out = edit(&mut record, current)?;
        let (key, record) = (key.to_string(), Box::new(record));
        let op = if current {
            ObjectOp::Put {
                bucket_id,
                key,
                record,
            }
        } else {
            ObjectOp::PutVersion {
                bucket_id,
                key,
                record,
            }
        };
        self.commit_locked(guard, None, vec![op], &[stripe]).await?;
        Ok(Some(out))
    }
}
