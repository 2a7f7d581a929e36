//! Chain replication at one member: a step's start (its place in the chain, the key's lock,
//! its version, its count under the map's epoch), writes and deletes applied here and handed
//! on to the next member, relayed steps, and tombstones collected once they are old.

use super::{
    CHAIN_BROKEN, Fail, HASH_INLINE_BYTES_MAX, HeldSlot, KeyStep, Node, NodeResp, OnePiece, answer,
    body_of_request, cv_of, digest_of, flip_next, hash_body, md5_of, meta_of, now_micros,
};
use crate::map::ClusterMap;
use crate::relay::RelayItem;
use crate::wire::Call;
use crate::wire::{
    CV_HEADER, CV_META, MD5_META, PUT_HEADER, VER_META, WireError, WireMeta, WirePut, WireRefusal,
    WireVersioning, encode, hop_timeout,
};
use base64::Engine;
use bytes::{Bytes, BytesMut};
use futures_util::future::BoxFuture;
use http::{Method, Response};
use http_body_util::{BodyExt, StreamBody};
use packrat_store_api::{Bucket, ObjectInfo, PutObject, StoreError, StoreResult};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// A key as every chain step names it: its bucket's id, its PG, the key.
#[derive(Clone, Copy, Debug)]
pub(crate) struct KeyAt<'a> {
    pub bid: u64,
    pub pg: u32,
    pub key: &'a str,
}

impl Node {
    /// A relayed request (`POST /w`) whose sender takes each step's answer as the step ends
    /// (see [`crate::relay::RELAY_ANSWERS_HEADER`]): the steps run side by side, and each
    /// answer goes out as soon as its step is over, so a step whose chain is slow holds back
    /// none of the others. Before, the answer waited for the slowest step: one PG with a hung
    /// successor held every write relayed with it for the hop's timeout.
    pub(super) async fn relayed_as_they_end<B>(
        self: Arc<Self>,
        req: http::Request<B>,
        held: HeldSlot,
    ) -> NodeResp
    where
        B: hyper::body::Body<Data = Bytes> + Send + 'static,
        B::Error: std::fmt::Display,
    {
        use futures_util::StreamExt;
        let items = match body_of_request(req, "relayed steps").await {
            Ok(body) => RelayItem::parse_all(body),
            Err(e) => Err(e),
        };
        let items = match items {
            Ok(items) => items,
            Err(e) => return self.respond(Err(e.into())),
        };
        let steps: futures_util::stream::FuturesUnordered<_> = items
            .into_iter()
            .enumerate()
            .map(|(i, item)| {
                let me = self.clone();
                async move {
                    let (status, body) = me.relayed_step(item).await;
                    let (status, body) = match me.fenced_meanwhile() {
                        Some(e) if (200..300).contains(&status) => {
                            let (status, err) = WireError::of(&e);
                            (
                                status,
                                Bytes::from(serde_json::to_vec(&err).unwrap_or_default()),
                            )
                        }
                        _ => (status, body),
                    };
                    let mut out = BytesMut::with_capacity(body.len() + 18);
                    crate::relay::put_indexed_answer(&mut out, i as u32, status, &body);
                    Ok::<_, std::io::Error>(hyper::body::Frame::data(out.freeze()))
                }
            })
            .collect();
        let frames = steps.map(move |frame| {
            let _held = &held;
            frame
        });
        let mut r = Response::new(StreamBody::new(frames).boxed_unsync());
        r.headers_mut().insert(
            crate::relay::RELAY_ANSWERS_HEADER,
            http::HeaderValue::from_static(crate::relay::RELAY_ANSWERS_INDEXED),
        );
        r
    }

