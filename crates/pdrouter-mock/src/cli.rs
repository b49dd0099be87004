//! Command line interface of the `pdrouter-mock` binary.

use std::fmt;
use std::io::{self, Write as _};
use std::time::Duration;

use clap::Parser;

use crate::config::{GrpcRuntime, HttpRuntime, KvConnectorKind, MockConfig, Role};
use crate::engine::EngineConfig;
use crate::worker::MockWorker;

/// Command line flags of `pdrouter-mock`.
#[derive(Clone, Debug, PartialEq, Parser)]
#[command(
    name = "pdrouter-mock",
    version,
    about = "Mock SGLang-style inference worker (prefill / decode / regular)"
)]
pub struct MockArgs {
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to bind (0 picks a free port; the bound address is printed).
    #[arg(long, default_value_t = 0)]
    pub port: u16,
    /// Role of the worker.
    #[arg(long, value_enum, required_unless_present = "pairs")]
    pub role: Option<Role>,
    /// Start N Prefill and N Decode workers in this one process instead of one worker of
    /// `--role`, each on a free port, every other flag applying to all of them. A Decode
    /// worker's KV rendezvous with a Prefill worker of this process then waits on it in
    /// memory instead of over HTTP (the same wait, without an exchange per request): a
    /// benchmark's fleet on one core spends its time serving, not talking to itself.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64),
          conflicts_with_all = ["role", "port", "bootstrap_port"])]
    pub pairs: Option<u16>,
    /// Milliseconds before the first byte of a generation response (prefill:
    /// the whole prefill).
    #[arg(long, default_value_t = 0, value_name = "D")]
    pub delay_ms: u64,
    /// Tokens a decode/regular worker generates.
    #[arg(long, default_value_t = 8, value_name = "N")]
    pub output_tokens: u32,
    /// gRPC: the text the model writes (repeated over --output-tokens, the last one EOS)
    /// instead of its built-in sentence, e.g. tool-call markup.
    #[arg(long, value_name = "TEXT", requires = "grpc")]
    pub output_text: Option<String>,
    /// Milliseconds between streamed tokens.
    #[arg(long, default_value_t = 0, value_name = "I")]
    pub token_interval_ms: u64,
    /// Fraction (0..=1) of generation requests answered 500 (gRPC: status
    /// INTERNAL).
    #[arg(long, default_value_t = 0.0, value_name = "F", value_parser = parse_fail_rate)]
    pub fail_rate: f64,
    /// Data-parallel size reported by /get_server_info (gRPC: GetServerInfo);
    /// a gRPC request for a data_parallel_rank at or above it is refused.
    #[arg(long, default_value_t = 1, value_name = "K",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub dp_size: u32,
    /// EPD Prefill (gRPC, TokenSpeed): milliseconds it waits for every image item's
    /// embedding to reach it from its encode worker before failing the request.
    #[arg(long, default_value_t = 30_000, value_name = "W")]
    pub encode_wait_ms: u64,
    /// Model id reported when a request names none.
    #[arg(long, default_value = "mock-model", value_name = "NAME")]
    pub model: String,
    /// Engine mode: a prefill worker runs at most --max-running prefills at
    /// once (the rest queue FIFO), takes time proportional to the prompt and
    /// serves a KV bootstrap endpoint; a decode worker waits for that
    /// endpoint before generating max_tokens tokens.
    #[arg(long)]
    pub engine: bool,
    /// Engine mode: prefills running at once (reported as
    /// max_running_requests).
    #[arg(long, default_value_t = 8, value_name = "N", requires = "engine",
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_running: u32,
    /// Engine mode: prefill speed in prompt tokens (words) per second.
    #[arg(long, default_value_t = 10_000.0, value_name = "R", requires = "engine",
          value_parser = parse_rate)]
    pub prefill_tokens_per_sec: f64,
    /// Engine mode, prefill role: chunked prefill, C prompt tokens per
    /// forward step shared by the step's requests (at most --max-running of
    /// them, FIFO; a long prompt spans steps); without it every running
    /// request computes on its own at the full token rate.
    #[arg(long, value_name = "C", requires = "engine",
          value_parser = clap::value_parser!(u64).range(1..=1_000_000_000))]
    pub chunked_prefill_tokens: Option<u64>,
    /// Engine mode with --chunked-prefill-tokens: fixed milliseconds every
    /// forward step costs on top of its tokens.
    #[arg(long, default_value_t = 0.0, value_name = "MS", requires = "chunked_prefill_tokens",
          value_parser = parse_step_ms)]
    pub step_overhead_ms: f64,
    /// Engine mode, prefill role: port of the KV bootstrap endpoint (0 picks
    /// a free port; it is printed as bootstrap_port=P).
    #[arg(long, default_value_t = 0, value_name = "P", requires = "engine")]
    pub bootstrap_port: u16,
    /// Speak SGLang's scheduler gRPC protocol (token ids in and out; with
    /// --runtime, TokenSpeed's or vLLM's) instead of the HTTP API; the same port
    /// also answers HTTP/1.1 GET /health, GET /mock/stats, POST /mock/controls and
    /// the KV hand-over (the bootstrap GET /room/{room}; vLLM: its connector's routes).
    #[arg(long)]
    pub grpc: bool,
    /// The engine imitated: with --grpc, sglang (the default), tokenspeed or vllm (vLLM's
    /// engine gRPC protocol with the KV connector of --kv-connector; only the chosen one's
    /// service answers); without it, vllm (vLLM's OpenAI server with that KV connector)
    /// instead of SGLang's HTTP server.
    #[arg(long, value_enum, requires_ifs = [("sglang", "grpc"), ("tokenspeed", "grpc")])]
    pub runtime: Option<RuntimeArg>,
    /// vLLM: milliseconds a producer (prefill leg) holds the KV blocks of a
    /// request no consumer pulled (vLLM's VLLM_NIXL_ABORT_REQUEST_TIMEOUT).
    #[arg(long, default_value_t = 480_000, value_name = "MS")]
    pub kv_abort_timeout_ms: u64,
    /// vLLM (HTTP or --grpc): the KV connector imitated: nixl (the consumer pulls from the
    /// producer's port), mooncake (both legs at once; a prefill worker serves a bootstrap
    /// server, printed as bootstrap_port=P) or lmcache (the producer pushes a one-token
    /// request's KV to --lmcache-peer).
    #[arg(long, value_enum, value_name = "C")]
    pub kv_connector: Option<KvConnectorKind>,
    /// vLLM with --kv-connector lmcache: base URL (http://host:port) of the consumer a
    /// one-token request's KV is pushed to.
    #[arg(long, value_name = "URL")]
    pub lmcache_peer: Option<String>,
    /// Require `Authorization: Bearer KEY` on every route but /mock/* (401
    /// without it).
    #[arg(long, value_name = "KEY")]
    pub api_key: Option<String>,
    /// gRPC: default sampling parameters GetModelInfo reports, a JSON object
    /// such as '{"temperature":0.6,"top_p":0.95}'.
    #[arg(long, value_name = "JSON", requires = "grpc", value_parser = parse_json_object)]
    pub default_sampling_params: Option<String>,
}

