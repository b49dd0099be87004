//! Validated router configuration.
//!
//! [`Config`] holds enums, durations and parsed worker specs, never raw flag strings. Every
//! startup rule lives in [`Config::validate`] with its own message naming the flag at fault, so
//! a bad command line fails before anything binds a port.

use std::net::IpAddr;
use std::time::Duration;

use pdrouter_policy::{CacheAwareConfig, PolicyKind};

/// A startup rule that the configuration breaks; the message names the flag and what to fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn bad(msg: impl Into<String>) -> ConfigError {
    ConfigError(msg.into())
}

/// Deadline arithmetic that cannot panic, shared with admission's queue timeout: use it for
/// every `Instant` computed from a configured duration.
pub use pdrouter_admission::deadline_after;

/// How requests are routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One regular worker per request.
    Regular,
    /// Prefill + Decode workers over HTTP.
    PdHttp,
}

/// The role a worker plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkerType {
    /// Serves whole requests.
    Regular,
    /// Runs the prefill phase of a PD pair.
    Prefill,
    /// Runs the decode phase of a PD pair.
    Decode,
}

impl WorkerType {
    /// Lower-case name as used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Regular => "regular",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
        }
    }
}

/// A worker as given on the command line or to `POST /workers`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerSpec {
    /// Base URL, normalised without a trailing slash.
    pub url: String,
    /// Role.
    pub worker_type: WorkerType,
    /// KV bootstrap port of a Prefill worker (`None` is sent as JSON null).
    pub bootstrap_port: Option<u16>,
    /// Bearer key sent to this worker, if it needs one.
    pub api_key: Option<String>,
}

/// Checks and normalises a worker URL: `http://` or `https://` with a host and optional port.
pub fn parse_worker_url(raw: &str) -> Result<String, String> {
    let trimmed = raw.trim().trim_end_matches('/');
    if trimmed.starts_with("grpc://") {
        return Err(format!(
            "worker URL '{raw}' uses grpc://, which this build does not serve yet; use http:// or https://"
        ));
    }
    let rest = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .ok_or_else(|| format!("worker URL '{raw}' must start with http:// or https://"))?;
    if rest.is_empty() {
        return Err(format!("worker URL '{raw}' has no host"));
    }
    if rest.contains('/') || rest.contains('?') || rest.contains('#') {
        return Err(format!(
            "worker URL '{raw}' must be scheme://host[:port] without a path"
        ));
    }
    let uri: http::Uri = trimmed
        .parse()
        .map_err(|e| format!("worker URL '{raw}' is not a valid URL: {e}"))?;
    let authority = uri
        .authority()
        .ok_or_else(|| format!("worker URL '{raw}' has no host"))?;
    if authority.host().is_empty() {
        return Err(format!("worker URL '{raw}' has no host"));
    }
    if authority.as_str().contains('@') {
        return Err(format!("worker URL '{raw}' must not carry credentials"));
    }
    if let Some(port) = authority.port() {
        if port.as_u16() == 0 {
            return Err(format!("worker URL '{raw}' has port 0"));
        }
    } else if let Some(p) = authority.as_str().rsplit_once(':').map(|(_, p)| p)
        && !authority.as_str().ends_with(']')
    {
        return Err(format!("worker URL '{raw}' has an invalid port '{p}'"));
    }
    Ok(trimmed.to_string())
}

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

/// Prefill admission settings; present only when the per-worker limit is positive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionSettings {
    /// In-flight Prefill requests per worker (per DP rank).
    pub max_inflight_per_worker: u32,
    /// Router-wide wait-queue depth; 0 = never wait.
    pub queue_size: usize,
    /// Longest wait for a slot.
    pub queue_timeout: Duration,
}

