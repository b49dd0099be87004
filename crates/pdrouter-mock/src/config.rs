//! Worker role and static configuration.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::Serialize;

use crate::engine::EngineConfig;

/// The part a worker plays in a prefill/decode deployment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Prefill worker: computes the prompt, answers with the first token only.
    Prefill,
    /// Decode worker: generates the output tokens.
    Decode,
    /// Ordinary (non-disaggregated) worker: no `bootstrap_room` required.
    Regular,
    /// EPD encode worker (gRPC, TokenSpeed's protocol only): serves `Encode`, finishing each
    /// item's room for the Prefill worker that waits for it.
    Encode,
}

impl Role {
    /// The lowercase name used on the command line and in JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Regular => "regular",
            Role::Encode => "encode",
        }
    }

    /// The `disaggregation_mode` reported by `/get_server_info`.
    pub fn disaggregation_mode(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
            Role::Regular => "null",
            Role::Encode => "encode",
        }
    }

    /// Whether generation requests must carry a `bootstrap_room`.
    pub fn requires_bootstrap(self) -> bool {
        matches!(self, Role::Prefill | Role::Decode)
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Error returned when parsing an unknown role name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseRoleError(String);

impl fmt::Display for ParseRoleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown role {:?} (expected prefill, decode, regular or encode)",
            self.0
        )
    }
}

impl std::error::Error for ParseRoleError {}

impl FromStr for Role {
    type Err = ParseRoleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "prefill" => Ok(Role::Prefill),
            "decode" => Ok(Role::Decode),
            "regular" => Ok(Role::Regular),
            "encode" => Ok(Role::Encode),
            _ => Err(ParseRoleError(s.to_owned())),
        }
    }
}

/// Configuration of a [`MockWorker`](crate::MockWorker).
#[derive(Clone, Debug, PartialEq)]
pub struct MockConfig {
    /// Host name or IP address to bind.
    pub host: String,
    /// Port to bind; 0 picks a free port.
    pub port: u16,
    /// Role of the worker.
    pub role: Role,
    /// Time before the first byte of a generation response (for prefill: the
    /// whole prefill).
    pub delay: Duration,
    /// Tokens a decode/regular worker generates per output.
    pub output_tokens: u32,
    /// gRPC: the text the model writes (its bytes, repeated over the output's tokens, before a
    /// final EOS), instead of the built-in sentence: how tests give it tool-call or reasoning
    /// markup to answer with.
    pub output_text: Option<String>,
    /// Time between generated tokens (decode/regular).
    pub token_interval: Duration,
    /// Fraction (0..=1) of generation requests answered 500.
    pub fail_rate: f64,
    /// Data-parallel size reported by `/get_server_info` (gRPC:
    /// `GetServerInfo`, which also refuses a `data_parallel_rank` beyond it).
    pub dp_size: u32,
    /// Model id reported when the request names none.
    pub model: String,
    /// Engine mode (see [`EngineConfig`]); `None` for the plain mock.
    pub engine: Option<EngineConfig>,
    /// Speak an engine's gRPC protocol instead of the HTTP API: SGLang's scheduler protocol,
    /// or the one [`MockConfig::grpc_runtime`] names (see the crate docs, gRPC mode).
    pub grpc: bool,
    /// gRPC: which engine protocol the worker speaks ([`GrpcRuntime::Vllm`] is also what
    /// [`HttpRuntime::Vllm`] means with [`MockConfig::grpc`]).
    pub grpc_runtime: GrpcRuntime,
    /// Key every route but `/mock/*` requires as `Authorization: Bearer KEY` (401 without
    /// it), like an engine started with `--api-key`; `None` leaves the routes open.
    pub api_key: Option<String>,
    /// gRPC: the default sampling parameters reported by `GetModelInfo`
    /// (`default_sampling_params_json`, a JSON object), as an engine reports
    /// the ones of its model's generation config; `None` reports none.
    pub default_sampling_params: Option<String>,
    /// gRPC TokenSpeed Prefill in EPD: the longest it waits for every image item's embedding
    /// (its room finished at its encode worker) before failing the request.
    pub encode_wait: Duration,
    /// HTTP mode: which server the worker imitates (SGLang's, or vLLM's OpenAI server with
    /// the KV connector of [`MockConfig::kv_connector`]; see the crate docs). With
    /// [`MockConfig::grpc`], [`HttpRuntime::Vllm`] makes a vLLM worker that speaks vLLM's engine
    /// gRPC protocol instead, as [`GrpcRuntime::Vllm`] does (with [`GrpcRuntime::TokenSpeed`]
    /// it is refused at start).
    pub http_runtime: HttpRuntime,
    /// vLLM mode (either front): how long a producer (prefill leg) holds the KV blocks of a
    /// request that no consumer pulled before it frees them (vLLM's
    /// `VLLM_NIXL_ABORT_REQUEST_TIMEOUT`).
    pub kv_abort_timeout: Duration,
    /// vLLM mode (either front): the KV connector imitated (NIXL, Mooncake or LMCache; see
    /// the crate docs).
    pub kv_connector: KvConnectorKind,
    /// vLLM mode, LMCache connector: base URL (`http://host:port`) of the consumer this
    /// worker pushes the KV of every one-token request to; `None` pushes nothing.
    pub lmcache_peer: Option<String>,
}

