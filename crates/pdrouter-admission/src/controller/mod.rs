//! The admission controller: fast path, wait queue, release hand-off, notifications.
//!
//! This module holds the public handle, [`Admission`], and what an acquire future does with
//! its grant; the state its clones share and every step taken on it (both paths, dispatch,
//! delivery, release) are in `inner`. `inner` imports nothing from this module.
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

mod inner;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::Duration;

use tokio::time::{Instant, timeout_at};

use crate::config::{AdmissionConfig, Limits};
use crate::ledger::Slot;
use crate::observer::{Observer, PriorityOutcome, Rejected, Rejection};
use crate::permit::Admitted;
use crate::priority::Priority;
use crate::queue::WaiterId;
use crate::selector::Selector;

use inner::{Inner, SlowPath};

/// Per-worker Prefill admission with a bounded, late-binding FIFO wait queue.
///
/// Cheap to clone (one `Arc`); all clones share the same ledger and queue.
#[derive(Clone)]
pub struct Admission {
    inner: Arc<Inner>,
}

impl Admission {
    /// A controller with the given limits, reporting to `observer`.
    pub fn new(cfg: AdmissionConfig, observer: Arc<dyn Observer>) -> Self {
        Admission {
            inner: Arc::new(Inner::new(cfg, observer)),
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
            inner.drain.record(Instant::now());
            let waited = grant.waited();
            let mut permit = grant.permit;
            permit.delivered();
            inner.observer.admitted(waited);
            inner.outcome(
                permit.priority(),
                PriorityOutcome::Admitted {
                    waited,
                    promoted: grant.promoted,
                },
            );
            Ok(Admitted {
                choice: grant.choice,
                permit,
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

    /// Expected time until a request that joined the queue now would be admitted, in whole
    /// seconds within `[1 s,` [`RETRY_AFTER_CAP`](crate::RETRY_AFTER_CAP)`]`: what a
    /// `QueueFull` or `QueueTimeout` rejection carries.
    ///
    /// From service times (each worker's observed Prefill duration against the age of what it
    /// has in flight, the waiters ahead taking the units as they free) and, where the last
    /// [`WINDOW`](crate::WINDOW) measures one, the drain rate; the cap with no observation at
    /// all. The rule is in the [crate docs](crate#retry-after). Scans the live workers, so it
    /// is meant for rejections, not for every request.
    pub fn retry_after(&self) -> Duration {
        self.inner.retry_after(self.queued())
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
