//! Worker credentials and the headers passed on to workers, on both PD legs and in regular
//! mode, seen from the workers' side (the mock records the headers it received and, given a
//! key, answers 401 without it); keys stay out of `/workers` and the logs; logs written to a
//! pipe carry no colour codes.

use std::time::Duration;

use crate::support::*;
use pdrouter::config::{Config, Mode};

/// Mocks that require `key` (each on every route but `/mock/*`).
async fn keyed(role: Role, key: Option<&str>) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.api_key = key.map(str::to_string);
    MockWorker::start(cfg).await.expect("mock starts")
}

/// The workers of one deployment: (Prefill, Decode) in PD mode, one regular worker otherwise.
async fn workers(mode: Mode, key: Option<&str>) -> Vec<MockWorker> {
    match mode {
        Mode::PdHttp | Mode::PdGrpc | Mode::EpdGrpc => vec![
            keyed(Role::Prefill, key).await,
            keyed(Role::Decode, key).await,
        ],
        Mode::Regular | Mode::RegularGrpc => vec![keyed(Role::Regular, key).await],
    }
}

fn config(mode: Mode, ws: &[MockWorker]) -> Config {
    match mode {
        Mode::PdHttp | Mode::PdGrpc | Mode::EpdGrpc => pd_config(&[&ws[0]], &[&ws[1]]),
        Mode::Regular | Mode::RegularGrpc => regular_config(&[&ws[0]]),
    }
}

/// Every value of `name` the worker received with its last generation request.
fn received(w: &MockWorker, name: &str) -> Vec<String> {
    w.stats()
        .last_headers
        .expect("the worker got a request")
        .get(name)
        .cloned()
        .unwrap_or_default()
}

const MODES: [Mode; 2] = [Mode::PdHttp, Mode::Regular];

