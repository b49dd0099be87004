//! How the router chooses a worker for a request: the [`Selector`] trait and what its
//! ranking returns ([`Ranking`]). The router's other trait, the metrics hooks, is
//! [`Observer`](crate::Observer), beside the outcomes it is told.

use std::fmt;
use std::sync::Arc;

use crate::ledger::Slot;
use crate::priority::Priority;

/// What [`Selector::rank`] found.
pub enum Ranking<C> {
    /// No healthy matching worker at all: the request is rejected with
    /// [`Rejection::Unavailable`](crate::Rejection::Unavailable) and never queued. A request that is already waiting keeps
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
