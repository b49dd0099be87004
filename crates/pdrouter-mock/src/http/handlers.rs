//! HTTP routes.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::body::{self, JSON, SSE};
use super::render::Plan;
use super::request::{Api, prompt_words, requested_tokens};
use crate::bootstrap::{await_bootstrap, rooms_of};
use crate::config::Role;
use crate::state::{InflightGuard, MockStats, Shared};

/// Largest accepted request body.
pub(crate) const BODY_LIMIT: usize = 64 * 1024 * 1024;

/// What a worker in garbage mode answers to generation requests.
pub(crate) const GARBAGE: &[u8] = b"<<mock garbage>> this is }{ not JSON \x01\x02";

type AppState = State<Arc<Shared>>;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let routes = Router::new()
        .route("/health", get(health))
        .route("/health_generate", get(health))
        .route("/v1/models", get(models))
        .route("/get_server_info", get(server_info))
        .route("/get_model_info", get(model_info))
        .route("/mock/stats", get(stats))
        .route("/mock/controls", post(set_controls));
    // The same table `front::Front` sends generation requests past the router by.
    Api::ALL
        .into_iter()
        .fold(routes, |r, api| {
            r.route(
                api.path(),
                post(move |s: AppState, h: HeaderMap, b: Bytes| generation(s, api, h, b)),
            )
        })
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&shared),
            require_key,
        ))
        .layer(DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(shared)
}

/// With `--api-key`, every route but the test hooks under `/mock/` answers 401 unless the
/// request carries exactly one `Authorization: Bearer KEY`.
pub(crate) async fn require_key(
    State(s): AppState,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if req.uri().path().starts_with("/mock/") || key_ok(&s, req.headers()) {
        next.run(req).await
    } else {
        unauthorized()
    }
}

/// Whether a request may pass: no `--api-key`, or exactly one `Authorization: Bearer KEY`.
pub(crate) fn key_ok(s: &Shared, headers: &HeaderMap) -> bool {
    let Some(key) = &s.api_key else {
        return true;
    };
    let mut given = headers.get_all(axum::http::header::AUTHORIZATION).iter();
    match (given.next(), given.next()) {
        (Some(v), None) => v.as_bytes().strip_prefix(b"Bearer ") == Some(key.as_bytes()),
        _ => false,
    }
}

/// What a request without the right key is answered.
pub(crate) fn unauthorized() -> Response {
    body::error(StatusCode::UNAUTHORIZED, "invalid or missing API key", None)
}

pub(crate) async fn health(State(s): AppState) -> StatusCode {
    if s.controls.healthy() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    }
}

async fn models(State(s): AppState) -> Response {
    body::json(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": [{
                "id": s.model,
                "object": "model",
                "created": 0,
                "owned_by": "sglang",
                "root": s.model,
            }],
        }),
    )
}

async fn server_info(State(s): AppState) -> Response {
    body::json(
        StatusCode::OK,
        &json!({
            "model_path": s.model,
            "served_model_name": s.model,
            "dp_size": s.dp_size,
            "disaggregation_mode": s.role.disaggregation_mode(),
            "max_running_requests": s.engine.as_ref().map_or(128, |e| e.config.max_running),
            "version": "mock",
        }),
    )
}

async fn model_info(State(s): AppState) -> Response {
    body::json(
        StatusCode::OK,
        &json!({
            "model_path": s.model,
            "tokenizer_path": s.model,
            "is_generation": true,
        }),
    )
}

async fn stats(State(s): AppState) -> Response {
    body::json(
        StatusCode::OK,
        &Value::Object(stats_fields(&s, &s.controls.stats())),
    )
}

/// The fields of `GET /mock/stats` both front-ends answer. Engine-mode
/// workers add their engine queue (absent otherwise, so the plain contract
/// stays exactly as documented).
pub(crate) fn stats_fields(s: &Shared, st: &MockStats) -> serde_json::Map<String, Value> {
    let mut map = serde_json::Map::new();
    map.insert("role".to_owned(), json!(s.role));
    map.insert("requests_total".to_owned(), json!(st.requests_total));
    map.insert("inflight".to_owned(), json!(st.inflight));
    map.insert("max_inflight".to_owned(), json!(st.max_inflight));
    map.insert("last_request".to_owned(), json!(st.last_request));
    map.insert("last_headers".to_owned(), json!(st.last_headers));
    if let Some(engine) = &s.engine {
        map.insert("engine_queue_len".to_owned(), json!(engine.queue_len()));
        map.insert(
            "max_engine_queue_wait_ms".to_owned(),
            json!(engine.max_queue_wait().as_secs_f64() * 1000.0),
        );
    }
    map
}

/// Body of `POST /mock/controls`; every field is optional.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct ControlUpdate {
    delay_ms: Option<u64>,
    token_interval_ms: Option<u64>,
    output_tokens: Option<u32>,
    fail_rate: Option<f64>,
    healthy: Option<bool>,
    garbage: Option<bool>,
    hang: Option<bool>,
    release_hung: Option<usize>,
    hold_body_open: Option<bool>,
    #[serde(default)]
    reset_max_inflight: bool,
}

