//! The global request limiter (`--max-concurrent-requests`, `--queue-size`,
//! `--queue-timeout-secs`, `--rate-limit-tokens-per-second`).
//!
//! A request holds one [`Permit`] from before its body is read until its response body ends
//! (streams included), and only then takes a Prefill admission slot (PD), so the two compose:
//! the limiter bounds everything the router works on, admission what each Prefill worker gets.
//!
//! A request is admitted when fewer than `max_concurrent` permits are out and, with a rate
//! set, the token bucket (capacity `max_concurrent`, refilled at `tokens_per_second`) holds a
//! token, which admission spends. Otherwise it waits in a bounded FIFO queue: full → 429, no
//! permit within the timeout → 408.
//!
//! With priority classes (when they do not order Prefill admission instead), each class has
//! its own [`Fifo`], queue size and timeout: a freed place goes to the oldest waiter past its
//! class's starvation age, else to the oldest waiter of the highest class waiting.
//!
//! Invariants:
//! - No bypass: an arrival is admitted at once only when nobody is waiting; waiters are served
//!   strictly in arrival order ([`Fifo`]) within a class, classes highest first, promoted
//!   waiters (past their class's starvation age) before all others.
//! - Everything is released by ownership: a [`Permit`] gives its place back when dropped (and
//!   hands it to the oldest waiter); a waiter dropped while queued (client gone) leaves the
//!   queue at once; a permit granted to a waiter that is already gone is dropped, and so
//!   passed on. After any mix of outcomes, in-flight and queued counts return to zero.
//! - Wakers and observer calls run outside the state lock.
//! - Time comes from `tokio::time`, so tests drive it with a paused clock.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pdrouter_admission::{Priority, PriorityClasses};
use tokio::sync::oneshot;
use tokio::time::Instant;

// The limiter's settings are configuration (checked at startup); re-exported for its users.
pub use crate::config::LimiterConfig;

use crate::error::ApiError;

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The queue is full (or queueing is off and nothing is free): 429.
    QueueFull,
    /// Waited `queue_timeout` without a permit: 408.
    QueueTimeout,
}

impl Refusal {
    /// The client's answer, `queue_timeout_secs` being the wait the request was allowed.
    pub fn into_api_error(self, queue_timeout_secs: u64) -> ApiError {
        match self {
            Refusal::QueueFull => ApiError::rate_limited(),
            Refusal::QueueTimeout => ApiError::queue_timeout(queue_timeout_secs),
        }
    }
}

/// What the limiter reports (implemented by the metrics). With priority classes it also
/// reports through the admission [`Observer`](pdrouter_admission::Observer)'s per-priority
/// hooks (`priority_outcome`, `priority_levels`), which mean the same for this queue.
pub trait LimiterObserver: pdrouter_admission::Observer {
    /// A request was admitted (`true`) or refused (`false`).
    fn decided(&self, allowed: bool);
    /// Current permits out and requests waiting.
    fn levels(&self, inflight: usize, queued: usize);
}

/// A FIFO of waiters keyed by arrival number: O(log n) push, pop and removal of any entry.
///
/// Kept a type of its own so that priority classes can become one `Fifo` per class.
#[derive(Debug)]
pub struct Fifo<T> {
    entries: BTreeMap<u64, T>,
    next: u64,
}

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Self {
            entries: BTreeMap::new(),
            next: 0,
        }
    }
}

impl<T> Fifo<T> {
    /// Appends; returns the entry's ticket for [`remove`](Self::remove).
    pub fn push(&mut self, value: T) -> u64 {
        let id = self.next;
        self.next += 1;
        self.entries.insert(id, value);
        id
    }
    /// Takes the oldest entry.
    pub fn pop(&mut self) -> Option<T> {
        self.entries.pop_first().map(|(_, v)| v)
    }
    /// The oldest entry.
    pub fn peek(&self) -> Option<&T> {
        self.entries.first_key_value().map(|(_, v)| v)
    }
    /// Removes the entry with this ticket, if still queued.
    pub fn remove(&mut self, ticket: u64) -> Option<T> {
        self.entries.remove(&ticket)
    }
    /// Entries queued.
    pub fn len(&self) -> usize {
        self.entries.len()
    }
    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// A queued request: where its permit goes, and since when it waits.
#[derive(Debug)]
struct Waiter {
    tx: oneshot::Sender<Permit>,
    since: Instant,
}

#[derive(Debug)]
struct State {
    inflight: usize,
    /// Permits out per priority.
    held: [usize; 4],
    /// One queue per priority, indexed by [`Priority::index`].
    queues: [Fifo<Waiter>; 4],
    tokens: f64,
    refilled: Instant,
}

impl State {
    fn queued(&self) -> usize {
        self.queues.iter().map(Fifo::len).sum()
    }

