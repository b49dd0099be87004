//! HTTP PD flow over real sockets: bootstrap injection, both legs, streaming, error mapping,
//! retries, and load accounting returning to zero.

use std::time::Duration;

use crate::support::*;

#[tokio::test]
async fn pd_request_reaches_both_legs_with_the_same_ticket() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.workers[0].bootstrap_port = Some(8998);
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["object"], "chat.completion");
    assert!(reply.header("x-request-id").is_some());
    let pl = p.stats().last_request.unwrap();
    let dl = d.stats().last_request.unwrap();
    assert_eq!(pl["bootstrap_room"], dl["bootstrap_room"]);
    assert_eq!(pl["bootstrap_host"], "127.0.0.1");
    assert_eq!(pl["bootstrap_port"], 8998);
    assert!(pl["bootstrap_room"].as_u64().unwrap() < 1 << 63);
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn bootstrap_port_none_is_json_null_and_batches_get_arrays() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let r = router(pd_config(&[&p], &[&d])).await;
    let reply = post(r.addr(), "/generate", r#"{"text":["a","b","c"]}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let last = d.stats().last_request.unwrap();
    assert_eq!(last["bootstrap_room"].as_array().unwrap().len(), 3);
    assert!(
        last["bootstrap_port"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p.is_null())
    );
    let reply = post(
        r.addr(),
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"x"}],"n":2}"#,
    )
    .await;
    assert_eq!(reply.status, 200);
    let last = p.stats().last_request.unwrap();
    assert_eq!(last["bootstrap_host"].as_array().unwrap().len(), 2);
}

