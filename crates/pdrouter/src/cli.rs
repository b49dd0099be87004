//! Command line (the only module that knows clap).
//!
//! Flag names and defaults follow SMG's `launch` so operators can move their command lines over
//! unchanged. [`LaunchArgs::into_config`] turns the raw flags into a validated [`Config`].

use std::net::IpAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use pdrouter_policy::{CacheAwareConfig, PolicyKind};

use crate::config::{
    AdmissionSettings, BreakerConfig, Config, ConfigError, DEFAULT_CLIENT_HEADER_TIMEOUT_SECS,
    DEFAULT_IMAGE_FETCH_TIMEOUT_SECS, DEFAULT_MAX_CONNECTIONS,
    DEFAULT_WORKER_STARTUP_CHECK_INTERVAL_SECS, DEFAULT_WORKER_STARTUP_TIMEOUT_SECS, HealthConfig,
    ImageConfig, Mode, PREFILL_GRACE_AFTER_DECODE, RawAdmission, RawAuto, RawLimiter, RawStore,
    RetryConfig, StartupWait, TokenizerSource, WorkerSpec, WorkerType, flag_range,
    parse_worker_url,
};
use crate::priority::PrioritySettings;
use pdrouter_policy::{AssignmentMode, ManualConfig, PrefixHashConfig};

/// pdrouter: prefill/decode-disaggregated LLM router with per-worker Prefill admission.
///
/// Without a subcommand, the flags are `launch`'s: `pdrouter --worker-urls URL...` is
/// `pdrouter launch --worker-urls URL...`.
#[derive(Debug, Parser)]
#[command(name = "pdrouter", version, about)]
pub struct Cli {
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the router in front of existing workers.
    Launch(Box<LaunchArgs>),
    /// Start embedded mock workers and a PD router with admission on, on loopback.
    Demo(DemoArgs),
}

/// `pdrouter demo` flags.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Address the demo router listens on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port of the demo router (0 = any free port).
    #[arg(long, default_value_t = 30000)]
    pub port: u16,
    /// Send a short burst through the router at start and show admission at work.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    pub burst: bool,
    /// Run the mocks as gRPC workers: the router tokenizes (with the tokenizer the mocks
    /// serve) and speaks SGLang's scheduler protocol to them.
    #[arg(long)]
    pub grpc: bool,
    /// Run EPD: an embedded TokenSpeed Encode mock besides the Prefill and Decode ones, and a
    /// router serving images for a small Qwen2-VL-shaped model (the mocks' byte-level
    /// tokenizer).
    #[arg(long, conflicts_with = "grpc")]
    pub epd: bool,
}

/// `pdrouter launch` flags.
#[derive(Debug, Args)]
pub struct LaunchArgs {
    // ---- Listener ----
    /// Address to listen on.
    #[arg(long, default_value = "0.0.0.0", help_heading = "Listener")]
    pub host: IpAddr,
    /// Port to listen on, 0-65535 (0 = any free port; the bound address is printed).
    #[arg(long, default_value_t = 30000, help_heading = "Listener")]
    pub port: u16,
    /// Largest accepted request body in bytes, 1-4294967296.
    #[arg(long, default_value_t = 536_870_912, help_heading = "Listener")]
    pub max_payload_size: usize,
    /// Longest a backend request may take, in seconds, 1-604800 (7 days).
    #[arg(long, default_value_t = 1800, help_heading = "Listener")]
    pub request_timeout_secs: u64,
    /// Time in-flight requests get to finish on SIGTERM/Ctrl-C, in seconds, 0-86400.
    #[arg(long, default_value_t = 180, help_heading = "Listener")]
    pub shutdown_grace_period_secs: u64,
    /// Longest a client may take from the first byte of a request head to its end, in seconds
    /// (1-3600); a stalled head gets 408 and its connection is closed. Idle keep-alive
    /// connections are not affected.
    #[arg(long, default_value_t = DEFAULT_CLIENT_HEADER_TIMEOUT_SECS, help_heading = "Listener")]
    pub client_header_timeout_secs: u64,
    /// Most client connections open at once (1-1048576); further connections wait in the
    /// accept backlog until one closes [default: 32768, or the open-file limit minus 256 when
    /// that is lower].
    #[arg(long, help_heading = "Listener")]
    pub max_connections: Option<usize>,
    /// Require `Authorization: Bearer KEY` on inference and admin routes; also the key sent
    /// to the startup workers.
    #[arg(long, help_heading = "Listener")]
    pub api_key: Option<String>,

    // ---- Workers ----
    /// Regular workers (regular mode).
    #[arg(long, num_args = 1.., value_name = "URL", help_heading = "Workers")]
    pub worker_urls: Vec<String>,
    /// Prefill/decode disaggregated mode.
    #[arg(long, help_heading = "Workers")]
    pub pd_disaggregation: bool,
    /// Prefill worker with an optional KV bootstrap port or `none` (repeatable).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT|none"], action = clap::ArgAction::Append, help_heading = "Workers")]
    pub prefill: Vec<String>,
    /// `--prefill` occurrences grouped (filled by [`Cli::parse_from_env`]).
    #[arg(skip)]
    pub prefill_groups: Vec<Vec<String>>,
    /// Decode worker (repeatable).
    #[arg(long, value_name = "URL", action = clap::ArgAction::Append, help_heading = "Workers")]
    pub decode: Vec<String>,
    /// Encode/Prefill/Decode mode over gRPC with TokenSpeed engines: --encode, --prefill and
    /// --decode grpc:// workers. Requests without images are served as PD by the Prefill and
    /// Decode workers.
    #[arg(long, help_heading = "Workers")]
    pub epd_disaggregation: bool,
    /// Encode worker with an optional bootstrap port (EPD mode; repeatable).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT"], action = clap::ArgAction::Append, help_heading = "Workers")]
    pub encode: Vec<String>,
    /// `--encode` occurrences grouped (filled by [`Cli::parse_from_env`]).
    #[arg(skip)]
    pub encode_groups: Vec<Vec<String>>,
    /// Register each DP rank of a worker reporting dp_size > 1 as its own worker.
    #[arg(long, help_heading = "Workers")]
    pub dp_aware: bool,
    /// Before serving, wait until every startup worker is ready, and exit with an error if
    /// they are not all ready after this many seconds, 1-604800 [default when only
    /// --worker-startup-check-interval is given: 1800]. Without either flag the router serves
    /// at once and workers join as their health probes pass.
    #[arg(long, help_heading = "Workers")]
    pub worker_startup_timeout_secs: Option<u64>,
    /// Seconds between readiness checks (and progress reports) while waiting for the startup
    /// workers, 1-3600 [default: 30].
    #[arg(long, help_heading = "Workers")]
    pub worker_startup_check_interval: Option<u64>,
    /// Accept ALIAS as the name of MODEL: a request naming ALIAS goes to the workers serving
    /// MODEL (repeatable; exact, case-sensitive match).
    #[arg(long, value_name = "ALIAS=MODEL", action = clap::ArgAction::Append, help_heading = "Workers")]
    pub model_alias: Vec<String>,
    /// Runtime of the grpc:// workers, asked first when learning each worker's runtime:
    /// sglang or tokenspeed. Without it the router asks SGLang's service, then TokenSpeed's;
    /// either way each worker's runtime is what its HealthCheck answers.
    #[arg(long, visible_alias = "backend", value_name = "RUNTIME", value_parser = ["sglang", "tokenspeed"], help_heading = "Workers")]
    pub runtime: Option<String>,

    // ---- Tokenizer ----
    /// Tokenizer the router uses: a tokenizer.json file or the directory holding it (default:
    /// from --model-path; for grpc:// workers, else the workers' own). grpc:// workers get
    /// token ids from it; with http:// workers, prefix_hash hashes the first
    /// --prefix-token-count tokens of the prompt instead of 4 characters per token.
    #[arg(long, value_name = "PATH", help_heading = "Tokenizer")]
    pub tokenizer_path: Option<std::path::PathBuf>,
    /// Model directory whose tokenizer files the router uses (see --tokenizer-path).
    #[arg(long, value_name = "DIR", help_heading = "Tokenizer")]
    pub model_path: Option<std::path::PathBuf>,
    /// Jinja chat template file overriding the tokenizer's own (grpc:// workers).
    #[arg(long, value_name = "FILE", help_heading = "Tokenizer")]
    pub chat_template: Option<std::path::PathBuf>,

