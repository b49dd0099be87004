//! The admission controller: fast path, wait queue, release hand-off, notifications.
//!
//! # Shape
//!
//! * **Fast path, no lock.** When nobody waits (`contended == 0`), [`Admission::acquire`] ranks,
//!   reserves with a CAS on the slot's counter (never above the limit), re-checks that nobody
//!   started waiting meanwhile, commits and returns.
//! * **Slow path, queue lock.** Ranks and reserves again under the lock (a release between the
//!   fast path and the lock is not missed), then rejects (`Unavailable`, `QueueFull`) or
//!   enqueues a waiter: the boxed selector plus a oneshot sender. The caller awaits the oneshot
//!   with its own deadline; no other task exists per waiter.
//! * **Waiters by class.** Waiters are grouped by [`Selector::wait_class`] (the set of workers
//!   they may use; e.g. any Prefill worker, or one strict target). Members of a class are
//!   interchangeable, so a class is served strictly in arrival order and only its oldest waiter
//!   (its head) is ever re-ranked while queued: if the head cannot reserve, nobody behind it can.
//! * **Priorities.** Within a wait class, waiters sit in one list per
//!   [priority](crate::Priority); a walk visits list heads of every wait class, promoted ones
//!   (waited past their class's starvation age) first and oldest first, then the rest by
//!   priority, highest first, oldest first within a priority. Once a visited waiter cannot
//!   reserve, the rest of its wait class is skipped for the walk (they could not reserve either,
//!   and with a token budget must not overtake it). Without priority classes every waiter is
//!   `Default` and nobody is promoted: one list per wait class, as before.
//! * **Release hands off.** When waiters exist, a release decrements under the lock and walks
//!   the class heads oldest-first, re-ranking only those whose class last asked about the
//!   released slot (a 64-bit interest filter), and grants the first that reserves. Grants are
//!   sent after unlocking. Classes that cannot use the slot are skipped, so there is no
//!   head-of-line blocking, and nobody is woken just to retry.
//! * **Notifications.** [`Admission::notify`] re-ranks every class head oldest-first (registry
//!   changes may affect anyone), admitting heads and their successors while they reserve: one
//!   ranking per class plus one per admission, however many requests wait.
//!   [`Admission::notify_at`] schedules one with a timer task, so a circuit breaker's half-open
//!   instant is seen on time without polling.
//!
//! # Why no waiter is stranded and no arrival bypasses a waiter
//!
//! `contended` counts waiters plus slow-path arrivals that may still enqueue; it is raised under
//! the lock *before* the arrival's last ranking. A release decrements the slot counter and then
//! reads `contended` (all `SeqCst`). These are the two halves of Dekker's pattern: either the
//! arrival's ranking sees the freed unit, or the release sees `contended > 0` and dispatches under
//! the lock, which it can only take after the arrival has enqueued. So no waiter is ever left
//! waiting while capacity it can use is free.
//!
//! No bypass. A release that sees `contended > 0` *before* it decrements does the decrement
//! under the lock and dispatches before unlocking, so no slow-path arrival (which ranks under the
//! same lock) can see the unit first. A fast-path arrival takes no lock and may win the CAS on a
//! just-freed unit, but it re-reads `contended` after its CAS: if anyone waits (or is about to),
//! it gives the unit back under the lock through the same dispatch (waiters first) and then
//! competes as the newest arrival. What remains are interleavings in which the waiter announced
//! itself while the competing release or arrival was already past its check of `contended`, i.e.
//! truly concurrent operations, which linearise with the waiter last. In the sequential model
//! (no overlapping operations) a new arrival never takes a unit an existing waiter could use, and
//! waiters competing for the same workers are served in arrival order; the property test checks
//! exactly that, and the multi-thread stress tests check the limit and the return to zero.
//!
//! # Improvements on the suggested design, and why
//!
//! * The fast path re-checks `contended` after its CAS and backs off through dispatch; without
//!   it, an arrival that read `contended == 0` just before a waiter enqueued could take a unit
//!   released after that waiter enqueued.
//! * Release dispatch filters classes by the slots their last ranking asked about, so a release
//!   calls `rank` only for class heads that could use it (plus rare 1-in-64 filter collisions),
//!   even when many strict-target waiters for a full worker sit in front. The walk itself skips
//!   the other classes with one bit test each.
//! * Re-ranking only class heads makes a notification cost proportional to the classes (a
//!   handful: "any worker" plus the strict targets in use) instead of to the waiters (a
//!   10,000-waiter queue re-ranked in full under the lock stalled every release and arrival for
//!   milliseconds). Selectors that name no class each form their own, which is the old
//!   walk-everyone behaviour.
//! * The wait list is a slab threaded on intrusive per-class lists with generation-checked ids,
//!   plus an ordered index of class heads: O(1) removal from anywhere, and walks never pass
//!   over tombstones or over waiters that are not heads.
//! * A grant whose receiver is gone is released iteratively in the delivering loop, not by
//!   recursion through `Drop`.
//! * The ledger entry lives exactly as long as the `Arc<Slot>` (see [`crate::Slot`]'s module):
//!   dropping it at "forgotten and idle" while a stale handle can still be reserved could give
//!   one key two slots and double its limit. The metrics cue is the separate
//!   [`Observer::slot_forgotten`] hook.

