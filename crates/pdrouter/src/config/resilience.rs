//! How the router copes with failing workers: retries, circuit breakers and health probes.

use std::time::Duration;

/// Retry settings (`--retry-*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RetryConfig {
    /// Total attempts, the first included (so 1 means no retry).
    pub max_attempts: u32,
    /// Backoff before the second attempt.
    pub initial_backoff: Duration,
    /// Cap on any one backoff.
    pub max_backoff: Duration,
    /// Growth per attempt.
    pub multiplier: f64,
    /// Fraction of the backoff randomised (0..=1).
    pub jitter: f64,
}

/// Circuit-breaker settings (`--cb-*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// False with `--disable-circuit-breaker`.
    pub enabled: bool,
    /// Consecutive failures that open the breaker.
    pub failure_threshold: u32,
    /// Successes in half-open that close it.
    pub success_threshold: u32,
    /// Time open before half-open.
    pub timeout: Duration,
    /// Failures count toward the threshold only within this long of the first failure of
    /// their run (`--cb-window-duration-secs`).
    pub window: Duration,
}

/// Health-check settings (`--health-*`).
#[derive(Debug, Clone, PartialEq)]
pub struct HealthConfig {
    /// False with `--disable-health-check`: workers start ready.
    pub enabled: bool,
    /// Probe period.
    pub interval: Duration,
    /// Per-probe timeout.
    pub timeout: Duration,
    /// Consecutive failures that make a ready worker not ready.
    pub failure_threshold: u32,
    /// Consecutive successes that make a not-ready worker ready.
    pub success_threshold: u32,
    /// Path probed, starting with '/'.
    pub endpoint: String,
}
