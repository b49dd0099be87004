//! Inference, information and probe handlers.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll};

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, Uri};
use axum::response::{IntoResponse, Response};
use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use tokio::time::Instant;
use tower_service::Service;

use super::AppState;
use super::middleware::RequestId;
use crate::backends::http::exchange::upstream_error;
use crate::config::WorkerType;
use crate::dispatch::RequestCtx;
use crate::error::{ApiError, Leg};
use crate::grpc::info::{self, Info};
use crate::proxy::forward::Forwarded;
use crate::registry::{ServedModel, Worker};
use crate::request::{Endpoint, ParsedRequest, parse, parse_keeping_tree};

// Names, not strings: a lookup by string parses and lowercases the name on every request.
const TARGET_WORKER: HeaderName = HeaderName::from_static("x-smg-target-worker");
const ROUTING_KEY: HeaderName = HeaderName::from_static("x-smg-routing-key");

/// Rejects a declared body length over the limit before anything is read.
fn check_length(limit: usize, headers: &HeaderMap) -> Result<(), ApiError> {
    match headers
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
    {
        Some(len) if len > limit as u64 => Err(ApiError::payload_too_large(limit)),
        _ => Ok(()),
    }
}

/// Reads a whole body of at most `limit` bytes.
/// Reads a whole body of at most `limit` bytes, within `timeout` (a body trickled in slower
/// would hold its connection, and any permit taken for it, without bound).
async fn collect_body(
    limit: usize,
    timeout: std::time::Duration,
    body: Body,
) -> Result<Bytes, ApiError> {
    let limited = http_body_util::Limited::new(body, limit);
    let collected = tokio::time::timeout(timeout, http_body_util::BodyExt::collect(limited));
    let Ok(collected) = collected.await else {
        return Err(ApiError::body_timeout(timeout.as_secs()));
    };
    match collected {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::payload_too_large(limit))
        }
        Err(e) => Err(ApiError::bad_request(
            "invalid_body",
            format!("could not read the request body: {e}"),
        )),
    }
}

pub(crate) async fn read_body(
    state: &AppState,
    body: Body,
    headers: &HeaderMap,
) -> Result<Bytes, ApiError> {
    check_length(state.cfg.max_payload_size, headers)?;
    collect_body(state.cfg.max_payload_size, state.cfg.request_timeout, body).await
}

fn header_str<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Result<Option<&'a str>, ApiError> {
    match headers.get(name) {
        None => Ok(None),
        Some(v) => v
            .to_str()
            .map(|s| Some(s.trim()))
            .map_err(|_| ApiError::invalid_header(name.as_str(), "must be visible ASCII")),
    }
}

/// An inference endpoint, served as a plain tower service rather than an axum handler.
///
/// Why: an inference request can wait in the admission queue for a long time, and everything
/// its future holds is held per waiter. Handler futures nest `async` blocks that each keep a
/// moved-from copy of the request beside the next one (about 2.3 KB in all). Here the request
/// head is read and dropped synchronously in `call`, and the future holds only the body, the
/// request context and the routing future.
#[derive(Debug, Clone)]
pub(crate) struct Infer {
    state: Arc<AppState>,
    endpoint: Endpoint,
}

impl Infer {
    pub(crate) fn new(state: Arc<AppState>, endpoint: Endpoint) -> Self {
        Self { state, endpoint }
    }
}

impl Service<Request> for Infer {
    type Response = Response;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let (ctx, body) = match request_ctx(&self.state, req) {
            Ok(prepared) => prepared,
            Err(e) => return Box::pin(std::future::ready(Ok(e.into_response()))),
        };
        Box::pin(respond(self.state.clone(), self.endpoint, body, ctx))
    }
}

/// The future an inference request lives in from its head to its response (boxed by `call`).
#[expect(
    clippy::manual_async_fn,
    reason = "an async fn would hold its arguments twice"
)]
fn respond(
    state: Arc<AppState>,
    endpoint: Endpoint,
    body: Body,
    ctx: RequestCtx,
) -> impl Future<Output = Result<Response, Infallible>> + Send + 'static {
    async move {
        Ok(answer(&state, endpoint, body, &ctx)
            .await
            .unwrap_or_else(IntoResponse::into_response))
    }
}

