//! Multipart uploads on a PG's chain, and copying one version of an object from another member.
//!
//! Every member of the chain keeps the upload in its local store under the id the gateway
//! chose, and stores each part as it comes down the chain, so completing the upload is, on
//! every member, the local store's own completion: no bytes copied. Completion is a chain write
//! like a PUT (the head checks the condition, gives the version, the key stays locked while it
//! goes down the chain). A member that joins a chain copies its uploads in progress, with
//! their parts, as it catches up (see [`Node::resync_uploads`]), so it can complete them even
//! as the chain's new head. A member that still lacks the upload or a part at completion (a
//! part that changed while it was copied) copies the completed version from the member before
//! it instead, part by part, so its copy has the same parts, ETag and checksum.

use super::{
    Fail, KeyAt, Node, NodeResp, OnePiece, answer, body_of_request, digest_of, json, listing_scope,
    md5_of, meta_of,
};
use crate::map::ClusterMap;
use crate::placement::pg_of;
use crate::wire::Call;
use crate::wire::{
    CV_HEADER, CV_META, MD5_META, PUT_HEADER, WireComplete, WireMeta, WirePart, WirePartPut,
    WireUpload, WireUploadEntry, WireUploadPage, WireUploadState, encode,
};
use bytes::Bytes;
use http::Method;
use packrat_store_api::checksum::ChecksumAlgorithm;
use packrat_store_api::lock::LockCheck;
use packrat_store_api::{
    Bucket, CompleteAs, CompletePart, NewUpload, ObjectInfo, Part, PutObject, PutPart, StoreError,
    UploadQuery, VersionAs, WriteCondition,
};
use std::collections::HashMap;

/// The attributes a copy of the version `meta` describes is stored with: its own, and the
/// node's entries (its `cv`, and its sequence if it was written with versioning).
fn node_attrs(meta: &WireMeta) -> packrat_store_api::ObjectAttrs {
    let mut attrs = meta.put.attrs();
    attrs
        .user_meta
        .push((CV_META.to_string(), meta.cv.to_string()));
    if let Some(seq) = meta.version_seq {
        attrs
            .user_meta
            .push((crate::wire::VER_META.to_string(), seq.to_string()));
    }
    attrs
}

/// The version a copy of `meta` is written as: its own, if it was written with versioning.
pub(super) fn version_as_of(meta: &WireMeta) -> Option<VersionAs> {
    meta.version_seq.map(|seq| VersionAs {
        seq,
        null: meta.version_id.as_deref().is_none_or(|id| id == "null"),
    })
}

/// A copy of a version read from another member, not yet visible here (see
/// [`Node::stage_version`]).
pub(super) enum Staged {
    Whole(Bytes),
    Parts {
        upload_id: String,
        named: Vec<CompletePart>,
    },
}

fn checksum_of(meta: &WireMeta) -> Option<ChecksumAlgorithm> {
    meta.checksum
        .as_ref()
        .and_then(|(a, _, _)| ChecksumAlgorithm::from_name(a))
}

/// What a chain step of an upload does (completion, a versioned write, is apart).
pub(super) enum Step {
    Create(Box<WireUpload>),
    Part {
        number: u32,
        put: WirePartPut,
        body: Bytes,
    },
    Abort,
}

fn algorithm(name: &Option<String>) -> Result<Option<ChecksumAlgorithm>, StoreError> {
    name.as_deref()
        .map(|n| {
            ChecksumAlgorithm::from_name(n)
                .ok_or_else(|| StoreError::Invalid(format!("unknown checksum {n}")))
        })
        .transpose()
}

pub fn wire_part(p: &Part) -> WirePart {
    WirePart {
        part_number: p.part_number,
        etag: p.etag.clone(),
        size: p.size,
        last_modified_ms: p.last_modified_ms,
        checksum: p
            .checksum
            .as_ref()
            .map(|c| (c.algorithm.clone(), c.value.clone(), c.kind.clone())),
    }
}

