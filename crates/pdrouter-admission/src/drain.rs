//! The queue's measured drain rate, one of the two estimates `Retry-After` is made of (see
//! `crate::retry` for the other one, from service times, and how the two combine).
//!
//! Every admission that reaches its caller (without waiting or after waiting) is counted in one
//! of [`BUCKETS`] one-second buckets. The rate is the number of admissions in the last
//! [`WINDOW`] (the current, partial second included) divided by the whole window. Dividing by
//! the whole window even just after start-up underestimates the rate then, which errs towards
//! telling clients to come back later rather than too early.
//!
//! The rate is per controller, not per wait class: a rejected request that comes back joins
//! the tail of the queue, behind every request waiting now, and classes mostly share the same
//! workers, so the controller-wide rate is the one that empties the queue in front of it. The
//! expected wait is `(queued + 1) / rate`, rounded up to whole seconds and clamped to
//! `[1, RETRY_AFTER_CAP]`; with no admission in the window there is no estimate.
//!
//! The rate counts admissions, so it measures what the workers can do only while the queue
//! stays busy the whole window; with sparse traffic it measures the arrivals and overstates
//! the wait, which is why it is not used alone.
//!
//! Invariants: recording is lock-free (one CAS on one bucket), so the admission fast path takes
//! no lock for it; a bucket older than the window never counts; time is read only through
//! `tokio::time`, so tests run on a paused clock.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use tokio::time::Instant;

/// Width of the measurement window.
pub const WINDOW: Duration = Duration::from_secs(BUCKETS as u64);

/// Largest `Retry-After` ever suggested. Small on purpose: clients (the OpenAI SDK among them)
/// sleep for the whole value before retrying, and a queue that drains faster than estimated
/// should not leave them idle for long.
pub const RETRY_AFTER_CAP: Duration = Duration::from_secs(10);

/// One-second buckets in the window.
const BUCKETS: usize = 10;

/// Admissions per second over the last [`WINDOW`].
pub(crate) struct DrainMeter {
    start: Instant,
    /// `second << 32 | count`: the second (since `start`) the bucket counts, and its count.
    buckets: [AtomicU64; BUCKETS],
}

impl DrainMeter {
    pub(crate) fn new() -> Self {
        DrainMeter {
            start: Instant::now(),
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }

    /// The current second since start (saturating; a router does not run 2^32 seconds).
    fn second(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.start)
            .as_secs()
            .min(u64::from(u32::MAX))
    }

