//! Service times: how long admitted requests hold a worker's slot, and since when the ones in
//! flight have held it. The `Retry-After` estimate (`crate::retry`) ages what is in flight
//! against these to tell when units free.
//!
//! Kept **per worker** (in its [`Slot`](crate::Slot)), not per controller. Prefill durations
//! differ between workers as much as by anything else: the model a pool serves, the hardware,
//! the prompt mix of that pool. A worker serving an 8B model frees its slots many times faster
//! than one serving a 70B model, and one controller-wide average would be wrong for both. The
//! ages it is compared with are per worker anyway, and the update at release stays on an atomic
//! of the released slot, not on one that every release in the controller contends on. A worker
//! with no hold observed yet borrows the mean of the others' (see `crate::retry`).
//!
//! * **Expected duration.** An exponentially weighted moving average of the hold durations of
//!   the slot's permits, admission to release, with weight 1/8 per hold (about the last eight
//!   Prefills); the first observation sets it. One CAS on one atomic per release.
//! * **What is a hold.** Every permit that reached its caller, however its Prefill ended
//!   (finished, failed, cancelled by the client): the estimate is about when units free, and a
//!   failing Prefill frees its unit when it fails. A grant whose caller was already gone (its
//!   permit dropped unseen, or released back by the controller) held nothing for anybody and is
//!   not observed, as the drain rate does not count it either.
//! * **In flight.** Each slot has [`CELLS`] cells of one atomic each. A permit claims a free one
//!   at admission (a load and a CAS, starting at a hint so that claims rarely collide), stores
//!   its admission instant in it, and clears it at release. Beyond `CELLS` in flight on one
//!   worker a permit is not tracked: the estimate counts it as just admitted, and its hold is
//!   not observed. The permit keeps only its cell's index, so it stays as small as before.
//! * **Remaining.** A permit of age `a` on a worker whose Prefills take `D` is expected to free
//!   its unit in `max(|D − a|, D/8)` (see [`remaining`]).
//!
//! Invariants: recording takes no lock (a cell's CAS at admission, a store and the average's
//! CAS at release); reading scans at most `CELLS` cells per slot; time is read only through
//! `tokio::time`, so tests run on a paused clock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

/// In-flight permits whose admission instants a slot tracks.
pub(crate) const CELLS: usize = 64;

/// Weight of one hold in a worker's expected duration, as a shift: the average moves by
/// `(hold − average) >> SMOOTHING_SHIFT`, i.e. by an eighth of the difference.
const SMOOTHING_SHIFT: u32 = 3;

/// The smallest remaining time, as a fraction (`1 / FLOOR`) of the expected duration.
const FLOOR: u32 = 8;

/// A permit's cell when it is not tracked.
const UNTRACKED: u8 = u8::MAX;

/// One worker's service times (part of its slot).
pub(crate) struct Service {
    /// What the stamps count from (the slot's creation).
    epoch: Instant,
    /// Expected hold in nanoseconds; 0 before the first observation.
    mean: AtomicU64,
    /// Admission stamps (nanoseconds since `epoch`, plus 1) of tracked in-flight permits; 0 is
    /// a free cell.
    since: [AtomicU64; CELLS],
}

