//! Prefill admission's settings: each Prefill worker's limit (a request count, a prompt-token
//! budget, or either sized at run time with `auto`) and the router-wide wait queue. The
//! startup rules of these flags are all in [`RawAdmission::resolve`].

use std::time::Duration;

pub use pdrouter_admission::{AutoConfig, Unit};

use super::{ConfigError, Mode, bad, range};

/// Prefill admission settings; present only when a per-worker limit (count or tokens) is set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionSettings {
    /// In-flight Prefill requests per worker (per DP rank); [`NO_COUNT_LIMIT`] when only the
    /// token budget limits workers.
    pub max_inflight_per_worker: u32,
    /// In-flight prompt tokens per worker (per DP rank), if budgeted.
    pub max_inflight_tokens_per_worker: Option<u32>,
    /// Router-wide wait-queue depth; 0 = never wait.
    pub queue_size: usize,
    /// Longest wait for a slot.
    pub queue_timeout: Duration,
    /// The limit sized at run time (`auto`), with its unit and bounds; the configured limit
    /// of that unit above is then where every worker starts (the bound `min`).
    pub auto: Option<AutoConfig>,
    /// Per-class settings when priority classes order this queue (they then replace
    /// `queue_size` and `queue_timeout`, which are their defaults).
    pub priorities: Option<pdrouter_admission::PriorityClasses>,
}

/// Default [`Config::prefill_grace_after_decode`](super::Config::prefill_grace_after_decode): a Prefill answer normally ends before
/// Decode does, so a leg still open by then has a network hiccup or a stuck worker; a few
/// seconds let the first end cleanly (keeping its pooled connection) and bound the second.
pub const PREFILL_GRACE_AFTER_DECODE: Duration = Duration::from_secs(5);

/// [`AdmissionSettings::max_inflight_per_worker`] when only a token budget is given.
pub const NO_COUNT_LIMIT: u32 = u32::MAX;

/// Default bounds of an `auto` request limit: one request up to a running batch larger than
/// engines commonly run for prefill.
pub const AUTO_REQUESTS_BOUNDS: (u32, u32) = (1, 64);
/// Default bounds of an `auto` token budget: a short prompt up to 2^20 tokens.
pub const AUTO_TOKENS_BOUNDS: (u32, u32) = (1024, 1 << 20);

/// Which admission limit is `auto` and the bounds given for it, before validation.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawAuto {
    /// `--prefill-max-inflight-requests-per-worker auto`.
    pub requests: bool,
    /// `--prefill-max-inflight-tokens-per-worker auto`.
    pub tokens: bool,
    /// `--prefill-limit-min`, if given.
    pub min: Option<i64>,
    /// `--prefill-limit-max`, if given.
    pub max: Option<i64>,
}

impl RawAuto {
    /// The `auto` limit's unit and bounds, `None` when no limit is `auto`.
    fn resolve(self) -> Result<Option<AutoConfig>, ConfigError> {
        let unit = match (self.requests, self.tokens) {
            (false, false) => {
                if self.min.is_some() || self.max.is_some() {
                    return Err(bad(
                        "--prefill-limit-min and --prefill-limit-max bound a limit sized at run time; \
                         give --prefill-max-inflight-requests-per-worker auto or \
                         --prefill-max-inflight-tokens-per-worker auto",
                    ));
                }
                return Ok(None);
            }
            (true, true) => {
                return Err(bad(
                    "auto sizes one Prefill limit: give --prefill-max-inflight-requests-per-worker \
                     or --prefill-max-inflight-tokens-per-worker a number (or leave it out)",
                ));
            }
            (true, false) => Unit::Requests,
            (false, true) => Unit::Tokens,
        };
        // In range, so the conversions are exact.
        let min = match self.min {
            Some(v) => Some(range::PREFILL_LIMIT_MIN.check(v)? as u32),
            None => None,
        };
        let max = match self.max {
            Some(v) => Some(range::PREFILL_LIMIT_MAX.check(v)? as u32),
            None => None,
        };
        let (default_min, default_max) = match unit {
            Unit::Requests => AUTO_REQUESTS_BOUNDS,
            Unit::Tokens => AUTO_TOKENS_BOUNDS,
        };
        // A bound given alone moves the other default out of its way.
        let min = min.unwrap_or(max.map_or(default_min, |m| default_min.min(m)));
        let max = max.unwrap_or(default_max.max(min));
        if min > max {
            return Err(bad(format!(
                "--prefill-limit-min {min} is above --prefill-limit-max {max}"
            )));
        }
        if unit == Unit::Requests {
            let most = range::PREFILL_MAX_INFLIGHT.max;
            if f64::from(max) > most {
                return Err(bad(format!(
                    "--prefill-limit-max {max} is above the most in-flight requests per worker, {most}"
                )));
            }
        }
        Ok(Some(AutoConfig { unit, min, max }))
    }
}

