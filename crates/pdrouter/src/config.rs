//! Validated router configuration.
//!
//! [`Config`] holds enums, durations and parsed worker specs, never raw flag strings. Every
//! startup rule lives in [`Config::validate`] with its own message naming the flag at fault, so
//! a bad command line fails before anything binds a port.

use std::net::IpAddr;
use std::time::Duration;

pub use pdrouter_admission::Fallback;
use pdrouter_policy::{CacheAwareConfig, ManualConfig, PolicyKind, PrefixHashConfig};

pub use crate::admission_store::StoreUrl;

use crate::limiter::LimiterConfig;

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
pub use pdrouter_admission::{AutoConfig, Unit};

/// The allowed values of one numeric flag, inclusive.
///
/// Every numeric flag has one, listed in [`FLAG_RANGES`]; its `--help` text states the same
/// range (a unit test in `cli` checks both). [`Config::validate`] checks them all, so a
/// configuration that passes cannot overflow a deadline or a counter, and an out-of-range
/// value fails with one line naming the flag and the range.
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

/// Ranges of the numeric flags (see [`FlagRange`]).
pub mod range {
    use super::FlagRange;

    /// `--port`.
    pub const PORT: FlagRange = FlagRange::new("--port", 0.0, 65_535.0);
    /// `--max-payload-size` (bytes, up to 4 GiB).
    pub const MAX_PAYLOAD_SIZE: FlagRange =
        FlagRange::new("--max-payload-size", 1.0, 4_294_967_296.0);
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
    pub const PREFILL_QUEUE_SIZE: FlagRange =
        FlagRange::new("--prefill-queue-size", 0.0, 1_000_000.0);
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
    pub const CB_FAILURE_THRESHOLD: FlagRange =
        FlagRange::new("--cb-failure-threshold", 1.0, 10_000.0);
    /// `--cb-success-threshold`.
    pub const CB_SUCCESS_THRESHOLD: FlagRange =
        FlagRange::new("--cb-success-threshold", 1.0, 10_000.0);
    /// `--cb-timeout-duration-secs` (up to 1 day).
    pub const CB_TIMEOUT_SECS: FlagRange =
        FlagRange::new("--cb-timeout-duration-secs", 1.0, 86_400.0);
    /// `--cb-window-duration-secs` (up to 1 day).
    pub const CB_WINDOW_SECS: FlagRange =
        FlagRange::new("--cb-window-duration-secs", 1.0, 86_400.0);
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
    pub const PREFIX_TOKEN_COUNT: FlagRange =
        FlagRange::new("--prefix-token-count", 1.0, 1_048_576.0);
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
    pub const MAX_IMAGE_BYTES: FlagRange =
        FlagRange::new("--max-image-bytes", 1.0, 1_073_741_824.0);
    /// `--max-image-pixels` (per decoded image, up to 2^28).
    pub const MAX_IMAGE_PIXELS: FlagRange =
        FlagRange::new("--max-image-pixels", 1.0, 268_435_456.0);
    /// `--image-fetch-timeout-secs` (up to 5 minutes).
    pub const IMAGE_FETCH_TIMEOUT_SECS: FlagRange =
        FlagRange::new("--image-fetch-timeout-secs", 1.0, 300.0);
}

