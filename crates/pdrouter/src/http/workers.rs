//! `/workers` admin API: add, list, inspect and remove workers at runtime.
//!
//! Invalid bodies are rejected before anything touches the registry, so a bad request never
//! changes the worker set.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

use super::AppState;
use super::handlers::read_body;
use pdrouter_admission::Sharer;

use crate::config::{
    HttpEngine, KvConnector, Mode, WorkerSpec, WorkerType, is_grpc_url, parse_worker_url,
};
use crate::error::ApiError;
use crate::proxy::forward::bearer;
use crate::registry::{RegisterError, Snapshot, Worker, WorkerStatus, health};

/// A worker as `/workers` shows it: SMG's fields (`is_healthy`, `models`, `connection_mode`,
/// `dp_*`) and pdrouter's (status, breaker, admission). Never its key.
fn describe(w: &Worker, snap: &Snapshot, sharer: Option<&Sharer>) -> Value {
    let ranks = w.dp_rank().map(|_| {
        snap.all()
            .iter()
            .filter(|o| o.base_url() == w.base_url() && o.worker_type() == w.worker_type())
            .count()
    });
    let models: Vec<Value> = w.model().map(|m| json!({"id": m.id})).into_iter().collect();
    json!({
        "id": w.id(),
        "url": w.url(),
        "model_id": w.model_id(),
        "models": models,
        "worker_type": w.worker_type().as_str(),
        "connection_mode": if w.grpc().is_some() { "grpc" } else { "http" },
        // A gRPC worker's runtime once its health checks learned it; an HTTP worker's engine.
        "runtime": w.runtime().map(|r| r.name()).or(w.http_engine().map(|e| e.name())),
        // How a vLLM worker's PD pairs move the KV.
        "kv_connector": w.kv_connector().map(|c| c.name()),
        "is_healthy": w.status() == WorkerStatus::Ready,
        "status": w.status().as_str(),
        "load": w.load(),
        "bootstrap_port": w.bootstrap_port(),
        "dp_rank": w.dp_rank(),
        "dp_size": ranks,
        "dp_base_url": w.dp_rank().map(|_| w.base_url()),
        "circuit_breaker": w.breaker().state().as_str(),
        "admission_inflight": w.slot().map(|s| s.inflight()),
        "admission_share": shared(w, sharer),
    })
}

/// With `--admission-store`, a Prefill worker's limit across the group and this replica's
/// share of it; null otherwise.
fn shared(w: &Worker, sharer: Option<&Sharer>) -> Value {
    match (w.slot(), sharer) {
        (Some(slot), Some(sharer)) => {
            let v = sharer.view(slot.key());
            json!({
                "global_limit": v.global_limit,
                "share": v.share,
                "replicas": v.replicas,
                "source": v.source.as_str(),
            })
        }
        _ => Value::Null,
    }
}

/// `bootstrap_port`: a port for a Prefill or Encode worker (both serve a bootstrap server),
/// or null.
fn bootstrap_port_field(v: Option<&Value>, t: WorkerType) -> Result<Option<u16>, ApiError> {
    let serves = matches!(t, WorkerType::Prefill | WorkerType::Encode);
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(p) if (1..=65535).contains(&p) && serves => Ok(Some(p as u16)),
            Some(_) if !serves => Err(ApiError::invalid_field(
                "bootstrap_port",
                "applies to prefill and encode workers only",
            )),
            _ => Err(ApiError::invalid_field(
                "bootstrap_port",
                "must be a port number 1-65535 or null",
            )),
        },
    }
}

/// `api_key`: a non-empty string that can be sent as `Authorization: Bearer <key>`, or null.
fn api_key_field(v: Option<&Value>) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(k)) if !k.is_empty() && bearer(k).is_some() => Ok(Some(k.clone())),
        Some(Value::String(k)) if !k.is_empty() => Err(ApiError::invalid_field(
            "api_key",
            "must be usable in an HTTP header: visible ASCII and spaces, no control characters",
        )),
        Some(_) => Err(ApiError::invalid_field(
            "api_key",
            "must be a non-empty string or null",
        )),
    }
}

/// The request body as a JSON object (size-limited like every body).
async fn json_body(state: &AppState, req: Request) -> Result<Map<String, Value>, ApiError> {
    let (parts, body) = req.into_parts();
    let bytes = read_body(state, body, &parts.headers).await?;
    match serde_json::from_slice(&bytes).map_err(ApiError::malformed_json)? {
        Value::Object(obj) => Ok(obj),
        _ => Err(ApiError::bad_request(
            "invalid_request",
            "body must be a JSON object",
        )),
    }
}

fn only_known(obj: &Map<String, Value>, known: &[&str]) -> Result<(), ApiError> {
    match obj.keys().find(|k| !known.contains(&k.as_str())) {
        Some(k) => Err(ApiError::invalid_field(
            k,
            format!("is not known; use {}", known.join(", ")),
        )),
        None => Ok(()),
    }
}