/// The values of `--runtime`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeArg {
    /// gRPC: SGLang's scheduler protocol.
    Sglang,
    /// gRPC: TokenSpeed's scheduler protocol.
    #[value(name = "tokenspeed")]
    TokenSpeed,
    /// vLLM: its OpenAI server (HTTP), or with `--grpc` its engine gRPC protocol, with the KV
    /// connector of `--kv-connector`.
    Vllm,
}

fn parse_json_object(s: &str) -> Result<String, String> {
    match serde_json::from_str::<serde_json::Value>(s) {
        Ok(serde_json::Value::Object(_)) => Ok(s.to_owned()),
        Ok(_) => Err("must be a JSON object".to_owned()),
        Err(e) => Err(format!("not JSON: {e}")),
    }
}

fn parse_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if rate.is_finite() && rate > 0.0 {
        Ok(rate)
    } else {
        Err(format!("{rate} is not a positive number"))
    }
}

fn parse_step_ms(s: &str) -> Result<f64, String> {
    let ms: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=60_000.0).contains(&ms) {
        Ok(ms)
    } else {
        Err(format!("{ms} is not within 0..=60000"))
    }
}

fn parse_fail_rate(s: &str) -> Result<f64, String> {
    let rate: f64 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if (0.0..=1.0).contains(&rate) {
        Ok(rate)
    } else {
        Err(format!("{rate} is not within 0..=1"))
    }
}