/// Every numeric flag's range, for help and error text and the checks that keep them true.
pub const FLAG_RANGES: &[FlagRange] = &[
    range::PORT,
    range::MAX_PAYLOAD_SIZE,
    range::REQUEST_TIMEOUT_SECS,
    range::SHUTDOWN_GRACE_SECS,
    range::CACHE_THRESHOLD,
    range::BALANCE_ABS_THRESHOLD,
    range::BALANCE_REL_THRESHOLD,
    range::EVICTION_INTERVAL_SECS,
    range::MAX_TREE_SIZE,
    range::PREFILL_MAX_INFLIGHT,
    range::PREFILL_MAX_INFLIGHT_TOKENS,
    range::PREFILL_LIMIT_MIN,
    range::PREFILL_LIMIT_MAX,
    range::PREFILL_QUEUE_SIZE,
    range::PREFILL_QUEUE_TIMEOUT_SECS,
    range::ADMISSION_STORE_INTERVAL_MS,
    range::ADMISSION_STORE_LEASE_TTL_MS,
    range::RETRY_MAX_RETRIES,
    range::RETRY_INITIAL_BACKOFF_MS,
    range::RETRY_MAX_BACKOFF_MS,
    range::RETRY_BACKOFF_MULTIPLIER,
    range::RETRY_JITTER_FACTOR,
    range::CB_FAILURE_THRESHOLD,
    range::CB_SUCCESS_THRESHOLD,
    range::CB_TIMEOUT_SECS,
    range::CB_WINDOW_SECS,
    range::HEALTH_FAILURE_THRESHOLD,
    range::HEALTH_SUCCESS_THRESHOLD,
    range::HEALTH_CHECK_TIMEOUT_SECS,
    range::HEALTH_CHECK_INTERVAL_SECS,
    range::CLIENT_HEADER_TIMEOUT_SECS,
    range::MAX_CONNECTIONS,
    range::PROMETHEUS_PORT,
    range::PREFIX_TOKEN_COUNT,
    range::PREFIX_HASH_LOAD_FACTOR,
    range::MAX_IDLE_SECS,
    range::MAX_CONCURRENT_REQUESTS,
    range::QUEUE_SIZE,
    range::QUEUE_TIMEOUT_SECS,
    range::RATE_LIMIT_TOKENS_PER_SECOND,
    range::WORKER_STARTUP_TIMEOUT_SECS,
    range::WORKER_STARTUP_CHECK_INTERVAL,
    range::MAX_IMAGE_BYTES,
    range::MAX_IMAGE_PIXELS,
    range::IMAGE_FETCH_TIMEOUT_SECS,
];

/// The range of a numeric flag (`--name`), if it is one.
pub fn flag_range(flag: &str) -> Option<&'static FlagRange> {
    FLAG_RANGES.iter().find(|r| r.flag == flag)
}

/// How requests are routed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// One regular worker per request.
    Regular,
    /// Prefill + Decode workers over HTTP.
    PdHttp,
    /// Prefill + Decode workers over gRPC: the router tokenizes and detokenizes.
    PdGrpc,
    /// One regular worker per request over gRPC: the router tokenizes and detokenizes.
    RegularGrpc,
    /// Encode + Prefill + Decode workers over gRPC (TokenSpeed): a request without images
    /// is served as PD.
    EpdGrpc,
}

impl Mode {
    /// Whether requests go to a Prefill and a Decode worker.
    pub fn is_pd(self) -> bool {
        matches!(self, Self::PdHttp | Self::PdGrpc | Self::EpdGrpc)
    }

    /// Whether the workers speak gRPC (the router tokenizes for them).
    pub fn is_grpc(self) -> bool {
        matches!(self, Self::PdGrpc | Self::RegularGrpc | Self::EpdGrpc)
    }

    /// The worker types a request of this mode needs ready workers of.
    pub fn worker_types(self) -> &'static [WorkerType] {
        match self {
            Self::PdHttp | Self::PdGrpc => &[WorkerType::Prefill, WorkerType::Decode],
            Self::EpdGrpc => &[WorkerType::Encode, WorkerType::Prefill, WorkerType::Decode],
            Self::Regular | Self::RegularGrpc => &[WorkerType::Regular],
        }
    }
}

/// Where the router gets its tokenizer when workers take token ids (gRPC).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerSource {
    /// `--tokenizer-path`: a `tokenizer.json` or the directory holding it.
    pub tokenizer_path: Option<std::path::PathBuf>,
    /// `--model-path`: the model directory.
    pub model_path: Option<std::path::PathBuf>,
    /// `--chat-template`: a Jinja file overriding the tokenizer's template.
    pub chat_template: Option<std::path::PathBuf>,
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
    /// Runs a vision model's encoder in EPD mode (gRPC, TokenSpeed's encoder service).
    Encode,
}

