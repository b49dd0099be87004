//! EPD mode without images, against TokenSpeed mock workers of the three roles: encode workers
//! are registered, health-checked through the standard gRPC health service and listed; the
//! router is ready only with a ready worker of each role; a text-only request is TokenSpeed PD
//! (no `Encode` call, one `kv_bootstrap_info` on both legs) under the same Prefill admission.
//! Requests with images are in `grpc_epd_images.rs`.

use std::time::Duration;

use crate::support::*;
use pdrouter::config::{Config, Mode, WorkerSpec, WorkerType};
use pdrouter_mock::GrpcRuntime;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(10);

async fn ts(role: Role) -> MockWorker {
    grpc_mock(role, |c| c.grpc_runtime = GrpcRuntime::TokenSpeed).await
}

struct Epd {
    e: MockWorker,
    p: MockWorker,
    d: MockWorker,
    cfg: Config,
}

/// One worker of each role and an EPD config over them, health checks on.
async fn epd() -> Epd {
    let (e, p, d) = (
        ts(Role::Encode).await,
        ts(Role::Prefill).await,
        ts(Role::Decode).await,
    );
    let spec = |w: &MockWorker, t, port: Option<u16>| WorkerSpec {
        bootstrap_port: port,
        ..crate::support::spec(&w.url(), t)
    };
    let workers = vec![
        spec(&e, WorkerType::Encode, Some(e.addr().port())),
        spec(&p, WorkerType::Prefill, Some(p.addr().port())),
        spec(&d, WorkerType::Decode, None),
    ];
    let mut cfg = Config::with_workers(Mode::EpdGrpc, workers);
    cfg.health.interval = Duration::from_secs(1);
    cfg.health.timeout = Duration::from_secs(2);
    cfg.health.failure_threshold = 1;
    cfg.health.success_threshold = 1;
    cfg.retry.max_attempts = 1;
    Epd { e, p, d, cfg }
}

/// A router over `cfg` once every worker is routable.
async fn ready_router(cfg: Config) -> pdrouter::RouterHandle {
    let r = router(cfg).await;
    let all_ready = || {
        r.registry()
            .snapshot()
            .all()
            .iter()
            .all(|w| w.is_routable())
    };
    assert!(eventually(WAIT, all_ready).await, "workers ready");
    r
}

async fn ready(r: &pdrouter::RouterHandle) -> bool {
    get(r.addr(), "/readiness").await.status == 200
}

#[tokio::test]
async fn encode_workers_are_health_checked_listed_and_needed_for_readiness() {
    let Epd {
        e,
        p: _p,
        d: _d,
        cfg,
    } = epd().await;
    let r = ready_router(cfg).await;
    let reply = get(r.addr(), "/readiness").await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["workers"]["ready_encode"], 1);
    let workers = get(r.addr(), "/workers").await.json();
    let encode: Vec<&Value> = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|w| w["worker_type"] == "encode")
        .collect();
    assert_eq!(encode.len(), 1, "{workers}");
    assert_eq!(encode[0]["url"], e.url());
    assert_eq!(encode[0]["bootstrap_port"], e.addr().port());
    assert_eq!(encode[0]["connection_mode"], "grpc");
    assert_eq!(workers["stats"]["encode_count"], 1);
    assert_eq!(workers["stats"]["by_type"]["encode"], 1);

    // An unhealthy encode worker makes the router unready, and ready again on recovery.
    let encode_ready = |r: &pdrouter::RouterHandle| {
        r.registry().snapshot().of_type(WorkerType::Encode)[0].is_routable()
    };
    e.controls().set_healthy(false);
    assert!(eventually(WAIT, || !encode_ready(&r)).await);
    let reply = get(r.addr(), "/readiness").await;
    assert_eq!(reply.status, 503);
    assert!(reply.text().contains("encode"), "{}", reply.text());
    e.controls().set_healthy(true);
    assert!(eventually(WAIT, || encode_ready(&r)).await);
    assert!(ready(&r).await);
}

#[tokio::test]
async fn a_text_only_request_is_tokenspeed_pd_under_prefill_admission() {
    let Epd { e, p, d, mut cfg } = epd().await;
    cfg.admission = admission(1, 4, 30);
    let r = ready_router(cfg).await;
    for body in [CHAT, CHAT_STREAM] {
        let reply = post(r.addr(), "/v1/chat/completions", body).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let pl = p.stats().last_request.unwrap();
        let dl = d.stats().last_request.unwrap();
        assert_eq!(pl["runtime"], "tokenspeed");
        assert_eq!(pl["kv_bootstrap_info"], dl["kv_bootstrap_info"]);
        assert_eq!(pl["has_encode_bootstrap_info"], false);
        assert_eq!(pl["has_mm_inputs"], false);
    }
    // No Encode call for a request without images; encode workers take no admission slot.
    assert_eq!(e.stats().requests_total, 0);
    assert_eq!(e.stats().encode_items_total, 0);
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
    let inflight = metric(&r, "smg_pd_prefill_admission_inflight{").unwrap_or(0.0);
    assert_eq!(inflight, 0.0);
}

#[tokio::test]
async fn an_image_request_is_refused_naming_its_part_and_reaches_no_worker() {
    let Epd { e, p, d, mut cfg } = epd().await;
    cfg.admission = admission(1, 4, 30);
    let r = ready_router(cfg).await;
    let image = r#"{"messages":[{"role":"system","content":"s"},{"role":"user","content":[
        {"type":"text","text":"what is this?"},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]}"#;
    // The model's tokenizer came from a worker's bundle without a vision model's config:
    // images are the client's mistake here.
    let reply = post(r.addr(), "/v1/chat/completions", image).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply.text().contains("messages[1].content[1]"),
        "{}",
        reply.text()
    );
    // Eleven images: the client's mistake comes first.
    let parts = [r#"{"type":"image_url","image_url":{"url":"x"}}"#; 11].join(",");
    let many = format!(r#"{{"messages":[{{"role":"user","content":[{parts}]}}]}}"#);
    let reply = post(r.addr(), "/v1/chat/completions", &many).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("too_many_images"), "{}", reply.text());
    for w in [&e, &p, &d] {
        assert_eq!(w.stats().requests_total, 0);
    }
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn workers_api_takes_encode_workers_in_epd_mode_only() {
    let Epd {
        e: _e,
        p: _p,
        d: _d,
        cfg,
    } = epd().await;
    let r = router(cfg).await;
    let extra = ts(Role::Encode).await;
    let body = format!(
        r#"{{"url":"{}","worker_type":"encode","bootstrap_port":{}}}"#,
        extra.url(),
        extra.addr().port()
    );
    let reply = post(r.addr(), "/workers", &body).await;
    assert!(reply.status < 300, "{}", reply.text());
    assert!(
        eventually(WAIT, || r
            .registry()
            .snapshot()
            .of_type(WorkerType::Encode)
            .iter()
            .any(|w| w.url() == extra.url() && w.is_routable()))
        .await
    );
    let reply = post(
        r.addr(),
        "/workers",
        &format!(r#"{{"url":"{}"}}"#, extra.url()),
    )
    .await;
    assert_eq!(reply.status, 400);
    assert!(
        reply.text().contains("encode, prefill or decode"),
        "{}",
        reply.text()
    );

    // A PD router refuses an encode worker.
    let (_p2, _d2, pd) = pair(3).await;
    let r = router(pd).await;
    let reply = post(r.addr(), "/workers", &body).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
}
