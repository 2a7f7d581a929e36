//! The data directory's master key: 32 random bytes made on first start, kept in
//! `master.key` (mode 0600) beside the index, and used to seal secrets the store keeps (access
//! keys' secrets today) with AES-256-GCM.
//!
//! File layout (version 1, 41 bytes):
//!
//! | offset | bytes | field                                   |
//! |--------|-------|-----------------------------------------|
//! | 0      | 4     | magic `PKMK`                            |
//! | 4      | 1     | version, 1                              |
//! | 5      | 32    | the key                                 |
//! | 37     | 4     | crc32c of bytes 0..37, little-endian    |
//!
//! A sealed value is a 12-byte random nonce followed by the ciphertext and its 16-byte tag. The
//! caller passes associated data that names what is sealed (an access key's id), so a sealed
//! secret copied onto another record does not open.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use std::path::Path;

pub const MASTER_KEY_FILE: &str = "master.key";
const MAGIC: &[u8; 4] = b"PKMK";
const VERSION: u8 = 1;
const FILE_BYTES: usize = 41;
const NONCE_BYTES: usize = 12;
const TAG_BYTES: usize = 16;

pub struct MasterKey {
    cipher: Aes256Gcm,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MasterKey(..)")
    }
}

fn crc32c(data: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32
}

fn encode_file(key: &[u8; 32]) -> [u8; FILE_BYTES] {
    let mut out = [0u8; FILE_BYTES];
    out[..4].copy_from_slice(MAGIC);
    out[4] = VERSION;
    out[5..37].copy_from_slice(key);
    let crc = crc32c(&out[..37]);
    out[37..].copy_from_slice(&crc.to_le_bytes());
    out
}

fn decode_file(bytes: &[u8]) -> Result<[u8; 32], String> {
    if bytes.len() != FILE_BYTES || &bytes[..4] != MAGIC {
        return Err("not a packrat master key file".into());
    }
    if bytes[4] != VERSION {
        return Err(format!("unknown master key file version {}", bytes[4]));
    }
    let crc = u32::from_le_bytes([bytes[37], bytes[38], bytes[39], bytes[40]]);
    if crc != crc32c(&bytes[..37]) {
        return Err("the master key file fails its checksum".into());
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(&bytes[5..37]);
    Ok(key)
}

impl MasterKey {
    pub fn from_bytes(key: &[u8; 32]) -> Self {
        Self {
            cipher: Aes256Gcm::new(key.into()),
        }
    }

    /// Reads `dir/master.key`, or makes one (mode 0600, fsynced, then the directory fsynced so
    /// the new name persists) when the directory has none. A file that exists but does not
    /// decode is an error, never replaced: a new key would make every sealed secret unreadable.
    pub fn load_or_create(dir: &Path) -> Result<Self, String> {
        let path = dir.join(MASTER_KEY_FILE);
        match std::fs::read(&path) {
            Ok(bytes) => {
                let key = decode_file(&bytes).map_err(|e| format!("{}: {e}", path.display()))?;
                return Ok(Self::from_bytes(&key));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        }
        let key: [u8; 32] = rand::random();
        crate::files::replace_durably(&path, &encode_file(&key), 0o600)
            .map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        tracing::info!(path = %path.display(), "created the master key");
        Ok(Self::from_bytes(&key))
    }

    /// `plain` sealed under this key, bound to `context`.
    pub fn seal(&self, plain: &[u8], context: &[u8]) -> Vec<u8> {
        let nonce: [u8; NONCE_BYTES] = rand::random();
        let sealed = self
            .cipher
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plain,
                    aad: context,
                },
            )
            .expect("AES-GCM encrypts any message shorter than 64 GiB");
        let mut out = Vec::with_capacity(NONCE_BYTES + sealed.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&sealed);
        out
    }

    /// What [`seal`](Self::seal) sealed with the same `context`; an error if the bytes were
    /// sealed under another key or context, or changed.
    pub fn open(&self, sealed: &[u8], context: &[u8]) -> Result<Vec<u8>, String> {
        if sealed.len() < NONCE_BYTES + TAG_BYTES {
            return Err("a sealed value too short to hold its nonce and tag".into());
        }
        let (nonce, ct) = sealed.split_at(NONCE_BYTES);
        self.cipher
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: context,
                },
            )
            .map_err(|_| "a sealed value does not open with this master key".to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn file_golden_bytes() {
        let bytes = encode_file(&[0xAB; 32]);
        assert_eq!(&bytes[..5], b"PKMK\x01");
        assert_eq!(&bytes[5..37], &[0xAB; 32]);
        assert_eq!(
            u32::from_le_bytes(bytes[37..].try_into().unwrap()),
            crc32c(&bytes[..37])
        );
        assert_eq!(decode_file(&bytes).unwrap(), [0xAB; 32]);
        let mut bad = bytes;
        bad[10] ^= 1;
        assert!(decode_file(&bad).unwrap_err().contains("checksum"));
        assert!(decode_file(&bytes[..40]).is_err());
    }

    #[test]
    fn created_once_with_mode_0600_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let a = MasterKey::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(MASTER_KEY_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let sealed = a.seal(b"secret", b"AK1");
        let b = MasterKey::load_or_create(dir.path()).unwrap();
        assert_eq!(b.open(&sealed, b"AK1").unwrap(), b"secret");
        // Bound to its context and to its key; a flipped bit does not open.
        assert!(b.open(&sealed, b"AK2").is_err());
        let other = MasterKey::from_bytes(&[1; 32]);
        assert!(other.open(&sealed, b"AK1").is_err());
        let mut flipped = sealed.clone();
        flipped[20] ^= 1;
        assert!(b.open(&flipped, b"AK1").is_err());
        assert!(b.open(&sealed[..20], b"AK1").is_err());
        // A damaged file is an error, not a reason to make a new key.
        std::fs::write(&path, b"junk").unwrap();
        assert!(MasterKey::load_or_create(dir.path()).is_err());
    }
}