impl WorkerType {
    /// Lower-case name as used in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Regular => "regular",
            Self::Prefill => "prefill",
            Self::Decode => "decode",
            Self::Encode => "encode",
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

/// Whether a (normalised) worker URL speaks gRPC.
pub fn is_grpc_url(url: &str) -> bool {
    url.starts_with("grpc://")
}

/// Checks and normalises a worker URL: `http://`, `https://` or `grpc://` with a host and
/// optional port (required for `grpc://`, which has no default).
pub fn parse_worker_url(raw: &str) -> Result<String, String> {
    let trimmed = raw.trim().trim_end_matches('/');
    let rest = trimmed
        .strip_prefix("http://")
        .or_else(|| trimmed.strip_prefix("https://"))
        .or_else(|| trimmed.strip_prefix("grpc://"))
        .ok_or_else(|| {
            format!("worker URL '{raw}' must start with http://, https:// or grpc://")
        })?;
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
    } else if is_grpc_url(trimmed) {
        return Err(format!("worker URL '{raw}' needs a port: grpc://host:port"));
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
    /// Policy choosing an image item's Encode worker (EPD), keyed by the item's content hash.
    pub encode_policy: PolicyKind,
    /// cache_aware knobs.
    pub cache: CacheAwareConfig,
    /// How often cache_aware trees are trimmed.
    pub eviction_interval: Duration,
    /// Required bearer key for inference and admin routes, and the key startup workers get
    /// unless their spec has one.
    pub api_key: Option<String>,
    /// Longest a backend request may take to answer.
    pub request_timeout: Duration,
    /// Largest accepted request body.
    pub max_payload_size: usize,
    /// In-flight requests get this long to finish on shutdown.
    pub shutdown_grace: Duration,
    /// Longest a client may take from the first byte of a request head to its end.
    pub client_header_timeout: Duration,
    /// Most client connections open at once; further ones wait in the accept backlog.
    pub max_connections: usize,
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
    /// Priority classes (`--priority-scheduler-enabled`): they order Prefill admission's queue
    /// when admission is on, else the global limiter's.
    pub priority: Option<crate::priority::PrioritySettings>,
    /// Prefill admission, when enabled.
    pub admission: Option<AdmissionSettings>,
    /// The admission store shared with other replicas, when `--admission-store` is given.
    pub admission_store: Option<StoreSettings>,
    /// How long a Prefill leg still open after Decode delivered the whole answer may go on
    /// (without its slot) before it is aborted.
    pub prefill_grace_after_decode: Duration,
    /// Tokenizer source: gRPC workers' tokenizer; with http:// workers, prefix_hash's.
    pub tokenizer: TokenizerSource,
    /// Request-id headers, CORS, server TLS, control-plane keys.
    pub edge: crate::edge::EdgeConfig,
    /// prefix_hash knobs.
    pub prefix_hash: PrefixHashConfig,
    /// manual knobs.
    pub manual: ManualConfig,
    /// The global request limiter, when `--max-concurrent-requests` is positive.
    pub limiter: Option<LimiterConfig>,
    /// Wait for every startup worker to be ready before serving, when asked.
    pub startup_wait: Option<StartupWait>,
    /// `--model-alias ALIAS=CANONICAL`: requests naming `ALIAS` go to the workers serving
    /// `CANONICAL`.
    pub model_aliases: Vec<(String, String)>,
    /// `--runtime`: the runtime asked first when learning a gRPC worker's runtime.
    pub grpc_runtime: Option<crate::grpc::runtime::Runtime>,
    /// Limits on image inputs.
    pub images: ImageConfig,
}

/// Default `--image-fetch-timeout-secs`: an image server that has not delivered a 20 MiB
/// image in 10 s is better refused than waited for while the client waits too.
pub const DEFAULT_IMAGE_FETCH_TIMEOUT_SECS: u64 = 10;

/// Image inputs (`image_url` content parts) for vision models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageConfig {
    /// `--max-image-bytes`: largest encoded image (data URL payload or fetched body).
    pub max_bytes: u64,
    /// `--max-image-pixels`: largest decoded image, width times height.
    pub max_pixels: u64,
    /// `--image-fetch-timeout-secs`: the whole fetch of an http(s) image, redirects included.
    pub fetch_timeout: Duration,
    /// `--allow-private-image-urls`: image URLs may reach loopback, private, link-local and
    /// unique-local addresses.
    pub allow_private_urls: bool,
}

