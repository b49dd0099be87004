//! Worker flags: the routing mode (regular, PD, EPD; HTTP or gRPC from the URLs), the workers
//! of each role, DP awareness, the wait for startup workers, model aliases and the gRPC
//! runtime hint.

use std::time::Duration;

use clap::Args;

use crate::config::{
    ConfigError, DEFAULT_WORKER_STARTUP_CHECK_INTERVAL_SECS, DEFAULT_WORKER_STARTUP_TIMEOUT_SECS,
    HttpEngine, KvConnector, Mode, Runtime, StartupWait, WorkerSpec, WorkerType, is_grpc_url,
    parse_worker_url,
};

/// `launch` flags under "Workers".
#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Regular workers (regular mode).
    #[arg(long, num_args = 1.., value_name = "URL", help_heading = "Workers")]
    pub worker_urls: Vec<String>,
    /// Prefill/decode disaggregated mode.
    #[arg(long, help_heading = "Workers")]
    pub pd_disaggregation: bool,
    /// Prefill worker with an optional KV bootstrap port or `none` (repeatable).
    #[arg(long, num_args = 1..=2, value_names = ["URL", "BOOTSTRAP_PORT|none"], action = clap::ArgAction::Append, help_heading = "Workers")]
    pub prefill: Vec<String>,
    /// `--prefill` occurrences grouped (filled by
    /// [`Cli::try_parse_args`](super::Cli::try_parse_args)).
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
    /// `--encode` occurrences grouped (filled by
    /// [`Cli::try_parse_args`](super::Cli::try_parse_args)).
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
    /// Runtime of the workers. grpc:// workers: sglang, tokenspeed or vllm, asked first when
    /// learning each worker's runtime (without it the router asks SGLang's service, then
    /// TokenSpeed's, then vLLM's; either way each worker's runtime is what its HealthCheck
    /// answers).
    /// http(s):// workers: sglang or vllm, taken as said; without it each worker's engine is
    /// detected (vLLM when its /v1/models says owned_by "vllm", or it serves /version but not
    /// /get_server_info).
    #[arg(long, visible_alias = "backend", value_name = "RUNTIME", value_parser = ["sglang", "tokenspeed", "vllm"], help_heading = "Workers")]
    pub runtime: Option<String>,
    /// How vLLM PD pairs move the KV cache: nixl (NixlConnector: the Prefill leg first, its
    /// answer's kv_transfer_params relayed to Decode), mooncake (MooncakeConnector: both legs
    /// at once with one transfer id; Decode is told the Prefill's bootstrap address, from
    /// --prefill URL PORT, 8998 when none), or lmcache (the Prefill leg first, capped at one
    /// token; Decode gets the same prompt). gRPC vLLM workers report their connector; this is
    /// what one that reports none uses.
    /// [default: nixl; only with --pd-disaggregation]
    #[arg(long, value_name = "CONNECTOR", value_parser = ["nixl", "mooncake", "lmcache"], help_heading = "Workers")]
    pub kv_connector: Option<String>,
}

/// The workers' part of [`Config`](crate::config::Config).
#[derive(Debug)]
pub(super) struct Workers {
    pub(super) mode: Mode,
    pub(super) specs: Vec<WorkerSpec>,
    pub(super) dp_aware: bool,
    pub(super) startup_wait: Option<StartupWait>,
    pub(super) model_aliases: Vec<(String, String)>,
    pub(super) runtime: Option<Runtime>,
    pub(super) http_engine: Option<HttpEngine>,
    pub(super) kv_connector: KvConnector,
}

impl WorkerArgs {
    /// The mode and the workers, checked: one disaggregated mode at most, every role's flag
    /// only in a mode that has the role, every URL well formed, at least one worker outside
    /// PD. (Whether the roles a mode needs are all there is `Config::validate`'s.)
    /// With `discovery` on, workers may all come from it.
    pub(super) fn resolve(&self, discovery: bool) -> Result<Workers, ConfigError> {
        let mode = self.mode()?;
        let specs = self.specs(mode, discovery)?;
        Ok(Workers {
            mode,
            specs,
            dp_aware: self.dp_aware,
            startup_wait: self.startup_wait(),
            model_aliases: self.model_aliases()?,
            // clap admits only the runtimes' names; which of them apply is checked with the
            // workers' transport (`Config::validate`).
            runtime: self.runtime.as_deref().and_then(Runtime::parse),
            http_engine: self.runtime.as_deref().and_then(HttpEngine::parse),
            // clap admits only the connectors' names.
            kv_connector: self
                .kv_connector
                .as_deref()
                .and_then(KvConnector::parse)
                .unwrap_or_default(),
        })
    }

    fn mode(&self) -> Result<Mode, ConfigError> {
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
        // the operator learns about every mistake).
        let grpc_pd = self
            .prefill
            .iter()
            .chain(&self.decode)
            .any(|u| is_grpc_url(u.trim()));
        let grpc_regular = self.worker_urls.iter().any(|u| is_grpc_url(u.trim()));
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
        Ok(mode)
    }

    fn specs(&self, mode: Mode, discovery: bool) -> Result<Vec<WorkerSpec>, ConfigError> {
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
                spec.bootstrap_port = Some(encode_bootstrap_port(port)?);
            }
            workers.push(spec);
        }
        if workers.is_empty() && !mode.is_pd() && !discovery {
            return Err(ConfigError(
                "no workers: give --worker-urls URL..., or --pd-disaggregation with --prefill and --decode"
                    .into(),
            ));
        }
        Ok(workers)
    }

    /// Waiting is asked for by either flag; the other then takes its default.
    fn startup_wait(&self) -> Option<StartupWait> {
        (self.worker_startup_timeout_secs.is_some() || self.worker_startup_check_interval.is_some())
            .then(|| StartupWait {
                timeout: Duration::from_secs(
                    self.worker_startup_timeout_secs
                        .unwrap_or(DEFAULT_WORKER_STARTUP_TIMEOUT_SECS),
                ),
                check_interval: Duration::from_secs(
                    self.worker_startup_check_interval
                        .unwrap_or(DEFAULT_WORKER_STARTUP_CHECK_INTERVAL_SECS),
                ),
            })
    }

    fn model_aliases(&self) -> Result<Vec<(String, String)>, ConfigError> {
        let mut model_aliases = Vec::new();
        for raw in &self.model_alias {
            let Some((alias, canonical)) = raw.split_once('=') else {
                return Err(ConfigError(format!(
                    "--model-alias '{raw}' must be ALIAS=MODEL"
                )));
            };
            model_aliases.push((alias.trim().to_string(), canonical.trim().to_string()));
        }
        Ok(model_aliases)
    }
}

fn worker(flag: &str, raw: &str, t: WorkerType) -> Result<WorkerSpec, ConfigError> {
    let url = parse_worker_url(raw).map_err(|e| ConfigError(format!("{flag}: {e}")))?;
    Ok(WorkerSpec::new(url, t))
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

/// Parses the optional second token of `--encode URL [PORT]` (an Encode worker always has a
/// port when one is given: there is no `none`).
fn encode_bootstrap_port(token: &str) -> Result<u16, ConfigError> {
    token
        .trim()
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| {
            ConfigError(format!(
                "--encode bootstrap port '{token}' must be a port number 1-65535"
            ))
        })
}