    // ---- Image inputs ----
    /// Largest image accepted per image_url content part, in bytes, 1-1073741824: a data: URL's
    /// decoded payload or an http(s) image's body (a larger one is a 400 naming the part).
    #[arg(long, default_value_t = pdrouter_vision::DEFAULT_MAX_IMAGE_BYTES, help_heading = "Image inputs")]
    pub max_image_bytes: u64,
    /// Largest decoded image, in pixels (width x height), 1-268435456; read from the image's
    /// header before it is decoded.
    #[arg(long, default_value_t = pdrouter_vision::DEFAULT_MAX_IMAGE_PIXELS, help_heading = "Image inputs")]
    pub max_image_pixels: u64,
    /// Longest the router spends fetching one http(s) image, redirects and body included, in
    /// seconds, 1-300.
    #[arg(long, default_value_t = DEFAULT_IMAGE_FETCH_TIMEOUT_SECS, help_heading = "Image inputs")]
    pub image_fetch_timeout_secs: u64,
    /// Let image URLs (and their redirects) reach loopback, private, link-local, unique-local
    /// and other non-public addresses; without it such URLs are refused.
    #[arg(long, help_heading = "Image inputs")]
    pub allow_private_image_urls: bool,

    // ---- Policies ----
    /// Routing policy: random, round_robin, power_of_two, cache_aware, consistent_hashing,
    /// prefix_hash, manual, bucket.
    #[arg(long, default_value = "cache_aware", help_heading = "Policies")]
    pub policy: String,
    /// Policy for Prefill selection (defaults to --policy).
    #[arg(long, help_heading = "Policies")]
    pub prefill_policy: Option<String>,
    /// Policy for Decode selection (defaults to --policy).
    #[arg(long, help_heading = "Policies")]
    pub decode_policy: Option<String>,
    /// EPD: policy choosing each image's Encode worker, keyed by the image's content hash:
    /// consistent_hashing (the same image always goes to the same worker), random,
    /// round_robin, power_of_two, cache_aware, manual [default: consistent_hashing; only with
    /// --epd-disaggregation].
    #[arg(long, help_heading = "Policies")]
    pub encode_policy: Option<String>,
    /// cache_aware: prefix match rate above which cache affinity wins, 0-1.
    #[arg(long, default_value_t = 0.3, help_heading = "Policies")]
    pub cache_threshold: f32,
    /// cache_aware: absolute load spread that counts as imbalance, 0-1000000.
    #[arg(long, default_value_t = 64, help_heading = "Policies")]
    pub balance_abs_threshold: u64,
    /// cache_aware: relative load spread that counts as imbalance, 1-1000.
    #[arg(long, default_value_t = 1.5, help_heading = "Policies")]
    pub balance_rel_threshold: f32,
    /// cache_aware: seconds between tree evictions, 1-86400; manual: between idle-key
    /// evictions.
    #[arg(
        long,
        visible_alias = "eviction-interval",
        default_value_t = 120,
        help_heading = "Policies"
    )]
    pub eviction_interval_secs: u64,
    /// cache_aware: maximum characters kept per worker tree, 1-1073741824.
    #[arg(long, default_value_t = 67_108_864, help_heading = "Policies")]
    pub max_tree_size: usize,
    /// prefix_hash: prompt tokens that make the hash key, 1-1048576 (4 characters of text per
    /// token unless a tokenizer is given).
    #[arg(long, default_value_t = 256, help_heading = "Policies")]
    pub prefix_token_count: usize,
    /// prefix_hash: a worker whose load is above this many times the mean is skipped, 1-1000.
    #[arg(long, default_value_t = 1.25, help_heading = "Policies")]
    pub prefix_hash_load_factor: f64,
    /// manual: how a routing key seen for the first time picks its worker: random, min_load
    /// (fewest in-flight requests) or min_group (fewest keys).
    #[arg(long, default_value = "random", help_heading = "Policies")]
    pub assignment_mode: String,
    /// manual: seconds a routing key may go unused before it is forgotten, 1-2592000.
    #[arg(long, default_value_t = 14_400, help_heading = "Policies")]
    pub max_idle_secs: u64,

    // ---- Global limiter ----
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

    // ---- Prefill admission ----
    /// In-flight Prefill requests per Prefill worker (per DP rank), 1-100000; <= 0 disables
    /// admission; auto sizes each worker's limit from its Prefill latencies, within
    /// --prefill-limit-min/--prefill-limit-max.
    #[arg(
        long,
        default_value = "-1",
        allow_negative_numbers = true,
        value_name = "N|auto",
        help_heading = "Prefill admission"
    )]
    pub prefill_max_inflight_requests_per_worker: LimitArg,
    /// In-flight prompt tokens per Prefill worker (per DP rank), 1-1000000000: a request is
    /// admitted to a worker only if its prompt tokens fit what the worker's admitted requests
    /// leave; an idle worker takes any one request. Alone or with the request limit; auto
    /// sizes each worker's budget like the request limit's auto.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "T|auto",
        help_heading = "Prefill admission"
    )]
    pub prefill_max_inflight_tokens_per_worker: Option<LimitArg>,
    /// Smallest limit an auto Prefill limit takes, and where every worker starts, 1-1000000000
    /// (requests, or prompt tokens for an auto token budget; default 1 request, 1024 tokens).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub prefill_limit_min: Option<i64>,
    /// Largest limit an auto Prefill limit takes, 1-1000000000 (requests, at most 100000, or
    /// prompt tokens; default 64 requests, 1048576 tokens).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub prefill_limit_max: Option<i64>,
    /// Router-wide wait-queue depth, 0-1000000 (default 100 when admission is on; 0 = never
    /// wait).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub prefill_queue_size: Option<i64>,
    /// Longest wait for a Prefill slot in seconds, 0-86400 (default 60 when admission is on;
    /// 0 only with a queue size of 0).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub prefill_queue_timeout_secs: Option<i64>,
    /// Share the per-worker Prefill limits with the other router replicas of
    /// --admission-group through this Redis store: redis://[user:pass@]host[:port][/db]
    /// (credentials are never logged). Needs a positive
    /// --prefill-max-inflight-requests-per-worker, which then bounds each worker across the
    /// group.
    #[arg(long, value_name = "URL", help_heading = "Prefill admission")]
    pub admission_store: Option<String>,
    /// Replicas with the same group share limits (default "default"; letters, digits, '-',
    /// '_', '.').
    #[arg(long, value_name = "NAME", help_heading = "Prefill admission")]
    pub admission_group: Option<String>,
    /// Milliseconds between a replica's exchanges with the admission store, 10-1000 (default
    /// 200; while replicas compete for a share, early exchanges too, on average one per
    /// fortieth of it and at least 5 ms, in bursts of at most 4).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub admission_store_interval_ms: Option<i64>,
    /// How long a replica's leases outlive its last exchange in the store, in ms,
    /// 1000-3600000 (default 3000; at least 3 intervals).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub admission_store_lease_ttl_ms: Option<i64>,
    /// Once a replica's leases could have expired without the store: hold (admit nothing;
    /// requests wait or get the usual 429/503) or local (admit up to N / replicas last seen
    /// per worker; the group bound may be exceeded). Default hold.
    #[arg(long, value_name = "hold|local", help_heading = "Prefill admission")]
    pub admission_store_fallback: Option<String>,
    // ---- Priority classes ----
    /// Order the wait queue by priority class (bulk < default < interactive < system, from
    /// X-SMG-Priority): Prefill admission's queue when a Prefill limit is set, else the global
    /// limiter's. Needs one of them.
    #[arg(long, help_heading = "Priority classes")]
    pub priority_scheduler_enabled: bool,
    /// Highest class a request may have unless its tenant is listed in
    /// --priority-scheduler-config: bulk, default, interactive or system [default: default].
    #[arg(long, value_name = "CLASS", help_heading = "Priority classes")]
    pub priority_scheduler_default_max_class: Option<String>,
    /// YAML file with per-class queue size, queue timeout and starvation age
    /// (`classes`) and per-tenant maximum classes (`tenant_policies`).
    #[arg(long, value_name = "FILE", help_heading = "Priority classes")]
    pub priority_scheduler_config: Option<std::path::PathBuf>,
    /// Read each request's tenant from --tenant-header-name (for per-tenant maximum classes);
    /// only when something in front of the router sets that header.
    #[arg(long, help_heading = "Priority classes")]
    pub trust_tenant_header: bool,
    /// The header naming the tenant, read with --trust-tenant-header [default: x-smg-tenant-id].
    #[arg(long, value_name = "HEADER", help_heading = "Priority classes")]
    pub tenant_header_name: Option<String>,

    // ---- Retries ----
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

    // ---- Circuit breaker ----
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

    // ---- Health checks ----
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
    #[arg(long, default_value = "/health", help_heading = "Health checks")]
    pub health_check_endpoint: String,
    /// Start workers ready and never probe them.
    #[arg(long, help_heading = "Health checks")]
    pub disable_health_check: bool,

    // ---- Observability ----
    /// Prometheus listener address.
    #[arg(long, default_value = "0.0.0.0", help_heading = "Observability")]
    pub prometheus_host: IpAddr,
    /// Prometheus listener port, 0-65535 (0 = any free port).
    #[arg(long, default_value_t = 29000, help_heading = "Observability")]
    pub prometheus_port: u16,
    /// Log level: trace, debug, info, warn, error (or a tracing filter).
    #[arg(long, default_value = "info", help_heading = "Observability")]
    pub log_level: String,
    /// Structured JSON logs.
    #[arg(long, help_heading = "Observability")]
    pub log_json: bool,

    // ---- Edge and telemetry (request ids, CORS, TLS, control-plane keys, log files, traces) ----
    /// Request ids, CORS, server TLS, control-plane keys.
    #[command(flatten)]
    pub edge: EdgeArgs,
    /// Log files and OpenTelemetry traces.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
}

