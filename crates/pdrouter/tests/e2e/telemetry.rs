//! Logs and traces of the binary: `--log-dir` files holding a request's log line, `--log-json`
//! lines that parse, and `--enable-trace` spans received by an in-test OTLP/gRPC collector
//! with the request → admission wait / Prefill / Decode structure.

use std::path::Path;
use std::time::Duration;

use crate::support::*;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;

/// Everything in the files of `dir`, concatenated.
fn read_dir_text(dir: &Path) -> String {
    let mut text = String::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            text.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    text
}

fn log_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("pdrouter.log"))
        .collect()
}

/// Starts the binary with `args` and `env`, sends `body` to `path` with `x-request-id: id`,
/// checks it succeeded, and returns the running child and its address.
async fn launch_and_send(
    args: Vec<String>,
    env: &'static [(&'static str, &'static str)],
    path: &str,
    body: &str,
    id: &str,
) -> (std::process::Child, std::net::SocketAddr) {
    let (child, addr) = tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, Path::new(*v))).collect();
        launch_binary(&args, &env)
    })
    .await
    .unwrap();
    let addr = addr.parse().unwrap();
    let reply = send(
        addr,
        "POST",
        path,
        body.to_string(),
        &[("x-request-id", id)],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    (child, addr)
}

/// Runs the binary with `extra` flags in front of one mock, sends a request with
/// `x-request-id: id`, stops it, and returns the log directory's text.
async fn one_logged_request(dir: &Path, extra: &[&str], id: &str) -> String {
    let w = mock(Role::Regular, 0).await;
    let mut args: Vec<String> = vec![
        "--worker-urls".into(),
        w.url(),
        "--disable-health-check".into(),
        "--log-level".into(),
        "debug".into(),
        "--log-dir".into(),
        dir.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let (child, _) = launch_and_send(args, &[], "/v1/completions", COMPLETION, id).await;
    // Lines are written as they come (a background writer): they show up while it runs.
    let written = eventually(Duration::from_secs(10), || read_dir_text(dir).contains(id)).await;
    let (status, _) = stop_binary(child).await;
    assert!(status.success(), "{status:?}");
    let text = read_dir_text(dir);
    assert!(
        written,
        "no log line with the request id in {dir:?}: {text}"
    );
    text
}

#[tokio::test]
async fn log_dir_holds_rotated_files_with_the_requests_log_lines() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("logs");
    let text = one_logged_request(&dir, &[], "file-probe-17").await;
    let files = log_files(&dir);
    assert_eq!(files.len(), 1, "{files:?}");
    // Daily rotation names the file after the day.
    assert!(files[0].starts_with("pdrouter.log."), "{files:?}");
    assert!(text.contains("router listening"), "{text}");
    assert!(text.contains("request answered"), "{text}");
    assert!(
        !text.contains('\u{1b}'),
        "colour codes in a log file: {text}"
    );
}

#[tokio::test]
async fn log_json_lines_parse_and_carry_the_request_id() {
    let tmp = tempfile::tempdir().unwrap();
    let text = one_logged_request(tmp.path(), &["--log-json"], "json-probe-23").await;
    let mut with_id = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not a JSON line ({e}): {line}"));
        assert!(
            v["level"].is_string() && v["timestamp"].is_string(),
            "{line}"
        );
        if v["span"]["request_id"] == "json-probe-23" {
            with_id += 1;
        }
    }
    assert!(with_id >= 1, "no JSON line carries the request id: {text}");
}

#[test]
fn an_unusable_log_dir_is_exit_2() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, b"x").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdrouter"))
        .args(["launch", "--worker-urls", "http://127.0.0.1:1", "--log-dir"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.starts_with("error: --log-dir: cannot write log files"),
        "{err}"
    );
}

