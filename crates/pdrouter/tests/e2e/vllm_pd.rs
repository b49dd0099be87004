//! vLLM PD over HTTP (NIXL) over real sockets, against the mock's vLLM mode: the Prefill leg
//! capped at one token, its transfer params relayed to Decode verbatim, the KV pulled from
//! the producer (the consumer's cached tokens show it), early-ended Prefills recomputed,
//! `n > 1` skipping the Prefill leg, detection, the slot released before Decode runs, and
//! nothing left held.

use std::time::Duration;

use crate::support::*;
use pdrouter::config::HttpEngine;
use pdrouter::{Config, RouterHandle};
use pdrouter_mock::HttpRuntime;

const WAIT: Duration = Duration::from_secs(10);

async fn vllm(role: Role, tune: impl FnOnce(&mut MockConfig)) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.http_runtime = HttpRuntime::Vllm;
    tune(&mut cfg);
    MockWorker::start(cfg).await.expect("mock starts")
}

/// A vLLM PD router over `p` and `d`, their engine detected from what they serve.
async fn vllm_router(
    p: &MockWorker,
    d: &MockWorker,
    tune: impl FnOnce(&mut Config),
) -> RouterHandle {
    let mut cfg = pd_config(&[p], &[d]);
    // Admission on (a limit these tests never reach unless they set their own): every
    // request takes and releases a Prefill slot.
    cfg.admission = admission(64, 16, 30);
    tune(&mut cfg);
    router(cfg).await
}

const COMPLETION: &str = r#"{"model":"mock-model","prompt":"one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen","max_tokens":5,"min_tokens":2}"#;

