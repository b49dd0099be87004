//! vLLM mode (`--runtime vllm`): routes, the producer/consumer KV hand-over, strictness,
//! expiry and aborts.

mod common;

use std::time::Duration;

use common::{TIMEOUT, get, post, post_with, prompt, start, start_request, wait_until};
use http_body_util::BodyExt as _;
use hyper::{Method, StatusCode};
use pdrouter_mock::{EngineConfig, HttpRuntime, MockConfig, MockStats, MockWorker, Role};
use serde_json::{Value, json};

fn vllm(role: Role) -> MockConfig {
    let mut cfg = MockConfig::new(role);
    cfg.http_runtime = HttpRuntime::Vllm;
    cfg
}

/// The body of a prefill leg for `prompt`.
fn prefill_body(prompt: &str) -> Value {
    json!({
        "model": "m",
        "prompt": prompt,
        "max_tokens": 1,
        "stream": false,
        "kv_transfer_params": {
            "do_remote_decode": true, "do_remote_prefill": false,
            "remote_engine_id": null, "remote_block_ids": null,
            "remote_host": null, "remote_port": null
        }
    })
}

/// Produces `prompt` on `p` as request `rid`; returns the answer's `kv_transfer_params`.
async fn produce(p: &MockWorker, prompt: &str, rid: &str) -> Value {
    let r = post_with(
        p.addr(),
        "/v1/completions",
        &prefill_body(prompt),
        &[("x-request-id", rid)],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    r.json()["kv_transfer_params"].clone()
}

fn held(s: &MockStats) -> (u64, u64) {
    (s.kv_held_requests, s.kv_held_blocks)
}

#[tokio::test]
async fn routes_are_vllms() {
    let mut cfg = vllm(Role::Regular);
    cfg.model = "my/model".into();
    let w = start(cfg).await;
    let health = get(w.addr(), "/health").await;
    assert_eq!((health.status, health.body.len()), (StatusCode::OK, 0));
    assert_eq!(
        get(w.addr(), "/version").await.json(),
        json!({"version": "0.11.0"})
    );
    let models = get(w.addr(), "/v1/models").await.json();
    let m = &models["data"][0];
    assert_eq!(models["object"], "list");
    assert_eq!(
        (
            &m["id"],
            &m["object"],
            &m["owned_by"],
            &m["root"],
            &m["parent"]
        ),
        (
            &json!("my/model"),
            &json!("model"),
            &json!("vllm"),
            &json!("my/model"),
            &Value::Null
        )
    );
    assert!(m["created"].is_u64() && m["max_model_len"].is_u64(), "{m}");
    for path in [
        "/get_server_info",
        "/get_model_info",
        "/health_generate",
        "/room/1",
    ] {
        let r = get(w.addr(), path).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{path}");
        assert_eq!(r.json(), json!({"detail": "Not Found"}), "{path}");
    }
    let r = post(w.addr(), "/generate", &json!({"text": "x"})).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.json(), json!({"detail": "Not Found"}));
    let r = get(w.addr(), "/v1/completions").await;
    assert_eq!(r.status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(r.json(), json!({"detail": "Method Not Allowed"}));
    assert_eq!(w.stats().requests_total, 0, "not a generation route");
    w.shutdown().await;
}

#[tokio::test]
async fn plain_requests_are_served_without_bootstrap_and_echo_the_request_id() {
    let w = start(vllm(Role::Decode)).await;
    let body = json!({"prompt": prompt(20), "max_tokens": 3});
    let r = post_with(
        w.addr(),
        "/v1/completions",
        &body,
        &[("x-request-id", "abc")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.headers["x-request-id"], "abc");
    let v = r.json();
    assert_eq!(v["id"], "cmpl-abc");
    assert_eq!(v["choices"][0]["text"], " tok0 tok1 tok2");
    assert_eq!(v["kv_transfer_params"], Value::Null);
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": 20, "completion_tokens": 3, "total_tokens": 23,
               "prompt_tokens_details": {"cached_tokens": 0}})
    );
    let chat = json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let r = post(w.addr(), "/v1/chat/completions", &chat).await;
    let v = r.json();
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"), "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], " tok0 tok1");
    let s = w.stats();
    assert_eq!((s.kv_recomputed_total, s.kv_relayed_total), (2, 0));
    assert_eq!((s.requests_total, s.inflight), (2, 0));
    assert_eq!(s.last_request.unwrap()["max_tokens"], 2);
    w.shutdown().await;
}

