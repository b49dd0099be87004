//! Every error this crate returns, with the side at fault.
//!
//! Who is at fault, for the router's status mapping:
//! - [`LoadError`], [`BundleError`]: the model files or the worker that served them (startup or
//!   worker failures, never the client's).
//! - [`TemplateError`]: the request (400), as with the engines: the template is fixed at
//!   startup, so what fails later fails on the request's conversation (a template that calls
//!   `raise_exception`, a list where the template expects a string, no template at all).
//! - [`EncodeError`], [`DecodeError`]: the tokenizer library failed on valid text or ids (500);
//!   [`EncodeError::UnknownTokenId`] is the client's (400).
//! - [`StopError`]: the client's stop conditions are invalid or beyond the bounds (400).

use std::path::PathBuf;

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

/// A tokenizer or its model files could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: no tokenizer.json (a tokenizer path is a tokenizer.json file or a directory holding one)", path.display())]
    NoTokenizerJson { path: PathBuf },
    #[error("{}: not a tokenizer the HF tokenizers library can load: {detail}", path.display())]
    Tokenizer { path: PathBuf, detail: String },
    #[error("{}: {detail}", path.display())]
    Config { path: PathBuf, detail: String },
    #[error("{}: chat templates {names:?} and none is named \"default\"", file.display())]
    NoDefaultTemplate { file: PathBuf, names: Vec<String> },
    #[error("{}: chat template does not compile: {detail}", file.display())]
    Template { file: PathBuf, detail: String },
    #[error("{}: special token {token:?} ({name}) is not in the vocabulary", file.display())]
    UnknownSpecialToken {
        file: PathBuf,
        name: &'static str,
        token: String,
    },
}

/// A chat template could not render a request; every variant is the request's fault.
#[derive(Debug, thiserror::Error)]
pub enum TemplateError {
    /// The template called `raise_exception(message)`: it refuses this conversation.
    #[error("chat template rejected the request: {message}")]
    Raised { message: String },
    /// The model has no chat template.
    #[error("the model has no chat template; send a prompt to the completions API instead")]
    NoTemplate,
    /// The request's extra template arguments try to set a reserved name.
    #[error("chat template argument {name:?} is reserved")]
    ReservedArgument { name: String },
    /// Rendering failed: the template does not fit the request's data (a missing field, a
    /// list where it expects a string), or the template is broken.
    #[error("chat template failed: {detail}")]
    Render { detail: String },
}

/// Text could not be turned into token ids.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    #[error("tokenizer failed to encode: {detail}")]
    Tokenizer { detail: String },
    #[error("token id {id} is not in the vocabulary ({vocab_size} ids)")]
    UnknownTokenId { id: u32, vocab_size: u32 },
}

/// Token ids could not be turned into text.
#[derive(Debug, thiserror::Error)]
#[error("tokenizer failed to decode: {detail}")]
pub struct DecodeError {
    pub(crate) detail: String,
}

/// Stop conditions the router refuses.
#[derive(Debug, thiserror::Error)]
pub enum StopError {
    #[error("at most {limit} stop strings")]
    TooManyStrings { limit: usize },
    #[error("a stop string is longer than {limit} bytes")]
    StringTooLong { limit: usize },
    #[error("at most {limit} stop token ids")]
    TooManyTokenIds { limit: usize },
    #[error("stop token id {id} is not in the vocabulary ({vocab_size} ids)")]
    UnknownTokenId { id: u32, vocab_size: u32 },
}
