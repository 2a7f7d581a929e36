//! Chain steps that did not reach the end of their chain, and copies no chain step made.
//!
//! A member that applied a write and could not hand it on (its successor died, hung, or the
//! map changed under it) keeps the key marked dirty (see `Node::dirty`): the client got an
//! error, or its gateway retried the write on the new chain with a new version. When no retry
//! came (the gateway or its client went away), the members before the break hold a version
//! the members after it lack. S3 lets a failed write take effect, but every replica must then
//! answer the same, so each node re-sends such steps down its current chain every
//! [`RESEND_EVERY`] until they are acknowledged, as 3FS does after a failover: a successor
//! copies the version from the member before it (`POST /o/..?resend`), or takes the delete
//! (a forwarded `DELETE`), and hands it on.
//!
//! A PUT is handed on once staged, before its own sync (see `Node::write`), so a member whose
//! sync then fails may lack a version the members after it hold: it keeps the key marked
//! (its reads of the key go to the tail) and copies the version back from the next member
//! (`Node::recover_lost`), or settles once the next member holds no more of it than this
//! one, and has for longer than a request handed on can still be on its way there.
//!
//! The marks are in memory: a node that restarts with such a version, which only it holds,
//! no longer knows it is unsettled. It learns it as it catches up: a copy newer than its
//! source's committed one, or one its source never had, written by no step under way (the
//! key's lock is free), is replaced by the source's (see [`Node::settle_with`]).

use super::{CV_HEADER, Fail, KeyAt, Node, RESEND_EVERY, cv_of, encode, json, meta_of};
use crate::map::ClusterMap;
use crate::placement::pg_of;
use crate::wire::Call;
use crate::wire::WireMeta;
use bytes::Bytes;
use http::Method;
use packrat_store_api::{Bucket, ObjectInfo, StoreError};
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a re-send round did with a key.
pub(super) enum Resent {
    /// The rest of the chain holds this member's version of the key (or both lack it).
    Settled,
    /// Not yet decided: asked again in a later round.
    Later,
}

/// How long after this member first found a version of a key lost (staged, then not made
/// durable) it may settle on "the next member lacks it too": longer than a request it handed
/// on can take to reach the next member and start there. That request's sender gives up
/// after a hop's time per member after it (for the largest body, `hop_timeout`), and a next
/// member hung for longer than its lease is out of the chain (a new map, so the round that
/// would settle ends) before it can start it; 10 s more for the manager's round and margin.
/// Measured on this node's clock from when it first looked, which is after the write.
pub(super) fn settle_after(members_after: usize) -> Duration {
    crate::wire::hop_timeout(crate::store::CLUSTER_PUT_MAX as usize) * members_after as u32
        + Duration::from_secs(crate::LEASE_SECS as u64 + 10)
}

/// An unsettled step as a round of settling finds it: the key, the step's version, and this
/// member's place in the key's chain.
#[derive(Clone, Copy)]
struct Mark<'a> {
    at: KeyAt<'a>,
    cv: u64,
    pos: usize,
}

impl Node {
    /// Re-sends the steps this node applied and could not hand on, every [`RESEND_EVERY`],
    /// for the node's life.
    pub async fn resend_loop(self: Arc<Self>) {
        loop {
            tokio::time::sleep(RESEND_EVERY).await;
            let (settled, left) = self.resend_unsettled().await;
            if settled > 0 {
                tracing::info!(
                    settled,
                    left,
                    "re-sent writes that had not reached the tail"
                );
            } else if left > 0 {
                tracing::debug!(left, "writes not yet handed on down their chains");
            }
        }
    }

