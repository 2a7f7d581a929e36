//! What a data directory and a key store share, below the storage engine and the cluster: the
//! master key that seals secrets at rest (`master_key`), the rules for new access keys
//! (`key_rules`), and small files replaced durably (`files`).

pub mod files;
pub mod key_rules;
pub mod master_key;
