//! Command line (the only module that knows clap).
//!
//! Flag names and defaults follow SMG's `launch` so operators can move their command lines over
//! unchanged. `launch`'s flags come in groups, one file each: a group declares its flags
//! (names, defaults, help text and heading) and turns them into its part of the [`Config`],
//! checking its own rules, so adding or checking a flag touches one file.
//! [`LaunchArgs::into_config`] composes the parts; the rules that tie flags of different groups
//! together are in `rules`, and the rules any configuration must keep are config's
//! ([`Config::validate`]). `--help` lists the flags in declaration order, groups in the order
//! [`LaunchArgs`] flattens them, so moving a field moves its line in the help (a golden-file
//! test pins the text).
//!
//! From this crate the module uses only `config`; besides clap it names the policy, admission
//! and vision crates' types and defaults.

mod admission;
mod demo;
mod discovery;
mod edge;
mod inputs;
mod limiter;
mod listener;
mod policies;
mod priority;
mod resilience;
mod rules;
mod store;
mod telemetry;
#[cfg(test)]
mod tests;
mod unsupported;
mod workers;

use clap::{Parser, Subcommand};

pub use admission::{AdmissionArgs, LimitArg};
pub use demo::DemoArgs;
pub use edge::EdgeArgs;
pub use inputs::{ImageArgs, TokenizerArgs};
pub use limiter::LimiterArgs;
pub use listener::ListenerArgs;
pub use policies::PolicyArgs;
pub use priority::PriorityArgs;
pub use resilience::{BreakerArgs, HealthArgs, RetryArgs};
pub use store::StoreArgs;
pub use telemetry::TelemetryArgs;
pub use unsupported::UNSUPPORTED_FLAGS;
pub use workers::{WorkerArgs, parse_bootstrap_port};

use crate::config::{Config, ConfigError, PREFILL_GRACE_AFTER_DECODE, flag_range};

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

/// `pdrouter launch` flags, one group per concern, in the order `--help` lists them (each
/// group names its help heading). A field's name is its clap id (`prefill` and `encode` are
/// read back by id in [`Cli::try_parse_args`]), so a flag keeps its field name wherever it
/// is declared.
#[derive(Debug, clap::Args)]
pub struct LaunchArgs {
    /// Address, port, body and time limits, connections, the inference API key.
    #[command(flatten)]
    pub listener: ListenerArgs,
    /// Mode and workers.
    #[command(flatten)]
    pub workers: WorkerArgs,
    /// Kubernetes pod discovery.
    #[command(flatten)]
    pub discovery: discovery::DiscoveryArgs,
    /// The router's tokenizer.
    #[command(flatten)]
    pub tokenizer: TokenizerArgs,
    /// Limits on image inputs.
    #[command(flatten)]
    pub images: ImageArgs,
    /// Routing policies and their knobs.
    #[command(flatten)]
    pub policies: PolicyArgs,
    /// The global request limiter.
    #[command(flatten)]
    pub limiter: LimiterArgs,
    /// Prefill admission: per-worker limits and the wait queue.
    #[command(flatten)]
    pub admission: AdmissionArgs,
    /// The admission store shared with other replicas.
    #[command(flatten)]
    pub store: StoreArgs,
    /// Priority classes.
    #[command(flatten)]
    pub priority: PriorityArgs,
    /// Retries.
    #[command(flatten)]
    pub retry: RetryArgs,
    /// Circuit breakers.
    #[command(flatten)]
    pub breaker: BreakerArgs,
    /// Health checks.
    #[command(flatten)]
    pub health: HealthArgs,
    /// Prometheus listener, logs and traces.
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    /// Request ids, CORS, server TLS, control-plane keys.
    #[command(flatten)]
    pub edge: EdgeArgs,
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
        if let Some(line) = unsupported::unsupported_flag(&args) {
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
                launch.workers.prefill_groups = occ.map(|o| o.cloned().collect()).collect();
            }
            if let Some(occ) = sub.get_occurrences::<String>("encode") {
                launch.workers.encode_groups = occ.map(|o| o.cloned().collect()).collect();
            }
        }
        Ok(cli)
    }

    /// Parses the process arguments. On error exits like clap (help and version: 0, usage
    /// errors: 2), except that a value a numeric flag cannot take is one line naming the flag
    /// and its range, like an out-of-range value caught by [`Config::validate`].
    pub fn parse_from_env() -> Self {
        Self::parse_from(std::env::args_os()).unwrap_or_else(|code| std::process::exit(code.into()))
    }

    /// Parses `args` as [`Cli::parse_from_env`] does, printing what it prints, but returns the
    /// exit code instead of exiting (for callers that own the process, such as the Python
    /// extension).
    pub fn parse_from<I, T>(args: I) -> Result<Self, u8>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        Self::try_parse_args(args).map_err(|e| {
            if let Some(line) = numeric_value_error(&e) {
                eprintln!("error: {line}");
                return 2;
            }
            let _ = e.print();
            // clap's codes are 0 (help, version) and 2 (usage errors).
            u8::try_from(e.exit_code()).unwrap_or(2)
        })
    }
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