/// Everything inference needs from the request head, checked; the head itself is dropped here.
fn request_ctx(state: &AppState, req: Request) -> Result<(RequestCtx, Body), ApiError> {
    let started = Instant::now();
    if state.shutting_down.load(Ordering::Relaxed) {
        return Err(ApiError::shutting_down());
    }
    let (parts, body) = req.into_parts();
    check_length(state.cfg.max_payload_size, &parts.headers)?;
    let target = match header_str(&parts.headers, &TARGET_WORKER)? {
        None => None,
        Some(s) => Some(s.parse::<u32>().map_err(|_| {
            ApiError::invalid_header(
                TARGET_WORKER.as_str(),
                format!("must be a 0-based worker index, got '{s}'"),
            )
        })?),
    };
    let routing_key = header_str(&parts.headers, &ROUTING_KEY)?.map(Arc::<str>::from);
    let request_id = parts
        .extensions
        .get::<RequestId>()
        .map(|r| Box::from(r.0.as_str()))
        .unwrap_or_default();
    let priority = match &state.cfg.priority {
        Some(settings) => {
            let resolved = settings.resolve(&parts.headers);
            state.metrics.priority_resolved(&resolved);
            resolved.priority
        }
        None => pdrouter_admission::Priority::Default,
    };
    let ctx = RequestCtx {
        request_id,
        target,
        routing_key,
        forwarded: Forwarded::from_client(&parts.headers),
        started,
        priority,
    };
    Ok((ctx, body))
}

async fn answer(
    state: &AppState,
    endpoint: Endpoint,
    body: Body,
    ctx: &RequestCtx,
) -> Result<Response, ApiError> {
    // The body first (bounded by the request timeout), so a client sending it slowly holds
    // only its connection, never a global permit others wait for.
    let received =
        collect_body(state.cfg.max_payload_size, state.cfg.request_timeout, body).await?;
    // A small body is a slice of the connection's read buffer; keeping it while the request
    // waits (for the global permit, in the admission queue) would pin that buffer for the
    // whole wait. `received` is moved either way, so no reference into the buffer lives
    // across the awaits below.
    let raw = if received.len() <= 64 * 1024 {
        let copy = Bytes::copy_from_slice(&received);
        drop(received);
        copy
    } else {
        received
    };
    // Then the global permit (before any Prefill slot); it rides in the response body, so a
    // streamed answer holds it to its last byte. Boxed: its wait state (timers) lives only
    // during the wait, not in every request's future.
    let permit = match &state.limiter {
        Some(limiter) => Some(Box::pin(limiter.acquire(ctx.priority)).await.map_err(|r| {
            let timeout = limiter.config().timeout_of(ctx.priority);
            r.into_api_error(timeout.as_secs())
        })?),
        None => None,
    };
    let mut parsed = parse_off_reactor(endpoint, raw, state.cfg.mode.is_grpc()).await?;
    let response = state.dispatcher.route(&mut parsed, ctx).await?;
    Ok(match permit {
        Some(permit) => crate::limiter::hold_until_body_ends(response, permit),
        None => response,
    })
}

/// Bodies up to this size are parsed where the request runs: `benches/parse.rs` parses a
/// 64 KiB chat request in about 19 µs on the 2-core machine, less than handing it to the
/// pool's thread and back costs.
const PARSE_INLINE_BYTES: usize = 64 << 10;

/// Parses a request: a body up to [`PARSE_INLINE_BYTES`] at once, a larger one off the async
/// workers (on the CPU pool, where prompts are tokenized), so parsing megabytes of JSON never
/// stalls other requests. For token-id workers the tree is kept for the translation. Boxed so that the
/// future a queued request holds does not grow by this wait's state.
fn parse_off_reactor(
    endpoint: Endpoint,
    raw: Bytes,
    keep_tree: bool,
) -> BoxFuture<'static, Result<ParsedRequest, ApiError>> {
    Box::pin(async move {
        crate::cpu_pool::offload(PARSE_INLINE_BYTES, raw.len(), move || {
            if keep_tree {
                parse_keeping_tree(endpoint, raw)
            } else {
                parse(endpoint, raw)
            }
        })
        .await?
    })
}

fn ready_of(state: &AppState, t: WorkerType) -> Vec<Arc<Worker>> {
    state
        .registry
        .snapshot()
        .of_type(t)
        .iter()
        .filter(|w| w.is_routable())
        .cloned()
        .collect()
}

fn serving_types(state: &AppState) -> &'static [WorkerType] {
    state.cfg.mode.worker_types()
}

/// One OpenAI `Model` object: the engine's own card (every field it reported kept), with
/// `id`, and `object`, `created` and `owned_by` where the engine left them out.
fn model_object(m: &ServedModel) -> Value {
    let mut card = m.card.clone();
    card.insert("id".into(), Value::String(m.id.clone()));
    card.entry("object").or_insert_with(|| "model".into());
    card.entry("created").or_insert_with(|| m.learned_at.into());
    card.entry("owned_by").or_insert_with(|| "pdrouter".into());
    Value::Object(card)
}

