//! Per-worker Prefill admission with a bounded, late-binding FIFO wait queue.
//!
//! [`Admission::acquire`] reserves one unit of a worker's in-flight cap `N` for a Prefill
//! request, on the worker the request's [`Selector`] ranks best among those with room. When every
//! matching worker is full the request waits in a router-wide queue of at most `Q` requests, for
//! at most `T`. A waiter does not bind to a worker: when capacity it could use appears and it
//! is the oldest waiter of its [wait class](Selector::wait_class), it is re-ranked and goes to
//! whichever worker frees up first. The reservation is a [`Permit`], released
//! exactly once when dropped.
//!
//! With [priority classes](Priority) (`AdmissionConfig::priorities`), each request waits in
//! its [priority](Selector::priority)'s class, with that class's queue size and timeout, and a
//! freed unit goes to the highest-priority waiter that can use it, oldest first within a
//! priority, except that a waiter past its class's starvation age is served before every
//! waiter that is not.
//!
//! The crate knows nothing of HTTP, metrics libraries or routing policies: the router supplies a
//! [`Selector`] (health, model pool, strict target, policy) and an [`Observer`] (metrics).
//!
//! # Example
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//! use pdrouter_admission::*;
//!
//! /// Any of the given workers, in order (a real selector re-reads the registry and the policy).
//! struct AnyOf(Vec<Arc<Slot>>);
//!
//! impl Selector for AnyOf {
//!     type Choice = String;
//!     fn rank(&mut self, has_room: &dyn Fn(&Slot) -> bool) -> Ranking<String> {
//!         if self.0.is_empty() {
//!             return Ranking::Unavailable;
//!         }
//!         let with_room = self.0.iter().filter(|s| has_room(s));
//!         Ranking::Candidates(with_room.map(|s| (s.clone(), s.key().to_owned())).collect())
//!     }
//!     fn commit(&mut self, _choice: &String) {}
//! }
//!
//! struct NoMetrics;
//! impl Observer for NoMetrics {}
//!
//! # tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap().block_on(async {
//! let cfg = AdmissionConfig {
//!     max_inflight_per_worker: 1,
//!     max_inflight_tokens_per_worker: None,
//!     queue_size: 0,
//!     queue_timeout: Duration::from_secs(60),
//!     priorities: None,
//! };
//! let admission = Admission::new(cfg, Arc::new(NoMetrics));
//! let workers = vec![admission.slot("http://prefill-0:8000")];
//!
//! let admitted = admission.acquire(AnyOf(workers.clone())).await.unwrap();
//! assert_eq!(admitted.choice, "http://prefill-0:8000");
//! // Full, and queue size 0: rejected at once.
//! let second = admission.acquire(AnyOf(workers.clone())).await;
//! assert_eq!(second.unwrap_err(), Rejection::QueueFull);
//! // Shared by every sub-request of the client request; released when the last one drops.
//! let permit = Arc::new(admitted.permit);
//! drop(permit);
//! assert_eq!(admission.inflight_total(), 0);
//! # });
//! ```
//!
//! # Invariants
//!
//! - A slot's in-flight count never exceeds its limit (`max_inflight_per_worker` unless changed
//!   with [`Admission::set_limits`]), and its prompt tokens never exceed its token budget unless
//!   it holds a single request (reservation is one CAS on both that refuses beyond the limits).
//!   A limit lowered below what is in flight revokes nothing; it holds new reservations back.
//! - At most `queue_size` requests wait; with `queue_size == 0` nothing ever waits. With
//!   priority classes, at most each class's own `queue_size` requests of that class wait, and
//!   each waits at most its class's `queue_timeout`.
//! - A request for which no healthy worker matches is rejected `Unavailable` and never queued.
//! - Filtering, policy ranking and reservation are one step; [`Selector::commit`] is called
//!   exactly once per admission, only for the reserved choice.
//! - No bypass: a new request never takes a unit an existing waiter could use; waiters that
//!   compete for the same workers are served in arrival order.
//! - Waiters of one wait class are admitted in arrival order (with priority classes: promoted
//!   waiters oldest first, then by priority, arrival order within a priority), and only the
//!   first of each (wait class, priority) list is re-ranked while queued, so a notification
//!   costs at most one ranking per wait class (plus one per admission), not one per waiter.
//! - Priority: a freed unit never goes to a waiter while a waiter served before it (higher
//!   priority, or promoted) could use the unit; promotion bounds the wait of every priority by
//!   its starvation age plus the waiters promoted before it.
//! - No head-of-line blocking: a waiter that cannot use free capacity does not hold back later
//!   waiters that can.
//! - No stranding: a waiter never stays queued while a unit it can use is free (given the
//!   [`Selector::rank`] contract and a [`notify`](Admission::notify) after registry changes).
//! - A waiter's deadline is its enqueue instant plus `queue_timeout`; a grant that races with the
//!   deadline is honoured.
//! - Cancelling (dropping the acquire future) removes the waiter at once; anything it was
//!   granted is released and passed on.
//! - Nothing leaks: after any mix of admissions, releases, timeouts and cancellations,
//!   [`Admission::queued`] and [`Admission::inflight_total`] return to zero.
//! - A `QueueFull` or `QueueTimeout` [`Rejected`] carries a `retry_after` in whole seconds
//!   within `[1 s,` [`RETRY_AFTER_CAP`]`]`, estimated from observed Prefill durations and the
//!   admissions measured over the last [`WINDOW`], never the queue timeout (see
//!   [Retry-After](#retry-after)).
//! - Time is read only through `tokio::time`, so tests run on a paused clock.
//! - No lock is held while a grant is sent or (except for `rank`/`commit` of waiters) while
//!   caller code runs; no global lock is taken on the fast path when nobody waits.
//!
//! See the [`controller`] module docs for the hand-off and the race argument.
//!
//! # Retry-After
//!
//! [`Admission::retry_after`] (what a `QueueFull` or `QueueTimeout` rejection carries) is the
//! expected time until a request that joins the queue now could be admitted, with `q` requests
//! waiting ahead of it:
//!
//! 1. **Service time.** Each worker keeps the average time its permits are held, admission to
//!    release (an exponentially weighted average, weight 1/8 per permit; a worker with none yet
//!    uses the mean of the others'). Over the full workers (those a waiting request can be
//!    waiting for; with a token budget, every worker with something in flight), each in-flight
//!    permit of age `a` on a worker of average `D` frees its unit in `max(|D − a|, D/8)`: the
//!    rest of its expected time, never less than an eighth of it, and once overdue, as long again
//!    as it has overrun (so workers that stopped finishing drive the value to the cap). Each unit
//!    then frees again every `D`. The estimate is when the `(q + 1)`-th unit frees.
//! 2. **Drain rate.** `(q + 1) / rate`, the rate being the admissions of the last [`WINDOW`]
//!    divided by the window. Trusted once the window holds at least as many admissions as the
//!    full workers' units: fewer measure the arrivals more than the workers.
//! 3. **Combined.** The smaller of the two when both exist and the rate is trusted, else the
//!    service time, else the drain rate (no permit released yet, or no worker full), else
//!    (nothing admitted in the window either) [`RETRY_AFTER_CAP`]. Rounded up to whole seconds and clamped to `[1 s,`
//!    [`RETRY_AFTER_CAP`]`]`.
//!
//! Every permit that reached its caller counts, however its Prefill ended (a failed or cancelled
//! Prefill frees its unit when it ends, and that is what the estimate is about); a grant whose
//! caller was gone does not. Recording takes no lock: an atomic cell per in-flight permit on
//! its worker and one CAS on the worker's average at release. Estimating scans the live workers'
//! cells, only on rejection.

#![warn(missing_docs)]

pub mod autosize;
mod config;
pub mod controller;
mod drain;
mod ledger;
mod observer;
mod permit;
mod priority;
mod queue;
mod retry;
mod selector;
mod service;
pub mod shares;

pub use autosize::{AutoConfig, AutoLimit, Completion, Unit};
pub use config::{AdmissionConfig, deadline_after};
pub use controller::Admission;
pub use drain::{RETRY_AFTER_CAP, WINDOW};
pub use ledger::Slot;
pub use observer::{Observer, PriorityOutcome, Rejected, Rejection};
pub use permit::{Admitted, Permit};
pub use priority::{ClassSettings, Priority, PriorityClasses};
pub use selector::{Ranking, Selector};
pub use shares::{
    Exchange, Fallback, LeaseStore, Push, ShareConfig, ShareGrant, ShareObserver, ShareReport,
    ShareSource, ShareView, Sharer, StoreError,
};

#[cfg(test)]
mod tests;
