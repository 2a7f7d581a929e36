//! SSE-KMS's key provider: named keys that seal objects' data keys, and who may use each.
//!
//! packrat runs the provider itself (each store keeps its keys' material sealed under its master
//! key, see `packrat_secrets::kms`). The S3 layer sees only [`KeyProvider`], so a real key
//! service can take its place behind the same calls.

use crate::StoreResult;
use serde::{Deserialize, Serialize};

/// The key SSE-KMS uses when a write names none, made on first use (AWS's `aws/s3`).
pub const DEFAULT_KEY_NAME: &str = "aws/s3";

/// Who may use a key besides root keys: `*` is every signed caller.
pub const ANY_USER: &str = "*";

/// A named key, as the provider lists it (its material never leaves the provider).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KmsKey {
    /// A UUID, as AWS KMS names keys.
    pub id: String,
    /// Unique in the store (`alias/<name>` in requests).
    pub name: String,
    /// The canonical user ids that may use the key besides root keys ([`ANY_USER`]: every
    /// signed caller).
    pub users: Vec<String>,
    pub created_ms: i64,
}

impl KmsKey {
    /// The key's ARN, as S3 answers name it (packrat's ARNs carry no region or account, as
    /// its IAM user ARNs `arn:aws:iam:::user/<id>`).
    pub fn arn(&self) -> String {
        arn_of(&self.id)
    }

    /// Whether the caller with canonical user id `owner_id` (root or not) may seal and open
    /// data keys with this key. Anonymous callers never may (as S3: SSE-KMS objects are not
    /// served to them).
    pub fn allows(&self, owner_id: &str, is_root: bool) -> bool {
        is_root || self.users.iter().any(|u| u == ANY_USER || u == owner_id)
    }
}

/// The ARN of the key with id `id`.
pub fn arn_of(id: &str) -> String {
    format!("arn:aws:kms:::key/{id}")
}

/// A key to create.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct NewKmsKey {
    pub name: String,
    /// See [`KmsKey::users`]; empty: root keys only.
    pub users: Vec<String>,
}

/// What a request's key reference names: a key id, or a key name (an alias).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyRef<'a> {
    Id(&'a str),
    Name(&'a str),
}

/// Reads a key reference as AWS takes them: a key id, `alias/<name>`, or an ARN ending in
/// `:key/<id>` or `:alias/<name>`; a bare word that is no UUID is taken as a name.
pub fn key_ref(s: &str) -> KeyRef<'_> {
    let s = s.trim();
    let s = if s.starts_with("arn:") {
        s.splitn(6, ':').nth(5).unwrap_or("")
    } else {
        s
    };
    if let Some(id) = s.strip_prefix("key/") {
        KeyRef::Id(id)
    } else if let Some(name) = s.strip_prefix("alias/") {
        KeyRef::Name(name)
    } else if is_uuid(s) {
        KeyRef::Id(s)
    } else {
        KeyRef::Name(s)
    }
}

fn is_uuid(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() == 36
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_hexdigit(),
        })
}

/// Whether `name` may name a new key: 1 to 256 letters, digits and `/_-.` (AWS's alias
/// characters), not starting with `aws/` unless it is the default key.
pub fn check_key_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 256
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/_-.".contains(&b))
    {
        return Err("a KMS key's name is 1 to 256 letters, digits, '/', '_', '-' and '.'".into());
    }
    if name.starts_with("alias/") || name.starts_with("arn:") || is_uuid(name) {
        return Err("a KMS key's name is neither alias/..., an ARN nor a UUID".into());
    }
    if name.starts_with("aws/") && name != DEFAULT_KEY_NAME {
        return Err("names starting with aws/ are reserved".into());
    }
    Ok(())
}

/// A store's SSE-KMS keys: every gateway of a store sees the same.
#[async_trait::async_trait]
pub trait KeyProvider: Send + Sync + 'static {
    /// The key `reference` names (see [`key_ref`]); `None` if there is none.
    fn kms_key(&self, reference: &str) -> StoreResult<Option<KmsKey>>;
    /// Every key, by name.
    async fn list_kms_keys(&self) -> StoreResult<Vec<KmsKey>>;
    /// Makes a key with fresh material; `Invalid` if the name breaks the rules
    /// ([`check_key_name`]) or is taken.
    async fn create_kms_key(&self, new: NewKmsKey) -> StoreResult<KmsKey>;
    /// The key writes that name none use ([`DEFAULT_KEY_NAME`], every signed caller may use
    /// it), made on first use; every gateway gets the same one.
    async fn default_kms_key(&self) -> StoreResult<KmsKey>;
    /// `plain` (an object's data key) sealed under key `id`, bound to `context`; `Invalid`
    /// if there is no such key.
    fn kms_seal(&self, id: &str, plain: &[u8], context: &[u8]) -> StoreResult<Vec<u8>>;
    /// What [`Self::kms_seal`] sealed under key `id` with the same `context`; `Corrupt` if it
    /// does not open or the key is unknown (keys are never deleted: their objects would be
    /// lost).
    fn kms_open(&self, id: &str, sealed: &[u8], context: &[u8]) -> StoreResult<Vec<u8>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_read_as_aws_writes_them() {
        let id = "1234abcd-12ab-34cd-56ef-1234567890ab";
        assert_eq!(key_ref(id), KeyRef::Id(id));
        assert_eq!(key_ref("alias/team"), KeyRef::Name("team"));
        assert_eq!(key_ref("team"), KeyRef::Name("team"));
        assert_eq!(
            key_ref(&format!("arn:aws:kms:us-east-2:111122223333:key/{id}")),
            KeyRef::Id(id)
        );
        assert_eq!(
            key_ref("arn:aws:kms:us-east-2:111122223333:alias/aws/s3"),
            KeyRef::Name("aws/s3")
        );
        assert_eq!(key_ref(&arn_of(id)), KeyRef::Id(id));
    }

    #[test]
    fn names_follow_the_rules() {
        assert!(check_key_name("team-a/images").is_ok());
        assert!(check_key_name(DEFAULT_KEY_NAME).is_ok());
        for bad in [
            "",
            "aws/other",
            "alias/x",
            "a b",
            "1234abcd-12ab-34cd-56ef-1234567890ab",
        ] {
            assert!(check_key_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn users_and_roots_may_use_a_key() {
        let k = KmsKey {
            id: "i".into(),
            name: "n".into(),
            users: vec!["alice".into()],
            created_ms: 0,
        };
        assert!(k.allows("alice", false));
        assert!(!k.allows("bob", false));
        assert!(k.allows("bob", true));
        let any = KmsKey {
            users: vec![ANY_USER.into()],
            ..k
        };
        assert!(any.allows("bob", false));
    }
}
