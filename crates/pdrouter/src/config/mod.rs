//! Validated router configuration.
//!
//! [`Config`] holds enums, durations and parsed worker specs, never raw flag strings. Every
//! startup rule lives either in the resolution of a flag group's raw values (`Raw*::resolve`,
//! e.g. [`RawAdmission::resolve`]) or in [`Config::validate`], each with its own message
//! naming the flag at fault, so a bad command line fails before anything binds a port.
//!
//! This module depends on no other module of the crate: the settings of the limiter, priority
//! classes, the edge, the admission store, logging and the gRPC runtimes are plain types here,
//! with their parsing and checks; the modules that act on them re-export them and add the
//! behaviour. One file per concern:
//!
//! - `range`: every numeric flag's range ([`FLAG_RANGES`]);
//! - `validate`: [`Config::validate`], the rules across fields;
//! - `workers`: routing mode, worker specs and URLs, gRPC runtime, startup wait;
//! - `admission`, `store`, `limiter`, `priority`: queues and limits;
//! - `resilience`: retries, circuit breakers, health checks;
//! - `edge`, `inputs`, `telemetry`: request ids, CORS, TLS and keys; tokenizer and image
//!   limits; logs and traces.

use std::net::IpAddr;
use std::time::Duration;

use pdrouter_policy::{CacheAwareConfig, ManualConfig, PolicyKind, PrefixHashConfig};

pub mod admission;
pub mod discovery;
pub mod edge;
pub mod inputs;
pub mod limiter;
pub mod priority;
pub mod range;
pub mod resilience;
pub mod store;
pub mod telemetry;
mod validate;
pub mod workers;

pub use admission::{
    AUTO_REQUESTS_BOUNDS, AUTO_TOKENS_BOUNDS, AdmissionSettings, AutoConfig, DEFAULT_QUEUE_SIZE,
    DEFAULT_QUEUE_TIMEOUT_SECS, NO_COUNT_LIMIT, PREFILL_GRACE_AFTER_DECODE, RawAdmission, RawAuto,
    Unit,
};
pub use discovery::{DEFAULT_DISCOVERY_PORT, DiscoverySettings, KubeSource};
pub use edge::EdgeConfig;
pub use inputs::{ChatParsers, DEFAULT_IMAGE_FETCH_TIMEOUT_SECS, ImageConfig, TokenizerSource};
pub use limiter::{
    DEFAULT_LIMITER_QUEUE_SIZE, DEFAULT_LIMITER_QUEUE_TIMEOUT_SECS, LimiterConfig, RawLimiter,
};
pub use priority::PrioritySettings;
pub use range::{FLAG_RANGES, FlagRange, FlagValue, flag_range};
pub use resilience::{BreakerConfig, HealthConfig, RetryConfig};
pub use store::{
    DEFAULT_ADMISSION_GROUP, DEFAULT_STORE_INTERVAL_MS, DEFAULT_STORE_LEASE_TTL_MS, Fallback,
    RawStore, StoreSettings, StoreUrl,
};
pub use telemetry::LogSettings;
pub use workers::{
    DEFAULT_WORKER_STARTUP_CHECK_INTERVAL_SECS, DEFAULT_WORKER_STARTUP_TIMEOUT_SECS, HttpEngine,
    HttpPairing, KvConnector, Mode, Runtime, StartupWait, WorkerSpec, WorkerType, is_grpc_url,
    parse_worker_url,
};

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

/// Default `--client-header-timeout-secs`: API clients send a head in one write, so any
/// value well above a network round trip is safe; 30 s tolerates very slow links while a
/// connection that stalls mid-head is closed long before it matters.
pub const DEFAULT_CLIENT_HEADER_TIMEOUT_SECS: u64 = 30;
/// Default `--max-connections`: far above what admission queues normally hold (every waiter
/// is a connection), yet bounded so a connection flood queues in the kernel's backlog instead
/// of exhausting file descriptors and memory (an idle connection costs about 2 KB).
pub const DEFAULT_MAX_CONNECTIONS: usize = 32_768;

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
    pub priority: Option<PrioritySettings>,
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
    pub edge: EdgeConfig,
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
    pub grpc_runtime: Option<Runtime>,
    /// `--runtime sglang|vllm` with http(s):// workers: their engine, not detected.
    pub http_engine: Option<HttpEngine>,
    /// `--kv-connector`: how vLLM PD pairs move the KV.
    pub kv_connector: KvConnector,
    /// Limits on image inputs.
    pub images: ImageConfig,
    /// How gRPC chat answers' tool calls and reasoning are parsed.
    pub chat_parsers: ChatParsers,
    /// Kubernetes pod discovery, when on.
    pub discovery: Option<DiscoverySettings>,
}

impl Config {
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
            edge: EdgeConfig::default(),
            prefix_hash: PrefixHashConfig::default(),
            manual: ManualConfig::default(),
            limiter: None,
            startup_wait: None,
            model_aliases: Vec::new(),
            grpc_runtime: None,
            http_engine: None,
            kv_connector: KvConnector::default(),
            images: ImageConfig::default(),
            chat_parsers: ChatParsers::default(),
            discovery: None,
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