use std::cell::Cell;
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout_at};

use crate::config::{AdmissionConfig, Limits, deadline_after};
use crate::drain::DrainMeter;
use crate::ledger::{Ledger, Slot};
use crate::observer::{Observer, PriorityOutcome, Rejected, Rejection};
use crate::permit::{Admitted, Permit, Release};
use crate::priority::{Priority, PriorityClasses};
use crate::queue::{Entry, Grant, Reserve, TypedWaiter, WaitQueue, Waiter, WaiterId, rank_reserve};
use crate::selector::Selector;

/// Per-worker Prefill admission with a bounded, late-binding FIFO wait queue.
///
/// Cheap to clone (one `Arc`); all clones share the same ledger and queue.
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    cfg: AdmissionConfig,
    observer: Arc<dyn Observer>,
    ledger: Ledger,
    /// Waiters plus slow-path arrivals that may still enqueue. The fast path runs only at 0.
    contended: AtomicUsize,
    /// The queue length, readable without the lock.
    waiting: AtomicUsize,
    queue: Mutex<WaitQueue>,
    /// Instants with a pending `notify_at` timer (so repeated calls share one timer).
    scheduled: Mutex<HashSet<Instant>>,
    /// Admissions per second, for the `retry_after` of a rejection.
    drain: DrainMeter,
    /// The class settings in force ([`AdmissionConfig::classes`]).
    classes: PriorityClasses,
    /// Priority classes are configured: selectors' priorities are read and reported.
    prioritized: bool,
    /// Permits held per priority (reported with priority classes only).
    held: [AtomicUsize; 4],
    /// The queue length per priority, readable without the lock.
    waiting_by: [AtomicUsize; 4],
    /// Some slot has (or had) a token budget, so waiters of one wait class may differ in what
    /// fits. Never goes back to false: the ordering it enables is only stricter.
    budgeted: AtomicBool,
    /// Signalled when a request starts waiting (slow path only), for whoever sizes the limits.
    enqueued: tokio::sync::Notify,
    /// Signalled when a permit is released while nobody waits, while releases are watched
    /// ([`Admission::watch_releases`]).
    released: tokio::sync::Notify,
    release_watched: AtomicBool,
}

/// A waiter that reserved a slot under the lock, to be granted after unlocking.
struct Pending {
    waiter: Box<dyn Waiter>,
    slot: Arc<Slot>,
    tokens: u32,
    priority: Priority,
    enqueued_at: Instant,
    promoted: bool,
}

