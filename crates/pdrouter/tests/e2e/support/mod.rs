//! Shared helpers for black-box tests: real mock workers and a real router on ephemeral
//! loopback ports, a small HTTP client, and polling with a deadline (never a fixed sleep).
#![allow(dead_code, unreachable_pub, unused_macros, unused_imports)]

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use pdrouter::RouterHandle;
use pdrouter::config::{Config, Mode, WorkerSpec, WorkerType};
pub use pdrouter_mock::{MockConfig, MockWorker, PortReservation, Role};

pub mod redis_server;

pub async fn mock(role: Role, delay_ms: u64) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.delay = Duration::from_millis(delay_ms);
    MockWorker::start(cfg).await.expect("mock starts")
}

pub fn spec(url: &str, t: WorkerType) -> WorkerSpec {
    WorkerSpec::new(url, t)
}

/// The protocol mock workers and the router speak to each other; scenarios that hold for
/// both are written once over a `Transport` and run for each (see [`both_transports`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    Http,
    /// gRPC workers speaking SGLang's protocol.
    Grpc,
    /// gRPC workers speaking TokenSpeed's protocol.
    TokenSpeed,
    /// HTTP workers imitating vLLM's server (the sequential NIXL handoff).
    Vllm,
    /// gRPC workers speaking vLLM's engine protocol (the same sequential handoff).
    GrpcVllm,
}

impl Transport {
    /// A mock config of `role` speaking this transport.
    pub fn mock(self, role: Role) -> MockConfig {
        let mut cfg = MockConfig::new(role);
        cfg.grpc = matches!(
            self,
            Transport::Grpc | Transport::TokenSpeed | Transport::GrpcVllm
        );
        if self == Transport::GrpcVllm {
            cfg.grpc_runtime = pdrouter_mock::GrpcRuntime::Vllm;
        }
        if self == Transport::Vllm {
            cfg.http_runtime = pdrouter_mock::HttpRuntime::Vllm;
        }
        if self == Transport::TokenSpeed {
            cfg.grpc_runtime = pdrouter_mock::GrpcRuntime::TokenSpeed;
        }
        cfg
    }

    /// Whether Decode is sent only once the Prefill answered (vLLM's handoff, either
    /// transport).
    pub fn sequential(self) -> bool {
        matches!(self, Transport::Vllm | Transport::GrpcVllm)
    }

    /// Starts an engine-mode mock of `role` (64 running, instant prefill, its own KV
    /// bootstrap port): a hung Prefill keeps its engine slot and the Decode waits for that
    /// Prefill's KV, as real engines do.
    pub async fn engine(self, role: Role) -> MockWorker {
        let mut cfg = self.mock(role);
        cfg.engine = Some(pdrouter_mock::EngineConfig {
            max_running: 64,
            prefill_tokens_per_sec: 1e9,
            bootstrap_port: 0,
            ..pdrouter_mock::EngineConfig::new()
        });
        MockWorker::start(cfg).await.expect("mock starts")
    }

    /// Starts a mock of `role` with `delay_ms` before its answer.
    pub async fn start(self, role: Role, delay_ms: u64) -> MockWorker {
        let mut cfg = self.mock(role);
        cfg.delay = Duration::from_millis(delay_ms);
        MockWorker::start(cfg).await.expect("mock starts")
    }
}

/// Runs each named `async fn(Transport)` scenario once per listed transport, as the test
/// `NAME::TEST` with the given test attribute (`[http => Http, ...]`: test name => variant).
macro_rules! over_transports {
    ($ts:tt #[$attr:meta] $($name:ident),+ $(,)?) => {$(
        over_transports!(@one $ts #[$attr] $name);
    )+};
    (@one [$($test:ident => $variant:ident),+] #[$attr:meta] $name:ident) => {
        mod $name {$(
            #[$attr]
            async fn $test() {
                super::$name(super::Transport::$variant).await
            }
        )+}
    };
}
pub(crate) use over_transports;

/// Each scenario as `NAME::http` and `NAME::grpc`.
macro_rules! both_transports {
    ($($rest:tt)*) => {
        over_transports!([http => Http, grpc => Grpc] $($rest)*);
    };
}
pub(crate) use both_transports;

/// [`both_transports`] plus `NAME::tokenspeed`: the scenario over gRPC workers speaking
/// TokenSpeed's protocol.
macro_rules! all_transports {
    ($($rest:tt)*) => {
        over_transports!([http => Http, grpc => Grpc, tokenspeed => TokenSpeed] $($rest)*);
    };
}
pub(crate) use all_transports;

