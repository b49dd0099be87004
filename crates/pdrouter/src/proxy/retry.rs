//! Retry backoff: exponential with jitter, capped.

use std::time::Duration;

use crate::config::RetryConfig;

/// Backoff before attempt `next_attempt` (2 for the first retry).
pub fn backoff(cfg: &RetryConfig, next_attempt: u32) -> Duration {
    let exp = next_attempt.saturating_sub(2).min(64) as i32;
    let base = cfg.initial_backoff.as_secs_f64() * cfg.multiplier.powi(exp);
    let capped = base.min(cfg.max_backoff.as_secs_f64());
    let jitter = if cfg.jitter > 0.0 {
        1.0 + cfg.jitter * (rand::random::<f64>() * 2.0 - 1.0)
    } else {
        1.0
    };
    // Never panics: a value `Duration` cannot hold (only from an unvalidated config) is capped.
    Duration::try_from_secs_f64((capped * jitter).max(0.0)).unwrap_or(cfg.max_backoff)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_caps_and_jitters_within_bounds() {
        let cfg = RetryConfig {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(250),
            multiplier: 2.0,
            jitter: 0.1,
        };
        for _ in 0..100 {
            let b2 = backoff(&cfg, 2).as_secs_f64();
            assert!((0.09..=0.11).contains(&b2), "{b2}");
            let b3 = backoff(&cfg, 3).as_secs_f64();
            assert!((0.18..=0.22).contains(&b3), "{b3}");
            let b9 = backoff(&cfg, 9).as_secs_f64();
            assert!(b9 <= 0.275, "{b9}");
        }
    }

    #[test]
    fn extreme_settings_do_not_panic() {
        let cfg = RetryConfig {
            max_attempts: u32::MAX,
            initial_backoff: Duration::MAX,
            max_backoff: Duration::MAX,
            multiplier: f64::MAX,
            jitter: 0.0,
        };
        // Duration::MAX in f64 seconds rounds up past what a Duration holds.
        for attempt in [2, 3, 66, u32::MAX] {
            assert_eq!(backoff(&cfg, attempt), Duration::MAX);
        }
    }
}