    /// The class whose oldest waiter is served next at `now` (see the module docs).
    fn next_class(&self, classes: &PriorityClasses, now: Instant) -> Option<Priority> {
        let head = |p: Priority| self.queues[p.index()].peek().map(|w| w.since);
        let promoted = Priority::ALL
            .into_iter()
            .filter_map(|p| {
                head(p)
                    .filter(|&since| classes.starved(p, since, now))
                    .map(|s| (s, p))
            })
            .min_by_key(|&(since, p)| (since, std::cmp::Reverse(p)));
        promoted
            .map(|(_, p)| p)
            .or_else(|| Priority::ALL.into_iter().rev().find(|&p| head(p).is_some()))
    }
}

struct Shared {
    cfg: LimiterConfig,
    classes: PriorityClasses,
    state: Mutex<State>,
    observer: Arc<dyn LimiterObserver>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("cfg", &self.cfg)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

/// The limiter; clones share it.
#[derive(Debug, Clone)]
pub struct Limiter {
    shared: Arc<Shared>,
}

/// One admitted request's place; dropping it frees the place for the next waiter.
#[derive(Debug)]
pub struct Permit {
    shared: Arc<Shared>,
    priority: Priority,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        state.inflight -= 1;
        state.held[self.priority.index()] -= 1;
        let grants = self.shared.grant(&mut state);
        let levels = self.shared.levels_of(&state);
        drop(state);
        self.shared.report(&levels);
        self.shared.deliver(grants);
    }
}

/// Counts read under the lock, reported after it.
struct Levels {
    inflight: usize,
    queued: usize,
    by_priority: [(usize, usize); 4],
}

impl Shared {
    fn refill(&self, state: &mut State) {
        if let Some(rate) = self.cfg.tokens_per_second {
            let now = Instant::now();
            let elapsed = now.saturating_duration_since(state.refilled).as_secs_f64();
            state.tokens = (state.tokens + elapsed * rate).min(self.cfg.max_concurrent as f64);
            state.refilled = now;
        }
    }

    fn has_room(&self, state: &State) -> bool {
        state.inflight < self.cfg.max_concurrent
            && (self.cfg.tokens_per_second.is_none() || state.tokens >= 1.0)
    }

    /// Takes a place (the caller checked [`has_room`](Self::has_room)).
    fn take(self: &Arc<Self>, state: &mut State, priority: Priority) -> Permit {
        state.inflight += 1;
        state.held[priority.index()] += 1;
        if self.cfg.tokens_per_second.is_some() {
            state.tokens -= 1.0;
        }
        Permit {
            shared: self.clone(),
            priority,
        }
    }

    /// Places for the next waiters while there is room; delivered after unlocking.
    fn grant(self: &Arc<Self>, state: &mut State) -> Vec<Grant> {
        self.refill(state);
        let now = Instant::now();
        let mut grants = Vec::new();
        while self.has_room(state) {
            let Some(p) = state.next_class(&self.classes, now) else {
                break;
            };
            let promoted = state.queues[p.index()]
                .peek()
                .is_some_and(|w| self.classes.starved(p, w.since, now));
            if let Some(w) = state.queues[p.index()].pop() {
                let permit = self.take(state, p);
                grants.push(Grant {
                    waiter: w,
                    permit,
                    promoted,
                    at: now,
                });
            }
        }
        grants
    }

    fn levels_of(&self, state: &State) -> Levels {
        Levels {
            inflight: state.inflight,
            queued: state.queued(),
            by_priority: std::array::from_fn(|i| (state.queues[i].len(), state.held[i])),
        }
    }

    fn report(&self, levels: &Levels) {
        self.observer.levels(levels.inflight, levels.queued);
        if self.cfg.priorities.is_some() {
            for p in Priority::ALL {
                let (queued, held) = levels.by_priority[p.index()];
                self.observer.priority_levels(p, queued, held);
            }
        }
    }

    fn outcome(&self, priority: Priority, outcome: pdrouter_admission::PriorityOutcome) {
        if self.cfg.priorities.is_some() {
            self.observer.priority_outcome(priority, outcome);
        }
    }