impl MockArgs {
    /// Parses `args` (including the program name) like [`Parser::try_parse_from`], then
    /// refuses the combinations clap cannot express: `--kv-connector` without `--runtime
    /// vllm` (HTTP or gRPC), `--lmcache-peer` without `--kv-connector lmcache` or not an
    /// `http://` URL.
    pub fn try_parse_checked<I, T>(args: I) -> Result<MockArgs, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args = MockArgs::try_parse_from(args)?;
        let fail = |kind, msg: &str| {
            Err(<MockArgs as clap::CommandFactory>::command().error(kind, msg.to_owned()))
        };
        let vllm = args.runtime == Some(RuntimeArg::Vllm);
        // Flags of the vLLM connectors would be silently ignored elsewhere.
        let missing = clap::error::ErrorKind::MissingRequiredArgument;
        if !vllm && args.kv_connector.is_some() {
            return fail(missing, "--kv-connector needs --runtime vllm");
        }
        if let Some(peer) = &args.lmcache_peer {
            if args.kv_connector != Some(KvConnectorKind::LmCache) {
                return fail(
                    missing,
                    "--lmcache-peer needs --runtime vllm --kv-connector lmcache",
                );
            }
            if !peer.starts_with("http://") {
                let kind = clap::error::ErrorKind::ValueValidation;
                return fail(kind, "--lmcache-peer must be an http://host:port URL");
            }
        }
        Ok(args)
    }

    /// The worker configuration these flags describe (with `--pairs`, a Prefill worker's).
    pub fn to_config(&self) -> MockConfig {
        self.config_as(self.role.unwrap_or(Role::Prefill))
    }

    /// The configuration of a worker of `role` with these flags.
    fn config_as(&self, role: Role) -> MockConfig {
        MockConfig {
            host: self.host.clone(),
            port: self.port,
            role,
            delay: Duration::from_millis(self.delay_ms),
            output_tokens: self.output_tokens,
            output_text: self.output_text.clone(),
            token_interval: Duration::from_millis(self.token_interval_ms),
            fail_rate: self.fail_rate,
            dp_size: self.dp_size,
            model: self.model.clone(),
            engine: self.engine.then_some(EngineConfig {
                max_running: self.max_running as usize,
                prefill_tokens_per_sec: self.prefill_tokens_per_sec,
                bootstrap_port: self.bootstrap_port,
                chunk_tokens: self.chunked_prefill_tokens,
                step_overhead: Duration::from_secs_f64(self.step_overhead_ms / 1000.0),
            }),
            grpc: self.grpc,
            grpc_runtime: match self.runtime {
                Some(RuntimeArg::TokenSpeed) => GrpcRuntime::TokenSpeed,
                Some(RuntimeArg::Vllm) => GrpcRuntime::Vllm,
                _ => GrpcRuntime::Sglang,
            },
            http_runtime: match self.runtime {
                Some(RuntimeArg::Vllm) => HttpRuntime::Vllm,
                _ => HttpRuntime::Sglang,
            },
            kv_abort_timeout: Duration::from_millis(self.kv_abort_timeout_ms),
            kv_connector: self.kv_connector.unwrap_or_default(),
            lmcache_peer: self.lmcache_peer.clone(),
            api_key: self.api_key.clone(),
            default_sampling_params: self.default_sampling_params.clone(),
            encode_wait: Duration::from_millis(self.encode_wait_ms),
        }
    }
}

impl From<MockArgs> for MockConfig {
    fn from(args: MockArgs) -> Self {
        args.to_config()
    }
}

/// Failure of [`run_cli`].
#[derive(Debug)]
pub enum CliError {
    /// Invalid flags, or `--help` / `--version` (call [`clap::Error::exit`]
    /// to print the message and exit with clap's status code).
    Args(clap::Error),
    /// Binding or serving failed.
    Io(io::Error),
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Args(e) => write!(f, "{e}"),
            CliError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for CliError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            CliError::Args(e) => Some(e),
            CliError::Io(e) => Some(e),
        }
    }
}

impl From<io::Error> for CliError {
    fn from(e: io::Error) -> Self {
        CliError::Io(e)
    }
}

/// Runs the `pdrouter-mock` command: parses `args` (including the program
/// name, as in [`std::env::args`]), starts the worker (with `--pairs N`, N Prefill then N
/// Decode workers), prints `pdrouter-mock listening on http://ADDR role=ROLE` for each
/// (`grpc://ADDR` with `--grpc`; engine-mode or Mooncake prefill: followed by
/// ` bootstrap_port=P`) to stdout and serves until Ctrl-C or SIGTERM.
pub async fn run_cli(args: impl IntoIterator<Item = String>) -> Result<(), CliError> {
    let args = MockArgs::try_parse_checked(args).map_err(CliError::Args)?;
    let roles = match (args.pairs, args.role) {
        (Some(n), _) => {
            crate::bootstrap::rendezvous_in_process();
            let n = usize::from(n);
            [vec![Role::Prefill; n], vec![Role::Decode; n]].concat()
        }
        (None, role) => vec![role.unwrap_or(Role::Prefill)],
    };
    let mut workers = Vec::with_capacity(roles.len());
    for role in roles {
        workers.push((MockWorker::start(args.config_as(role)).await?, role));
    }
    {
        let mut out = io::stdout().lock();
        for (worker, role) in &workers {
            write!(
                out,
                "pdrouter-mock listening on {} role={role}",
                worker.url()
            )?;
            if let Some(b) = worker.bootstrap_addr() {
                write!(out, " bootstrap_port={}", b.port())?;
            }
            writeln!(out)?;
        }
        out.flush()?;
    }
    wait_for_signal().await?;
    for (worker, _) in workers {
        worker.shutdown().await;
    }
    Ok(())
}

