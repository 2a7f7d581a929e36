//! Attribute edits on the chain (`PATCH /o/...?base=V`): tags, metadata, storage class (a
//! CopyObject onto itself, a lifecycle transition) and ACL headers change without the bytes
//! being sent or written again. An edit is a chain step with a version of its own, so reads,
//! resyncs and the dirty-key rule treat it as they treat a write; what differs is that each
//! member changes the attributes of the version `base` it already holds, in place.

use super::{Fail, KeyAt, Node, meta_of};
use crate::map::ClusterMap;
use crate::wire::Call;
use crate::wire::{CV_HEADER, CV_META, PUT_HEADER, WireMeta, WirePut, encode};
use bytes::Bytes;
use http::Method;
use packrat_store_api::{StoreError, WriteCondition};

impl Node {
    /// Gives version `base` of a key the attributes `wput` carries (its checks and conditions
    /// unused), as the new version `cv` (chosen here at the head, `None`; passed down the
    /// chain). At the head, `PreconditionFailed` if the key's version is no longer `base`
    /// (the gateway reads it again and retries), `NoSuchKey` if it has none. A member that
    /// does not hold `base` (it joined the chain since) copies the edited version from the
    /// member before it.
    pub(super) async fn edit(
        &self,
        map: &ClusterMap,
        at: KeyAt<'_>,
        cv: Option<u64>,
        base: u64,
        wput: WirePut,
    ) -> Result<Option<WireMeta>, Fail> {
        let KeyAt { bid, pg, key } = at;
        let step = self.begin_step(map, bid, pg, key, cv, false).await?;
        let cv = step.cv;
        let held = step.obj.as_ref().map_or(0, super::cv_of);
        if step.at_head() && step.obj.is_none() {
            return Err(StoreError::NoSuchKey.into());
        }
        if step.at_head() && held != base {
            return Err(StoreError::PreconditionFailed.into());
        }
        let mut meta = step.obj.as_ref().map(meta_of);
        if cv > step.have {
            self.mark_dirty(bid, key, cv);
            let done = if step.obj.is_some() && held == base {
                // `attrs()` leaves out the node's own entries; they are set again here.
                let mut attrs = wput.attrs();
                attrs.user_meta.push((CV_META.to_string(), cv.to_string()));
                // The bytes stay, and the version: so do their MD5 (when the ETag shows
                // another) and the version's sequence.
                if let Some(obj) = step.obj.as_ref() {
                    attrs.user_meta.extend(super::kept_entries(obj));
                }
                self.store
                    .update_object(
                        &super::with_versions(&step.objects),
                        key,
                        &WriteCondition::default(),
                        Box::new(move |a| *a = attrs),
                    )
                    .await
                    .map_err(Fail::from)
            } else {
                let from = &step.chain[step.pos - 1];
                tracing::info!(key, cv, %from, "an edit of a version this node lacks: copying the object");
                self.pull_version(map, from, &step.objects, KeyAt { bid, pg, key }, cv)
                    .await
            };
            meta = Some(self.applied(&step, done).await?);
        }
        let header = serde_json::to_string(&wput).map_err(|e| StoreError::internal("edit", e))?;
        let path = format!("/o/{bid}/{pg}/{}?base={base}", encode(key));
        let headers = [(CV_HEADER, cv.to_string()), (PUT_HEADER, header)];
        // What this member holds now: the edited version, or (further down the chain) a newer
        // one that overtook it; the head's answer is the one the gateway reads.
        self.end_step(
            map,
            step,
            Call {
                method: Method::PATCH,
                path: &path,
                headers: &headers,
                body: Bytes::new(),
            },
            meta,
        )
        .await
    }
}
