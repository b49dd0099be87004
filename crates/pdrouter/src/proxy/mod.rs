//! Talking to workers: the pooled client, the headers passed on, retry backoff, and the
//! relayed response body.

pub mod client;
pub mod forward;
pub mod relay;
pub mod retry;
