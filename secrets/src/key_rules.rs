//! The rules every store applies to a new access key, and generated keys. Shared by the
//! local store, the offline admin commands and the cluster (which keeps keys in etcd).

use packrat_store_api::admin::NewKey;

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

/// The access and secret key of a key to create (generated where not given), or why the
/// request breaks the rules. Shared by every store that keeps keys.
pub fn checked_new_key(new: &NewKey) -> Result<(String, String), &'static str> {
    if new.name.is_empty() || new.name.len() > 64 {
        return Err("a key needs a name of 1 to 64 characters");
    }
    if let Some(id) = &new.user_id
        && (!(1..=64).contains(&id.len())
            || !id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'))
    {
        return Err("a user id is 1 to 64 letters, digits, '-' and '_'");
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

/// The owner id of a key to create: the one given, unless another user (a key of another
/// name) already holds it; a random one when none is given. `existing` lists the store's keys
/// as (owner id, name).
pub fn owner_id_for<'a>(
    new: &NewKey,
    mut existing: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<String, String> {
    let Some(id) = &new.user_id else {
        return Ok(generate_owner_id());
    };
    match existing.find(|(owner, _)| owner == id) {
        Some((_, name)) if name != new.name => Err(format!(
            "the user id {id} belongs to the user named {name:?}; a second key of that user needs its name"
        )),
        _ => Ok(id.clone()),
    }
}

/// A new user's canonical id: 32 random hex digits.
pub fn generate_owner_id() -> String {
    random_token(32, b"0123456789abcdef")
}