/// An OTLP/gRPC collector that hands every export to the test.
#[derive(Debug)]
struct Collector(tokio::sync::mpsc::UnboundedSender<ExportTraceServiceRequest>);

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running in-test collector: its address and what it received.
struct TestCollector {
    addr: std::net::SocketAddr,
    rx: tokio::sync::mpsc::UnboundedReceiver<ExportTraceServiceRequest>,
    server: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl TestCollector {
    async fn start() -> Self {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(TraceServiceServer::new(Collector(tx)))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        Self { addr, rx, server }
    }

    /// The flags that send the router's spans here.
    fn flags(&self) -> [String; 3] {
        [
            "--enable-trace".into(),
            "--otlp-traces-endpoint".into(),
            self.addr.to_string(),
        ]
    }

    /// Every span received so far (call after the router has exited: it flushes on exit).
    fn spans(mut self) -> Vec<Span> {
        let mut spans = Vec::new();
        while let Ok(export) = self.rx.try_recv() {
            for rs in export.resource_spans {
                for ss in rs.scope_spans {
                    spans.extend(ss.spans);
                }
            }
        }
        self.server.abort();
        spans
    }
}

/// Export batches every 100 ms (the SDK reads this variable); exiting flushes the rest.
const FAST_EXPORT: &[(&str, &str)] = &[("OTEL_BSP_SCHEDULE_DELAY", "100")];

/// The spans named `name` whose parent is `parent`.
fn children<'a>(spans: &'a [Span], parent: &Span, name: &str) -> Vec<&'a Span> {
    spans
        .iter()
        .filter(|s| s.name == name && s.parent_span_id == parent.span_id)
        .collect()
}

fn attr<'a>(span: &'a Span, key: &str) -> Option<&'a str> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| match kv.value.as_ref()?.value.as_ref()? {
            AnyValue::StringValue(s) => Some(s.as_str()),
            _ => None,
        })
}

