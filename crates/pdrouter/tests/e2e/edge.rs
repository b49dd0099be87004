//! The client-facing edge, end to end against real mock workers: request ids from configured
//! headers, CORS preflights and origins, and the control-plane keys' roles on `/workers`.

use crate::support::*;
use pdrouter::edge::{self, Cors};

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// The request id the worker received with its last generation request.
fn worker_saw_id(w: &MockWorker) -> Vec<String> {
    w.stats()
        .last_headers
        .expect("the worker got a request")
        .get("x-request-id")
        .cloned()
        .unwrap_or_default()
}

#[tokio::test]
async fn the_request_id_comes_from_the_first_configured_header_that_holds_one() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.edge.request_id_headers =
        edge::request_id_headers(&strings(&["x-trace-id", "x-my-id"])).unwrap();
    let r = router(cfg).await;
    let addr = r.addr();

    // The first listed header wins over the second; the id is echoed and forwarded.
    let reply = send(
        addr,
        "POST",
        "/v1/completions",
        COMPLETION,
        &[("x-my-id", "second"), ("x-trace-id", "first-id")],
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("x-request-id"), Some("first-id"));
    assert_eq!(worker_saw_id(&w), ["first-id"]);

    // An invalid value (a space) is skipped for the next header.
    let reply = send(
        addr,
        "POST",
        "/v1/completions",
        COMPLETION,
        &[("x-trace-id", "has space"), ("x-my-id", "fallback-id")],
    )
    .await;
    assert_eq!(reply.header("x-request-id"), Some("fallback-id"));

    // x-request-id is not in this list: a fresh id is generated instead.
    let reply = send(
        addr,
        "POST",
        "/v1/completions",
        COMPLETION,
        &[("x-request-id", "ignored")],
    )
    .await;
    let id = reply.header("x-request-id").unwrap().to_string();
    assert_ne!(id, "ignored");
    assert_eq!(id.len(), 32, "{id}");
    assert_eq!(worker_saw_id(&w), [id]);
}

#[tokio::test]
async fn the_default_request_id_headers_include_x_correlation_id() {
    let w = mock(Role::Regular, 0).await;
    let r = router(regular_config(&[&w])).await;
    let reply = send(
        r.addr(),
        "POST",
        "/v1/completions",
        COMPLETION,
        &[("x-correlation-id", "corr-7")],
    )
    .await;
    assert_eq!(reply.header("x-request-id"), Some("corr-7"));
    let both = [("x-correlation-id", "corr-8"), ("x-request-id", "req-8")];
    let reply = send(r.addr(), "POST", "/v1/completions", COMPLETION, &both).await;
    assert_eq!(reply.header("x-request-id"), Some("req-8"));
}

const ALLOWED: &str = "https://app.example";

async fn cors_router(w: &MockWorker, api_key: Option<&str>) -> pdrouter::RouterHandle {
    let mut cfg = regular_config(&[w]);
    cfg.edge.cors = edge::cors(&strings(&[ALLOWED, "http://localhost:3000"])).unwrap();
    cfg.api_key = api_key.map(str::to_string);
    router(cfg).await
}

fn preflight_headers(origin: &str) -> [(&str, &str); 3] {
    [
        ("origin", origin),
        ("access-control-request-method", "POST"),
        (
            "access-control-request-headers",
            "authorization, content-type",
        ),
    ]
}

