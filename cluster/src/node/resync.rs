//! Catching up: a member that joined a PG's chain copies what a caught-up member has and it
//! lacks, gives up copies that never committed, and reports each PG caught up in etcd.

use super::{FORWARD_TIMEOUT, Fail, KeyAt, Node, RESYNC_PGS, cv_of};
use crate::map::{ClusterMap, Etcd};
use crate::placement::pg_of;
use crate::wire::Call;
use crate::wire::{WireMeta, WirePage, encode};
use bytes::Bytes;
use http::Method;
use packrat_store_api::StoreError;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

impl Node {
    /// A GET from another member answered with JSON (`Unavailable` if it cannot be reached,
    /// its error if it refuses).
    pub(super) async fn fetch_json<T: serde::de::DeserializeOwned>(
        &self,
        addr: &str,
        path: &str,
        epoch: u64,
    ) -> Result<T, Fail> {
        let ans = self
            .fetch(addr, path, epoch)
            .await
            .map_err(|why| Fail::Store(StoreError::Unavailable(why)))?;
        if ans.status != 200 {
            return Err(ans.error().await.into());
        }
        Ok(ans.json().await?)
    }

    /// A resync's GET from a caught-up member.
    pub(super) async fn fetch(
        &self,
        addr: &str,
        path: &str,
        epoch: u64,
    ) -> Result<crate::wire::Answer, String> {
        self.client
            .send(
                Call {
                    method: Method::GET,
                    path,
                    headers: &[],
                    body: Bytes::new(),
                },
                addr,
                epoch,
                FORWARD_TIMEOUT,
            )
            .await
            .map_err(|e| e.to_string())
    }

