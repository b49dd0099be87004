//! vLLM mode's HTTP server: vLLM's OpenAI server (0.11) with the NIXL, Mooncake or LMCache
//! KV connector, over the same generation model as the SGLang routes.
//!
//! Routes: `GET /health` (200 with an empty body; 503 when made unhealthy), `GET /version`,
//! `GET /v1/models`, `POST /v1/completions`, `POST /v1/chat/completions`, and the test hooks
//! `GET /mock/stats` (with the KV counters), `POST /mock/controls` and the NIXL pull
//! ([`super::nixl`]; LMCache: the push, [`super::lmcache`]). Anything else, SGLang's routes included, is 404 `{"detail":"Not Found"}`
//! (405 `{"detail":"Method Not Allowed"}` for a known path).
//!
//! A generation request is one of three legs ([`KvLeg`]):
//! - **produce** (`do_remote_decode`): checked strictly, prefilled (the delay, or the engine),
//!   one token answered with a top-level `kv_transfer_params` naming the blocks now held for
//!   the consumer ([`crate::kv`]); a prefill that ends early ([`kv_params::EOS_MARKER`])
//!   answers `kv_transfer_params: null` and holds nothing;
//! - **consume** (`do_remote_prefill`): pulls the blocks first; `cached_tokens` is what moved,
//!   0 (recomputed) when the pull failed;
//! - **plain**: computed whole (`cached_tokens` 0).
//!
//! Mooncake's legs ([`super::mooncake`]) are the same two, rendezvous by `transfer_id`: the
//! producer holds under the engine id of its DP rank (`X-data-parallel-rank`) and answers
//! `kv_transfer_params: null`; the consumer pulls through the producer's bootstrap server,
//! waiting for it. LMCache's legs are all plain: a worker first uses what was pushed for the
//! prompt (cached) and, with a peer, pushes a one-token request's KV there before answering.
//!
//! Invariants: blocks are held only once the producer's answer is ready, so a request that
//! fails or whose client goes away first holds nothing; a generation answer echoes the
//! request's `X-Request-Id` and is named after it; a generation whose handler or answer
//! stream is dropped before its end (client gone) counts one `aborts_total`.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use futures_util::{Stream, StreamExt as _};
use serde_json::{Value, json};

use super::body::{self, JSON};
use super::handlers::{self, BODY_LIMIT, GARBAGE};
use super::render::{Plan, now_secs, random_hex};
use super::request::{Api, prompt_words, requested_tokens};
use super::{lmcache, nixl};
use crate::config::{KvConnectorKind, Role};
use crate::state::{InflightGuard, Shared};
use crate::vllm_kv::{self, Body, Holder, KvLeg, LegFacts, params as kv_params, transfer};

/// The version `GET /version` reports.
const VERSION: &str = "0.11.0";

/// The context length `GET /v1/models` reports.
const MAX_MODEL_LEN: u64 = 32_768;

const REQUEST_ID: &str = "x-request-id";

/// The header naming the DP rank a request runs on (vLLM's, as its routers send it).
const DP_RANK: &str = "x-data-parallel-rank";

type AppState = State<Arc<Shared>>;

pub(crate) fn router(shared: Arc<Shared>) -> Router {
    let app = Router::new()
        .route("/health", get(handlers::health))
        .route("/version", get(version))
        .route("/v1/models", get(models))
        .route("/mock/stats", get(stats))
        .route("/mock/controls", post(handlers::set_controls))
        .route(nixl::PULL_PATH, post(nixl::serve_pull));
    let app = if shared.kv_connector == KvConnectorKind::LmCache {
        app.route(lmcache::PUSH_PATH, post(lmcache::serve_push))
    } else {
        app
    };
    app.route(
        "/v1/completions",
        post(|s: AppState, h: HeaderMap, b: Bytes| generation(s, Api::Completion, h, b)),
    )
    .route(
        "/v1/chat/completions",
        post(|s: AppState, h: HeaderMap, b: Bytes| generation(s, Api::Chat, h, b)),
    )
    .fallback(not_found)
    .method_not_allowed_fallback(method_not_allowed)
    .layer(axum::middleware::from_fn_with_state(
        Arc::clone(&shared),
        handlers::require_key,
    ))
    .layer(DefaultBodyLimit::max(BODY_LIMIT))
    .with_state(shared)
}

async fn not_found() -> Response {
    body::json(StatusCode::NOT_FOUND, &json!({ "detail": "Not Found" }))
}

async fn method_not_allowed() -> Response {
    let detail = json!({ "detail": "Method Not Allowed" });
    body::json(StatusCode::METHOD_NOT_ALLOWED, &detail)
}

async fn version() -> Response {
    body::json(StatusCode::OK, &json!({ "version": VERSION }))
}