#[tokio::test]
async fn a_producer_answers_one_token_and_holds_the_prompts_blocks() {
    let p = start(vllm(Role::Prefill)).await;
    let r = post_with(
        p.addr(),
        "/v1/completions",
        &prefill_body(&prompt(40)),
        &[("x-request-id", "req-1")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.headers["x-request-id"], "req-1");
    let v = r.json();
    assert_eq!(v["id"], "cmpl-req-1");
    assert_eq!(v["choices"][0]["text"], " tok0");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 1);
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let kv = &v["kv_transfer_params"];
    let engine = kv["remote_engine_id"].as_str().unwrap();
    assert_eq!(engine.len(), 36, "uuid-like: {engine}");
    assert_eq!(
        kv["remote_block_ids"].as_array().unwrap().len(),
        3,
        "40 tokens"
    );
    let mut rest = kv.clone();
    for k in ["remote_engine_id", "remote_block_ids"] {
        rest.as_object_mut().unwrap().remove(k);
    }
    assert_eq!(
        rest,
        json!({"do_remote_prefill": true, "do_remote_decode": false,
               "remote_request_id": "req-1", "remote_host": "127.0.0.1",
               "remote_port": p.addr().port(), "tp_size": 1})
    );
    let s = p.stats();
    assert_eq!((held(&s), s.kv_produced_total), ((1, 3), 1));
    // The same worker keeps its engine id; without X-Request-Id an id is made up.
    let kv2 = produce(&p, &prompt(16), "").await;
    assert_eq!(kv2["remote_engine_id"], engine);
    assert!(!kv2["remote_request_id"].as_str().unwrap().is_empty());
    assert_eq!(held(&p.stats()), (2, 4));
    // A chat producer caps with max_completion_tokens.
    let chat = json!({
        "messages": [{"role": "user", "content": prompt(12)}],
        "max_completion_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": true}
    });
    let r = post(p.addr(), "/v1/chat/completions", &chat).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let blocks = &r.json()["kv_transfer_params"]["remote_block_ids"];
    assert_eq!(blocks.as_array().unwrap().len(), 1, "16 tokens: {blocks}");
    let st = get(p.addr(), "/mock/stats").await.json();
    assert_eq!(
        (&st["kv_held_requests"], &st["kv_held_blocks"]),
        (&json!(3), &json!(5))
    );
    assert_eq!(st["kv_produced_total"], 3);
    p.shutdown().await;
}