/// The whole validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// Address the router listens on.
    pub host: IpAddr,
    /// Port (0 = ephemeral).
    pub port: u16,
    /// Routing mode.
    pub mode: Mode,
    /// Workers known at startup.
    pub workers: Vec<WorkerSpec>,
    /// Policy for regular workers (and default for both PD legs).
    pub policy: PolicyKind,
    /// Policy for Prefill selection.
    pub prefill_policy: PolicyKind,
    /// Policy for Decode selection.
    pub decode_policy: PolicyKind,
    /// cache_aware knobs.
    pub cache: CacheAwareConfig,
    /// How often cache_aware trees are trimmed.
    pub eviction_interval: Duration,
    /// Required bearer key for inference and admin routes.
    pub api_key: Option<String>,
    /// Longest a backend request may take to answer.
    pub request_timeout: Duration,
    /// Largest accepted request body.
    pub max_payload_size: usize,
    /// In-flight requests get this long to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Retry policy.
    pub retry: RetryConfig,
    /// Circuit breaker policy.
    pub breaker: BreakerConfig,
    /// Health checking.
    pub health: HealthConfig,
    /// Address of the Prometheus listener; `None` disables it.
    pub prometheus: Option<(IpAddr, u16)>,
    /// `--dp-aware`.
    pub dp_aware: bool,
    /// `--priority-scheduler-enabled` (validated only).
    pub priority_scheduler: bool,
    /// Prefill admission, when enabled.
    pub admission: Option<AdmissionSettings>,
}

/// Admission flags as given, before validation.
#[derive(Debug, Clone, Copy, Default)]
pub struct RawAdmission {
    /// `--prefill-max-inflight-requests-per-worker`.
    pub max_inflight: i64,
    /// `--prefill-queue-size`, if given.
    pub queue_size: Option<i64>,
    /// `--prefill-queue-timeout-secs`, if given.
    pub queue_timeout_secs: Option<i64>,
}

/// Default queue depth when admission is on and `--prefill-queue-size` is absent.
pub const DEFAULT_QUEUE_SIZE: usize = 100;
/// Default queue timeout when admission is on and `--prefill-queue-timeout-secs` is absent.
pub const DEFAULT_QUEUE_TIMEOUT_SECS: u64 = 60;

impl RawAdmission {
    /// Applies SPEC §4.1: returns the admission settings, or `None` when admission is off.
    pub fn resolve(
        self,
        mode: Mode,
        priority_scheduler: bool,
    ) -> Result<Option<AdmissionSettings>, ConfigError> {
        if self.max_inflight <= 0 {
            if self.queue_size.is_some() || self.queue_timeout_secs.is_some() {
                return Err(bad(
                    "--prefill-queue-size and --prefill-queue-timeout-secs need a positive \
                     --prefill-max-inflight-requests-per-worker (admission is off)",
                ));
            }
            return Ok(None);
        }
        if mode != Mode::PdHttp {
            return Err(bad(
                "--prefill-max-inflight-requests-per-worker needs PD mode \
                 (--pd-disaggregation with --prefill and --decode workers)",
            ));
        }
        if priority_scheduler {
            return Err(bad(
                "--prefill-max-inflight-requests-per-worker cannot be combined with \
                 --priority-scheduler-enabled; choose one",
            ));
        }
        let max = u32::try_from(self.max_inflight).map_err(|_| {
            bad(format!(
                "--prefill-max-inflight-requests-per-worker {} is too large",
                self.max_inflight
            ))
        })?;
        let queue_size = match self.queue_size {
            None => DEFAULT_QUEUE_SIZE,
            Some(q) if q < 0 => {
                return Err(bad(format!(
                    "--prefill-queue-size must be 0 or more, got {q}"
                )));
            }
            Some(q) => usize::try_from(q).map_err(|_| bad("--prefill-queue-size is too large"))?,
        };
        let timeout = match self.queue_timeout_secs {
            None => DEFAULT_QUEUE_TIMEOUT_SECS,
            Some(t) if t < 0 => {
                return Err(bad(format!(
                    "--prefill-queue-timeout-secs must be 0 or more, got {t}"
                )));
            }
            Some(t) => t as u64,
        };
        if queue_size > 0 && timeout == 0 {
            return Err(bad(
                "--prefill-queue-timeout-secs 0 with a non-empty queue would reject every waiter; \
                 give a positive timeout or set --prefill-queue-size 0",
            ));
        }
        Ok(Some(AdmissionSettings {
            max_inflight_per_worker: max,
            queue_size,
            queue_timeout: Duration::from_secs(timeout),
        }))
    }
}