    /// The map a request was routed by: ours if the epochs agree. A request from a newer map
    /// waits (briefly) for ours to catch up; one from an older map is refused, so a node or
    /// gateway that missed a change cannot act on it (fencing).
    pub(super) async fn map_at(&self, epoch: u64) -> Result<Arc<ClusterMap>, Fail> {
        let current = self.map.borrow().clone();
        if current.epoch == epoch {
            return Ok(current);
        }
        if epoch < current.epoch {
            return Err(Fail::Refused(format!(
                "epoch {epoch} is older than this node's {}",
                current.epoch
            )));
        }
        let mut rx = self.map.clone();
        let caught_up =
            tokio::time::timeout(Duration::from_secs(2), rx.wait_for(|m| m.epoch >= epoch)).await;
        let current = self.map.borrow().clone();
        match caught_up {
            Ok(Ok(_)) if current.epoch == epoch => Ok(current),
            _ => Err(Fail::Refused(format!(
                "epoch {epoch} is not this node's ({})",
                current.epoch
            ))),
        }
    }

    /// Starts a chain step (a write, a delete, a completion, an attribute edit) of `key` at
    /// this member: its place in the chain (`cv` is `None` at the head, the step's version
    /// further down), the key's lock, what this member has of the key, and the step's version
    /// (chosen here at the head, above everything this member has of the key). With
    /// `versioned` (a step of a bucket with versioning), a delete marker that is the key's
    /// latest version counts as a tombstone of its sequence (the tombstone a versioned delete
    /// leaves is dropped after `--tombstone-keep`; the marker stays).
    pub(super) async fn begin_step<'a>(
        &'a self,
        map: &'a ClusterMap,
        bid: u64,
        pg: u32,
        key: &'a str,
        cv: Option<u64>,
        versioned: bool,
    ) -> Result<KeyStep<'a>, Fail> {
        self.begin_step_as(map, KeyAt { bid, pg, key }, cv, versioned, cv.is_none())
            .await
    }

    /// [`Node::begin_step`], at the head (`at_head`) or further down the chain: a step with
    /// its version given at the head is one re-sent through it (see `unsettled`).
    pub(super) async fn begin_step_as<'a>(
        &'a self,
        map: &'a ClusterMap,
        at: KeyAt<'a>,
        cv: Option<u64>,
        versioned: bool,
        at_head: bool,
    ) -> Result<KeyStep<'a>, Fail> {
        let KeyAt { bid, pg, key } = at;
        // Counted before the map is checked (see `epochs`): a job's step begun on a map this
        // node has since replaced is refused here, before anything is applied.
        let epoch = self.steps.enter(map.epoch);
        let current = self.map.borrow().epoch;
        if current != map.epoch {
            return Err(Fail::Refused(format!(
                "epoch {} is not this node's ({current})",
                map.epoch
            )));
        }
        let (chain, pos) = self.chain_position(map, pg, at_head)?;
        let objects = self.local_bucket(format!("o-{bid}")).await?;
        let tombs = self.local_bucket(format!("t-{bid}")).await?;
        let lock = self.lock_of(bid, key).lock().await;
        let (obj, mut tomb) = self.current(&objects, &tombs, key).await?;
        if versioned && obj.is_none() {
            tomb = tomb.max(self.latest_marker(&objects, key).await?);
        }
        let have = obj.as_ref().map_or(0, cv_of).max(tomb);
        let cv = cv.unwrap_or_else(|| self.next_cv(have));
        Ok(KeyStep {
            bid,
            key,
            chain,
            pos,
            objects,
            tombs,
            obj,
            tomb,
            have,
            cv,
            _lock: lock,
            _epoch: epoch,
        })
    }

    /// A chain write (`Some((put, body))`) or delete (`None`): applied here if newer than
    /// what this node has, then forwarded to the next member; answers once the chain has.
    /// `expect` (at the head): only if the key's version here is still that one, else
    /// `PreconditionFailed` (a lifecycle expiration of the version it evaluated).
    pub(super) async fn write(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        cv: Option<u64>,
        put: Option<(WirePut, Bytes)>,
        versioning: Option<WireVersioning>,
        expect: Option<u64>,
    ) -> Result<Option<WireMeta>, Fail> {
        let KeyAt { bid, pg, key } = at;
        let versioned = put.as_ref().map_or(versioning, |(p, _)| p.versioning);
        if versioned.is_some() {
            self.note_versioned(bid);
        }
        // The body is checked before the key is locked.
        let (put, md5) = match put {
            Some((mut wput, body)) => {
                let md5 = self
                    .check_body(
                        &mut wput.body_crc32c,
                        &mut wput.body_md5,
                        &body,
                        cv.is_none(),
                        key,
                    )
                    .await?;
                (Some((wput, body)), md5)
            }
            None => (None, [0; 16]),
        };
        let step = self
            .begin_step(map, bid, pg, key, cv, versioned.is_some())
            .await?;
        let (at_head, cv) = (step.at_head(), step.cv);
        if at_head && expect.is_some_and(|v| v != step.have) {
            return Err(StoreError::PreconditionFailed.into());
        }
        let mut headers = vec![(CV_HEADER, cv.to_string())];
        let path = format!("/o/{bid}/{pg}/{}", encode(key));
        let Some((wput, body)) = put else {
            let mut path = path;
            if let Some(v) = versioning {
                path.push_str(&format!("?versioning={}", v.name()));
            }
            let meta = if cv > step.have {
                self.bury_step(&step, versioning).await?;
                // A versioned delete answers the delete marker it made.
                versioning.map(|v| WireMeta {
                    cv,
                    marker: true,
                    version_id: Some(v.version_id(cv)).filter(|id| id != "null"),
                    ..Default::default()
                })
            } else {
                step.obj.as_ref().map(meta_of)
            };
            return self
                .end_step(
                    map,
                    step,
                    Call {
                        method: Method::DELETE,
                        path: &path,
                        headers: &headers,
                        body: Bytes::new(),
                    },
                    meta,
                )
                .await;
        };
        let mut next = wput.clone();
        next.if_match = None;
        next.if_none_match_any = false;
        headers.push((
            PUT_HEADER,
            serde_json::to_string(&next)
                .map_err(|e| StoreError::internal("write description", e))?,
        ));
        if cv <= step.have {
            // Not newer than what this member has: handed on only.
            let meta = step.obj.as_ref().map(meta_of);
            return self
                .end_step(
                    map,
                    step,
                    Call {
                        method: Method::PUT,
                        path: &path,
                        headers: &headers,
                        body,
                    },
                    meta,
                )
                .await;
        }
        let shown = md5_of(&wput.shown_md5)?;
        self.mark_dirty(bid, key, cv);
        let mut attrs = wput.attrs();
        attrs.user_meta.push((CV_META.to_string(), cv.to_string()));
        let version_as = wput.versioning.map(|v| v.version_as(cv));
        if version_as.is_some() {
            attrs.user_meta.push((VER_META.to_string(), cv.to_string()));
        }
        if shown.is_some() {
            // The ETag will show another MD5: the stored bytes' is kept for copies' checks.
            attrs
                .user_meta
                .push((MD5_META.to_string(), hex::encode(md5)));
        }
        let staged = Arc::new(tokio::sync::Notify::new());
        let tell = staged.clone();
        let put = PutObject {
            attrs,
            checksum: wput.checksum_algorithm()?,
            expected_checksum: digest_of(&wput.expected_checksum)?,
            content_md5: md5_of(&wput.content_md5)?,
            // Decided once, at the head, against its committed copy.
            condition: if at_head {
                wput.condition()
            } else {
                Default::default()
            },
            on_staged: Some(packrat_store_api::OnStaged(Arc::new(move || {
                tell.notify_one()
            }))),
            version_as,
        };
        let mut piece = OnePiece(Some(body.clone()), shown, Some(md5));
        let objects = step.objects.clone();
        let local = self.store.put_object(&objects, key, &mut piece, put);
        tokio::pin!(local);
        // The write goes on to the next member once it is staged here (stored, checked, its
        // condition decided, its order among the key's writes fixed), while this member makes
        // it durable: the members of a chain sync at the same time, not one after the other.
        // A write that fails before it is staged goes no further. The key stays locked here
        // until the rest of the chain has answered, so writes of one key reach every member
        // in the head's order.
        let staged_first = tokio::select! {
            biased;
            done = &mut local => Err(done),
            () = staged.notified() => Ok(()),
        };
        let (made, forwarded) = match staged_first {
            Err(done) => {
                // Done before it was staged: a refusal (nothing stored), or a store that does
                // not tell; either way it is handed on now, if at all.
                let meta = self.applied(&step, done.map_err(Fail::from)).await?;
                return self
                    .end_step(
                        map,
                        step,
                        Call {
                            method: Method::PUT,
                            path: &path,
                            headers: &headers,
                            body,
                        },
                        Some(meta),
                    )
                    .await;
            }
            Ok(()) => {
                let forward = self.forward(
                    map,
                    step.chain,
                    step.pos,
                    Call {
                        method: Method::PUT,
                        path: &path,
                        headers: &headers,
                        body,
                    },
                );
                tokio::join!(local, forward)
            }
        };
        let made = match (made, &forwarded, step.chain.get(step.pos + 1)) {
            (Ok(info), _, _) => info,
            // Staged here but not made durable (the device failed its sync), while the rest
            // of the chain has the version: it is copied back from the next member. If that
            // fails too, the key stays marked here (reads of it go to the tail, whose copy is
            // the committed one) and the re-send rounds copy it back (see `unsettled.rs`).
            (Err(e), Ok(()), Some(next)) => {
                tracing::warn!(key, cv, "a staged write failed to become durable here: {e}");
                match self
                    .pull_version(map, next, &step.objects, KeyAt { bid, pg, key }, cv)
                    .await
                {
                    Ok(info) => info,
                    Err(_) => return Err(e.into()),
                }
            }
            // At the tail, nothing was handed on: a failed write like any other.
            (Err(e), Ok(()), None) => {
                self.undo_dirty(bid, key, cv);
                return Err(e.into());
            }
            // Neither here nor (as far as this member knows) further on: the key stays marked
            // for the re-send rounds, which copy the version back from the next member if it
            // has it.
            (Err(e), Err(_), _) => return Err(e.into()),
        };
        let meta = self.applied(&step, Ok(made)).await?;
        forwarded?;
        self.clear_dirty(bid, key, cv);
        drop(step);
        Ok(Some(WireMeta {
            cv: meta.cv.max(cv),
            ..meta
        }))
    }

    /// Checks a chain write's body (a PUT's or a part's) against the CRC32C its sender sent (a
    /// gateway's, or the member's before: `crc_sent`), then sets what the next member checks
    /// and takes: the body's CRC and MD5 (`crc_sent`, `md5_sent`). The MD5 (the ETag every
    /// member shows) is computed once, at the head (`at_head`); a member takes the head's
    /// (`md5_sent`) rather than hash the bytes again, since the CRC vouches at each
    /// hop that they are the bytes the head hashed. Before, each member hashed what it got and
    /// nothing compared it with the head's, so bytes damaged between two members were stored
    /// as a different object under the same version. A step whose sender sends no CRC (an
    /// older node or gateway) is hashed here. A body above [`HASH_INLINE_BYTES_MAX`] is
    /// hashed on the blocking pool. Returns the body's MD5.
    pub(super) async fn check_body(
        &self,
        crc_sent: &mut Option<u32>,
        md5_sent: &mut Option<String>,
        body: &Bytes,
        at_head: bool,
        key: &str,
    ) -> Result<[u8; 16], Fail> {
        let given = match (at_head, *crc_sent) {
            (false, Some(_)) => md5_of(md5_sent),
            _ => Ok(None),
        };
        let known = given.as_ref().ok().copied().flatten();
        let (crc, md5) = if body.len() > HASH_INLINE_BYTES_MAX {
            let b = body.clone();
            tokio::task::spawn_blocking(move || hash_body(&b, known))
                .await
                .map_err(|e| StoreError::internal("chain write", format!("hashing: {e}")))?
        } else {
            hash_body(body, known)
        };
        if let Some(sent) = *crc_sent
            && sent != crc
        {
            self.damaged.fetch_add(1, Ordering::Relaxed);
            tracing::error!(
                key,
                sent,
                crc,
                "a chain write's body does not match its CRC32C: refused"
            );
            return Err(StoreError::internal(
                "chain write",
                format!(
                    "the body of {key} was damaged on its way here (its CRC32C does not match)"
                ),
            )
            .into());
        }
        // A malformed MD5 from the member before is refused once the bytes are known good.
        given?;
        *crc_sent = Some(crc);
        *md5_sent = Some(base64::engine::general_purpose::STANDARD.encode(md5));
        Ok(md5)
    }

    /// What a version a chain step made here (`made`) leaves: on failure, the step's dirty
    /// mark cleared and the failure answered; else the key's tombstone (if it had one)
    /// dropped and the version's metadata answered.
    pub(super) async fn applied(
        &self,
        step: &KeyStep<'_>,
        made: Result<ObjectInfo, Fail>,
    ) -> Result<WireMeta, Fail> {
        let info = match made {
            Ok(i) => i,
            Err(e) => {
                self.undo_dirty(step.bid, step.key, step.cv);
                return Err(e);
            }
        };
        if step.tomb > 0 {
            self.store.delete_object(&step.tombs, step.key).await?;
        }
        Ok(meta_of(&info))
    }

    /// Ends a chain step applied at this member: sends it on to the next member (`method`
    /// `path` with `headers` and `body`; the key stays locked until the rest of the chain has
    /// answered), clears the key's dirty mark, and answers `meta` (what this member holds now)
    /// with the step's version at least.
    pub(super) async fn end_step(
        &self,
        map: &ClusterMap,
        step: KeyStep<'_>,
        call: Call<'_>,
        meta: Option<WireMeta>,
    ) -> Result<Option<WireMeta>, Fail> {
        self.forward(map, step.chain, step.pos, call).await?;
        self.clear_dirty(step.bid, step.key, step.cv);
        let cv = step.cv;
        drop(step);
        Ok(meta.map(|mut m| {
            m.cv = m.cv.max(cv);
            m
        }))
    }

    /// This node's place in `pg`'s chain, if it may take a chain write there: the head when
    /// the write comes from a gateway (`at_head`), a later member when it is forwarded; and a
    /// write at the head needs the chain to have its write quorum.
    pub(super) fn chain_position<'m>(
        &self,
        map: &'m ClusterMap,
        pg: u32,
        at_head: bool,
    ) -> Result<(&'m [String], usize), Fail> {
        let chain = map.chain(pg);
        let Some(pos) = chain.iter().position(|n| *n == self.id) else {
            return Err(Fail::Refused(format!("not a member of PG {pg}")));
        };
        if at_head != (pos == 0) {
            return Err(Fail::Refused(format!(
                "{} the head of PG {pg}",
                if at_head { "not" } else { "already" }
            )));
        }
        // A head still catching up decides writes (conditional ones too) against a copy that
        // may be partial: the manager heads a chain with a caught-up member whenever it has
        // one, so this is a PG waiting for one (see `ClusterMap::waiting`).
        if at_head && map.is_syncing(&self.id, pg) {
            return Err(StoreError::Unavailable(format!(
                "PG {pg} has no caught-up member now (waiting for {}); retry later",
                map.holders(pg).join(", ")
            ))
            .into());
        }
        if at_head && chain.len() < map.write_quorum() {
            return Err(StoreError::Unavailable(format!(
                "PG {pg} has {} of {} replicas alive, fewer than the {} a write needs",
                chain.len(),
                map.replicas,
                map.write_quorum()
            ))
            .into());
        }
        Ok((chain, pos))
    }

    /// Sends a chain write on to the member after `pos` (if any) and waits for the rest of
    /// the chain's answer (read to its end, so the connection is kept). An unreachable
    /// successor is a broken chain, not a failed write: the gateway retries on the map that
    /// replaces it.
    pub(super) async fn forward(
        &self,
        map: &ClusterMap,
        chain: &[String],
        pos: usize,
        call: Call<'_>,
    ) -> Result<(), Fail> {
        let Some(next) = chain.get(pos + 1) else {
            return Ok(());
        };
        let addr = map
            .addr(next)
            .ok_or_else(|| StoreError::internal("cluster map", format!("no address for {next}")))?;
        let body_len = call.body.len();
        // Fault injection: a step that never reaches the next member.
        if self
            .hop_drops
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(Fail::Refused(format!(
                "{CHAIN_BROKEN} at {next}: dropped (fault injection)"
            )));
        }
        // Fault injection: a write's bytes change on their way, after their CRC was taken.
        let mut call = call;
        if call.method == Method::PUT {
            call.body = flip_next(&self.hop_flips, call.body);
        }
        // The rest of the chain answers within a hop's time per member.
        let timeout = hop_timeout(body_len) * (chain.len() - pos - 1) as u32;
        let sent = self.relay.send(call, addr, map.epoch, timeout).await;
        let ans = match sent {
            Ok(a) => a,
            Err(StoreError::Unavailable(why)) => {
                // No answer at all: probed, and reported while it stays so (see `reports`).
                self.suspect(next, addr);
                return Err(Fail::Refused(format!("{CHAIN_BROKEN} at {next}: {why}")));
            }
            Err(e) => return Err(e.into()),
        };
        if ans.status == 409 {
            let r: WireRefusal = ans.json().await?;
            return Err(Fail::Refused(format!(
                "{CHAIN_BROKEN} at {next}: {}",
                r.reason
            )));
        }
        if !(200..300).contains(&ans.status) {
            return Err(ans.error().await.into());
        }
        ans.bytes().await?;
        Ok(())
    }

    /// The steps of a relayed request (`POST /w`, see [`crate::relay`]), each run as if it
    /// had come alone, side by side; their answers in the order sent.
    ///
    /// Boxed: each step is routed by [`Node::route`], whose own future holds this one.
    pub(super) fn relayed(&self, body: Bytes) -> BoxFuture<'_, Result<NodeResp, Fail>> {
        Box::pin(async move {
            let items = RelayItem::parse_all(body)?;
            let answers =
                futures_util::future::join_all(items.into_iter().map(|i| self.relayed_step(i)))
                    .await;
            let mut out = BytesMut::new();
            for (status, body) in &answers {
                crate::relay::put_answer(&mut out, *status, body);
            }
            Ok(answer(200, out.freeze()))
        })
    }

    pub(super) async fn relayed_step(&self, item: RelayItem) -> (u16, Bytes) {
        if !crate::relay::relayable(&item.method, &item.path) {
            return (400, Bytes::from_static(b"not a relayed route"));
        }
        let mut req = http::Request::builder().method(item.method).uri(item.path);
        for (k, v) in &item.headers {
            req = req.header(k, v);
        }
        let Ok(req) = req.body(http_body_util::Full::new(item.body)) else {
            return (400, Bytes::from_static(b"bad relayed step"));
        };
        let resp = self.respond(self.route(req, item.epoch).await);
        let status = resp.status().as_u16();
        match resp.into_body().collect().await {
            Ok(b) => (status, b.to_bytes()),
            Err(e) => (500, Bytes::from(format!("answer body: {e}"))),
        }
    }

    /// Applies a delete step here (its key marked dirty until the chain has it; the mark taken
    /// back if the delete fails).
    pub(super) async fn bury_step(
        &self,
        step: &KeyStep<'_>,
        versioning: Option<WireVersioning>,
    ) -> Result<(), Fail> {
        let (bid, key, cv) = (step.bid, step.key, step.cv);
        self.mark_dirty(bid, key, cv);
        let buried = self
            .bury(
                &step.objects,
                &step.tombs,
                key,
                cv,
                step.obj.is_some(),
                versioning,
            )
            .await;
        if let Err(e) = buried {
            self.undo_dirty(bid, key, cv);
            return Err(e.into());
        }
        Ok(())
    }

    /// Deletes a key here as of version `cv`: a tombstone with the version, then the object if
    /// there is one, or (with `versioning`) a delete marker of that version over it.
    pub(super) async fn bury(
        &self,
        objects: &Bucket,
        tombs: &Bucket,
        key: &str,
        cv: u64,
        has_object: bool,
        versioning: Option<WireVersioning>,
    ) -> StoreResult<()> {
        let mut attrs = packrat_store_api::ObjectAttrs {
            last_modified_ms: (now_micros() / 1000) as i64,
            ..Default::default()
        };
        attrs.user_meta.push((CV_META.to_string(), cv.to_string()));
        let tomb = PutObject {
            attrs,
            ..Default::default()
        };
        self.store
            .put_object(tombs, key, &mut OnePiece(None, None, None), tomb)
            .await?;
        if let Some(v) = versioning {
            // The object is kept in the key's history, under a delete marker of this version,
            // dated by it (the head's clock, in µs) so that every member lists the same marker:
            // a member's own clock would make copies of the key differ, and each catching up
            // would remove and copy the key's markers again.
            let dated = i64::try_from(cv / 1000).unwrap_or(i64::MAX);
            self.store
                .put_delete_marker(objects, key, v.version_as(cv), dated)
                .await?;
        } else if has_object {
            self.store.delete_object(objects, key).await?;
        }
        Ok(())
    }

    /// Drops tombstones older than `--tombstone-keep`, every minute (or as often as that, if
    /// shorter), for the node's life. A
    /// tombstone orders a delete against writes still on their way down a chain (seconds at
    /// most); a node that was away longer than that learns of the delete by the object's
    /// absence on the member it resyncs from (a resync drops what the source does not have).
    pub async fn collect_tombstones(self: Arc<Self>) {
        let every = self
            .tombstone_keep
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
        loop {
            tokio::time::sleep(every).await;
            match self.collect_tombstones_once(self.tombstone_keep).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(tombstones = n, "collected"),
                Err(e) => tracing::warn!("collecting tombstones: {e}"),
            }
        }
    }

    pub(super) async fn collect_tombstones_once(&self, keep: Duration) -> StoreResult<usize> {
        let cutoff = (now_micros() / 1000) as i64 - keep.as_millis() as i64;
        let mut dropped = 0;
        for tombs in self.store.list_buckets().await? {
            if !tombs.name.starts_with("t-") {
                continue;
            }
            let mut after: Option<String> = None;
            loop {
                let page = self.local_page(&tombs, "", &after).await?;
                for t in page.objects.iter().filter(|t| t.last_modified_ms < cutoff) {
                    let bid: u64 = tombs.name[2..].parse().unwrap_or(0);
                    let _g = self.lock_of(bid, &t.key).lock().await;
                    if let Some(now) = self.store.head_object(&tombs, &t.key).await?
                        && now.attrs.last_modified_ms < cutoff
                    {
                        self.store.delete_object(&tombs, &t.key).await?;
                        dropped += 1;
                    }
                }
                after = page.objects.last().map(|o| o.key.clone());
                if !page.truncated {
                    break;
                }
            }
        }
        Ok(dropped)
    }
}
