//! The `pdrouter-mock` binary.

mod common;

use std::net::SocketAddr;
use std::process::Stdio;

use common::{TIMEOUT, get, post};
use hyper::StatusCode;
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_pdrouter-mock");

/// Starts the binary and returns it with its listening line, minus the fixed prefix
/// (`ADDR role=ROLE [bootstrap_port=PORT]`). The child is killed when dropped.
async fn spawn_listening(args: &[&str]) -> (tokio::process::Child, String) {
    spawn_listening_on("http", args).await
}

/// [`spawn_listening`] for a worker whose URL has `scheme`.
async fn spawn_listening_on(scheme: &str, args: &[&str]) -> (tokio::process::Child, String) {
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn pdrouter-mock");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    tokio::time::timeout(TIMEOUT, BufReader::new(stdout).read_line(&mut line))
        .await
        .expect("listening line in time")
        .unwrap();
    let rest = line
        .trim_end()
        .strip_prefix(&format!("pdrouter-mock listening on {scheme}://"))
        .unwrap_or_else(|| panic!("unexpected line {line:?}"))
        .to_string();
    (child, rest)
}

#[tokio::test]
async fn binary_prints_bound_address_and_serves() {
    let (mut child, line) = spawn_listening(&[
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--role",
        "prefill",
        "--delay-ms",
        "1",
        "--output-tokens",
        "4",
        "--token-interval-ms",
        "0",
        "--fail-rate",
        "0",
        "--dp-size",
        "2",
        "--model",
        "cli-model",
    ])
    .await;
    let rest = line.as_str();
    let (addr, role) = rest.split_once(' ').unwrap();
    assert_eq!(role, "role=prefill");
    let addr: SocketAddr = addr.parse().unwrap();
    assert_ne!(addr.port(), 0);

    assert_eq!(get(addr, "/health").await.status, StatusCode::OK);
    let info = get(addr, "/get_server_info").await.json();
    assert_eq!(info["dp_size"], 2);
    assert_eq!(info["model_path"], "cli-model");
    assert_eq!(info["disaggregation_mode"], "prefill");
    let r = post(
        addr,
        "/generate",
        &json!({"text": "x", "bootstrap_room": 3}),
    )
    .await;
    assert_eq!(r.json()["text"], " tok0");

    child.start_kill().unwrap();
    child.wait().await.unwrap();
}

#[tokio::test]
async fn invalid_flags_exit_non_zero() {
    for args in [
        vec!["--role", "sideways"],
        vec!["--port", "0"],
        vec!["--role", "decode", "--fail-rate", "1.5"],
        vec!["--role", "decode", "--dp-size", "0"],
        vec!["--role", "decode", "--bogus"],
    ] {
        let out = Command::new(BIN).args(&args).output().await.unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("error"), "{args:?}: {err}");
    }
}

#[test]
fn role_parses_from_str() {
    use pdrouter_mock::Role;
    assert_eq!("prefill".parse::<Role>().unwrap(), Role::Prefill);
    assert_eq!("Decode".parse::<Role>().unwrap(), Role::Decode);
    assert_eq!(Role::Regular.to_string(), "regular");
    assert!("x".parse::<Role>().is_err());
}

#[test]
fn args_map_to_config() {
    use clap::Parser;
    use pdrouter_mock::{MockArgs, MockConfig, Role};
    use std::time::Duration;
    let args = MockArgs::parse_from([
        "pdrouter-mock",
        "--role",
        "decode",
        "--delay-ms",
        "7",
        "--token-interval-ms",
        "3",
        "--encode-wait-ms",
        "1500",
    ]);
    let cfg = MockConfig::from(args);
    let mut want = MockConfig::new(Role::Decode);
    want.delay = Duration::from_millis(7);
    want.token_interval = Duration::from_millis(3);
    want.encode_wait = Duration::from_millis(1500);
    assert_eq!(cfg, want);
    let grpc = MockConfig::from(MockArgs::parse_from(["m", "--role", "prefill", "--grpc"]));
    assert!(grpc.grpc);
}

#[tokio::test]
async fn engine_prefill_prints_its_bootstrap_port() {
    let (mut child, line) = spawn_listening(&[
        "--role",
        "prefill",
        "--engine",
        "--max-running",
        "5",
        "--prefill-tokens-per-sec",
        "500",
        "--bootstrap-port",
        "0",
    ])
    .await;
    let rest = line.as_str();
    let parts: Vec<&str> = rest.split(' ').collect();
    assert_eq!(parts[1], "role=prefill");
    let port: u16 = parts[2]
        .strip_prefix("bootstrap_port=")
        .unwrap_or_else(|| panic!("no bootstrap port in {line:?}"))
        .parse()
        .unwrap();
    assert_ne!(port, 0);
    let addr: SocketAddr = parts[0].parse().unwrap();
    let info = get(addr, "/get_server_info").await.json();
    assert_eq!(info["max_running_requests"], 5);
    let bootstrap = SocketAddr::new(addr.ip(), port);
    assert_eq!(get(bootstrap, "/health").await.status, StatusCode::OK);
    child.kill().await.unwrap();
}