enum SlowPath<C> {
    Done(Result<Admitted<C>, Rejected>),
    Wait {
        id: WaiterId,
        rx: oneshot::Receiver<Grant<C>>,
        deadline: Instant,
    },
}

impl Admission {
    /// A controller with the given limits, reporting to `observer`.
    pub fn new(cfg: AdmissionConfig, observer: Arc<dyn Observer>) -> Self {
        let limits = Limits::of(&cfg);
        Admission {
            inner: Arc::new(Inner {
                classes: cfg.classes(),
                prioritized: cfg.priorities.is_some(),
                held: Default::default(),
                waiting_by: Default::default(),
                cfg,
                observer,
                ledger: Ledger::new(limits),
                budgeted: AtomicBool::new(limits.tokens.is_some()),
                contended: AtomicUsize::new(0),
                waiting: AtomicUsize::new(0),
                queue: Mutex::new(WaitQueue::new()),
                scheduled: Mutex::new(HashSet::new()),
                drain: DrainMeter::new(),
                enqueued: tokio::sync::Notify::new(),
                released: tokio::sync::Notify::new(),
                release_watched: AtomicBool::new(false),
            }),
        }
    }

    /// The limits this controller was configured with (what every slot starts with).
    pub fn config(&self) -> &AdmissionConfig {
        &self.inner.cfg
    }

    /// Ledger: the slot for a worker identity (URL, or URL@rank).
    ///
    /// The same key gets the same `Arc<Slot>` while anything (registry entry, selector or
    /// permit) still holds it, so a worker removed and registered again keeps its in-flight
    /// count. Calling this for a [forgotten](Admission::forget) key makes it live again. The
    /// ledger entry goes away with the last `Arc<Slot>`.
    pub fn slot(&self, key: &str) -> Arc<Slot> {
        self.inner.ledger.slot(key)
    }

    /// Sets one worker identity's limits: at most `count` requests and, with `tokens`, at most
    /// that many prompt tokens in flight (with the same lone-request exception as the
    /// configured budget). For a controller that sizes limits at run time (a feedback loop, or
    /// a share of a limit held with other routers).
    ///
    /// Raising a limit admits waiters that now fit at once. Lowering it below what is in flight
    /// revokes nothing: new reservations wait until the load is under the new limits. The
    /// limits belong to the slot, so they last while something holds it (the caller should keep
    /// its `Arc<Slot>`); a slot created anew starts at the configured limits.
    pub fn set_limits(&self, slot: &Slot, count: u32, tokens: Option<u32>) {
        if tokens.is_some() {
            self.inner.budgeted.store(true, SeqCst);
        }
        slot.set_limits(Limits { count, tokens });
        self.notify();
    }

    /// The worker with this key was removed from the registry.
    ///
    /// Wakes waiters (like [`notify`](Admission::notify)) and marks the slot forgotten. Once it
    /// is both forgotten and idle (now, or when its last permit is released) the observer's
    /// [`slot_forgotten`](Observer::slot_forgotten) fires: that is when the router removes the
    /// worker's `inflight` gauge series. If the key is registered again first (via
    /// [`slot`](Admission::slot)), nothing fires.
    pub fn forget(&self, key: &str) {
        self.inner.ledger.forget(key, &*self.inner.observer);
        self.notify();
    }

