//! The traits the router implements: [`Selector`] (worker choice) and [`Observer`] (metrics hooks).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::ledger::Slot;
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
    /// request arriving now would be admitted, from the measured drain rate (see
    /// [`Admission::retry_after`](crate::Admission::retry_after)); `None` for
    /// [`Rejection::Unavailable`], where no admission rate says when a worker comes back.
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
    fn inflight_changed(&self, _key: &str, _inflight: u32) {}
    /// The in-flight prompt tokens of the worker `key` changed; `tokens` is its current value.
    /// Called right after each [`inflight_changed`](Observer::inflight_changed).
    fn tokens_changed(&self, _key: &str, _tokens: u32) {}
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

/// What [`Selector::rank`] found.
pub enum Ranking<C> {
    /// No healthy matching worker at all: the request is rejected with
    /// [`Rejection::Unavailable`] and never queued. A request that is already waiting keeps
    /// waiting (a circuit breaker may half-open before its deadline).
    Unavailable,
    /// The matching workers that have room, best first, each with the caller's choice value.
    /// Empty means every matching worker is full.
    Candidates(Vec<(Arc<Slot>, C)>),
}

impl<C> fmt::Debug for Ranking<C> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ranking::Unavailable => f.write_str("Unavailable"),
            Ranking::Candidates(c) => f
                .debug_list()
                .entries(c.iter().map(|(slot, _)| slot.key()))
                .finish(),
        }
    }
}

/// Worker selection for one request: filtering, policy ranking and policy commit.
///
/// The controller calls [`rank`](Selector::rank) whenever the request might be admitted (on
/// arrival, and while it waits, each time capacity it could use appears), reserves the first
/// candidate it can, and then calls [`commit`](Selector::commit) exactly once with that
/// candidate's choice. A choice that is not reserved is never committed.
pub trait Selector: Send + 'static {
    /// What the caller gets back for the reserved worker (e.g. the worker handle).
    type Choice: Send + 'static;

    /// Re-reads live state (worker health, model pool, strict target, policy state) and returns
    /// the candidates that have room (`has_room(slot)`), best first.
    ///
    /// Called with the queue lock held: must be quick and must not call back into the
    /// [`Admission`](crate::Admission).
    ///
    /// Contract that lets a release wake only the waiters it concerns: ask `has_room` about every
    /// worker the request could use (all healthy matching workers, or the strict target), and let
    /// the result depend only on `has_room` answers and on state whose changes are followed by
    /// [`Admission::notify`](crate::Admission::notify) (or announced with
    /// [`notify_at`](crate::Admission::notify_at)). The oldest waiting request of each
    /// [wait class](Selector::wait_class) is re-ranked when a slot its class asked about is
    /// released, and on every notify.
    fn rank(&mut self, has_room: &dyn Fn(&Slot) -> bool) -> Ranking<Self::Choice>;

    /// Records the reserved choice (stateful policies commit here). Called exactly once per
    /// admission, only for the reserved choice. Called without locks on the fast path and with
    /// the queue lock held for a waiter, so the same rules as for `rank` apply.
    fn commit(&mut self, choice: &Self::Choice);

    /// The request's wait class: a key naming the set of workers it may use (e.g. "any Prefill
    /// worker serving model m", or "strict target 3"). `None` (the default) puts it in a class
    /// of its own. Called once per request that has to wait.
    ///
    /// Contract: requests with the same key are interchangeable for admission. At any instant,
    /// ranking either of them asks `has_room` about the same slots and yields `Unavailable` for
    /// both or candidates over the same slots (their order may differ, e.g. by cache affinity).
    ///
    /// The controller relies on it to serve a class strictly in arrival order and to re-rank
    /// only the oldest waiter of each class when capacity may have appeared: if that one cannot
    /// reserve, nobody behind it can. A [`notify`](crate::Admission::notify) then costs one
    /// ranking per class (plus one per admission) however many requests wait, and a release
    /// ranks only the oldest waiter of each class that asked about the released slot.
    fn wait_class(&self) -> Option<Box<str>> {
        None
    }

    /// The request's prompt tokens, charged against the worker's token budget (if one is
    /// configured) while the permit is held. Read once per acquire; a value below 1 counts as 1
    /// and one above `u32::MAX` as `u32::MAX`. The default, 1, suits selectors that do not know.
    ///
    /// Requests of one [wait class](Selector::wait_class) may differ in size: the class is still
    /// served in arrival order, so a large request at its head waits for room (at worst until
    /// its worker is empty) and the smaller ones behind it wait too, instead of overtaking it
    /// for ever.
    fn prompt_tokens(&self) -> u64 {
        1
    }

    /// The request's priority class, read once per acquire when the controller has priority
    /// classes (ignored otherwise). The default is [`Priority::Default`].
    ///
    /// Waiters of one wait class are served highest priority first, then in arrival order
    /// (a waiter past its class's starvation age goes first); an arrival never takes capacity
    /// that a waiter of its wait class with at least its priority is waiting for.
    fn priority(&self) -> Priority {
        Priority::Default
    }
}
