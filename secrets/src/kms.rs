//! packrat's own SSE-KMS keys, shared by the local store (records in its index) and the
//! cluster (records in etcd): each key's 32 bytes of material sealed under the master key, and
//! the ring of opened keys a store seals data keys with.
//!
//! A record is JSON: the key as listed ([`KmsKey`]) and `sealed_material`, base64 of the
//! material sealed under the master key with the context `packrat kms key v1 <id>` (so
//! material copied onto another record does not open). A data key is sealed under the key's
//! material with AES-256-GCM, bound to the caller's context (`MasterKey::seal`'s format).

use crate::master_key::MasterKey;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use packrat_store_api::kms::{KeyRef, KmsKey, NewKmsKey, check_key_name, key_ref};
use packrat_store_api::{StoreError, StoreResult};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// A key as a store keeps it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KmsRecord {
    #[serde(flatten)]
    pub key: KmsKey,
    pub sealed_material: String,
}

fn material_context(id: &str) -> Vec<u8> {
    format!("packrat kms key v1 {id}").into_bytes()
}

fn new_id() -> String {
    let b: [u8; 16] = rand::random();
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

/// A new key's record (fresh material, sealed under `master`), or why `new` breaks the rules:
/// a bad name, or one `taken` already holds.
pub fn new_record<'a>(
    master: &MasterKey,
    new: NewKmsKey,
    mut taken: impl Iterator<Item = &'a str>,
    now_ms: i64,
) -> Result<KmsRecord, String> {
    check_key_name(&new.name)?;
    if taken.any(|n| n == new.name) {
        return Err(format!("a KMS key named {} exists", new.name));
    }
    if new.users.iter().any(|u| u.is_empty() || u.len() > 64) {
        return Err("a user id is 1 to 64 characters".into());
    }
    let id = new_id();
    let material: [u8; 32] = rand::random();
    let sealed = master.seal(&material, &material_context(&id));
    Ok(KmsRecord {
        key: KmsKey {
            id,
            name: new.name,
            users: new.users,
            created_ms: now_ms,
        },
        sealed_material: B64.encode(sealed),
    })
}

/// A store's keys, opened: what `KeyProvider`'s synchronous calls answer from.
#[derive(Default)]
pub struct KeyRing {
    keys: RwLock<HashMap<String, Arc<(KmsKey, MasterKey)>>>,
}

impl std::fmt::Debug for KeyRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyRing(..)")
    }
}

fn opened(master: &MasterKey, rec: &KmsRecord) -> Result<MasterKey, String> {
    let sealed = B64
        .decode(&rec.sealed_material)
        .map_err(|_| format!("KMS key {}: material that is not base64", rec.key.id))?;
    let material = master
        .open(&sealed, &material_context(&rec.key.id))
        .map_err(|e| format!("KMS key {}: {e}", rec.key.id))?;
    let material = <[u8; 32]>::try_from(material)
        .map_err(|_| format!("KMS key {}: material of the wrong length", rec.key.id))?;
    Ok(MasterKey::from_bytes(&material))
}

impl KeyRing {
    /// Replaces the ring with `records`, each opened with `master`. A record that does not
    /// open is left out, with the reason answered (a store logs it: its objects stay sealed).
    pub fn replace(&self, master: &MasterKey, records: &[KmsRecord]) -> Vec<String> {
        let mut keys = HashMap::new();
        let mut bad = Vec::new();
        for rec in records {
            match opened(master, rec) {
                Ok(m) => {
                    keys.insert(rec.key.id.clone(), Arc::new((rec.key.clone(), m)));
                }
                Err(e) => bad.push(e),
            }
        }
        if let Ok(mut k) = self.keys.write() {
            *k = keys;
        }
        bad
    }

    /// Adds (or replaces) one record.
    pub fn insert(&self, master: &MasterKey, rec: &KmsRecord) -> Result<(), String> {
        let m = opened(master, rec)?;
        if let Ok(mut k) = self.keys.write() {
            k.insert(rec.key.id.clone(), Arc::new((rec.key.clone(), m)));
        }
        Ok(())
    }

    fn entry(&self, reference: &str) -> Option<Arc<(KmsKey, MasterKey)>> {
        let keys = self.keys.read().ok()?;
        match key_ref(reference) {
            KeyRef::Id(id) => keys.get(id).cloned(),
            KeyRef::Name(name) => keys.values().find(|e| e.0.name == name).cloned(),
        }
    }

    pub fn get(&self, reference: &str) -> Option<KmsKey> {
        self.entry(reference).map(|e| e.0.clone())
    }

    /// Every key, by name.
    pub fn list(&self) -> Vec<KmsKey> {
        let mut out: Vec<KmsKey> = self
            .keys
            .read()
            .map(|k| k.values().map(|e| e.0.clone()).collect())
            .unwrap_or_default();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    pub fn seal(&self, id: &str, plain: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        let e = self
            .entry(id)
            .ok_or_else(|| StoreError::Invalid(format!("no KMS key {id}")))?;
        Ok(e.1.seal(plain, context))
    }

    pub fn open(&self, id: &str, sealed: &[u8], context: &[u8]) -> StoreResult<Vec<u8>> {
        let e = self.entry(id).ok_or_else(|| {
            StoreError::Corrupt(format!(
                "an object sealed under KMS key {id}, which this store does not have"
            ))
        })?;
        e.1.open(sealed, context).map_err(StoreError::Corrupt)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_opens_under_its_master_key_only() {
        let master = MasterKey::from_bytes(&[7; 32]);
        let new = NewKmsKey {
            name: "team".into(),
            users: vec!["alice".into()],
        };
        let rec = new_record(&master, new.clone(), std::iter::empty(), 1).unwrap();
        assert!(new_record(&master, new, ["team"].into_iter(), 1).is_err());
        let ring = KeyRing::default();
        assert!(ring.replace(&master, std::slice::from_ref(&rec)).is_empty());
        let sealed = ring.seal(&rec.key.id, b"data key", b"ctx").unwrap();
        assert_eq!(
            ring.open("alias/team", &sealed, b"ctx").unwrap(),
            b"data key"
        );
        assert!(ring.open(&rec.key.id, &sealed, b"other").is_err());
        // Under another master key the record does not open, and is reported.
        let other = KeyRing::default();
        let bad = other.replace(&MasterKey::from_bytes(&[8; 32]), std::slice::from_ref(&rec));
        assert_eq!(bad.len(), 1);
        assert!(other.get(&rec.key.id).is_none());
        // Material moved onto another id does not open.
        let mut moved = rec.clone();
        moved.key.id = new_id();
        assert!(other.insert(&master, &moved).is_err());
    }
}
