//! Reads at a member: metadata (committed copies for readers, any copy for a member catching
//! up), gathered lookups, object bytes and TAR members, and listings of the PGs it holds.

use super::{
    Asker, Fail, GATHERED_META_ROOM, Node, NodeResp, RECENT_MAX, UNSETTLED, answer, answer_bytes,
    cv_of, json, listing_scope, meta_of, streamed,
};
use crate::map::ClusterMap;
use crate::placement::pg_of;
use crate::wire::{GatherItem, Gathered, WireEntry, WirePage};
use bytes::{Bytes, BytesMut};
use packrat_store_api::{Bucket, ListQuery, ObjectInfo, StoreError, StoreResult};
use std::collections::HashMap;

impl Node {
    /// A page of up to 1000 keys of a local bucket under `prefix`, after `after`.
    pub(super) async fn local_page(
        &self,
        bucket: &Bucket,
        prefix: &str,
        after: &Option<String>,
    ) -> StoreResult<packrat_store_api::ObjectPage> {
        let query = ListQuery {
            prefix: prefix.to_string(),
            delimiter: None,
            after: after.clone(),
            max_keys: 1000,
        };
        self.store.list_objects(bucket, &query).await
    }

    /// An object's metadata, if this node may answer `who` for it: a reader gets it from a
    /// caught-up member whose copy is committed (the tail's always is); a resync also gets a
    /// dirty copy; the next member of the chain, copying the version this node just made
    /// (see `uploads`), gets it from a member still syncing too.
    pub(super) async fn read_meta(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        who: Asker,
    ) -> Result<ObjectInfo, Fail> {
        let chain = map.chain(pg);
        if !chain.contains(&self.id) || (who != Asker::Successor && map.is_syncing(&self.id, pg)) {
            return Err(Fail::Refused(format!("not a reader of PG {pg}")));
        }
        let is_tail = chain.last().is_some_and(|n| *n == self.id);
        let objects = self.reading_bucket(bid).await?;
        let info = self.store.head_object(&objects, key).await?;
        // Judged after the lookup: a write marks the key before it stores its version and
        // clears the mark once the tail has it, so a copy found here and not dirty now was
        // committed (judged before, a write could land between the two).
        if who == Asker::Reader {
            match self.dirty_since(bid, key) {
                Some(_) if !is_tail => return Err(Fail::Refused("dirty: ask the tail".into())),
                // A version this member took before it became the tail may be missing at the
                // members before it: it is committed once re-sent through the head.
                Some(epoch) if epoch < map.epoch => {
                    return Err(Fail::Refused(format!(
                        "{UNSETTLED}: the tail's version of {key} is not yet at every member"
                    )));
                }
                _ => {}
            }
        }
        info.ok_or_else(|| StoreError::NoSuchKey.into())
    }

    /// An object's metadata (see [`Node::read_meta`]) and, when it has 1 to `inline` bytes,
    /// its bytes; a version handed out without them is remembered for the read that follows.
    pub(super) async fn meta_and_bytes(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        who: Asker,
        inline: u64,
    ) -> Result<(ObjectInfo, Option<Bytes>), Fail> {
        let info = self.read_meta(map, bid, pg, key, who).await?;
        if info.size > inline || info.size == 0 {
            self.remember(bid, key, &info);
            return Ok((info, None));
        }
        let reader = self.store.read_object(&info, 0, info.size)?;
        let body = read_whole(reader, info.size).await?;
        Ok((info, Some(body)))
    }