    /// One round of [`Node::resend_loop`]: the keys settled and those left for the next. A
    /// successor that failed once is not asked again in the round (a hung one would take a
    /// hop's timeout per key), and the round ends when the map changes.
    pub(super) async fn resend_unsettled(&self) -> (usize, usize) {
        let pending: Vec<((u64, String), u64)> = match self.dirty.lock() {
            Ok(d) => d.iter().map(|(k, m)| (k.clone(), m.cv)).collect(),
            Err(_) => return (0, 0),
        };
        // Versions found lost (see `recover_lost`) are followed while their marks last.
        {
            let mut lost = self.lost_since.lock().unwrap_or_else(|e| e.into_inner());
            if !lost.is_empty() {
                let marked: HashSet<(u64, &str, u64)> = pending
                    .iter()
                    .map(|((bid, key), cv)| (*bid, key.as_str(), *cv))
                    .collect();
                lost.retain(|(bid, key, cv), _| marked.contains(&(*bid, key.as_str(), *cv)));
            }
        }
        let map = self.map.borrow().clone();
        let mut failed: HashSet<String> = HashSet::new();
        let (mut settled, mut left) = (0, 0);
        for (i, ((bid, key), cv)) in pending.iter().enumerate() {
            if self.map.borrow().epoch != map.epoch {
                left += pending.len() - i;
                break;
            }
            let pg = pg_of(*bid, key, map.pgs);
            let chain = map.chain(pg);
            let pos = chain.iter().position(|n| *n == self.id);
            // Where the step goes: a head hands it to the next member, any other member
            // through the head (see `resend`).
            let to = match pos {
                Some(0) => chain.get(1),
                Some(_) => chain.first(),
                None => None,
            };
            if to.is_some_and(|n| failed.contains(n)) {
                left += 1;
                continue;
            }
            // A step of the key (or of its stripe) under way here holds the lock; it settles
            // the mark itself, or leaves it for the next round.
            let Ok(lock) = self.lock_of(*bid, key).try_lock() else {
                left += 1;
                continue;
            };
            if !self.dirty_at(*bid, key, *cv) {
                continue;
            }
            // Nothing to send when this node is no longer a member (its copy is read by no
            // one, and replaced if it joins again) or the chain's only one.
            let sent = match (pos, to) {
                (Some(pos), Some(_)) => {
                    let at = KeyAt { bid: *bid, pg, key };
                    let mark = Mark { at, cv: *cv, pos };
                    self.resend(&map, mark, lock).await
                }
                _ => Ok(Resent::Settled),
            };
            match sent {
                Ok(Resent::Settled) => {
                    self.clear_dirty(*bid, key, *cv);
                    settled += 1;
                }
                Ok(Resent::Later) => left += 1,
                Err(why) => {
                    tracing::debug!(bid, key, cv, "re-sending: {why}");
                    failed.extend(to.cloned());
                    left += 1;
                }
            }
        }
        (settled, left)
    }

    /// Hands version `cv` of a key on from this member, at `pos` of `pg`'s chain in `map`,
    /// to the rest of the chain (`lock`: the key's lock, taken by the caller); nothing if this
    /// member no longer holds that version.
    async fn resend(
        &self,
        map: &ClusterMap,
        mark: Mark<'_>,
        lock: tokio::sync::MutexGuard<'_, ()>,
    ) -> Result<Resent, String> {
        let Mark {
            at: KeyAt { bid, pg, key },
            cv,
            pos,
        } = mark;
        let chain = map.chain(pg);
        let e = |e: StoreError| e.to_string();
        let objects = self.local_bucket(format!("o-{bid}")).await.map_err(e)?;
        let tombs = self.local_bucket(format!("t-{bid}")).await.map_err(e)?;
        let (obj, tomb) = self.current(&objects, &tombs, key).await.map_err(e)?;
        let path = format!("/o/{bid}/{pg}/{}", encode(key));
        // A step of a bucket with versioning that this member holds (a version it wrote, a
        // delete marker, a delete by version id): the next member makes its history of the
        // key this one's, and hands that on.
        let history_step = self
            .history_steps
            .lock()
            .is_ok_and(|h| h.get(&(bid, key.to_string())) == Some(&cv));
        let (method, path) = match (obj.as_ref().map_or(0, cv_of), tomb) {
            (o, t) if history_step || (self.is_versioned(bid) && (o == cv || t == cv)) => {
                (Method::POST, format!("{path}?hsync"))
            }
            (o, _) if o == cv => (Method::POST, format!("{path}?resend")),
            (_, t) if t == cv => (Method::DELETE, path),
            (o, t) if o.max(t) > cv => return Ok(Resent::Settled),
            _ => {
                return self
                    .recover_lost(map, mark, (&objects, &tombs), obj.as_ref(), tomb)
                    .await;
            }
        };
        let headers = [(CV_HEADER, cv.to_string())];
        let through_head = pos > 0 && (path.ends_with("?resend") || method == Method::DELETE);
        if through_head {
            // Through the head, which copies the version from this member if it lacks it and
            // hands it down the chain, each member copying it from the one before: every
            // member then holds it, those before this one too. Handed to the next member
            // only, it would miss a member the manager moved ahead of this one (to spread
            // heads) after the step was applied, and as the tail this member would answer a
            // version the head did not have.
            let head = &chain[0];
            let addr = map
                .addr(head)
                .ok_or_else(|| format!("no address for {head}"))?;
            // The step comes back down the chain to this member, which takes the key's lock
            // for it: held here, each would wait for the other until the hop's timeout. A
            // step of the key that comes meanwhile is newer, and settles this one.
            drop(lock);
            let path = match method {
                Method::DELETE => format!("{path}?resend&from={}", encode(&self.id)),
                _ => format!("{path}&from={}", encode(&self.id)),
            };
            let ans = self
                .client
                .send(
                    Call {
                        method: method.clone(),
                        path: &path,
                        headers: &headers,
                        body: Bytes::new(),
                    },
                    addr,
                    map.epoch,
                    crate::wire::hop_timeout(0) * chain.len() as u32,
                )
                .await
                .map_err(|e| e.to_string())?;
            if !(200..300).contains(&ans.status) {
                return Err(format!("{head} answered {}", ans.status));
            }
            return Ok(Resent::Settled);
        }
        if pos + 1 == chain.len() {
            // The tail's history step: nothing after it to hand it to.
            return Ok(Resent::Settled);
        }
        self.forward(
            map,
            chain,
            pos,
            Call {
                method,
                path: &path,
                headers: &headers,
                body: Bytes::new(),
            },
        )
        .await
        .map_err(|f| match f {
            Fail::Refused(r) => r,
            Fail::Store(e) => e.to_string(),
        })?;
        self.history_step_done(bid, key, cv);
        Ok(Resent::Settled)
    }

