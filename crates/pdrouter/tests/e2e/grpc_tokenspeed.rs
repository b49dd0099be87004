//! TokenSpeed workers over gRPC, end to end against mock workers speaking only TokenSpeed's
//! protocol: runtime detection (with and without the `--runtime` hint), PD with one
//! `kv_bootstrap_info` on both legs for every endpoint, streaming and not, sampling scalars
//! sent only when the client set them, the refusals (prompt logprobs, a PD pair of two
//! runtimes, unreachable or non-gRPC worker URLs), a long prompt reaching both legs whole,
//! and nothing held afterwards. The admission
//! scenarios run over TokenSpeed too (`admission_e2e`, `chaos`, `prefill_release`).

use std::time::Duration;

use crate::support::*;
use pdrouter::config::{Config, Mode, WorkerType};
use pdrouter::grpc::runtime::Runtime;
use pdrouter_mock::GrpcRuntime;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(10);

async fn ts_mock(role: Role, tune: impl FnOnce(&mut MockConfig)) -> MockWorker {
    grpc_mock(role, |c| {
        c.grpc_runtime = GrpcRuntime::TokenSpeed;
        tune(c);
    })
    .await
}

/// A TokenSpeed Prefill and Decode pair (Decode generating `tokens`) and a gRPC PD config
/// over them, health checks off: the router learns the runtime at the first request.
async fn ts_pair(tokens: u32) -> (MockWorker, MockWorker, Config) {
    let p = ts_mock(Role::Prefill, |_| {}).await;
    let d = ts_mock(Role::Decode, |c| c.output_tokens = tokens).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.mode = Mode::PdGrpc;
    cfg.workers[0].bootstrap_port = Some(p.addr().port());
    (p, d, cfg)
}

/// Waits until `f` holds for every registered worker.
async fn every_worker(
    r: &pdrouter::RouterHandle,
    f: impl Fn(&pdrouter::registry::Worker) -> bool,
) -> bool {
    eventually(WAIT, || r.registry().snapshot().all().iter().all(|w| f(w))).await
}

fn runtime_of(r: &pdrouter::RouterHandle, url: &str) -> Option<Runtime> {
    r.registry()
        .snapshot()
        .all()
        .iter()
        .find(|w| w.url() == url)
        .and_then(|w| w.runtime())
}