#[tokio::test]
async fn streaming_is_relayed_to_done_and_load_is_released() {
    let p = mock(Role::Prefill, 0).await;
    let mut dc = MockConfig::new(Role::Decode);
    dc.output_tokens = 5;
    dc.token_interval = Duration::from_millis(5);
    let d = MockWorker::start(dc).await.unwrap();
    let r = router(pd_config(&[&p], &[&d])).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT_STREAM).await;
    assert_eq!(reply.status, 200);
    let text = reply.text();
    assert!(text.contains("data: "), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(text.matches("tok").count(), 5);
    for path in ["/generate", "/v1/completions"] {
        let body = if path == "/generate" {
            r#"{"text":"hi","stream":true}"#
        } else {
            r#"{"prompt":"hi","stream":true}"#
        };
        let reply = post(r.addr(), path, body).await;
        assert_eq!(reply.status, 200, "{path}");
        assert!(reply.text().contains("[DONE]"), "{path}");
    }
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn unreachable_prefill_is_a_502_naming_the_leg() {
    let d = mock(Role::Decode, 0).await;
    let dead = dead_url();
    let mut cfg = pd_config(&[], &[&d]);
    cfg.workers
        .insert(0, spec(&dead.url(), pdrouter::config::WorkerType::Prefill));
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(reply.error_code(), "prefill_connect_failed");
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("prefill")
    );
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn unreachable_decode_is_a_502_naming_the_leg() {
    let p = mock(Role::Prefill, 0).await;
    let dead = dead_url();
    let mut cfg = pd_config(&[&p], &[]);
    cfg.workers
        .push(spec(&dead.url(), pdrouter::config::WorkerType::Decode));
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 502);
    assert_eq!(reply.error_code(), "decode_connect_failed");
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn prefill_failure_maps_to_gateway_error_and_cancels_decode() {
    let p = mock(Role::Prefill, 0).await;
    p.controls().set_fail_rate(1.0);
    let mut dc = MockConfig::new(Role::Decode);
    dc.delay = Duration::from_secs(30);
    let d = MockWorker::start(dc).await.unwrap();
    let r = router(pd_config(&[&p], &[&d])).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(reply.error_code(), "prefill_worker_error");
    // The Decode leg, stuck in its 30 s delay, was cancelled.
    assert!(eventually(Duration::from_secs(5), || d.stats().inflight == 0).await);
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn retries_reselect_the_pair_on_5xx() {
    let bad = mock(Role::Prefill, 0).await;
    bad.controls().set_fail_rate(1.0);
    let good = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&bad, &good], &[&d]);
    cfg.retry.max_attempts = 5;
    cfg.retry.initial_backoff = Duration::from_millis(1);
    cfg.policy = pdrouter_policy::PolicyKind::RoundRobin;
    cfg.prefill_policy = pdrouter_policy::PolicyKind::RoundRobin;
    cfg.decode_policy = pdrouter_policy::PolicyKind::RoundRobin;
    let r = router(cfg).await;
    for _ in 0..4 {
        let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert!(bad.stats().requests_total >= 1);
    let text = r.metrics_text();
    assert!(
        metric(&r, "smg_worker_retries_total").unwrap_or(0.0) >= 1.0,
        "{text}"
    );
}

#[tokio::test]
async fn client_disconnect_mid_stream_releases_decode_load() {
    let p = mock(Role::Prefill, 0).await;
    let mut dc = MockConfig::new(Role::Decode);
    dc.output_tokens = 1000;
    dc.token_interval = Duration::from_millis(20);
    let d = MockWorker::start(dc).await.unwrap();
    let r = router(pd_config(&[&p], &[&d])).await;
    let addr = r.addr();
    let task = tokio::spawn(async move {
        use http_body_util::BodyExt;
        let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
            .body(http_body_util::Full::new(bytes::Bytes::from(CHAT_STREAM)))
            .unwrap();
        let resp = client().request(req).await.unwrap();
        let mut body = resp.into_body();
        // Read one frame, then hang up.
        let _ = body.frame().await;
    });
    task.await.unwrap();
    assert!(eventually(Duration::from_secs(10), || total_load(&r) == 0).await);
    assert!(eventually(Duration::from_secs(10), || d.stats().inflight == 0).await);
}

#[tokio::test]
async fn regular_mode_forwards_and_streams() {
    let w = mock(Role::Regular, 0).await;
    let r = router(regular_config(&[&w])).await;
    let reply = post(r.addr(), "/v1/completions", r#"{"prompt":"hi"}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(w.stats().last_request.unwrap()["prompt"], "hi");
    let reply = post(r.addr(), "/v1/chat/completions", CHAT_STREAM).await;
    assert!(reply.text().contains("[DONE]"));
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn info_and_probe_endpoints() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let r = router(pd_config(&[&p], &[&d])).await;
    let models = get(r.addr(), "/v1/models").await;
    assert_eq!(models.status, 200);
    assert_eq!(models.json()["data"][0]["id"], "mock-model");
    assert_eq!(get(r.addr(), "/get_server_info").await.status, 200);
    assert_eq!(get(r.addr(), "/get_model_info").await.status, 200);
    for path in ["/health", "/liveness", "/readiness", "/health_generate"] {
        assert_eq!(get(r.addr(), path).await.status, 200, "{path}");
    }
    // Probes never count as generation requests on the workers.
    assert_eq!(p.stats().requests_total, 0);
}

#[tokio::test]
async fn readiness_needs_both_roles() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let r = router(pd_config(&[&p], &[&d])).await;
    let w = r
        .registry()
        .snapshot()
        .of_type(pdrouter::config::WorkerType::Decode)[0]
        .clone();
    r.registry()
        .set_status(&w, pdrouter::registry::WorkerStatus::NotReady);
    let reply = get(r.addr(), "/readiness").await;
    assert_eq!(reply.status, 503);
    assert!(reply.text().contains("decode"));
    assert_eq!(get(r.addr(), "/liveness").await.status, 200);
}

all_transports!(
    #[tokio::test]
    dp_aware_registers_each_rank_with_its_own_limit
);

async fn dp_aware_registers_each_rank_with_its_own_limit(t: Transport) {
    let mut pc = t.mock(Role::Prefill);
    pc.dp_size = 2;
    let p = MockWorker::start(pc).await.unwrap();
    let d = t.start(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.dp_aware = true;
    cfg.prefill_policy = pdrouter_policy::PolicyKind::RoundRobin;
    cfg.admission = admission(1, 4, 30);
    let r = router(cfg).await;
    let prefills: Vec<String> = r
        .registry()
        .snapshot()
        .of_type(pdrouter::config::WorkerType::Prefill)
        .iter()
        .map(|w| w.url().to_string())
        .collect();
    assert_eq!(
        prefills,
        vec![format!("{}@0", p.url()), format!("{}@1", p.url())]
    );
    // Round robin over the two ranks: each request carries its entry's rank.
    let mut ranks = Vec::new();
    for _ in 0..2 {
        let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let pl = p.stats().last_request.unwrap();
        let dl = d.stats().last_request.unwrap();
        let rank = match t {
            Transport::Vllm | Transport::GrpcVllm => unreachable!("not run over vLLM workers"),
            Transport::Http => {
                let rank = pl["routed_dp_rank"].as_u64().unwrap();
                assert_eq!(dl["disagg_prefill_dp_rank"], rank);
                rank
            }
            // Each leg gets its own worker's rank; the Decode worker is not DP.
            Transport::Grpc => {
                assert_eq!(dl["data_parallel_rank"], 0);
                pl["data_parallel_rank"].as_u64().unwrap()
            }
            // Optional in TokenSpeed's protocol: absent for a worker that is not DP.
            Transport::TokenSpeed => {
                assert_eq!(dl["data_parallel_rank"], serde_json::Value::Null);
                pl["data_parallel_rank"].as_u64().unwrap()
            }
        };
        ranks.push(rank);
    }
    ranks.sort_unstable();
    assert_eq!(ranks, [0, 1]);
    assert!(
        metric(
            &r,
            &format!(
                "smg_pd_prefill_admission_inflight{{worker=\"{}@1\"}}",
                p.url()
            )
        )
        .is_some()
    );
}

#[tokio::test]
async fn a_request_without_model_gets_the_canonical_model() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.health.enabled = true;
    cfg.health.interval = Duration::from_secs(1);
    let r = router(cfg).await;
    let reg = r.registry().clone();
    assert!(
        eventually(Duration::from_secs(5), || reg
            .snapshot()
            .all()
            .iter()
            .all(|w| w.is_routable() && w.model_id().is_some()))
        .await
    );
    let reply = post(
        r.addr(),
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(d.stats().last_request.unwrap()["model"], "mock-model");
    assert_eq!(p.stats().last_request.unwrap()["model"], "mock-model");
    // A model the client names is left alone (the mock echoes it back).
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["model"], "mock-model");
    // One no worker serves is refused without reaching either worker.
    let before = (p.stats().requests_total, d.stats().requests_total);
    let reply = post(
        r.addr(),
        "/v1/chat/completions",
        r#"{"model":"other","messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.error_code(), "model_not_found");
    assert_eq!((p.stats().requests_total, d.stats().requests_total), before);
}

#[tokio::test]
async fn prefill_failure_after_the_stream_started_ends_it_with_an_sse_error_event() {
    use http_body_util::BodyExt;
    let p = mock(Role::Prefill, 0).await;
    p.controls().set_hang(true);
    let mut dc = MockConfig::new(Role::Decode);
    // A stream far longer than any test: it ends only because the Prefill worker dies.
    dc.output_tokens = 1_000_000;
    dc.token_interval = Duration::from_millis(10);
    let d = MockWorker::start(dc).await.unwrap();
    let r = router(pd_config(&[&p], &[&d])).await;
    let req = http::Request::post(format!("http://{}/v1/chat/completions", r.addr()))
        .body(http_body_util::Full::new(bytes::Bytes::from(CHAT_STREAM)))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    // The Prefill worker dies while Decode is streaming.
    p.shutdown().await;
    let mut rest = Vec::new();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            rest.extend_from_slice(&data);
        }
    }
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains(r#""code":"prefill_"#), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
    assert!(eventually(Duration::from_secs(5), || d.stats().inflight == 0).await);
}

#[tokio::test]
async fn a_client_supplied_bootstrap_field_is_replaced_not_doubled() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let r = router(pd_config(&[&p], &[&d])).await;
    let reply = post(r.addr(), "/generate", r#"{"text":"hi","bootstrap_room":5}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let pl = p.stats().last_request.unwrap();
    let dl = d.stats().last_request.unwrap();
    assert_eq!(pl["bootstrap_room"], dl["bootstrap_room"]);
    assert_ne!(pl["bootstrap_room"], 5);
    assert_eq!(pl["text"], "hi");
}

#[tokio::test]
async fn both_legs_are_in_flight_at_once() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    // Both workers hold the request until released, so "both at once" does not depend on timing.
    p.controls().set_hang(true);
    d.controls().set_hang(true);
    let r = router(pd_config(&[&p], &[&d])).await;
    let addr = r.addr();
    let call = tokio::spawn(async move { post(addr, "/v1/chat/completions", CHAT).await });
    assert!(
        eventually(Duration::from_secs(30), || p.stats().inflight == 1
            && d.stats().inflight == 1)
        .await,
        "Decode was not sent while Prefill was running"
    );
    p.controls().set_hang(false);
    d.controls().set_hang(false);
    assert_eq!(call.await.unwrap().status, 200);
}