pub(crate) async fn set_controls(State(s): AppState, body: Bytes) -> Response {
    let update: ControlUpdate = if body.is_empty() {
        ControlUpdate::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(u) => u,
            Err(e) => {
                return body::error(
                    StatusCode::BAD_REQUEST,
                    &format!("invalid controls: {e}"),
                    None,
                );
            }
        }
    };
    let c = &s.controls;
    if let Some(ms) = update.delay_ms {
        c.set_delay(Duration::from_millis(ms));
    }
    if let Some(ms) = update.token_interval_ms {
        c.set_token_interval(Duration::from_millis(ms));
    }
    if let Some(n) = update.output_tokens {
        c.set_output_tokens(n);
    }
    if let Some(rate) = update.fail_rate {
        c.set_fail_rate(rate);
    }
    if let Some(h) = update.healthy {
        c.set_healthy(h);
    }
    if let Some(g) = update.garbage {
        c.set_garbage(g);
    }
    if let Some(h) = update.hang {
        c.set_hang(h);
    }
    if let Some(n) = update.release_hung {
        c.release_hung(n);
    }
    if let Some(h) = update.hold_body_open {
        c.set_hold_body_open(h);
    }
    if update.reset_max_inflight {
        c.reset_max_inflight();
        if let Some(engine) = &s.engine {
            engine.reset_max_queue_wait();
        }
    }
    body::json(
        StatusCode::OK,
        &json!({
            "delay_ms": c.delay().as_millis() as u64,
            "token_interval_ms": c.token_interval().as_millis() as u64,
            "output_tokens": c.output_tokens(),
            "fail_rate": c.fail_rate(),
            "healthy": c.healthy(),
            "garbage": c.garbage(),
            "hang": c.hang(),
            "hung": c.hung(),
            "hold_body_open": c.hold_body_open(),
        }),
    )
}

/// Every generation route: count, validate, inject faults, wait, answer.
pub(crate) async fn generation(
    State(s): AppState,
    api: Api,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let guard = InflightGuard::begin(&s);
    let controls = &s.controls;
    controls.record_headers(headers);

    let parsed = serde_json::from_slice::<Value>(&body);
    if parsed.is_ok() {
        controls.record_request(body);
    }
    // An engine-mode prefill is held inside the engine instead (below).
    let engine_prefill = s.engine.is_some() && s.role == Role::Prefill;
    if !engine_prefill {
        controls.wait_while_hung().await;
    }

    let req = match parsed {
        Ok(Value::Object(req)) => req,
        Ok(_) => {
            return body::error(
                StatusCode::BAD_REQUEST,
                "request body must be a JSON object",
                Some(guard),
            );
        }
        Err(e) => {
            return body::error(
                StatusCode::BAD_REQUEST,
                &format!("invalid JSON body: {e}"),
                Some(guard),
            );
        }
    };
    if s.role.requires_bootstrap() && req.get("bootstrap_room").is_none_or(Value::is_null) {
        return body::error(
            StatusCode::BAD_REQUEST,
            "missing bootstrap_room",
            Some(guard),
        );
    }
    if controls.draw_failure() {
        return body::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "mock injected failure",
            Some(guard),
        );
    }
    if controls.garbage() {
        return body::full(StatusCode::OK, JSON, GARBAGE, Some(guard));
    }
    // In engine mode a decode worker generates what the request asks for.
    let output_tokens = match &s.engine {
        Some(_) => requested_tokens(api, &req).unwrap_or_else(|| controls.output_tokens()),
        None => controls.output_tokens(),
    };
    let plan = match Plan::new(api, &req, s.role, &s.model, output_tokens) {
        Ok(plan) => plan,
        Err(msg) => return body::error(StatusCode::BAD_REQUEST, &msg, Some(guard)),
    };
    let delay = match engine_work(&s, api, &req, controls.delay()).await {
        Ok(delay) => delay,
        Err(msg) => return body::error(StatusCode::BAD_GATEWAY, &msg, Some(guard)),
    };
    drop(req);
    answer(&s, plan, delay, guard).await
}

/// Engine mode: a prefill computes in the engine, a decode first waits for its rooms. Returns
/// the delay still to wait before answering (none after an engine prefill: the configured
/// delay is part of its work), or why the rooms could not be had (a 502).
async fn engine_work(
    s: &Shared,
    api: Api,
    req: &Map<String, Value>,
    delay: Duration,
) -> Result<Duration, String> {
    let Some(engine) = &s.engine else {
        return Ok(delay);
    };
    match s.role {
        Role::Prefill => {
            let words = prompt_words(api, req);
            engine
                .prefill(words, delay, &rooms_of(req), s.controls.wait_while_hung())
                .await;
            Ok(Duration::ZERO)
        }
        Role::Decode => await_bootstrap(req).await.map(|()| delay),
        // An encode worker is never an HTTP worker (refused at start).
        Role::Regular | Role::Encode => Ok(delay),
    }
}

/// Answers `plan` after `delay`: a stream token by token (a prefill worker: all in one
/// chunk), or the whole body once every token's interval has passed. `guard` lives as long
/// as the body.
async fn answer(s: &Shared, plan: Plan, delay: Duration, guard: InflightGuard) -> Response {
    let controls = &s.controls;
    let interval = if s.role == Role::Prefill {
        Duration::ZERO
    } else {
        controls.token_interval()
    };
    let answer = if plan.stream {
        sleep(delay).await;
        if s.role == Role::Prefill {
            body::full(StatusCode::OK, SSE, plan.single_chunk_sse(), Some(guard))
        } else {
            body::sse_stream(plan.into_stream(interval, guard))
        }
    } else {
        let gaps = plan.tokens.saturating_sub(1);
        sleep(delay.saturating_add(interval.saturating_mul(gaps))).await;
        body::full(StatusCode::OK, JSON, plan.full_body(), Some(guard))
    };
    if controls.hold_body_open() {
        body::held_open(answer, controls.body_released())
    } else {
        answer
    }
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
