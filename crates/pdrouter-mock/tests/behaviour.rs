//! Counters, fault injection, runtime controls and lifecycle.

mod common;

use std::time::{Duration, Instant};

use common::{TIMEOUT, get, post, start_request, try_request, wait_until};
use http_body_util::BodyExt;
use hyper::{Method, StatusCode};
use pdrouter_mock::{MockConfig, MockWorker, PortReservation, Role};
use serde_json::json;

async fn worker(cfg: MockConfig) -> MockWorker {
    MockWorker::start(cfg).await.expect("start worker")
}

#[tokio::test]
async fn stats_count_only_generation_posts() {
    let w = worker(MockConfig::new(Role::Decode)).await;
    for path in [
        "/health",
        "/health_generate",
        "/v1/models",
        "/get_server_info",
        "/get_model_info",
        "/mock/stats",
    ] {
        get(w.addr(), path).await;
    }
    let s = w.stats();
    assert_eq!((s.requests_total, s.inflight, s.max_inflight), (0, 0, 0));
    assert_eq!(s.last_request, None);
    assert_eq!(s.last_headers, None, "probes are not generation requests");
    let v = get(w.addr(), "/mock/stats").await.json();
    assert_eq!(
        v,
        json!({"role": "decode", "requests_total": 0, "inflight": 0, "max_inflight": 0,
               "last_request": null, "last_headers": null})
    );

    post(
        w.addr(),
        "/generate",
        &json!({"text": "a", "bootstrap_room": 1}),
    )
    .await;
    let last = json!({"messages": [{"role": "user", "content": "b"}], "bootstrap_room": 2});
    post(w.addr(), "/v1/chat/completions", &last).await;
    // Rejected requests count too.
    let rejected = post(w.addr(), "/v1/completions", &json!({"prompt": "c"})).await;
    assert_eq!(rejected.status, StatusCode::BAD_REQUEST);

    let s = w.stats();
    assert_eq!(s.requests_total, 3);
    assert_eq!(s.inflight, 0);
    assert_eq!(s.max_inflight, 1);
    assert_eq!(s.last_request, Some(json!({"prompt": "c"})));
    let v = get(w.addr(), "/mock/stats").await.json();
    assert_eq!(v["requests_total"], 3);
    assert_eq!(v["last_request"], json!({"prompt": "c"}));
    assert_eq!(v["role"], "decode");
    w.shutdown().await;
}

#[tokio::test]
async fn inflight_drops_when_streaming_client_disconnects() {
    let mut cfg = MockConfig::new(Role::Regular);
    cfg.output_tokens = 10_000;
    cfg.token_interval = Duration::from_millis(20);
    let w = worker(cfg).await;
    let body = json!({"text": "x", "stream": true}).to_string();
    let (resp, conn) = start_request(w.addr(), Method::POST, "/generate", Some(&body))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = body.frame().await.expect("a frame").expect("frame ok");
    let first = first.into_data().expect("data frame");
    assert!(String::from_utf8_lossy(&first).starts_with("data: "));
    assert_eq!(w.stats().inflight, 1);

    // Disconnect mid-stream: the stream would otherwise last 200 s.
    drop(body);
    conn.abort();
    wait_until("inflight back to 0", || async { w.stats().inflight == 0 }).await;
    let s = w.stats();
    assert_eq!((s.requests_total, s.max_inflight), (1, 1));
    w.shutdown().await;
}

#[tokio::test]
async fn max_inflight_under_concurrency() {
    let w = worker(MockConfig::new(Role::Regular)).await;
    w.controls().set_hang(true);
    let addr = w.addr();
    let tasks: Vec<_> = (0..10)
        .map(|i| {
            tokio::spawn(async move {
                let body = json!({"text": format!("req {i}")}).to_string();
                try_request(addr, Method::POST, "/generate", Some(&body)).await
            })
        })
        .collect();
    wait_until("10 requests in flight", || async {
        w.stats().inflight == 10
    })
    .await;
    w.controls().set_hang(false);
    for t in tasks {
        let r = tokio::time::timeout(TIMEOUT, t)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        assert_eq!(r.status, StatusCode::OK);
    }
    let s = w.stats();
    assert_eq!((s.requests_total, s.inflight, s.max_inflight), (10, 0, 10));
    w.controls().reset_max_inflight();
    assert_eq!(w.stats().max_inflight, 0);
    post(addr, "/generate", &json!({"text": "again"})).await;
    assert_eq!(w.stats().max_inflight, 1);
    w.shutdown().await;
}