impl Cli {
    /// Parses `args`, keeping each `--prefill URL [PORT]` occurrence together. Flags without
    /// a subcommand are `launch`'s; a flag of SMG's that pdrouter deliberately does not take
    /// is refused with what to use instead (see [`UNSUPPORTED_FLAGS`]).
    pub fn try_parse_args<I, T>(args: I) -> Result<Self, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        use clap::{CommandFactory, FromArgMatches};
        let mut args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        if let Some(line) = unsupported_flag(&args) {
            return Err(Self::command().error(clap::error::ErrorKind::UnknownArgument, line));
        }
        let first = args.get(1).and_then(|a| a.to_str());
        if first.is_some_and(|a| a.starts_with("--") && !matches!(a, "--help" | "--version")) {
            args.insert(1, "launch".into());
        }
        let matches = Self::command().try_get_matches_from(args)?;
        let mut cli = Self::from_arg_matches(&matches)?;
        if let (Command::Launch(launch), Some(("launch", sub))) =
            (&mut cli.command, matches.subcommand())
        {
            if let Some(occ) = sub.get_occurrences::<String>("prefill") {
                launch.prefill_groups = occ.map(|o| o.cloned().collect()).collect();
            }
            if let Some(occ) = sub.get_occurrences::<String>("encode") {
                launch.encode_groups = occ.map(|o| o.cloned().collect()).collect();
            }
        }
        Ok(cli)
    }

    /// Parses the process arguments. On error exits like clap (help and version: 0, usage
    /// errors: 2), except that a value a numeric flag cannot take is one line naming the flag
    /// and its range, like an out-of-range value caught by [`Config::validate`].
    pub fn parse_from_env() -> Self {
        Self::try_parse_args(std::env::args_os()).unwrap_or_else(|e| {
            if let Some(line) = numeric_value_error(&e) {
                eprintln!("error: {line}");
                std::process::exit(2);
            }
            e.exit()
        })
    }
}

const MESH: &str = "pdrouter has no router mesh; run one router, or several independent \
    replicas behind a load balancer (each with its own limits and queues). Sharing Prefill \
    admission between replicas through a Redis admission store is planned but not available \
    yet (README: Flags pdrouter does not take)";
const DISCOVERY: &str = "pdrouter does not discover workers in Kubernetes; give them with \
    --worker-urls, or --prefill/--decode, and add or remove them at runtime through the \
    /workers API (README: Flags pdrouter does not take)";

/// SMG flags that pdrouter deliberately does not take, each with what to do instead. Given
/// one, pdrouter exits 2 with that line rather than clap's generic "unexpected argument".
pub const UNSUPPORTED_FLAGS: &[(&str, &str)] = &[
    ("--enable-mesh", MESH),
    ("--mesh-server-name", MESH),
    ("--mesh-host", MESH),
    ("--mesh-advertise-host", MESH),
    ("--mesh-port", MESH),
    ("--mesh-peer-urls", MESH),
    ("--router-selector", MESH),
    ("--service-discovery", DISCOVERY),
    ("--selector", DISCOVERY),
    ("--service-discovery-port", DISCOVERY),
    ("--service-discovery-namespace", DISCOVERY),
    ("--prefill-selector", DISCOVERY),
    ("--decode-selector", DISCOVERY),
    (
        "--priority-scheduler-tenant-metric-top-n",
        "pdrouter labels scheduler metrics with the tenants listed in \
         --priority-scheduler-config and puts every other tenant under 'other', so the number \
         of series is bounded by the file (README: Priority classes)",
    ),
    (
        "--enable-igw",
        "pdrouter has no separate multi-model gateway mode: it always sends a request to the \
         workers serving the model it names, so register the workers of every model with \
         --worker-urls or the /workers API (README: Flags pdrouter does not take)",
    ),
];

/// The refusal line for the first unsupported flag in `args` (as `--flag` or `--flag=...`).
fn unsupported_flag(args: &[std::ffi::OsString]) -> Option<String> {
    args.iter().skip(1).find_map(|a| {
        let a = a.to_str()?;
        let name = a.split_once('=').map_or(a, |(n, _)| n);
        UNSUPPORTED_FLAGS
            .iter()
            .find(|(flag, _)| *flag == name)
            .map(|(flag, instead)| format!("{flag} is not supported: {instead}"))
    })
}

/// For a value clap could not parse as a numeric flag's type (not a number, negative,
/// too large for the type): the one-line message naming the flag and its range.
pub fn numeric_value_error(e: &clap::Error) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) else {
        return None;
    };
    let flag = arg.split_whitespace().next()?;
    let range = flag_range(flag)?;
    let got = match e.get(ContextKind::InvalidValue) {
        Some(ContextValue::String(v)) => format!("'{v}'"),
        _ => "nothing".to_string(),
    };
    let mut msg = range.error(got).0;
    use crate::config::range::{PREFILL_MAX_INFLIGHT, PREFILL_MAX_INFLIGHT_TOKENS};
    if flag == PREFILL_MAX_INFLIGHT.flag || flag == PREFILL_MAX_INFLIGHT_TOKENS.flag {
        msg.push_str(", or auto");
    }
    Some(msg)
}

fn policy(flag: &str, name: &str) -> Result<PolicyKind, ConfigError> {
    PolicyKind::parse(name).ok_or_else(|| {
        ConfigError(format!(
            "{flag} '{name}' is not a policy; use one of {}",
            PolicyKind::NAMES.join(", ")
        ))
    })
}

/// `--encode-policy`: the policies that can rank Encode workers by an image's content hash
/// (prefix_hash needs prompt tokens and bucket prompt lengths, which an image has not).
fn encode_policy(name: &str) -> Result<PolicyKind, ConfigError> {
    let kind = policy("--encode-policy", name)?;
    if matches!(kind, PolicyKind::PrefixHash | PolicyKind::Bucket) {
        return Err(ConfigError(format!(
            "--encode-policy '{name}' cannot choose Encode workers (it needs the prompt); use \
             consistent_hashing, random, round_robin, power_of_two, cache_aware or manual"
        )));
    }
    Ok(kind)
}