/// `worker_type`: one of regular, prefill, decode, encode; required in PD and EPD mode.
fn worker_type_field(state: &AppState, obj: &Map<String, Value>) -> Result<WorkerType, ApiError> {
    Ok(match obj.get("worker_type") {
        None | Some(Value::Null) => match state.cfg.mode {
            Mode::Regular | Mode::RegularGrpc => WorkerType::Regular,
            Mode::PdHttp | Mode::PdGrpc => {
                return Err(ApiError::invalid_field(
                    "worker_type",
                    "is required in PD mode: prefill or decode",
                ));
            }
            Mode::EpdGrpc => {
                return Err(ApiError::invalid_field(
                    "worker_type",
                    "is required in EPD mode: encode, prefill or decode",
                ));
            }
        },
        Some(Value::String(s)) => match s.as_str() {
            "regular" => WorkerType::Regular,
            "prefill" => WorkerType::Prefill,
            "decode" => WorkerType::Decode,
            "encode" => WorkerType::Encode,
            other => {
                return Err(ApiError::invalid_field(
                    "worker_type",
                    format!("'{other}' is not one of regular, prefill, decode, encode"),
                ));
            }
        },
        Some(_) => return Err(ApiError::invalid_field("worker_type", "must be a string")),
    })
}

fn parse_spec(state: &AppState, obj: &Map<String, Value>) -> Result<(WorkerSpec, bool), ApiError> {
    only_known(
        obj,
        &[
            "url",
            "worker_type",
            "bootstrap_port",
            "api_key",
            "dp_aware",
            "runtime",
            "kv_connector",
        ],
    )?;
    let url = match obj.get("url") {
        Some(Value::String(u)) => {
            parse_worker_url(u).map_err(|e| ApiError::bad_request("invalid_worker_url", e))?
        }
        None => return Err(ApiError::invalid_field("url", "is required")),
        Some(_) => return Err(ApiError::invalid_field("url", "must be a string")),
    };
    let worker_type = worker_type_field(state, obj)?;
    let fits = match state.cfg.mode {
        Mode::Regular | Mode::RegularGrpc => worker_type == WorkerType::Regular,
        Mode::PdHttp | Mode::PdGrpc => {
            matches!(worker_type, WorkerType::Prefill | WorkerType::Decode)
        }
        Mode::EpdGrpc => worker_type != WorkerType::Regular,
    };
    if !fits {
        return Err(ApiError::invalid_field(
            "worker_type",
            format!(
                "'{}' does not fit this router's mode ({})",
                worker_type.as_str(),
                match state.cfg.mode {
                    Mode::Regular | Mode::RegularGrpc => "regular: use regular",
                    Mode::PdHttp | Mode::PdGrpc => "PD: use prefill or decode",
                    Mode::EpdGrpc => "EPD: use encode, prefill or decode",
                }
            ),
        ));
    }
    if is_grpc_url(&url) != state.cfg.mode.is_grpc() {
        return Err(ApiError::invalid_field(
            "url",
            if state.cfg.mode.is_grpc() {
                "must be a grpc:// URL: this router's workers speak gRPC"
            } else {
                "must be an http:// or https:// URL: this router's workers speak HTTP \
                 (grpc:// workers are served only by a router started with grpc:// workers)"
            },
        ));
    }
    let bootstrap_port = bootstrap_port_field(obj.get("bootstrap_port"), worker_type)?;
    let api_key = api_key_field(obj.get("api_key"))?;
    let dp_aware = match obj.get("dp_aware") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid_field("dp_aware", "must be true or false")),
    };
    let (engine, kv_connector) = engine_fields(obj, is_grpc_url(&url))?;
    Ok((
        WorkerSpec {
            url,
            worker_type,
            bootstrap_port,
            api_key,
            engine,
            kv_connector,
        },
        dp_aware,
    ))
}

/// `runtime` (an HTTP worker's engine: `sglang` or `vllm`) and `kv_connector` (a vLLM
/// worker's: `nixl`, `mooncake` or `lmcache`), each a string or null. A gRPC worker's runtime
/// is what its health checks learn, so `runtime` is refused for one.
fn engine_fields(
    obj: &Map<String, Value>,
    grpc: bool,
) -> Result<(Option<HttpEngine>, Option<KvConnector>), ApiError> {
    let engine = match obj.get("runtime") {
        None | Some(Value::Null) => None,
        Some(_) if grpc => {
            return Err(ApiError::invalid_field(
                "runtime",
                "applies to http(s):// workers; a grpc:// worker's runtime is what its \
                 HealthCheck answers",
            ));
        }
        Some(Value::String(s)) => Some(HttpEngine::parse(s).ok_or_else(|| {
            ApiError::invalid_field("runtime", format!("'{s}' is not one of sglang, vllm"))
        })?),
        Some(_) => return Err(ApiError::invalid_field("runtime", "must be a string")),
    };
    let connector = match obj.get("kv_connector") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(KvConnector::parse(s).ok_or_else(|| {
            ApiError::invalid_field(
                "kv_connector",
                format!("'{s}' is not one of nixl, mooncake, lmcache"),
            )
        })?),
        Some(_) => return Err(ApiError::invalid_field("kv_connector", "must be a string")),
    };
    Ok((engine, connector))
}