/// The KV connector a vLLM-mode worker imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum KvConnectorKind {
    /// vLLM's NIXL connector: the consumer pulls the blocks the producer's answer names.
    #[default]
    Nixl,
    /// vLLM's Mooncake connector: both legs at once, rendezvous by `transfer_id` through the
    /// producer's bootstrap server.
    Mooncake,
    /// LMCache's disaggregation: the producer pushes a one-token request's KV to its peer,
    /// which finds it by prompt.
    #[value(name = "lmcache")]
    LmCache,
}

impl KvConnectorKind {
    /// The name used on the command line and in `/mock/stats`.
    pub fn as_str(self) -> &'static str {
        match self {
            KvConnectorKind::Nixl => "nixl",
            KvConnectorKind::Mooncake => "mooncake",
            KvConnectorKind::LmCache => "lmcache",
        }
    }
}

/// The server an HTTP-mode worker imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HttpRuntime {
    /// SGLang's HTTP server (`/generate`, `/get_server_info`, bootstrap rooms).
    #[default]
    Sglang,
    /// vLLM's OpenAI server with the NIXL KV connector: `/v1/completions` and
    /// `/v1/chat/completions` only, prefill/decode told apart by `kv_transfer_params`.
    Vllm,
}

/// The engine protocol of a gRPC-mode worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum GrpcRuntime {
    /// SGLang's `sglang.grpc.scheduler.SglangScheduler`.
    #[default]
    Sglang,
    /// TokenSpeed's `tokenspeed.grpc.scheduler.TokenSpeedScheduler` (only that service: a
    /// router asking SGLang's gets `Unimplemented`).
    #[value(name = "tokenspeed")]
    TokenSpeed,
    /// vLLM's `vllm.grpc.engine.VllmEngine` with the KV connector of
    /// [`MockConfig::kv_connector`] (only that service answers): vLLM mode over gRPC.
    Vllm,
}

impl MockConfig {
    /// Whether the worker imitates vLLM (over HTTP, or with [`MockConfig::grpc`] over vLLM's
    /// engine gRPC protocol): the KV connector, its table and its routes are then in use.
    pub(crate) fn vllm(&self) -> bool {
        self.http_runtime == HttpRuntime::Vllm
            || (self.grpc && self.grpc_runtime == GrpcRuntime::Vllm)
    }

    /// The gRPC protocol a gRPC worker speaks.
    pub(crate) fn grpc_protocol(&self) -> GrpcRuntime {
        if self.vllm() {
            GrpcRuntime::Vllm
        } else {
            self.grpc_runtime
        }
    }

    /// Defaults: 127.0.0.1, port 0, no delays, 8 tokens, no failures,
    /// dp size 1, model `"mock-model"`, no engine mode, HTTP (SGLang's), no API key, no
    /// default sampling parameters, a KV abort timeout of 480 s, the NIXL connector, no
    /// LMCache peer.
    pub fn new(role: Role) -> Self {
        MockConfig {
            host: "127.0.0.1".to_owned(),
            port: 0,
            role,
            delay: Duration::ZERO,
            output_tokens: 8,
            output_text: None,
            token_interval: Duration::ZERO,
            fail_rate: 0.0,
            dp_size: 1,
            model: "mock-model".to_owned(),
            engine: None,
            grpc: false,
            grpc_runtime: GrpcRuntime::Sglang,
            api_key: None,
            default_sampling_params: None,
            encode_wait: DEFAULT_ENCODE_WAIT,
            http_runtime: HttpRuntime::Sglang,
            kv_abort_timeout: DEFAULT_KV_ABORT_TIMEOUT,
            kv_connector: KvConnectorKind::Nixl,
            lmcache_peer: None,
        }
    }
}

/// Default of [`MockConfig::kv_abort_timeout`]: vLLM's 480 s.
pub(crate) const DEFAULT_KV_ABORT_TIMEOUT: Duration = Duration::from_secs(480);

/// Default of [`MockConfig::encode_wait`].
pub(crate) const DEFAULT_ENCODE_WAIT: Duration = Duration::from_secs(30);

impl Default for MockConfig {
    /// A [`Role::Regular`] worker with the defaults of [`MockConfig::new`].
    fn default() -> Self {
        MockConfig::new(Role::Regular)
    }
}
