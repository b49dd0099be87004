//! Workers and how requests reach them: the routing [`Mode`], each worker's role and URL, the
//! runtime a gRPC worker is asked for first, and the wait for startup workers.

use std::time::Duration;

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
    /// An HTTP worker's engine, when given for it (`POST /workers`); else the router's
    /// `--runtime`, else detected.
    pub engine: Option<HttpEngine>,
    /// A vLLM worker's KV connector, when given for it (`POST /workers`); else the router's
    /// `--kv-connector`.
    pub kv_connector: Option<KvConnector>,
}

impl WorkerSpec {
    /// A `worker_type` worker at `url` with nothing else given: no bootstrap port, no key,
    /// its engine and connector the router's.
    pub fn new(url: impl Into<String>, worker_type: WorkerType) -> Self {
        WorkerSpec {
            url: url.into(),
            worker_type,
            bootstrap_port: None,
            api_key: None,
            engine: None,
            kv_connector: None,
        }
    }
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

/// The protocol a gRPC worker speaks (`--runtime`). What each runtime's messages can carry is
/// the gRPC module's business (`crate::grpc::runtime`); here it is only a name to check.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Runtime {
    /// `sglang.grpc.scheduler.SglangScheduler`.
    Sglang,
    /// `tokenspeed.grpc.scheduler.TokenSpeedScheduler`.
    TokenSpeed,
    /// `vllm.grpc.engine.VllmEngine`.
    Vllm,
}

impl Runtime {
    /// Every runtime, in the order detection tries them without a hint.
    pub const ALL: [Runtime; 3] = [Runtime::Sglang, Runtime::TokenSpeed, Runtime::Vllm];

    /// The name used by `--runtime`, `/workers` and logs.
    pub fn name(self) -> &'static str {
        match self {
            Runtime::Sglang => "sglang",
            Runtime::TokenSpeed => "tokenspeed",
            Runtime::Vllm => "vllm",
        }
    }

    /// The runtime named `s` (as [`Runtime::name`] spells it).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.name() == s)
    }
}

/// The engine behind an `http(s)://` worker, which decides how a PD pair over HTTP hands over
/// the KV: SGLang's engines take both legs at once with a bootstrap ticket, vLLM's a Prefill
/// leg first whose transfer params go to the Decode leg.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HttpEngine {
    /// SGLang's HTTP server (the default until a worker says otherwise).
    Sglang,
    /// vLLM's OpenAI-compatible server.
    Vllm,
}

impl HttpEngine {
    /// The name used by `--runtime`, `/workers` and logs.
    pub fn name(self) -> &'static str {
        match self {
            HttpEngine::Sglang => "sglang",
            HttpEngine::Vllm => "vllm",
        }
    }

    /// The engine named `s` (as [`HttpEngine::name`] spells it).
    pub fn parse(s: &str) -> Option<Self> {
        [HttpEngine::Sglang, HttpEngine::Vllm]
            .into_iter()
            .find(|e| e.name() == s)
    }
}

/// What the two workers of an HTTP PD pair must share: the engine and, for vLLM's, the KV
/// connector (one byte, so selection state stays small).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HttpPairing {
    /// SGLang's engines (a bootstrap ticket on both legs).
    Sglang,
    /// vLLM's engines with this connector.
    Vllm(KvConnector),
}

impl HttpPairing {
    /// The engine's name, then the connector's (`sglang`, `vllm-nixl`, ...).
    pub fn name(self) -> &'static str {
        match self {
            HttpPairing::Sglang => "sglang",
            HttpPairing::Vllm(KvConnector::Nixl) => "vllm-nixl",
            HttpPairing::Vllm(KvConnector::Mooncake) => "vllm-mooncake",
            HttpPairing::Vllm(KvConnector::Lmcache) => "vllm-lmcache",
        }
    }
}

/// How vLLM workers move the KV cache between a PD pair (`--kv-connector`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum KvConnector {
    /// vLLM's NixlConnector: the Prefill answer's `kv_transfer_params` tell Decode where
    /// to read the blocks (the legs one after the other).
    #[default]
    Nixl,
    /// vLLM's MooncakeConnector: both legs at once, one transfer id, Decode told the
    /// Prefill's bootstrap address and engine id.
    Mooncake,
    /// LMCache: the Prefill capped at one token stores the prompt's KV, then Decode is sent
    /// the same prompt (no params).
    Lmcache,
}

impl KvConnector {
    /// Every connector, as `--kv-connector` and `POST /workers` name them.
    pub const ALL: [KvConnector; 3] = [
        KvConnector::Nixl,
        KvConnector::Mooncake,
        KvConnector::Lmcache,
    ];

    /// The name used by `--kv-connector` and `/workers`.
    pub fn name(self) -> &'static str {
        match self {
            KvConnector::Nixl => "nixl",
            KvConnector::Mooncake => "mooncake",
            KvConnector::Lmcache => "lmcache",
        }
    }

    /// The connector named `s` (as [`KvConnector::name`] spells it).
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|c| c.name() == s)
    }
}

impl std::fmt::Display for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
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

#[cfg(test)]
mod tests {
    use super::*;

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