/// `POST /workers`.
pub(crate) async fn add(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let result = async {
        let (spec, dp_aware) = parse_spec(&state, &json_body(&state, req).await?)?;
        let added =
            health::register_running(&state.registry, &state.client, &state.cfg, &spec, dp_aware)
                .await
                .map_err(|e| match e {
                    RegisterError::Duplicate(url) => {
                        ApiError::conflict(format!("worker '{url}' is already registered"))
                    }
                })?;
        let initial = health::initial_status(&state.cfg.health);
        tracing::info!(url = %spec.url, worker_type = spec.worker_type.as_str(), "worker added");
        let ids: Vec<&str> = added.iter().map(|w| w.id()).collect();
        Ok::<_, ApiError>(
            (
                StatusCode::ACCEPTED,
                Json(json!({
                    "worker_id": ids[0],
                    "worker_ids": ids,
                    "url": spec.url,
                    "status": initial.as_str(),
                })),
            )
                .into_response(),
        )
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /workers`.
pub(crate) async fn list(State(state): State<Arc<AppState>>) -> Response {
    let snap = state.registry.snapshot();
    let all = snap.all();
    let workers: Vec<Value> = all
        .iter()
        .map(|w| describe(w, &snap, state.sharer.as_deref()))
        .collect();
    let count = |t| snap.of_type(t).len();
    let mut models: Vec<String> = all.iter().filter_map(|w| w.model_id()).collect();
    models.sort_unstable();
    models.dedup();
    Json(json!({
        "workers": workers,
        "total": workers.len(),
        "stats": {
            "prefill_count": count(WorkerType::Prefill),
            "decode_count": count(WorkerType::Decode),
            "regular_count": count(WorkerType::Regular),
            "encode_count": count(WorkerType::Encode),
            "total_workers": all.len(),
            "healthy_workers": all.iter().filter(|w| w.status() == WorkerStatus::Ready).count(),
            "total_models": models.len(),
            "total_load": all.iter().map(|w| w.load()).sum::<u64>(),
            "by_type": {
                "regular": count(WorkerType::Regular),
                "prefill": count(WorkerType::Prefill),
                "decode": count(WorkerType::Decode),
                "encode": count(WorkerType::Encode),
            },
        }
    }))
    .into_response()
}

/// `PUT /workers/{id}` (id or URL): changes a worker's `bootstrap_port` and/or `api_key`
/// (absent: unchanged; null: cleared). Every DP rank of the worker is replaced by an entry
/// built from the new settings that keeps its status, load, admission slot and model id, and
/// each replacement is published as a registry event (which wakes admission waiters).
pub(crate) async fn update(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
    req: Request,
) -> Response {
    let result = async {
        let obj = json_body(&state, req).await?;
        only_known(&obj, &["bootstrap_port", "api_key"])?;
        if obj.is_empty() {
            return Err(ApiError::bad_request(
                "invalid_request",
                "nothing to change: give bootstrap_port and/or api_key",
            ));
        }
        let Some(current) = state.registry.snapshot().find(&id).cloned() else {
            return Err(ApiError::no_such("worker", &id));
        };
        let t = current.worker_type();
        let spec = WorkerSpec {
            url: current.base_url().to_string(),
            worker_type: t,
            bootstrap_port: match obj.get("bootstrap_port") {
                None => current.bootstrap_port(),
                v => bootstrap_port_field(v, t)?,
            },
            api_key: match obj.get("api_key") {
                None => current.api_key().map(str::to_string),
                v => api_key_field(v)?,
            },
            // What was given for the worker stays; a detected engine is detected again.
            engine: current.given_engine(),
            kv_connector: Some(current.connector()),
        };
        let replaced = state.registry.replace(&spec);
        let Some(new) = replaced
            .iter()
            .find(|w| w.url() == current.url())
            .or(replaced.first())
        else {
            // Removed between the lookup and the replacement.
            return Err(ApiError::no_such("worker", &id));
        };
        tracing::info!(url = %spec.url, "worker updated");
        Ok(Json(describe(
            new,
            &state.registry.snapshot(),
            state.sharer.as_deref(),
        ))
        .into_response())
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}

/// `GET /workers/{id}` (id or URL).
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Response {
    let snap = state.registry.snapshot();
    match snap.find(&id) {
        Some(w) => Json(describe(w, &snap, state.sharer.as_deref())).into_response(),
        None => ApiError::no_such("worker", &id).into_response(),
    }
}

/// `DELETE /workers/{id}`: stops routing to the worker at once; its in-flight requests finish.
pub(crate) async fn remove(State(state): State<Arc<AppState>>, Path(id): Path<String>) -> Response {
    let found = state.registry.snapshot().find(&id).cloned();
    let Some(w) = found else {
        return ApiError::no_such("worker", &id).into_response();
    };
    match state.registry.remove(w.id()) {
        Some(w) => {
            tracing::info!(url = %w.url(), "worker removed");
            (
                StatusCode::ACCEPTED,
                Json(json!({
                    "worker_id": w.id(),
                    "url": w.url(),
                    "status": "draining",
                    "inflight": w.load(),
                })),
            )
                .into_response()
        }
        None => ApiError::no_such("worker", &id).into_response(),
    }
}
