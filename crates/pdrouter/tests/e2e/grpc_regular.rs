//! Regular mode over gRPC workers (`--worker-urls grpc://...`): one `Generate` stream per
//! request with the same tokenization and answers as gRPC PD, retries that re-run selection,
//! load released with the answer, `Abort` on client disconnect, DP-aware ranks, and
//! `POST /workers` keeping the router's one transport.

use std::time::Duration;

use crate::support::*;
use pdrouter::config::WorkerType;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(10);

async fn grpc_regular(tune: impl FnOnce(&mut MockConfig)) -> MockWorker {
    let mut cfg = Transport::Grpc.mock(Role::Regular);
    tune(&mut cfg);
    MockWorker::start(cfg).await.expect("gRPC mock starts")
}

#[tokio::test]
async fn chat_and_generate_go_through_one_stream() {
    let w = grpc_regular(|c| c.output_tokens = 12).await;
    let r = router(regular_config(&[&w])).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "mock-model");
    // The mock's text, one byte per token, ended by its EOS (never shown).
    assert_eq!(v["choices"][0]["message"]["content"], "The quick b");
    assert_eq!(v["usage"]["completion_tokens"], 12);
    let last = w.stats().last_request.unwrap();
    assert!(last["disaggregated_params"].is_null(), "{last}");
    assert!(
        last["original_text"]
            .as_str()
            .unwrap()
            .ends_with("<|im_start|>assistant\n")
    );
    assert_eq!(w.stats().requests_total, 1);

    let reply = post(r.addr(), "/v1/chat/completions", CHAT_STREAM).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    let text: String = reply
        .text()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|e| {
            e["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert_eq!(text, "The quick b");

    let reply = post(r.addr(), "/generate", r#"{"text":"hi"}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["text"], "The quick b");
    assert_eq!(
        w.stats().last_request.unwrap()["input_ids"],
        serde_json::json!([104, 105])
    );
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn a_failing_worker_is_retried_on_another() {
    let bad = grpc_regular(|c| c.fail_rate = 1.0).await;
    let good = grpc_regular(|c| c.output_tokens = 3).await;
    let mut cfg = regular_config(&[&bad, &good]);
    cfg.policy = pdrouter_policy::PolicyKind::RoundRobin;
    with_retries(&mut cfg);
    let r = router(cfg).await;
    served_around(&r, &bad).await;
    assert!(metric(&r, "smg_worker_retries_total").unwrap_or(0.0) >= 1.0);

    // Without retries the worker's failure is the client's answer, with the gRPC mapping.
    let mut cfg = regular_config(&[&bad]);
    cfg.retry.max_attempts = 1;
    let r1 = router(cfg).await;
    let reply = post(r1.addr(), "/generate", r#"{"text":"x"}"#).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(reply.error_code(), "worker_error");
    assert!(eventually(WAIT, || total_load(&r) == 0 && total_load(&r1) == 0).await);
}

#[tokio::test]
async fn client_disconnect_aborts_the_stream_and_frees_the_load() {
    let w = grpc_regular(|c| {
        c.output_tokens = 10_000;
        c.token_interval = Duration::from_millis(20);
    })
    .await;
    let r = router(regular_config(&[&w])).await;
    let body = open_chat_stream(r.addr(), 2).await;
    assert_eq!(w.stats().inflight, 1);
    assert_eq!(total_load(&r), 1, "the answer holds the worker's load");
    drop(body);
    assert!(
        eventually(WAIT, || w.stats().aborts_total >= 1).await,
        "aborted"
    );
    assert!(eventually(WAIT, || w.stats().inflight == 0 && total_load(&r) == 0).await);
}

#[tokio::test]
async fn dp_aware_sends_each_entrys_rank() {
    let w = grpc_regular(|c| c.dp_size = 2).await;
    let mut cfg = regular_config(&[&w]);
    cfg.dp_aware = true;
    cfg.policy = pdrouter_policy::PolicyKind::RoundRobin;
    let r = router(cfg).await;
    let urls: Vec<String> = r
        .registry()
        .snapshot()
        .of_type(WorkerType::Regular)
        .iter()
        .map(|w| w.url().to_string())
        .collect();
    assert_eq!(urls, [format!("{}@0", w.url()), format!("{}@1", w.url())]);
    let mut ranks = Vec::new();
    for _ in 0..2 {
        let reply = post(r.addr(), "/generate", r#"{"text":"x"}"#).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        ranks.push(
            w.stats().last_request.unwrap()["data_parallel_rank"]
                .as_u64()
                .unwrap(),
        );
    }
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1]);

    // POST /workers with dp_aware asks the new worker over GetServerInfo too.
    let extra = grpc_regular(|c| c.dp_size = 3).await;
    let body = format!(r#"{{"url":"{}","dp_aware":true}}"#, extra.url());
    let added = post(r.addr(), "/workers", &body).await;
    assert_eq!(added.status, 202, "{}", added.text());
    assert_eq!(added.json()["worker_ids"].as_array().unwrap().len(), 3);
}

#[tokio::test]
async fn workers_api_keeps_one_transport() {
    let w = grpc_regular(|_| {}).await;
    let r = router(regular_config(&[&w])).await;
    let reply = post(r.addr(), "/workers", r#"{"url":"http://127.0.0.1:9"}"#).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    let extra = grpc_regular(|c| c.output_tokens = 2).await;
    let reply = post(
        r.addr(),
        "/workers",
        &format!(r#"{{"url":"{}"}}"#, extra.url()),
    )
    .await;
    assert_eq!(reply.status, 202, "{}", reply.text());
    assert_eq!(
        r.registry().snapshot().of_type(WorkerType::Regular).len(),
        2
    );

    // An HTTP regular router refuses grpc:// workers.
    let h = mock(Role::Regular, 0).await;
    let http = router(regular_config(&[&h])).await;
    let reply = post(
        http.addr(),
        "/workers",
        &format!(r#"{{"url":"{}"}}"#, extra.url()),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
}

#[test]
fn a_regular_pool_mixing_transports_exits_2_with_one_line() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdrouter"))
        .args([
            "launch",
            "--worker-urls",
            "grpc://127.0.0.1:1",
            "http://127.0.0.1:2",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("mix"), "{err}");
}

/// `/get_model_info` and `/get_server_info` are answered from the engine's `GetModelInfo` and
/// `GetServerInfo`, in SGLang's HTTP shapes (launch arguments at the top level).
#[tokio::test]
async fn model_and_server_info_come_from_the_engines_rpcs() {
    let w = grpc_regular(|c| c.dp_size = 2).await;
    let r = router(regular_config(&[&w])).await;

    let reply = get(r.addr(), "/get_model_info").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["model_path"], "mock-model", "{v}");
    assert_eq!(v["is_generation"], true, "{v}");
    assert!(
        v["eos_token_ids"].as_array().is_some_and(|a| !a.is_empty()),
        "{v}"
    );

    let reply = get(r.addr(), "/get_server_info").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["dp_size"], 2, "{v}");
    assert_eq!(v["server_type"], "grpc", "{v}");
    assert_eq!(v["version"], "mock", "{v}");
    assert!(v["scheduler_info"]["max_running_requests"].is_u64(), "{v}");
}

/// A worker that stops answering makes the info routes a worker error, never a 500.
#[tokio::test]
async fn info_from_a_gone_worker_is_a_worker_error() {
    let w = grpc_regular(|_| {}).await;
    let mut cfg = regular_config(&[&w]);
    cfg.health.timeout = Duration::from_millis(500);
    let r = router(cfg).await;
    drop(w);
    let reply = get(r.addr(), "/get_server_info").await;
    assert!(
        [502, 503, 504].contains(&reply.status),
        "{} {}",
        reply.status,
        reply.text()
    );
}
