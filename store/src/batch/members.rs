//! TAR member indexes: built from an object's bytes on first use and kept in the index.

use crate::engine::{Engine, ObjectReader, blocking};
use packrat_index::{MemberRecord, ObjectRecord, TarIndexRecord};
use packrat_store_api::{StoreError, StoreResult};
use packrat_tar::{TarError, TarEvent, TarParser};
use std::sync::Arc;

/// The member index of a TAR object: built on first use by reading the object once, then kept
/// in the index under the identity of the object's bytes.
pub(super) async fn tar_index(
    engine: &Arc<Engine>,
    key: &str,
    obj: &Arc<ObjectRecord>,
) -> StoreResult<[u8; 16]> {
    let not_tar = |why: &str| {
        StoreError::Invalid(format!(
            "The object {key:?} is not a TAR archive ({why}); `member` needs one"
        ))
    };
    if obj.chunks.is_empty() {
        return Err(not_tar("it is empty"));
    }
    let id = obj.chunk_identity(0).0;
    let known = {
        let engine = engine.clone();
        blocking(move || Ok(engine.index.get_tar_index(&id)?)).await?
    };
    if let Some(t) = known {
        return match t.not_a_tar {
            Some(why) => Err(not_tar(&why)),
            None => Ok(id),
        };
    }
    let mut parser = TarParser::new();
    let mut members: Vec<(String, MemberRecord)> = Vec::new();
    let mut reader = ObjectReader::new(engine.clone(), obj.clone(), 0, obj.size);
    let mut parsed: Result<(), TarError> = Ok(());
    while let Some(d) = reader.next().await? {
        parsed = parser.push(&d, &mut |ev| {
            if let TarEvent::File { name, size, offset } = ev
                && !name.is_empty()
            {
                members.push((name, MemberRecord { offset, size }));
            }
            Ok::<(), TarError>(())
        });
        if parsed.is_err() || parser.is_done() {
            break;
        }
    }
    let parsed = parsed.and_then(|()| parser.finish());
    let summary = TarIndexRecord {
        members: members.len() as u64,
        not_a_tar: parsed.as_ref().err().map(|e| e.0.clone()),
    };
    if summary.not_a_tar.is_some() {
        members.clear();
    }
    let result = summary.not_a_tar.clone();
    let count = summary.members;
    {
        let engine = engine.clone();
        blocking(move || Ok(engine.index.put_tar_index(&id, &summary, &members)?)).await?;
    }
    tracing::info!(key, members = count, not_a_tar = ?result, "indexed TAR members");
    match result {
        Some(why) => Err(not_tar(&why)),
        None => Ok(id),
    }
}