#[tokio::test]
async fn a_consumer_pulls_once_and_a_second_pull_recomputes() {
    let p = start(vllm(Role::Prefill)).await;
    let d = start(vllm(Role::Decode)).await;
    let text = prompt(40);
    let kv = produce(&p, &text, "pd-1").await;
    let decode = json!({"prompt": text, "max_tokens": 4, "kv_transfer_params": kv});
    let r = post_with(
        d.addr(),
        "/v1/completions",
        &decode,
        &[("x-request-id", "pd-1")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], " tok0 tok1 tok2 tok3");
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 32);
    let ps = p.stats();
    assert_eq!((held(&ps), ps.kv_pulled_total), ((0, 0), 1));
    let ds = d.stats();
    assert_eq!((ds.kv_relayed_total, ds.kv_recomputed_total), (1, 0));

    // The blocks are gone: the same params again are recomputed.
    let r = post(d.addr(), "/v1/completions", &decode).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    let ds = d.stats();
    assert_eq!(
        (
            ds.kv_relayed_total,
            ds.kv_recomputed_total,
            ds.kv_pull_failed_total
        ),
        (1, 1, 1)
    );
    assert_eq!(p.stats().kv_pulled_total, 1);
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn a_streaming_consumer_reports_cached_tokens_in_its_usage_chunk() {
    let p = start(vllm(Role::Prefill)).await;
    let d = start(vllm(Role::Decode)).await;
    let chat_prompt = prompt(60);
    let messages = json!([{"role": "user", "content": chat_prompt}]);
    let pre = json!({
        "messages": messages, "max_tokens": 1,
        "kv_transfer_params": {"do_remote_decode": true}
    });
    let r = post(p.addr(), "/v1/chat/completions", &pre).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let kv = r.json()["kv_transfer_params"].clone();
    let dec = json!({
        "messages": messages, "max_tokens": 3, "stream": true,
        "stream_options": {"include_usage": true}, "kv_transfer_params": kv
    });
    let r = post(d.addr(), "/v1/chat/completions", &dec).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let chunks = r.sse_json();
    let usage = &chunks.last().unwrap()["usage"];
    // 64 prompt tokens (4 per message + 60): four whole blocks moved.
    assert_eq!(usage["prompt_tokens"], 64);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 64);
    assert_eq!(usage["completion_tokens"], 3);
    assert_eq!(d.stats().kv_relayed_total, 1);
    assert_eq!(held(&p.stats()), (0, 0));
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn the_eos_marker_ends_a_prefill_early_and_holds_nothing() {
    let p = start(vllm(Role::Prefill)).await;
    let r = post(
        p.addr(),
        "/v1/completions",
        &prefill_body("a short answer [[eos]] please"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    assert_eq!(v["kv_transfer_params"], Value::Null);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["text"], "");
    assert_eq!(v["usage"]["completion_tokens"], 0);
    let s = p.stats();
    assert_eq!((held(&s), s.kv_produced_total), ((0, 0), 0));
    assert_eq!(s.prefill_early_end_total, 1);
    p.shutdown().await;
}

#[tokio::test]
async fn producers_that_would_stream_or_generate_more_are_refused() {
    let p = start(vllm(Role::Prefill)).await;
    let cases = [
        ("stream", json!(true)),
        ("max_tokens", json!(2)),
        ("stream_options", json!({"include_usage": true})),
        ("min_tokens", json!(3)),
    ];
    for (field, value) in cases {
        let mut body = prefill_body(&prompt(8));
        body[field] = value;
        let r = post(p.addr(), "/v1/completions", &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{field}: {}", r.text());
        let err = &r.json()["error"];
        assert_eq!(
            (&err["type"], &err["code"]),
            (&json!("BadRequestError"), &json!(400))
        );
        assert!(err["message"].as_str().unwrap().contains(field), "{err}");
    }
    let mut body = prefill_body(&prompt(8));
    body.as_object_mut().unwrap().remove("max_tokens");
    let r = post(p.addr(), "/v1/completions", &body).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "no cap: {}", r.text());
    // A consumer with malformed params is refused naming the field.
    let bad = json!({"prompt": "x", "kv_transfer_params": {
        "do_remote_prefill": true, "remote_engine_id": "e", "remote_request_id": "r",
        "remote_block_ids": [0], "remote_host": "127.0.0.1", "remote_port": "80"
    }});
    let r = post(p.addr(), "/v1/completions", &bad).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(msg.contains("remote_port"), "{msg}");
    let r = post(
        p.addr(),
        "/v1/completions",
        &json!({"prompt": "x", "kv_transfer_params": "yes"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let s = p.stats();
    assert_eq!((held(&s), s.kv_produced_total, s.inflight), ((0, 0), 0, 0));
    p.shutdown().await;
}

#[tokio::test]
async fn unpulled_blocks_expire_after_the_abort_timeout() {
    let mut cfg = vllm(Role::Prefill);
    cfg.kv_abort_timeout = Duration::from_millis(100);
    let p = start(cfg).await;
    let d = start(vllm(Role::Decode)).await;
    let text = prompt(32);
    let kv = produce(&p, &text, "late").await;
    assert_eq!(held(&p.stats()), (1, 2));
    wait_until("the held blocks expire", || async {
        p.stats().kv_expired_total == 1
    })
    .await;
    assert_eq!(held(&p.stats()), (0, 0));
    // Too late: the consumer recomputes.
    let decode = json!({"prompt": text, "max_tokens": 1, "kv_transfer_params": kv});
    let r = post(d.addr(), "/v1/completions", &decode).await;
    assert_eq!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    assert_eq!(d.stats().kv_pull_failed_total, 1);
    assert_eq!(p.stats().kv_pulled_total, 0);
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn the_pull_checks_engine_request_and_blocks() {
    let p = start(vllm(Role::Prefill)).await;
    let kv = produce(&p, &prompt(20), "r").await;
    let pull = |engine: &Value, rid: &str, blocks: &Value| json!({"remote_engine_id": engine, "remote_request_id": rid, "remote_block_ids": blocks});
    let (engine, blocks) = (&kv["remote_engine_id"], &kv["remote_block_ids"]);
    for wrong in [
        pull(&json!("someone-else"), "r", blocks),
        pull(engine, "other", blocks),
        pull(engine, "r", &json!([12345])),
    ] {
        let r = post(p.addr(), "/mock/nixl/pull", &wrong).await;
        assert_eq!(r.status, StatusCode::NOT_FOUND, "{wrong}");
    }
    let r = post(p.addr(), "/mock/nixl/pull", &json!({"remote_engine_id": 1})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(held(&p.stats()), (1, 2));
    let r = post(p.addr(), "/mock/nixl/pull", &pull(engine, "r", blocks)).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(held(&p.stats()), (0, 0));
    p.shutdown().await;
}

#[tokio::test]
async fn failures_and_aborted_prefills_hold_nothing() {
    let mut cfg = vllm(Role::Prefill);
    cfg.fail_rate = 1.0;
    let p = start(cfg).await;
    let r = post(p.addr(), "/v1/completions", &prefill_body(&prompt(8))).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.json()["error"]["code"], 500);
    assert_eq!(p.stats().kv_produced_total, 0);
    p.controls().set_fail_rate(0.0);

    // The client goes away during the prefill: an abort, and nothing held.
    p.controls().set_delay(Duration::from_secs(30));
    let body = prefill_body(&prompt(8)).to_string();
    let pending = tokio::spawn({
        let addr = p.addr();
        async move { start_request(addr, Method::POST, "/v1/completions", Some(&body)).await }
    });
    wait_until("the prefill is in flight", || async {
        p.stats().inflight == 1
    })
    .await;
    pending.abort();
    wait_until("the abort is counted", || async {
        p.stats().aborts_total == 1
    })
    .await;
    let s = p.stats();
    assert_eq!((s.inflight, held(&s), s.kv_produced_total), (0, (0, 0), 0));
    p.shutdown().await;
}

#[tokio::test]
async fn a_client_leaving_mid_stream_counts_an_abort() {
    let mut cfg = vllm(Role::Decode);
    cfg.output_tokens = 10_000;
    cfg.token_interval = Duration::from_millis(20);
    let d = start(cfg).await;
    let body = json!({"prompt": "x", "stream": true}).to_string();
    let (resp, conn) = start_request(d.addr(), Method::POST, "/v1/completions", Some(&body))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("frame ok");
    assert!(first.into_data().is_ok());
    assert_eq!(d.stats().aborts_total, 0);
    drop(body);
    conn.abort();
    wait_until("inflight back to 0", || async { d.stats().inflight == 0 }).await;
    wait_until("the abort is counted", || async {
        d.stats().aborts_total == 1
    })
    .await;
    // A stream read to its end is no abort.
    let short = json!({"prompt": "x", "stream": true, "max_tokens": 2});
    let r = post(d.addr(), "/v1/completions", &short).await;
    assert_eq!(r.sse_json().len(), 3, "two tokens and the finish");
    assert_eq!(d.stats().aborts_total, 1);
    d.shutdown().await;
}

#[tokio::test]
async fn vllm_mode_over_grpc_speaks_vllms_protocol_only() {
    // With --grpc, vLLM mode is vLLM's engine gRPC protocol (tests/grpc_vllm.rs), which a
    // TokenSpeed worker cannot also speak.
    let mut cfg = vllm(Role::Decode);
    cfg.grpc = true;
    let w = MockWorker::start(cfg.clone())
        .await
        .expect("a vLLM gRPC worker");
    assert!(w.is_grpc());
    w.shutdown().await;
    cfg.grpc_runtime = pdrouter_mock::GrpcRuntime::TokenSpeed;
    let err = MockWorker::start(cfg).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[tokio::test]
async fn engine_mode_queues_producers_and_keeps_no_bootstrap_server() {
    let mut cfg = vllm(Role::Prefill);
    let mut engine = EngineConfig::new();
    engine.max_running = 1;
    cfg.engine = Some(engine);
    let p = start(cfg).await;
    assert_eq!(p.bootstrap_addr(), None, "vLLM has no bootstrap server");
    p.controls().set_hang(true);
    let addr = p.addr();
    let sends: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|rid| {
            tokio::spawn(async move {
                let body = prefill_body(&prompt(16));
                post_with(addr, "/v1/completions", &body, &[("x-request-id", rid)]).await
            })
        })
        .collect();
    wait_until("one running, one queued", || async {
        let st = get(addr, "/mock/stats").await.json();
        p.controls().hung() == 1 && st["engine_queue_len"] == 1
    })
    .await;
    p.controls().set_hang(false);
    for send in sends {
        let r = tokio::time::timeout(TIMEOUT, send).await.unwrap().unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
        assert_eq!(
            r.json()["kv_transfer_params"]["remote_block_ids"]
                .as_array()
                .unwrap()
                .len(),
            1
        );
    }
    assert_eq!(held(&p.stats()), (2, 2));
    p.shutdown().await;
}

#[tokio::test]
async fn the_api_key_guards_generation_but_not_the_pull() {
    let mut cfg = vllm(Role::Prefill);
    cfg.api_key = Some("k".into());
    let p = start(cfg).await;
    let body = prefill_body(&prompt(16));
    let r = post(p.addr(), "/v1/completions", &body).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let r = post_with(
        p.addr(),
        "/v1/completions",
        &body,
        &[("authorization", "Bearer k")],
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let kv = r.json()["kv_transfer_params"].clone();
    let pull = json!({
        "remote_engine_id": kv["remote_engine_id"],
        "remote_request_id": kv["remote_request_id"],
        "remote_block_ids": kv["remote_block_ids"],
    });
    let r = post(p.addr(), "/mock/nixl/pull", &pull).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    p.shutdown().await;
}