/// What a permit keeps of its admission: the cell that holds its stamp (one byte, so a permit,
/// which every waiting request's future has room for, does not grow).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Hold {
    cell: u8,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Service {
    pub(crate) fn new() -> Self {
        Service {
            epoch: Instant::now(),
            mean: AtomicU64::new(0),
            since: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    fn stamp(&self, at: Instant) -> u64 {
        nanos(at.saturating_duration_since(self.epoch)).saturating_add(1)
    }

    /// A permit admitted at `now` is in flight. `hint` (e.g. the slot's in-flight count) is
    /// where the search for a free cell starts.
    pub(crate) fn start(&self, now: Instant, hint: u32) -> Hold {
        let stamp = self.stamp(now);
        let first = hint as usize % CELLS;
        for i in 0..CELLS {
            let index = (first + i) % CELLS;
            let cell = &self.since[index];
            if cell.load(Relaxed) == 0 && cell.compare_exchange(0, stamp, Relaxed, Relaxed).is_ok()
            {
                let cell = u8::try_from(index).unwrap_or(UNTRACKED);
                return Hold { cell };
            }
        }
        Hold { cell: UNTRACKED }
    }

    /// The permit is released (`at` its release instant, if its hold is observed) or was never
    /// held for anybody (`None`): frees its cell and, with `at`, adds its hold to the average
    /// (an untracked permit's hold is not observed: the tracked ones are enough to average).
    pub(crate) fn end(&self, hold: Hold, at: Option<Instant>) {
        let Some(cell) = self.since.get(usize::from(hold.cell)) else {
            return;
        };
        let since = cell.swap(0, Relaxed);
        if let Some(at) = at
            && since != 0
        {
            let held = self.stamp(at).saturating_sub(since);
            self.observe(Duration::from_nanos(held));
        }
    }

    /// Adds one hold of `held` to the expected duration.
    pub(crate) fn observe(&self, held: Duration) {
        let held = nanos(held);
        let _ = self
            .mean
            .fetch_update(Relaxed, Relaxed, |mean| Some(smooth(mean, held)));
    }

    /// The expected hold, once one was observed.
    pub(crate) fn expected(&self) -> Option<Duration> {
        match self.mean.load(Relaxed) {
            0 => None,
            mean => Some(Duration::from_nanos(mean)),
        }
    }

    /// The ages at `now` of the tracked in-flight permits.
    pub(crate) fn ages(&self, now: Instant) -> impl Iterator<Item = Duration> + '_ {
        let stamp = self.stamp(now);
        self.since
            .iter()
            .map(|cell| cell.load(Relaxed))
            .filter(|&since| since != 0)
            .map(move |since| Duration::from_nanos(stamp.saturating_sub(since)))
    }
}

/// The average after one more hold, in nanoseconds; at least 1, so that 0 keeps meaning "none
/// observed".
fn smooth(mean: u64, held: u64) -> u64 {
    if mean == 0 {
        return held.max(1);
    }
    let next = if held >= mean {
        mean + ((held - mean) >> SMOOTHING_SHIFT)
    } else {
        mean - ((mean - held) >> SMOOTHING_SHIFT)
    };
    next.max(1)
}

/// When an in-flight permit of `age` is expected to free its unit, on a worker whose holds take
/// `expected`: `max(|expected − age|, expected / 8)`.
///
/// Before its expected end, the rest of it. Around it, at least an eighth of it: it has not
/// ended yet. Past it, as long again as it has overrun: durations have a long tail (one long
/// prompt, an engine that slowed down), so the longer a Prefill has overrun the longer it is
/// likely to go on, and a stuck worker drives the estimate to the cap (as the drain rate's
/// "nothing admitted" did) instead of promising clients a second forever.
pub(crate) fn remaining(expected: Duration, age: Duration) -> Duration {
    expected.abs_diff(age).max(expected / FLOOR)
}

/// `count` units alike that free at `first`, then every `period` (each next request holds the
/// unit for the expected duration).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lane {
    pub(crate) first: Duration,
    pub(crate) period: Duration,
    pub(crate) count: u64,
}

/// The `k`-th admission opportunity over `lanes` (the k-th unit to free, counting the units
/// that free again after each further round), rounded up to whole seconds and clamped to
/// `[1 s, cap]`: the cap when it does not come by then. `None` without lanes.
pub(crate) fn kth_free(lanes: &[Lane], k: u64, cap: Duration) -> Option<Duration> {
    if lanes.is_empty() {
        return None;
    }
    let cap = cap.as_secs().max(1);
    let secs = (1..=cap)
        .find(|&s| opportunities(lanes, Duration::from_secs(s)) >= k)
        .unwrap_or(cap);
    Some(Duration::from_secs(secs))
}