/// [`all_transports`] plus `NAME::vllm` and `NAME::vllm_grpc`: the scenario over workers
/// imitating vLLM's HTTP server and its gRPC engine, where the Decode leg starts only once the
/// Prefill answered.
#[allow(unused_macros)]
macro_rules! every_engine {
    ($($rest:tt)*) => {
        over_transports!(
            [
                http => Http,
                grpc => Grpc,
                tokenspeed => TokenSpeed,
                vllm => Vllm,
                vllm_grpc => GrpcVllm
            ] $($rest)*
        );
    };
}
#[allow(unused_imports)]
pub(crate) use every_engine;

/// The prompt text a mock received last: the chat message's content over HTTP, the text the
/// router tokenized over gRPC (the rendered chat, which contains it).
pub fn last_prompt_text(w: &MockWorker) -> String {
    let last = w
        .stats()
        .last_request
        .expect("a request reached the worker");
    let text = if w.is_grpc() {
        &last["original_text"]
    } else {
        &last["messages"][0]["content"]
    };
    text.as_str().expect("prompt text").to_string()
}

/// A PD config over the given mocks, health checks off (workers start ready), retries off.
/// gRPC mocks make it a gRPC PD config, each Prefill's bootstrap port its own (where a
/// Decode mock waits for the room).
pub fn pd_config(prefills: &[&MockWorker], decodes: &[&MockWorker]) -> Config {
    let mut workers: Vec<WorkerSpec> = prefills
        .iter()
        .map(|p| {
            let mut s = spec(&p.url(), WorkerType::Prefill);
            if p.is_grpc() {
                s.bootstrap_port = Some(p.bootstrap_addr().unwrap_or(p.addr()).port());
            }
            s
        })
        .collect();
    workers.extend(decodes.iter().map(|d| spec(&d.url(), WorkerType::Decode)));
    let grpc = prefills.iter().chain(decodes).any(|w| w.is_grpc());
    let mode = if grpc { Mode::PdGrpc } else { Mode::PdHttp };
    let mut cfg = Config::with_workers(mode, workers);
    cfg.health.enabled = false;
    cfg.retry.max_attempts = 1;
    cfg.prometheus = Some(([127, 0, 0, 1].into(), 0));
    cfg.shutdown_grace = Duration::from_secs(5);
    cfg
}

/// Admission settings: `limit` per Prefill worker, `queue` waiters, `timeout_secs` wait.
pub fn admission(
    limit: u32,
    queue: usize,
    timeout_secs: u64,
) -> Option<pdrouter::config::AdmissionSettings> {
    Some(pdrouter::config::AdmissionSettings {
        max_inflight_per_worker: limit,
        max_inflight_tokens_per_worker: None,
        queue_size: queue,
        queue_timeout: Duration::from_secs(timeout_secs),
        auto: None,
        priorities: None,
    })
}

pub fn regular_config(workers: &[&MockWorker]) -> Config {
    let specs = workers
        .iter()
        .map(|w| spec(&w.url(), WorkerType::Regular))
        .collect();
    let grpc = workers.iter().any(|w| w.is_grpc());
    let mode = if grpc {
        Mode::RegularGrpc
    } else {
        Mode::Regular
    };
    let mut cfg = Config::with_workers(mode, specs);
    cfg.health.enabled = false;
    cfg.retry.max_attempts = 1;
    cfg.prometheus = Some(([127, 0, 0, 1].into(), 0));
    cfg
}

/// Up to three attempts per request, with a negligible backoff.
pub fn with_retries(cfg: &mut Config) {
    cfg.retry.max_attempts = 3;
    cfg.retry.initial_backoff = Duration::from_millis(1);
}

