//! The global request limiter's settings (`--max-concurrent-requests` and its queue and rate
//! flags): checked here, enforced by `crate::limiter`.

use std::time::Duration;

use pdrouter_admission::{Priority, PriorityClasses};

use super::range;
use super::{ConfigError, bad};

/// Limiter settings; present only when `--max-concurrent-requests` is positive.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimiterConfig {
    /// Most requests in flight at once (also the token bucket's capacity).
    pub max_concurrent: usize,
    /// Most requests waiting; 0 = never wait.
    pub queue_size: usize,
    /// Longest wait for a permit.
    pub queue_timeout: Duration,
    /// Token refill rate per second; `None`: concurrency alone limits.
    pub tokens_per_second: Option<f64>,
    /// Priority classes, when they order this queue: each class's own queue size, timeout and
    /// starvation age replace `queue_size` and `queue_timeout`. `None`: one FIFO.
    pub priorities: Option<PriorityClasses>,
}

impl LimiterConfig {
    /// The class settings in force (every class alike, without promotion, when `priorities`
    /// is `None`).
    pub fn classes(&self) -> PriorityClasses {
        self.priorities
            .unwrap_or_else(|| PriorityClasses::uniform(self.queue_size, self.queue_timeout))
    }

    /// How long a request of `priority` may wait.
    pub fn timeout_of(&self, priority: Priority) -> Duration {
        self.classes().get(priority).queue_timeout
    }
}

/// Default `--queue-size` of the global limiter (SMG's).
pub const DEFAULT_LIMITER_QUEUE_SIZE: usize = 100;
/// Default `--queue-timeout-secs` of the global limiter (SMG's).
pub const DEFAULT_LIMITER_QUEUE_TIMEOUT_SECS: u64 = 60;

/// Limiter flags as given, before validation.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawLimiter {
    /// `--max-concurrent-requests`.
    pub max_concurrent: i64,
    /// `--queue-size`, if given.
    pub queue_size: Option<i64>,
    /// `--queue-timeout-secs`, if given.
    pub queue_timeout_secs: Option<i64>,
    /// `--rate-limit-tokens-per-second`, if given.
    pub tokens_per_second: Option<i64>,
}

impl RawLimiter {
    /// The limiter settings, or `None` when `--max-concurrent-requests` is not positive (the
    /// other flags then have nothing to act on and are refused).
    pub fn resolve(self) -> Result<Option<LimiterConfig>, ConfigError> {
        if self.max_concurrent <= 0 {
            if self.queue_size.is_some()
                || self.queue_timeout_secs.is_some()
                || self.tokens_per_second.is_some()
            {
                return Err(bad(
                    "--queue-size, --queue-timeout-secs and --rate-limit-tokens-per-second need \
                     a positive --max-concurrent-requests (the limiter is off)",
                ));
            }
            return Ok(None);
        }
        // In range, so the conversions below are exact.
        let max = range::MAX_CONCURRENT_REQUESTS.check(self.max_concurrent)? as usize;
        let queue_size = match self.queue_size {
            None => DEFAULT_LIMITER_QUEUE_SIZE,
            Some(q) => range::QUEUE_SIZE.check(q)? as usize,
        };
        let timeout = match self.queue_timeout_secs {
            None => DEFAULT_LIMITER_QUEUE_TIMEOUT_SECS,
            Some(t) => range::QUEUE_TIMEOUT_SECS.check(t)? as u64,
        };
        if queue_size > 0 && timeout == 0 {
            return Err(bad(
                "--queue-timeout-secs 0 with a non-empty queue would time out every waiter; \
                 give a positive timeout or set --queue-size 0",
            ));
        }
        let rate = match self.tokens_per_second {
            None | Some(0) => None,
            Some(r) => Some(range::RATE_LIMIT_TOKENS_PER_SECOND.check(r)? as f64),
        };
        Ok(Some(LimiterConfig {
            max_concurrent: max,
            queue_size,
            queue_timeout: Duration::from_secs(timeout),
            tokens_per_second: rate,
            priorities: None,
        }))
    }
}