impl Config {
    /// Cross-field rules that do not depend on how the values were given.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let count = |t: WorkerType| self.workers.iter().filter(|w| w.worker_type == t).count();
        match self.mode {
            Mode::PdHttp => {
                if count(WorkerType::Prefill) == 0 {
                    return Err(bad(
                        "--pd-disaggregation needs at least one --prefill URL [BOOTSTRAP_PORT|none]",
                    ));
                }
                if count(WorkerType::Decode) == 0 {
                    return Err(bad("--pd-disaggregation needs at least one --decode URL"));
                }
                if count(WorkerType::Regular) > 0 {
                    return Err(bad(
                        "--worker-urls cannot be combined with --pd-disaggregation; use --prefill and --decode",
                    ));
                }
            }
            Mode::Regular => {
                if count(WorkerType::Prefill) + count(WorkerType::Decode) > 0 {
                    return Err(bad("--prefill and --decode need --pd-disaggregation"));
                }
            }
        }
        let mut seen = std::collections::HashSet::new();
        for w in &self.workers {
            if !seen.insert((w.url.as_str(), w.worker_type)) {
                return Err(bad(format!(
                    "worker URL '{}' is given twice as a {} worker",
                    w.url,
                    w.worker_type.as_str()
                )));
            }
        }
        if self.retry.max_attempts == 0 {
            return Err(bad(
                "--retry-max-retries must be at least 1 (it counts total attempts)",
            ));
        }
        if !(self.retry.multiplier >= 1.0 && self.retry.multiplier.is_finite()) {
            return Err(bad(
                "--retry-backoff-multiplier must be a number of at least 1.0",
            ));
        }
        if !(0.0..=1.0).contains(&self.retry.jitter) {
            return Err(bad("--retry-jitter-factor must be between 0 and 1"));
        }
        if self.breaker.failure_threshold == 0 || self.breaker.success_threshold == 0 {
            return Err(bad(
                "--cb-failure-threshold and --cb-success-threshold must be at least 1",
            ));
        }
        if self.health.failure_threshold == 0 || self.health.success_threshold == 0 {
            return Err(bad(
                "--health-failure-threshold and --health-success-threshold must be at least 1",
            ));
        }
        if self.health.interval.is_zero() || self.health.timeout.is_zero() {
            return Err(bad(
                "--health-check-interval-secs and --health-check-timeout-secs must be at least 1",
            ));
        }
        if !self.health.endpoint.starts_with('/') {
            return Err(bad("--health-check-endpoint must start with '/'"));
        }
        if !(0.0..=1.0).contains(&self.cache.cache_threshold) {
            return Err(bad("--cache-threshold must be between 0 and 1"));
        }
        if self.cache.balance_rel_threshold < 1.0 || !self.cache.balance_rel_threshold.is_finite() {
            return Err(bad("--balance-rel-threshold must be at least 1.0"));
        }
        if self.request_timeout.is_zero() {
            return Err(bad("--request-timeout-secs must be at least 1"));
        }
        if self.max_payload_size == 0 {
            return Err(bad("--max-payload-size must be at least 1 byte"));
        }
        if self.eviction_interval.is_zero() {
            return Err(bad("--eviction-interval-secs must be at least 1"));
        }
        if let Some(a) = self.admission {
            if self.mode != Mode::PdHttp {
                return Err(bad(
                    "--prefill-max-inflight-requests-per-worker needs PD mode",
                ));
            }
            if a.max_inflight_per_worker == 0 {
                return Err(bad(
                    "--prefill-max-inflight-requests-per-worker must be positive to enable admission",
                ));
            }
        }
        Ok(())
    }

    /// A configuration with SMG's defaults for the given mode and workers (used by tests and
    /// the demo); call [`Config::validate`] before use.
    pub fn with_workers(mode: Mode, workers: Vec<WorkerSpec>) -> Self {
        Self {
            host: IpAddr::from([127, 0, 0, 1]),
            port: 0,
            mode,
            workers,
            policy: PolicyKind::CacheAware,
            prefill_policy: PolicyKind::CacheAware,
            decode_policy: PolicyKind::CacheAware,
            cache: CacheAwareConfig::default(),
            eviction_interval: Duration::from_secs(120),
            api_key: None,
            request_timeout: Duration::from_secs(1800),
            max_payload_size: 512 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(180),
            retry: RetryConfig {
                max_attempts: 5,
                initial_backoff: Duration::from_millis(50),
                max_backoff: Duration::from_secs(30),
                multiplier: 1.5,
                jitter: 0.2,
            },
            breaker: BreakerConfig {
                enabled: true,
                failure_threshold: 10,
                success_threshold: 3,
                timeout: Duration::from_secs(60),
            },
            health: HealthConfig {
                enabled: true,
                interval: Duration::from_secs(60),
                timeout: Duration::from_secs(5),
                failure_threshold: 3,
                success_threshold: 2,
                endpoint: "/health".into(),
            },
            prometheus: None,
            dp_aware: false,
            priority_scheduler: false,
            admission: None,
        }
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
        }
    }

    #[test]
    fn admission_off_by_default() {
        assert_eq!(raw(-1, None, None).resolve(Mode::PdHttp, false), Ok(None));
        assert_eq!(raw(0, None, None).resolve(Mode::Regular, false), Ok(None));
    }

    #[test]
    fn admission_defaults_when_enabled() {
        let a = raw(2, None, None)
            .resolve(Mode::PdHttp, false)
            .unwrap()
            .unwrap();
        assert_eq!(a.max_inflight_per_worker, 2);
        assert_eq!(a.queue_size, 100);
        assert_eq!(a.queue_timeout, Duration::from_secs(60));
    }

    #[test]
    fn the_four_startup_rejections_have_distinct_messages() {
        let errs = [
            raw(-1, Some(4), None).resolve(Mode::PdHttp, false),
            raw(1, None, None).resolve(Mode::Regular, false),
            raw(1, None, None).resolve(Mode::PdHttp, true),
            raw(1, Some(4), Some(0)).resolve(Mode::PdHttp, false),
        ];
        let msgs: Vec<String> = errs.into_iter().map(|e| e.unwrap_err().0).collect();
        assert!(msgs[0].contains("--prefill-queue-size"));
        assert!(msgs[1].contains("PD mode"));
        assert!(msgs[2].contains("--priority-scheduler-enabled"));
        assert!(msgs[3].contains("--prefill-queue-timeout-secs 0"));
        let unique: std::collections::HashSet<_> = msgs.iter().collect();
        assert_eq!(unique.len(), 4);
    }

    #[test]
    fn queue_size_zero_allows_zero_timeout() {
        let a = raw(1, Some(0), Some(0))
            .resolve(Mode::PdHttp, false)
            .unwrap()
            .unwrap();
        assert_eq!(a.queue_size, 0);
    }

    #[test]
    fn worker_urls_are_checked() {
        assert_eq!(parse_worker_url("http://h:8000/").unwrap(), "http://h:8000");
        assert!(parse_worker_url("https://h:8443").is_ok());
        assert!(parse_worker_url("ftp://h").unwrap_err().contains("http://"));
        assert!(parse_worker_url("h:8000").is_err());
        assert!(parse_worker_url("http://").is_err());
        assert!(parse_worker_url("http://h:99999").is_err());
        assert!(parse_worker_url("http://h:0").is_err());
        assert!(parse_worker_url("http://h:80/v1").is_err());
        assert!(
            parse_worker_url("grpc://h:80")
                .unwrap_err()
                .contains("grpc")
        );
    }
}