    /// The answers to a gathered request's lookups, in the order asked (see [`GatherItem`]):
    /// each as [`Node::meta_and_bytes`] answers a reader, looked up side by side; the
    /// metadata in binary when the gateway asked for it (`binary`), else JSON.
    pub(super) async fn gathered(
        &self,
        map: &ClusterMap,
        items: &[GatherItem],
        binary: bool,
    ) -> NodeResp {
        let answers = futures_util::future::join_all(items.iter().map(|it| async move {
            if pg_of(it.bid, &it.key, map.pgs) != it.pg {
                return Err(Fail::Refused("the key is not in that PG".into()));
            }
            self.meta_and_bytes(map, it.bid, it.pg, &it.key, Asker::Reader, it.inline)
                .await
        }))
        .await;
        // Sized up front: growing it copied every answer already in it again (about 3% of a
        // node's CPU under 4 KiB GETs at 64 connections).
        let room = answers
            .iter()
            .map(|a| match a {
                Ok((_, bytes)) => GATHERED_META_ROOM + bytes.as_ref().map_or(0, Bytes::len),
                Err(_) => GATHERED_META_ROOM,
            })
            .sum();
        let mut out = BytesMut::with_capacity(room);
        for a in answers {
            match a {
                Ok((info, bytes)) if binary => {
                    Gathered::put_found_bin(&mut out, &meta_of(&info), bytes.as_deref())
                }
                Ok((info, bytes)) => match serde_json::to_vec(&meta_of(&info)) {
                    Ok(meta) => Gathered::put_found(&mut out, &meta, bytes.as_deref()),
                    Err(e) => Gathered::put_alone(&mut out, &e.to_string()),
                },
                Err(Fail::Store(StoreError::NoSuchKey | StoreError::NoSuchBucket)) => {
                    Gathered::put_missing(&mut out)
                }
                Err(Fail::Refused(why)) => Gathered::put_alone(&mut out, &why),
                Err(Fail::Store(e)) => Gathered::put_alone(&mut out, &e.to_string()),
            }
        }
        answer(200, out.freeze())
    }

    /// Keeps a version handed out without its bytes for the read that follows.
    pub(super) fn remember(&self, bid: u64, key: &str, info: &ObjectInfo) {
        if let Ok(mut r) = self.recent.lock() {
            if r.len() >= RECENT_MAX {
                r.clear();
            }
            r.insert((bid, key.to_string(), cv_of(info)), info.clone());
        }
    }

    /// Version `want` of a key as this node has it (remembered from the lookup that handed it
    /// out, or its current object); refused if it is gone.
    pub(super) async fn version_here(
        &self,
        bid: u64,
        key: &str,
        want: u64,
    ) -> Result<ObjectInfo, Fail> {
        let cached = self
            .recent
            .lock()
            .ok()
            .and_then(|r| r.get(&(bid, key.to_string(), want)).cloned());
        if let Some(i) = cached {
            return Ok(i);
        }
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let info = self
            .store
            .head_object(&objects, key)
            .await?
            .ok_or(StoreError::NoSuchKey)?;
        if cv_of(&info) != want {
            return Err(Fail::Refused("the version asked for is gone".into()));
        }
        Ok(info)
    }

    /// Where the named members of version `want` of a TAR object lie in it (see
    /// `ObjectStore::tar_members`).
    pub(super) async fn tar_members(
        &self,
        bid: u64,
        key: &str,
        want: u64,
        names: &[String],
    ) -> Result<NodeResp, Fail> {
        let info = self.version_here(bid, key, want).await?;
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let found = self.store.tar_members(&objects, key, &info, names).await?;
        Ok(json(200, &found))
    }

    /// Bytes `[start, end)` of version `want` of a key, streamed as the local store verifies
    /// them.
    pub(super) async fn read_bytes(
        &self,
        bid: u64,
        key: &str,
        want: u64,
        version: Option<&str>,
        start: u64,
        end: u64,
    ) -> Result<NodeResp, Fail> {
        let info = match version {
            Some(id) => self.version_by_id(bid, key, id, want).await?,
            None => self.version_here(bid, key, want).await?,
        };
        let mut reader = self.store.read_object(&info, start, end)?;
        // A single piece is read before answering, so a failed read is an error, not a cut.
        if reader.is_single_piece() {
            let piece = reader.next().await?.unwrap_or_default();
            return Ok(answer_bytes(piece));
        }
        let stream = futures_util::stream::unfold(reader, |mut r| async move {
            match r.next().await {
                Ok(Some(b)) => Some((Ok(b), r)),
                Ok(None) => None,
                Err(e) => Some((Err(std::io::Error::other(e.to_string())), r)),
            }
        });
        Ok(streamed(stream))
    }