impl Default for ImageConfig {
    fn default() -> Self {
        ImageConfig {
            max_bytes: pdrouter_vision::DEFAULT_MAX_IMAGE_BYTES,
            max_pixels: pdrouter_vision::DEFAULT_MAX_IMAGE_PIXELS,
            fetch_timeout: Duration::from_secs(DEFAULT_IMAGE_FETCH_TIMEOUT_SECS),
            allow_private_urls: false,
        }
    }
}

/// `--worker-startup-timeout-secs` / `--worker-startup-check-interval`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StartupWait {
    /// Give up (and exit) if the startup workers are not all ready by then.
    pub timeout: Duration,
    /// How often readiness is checked (and reported) while waiting.
    pub check_interval: Duration,
}

/// Default `--worker-startup-timeout-secs` when only the check interval is given (SMG's).
pub const DEFAULT_WORKER_STARTUP_TIMEOUT_SECS: u64 = 1800;
/// Default `--worker-startup-check-interval` when only the timeout is given (SMG's).
pub const DEFAULT_WORKER_STARTUP_CHECK_INTERVAL_SECS: u64 = 30;
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

/// Default [`Config::prefill_grace_after_decode`]: a Prefill answer normally ends before
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

/// `--admission-store` and its tuning: the replicas of one group share each Prefill worker's
/// request limit (and token budget) through the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreSettings {
    /// The store (credentials hidden when shown).
    pub url: StoreUrl,
    /// `--admission-group`: replicas with the same group share limits.
    pub group: String,
    /// Time between a replica's exchanges with the store.
    pub interval: Duration,
    /// How long a replica's leases last in the store without renewal.
    pub lease_ttl: Duration,
    /// What a replica does once its leases could have expired.
    pub fallback: Fallback,
}

/// Default `--admission-group`.
pub const DEFAULT_ADMISSION_GROUP: &str = "default";
/// Default `--admission-store-interval-ms`.
pub const DEFAULT_STORE_INTERVAL_MS: u64 = 200;
/// Default `--admission-store-lease-ttl-ms`.
pub const DEFAULT_STORE_LEASE_TTL_MS: u64 = 3_000;

/// Admission-store flags as given, before validation.
#[derive(Debug, Clone, Default)]
pub struct RawStore {
    /// `--admission-store`.
    pub url: Option<String>,
    /// `--admission-group`.
    pub group: Option<String>,
    /// `--admission-store-interval-ms`.
    pub interval_ms: Option<i64>,
    /// `--admission-store-lease-ttl-ms`.
    pub lease_ttl_ms: Option<i64>,
    /// `--admission-store-fallback`.
    pub fallback: Option<String>,
}

