//! How talking to a worker can fail, for both upstream clients: the one classification the
//! legs map to client errors.

/// How talking to a worker failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum UpstreamError {
    /// No connection could be made.
    #[error("connection failed")]
    Connect,
    /// No answer in time.
    #[error("timed out")]
    Timeout,
    /// The connection broke or the answer was not HTTP.
    #[error("broken response")]
    Broken,
    /// A body read whole was longer than [`INFO_BODY_LIMIT`].
    #[error("response body over the {INFO_BODY_LIMIT}-byte limit")]
    TooLarge,
}

/// Largest body read whole from a worker (1 MiB). The answers read this way (`/health`,
/// `/get_server_info`, `/get_model_info`, `/v1/models`, `/health_generate`) are a few KB.
pub const INFO_BODY_LIMIT: usize = 1 << 20;