#[tokio::test]
async fn cors_preflights_are_answered_for_allowed_origins_only_and_need_no_key() {
    let w = mock(Role::Regular, 0).await;
    let r = cors_router(&w, Some("k")).await;
    let addr = r.addr();

    let ok = send(
        addr,
        "OPTIONS",
        "/v1/chat/completions",
        "",
        &preflight_headers(ALLOWED),
    )
    .await;
    assert_eq!(ok.status, 204, "{}", ok.text());
    assert_eq!(ok.header("access-control-allow-origin"), Some(ALLOWED));
    let methods = ok.header("access-control-allow-methods").unwrap();
    assert!(methods.contains("POST"), "{methods}");
    let headers = ok.header("access-control-allow-headers").unwrap();
    assert!(headers.contains("authorization") && headers.contains("content-type"));
    assert!(ok.header("access-control-max-age").is_some());
    assert!(
        ok.header("x-request-id").is_some(),
        "preflights are observed too"
    );
    // An SDK's own headers (the OpenAI SDK's x-stainless-*) are allowed as asked for.
    let sdk = "authorization, content-type, x-stainless-lang, x-stainless-retry-count";
    let asking = |headers: Option<&'static str>| {
        let mut h = vec![
            ("origin", ALLOWED),
            ("access-control-request-method", "POST"),
        ];
        h.extend(headers.map(|v| ("access-control-request-headers", v)));
        async move { send(addr, "OPTIONS", "/v1/chat/completions", "", &h).await }
    };
    let asked = asking(Some(sdk)).await;
    assert_eq!(asked.header("access-control-allow-headers"), Some(sdk));
    // A preflight asking for none gets the router's own list.
    let none = asking(None).await;
    let own = none.header("access-control-allow-headers").unwrap();
    assert!(
        own.contains("authorization") && own.contains("traceparent"),
        "{own}"
    );

    let other = "https://evil.example";
    let refused = send(
        addr,
        "OPTIONS",
        "/v1/chat/completions",
        "",
        &preflight_headers(other),
    )
    .await;
    assert_eq!(refused.status, 204);
    assert_eq!(refused.header("access-control-allow-origin"), None);
    assert_eq!(refused.header("access-control-allow-methods"), None);
    assert_eq!(w.stats().requests_total, 0, "no preflight reached a worker");
}

#[tokio::test]
async fn cors_responses_name_the_allowed_origin_and_nothing_else() {
    let w = mock(Role::Regular, 0).await;
    let r = cors_router(&w, None).await;
    let addr = r.addr();

    let ok = send(
        addr,
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("origin", ALLOWED)],
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    assert_eq!(ok.header("access-control-allow-origin"), Some(ALLOWED));
    let exposed = ok.header("access-control-expose-headers").unwrap();
    assert!(exposed.contains("x-request-id"), "{exposed}");
    assert!(ok.headers.get_all("vary").iter().any(|v| v == "origin"));

    // Errors carry it too, so a browser script can read them.
    let err = send(
        addr,
        "POST",
        "/v1/chat/completions",
        "{",
        &[("origin", ALLOWED)],
    )
    .await;
    assert_eq!(err.status, 400);
    assert_eq!(err.header("access-control-allow-origin"), Some(ALLOWED));

    let other = send(
        addr,
        "POST",
        "/v1/chat/completions",
        CHAT,
        &[("origin", "https://x.example")],
    )
    .await;
    assert_eq!(
        other.status, 200,
        "the router still answers; the browser withholds it"
    );
    assert_eq!(other.header("access-control-allow-origin"), None);

    // No Origin (not a browser): no CORS headers; OPTIONS without a preflight is routed.
    let plain = send(addr, "POST", "/v1/chat/completions", CHAT, &[]).await;
    assert_eq!(plain.header("access-control-allow-origin"), None);
    let options = send(addr, "OPTIONS", "/v1/chat/completions", "", &[]).await;
    assert_eq!(options.status, 405);
}

#[tokio::test]
async fn cors_any_origin_answers_star() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.edge.cors = Some(Cors::Any);
    let r = router(cfg).await;
    let reply = send(
        r.addr(),
        "GET",
        "/v1/models",
        "",
        &[("origin", "https://any.example")],
    )
    .await;
    assert_eq!(reply.header("access-control-allow-origin"), Some("*"));
}

const ADMIN: &str = "admin-secret-1";
const USER: &str = "user-secret-2";

