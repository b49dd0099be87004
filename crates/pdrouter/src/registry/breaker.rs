//! Per-worker circuit breaker.
//!
//! `closed --(failure_threshold consecutive failures within the window)--> open --(timeout)-->
//! half_open`; in half-open, `success_threshold` successes close it and any failure reopens it.
//! A success resets the failure count; so does a failure more than `window` after the first
//! failure of the current run (it starts a new run), so a worker failing now and then over
//! hours is not opened by failures long apart.
//!
//! Invariants:
//! - Reading the state ([`Breaker::state`], [`Breaker::allows`]) never changes it. Selection,
//!   `GET /workers` and metrics all read, so a transition applied by a reader would be lost
//!   to the registry's event path (no event, no admission re-evaluation, a stale gauge).
//! - Only the registry changes the state: [`Breaker::record`] on an outcome, and
//!   [`Breaker::half_open_if_due`] from the exact timer armed when the breaker opened. Each
//!   transition is returned to exactly one caller (under the breaker's lock), which publishes
//!   it. So a worker stays open until that timer has run and its event is out: admission
//!   waiters are re-evaluated before any new arrival can see the worker as available.
//! - Time comes from `tokio::time` only, so tests drive it with a paused clock.

use std::sync::atomic::{AtomicU8, Ordering};

use parking_lot::Mutex;
use tokio::time::Instant;

use crate::config::BreakerConfig;

/// Externally visible breaker state; the discriminant is the `smg_worker_cb_state` value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum BreakerState {
    /// Traffic flows.
    Closed = 0,
    /// Traffic is refused until the timeout passes.
    Open = 1,
    /// Trial traffic flows; the next results decide.
    HalfOpen = 2,
}

impl BreakerState {
    /// Lower-case name for the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Closed => "closed",
            Self::Open => "open",
            Self::HalfOpen => "half_open",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::Open,
            2 => Self::HalfOpen,
            _ => Self::Closed,
        }
    }
}

#[derive(Debug)]
enum Inner {
    /// `since`: when the current run of failures began.
    Closed {
        failures: u32,
        since: Instant,
    },
    Open {
        until: Instant,
    },
    HalfOpen {
        successes: u32,
    },
}

/// A state change caused by [`Breaker::record`] or [`Breaker::half_open_if_due`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// New state.
    pub to: BreakerState,
    /// When the breaker just opened: the instant it turns half-open.
    pub half_open_at: Option<Instant>,
}

/// One worker's breaker.
#[derive(Debug)]
pub struct Breaker {
    cfg: BreakerConfig,
    // Mirror of the state so the routing hot path reads one atomic when closed.
    fast: AtomicU8,
    inner: Mutex<Inner>,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Self {
        Self {
            cfg,
            fast: AtomicU8::new(BreakerState::Closed as u8),
            inner: Mutex::new(Inner::Closed {
                failures: 0,
                since: Instant::now(),
            }),
        }
    }

    /// Current state. Never changes it (see the module docs).
    pub fn state(&self) -> BreakerState {
        if !self.cfg.enabled {
            return BreakerState::Closed;
        }
        BreakerState::from_u8(self.fast.load(Ordering::Acquire))
    }

    /// Turns an open breaker half-open once its timeout has passed; returns the transition to
    /// the one caller that applied it.
    pub(crate) fn half_open_if_due(&self) -> Option<Transition> {
        let mut inner = self.inner.lock();
        match *inner {
            Inner::Open { until } if Instant::now() >= until => {
                *inner = Inner::HalfOpen { successes: 0 };
                self.fast
                    .store(BreakerState::HalfOpen as u8, Ordering::Release);
                Some(Transition {
                    to: BreakerState::HalfOpen,
                    half_open_at: None,
                })
            }
            _ => None,
        }
    }

    /// Whether a request may be sent now (closed or half-open).
    pub fn allows(&self) -> bool {
        self.state() != BreakerState::Open
    }