fn worker(flag: &str, raw: &str, t: WorkerType) -> Result<WorkerSpec, ConfigError> {
    let url = parse_worker_url(raw).map_err(|e| ConfigError(format!("{flag}: {e}")))?;
    Ok(WorkerSpec {
        url,
        worker_type: t,
        bootstrap_port: None,
        api_key: None,
    })
}

/// Parses the optional second token of `--prefill URL [PORT|none]`.
pub fn parse_bootstrap_port(token: &str) -> Result<Option<u16>, ConfigError> {
    if token.eq_ignore_ascii_case("none") {
        return Ok(None);
    }
    match token.parse::<u32>() {
        Ok(p) if (1..=65535).contains(&p) => Ok(Some(p as u16)),
        _ => Err(ConfigError(format!(
            "--prefill: bootstrap port '{token}' must be a port number 1-65535 or 'none'"
        ))),
    }
}

fn valid_log_level(level: &str) -> bool {
    matches!(
        level.to_ascii_lowercase().as_str(),
        "trace" | "debug" | "info" | "warn" | "warning" | "error" | "off"
    ) || tracing_subscriber::EnvFilter::try_new(level).is_ok() && level.contains('=')
}

impl LaunchArgs {
    /// The priority settings, checked: the class flags need `--priority-scheduler-enabled`,
    /// which needs a queue to order (`governs`); the tenant header is read only when trusted.
    fn priority(&self, governs: bool) -> Result<Option<PrioritySettings>, ConfigError> {
        let given = [
            (
                "--priority-scheduler-default-max-class",
                self.priority_scheduler_default_max_class.is_some(),
            ),
            (
                "--priority-scheduler-config",
                self.priority_scheduler_config.is_some(),
            ),
            ("--trust-tenant-header", self.trust_tenant_header),
            ("--tenant-header-name", self.tenant_header_name.is_some()),
        ];
        if !self.priority_scheduler_enabled {
            return match given.iter().find(|(_, g)| *g) {
                Some((flag, _)) => Err(ConfigError(format!(
                    "{flag} needs --priority-scheduler-enabled"
                ))),
                None => Ok(None),
            };
        }
        if !governs {
            return Err(ConfigError(
                "--priority-scheduler-enabled orders a wait queue, and none is on: give \
                 --prefill-max-inflight-requests-per-worker (or the token budget) in PD mode, or \
                 --max-concurrent-requests"
                    .into(),
            ));
        }
        let max = match &self.priority_scheduler_default_max_class {
            Some(v) => crate::priority::class_flag("--priority-scheduler-default-max-class", v)?,
            None => pdrouter_admission::Priority::Default,
        };
        let mut settings = PrioritySettings::new(max);
        if let Some(path) = &self.priority_scheduler_config {
            crate::priority::load(path, &mut settings)?;
        }
        if self.trust_tenant_header {
            let name = self
                .tenant_header_name
                .as_deref()
                .unwrap_or(crate::priority::DEFAULT_TENANT_HEADER);
            settings.tenant_header = Some(crate::priority::tenant_header(name)?);
        } else if self.tenant_header_name.is_some() {
            return Err(ConfigError(
                "--tenant-header-name needs --trust-tenant-header (without it no tenant is read)"
                    .into(),
            ));
        } else if !settings.tenants.is_empty() {
            return Err(ConfigError(
                "--priority-scheduler-config lists tenant_policies, which need \
                 --trust-tenant-header (tenants come from the tenant header only)"
                    .into(),
            ));
        }
        Ok(Some(settings))
    }