    /// Hands out grants; a waiter already gone drops its permit, which passes it on.
    fn deliver(&self, grants: Vec<Grant>) {
        for g in grants {
            let priority = g.permit.priority;
            if g.waiter.tx.send(g.permit).is_ok() {
                self.observer.decided(true);
                let waited = g.at.saturating_duration_since(g.waiter.since);
                let promoted = g.promoted;
                self.outcome(
                    priority,
                    pdrouter_admission::PriorityOutcome::Admitted { waited, promoted },
                );
            }
        }
    }

    /// When the next token arrives, with a rate set and the bucket empty.
    fn next_token_at(&self, state: &State) -> Option<Instant> {
        let rate = self.cfg.tokens_per_second?;
        if state.tokens >= 1.0 || rate <= 0.0 {
            return None;
        }
        let secs = ((1.0 - state.tokens) / rate).max(0.001);
        Some(state.refilled + Duration::from_secs_f64(secs.min(86_400.0)))
    }

    /// An arrival of `priority`, at `since`: admitted at once when nobody waits and there is
    /// room, refused when its class's queue holds `queue_size`, else queued.
    fn arrive(
        self: &Arc<Self>,
        priority: Priority,
        queue_size: usize,
        since: Instant,
    ) -> Arrival<'_> {
        let mut state = self.state.lock();
        self.refill(&mut state);
        if state.queued() == 0 && self.has_room(&state) {
            let permit = self.take(&mut state, priority);
            let levels = self.levels_of(&state);
            drop(state);
            self.report(&levels);
            self.observer.decided(true);
            let waited = Duration::ZERO;
            self.outcome(
                priority,
                pdrouter_admission::PriorityOutcome::Admitted {
                    waited,
                    promoted: false,
                },
            );
            return Arrival::Admitted(permit);
        }
        if state.queues[priority.index()].len() >= queue_size {
            drop(state);
            self.observer.decided(false);
            let full = pdrouter_admission::Rejection::QueueFull;
            let waited = Duration::ZERO;
            self.outcome(
                priority,
                pdrouter_admission::PriorityOutcome::Rejected {
                    reason: full,
                    waited,
                },
            );
            return Arrival::QueueFull;
        }
        let (tx, rx) = oneshot::channel();
        let id = state.queues[priority.index()].push(Waiter { tx, since });
        let levels = self.levels_of(&state);
        drop(state);
        self.report(&levels);
        let ticket = Ticket {
            shared: self,
            priority,
            id: Some(id),
        };
        Arrival::Queued(rx, ticket)
    }

    /// Grants places that time (a refilled token) freed to the waiters next in line.
    fn grant_waiting(self: &Arc<Self>) {
        let mut state = self.state.lock();
        let grants = self.grant(&mut state);
        let levels = self.levels_of(&state);
        drop(state);
        self.report(&levels);
        self.deliver(grants);
    }
}

/// A place taken for a waiter under the lock, sent after unlocking.
struct Grant {
    waiter: Waiter,
    permit: Permit,
    promoted: bool,
    at: Instant,
}

/// Removes its waiter from the queue when the waiting future is dropped (client gone).
struct Ticket<'a> {
    shared: &'a Arc<Shared>,
    priority: Priority,
    id: Option<u64>,
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            let mut state = self.shared.state.lock();
            let removed = state.queues[self.priority.index()].remove(id);
            // Leaving may let the next waiter use a token this one was waiting for.
            let grants = if removed.is_some() {
                self.shared.grant(&mut state)
            } else {
                Vec::new()
            };
            let levels = self.shared.levels_of(&state);
            drop(state);
            if let Some(w) = removed {
                self.shared.report(&levels);
                let waited = Instant::now().saturating_duration_since(w.since);
                self.shared.outcome(
                    self.priority,
                    pdrouter_admission::PriorityOutcome::Cancelled { waited },
                );
            }
            self.shared.deliver(grants);
        }
    }
}

