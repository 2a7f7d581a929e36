//! The engine's error: a [`StoreError`] that index, chunk-store and tier failures convert into
//! with `?`. (Those conversions cannot live in `packrat-store-api`, which knows none of these
//! crates, and the orphan rule keeps them out of this crate unless the target type is local:
//! hence the newtype.)

use packrat_store_api::StoreError;

#[derive(Debug, Clone)]
pub struct EngineError(pub StoreError);

pub type EngineResult<T> = Result<T, EngineError>;

impl EngineError {
    pub fn internal(context: &'static str, detail: impl std::fmt::Display) -> Self {
        EngineError(StoreError::internal(context, detail))
    }

    /// Whether something the work needs cannot be reached now (a tier), rather than being
    /// wrong or lost.
    pub fn is_unavailable(&self) -> bool {
        matches!(self.0, StoreError::Unavailable(_))
    }
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for EngineError {}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        EngineError(e)
    }
}

impl From<EngineError> for StoreError {
    fn from(e: EngineError) -> Self {
        e.0
    }
}

impl From<packrat_index::IndexError> for EngineError {
    fn from(e: packrat_index::IndexError) -> Self {
        use packrat_index::IndexError as E;
        EngineError(match e {
            E::BucketExists => StoreError::BucketExists,
            E::NoSuchBucket => StoreError::NoSuchBucket,
            E::BucketNotEmpty => StoreError::BucketNotEmpty,
            E::Rocks(_) | E::Corrupt { .. } | E::Injected(_) | E::NotAvailable(_) => {
                StoreError::internal("index error", e)
            }
        })
    }
}

impl From<packrat_chunk_store::ChunkStoreError> for EngineError {
    fn from(e: packrat_chunk_store::ChunkStoreError) -> Self {
        use packrat_chunk_store::ChunkStoreError as E;
        EngineError(match e {
            E::NoSpace { .. } => StoreError::InsufficientStorage(e.to_string()),
            E::Corrupt { .. } | E::MissingSegment(_) => StoreError::Corrupt(e.to_string()),
            E::Unrecoverable { .. } => StoreError::Unrecoverable(e.to_string()),
            E::Io { .. } | E::RecordTooLarge(_) | E::Config(_) => {
                StoreError::internal("chunk store error", e)
            }
        })
    }
}

impl From<packrat_tiering::TierError> for EngineError {
    fn from(e: packrat_tiering::TierError) -> Self {
        use packrat_tiering::TierError as E;
        EngineError(match e {
            E::Unavailable { .. } => StoreError::Unavailable(format!(
                "The object is on a storage tier that cannot be reached now ({e}); retry later."
            )),
            E::NotFound { .. } | E::Mismatch { .. } => StoreError::TierData(e.to_string()),
            E::Config(_) => StoreError::internal("tier configuration", e),
        })
    }
}