    /// Counts one admission at `now`.
    pub(crate) fn record(&self, now: Instant) {
        let sec = self.second(now);
        let bucket = &self.buckets[(sec % BUCKETS as u64) as usize];
        let mut cur = bucket.load(Relaxed);
        loop {
            let next = if cur >> 32 == sec {
                // Saturate instead of carrying into the second.
                cur + u64::from(cur & 0xffff_ffff < 0xffff_ffff)
            } else {
                sec << 32 | 1
            };
            match bucket.compare_exchange_weak(cur, next, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Admissions counted in the last [`WINDOW`] (the current second included).
    pub(crate) fn admitted_in_window(&self) -> u64 {
        let sec = self.second(Instant::now());
        // A bucket's first count happens at second 0 with value 0 << 32 | n, so "never written"
        // (0) counts nothing either way.
        let oldest = sec.saturating_sub(BUCKETS as u64 - 1);
        self.buckets
            .iter()
            .map(|b| b.load(Relaxed))
            .filter(|v| (oldest..=sec).contains(&(v >> 32)))
            .map(|v| v & 0xffff_ffff)
            .sum()
    }

    /// Expected time until a request that joins the queue behind `queued` waiters is admitted,
    /// rounded up to whole seconds and clamped to `[1 s, RETRY_AFTER_CAP]`; the cap with no
    /// admission in the window.
    #[cfg(test)]
    pub(crate) fn retry_after(&self, queued: usize) -> Duration {
        wait_at_rate(self.admitted_in_window(), queued).unwrap_or(RETRY_AFTER_CAP)
    }
}

/// Expected time until a request that joins the queue behind `queued` waiters is admitted when
/// `admitted` requests were admitted in the last [`WINDOW`]: `(queued + 1) / rate`, rounded up
/// to whole seconds and clamped to `[1 s, RETRY_AFTER_CAP]`. `None` when nothing was admitted.
pub(crate) fn wait_at_rate(admitted: u64, queued: usize) -> Option<Duration> {
    if admitted == 0 {
        return None;
    }
    let ahead = queued as u64 + 1;
    // ahead / (admitted / WINDOW) seconds, rounded up, in integers.
    let secs = (ahead.saturating_mul(WINDOW.as_secs())).div_ceil(admitted);
    Some(Duration::from_secs(
        secs.clamp(1, RETRY_AFTER_CAP.as_secs()),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::time::advance;

    fn secs(d: Duration) -> u64 {
        d.as_secs()
    }

    #[tokio::test(start_paused = true)]
    async fn no_admission_yet_suggests_the_cap() {
        let m = DrainMeter::new();
        assert_eq!(m.retry_after(0), RETRY_AFTER_CAP);
        assert_eq!(m.retry_after(1000), RETRY_AFTER_CAP);
    }

    #[tokio::test(start_paused = true)]
    async fn rate_is_admissions_over_the_window() {
        let m = DrainMeter::new();
        // 20 admissions spread over 4 s: 2 per second over the 10 s window.
        for _ in 0..4 {
            for _ in 0..5 {
                m.record(Instant::now());
            }
            advance(Duration::from_secs(1)).await;
        }
        assert_eq!(m.admitted_in_window(), 20);
        // Alone: 1 / 2 per second = 0.5 s, rounded up to 1.
        assert_eq!(secs(m.retry_after(0)), 1);
        // 5 ahead + itself at 2 per second: 3 s.
        assert_eq!(secs(m.retry_after(5)), 3);
        // 8 + 1 at 2 per second: 4.5 s, rounded up.
        assert_eq!(secs(m.retry_after(8)), 5);
        // Far more than the cap.
        assert_eq!(m.retry_after(1000), RETRY_AFTER_CAP);
    }

    #[tokio::test(start_paused = true)]
    async fn old_admissions_leave_the_window() {
        let m = DrainMeter::new();
        for _ in 0..100 {
            m.record(Instant::now());
        }
        assert_eq!(secs(m.retry_after(9)), 1, "10 per second");
        advance(Duration::from_secs(9)).await;
        assert_eq!(
            m.admitted_in_window(),
            100,
            "second 0 is still in the window"
        );
        advance(Duration::from_secs(1)).await;
        assert_eq!(m.admitted_in_window(), 0);
        assert_eq!(m.retry_after(0), RETRY_AFTER_CAP);
        // A bucket reused by a later second starts from zero.
        m.record(Instant::now());
        assert_eq!(m.admitted_in_window(), 1);
        assert_eq!(secs(m.retry_after(0)), 10);
        advance(Duration::from_secs(25)).await;
        for _ in 0..30 {
            m.record(Instant::now());
        }
        assert_eq!(m.admitted_in_window(), 30);
        assert_eq!(secs(m.retry_after(5)), 2, "6 at 3 per second");
    }

    #[tokio::test(start_paused = true)]
    async fn a_slower_drain_suggests_a_longer_wait() {
        let fast = DrainMeter::new();
        let slow = DrainMeter::new();
        for _ in 0..40 {
            fast.record(Instant::now());
        }
        for _ in 0..4 {
            slow.record(Instant::now());
        }
        assert!(fast.retry_after(3) < slow.retry_after(3));
        assert_eq!(secs(fast.retry_after(3)), 1);
        assert_eq!(secs(slow.retry_after(3)), 10);
        assert_eq!(secs(slow.retry_after(1)), 5);
    }
}