    /// Turns the raw flags into a validated [`Config`].
    pub fn into_config(self) -> Result<Config, ConfigError> {
        if self.pd_disaggregation && self.epd_disaggregation {
            return Err(ConfigError(
                "--pd-disaggregation and --epd-disaggregation exclude each other; choose one"
                    .into(),
            ));
        }
        if !self.encode.is_empty() && !self.epd_disaggregation {
            return Err(ConfigError("--encode needs --epd-disaggregation".into()));
        }
        // EPD is a disaggregated mode like PD: the admission rules are checked as for PD (so
        // the operator learns about every mistake), then the mode itself is refused below.
        let grpc_pd = self
            .prefill
            .iter()
            .chain(&self.decode)
            .any(|u| crate::config::is_grpc_url(u.trim()));
        let grpc_regular = self
            .worker_urls
            .iter()
            .any(|u| crate::config::is_grpc_url(u.trim()));
        let mode = if self.epd_disaggregation {
            Mode::EpdGrpc
        } else if self.pd_disaggregation && grpc_pd {
            Mode::PdGrpc
        } else if self.pd_disaggregation {
            Mode::PdHttp
        } else if grpc_regular {
            Mode::RegularGrpc
        } else {
            Mode::Regular
        };
        if !mode.is_pd() && (!self.prefill.is_empty() || !self.decode.is_empty()) {
            return Err(ConfigError(
                "--prefill and --decode need --pd-disaggregation".into(),
            ));
        }
        if !valid_log_level(&self.log_level) {
            return Err(ConfigError(format!(
                "--log-level '{}' is not one of trace, debug, info, warn, error",
                self.log_level
            )));
        }
        let mut workers = Vec::new();
        for raw in &self.worker_urls {
            workers.push(worker("--worker-urls", raw, WorkerType::Regular)?);
        }
        for occurrence in &self.prefill_groups {
            let mut spec = worker("--prefill", &occurrence[0], WorkerType::Prefill)?;
            if let Some(port) = occurrence.get(1) {
                spec.bootstrap_port = parse_bootstrap_port(port)?;
            }
            workers.push(spec);
        }
        for raw in &self.decode {
            workers.push(worker("--decode", raw, WorkerType::Decode)?);
        }
        for occurrence in &self.encode_groups {
            let mut spec = worker("--encode", &occurrence[0], WorkerType::Encode)?;
            if let Some(port) = occurrence.get(1) {
                spec.bootstrap_port = Some(
                    port.trim()
                        .parse::<u16>()
                        .ok()
                        .filter(|p| *p > 0)
                        .ok_or_else(|| {
                            ConfigError(format!(
                                "--encode bootstrap port '{port}' must be a port number 1-65535"
                            ))
                        })?,
                );
            }
            workers.push(spec);
        }
        if workers.is_empty() && !mode.is_pd() {
            return Err(ConfigError(
                "no workers: give --worker-urls URL..., or --pd-disaggregation with --prefill and --decode"
                    .into(),
            ));
        }
        let base = policy("--policy", &self.policy)?;
        let prefill_policy = match &self.prefill_policy {
            Some(p) => policy("--prefill-policy", p)?,
            None => base,
        };
        let decode_policy = match &self.decode_policy {
            Some(p) => policy("--decode-policy", p)?,
            None => base,
        };
        let encode_policy = match &self.encode_policy {
            Some(_) if !self.epd_disaggregation => {
                return Err(ConfigError(
                    "--encode-policy needs --epd-disaggregation (only EPD has Encode workers)"
                        .into(),
                ));
            }
            Some(name) => encode_policy(name)?,
            None => PolicyKind::ConsistentHashing,
        };
        let assignment_mode = AssignmentMode::parse(&self.assignment_mode).ok_or_else(|| {
            ConfigError(format!(
                "--assignment-mode '{}' is not one of {}",
                self.assignment_mode,
                AssignmentMode::NAMES.join(", ")
            ))
        })?;
        let limiter = RawLimiter {
            max_concurrent: self.max_concurrent_requests,
            queue_size: self.queue_size,
            queue_timeout_secs: self.queue_timeout_secs,
            tokens_per_second: self.rate_limit_tokens_per_second,
        }
        .resolve()?;
        let startup_wait = (self.worker_startup_timeout_secs.is_some()
            || self.worker_startup_check_interval.is_some())
        .then(|| StartupWait {
            timeout: Duration::from_secs(
                self.worker_startup_timeout_secs
                    .unwrap_or(DEFAULT_WORKER_STARTUP_TIMEOUT_SECS),
            ),
            check_interval: Duration::from_secs(
                self.worker_startup_check_interval
                    .unwrap_or(DEFAULT_WORKER_STARTUP_CHECK_INTERVAL_SECS),
            ),
        });
        let grpc_runtime = self
            .runtime
            .as_deref()
            .and_then(crate::grpc::runtime::Runtime::parse);
        let mut model_aliases = Vec::new();
        for raw in &self.model_alias {
            let Some((alias, canonical)) = raw.split_once('=') else {
                return Err(ConfigError(format!(
                    "--model-alias '{raw}' must be ALIAS=MODEL"
                )));
            };
            model_aliases.push((alias.trim().to_string(), canonical.trim().to_string()));
        }
        let admission: Option<AdmissionSettings> = RawAdmission {
            max_inflight: self.prefill_max_inflight_requests_per_worker.number(),
            max_inflight_tokens: self
                .prefill_max_inflight_tokens_per_worker
                .map(LimitArg::number),
            auto: RawAuto {
                requests: self.prefill_max_inflight_requests_per_worker == LimitArg::Auto,
                tokens: self.prefill_max_inflight_tokens_per_worker == Some(LimitArg::Auto),
                min: self.prefill_limit_min,
                max: self.prefill_limit_max,
            },
            queue_size: self.prefill_queue_size,
            queue_timeout_secs: self.prefill_queue_timeout_secs,
        }
        .resolve(mode)?;
        let priority = self.priority(admission.is_some() || limiter.is_some())?;
        let mut admission = admission;
        let mut limiter = limiter;
        // The classes order one queue: admission's when it is on, else the limiter's.
        if let Some(p) = &priority {
            match (&mut admission, &mut limiter) {
                (Some(a), _) => a.priorities = Some(p.classes(a.queue_size, a.queue_timeout)),
                (None, Some(l)) => l.priorities = Some(p.classes(l.queue_size, l.queue_timeout)),
                (None, None) => {}
            }
        }
        let admission_store = RawStore {
            url: self.admission_store,
            group: self.admission_group,
            interval_ms: self.admission_store_interval_ms,
            lease_ttl_ms: self.admission_store_lease_ttl_ms,
            fallback: self.admission_store_fallback,
        }
        .resolve(admission.as_ref())?;
        if self.health_check_endpoint.is_empty() {
            return Err(ConfigError(
                "--health-check-endpoint must not be empty".into(),
            ));
        }
        if self.api_key.as_deref() == Some("") {
            return Err(ConfigError("--api-key must not be empty".into()));
        }
        if let Some(key) = &self.api_key
            && crate::proxy::forward::bearer(key).is_none()
        {
            return Err(ConfigError(
                "--api-key must be usable in an HTTP header: visible ASCII and spaces".into(),
            ));
        }
        let edge = self.edge.into_edge()?;
        self.telemetry.check()?;
        let config = Config {
            host: self.host,
            port: self.port,
            mode,
            workers,
            policy: base,
            prefill_policy,
            decode_policy,
            encode_policy,
            cache: CacheAwareConfig {
                cache_threshold: self.cache_threshold,
                balance_abs_threshold: self.balance_abs_threshold,
                balance_rel_threshold: self.balance_rel_threshold,
                max_tree_size: self.max_tree_size,
            },
            eviction_interval: Duration::from_secs(self.eviction_interval_secs),
            api_key: self.api_key,
            request_timeout: Duration::from_secs(self.request_timeout_secs),
            max_payload_size: self.max_payload_size,
            shutdown_grace: Duration::from_secs(self.shutdown_grace_period_secs),
            client_header_timeout: Duration::from_secs(self.client_header_timeout_secs),
            max_connections: self.max_connections.unwrap_or(DEFAULT_MAX_CONNECTIONS),
            retry: RetryConfig {
                max_attempts: if self.disable_retries {
                    1
                } else {
                    self.retry_max_retries
                },
                initial_backoff: Duration::from_millis(self.retry_initial_backoff_ms),
                max_backoff: Duration::from_millis(self.retry_max_backoff_ms),
                multiplier: self.retry_backoff_multiplier,
                jitter: self.retry_jitter_factor,
            },
            breaker: BreakerConfig {
                enabled: !self.disable_circuit_breaker,
                failure_threshold: self.cb_failure_threshold,
                success_threshold: self.cb_success_threshold,
                timeout: Duration::from_secs(self.cb_timeout_duration_secs),
                window: Duration::from_secs(self.cb_window_duration_secs),
            },
            health: HealthConfig {
                enabled: !self.disable_health_check,
                interval: Duration::from_secs(self.health_check_interval_secs),
                timeout: Duration::from_secs(self.health_check_timeout_secs),
                failure_threshold: self.health_failure_threshold,
                success_threshold: self.health_success_threshold,
                endpoint: self.health_check_endpoint,
            },
            prometheus: Some((self.prometheus_host, self.prometheus_port)),
            dp_aware: self.dp_aware,
            priority,
            admission,
            admission_store,
            prefill_grace_after_decode: PREFILL_GRACE_AFTER_DECODE,
            tokenizer: TokenizerSource {
                tokenizer_path: self.tokenizer_path,
                model_path: self.model_path,
                chat_template: self.chat_template,
            },
            edge,
            prefix_hash: PrefixHashConfig {
                prefix_token_count: self.prefix_token_count,
                load_factor: self.prefix_hash_load_factor,
            },
            manual: ManualConfig {
                assignment_mode,
                max_idle_secs: self.max_idle_secs,
            },
            limiter,
            startup_wait,
            model_aliases,
            grpc_runtime,
            images: ImageConfig {
                max_bytes: self.max_image_bytes,
                max_pixels: self.max_image_pixels,
                fetch_timeout: Duration::from_secs(self.image_fetch_timeout_secs),
                allow_private_urls: self.allow_private_image_urls,
            },
        };
        config.validate()?;
        Ok(config)
    }
}

// ---- Edge and telemetry flags ----

/// Flags of the client-facing edge (see [`crate::edge`]).
#[derive(Debug, Args)]
pub struct EdgeArgs {
    /// Headers read for the request id, in order; the first valid one wins, else a fresh id.
    /// The id is echoed as `x-request-id` [default: x-request-id x-correlation-id x-trace-id
    /// request-id].
    #[arg(long, num_args = 1.., value_name = "HEADER", help_heading = "Edge")]
    pub request_id_headers: Vec<String>,
    /// Browser origins allowed to call the router (scheme://host[:port], or * for any);
    /// preflights are answered and allowed origins get Access-Control-Allow-Origin.
    #[arg(long, num_args = 1.., value_name = "ORIGIN", help_heading = "Edge")]
    pub cors_allowed_origins: Vec<String>,
    /// Serve HTTPS with this PEM certificate chain (needs --tls-key-path).
    #[arg(long, value_name = "FILE", help_heading = "Edge")]
    pub tls_cert_path: Option<std::path::PathBuf>,
    /// PEM private key of --tls-cert-path.
    #[arg(long, value_name = "FILE", help_heading = "Edge")]
    pub tls_key_path: Option<std::path::PathBuf>,
    /// Control-plane keys 'id:name:role:key', role admin or user; when given, /workers needs
    /// an admin key (user: 403) instead of --api-key.
    #[arg(long, num_args = 1.., value_name = "ID:NAME:ROLE:KEY", help_heading = "Edge")]
    pub control_plane_api_keys: Vec<String>,
}

impl EdgeArgs {
    fn into_edge(self) -> Result<crate::edge::EdgeConfig, ConfigError> {
        use crate::edge;
        Ok(edge::EdgeConfig {
            request_id_headers: edge::request_id_headers(&self.request_id_headers)?,
            cors: edge::cors(&self.cors_allowed_origins)?,
            tls: edge::server_tls(self.tls_cert_path.as_deref(), self.tls_key_path.as_deref())?,
            control_plane_keys: edge::control_plane_keys(&self.control_plane_api_keys)?,
        })
    }
}