async fn models(State(s): AppState) -> Response {
    body::json(
        StatusCode::OK,
        &json!({
            "object": "list",
            "data": [{
                "id": s.model,
                "object": "model",
                "created": now_secs(),
                "owned_by": "vllm",
                "root": s.model,
                "parent": null,
                "max_model_len": MAX_MODEL_LEN,
            }],
        }),
    )
}

/// `GET /mock/stats`: the common fields, the abort count and the KV counters.
async fn stats(State(s): AppState) -> Response {
    let st = s.stats();
    let mut map = handlers::stats_fields(&s, &st);
    vllm_kv::insert_stats(&mut map, &s, &st);
    body::json(StatusCode::OK, &Value::Object(map))
}

/// vLLM's error body: `{"error":{"message","type","code"}}`.
fn error(status: StatusCode, message: &str, guard: InflightGuard) -> Response {
    let kind = match status {
        StatusCode::BAD_REQUEST => "BadRequestError",
        StatusCode::SERVICE_UNAVAILABLE => "ServiceUnavailableError",
        _ => "InternalServerError",
    };
    let v = json!({ "error": { "message": message, "type": kind, "code": status.as_u16() } });
    body::full(
        status,
        JSON,
        serde_json::to_vec(&v).unwrap_or_default(),
        Some(guard),
    )
}

/// Counts one abort when dropped armed: a generation that did not reach its end.
#[derive(Debug)]
struct AbortWatch {
    shared: Arc<Shared>,
    armed: bool,
}

impl AbortWatch {
    fn new(shared: &Arc<Shared>) -> Self {
        AbortWatch {
            shared: Arc::clone(shared),
            armed: true,
        }
    }

    fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for AbortWatch {
    fn drop(&mut self) {
        if self.armed {
            self.shared.controls.record_abort();
        }
    }
}

/// `inner`, counting an abort if it is dropped before its end.
fn watched<S>(inner: S, watch: AbortWatch) -> impl Stream<Item = Result<Bytes, Infallible>> + Send
where
    S: Stream<Item = Result<Bytes, Infallible>> + Send + 'static,
{
    let inner = Box::pin(inner);
    futures_util::stream::unfold((inner, watch), |(mut inner, mut watch)| async move {
        match inner.next().await {
            Some(item) => Some((item, (inner, watch))),
            None => {
                watch.disarm();
                None
            }
        }
    })
}

/// Both generation routes: the answer, with the request's `X-Request-Id` echoed; a handler
/// dropped before it answers (client gone) counts an abort.
async fn generation(State(s): AppState, api: Api, headers: HeaderMap, body: Bytes) -> Response {
    let mut watch = AbortWatch::new(&s);
    let echo = headers.get(REQUEST_ID).cloned();
    let rid = echo
        .as_ref()
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .map(str::to_owned);
    let mut resp = respond(&s, api, &headers, rid, body).await;
    watch.disarm();
    if let Some(v) = echo {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    resp
}

/// Count, validate, inject faults, then serve the request's leg.
async fn respond(
    s: &Arc<Shared>,
    api: Api,
    headers: &HeaderMap,
    rid: Option<String>,
    body: Bytes,
) -> Response {
    let guard = InflightGuard::begin(s);
    let c = &s.controls;
    c.record_headers(headers.clone());
    let parsed = serde_json::from_slice::<Value>(&body);
    if parsed.is_ok() {
        c.record_request(body);
    }
    let req = match parsed {
        Ok(Value::Object(req)) => req,
        Ok(_) => return error(StatusCode::BAD_REQUEST, "body must be a JSON object", guard),
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                &format!("invalid JSON: {e}"),
                guard,
            );
        }
    };
    let leg = match kv_params::leg_for(s.kv_connector, &req) {
        Ok(leg) => leg,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg, guard),
    };
    if leg.produces()
        && let Err(msg) = kv_params::check_producer(body_of(api), &req)
    {
        return error(StatusCode::BAD_REQUEST, &msg, guard);
    }
    let mut leg = leg;
    if let Err(msg) = set_dp_rank(s, &mut leg, headers) {
        return error(StatusCode::BAD_REQUEST, &msg, guard);
    }
    // An engine-mode producer is held inside the engine instead (a stalled engine).
    if !(leg.produces() && s.engine.is_some()) {
        c.wait_while_hung().await;
    }
    if c.draw_failure() {
        let msg = "mock injected failure";
        return error(StatusCode::INTERNAL_SERVER_ERROR, msg, guard);
    }
    if c.garbage() {
        return body::full(StatusCode::OK, JSON, GARBAGE, Some(guard));
    }
    // The marker makes EOS the model's first token, whichever leg computes it.
    let natural = if kv_params::has_eos_marker(body_of(api), &req) {
        0
    } else if s.engine.is_some() {
        requested_tokens(api, &req).unwrap_or_else(|| c.output_tokens())
    } else {
        c.output_tokens()
    };
    let mut plan = match Plan::new(api, &req, Role::Regular, &s.model, natural) {
        Ok(plan) => plan,
        Err(msg) => return error(StatusCode::BAD_REQUEST, &msg, guard),
    };
    let rid = rid.unwrap_or_else(random_hex);
    plan.set_request_id(&rid);
    serve_leg(s, api, req, leg, plan, rid, guard).await
}

