//! Multipart uploads: how a completed upload's object is assembled from its stored parts
//! (checked against what CompleteMultipartUpload named), and how an upload keeps the tags
//! CreateMultipartUpload was given. The index writes themselves go through the engine's write
//! protocol (`Engine::{create_upload, put_part, complete_upload, abort_upload}`).

use crate::error::{EngineError, EngineResult};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use md5::{Digest as _, Md5};
use packrat_index::{ObjectRecord, PartExtent, PartRecord, StoredChecksum, UploadRecord};
use packrat_store_api::checksum::{self, ChecksumAlgorithm};
use packrat_store_api::sealed;
use packrat_store_api::{CompletePart, PART_BYTES_MIN, StoreError, UPLOAD_ID_HEADER};
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, percent_decode_str, utf8_percent_encode};
use std::collections::HashMap;

/// Where an upload keeps its object's tags until Complete gives them to the object: among the
/// upload's stored headers, in the `x-amz-tagging` form (`k=v&k2=v2`, URL-encoded), as every
/// release so far has stored them.
pub const UPLOAD_TAGGING_HEADER: &str = "x-amz-tagging";

/// Characters left as they are in the stored tagging form (RFC 3986 unreserved).
const TAG_ESCAPES: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

pub fn tags_to_header(tags: &[(String, String)]) -> String {
    tags.iter()
        .map(|(k, v)| {
            format!(
                "{}={}",
                utf8_percent_encode(k, TAG_ESCAPES),
                utf8_percent_encode(v, TAG_ESCAPES)
            )
        })
        .collect::<Vec<_>>()
        .join("&")
}

pub fn tags_from_header(raw: &str) -> EngineResult<Vec<(String, String)>> {
    let decode = |s: &str| {
        percent_decode_str(&s.replace('+', " "))
            .decode_utf8()
            .map(|c| c.into_owned())
            .map_err(|e| EngineError::internal("an upload's stored tags", e))
    };
    raw.split('&')
        .filter(|p| !p.is_empty())
        .map(|pair| {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            Ok((decode(k)?, decode(v)?))
        })
        .collect()
}

fn invalid_part(message: impl Into<String>) -> EngineError {
    EngineError(StoreError::InvalidPart(message.into()))
}

