//! Access keys in the index: the rules a new key must meet, generated keys, the refusal to
//! delete the last root key, and secrets sealed at rest with the data directory's master key
//! (the index keeps only sealed bytes; records written in plaintext by older builds are sealed
//! when the store opens). Shared by `LocalStore` (the admin API) and the offline admin
//! commands, which open a stopped server's index directly. Every read and write of a key
//! record goes through [`get`], [`list`] and [`put`] here, never the index's own calls.

use crate::error::{EngineError, EngineResult};
use crate::master_key::MasterKey;
use packrat_index::{KeyRecord, RocksIndex};
pub use packrat_secrets::key_rules::{checked_new_key, generate_access_key, generate_secret_key};
use packrat_store_api::admin::{AccessKey, NewKey};
use packrat_store_api::{Clock, StoreError};

/// A key operation's failure as an operator reads it: a refusal's own text, else the error.
pub fn refusal(e: EngineError) -> String {
    match e.0 {
        StoreError::Invalid(message) => message,
        e => e.to_string(),
    }
}

fn invalid(message: impl Into<String>) -> EngineError {
    EngineError(StoreError::Invalid(message.into()))
}

fn corrupt(access_key: &str, reason: String) -> EngineError {
    EngineError(StoreError::internal(
        "access key",
        format!("{access_key}: {reason}"),
    ))
}

/// A record as the index gets it: the secret sealed, the plaintext field empty.
fn sealed(master: &MasterKey, rec: &KeyRecord) -> KeyRecord {
    KeyRecord {
        secret_key: String::new(),
        sealed_secret: master.seal(rec.secret_key.as_bytes(), rec.access_key.as_bytes()),
        ..rec.clone()
    }
}

/// A record as the index keeps it, with its secret opened (a version-1 record's plaintext
/// secret is taken as it is).
fn opened(master: &MasterKey, mut rec: KeyRecord) -> EngineResult<KeyRecord> {
    if !rec.sealed_secret.is_empty() {
        let plain = master
            .open(&rec.sealed_secret, rec.access_key.as_bytes())
            .map_err(|e| corrupt(&rec.access_key, e))?;
        rec.secret_key = String::from_utf8(plain)
            .map_err(|_| corrupt(&rec.access_key, "a secret that is not UTF-8".into()))?;
        rec.sealed_secret = Vec::new();
    }
    Ok(rec)
}

pub fn get(
    index: &RocksIndex,
    master: &MasterKey,
    access_key: &str,
) -> EngineResult<Option<KeyRecord>> {
    index
        .get_key(access_key)?
        .map(|r| opened(master, r))
        .transpose()
}

pub fn list(index: &RocksIndex, master: &MasterKey) -> EngineResult<Vec<KeyRecord>> {
    index
        .list_keys()?
        .into_iter()
        .map(|r| opened(master, r))
        .collect()
}

/// Stores `rec` (its `secret_key` in plaintext) with the secret sealed.
pub fn put(index: &RocksIndex, master: &MasterKey, rec: &KeyRecord) -> EngineResult<()> {
    Ok(index.put_key(&sealed(master, rec))?)
}

/// Seals the secrets that older builds stored in plaintext; answers how many.
pub fn seal_plaintext_keys(index: &RocksIndex, master: &MasterKey) -> EngineResult<usize> {
    let plain: Vec<KeyRecord> = index
        .list_keys()?
        .into_iter()
        .filter(|r| r.sealed_secret.is_empty())
        .collect();
    for rec in &plain {
        put(index, master, rec)?;
    }
    if !plain.is_empty() {
        // The plaintext versions stay in the index's tables until compacted away.
        index.compact_keys()?;
    }
    Ok(plain.len())
}

/// Creates a key record; `Invalid` if the name or a given key breaks the rules, or the access
/// key exists.
pub fn create_key(
    index: &RocksIndex,
    master: &MasterKey,
    new: NewKey,
    is_root: bool,
    clock: &dyn Clock,
) -> EngineResult<KeyRecord> {
    let (access_key, secret_key) = checked_new_key(&new).map_err(invalid)?;
    if index.get_key(&access_key)?.is_some() {
        return Err(invalid(format!("access key {access_key} already exists")));
    }
    let keys = index.list_keys()?;
    let owners = keys.iter().map(|k| (k.owner_id.as_str(), k.name.as_str()));
    let owner_id = packrat_secrets::key_rules::owner_id_for(&new, owners).map_err(invalid)?;
    let rec = KeyRecord {
        access_key,
        secret_key,
        name: new.name,
        owner_id,
        is_root,
        created_ms: clock.now_ms(),
        sealed_secret: Vec::new(),
    };
    put(index, master, &rec)?;
    Ok(rec)
}

/// Deletes a key; `None` if there is none. Refuses (`Invalid`) to delete the last root key.
pub fn delete_key(
    index: &RocksIndex,
    master: &MasterKey,
    access_key: &str,
) -> EngineResult<Option<KeyRecord>> {
    let Some(existing) = get(index, master, access_key)? else {
        return Ok(None);
    };
    if existing.is_root && index.list_keys()?.iter().filter(|k| k.is_root).count() <= 1 {
        return Err(invalid("refusing to delete the last root key"));
    }
    index.delete_key(access_key)?;
    Ok(Some(existing))
}

pub fn access_key_of(k: KeyRecord) -> AccessKey {
    AccessKey {
        access_key: k.access_key,
        secret_key: k.secret_key,
        name: k.name,
        owner_id: k.owner_id,
        is_root: k.is_root,
        created_ms: k.created_ms,
    }
}