#[tokio::test]
async fn every_documented_metric_family_is_exported() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.admission = admission(1, 0, 1);
    cfg.retry.max_attempts = 2;
    cfg.retry.initial_backoff = Duration::from_millis(1);
    cfg.breaker.failure_threshold = 2;
    let r = router(cfg).await;
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT_STREAM)
            .await
            .status,
        200
    );
    d.controls().set_fail_rate(1.0);
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        502
    );
    let w = r
        .registry()
        .snapshot()
        .of_type(pdrouter::config::WorkerType::Prefill)[0]
        .clone();
    r.registry()
        .set_status(&w, pdrouter::registry::WorkerStatus::NotReady);
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        503
    );
    // Scrape through the Prometheus listener, as an operator would.
    let text = get(r.metrics_addr().unwrap(), "/metrics").await.text();
    for family in [
        "smg_http_requests_total",
        "smg_http_request_duration_seconds_bucket",
        "smg_http_responses_total",
        "smg_router_requests_total",
        "smg_router_request_errors_total",
        "smg_worker_requests_active",
        "smg_worker_health",
        "smg_worker_cb_state",
        "smg_worker_cb_transitions_total",
        "smg_worker_retries_total",
        "smg_pd_ttft_seconds_bucket",
        "smg_pd_prefill_duration_seconds_bucket",
        "smg_pd_prefill_admission_inflight",
        "smg_pd_prefill_admission_queued",
        "smg_pd_prefill_admission_wait_seconds_bucket",
        "smg_pd_prefill_admission_rejections_total",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(family)),
            "missing {family}"
        );
    }
    // The access record names the route template and method, and the status with its code.
    let access = [
        (
            r#"smg_http_requests_total{method="POST",path="/v1/chat/completions"}"#,
            3.0,
        ),
        (
            r#"smg_http_responses_total{status_code="200",error_code="none"}"#,
            1.0,
        ),
        (
            r#"smg_http_responses_total{status_code="503",error_code="no_available_workers"}"#,
            1.0,
        ),
    ];
    for (series, count) in access {
        assert_eq!(metric(&r, series), Some(count), "{series}");
    }
}
