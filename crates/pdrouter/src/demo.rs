//! `pdrouter demo`: two embedded Prefill mocks and one Decode mock on loopback, a PD router with
//! admission in front, an optional short burst that shows the queue at work, then serving until
//! Ctrl-C. Needs no engine, GPU or network. With `--grpc` the mocks speak gRPC and the router
//! tokenizes, with the byte-level tokenizer the mocks serve through `GetTokenizer`. With
//! `--epd` the mocks speak TokenSpeed's protocol, an Encode mock joins them, and the router
//! serves images for a Qwen2-VL-shaped model over that tokenizer (written to a temporary
//! directory, removed at exit). With `--vllm` the mocks imitate vLLM's servers with the NIXL
//! connector (the router detects them). With `--grpc` the Decode mock's model reasons, then
//! calls the weather tool; the router parses both (Qwen's formats) and the demo shows one such
//! answer before serving.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;
use pdrouter_mock::{MockConfig, MockWorker, Role};

use crate::cli::DemoArgs;
use crate::config::{AdmissionSettings, Config, Mode, WorkerSpec, WorkerType};
use crate::proxy::client::{UpstreamClient, json_post};

const LIMIT: u32 = 2;
const QUEUE: usize = 16;
const BURST: usize = 12;

/// What the gRPC demo's model writes: its reasoning, a sentence, then a call in Qwen's format.
const AGENT_TEXT: &str = "<think>The user wants the weather in Paris; get_weather gives it.</think>\
Let me look that up.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

/// The tool the agent example offers.
const AGENT_TOOLS: &str = r#"[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]"#;

/// A small PNG (8 x 8, one colour) for the EPD demo's example request.
const DEMO_PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAEUlEQVR4nGM4ISeHFTEMLQkAkL9BAbKfPiIAAAAASUVORK5CYII=";

/// The transport of the demo's mocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Http,
    Grpc,
    Epd,
    Vllm,
}

impl Kind {
    fn of(args: &DemoArgs) -> Self {
        match (args.epd, args.grpc, args.vllm) {
            (true, _, _) => Self::Epd,
            (false, true, _) => Self::Grpc,
            (false, false, true) => Self::Vllm,
            (false, false, false) => Self::Http,
        }
    }

    fn mode(self) -> Mode {
        match self {
            Self::Http | Self::Vllm => Mode::PdHttp,
            Self::Grpc => Mode::PdGrpc,
            Self::Epd => Mode::EpdGrpc,
        }
    }

    fn transport(self) -> &'static str {
        match self {
            Self::Http => "HTTP workers",
            Self::Grpc => "gRPC workers",
            Self::Epd => "EPD, TokenSpeed gRPC workers",
            Self::Vllm => "vLLM HTTP workers, NIXL handoff",
        }
    }
}

async fn mock(role: Role, delay_ms: u64, kind: Kind) -> Result<MockWorker, String> {
    let mut cfg = MockConfig::new(role);
    cfg.grpc = matches!(kind, Kind::Grpc | Kind::Epd);
    if kind == Kind::Vllm {
        cfg.http_runtime = pdrouter_mock::HttpRuntime::Vllm;
    }
    if kind == Kind::Epd {
        cfg.grpc_runtime = pdrouter_mock::GrpcRuntime::TokenSpeed;
    }
    cfg.delay = Duration::from_millis(delay_ms);
    cfg.token_interval = Duration::from_millis(15);
    cfg.output_tokens = 8;
    if kind == Kind::Grpc && role == Role::Decode {
        // The byte-level tokenizer: a token per byte, then EOS.
        cfg.output_text = Some(AGENT_TEXT.to_owned());
        cfg.output_tokens = u32::try_from(AGENT_TEXT.len()).unwrap_or(u32::MAX) + 1;
        cfg.token_interval = Duration::from_millis(1);
    }
    MockWorker::start(cfg)
        .await
        .map_err(|e| format!("cannot start a mock {role:?} worker: {e}"))
}

/// Runs the demo until Ctrl-C.
pub async fn run(args: DemoArgs) -> Result<(), String> {
    let kind = Kind::of(&args);
    let mocks = Mocks::start(kind).await?;
    let model_dir = match kind {
        Kind::Epd => Some(DemoModel::write()?),
        _ => None,
    };
    let cfg = router_config(&args, kind, mocks.specs(kind), model_dir.as_ref())?;
    let router = crate::start(cfg).await.map_err(|e| e.to_string())?;
    wait_until_routable(&router).await;
    print_intro(&router, kind, &mocks);
    if kind == Kind::Grpc {
        agent_example(router.addr()).await;
    }
    if args.burst {
        burst(&router, router.addr()).await;
    }
    println!("Serving until Ctrl-C.");
    router.run_until_signal().await;
    mocks.shutdown().await;
    drop(model_dir);
    Ok(())
}

/// The demo's mock workers: two slow Prefill ones (so a burst queues), a Decode one and, in
/// EPD, an Encode one.
struct Mocks {
    prefills: [MockWorker; 2],
    decode: MockWorker,
    encode: Option<MockWorker>,
}

