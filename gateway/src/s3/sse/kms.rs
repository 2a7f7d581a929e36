//! SSE-KMS in the S3 layer: a write's key found (named, or the store's default key made on
//! first use), whether the caller may use it, and the envelope `1 kms <key id> <sealed data
//! key>`. The key provider is the store's [`KeyProvider`](packrat_store_api::KeyProvider): it
//! seals and opens data keys and never hands out a key's material.

use super::*;
use packrat_store_api::kms::arn_of;

/// What an SSE-KMS data key is sealed against (the KMS key opens it for nothing else).
const DATA_KEY_CONTEXT: &[u8] = b"packrat sse-kms data key v1";

/// `how` with its SSE-KMS key found and the writer `who`'s use of it checked; any other
/// encryption as it is. An unknown key is S3's `KMS.NotFoundException`.
pub async fn resolve(
    state: &AppState,
    who: Option<&Identity>,
    how: Option<Requested>,
) -> S3Result<Option<Requested>> {
    let Some(Requested::KmsAsked(reference)) = how else {
        return Ok(how);
    };
    let key = match reference {
        None => state.store.default_kms_key().await?,
        Some(r) => find(&*state.store, &r)?,
    };
    may_use(&key, who)?;
    Ok(Some(Requested::Kms(key)))
}

/// The key `reference` names; `KMS.NotFoundException` if there is none.
pub fn find(store: &dyn Store, reference: &str) -> S3Result<KmsKey> {
    store.kms_key(reference)?.ok_or_else(|| {
        err(
            S3ErrorCode::KmsNotFound,
            format!("Key '{reference}' does not exist"),
        )
    })
}

/// Whether `who` may seal and open data keys under `key` (anonymous callers never may).
fn may_use(key: &KmsKey, who: Option<&Identity>) -> S3Result<()> {
    match who {
        Some(i) if key.allows(&i.owner_id, i.is_root) => Ok(()),
        Some(i) => Err(err(
            S3ErrorCode::AccessDenied,
            format!(
                "User {} is not authorized to use KMS key {}",
                i.owner_id,
                key.arn()
            ),
        )),
        None => Err(err(
            S3ErrorCode::AccessDenied,
            format!(
                "An anonymous request cannot use KMS key {}: SSE-KMS objects are read and written with signed requests",
                key.arn()
            ),
        )),
    }
}

/// A new object's cipher and envelope under `key` (which the writer may use).
pub(super) fn create(store: &dyn Store, key: &KmsKey) -> StoreResult<(ObjectCipher, String)> {
    let data_key: [u8; 32] = rand::random();
    let sealed = store.kms_seal(&key.id, &data_key, DATA_KEY_CONTEXT)?;
    let env = format!("{ENVELOPE_VERSION} kms {} {}", key.id, B64.encode(sealed));
    let cipher = ObjectCipher {
        kms_key: Some(key.id.clone()),
        ..ObjectCipher::new(data_key, None)
    };
    Ok((cipher, env))
}

/// The cipher of an object sealed under KMS key `id`, for the caller `who`.
pub(super) fn open(
    store: &dyn Store,
    id: &str,
    sealed: &[u8],
    who: Option<&Identity>,
) -> S3Result<ObjectCipher> {
    let key = store.kms_key(id)?.ok_or_else(|| {
        S3Error::from(StoreError::Corrupt(format!(
            "an object sealed under KMS key {id}, which the store does not have"
        )))
    })?;
    may_use(&key, who)?;
    let data_key = store.kms_open(id, sealed, DATA_KEY_CONTEXT)?;
    let data_key = <[u8; 32]>::try_from(data_key).map_err(|_| {
        S3Error::from(StoreError::Corrupt(
            "an SSE-KMS data key of the wrong length".into(),
        ))
    })?;
    Ok(ObjectCipher {
        kms_key: Some(id.to_string()),
        ..ObjectCipher::new(data_key, None)
    })
}

/// The headers an answer about an object sealed under KMS key `id` carries.
pub(super) fn response_headers(id: &str) -> Vec<(&'static str, String)> {
    vec![(SSE, "aws:kms".to_string()), (KMS_KEY_ID, arn_of(id))]
}