#[tokio::test]
async fn traces_reach_the_collector_as_a_request_span_with_wait_and_leg_children() {
    let collector = TestCollector::start().await;
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let args: Vec<String> = [
        "--pd-disaggregation",
        "--prefill",
        &p.url(),
        "--decode",
        &d.url(),
        "--disable-health-check",
        "--prefill-max-inflight-requests-per-worker",
        "1",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain(collector.flags())
    .collect();
    let (child, addr) = launch_and_send(
        args,
        FAST_EXPORT,
        "/v1/chat/completions",
        CHAT,
        "trace-probe-5",
    )
    .await;
    // A second request continues a client's trace.
    let client_trace = "0af7651916cd43dd8448eb211c80319c";
    let client_span = "b7ad6b7169203331";
    let traceparent = format!("00-{client_trace}-{client_span}-01");
    let headers = [
        ("x-request-id", "trace-probe-6"),
        ("traceparent", traceparent.as_str()),
    ];
    let reply = send(addr, "POST", "/v1/chat/completions", CHAT, &headers).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // Stopping the router sends whatever is still batched.
    let (status, _) = stop_binary(child).await;
    assert!(status.success(), "{status:?}");

    let spans = collector.spans();
    let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
    let request = |id: &str| {
        spans
            .iter()
            .find(|s| s.name == "request" && attr(s, "request_id") == Some(id))
            .unwrap_or_else(|| panic!("no request span for {id} among {names:?}"))
    };
    let child = |request: &Span, name: &str| {
        let found = children(&spans, request, name);
        assert_eq!(
            found.len(),
            1,
            "{name} children of the request span among {names:?}"
        );
        found[0].clone()
    };

    let root = request("trace-probe-5");
    assert!(
        root.parent_span_id.is_empty(),
        "without traceparent the request span is a root"
    );
    assert_eq!(attr(root, "path"), Some("/v1/chat/completions"));
    for name in ["admission_wait", "prefill", "decode"] {
        let span = child(root, name);
        assert_eq!(span.trace_id, root.trace_id, "{name}");
        assert!(
            span.end_time_unix_nano >= span.start_time_unix_nano,
            "{name}"
        );
    }
    assert_eq!(
        attr(&child(root, "prefill"), "worker"),
        Some(p.url().as_str())
    );
    assert_eq!(
        attr(&child(root, "decode"), "worker"),
        Some(d.url().as_str())
    );
    // The admission wait ends before the Prefill leg starts.
    assert!(
        child(root, "admission_wait").end_time_unix_nano
            <= child(root, "prefill").start_time_unix_nano
    );

    // The client's trace is continued, and each worker gets its own leg span as parent.
    let joined = request("trace-probe-6");
    assert_eq!(hex(&joined.trace_id), client_trace);
    assert_eq!(hex(&joined.parent_span_id), client_span);
    for (worker, leg) in [(&p, "prefill"), (&d, "decode")] {
        let span = child(joined, leg);
        let got = worker.stats().last_headers.unwrap()["traceparent"].clone();
        let want = format!("00-{client_trace}-{}-01", hex(&span.span_id));
        assert_eq!(got, [want], "{leg}");
    }
}

#[test]
fn a_bad_otlp_endpoint_is_exit_2() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdrouter"))
        .args([
            "launch",
            "--worker-urls",
            "http://127.0.0.1:1",
            "--enable-trace",
            "--otlp-traces-endpoint",
            "collector-without-port",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.starts_with("error: --otlp-traces-endpoint"), "{err}");
}

/// The request span of the only request the router saw.
fn only_request(spans: &[Span]) -> &Span {
    let requests: Vec<&Span> = spans.iter().filter(|s| s.name == "request").collect();
    assert_eq!(requests.len(), 1, "{spans:?}");
    requests[0]
}

#[tokio::test]
async fn a_regular_request_has_one_worker_child() {
    let collector = TestCollector::start().await;
    let w = mock(Role::Regular, 0).await;
    let args: Vec<String> = [
        "--worker-urls".to_string(),
        w.url(),
        "--disable-health-check".into(),
    ]
    .into_iter()
    .chain(collector.flags())
    .collect();
    let (child, _) = launch_and_send(args, FAST_EXPORT, "/v1/completions", COMPLETION, "r-1").await;
    let (status, _) = stop_binary(child).await;
    assert!(status.success(), "{status:?}");
    let spans = collector.spans();
    let request = only_request(&spans);
    let legs = children(&spans, request, "worker");
    assert_eq!(legs.len(), 1, "{spans:?}");
    assert_eq!(attr(legs[0], "worker"), Some(w.url().as_str()));
    assert!(
        children(&spans, request, "admission_wait").is_empty(),
        "no admission in regular mode"
    );
}

#[tokio::test]
async fn a_grpc_pd_request_has_prefill_and_decode_children() {
    let collector = TestCollector::start().await;
    let grpc = |role| {
        let mut cfg = MockConfig::new(role);
        cfg.grpc = true;
        MockWorker::start(cfg)
    };
    let p = grpc(Role::Prefill).await.unwrap();
    let d = grpc(Role::Decode).await.unwrap();
    let tokenizer = tempfile::tempdir().unwrap();
    for (name, data) in pdrouter_tokenizer::bytelevel::files() {
        std::fs::write(tokenizer.path().join(name), data).unwrap();
    }
    let args: Vec<String> = [
        "--pd-disaggregation".to_string(),
        "--prefill".into(),
        p.url(),
        p.addr().port().to_string(),
        "--decode".into(),
        d.url(),
        "--disable-health-check".into(),
        "--model-path".into(),
        tokenizer.path().display().to_string(),
    ]
    .into_iter()
    .chain(collector.flags())
    .collect();
    let (child, _) = launch_and_send(args, FAST_EXPORT, "/v1/chat/completions", CHAT, "g-1").await;
    let (status, _) = stop_binary(child).await;
    assert!(status.success(), "{status:?}");
    let spans = collector.spans();
    let request = only_request(&spans);
    for (leg, worker) in [("prefill", &p), ("decode", &d)] {
        let found = children(&spans, request, leg);
        assert_eq!(found.len(), 1, "{leg}: {spans:?}");
        assert_eq!(attr(found[0], "worker"), Some(worker.url().as_str()));
        // Each Generate call carries its own leg span's trace context as metadata.
        let got = worker.stats().last_headers.unwrap()["traceparent"].clone();
        let want = format!(
            "00-{}-{}-01",
            hex(&request.trace_id),
            hex(&found[0].span_id)
        );
        assert_eq!(got, [want], "{leg}");
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}
