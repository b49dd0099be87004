//! Admission configuration.

use std::time::Duration;

use tokio::time::Instant;

/// Limits of one admission controller, already validated by the router.
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

/// `from + after` without the panic `Instant + Duration` has on overflow. Every deadline
/// computed from a configured duration (queue timeout here, breaker and request timeouts in
/// the router) goes through this, so no configured value can panic a request. A deadline too
/// far to represent becomes a century away, which is never in practice.
pub fn deadline_after(from: Instant, after: Duration) -> Instant {
    const CENTURY: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    from.checked_add(after)
        .or_else(|| from.checked_add(CENTURY))
        .unwrap_or(from)
}