    /// Admits a request: reserves a slot on the worker `selector` picks, waiting in the queue if
    /// every matching worker is full.
    ///
    /// Rejects with [`Rejection::Unavailable`] when no healthy worker matches (never queued),
    /// [`Rejection::QueueFull`] when it would have to wait but the queue is full (or its size is
    /// 0), and [`Rejection::QueueTimeout`] when the queue timeout passes first.
    ///
    /// Cancel-safe: dropping the future removes the waiter at once; a grant that raced with the
    /// drop is released and passed on to the next waiter.
    ///
    /// Lazy like any future: nothing happens until it is first polled. Written as a plain `fn`
    /// returning an `async` block so the selector is held once (an `async fn` keeps its
    /// arguments twice), because a waiting request holds this future for its whole wait.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would hold the selector twice"
    )]
    pub fn acquire<S: Selector>(
        &self,
        mut selector: S,
    ) -> impl Future<Output = Result<Admitted<S::Choice>, Rejected>> + Send + '_ {
        async move {
            let inner = &self.inner;
            let mut backoff = None;
            if inner.contended.load(SeqCst) == 0 {
                match inner.fast_path(&mut selector) {
                    Ok(Some(admitted)) => return Ok(admitted),
                    Ok(None) => {}
                    Err(Some(slot)) => backoff = Some(slot),
                    Err(None) => {
                        let priority = inner.priority_of(&selector);
                        return Err(inner.reject(Rejection::Unavailable, priority, Duration::ZERO));
                    }
                }
            }
            let (id, mut rx, deadline) = match inner.slow_path(selector, backoff) {
                SlowPath::Done(result) => return result,
                SlowPath::Wait { id, rx, deadline } => (id, rx, deadline),
            };
            let mut guard = CancelOnDrop {
                inner,
                id: Some(id),
            };
            let grant = match timeout_at(deadline, &mut rx).await {
                Ok(Ok(grant)) => grant,
                Ok(Err(_)) => {
                    // The sender is only dropped after sending; kept total for robustness.
                    guard.id = None;
                    let (priority, waited) = inner.cancel(id).unwrap_or_default();
                    return Err(inner.reject(Rejection::QueueTimeout, priority, waited));
                }
                Err(_elapsed) => {
                    guard.id = None;
                    if let Some((priority, waited)) = inner.cancel(id) {
                        return Err(inner.reject(Rejection::QueueTimeout, priority, waited));
                    }
                    // A grant raced with the deadline: it was taken off the queue under the
                    // lock and is being sent now. Honour it.
                    match rx.await {
                        Ok(grant) => grant,
                        Err(_) => {
                            let priority = Priority::Default;
                            return Err(inner.reject(
                                Rejection::QueueTimeout,
                                priority,
                                Duration::ZERO,
                            ));
                        }
                    }
                }
            };
            guard.id = None;
            inner.drain.record();
            let waited = grant.waited();
            inner.observer.admitted(waited);
            inner.outcome(
                grant.permit.priority(),
                PriorityOutcome::Admitted {
                    waited,
                    promoted: grant.promoted,
                },
            );
            Ok(Admitted {
                choice: grant.choice,
                permit: grant.permit,
                waited,
            })
        }
    }

    /// The registry changed (worker registered, removed, replaced, health changed): re-ranks the
    /// oldest waiter of every wait class, oldest first, and admits those that can now reserve
    /// (each admission moves on to the next waiter of its class).
    pub fn notify(&self) {
        self.inner.notify();
    }

    /// Schedules a [`notify`](Admission::notify) at `when` (e.g. a circuit breaker's half-open
    /// instant), so recovery is seen on time without polling.
    ///
    /// Spawns one timer task per distinct instant on the current Tokio runtime; the task holds
    /// only a weak reference to the controller. An instant already past notifies at once, and so
    /// does a call made outside a runtime (it cannot schedule anything).
    pub fn notify_at(&self, when: Instant) {
        if when <= Instant::now() {
            self.notify();
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            self.notify();
            return;
        };
        if !self.inner.scheduled.lock().insert(when) {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        handle.spawn(async move {
            tokio::time::sleep_until(when).await;
            if let Some(inner) = weak.upgrade() {
                inner.scheduled.lock().remove(&when);
                inner.notify();
            }
        });
    }

    /// Expected time until a request that joined the queue now would be admitted: the waiters
    /// ahead of it plus itself, divided by the admissions per second measured over the last
    /// [`WINDOW`](crate::WINDOW), rounded up and clamped to `[1 s,`
    /// [`RETRY_AFTER_CAP`](crate::RETRY_AFTER_CAP)`]` (the cap when nothing was admitted in the
    /// window). This is what a `QueueFull` or `QueueTimeout` rejection carries.
    pub fn retry_after(&self) -> Duration {
        self.inner.drain.retry_after(self.queued())
    }

    /// Completes once a request has started waiting since the last call completed (one stored
    /// signal, however many started meanwhile). For a task that sizes limits at run time and
    /// wants to ask for more as soon as someone waits; nothing on the fast path signals.
    pub async fn waiter_enqueued(&self) {
        self.inner.enqueued.notified().await;
    }

    /// Completes once a permit has been released while nobody waited and releases were
    /// watched ([`watch_releases`](Admission::watch_releases)), since the last call completed
    /// (one stored signal, however many releases): for a task that hands unused limits back to
    /// others.
    pub async fn released_idle(&self) {
        self.inner.released.notified().await;
    }

    /// Whether releases signal [`released_idle`](Admission::released_idle). Off by default:
    /// a release then pays one relaxed load for it; on, also a wake of the waiting task.
    pub fn watch_releases(&self, on: bool) {
        self.inner.release_watched.store(on, Relaxed);
    }

    /// The number of waiting requests.
    pub fn queued(&self) -> usize {
        self.inner.waiting.load(SeqCst)
    }

    /// The sum of in-flight counts over live slots (for tests and leak checks).
    pub fn inflight_total(&self) -> u64 {
        let slots = self.inner.ledger.live();
        slots.iter().map(|s| u64::from(s.inflight())).sum()
    }

    #[cfg(test)]
    pub(crate) fn ledger_len(&self) -> usize {
        self.inner.ledger.len()
    }
}

