//! Reads of object bytes through a gateway: small objects that came whole with their
//! metadata (`InlineRead`), larger ones in ranged pieces from the members (`ClusterRead`).

use crate::map::ClusterMap;
use crate::wire::Call;
use crate::wire::{NodeClient, READ_TIMEOUT};
use bytes::Bytes;
use http::Method;

use super::*;
use packrat_store_api::{ObjectRead, StoreError, StoreResult};
use std::sync::Arc;
use tokio::sync::watch;

/// Bytes of a small object that came with its metadata.
pub(super) struct InlineRead(pub(super) Option<Bytes>);

#[async_trait::async_trait]
impl ObjectRead for InlineRead {
    async fn next(&mut self) -> StoreResult<Option<Bytes>> {
        Ok(self.0.take().filter(|b| !b.is_empty()))
    }

    fn is_single_piece(&self) -> bool {
        true
    }
}

/// Bytes of one object version from the node that described it.
pub(super) struct ClusterRead {
    pub(super) client: NodeClient,
    pub(super) map: watch::Receiver<Arc<ClusterMap>>,
    pub(super) path: String,
    pub(super) node: String,
    pub(super) pg: u32,
    pub(super) single: bool,
    pub(super) started: bool,
    pub(super) body: Option<crate::wire::AnswerBody>,
    pub(super) crc: Option<crate::wire::AnswerCrc>,
    /// The last piece received, handed on once the next comes or the CRC is checked.
    pub(super) held: Option<Bytes>,
}

#[async_trait::async_trait]
impl ObjectRead for ClusterRead {
    async fn next(&mut self) -> StoreResult<Option<Bytes>> {
        use http_body_util::BodyExt;
        if !self.started {
            self.started = true;
            let map = self.map.borrow().clone();
            // The node that described the version has it; if it is gone, a caught-up member
            // of the chain has it too (or a newer one, which the version check refuses).
            let mut nodes: Vec<String> = vec![self.node.clone()];
            nodes.extend(map.readers(self.pg).filter(|n| **n != self.node).cloned());
            let mut last = StoreError::Unavailable("no member of the chain".into());
            let mut answer = None;
            for node in nodes {
                let Some(addr) = map.addr(&node) else {
                    continue;
                };
                match self
                    .client
                    .send(
                        Call::new(Method::GET, &self.path),
                        addr,
                        map.epoch,
                        READ_TIMEOUT,
                    )
                    .await
                {
                    // A single piece damaged (or cut) on its way is read from another
                    // member.
                    Ok(a) if a.status == 200 && self.single => match a.bytes().await {
                        Ok(b) => return Ok(Some(b)),
                        Err(e) => last = e,
                    },
                    Ok(a) if a.status == 200 => {
                        answer = Some(a);
                        break;
                    }
                    Ok(a) if a.status == 409 => {
                        last = StoreError::Unavailable(
                            "the object changed while it was read; retry".into(),
                        );
                    }
                    Ok(a) => return Err(a.error().await),
                    Err(e) => last = e,
                }
            }
            let Some(answer) = answer else {
                return Err(last);
            };
            self.crc = Some(crate::wire::AnswerCrc::new(&answer.headers));
            self.body = Some(answer.body);
        }
        let (Some(body), Some(crc)) = (self.body.as_mut(), self.crc.as_mut()) else {
            return Ok(None);
        };
        loop {
            match body.frame().await {
                None => {
                    // The last piece is held back until the CRC is checked: if the bytes
                    // were damaged, the answer to the client ends short of its length (an
                    // error there) rather than complete with them.
                    crc.end()?;
                    self.body = None;
                    return Ok(self.held.take());
                }
                Some(Err(e)) => {
                    return Err(StoreError::Unavailable(format!("storage node: {e}")));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) if !data.is_empty() => {
                        crc.data(&data);
                        if let Some(before) = self.held.replace(data) {
                            return Ok(Some(before));
                        }
                    }
                    Ok(_) => {}
                    Err(frame) => {
                        if let Some(t) = frame.trailers_ref() {
                            crc.trailers(t);
                        }
                    }
                },
            }
        }
    }

    fn is_single_piece(&self) -> bool {
        self.single
    }
}

impl ClusterStore {
    pub(super) fn info_of(
        &self,
        bucket: &Bucket,
        key: &str,
        pg: u32,
        node: String,
        meta: WireMeta,
        inline: Option<Bytes>,
    ) -> ObjectInfo {
        // The answer's strings are moved into the info, not copied (a lookup's hot path).
        let checksum = meta.object_checksum();
        let WireMeta {
            size,
            etag,
            put,
            part_sizes,
            cv,
            stored_md5,
            version_id,
            ..
        } = meta;
        ObjectInfo {
            size,
            etag,
            attrs: put.into_attrs(),
            checksum,
            part_sizes,
            version_id: (bucket.versioning != Versioning::Unversioned)
                .then(|| version_id.unwrap_or_else(|| "null".into())),
            version: ObjectVersion(Arc::new(ClusterVersion {
                inline,
                bucket_id: bucket.id,
                key: key.to_string(),
                pg,
                cv,
                node,
                shown_etag: stored_md5.is_some(),
                by_id: None,
            })),
        }
    }

    pub(super) async fn read_all(&self, source: &ObjectInfo) -> StoreResult<Bytes> {
        let mut reader = self.read_object(source, 0, source.size)?;
        let mut buf = BytesMut::with_capacity(source.size as usize);
        while let Some(piece) = reader.next().await? {
            buf.extend_from_slice(&piece);
        }
        Ok(buf.freeze())
    }
}