impl Mocks {
    async fn start(kind: Kind) -> Result<Self, String> {
        let prefills = [
            mock(Role::Prefill, 600, kind).await?,
            mock(Role::Prefill, 600, kind).await?,
        ];
        let decode = mock(Role::Decode, 0, kind).await?;
        let encode = match kind {
            Kind::Epd => Some(mock(Role::Encode, 0, kind).await?),
            _ => None,
        };
        Ok(Self {
            prefills,
            decode,
            encode,
        })
    }

    /// The router's startup workers: these mocks.
    fn specs(&self, kind: Kind) -> Vec<WorkerSpec> {
        let grpc = matches!(kind, Kind::Grpc | Kind::Epd);
        let mut workers: Vec<WorkerSpec> = self
            .prefills
            .iter()
            .enumerate()
            .map(|(i, p)| WorkerSpec {
                // A gRPC Decode mock fetches its KV ticket from the Prefill mock's own port.
                bootstrap_port: match kind {
                    _ if grpc => Some(p.addr().port()),
                    // vLLM's NIXL handoff needs no bootstrap port.
                    Kind::Vllm => None,
                    _ => (i == 0).then_some(8998),
                },
                ..WorkerSpec::new(p.url(), WorkerType::Prefill)
            })
            .collect();
        workers.push(WorkerSpec::new(self.decode.url(), WorkerType::Decode));
        if let Some(e) = &self.encode {
            workers.push(WorkerSpec {
                bootstrap_port: Some(e.addr().port()),
                ..WorkerSpec::new(e.url(), WorkerType::Encode)
            });
        }
        workers
    }

    async fn shutdown(self) {
        for p in self.prefills {
            p.shutdown().await;
        }
        self.decode.shutdown().await;
        if let Some(e) = self.encode {
            e.shutdown().await;
        }
    }
}

/// The demo router's configuration, validated: PD (or EPD) over `workers`, with admission.
fn router_config(
    args: &DemoArgs,
    kind: Kind,
    workers: Vec<WorkerSpec>,
    model_dir: Option<&DemoModel>,
) -> Result<Config, String> {
    let mut cfg = Config::with_workers(kind.mode(), workers);
    if kind == Kind::Grpc {
        cfg.chat_parsers = crate::config::ChatParsers {
            tool: Some(pdrouter_parsers::ToolKind::Qwen),
            reasoning: Some(pdrouter_parsers::ReasoningKind::Qwen3),
        };
    }
    cfg.tokenizer.model_path = model_dir.map(|m| m.0.clone());
    cfg.host = args.host;
    cfg.port = args.port;
    cfg.prometheus = Some((args.host, 0));
    cfg.health.interval = Duration::from_secs(5);
    cfg.shutdown_grace = Duration::from_secs(5);
    cfg.admission = Some(AdmissionSettings {
        max_inflight_per_worker: LIMIT,
        max_inflight_tokens_per_worker: None,
        queue_size: QUEUE,
        queue_timeout: Duration::from_secs(10),
        auto: None,
        priorities: None,
    });
    cfg.validate().map_err(|e| e.to_string())?;
    Ok(cfg)
}