    /// Catches up on the PGs this node joined, from caught-up members, and reports each one
    /// done in etcd. Runs for the node's life.
    pub async fn resync_loop(self: Arc<Self>, etcd: Etcd) {
        let mut rx = self.map.clone();
        let mut done: HashSet<(u32, u64)> = HashSet::new();
        loop {
            let map = rx.borrow_and_update().clone();
            let todo: Vec<(u32, u64)> = map
                .syncing
                .get(&self.id)
                .into_iter()
                .flatten()
                .map(|(p, e)| (*p, *e))
                .filter(|pe| !done.contains(pe))
                .collect();
            let mut pending = false;
            for batch in todo.chunks(RESYNC_PGS) {
                let bids = match crate::map::bucket_records(&etcd).await {
                    Ok(b) => b
                        .into_iter()
                        .map(|b| (b.id, b.versioning.is_some()))
                        .collect::<Vec<(u64, bool)>>(),
                    Err(e) => {
                        tracing::debug!("resync: {e}");
                        pending = true;
                        break;
                    }
                };
                let pgs: Vec<u32> = batch.iter().map(|(pg, _)| *pg).collect();
                let sweep = self.sweep.lock().await;
                let copied = self.resync_pgs(&map, &pgs, &bids).await;
                drop(sweep);
                let copied = match copied {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::debug!(?pgs, "resync: {e}");
                        pending = true;
                        continue;
                    }
                };
                for (pg, since) in batch {
                    let Some(n) = copied.get(pg) else {
                        pending = true; // no caught-up member to copy from yet
                        continue;
                    };
                    tracing::info!(pg, objects = n, "caught up");
                    if etcd
                        .put(&format!("synced/{}/{pg}", self.id), since.to_string())
                        .await
                        .is_ok()
                    {
                        done.insert((*pg, *since));
                    } else {
                        pending = true;
                    }
                }
                if rx.has_changed().unwrap_or(false) {
                    break;
                }
            }
            let wait = if pending {
                Duration::from_millis(500)
            } else {
                Duration::from_secs(3600)
            };
            let _ = tokio::time::timeout(wait, rx.changed()).await;
        }
    }

    /// Copies what caught-up members have of `pgs` and this node lacks (newer versions,
    /// tombstones), and gives up copies that never committed (newer here than there, or
    /// unknown there: see `unsettled`), taking theirs or none. One listing per bucket and source for all
    /// the PGs it is the source of, not one per PG: a bucket's listing on a node scans all of
    /// it, so a node back from a reboot with hundreds of PGs to catch up on would otherwise
    /// scan every bucket hundreds of times. Answers the objects copied per PG; a PG without a
    /// caught-up member to copy from is left out.
    pub(super) async fn resync_pgs(
        &self,
        map: &ClusterMap,
        pgs: &[u32],
        bids: &[(u64, bool)],
    ) -> Result<HashMap<u32, usize>, String> {
        let mut by_source: BTreeMap<String, HashSet<u32>> = BTreeMap::new();
        let mut copied = HashMap::new();
        for pg in pgs {
            match map.readers(*pg).find(|n| **n != self.id) {
                Some(source) => {
                    by_source.entry(source.clone()).or_default().insert(*pg);
                    copied.insert(*pg, 0);
                }
                None => tracing::debug!(pg, "resync: no caught-up member to copy from"),
            }
        }
        for (source, group) in by_source {
            let addr = map.addr(&source).ok_or("no address")?.to_string();
            // The source's steps of older maps (chains without this node) land before it is
            // listed, or never (see `epochs`). A node from before the barrier answers 404.
            let ans = self.fetch(&addr, "/drain", map.epoch).await?;
            if !matches!(ans.status, 204 | 404) {
                return Err(format!("barrier at {source}: {}", ans.error().await));
            }
            for &(bid, versioned) in bids {
                if versioned {
                    self.note_versioned(bid);
                    self.resync_versions(map, &group, bid, &addr, &mut copied)
                        .await?;
                } else {
                    self.resync_bucket(map, &group, bid, &addr, &mut copied)
                        .await?;
                }
                let parts = self.resync_uploads(map, &group, bid, &addr).await?;
                if parts > 0 {
                    tracing::info!(bid, parts, %source, "copied parts of uploads in progress");
                }
            }
        }
        Ok(copied)
    }

    pub(super) async fn resync_bucket(
        &self,
        map: &ClusterMap,
        pgs: &HashSet<u32>,
        bid: u64,
        addr: &str,
        copied: &mut HashMap<u32, usize>,
    ) -> Result<(), String> {
        let pg_list = pgs.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let e = |e: StoreError| e.to_string();
        let source_keys = |tombstones: bool| {
            let addr = addr.to_string();
            let pg_list = &pg_list;
            async move {
                let mut out = Vec::new();
                let mut after: Option<String> = None;
                loop {
                    let mut path = format!("/l/{bid}?pgs={pg_list}&max=1000&cv");
                    if tombstones {
                        path.push_str("&tombstones");
                    }
                    if let Some(a) = &after {
                        path.push_str(&format!("&after={}", encode(a)));
                    }
                    let ans = self.fetch(&addr, &path, map.epoch).await?;
                    if ans.status != 200 {
                        return Err(format!("listing from {addr}: {}", ans.error().await));
                    }
                    let page: WirePage = ans.json().await.map_err(e)?;
                    after = page.entries.last().map(|x| x.key.clone());
                    out.extend(page.entries);
                    if !page.truncated {
                        return Ok(out);
                    }
                }
            }
        };
        let objects = self.local_bucket(format!("o-{bid}")).await.map_err(e)?;
        let tombs = self.local_bucket(format!("t-{bid}")).await.map_err(e)?;
        let settle = |key: &str| {
            let (objects, tombs) = (&objects, &tombs);
            let key = key.to_string();
            async move {
                match self.settle_with(map, addr, objects, tombs, bid, &key).await {
                    Ok(changed) => Ok(changed),
                    // Overwritten on the source meanwhile: the newer write comes by the chain.
                    Err(Fail::Refused(_)) => Ok(false),
                    Err(Fail::Store(err)) => Err(format!("{key}: {err}")),
                }
            }
        };
        let theirs = source_keys(false).await?;
        let their_tombs = source_keys(true).await?;
        let mut known: HashSet<&str> = theirs.iter().map(|x| x.key.as_str()).collect();
        known.extend(their_tombs.iter().map(|x| x.key.as_str()));
        for t in &their_tombs {
            let _g = self.lock_of(bid, &t.key).lock().await;
            let (obj, tomb) = self.current(&objects, &tombs, &t.key).await.map_err(e)?;
            let mine = obj.as_ref().map_or(0, cv_of).max(tomb);
            if t.cv > mine {
                self.bury(&objects, &tombs, &t.key, t.cv, obj.is_some(), None)
                    .await
                    .map_err(e)?;
            }
            if t.unsettled && t.cv >= mine {
                self.mark_copied_unsettled(bid, &t.key, t.cv);
            }
        }
        for o in &theirs {
            let pg = pg_of(bid, &o.key, map.pgs);
            // Only what is newer on the source is asked for: a node back from a short absence
            // copies what it missed, not the whole PG. A copy newer here may be one that
            // never committed.
            {
                let (obj, tomb) = self.current(&objects, &tombs, &o.key).await.map_err(e)?;
                let mine = obj.as_ref().map_or(0, cv_of).max(tomb);
                if o.cv != 0 && o.cv <= mine {
                    if o.cv < mine && settle(&o.key).await? {
                        *copied.entry(pg).or_default() += 1;
                    }
                    // The same version here (this node held it before it restarted, its mark
                    // lost with its memory) and marked at the source.
                    if o.cv == mine && o.unsettled {
                        self.mark_copied_unsettled(bid, &o.key, mine);
                    }
                    continue;
                }
            }
            let path = format!("/o/{bid}/{pg}/{}?meta&any", encode(&o.key));
            let ans = self.fetch(addr, &path, map.epoch).await?;
            if ans.status == 404 {
                continue;
            }
            if ans.status != 200 {
                return Err(format!("{}: {}", o.key, ans.error().await));
            }
            let unsettled = o.unsettled || ans.headers.contains_key(crate::wire::UNSETTLED_HEADER);
            let meta: WireMeta = ans.json().await.map_err(e)?;
            {
                let (obj, tomb) = self.current(&objects, &tombs, &o.key).await.map_err(e)?;
                if meta.cv <= obj.as_ref().map_or(0, cv_of).max(tomb) {
                    continue;
                }
            }
            // The bytes are read without the key's lock; the copy is made visible under it
            // if it is still newer than what this node has.
            let staged = match self
                .stage_version(
                    map,
                    addr,
                    &objects,
                    KeyAt {
                        bid,
                        pg,
                        key: &o.key,
                    },
                    &meta,
                )
                .await
            {
                Ok(s) => s,
                // Overwritten meanwhile: the newer write reaches this node by the chain.
                Err(Fail::Refused(_)) => continue,
                Err(Fail::Store(err)) => return Err(format!("{}: {err}", o.key)),
            };
            let _g = self.lock_of(bid, &o.key).lock().await;
            let (obj, tomb) = self.current(&objects, &tombs, &o.key).await.map_err(e)?;
            if meta.cv <= obj.as_ref().map_or(0, cv_of).max(tomb) {
                self.drop_staged(&objects, &o.key, staged).await;
                continue;
            }
            if let Err(f) = self.commit_version(&objects, &o.key, &meta, staged).await {
                return Err(match f {
                    Fail::Refused(r) => format!("{}: {r}", o.key),
                    Fail::Store(err) => format!("{}: {err}", o.key),
                });
            }
            if tomb > 0 {
                self.store.delete_object(&tombs, &o.key).await.map_err(e)?;
            }
            if unsettled {
                self.mark_copied_unsettled(bid, &o.key, meta.cv);
            }
            *copied.entry(pg).or_default() += 1;
        }
        // What this node holds of the PG that the source did not list: writes that never
        // committed, or ones that came down the chain since the listing (the source has them
        // now).
        let mut after: Option<String> = None;
        loop {
            let page = self.local_page(&objects, "", &after).await.map_err(e)?;
            for o in &page.objects {
                if pgs.contains(&pg_of(bid, &o.key, map.pgs)) && !known.contains(o.key.as_str()) {
                    settle(&o.key).await?;
                }
            }
            after = page.objects.last().map(|o| o.key.clone());
            if !page.truncated {
                break;
            }
        }
        Ok(())
    }
}
