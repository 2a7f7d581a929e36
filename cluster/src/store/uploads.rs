//! Multipart uploads through a cluster gateway: every step goes to the head of the object's
//! PG (which sends it down the chain, see `crate::node::uploads`); the upload's id is chosen
//! here, so a step retried on a new head after a failover names the same upload.

use super::{CLUSTER_PUT_MAX, ClusterStore, Target, not_in_cluster, wire_put};
use crate::placement::pg_of;
use crate::wire::Call;
use crate::wire::{
    PUT_HEADER, WireComplete, WireCompletePart, WireMeta, WirePart, WirePartPut, WireUpload,
    WireUploadEntry, WireUploadPage, WireUploadState, encode,
};
use bytes::{Bytes, BytesMut};
use http::Method;
use packrat_store_api::checksum::ChecksumAlgorithm;
use packrat_store_api::{
    Bucket, ByteSource, CompletePart, NewUpload, ObjectChecksum, ObjectInfo, ObjectStore, Part,
    PutObject, PutPart, StoreError, StoreResult, Upload, UploadPage, UploadQuery, WriteCondition,
};
use std::collections::BTreeMap;

/// Uploads a node lists per request when the gateway merges a listing.
const UPLOADS_PER_NODE: usize = 1000;

fn part_of(p: WirePart) -> Part {
    Part {
        part_number: p.part_number,
        etag: p.etag,
        size: p.size,
        last_modified_ms: p.last_modified_ms,
        checksum: p.checksum.map(|(algorithm, value, kind)| ObjectChecksum {
            algorithm,
            value,
            kind,
        }),
    }
}

fn upload_of(key: &str, upload_id: &str, s: &WireUploadState) -> Upload {
    Upload {
        upload_id: upload_id.to_string(),
        key: key.to_string(),
        owner_id: s.owner_id.clone(),
        initiated_ms: s.initiated_ms,
        storage_class: s.storage_class.clone(),
        checksum: s.checksum.as_deref().and_then(ChecksumAlgorithm::from_name),
        checksum_type: s.checksum_type.clone(),
        envelope: s.envelope.clone(),
    }
}

fn entry_upload(e: WireUploadEntry) -> Upload {
    Upload {
        upload_id: e.upload_id,
        key: e.key,
        owner_id: e.owner_id,
        initiated_ms: e.initiated_ms,
        storage_class: e.storage_class,
        checksum: e.checksum.as_deref().and_then(ChecksumAlgorithm::from_name),
        checksum_type: e.checksum_type,
        envelope: None,
    }
}

impl ClusterStore {
    fn upload_path(&self, bucket: &Bucket, key: &str, upload_id: &str) -> (u32, String) {
        let pg = pg_of(bucket.id, key, self.map().pgs);
        (
            pg,
            format!(
                "/u/{}/{pg}/{}?id={}",
                bucket.id,
                encode(key),
                encode(upload_id)
            ),
        )
    }