/// Waits (bounded) until the health checker has made the workers ready.
async fn wait_until_routable(router: &crate::RouterHandle) {
    for _ in 0..100 {
        let snap = router.registry().snapshot();
        if snap.all().iter().all(|w| w.is_routable()) {
            break;
        }
        drop(snap);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where everything listens, and requests to try.
fn print_intro(router: &crate::RouterHandle, kind: Kind, mocks: &Mocks) {
    let addr = router.addr();
    let transport = kind.transport();
    println!("pdrouter demo: PD router on http://{addr} ({transport})");
    if let Some(e) = &mocks.encode {
        println!("  encode  mock {}", e.url());
    }
    for p in &mocks.prefills {
        println!("  prefill mock {} (600 ms per prefill)", p.url());
    }
    println!("  decode  mock {}", mocks.decode.url());
    if let Some(m) = router.metrics_addr() {
        println!("  metrics      http://{m}/metrics");
    }
    println!(
        "  admission: {LIMIT} in-flight Prefill requests per worker, queue {QUEUE}, timeout 10 s"
    );
    println!();
    println!("Try:");
    println!(
        "  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"mock-model\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"stream\":true}}'"
    );
    if mocks.encode.is_some() {
        println!("  with an image (its pixels go to the encode mock, the Prefill waits for them):");
        println!(
            "  curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    -d '{{\"model\":\"mock-model\",\"messages\":[{{\"role\":\"user\",\"content\":[{{\"type\":\"text\",\"text\":\"What is this?\"}},{{\"type\":\"image_url\",\"image_url\":{{\"url\":\"data:image/png;base64,{DEMO_PNG}\"}}}}]}}]}}'"
        );
    }
    println!();
}

/// The EPD demo's model directory: the mocks' byte-level tokenizer and a Qwen2-VL
/// `config.json` whose image token is that tokenizer's `<image>`; removed on drop.
struct DemoModel(std::path::PathBuf);

impl DemoModel {
    fn write() -> Result<Self, String> {
        use pdrouter_tokenizer::bytelevel;
        let dir = std::env::temp_dir().join(format!(
            "pdrouter-demo-model-{}-{:x}",
            std::process::id(),
            rand::random::<u64>()
        ));
        let fail = |e: std::io::Error| format!("cannot write the demo model: {e}");
        std::fs::create_dir_all(&dir).map_err(fail)?;
        let model = DemoModel(dir);
        for (name, data) in bytelevel::files() {
            std::fs::write(model.0.join(name), data).map_err(fail)?;
        }
        let config = serde_json::json!({
            "model_type": "qwen2_vl",
            "image_token_id": bytelevel::IMAGE,
            "vocab_size": bytelevel::VOCAB_SIZE,
        });
        std::fs::write(model.0.join("config.json"), config.to_string()).map_err(fail)?;
        Ok(model)
    }
}

impl Drop for DemoModel {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One chat request with a tool, its answer as the router parsed it.
async fn agent_example(addr: std::net::SocketAddr) {
    println!(
        "Agent example: a chat offering get_weather; the model reasons, then calls it, and the \
         router parses both (--tool-call-parser qwen --reasoning-parser qwen3):"
    );
    let body = format!(
        r#"{{"model":"mock-model","messages":[{{"role":"user","content":"Weather in Paris?"}}],"tools":{AGENT_TOOLS}}}"#
    );
    let req = json_post(
        &format!("http://{addr}"),
        "/v1/chat/completions",
        Bytes::from(body),
        None,
        "demo-agent",
    );
    let answer = match UpstreamClient::new()
        .send(req, Duration::from_secs(30))
        .await
    {
        Ok(resp) => resp.into_body().collect().await.ok().map(|b| b.to_bytes()),
        Err(_) => None,
    };
    let v: serde_json::Value = answer
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let choice = &v["choices"][0];
    let m = &choice["message"];
    println!("  reasoning_content: {}", m["reasoning_content"]);
    println!("  content:           {}", m["content"]);
    for (i, c) in m["tool_calls"].as_array().into_iter().flatten().enumerate() {
        let f = &c["function"];
        println!(
            "  tool_calls[{i}]:     {} {}",
            f["name"].as_str().unwrap_or_default(),
            f["arguments"].as_str().unwrap_or_default()
        );
    }
    println!("  finish_reason:     {}", choice["finish_reason"]);
    println!(
        "  try it: curl -s http://{addr}/v1/chat/completions -H 'content-type: application/json' \\\n    \
         -d '{{\"messages\":[{{\"role\":\"user\",\"content\":\"Weather in Paris?\"}}],\"tools\":{AGENT_TOOLS}}}'"
    );
    println!();
}

async fn burst(router: &crate::RouterHandle, addr: std::net::SocketAddr) {
    println!("Burst: {BURST} requests at once over 2 Prefill workers x {LIMIT} slots:");
    let client = UpstreamClient::new();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for i in 0..BURST {
        let client = client.clone();
        let done = done.clone();
        tasks.push(tokio::spawn(async move {
            let body = format!(
                r#"{{"model":"mock-model","messages":[{{"role":"user","content":"demo request {i}"}}]}}"#
            );
            let req = json_post(
                &format!("http://{addr}"),
                "/v1/chat/completions",
                Bytes::from(body),
                None,
                &format!("demo-{i}"),
            );
            let status = match client.send(req, Duration::from_secs(30)).await {
                Ok(resp) => {
                    let s = resp.status().as_u16();
                    let _ = resp.into_body().collect().await;
                    s
                }
                Err(_) => 0,
            };
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            status
        }));
    }
    let started = tokio::time::Instant::now();
    while done.load(std::sync::atomic::Ordering::Relaxed) < BURST {
        let snap = router.registry().snapshot();
        let slots: Vec<String> = snap
            .of_type(WorkerType::Prefill)
            .iter()
            .map(|w| {
                let used = w.slot().map_or(0, |s| s.inflight());
                format!(
                    "{} [{}{}]",
                    w.url(),
                    "#".repeat(used as usize),
                    ".".repeat(LIMIT.saturating_sub(used) as usize)
                )
            })
            .collect();
        let queued = router.admission().map_or(0, |a| a.queued());
        println!(
            "  t={:>4.1}s  {}  queued {:>2}  done {:>2}/{BURST}",
            started.elapsed().as_secs_f64(),
            slots.join("  "),
            queued,
            done.load(std::sync::atomic::Ordering::Relaxed)
        );
        drop(snap);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let mut statuses = Vec::new();
    for t in tasks {
        statuses.push(t.await.unwrap_or(0));
    }
    let ok = statuses.iter().filter(|s| **s == 200).count();
    println!(
        "  all {BURST} answered in {:.1}s: {ok} x 200, {} other; queue back to {}",
        started.elapsed().as_secs_f64(),
        BURST - ok,
        router.admission().map_or(0, |a| a.queued())
    );
    println!();
}
