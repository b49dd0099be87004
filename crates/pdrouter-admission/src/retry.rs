//! The `Retry-After` estimate: when a request that joins the queue now could be admitted. The
//! crate docs' "Retry-After" section states the rule for users; this is how it is computed.
//!
//! **Service time.** Over the *binding* slots (live, not forgotten, and full, or with a token
//! budget and something in flight): the workers a waiting request can be waiting on. Workers
//! with room are not: if a waiter could use one, it would have been admitted. For each, `D` is
//! its expected hold ([`crate::service`]), or the mean of the expected holds of the live slots
//! that have one while it has none. Its capacity is `c = min(inflight, limit)`; its units free
//! at `remaining(D, age)` for each tracked in-flight permit, and at `D` for each untracked one
//! (as just admitted); with more in flight than the limit (lowered), the first
//! `inflight − limit` of those free no unit anyone can use. Each unit that frees is taken by
//! the next request, which frees it again `D` later. The request that is told `Retry-After`
//! has `queued` waiters ahead of it, so it is admitted at the `(queued + 1)`-th of those
//! opportunities over all binding slots ([`kth_free`]). No estimate when no live slot has an
//! observed hold, or no slot binds (e.g. the workers waited for are all unhealthy).
//!
//! **Drain rate.** [`wait_at_rate`] over the admissions of the last [`WINDOW`](crate::WINDOW),
//! trusted when they are at least the binding capacity `Σ c` (one round of every unit; fewer
//! say more about the arrivals than about how fast units free).
//!
//! **Combined.** The smaller of the two when both exist and the rate is trusted; else the
//! service time; else the drain rate (as before service times existed, which is also what a
//! controller with no finished Prefill yet gets); else [`RETRY_AFTER_CAP`]. Each errs late in
//! its own way: the drain rate counts admissions, which are the arrivals unless the queue
//! stayed busy the whole window, so it understates what the workers can do under sparse or
//! bursty traffic; the service time lags a worker that became faster by a few Prefills. Erring
//! early costs the client one more cheap 429; erring late leaves it idle while units are free.
//!
//! Every value is rounded up to whole seconds and clamped to `[1 s, RETRY_AFTER_CAP]`.
//!
//! Cost: computed only for a `QueueFull` or `QueueTimeout` rejection (and
//! [`Admission::retry_after`](crate::Admission::retry_after)), after the queue lock is
//! released: the ledger's lock to list the live slots, then at most `CELLS` cells per binding
//! slot and ten counts per lane. Nothing on the admission fast path.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::drain::{DrainMeter, RETRY_AFTER_CAP, wait_at_rate};
use crate::ledger::Slot;
use crate::service::{Lane, kth_free, remaining};

/// The service-time estimate and the capacity it counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Estimate {
    wait: Duration,
    capacity: u64,
}

/// When a request that joins the queue behind `queued` waiters could be admitted, given the
/// controller's drain meter and its live slots.
pub(crate) fn retry_after(drain: &DrainMeter, slots: &[Arc<Slot>], queued: usize) -> Duration {
    let ahead = (queued as u64).saturating_add(1);
    let service = from_service(slots, ahead, Instant::now());
    let admitted = drain.admitted_in_window();
    combine(service, admitted, wait_at_rate(admitted, queued))
}

/// The rule that combines the two estimates (see the module docs).
fn combine(service: Option<Estimate>, admitted: u64, drained: Option<Duration>) -> Duration {
    match (service, drained) {
        (Some(s), Some(d)) if admitted >= s.capacity => s.wait.min(d),
        (Some(s), _) => s.wait,
        (None, Some(d)) => d,
        (None, None) => RETRY_AFTER_CAP,
    }
}

/// A waiting request may be waiting for this slot.
fn binds(slot: &Slot) -> bool {
    !slot.is_forgotten()
        && (slot.is_full() || (slot.token_limit().is_some() && slot.inflight() > 0))
}

/// The service-time estimate for the `ahead`-th opportunity, at `now`.
fn from_service(slots: &[Arc<Slot>], ahead: u64, now: Instant) -> Option<Estimate> {
    let fallback = mean_expected(slots)?;
    let mut lanes = Vec::new();
    let mut capacity = 0;
    for slot in slots.iter().filter(|s| binds(s)) {
        let expected = slot.service.expected().unwrap_or(fallback);
        capacity += slot_lanes(slot, expected, now, &mut lanes);
    }
    let wait = kth_free(&lanes, ahead, RETRY_AFTER_CAP)?;
    Some(Estimate { wait, capacity })
}

/// The mean of the expected holds of the slots that have one.
fn mean_expected(slots: &[Arc<Slot>]) -> Option<Duration> {
    let (sum, n) = slots
        .iter()
        .filter_map(|s| s.service.expected())
        .fold((Duration::ZERO, 0u32), |(sum, n), d| {
            (sum.saturating_add(d), n + 1)
        });
    (n > 0).then(|| sum / n)
}