#[tokio::test]
async fn the_prefill_params_reach_decode_and_the_kv_moves() {
    let p = vllm(Role::Prefill, |_| {}).await;
    let d = vllm(Role::Decode, |c| c.output_tokens = 5).await;
    let r = vllm_router(&p, &d, |_| {}).await;
    let reply = post(r.addr(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let answer = reply.json();
    assert_eq!(
        answer["choices"][0]["text"]
            .as_str()
            .unwrap()
            .matches("tok")
            .count(),
        5
    );
    let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    assert!(cached.unwrap() > 0, "the KV was relayed: {answer}");
    assert!(
        answer.get("kv_transfer_params").is_none_or(|v| v.is_null()),
        "{answer}"
    );

    let prefill = p.stats().last_request.unwrap();
    assert_eq!(prefill["max_tokens"], 1);
    assert_eq!(prefill["stream"], false);
    assert!(prefill.get("min_tokens").is_none(), "{prefill}");
    assert_eq!(prefill["kv_transfer_params"]["do_remote_decode"], true);
    let decode = d.stats().last_request.unwrap();
    assert_eq!(decode["max_tokens"], 5, "Decode gets the client's body");
    assert_eq!(decode["min_tokens"], 2);
    assert_eq!(decode["kv_transfer_params"]["do_remote_prefill"], true);
    assert_eq!(decode["kv_transfer_params"]["remote_port"], p.addr().port());
    let id = |w: &MockWorker| w.stats().last_headers.unwrap()["x-request-id"].clone();
    assert_eq!(id(&p), id(&d), "both legs carry one request id");

    assert!(
        eventually(WAIT, || p.stats().kv_held_requests == 0).await,
        "pulled"
    );
    assert_eq!(d.stats().kv_relayed_total, 1);
    assert_eq!(kv_handoffs(&r, "relayed"), 1.0);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn streamed_chat_is_relayed_to_done_with_the_kv_moved() {
    let p = vllm(Role::Prefill, |_| {}).await;
    let d = vllm(Role::Decode, |c| {
        c.output_tokens = 4;
        c.token_interval = Duration::from_millis(2);
    })
    .await;
    let r = vllm_router(&p, &d, |_| {}).await;
    let body = r#"{"messages":[{"role":"user","content":"a b c d e f g h i j k l m n o p q r s"}],"max_completion_tokens":4,"stream":true,"stream_options":{"include_usage":true}}"#;
    let reply = post(r.addr(), "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let text = reply.text();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(text.matches(" tok").count(), 4, "{text}");
    let prefill = p.stats().last_request.unwrap();
    assert_eq!(prefill["max_completion_tokens"], 1);
    assert!(prefill.get("stream_options").is_none(), "{prefill}");
    let decode = d.stats().last_request.unwrap();
    assert_eq!(decode["stream"], true);
    assert_eq!(decode["stream_options"]["include_usage"], true);
    assert_eq!(d.stats().kv_relayed_total, 1);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn a_prefill_that_ends_early_is_recomputed_and_the_client_served() {
    let p = vllm(Role::Prefill, |_| {}).await;
    let d = vllm(Role::Decode, |c| c.output_tokens = 3).await;
    let r = vllm_router(&p, &d, |_| {}).await;
    let body = r#"{"prompt":"stop here [[eos]] please","max_tokens":3}"#;
    let reply = post(r.addr(), "/v1/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    let decode = d.stats().last_request.unwrap();
    assert!(decode.get("kv_transfer_params").is_none(), "{decode}");
    assert_eq!(d.stats().kv_recomputed_total, 1);
    assert_eq!(p.stats().kv_held_requests, 0);
    assert_eq!(kv_handoffs(&r, "recomputed"), 1.0);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn several_choices_skip_the_prefill_leg() {
    let p = vllm(Role::Prefill, |_| {}).await;
    let d = vllm(Role::Decode, |_| {}).await;
    let r = vllm_router(&p, &d, |c| c.admission = admission(1, 4, 5)).await;
    let reply = post(
        r.addr(),
        "/v1/completions",
        r#"{"prompt":"x","n":2,"max_tokens":2}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(p.stats().requests_total, 0, "no handoff feeds two decodes");
    assert_eq!(d.stats().requests_total, 1);
    assert_eq!(kv_handoffs(&r, "skipped"), 1.0);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn a_failing_prefill_is_not_charged_to_decode() {
    let p = vllm(Role::Prefill, |c| c.fail_rate = 1.0).await;
    let d = vllm(Role::Decode, |_| {}).await;
    let r = vllm_router(&p, &d, |_| {}).await;
    let reply = post(r.addr(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(reply.error_code(), "prefill_worker_error");
    assert_eq!(d.stats().requests_total, 0);
    let workers = get(r.addr(), "/workers").await.json();
    let decode = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_type"] == "decode")
        .cloned()
        .unwrap();
    assert_eq!(decode["circuit_breaker"], "closed");
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn generate_is_refused_for_vllm_pairs() {
    let p = vllm(Role::Prefill, |_| {}).await;
    let d = vllm(Role::Decode, |_| {}).await;
    let r = vllm_router(&p, &d, |_| {}).await;
    let reply = post(r.addr(), "/generate", r#"{"text":"x"}"#).await;
    assert_eq!(reply.status, 501, "{}", reply.text());
    assert!(reply.text().contains("/v1/completions"), "{}", reply.text());
    assert_eq!(p.stats().requests_total + d.stats().requests_total, 0);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn workers_show_the_detected_engine_and_connector() {
    let p = vllm(Role::Prefill, |_| {}).await;
    let d = vllm(Role::Decode, |_| {}).await;
    let sp = mock(Role::Prefill, 0).await;
    let r = vllm_router(&p, &d, |_| {}).await;
    let workers = get(r.addr(), "/workers").await.json();
    for w in workers["workers"].as_array().unwrap() {
        assert_eq!(w["runtime"], "vllm", "{w}");
        assert_eq!(w["kv_connector"], "nixl", "{w}");
    }
    drop(r);
    let r = router(pd_config(&[&sp], &[&d])).await;
    let workers = get(r.addr(), "/workers").await.json();
    let runtimes: Vec<_> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["runtime"].clone(), w["kv_connector"].clone()))
        .collect();
    assert!(
        runtimes.contains(&("sglang".into(), serde_json::Value::Null)),
        "{runtimes:?}"
    );
    // An SGLang Prefill and a vLLM Decode are no pair: there is no Decode for it.
    let reply = post(r.addr(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 503, "{}", reply.text());
}

#[tokio::test]
async fn the_runtime_flag_makes_a_worker_vllm_without_asking() {
    let p = vllm(Role::Prefill, |_| {}).await;
    let d = vllm(Role::Decode, |_| {}).await;
    let r = vllm_router(&p, &d, |c| c.http_engine = Some(HttpEngine::Vllm)).await;
    let reply = post(r.addr(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(d.stats().kv_relayed_total, 1);
}

/// The Prefill slot is the Prefill's only: with one slot, a second request's Prefill runs
/// while the first request's Decode is still streaming.
#[tokio::test]
async fn the_slot_is_released_before_decode_runs() {
    let p = vllm(Role::Prefill, |_| {}).await;
    let d = vllm(Role::Decode, |c| {
        c.output_tokens = 1000;
        c.token_interval = Duration::from_millis(5);
    })
    .await;
    let r = vllm_router(&p, &d, |c| c.admission = admission(1, 4, 30)).await;
    let body = r#"{"prompt":"a b c d e f g h i j k l m n o p q","max_tokens":1000,"stream":true}"#;
    let (status, first) = open_stream(r.addr(), "/v1/completions", body).await;
    assert_eq!(status, 200);
    assert!(eventually(WAIT, || d.stats().inflight == 1).await);
    assert_eq!(metric(&r, "smg_pd_prefill_admission_inflight"), Some(0.0));
    let reply = post(r.addr(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(p.stats().requests_total, 2);
    // The client leaving mid-stream aborts the Decode request.
    drop(first);
    assert_legs_released(&r, &p, &d).await;
}
