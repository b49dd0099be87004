//! vLLM mode's other KV connectors (`--kv-connector mooncake|lmcache`): Mooncake's bootstrap
//! server and its waiting pull by `transfer_id` (legs at once, in either order), and
//! LMCache's push of a one-token request's KV to the consumer, found there by prompt.

mod common;

use std::time::{Duration, Instant};

use common::{get, post, post_with, prompt, start};
use hyper::StatusCode;
use pdrouter_mock::{HttpRuntime, KvConnectorKind, MockConfig, MockWorker, PortReservation, Role};
use serde_json::{Value, json};

fn vllm(role: Role, connector: KvConnectorKind) -> MockConfig {
    let mut cfg = MockConfig::new(role);
    cfg.http_runtime = HttpRuntime::Vllm;
    cfg.kv_connector = connector;
    cfg
}

fn cached(v: &Value) -> &Value {
    &v["usage"]["prompt_tokens_details"]["cached_tokens"]
}

// ---- Mooncake ----------------------------------------------------------------------------

fn mc_producer_body(prompt: &str, transfer_id: &str) -> Value {
    json!({
        "model": "m", "prompt": prompt, "max_tokens": 1, "stream": false,
        "kv_transfer_params": {
            "do_remote_decode": true, "do_remote_prefill": false, "transfer_id": transfer_id
        }
    })
}

fn mc_consumer_body(prompt: &str, p: &MockWorker, engine_id: &str, transfer_id: &str) -> Value {
    let addr = p
        .bootstrap_addr()
        .expect("a mooncake prefill worker has a bootstrap server");
    json!({
        "model": "m", "prompt": prompt, "max_tokens": 3,
        "kv_transfer_params": {
            "do_remote_decode": false, "do_remote_prefill": true,
            "remote_bootstrap_addr": format!("http://{addr}"),
            "remote_engine_id": engine_id, "transfer_id": transfer_id
        }
    })
}

/// The engine id of each DP rank, from the producer's `GET /query`.
async fn engine_ids(p: &MockWorker) -> Vec<String> {
    let r = get(p.bootstrap_addr().unwrap(), "/query").await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let v = r.json();
    let map = v.as_object().expect("an object");
    (0..map.len())
        .map(|rank| {
            let entry = &map[&rank.to_string()];
            entry["engine_id"].as_str().expect("engine_id").to_owned()
        })
        .collect()
}

async fn mooncake_pair(producer: MockConfig) -> (MockWorker, MockWorker) {
    let d = start(vllm(Role::Decode, KvConnectorKind::Mooncake)).await;
    (start(producer).await, d)
}

