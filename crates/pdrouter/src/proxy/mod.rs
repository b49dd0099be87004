//! Talking to HTTP workers: the pooled client, the headers passed on, retry backoff.

pub mod client;
pub mod forward;
pub mod retry;