#[cfg(unix)]
async fn wait_for_signal() -> io::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(not(unix))]
async fn wait_for_signal() -> io::Result<()> {
    tokio::signal::ctrl_c().await
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[test]
    fn pairs_replace_the_role_and_take_free_ports() {
        let args =
            MockArgs::try_parse_checked(["pdrouter-mock", "--pairs", "2", "--grpc"]).unwrap();
        assert_eq!((args.pairs, args.role), (Some(2), None));
        assert_eq!(args.config_as(Role::Decode).role, Role::Decode);
        assert_eq!(args.config_as(Role::Decode).port, 0);
        for bad in [
            vec!["--pairs", "2", "--role", "decode"],
            vec!["--pairs", "2", "--port", "8000"],
            vec!["--pairs", "0"],
            vec!["--pairs", "65"],
            vec![],
        ] {
            let argv = std::iter::once("pdrouter-mock").chain(bad.iter().copied());
            assert!(MockArgs::try_parse_checked(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn default_sampling_params_must_be_a_json_object_on_a_grpc_worker() {
        let args = MockArgs::try_parse_from([
            "pdrouter-mock",
            "--role",
            "decode",
            "--grpc",
            "--default-sampling-params",
            r#"{"top_k":20}"#,
        ])
        .unwrap();
        assert_eq!(
            args.to_config().default_sampling_params.as_deref(),
            Some(r#"{"top_k":20}"#)
        );
        for bad in [
            vec!["--grpc", "--default-sampling-params", "[1]"],
            vec!["--grpc", "--default-sampling-params", "{"],
            vec!["--default-sampling-params", "{}"],
        ] {
            let argv = ["pdrouter-mock", "--role", "decode"]
                .into_iter()
                .chain(bad.iter().copied());
            assert!(MockArgs::try_parse_from(argv).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn runtime_picks_the_grpc_protocol() {
        let parse = |extra: &[&str]| {
            let argv = ["pdrouter-mock", "--role", "decode"]
                .into_iter()
                .chain(extra.iter().copied());
            MockArgs::try_parse_from(argv).map(|a| a.to_config().grpc_runtime)
        };
        assert_eq!(parse(&["--grpc"]).unwrap(), GrpcRuntime::Sglang);
        assert_eq!(
            parse(&["--grpc", "--runtime", "tokenspeed"]).unwrap(),
            GrpcRuntime::TokenSpeed
        );
        assert!(parse(&["--runtime", "tokenspeed"]).is_err(), "needs --grpc");
        assert!(parse(&["--runtime", "sglang"]).is_err(), "needs --grpc");
        assert_eq!(parse(&[]).unwrap(), GrpcRuntime::Sglang);
    }

    /// A prefill worker's config from `extra` flags, checked as the binary checks them.
    fn parse(extra: &[&str]) -> Result<MockConfig, clap::Error> {
        let argv = ["pdrouter-mock", "--role", "prefill"]
            .into_iter()
            .chain(extra.iter().copied());
        MockArgs::try_parse_checked(argv).map(|a| a.to_config())
    }

    #[test]
    fn runtime_vllm_speaks_http_or_grpc() {
        let cfg = parse(&["--runtime", "vllm"]).unwrap();
        assert_eq!(cfg.http_runtime, HttpRuntime::Vllm);
        assert!(!cfg.grpc);
        assert!(cfg.vllm());
        assert_eq!(cfg.kv_abort_timeout, Duration::from_secs(480));
        let cfg = parse(&["--runtime", "vllm", "--kv-abort-timeout-ms", "150"]).unwrap();
        assert_eq!(cfg.kv_abort_timeout, Duration::from_millis(150));
        let cfg = parse(&["--grpc", "--runtime", "vllm"]).unwrap();
        assert!(cfg.grpc && cfg.vllm());
        assert_eq!(cfg.grpc_runtime, GrpcRuntime::Vllm);
        assert_eq!(cfg.grpc_protocol(), GrpcRuntime::Vllm);
        assert_eq!(cfg.kv_connector, KvConnectorKind::Nixl);
        let grpc_mc = ["--grpc", "--runtime", "vllm", "--kv-connector", "mooncake"];
        let cfg = parse(&grpc_mc).unwrap();
        assert_eq!(cfg.kv_connector, KvConnectorKind::Mooncake);
        let grpc_lm = [
            "--grpc",
            "--runtime",
            "vllm",
            "--kv-connector",
            "lmcache",
            "--lmcache-peer",
            "http://127.0.0.1:9",
        ];
        let cfg = parse(&grpc_lm).unwrap();
        assert_eq!(cfg.lmcache_peer.as_deref(), Some("http://127.0.0.1:9"));
        let cfg = parse(&[]).unwrap();
        assert_eq!(cfg.http_runtime, HttpRuntime::Sglang);
        assert!(!cfg.vllm());
        let cfg = parse(&["--grpc", "--runtime", "tokenspeed"]).unwrap();
        assert_eq!(cfg.http_runtime, HttpRuntime::Sglang);
        assert!(!cfg.vllm());
        for bad in [
            vec!["--grpc", "--kv-connector", "mooncake"],
            vec![
                "--grpc",
                "--runtime",
                "tokenspeed",
                "--kv-connector",
                "nixl",
            ],
            vec![
                "--grpc",
                "--runtime",
                "vllm",
                "--lmcache-peer",
                "http://h:1",
            ],
        ] {
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn chunked_prefill_flags_build_the_step_engine() {
        let base = ["pdrouter-mock", "--role", "prefill", "--engine"];
        let args = MockArgs::try_parse_from(base.iter().copied().chain([
            "--max-running",
            "4",
            "--chunked-prefill-tokens",
            "2048",
            "--step-overhead-ms",
            "2.5",
        ]))
        .unwrap();
        let engine = args.to_config().engine.unwrap();
        assert_eq!(engine.max_running, 4);
        assert_eq!(engine.chunk_tokens, Some(2048));
        assert_eq!(engine.step_overhead, Duration::from_micros(2500));
        for bad in [
            vec!["--chunked-prefill-tokens", "0"],
            vec!["--chunked-prefill-tokens", "x"],
            vec!["--chunked-prefill-tokens", "64", "--step-overhead-ms", "-1"],
            vec![
                "--chunked-prefill-tokens",
                "64",
                "--step-overhead-ms",
                "1e9",
            ],
            vec!["--step-overhead-ms", "1"],
        ] {
            let argv = base.iter().copied().chain(bad.iter().copied());
            assert!(MockArgs::try_parse_from(argv).is_err(), "{bad:?}");
        }
        let plain = [
            "pdrouter-mock",
            "--role",
            "prefill",
            "--chunked-prefill-tokens",
            "8",
        ];
        assert!(MockArgs::try_parse_from(plain).is_err(), "needs --engine");
    }

    #[test]
    fn kv_connector_and_lmcache_peer_need_vllm() {
        let cfg = parse(&["--runtime", "vllm"]).unwrap();
        assert_eq!(
            (cfg.kv_connector, cfg.lmcache_peer),
            (KvConnectorKind::Nixl, None)
        );
        for (name, kind) in [
            ("nixl", KvConnectorKind::Nixl),
            ("mooncake", KvConnectorKind::Mooncake),
            ("lmcache", KvConnectorKind::LmCache),
        ] {
            let cfg = parse(&["--runtime", "vllm", "--kv-connector", name]).unwrap();
            assert_eq!(cfg.kv_connector, kind);
            assert_eq!(kind.as_str(), name);
        }
        let peer = ["--runtime", "vllm", "--kv-connector", "lmcache"];
        let with_peer = |url: &str| {
            let argv: Vec<&str> = peer
                .iter()
                .copied()
                .chain(["--lmcache-peer", url])
                .collect();
            parse(&argv)
        };
        let cfg = with_peer("http://127.0.0.1:9").unwrap();
        assert_eq!(cfg.lmcache_peer.as_deref(), Some("http://127.0.0.1:9"));
        assert!(with_peer("127.0.0.1:9").is_err(), "a URL");
        for bad in [
            vec!["--kv-connector", "mooncake"],
            vec!["--grpc", "--kv-connector", "nixl"],
            vec!["--runtime", "vllm", "--kv-connector", "p2p"],
            vec!["--runtime", "vllm", "--lmcache-peer", "http://h:1"],
            vec![
                "--runtime",
                "vllm",
                "--kv-connector",
                "mooncake",
                "--lmcache-peer",
                "http://h:1",
            ],
        ] {
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
    }
}