impl Ticket<'_> {
    /// The waiter's deadline passed: it leaves the queue and is refused, unless its permit
    /// was granted at that very instant (then it is in `rx`, and taken).
    fn expire(
        &mut self,
        rx: &mut oneshot::Receiver<Permit>,
        since: Instant,
    ) -> Result<Permit, Refusal> {
        let shared = self.shared;
        let id = self.id.take();
        let mut state = shared.state.lock();
        let queue = &mut state.queues[self.priority.index()];
        let removed = id.is_some_and(|id| queue.remove(id).is_some());
        let levels = shared.levels_of(&state);
        drop(state);
        if !removed {
            // Granted at the deadline: the permit is in the channel.
            if let Ok(permit) = rx.try_recv() {
                return Ok(permit);
            }
        }
        shared.report(&levels);
        shared.observer.decided(false);
        let reason = pdrouter_admission::Rejection::QueueTimeout;
        let waited = Instant::now().saturating_duration_since(since);
        shared.outcome(
            self.priority,
            pdrouter_admission::PriorityOutcome::Rejected { reason, waited },
        );
        Err(Refusal::QueueTimeout)
    }
}

/// What an arrival gets at once.
enum Arrival<'a> {
    /// A place: nobody was waiting and there was room.
    Admitted(Permit),
    /// Nothing: its class's queue is full.
    QueueFull,
    /// A place in its class's queue: where its permit will come, and its ticket.
    Queued(oneshot::Receiver<Permit>, Ticket<'a>),
}

impl Limiter {
    /// A limiter reporting to `observer`.
    pub fn new(cfg: LimiterConfig, observer: Arc<dyn LimiterObserver>) -> Self {
        Self {
            shared: Arc::new(Shared {
                cfg,
                classes: cfg.classes(),
                state: Mutex::new(State {
                    inflight: 0,
                    held: [0; 4],
                    queues: Default::default(),
                    tokens: cfg.max_concurrent as f64,
                    refilled: Instant::now(),
                }),
                observer,
            }),
        }
    }

    /// The settings.
    pub fn config(&self) -> LimiterConfig {
        self.shared.cfg
    }

    /// Permits out now.
    pub fn inflight(&self) -> usize {
        self.shared.state.lock().inflight
    }

    /// Requests waiting now.
    pub fn queued(&self) -> usize {
        self.shared.state.lock().queued()
    }

    /// Waits for a permit as a request of `priority` (ignored without priority classes; see
    /// the module docs). Cancel-safe: dropping the future leaves the queue and loses nothing.
    ///
    /// The steps around the wait are plain functions: a queued request holds this future for
    /// its whole wait, and keeping their state out of it keeps it small.
    pub async fn acquire(&self, priority: Priority) -> Result<Permit, Refusal> {
        let shared = &self.shared;
        let priority = if shared.cfg.priorities.is_some() {
            priority
        } else {
            Priority::Default
        };
        let class = *shared.classes.get(priority);
        let since = Instant::now();
        let deadline = crate::config::deadline_after(since, class.queue_timeout);
        let mut rx = match shared.arrive(priority, class.queue_size, since) {
            Arrival::Admitted(permit) => return Ok(permit),
            Arrival::QueueFull => return Err(Refusal::QueueFull),
            Arrival::Queued(rx, ticket) => (rx, ticket),
        };
        loop {
            // With a rate set, nothing but time frees a token: wake when one is due and
            // serve the head of the queue (whoever is waiting there).
            let token_at = shared.next_token_at(&shared.state.lock());
            tokio::select! {
                granted = &mut rx.0 => {
                    rx.1.id = None;
                    // The sender is only dropped after sending or by removal, which this
                    // ticket alone does; a closed channel cannot happen, but reads as a timeout.
                    return granted.map_err(|_| Refusal::QueueTimeout);
                }
                () = tokio::time::sleep_until(deadline) => {
                    return rx.1.expire(&mut rx.0, since);
                }
                () = async {
                    match token_at {
                        Some(at) => tokio::time::sleep_until(at).await,
                        None => std::future::pending().await,
                    }
                } => shared.grant_waiting(),
            }
        }
    }
}

/// `response` with `permit` moved into its body: the permit is released when the body
/// reaches its end or is dropped (client gone), never at response-head time.
pub fn hold_until_body_ends(
    response: axum::response::Response,
    permit: Permit,
) -> axum::response::Response {
    response.map(|inner| {
        axum::body::Body::new(HoldBody {
            inner,
            permit: Some(permit),
        })
    })
}

/// A body that owns a [`Permit`] until its last frame.
#[derive(Debug)]
struct HoldBody {
    inner: axum::body::Body,
    permit: Option<Permit>,
}

impl http_body::Body for HoldBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None | Some(Err(_)))) {
            this.permit = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
