//! The state every clone of an [`Admission`](crate::Admission) shares, and what is done with
//! it: the fast path, the slow path under the queue lock, dispatch to waiters, delivery of
//! grants outside the lock, release and notification. The parent module's docs give the
//! shape and the race argument these follow.

use std::cell::Cell;
use std::collections::{HashSet, VecDeque};
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed, Ordering::SeqCst};
use std::time::Duration;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::config::{AdmissionConfig, Limits, deadline_after};
use crate::drain::DrainMeter;
use crate::ledger::{Ledger, Slot};
use crate::observer::{Observer, PriorityOutcome, Rejected, Rejection};
use crate::permit::{Admitted, Permit, Release};
use crate::priority::{Priority, PriorityClasses};
use crate::queue::{Entry, Grant, Reserve, TypedWaiter, WaitQueue, Waiter, WaiterId, rank_reserve};
use crate::retry;
use crate::selector::Selector;

/// What every clone of an [`Admission`](crate::Admission) shares.
pub(crate) struct Inner {
    pub(super) cfg: AdmissionConfig,
    pub(super) observer: Arc<dyn Observer>,
    pub(super) ledger: Ledger,
    /// Waiters plus slow-path arrivals that may still enqueue. The fast path runs only at 0.
    pub(super) contended: AtomicUsize,
    /// The queue length, readable without the lock.
    pub(super) waiting: AtomicUsize,
    queue: Mutex<WaitQueue>,
    /// Instants with a pending `notify_at` timer (so repeated calls share one timer).
    pub(super) scheduled: Mutex<HashSet<Instant>>,
    /// Admissions per second, for the `retry_after` of a rejection.
    pub(super) drain: DrainMeter,
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
    pub(super) budgeted: AtomicBool,
    /// Signalled when a request starts waiting (slow path only), for whoever sizes the limits.
    pub(super) enqueued: tokio::sync::Notify,
    /// Signalled when a permit is released while nobody waits, while releases are watched
    /// ([`Admission::watch_releases`](crate::Admission::watch_releases)).
    pub(super) released: tokio::sync::Notify,
    pub(super) release_watched: AtomicBool,
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

/// How the slow path ended: decided under the lock, or waiting for a grant.
pub(super) enum SlowPath<C> {
    Done(Result<Admitted<C>, Rejected>),
    Wait {
        id: WaiterId,
        rx: oneshot::Receiver<Grant<C>>,
        deadline: Instant,
    },
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

impl Inner {
    /// The state of a controller with the given limits, reporting to `observer`.
    pub(super) fn new(cfg: AdmissionConfig, observer: Arc<dyn Observer>) -> Self {
        let limits = Limits::of(&cfg);
        Inner {
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
        }
    }

    fn budgeted(&self) -> bool {
        self.budgeted.load(SeqCst)
    }

    /// Tells the observer a slot's count and tokens.
    fn report(&self, slot: &Slot) {
        self.observer
            .inflight_changed(slot.shared_key(), slot.inflight());
        self.observer
            .tokens_changed(slot.shared_key(), slot.inflight_tokens());
    }

    /// The priority a request waits with: its selector's with priority classes, else `Default`.
    pub(super) fn priority_of<S: Selector>(&self, selector: &S) -> Priority {
        if self.prioritized {
            selector.priority()
        } else {
            Priority::Default
        }
    }

    /// Tells the observer how a request of `priority` left (priority classes only).
    pub(super) fn outcome(&self, priority: Priority, outcome: PriorityOutcome) {
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

    pub(super) fn reject(
        &self,
        reason: Rejection,
        priority: Priority,
        waited: Duration,
    ) -> Rejected {
        self.observer.rejected(reason);
        self.outcome(priority, PriorityOutcome::Rejected { reason, waited });
        let retry_after = match reason {
            Rejection::QueueFull | Rejection::QueueTimeout => {
                Some(self.retry_after(self.waiting.load(SeqCst)))
            }
            Rejection::Unavailable => None,
        };
        Rejected {
            reason,
            retry_after,
        }
    }

    /// When a request that joins the queue behind `queued` waiters could be admitted (see
    /// `crate::retry`). Scans the live slots: for rejections only, never on the fast path.
    pub(super) fn retry_after(&self, queued: usize) -> Duration {
        retry::retry_after(&self.drain, &self.ledger.live(), queued)
    }

    /// `Ok(Some)`: admitted. `Ok(None)`: everything full, go slow. `Err(Some(slot))`: reserved,
    /// but someone started waiting; give it back through the slow path. `Err(None)`: unavailable.
    #[allow(clippy::type_complexity)]
    pub(super) fn fast_path<S: Selector>(
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
        let now = Instant::now();
        self.drain.record(now);
        self.observer.admitted(Duration::ZERO);
        let permit = Permit::new(slot, Arc::<Self>::clone(self), tokens, priority, now, true);
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

    pub(super) fn slow_path<S: Selector>(
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
            let permit = Permit::new(slot, Arc::<Self>::clone(self), tokens, priority, now, false);
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

    pub(super) fn notify(self: &Arc<Self>) {
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
    pub(super) fn cancel(&self, id: WaiterId) -> Option<(Priority, Duration)> {
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