/// Sends four small `/generate` requests that must all succeed although `bad` (which fails
/// every request) was tried: retries re-ran the selection.
pub async fn served_around(r: &RouterHandle, bad: &MockWorker) {
    for _ in 0..4 {
        let reply = post(r.addr(), "/generate", r#"{"text":"x"}"#).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert!(
        bad.stats().requests_total >= 1,
        "the failing worker was tried"
    );
}

pub async fn router(mut cfg: Config) -> RouterHandle {
    with_store_from_env(&mut cfg);
    cfg.validate().expect("valid config");
    pdrouter::start(cfg).await.expect("router starts")
}

/// With `PDROUTER_TEST_ADMISSION_STORE=redis://...` set (`.ci/run` sets it for a second run of
/// the admission suite), every router with a fixed request limit shares it through that store,
/// in a group of its own: a lone replica must behave exactly as without the store. (A limit
/// sized by `auto` is never shared: the two exclude each other.)
fn with_store_from_env(cfg: &mut Config) {
    let Ok(url) = std::env::var("PDROUTER_TEST_ADMISSION_STORE") else {
        return;
    };
    let limited = cfg.admission.is_some_and(|a| {
        a.max_inflight_per_worker != pdrouter::config::NO_COUNT_LIMIT && a.auto.is_none()
    });
    if !limited || cfg.admission_store.is_some() {
        return;
    }
    cfg.admission_store = Some(pdrouter::config::StoreSettings {
        url: pdrouter::config::StoreUrl::parse(&url).expect("PDROUTER_TEST_ADMISSION_STORE"),
        group: format!("e2e-{:016x}", rand::random::<u64>()),
        interval: Duration::from_millis(100),
        lease_ttl: Duration::from_secs(3),
        fallback: pdrouter::config::Fallback::Hold,
    });
}

#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
    /// Asserts the documented error shape (README, Errors) and returns the code.
    pub fn error_code(&self) -> String {
        let v = self.json();
        let code = v["error"]["code"].as_str().expect("error.code").to_string();
        assert!(v["error"]["message"].is_string(), "error.message: {v}");
        assert!(v["error"]["type"].is_string(), "error.type: {v}");
        assert!(v["error"].get("param").is_some(), "error.param: {v}");
        assert_eq!(self.header("x-smg-error-code"), Some(code.as_str()));
        code
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: impl Into<Bytes>,
    headers: &[(&str, &str)],
) -> Reply {
    let mut b = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client()
        .request(b.body(Full::new(body.into())).unwrap())
        .await
        .expect("request reaches the router");
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    Reply {
        status,
        headers,
        body,
    }
}

/// Starts a streaming chat request and reads its first `frames` body frames (the role event
/// first, then text); the caller holds the rest of the body, and drops it to disconnect.
pub async fn open_chat_stream(addr: SocketAddr, frames: usize) -> hyper::body::Incoming {
    let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(CHAT_STREAM)))
        .unwrap();
    let resp = client()
        .request(req)
        .await
        .expect("request reaches the router");
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    for _ in 0..frames {
        tokio::time::timeout(Duration::from_secs(10), body.frame())
            .await
            .expect("a frame in time");
    }
    body
}

pub async fn post(addr: SocketAddr, path: &str, body: &str) -> Reply {
    send(addr, "POST", path, body.to_string(), &[]).await
}

pub async fn get(addr: SocketAddr, path: &str) -> Reply {
    send(addr, "GET", path, Bytes::new(), &[]).await
}

pub const CHAT: &str =
    r#"{"model":"mock-model","messages":[{"role":"user","content":"hello there"}]}"#;
pub const COMPLETION: &str = r#"{"prompt":"x"}"#;
pub const CHAT_STREAM: &str =
    r#"{"model":"mock-model","messages":[{"role":"user","content":"hello there"}],"stream":true}"#;

/// Polls `f` every 10 ms until it returns true or `within` passes.
pub async fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sum of all workers' in-flight load.
pub fn total_load(r: &RouterHandle) -> u64 {
    r.registry().snapshot().all().iter().map(|w| w.load()).sum()
}

/// Value of a metric series in the router's exposition (first line starting with `prefix`).
pub fn metric(r: &RouterHandle, prefix: &str) -> Option<f64> {
    r.metrics_text()
        .lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// `smg_pd_kv_handoffs_total` for `outcome` (`relayed`, `recomputed`, `skipped`), 0 before
/// the first.
#[allow(dead_code)]
pub fn kv_handoffs(r: &RouterHandle, outcome: &str) -> f64 {
    metric(
        r,
        &format!("smg_pd_kv_handoffs_total{{outcome=\"{outcome}\"}}"),
    )
    .unwrap_or(0.0)
}

/// A URL that refuses connections: a reserved port nobody listens on (the reservation keeps
/// another process from taking it while the test runs, so keep it alive).
pub fn dead_url() -> PortReservation {
    PortReservation::new().expect("a free loopback port")
}

/// Starts the `pdrouter` binary as `pdrouter launch ARGS`, on loopback with ephemeral router
/// and Prometheus ports unless `args` set those flags, with extra environment variables. Returns the child and the `host:port` from its first stdout line.
/// Blocks while reading that line: call it from `spawn_blocking` when in-process servers must
/// keep running.
pub fn launch_binary<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    env: &[(&str, &std::path::Path)],
) -> (std::process::Child, String) {
    launch_binary_with(args, env, std::process::Stdio::null())
}

/// [`launch_binary`], with the router's log (stderr) going to `stderr`.
pub fn launch_binary_with<S: AsRef<std::ffi::OsStr>>(
    args: &[S],
    env: &[(&str, &std::path::Path)],
    stderr: std::process::Stdio,
) -> (std::process::Child, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pdrouter"));
    cmd.arg("launch");
    for (flag, value) in [
        ("--host", "127.0.0.1"),
        ("--port", "0"),
        ("--prometheus-host", "127.0.0.1"),
        ("--prometheus-port", "0"),
    ] {
        if !args.iter().any(|a| a.as_ref() == flag) {
            cmd.args([flag, value]);
        }
    }
    cmd.args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("pdrouter starts");
    let addr = listening_addr(&mut child);
    (child, addr)
}

