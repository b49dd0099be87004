//! Global limiter flags: how many requests the router works on at once, how many may wait, for
//! how long, and the admission rate.

use clap::Args;

use crate::config::{ConfigError, LimiterConfig, RawLimiter};

/// `launch` flags under "Global limiter".
#[derive(Debug, Args)]
pub struct LimiterArgs {
    /// Requests the router works on at once (held until the response body ends),
    /// 1-1000000; <= 0 disables the limiter.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true, help_heading = "Global limiter")]
    pub max_concurrent_requests: i64,
    /// Requests that may wait for the limiter, 0-1000000 (default 100 when the limiter is
    /// on; 0 = never wait); a request finding it full gets 429.
    #[arg(long, allow_negative_numbers = true, help_heading = "Global limiter")]
    pub queue_size: Option<i64>,
    /// Longest wait for the limiter in seconds, 0-86400 (default 60 when the limiter is on);
    /// then 408.
    #[arg(long, allow_negative_numbers = true, help_heading = "Global limiter")]
    pub queue_timeout_secs: Option<i64>,
    /// Admissions per second after a burst of --max-concurrent-requests (a token bucket),
    /// 0-1000000; 0 or absent: concurrency alone limits.
    #[arg(long, allow_negative_numbers = true, help_heading = "Global limiter")]
    pub rate_limit_tokens_per_second: Option<i64>,
}

impl LimiterArgs {
    /// The limiter settings, `None` when it is off (the rules are [`RawLimiter::resolve`]'s).
    pub(super) fn resolve(&self) -> Result<Option<LimiterConfig>, ConfigError> {
        RawLimiter {
            max_concurrent: self.max_concurrent_requests,
            queue_size: self.queue_size,
            queue_timeout_secs: self.queue_timeout_secs,
            tokens_per_second: self.rate_limit_tokens_per_second,
        }
        .resolve()
    }
}
