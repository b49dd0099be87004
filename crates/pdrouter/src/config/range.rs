//! The allowed values of every numeric flag ([`FLAG_RANGES`]), one [`FlagRange`] each.
//!
//! One table serves three readers: `--help` states each range, [`Config::validate`] checks it,
//! and a value clap cannot parse is reported with it; a test in `cli` keeps the help text and
//! this table in step, so a range is changed here and in the flag's help line only.
//!
//! [`Config::validate`]: super::Config::validate

use std::time::Duration;

use super::{ConfigError, bad};

/// The allowed values of one numeric flag, inclusive.
///
/// Every numeric flag has one, listed in [`FLAG_RANGES`]; its `--help` text states the same
/// range (a unit test in `cli` checks both). [`Config::validate`](super::Config::validate)
/// checks them all, so a configuration that passes cannot overflow a deadline or a counter,
/// and an out-of-range value fails with one line naming the flag and the range.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlagRange {
    /// The flag, with its dashes.
    pub flag: &'static str,
    /// Smallest allowed value.
    pub min: f64,
    /// Largest allowed value.
    pub max: f64,
}

/// A flag's numeric type, widened for the range check (every bound is below 2^53, so the
/// widening never moves a value across a bound).
pub trait FlagValue: Copy + std::fmt::Display {
    /// The value as `f64` (NaN stays NaN and is out of every range).
    fn widen(self) -> f64;
}

macro_rules! flag_value {
    ($($t:ty),*) => {$(
        impl FlagValue for $t {
            fn widen(self) -> f64 {
                self as f64
            }
        }
    )*};
}
flag_value!(u16, u32, u64, usize, i64, f32, f64);

impl FlagRange {
    const fn new(flag: &'static str, min: f64, max: f64) -> Self {
        Self { flag, min, max }
    }

    /// `MIN-MAX`, as the help text writes it.
    pub fn text(&self) -> String {
        format!("{}-{}", self.min, self.max)
    }

    /// The one-line error for a value given as `got`.
    pub fn error(&self, got: impl std::fmt::Display) -> ConfigError {
        bad(format!(
            "{} must be between {} and {}, got {got}",
            self.flag, self.min, self.max
        ))
    }

    /// `value` if it is in range.
    pub fn check<T: FlagValue>(&self, value: T) -> Result<T, ConfigError> {
        let v = value.widen();
        if self.min <= v && v <= self.max {
            Ok(value)
        } else {
            Err(self.error(value))
        }
    }

    /// Checks a duration whose flag counts `unit`s (seconds or milliseconds). A non-zero
    /// duration below one unit, which only code can set, counts as in range.
    pub fn check_duration(&self, d: Duration, unit: Duration) -> Result<(), ConfigError> {
        let v = d.as_secs_f64() / unit.as_secs_f64();
        if v <= self.max && (v >= self.min || !d.is_zero()) {
            Ok(())
        } else {
            Err(self.error(v))
        }
    }
}

/// `--port`.
pub const PORT: FlagRange = FlagRange::new("--port", 0.0, 65_535.0);
/// `--max-payload-size` (bytes, up to 4 GiB).
pub const MAX_PAYLOAD_SIZE: FlagRange = FlagRange::new("--max-payload-size", 1.0, 4_294_967_296.0);
/// `--request-timeout-secs` (up to 7 days).
pub const REQUEST_TIMEOUT_SECS: FlagRange =
    FlagRange::new("--request-timeout-secs", 1.0, 604_800.0);
/// `--shutdown-grace-period-secs` (up to 1 day).
pub const SHUTDOWN_GRACE_SECS: FlagRange =
    FlagRange::new("--shutdown-grace-period-secs", 0.0, 86_400.0);
/// `--cache-threshold`.
pub const CACHE_THRESHOLD: FlagRange = FlagRange::new("--cache-threshold", 0.0, 1.0);
/// `--balance-abs-threshold`.
pub const BALANCE_ABS_THRESHOLD: FlagRange =
    FlagRange::new("--balance-abs-threshold", 0.0, 1_000_000.0);
/// `--balance-rel-threshold`.
pub const BALANCE_REL_THRESHOLD: FlagRange =
    FlagRange::new("--balance-rel-threshold", 1.0, 1_000.0);
/// `--eviction-interval-secs`.
pub const EVICTION_INTERVAL_SECS: FlagRange =
    FlagRange::new("--eviction-interval-secs", 1.0, 86_400.0);
/// `--max-tree-size` (characters per worker, up to 2^30).
pub const MAX_TREE_SIZE: FlagRange = FlagRange::new("--max-tree-size", 1.0, 1_073_741_824.0);
/// `--prefill-max-inflight-requests-per-worker` when positive (`<= 0` turns admission off).
pub const PREFILL_MAX_INFLIGHT: FlagRange =
    FlagRange::new("--prefill-max-inflight-requests-per-worker", 1.0, 100_000.0);