    /// A version `cv` this member staged and failed to make durable while the rest of the
    /// chain went on (see `Node::write`; `obj` and `tomb`: what it has of the key instead, read
    /// by the caller under the key's lock): copied back from the next member if that has it.
    /// Settled as well when the next member answers a read
    /// (so it holds no unsettled step of the key) with the version this one has: the write
    /// then reached neither, unless a request this member handed on is still on its way there
    /// (delayed past the hop's timeout, the forward having failed here too), so that settle
    /// waits until [`settle_after`] has passed since this member first found the version
    /// lost. Else left for the next round, the key still marked, so reads of it here go to
    /// the tail.
    async fn recover_lost(
        &self,
        map: &ClusterMap,
        mark: Mark<'_>,
        (objects, tombs): (&Bucket, &Bucket),
        obj: Option<&ObjectInfo>,
        tomb: u64,
    ) -> Result<Resent, String> {
        let Mark {
            at: KeyAt { bid, pg, key },
            cv,
            pos,
        } = mark;
        let Some(next) = map.chain(pg).get(pos + 1) else {
            return Ok(Resent::Settled);
        };
        let found = *self
            .lost_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((bid, key.to_string(), cv))
            .or_insert_with(Instant::now);
        let pulled = self
            .pull_version(map, next, objects, KeyAt { bid, pg, key }, cv)
            .await;
        if pulled.is_ok() {
            // The tombstone here, if any, is older than the version copied.
            if tomb > 0 {
                self.store
                    .delete_object(tombs, key)
                    .await
                    .map_err(|e| e.to_string())?;
            }
            return Ok(Resent::Settled);
        }
        let addr = map
            .addr(next)
            .ok_or_else(|| format!("no address for {next}"))?;
        let path = format!("/o/{bid}/{pg}/{}?meta", encode(key));
        let ans = self.fetch(addr, &path, map.epoch).await?;
        let theirs = match ans.status {
            200 => ans.json::<WireMeta>().await.map_err(|e| e.to_string())?.cv,
            404 => 0,
            s => return Err(format!("{next} answered {s} for {key}")),
        };
        let mine = obj.map_or(0, cv_of).max(tomb);
        if theirs == mine || (theirs == 0 && obj.is_none()) {
            let members_after = map.chain(pg).len() - pos - 1;
            if found.elapsed() < settle_after(members_after) {
                return Ok(Resent::Later); // a request handed on may still reach `next`
            }
            return Ok(Resent::Settled);
        }
        Err(format!(
            "{next} has version {theirs} of {key}, this member {mine}, the lost one {cv}"
        ))
    }

    /// `POST /o/..?resend` with version `cv`: a member re-sends a version it holds, to the
    /// head (`from`: that member) or down the chain (from the member before this one); this
    /// member copies it from there if it lacks it, and hands it on.
    pub(super) async fn resent(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        cv: u64,
        from: Option<String>,
    ) -> Result<super::NodeResp, Fail> {
        let step = self
            .begin_step_as(map, KeyAt { bid, pg, key }, Some(cv), false, from.is_some())
            .await?;
        let mut meta = step.obj.as_ref().map(meta_of);
        if cv > step.have {
            let from = match (&from, step.pos) {
                (Some(from), 0) if map.chain(pg).contains(from) => from.clone(),
                (None, pos) if pos > 0 => step.chain[pos - 1].clone(),
                _ => {
                    return Err(StoreError::Invalid(
                        "a re-sent step names the member it comes from (at the head only)".into(),
                    )
                    .into());
                }
            };
            self.mark_dirty(bid, key, cv);
            let from = &from;
            let copied = self
                .pull_version(map, from, &step.objects, KeyAt { bid, pg, key }, cv)
                .await;
            meta = Some(self.applied(&step, copied).await?);
        }
        let path = format!("/o/{bid}/{pg}/{}?resend", encode(key));
        let headers = [(CV_HEADER, cv.to_string())];
        let meta = self
            .end_step(
                map,
                step,
                Call {
                    method: Method::POST,
                    path: &path,
                    headers: &headers,
                    body: Bytes::new(),
                },
                meta,
            )
            .await?;
        Ok(json(200, &meta))
    }