/// Sets the DP rank a Mooncake producer computes on: its `X-data-parallel-rank` header (0
/// when absent), refused when not a rank of this worker. Other legs have no rank.
fn set_dp_rank(s: &Shared, leg: &mut KvLeg, headers: &HeaderMap) -> Result<(), String> {
    let (KvLeg::ProduceTransfer { rank, .. }, Some(v)) = (leg, headers.get(DP_RANK)) else {
        return Ok(());
    };
    let parsed = v.to_str().ok().and_then(|v| v.trim().parse::<u32>().ok());
    match parsed {
        Some(r) if r < s.dp_size => {
            *rank = r;
            Ok(())
        }
        _ => Err(format!(
            "{DP_RANK} must be a data parallel rank below {} (got {v:?})",
            s.dp_size
        )),
    }
}

/// The shape of a vLLM route's body.
fn body_of(api: Api) -> Body {
    match api {
        Api::Chat => Body::Chat,
        _ => Body::Completion,
    }
}

/// Serves a validated request's leg: its work before the first token ([`vllm_kv::prepare`]),
/// then a producer's one-piece answer or the generation.
async fn serve_leg(
    s: &Arc<Shared>,
    api: Api,
    req: serde_json::Map<String, Value>,
    leg: KvLeg,
    mut plan: Plan,
    rid: String,
    guard: InflightGuard,
) -> Response {
    let lmcache = leg == KvLeg::Plain && s.kv_connector == KvConnectorKind::LmCache;
    let facts = LegFacts {
        prompt_tokens: plan.prompt_tokens(),
        compute_tokens: if leg.produces() {
            prompt_words(api, &req)
        } else {
            0
        },
        prompt_key: lmcache
            .then(|| transfer::prompt_key(body_of(api), &req))
            .flatten(),
        one_token: requested_tokens(api, &req) == Some(1),
        capped: plan.capped(),
    };
    drop(req);
    let prepared = vllm_kv::prepare(s, &leg, &facts).await;
    plan.set_cached_tokens(prepared.cached);
    match &leg {
        KvLeg::Produce => produce(s, plan, Holder::Nixl(&rid), guard),
        KvLeg::ProduceTransfer { transfer_id, rank } => {
            produce(s, plan, Holder::Mooncake(*rank, transfer_id), guard)
        }
        _ => generate(s, plan, prepared.delay, guard).await,
    }
}

/// The prefill leg's answer, once computed: hold the prompt's blocks (unless the prefill
/// ended before its cap) and name them in the answer.
fn produce(s: &Shared, plan: Plan, holder: Holder<'_>, guard: InflightGuard) -> Response {
    let params = match vllm_kv::hold(s, holder, plan.prompt_tokens(), plan.capped()) {
        Ok(params) => params.unwrap_or(Value::Null),
        Err(full) => return error(StatusCode::SERVICE_UNAVAILABLE, &full.to_string(), guard),
    };
    let mut v = plan.full_value();
    v["kv_transfer_params"] = params;
    let resp = body::full(
        StatusCode::OK,
        JSON,
        serde_json::to_vec(&v).unwrap_or_default(),
        Some(guard),
    );
    held_open(s, resp)
}

/// Generates `plan` after `delay`: token by token as SSE, or the whole body once every
/// token's interval has passed.
async fn generate(s: &Arc<Shared>, plan: Plan, delay: Duration, guard: InflightGuard) -> Response {
    let c = &s.controls;
    let interval = c.token_interval();
    let resp = if plan.stream {
        sleep(delay).await;
        let stream = watched(plan.into_stream(interval, guard), AbortWatch::new(s));
        body::sse_stream(stream)
    } else {
        let gaps = plan.tokens.saturating_sub(1);
        sleep(delay.saturating_add(interval.saturating_mul(gaps))).await;
        let mut v = plan.full_value();
        v["kv_transfer_params"] = Value::Null;
        body::full(
            StatusCode::OK,
            JSON,
            serde_json::to_vec(&v).unwrap_or_default(),
            Some(guard),
        )
    };
    held_open(s, resp)
}

fn held_open(s: &Shared, resp: Response) -> Response {
    if s.controls.hold_body_open() {
        body::held_open(resp, s.controls.body_released())
    } else {
        resp
    }
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
