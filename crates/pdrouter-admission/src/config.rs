//! Admission configuration.

use std::time::Duration;

/// Limits of one admission controller (SPEC §4.1), already validated by the router.
///
/// The controller takes the values as they are: a `max_inflight_per_worker` of 0 admits nothing
/// (every request waits or is rejected), which is why the router disables admission instead of
/// building a controller when the limit flag is `<= 0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Cap `N` on in-flight Prefill requests per worker identity (URL, or URL@rank).
    pub max_inflight_per_worker: u32,
    /// Router-wide wait-queue depth `Q`; 0 means never wait (reject at once when full).
    pub queue_size: usize,
    /// Longest time `T` a request may wait for a slot before `QueueTimeout`.
    pub queue_timeout: Duration,
}