/// Admission flags as given, before validation.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawAdmission {
    /// `--prefill-max-inflight-requests-per-worker`.
    pub max_inflight: i64,
    /// `--prefill-max-inflight-tokens-per-worker`, if given.
    pub max_inflight_tokens: Option<i64>,
    /// `--prefill-queue-size`, if given.
    pub queue_size: Option<i64>,
    /// `--prefill-queue-timeout-secs`, if given.
    pub queue_timeout_secs: Option<i64>,
    /// Which limit is `auto` (its number above is then ignored), and its bounds.
    pub auto: RawAuto,
}

/// Default queue depth when admission is on and `--prefill-queue-size` is absent.
pub const DEFAULT_QUEUE_SIZE: usize = 100;
/// Default queue timeout when admission is on and `--prefill-queue-timeout-secs` is absent.
pub const DEFAULT_QUEUE_TIMEOUT_SECS: u64 = 60;

impl RawAdmission {
    /// Applies the admission startup rules (queue flags need a positive limit; the limit needs PD
    /// mode; a non-empty queue needs a positive timeout): returns the admission settings, or
    /// `None` when admission is off.
    pub fn resolve(self, mode: Mode) -> Result<Option<AdmissionSettings>, ConfigError> {
        let auto = self.auto.resolve()?;
        let auto_unit = auto.map(|a| a.unit);
        // In range, so the conversions below are exact.
        let tokens = match (self.max_inflight_tokens, auto) {
            (_, Some(a)) if a.unit == Unit::Tokens => Some(a.min),
            (None, _) => None,
            (Some(t), _) => Some(range::PREFILL_MAX_INFLIGHT_TOKENS.check(t)? as u32),
        };
        let count_on = self.max_inflight > 0 || auto_unit == Some(Unit::Requests);
        if !count_on && tokens.is_none() {
            if self.queue_size.is_some() || self.queue_timeout_secs.is_some() {
                return Err(bad(
                    "--prefill-queue-size and --prefill-queue-timeout-secs need a positive \
                     --prefill-max-inflight-requests-per-worker or \
                     --prefill-max-inflight-tokens-per-worker (admission is off)",
                ));
            }
            return Ok(None);
        }
        let flag = if count_on {
            "--prefill-max-inflight-requests-per-worker"
        } else {
            "--prefill-max-inflight-tokens-per-worker"
        };
        if !mode.is_pd() {
            return Err(bad(format!(
                "{flag} needs PD mode (--pd-disaggregation with --prefill and --decode workers)"
            )));
        }
        let max = if let Some(a) = auto.filter(|a| a.unit == Unit::Requests) {
            a.min
        } else if self.max_inflight > 0 {
            range::PREFILL_MAX_INFLIGHT.check(self.max_inflight)? as u32
        } else {
            NO_COUNT_LIMIT
        };
        let queue_size = match self.queue_size {
            None => DEFAULT_QUEUE_SIZE,
            Some(q) => range::PREFILL_QUEUE_SIZE.check(q)? as usize,
        };
        let timeout = match self.queue_timeout_secs {
            None => DEFAULT_QUEUE_TIMEOUT_SECS,
            Some(t) => range::PREFILL_QUEUE_TIMEOUT_SECS.check(t)? as u64,
        };
        if queue_size > 0 && timeout == 0 {
            return Err(bad(
                "--prefill-queue-timeout-secs 0 with a non-empty queue would reject every waiter; \
                 give a positive timeout or set --prefill-queue-size 0",
            ));
        }
        Ok(Some(AdmissionSettings {
            max_inflight_per_worker: max,
            max_inflight_tokens_per_worker: tokens,
            queue_size,
            queue_timeout: Duration::from_secs(timeout),
            auto,
            priorities: None,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(max: i64, q: Option<i64>, t: Option<i64>) -> RawAdmission {
        RawAdmission {
            max_inflight: max,
            queue_size: q,
            queue_timeout_secs: t,
            max_inflight_tokens: None,
            auto: RawAuto::default(),
        }
    }

    #[test]
    fn a_token_budget_alone_or_with_the_count_turns_admission_on() {
        let tokens = |max, t| RawAdmission {
            max_inflight_tokens: Some(t),
            ..raw(max, None, None)
        };
        let alone = tokens(-1, 4096).resolve(Mode::PdHttp).unwrap().unwrap();
        assert_eq!(alone.max_inflight_per_worker, NO_COUNT_LIMIT);
        assert_eq!(alone.max_inflight_tokens_per_worker, Some(4096));
        assert_eq!(alone.queue_size, DEFAULT_QUEUE_SIZE);
        let both = tokens(2, 1).resolve(Mode::PdGrpc).unwrap().unwrap();
        assert_eq!(both.max_inflight_per_worker, 2);
        assert_eq!(both.max_inflight_tokens_per_worker, Some(1));
        for bad in [0, -5, 1_000_000_001] {
            let err = tokens(2, bad).resolve(Mode::PdHttp).unwrap_err();
            assert!(
                err.0.contains("--prefill-max-inflight-tokens-per-worker"),
                "{err:?}"
            );
        }
        let regular = tokens(-1, 10).resolve(Mode::Regular).unwrap_err();
        assert!(regular.0.contains("needs PD mode"), "{regular:?}");
    }

    fn auto(requests: bool, tokens: bool, min: Option<i64>, max: Option<i64>) -> RawAdmission {
        RawAdmission {
            auto: RawAuto {
                requests,
                tokens,
                min,
                max,
            },
            ..raw(0, None, None)
        }
    }

    #[test]
    fn an_auto_limit_starts_at_its_bound_min() {
        let a = auto(true, false, None, None)
            .resolve(Mode::PdHttp)
            .unwrap()
            .unwrap();
        let (min, max) = AUTO_REQUESTS_BOUNDS;
        assert_eq!(
            a.auto,
            Some(AutoConfig {
                unit: Unit::Requests,
                min,
                max
            })
        );
        assert_eq!(a.max_inflight_per_worker, min);
        assert_eq!(a.max_inflight_tokens_per_worker, None);

        let t = RawAdmission {
            max_inflight: 3,
            ..auto(false, true, Some(2000), None)
        }
        .resolve(Mode::PdGrpc)
        .unwrap()
        .unwrap();
        assert_eq!(
            t.max_inflight_per_worker, 3,
            "a fixed count beside an auto budget"
        );
        assert_eq!(t.max_inflight_tokens_per_worker, Some(2000));
        assert_eq!(
            t.auto.map(|a| (a.unit, a.min, a.max)),
            Some((Unit::Tokens, 2000, AUTO_TOKENS_BOUNDS.1))
        );
        // A bound given alone moves the other default out of its way.
        let high = auto(true, false, Some(100), None).resolve(Mode::PdHttp);
        assert_eq!(
            high.unwrap().unwrap().auto.map(|a| (a.min, a.max)),
            Some((100, 100))
        );
        let low = auto(false, true, None, Some(10)).resolve(Mode::PdHttp);
        assert_eq!(
            low.unwrap().unwrap().auto.map(|a| (a.min, a.max)),
            Some((10, 10))
        );
    }

    #[test]
    fn bad_auto_settings_are_refused_each_with_its_reason() {
        let cases = [
            (auto(true, true, None, None), "auto sizes one Prefill limit"),
            (
                auto(false, false, Some(2), None),
                "bound a limit sized at run time",
            ),
            (
                auto(false, false, None, Some(2)),
                "bound a limit sized at run time",
            ),
            (
                auto(true, false, Some(5), Some(4)),
                "--prefill-limit-min 5 is above",
            ),
            (
                auto(true, false, Some(0), None),
                "--prefill-limit-min must be between",
            ),
            (
                auto(true, false, None, Some(0)),
                "--prefill-limit-max must be between",
            ),
            (
                auto(false, true, None, Some(1_000_000_001)),
                "--prefill-limit-max must be between",
            ),
            (
                auto(true, false, None, Some(100_001)),
                "above the most in-flight requests",
            ),
        ];
        for (raw, want) in cases {
            let err = raw.resolve(Mode::PdHttp).unwrap_err();
            assert!(err.0.contains(want), "{raw:?}: {err:?}");
        }
        let regular = auto(true, false, None, None).resolve(Mode::Regular);
        assert!(regular.unwrap_err().0.contains("needs PD mode"));
    }

    #[test]
    fn admission_off_by_default() {
        assert_eq!(raw(-1, None, None).resolve(Mode::PdHttp), Ok(None));
        assert_eq!(raw(0, None, None).resolve(Mode::Regular), Ok(None));
    }

    #[test]
    fn admission_defaults_when_enabled() {
        let a = raw(2, None, None).resolve(Mode::PdHttp).unwrap().unwrap();
        assert_eq!(a.max_inflight_per_worker, 2);
        assert_eq!(a.queue_size, 100);
        assert_eq!(a.queue_timeout, Duration::from_secs(60));
    }

    #[test]
    fn the_three_startup_rejections_have_distinct_messages() {
        let errs = [
            raw(-1, Some(4), None).resolve(Mode::PdHttp),
            raw(1, None, None).resolve(Mode::Regular),
            raw(1, Some(4), Some(0)).resolve(Mode::PdHttp),
        ];
        let msgs: Vec<String> = errs.into_iter().map(|e| e.unwrap_err().0).collect();
        assert!(msgs[0].contains("--prefill-queue-size"));
        assert!(msgs[1].contains("PD mode"));
        assert!(msgs[2].contains("--prefill-queue-timeout-secs 0"));
        let unique: std::collections::HashSet<_> = msgs.iter().collect();
        assert_eq!(unique.len(), 3);
    }

    #[test]
    fn queue_size_zero_allows_zero_timeout() {
        let a = raw(1, Some(0), Some(0))
            .resolve(Mode::PdHttp)
            .unwrap()
            .unwrap();
        assert_eq!(a.queue_size, 0);
    }
}