/// `--prefill-max-inflight-tokens-per-worker` (prompt tokens per worker, up to 10^9).
pub const PREFILL_MAX_INFLIGHT_TOKENS: FlagRange = FlagRange::new(
    "--prefill-max-inflight-tokens-per-worker",
    1.0,
    1_000_000_000.0,
);
/// `--prefill-limit-min` (the smallest `auto` limit: requests, or prompt tokens).
pub const PREFILL_LIMIT_MIN: FlagRange =
    FlagRange::new("--prefill-limit-min", 1.0, 1_000_000_000.0);
/// `--prefill-limit-max` (the largest `auto` limit: requests, or prompt tokens).
pub const PREFILL_LIMIT_MAX: FlagRange =
    FlagRange::new("--prefill-limit-max", 1.0, 1_000_000_000.0);
/// `--prefill-queue-size` (each waiter is a client connection).
pub const PREFILL_QUEUE_SIZE: FlagRange = FlagRange::new("--prefill-queue-size", 0.0, 1_000_000.0);
/// `--prefill-queue-timeout-secs` (up to 1 day).
pub const PREFILL_QUEUE_TIMEOUT_SECS: FlagRange =
    FlagRange::new("--prefill-queue-timeout-secs", 0.0, 86_400.0);
/// `--admission-store-interval-ms` (time between a replica's store exchanges).
pub const ADMISSION_STORE_INTERVAL_MS: FlagRange =
    FlagRange::new("--admission-store-interval-ms", 10.0, 1_000.0);
/// `--admission-store-lease-ttl-ms` (up to 1 hour; at least 3 intervals).
pub const ADMISSION_STORE_LEASE_TTL_MS: FlagRange =
    FlagRange::new("--admission-store-lease-ttl-ms", 1_000.0, 3_600_000.0);
/// `--retry-max-retries` (total attempts).
pub const RETRY_MAX_RETRIES: FlagRange = FlagRange::new("--retry-max-retries", 1.0, 100.0);
/// `--retry-initial-backoff-ms` (up to 10 minutes).
pub const RETRY_INITIAL_BACKOFF_MS: FlagRange =
    FlagRange::new("--retry-initial-backoff-ms", 0.0, 600_000.0);
/// `--retry-max-backoff-ms` (up to 10 minutes).
pub const RETRY_MAX_BACKOFF_MS: FlagRange =
    FlagRange::new("--retry-max-backoff-ms", 0.0, 600_000.0);
/// `--retry-backoff-multiplier`.
pub const RETRY_BACKOFF_MULTIPLIER: FlagRange =
    FlagRange::new("--retry-backoff-multiplier", 1.0, 100.0);
/// `--retry-jitter-factor`.
pub const RETRY_JITTER_FACTOR: FlagRange = FlagRange::new("--retry-jitter-factor", 0.0, 1.0);
/// `--cb-failure-threshold`.
pub const CB_FAILURE_THRESHOLD: FlagRange = FlagRange::new("--cb-failure-threshold", 1.0, 10_000.0);
/// `--cb-success-threshold`.
pub const CB_SUCCESS_THRESHOLD: FlagRange = FlagRange::new("--cb-success-threshold", 1.0, 10_000.0);
/// `--cb-timeout-duration-secs` (up to 1 day).
pub const CB_TIMEOUT_SECS: FlagRange = FlagRange::new("--cb-timeout-duration-secs", 1.0, 86_400.0);
/// `--cb-window-duration-secs` (up to 1 day).
pub const CB_WINDOW_SECS: FlagRange = FlagRange::new("--cb-window-duration-secs", 1.0, 86_400.0);
/// `--health-failure-threshold`.
pub const HEALTH_FAILURE_THRESHOLD: FlagRange =
    FlagRange::new("--health-failure-threshold", 1.0, 10_000.0);
/// `--health-success-threshold`.
pub const HEALTH_SUCCESS_THRESHOLD: FlagRange =
    FlagRange::new("--health-success-threshold", 1.0, 10_000.0);
/// `--health-check-timeout-secs` (up to 1 hour).
pub const HEALTH_CHECK_TIMEOUT_SECS: FlagRange =
    FlagRange::new("--health-check-timeout-secs", 1.0, 3_600.0);
/// `--health-check-interval-secs` (up to 1 day).
pub const HEALTH_CHECK_INTERVAL_SECS: FlagRange =
    FlagRange::new("--health-check-interval-secs", 1.0, 86_400.0);
/// `--client-header-timeout-secs` (up to 1 hour).
pub const CLIENT_HEADER_TIMEOUT_SECS: FlagRange =
    FlagRange::new("--client-header-timeout-secs", 1.0, 3_600.0);
/// `--max-connections` (up to Linux's default per-process descriptor ceiling, 2^20).
pub const MAX_CONNECTIONS: FlagRange = FlagRange::new("--max-connections", 1.0, 1_048_576.0);
/// `--prometheus-port`.
pub const PROMETHEUS_PORT: FlagRange = FlagRange::new("--prometheus-port", 0.0, 65_535.0);
/// `--prefix-token-count` (prefix_hash; up to 2^20 tokens).
pub const PREFIX_TOKEN_COUNT: FlagRange = FlagRange::new("--prefix-token-count", 1.0, 1_048_576.0);
/// `--prefix-hash-load-factor` (prefix_hash).
pub const PREFIX_HASH_LOAD_FACTOR: FlagRange =
    FlagRange::new("--prefix-hash-load-factor", 1.0, 1_000.0);
