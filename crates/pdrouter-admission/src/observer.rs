//! What the controller tells the router: why a request was not admitted ([`Rejection`],
//! [`Rejected`]), how a request of a priority class left ([`PriorityOutcome`]), and the
//! [`Observer`] hooks (metrics) that receive it. A leaf: the ledger reports to the observer,
//! and everything else builds on the ledger.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::priority::Priority;

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Rejection {
    /// The wait queue was full (or the queue size is 0) and no slot was free: 429.
    QueueFull,
    /// The request waited for the whole queue timeout without getting a slot: 429.
    QueueTimeout,
    /// No healthy worker matches the request at all: 503, never queued.
    Unavailable,
}

impl Rejection {
    /// The metric label value: `"queue_full"`, `"queue_timeout"` or `"unavailable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::QueueFull => "queue_full",
            Rejection::QueueTimeout => "queue_timeout",
            Rejection::Unavailable => "unavailable",
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Rejection::QueueFull => "prefill admission queue is full",
            Rejection::QueueTimeout => "timed out waiting in the prefill admission queue",
            Rejection::Unavailable => "no healthy prefill worker is available",
        })
    }
}

impl std::error::Error for Rejection {}

/// A rejection as [`Admission::acquire`](crate::Admission::acquire) returns it: the reason and,
/// for the two queue rejections, when the client should come back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rejected {
    /// Why the request was not admitted.
    pub reason: Rejection,
    /// For [`Rejection::QueueFull`] and [`Rejection::QueueTimeout`]: the expected time until a
    /// request arriving now would be admitted, from observed Prefill durations and the measured
    /// drain rate (see [`Admission::retry_after`](crate::Admission::retry_after)); `None` for
    /// [`Rejection::Unavailable`], where nothing says when a worker comes back.
    pub retry_after: Option<Duration>,
}

impl PartialEq<Rejection> for Rejected {
    fn eq(&self, other: &Rejection) -> bool {
        self.reason == *other
    }
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.reason, f)
    }
}

impl std::error::Error for Rejected {}

/// Metrics hooks. Every method has a no-op default.
///
/// Hooks are called outside the controller's locks, so calls from different threads may reach the
/// observer in a different order than the events happened. Values passed to
/// [`inflight_changed`](Observer::inflight_changed) are read at call time (not taken from the
/// event itself), so a gauge set from them converges on the true value with the last call.
pub trait Observer: Send + Sync + 'static {
    /// The in-flight count of the worker `key` changed; `inflight` is its current value.
    fn inflight_changed(&self, _key: &Arc<str>, _inflight: u32) {}
    /// The in-flight prompt tokens of the worker `key` changed; `tokens` is its current value.
    /// Called right after each [`inflight_changed`](Observer::inflight_changed).
    fn tokens_changed(&self, _key: &Arc<str>, _tokens: u32) {}
    /// The number of waiting requests changed; `queued` is its current value.
    fn queued_changed(&self, _queued: usize) {}
    /// A request was admitted after waiting `waited` ([`Duration::ZERO`] when it did not wait).
    /// Called once per admission that reached its caller.
    fn admitted(&self, _waited: Duration) {}
    /// A request was rejected.
    fn rejected(&self, _reason: Rejection) {}
    /// The worker `key` was [forgotten](crate::Admission::forget) and now has nothing in flight.
    ///
    /// This is the router's cue to remove the worker's `inflight` gauge series: it comes after the
    /// last `inflight_changed(key, 0)` of that slot. It fires once each time a forgotten slot
    /// becomes idle; if a stale selection reserves the forgotten slot again, a new
    /// `inflight_changed` and, once idle again, a new `slot_forgotten` follow. Re-registering the
    /// key (calling [`Admission::slot`](crate::Admission::slot)) before it is idle cancels it.
    fn slot_forgotten(&self, _key: &str) {}
    /// With priority classes only: how a request of `priority` left admission. Called once
    /// per request that reached the controller (admitted, rejected or cancelled while waiting).
    fn priority_outcome(&self, _priority: Priority, _outcome: PriorityOutcome) {}
    /// With priority classes only: the requests of `priority` waiting and holding a slot now
    /// (read at call time, like [`inflight_changed`](Observer::inflight_changed)).
    fn priority_levels(&self, _priority: Priority, _queued: usize, _inflight: usize) {}
}

/// How one request of a priority class left admission (see
/// [`Observer::priority_outcome`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PriorityOutcome {
    /// Admitted after waiting `waited` (zero when it did not wait); `promoted` when it was
    /// served ahead of its priority because it waited past its class's starvation age.
    Admitted {
        /// Time in the queue.
        waited: Duration,
        /// Served by starvation promotion.
        promoted: bool,
    },
    /// Rejected after waiting `waited` (zero unless it timed out).
    Rejected {
        /// Why.
        reason: Rejection,
        /// Time in the queue.
        waited: Duration,
    },
    /// Its caller went away while it waited.
    Cancelled {
        /// Time in the queue.
        waited: Duration,
    },
}