impl fmt::Debug for Admission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.inner, f)
    }
}

impl fmt::Debug for Inner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Admission")
            .field("cfg", &self.cfg)
            .field("queued", &self.waiting.load(SeqCst))
            .field("contended", &self.contended.load(SeqCst))
            .field("ledger", &self.ledger)
            .finish_non_exhaustive()
    }
}

/// What a request reserves of a token budget (read here rather than kept in the acquire
/// future, which a waiting request holds for its whole wait).
fn tokens_of<S: Selector>(selector: &S) -> u32 {
    u32::try_from(selector.prompt_tokens())
        .unwrap_or(u32::MAX)
        .max(1)
}

/// Removes the waiter if the acquire future is dropped while waiting.
struct CancelOnDrop<'a> {
    inner: &'a Arc<Inner>,
    id: Option<WaiterId>,
}

impl Drop for CancelOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take()
            && let Some((priority, waited)) = self.inner.cancel(id)
        {
            self.inner
                .outcome(priority, PriorityOutcome::Cancelled { waited });
        }
    }
}

impl Inner {
    fn budgeted(&self) -> bool {
        self.budgeted.load(SeqCst)
    }

    /// Tells the observer a slot's count and tokens.
    fn report(&self, slot: &Slot) {
        self.observer.inflight_changed(slot.key(), slot.inflight());
        self.observer
            .tokens_changed(slot.key(), slot.inflight_tokens());
    }

    /// The priority a request waits with: its selector's with priority classes, else `Default`.
    fn priority_of<S: Selector>(&self, selector: &S) -> Priority {
        if self.prioritized {
            selector.priority()
        } else {
            Priority::Default
        }
    }

    /// Tells the observer how a request of `priority` left (priority classes only).
    fn outcome(&self, priority: Priority, outcome: PriorityOutcome) {
        if self.prioritized {
            self.observer.priority_outcome(priority, outcome);
        }
    }

