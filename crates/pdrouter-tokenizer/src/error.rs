//! Every error this crate returns, with the side at fault.
//!
//! [`BundleError`]: a worker's tokenizer bundle could not be received or extracted (a worker-side
//! or local-disk failure, never the client's).

/// A tokenizer bundle (the `GetTokenizer` stream) could not be received or extracted.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("tokenizer bundle is larger than the {limit}-byte limit")]
    ArchiveTooLarge { limit: u64 },
    #[error("tokenizer bundle carries no sha256 checksum")]
    ChecksumMissing,
    #[error("tokenizer bundle checksum mismatch: expected {expected}, got {actual}")]
    ChecksumMismatch { expected: String, actual: String },
    #[error("tokenizer bundle data arrived after the chunk carrying the checksum")]
    ChunkAfterChecksum,
    #[error("tokenizer bundle is not a valid zip archive: {detail}")]
    Corrupt { detail: String },
    #[error("tokenizer bundle holds no files")]
    Empty,
    #[error("tokenizer bundle holds more than {limit} entries")]
    TooManyFiles { limit: usize },
    #[error("tokenizer bundle file {name:?} is larger than the {limit}-byte limit")]
    FileTooLarge { name: String, limit: u64 },
    #[error("tokenizer bundle unpacks to more than {limit} bytes")]
    TotalTooLarge { limit: u64 },
    #[error("tokenizer bundle entry {name:?} is not a plain relative path")]
    UnsafePath { name: String },
    #[error("tokenizer bundle entry {name:?} is a symbolic link")]
    Symlink { name: String },
    #[error("tokenizer bundle entry {name:?} is encrypted")]
    Encrypted { name: String },
    #[error("tokenizer bundle holds {name:?} twice")]
    Duplicate { name: String },
    #[error("tokenizer bundle: {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}
