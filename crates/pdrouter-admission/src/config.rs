//! Admission configuration.

use std::time::Duration;

use tokio::time::Instant;

use crate::priority::PriorityClasses;

/// Limits of one admission controller, already validated by the router.
///
/// The controller takes the values as they are: a `max_inflight_per_worker` of 0 admits nothing
/// (every request waits or is rejected), which is why the router disables admission instead of
/// building a controller when the limit flag is `<= 0`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdmissionConfig {
    /// Cap `N` on in-flight Prefill requests per worker identity (URL, or URL@rank).
    /// `u32::MAX` when only a token budget limits the worker.
    pub max_inflight_per_worker: u32,
    /// Budget `B` of in-flight prompt tokens per worker identity, if any: a request is admitted
    /// to a worker only if its [prompt tokens](crate::Selector::prompt_tokens) fit in what the
    /// worker's admitted requests leave of `B`, except that a worker with nothing in flight
    /// takes any one request (so a prompt larger than `B` runs alone instead of never).
    pub max_inflight_tokens_per_worker: Option<u32>,
    /// Router-wide wait-queue depth `Q`; 0 means never wait (reject at once when full).
    pub queue_size: usize,
    /// Longest time `T` a request may wait for a slot before `QueueTimeout`.
    pub queue_timeout: Duration,
    /// Priority classes, if enabled: each request waits as its
    /// [priority](crate::Selector::priority)'s class says (its own queue size, timeout and
    /// starvation age), instead of `queue_size` and `queue_timeout`, and a freed slot goes to
    /// the highest class first (see [`crate::Priority`]). `None`: every request is
    /// [`Default`](crate::Priority::Default), one FIFO per wait class.
    pub priorities: Option<PriorityClasses>,
}

impl AdmissionConfig {
    /// The class settings in force: the configured ones, or `queue_size` and `queue_timeout`
    /// for every class without promotion.
    pub fn classes(&self) -> PriorityClasses {
        self.priorities
            .unwrap_or_else(|| PriorityClasses::uniform(self.queue_size, self.queue_timeout))
    }
}

/// The two per-worker limits, as the reservation checks them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    pub(crate) count: u32,
    pub(crate) tokens: Option<u32>,
}

impl Limits {
    pub(crate) fn of(cfg: &AdmissionConfig) -> Self {
        Limits {
            count: cfg.max_inflight_per_worker,
            tokens: cfg.max_inflight_tokens_per_worker,
        }
    }

    /// Whether a request of `tokens` fits next to `count` requests holding `held` tokens.
    pub(crate) fn fits(self, count: u32, held: u32, tokens: u32) -> bool {
        count < self.count
            && (count == 0
                || self
                    .tokens
                    .is_none_or(|budget| u64::from(held) + u64::from(tokens) <= u64::from(budget)))
    }

    /// Whether not even a one-token request fits (every request costs at least one token).
    pub(crate) fn full(self, count: u32, held: u32) -> bool {
        !self.fits(count, held, 1)
    }
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