/// The `host:port` a started `pdrouter` (stdout piped) prints first.
pub fn listening_addr(child: &mut std::process::Child) -> String {
    use std::io::{BufRead, BufReader};
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().expect("piped stdout"))
        .read_line(&mut line)
        .expect("first line");
    line.trim()
        .strip_prefix("pdrouter listening on http://")
        .or_else(|| line.trim().strip_prefix("pdrouter listening on https://"))
        .unwrap_or_else(|| panic!("unexpected first line: {line}"))
        .to_string()
}

/// Sends SIGTERM to a child started by [`launch_binary`].
pub fn sigterm(child: &std::process::Child) {
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// A gRPC mock of `role`, tuned by `tune`.
pub async fn grpc_mock(role: Role, tune: impl FnOnce(&mut MockConfig)) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.grpc = true;
    tune(&mut cfg);
    MockWorker::start(cfg).await.expect("gRPC mock starts")
}

/// A Prefill mock, a Decode mock producing `tokens` tokens, and a gRPC PD config over them
/// whose Prefill bootstrap port is the Prefill mock's own (the Decode mock waits for its room
/// there).
pub async fn pair(tokens: u32) -> (MockWorker, MockWorker, Config) {
    pair_tuned(|c| c.output_tokens = tokens).await
}

/// [`pair`] with the Decode mock tuned by `tune`.
pub async fn pair_tuned(tune: impl FnOnce(&mut MockConfig)) -> (MockWorker, MockWorker, Config) {
    let p = grpc_mock(Role::Prefill, |_| {}).await;
    let d = grpc_mock(Role::Decode, tune).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.mode = Mode::PdGrpc;
    cfg.workers[0].bootstrap_port = Some(p.addr().port());
    (p, d, cfg)
}

/// The mock's byte-level tokenizer files in a fresh directory.
pub fn tokenizer_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, data) in pdrouter_tokenizer::bytelevel::files() {
        std::fs::write(dir.path().join(name), data).unwrap();
    }
    dir
}

/// What the router should have made of the Decode mock's last generation.
pub fn detokenized(d: &MockWorker) -> String {
    let dir = tokenizer_dir();
    let t = pdrouter_tokenizer::Tokenizer::load(dir.path(), None).unwrap();
    let ids = d.stats().last_output_ids.expect("a finished generation");
    t.decode(&ids, pdrouter_tokenizer::DecodeOptions::default())
        .unwrap()
}

/// The `data:` payloads of an SSE body, without the final `[DONE]`.
pub fn sse_events(body: &str) -> Vec<serde_json::Value> {
    body.split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// A gRPC PD pair whose Decode mock streams (practically) without end, a token every 20 ms.
pub async fn endless_pair() -> (MockWorker, MockWorker, Config) {
    pair_tuned(|c| {
        c.output_tokens = 10_000;
        c.token_interval = Duration::from_millis(20);
    })
    .await
}

/// Waits until a PD request's legs are over: neither mock runs anything, and the router holds
/// no load and no Prefill slot.
pub async fn assert_legs_released(r: &RouterHandle, p: &MockWorker, d: &MockWorker) {
    const WAIT: Duration = Duration::from_secs(10);
    assert!(eventually(WAIT, || d.stats().inflight == 0 && p.stats().inflight == 0).await);
    assert!(eventually(WAIT, || total_load(r) == 0).await);
    assert!(
        eventually(WAIT, || metric(r, "smg_pd_prefill_admission_inflight")
            == Some(0.0))
        .await
    );
}

/// Posts `body` to `path` and returns the answer's status and body, still streaming.
pub async fn open_stream(
    addr: SocketAddr,
    path: &str,
    body: &'static str,
) -> (http::StatusCode, hyper::body::Incoming) {
    let req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    (resp.status(), resp.into_body())
}

/// Stops a child started by [`launch_binary`] with SIGTERM and waits for it to exit (off the
/// runtime's threads); returns how it exited and its stderr when that was piped.
pub async fn stop_binary(mut child: std::process::Child) -> (std::process::ExitStatus, String) {
    sigterm(&child);
    tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut log = String::new();
        if let Some(mut stderr) = child.stderr.take() {
            stderr.read_to_string(&mut log).unwrap();
        }
        (child.wait().unwrap(), log)
    })
    .await
    .unwrap()
}
