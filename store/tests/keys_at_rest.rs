//! Access keys' secrets at rest: sealed with the data directory's master key, never in the
//! index in plaintext; records older builds wrote in plaintext are sealed when the store opens;
//! the data directory and the master key are private to packrat's user.

use packrat_index::{KeyRecord, RocksIndex};
use packrat_store::local::{LocalOptions, LocalStore};
use packrat_store::master_key::MASTER_KEY_FILE;
use packrat_store_api::admin::NewKey;
use packrat_store_api::{Credentials, StoreAdmin};
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Every byte under `dir`, file by file, searched for `needle`.
fn files_containing(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle)
            {
                hits.push(p.display().to_string());
            }
        }
    }
    hits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_secrets_are_sealed_on_open_and_new_ones_never_stored_plain() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // What an older build left: a key record whose secret is in plaintext (version 1).
    let old_secret = "OLDSECRETplaintext0123456789";
    {
        let index = RocksIndex::open(&dir.path().join("index")).unwrap();
        index
            .put_key(&KeyRecord {
                access_key: "OLDKEY".into(),
                secret_key: old_secret.into(),
                name: "old".into(),
                owner_id: "o1".into(),
                is_root: true,
                created_ms: 1,
                sealed_secret: Vec::new(),
            })
            .unwrap();
    }
    let new_secret = "NEWSECRETneverplain0123456789";
    {
        let opened = LocalStore::open(LocalOptions::new(dir.path().to_path_buf())).unwrap();
        let store = opened.store;
        assert!(
            opened.generated_root.is_none(),
            "the old root key is kept, not replaced"
        );
        let id = store.access_key("OLDKEY").unwrap().unwrap();
        assert_eq!(id.secret_key, old_secret, "the sealed secret opens");
        store
            .create_key(NewKey {
                name: "alice".into(),
                access_key: Some("ALICEKEY".into()),
                secret_key: Some(new_secret.into()),
                user_id: None,
            })
            .await
            .unwrap();
        let listed = store.list_keys().await.unwrap();
        assert!(
            listed
                .iter()
                .any(|k| k.access_key == "ALICEKEY" && k.secret_key == new_secret)
        );
        store.status(true).await.unwrap();
    }
    assert_eq!(mode(dir.path()), 0o700, "the data directory is private");
    assert_eq!(mode(&dir.path().join(MASTER_KEY_FILE)), 0o600);
    // The index's records hold sealed secrets only.
    let index = RocksIndex::open(&dir.path().join("index")).unwrap();
    for k in index.list_keys().unwrap() {
        assert!(
            k.secret_key.is_empty(),
            "{} stored in plaintext",
            k.access_key
        );
        assert!(!k.sealed_secret.is_empty());
    }
    drop(index);
    // Nowhere in the index's files (tables, logs) is a secret in plaintext: the old one's
    // plaintext record was compacted away once sealed, the new one was never written plain.
    let index_dir = dir.path().join("index");
    for secret in [old_secret, new_secret] {
        assert_eq!(
            files_containing(&index_dir, secret.as_bytes()),
            Vec::<String>::new(),
            "{secret} in plaintext"
        );
    }
    // Reopening with the same master key reads both; with another key the store refuses to
    // answer for them rather than serving a wrong secret.
    {
        let opened = LocalStore::open(LocalOptions::new(dir.path().to_path_buf())).unwrap();
        let id = opened.store.access_key("ALICEKEY").unwrap().unwrap();
        assert_eq!(id.secret_key, new_secret);
    }
    // Without its master key the store does not start (a new key would open nothing), and
    // says what to restore; with a master key that is not the one, secrets do not open.
    let key_file = dir.path().join(MASTER_KEY_FILE);
    let saved = std::fs::read(&key_file).unwrap();
    std::fs::remove_file(&key_file).unwrap();
    let Err(e) = LocalStore::open(LocalOptions::new(dir.path().to_path_buf())) else {
        panic!("the store opened without its master key");
    };
    assert!(e.contains("master.key is missing"), "{e}");
    assert!(!key_file.exists(), "no new master key was made");
    let mut other = saved.clone();
    other[5..37].copy_from_slice(&[7; 32]);
    let crc = crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, &other[..37]) as u32;
    other[37..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&key_file, &other).unwrap();
    let opened = LocalStore::open(LocalOptions::new(dir.path().to_path_buf())).unwrap();
    assert!(
        opened.store.access_key("ALICEKEY").is_err(),
        "a secret sealed under another master key is an error, not a match"
    );
}