    pub(super) async fn begin_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        new: NewUpload,
    ) -> StoreResult<Upload> {
        let upload_id = hex::encode(rand::random::<[u8; 16]>());
        let mut put = crate::wire::WirePut::default();
        put.set_attrs(new.attrs);
        let envelope = packrat_store_api::sealed::envelope(&put.headers).map(str::to_string);
        let state = WireUploadState {
            owner_id: new.owner_id.clone(),
            initiated_ms: new.initiated_ms,
            storage_class: put.storage_class.clone(),
            checksum: new.checksum.map(|a| a.name().to_string()),
            checksum_type: new.checksum_type.clone(),
            envelope,
            parts: Vec::new(),
            truncated: false,
        };
        let wire = WireUpload {
            owner_id: new.owner_id,
            initiated_ms: new.initiated_ms,
            put,
            checksum: state.checksum.clone(),
            checksum_type: new.checksum_type,
        };
        let body = serde_json::to_vec(&wire).map_err(|e| StoreError::internal("upload", e))?;
        let (pg, path) = self.upload_path(bucket, key, &upload_id);
        let (ans, _) = self
            .call(
                pg,
                Target::Head,
                Call {
                    method: Method::POST,
                    path: &format!("{path}&create"),
                    headers: &[],
                    body: Bytes::from(body),
                },
            )
            .await?;
        if ans.status != 200 {
            return Err(ans.error().await);
        }
        Ok(upload_of(key, &upload_id, &state))
    }

    /// The upload and a page of its parts (`parts`: after, max), from the PG's head.
    async fn upload_state(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        parts: Option<(u32, usize)>,
    ) -> StoreResult<Option<WireUploadState>> {
        let (pg, mut path) = self.upload_path(bucket, key, upload_id);
        if let Some((after, max)) = parts {
            path.push_str(&format!("&parts&after={after}&max={max}"));
        }
        let (ans, _) = self
            .call(pg, Target::Head, Call::new(Method::GET, &path))
            .await?;
        match ans.status {
            200 => Ok(Some(ans.json().await?)),
            _ => match ans.error().await {
                StoreError::NoSuchUpload => Ok(None),
                e => Err(e),
            },
        }
    }

    pub(super) async fn find_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
    ) -> StoreResult<Option<Upload>> {
        Ok(self
            .upload_state(bucket, key, upload_id, None)
            .await?
            .map(|s| upload_of(key, upload_id, &s)))
    }

    pub(super) async fn put_part(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        body: &mut dyn ByteSource,
        put: PutPart,
    ) -> StoreResult<Part> {
        let bytes = Self::body_of(body).await?;
        let trailing = match put.checksum {
            Some(alg) if put.expected_checksum.is_none() => body.trailing_checksum(alg)?,
            _ => None,
        };
        // The same encoding of the checks as a PUT's.
        let w = wire_put(
            &PutObject {
                checksum: put.checksum,
                expected_checksum: put.expected_checksum,
                content_md5: put.content_md5,
                ..Default::default()
            },
            trailing,
        );
        self.send_part(
            bucket,
            key,
            upload_id,
            part_number,
            bytes,
            WirePartPut {
                checksum: w.checksum,
                expected_checksum: w.expected_checksum,
                content_md5: w.content_md5,
                ..Default::default()
            },
        )
        .await
    }

    async fn send_part(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        bytes: Bytes,
        mut put: WirePartPut,
    ) -> StoreResult<Part> {
        // The head checks the bytes it gets against this (see `Node::check_body`).
        put.body_crc32c = Some(crate::wire::body_crc32c(&bytes));
        let header = serde_json::to_string(&put).map_err(|e| StoreError::internal("part", e))?;
        let (pg, path) = self.upload_path(bucket, key, upload_id);
        let (ans, _) = self
            .call(
                pg,
                Target::Head,
                Call {
                    method: Method::PUT,
                    path: &format!("{path}&part={part_number}"),
                    headers: &[(PUT_HEADER, header)],
                    body: bytes,
                },
            )
            .await?;
        if ans.status != 200 {
            return Err(ans.error().await);
        }
        Ok(part_of(ans.json().await?))
    }

    pub(super) async fn copy_part(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        part_number: u32,
        source: &ObjectInfo,
        range: std::ops::Range<u64>,
    ) -> StoreResult<Part> {
        let (start, end) = (range.start, range.end);
        if end - start > CLUSTER_PUT_MAX {
            return Err(not_in_cluster(
                "a part copied from over 256 MiB of an object",
            ));
        }
        let mut reader = self.read_object(source, start, end)?;
        let mut buf = BytesMut::with_capacity((end - start) as usize);
        while let Some(piece) = reader.next().await? {
            buf.extend_from_slice(&piece);
        }
        self.send_part(
            bucket,
            key,
            upload_id,
            part_number,
            buf.freeze(),
            WirePartPut::default(),
        )
        .await
    }

    pub(super) async fn finish_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
        parts: Vec<CompletePart>,
        condition: &WriteCondition,
    ) -> StoreResult<ObjectInfo> {
        let wc = WireComplete {
            parts: parts
                .into_iter()
                .map(|p| WireCompletePart {
                    number: p.part_number,
                    etag: p.etag,
                    checksums: p
                        .checksums
                        .into_iter()
                        .map(|(a, v)| (a.name().to_string(), v))
                        .collect(),
                })
                .collect(),
            if_none_match_any: condition.if_none_match_any,
            if_match: condition.if_match.clone(),
            versioning: crate::wire::WireVersioning::of(bucket.versioning),
        };
        let body = serde_json::to_vec(&wc).map_err(|e| StoreError::internal("completion", e))?;
        let (pg, path) = self.upload_path(bucket, key, upload_id);
        let (ans, node) = self
            .call(
                pg,
                Target::Head,
                Call {
                    method: Method::POST,
                    path: &format!("{path}&complete"),
                    headers: &[],
                    body: Bytes::from(body),
                },
            )
            .await?;
        if ans.status != 200 {
            return Err(ans.error().await);
        }
        let meta: WireMeta = ans.json().await?;
        Ok(self.info_of(bucket, key, pg, node, meta, None))
    }

    pub(super) async fn end_upload(
        &self,
        bucket: &Bucket,
        key: &str,
        upload_id: &str,
    ) -> StoreResult<()> {
        let (pg, path) = self.upload_path(bucket, key, upload_id);
        let (ans, _) = self
            .call(pg, Target::Head, Call::new(Method::DELETE, &path))
            .await?;
        match ans.status {
            200..=299 => Ok(()),
            _ => Err(ans.error().await),
        }
    }

    pub(super) async fn parts_of(
        &self,
        upload: &Upload,
        bucket: &Bucket,
        after: u32,
        max: usize,
    ) -> StoreResult<(Vec<Part>, bool)> {
        let state = self
            .upload_state(bucket, &upload.key, &upload.upload_id, Some((after, max)))
            .await?
            .ok_or(StoreError::NoSuchUpload)?;
        Ok((
            state.parts.into_iter().map(part_of).collect(),
            state.truncated,
        ))
    }

    /// A page of the bucket's uploads in progress: each PG's head lists those of the PGs it
    /// heads, one request per node, and the pages are merged here (key, then upload id), with
    /// the delimiter's common prefixes made here.
    pub(super) async fn uploads_page(
        &self,
        bucket: &Bucket,
        query: &UploadQuery,
    ) -> StoreResult<UploadPage> {
        let map = self.map();
        let mut by_node: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for pg in 0..map.pgs {
            let head = map.chain(pg).first().ok_or_else(|| {
                StoreError::Unavailable(format!("placement group {pg} has no head now; retry"))
            })?;
            by_node.entry(head.clone()).or_default().push(pg);
        }
        let mut tail = format!("&max={UPLOADS_PER_NODE}&prefix={}", encode(&query.prefix));
        if let Some(k) = &query.key_marker {
            tail.push_str(&format!("&key={}", encode(k)));
            if let Some(id) = &query.upload_id_marker {
                tail.push_str(&format!("&id={}", encode(id)));
            }
        }
        let pages: Vec<WireUploadPage> = self
            .ask_nodes(&map, &format!("/ul/{}", bucket.id), &by_node, &tail)
            .await?;
        // Entries are known complete up to the smallest last entry of a truncated page.
        let limit: Option<(String, String)> = pages
            .iter()
            .filter(|p| p.truncated)
            .filter_map(|p| {
                p.uploads
                    .last()
                    .map(|u| (u.key.clone(), u.upload_id.clone()))
            })
            .min();
        let mut entries: Vec<WireUploadEntry> = pages.into_iter().flat_map(|p| p.uploads).collect();
        entries.sort_by(|a, b| (&a.key, &a.upload_id).cmp(&(&b.key, &b.upload_id)));
        let delimiter = query.delimiter.as_deref().filter(|d| !d.is_empty());
        // A page that ended on a common prefix resumes after everything under it.
        let skip_under = query
            .key_marker
            .as_deref()
            .filter(|k| delimiter.is_some_and(|d| k.ends_with(d)) && k.starts_with(&query.prefix));
        let max = query.max_uploads.max(1);
        let mut page = UploadPage::default();
        let mut cut = false;
        for e in entries {
            if skip_under.is_some_and(|k| e.key.starts_with(k)) {
                continue;
            }
            if limit
                .as_ref()
                .is_some_and(|(k, id)| (&e.key, &e.upload_id) > (k, id))
            {
                cut = true;
                break;
            }
            let prefix = delimiter.and_then(|d| {
                e.key[query.prefix.len()..]
                    .find(d)
                    .map(|i| e.key[..query.prefix.len() + i + d.len()].to_string())
            });
            if let Some(cp) = &prefix
                && page.common_prefixes.last() == Some(cp)
            {
                continue;
            }
            if page.uploads.len() + page.common_prefixes.len() == max {
                cut = true;
                break;
            }
            match prefix {
                Some(cp) => page.common_prefixes.push(cp),
                None => page.uploads.push(entry_upload(e)),
            }
        }
        page.truncated = cut;
        Ok(page)
    }
}
