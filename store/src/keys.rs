//! Access keys in the index: the rules a new key must meet, generated keys, and the refusal to
//! delete the last root key. Shared by `LocalStore` (the admin API) and the offline admin
//! commands, which open a stopped server's index directly.

use crate::error::{EngineError, EngineResult};
use packrat_index::{KeyRecord, RocksIndex};
use packrat_store_api::admin::{AccessKey, NewKey};
use packrat_store_api::{Clock, StoreError};

fn random_token(len: usize, alphabet: &[u8]) -> String {
    (0..len)
        .map(|_| alphabet[rand::random_range(0..alphabet.len())] as char)
        .collect()
}

pub fn generate_access_key() -> String {
    format!(
        "PK{}",
        random_token(18, b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567")
    )
}

pub fn generate_secret_key() -> String {
    random_token(
        40,
        b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789",
    )
}

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

/// The access and secret key of a key to create (generated where not given), or why the
/// request breaks the rules. Shared by every store that keeps keys.
pub fn checked_new_key(new: &NewKey) -> Result<(String, String), &'static str> {
    if new.name.is_empty() || new.name.len() > 64 {
        return Err("a key needs a name of 1 to 64 characters");
    }
    let access_key = new.access_key.clone().unwrap_or_else(generate_access_key);
    let secret_key = new.secret_key.clone().unwrap_or_else(generate_secret_key);
    if !(3..=128).contains(&access_key.len())
        || !access_key.bytes().all(|b| b.is_ascii_alphanumeric())
    {
        return Err("an access key is 3 to 128 letters and digits");
    }
    if !(8..=128).contains(&secret_key.len()) || !secret_key.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a secret key is 8 to 128 printable characters");
    }
    Ok((access_key, secret_key))
}

/// Creates a key record; `Invalid` if the name or a given key breaks the rules, or the access
/// key exists.
pub fn create_key(
    index: &RocksIndex,
    new: NewKey,
    is_root: bool,
    clock: &dyn Clock,
) -> EngineResult<KeyRecord> {
    let (access_key, secret_key) = checked_new_key(&new).map_err(invalid)?;
    if index.get_key(&access_key)?.is_some() {
        return Err(invalid(format!("access key {access_key} already exists")));
    }
    let rec = KeyRecord {
        access_key,
        secret_key,
        name: new.name,
        owner_id: hex::encode(rand::random::<[u8; 16]>()),
        is_root,
        created_ms: clock.now_ms(),
    };
    index.put_key(&rec)?;
    Ok(rec)
}

/// Deletes a key; `None` if there is none. Refuses (`Invalid`) to delete the last root key.
pub fn delete_key(index: &RocksIndex, access_key: &str) -> EngineResult<Option<KeyRecord>> {
    let Some(existing) = index.get_key(access_key)? else {
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
