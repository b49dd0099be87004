//! `/workers` admin API: add, list, inspect and remove workers at runtime.
//!
//! Invalid bodies are rejected before anything touches the registry, so a bad request never
//! changes the worker set.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::AppState;
use super::handlers::read_body;
use crate::config::{Mode, WorkerSpec, WorkerType, parse_worker_url};
use crate::error::ApiError;
use crate::registry::{RegisterError, Worker, WorkerStatus};

fn describe(w: &Worker) -> Value {
    json!({
        "id": w.id(),
        "url": w.url(),
        "worker_type": w.worker_type().as_str(),
        "status": w.status().as_str(),
        "load": w.load(),
        "bootstrap_port": w.bootstrap_port(),
        "circuit_breaker": w.breaker().state().as_str(),
        "model_id": w.model_id(),
        "admission_inflight": w.slot().map(|s| s.inflight()),
    })
}

fn parse_spec(state: &AppState, bytes: &[u8]) -> Result<(WorkerSpec, bool), ApiError> {
    let v: Value = serde_json::from_slice(bytes).map_err(ApiError::malformed_json)?;
    let Value::Object(obj) = v else {
        return Err(ApiError::bad_request(
            "invalid_request",
            "body must be a JSON object",
        ));
    };
    for key in obj.keys() {
        if !matches!(
            key.as_str(),
            "url" | "worker_type" | "bootstrap_port" | "api_key" | "dp_aware"
        ) {
            return Err(ApiError::invalid_field(
                key,
                "is not known; use url, worker_type, bootstrap_port, api_key, dp_aware",
            ));
        }
    }
    let url = match obj.get("url") {
        Some(Value::String(u)) => {
            parse_worker_url(u).map_err(|e| ApiError::bad_request("invalid_worker_url", e))?
        }
        None => return Err(ApiError::invalid_field("url", "is required")),
        Some(_) => return Err(ApiError::invalid_field("url", "must be a string")),
    };
    let worker_type = match obj.get("worker_type") {
        None | Some(Value::Null) => match state.cfg.mode {
            Mode::Regular => WorkerType::Regular,
            Mode::PdHttp => {
                return Err(ApiError::invalid_field(
                    "worker_type",
                    "is required in PD mode: prefill or decode",
                ));
            }
        },
        Some(Value::String(s)) => match s.as_str() {
            "regular" => WorkerType::Regular,
            "prefill" => WorkerType::Prefill,
            "decode" => WorkerType::Decode,
            other => {
                return Err(ApiError::invalid_field(
                    "worker_type",
                    format!("'{other}' is not one of regular, prefill, decode"),
                ));
            }
        },
        Some(_) => return Err(ApiError::invalid_field("worker_type", "must be a string")),
    };
    let fits = match state.cfg.mode {
        Mode::Regular => worker_type == WorkerType::Regular,
        Mode::PdHttp => worker_type != WorkerType::Regular,
    };
    if !fits {
        return Err(ApiError::invalid_field(
            "worker_type",
            format!(
                "'{}' does not fit this router's mode ({})",
                worker_type.as_str(),
                match state.cfg.mode {
                    Mode::Regular => "regular: use regular",
                    Mode::PdHttp => "PD: use prefill or decode",
                }
            ),
        ));
    }
    let bootstrap_port = match obj.get("bootstrap_port") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_u64() {
            Some(p) if (1..=65535).contains(&p) && worker_type == WorkerType::Prefill => {
                Some(p as u16)
            }
            Some(_) if worker_type != WorkerType::Prefill => {
                return Err(ApiError::invalid_field(
                    "bootstrap_port",
                    "applies to prefill workers only",
                ));
            }
            _ => {
                return Err(ApiError::invalid_field(
                    "bootstrap_port",
                    "must be a port number 1-65535 or null",
                ));
            }
        },
    };
    let api_key = match obj.get("api_key") {
        None | Some(Value::Null) => None,
        Some(Value::String(k)) if !k.is_empty() => Some(k.clone()),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "api_key",
                "must be a non-empty string",
            ));
        }
    };
    let dp_aware = match obj.get("dp_aware") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(ApiError::invalid_field("dp_aware", "must be true or false")),
    };
    Ok((
        WorkerSpec {
            url,
            worker_type,
            bootstrap_port,
            api_key,
        },
        dp_aware,
    ))
}

/// `POST /workers`.
pub(crate) async fn add(State(state): State<Arc<AppState>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let result = async {
        let bytes = read_body(&state, body, &parts.headers).await?;
        let (spec, dp_aware) = parse_spec(&state, &bytes)?;
        let dp = if dp_aware || state.cfg.dp_aware {
            crate::app::discover_dp_size(&state.client, &spec, state.cfg.health.timeout).await
        } else {
            None
        };
        let initial = if state.cfg.health.enabled {
            WorkerStatus::Pending
        } else {
            WorkerStatus::Ready
        };
        let added = state
            .registry
            .register(&spec, dp, initial)
            .map_err(|e| match e {
                RegisterError::Duplicate(url) => {
                    ApiError::conflict(format!("worker '{url}' is already registered"))
                }
            })?;
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
    let workers: Vec<Value> = snap.all().iter().map(|w| describe(w)).collect();
    let count = |t| snap.of_type(t).len();
    Json(json!({
        "workers": workers,
        "total": workers.len(),
        "stats": {
            "prefill_count": count(WorkerType::Prefill),
            "decode_count": count(WorkerType::Decode),
            "regular_count": count(WorkerType::Regular),
        }
    }))
    .into_response()
}

/// `GET /workers/{id}` (id or URL).
pub(crate) async fn get_one(
    State(state): State<Arc<AppState>>,
    Path(id): Path<String>,
) -> Response {
    match state.registry.snapshot().find(&id) {
        Some(w) => Json(describe(w)).into_response(),
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