    /// Tells the observer the waiting and held counts of every priority (priority classes only).
    fn levels(&self) {
        if self.prioritized {
            for p in Priority::ALL {
                let queued = self.waiting_by[p.index()].load(SeqCst);
                let held = self.held[p.index()].load(SeqCst);
                self.observer.priority_levels(p, queued, held);
            }
        }
    }

    fn reject(&self, reason: Rejection, priority: Priority, waited: Duration) -> Rejected {
        self.observer.rejected(reason);
        self.outcome(priority, PriorityOutcome::Rejected { reason, waited });
        let retry_after = match reason {
            Rejection::QueueFull | Rejection::QueueTimeout => {
                Some(self.drain.retry_after(self.waiting.load(SeqCst)))
            }
            Rejection::Unavailable => None,
        };
        Rejected {
            reason,
            retry_after,
        }
    }

    /// `Ok(Some)`: admitted. `Ok(None)`: everything full, go slow. `Err(Some(slot))`: reserved,
    /// but someone started waiting; give it back through the slow path. `Err(None)`: unavailable.
    #[allow(clippy::type_complexity)]
    fn fast_path<S: Selector>(
        self: &Arc<Self>,
        selector: &mut S,
    ) -> Result<Option<Admitted<S::Choice>>, Option<Arc<Slot>>> {
        let tokens = tokens_of(selector);
        let interest = Cell::new(0);
        match rank_reserve(selector, tokens, &interest, true) {
            Reserve::Reserved(slot, choice) => {
                if self.contended.load(SeqCst) != 0 {
                    return Err(Some(slot));
                }
                selector.commit(&choice);
                let priority = self.priority_of(selector);
                Ok(Some(self.admitted_now(slot, tokens, priority, choice)))
            }
            Reserve::Full => Ok(None),
            Reserve::Unavailable => Err(None),
        }
    }

    /// Bookkeeping for an admission that did not wait (choice already committed).
    fn admitted_now<C>(
        self: &Arc<Self>,
        slot: Arc<Slot>,
        tokens: u32,
        priority: Priority,
        choice: C,
    ) -> Admitted<C> {
        if slot.is_forgotten() {
            self.ledger.reserved_forgotten(&slot);
        }
        self.report(&slot);
        self.drain.record();
        self.observer.admitted(Duration::ZERO);
        let permit = Permit::new(slot, Arc::<Self>::clone(self), tokens, priority);
        self.outcome(
            priority,
            PriorityOutcome::Admitted {
                waited: Duration::ZERO,
                promoted: false,
            },
        );
        self.levels();
        Admitted {
            choice,
            permit,
            waited: Duration::ZERO,
        }
    }