    /// Records one outcome; returns the transition it caused.
    pub(crate) fn record(&self, success: bool) -> Option<Transition> {
        if !self.cfg.enabled {
            return None;
        }
        let mut inner = self.inner.lock();
        let next = match (&mut *inner, success) {
            (Inner::Closed { failures, .. }, true) => {
                *failures = 0;
                None
            }
            (Inner::Closed { failures, since }, false) => {
                let now = Instant::now();
                if *failures == 0 || now.saturating_duration_since(*since) > self.cfg.window {
                    *failures = 0;
                    *since = now;
                }
                *failures += 1;
                (*failures >= self.cfg.failure_threshold).then(|| self.open_until())
            }
            (Inner::HalfOpen { successes }, true) => {
                *successes += 1;
                if *successes >= self.cfg.success_threshold {
                    *inner = Inner::Closed {
                        failures: 0,
                        since: Instant::now(),
                    };
                    self.fast
                        .store(BreakerState::Closed as u8, Ordering::Release);
                    return Some(Transition {
                        to: BreakerState::Closed,
                        half_open_at: None,
                    });
                }
                None
            }
            (Inner::HalfOpen { .. }, false) => Some(self.open_until()),
            // Results of requests sent before the breaker opened say nothing new, even once
            // the timeout has passed: only the timer turns it half-open.
            (Inner::Open { .. }, _) => None,
        };
        match next {
            Some(until) => {
                *inner = Inner::Open { until };
                self.fast.store(BreakerState::Open as u8, Ordering::Release);
                Some(Transition {
                    to: BreakerState::Open,
                    half_open_at: Some(until),
                })
            }
            None => None,
        }
    }

    fn open_until(&self) -> Instant {
        crate::config::deadline_after(Instant::now(), self.cfg.timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn cfg() -> BreakerConfig {
        BreakerConfig {
            enabled: true,
            failure_threshold: 3,
            success_threshold: 2,
            timeout: Duration::from_secs(10),
            window: Duration::from_secs(60),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn failures_further_apart_than_the_window_do_not_add_up() {
        let b = Breaker::new(cfg());
        assert!(b.record(false).is_none());
        tokio::time::advance(Duration::from_secs(30)).await;
        assert!(b.record(false).is_none());
        // 61 s after the run began: this failure starts a new run of one.
        tokio::time::advance(Duration::from_secs(31)).await;
        assert!(b.record(false).is_none());
        assert!(b.record(false).is_none());
        assert_eq!(b.state(), BreakerState::Closed);
        // Within the window of the new run: the third failure opens it.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(b.record(false).unwrap().to, BreakerState::Open);
    }

    #[tokio::test(start_paused = true)]
    async fn opens_after_consecutive_failures_only() {
        let b = Breaker::new(cfg());
        assert!(b.record(false).is_none());
        assert!(b.record(true).is_none());
        assert!(b.record(false).is_none());
        assert!(b.record(false).is_none());
        let t = b.record(false).unwrap();
        assert_eq!(t.to, BreakerState::Open);
        assert_eq!(
            t.half_open_at,
            Some(Instant::now() + Duration::from_secs(10))
        );
        assert!(!b.allows());
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_at_the_exact_instant_then_closes() {
        let b = Breaker::new(cfg());
        for _ in 0..3 {
            b.record(false);
        }
        tokio::time::advance(Duration::from_millis(9_999)).await;
        assert!(b.half_open_if_due().is_none());
        assert_eq!(b.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_millis(1)).await;
        // Due, but reading neither applies nor loses the change: it goes to one caller.
        assert_eq!(b.state(), BreakerState::Open);
        assert!(!b.allows());
        assert!(
            b.record(true).is_none(),
            "an outcome while open changes nothing"
        );
        assert_eq!(b.half_open_if_due().unwrap().to, BreakerState::HalfOpen);
        assert!(b.half_open_if_due().is_none(), "applied exactly once");
        assert_eq!(b.state(), BreakerState::HalfOpen);
        assert!(b.record(true).is_none());
        assert_eq!(b.record(true).unwrap().to, BreakerState::Closed);
    }

    #[tokio::test(start_paused = true)]
    async fn half_open_failure_reopens() {
        let b = Breaker::new(cfg());
        for _ in 0..3 {
            b.record(false);
        }
        tokio::time::advance(Duration::from_secs(10)).await;
        b.half_open_if_due().unwrap();
        assert!(b.allows());
        let t = b.record(false).unwrap();
        assert_eq!(t.to, BreakerState::Open);
        assert!(!b.allows());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unrepresentable_timeout_opens_for_good_without_panicking() {
        let b = Breaker::new(BreakerConfig {
            timeout: Duration::MAX,
            ..cfg()
        });
        for _ in 0..3 {
            b.record(false);
        }
        tokio::time::advance(Duration::from_secs(365 * 24 * 3600)).await;
        assert!(b.half_open_if_due().is_none());
        assert!(!b.allows());
    }

    #[tokio::test(start_paused = true)]
    async fn disabled_never_opens() {
        let b = Breaker::new(BreakerConfig {
            enabled: false,
            ..cfg()
        });
        for _ in 0..10 {
            assert!(b.record(false).is_none());
        }
        assert!(b.allows());
    }
}