#[tokio::test]
async fn pd_legs_share_one_kv_ticket_for_every_endpoint_streaming_or_not() {
    let (p, d, cfg) = ts_pair(12).await;
    let r = router(cfg).await;
    let cases = [
        ("/v1/chat/completions", CHAT, false),
        ("/v1/chat/completions", CHAT_STREAM, true),
        ("/v1/completions", r#"{"prompt":"x"}"#, false),
        ("/v1/completions", r#"{"prompt":"x","stream":true}"#, true),
        ("/generate", r#"{"text":"x"}"#, false),
        ("/generate", r#"{"text":"x","stream":true}"#, true),
    ];
    let mut rooms = Vec::new();
    for (path, body, stream) in cases {
        let reply = post(r.addr(), path, body).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        let pl = p.stats().last_request.unwrap();
        let dl = d.stats().last_request.unwrap();
        assert_eq!(dl["runtime"], "tokenspeed");
        assert_eq!(pl["request_id"], dl["request_id"]);
        assert_eq!(pl["input_ids"], dl["input_ids"]);
        assert_eq!(pl["kv_bootstrap_info"], dl["kv_bootstrap_info"], "{path}");
        let kv = &dl["kv_bootstrap_info"];
        assert_eq!(kv["bootstrap_host"], "127.0.0.1");
        assert_eq!(kv["bootstrap_port"], p.addr().port());
        let room = kv["bootstrap_room"].as_i64().expect("an int64 room");
        assert!(room >= 0);
        rooms.push(room as u64);
        assert_eq!(dl["has_mm_inputs"], false);
        assert_eq!(dl["has_encode_bootstrap_info"], false);
        if stream {
            assert_eq!(reply.header("content-type"), Some("text/event-stream"));
            assert!(reply.text().ends_with("data: [DONE]\n\n"), "{path}");
        } else {
            // Decode's output, detokenized by the router, reached the client.
            let text = reply.json().to_string();
            assert!(text.contains("quick"), "{path}: {text}");
        }
    }
    // Rooms are drawn from the 63-bit range: six draws all below 2^31 happen with
    // probability 2^-192.
    assert!(rooms.iter().any(|&r| r > u64::from(u32::MAX)), "{rooms:?}");
    assert_eq!(runtime_of(&r, &p.url()), Some(Runtime::TokenSpeed));
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
    assert!(eventually(WAIT, || p.stats().inflight == 0 && d.stats().inflight == 0).await);
}

/// A long prompt (above the bulk threshold) is encoded once for both legs: each worker still
/// gets the whole of TokenSpeed's message, ticket included.
#[tokio::test]
async fn a_long_prompt_reaches_both_legs_whole() {
    let (p, d, cfg) = ts_pair(3).await;
    let r = router(cfg).await;
    let long = "w".repeat(14 * 1024);
    let body = serde_json::json!({ "text": long, "sampling_params": {"temperature": 0} });
    let reply = post(r.addr(), "/generate", &body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let dl = d.stats().last_request.unwrap();
    assert_eq!(dl["runtime"], "tokenspeed");
    let ids = dl["input_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 14 * 1024);
    assert!(ids.iter().all(|id| id == u32::from(b'w')));
    assert_eq!(dl["kv_bootstrap_info"]["bootstrap_port"], p.addr().port());
    assert_eq!(p.stats().last_request.unwrap(), dl);
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn the_answer_is_decodes_detokenized_output() {
    let (_p, d, cfg) = ts_pair(60).await;
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text, detokenized(&d));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 60);
}

#[tokio::test]
async fn sampling_scalars_are_sent_only_when_the_client_set_them() {
    let (p, d, cfg) = ts_pair(5).await;
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    for w in [&p, &d] {
        let sp = &w.stats().last_request.unwrap()["sampling_params"];
        assert_eq!(sp["sampling_set"], serde_json::json!([]), "{sp}");
        for k in ["temperature", "top_p", "top_k", "min_p", "max_new_tokens"] {
            assert_eq!(sp[k], Value::Null, "{k} absent: {sp}");
        }
    }
    let body =
        r#"{"messages":[{"role":"user","content":"hi"}],"temperature":0,"top_k":5,"max_tokens":3}"#;
    let reply = post(r.addr(), "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let sp = &d.stats().last_request.unwrap()["sampling_params"];
    assert_eq!(
        sp["sampling_set"],
        serde_json::json!(["temperature", "top_k", "max_new_tokens"]),
        "{sp}"
    );
    // An explicit zero is sent as such.
    assert_eq!(sp["temperature"], 0.0);
    assert_eq!(sp["top_k"], 5);
    assert_eq!(sp["max_new_tokens"], 3);
    assert_eq!(reply.json()["usage"]["completion_tokens"], 3);
}

#[tokio::test]
async fn worker_defaults_are_left_to_a_tokenspeed_engine() {
    // The engine applies its own reported defaults; the router does not copy them in.
    let p = ts_mock(Role::Prefill, |_| {}).await;
    let d = ts_mock(Role::Decode, |c| {
        c.default_sampling_params = Some(r#"{"temperature":0.25}"#.to_owned());
    })
    .await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.mode = Mode::PdGrpc;
    cfg.workers[0].bootstrap_port = Some(p.addr().port());
    cfg.health.enabled = true;
    let r = router(cfg).await;
    assert!(every_worker(&r, |w| w.is_routable() && w.model_id().is_some()).await);
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let sp = &d.stats().last_request.unwrap()["sampling_params"];
    assert_eq!(sp["temperature"], Value::Null, "{sp}");
}

#[tokio::test]
async fn health_checks_learn_each_workers_runtime_and_workers_show_it() {
    let p = ts_mock(Role::Prefill, |_| {}).await;
    let d = ts_mock(Role::Decode, |_| {}).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.mode = Mode::PdGrpc;
    cfg.health.enabled = true;
    let r = router(cfg).await;
    assert!(
        eventually(WAIT, || runtime_of(&r, &p.url())
            == Some(Runtime::TokenSpeed)
            && runtime_of(&r, &d.url()) == Some(Runtime::TokenSpeed))
        .await
    );
    let workers = get(r.addr(), "/workers").await.json();
    let listed = workers["workers"].as_array().expect("a worker list");
    assert_eq!(listed.len(), 2);
    assert!(
        listed.iter().all(|w| w["runtime"] == "tokenspeed"),
        "{workers}"
    );
    // The SGLang mock of the same tests is learned as such, with a TokenSpeed hint first.
    let s = grpc_mock(Role::Regular, |_| {}).await;
    let mut cfg = regular_config(&[&s]);
    cfg.health.enabled = true;
    cfg.grpc_runtime = Some(Runtime::TokenSpeed);
    let r = router(cfg).await;
    assert!(eventually(WAIT, || runtime_of(&r, &s.url()) == Some(Runtime::Sglang)).await);
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
}

#[tokio::test]
async fn regular_mode_serves_a_tokenspeed_worker() {
    let w = ts_mock(Role::Regular, |c| c.output_tokens = 7).await;
    let cfg = regular_config(&[&w]);
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/completions", r#"{"prompt":"x","n":2}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    let last = w.stats().last_request.unwrap();
    assert_eq!(last["runtime"], "tokenspeed");
    assert_eq!(last["kv_bootstrap_info"], Value::Null);
    assert_eq!(last["sampling_params"]["n"], 2);
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn prompt_logprobs_are_refused_before_anything_is_sent() {
    let (p, d, cfg) = ts_pair(5).await;
    let r = router(cfg).await;
    let body = r#"{"text":"x","return_logprob":true,"logprob_start_len":0}"#;
    let reply = post(r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 501, "{}", reply.text());
    assert_eq!(reply.error_code(), "not_implemented");
    assert!(reply.text().contains("tokenspeed"), "{}", reply.text());
    assert_eq!(p.stats().requests_total + d.stats().requests_total, 0);
    // Output logprobs are served.
    let body = r#"{"text":"x","return_logprob":true}"#;
    let reply = post(r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn a_pd_pair_of_two_runtimes_is_never_used() {
    let p = ts_mock(Role::Prefill, |_| {}).await;
    let d = grpc_mock(Role::Decode, |_| {}).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.mode = Mode::PdGrpc;
    cfg.workers[0].bootstrap_port = Some(p.addr().port());
    let dir = tokenizer_dir();
    cfg.tokenizer.tokenizer_path = Some(dir.path().to_owned());
    // With health checks off, the startup model probe learns the runtimes; with them on,
    // the health checks do. Either way selection finds no Decode worker of the Prefill's
    // runtime, and nothing is sent.
    for health in [false, true] {
        cfg.health.enabled = health;
        let r = router(cfg.clone()).await;
        assert!(
            eventually(WAIT, || runtime_of(&r, &d.url()) == Some(Runtime::Sglang)
                && runtime_of(&r, &p.url()) == Some(Runtime::TokenSpeed)
                && r.registry()
                    .snapshot()
                    .all()
                    .iter()
                    .all(|w| w.is_routable()))
            .await
        );
        let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
        assert_eq!(reply.status, 503, "{}", reply.text());
        assert_eq!(reply.error_code(), "no_available_workers");
        assert_eq!(p.stats().requests_total + d.stats().requests_total, 0);
        assert!(eventually(WAIT, || total_load(&r) == 0).await);
    }
}

#[tokio::test]
async fn unreachable_and_non_grpc_worker_urls_are_never_ready() {
    // A closed port, and an HTTP (not gRPC) mock behind a grpc:// URL.
    let dead = dead_url();
    let http = mock(Role::Regular, 0).await;
    let workers = vec![
        spec(&format!("grpc://{}", dead.addr()), WorkerType::Regular),
        spec(&format!("grpc://{}", http.addr()), WorkerType::Regular),
    ];
    let mut cfg = Config::with_workers(Mode::RegularGrpc, workers);
    cfg.health.timeout = Duration::from_secs(1);
    cfg.retry.max_attempts = 1;
    cfg.grpc_runtime = Some(Runtime::TokenSpeed);
    let dir = tokenizer_dir();
    cfg.tokenizer.tokenizer_path = Some(dir.path().to_owned());
    let r = router(cfg).await;
    assert!(every_worker(&r, |w| w.probed()).await);
    for w in r.registry().snapshot().all() {
        assert!(!w.is_routable(), "{} is not ready", w.url());
        assert_eq!(w.runtime(), None, "{} has no runtime", w.url());
    }
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert_eq!(http.stats().requests_total, 0);
}