/// Pushes the lanes of one binding slot whose holds take `expected`; returns its capacity.
fn slot_lanes(slot: &Slot, expected: Duration, now: Instant, lanes: &mut Vec<Lane>) -> u64 {
    let inflight = u64::from(slot.inflight());
    let capacity = inflight.min(u64::from(slot.limit()));
    if capacity == 0 {
        return 0;
    }
    // (when it frees, how many), earliest first.
    let mut frees: Vec<(Duration, u64)> = slot
        .service
        .ages(now)
        .map(|age| (remaining(expected, age), 1))
        .collect();
    let untracked = inflight.saturating_sub(frees.len() as u64);
    frees.push((expected, untracked));
    frees.sort_unstable();
    let mut skip = inflight - capacity;
    let mut left = capacity;
    for (first, count) in frees {
        let skipped = skip.min(count);
        skip -= skipped;
        // Cells and the count are read at slightly different instants: never more lanes than
        // the capacity.
        let count = (count - skipped).min(left);
        left -= count;
        if count > 0 {
            lanes.push(Lane {
                first,
                period: expected,
                count,
            });
        }
    }
    capacity
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Limits;
    use crate::ledger::Ledger;
    use tokio::time::advance;

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn est(wait: u64, capacity: u64) -> Option<Estimate> {
        Some(Estimate {
            wait: secs(wait),
            capacity,
        })
    }

    #[test]
    fn the_smaller_where_the_drain_rate_is_measured_else_the_service_time() {
        // Measured (admissions at least the capacity): the smaller of the two.
        assert_eq!(combine(est(6, 2), 4, Some(secs(10))), secs(6));
        assert_eq!(combine(est(6, 2), 2, Some(secs(3))), secs(3));
        // Too few admissions for the rate to say how fast units free: the service time,
        // even when the rate says sooner.
        assert_eq!(combine(est(6, 4), 3, Some(secs(3))), secs(6));
        assert_eq!(combine(est(4, 1), 0, None), secs(4));
        // No observed hold: the drain rate as before, else the cap.
        assert_eq!(combine(None, 1, Some(secs(5))), secs(5));
        assert_eq!(combine(None, 0, None), RETRY_AFTER_CAP);
    }

    fn limits(count: u32, tokens: Option<u32>) -> Limits {
        Limits { count, tokens }
    }

    #[tokio::test(start_paused = true)]
    async fn a_lowered_limit_leaves_the_first_units_to_free_to_nobody() {
        let ledger = Ledger::new(limits(2, None));
        let slot = ledger.slot("w0");
        slot.service.observe(secs(6));
        assert!(slot.try_reserve(1));
        let x = slot.service.start(Instant::now(), 0);
        advance(secs(4)).await;
        assert!(slot.try_reserve(1));
        let y = slot.service.start(Instant::now(), 1);
        let slots = [Arc::clone(&slot)];
        let now = Instant::now();
        // x frees in 2 s, y in 6 s, each again 6 s later.
        assert_eq!(from_service(&slots, 1, now), est(2, 2));
        assert_eq!(from_service(&slots, 2, now), est(6, 2));
        assert_eq!(from_service(&slots, 3, now), est(8, 2));
        // One unit now: x's end admits nobody.
        slot.set_limits(limits(1, None));
        assert_eq!(from_service(&slots, 1, now), est(6, 1));
        assert_eq!(
            from_service(&slots, 2, now),
            Some(Estimate {
                wait: RETRY_AFTER_CAP,
                capacity: 1
            })
        );
        slot.service.end(x, None);
        slot.service.end(y, None);
        slot.unreserve(1);
        slot.unreserve(1);
    }

    #[tokio::test(start_paused = true)]
    async fn only_slots_a_waiter_may_wait_for_count_and_unobserved_ones_borrow_the_mean() {
        let ledger = Ledger::new(limits(1, None));
        let (a, b, c) = (ledger.slot("a"), ledger.slot("b"), ledger.slot("c"));
        let slots = [Arc::clone(&a), Arc::clone(&b), Arc::clone(&c)];
        let now = Instant::now();
        // Nothing observed anywhere: no estimate.
        assert!(c.try_reserve(1));
        let hold = c.service.start(now, 0);
        assert_eq!(from_service(&slots, 1, now), None);
        // a and b have room, so they do not count; c has no average of its own: 2 s and 6 s.
        a.service.observe(secs(2));
        b.service.observe(secs(6));
        assert_eq!(from_service(&slots, 1, now), est(4, 1));
        // A forgotten worker is waited for by nobody.
        ledger.forget("c", &NoObserver);
        assert_eq!(from_service(&slots, 1, now), None);
        c.service.end(hold, None);
        c.unreserve(1);
        // With a token budget, a worker with room for small prompts may still hold a large one
        // back: it counts once something is in flight.
        let budgeted = Ledger::new(limits(u32::MAX, Some(100)));
        let t = budgeted.slot("t");
        t.service.observe(secs(3));
        let slots = [Arc::clone(&t)];
        assert_eq!(from_service(&slots, 1, now), None, "idle");
        assert!(t.try_reserve(10));
        let hold = t.service.start(now, 0);
        assert_eq!(from_service(&slots, 1, now), est(3, 1));
        t.service.end(hold, None);
        t.unreserve(10);
    }

    struct NoObserver;
    impl crate::observer::Observer for NoObserver {}
}