impl LaunchArgs {
    /// Turns the raw flags into a validated [`Config`]: each group converts and checks its own
    /// flags, `rules` checks the rules across groups, and [`Config::validate`] the whole.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let workers = self.workers.resolve(self.discovery.service_discovery)?;
        let discovery = self.discovery.resolve(workers.mode)?;
        rules::encode_policy_needs_epd(self.policies.encode_policy.as_deref(), workers.mode)?;
        rules::flags_the_mode_uses(
            workers.mode,
            [
                ("--prefill-policy", self.policies.prefill_policy.is_some()),
                ("--decode-policy", self.policies.decode_policy.is_some()),
            ],
            &self.health.health_check_endpoint,
            self.workers.kv_connector.is_some(),
        )?;
        let (tokenizer, chat_parsers) = self.tokenizer.resolve();
        rules::parsers_need_grpc(workers.mode, chat_parsers)?;
        let policies = self.policies.resolve()?;
        let mut limiter = self.limiter.resolve()?;
        let mut admission = self.admission.resolve(workers.mode)?;
        rules::priority_needs_a_queue(
            self.priority.priority_scheduler_enabled,
            admission.as_ref(),
            limiter.as_ref(),
        )?;
        let priority = self.priority.resolve()?;
        rules::order_one_queue(priority.as_ref(), &mut admission, &mut limiter);
        let admission_store = self.store.resolve(admission.as_ref())?;
        let health = self.health.resolve()?;
        let listener = self.listener.resolve()?;
        let edge = self.edge.resolve()?;
        self.telemetry.check()?;
        let config = Config {
            host: listener.host,
            port: listener.port,
            mode: workers.mode,
            workers: workers.specs,
            policy: policies.policy,
            prefill_policy: policies.prefill_policy,
            decode_policy: policies.decode_policy,
            encode_policy: policies.encode_policy,
            cache: policies.cache,
            eviction_interval: policies.eviction_interval,
            api_key: listener.api_key,
            request_timeout: listener.request_timeout,
            max_payload_size: listener.max_payload_size,
            shutdown_grace: listener.shutdown_grace,
            client_header_timeout: listener.client_header_timeout,
            max_connections: listener.max_connections,
            retry: self.retry.resolve(),
            breaker: self.breaker.resolve(),
            health,
            prometheus: Some(self.telemetry.prometheus()),
            dp_aware: workers.dp_aware,
            priority,
            admission,
            admission_store,
            prefill_grace_after_decode: PREFILL_GRACE_AFTER_DECODE,
            tokenizer,
            edge,
            prefix_hash: policies.prefix_hash,
            manual: policies.manual,
            limiter,
            startup_wait: workers.startup_wait,
            model_aliases: workers.model_aliases,
            grpc_runtime: workers.runtime,
            http_engine: workers.http_engine,
            kv_connector: workers.kv_connector,
            images: self.images.resolve(),
            chat_parsers,
            discovery,
        };
        config.validate()?;
        Ok(config)
    }
}