/// Admission opportunities over `lanes` up to and including `by`.
fn opportunities(lanes: &[Lane], by: Duration) -> u64 {
    lanes
        .iter()
        .filter(|lane| lane.first <= by)
        .map(|lane| {
            let rounds = nanos(by - lane.first) / nanos(lane.period).max(1);
            rounds.saturating_add(1).saturating_mul(lane.count)
        })
        .fold(0, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    const fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn ms(ms: u64) -> Duration {
        Duration::from_millis(ms)
    }

    fn lane(first: Duration, period: Duration, count: u64) -> Lane {
        Lane {
            first,
            period,
            count,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_hold_sets_the_average_and_each_next_one_moves_it_an_eighth() {
        let s = Service::new();
        assert_eq!(s.expected(), None);
        let hold = s.start(Instant::now(), 0);
        advance(secs(4)).await;
        s.end(hold, Some(Instant::now()));
        assert_eq!(s.expected(), Some(secs(4)));
        s.observe(Duration::ZERO);
        assert_eq!(s.expected(), Some(ms(3500)));
        s.observe(ms(11_500));
        assert_eq!(s.expected(), Some(ms(4500)));
        // A hold that took no time still counts as an observation.
        let t = Service::new();
        t.observe(Duration::ZERO);
        assert_eq!(t.expected(), Some(Duration::from_nanos(1)));
    }

    #[tokio::test(start_paused = true)]
    async fn cells_hold_the_ages_of_what_is_in_flight() {
        let s = Service::new();
        let a = s.start(Instant::now(), 0);
        advance(secs(1)).await;
        let b = s.start(Instant::now(), 0);
        advance(secs(2)).await;
        let mut ages: Vec<_> = s.ages(Instant::now()).collect();
        ages.sort();
        assert_eq!(ages, [secs(2), secs(3)]);
        // Released without an observation: the cell is free, the average untouched.
        s.end(a, None);
        assert_eq!(s.ages(Instant::now()).collect::<Vec<_>>(), [secs(2)]);
        assert_eq!(s.expected(), None);
        s.end(b, Some(Instant::now()));
        assert_eq!(s.ages(Instant::now()).count(), 0);
        assert_eq!(s.expected(), Some(secs(2)));
    }

    #[tokio::test(start_paused = true)]
    async fn beyond_the_cells_permits_are_not_tracked() {
        let s = Service::new();
        let holds: Vec<_> = (0..CELLS as u32 + 3)
            .map(|i| s.start(Instant::now(), i))
            .collect();
        assert_eq!(s.ages(Instant::now()).count(), CELLS);
        assert_eq!(holds.iter().filter(|h| h.cell == UNTRACKED).count(), 3);
        // Ending an untracked permit frees nobody's cell.
        for hold in holds.iter().filter(|h| h.cell == UNTRACKED) {
            s.end(*hold, None);
        }
        assert_eq!(s.ages(Instant::now()).count(), CELLS);
        for hold in holds {
            s.end(hold, None);
        }
        assert_eq!(s.ages(Instant::now()).count(), 0);
    }

    #[test]
    fn remaining_is_the_rest_then_the_overrun_never_below_an_eighth() {
        let d = secs(4);
        assert_eq!(remaining(d, Duration::ZERO), secs(4));
        assert_eq!(remaining(d, ms(3300)), ms(700));
        assert_eq!(remaining(d, ms(3900)), ms(500), "floor: an eighth");
        assert_eq!(remaining(d, secs(4)), ms(500));
        assert_eq!(remaining(d, secs(6)), secs(2), "overrun by 2 s: 2 s more");
        assert_eq!(remaining(d, secs(30)), secs(26));
    }

    #[test]
    fn the_kth_unit_to_free_counts_further_rounds() {
        let cap = secs(10);
        assert_eq!(kth_free(&[], 1, cap), None);
        // Capacity 2, both just admitted, 2 s each: units free at 2, 2, 4, 4, 6, 6.
        let busy = [lane(secs(2), secs(2), 2)];
        assert_eq!(kth_free(&busy, 1, cap), Some(secs(2)));
        assert_eq!(kth_free(&busy, 3, cap), Some(secs(4)));
        assert_eq!(kth_free(&busy, 6, cap), Some(secs(6)));
        assert_eq!(kth_free(&busy, 7, cap), Some(secs(8)));
        assert_eq!(kth_free(&busy, 100, cap), Some(cap), "clamped to the cap");
        // Rounded up, never below a second.
        let soon = [lane(ms(700), secs(4), 1)];
        assert_eq!(kth_free(&soon, 1, cap), Some(secs(1)));
        assert_eq!(kth_free(&soon, 2, cap), Some(secs(5)), "4.7 s");
        let instant = [lane(Duration::ZERO, Duration::from_nanos(1), 1)];
        assert_eq!(kth_free(&instant, 1_000_000, cap), Some(secs(1)));
        // Lanes of different workers interleave.
        let mixed = [lane(secs(1), secs(3), 1), lane(secs(2), secs(8), 1)];
        // 1, 2, 4, 7, 10: the fourth at 7 s.
        assert_eq!(kth_free(&mixed, 4, cap), Some(secs(7)));
        assert_eq!(kth_free(&mixed, 5, cap), Some(secs(10)));
    }
}
