//! Talking to HTTP workers: the pooled client (inline HTTP/1 for plain workers), the headers
//! passed on, retry backoff.

pub mod client;
pub mod error;
pub mod forward;
pub mod h1;
pub mod retry;