impl RawStore {
    /// The store settings, or `None` without `--admission-store` (its other flags are then
    /// refused). The store shares the request limit, so admission must have one.
    pub fn resolve(
        self,
        admission: Option<&AdmissionSettings>,
    ) -> Result<Option<StoreSettings>, ConfigError> {
        let Some(raw_url) = self.url else {
            if self.group.is_some()
                || self.interval_ms.is_some()
                || self.lease_ttl_ms.is_some()
                || self.fallback.is_some()
            {
                return Err(bad("--admission-group, --admission-store-interval-ms, \
                     --admission-store-lease-ttl-ms and --admission-store-fallback need \
                     --admission-store"));
            }
            return Ok(None);
        };
        let url = StoreUrl::parse(&raw_url).map_err(bad)?;
        // Both would set each worker's limit: the store from the group's shares of a fixed N,
        // auto from this replica's own observations.
        if admission.is_some_and(|a| a.auto.is_some()) {
            return Err(bad(
                "--admission-store shares fixed Prefill limits between replicas; give \
                 --prefill-max-inflight-requests-per-worker and \
                 --prefill-max-inflight-tokens-per-worker numbers, not auto",
            ));
        }
        if admission.is_none_or(|a| a.max_inflight_per_worker == NO_COUNT_LIMIT) {
            return Err(bad(
                "--admission-store shares --prefill-max-inflight-requests-per-worker between \
                 replicas; give a positive one",
            ));
        }
        let group = self
            .group
            .unwrap_or_else(|| DEFAULT_ADMISSION_GROUP.to_string());
        if group.is_empty()
            || group.len() > 64
            || !group
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(bad(format!(
                "--admission-group '{group}' must be 1-64 letters, digits, '-', '_' or '.'"
            )));
        }
        // In range, so the conversions below are exact.
        let interval = match self.interval_ms {
            None => DEFAULT_STORE_INTERVAL_MS,
            Some(v) => range::ADMISSION_STORE_INTERVAL_MS.check(v)? as u64,
        };
        let ttl = match self.lease_ttl_ms {
            None => DEFAULT_STORE_LEASE_TTL_MS,
            Some(v) => range::ADMISSION_STORE_LEASE_TTL_MS.check(v)? as u64,
        };
        if ttl < 3 * interval {
            return Err(bad(format!(
                "--admission-store-lease-ttl-ms {ttl} must be at least 3 times \
                 --admission-store-interval-ms {interval}, so a lease is renewed several times \
                 before it expires"
            )));
        }
        let fallback = match self.fallback.as_deref() {
            None | Some("hold") => Fallback::Hold,
            Some("local") => Fallback::Local,
            Some(other) => {
                return Err(bad(format!(
                    "--admission-store-fallback '{other}' must be hold or local"
                )));
            }
        };
        Ok(Some(StoreSettings {
            url,
            group,
            interval: Duration::from_millis(interval),
            lease_ttl: Duration::from_millis(ttl),
            fallback,
        }))
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

/// Default `--client-header-timeout-secs`: API clients send a head in one write, so any
/// value well above a network round trip is safe; 30 s tolerates very slow links while a
/// connection that stalls mid-head is closed long before it matters.
pub const DEFAULT_CLIENT_HEADER_TIMEOUT_SECS: u64 = 30;
/// Default `--max-connections`: far above what admission queues normally hold (every waiter
/// is a connection), yet bounded so a connection flood queues in the kernel's backlog instead
/// of exhausting file descriptors and memory (an idle connection costs about 2 KB).
pub const DEFAULT_MAX_CONNECTIONS: usize = 32_768;

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

impl Config {
    /// Cross-field rules that do not depend on how the values were given.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let count = |t: WorkerType| self.workers.iter().filter(|w| w.worker_type == t).count();
        let grpc = self.workers.iter().filter(|w| is_grpc_url(&w.url)).count();
        if grpc != 0 && grpc != self.workers.len() {
            return Err(bad(if self.mode.is_pd() {
                "PD workers mix http(s):// and grpc:// URLs; give every --prefill and --decode \
                 worker the same transport"
            } else {
                "--worker-urls mix http(s):// and grpc:// URLs; give every worker the same transport"
            }));
        }
        if !self.workers.is_empty() && (grpc != 0) != self.mode.is_grpc() {
            return Err(bad(
                "the routing mode does not match the workers' transport (gRPC modes need \
                 grpc:// workers, HTTP modes http(s):// ones)",
            ));
        }
        if let Some(rt) = self.grpc_runtime
            && !self.workers.is_empty()
            && !self.mode.is_grpc()
        {
            return Err(bad(format!(
                "--runtime {rt} applies to grpc:// workers; these workers are http(s)://"
            )));
        }
        match self.mode {
            Mode::PdHttp | Mode::PdGrpc => {
                if count(WorkerType::Encode) > 0 {
                    return Err(bad("--encode needs --epd-disaggregation"));
                }
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
            Mode::EpdGrpc => {
                for (t, flag) in [
                    (WorkerType::Encode, "--encode URL [BOOTSTRAP_PORT]"),
                    (WorkerType::Prefill, "--prefill URL [BOOTSTRAP_PORT|none]"),
                    (WorkerType::Decode, "--decode URL"),
                ] {
                    if count(t) == 0 {
                        return Err(bad(format!(
                            "--epd-disaggregation needs at least one {flag}"
                        )));
                    }
                }
                if count(WorkerType::Regular) > 0 {
                    return Err(bad(
                        "--worker-urls cannot be combined with --epd-disaggregation",
                    ));
                }
            }
            Mode::Regular | Mode::RegularGrpc => {
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
        self.check_ranges()?;
        if !self.health.endpoint.starts_with('/') {
            return Err(bad("--health-check-endpoint must start with '/'"));
        }
        if !self.mode.is_grpc() && self.tokenizer.chat_template.is_some() {
            return Err(bad(
                "--chat-template is for grpc:// workers (the router renders chats for them); \
                 http:// workers apply their own template",
            ));
        }
        let mut aliases = std::collections::HashSet::new();
        for (alias, canonical) in &self.model_aliases {
            if alias.is_empty() || canonical.is_empty() || alias == canonical {
                return Err(bad(format!(
                    "--model-alias '{alias}={canonical}' must be ALIAS=MODEL with two different, \
                     non-empty names"
                )));
            }
            if !aliases.insert(alias.as_str()) {
                return Err(bad(format!("--model-alias '{alias}' is given twice")));
            }
        }
        if let Some(st) = &self.admission_store {
            if self.admission.is_some_and(|a| a.auto.is_some()) {
                return Err(bad(
                    "--admission-store shares fixed Prefill limits between replicas, not auto",
                ));
            }
            if self
                .admission
                .is_none_or(|a| a.max_inflight_per_worker == NO_COUNT_LIMIT)
            {
                return Err(bad(
                    "--admission-store needs a positive --prefill-max-inflight-requests-per-worker",
                ));
            }
            if st.lease_ttl < st.interval * 3 {
                return Err(bad(
                    "--admission-store-lease-ttl-ms must be at least 3 times \
                     --admission-store-interval-ms",
                ));
            }
        }
        if self.admission.is_some() && !self.mode.is_pd() {
            return Err(bad(
                "--prefill-max-inflight-requests-per-worker needs PD mode",
            ));
        }
        Ok(())
    }

    /// Every numeric setting against its flag's range (see [`FlagRange`]).
    fn check_ranges(&self) -> Result<(), ConfigError> {
        let secs = Duration::from_secs(1);
        let ms = Duration::from_millis(1);
        range::PORT.check(self.port)?;
        range::MAX_PAYLOAD_SIZE.check(self.max_payload_size)?;
        range::REQUEST_TIMEOUT_SECS.check_duration(self.request_timeout, secs)?;
        range::SHUTDOWN_GRACE_SECS.check_duration(self.shutdown_grace, secs)?;
        range::CACHE_THRESHOLD.check(self.cache.cache_threshold)?;
        range::BALANCE_ABS_THRESHOLD.check(self.cache.balance_abs_threshold)?;
        range::BALANCE_REL_THRESHOLD.check(self.cache.balance_rel_threshold)?;
        range::EVICTION_INTERVAL_SECS.check_duration(self.eviction_interval, secs)?;
        range::MAX_TREE_SIZE.check(self.cache.max_tree_size)?;
        range::RETRY_MAX_RETRIES.check(self.retry.max_attempts)?;
        range::RETRY_INITIAL_BACKOFF_MS.check_duration(self.retry.initial_backoff, ms)?;
        range::RETRY_MAX_BACKOFF_MS.check_duration(self.retry.max_backoff, ms)?;
        range::RETRY_BACKOFF_MULTIPLIER.check(self.retry.multiplier)?;
        range::RETRY_JITTER_FACTOR.check(self.retry.jitter)?;
        range::CB_FAILURE_THRESHOLD.check(self.breaker.failure_threshold)?;
        range::CB_SUCCESS_THRESHOLD.check(self.breaker.success_threshold)?;
        range::CB_TIMEOUT_SECS.check_duration(self.breaker.timeout, secs)?;
        range::HEALTH_FAILURE_THRESHOLD.check(self.health.failure_threshold)?;
        range::HEALTH_SUCCESS_THRESHOLD.check(self.health.success_threshold)?;
        range::HEALTH_CHECK_TIMEOUT_SECS.check_duration(self.health.timeout, secs)?;
        range::HEALTH_CHECK_INTERVAL_SECS.check_duration(self.health.interval, secs)?;
        range::CLIENT_HEADER_TIMEOUT_SECS.check_duration(self.client_header_timeout, secs)?;
        range::MAX_CONNECTIONS.check(self.max_connections)?;
        range::MAX_IMAGE_BYTES.check(self.images.max_bytes)?;
        range::MAX_IMAGE_PIXELS.check(self.images.max_pixels)?;
        range::IMAGE_FETCH_TIMEOUT_SECS.check_duration(self.images.fetch_timeout, secs)?;
        if let Some((_, port)) = self.prometheus {
            range::PROMETHEUS_PORT.check(port)?;
        }
        range::PREFIX_TOKEN_COUNT.check(self.prefix_hash.prefix_token_count)?;
        range::PREFIX_HASH_LOAD_FACTOR.check(self.prefix_hash.load_factor)?;
        range::MAX_IDLE_SECS.check(self.manual.max_idle_secs)?;
        range::CB_WINDOW_SECS.check_duration(self.breaker.window, secs)?;
        if let Some(l) = self.limiter {
            range::MAX_CONCURRENT_REQUESTS.check(l.max_concurrent)?;
            range::QUEUE_SIZE.check(l.queue_size)?;
            range::QUEUE_TIMEOUT_SECS.check_duration(l.queue_timeout, secs)?;
            if let Some(r) = l.tokens_per_second {
                range::RATE_LIMIT_TOKENS_PER_SECOND.check(r)?;
            }
        }
        if let Some(w) = self.startup_wait {
            range::WORKER_STARTUP_TIMEOUT_SECS.check_duration(w.timeout, secs)?;
            range::WORKER_STARTUP_CHECK_INTERVAL.check_duration(w.check_interval, secs)?;
        }
        if let Some(a) = self.admission {
            if a.max_inflight_per_worker != NO_COUNT_LIMIT {
                range::PREFILL_MAX_INFLIGHT.check(a.max_inflight_per_worker)?;
            }
            if let Some(t) = a.max_inflight_tokens_per_worker {
                range::PREFILL_MAX_INFLIGHT_TOKENS.check(t)?;
            }
            range::PREFILL_QUEUE_SIZE.check(a.queue_size)?;
            range::PREFILL_QUEUE_TIMEOUT_SECS.check_duration(a.queue_timeout, secs)?;
        }
        if let Some(st) = &self.admission_store {
            range::ADMISSION_STORE_INTERVAL_MS.check_duration(st.interval, ms)?;
            range::ADMISSION_STORE_LEASE_TTL_MS.check_duration(st.lease_ttl, ms)?;
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
            encode_policy: PolicyKind::ConsistentHashing,
            cache: CacheAwareConfig::default(),
            eviction_interval: Duration::from_secs(120),
            api_key: None,
            request_timeout: Duration::from_secs(1800),
            max_payload_size: 512 * 1024 * 1024,
            shutdown_grace: Duration::from_secs(180),
            client_header_timeout: Duration::from_secs(DEFAULT_CLIENT_HEADER_TIMEOUT_SECS),
            max_connections: DEFAULT_MAX_CONNECTIONS,
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
                window: Duration::from_secs(120),
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
            priority: None,
            admission: None,
            admission_store: None,
            prefill_grace_after_decode: PREFILL_GRACE_AFTER_DECODE,
            tokenizer: TokenizerSource::default(),
            edge: crate::edge::EdgeConfig::default(),
            prefix_hash: PrefixHashConfig::default(),
            manual: ManualConfig::default(),
            limiter: None,
            startup_wait: None,
            model_aliases: Vec::new(),
            grpc_runtime: None,
            images: ImageConfig::default(),
        }
    }

    /// The model a request naming `model` is routed for: the canonical name of an alias, else
    /// the name itself.
    pub fn resolve_model<'a>(&'a self, model: &'a str) -> &'a str {
        self.model_aliases
            .iter()
            .find(|(alias, _)| alias == model)
            .map_or(model, |(_, canonical)| canonical.as_str())
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
    fn the_admission_store_needs_a_request_limit_and_checks_its_flags() {
        let limits = raw(4, None, None).resolve(Mode::PdHttp).unwrap();
        let store = |f: fn(&mut RawStore)| {
            let mut r = RawStore {
                url: Some("redis://u:pw@127.0.0.1:6379/1".into()),
                ..RawStore::default()
            };
            f(&mut r);
            r
        };
        let ok = store(|_| {}).resolve(limits.as_ref()).unwrap().unwrap();
        assert_eq!(ok.group, DEFAULT_ADMISSION_GROUP);
        assert_eq!(ok.interval, Duration::from_millis(200));
        assert_eq!(ok.lease_ttl, Duration::from_secs(3));
        assert_eq!(ok.fallback, Fallback::Hold);
        assert!(!format!("{ok:?}").contains("pw"));
        let err = |r: RawStore, a: Option<&AdmissionSettings>| r.resolve(a).unwrap_err().0;
        assert!(err(store(|_| {}), None).contains("--prefill-max-inflight-requests-per-worker"));
        let tokens_only = AdmissionSettings {
            max_inflight_per_worker: NO_COUNT_LIMIT,
            ..limits.unwrap()
        };
        assert!(err(store(|_| {}), Some(&tokens_only)).contains("positive"));
        let l = limits.as_ref();
        assert!(err(store(|r| r.group = Some("a b".into())), l).contains("--admission-group"));
        assert!(err(store(|r| r.fallback = Some("drop".into())), l).contains("hold or local"));
        let e = err(
            store(|r| {
                r.interval_ms = Some(1000);
                r.lease_ttl_ms = Some(2000);
            }),
            l,
        );
        assert!(e.contains("at least 3 times"), "{e}");
        let e = err(
            RawStore {
                fallback: Some("local".into()),
                ..RawStore::default()
            },
            l,
        );
        assert!(e.contains("need --admission-store"), "{e}");
        assert_eq!(RawStore::default().resolve(l).unwrap(), None);
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
        assert_eq!(parse_worker_url("grpc://h:80/").unwrap(), "grpc://h:80");
        assert!(parse_worker_url("grpc://h").unwrap_err().contains("port"));
        assert!(parse_worker_url("grpc://").is_err());
        assert!(parse_worker_url("grpc://h:0").is_err());
        assert!(parse_worker_url("grpc://h:80/x").is_err());
        assert!(parse_worker_url("grpc://u@h:80").is_err());
    }
}