#[tokio::test]
async fn fail_rate_one_answers_500() {
    let mut cfg = MockConfig::new(Role::Regular);
    cfg.fail_rate = 1.0;
    let w = worker(cfg).await;
    for path in ["/generate", "/v1/completions"] {
        let r = post(w.addr(), path, &json!({"text": "x", "prompt": "x"})).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(r.json()["error"]["message"].is_string());
    }
    // Health is unaffected.
    assert_eq!(get(w.addr(), "/health").await.status, StatusCode::OK);
    w.controls().set_fail_rate(0.0);
    assert_eq!(
        post(w.addr(), "/generate", &json!({"text": "x"}))
            .await
            .status,
        StatusCode::OK
    );
    w.controls().set_fail_rate(1.0);
    assert_eq!(
        post(w.addr(), "/generate", &json!({"text": "x"}))
            .await
            .status,
        StatusCode::INTERNAL_SERVER_ERROR
    );
    assert_eq!(w.stats().requests_total, 4);
    w.shutdown().await;
}

#[tokio::test]
async fn healthy_control_switches_health_probes() {
    let w = worker(MockConfig::new(Role::Prefill)).await;
    w.controls().set_healthy(false);
    assert_eq!(
        get(w.addr(), "/health").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        get(w.addr(), "/health_generate").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    w.controls().set_healthy(true);
    assert_eq!(get(w.addr(), "/health").await.status, StatusCode::OK);
    assert_eq!(
        get(w.addr(), "/health_generate").await.status,
        StatusCode::OK
    );
    assert_eq!(w.stats().requests_total, 0);
    w.shutdown().await;
}

#[tokio::test]
async fn garbage_control_answers_non_json_200() {
    let w = worker(MockConfig::new(Role::Regular)).await;
    w.controls().set_garbage(true);
    for stream in [false, true] {
        let r = post(
            w.addr(),
            "/v1/chat/completions",
            &json!({"stream": stream, "messages": []}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK);
        assert!(serde_json::from_slice::<serde_json::Value>(&r.body).is_err());
        assert!(!r.body.is_empty());
    }
    w.controls().set_garbage(false);
    let r = post(w.addr(), "/v1/chat/completions", &json!({"messages": []})).await;
    assert_eq!(r.json()["object"], "chat.completion");
    w.shutdown().await;
}

#[tokio::test]
async fn hang_control_holds_requests_until_cleared() {
    let w = worker(MockConfig::new(Role::Regular)).await;
    w.controls().set_hang(true);
    let addr = w.addr();
    let pending = tokio::spawn(async move {
        try_request(addr, Method::POST, "/generate", Some(r#"{"text":"x"}"#)).await
    });
    wait_until("request in flight", || async { w.stats().inflight == 1 }).await;
    // Health probes are not held.
    assert_eq!(get(addr, "/health").await.status, StatusCode::OK);
    assert!(!pending.is_finished());
    w.controls().set_hang(false);
    let r = tokio::time::timeout(TIMEOUT, pending)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["meta_info"]["completion_tokens"], 8);
    w.shutdown().await;
}

#[tokio::test]
async fn release_hung_lets_the_oldest_held_requests_through_one_at_a_time() {
    let w = worker(MockConfig::new(Role::Regular)).await;
    w.controls().set_hang(true);
    let addr = w.addr();
    let send = |text: &'static str| {
        tokio::spawn(async move {
            let body = json!({ "text": text }).to_string();
            try_request(addr, Method::POST, "/generate", Some(&body)).await
        })
    };
    // Three requests held in a known order; the middle one's client goes away.
    let first = send("first");
    wait_until("first held", || async { w.controls().hung() == 1 }).await;
    let gone = send("gone");
    wait_until("second held", || async { w.controls().hung() == 2 }).await;
    let third = send("third");
    wait_until("third held", || async { w.controls().hung() == 3 }).await;
    gone.abort();
    wait_until("the gone client is no longer held", || async {
        w.controls().hung() == 2
    })
    .await;
    assert_eq!(w.controls().release_hung(1), 1);
    let r = tokio::time::timeout(TIMEOUT, first).await.unwrap().unwrap();
    assert_eq!(r.unwrap().status, StatusCode::OK);
    assert!(!third.is_finished(), "only the oldest was let through");
    assert!(w.controls().hang(), "the hang stays on");
    // Over HTTP: asking for more than are held releases what there is.
    let r = post(addr, "/mock/controls", &json!({"release_hung": 5})).await;
    assert_eq!(r.json()["hung"], 0, "{}", r.text());
    let r = tokio::time::timeout(TIMEOUT, third).await.unwrap().unwrap();
    assert_eq!(r.unwrap().status, StatusCode::OK);
    assert_eq!(w.controls().release_hung(1), 0);
    w.shutdown().await;
}

#[tokio::test]
async fn shutdown_aborts_hung_requests() {
    let w = worker(MockConfig::new(Role::Regular)).await;
    w.controls().set_hang(true);
    let addr = w.addr();
    let pending = tokio::spawn(async move {
        try_request(addr, Method::POST, "/generate", Some(r#"{"text":"x"}"#)).await
    });
    wait_until("request in flight", || async { w.stats().inflight == 1 }).await;
    tokio::time::timeout(TIMEOUT, w.shutdown())
        .await
        .expect("shutdown is prompt");
    let res = tokio::time::timeout(TIMEOUT, pending)
        .await
        .unwrap()
        .unwrap();
    assert!(
        res.is_err(),
        "hung request must fail when the worker dies: {res:?}"
    );
}

#[tokio::test]
async fn delay_control_and_token_interval() {
    let mut cfg = MockConfig::new(Role::Decode);
    cfg.output_tokens = 5;
    cfg.token_interval = Duration::from_millis(30);
    let w = worker(cfg).await;
    let req = json!({"text": "x", "bootstrap_room": 1});

    // 4 gaps of 30 ms between 5 tokens.
    let t = Instant::now();
    assert_eq!(
        post(w.addr(), "/generate", &req).await.status,
        StatusCode::OK
    );
    assert!(
        t.elapsed() >= Duration::from_millis(120),
        "{:?}",
        t.elapsed()
    );

    w.controls().set_delay(Duration::from_millis(250));
    let t = Instant::now();
    post(w.addr(), "/generate", &req).await;
    assert!(
        t.elapsed() >= Duration::from_millis(370),
        "{:?}",
        t.elapsed()
    );

    // The delay applies before the response head of a stream too.
    let mut s = req.clone();
    s["stream"] = json!(true);
    let t = Instant::now();
    let (resp, _conn) = start_request(w.addr(), Method::POST, "/generate", Some(&s.to_string()))
        .await
        .unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(250),
        "{:?}",
        t.elapsed()
    );
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(
        t.elapsed() >= Duration::from_millis(370),
        "{:?}",
        t.elapsed()
    );
    assert!(String::from_utf8_lossy(&body).ends_with("data: [DONE]\n\n"));

    // A change applies to requests that arrive afterwards: one held by an hour-long delay
    // does not hold back the next one once the delay is back to zero.
    w.controls().set_delay(Duration::from_secs(3600));
    let addr = w.addr();
    let held = tokio::spawn(async move {
        let body = json!({"text": "x", "bootstrap_room": 2}).to_string();
        try_request(addr, Method::POST, "/generate", Some(&body)).await
    });
    wait_until("the hour-long request in flight", || async {
        w.stats().inflight == 1
    })
    .await;
    w.controls().set_delay(Duration::ZERO);
    w.controls().set_token_interval(Duration::ZERO);
    assert_eq!(
        post(w.addr(), "/generate", &req).await.status,
        StatusCode::OK
    );
    assert!(!held.is_finished());
    w.shutdown().await;
}

#[tokio::test]
async fn prefill_delay_is_the_whole_prefill() {
    let mut cfg = MockConfig::new(Role::Prefill);
    cfg.delay = Duration::from_millis(150);
    cfg.token_interval = Duration::from_secs(100); // ignored by prefill
    let w = worker(cfg).await;
    let t = Instant::now();
    let r = post(
        w.addr(),
        "/generate",
        &json!({"text": "x", "bootstrap_room": 1}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let e = t.elapsed();
    assert!(e >= Duration::from_millis(150), "{e:?}");
    w.shutdown().await;
}

#[tokio::test]
async fn shutdown_then_restart_on_same_port() {
    // The port stays reserved while the worker is down, so nobody else can take it.
    let port = PortReservation::new().unwrap();
    let mut first = MockConfig::new(Role::Decode);
    first.port = port.port();
    let w = worker(first).await;
    let addr = w.addr();
    assert_eq!(addr, port.addr());
    // An idle keep-alive connection and a streaming request in progress.
    let (_idle, _idle_conn) = common::connect(addr).await;
    let mut cfg = MockConfig::new(Role::Decode);
    cfg.output_tokens = 10_000;
    cfg.token_interval = Duration::from_millis(20);
    w.controls().set_output_tokens(10_000);
    w.controls().set_token_interval(Duration::from_millis(20));
    let body = json!({"text": "x", "stream": true, "bootstrap_room": 1}).to_string();
    let (resp, _conn) = start_request(addr, Method::POST, "/generate", Some(&body))
        .await
        .unwrap();
    let mut stream = resp.into_body();
    stream.frame().await.unwrap().unwrap();

    w.shutdown().await;
    // The open stream is cut off instead of running to completion.
    let rest = tokio::time::timeout(TIMEOUT, stream.collect())
        .await
        .expect("stream ends");
    assert!(rest.is_err(), "stream must end with an error");
    // Nothing listens any more.
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());

    cfg.port = addr.port();
    let w2 = worker(cfg).await;
    assert_eq!(w2.addr(), addr);
    assert_eq!(get(addr, "/health").await.status, StatusCode::OK);
    assert_eq!(w2.stats().requests_total, 0);
    w2.shutdown().await;
}

#[tokio::test]
async fn controls_over_http() {
    let w = worker(MockConfig::new(Role::Regular)).await;
    let r = post(
        w.addr(),
        "/mock/controls",
        &json!({"healthy": false, "delay_ms": 5, "fail_rate": 0.25}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    assert_eq!(v["healthy"], false);
    assert_eq!(v["delay_ms"], 5);
    assert_eq!(v["fail_rate"], 0.25);
    assert!(!w.controls().healthy());
    assert_eq!(
        get(w.addr(), "/health").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let r = post(w.addr(), "/mock/controls", &json!({"bogus": 1})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(w.stats().requests_total, 0);
    w.shutdown().await;
}

#[tokio::test]
async fn dropping_worker_stops_it() {
    let w = worker(MockConfig::new(Role::Regular)).await;
    let addr = w.addr();
    drop(w);
    wait_until("listener closed", || async {
        tokio::net::TcpStream::connect(addr).await.is_err()
    })
    .await;
}

#[tokio::test]
async fn inflight_drops_when_client_gives_up_on_hung_request() {
    let w = worker(MockConfig::new(Role::Regular)).await;
    w.controls().set_hang(true);
    let (mut sender, conn) = common::connect(w.addr()).await;
    let req = hyper::Request::post("/generate")
        .header("host", w.addr().to_string())
        .body(http_body_util::Full::new(bytes::Bytes::from_static(
            b"{\"text\":\"x\"}",
        )))
        .unwrap();
    let pending = tokio::spawn(async move { sender.send_request(req).await });
    wait_until("request in flight", || async { w.stats().inflight == 1 }).await;
    pending.abort();
    conn.abort();
    wait_until("inflight back to 0", || async { w.stats().inflight == 0 }).await;
    w.shutdown().await;
}

#[tokio::test]
async fn hold_body_open_sends_the_answer_but_not_its_end_until_cleared() {
    let w = worker(MockConfig::new(Role::Prefill)).await;
    let r = post(w.addr(), "/mock/controls", &json!({"hold_body_open": true})).await;
    assert_eq!(r.json()["hold_body_open"], true);
    let (resp, _task) = start_request(
        w.addr(),
        Method::POST,
        "/generate",
        Some(r#"{"text":"x","bootstrap_room":1}"#),
    )
    .await
    .expect("answered");
    assert_eq!(resp.status(), StatusCode::OK);
    let mut body = resp.into_body();
    let first = tokio::time::timeout(TIMEOUT, body.frame())
        .await
        .expect("the content arrives")
        .expect("a frame")
        .expect("not an error");
    let content: serde_json::Value =
        serde_json::from_slice(first.data_ref().expect("data")).expect("the whole answer");
    assert_eq!(content["meta_info"]["completion_tokens"], 1);
    // The body stays open (the request stays in flight) until the switch is cleared.
    let end = tokio::spawn(async move { body.frame().await.is_none() });
    assert_eq!(w.stats().inflight, 1);
    assert!(!end.is_finished());
    w.controls().set_hold_body_open(false);
    assert!(tokio::time::timeout(TIMEOUT, end).await.unwrap().unwrap());
    wait_until("request done", || async { w.stats().inflight == 0 }).await;
    w.shutdown().await;
}