/// The object a completed upload becomes: the named parts' chunks in order (no bytes copied),
/// the multipart ETag (MD5 of the parts' binary MD5s, `-N`), the combined checksum, and the
/// upload's attributes. Fails as S3 does on parts out of order, missing or different, or too
/// small.
pub fn assemble(
    upload: &UploadRecord,
    stored: &[PartRecord],
    named: &[CompletePart],
    now_ms: i64,
) -> EngineResult<ObjectRecord> {
    if named
        .windows(2)
        .any(|w| w[0].part_number >= w[1].part_number)
    {
        return Err(EngineError(StoreError::InvalidPartOrder));
    }
    let by_number: HashMap<u32, &PartRecord> = stored.iter().map(|p| (p.part_number, p)).collect();
    let missing = "One or more of the specified parts could not be found. The part may not have \
                   been uploaded, or the specified entity tag may not match the part's entity tag.";
    let mut md5s = Vec::with_capacity(named.len() * 16);
    let mut chosen: Vec<&PartRecord> = Vec::with_capacity(named.len());
    let by_part = sealed::is_sealed_by_part(&upload.headers);
    for (i, p) in named.iter().enumerate() {
        let sp = by_number
            .get(&p.part_number)
            .ok_or_else(|| invalid_part(missing))?;
        if p.etag.trim().trim_matches('"') != sp.etag {
            return Err(invalid_part(missing));
        }
        for (a, v) in &p.checksums {
            if sp
                .checksum
                .as_ref()
                .is_some_and(|c| c.algorithm == a.name() && c.value != *v)
            {
                return Err(invalid_part(format!(
                    "The checksum of part {} does not match",
                    p.part_number
                )));
            }
        }
        // The size a client sent (an encrypted part's plaintext).
        let sent = match by_part {
            true => sealed::plain_part_len(sp.size).unwrap_or(sp.size),
            false => sp.size,
        };
        if i + 1 < named.len() && sent < PART_BYTES_MIN {
            return Err(EngineError(StoreError::EntityTooSmall));
        }
        md5s.extend_from_slice(
            &hex::decode(&sp.etag).map_err(|e| EngineError::internal("part etag", e))?,
        );
        chosen.push(sp);
    }
    let etag = format!("{}-{}", hex::encode(Md5::digest(&md5s)), chosen.len());
    let alg = upload
        .checksum_algorithm
        .as_deref()
        .and_then(ChecksumAlgorithm::from_name);
    let checksum = match (alg, upload.checksum_type.as_deref()) {
        (Some(a), Some(kind)) => combined_checksum(a, kind, &chosen)?,
        _ => None,
    };
    let (tag_header, mut headers): (Vec<_>, Vec<_>) = upload
        .headers
        .iter()
        .cloned()
        .partition(|(k, _)| k == UPLOAD_TAGGING_HEADER);
    let tags = match tag_header.first() {
        Some((_, raw)) => tags_from_header(raw)?,
        None => Vec::new(),
    };
    headers.push((UPLOAD_ID_HEADER.to_string(), upload.upload_id.clone()));
    Ok(ObjectRecord {
        record_id: [0; 16],
        size: chosen.iter().map(|p| p.size).sum(),
        etag,
        last_modified_ms: now_ms,
        content_type: upload.content_type.clone(),
        headers,
        user_meta: upload.user_meta.clone(),
        checksum,
        storage_class: upload.storage_class.clone(),
        chunks: chosen
            .iter()
            .flat_map(|p| p.chunks.iter().copied())
            .collect(),
        parts: chosen
            .iter()
            .map(|p| PartExtent {
                record_id: p.record_id,
                chunk_count: p.chunks.len() as u32,
                size: p.size,
            })
            .collect(),
        tags,
        ..Default::default()
    })
}

/// A multipart object's checksum: full-object (the parts' CRCs combined) or composite (the
/// checksum of the parts' checksums, `-N`); none if a part lacks the upload's algorithm.
fn combined_checksum(
    a: ChecksumAlgorithm,
    kind: &str,
    chosen: &[&PartRecord],
) -> EngineResult<Option<StoredChecksum>> {
    if chosen
        .iter()
        .any(|p| p.checksum.as_ref().is_none_or(|c| c.algorithm != a.name()))
    {
        return Ok(None);
    }
    let value = if kind == "FULL_OBJECT" {
        let crcs: Vec<(u64, u64)> = chosen
            .iter()
            .map(|p| (p.crc.unwrap_or(0), p.size))
            .collect();
        match checksum::combine_full(a, &crcs) {
            Some(raw) => B64.encode(raw),
            None => return Ok(None),
        }
    } else {
        let raws = chosen
            .iter()
            .map(|p| {
                let v = p.checksum.as_ref().map(|c| c.value.as_str()).unwrap_or("");
                B64.decode(v)
                    .map_err(|e| EngineError::internal("a part's stored checksum", e))
            })
            .collect::<EngineResult<Vec<_>>>()?;
        format!(
            "{}-{}",
            B64.encode(checksum::composite(a, &raws)),
            chosen.len()
        )
    };
    Ok(Some(StoredChecksum {
        algorithm: a.name().into(),
        value,
        kind: kind.into(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_survive_the_stored_form() {
        let tags = vec![
            ("split".to_string(), "train set".to_string()),
            ("a&b=c".to_string(), "ü/100%".to_string()),
            ("empty".to_string(), String::new()),
        ];
        assert_eq!(tags_from_header(&tags_to_header(&tags)).unwrap(), tags);
        // What earlier releases stored: the header exactly as the client sent it.
        assert_eq!(
            tags_from_header("k1=v+1&k%202=v%2F2").unwrap(),
            [
                ("k1".to_string(), "v 1".to_string()),
                ("k 2".to_string(), "v/2".to_string())
            ]
        );
    }
}