#[tokio::test]
async fn grpc_flag_serves_the_scheduler_protocol() {
    use pdrouter_proto::scheduler::GetServerInfoRequest;
    use pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient;
    let (mut child, line) =
        spawn_listening_on("grpc", &["--grpc", "--role", "decode", "--dp-size", "3"]).await;
    let (addr, role) = line.split_once(' ').unwrap();
    assert_eq!(role, "role=decode");
    let addr: SocketAddr = addr.parse().unwrap();
    assert_eq!(get(addr, "/health").await.status, StatusCode::OK);
    let mut client = SglangSchedulerClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let info = client
        .get_server_info(GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let dp = info.server_args.unwrap().fields["dp_size"].clone();
    assert_eq!(dp.kind, Some(prost_types::value::Kind::NumberValue(3.0)));
    child.kill().await.unwrap();
}

#[tokio::test]
async fn engine_flags_need_engine_mode() {
    let out = Command::new(BIN)
        .args(["--role", "prefill", "--max-running", "5"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--engine"), "{err}");
}

#[tokio::test]
async fn binary_runs_vllm_mode_over_http() {
    let (mut child, line) = spawn_listening(&[
        "--role",
        "prefill",
        "--runtime",
        "vllm",
        "--kv-abort-timeout-ms",
        "60000",
    ])
    .await;
    let (addr, role) = line.split_once(' ').unwrap();
    assert_eq!(role, "role=prefill", "no bootstrap port in vLLM mode");
    let addr: SocketAddr = addr.parse().unwrap();
    assert_eq!(
        get(addr, "/version").await.json(),
        json!({"version": "0.11.0"})
    );
    let r = post(
        addr,
        "/v1/completions",
        &json!({"prompt": "abcd", "max_tokens": 1,
                "kv_transfer_params": {"do_remote_decode": true}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["kv_transfer_params"]["remote_port"], addr.port());
    child.start_kill().unwrap();
    child.wait().await.unwrap();

    let out = Command::new(BIN)
        .args(["--role", "decode", "--runtime", "tokenspeed"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success(), "tokenspeed needs --grpc");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("error"), "{err}");
}

#[tokio::test]
async fn binary_runs_vllm_mode_over_grpc_with_its_connector() {
    use pdrouter_proto::vllm_engine::GetServerInfoRequest;
    use pdrouter_proto::vllm_engine::vllm_engine_client::VllmEngineClient;
    let (mut child, line) = spawn_listening_on(
        "grpc",
        &[
            "--grpc",
            "--runtime",
            "vllm",
            "--role",
            "prefill",
            "--kv-connector",
            "mooncake",
            "--dp-size",
            "2",
        ],
    )
    .await;
    let parts: Vec<&str> = line.split(' ').collect();
    assert_eq!(parts[1], "role=prefill");
    let port: u16 = parts
        .get(2)
        .and_then(|p| p.strip_prefix("bootstrap_port="))
        .unwrap_or_else(|| panic!("no bootstrap port in {line:?}"))
        .parse()
        .unwrap();
    let addr: SocketAddr = parts[0].parse().unwrap();
    let query = get(SocketAddr::new(addr.ip(), port), "/query").await.json();
    let mut client = VllmEngineClient::connect(format!("http://{addr}"))
        .await
        .unwrap();
    let info = client
        .get_server_info(GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (info.server_type.as_str(), info.kv_connector.as_str()),
        ("vllm-grpc", "MooncakeConnector")
    );
    assert_eq!(
        (info.kv_role.as_str(), info.data_parallel_size),
        ("kv_producer", 2)
    );
    assert_eq!(query["0"]["engine_id"], info.kv_engine_id.as_str());
    let stats = get(addr, "/mock/stats").await.json();
    assert_eq!(stats["kv_connector"], "mooncake");
    child.start_kill().unwrap();
    child.wait().await.unwrap();
}

#[tokio::test]
async fn binary_serves_the_mooncake_bootstrap_and_checks_connector_flags() {
    let (mut child, line) = spawn_listening(&[
        "--role",
        "prefill",
        "--runtime",
        "vllm",
        "--kv-connector",
        "mooncake",
        "--dp-size",
        "2",
    ])
    .await;
    let parts: Vec<&str> = line.split(' ').collect();
    assert_eq!(parts[1], "role=prefill");
    let port: u16 = parts
        .get(2)
        .and_then(|p| p.strip_prefix("bootstrap_port="))
        .unwrap_or_else(|| panic!("no bootstrap port in {line:?}"))
        .parse()
        .unwrap();
    let addr: SocketAddr = parts[0].parse().unwrap();
    let query = get(SocketAddr::new(addr.ip(), port), "/query").await.json();
    assert_eq!(query.as_object().map(|m| m.len()), Some(2), "{query}");
    assert_eq!(
        get(addr, "/mock/stats").await.json()["kv_connector"],
        "mooncake"
    );
    child.start_kill().unwrap();
    child.wait().await.unwrap();

    for (args, says) in [
        (vec!["--kv-connector", "lmcache"], "--runtime vllm"),
        (
            vec!["--runtime", "vllm", "--lmcache-peer", "http://127.0.0.1:1"],
            "--kv-connector lmcache",
        ),
    ] {
        let out = Command::new(BIN)
            .args(["--role", "prefill"])
            .args(&args)
            .output()
            .await
            .unwrap();
        assert!(!out.status.success(), "{args:?} should fail");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}