/// Log-file and tracing flags (see [`crate::telemetry`]).
#[derive(Debug, Args)]
pub struct TelemetryArgs {
    /// Also write logs to daily-rotated files in this directory (pdrouter.log.YYYY-MM-DD;
    /// the newest 7 are kept).
    #[arg(long, value_name = "DIR", help_heading = "Observability")]
    pub log_dir: Option<std::path::PathBuf>,
    /// Export OpenTelemetry spans over OTLP/gRPC: one per request, with children for the
    /// admission wait and each worker leg.
    #[arg(long, help_heading = "Observability")]
    pub enable_trace: bool,
    /// OTLP/gRPC collector for --enable-trace, host:port or http://host:port
    /// [default: localhost:4317].
    #[arg(long, value_name = "HOST:PORT", help_heading = "Observability")]
    pub otlp_traces_endpoint: Option<String>,
}

/// Where spans go when `--otlp-traces-endpoint` is not given.
const DEFAULT_OTLP_ENDPOINT: &str = "localhost:4317";

impl TelemetryArgs {
    fn endpoint(&self) -> &str {
        self.otlp_traces_endpoint
            .as_deref()
            .unwrap_or(DEFAULT_OTLP_ENDPOINT)
    }

    /// Settings that are valid but do nothing as given, one warning line each.
    pub fn unused(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        if self.otlp_traces_endpoint.is_some() && !self.enable_trace {
            out.push("--otlp-traces-endpoint has no effect without --enable-trace; no spans are exported");
        }
        out
    }

    fn check(&self) -> Result<(), ConfigError> {
        crate::telemetry::otlp_endpoint(self.endpoint())?;
        if let Some(dir) = &self.log_dir {
            crate::telemetry::check_log_dir(dir)?;
        }
        Ok(())
    }

    /// What [`crate::telemetry::init`] needs.
    pub fn settings(&self, level: &str, json: bool) -> crate::telemetry::LogSettings {
        crate::telemetry::LogSettings {
            level: level.to_string(),
            json,
            dir: self.log_dir.clone(),
            // Checked by `into_config` already; the scheme-less form gets `http://` here.
            otlp_endpoint: self
                .enable_trace
                .then(|| crate::telemetry::otlp_endpoint(self.endpoint()).ok())
                .flatten(),
        }
    }
}

/// A Prefill limit flag's value: a number, or `auto` (sized at run time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitArg {
    /// A fixed limit (`<= 0`: none).
    Number(i64),
    /// Sized per worker at run time.
    Auto,
}

impl LimitArg {
    /// The number, with `auto` as 0 (its limit comes from the `auto` settings).
    fn number(self) -> i64 {
        match self {
            LimitArg::Number(n) => n,
            LimitArg::Auto => 0,
        }
    }
}