/// The models the ready workers serve, once each; asks one worker when none is known yet.
async fn served_models(state: &AppState) -> Result<Vec<Arc<ServedModel>>, Response> {
    fn collect(models: &mut Vec<Arc<ServedModel>>, ws: &[Arc<Worker>]) {
        for m in ws.iter().filter_map(|w| w.model()) {
            if !models.iter().any(|seen| seen.id == m.id) {
                models.push(m);
            }
        }
    }
    let mut models = Vec::new();
    for t in serving_types(state) {
        collect(&mut models, &ready_of(state, *t));
    }
    if models.is_empty() {
        // Nothing learned yet (the engine did not answer so far): ask one worker now.
        let t = serving_types(state)[0];
        if let Some(w) = ready_of(state, t).first() {
            if let Err(e) =
                crate::registry::health::learn_model(&state.client, w, state.cfg.health.timeout)
                    .await
            {
                return Err(upstream_error(e, Leg::Worker, w.url()).into_response());
            }
            collect(&mut models, std::slice::from_ref(w));
        }
    }
    Ok(models)
}

/// `GET /v1/models`: the models the ready workers serve, once each.
pub(crate) async fn models(State(state): State<Arc<AppState>>) -> Response {
    match served_models(&state).await {
        Ok(models) => {
            let data: Vec<Value> = models.iter().map(|m| model_object(m)).collect();
            Json(json!({"object": "list", "data": data})).into_response()
        }
        Err(resp) => resp,
    }
}

/// `GET /v1/models/{model}` (OpenAI's retrieve; the id may hold slashes, as hub names do):
/// that model's object from `/v1/models`, or 404 `model_not_found`.
pub(crate) async fn model(
    State(state): State<Arc<AppState>>,
    axum::extract::Path(id): axum::extract::Path<String>,
) -> Response {
    match served_models(&state).await {
        Ok(models) => match models.iter().find(|m| m.id == id) {
            Some(m) => Json(model_object(m)).into_response(),
            None => ApiError::model_not_found(&id).into_response(),
        },
        Err(resp) => resp,
    }
}

/// GETs `path` on `worker` and returns the body of a 2xx answer; anything else is the
/// worker's error, mapped like an inference leg's.
async fn get_from(
    state: &AppState,
    worker: &Worker,
    path: &str,
    timeout: std::time::Duration,
) -> Result<Bytes, ApiError> {
    let url = format!("{}{path}", worker.base_url());
    match state.client.get(&url, worker.api_key(), timeout).await {
        Ok((status, body)) if status.is_success() => Ok(body),
        Ok((status, body)) => Err(ApiError::upstream_status(
            Leg::Worker,
            worker.url(),
            status,
            &String::from_utf8_lossy(&body),
        )),
        Err(e) => Err(upstream_error(e, Leg::Worker, worker.url())),
    }
}

async fn forward_get(state: &AppState, path: &str) -> Result<Response, ApiError> {
    let t = serving_types(state)[0];
    let Some(w) = ready_of(state, t).into_iter().next() else {
        return Err(ApiError::no_worker(t.as_str()));
    };
    if let Some(ch) = w.grpc() {
        let what = match path {
            "/get_model_info" => Info::Model,
            _ => Info::Server,
        };
        let v = info::fetch(ch, what, state.cfg.health.timeout)
            .await
            .map_err(|s| ApiError::grpc_status(Leg::Worker, w.url(), s.code(), s.message()))?;
        return Ok(Json(v).into_response());
    }
    let body = get_from(state, &w, path, state.cfg.health.timeout).await?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|_| ApiError::upstream_broken(Leg::Worker, w.url()))?;
    Ok(Json(v).into_response())
}