    /// `DELETE /o/..?resend&from=` at the head, with version `cv`: a member re-sends a delete
    /// it applied and could not hand on (see `resend`); the head applies it if it is newer
    /// than what it has, and hands it down the chain as a chain delete of that version.
    pub(super) async fn resent_delete(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        cv: u64,
        from: &str,
    ) -> Result<super::NodeResp, Fail> {
        if !map.chain(pg).iter().any(|n| n == from) {
            return Err(StoreError::Invalid(format!("{from} is not a member of PG {pg}")).into());
        }
        let step = self
            .begin_step_as(map, KeyAt { bid, pg, key }, Some(cv), false, true)
            .await?;
        if cv > step.have {
            self.bury_step(&step, None).await?;
        }
        let path = format!("/o/{bid}/{pg}/{}", encode(key));
        let headers = [(CV_HEADER, cv.to_string())];
        self.end_step(
            map,
            step,
            Call {
                method: Method::DELETE,
                path: &path,
                headers: &headers,
                body: Bytes::new(),
            },
            None,
        )
        .await?;
        Ok(super::answer(204, Bytes::new()))
    }

    /// Brings this node's copy of a key, newer than what its source listed or unknown to it,
    /// in line with the source's (at `addr`) as the source holds it now: a copy no step under
    /// way here wrote and the source lacks is one that never committed (this node restarted
    /// with it, or it was never handed on). Copies the source has newer are left to the
    /// chain, which brings them. Answers whether this node's copy changed.
    pub(super) async fn settle_with(
        &self,
        map: &ClusterMap,
        addr: &str,
        objects: &Bucket,
        tombs: &Bucket,
        bid: u64,
        key: &str,
    ) -> Result<bool, Fail> {
        let pg = pg_of(bid, key, map.pgs);
        let _lock = self.lock_of(bid, key).lock().await;
        if self.is_dirty(bid, key) {
            // A step this node applied and has not handed on: re-sent by `resend_loop`.
            return Ok(false);
        }
        let (obj, tomb) = self.current(objects, tombs, key).await?;
        let mine = obj.as_ref().map_or(0, cv_of).max(tomb);
        let unavailable = |why: String| Fail::Store(StoreError::Unavailable(why));
        let path = format!("/o/{bid}/{pg}/{}?meta&any&settle", encode(key));
        let ans = self
            .fetch(addr, &path, map.epoch)
            .await
            .map_err(unavailable)?;
        let theirs: Option<WireMeta> = match ans.status {
            200 => Some(ans.json().await?),
            404 => None,
            // A step of the key is under way at the source: it reaches this node by the
            // chain (this copy may be it, committed here before the source shows it).
            409 => return Ok(false),
            _ => return Err(ans.error().await.into()),
        };
        match theirs {
            // The source has no object: this node's is dropped (a tombstone of the source's
            // came with the listing).
            None => {
                if obj.is_none() {
                    return Ok(false);
                }
                tracing::info!(key, cv = mine, "dropping a copy that never committed");
                self.store.delete_object(objects, key).await?;
                Ok(true)
            }
            Some(m) if m.cv >= mine => Ok(false),
            Some(m) => {
                tracing::info!(
                    key,
                    cv = mine,
                    committed = m.cv,
                    "replacing a copy that never committed"
                );
                let staged = self
                    .stage_version(map, addr, objects, KeyAt { bid, pg, key }, &m)
                    .await?;
                self.commit_version(objects, key, &m, staged).await?;
                if tomb > 0 {
                    self.store.delete_object(tombs, key).await?;
                }
                Ok(true)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lost_version_settles_only_after_a_forward_can_no_longer_land() {
        // Two members after this one: each may take a hop's time for the largest body.
        let two = settle_after(2);
        let hop = crate::wire::hop_timeout(crate::store::CLUSTER_PUT_MAX as usize);
        assert!(
            two >= hop * 2 + Duration::from_secs(crate::LEASE_SECS as u64),
            "{two:?}"
        );
        assert!(settle_after(1) < two);
        assert!(
            two < Duration::from_secs(60),
            "{two:?}: keys would stay marked for long"
        );
    }
}
