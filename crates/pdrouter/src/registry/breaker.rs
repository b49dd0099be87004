//! Per-worker circuit breaker.
//!
//! `closed --(failure_threshold consecutive failures)--> open --(timeout)--> half_open`;
//! in half-open, `success_threshold` successes close it and any failure reopens it.
//! Open → half-open happens lazily when the state is read, and [`Breaker::record`] reports the
//! instant it will be due, so the registry can arm one exact timer instead of polling.
//! Time comes from `tokio::time` only, so tests drive it with a paused clock.

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
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { successes: u32 },
}

/// A state change caused by [`Breaker::record`] or a lazy read.
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
            inner: Mutex::new(Inner::Closed { failures: 0 }),
        }
    }

    /// Current state, applying a due open → half-open change. Returns the change, if any.
    pub fn poll_state(&self) -> (BreakerState, Option<Transition>) {
        if !self.cfg.enabled {
            return (BreakerState::Closed, None);
        }
        let fast = BreakerState::from_u8(self.fast.load(Ordering::Acquire));
        if fast != BreakerState::Open {
            return (fast, None);
        }
        let mut inner = self.inner.lock();
        if let Inner::Open { until } = *inner {
            if Instant::now() >= until {
                *inner = Inner::HalfOpen { successes: 0 };
                self.fast
                    .store(BreakerState::HalfOpen as u8, Ordering::Release);
                return (
                    BreakerState::HalfOpen,
                    Some(Transition {
                        to: BreakerState::HalfOpen,
                        half_open_at: None,
                    }),
                );
            }
            return (BreakerState::Open, None);
        }
        (
            BreakerState::from_u8(self.fast.load(Ordering::Acquire)),
            None,
        )
    }

    /// Current state without side effects on the caller's view (may still apply a due change).
    pub fn state(&self) -> BreakerState {
        self.poll_state().0
    }

    /// Whether a request may be sent now (closed or half-open).
    pub fn allows(&self) -> bool {
        self.state() != BreakerState::Open
    }

    /// Records one outcome; returns the transition it caused.
    pub fn record(&self, success: bool) -> Option<Transition> {
        if !self.cfg.enabled {
            return None;
        }
        let (_, lazy) = self.poll_state();
        let mut inner = self.inner.lock();
        let next = match (&mut *inner, success) {
            (Inner::Closed { failures }, true) => {
                *failures = 0;
                None
            }
            (Inner::Closed { failures }, false) => {
                *failures += 1;
                (*failures >= self.cfg.failure_threshold).then(|| self.open_until())
            }
            (Inner::HalfOpen { successes }, true) => {
                *successes += 1;
                if *successes >= self.cfg.success_threshold {
                    *inner = Inner::Closed { failures: 0 };
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
            // Results of requests sent before the breaker opened say nothing new.
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
            None => lazy,
        }
    }

    fn open_until(&self) -> Instant {
        Instant::now() + self.cfg.timeout
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
        }
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
        assert_eq!(b.state(), BreakerState::Open);
        tokio::time::advance(Duration::from_millis(1)).await;
        let (s, t) = b.poll_state();
        assert_eq!(s, BreakerState::HalfOpen);
        assert_eq!(t.unwrap().to, BreakerState::HalfOpen);
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
        assert!(b.allows());
        let t = b.record(false).unwrap();
        assert_eq!(t.to, BreakerState::Open);
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