/// `--max-idle-secs` (manual; up to 30 days).
pub const MAX_IDLE_SECS: FlagRange = FlagRange::new("--max-idle-secs", 1.0, 2_592_000.0);
/// `--max-concurrent-requests` when positive (`<= 0` turns the limiter off).
pub const MAX_CONCURRENT_REQUESTS: FlagRange =
    FlagRange::new("--max-concurrent-requests", 1.0, 1_000_000.0);
/// `--queue-size` (each waiter is a client connection).
pub const QUEUE_SIZE: FlagRange = FlagRange::new("--queue-size", 0.0, 1_000_000.0);
/// `--queue-timeout-secs` (up to 1 day).
pub const QUEUE_TIMEOUT_SECS: FlagRange = FlagRange::new("--queue-timeout-secs", 0.0, 86_400.0);
/// `--rate-limit-tokens-per-second` (0: no rate limit).
pub const RATE_LIMIT_TOKENS_PER_SECOND: FlagRange =
    FlagRange::new("--rate-limit-tokens-per-second", 0.0, 1_000_000.0);
/// `--worker-startup-timeout-secs` (up to 7 days).
pub const WORKER_STARTUP_TIMEOUT_SECS: FlagRange =
    FlagRange::new("--worker-startup-timeout-secs", 1.0, 604_800.0);
/// `--worker-startup-check-interval` (seconds, up to 1 hour).
pub const WORKER_STARTUP_CHECK_INTERVAL: FlagRange =
    FlagRange::new("--worker-startup-check-interval", 1.0, 3_600.0);
/// `--max-image-bytes` (per image, up to 1 GiB).
pub const MAX_IMAGE_BYTES: FlagRange = FlagRange::new("--max-image-bytes", 1.0, 1_073_741_824.0);
/// `--max-image-pixels` (per decoded image, up to 2^28).
pub const MAX_IMAGE_PIXELS: FlagRange = FlagRange::new("--max-image-pixels", 1.0, 268_435_456.0);
/// `--image-fetch-timeout-secs` (up to 5 minutes).
pub const IMAGE_FETCH_TIMEOUT_SECS: FlagRange =
    FlagRange::new("--image-fetch-timeout-secs", 1.0, 300.0);

/// Every numeric flag's range, for help and error text and the checks that keep them true.
pub const FLAG_RANGES: &[FlagRange] = &[
    PORT,
    MAX_PAYLOAD_SIZE,
    REQUEST_TIMEOUT_SECS,
    SHUTDOWN_GRACE_SECS,
    CACHE_THRESHOLD,
    BALANCE_ABS_THRESHOLD,
    BALANCE_REL_THRESHOLD,
    EVICTION_INTERVAL_SECS,
    MAX_TREE_SIZE,
    PREFILL_MAX_INFLIGHT,
    PREFILL_MAX_INFLIGHT_TOKENS,
    PREFILL_LIMIT_MIN,
    PREFILL_LIMIT_MAX,
    PREFILL_QUEUE_SIZE,
    PREFILL_QUEUE_TIMEOUT_SECS,
    ADMISSION_STORE_INTERVAL_MS,
    ADMISSION_STORE_LEASE_TTL_MS,
    RETRY_MAX_RETRIES,
    RETRY_INITIAL_BACKOFF_MS,
    RETRY_MAX_BACKOFF_MS,
    RETRY_BACKOFF_MULTIPLIER,
    RETRY_JITTER_FACTOR,
    CB_FAILURE_THRESHOLD,
    CB_SUCCESS_THRESHOLD,
    CB_TIMEOUT_SECS,
    CB_WINDOW_SECS,
    HEALTH_FAILURE_THRESHOLD,
    HEALTH_SUCCESS_THRESHOLD,
    HEALTH_CHECK_TIMEOUT_SECS,
    HEALTH_CHECK_INTERVAL_SECS,
    CLIENT_HEADER_TIMEOUT_SECS,
    MAX_CONNECTIONS,
    PROMETHEUS_PORT,
    PREFIX_TOKEN_COUNT,
    PREFIX_HASH_LOAD_FACTOR,
    MAX_IDLE_SECS,
    MAX_CONCURRENT_REQUESTS,
    QUEUE_SIZE,
    QUEUE_TIMEOUT_SECS,
    RATE_LIMIT_TOKENS_PER_SECOND,
    WORKER_STARTUP_TIMEOUT_SECS,
    WORKER_STARTUP_CHECK_INTERVAL,
    MAX_IMAGE_BYTES,
    MAX_IMAGE_PIXELS,
    IMAGE_FETCH_TIMEOUT_SECS,
];

/// The range of a numeric flag (`--name`), if it is one.
pub fn flag_range(flag: &str) -> Option<&'static FlagRange> {
    FLAG_RANGES.iter().find(|r| r.flag == flag)
}