    fn slow_path<S: Selector>(
        self: &Arc<Self>,
        selector: S,
        backoff: Option<Arc<Slot>>,
    ) -> SlowPath<S::Choice> {
        let tokens = tokens_of(&selector);
        let priority = self.priority_of(&selector);
        let now = Instant::now();
        let interest = Cell::new(0);
        let class = selector.wait_class();
        let mut selector = Some(selector);
        let mut pending = Vec::new();

        let mut queue = self.queue.lock();
        let before = queue.len();
        if let Some(slot) = &backoff {
            // Older waiters get the unit first; this arrival then competes as the newest.
            slot.unreserve(tokens);
            self.dispatch(&mut queue, Some(slot), &mut pending);
        }
        let may_wait = queue.lens()[priority.index()] < self.classes.get(priority).queue_size;
        if may_wait {
            // Announce before ranking (see the module docs: pairs with `release`).
            self.contended.fetch_add(1, SeqCst);
        }
        // With a token budget, members of a class differ in size: an arrival that fits where a
        // waiter of its class served before it does not would overtake it, again and again, so
        // it queues behind instead. (Without a budget, it could not fit where they do not.)
        let behind =
            self.budgeted() && queue.outranked(class.as_deref(), priority, &self.classes, now);
        let sel = selector.as_mut().expect("selector present");
        let step = match rank_reserve(sel, tokens, &interest, !behind) {
            Reserve::Reserved(slot, choice) => Ok((slot, choice)),
            Reserve::Unavailable => Err(Rejection::Unavailable),
            Reserve::Full if !may_wait => Err(Rejection::QueueFull),
            Reserve::Full => {
                let (tx, rx) = oneshot::channel();
                let waiter =
                    TypedWaiter::new(selector.take().expect("selector present"), tokens, tx);
                let id = queue.push(Entry {
                    waiter: Box::new(waiter),
                    enqueued_at: now,
                    interest: interest.get(),
                    class,
                    priority,
                });
                let after = self.unlock(queue, before);
                self.deliver(pending);
                self.publish(after);
                self.enqueued.notify_one();
                let timeout = self.classes.get(priority).queue_timeout;
                return SlowPath::Wait {
                    id,
                    rx,
                    deadline: deadline_after(now, timeout),
                };
            }
        };
        if may_wait {
            self.contended.fetch_sub(1, SeqCst);
        }
        let after = self.unlock(queue, before);
        self.deliver(pending);
        self.publish(after);
        SlowPath::Done(match step {
            Ok((slot, choice)) => {
                let mut selector = selector.expect("selector present");
                selector.commit(&choice);
                Ok(self.admitted_now(slot, tokens, priority, choice))
            }
            Err(reason) => Err(self.reject(reason, priority, Duration::ZERO)),
        })
    }

    /// Publishes the queue length and unlocks; returns the new length (and the lengths per
    /// priority) if it changed.
    fn unlock(&self, queue: MutexGuard<'_, WaitQueue>, before: usize) -> Option<usize> {
        let len = queue.len();
        self.waiting.store(len, SeqCst);
        if self.prioritized {
            for (count, n) in self.waiting_by.iter().zip(queue.lens()) {
                count.store(n, SeqCst);
            }
        }
        drop(queue);
        (len != before).then_some(len)
    }

    /// Tells the observer a queue length [`unlock`](Self::unlock) returned.
    fn publish(&self, after: Option<usize>) {
        if let Some(len) = after {
            self.observer.queued_changed(len);
            self.levels();
        }
    }

    /// Walks the oldest waiter of each class, oldest first, and takes off the queue each one
    /// that reserves (its successor is then visited in turn). With `released`, only classes
    /// interested in that slot are re-ranked, and the walk stops once the slot is full again.
    /// Called with the queue lock held.
    fn dispatch(&self, queue: &mut WaitQueue, released: Option<&Slot>, pending: &mut Vec<Pending>) {
        let budgeted = self.budgeted();
        // Full for every waiter: not even a one-token request fits.
        let full = |slot: Option<&Slot>| slot.is_some_and(Slot::is_full);
        if full(released) {
            return;
        }
        let bit = released.map(|s| s.bit);
        let now = Instant::now();
        let mut walk = queue.walk();
        while let Some(visit) = queue.next(&mut walk, bit, &self.classes, now) {
            let reserved = queue.try_reserve(visit.index);
            // With a token budget the next waiter of this class may be smaller and fit on a
            // worker its predecessor did not: it is visited even if the released slot is full.
            let successor_may_fit = reserved.is_some() && budgeted;
            match reserved {
                Some(slot) => {
                    let entry = queue.remove_at(visit.index);
                    self.contended.fetch_sub(1, SeqCst);
                    pending.push(Pending {
                        tokens: entry.waiter.tokens(),
                        waiter: entry.waiter,
                        slot,
                        priority: entry.priority,
                        enqueued_at: entry.enqueued_at,
                        promoted: visit.promoted,
                    });
                }
                None => queue.block(&walk, visit.index),
            }
            // The released unit is gone (to this waiter, or to a racing fast-path arrival that
            // will give it back through dispatch if anyone waits).
            if full(released) && !successor_may_fit {
                break;
            }
        }
    }

