//! What a data directory and a key store share, below the storage engine and the cluster: the
//! master key that seals secrets at rest (`master_key`), the rules for new access keys
//! (`key_rules`), packrat's own SSE-KMS keys (`kms`), and small files replaced durably (`files`).

pub mod files;
pub mod key_rules;
pub mod kms;
pub mod master_key;
