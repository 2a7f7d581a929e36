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