    /// Sends grants (outside the lock). A grant whose caller is gone is released and passed on,
    /// iteratively rather than recursively.
    fn deliver(self: &Arc<Self>, pending: Vec<Pending>) {
        if pending.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut work = VecDeque::from(pending);
        while let Some(Pending {
            waiter,
            slot,
            tokens,
            priority,
            enqueued_at,
            promoted,
        }) = work.pop_front()
        {
            if slot.is_forgotten() {
                self.ledger.reserved_forgotten(&slot);
            }
            self.report(&slot);
            let waited = now.saturating_duration_since(enqueued_at);
            let permit = Permit::new(slot, Arc::<Self>::clone(self), tokens, priority);
            if let Err(permit) = waiter.grant(permit, waited, promoted) {
                let (slot, tokens, priority) = permit.disarm();
                let mut more = Vec::new();
                self.release_into(&slot, tokens, priority, &mut more);
                work.extend(more);
            }
        }
    }

    fn release_into(
        &self,
        slot: &Arc<Slot>,
        tokens: u32,
        priority: Priority,
        pending: &mut Vec<Pending>,
    ) {
        if self.prioritized {
            self.held[priority.index()].fetch_sub(1, SeqCst);
        }
        let mut queued = None;
        if self.contended.load(SeqCst) == 0 {
            slot.unreserve(tokens);
            // Someone may have announced between the load and the decrement (module docs).
            if self.contended.load(SeqCst) != 0 {
                let mut queue = self.queue.lock();
                let before = queue.len();
                self.dispatch(&mut queue, Some(slot), pending);
                queued = self.unlock(queue, before);
            }
        } else {
            // Decrement under the lock so that the unit goes to a waiter before anyone else.
            let mut queue = self.queue.lock();
            let before = queue.len();
            slot.unreserve(tokens);
            self.dispatch(&mut queue, Some(slot), pending);
            queued = self.unlock(queue, before);
        }
        let inflight = slot.inflight();
        self.report(slot);
        match queued {
            Some(len) => self.publish(Some(len)),
            None => self.levels(),
        }
        if inflight == 0 && slot.is_forgotten() {
            self.ledger.released_forgotten(slot, &*self.observer);
        }
    }

    fn notify(self: &Arc<Self>) {
        let mut pending = Vec::new();
        let mut queue = self.queue.lock();
        let before = queue.len();
        if before == 0 {
            return;
        }
        self.dispatch(&mut queue, None, &mut pending);
        let after = self.unlock(queue, before);
        self.deliver(pending);
        self.publish(after);
    }

    /// Removes a waiter (timeout or cancellation): its priority and how long it waited, or
    /// `None` if it was already taken off the queue by a grant.
    fn cancel(&self, id: WaiterId) -> Option<(Priority, Duration)> {
        let mut queue = self.queue.lock();
        let before = queue.len();
        let entry = queue.remove(id);
        if entry.is_some() {
            self.contended.fetch_sub(1, SeqCst);
        }
        let after = self.unlock(queue, before);
        let left = entry.as_ref().map(|e| {
            let waited = Instant::now().saturating_duration_since(e.enqueued_at);
            (e.priority, waited)
        });
        // The selector is dropped outside the lock.
        drop(entry);
        self.publish(after);
        left
    }
}

impl Release for Inner {
    /// Counted with priority classes only: a shared counter would cost every admission a
    /// contended atomic.
    fn held(&self, priority: Priority) {
        if self.prioritized {
            self.held[priority.index()].fetch_add(1, SeqCst);
        }
    }

    fn release(self: Arc<Self>, slot: &Arc<Slot>, tokens: u32, priority: Priority) {
        let mut pending = Vec::new();
        self.release_into(slot, tokens, priority, &mut pending);
        self.deliver(pending);
        if self.release_watched.load(Relaxed) && self.waiting.load(Relaxed) == 0 {
            self.released.notify_one();
        }
    }
}