async fn keyed_router(w: &MockWorker) -> pdrouter::RouterHandle {
    let mut cfg = regular_config(&[w]);
    cfg.api_key = Some("inference-key".into());
    cfg.edge.control_plane_keys = edge::control_plane_keys(&strings(&[
        &format!("ops:Operators:admin:{ADMIN}"),
        &format!("mon:Monitoring:user:{USER}"),
    ]))
    .unwrap();
    router(cfg).await
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

#[tokio::test]
async fn control_plane_keys_gate_workers_by_role() {
    let w = mock(Role::Regular, 0).await;
    let extra = mock(Role::Regular, 0).await;
    let r = keyed_router(&w).await;
    let addr = r.addr();
    let admin = bearer(ADMIN);
    let user = bearer(USER);
    let inference = bearer("inference-key");

    // Admin: every control-plane route.
    let listed = send(addr, "GET", "/workers", "", &[("authorization", &admin)]).await;
    assert_eq!(listed.status, 200, "{}", listed.text());
    let body = format!(r#"{{"url":"{}"}}"#, extra.url());
    let added = send(
        addr,
        "POST",
        "/workers",
        body.clone(),
        &[("authorization", &admin)],
    )
    .await;
    assert_eq!(added.status, 202, "{}", added.text());
    assert_eq!(r.registry().snapshot().all().len(), 2);

    // User: a known key, but not for the control plane; nothing changes.
    for (method, path, body) in [
        ("GET", "/workers".to_string(), String::new()),
        ("POST", "/workers".to_string(), body.clone()),
        (
            "DELETE",
            format!("/workers/{}", extra.url().replace("http://", "")),
            String::new(),
        ),
    ] {
        let reply = send(addr, method, &path, body, &[("authorization", &user)]).await;
        assert_eq!(reply.status, 403, "{method} {path}: {}", reply.text());
        assert_eq!(reply.error_code(), "forbidden");
    }
    // No key, an unknown key, or the inference key: 401.
    for auth in [None, Some(bearer("nope")), Some(inference.clone())] {
        let headers: Vec<(&str, &str)> =
            auth.iter().map(|a| ("authorization", a.as_str())).collect();
        let reply = send(addr, "GET", "/workers", "", &headers).await;
        assert_eq!(reply.status, 401, "{auth:?}");
        assert_eq!(reply.error_code(), "unauthorized");
    }
    assert_eq!(r.registry().snapshot().all().len(), 2);

    // Inference keeps --api-key; control-plane keys are not inference credentials.
    let ok = send(
        addr,
        "POST",
        "/v1/completions",
        COMPLETION,
        &[("authorization", &inference)],
    )
    .await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let refused = send(
        addr,
        "POST",
        "/v1/completions",
        COMPLETION,
        &[("authorization", &admin)],
    )
    .await;
    assert_eq!(refused.status, 401);
    // Open routes stay open.
    assert_eq!(get(addr, "/v1/models").await.status, 200);
}

#[tokio::test]
async fn without_control_plane_keys_the_api_key_guards_workers() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.api_key = Some("k".into());
    let r = router(cfg).await;
    assert_eq!(get(r.addr(), "/workers").await.status, 401);
    let ok = send(
        r.addr(),
        "GET",
        "/workers",
        "",
        &[("authorization", "Bearer k")],
    )
    .await;
    assert_eq!(ok.status, 200);
}

/// The binary at debug level: control-plane requests are logged by key id, never by key, and
/// a malformed entry fails the command line without echoing its key.
#[tokio::test]
async fn control_plane_keys_never_reach_the_log() {
    let w = mock(Role::Regular, 0).await;
    let args = [
        "--worker-urls".to_string(),
        w.url(),
        "--disable-health-check".into(),
        "--log-level".into(),
        "debug".into(),
        "--control-plane-api-keys".into(),
        format!("ops:Operators:admin:{ADMIN}"),
        format!("mon:Monitoring:user:{USER}"),
    ];
    let (child, addr) = tokio::task::spawn_blocking(move || {
        launch_binary_with(&args, &[], std::process::Stdio::piped())
    })
    .await
    .unwrap();
    let addr = addr.parse().unwrap();
    for (key, status) in [(ADMIN, 200), (USER, 403), ("wrong-secret-3", 401)] {
        let auth = bearer(key);
        let reply = send(addr, "GET", "/workers", "", &[("authorization", &auth)]).await;
        assert_eq!(reply.status, status, "{key}");
    }
    let (_, log) = stop_binary(child).await;
    assert!(
        log.contains("key_id=ops") && log.contains("key_id=mon"),
        "{log}"
    );
    for secret in [ADMIN, USER, "wrong-secret-3"] {
        assert!(!log.contains(secret), "{secret} in the log: {log}");
    }

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdrouter"))
        .args([
            "launch",
            "--worker-urls",
            "http://127.0.0.1:1",
            "--control-plane-api-keys",
        ])
        .arg("ops:Operators:root:top-secret-9")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("role 'root'") && !err.contains("top-secret-9"),
        "{err}"
    );
}
