//! Models and the shapes SMG clients expect: which routes are open with `--api-key`, OpenAI
//! `Model` objects in `/v1/models`, SMG's `/workers` fields, and routing by the model a
//! request names (404 `model_not_found` when no worker serves it, 503 when its workers are
//! all unavailable, any worker when it names none).

use std::time::Duration;

use crate::support::*;

async fn serving(role: Role, model: &str) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.model = model.to_string();
    MockWorker::start(cfg).await.expect("mock starts")
}

fn chat(model: &str) -> String {
    format!(r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi"}}]}}"#)
}

fn total(ws: &[&MockWorker]) -> Vec<u64> {
    ws.iter().map(|w| w.stats().requests_total).collect()
}

#[tokio::test]
async fn model_information_is_open_and_shaped_like_openai_and_smg() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.api_key = Some("s3cret".into());
    let r = router(cfg).await;
    for path in [
        "/liveness",
        "/readiness",
        "/health",
        "/health_generate",
        "/v1/models",
        "/get_model_info",
        "/get_server_info",
    ] {
        let reply = get(r.addr(), path).await;
        assert_eq!(reply.status, 200, "{path} is open: {}", reply.text());
    }
    assert_eq!(get(r.addr(), "/workers").await.status, 401);
    assert_eq!(get(r.addr(), "/workers/w1").await.status, 401);
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        401
    );

    let models = get(r.addr(), "/v1/models").await.json();
    assert_eq!(models["object"], "list");
    let data = models["data"].as_array().unwrap();
    assert_eq!(data.len(), 1, "one model, however many workers: {models}");
    let m = &data[0];
    assert_eq!(m["id"], "mock-model");
    assert_eq!(m["object"], "model");
    assert!(m["created"].is_u64(), "{m}");
    assert_eq!(m["owned_by"], "sglang", "the engine's own value is kept");
    assert_eq!(m["root"], "mock-model", "and its extra fields");

    let auth = [("authorization", "Bearer s3cret")];
    let list = send(r.addr(), "GET", "/workers", "", &auth).await.json();
    assert_eq!(list["total"], 2);
    let stats = &list["stats"];
    for (key, n) in [
        ("prefill_count", 1),
        ("decode_count", 1),
        ("regular_count", 0),
        ("total_workers", 2),
        ("healthy_workers", 2),
        ("total_models", 1),
        ("total_load", 0),
    ] {
        assert_eq!(stats[key], n, "{key}: {stats}");
    }
    assert_eq!(stats["by_type"]["prefill"], 1);
    assert_eq!(stats["by_type"]["decode"], 1);
    for w in list["workers"].as_array().unwrap() {
        assert_eq!(w["is_healthy"], true, "{w}");
        assert_eq!(w["model_id"], "mock-model");
        assert_eq!(w["models"][0]["id"], "mock-model");
        assert_eq!(w["connection_mode"], "http");
        assert_eq!(w["status"], "ready");
        assert_eq!(w["circuit_breaker"], "closed");
        let id = w["id"].as_str().unwrap();
        let one = send(r.addr(), "GET", &format!("/workers/{id}"), "", &auth).await;
        assert_eq!(&one.json(), w);
    }
}

