//! Talking to workers: the pooled client, retry backoff, and the relayed response body.

pub mod client;
pub mod relay;
pub mod retry;