/// `--api-key` is the router's credential towards its startup workers: probes, model
/// discovery and every inference leg carry it, and the headers a trace needs go along.
#[tokio::test]
async fn the_router_key_reaches_startup_workers_with_the_trace_headers() {
    for mode in MODES {
        let ws = workers(mode, Some("k-router")).await;
        let mut cfg = config(mode, &ws);
        cfg.api_key = Some("k-router".into());
        cfg.health.enabled = true;
        let r = router(cfg).await;
        let reg = r.registry().clone();
        assert!(
            eventually(Duration::from_secs(10), || reg.snapshot().all().iter().all(
                |w| w.is_routable() && w.model_id().as_deref() == Some("mock-model")
            ))
            .await,
            "{mode:?}: health probes and model discovery authenticated"
        );
        let headers = [
            ("authorization", "Bearer k-router"),
            (
                "traceparent",
                "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            ),
            ("tracestate", "vendor=opaque"),
            ("x-request-id", "req-42"),
            ("x-correlation-id", "corr-7"),
            ("x-request-id-upstream", "up-9"),
            ("x-smg-routing-key", "user-3"),
            ("te", "trailers"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic eHg="),
            ("cookie", "session=1"),
        ];
        let reply = send(r.addr(), "POST", "/v1/chat/completions", CHAT, &headers).await;
        assert_eq!(reply.status, 200, "{mode:?}: {}", reply.text());
        for w in &ws {
            let role = w.role();
            assert_eq!(received(w, "authorization"), ["Bearer k-router"], "{role}");
            for (name, value) in &headers[1..7] {
                assert_eq!(received(w, name), [*value], "{role}: {name}");
            }
            for (name, _) in &headers[7..] {
                assert!(received(w, name).is_empty(), "{role}: {name} passed on");
            }
        }
        // The information routes the router answers from a worker authenticate too.
        for path in ["/get_server_info", "/get_model_info"] {
            let reply = get(r.addr(), path).await;
            assert_eq!(reply.status, 200, "{mode:?} {path}: {}", reply.text());
        }
        let reply = send(
            r.addr(),
            "GET",
            "/health_generate",
            "",
            &[("authorization", "Bearer k-router")],
        )
        .await;
        assert_eq!(reply.status, 200, "{mode:?}: {}", reply.text());
        r.shutdown(Duration::from_secs(1)).await;
    }
}

/// A worker given its own key (here through `PUT /workers/{id}`) gets that key, and only
/// that key, whatever the client or the router's key say.
#[tokio::test]
async fn a_workers_own_key_wins() {
    for mode in MODES {
        let ws = workers(mode, Some("k-worker")).await;
        let mut cfg = config(mode, &ws);
        cfg.api_key = Some("k-router".into());
        let r = router(cfg).await;
        let auth = [("authorization", "Bearer k-router")];
        let ids: Vec<String> = r
            .registry()
            .snapshot()
            .all()
            .iter()
            .map(|w| w.id().to_string())
            .collect();
        for id in ids {
            let path = format!("/workers/{id}");
            let reply = send(r.addr(), "PUT", &path, r#"{"api_key":"k-worker"}"#, &auth).await;
            assert_eq!(reply.status, 200, "{}", reply.text());
            assert!(!reply.text().contains("k-worker"));
        }
        let reply = send(r.addr(), "POST", "/v1/completions", COMPLETION, &auth).await;
        assert_eq!(reply.status, 200, "{mode:?}: {}", reply.text());
        for w in &ws {
            assert_eq!(
                received(w, "authorization"),
                ["Bearer k-worker"],
                "{}",
                w.role()
            );
        }
        let listed = send(r.addr(), "GET", "/workers", "", &auth).await;
        assert_eq!(listed.status, 200);
        assert!(!listed.text().contains("k-worker"), "{}", listed.text());
        assert!(!listed.text().contains("k-router"), "{}", listed.text());
        r.shutdown(Duration::from_secs(1)).await;
    }
}

/// With no key of the router's or the worker's, the client's credential is passed on (once);
/// without one, none is sent.
#[tokio::test]
async fn without_keys_the_clients_authorization_is_passed_on() {
    for mode in MODES {
        let ws = workers(mode, Some("k-client")).await;
        let r = router(config(mode, &ws)).await;
        let reply = send(
            r.addr(),
            "POST",
            "/generate",
            r#"{"text":"hi"}"#,
            &[
                ("authorization", "Bearer k-client"),
                ("authorization", "Bearer second"),
            ],
        )
        .await;
        assert_eq!(reply.status, 200, "{mode:?}: {}", reply.text());
        for w in &ws {
            assert_eq!(
                received(w, "authorization"),
                ["Bearer k-client"],
                "{}",
                w.role()
            );
        }
        // No credential at all: the worker's 401 reaches the client as the worker's answer.
        let reply = post(r.addr(), "/generate", r#"{"text":"hi"}"#).await;
        assert_eq!(reply.status, 401, "{mode:?}: {}", reply.text());
        assert!(reply.error_code().ends_with("worker_error"));
        r.shutdown(Duration::from_secs(1)).await;
    }
}

#[tokio::test]
async fn a_worker_key_that_cannot_be_a_header_is_refused() {
    let w = mock(Role::Regular, 0).await;
    let r = router(regular_config(&[&w])).await;
    let id = r.registry().snapshot().all()[0].id().to_string();
    let bad = r#""k\u0001ey""#;
    let reply = post(
        r.addr(),
        "/workers",
        &format!(r#"{{"url":"http://127.0.0.1:9","api_key":{bad}}}"#),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(reply.error_code(), "invalid_request");
    let reply = send(
        r.addr(),
        "PUT",
        &format!("/workers/{id}"),
        format!(r#"{{"api_key":{bad}}}"#),
        &[],
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert_eq!(r.registry().snapshot().all().len(), 1);
    assert!(r.registry().snapshot().all()[0].api_key().is_none());
}

/// The binary writing its log to a pipe: plain text, and no key anywhere in it, even at debug
/// level with workers added and updated with keys.
#[tokio::test]
async fn logs_to_a_pipe_are_plain_and_never_show_a_key() {
    let w = keyed(Role::Regular, Some("k-router-secret")).await;
    let other = keyed(Role::Regular, Some("k-worker-secret")).await;
    let args = [
        "--worker-urls".to_string(),
        w.url(),
        "--api-key".into(),
        "k-router-secret".into(),
        "--log-level".into(),
        "debug".into(),
    ];
    let (child, addr) = tokio::task::spawn_blocking(move || {
        launch_binary_with(&args, &[], std::process::Stdio::piped())
    })
    .await
    .unwrap();
    let addr = addr.parse().unwrap();
    let auth = [("authorization", "Bearer k-router-secret")];
    let reply = send(addr, "POST", "/v1/completions", COMPLETION, &auth).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(received(&w, "authorization"), ["Bearer k-router-secret"]);
    let body = format!(r#"{{"url":"{}","api_key":"k-worker-secret"}}"#, other.url());
    assert_eq!(
        send(addr, "POST", "/workers", body, &auth).await.status,
        202
    );
    let listed = send(addr, "GET", "/workers", "", &auth).await;
    let id = listed.json()["workers"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let reply = send(
        addr,
        "PUT",
        &format!("/workers/{id}"),
        r#"{"api_key":"k-worker-secret"}"#,
        &auth,
    )
    .await;
    assert_eq!(reply.status, 200);
    let listed = send(addr, "GET", "/workers", "", &auth).await.text();
    assert!(!listed.contains("secret"), "{listed}");
    let (_, log) = stop_binary(child).await;
    assert!(log.contains("worker added"), "debug log expected: {log}");
    assert!(
        !log.contains('\u{1b}'),
        "colour codes in a piped log: {log}"
    );
    assert!(!log.contains("secret"), "a key in the log: {log}");
}