#[tokio::test]
async fn requests_go_only_to_workers_of_the_named_model() {
    let a = serving(Role::Regular, "model-a").await;
    let b = serving(Role::Regular, "model-b").await;
    let mut cfg = regular_config(&[&a, &b]);
    cfg.policy = pdrouter_policy::PolicyKind::RoundRobin;
    let r = router(cfg).await;
    for _ in 0..4 {
        let reply = post(r.addr(), "/v1/chat/completions", &chat("model-a")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        assert_eq!(reply.json()["model"], "model-a");
    }
    assert_eq!(total(&[&a, &b]), [4, 0]);

    let reply = post(r.addr(), "/v1/chat/completions", &chat("model-c")).await;
    assert_eq!(reply.status, 404, "{}", reply.text());
    assert_eq!(reply.error_code(), "model_not_found");
    assert_eq!(
        reply.json()["error"]["message"],
        "No worker available for model 'model-c'"
    );
    assert_eq!(total(&[&a, &b]), [4, 0], "nothing forwarded");

    // No model named: any worker, and the body names the model of the worker it went to.
    for _ in 0..4 {
        let reply = post(r.addr(), "/v1/completions", COMPLETION).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(total(&[&a, &b]), [6, 2]);
    assert_eq!(a.stats().last_request.unwrap()["model"], "model-a");
    assert_eq!(b.stats().last_request.unwrap()["model"], "model-b");

    let ids = get(r.addr(), "/v1/models").await.json()["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap().to_string())
        .collect::<Vec<_>>();
    assert_eq!(ids, ["model-a", "model-b"]);
}

#[tokio::test]
async fn a_model_whose_workers_are_all_down_is_503_not_404() {
    let a = serving(Role::Regular, "model-a").await;
    let b = serving(Role::Regular, "model-b").await;
    let mut cfg = regular_config(&[&a, &b]);
    cfg.health.enabled = true;
    cfg.health.interval = Duration::from_millis(100);
    cfg.health.failure_threshold = 1;
    let r = router(cfg).await;
    a.controls().set_healthy(false);
    let reg = r.registry().clone();
    assert!(
        eventually(Duration::from_secs(10), || {
            let snap = reg.snapshot();
            let a = snap
                .all()
                .iter()
                .find(|w| w.model_id().as_deref() == Some("model-a"));
            a.is_some_and(|w| !w.is_routable())
        })
        .await
    );
    let reply = post(r.addr(), "/v1/chat/completions", &chat("model-a")).await;
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert_eq!(reply.error_code(), "no_available_workers");
    let reply = post(r.addr(), "/v1/chat/completions", &chat("model-b")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(a.stats().requests_total, 0);
}

#[tokio::test]
async fn pd_pairs_serve_one_model_on_both_legs() {
    let p = serving(Role::Prefill, "model-a").await;
    let d_other = serving(Role::Decode, "model-b").await;
    let d = serving(Role::Decode, "model-a").await;
    let mut cfg = pd_config(&[&p], &[&d_other, &d]);
    cfg.decode_policy = pdrouter_policy::PolicyKind::RoundRobin;
    let r = router(cfg).await;
    // Unnamed: the Decode worker is one that serves the Prefill worker's model.
    for _ in 0..3 {
        let reply = post(r.addr(), "/generate", r#"{"text":"hi"}"#).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(total(&[&p, &d_other, &d]), [3, 0, 3]);
    assert_eq!(p.stats().last_request.unwrap()["model"], "model-a");
    assert_eq!(d.stats().last_request.unwrap()["model"], "model-a");
    // Named but served by the Decode side only: refused before either leg is sent.
    let reply = post(r.addr(), "/v1/chat/completions", &chat("model-b")).await;
    assert_eq!(reply.status, 404, "{}", reply.text());
    assert_eq!(reply.error_code(), "model_not_found");
    assert_eq!(total(&[&p, &d_other, &d]), [3, 0, 3]);
    let reply = post(r.addr(), "/v1/chat/completions", &chat("model-a")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(total(&[&p, &d_other, &d]), [4, 0, 4]);
}

/// `GET /v1/models/{id}` (the OpenAI SDK's `models.retrieve`): open like the list, the same
/// object, hub-style ids with a slash included; an id no worker serves is 404
/// `model_not_found`.
#[tokio::test]
async fn one_model_can_be_retrieved_by_id() {
    let w = serving(Role::Regular, "org/model-x").await;
    let mut cfg = regular_config(&[&w]);
    cfg.api_key = Some("s3cret".into());
    let r = router(cfg).await;
    let list = get(r.addr(), "/v1/models").await.json();
    let one = get(r.addr(), "/v1/models/org/model-x").await;
    assert_eq!(one.status, 200, "{}", one.text());
    assert_eq!(one.json(), list["data"][0]);
    assert_eq!(one.json()["object"], "model");
    let missing = get(r.addr(), "/v1/models/org/other").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.error_code(), "model_not_found");
    assert_eq!(w.stats().requests_total, 0, "nothing is forwarded");
}
