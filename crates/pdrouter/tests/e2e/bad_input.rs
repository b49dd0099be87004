//! Client mistakes get a 4xx (or the documented 503) in the documented error shape, never a 500,
//! and never reach a worker.

use std::time::Duration;

use crate::support::*;
use pdrouter::config::WorkerType;
use pdrouter::registry::WorkerStatus;

async fn pd() -> (MockWorker, MockWorker, pdrouter::RouterHandle) {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.max_payload_size = 1024;
    cfg.policy = pdrouter_policy::PolicyKind::ConsistentHashing;
    cfg.prefill_policy = cfg.policy;
    let r = router(cfg).await;
    (p, d, r)
}

#[tokio::test]
async fn malformed_and_misshapen_json_is_400_naming_the_field() {
    let (p, d, r) = pd().await;
    let cases: &[(&str, &str, &str)] = &[
        ("/v1/chat/completions", "{not json", "invalid_json"),
        (
            "/v1/chat/completions",
            r#"{"messages":"hi"}"#,
            "invalid_request",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[{"role":"user","content":"x"}],"stream":1}"#,
            "invalid_request",
        ),
        ("/v1/completions", r#"{"prompt":{}}"#, "invalid_request"),
        ("/generate", r#"{"text":null}"#, "invalid_request"),
        ("/generate", "[]", "invalid_request"),
        ("/v1/responses", r#"{"input":5}"#, "invalid_request"),
    ];
    for (path, body, code) in cases {
        let reply = post(r.addr(), path, body).await;
        assert_eq!(reply.status, 400, "{path} {body}: {}", reply.text());
        assert_eq!(reply.error_code(), *code, "{path} {body}");
    }
    let reply = post(r.addr(), "/v1/chat/completions", r#"{"messages":"hi"}"#).await;
    assert!(
        reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages")
    );
    assert_eq!(p.stats().requests_total + d.stats().requests_total, 0);
}

#[tokio::test]
async fn oversized_body_is_413() {
    let (p, _d, r) = pd().await;
    let big = format!(r#"{{"text":"{}"}}"#, "x".repeat(4096));
    let reply = post(r.addr(), "/generate", &big).await;
    assert_eq!(reply.status, 413);
    assert_eq!(reply.error_code(), "payload_too_large");
    assert_eq!(p.stats().requests_total, 0);
}

#[tokio::test]
async fn unknown_route_is_404_and_wrong_method_405() {
    let (_p, _d, r) = pd().await;
    let reply = get(r.addr(), "/v2/nothing").await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.error_code(), "not_found");
    let reply = get(r.addr(), "/v1/chat/completions").await;
    assert_eq!(reply.status, 405);
    reply.error_code();
}

#[tokio::test]
async fn target_worker_header_is_checked() {
    let (p, _d, r) = pd().await;
    let reply = send(
        r.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("x-smg-target-worker", "abc")],
    )
    .await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.error_code(), "invalid_header");
    let reply = send(
        r.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("x-smg-target-worker", "-1")],
    )
    .await;
    assert_eq!(reply.status, 400);
    let reply = send(
        r.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("x-smg-target-worker", "7")],
    )
    .await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.error_code(), "target_worker_unavailable");
    assert_eq!(p.stats().requests_total, 0);
    let reply = send(
        r.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("x-smg-target-worker", "0")],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
}

#[tokio::test]
async fn no_ready_worker_is_503() {
    let (p, _d, r) = pd().await;
    let w = r.registry().snapshot().of_type(WorkerType::Prefill)[0].clone();
    r.registry().set_status(&w, WorkerStatus::NotReady);
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.error_code(), "no_available_workers");
    assert_eq!(p.stats().requests_total, 0);
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn api_key_guards_inference_and_admin_but_not_probes() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.api_key = Some("s3cret".into());
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 401);
    assert_eq!(reply.error_code(), "unauthorized");
    assert!(!reply.text().contains("s3cret"));
    // Every inference route, each served by its own direct stack.
    for path in [
        "/generate",
        "/v1/completions",
        "/v1/responses",
        "/v1/chat/completions",
    ] {
        let reply = post(r.addr(), path, "{}").await;
        assert_eq!(reply.status, 401, "{path}");
        let reply = send(
            r.addr(),
            "POST",
            path,
            "{",
            &[("authorization", "Bearer s3cret")],
        )
        .await;
        assert_eq!(
            reply.status, 400,
            "{path}: the key passes, the body does not"
        );
        assert!(reply.header("x-request-id").is_some(), "{path}");
    }
    let reply = send(
        r.addr(),
        "GET",
        "/workers",
        "",
        &[("authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(reply.status, 401);
    let reply = send(
        r.addr(),
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("authorization", "Bearer s3cret")],
    )
    .await;
    assert_eq!(reply.status, 200);
    for path in ["/health", "/liveness", "/readiness"] {
        assert_eq!(get(r.addr(), path).await.status, 200, "{path}");
    }
}

#[tokio::test]
async fn request_id_is_echoed_or_generated() {
    let (_p, _d, r) = pd().await;
    let reply = send(
        r.addr(),
        "GET",
        "/health",
        "",
        &[("x-request-id", "abc-123")],
    )
    .await;
    assert_eq!(reply.header("x-request-id"), Some("abc-123"));
    let reply = get(r.addr(), "/health").await;
    assert!(reply.header("x-request-id").is_some_and(|v| v.len() >= 16));
}

/// A small body asking for a huge fan-out (2,000 empty prompts × 500 samples in 8 KB) is
/// refused before anything is built for it: no worker sees it, nothing is held.
#[tokio::test]
async fn a_huge_fan_out_in_a_small_body_is_400_before_anything_is_built() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let r = router(pd_config(&[&p], &[&d])).await;
    let prompts = vec![r#""""#; 2000].join(",");
    let body = format!(r#"{{"text":[{prompts}],"sampling_params":{{"n":500}}}}"#);
    assert!(body.len() < 8 * 1024);
    let reply = post(r.addr(), "/generate", &body).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply.text().contains("at most 256 prompts"),
        "{}",
        reply.text()
    );
    let body = r#"{"prompt":["a","b","c","d"],"n":1000}"#;
    let reply = post(r.addr(), "/v1/completions", body).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("'n'"), "{}", reply.text());
    assert_eq!(p.stats().requests_total + d.stats().requests_total, 0);
    assert_eq!(total_load(&r), 0);
}