#[tokio::test]
async fn a_mooncake_producer_serves_one_engine_id_per_dp_rank() {
    let mut cfg = vllm(Role::Prefill, KvConnectorKind::Mooncake);
    cfg.dp_size = 2;
    let (p, d) = mooncake_pair(cfg).await;
    let r = get(p.bootstrap_addr().unwrap(), "/query").await;
    let v = r.json();
    let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
    assert_eq!(keys, ["0", "1"], "{v}");
    let ids = engine_ids(&p).await;
    assert_ne!(ids[0], ids[1]);
    let stats = get(p.addr(), "/mock/stats").await.json();
    assert_eq!(stats["kv_connector"], "mooncake");
    assert_eq!(stats["engine_ids"], json!(ids));
    assert_eq!(d.bootstrap_addr(), None, "only the producer has one");
    let nixl = start(vllm(Role::Prefill, KvConnectorKind::Nixl)).await;
    assert_eq!(nixl.bootstrap_addr(), None);
    assert_eq!(
        get(nixl.addr(), "/mock/stats").await.json()["kv_connector"],
        "nixl"
    );
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn a_mooncake_consumer_arriving_first_waits_for_its_producer() {
    let mut cfg = vllm(Role::Prefill, KvConnectorKind::Mooncake);
    cfg.delay = Duration::from_millis(200);
    let (p, d) = mooncake_pair(cfg).await;
    let ids = engine_ids(&p).await;
    let text = prompt(40);
    let consumer = tokio::spawn({
        let (addr, body) = (d.addr(), mc_consumer_body(&text, &p, &ids[0], "t-1"));
        async move { post(addr, "/v1/completions", &body).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!consumer.is_finished(), "the pull waits for the producer");
    assert_eq!(p.stats().requests_total, 0);
    let started = Instant::now();
    let r = post(p.addr(), "/v1/completions", &mc_producer_body(&text, "t-1")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert!(started.elapsed() >= Duration::from_millis(200));
    let v = r.json();
    assert_eq!(v["choices"][0]["text"], " tok0");
    assert!(
        v.get("kv_transfer_params").is_none_or(Value::is_null),
        "{v}"
    );
    let r = consumer.await.unwrap();
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    // 40 prompt tokens: two whole blocks moved.
    assert_eq!(cached(&r.json()), 32);
    assert_eq!(r.json()["usage"]["completion_tokens"], 3);
    let (ps, ds) = (p.stats(), d.stats());
    assert_eq!(
        (
            ps.kv_produced_total,
            ps.kv_pulled_total,
            ps.kv_held_requests
        ),
        (1, 1, 0)
    );
    assert_eq!((ds.kv_relayed_total, ds.kv_recomputed_total), (1, 0));
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn a_mooncake_consumer_after_its_producer_pulls_once() {
    let (p, d) = mooncake_pair(vllm(Role::Prefill, KvConnectorKind::Mooncake)).await;
    let ids = engine_ids(&p).await;
    let text = prompt(20);
    let r = post(p.addr(), "/v1/completions", &mc_producer_body(&text, "t-2")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(p.stats().kv_held_requests, 1);
    let body = mc_consumer_body(&text, &p, &ids[0], "t-2");
    let r = post(d.addr(), "/v1/completions", &body).await;
    assert_eq!(cached(&r.json()), 16);
    assert_eq!(p.stats().kv_held_requests, 0);
    let started = Instant::now();
    let r = post(d.addr(), "/v1/completions", &body).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(cached(&r.json()), 0, "already consumed: recomputed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused without waiting"
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
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn a_mooncake_pull_needs_the_engine_id_of_the_rank_that_computed() {
    let mut cfg = vllm(Role::Prefill, KvConnectorKind::Mooncake);
    cfg.dp_size = 2;
    let (p, d) = mooncake_pair(cfg).await;
    let ids = engine_ids(&p).await;
    let text = prompt(40);
    let headers = [("x-data-parallel-rank", "1")];
    let r = post_with(
        p.addr(),
        "/v1/completions",
        &mc_producer_body(&text, "t-3"),
        &headers,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let started = Instant::now();
    let wrong = mc_consumer_body(&text, &p, &ids[0], "t-3");
    let r = post(d.addr(), "/v1/completions", &wrong).await;
    assert_eq!(cached(&r.json()), 0, "rank 0's engine id: recomputed");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused without waiting"
    );
    assert_eq!(
        p.stats().kv_held_requests,
        1,
        "left held for the right engine"
    );
    assert_eq!(d.stats().kv_pull_failed_total, 1);
    let right = mc_consumer_body(&text, &p, &ids[1], "t-3");
    let r = post(d.addr(), "/v1/completions", &right).await;
    assert_eq!(cached(&r.json()), 32);
    assert_eq!(p.stats().kv_pulled_total, 1);
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn unpulled_mooncake_transfers_expire() {
    let mut cfg = vllm(Role::Prefill, KvConnectorKind::Mooncake);
    // Also the longest a pull would wait for a transfer not yet held.
    cfg.kv_abort_timeout = Duration::from_millis(1_000);
    let (p, d) = mooncake_pair(cfg).await;
    let ids = engine_ids(&p).await;
    let text = prompt(40);
    let r = post(p.addr(), "/v1/completions", &mc_producer_body(&text, "t-4")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(p.stats().kv_held_requests, 1);
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let ps = p.stats();
    assert_eq!((ps.kv_held_requests, ps.kv_expired_total), (0, 1));
    let started = Instant::now();
    let r = post(
        d.addr(),
        "/v1/completions",
        &mc_consumer_body(&text, &p, &ids[0], "t-4"),
    )
    .await;
    assert_eq!(cached(&r.json()), 0);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "expired: refused at once"
    );
    assert_eq!(d.stats().kv_pull_failed_total, 1);
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn mooncake_legs_are_checked_strictly() {
    let mut cfg = vllm(Role::Prefill, KvConnectorKind::Mooncake);
    cfg.dp_size = 2;
    let (p, d) = mooncake_pair(cfg).await;
    let ok = mc_producer_body("x", "t-5");
    let bad = |edit: &dyn Fn(&mut Value)| {
        let mut b = ok.clone();
        edit(&mut b);
        b
    };
    let cases: Vec<(Value, &str)> = vec![
        (bad(&|b| b["stream"] = json!(true)), "stream"),
        (bad(&|b| b["max_tokens"] = json!(2)), "max_tokens exactly 1"),
        (
            bad(&|b| b["stream_options"] = json!({"include_usage": true})),
            "stream_options",
        ),
        (
            bad(&|b| b["kv_transfer_params"]["transfer_id"] = json!(5)),
            "transfer_id",
        ),
        (
            bad(&|b| b["kv_transfer_params"]["transfer_id"] = Value::Null),
            "transfer_id",
        ),
    ];
    for (body, what) in cases {
        let r = post(p.addr(), "/v1/completions", &body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{what}: {}", r.text());
        let msg = r.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(msg.contains(what), "{what}: {msg}");
    }
    for rank in ["2", "x", "-1"] {
        let r = post_with(
            p.addr(),
            "/v1/completions",
            &ok,
            &[("x-data-parallel-rank", rank)],
        )
        .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "rank {rank}");
        assert!(r.text().contains("x-data-parallel-rank"), "{}", r.text());
    }
    let ids = engine_ids(&p).await;
    let mut c = mc_consumer_body("x", &p, &ids[0], "t-5");
    c["kv_transfer_params"]["remote_bootstrap_addr"] = json!("127.0.0.1:1");
    let r = post(d.addr(), "/v1/completions", &c).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("remote_bootstrap_addr"), "{}", r.text());
    let mut c = mc_consumer_body("x", &p, &ids[0], "t-5");
    c["kv_transfer_params"]["remote_engine_id"] = json!(1);
    let r = post(d.addr(), "/v1/completions", &c).await;
    assert!(r.text().contains("remote_engine_id"), "{}", r.text());
    assert_eq!(p.stats().kv_produced_total, 0, "nothing refused was held");
    let eos = mc_producer_body("stop [[eos]] here", "t-6");
    let r = post(p.addr(), "/v1/completions", &eos).await;
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    let ps = p.stats();
    assert_eq!((ps.prefill_early_end_total, ps.kv_held_requests), (1, 0));
    p.shutdown().await;
    d.shutdown().await;
}

// ---- LMCache -----------------------------------------------------------------------------

/// A Decode consumer and a Prefill producer pushing to it (`peer`: or to nowhere).
async fn lmcache_pair(peer: bool) -> (MockWorker, MockWorker) {
    let d = start(vllm(Role::Decode, KvConnectorKind::LmCache)).await;
    let mut cfg = vllm(Role::Prefill, KvConnectorKind::LmCache);
    cfg.lmcache_peer = peer.then(|| d.url());
    (start(cfg).await, d)
}

fn chat(content: &str, extra: Value) -> Value {
    let mut body = json!({"model": "m", "messages": [{"role": "user", "content": content}]});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    body
}

#[tokio::test]
async fn an_lmcache_push_gives_the_decode_leg_its_prompt_cached() {
    let (p, d) = lmcache_pair(true).await;
    let text = prompt(61);
    let r = post(
        p.addr(),
        "/v1/chat/completions",
        &chat(&text, json!({"max_completion_tokens": 1})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    assert_eq!(r.json()["choices"][0]["message"]["content"], " tok0");
    let ps = p.stats();
    assert_eq!((ps.kv_pushed_total, ps.kv_push_failed_total), (1, 0));
    assert_eq!(d.stats().kv_held_requests, 1, "pushed before the answer");
    let dec = chat(
        &text,
        json!({"max_tokens": 4, "stream": true,
                                 "stream_options": {"include_usage": true}}),
    );
    let r = post(d.addr(), "/v1/chat/completions", &dec).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let usage = r.sse_json().last().unwrap()["usage"].clone();
    // 65 prompt tokens (4 for the message + 61): four whole blocks.
    assert_eq!(usage["prompt_tokens"], 65);
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 64);
    assert_eq!(usage["completion_tokens"], 4);
    let ds = d.stats();
    assert_eq!(
        (ds.kv_relayed_total, ds.kv_held_requests, ds.kv_pulled_total),
        (1, 0, 1)
    );
    let r = post(
        d.addr(),
        "/v1/chat/completions",
        &chat(&text, json!({"max_tokens": 2})),
    )
    .await;
    assert_eq!(cached(&r.json()), 0, "used once");
    let stats = get(d.addr(), "/mock/stats").await.json();
    assert_eq!(
        (&stats["kv_connector"], &stats["kv_recomputed_total"]),
        (&json!("lmcache"), &json!(1))
    );
    assert_eq!(
        get(p.addr(), "/mock/stats").await.json()["kv_pushed_total"],
        1
    );
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn an_lmcache_producer_without_a_peer_pushes_nothing() {
    let (p, d) = lmcache_pair(false).await;
    let text = prompt(40);
    let body = json!({"prompt": text, "max_tokens": 1});
    let r = post(p.addr(), "/v1/completions", &body).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = post(
        d.addr(),
        "/v1/completions",
        &json!({"prompt": text, "max_tokens": 5}),
    )
    .await;
    assert_eq!(cached(&r.json()), 0);
    let (ps, ds) = (p.stats(), d.stats());
    assert_eq!((ps.kv_pushed_total, ps.kv_push_failed_total), (0, 0));
    assert_eq!(
        (
            ds.kv_relayed_total,
            ds.kv_recomputed_total,
            ds.kv_produced_total
        ),
        (0, 1, 0)
    );
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn an_lmcache_push_serves_only_its_own_prompt() {
    let (p, d) = lmcache_pair(true).await;
    let r = post(
        p.addr(),
        "/v1/completions",
        &json!({"prompt": prompt(40), "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let other = json!({"prompt": format!("{}x", prompt(40)), "max_tokens": 5});
    let r = post(d.addr(), "/v1/completions", &other).await;
    assert_eq!(cached(&r.json()), 0);
    // Only a one-token request pushes: a longer one is a plain request.
    let r = post(
        p.addr(),
        "/v1/completions",
        &json!({"prompt": "y", "max_tokens": 2}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let ds = d.stats();
    assert_eq!((ds.kv_recomputed_total, ds.kv_held_requests), (1, 1));
    assert_eq!(p.stats().kv_pushed_total, 1);
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn an_lmcache_prefill_ending_early_pushes_nothing() {
    let (p, d) = lmcache_pair(true).await;
    let body = json!({"prompt": "done [[eos]]", "max_tokens": 1});
    let r = post(p.addr(), "/v1/completions", &body).await;
    assert_eq!(r.json()["choices"][0]["finish_reason"], "stop");
    let ps = p.stats();
    assert_eq!((ps.kv_pushed_total, ps.prefill_early_end_total), (0, 1));
    assert_eq!(d.stats().kv_produced_total, 0);
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn a_failed_lmcache_push_is_counted_and_the_answer_still_succeeds() {
    let gone = PortReservation::new().unwrap();
    let mut cfg = vllm(Role::Prefill, KvConnectorKind::LmCache);
    cfg.lmcache_peer = Some(gone.url());
    let p = start(cfg).await;
    let r = post(
        p.addr(),
        "/v1/completions",
        &json!({"prompt": prompt(8), "max_tokens": 1}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    let ps = p.stats();
    assert_eq!((ps.kv_pushed_total, ps.kv_push_failed_total), (0, 1));
    let nixl_params = json!({"prompt": "x", "max_tokens": 1,
                             "kv_transfer_params": {"do_remote_decode": true}});
    let r = post(p.addr(), "/v1/completions", &nixl_params).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text().contains("LMCache"), "{}", r.text());
    p.shutdown().await;
}