/// `GET /get_server_info`: one ready worker's server info (Prefill in PD mode).
pub(crate) async fn server_info(State(state): State<Arc<AppState>>) -> Response {
    forward_get(&state, "/get_server_info")
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET /get_model_info`.
pub(crate) async fn model_info(State(state): State<Arc<AppState>>) -> Response {
    forward_get(&state, "/get_model_info")
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// `GET /health`: the router process is up.
pub(crate) async fn health(State(state): State<Arc<AppState>>) -> Response {
    if state.shutting_down.load(Ordering::Relaxed) {
        return ApiError::shutting_down().into_response();
    }
    Json(json!({"status": "ok"})).into_response()
}

/// `GET /liveness`.
pub(crate) async fn liveness() -> Response {
    Json(json!({"status": "alive"})).into_response()
}

/// `GET /readiness`: regular mode needs one ready worker; PD one ready Prefill and one Decode;
/// EPD one ready worker of each of the three roles.
pub(crate) async fn readiness(State(state): State<Arc<AppState>>) -> Response {
    if state.shutting_down.load(Ordering::Relaxed) {
        return ApiError::shutting_down().into_response();
    }
    let counts: Vec<(WorkerType, usize)> = serving_types(&state)
        .iter()
        .map(|t| (*t, ready_of(&state, *t).len()))
        .collect();
    let ready = counts.iter().all(|(_, n)| *n > 0);
    let detail: serde_json::Map<String, Value> = counts
        .iter()
        .map(|(t, n)| (format!("ready_{}", t.as_str()), Value::from(*n)))
        .collect();
    if ready {
        Json(json!({"status": "ready", "workers": detail})).into_response()
    } else {
        let missing: Vec<&str> = counts
            .iter()
            .filter(|(_, n)| *n == 0)
            .map(|(t, _)| t.as_str())
            .collect();
        ApiError::not_ready(&missing.join(" or ")).into_response()
    }
}

/// `GET /health_generate`: probes one ready worker of each needed type. Never takes an
/// admission slot and never waits in the queue.
pub(crate) async fn health_generate(State(state): State<Arc<AppState>>) -> Response {
    let mut probes = Vec::new();
    for t in serving_types(&state) {
        let Some(w) = ready_of(&state, *t).into_iter().next() else {
            return ApiError::no_worker(t.as_str()).into_response();
        };
        probes.push(w);
    }
    let timeout = state
        .cfg
        .request_timeout
        .min(std::time::Duration::from_secs(30));
    // A gRPC worker is asked through its `HealthCheck` call.
    let checks = probes.iter().map(|w| {
        let state = &state;
        async move {
            match w.grpc_healthy(timeout).await {
                Some(true) => Ok(()),
                Some(false) => Err(ApiError::upstream_status(
                    Leg::Worker,
                    w.url(),
                    http::StatusCode::SERVICE_UNAVAILABLE,
                    "HealthCheck says the worker is not healthy",
                )),
                None => get_from(state, w, "/health_generate", timeout)
                    .await
                    .map(drop),
            }
        }
    });
    for result in futures_util::future::join_all(checks).await {
        if let Err(e) = result {
            return e.into_response();
        }
    }
    Json(json!({"status": "ok"})).into_response()
}

/// Unknown route.
pub(crate) async fn not_found(uri: Uri) -> Response {
    ApiError::not_found(uri.path()).into_response()
}

/// Known route, wrong method.
pub(crate) async fn method_not_allowed() -> Response {
    ApiError::method_not_allowed().into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn future_size<A, B, C, D, F>(_: impl FnOnce(A, B, C, D) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// The smallest future that holds `respond`'s arguments across an await: what any
    /// implementation must keep, laid out by the same compiler.
    #[expect(clippy::manual_async_fn, reason = "the same shape as respond's")]
    fn holding(
        state: Arc<AppState>,
        endpoint: Endpoint,
        body: Body,
        ctx: RequestCtx,
    ) -> impl Future<Output = Result<Response, Infallible>> + Send + 'static {
        async move {
            std::future::pending::<()>().await;
            drop((state, endpoint, body, ctx));
            Ok(Response::default())
        }
    }

    /// A request waiting in the admission queue holds this future for its whole wait, so with
    /// 10,000 waiters each 100 bytes of it is a megabyte (bench/queue_memory.py measures the
    /// total). What is bounded is the state the router keeps beyond the request's own
    /// arguments, both measured in this build, so a compiler that lays futures out
    /// differently moves both alike; an `async fn` in the chain that takes its request or
    /// context by value again, or a nested handler wrapper, exceeds it.
    #[test]
    fn the_future_a_waiting_request_holds_stays_small() {
        let size = future_size(respond);
        let args = future_size(holding);
        eprintln!("inference future: {size} bytes, its arguments held: {args} bytes");
        assert!(
            size <= args + OWN_STATE_BUDGET,
            "inference future grew to {size} bytes, {} above its arguments",
            size.saturating_sub(args)
        );
    }

    /// 1,080 bytes in a debug build when written (the global limiter's permit and
    /// prefix_hash's token ids, which a waiting request holds by design, included), plus a
    /// quarter for other compilers' layouts.
    const OWN_STATE_BUDGET: usize = 1_344;
}