    /// A page of this node's objects (or, with `tombstones`, tombstones) of the PGs asked.
    pub(super) async fn list(
        &self,
        map: &ClusterMap,
        bid: u64,
        q: &HashMap<String, String>,
    ) -> Result<WirePage, Fail> {
        let (pgs, max) = listing_scope(q);
        let tombstones = q.contains_key("tombstones");
        let with_cv = q.contains_key("cv");
        let prefix = q.get("prefix").cloned().unwrap_or_default();
        let delimiter = q.get("delimiter").filter(|d| !d.is_empty()).cloned();
        let mut after = q.get("after").cloned();
        // A page that ended on a common prefix resumes after everything under it.
        if let Some(a) = after.as_mut() {
            WireEntry::resume_after_prefix(&prefix, delimiter.as_deref(), a);
        }
        let bucket = self
            .local_bucket(format!("{}-{bid}", if tombstones { "t" } else { "o" }))
            .await?;
        let mut page = WirePage::default();
        'pages: loop {
            let local = self.local_page(&bucket, &prefix, &after).await?;
            for o in &local.objects {
                after = Some(o.key.clone());
                if !pgs.contains(&pg_of(bid, &o.key, map.pgs)) {
                    continue;
                }
                if page.entries.len() >= max {
                    page.truncated = true;
                    break 'pages;
                }
                if let Some(d) = &delimiter
                    && let Some(i) = o.key[prefix.len()..].find(d.as_str())
                {
                    let cp = o.key[..prefix.len() + i + d.len()].to_string();
                    page.entries.push(WireEntry::common_prefix(cp.clone()));
                    // Skip the rest of the common prefix.
                    after = Some(format!("{cp}{}", char::MAX));
                    continue 'pages;
                }
                // A tombstone's version, or with `cv` an object's (a resync compares it with its
                // own before it asks for the object).
                let cv = if tombstones || with_cv {
                    self.store
                        .head_object(&bucket, &o.key)
                        .await?
                        .map_or(0, |t| cv_of(&t))
                } else {
                    0
                };
                // Judged after the lookup, as `read_meta` judges a reader's: a copy not marked
                // now was committed.
                let unsettled = (tombstones || with_cv) && self.is_dirty(bid, &o.key);
                page.entries.push(WireEntry {
                    deleted: tombstones,
                    cv,
                    prefix: false,
                    unsettled,
                    ..entry_of(o)
                });
            }
            if !local.truncated {
                break;
            }
        }
        Ok(page)
    }
}

/// Every piece of a read of `size` bytes, in one buffer (a read in one piece as it came, not
/// copied).
pub(super) async fn read_whole(
    mut reader: Box<dyn packrat_store_api::ObjectRead>,
    size: u64,
) -> StoreResult<Bytes> {
    if reader.is_single_piece() {
        return Ok(reader.next().await?.unwrap_or_default());
    }
    let mut body = bytes::BytesMut::with_capacity(size as usize);
    while let Some(piece) = reader.next().await? {
        body.extend_from_slice(&piece);
    }
    Ok(body.freeze())
}

pub(super) fn entry_of(o: &packrat_store_api::ObjectSummary) -> WireEntry {
    WireEntry {
        key: o.key.clone(),
        prefix: false,
        deleted: false,
        size: o.size,
        etag: o.etag.clone(),
        last_modified_ms: o.last_modified_ms,
        checksum: o.checksum.clone(),
        storage_class: o.storage_class.clone(),
        cv: 0,
        unsettled: false,
    }
}