impl std::str::FromStr for LimitArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(LimitArg::Auto);
        }
        s.trim()
            .parse()
            .map(LimitArg::Number)
            .map_err(|_| format!("'{s}' is neither a whole number nor auto"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<Config, String> {
        let mut full = vec!["pdrouter", "launch"];
        full.extend_from_slice(args);
        let cli = Cli::try_parse_args(full)
            .map_err(|e| numeric_value_error(&e).unwrap_or_else(|| e.to_string()))?;
        match cli.command {
            Command::Launch(a) => a.into_config().map_err(|e| e.0),
            Command::Demo(_) => unreachable!(),
        }
    }

    fn telemetry(args: &[&str]) -> TelemetryArgs {
        let mut full = vec!["pdrouter", "launch", "--worker-urls", "http://w:1"];
        full.extend_from_slice(args);
        match Cli::try_parse_args(full).unwrap().command {
            Command::Launch(a) => a.telemetry,
            Command::Demo(_) => unreachable!(),
        }
    }

    #[test]
    fn an_otlp_endpoint_without_tracing_is_reported_unused() {
        let t = telemetry(&["--otlp-traces-endpoint", "collector:4317"]);
        assert_eq!(t.unused().len(), 1);
        assert!(t.unused()[0].contains("--enable-trace"));
        assert_eq!(t.settings("info", false).otlp_endpoint, None);
        let t = telemetry(&["--otlp-traces-endpoint", "collector:4317", "--enable-trace"]);
        assert!(t.unused().is_empty());
        assert_eq!(
            t.settings("info", false).otlp_endpoint.as_deref(),
            Some("http://collector:4317")
        );
        // Tracing alone goes to the default collector.
        let t = telemetry(&["--enable-trace"]);
        assert!(t.unused().is_empty());
        assert_eq!(
            t.settings("info", false).otlp_endpoint.as_deref(),
            Some("http://localhost:4317")
        );
    }

    #[test]
    fn pd_flags_with_bootstrap_ports() {
        let c = parse(&[
            "--pd-disaggregation",
            "--prefill",
            "http://p1:8000",
            "9000",
            "--prefill",
            "http://p2:8000",
            "none",
            "--prefill",
            "http://p3:8000",
            "--decode",
            "http://d1:8000",
        ])
        .unwrap();
        assert_eq!(c.mode, Mode::PdHttp);
        let ports: Vec<_> = c.workers.iter().map(|w| w.bootstrap_port).collect();
        assert_eq!(ports, vec![Some(9000), None, None, None]);
        assert_eq!(c.port, 30000);
        assert_eq!(c.policy, PolicyKind::CacheAware);
        assert!(c.admission.is_none());
    }

    #[test]
    fn invalid_configurations_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (
                &["--pd-disaggregation", "--decode", "http://d:1"],
                "--prefill",
            ),
            (
                &["--pd-disaggregation", "--prefill", "http://p:1"],
                "--decode",
            ),
            (&["--worker-urls", "ftp://x"], "http://"),
            (
                &["--worker-urls", "http://x:1", "--policy", "fastest"],
                "--policy",
            ),
            (
                &[
                    "--pd-disaggregation",
                    "--prefill",
                    "http://p:1",
                    "70000",
                    "--decode",
                    "http://d:1",
                ],
                "bootstrap port",
            ),
            (
                &["--worker-urls", "http://x:1", "--prefill-queue-size", "3"],
                "--prefill-queue-size",
            ),
            (
                &[
                    "--worker-urls",
                    "http://x:1",
                    "--prefill-max-inflight-requests-per-worker",
                    "2",
                ],
                "PD mode",
            ),
            (&[], "no workers"),
            (&["--encode", "http://e:1", "9000"], "--encode needs"),
            (
                &[
                    "--pd-disaggregation",
                    "--epd-disaggregation",
                    "--prefill",
                    "http://p:1",
                    "--decode",
                    "http://d:1",
                ],
                "exclude each other",
            ),
            (
                &["--worker-urls", "http://x:1", "--retry-jitter-factor", "2"],
                "--retry-jitter-factor",
            ),
            (
                &["--worker-urls", "http://x:1", "--log-level", "loud"],
                "--log-level",
            ),
        ];
        for (args, needle) in cases {
            let err = parse(args).unwrap_err();
            assert!(err.contains(needle), "{args:?}: {err}");
        }
    }

    #[test]
    fn runtime_hint_names_a_known_runtime_of_grpc_workers() {
        use crate::grpc::runtime::Runtime;
        let c = parse(&["--worker-urls", "grpc://h:1", "--runtime", "tokenspeed"]).unwrap();
        assert_eq!(c.grpc_runtime, Some(Runtime::TokenSpeed));
        let c = parse(&["--worker-urls", "grpc://h:1", "--backend", "sglang"]).unwrap();
        assert_eq!(c.grpc_runtime, Some(Runtime::Sglang));
        let c = parse(&["--worker-urls", "grpc://h:1"]).unwrap();
        assert_eq!(c.grpc_runtime, None);
        let e = parse(&["--worker-urls", "grpc://h:1", "--runtime", "vllm"]).unwrap_err();
        assert!(e.contains("vllm"), "{e}");
        let e = parse(&["--worker-urls", "http://h:1", "--runtime", "tokenspeed"]).unwrap_err();
        assert!(
            e.contains("--runtime tokenspeed applies to grpc:// workers"),
            "{e}"
        );
    }

    #[test]
    fn epd_takes_grpc_workers_of_three_roles_and_the_pd_rules() {
        let epd = [
            "--epd-disaggregation",
            "--encode",
            "grpc://e:1",
            "9000",
            "--encode",
            "grpc://e:2",
            "--prefill",
            "grpc://p:1",
            "--decode",
            "grpc://d:1",
        ];
        let c = parse(&epd).unwrap();
        assert_eq!(c.mode, Mode::EpdGrpc);
        let encode: Vec<_> = c
            .workers
            .iter()
            .filter(|w| w.worker_type == WorkerType::Encode)
            .map(|w| (w.url.as_str(), w.bootstrap_port))
            .collect();
        assert_eq!(encode, [("grpc://e:1", Some(9000)), ("grpc://e:2", None)]);
        let http: Vec<String> = epd
            .iter()
            .map(|a| a.replace("grpc://", "http://"))
            .collect();
        let http: Vec<&str> = http.iter().map(String::as_str).collect();
        assert!(parse(&http).unwrap_err().contains("transport"));
        let bad_port = [&epd[..3], &["none"], &epd[4..]].concat();
        assert!(
            parse(&bad_port)
                .unwrap_err()
                .contains("--encode bootstrap port")
        );
        let no_encode = [&epd[..1], &epd[6..]].concat();
        assert!(parse(&no_encode).unwrap_err().contains("--encode"));
        let with_both = [
            &epd[..],
            &[
                "--prefill-max-inflight-requests-per-worker",
                "2",
                "--priority-scheduler-enabled",
            ],
        ]
        .concat();
        // Admission and priority classes compose in EPD as in PD.
        let both = parse(&with_both).unwrap();
        assert!(both.admission.unwrap().priorities.is_some());
    }

    #[test]
    fn priority_classes_order_admission_else_the_limiter() {
        use pdrouter_admission::Priority;
        let pd = [
            "--pd-disaggregation",
            "--prefill",
            "http://p:1",
            "--decode",
            "http://d:1",
            "--max-concurrent-requests",
            "8",
            "--queue-size",
            "7",
        ];
        let with_admission = [
            &pd[..],
            &[
                "--prefill-max-inflight-requests-per-worker",
                "1",
                "--prefill-queue-size",
                "9",
                "--priority-scheduler-enabled",
                "--priority-scheduler-default-max-class",
                "interactive",
            ],
        ]
        .concat();
        let cfg = parse(&with_admission).unwrap();
        let classes = cfg
            .admission
            .unwrap()
            .priorities
            .expect("admission ordered");
        assert_eq!(
            classes.get(Priority::Bulk).queue_size,
            9,
            "the admission flag"
        );
        assert_eq!(
            cfg.limiter.unwrap().priorities,
            None,
            "the limiter stays one FIFO"
        );
        let p = cfg.priority.unwrap();
        assert_eq!(p.default_max_class, Priority::Interactive);
        assert_eq!(p.tenant_header, None, "not trusted");
        let limiter_only = parse(
            &[
                &pd[..],
                &["--priority-scheduler-enabled", "--trust-tenant-header"],
            ]
            .concat(),
        )
        .unwrap();
        let classes = limiter_only
            .limiter
            .unwrap()
            .priorities
            .expect("limiter ordered");
        assert_eq!(
            classes.get(Priority::System).queue_size,
            7,
            "the limiter flag"
        );
        assert_eq!(
            limiter_only
                .priority
                .unwrap()
                .tenant_header
                .unwrap()
                .as_str(),
            "x-smg-tenant-id"
        );
        assert!(parse(&pd).unwrap().priority.is_none());
    }

    #[test]
    fn admission_flags_parse() {
        let args = [
            &PD_ADMISSION[..7],
            &[
                "--prefill-queue-size",
                "4",
                "--prefill-queue-timeout-secs",
                "30",
            ],
        ]
        .concat();
        let a = parse(&args).unwrap().admission.unwrap();
        assert_eq!((a.max_inflight_per_worker, a.queue_size), (1, 4));
        assert_eq!(a.queue_timeout, Duration::from_secs(30));
    }

    #[test]
    fn auto_limits_are_refused_with_an_admission_store() {
        let store = ["--admission-store", "redis://127.0.0.1:6379"];
        let requests = ["--prefill-max-inflight-requests-per-worker", "auto"];
        let tokens = [
            "--prefill-max-inflight-requests-per-worker",
            "4",
            "--prefill-max-inflight-tokens-per-worker",
            "auto",
        ];
        for limits in [&requests[..], &tokens[..]] {
            let args = [&PD_ADMISSION[..5], limits, &store[..]].concat();
            let err = parse(&args).unwrap_err();
            assert!(err.contains("not auto"), "{err}");
        }
    }

    #[test]
    fn auto_limits_parse() {
        let args = [
            &PD_ADMISSION[..5],
            &[
                "--prefill-max-inflight-requests-per-worker",
                "AUTO",
                "--prefill-limit-min",
                "2",
                "--prefill-limit-max",
                "12",
            ],
        ]
        .concat();
        let a = parse(&args).unwrap().admission.unwrap();
        assert_eq!(a.max_inflight_per_worker, 2);
        assert_eq!(
            a.auto,
            Some(crate::config::AutoConfig {
                unit: crate::config::Unit::Requests,
                min: 2,
                max: 12
            })
        );
        let tokens = [
            &PD_ADMISSION[..5],
            &["--prefill-max-inflight-tokens-per-worker", "auto"],
        ]
        .concat();
        let t = parse(&tokens).unwrap().admission.unwrap();
        assert_eq!(t.auto.map(|a| a.unit), Some(crate::config::Unit::Tokens));
        for bad in ["automatic", "1.5", ""] {
            let args = [
                &PD_ADMISSION[..5],
                &["--prefill-max-inflight-requests-per-worker", bad],
            ]
            .concat();
            let err = parse(&args).unwrap_err();
            assert!(
                err.contains("must be between 1 and 100000, got") && err.ends_with(", or auto"),
                "{bad}: {err}"
            );
        }
    }

    const PD_ADMISSION: &[&str] = &[
        "--pd-disaggregation",
        "--prefill",
        "http://p:1",
        "--decode",
        "http://d:1",
        "--prefill-max-inflight-requests-per-worker",
        "1",
        "--prefill-queue-size",
        "0",
        "--max-concurrent-requests",
        "1",
        "--queue-size",
        "0",
    ];

    /// PD with admission on, and `flag=value` instead of any base setting of that flag.
    fn parse_with(flag: &str, value: &str) -> Result<Config, String> {
        let mut args: Vec<&str> = Vec::new();
        let mut base = PD_ADMISSION.iter();
        while let Some(&a) = base.next() {
            if a == flag {
                base.next();
            } else {
                args.push(a);
            }
        }
        let arg = format!("{flag}={value}");
        if flag.starts_with("--admission-store-") {
            args.push("--admission-store=redis://127.0.0.1:6379");
        }
        args.push(&arg);
        // The bounds of an auto limit need one (the token budget's, whose range is theirs).
        if flag.starts_with("--prefill-limit-") {
            args.push("--prefill-max-inflight-tokens-per-worker=auto");
        }
        parse(&args)
    }

    #[test]
    fn every_numeric_flag_states_its_range_in_its_help() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let launch = cli.find_subcommand("launch").unwrap();
        let text = [
            "host",
            "api_key",
            "worker_urls",
            "prefill",
            "decode",
            "encode",
            "policy",
            "prefill_policy",
            "decode_policy",
            "encode_policy",
            "health_check_endpoint",
            "prometheus_host",
            "log_level",
            "tokenizer_path",
            "model_path",
            "runtime",
            "chat_template",
            "request_id_headers",
            "cors_allowed_origins",
            "tls_cert_path",
            "tls_key_path",
            "control_plane_api_keys",
            "log_dir",
            "otlp_traces_endpoint",
            "assignment_mode",
            "model_alias",
            "admission_store",
            "admission_group",
            "admission_store_fallback",
            "priority_scheduler_default_max_class",
            "priority_scheduler_config",
            "tenant_header_name",
        ];
        let mut seen = 0;
        for arg in launch.get_arguments() {
            let (Some(long), true) = (arg.get_long(), arg.get_action().takes_values()) else {
                continue;
            };
            if text.contains(&arg.get_id().as_str()) {
                continue;
            }
            let flag = format!("--{long}");
            let range = flag_range(&flag)
                .unwrap_or_else(|| panic!("{flag} takes a value but has no range"));
            let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
            assert!(
                help.contains(&range.text()),
                "{flag}: help '{help}' does not state {}",
                range.text()
            );
            seen += 1;
        }
        assert_eq!(
            seen,
            crate::config::FLAG_RANGES.len(),
            "a range without a flag"
        );
    }

    #[test]
    fn each_range_is_inclusive_and_one_step_outside_is_one_line_naming_it() {
        for r in crate::config::FLAG_RANGES {
            let with = |v: String| parse_with(r.flag, &v);
            for inside in [r.min, r.max] {
                if let Err(e) = with(inside.to_string()) {
                    panic!("{} {inside}: {e}", r.flag);
                }
            }
            let step = if r.max <= 1.0 { 0.5 } else { 1.0 };
            for outside in [r.min - step, r.max + step] {
                if (r.flag == "--prefill-max-inflight-requests-per-worker"
                    || r.flag == "--max-concurrent-requests")
                    && outside <= 0.0
                {
                    continue; // turns admission (the limiter) off, a valid setting
                }
                let err = with(outside.to_string()).unwrap_err();
                let want = format!("{} must be between {} and {}", r.flag, r.min, r.max);
                assert!(err.starts_with(&want), "{} {outside}: {err}", r.flag);
                assert!(!err.contains('\n'), "{err}");
            }
        }
    }

    #[test]
    fn values_beyond_the_flag_type_are_one_line_naming_the_range() {
        for (flag, value) in [
            ("--request-timeout-secs", "18446744073709551616"),
            ("--prefill-queue-timeout-secs", "99999999999999999999"),
            ("--cb-timeout-duration-secs", "-1"),
            ("--retry-max-retries", "lots"),
            ("--port", "70000"),
        ] {
            let err = parse_with(flag, value).unwrap_err();
            let range = flag_range(flag).unwrap();
            assert_eq!(err, range.error(format!("'{value}'")).0);
        }
        for (flag, value) in [
            ("--retry-backoff-multiplier", "NaN"),
            ("--cache-threshold", "inf"),
        ] {
            let err = parse_with(flag, value).unwrap_err();
            assert!(err.starts_with(&format!("{flag} must be between")), "{err}");
        }
    }

    #[test]
    fn connection_limits_parse_with_their_defaults() {
        let w = ["--worker-urls", "http://x:1"];
        let c = parse(&w).unwrap();
        assert_eq!(c.client_header_timeout, Duration::from_secs(30));
        assert_eq!(c.max_connections, 32_768);
        let c = parse(&[
            w[0],
            w[1],
            "--client-header-timeout-secs",
            "5",
            "--max-connections",
            "10",
        ])
        .unwrap();
        assert_eq!(c.client_header_timeout, Duration::from_secs(5));
        assert_eq!(c.max_connections, 10);
    }

    #[test]
    fn encode_policy_defaults_to_consistent_hashing_and_refuses_prompt_policies() {
        let epd = [
            "--epd-disaggregation",
            "--encode",
            "grpc://e:1",
            "--prefill",
            "grpc://p:1",
            "--decode",
            "grpc://d:1",
        ];
        let c = parse(&epd).unwrap();
        assert_eq!(c.encode_policy, PolicyKind::ConsistentHashing);
        let args = [&epd[..], &["--encode-policy", "power_of_two"]].concat();
        assert_eq!(parse(&args).unwrap().encode_policy, PolicyKind::PowerOfTwo);
        for bad in ["prefix_hash", "bucket", "nope"] {
            let args = [&epd[..], &["--encode-policy", bad]].concat();
            let err = parse(&args).unwrap_err();
            assert!(err.contains("--encode-policy"), "{err}");
        }
        // Outside EPD there is nothing for it to choose: refused, not ignored.
        let args = ["--worker-urls", "http://w:1", "--encode-policy", "random"];
        assert!(
            parse(&args)
                .unwrap_err()
                .contains("needs --epd-disaggregation")
        );
    }

    #[test]
    fn image_flags_parse_into_the_image_limits() {
        let w = ["--worker-urls", "http://x:1"];
        let c = parse(&w).unwrap();
        assert_eq!(c.images, crate::config::ImageConfig::default());
        assert_eq!(c.images.max_bytes, 20 * 1024 * 1024);
        assert_eq!(c.images.max_pixels, 1 << 25);
        assert_eq!(c.images.fetch_timeout, Duration::from_secs(10));
        assert!(!c.images.allow_private_urls);
        let c = parse(&[
            w[0],
            w[1],
            "--max-image-bytes",
            "1000",
            "--max-image-pixels",
            "4096",
            "--image-fetch-timeout-secs",
            "3",
            "--allow-private-image-urls",
        ])
        .unwrap();
        assert_eq!(c.images.max_bytes, 1000);
        assert_eq!(c.images.max_pixels, 4096);
        assert_eq!(c.images.fetch_timeout, Duration::from_secs(3));
        assert!(c.images.allow_private_urls);
    }

    #[test]
    fn smg_spellings_and_new_flags_parse() {
        let w = ["--worker-urls", "http://x:1"];
        let c = parse(&[w[0], w[1], "--eviction-interval", "30"]).unwrap();
        assert_eq!(c.eviction_interval, Duration::from_secs(30));
        let c = parse(&[
            w[0],
            w[1],
            "--policy",
            "manual",
            "--assignment-mode",
            "min_group",
            "--max-idle-secs",
            "60",
            "--prefix-token-count",
            "8",
            "--prefix-hash-load-factor",
            "2",
            "--max-concurrent-requests",
            "4",
            "--rate-limit-tokens-per-second",
            "10",
            "--model-alias",
            "a=m",
            "--model-alias",
            "b = m",
            "--worker-startup-timeout-secs",
            "5",
        ])
        .unwrap();
        assert_eq!(c.policy, PolicyKind::Manual);
        assert_eq!(c.manual.assignment_mode, AssignmentMode::MinGroup);
        assert_eq!(c.manual.max_idle_secs, 60);
        assert_eq!(c.prefix_hash.prefix_token_count, 8);
        let l = c.limiter.unwrap();
        assert_eq!((l.max_concurrent, l.queue_size), (4, 100));
        assert_eq!(l.queue_timeout, Duration::from_secs(60));
        assert_eq!(l.tokens_per_second, Some(10.0));
        assert_eq!(c.model_aliases[1], ("b".to_string(), "m".to_string()));
        assert_eq!(c.resolve_model("a"), "m");
        assert_eq!(c.resolve_model("m"), "m");
        let wait = c.startup_wait.unwrap();
        assert_eq!(wait.timeout, Duration::from_secs(5));
        assert_eq!(wait.check_interval, Duration::from_secs(30));
        assert!(parse(&w).unwrap().limiter.is_none());
        assert!(parse(&w).unwrap().startup_wait.is_none());
        // --model-path is accepted with http:// workers (prefix_hash's tokenizer).
        assert!(parse(&[w[0], w[1], "--model-path", "/m"]).is_ok());
    }

    #[test]
    fn bad_new_flags_name_the_flag() {
        let w = ["--worker-urls", "http://x:1"];
        for (extra, needle) in [
            (&["--assignment-mode", "sticky"][..], "--assignment-mode"),
            (
                &["--queue-size", "5"][..],
                "positive --max-concurrent-requests",
            ),
            (
                &["--rate-limit-tokens-per-second", "5"][..],
                "positive --max-concurrent-requests",
            ),
            (
                &[
                    "--max-concurrent-requests",
                    "2",
                    "--queue-timeout-secs",
                    "0",
                ][..],
                "--queue-timeout-secs 0",
            ),
            (&["--model-alias", "nodelimiter"][..], "ALIAS=MODEL"),
            (&["--model-alias", "a=a"][..], "two different"),
            (
                &["--model-alias", "a=m", "--model-alias", "a=n"][..],
                "twice",
            ),
            (&["--chat-template", "/t.jinja"][..], "--chat-template"),
        ] {
            let err = parse(&[&w[..], extra].concat()).unwrap_err();
            assert!(err.contains(needle), "{extra:?}: {err}");
        }
    }
}
