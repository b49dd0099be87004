//! Engine mode: running-set limit with FIFO queue, KV bootstrap rendezvous,
//! requested output length, reporting.

mod common;

use std::net::SocketAddr;

use common::{get, post, wait_until};
use hyper::StatusCode;
use pdrouter_mock::{EngineConfig, MockConfig, MockWorker, Role};
use serde_json::{Value, json};

fn engine(role: Role, max_running: usize, tokens_per_sec: f64) -> MockConfig {
    let mut cfg = MockConfig::new(role);
    cfg.engine = Some(EngineConfig {
        max_running,
        prefill_tokens_per_sec: tokens_per_sec,
        bootstrap_port: 0,
        ..EngineConfig::new()
    });
    cfg
}

async fn stats(addr: SocketAddr) -> Value {
    get(addr, "/mock/stats").await.json()
}

fn words(n: usize) -> String {
    (0..n)
        .map(|i| format!("w{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test]
async fn server_info_and_stats_report_the_engine() {
    let w = MockWorker::start(engine(Role::Prefill, 3, 1000.0))
        .await
        .unwrap();
    let info = get(w.addr(), "/get_server_info").await.json();
    assert_eq!(info["max_running_requests"], 3);
    let st = stats(w.addr()).await;
    assert_eq!(st["engine_queue_len"], 0);
    assert_eq!(st["max_engine_queue_wait_ms"], 0.0);
    assert!(w.bootstrap_addr().is_some());
    let bootstrap = w.bootstrap_addr().unwrap();
    assert_ne!(bootstrap.port(), w.addr().port());
    assert_eq!(get(bootstrap, "/health").await.status, StatusCode::OK);
    assert_eq!(
        get(bootstrap, "/room/abc").await.status,
        StatusCode::BAD_REQUEST
    );
    w.shutdown().await;

    // Only engine-mode prefill workers have a bootstrap endpoint; plain
    // workers keep the plain stats and the default max_running_requests.
    let d = MockWorker::start(engine(Role::Decode, 3, 1000.0))
        .await
        .unwrap();
    assert!(d.bootstrap_addr().is_none());
    d.shutdown().await;
    let plain = MockWorker::start(MockConfig::new(Role::Prefill))
        .await
        .unwrap();
    assert!(plain.bootstrap_addr().is_none());
    assert_eq!(
        get(plain.addr(), "/get_server_info").await.json()["max_running_requests"],
        128
    );
    assert!(stats(plain.addr()).await.get("engine_queue_len").is_none());
    plain.shutdown().await;
}

#[tokio::test]
async fn at_most_max_running_prefill_the_rest_queue() {
    // 50 words at 1 word/s: nobody finishes during the test.
    let w = MockWorker::start(engine(Role::Prefill, 2, 1.0))
        .await
        .unwrap();
    let addr = w.addr();
    let body = json!({"text": words(50), "bootstrap_room": 1});
    let mut pending = Vec::new();
    for _ in 0..5 {
        let body = body.clone();
        pending.push(tokio::spawn(async move {
            common::try_request(
                addr,
                hyper::Method::POST,
                "/generate",
                Some(&body.to_string()),
            )
            .await
        }));
    }
    wait_until("5 requests in, 3 of them queued", || async {
        let st = stats(addr).await;
        st["inflight"] == 5 && st["engine_queue_len"] == 3
    })
    .await;
    assert!(pending.iter().all(|t| !t.is_finished()));
    w.shutdown().await;
    for t in pending {
        let _ = t.await;
    }
}

#[tokio::test]
async fn queued_prefills_report_their_wait_and_finish() {
    let w = MockWorker::start(engine(Role::Prefill, 1, 1000.0))
        .await
        .unwrap();
    let addr = w.addr();
    // The hang stalls the engine: the first request keeps the only running slot, so the other
    // three are certainly queued behind it, however slowly this machine schedules them.
    w.controls().set_hang(true);
    let body = json!({"text": words(5), "bootstrap_room": 2});
    let pending: Vec<_> = (0..4)
        .map(|_| {
            let body = body.clone();
            tokio::spawn(async move { post(addr, "/generate", &body).await })
        })
        .collect();
    wait_until("one request running (held), three queued", || async {
        let st = stats(addr).await;
        st["inflight"] == 4 && st["engine_queue_len"] == 3
    })
    .await;
    assert_eq!(w.controls().hung(), 1);
    assert!(pending.iter().all(|t| !t.is_finished()));
    w.controls().set_hang(false);
    for t in pending {
        assert_eq!(t.await.unwrap().status, StatusCode::OK);
    }
    let st = stats(addr).await;
    assert_eq!(st["engine_queue_len"], 0);
    assert_eq!(st["max_inflight"], 4);
    // The queued ones waited at least from entering the queue until the hang was cleared,
    // which came after the stats request that saw them queued.
    assert!(
        st["max_engine_queue_wait_ms"].as_f64().unwrap() > 0.0,
        "{st}"
    );
    let reset = post(addr, "/mock/controls", &json!({"reset_max_inflight": true})).await;
    assert_eq!(reset.status, StatusCode::OK);
    assert_eq!(stats(addr).await["max_engine_queue_wait_ms"], 0.0);
    w.shutdown().await;
}

#[tokio::test]
async fn decode_waits_for_the_prefill_of_its_room() {
    let p = MockWorker::start(engine(Role::Prefill, 4, 10_000.0))
        .await
        .unwrap();
    let d = MockWorker::start(engine(Role::Decode, 4, 10_000.0))
        .await
        .unwrap();
    let (paddr, daddr) = (p.addr(), d.addr());
    let bootstrap = p.bootstrap_addr().unwrap();
    let ticket = json!({
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": bootstrap.port(),
        "bootstrap_room": 42,
    });
    let mut decode_body = json!({"text": "a b c", "sampling_params": {"max_new_tokens": 3}});
    let mut prefill_body = json!({"text": "a b c"});
    for b in [&mut decode_body, &mut prefill_body] {
        for (k, v) in ticket.as_object().unwrap() {
            b[k] = v.clone();
        }
    }

    // Hold the prefill back; the decode request must wait for it.
    p.controls().set_hang(true);
    let prefill = tokio::spawn(async move { post(paddr, "/generate", &prefill_body).await });
    let decode = tokio::spawn(async move { post(daddr, "/generate", &decode_body).await });
    wait_until("both legs received", || async {
        stats(paddr).await["inflight"] == 1 && stats(daddr).await["inflight"] == 1
    })
    .await;
    tokio::task::yield_now().await;
    assert!(!decode.is_finished(), "decode answered before its prefill");

    p.controls().set_hang(false);
    let pr = prefill.await.unwrap();
    assert_eq!(pr.status, StatusCode::OK);
    let dr = decode.await.unwrap();
    assert_eq!(dr.status, StatusCode::OK, "{}", dr.text());
    // The decode generated what the request asked for.
    assert_eq!(
        dr.json()["meta_info"]["completion_tokens"],
        3,
        "{}",
        dr.text()
    );
    // A late asker for a finished room is answered at once.
    let room = get(bootstrap, "/room/42").await;
    assert_eq!(room.status, StatusCode::OK);
    assert_eq!(room.json()["ready"], true);
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn decode_without_a_bootstrap_port_generates_at_once() {
    let d = MockWorker::start(engine(Role::Decode, 1, 1.0))
        .await
        .unwrap();
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 12,
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": null,
        "bootstrap_room": 1,
    });
    let r = post(d.addr(), "/v1/chat/completions", &body).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["usage"]["completion_tokens"], 12, "{}", r.text());
    d.shutdown().await;
}

#[tokio::test]
async fn decode_answers_502_when_the_bootstrap_is_unreachable() {
    let d = MockWorker::start(engine(Role::Decode, 1, 1.0))
        .await
        .unwrap();
    let body = json!({
        "text": "x",
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": 0,
        "bootstrap_room": 1,
    });
    let r = post(d.addr(), "/generate", &body).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY, "{}", r.text());
    d.shutdown().await;
}
