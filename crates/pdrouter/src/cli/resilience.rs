//! Flags for failing workers: retries, circuit breakers and health checks.

use std::time::Duration;

use clap::Args;

use crate::config::{BreakerConfig, ConfigError, HealthConfig, RetryConfig};

/// `launch` flags under "Retries".
#[derive(Debug, Args)]
pub struct RetryArgs {
    /// Total attempts per request, 1-100 (1 = no retry).
    #[arg(long, default_value_t = 5, help_heading = "Retries")]
    pub retry_max_retries: u32,
    /// Backoff before the second attempt, in ms, 0-600000.
    #[arg(long, default_value_t = 50, help_heading = "Retries")]
    pub retry_initial_backoff_ms: u64,
    /// Cap on one backoff, in ms, 0-600000.
    #[arg(long, default_value_t = 30_000, help_heading = "Retries")]
    pub retry_max_backoff_ms: u64,
    /// Backoff growth per attempt, 1-100.
    #[arg(long, default_value_t = 1.5, help_heading = "Retries")]
    pub retry_backoff_multiplier: f64,
    /// Fraction of each backoff that is randomised, 0-1.
    #[arg(long, default_value_t = 0.2, help_heading = "Retries")]
    pub retry_jitter_factor: f64,
    /// Never retry.
    #[arg(long, help_heading = "Retries")]
    pub disable_retries: bool,
}

impl RetryArgs {
    /// The retry policy (`--disable-retries` is one attempt).
    pub(super) fn resolve(&self) -> RetryConfig {
        RetryConfig {
            max_attempts: if self.disable_retries {
                1
            } else {
                self.retry_max_retries
            },
            initial_backoff: Duration::from_millis(self.retry_initial_backoff_ms),
            max_backoff: Duration::from_millis(self.retry_max_backoff_ms),
            multiplier: self.retry_backoff_multiplier,
            jitter: self.retry_jitter_factor,
        }
    }
}

/// `launch` flags under "Circuit breaker".
#[derive(Debug, Args)]
pub struct BreakerArgs {
    /// Consecutive failures that open a worker's breaker, 1-10000.
    #[arg(long, default_value_t = 10, help_heading = "Circuit breaker")]
    pub cb_failure_threshold: u32,
    /// Successes in half-open that close it again, 1-10000.
    #[arg(long, default_value_t = 3, help_heading = "Circuit breaker")]
    pub cb_success_threshold: u32,
    /// Seconds open before half-open, 1-86400.
    #[arg(long, default_value_t = 60, help_heading = "Circuit breaker")]
    pub cb_timeout_duration_secs: u64,
    /// Consecutive failures open the breaker only within this many seconds of the first one,
    /// 1-86400.
    #[arg(long, default_value_t = 120, help_heading = "Circuit breaker")]
    pub cb_window_duration_secs: u64,
    /// Turn circuit breakers off.
    #[arg(long, help_heading = "Circuit breaker")]
    pub disable_circuit_breaker: bool,
}

impl BreakerArgs {
    /// The circuit-breaker policy.
    pub(super) fn resolve(&self) -> BreakerConfig {
        BreakerConfig {
            enabled: !self.disable_circuit_breaker,
            failure_threshold: self.cb_failure_threshold,
            success_threshold: self.cb_success_threshold,
            timeout: Duration::from_secs(self.cb_timeout_duration_secs),
            window: Duration::from_secs(self.cb_window_duration_secs),
        }
    }
}

/// The path probed on each HTTP worker unless `--health-check-endpoint` says otherwise.
pub(super) const DEFAULT_HEALTH_ENDPOINT: &str = "/health";

/// `launch` flags under "Health checks".
#[derive(Debug, Args)]
pub struct HealthArgs {
    /// Consecutive failed probes that make a worker not ready, 1-10000.
    #[arg(long, default_value_t = 3, help_heading = "Health checks")]
    pub health_failure_threshold: u32,
    /// Consecutive good probes that make it ready again, 1-10000.
    #[arg(long, default_value_t = 2, help_heading = "Health checks")]
    pub health_success_threshold: u32,
    /// Probe timeout in seconds, 1-3600.
    #[arg(long, default_value_t = 5, help_heading = "Health checks")]
    pub health_check_timeout_secs: u64,
    /// Seconds between probes, 1-86400.
    #[arg(long, default_value_t = 60, help_heading = "Health checks")]
    pub health_check_interval_secs: u64,
    /// Path probed on each worker.
    #[arg(long, default_value = DEFAULT_HEALTH_ENDPOINT, help_heading = "Health checks")]
    pub health_check_endpoint: String,
    /// Start workers ready and never probe them.
    #[arg(long, help_heading = "Health checks")]
    pub disable_health_check: bool,
}

impl HealthArgs {
    /// The health-check settings. An empty endpoint is refused here with its own message;
    /// one without a leading '/' is `Config::validate`'s.
    pub(super) fn resolve(self) -> Result<HealthConfig, ConfigError> {
        if self.health_check_endpoint.is_empty() {
            return Err(ConfigError(
                "--health-check-endpoint must not be empty".into(),
            ));
        }
        Ok(HealthConfig {
            enabled: !self.disable_health_check,
            interval: Duration::from_secs(self.health_check_interval_secs),
            timeout: Duration::from_secs(self.health_check_timeout_secs),
            failure_threshold: self.health_failure_threshold,
            success_threshold: self.health_success_threshold,
            endpoint: self.health_check_endpoint,
        })
    }
}