/// The parts a completion names, as the store takes them.
pub fn complete_parts(wc: &WireComplete) -> Vec<CompletePart> {
    wc.parts
        .iter()
        .map(|p| CompletePart {
            part_number: p.number,
            etag: p.etag.clone(),
            checksums: p
                .checksums
                .iter()
                .filter_map(|(a, v)| ChecksumAlgorithm::from_name(a).map(|a| (a, v.clone())))
                .collect(),
        })
        .collect()
}

impl Node {
    /// `/u/{bucket id}/{pg}/{key}?id=ID&...`: the upload routes (see `crate::wire`).
    pub(super) async fn upload_route<B>(
        &self,
        req: http::Request<B>,
        map: &ClusterMap,
        (bid, pg, key): (u64, u32, &str),
        q: &HashMap<String, String>,
    ) -> Result<NodeResp, Fail>
    where
        B: hyper::body::Body<Data = Bytes>,
        B::Error: std::fmt::Display,
    {
        let Some(id) = q.get("id").cloned() else {
            return Ok(answer(400, "no upload id"));
        };
        // A forwarded step carries the chain's version header (its value unused but for
        // completion).
        let hop: Option<u64> = req
            .headers()
            .get(CV_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let method = req.method().clone();
        let step = match method {
            Method::GET if q.contains_key("copy") => {
                return self.upload_to_copy(map, bid, pg, key, &id).await;
            }
            Method::GET if q.contains_key("part") => {
                let Some(number) = q.get("part").and_then(|v| v.parse().ok()) else {
                    return Ok(answer(400, "bad part number"));
                };
                return self.part_bytes(map, bid, pg, key, &id, number).await;
            }
            Method::GET => return self.describe_upload(map, bid, pg, key, &id, q).await,
            Method::POST if q.contains_key("complete") => {
                let body = body_of_request(req, "completion").await?;
                let wc: WireComplete = serde_json::from_slice(&body)
                    .map_err(|e| StoreError::Invalid(format!("bad completion: {e}")))?;
                let t = q.get("t").and_then(|v| v.parse().ok());
                return self
                    .complete(map, KeyAt { bid, pg, key }, &id, hop, t, wc)
                    .await;
            }
            Method::POST if q.contains_key("create") => {
                let body = body_of_request(req, "upload").await?;
                Step::Create(
                    serde_json::from_slice(&body)
                        .map_err(|e| StoreError::Invalid(format!("bad upload: {e}")))?,
                )
            }
            Method::PUT => {
                let Some(number) = q.get("part").and_then(|v| v.parse().ok()) else {
                    return Ok(answer(400, "no part number"));
                };
                let put: WirePartPut = super::put_header(&req, "part")?;
                let body = body_of_request(req, "part").await?;
                Step::Part { number, put, body }
            }
            Method::DELETE => Step::Abort,
            _ => return Ok(answer(405, "method not allowed")),
        };
        self.upload_step(map, KeyAt { bid, pg, key }, &id, hop.is_none(), step)
            .await
    }

    /// Begins, adds a part to or aborts an upload here, then down the chain. A member that
    /// lacks the upload (it joined the chain after the upload began) skips its parts and
    /// abort: it copies the object if the upload completes.
    pub(super) async fn upload_step(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        id: &str,
        at_head: bool,
        step: Step,
    ) -> Result<NodeResp, Fail> {
        let KeyAt { bid, pg, key } = at;
        let (chain, pos) = self.chain_position(map, pg, at_head)?;
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let lacks = |e: &StoreError| !at_head && matches!(e, StoreError::NoSuchUpload);
        let path = format!("/u/{bid}/{pg}/{}?id={}", encode(key), encode(id));
        let mut headers = vec![(CV_HEADER, "0".to_string())];
        let (out, method, path, body) = match step {
            Step::Create(up) => {
                let checksum = algorithm(&up.checksum)?;
                let new = NewUpload {
                    owner_id: up.owner_id.clone(),
                    initiated_ms: up.initiated_ms,
                    attrs: up.put.attrs(),
                    checksum,
                    checksum_type: up.checksum_type.clone(),
                    upload_id: Some(id.to_string()),
                };
                self.store.create_upload(&objects, key, new).await?;
                let body =
                    serde_json::to_vec(&up).map_err(|e| StoreError::internal("upload", e))?;
                (
                    answer(200, Bytes::new()),
                    Method::POST,
                    format!("{path}&create"),
                    Bytes::from(body),
                )
            }
            Step::Part {
                number,
                mut put,
                body,
            } => {
                let known = self
                    .check_body(&mut put.body_crc32c, &mut put.body_md5, &body, at_head, key)
                    .await?;
                let md5 = md5_of(&put.content_md5)?;
                let stored = self
                    .store
                    .upload_part(
                        &objects,
                        key,
                        id,
                        number,
                        &mut OnePiece(Some(body.clone()), None, Some(known)),
                        PutPart {
                            checksum: algorithm(&put.checksum)?,
                            expected_checksum: digest_of(&put.expected_checksum)?,
                            content_md5: md5,
                        },
                    )
                    .await;
                let out = match stored {
                    Ok(p) => json(200, &wire_part(&p)),
                    Err(e) if lacks(&e) => answer(200, Bytes::new()),
                    Err(e) => return Err(e.into()),
                };
                headers.push((
                    PUT_HEADER,
                    serde_json::to_string(&put).map_err(|e| StoreError::internal("part", e))?,
                ));
                (out, Method::PUT, format!("{path}&part={number}"), body)
            }
            Step::Abort => {
                match self.store.abort_upload(&objects, key, id).await {
                    Err(e) if lacks(&e) => {}
                    r => r?,
                }
                (
                    answer(204, Bytes::new()),
                    Method::DELETE,
                    path,
                    Bytes::new(),
                )
            }
        };
        self.forward(
            map,
            chain,
            pos,
            Call {
                method,
                path: &path,
                headers: &headers,
                body,
            },
        )
        .await?;
        Ok(out)
    }

    /// CompleteMultipartUpload on the chain: a versioned write, as `Node::write` does a PUT.
    /// The head checks the condition and gives the version and the time (`t`, passed down
    /// so every copy shows the same one).
    async fn complete(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        id: &str,
        cv: Option<u64>,
        t: Option<i64>,
        wc: WireComplete,
    ) -> Result<NodeResp, Fail> {
        let KeyAt { bid, pg, key } = at;
        if wc.versioning.is_some() {
            self.note_versioned(bid);
        }
        let step = self
            .begin_step(map, bid, pg, key, cv, wc.versioning.is_some())
            .await?;
        let (at_head, cv, objects) = (step.at_head(), step.cv, &step.objects);
        let t = t.unwrap_or_else(|| (super::now_micros() / 1000) as i64);
        let mut meta = step.obj.as_ref().map(meta_of);
        if cv > step.have {
            self.mark_dirty(bid, key, cv);
            let condition = match at_head {
                // Decided once, at the head, against its committed copy.
                true => WriteCondition {
                    if_none_match_any: wc.if_none_match_any,
                    if_match: wc.if_match.clone(),
                },
                false => WriteCondition::default(),
            };
            let mut stamp = CompleteAs {
                last_modified_ms: Some(t),
                user_meta: vec![(CV_META.to_string(), cv.to_string())],
                version_as: wc.versioning.map(|v| v.version_as(cv)),
            };
            if stamp.version_as.is_some() {
                stamp
                    .user_meta
                    .push((crate::wire::VER_META.to_string(), cv.to_string()));
            }
            let done = self
                .store
                .complete_upload(objects, key, id, complete_parts(&wc), &condition, &stamp)
                .await;
            let info = match done {
                Ok(info) => Ok(info),
                // This member lacks the upload or a part (a part replaced as it was copied
                // here, or the upload begun before it joined and not yet copied): it copies
                // the version the member before it made.
                Err(
                    StoreError::NoSuchUpload
                    | StoreError::InvalidPart(_)
                    | StoreError::InvalidPartOrder
                    | StoreError::EntityTooSmall,
                ) if !at_head => {
                    let _ = self.store.abort_upload(objects, key, id).await;
                    let from = &step.chain[step.pos - 1];
                    tracing::info!(
                        key,
                        cv,
                        %from,
                        "completing an upload this node lacks parts of: copying the object"
                    );
                    self.pull_version(map, from, objects, KeyAt { bid, pg, key }, cv)
                        .await
                }
                Err(e) => Err(e.into()),
            };
            meta = Some(self.applied(&step, info).await?);
        } else {
            // A newer write of the key is here already: the upload's parts are not needed.
            let _ = self.store.abort_upload(objects, key, id).await;
        }
        let mut wc = wc;
        wc.if_match = None;
        wc.if_none_match_any = false;
        let body = serde_json::to_vec(&wc).map_err(|e| StoreError::internal("completion", e))?;
        let path = format!(
            "/u/{bid}/{pg}/{}?id={}&complete&t={t}",
            encode(key),
            encode(id)
        );
        let headers = [(CV_HEADER, cv.to_string())];
        let meta = self
            .end_step(
                map,
                step,
                Call {
                    method: Method::POST,
                    path: &path,
                    headers: &headers,
                    body: Bytes::from(body),
                },
                meta,
            )
            .await?
            .ok_or(StoreError::NoSuchKey)?;
        Ok(json(200, &meta))
    }

    /// An upload and, with `parts`, a page of its parts, from the head (which holds every part
    /// the chain acknowledged).
    async fn describe_upload(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        id: &str,
        q: &HashMap<String, String>,
    ) -> Result<NodeResp, Fail> {
        if q.contains_key("any") {
            self.upload_source(map, pg)?;
        } else if map.chain(pg).first() != Some(&self.id) {
            return Err(Fail::Refused(format!("not the head of PG {pg}")));
        }
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let up = self
            .store
            .upload(&objects, key, id)
            .await?
            .ok_or(StoreError::NoSuchUpload)?;
        let (parts, truncated) = match q.contains_key("parts") {
            true => {
                let after = q.get("after").and_then(|v| v.parse().ok()).unwrap_or(0);
                let max = q
                    .get("max")
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(1000usize)
                    .clamp(1, 10_000);
                self.store.list_parts(&up, &objects, after, max).await?
            }
            false => (Vec::new(), false),
        };
        Ok(json(
            200,
            &WireUploadState {
                owner_id: up.owner_id,
                initiated_ms: up.initiated_ms,
                storage_class: up.storage_class,
                checksum: up.checksum.map(|a| a.name().to_string()),
                checksum_type: up.checksum_type,
                envelope: up.envelope,
                parts: parts.iter().map(wire_part).collect(),
                truncated,
            },
        ))
    }

    /// Refused unless this node is a caught-up member of `pg`, which a member catching up
    /// copies uploads in progress from.
    fn upload_source(&self, map: &ClusterMap, pg: u32) -> Result<(), Fail> {
        if !map.chain(pg).contains(&self.id) || map.is_syncing(&self.id, pg) {
            return Err(Fail::Refused(format!("not a reader of PG {pg}")));
        }
        Ok(())
    }

    /// `GET /u/..?id=ID&copy`: what a member catching up needs to begin the upload itself.
    async fn upload_to_copy(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        id: &str,
    ) -> Result<NodeResp, Fail> {
        self.upload_source(map, pg)?;
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let new = self
            .store
            .upload_to_copy(&objects, key, id)
            .await?
            .ok_or(StoreError::NoSuchUpload)?;
        let mut put = crate::wire::WirePut::default();
        put.set_attrs(new.attrs);
        Ok(json(
            200,
            &WireUpload {
                owner_id: new.owner_id,
                initiated_ms: new.initiated_ms,
                put,
                checksum: new.checksum.map(|a| a.name().to_string()),
                checksum_type: new.checksum_type,
            },
        ))
    }

    /// `GET /u/..?id=ID&part=N`: a part's bytes, for a member catching up.
    async fn part_bytes(
        &self,
        map: &ClusterMap,
        bid: u64,
        pg: u32,
        key: &str,
        id: &str,
        number: u32,
    ) -> Result<NodeResp, Fail> {
        self.upload_source(map, pg)?;
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let Some((part, reader)) = self.store.read_part(&objects, key, id, number).await? else {
            return Ok(answer(404, "no such upload or part"));
        };
        Ok(answer(200, super::read_whole(reader, part.size).await?))
    }

    /// Copies the uploads in progress of `pgs` that the caught-up member at `addr` has, with
    /// their parts, into this node, which joins those PGs' chains (a node added, a replica
    /// made again): so that it can complete them itself, even as the head. Before, it
    /// skipped the parts written before it joined, and a completion at it as the new head
    /// answered NoSuchUpload or InvalidPart. Its own upload is begun before the source's
    /// parts are listed, so a part that came down the chain before (and that this node
    /// skipped, lacking the upload) is on the source's list. Answers the parts copied.
    pub(super) async fn resync_uploads(
        &self,
        map: &ClusterMap,
        pgs: &std::collections::HashSet<u32>,
        bid: u64,
        addr: &str,
    ) -> Result<usize, String> {
        let e = |e: StoreError| e.to_string();
        let objects = self.local_bucket(format!("o-{bid}")).await.map_err(e)?;
        let pg_list = pgs.iter().map(u32::to_string).collect::<Vec<_>>().join(",");
        let mut marker: Option<(String, String)> = None;
        let mut copied = 0;
        loop {
            let mut path = format!("/ul/{bid}?pgs={pg_list}&max=1000");
            if let Some((k, id)) = &marker {
                path.push_str(&format!("&key={}&id={}", encode(k), encode(id)));
            }
            let ans = self.fetch(addr, &path, map.epoch).await?;
            if ans.status != 200 {
                return Err(format!("uploads from {addr}: {}", ans.error().await));
            }
            let page: WireUploadPage = ans.json().await.map_err(e)?;
            for u in &page.uploads {
                match self.copy_upload(map, &objects, bid, addr, u).await {
                    Ok(n) => copied += n,
                    // Ended on the source meanwhile (completed or aborted): its end comes
                    // down the chain, or the object with the resync.
                    Err(Fail::Refused(_)) => {}
                    Err(Fail::Store(err)) => return Err(format!("{} upload: {err}", u.key)),
                }
            }
            marker = page
                .uploads
                .last()
                .map(|u| (u.key.clone(), u.upload_id.clone()));
            if !page.truncated || marker.is_none() {
                return Ok(copied);
            }
        }
    }

    /// One upload of [`Node::resync_uploads`]: begun here if missing, then each part the
    /// source has and this node lacks (or holds other bytes of) copied. `Fail::Refused` if
    /// the upload ended on the source.
    async fn copy_upload(
        &self,
        map: &ClusterMap,
        objects: &Bucket,
        bid: u64,
        addr: &str,
        u: &WireUploadEntry,
    ) -> Result<usize, Fail> {
        let (key, id) = (u.key.as_str(), u.upload_id.as_str());
        let pg = pg_of(bid, key, map.pgs);
        let base = format!("/u/{bid}/{pg}/{}?id={}", encode(key), encode(id));
        let get = |path: String| self.ask_upload_source(map, addr, path);
        let mut mine: HashMap<u32, String> = HashMap::new();
        let created = match self.store.upload(objects, key, id).await? {
            Some(up) => {
                let mut after = 0;
                loop {
                    let (parts, more) = self.store.list_parts(&up, objects, after, 1000).await?;
                    for p in &parts {
                        mine.insert(p.part_number, p.etag.clone());
                    }
                    after = parts.last().map_or(after, |p| p.part_number);
                    if !more || parts.is_empty() {
                        break;
                    }
                }
                false
            }
            None => {
                let up: WireUpload = get(format!("{base}&copy")).await?.json().await?;
                let new = NewUpload {
                    owner_id: up.owner_id,
                    initiated_ms: up.initiated_ms,
                    attrs: up.put.attrs(),
                    checksum: algorithm(&up.checksum)?,
                    checksum_type: up.checksum_type,
                    upload_id: Some(id.to_string()),
                };
                self.store.create_upload(objects, key, new).await?;
                true
            }
        };
        let copied = self
            .copy_parts(map, addr, (objects, key, id), &base, &mine, &u.checksum)
            .await;
        if created && matches!(copied, Err(Fail::Refused(_))) {
            // Ended on the source before its parts were listed: nothing to keep here.
            let _ = self.store.abort_upload(objects, key, id).await;
        }
        copied
    }

    /// A GET of an upload route from the member a resync copies from: 404 (the upload ended
    /// there) is `Fail::Refused`.
    async fn ask_upload_source(
        &self,
        map: &ClusterMap,
        addr: &str,
        path: String,
    ) -> Result<crate::wire::Answer, Fail> {
        let ans = self
            .fetch(addr, &path, map.epoch)
            .await
            .map_err(|why| Fail::Store(StoreError::Unavailable(why)))?;
        match ans.status {
            200 => Ok(ans),
            404 => Err(Fail::Refused(format!(
                "{path}: the upload ended on the source"
            ))),
            _ => Err(ans.error().await.into()),
        }
    }

    /// The parts of an upload the source has and this node lacks, copied (see
    /// [`Node::copy_upload`]).
    async fn copy_parts(
        &self,
        map: &ClusterMap,
        addr: &str,
        (objects, key, id): (&Bucket, &str, &str),
        base: &str,
        mine: &HashMap<u32, String>,
        checksum: &Option<String>,
    ) -> Result<usize, Fail> {
        let get = |path: String| self.ask_upload_source(map, addr, path);
        let checksum = algorithm(checksum)?;
        let mut copied = 0;
        let mut after = 0;
        loop {
            let state: WireUploadState = get(format!("{base}&parts&any&after={after}&max=1000"))
                .await?
                .json()
                .await?;
            for p in &state.parts {
                if mine.get(&p.part_number) == Some(&p.etag) {
                    continue;
                }
                let body = get(format!("{base}&part={}", p.part_number))
                    .await?
                    .bytes()
                    .await?;
                let stored = self
                    .store
                    .upload_part(
                        objects,
                        key,
                        id,
                        p.part_number,
                        &mut OnePiece(Some(body), None, None),
                        PutPart {
                            checksum,
                            ..Default::default()
                        },
                    )
                    .await?;
                if stored.etag != p.etag {
                    // Replaced on the source while it was read: the new part comes down the
                    // chain (or the completion copies the object).
                    tracing::debug!(key, part = p.part_number, "a part changed while copied");
                }
                copied += 1;
            }
            after = state.parts.last().map_or(after, |p| p.part_number);
            if !state.truncated || state.parts.is_empty() {
                break;
            }
        }
        Ok(copied)
    }

    /// `/ul/{bucket id}?pgs=..&prefix=..&key=..&id=..&max=..`: this node's uploads in progress
    /// of the PGs asked (those it heads), after the key and upload id given.
    pub(super) async fn list_uploads(
        &self,
        map: &ClusterMap,
        bid: u64,
        q: &HashMap<String, String>,
    ) -> Result<WireUploadPage, Fail> {
        let (pgs, max) = listing_scope(q);
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let mut query = UploadQuery {
            prefix: q.get("prefix").cloned().unwrap_or_default(),
            delimiter: None,
            key_marker: q.get("key").cloned(),
            upload_id_marker: q.get("id").cloned(),
            max_uploads: 1000,
        };
        let mut page = WireUploadPage::default();
        loop {
            let local = self.store.list_uploads(&objects, &query).await?;
            for u in &local.uploads {
                query.key_marker = Some(u.key.clone());
                query.upload_id_marker = Some(u.upload_id.clone());
                if !pgs.contains(&pg_of(bid, &u.key, map.pgs)) {
                    continue;
                }
                if page.uploads.len() >= max {
                    page.truncated = true;
                    return Ok(page);
                }
                page.uploads.push(WireUploadEntry {
                    key: u.key.clone(),
                    upload_id: u.upload_id.clone(),
                    owner_id: u.owner_id.clone(),
                    initiated_ms: u.initiated_ms,
                    storage_class: u.storage_class.clone(),
                    checksum: u.checksum.map(|a| a.name().to_string()),
                    checksum_type: u.checksum_type.clone(),
                });
            }
            if !local.truncated {
                return Ok(page);
            }
        }
    }

    /// Copies version `cv` of a key from member `from` (the one before this node in the chain,
    /// which made it and holds the key locked until this node answers).
    pub(super) async fn pull_version(
        &self,
        map: &ClusterMap,
        from: &str,
        objects: &Bucket,
        at: KeyAt<'_>,
        cv: u64,
    ) -> Result<ObjectInfo, Fail> {
        let KeyAt { bid, pg, key } = at;
        let addr = map
            .addr(from)
            .ok_or_else(|| StoreError::internal("cluster map", format!("no address for {from}")))?;
        let path = format!("/o/{bid}/{pg}/{}?meta&any&pull", encode(key));
        let meta: WireMeta = self.fetch_json(addr, &path, map.epoch).await?;
        if meta.cv != cv {
            return Err(Fail::Store(StoreError::Unavailable(format!(
                "{from} has version {} of {key}, not {cv}",
                meta.cv
            ))));
        }
        let staged = self
            .stage_version(map, addr, objects, KeyAt { bid, pg, key }, &meta)
            .await?;
        self.commit_version(objects, key, &meta, staged).await
    }

    /// Reads the version `meta` describes from the member at `addr` and readies it here
    /// without making it visible, so a resync holds no key's lock while bytes travel: an
    /// object of one part is held in memory; a multipart object becomes an upload of the same
    /// part sizes, so the copy has the same ETag, parts and checksum. `Fail::Refused` when
    /// the source no longer has that version.
    pub(super) async fn stage_version(
        &self,
        map: &ClusterMap,
        addr: &str,
        objects: &Bucket,
        at: KeyAt<'_>,
        meta: &WireMeta,
    ) -> Result<Staged, Fail> {
        let KeyAt { bid, pg, key } = at;
        let range = |start: u64, end: u64| async move {
            let mut path = format!(
                "/o/{bid}/{pg}/{}?cv={}&start={start}&end={end}",
                encode(key),
                meta.cv
            );
            // A version other than the key's current one is read by its id.
            if let Some(id) = &meta.version_id {
                path.push_str(&format!("&version={}", encode(id)));
            }
            let ans = self
                .fetch(addr, &path, map.epoch)
                .await
                .map_err(|why| Fail::Store(StoreError::Unavailable(why)))?;
            if ans.status == 409 {
                return Err(Fail::Refused(format!("{key}: overwritten on the source")));
            }
            if ans.status != 200 {
                return Err(ans.error().await.into());
            }
            let body = ans.bytes().await?;
            if body.len() as u64 != end - start {
                return Err(Fail::Store(StoreError::Unavailable(format!(
                    "{key}: a short copy from {addr}"
                ))));
            }
            Ok(body)
        };
        if meta.part_sizes.is_empty() {
            return Ok(Staged::Whole(range(0, meta.size).await?));
        }
        let attrs = node_attrs(meta);
        let up = self
            .store
            .create_upload(
                objects,
                key,
                NewUpload {
                    owner_id: "packrat-cluster".into(),
                    initiated_ms: attrs.last_modified_ms,
                    attrs,
                    checksum: checksum_of(meta),
                    checksum_type: meta.checksum.as_ref().map(|(_, _, kind)| kind.clone()),
                    upload_id: None,
                },
            )
            .await?;
        let upload_id = up.upload_id;
        let parts = async {
            let mut named = Vec::with_capacity(meta.part_sizes.len());
            let mut start = 0;
            for (i, size) in meta.part_sizes.iter().enumerate() {
                let body = range(start, start + size).await?;
                start += size;
                let part = self
                    .store
                    .upload_part(
                        objects,
                        key,
                        &upload_id,
                        i as u32 + 1,
                        &mut OnePiece(Some(body), None, None),
                        PutPart::default(),
                    )
                    .await?;
                named.push(CompletePart {
                    part_number: part.part_number,
                    etag: part.etag,
                    checksums: Vec::new(),
                });
            }
            Ok(named)
        }
        .await;
        match parts {
            Ok(named) => Ok(Staged::Parts { upload_id, named }),
            Err(e) => {
                let _ = self.store.abort_upload(objects, key, &upload_id).await;
                Err(e)
            }
        }
    }

    /// Makes a staged copy the key's object here (the caller holds the key's lock and has
    /// checked that the version is newer than what this node has). A version written with
    /// versioning keeps its sequence (see `VER_META`): in the key's history where that places
    /// it, the current object kept in its history if the copy is newer.
    pub(super) async fn commit_version(
        &self,
        objects: &Bucket,
        key: &str,
        meta: &WireMeta,
        staged: Staged,
    ) -> Result<ObjectInfo, Fail> {
        self.commit_version_as(objects, key, meta, staged, version_as_of(meta))
            .await
    }

    /// [`Node::commit_version`] with the version given (a copy of a plain object into a
    /// key's history gives it one).
    pub(super) async fn commit_version_as(
        &self,
        objects: &Bucket,
        key: &str,
        meta: &WireMeta,
        staged: Staged,
        version_as: Option<VersionAs>,
    ) -> Result<ObjectInfo, Fail> {
        let (upload_id, named) = match staged {
            Staged::Whole(body) => {
                let mut attrs = node_attrs(meta);
                let md5_of_hex = |h: &str| {
                    hex::decode(h)
                        .ok()
                        .and_then(|v| <[u8; 16]>::try_from(v.as_slice()).ok())
                };
                // An ETag that shows another MD5 than the stored bytes' (SSE-S3) is kept as
                // the source shows it, and the copy checked against the stored bytes' MD5.
                let (md5, shown) = match &meta.stored_md5 {
                    Some(stored) => {
                        attrs.user_meta.push((MD5_META.to_string(), stored.clone()));
                        (md5_of_hex(stored), md5_of_hex(&meta.etag))
                    }
                    None => (md5_of_hex(&meta.etag), None),
                };
                let info = self
                    .store
                    .put_object(
                        objects,
                        key,
                        &mut OnePiece(Some(body), shown, None),
                        PutObject {
                            attrs,
                            checksum: checksum_of(meta),
                            // The copy is checked against the source's MD5 as it is stored.
                            content_md5: md5,
                            version_as,
                            ..Default::default()
                        },
                    )
                    .await?;
                return Ok(info);
            }
            Staged::Parts { upload_id, named } => (upload_id, named),
        };
        // The version is in the upload's attributes (`stage_version`); the time is the source's.
        let stamp = CompleteAs {
            last_modified_ms: Some(meta.put.last_modified_ms),
            user_meta: Vec::new(),
            version_as,
        };
        let done = self
            .store
            .complete_upload(
                objects,
                key,
                &upload_id,
                named,
                &WriteCondition::default(),
                &stamp,
            )
            .await;
        let info = match done {
            Ok(info) => info,
            Err(e) => {
                let _ = self.store.abort_upload(objects, key, &upload_id).await;
                return Err(e.into());
            }
        };
        if info.etag != meta.etag {
            // The parts' MD5s differ from the source's: the bytes read are not its bytes.
            match (version_as, &info.version_id) {
                (Some(_), Some(id)) => {
                    self.store
                        .delete_version(&super::with_versions(objects), key, id, LockCheck::Decided)
                        .await?;
                }
                _ => {
                    self.store.delete_object(objects, key).await?;
                }
            }
            return Err(Fail::Store(StoreError::Unavailable(format!(
                "{key}: the copy's ETag {} is not the source's {}",
                info.etag, meta.etag
            ))));
        }
        Ok(info)
    }

    /// Drops a staged copy that is not needed after all.
    pub(super) async fn drop_staged(&self, objects: &Bucket, key: &str, staged: Staged) {
        if let Staged::Parts { upload_id, .. } = staged {
            let _ = self.store.abort_upload(objects, key, &upload_id).await;
        }
    }
}
