//! vLLM mode's stand-in for the Mooncake connector's transfer: a Prefill (producer) worker
//! serves a bootstrap server on its own port ([`bootstrap_router`]), where a router asks
//! `GET /query` for the engine id of every DP rank and a consumer (decode leg) pulls its
//! prompt's KV with `POST /mock/mooncake/pull` `{"transfer_id","remote_engine_id"}`
//! ([`crate::vllm_kv::transfer::mooncake_pull`]). Both fronts' producers serve it the same.
//!
//! The router sends both legs at once, so the consumer may pull before its producer has
//! computed: the pull waits (at most [`WAIT_LIMIT`], or the abort timeout when shorter) for
//! the producer to hold that `transfer_id`, then answers 200 and frees it when the engine id
//! matches the rank that computed it; 404 when it does not (at once, leaving it held), when
//! the wait runs out, or (at once, the table remembering what is gone for one abort timeout)
//! when the entry was already pulled or expired. Any failure is the consumer's cue to
//! recompute.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use super::body;
use crate::kv::Taken;
use crate::state::Shared;
use crate::vllm_kv::transfer::{
    MOONCAKE_PULL_PATH as PULL_PATH, MOONCAKE_WAIT_LIMIT as WAIT_LIMIT,
};

#[derive(Debug, Deserialize)]
struct PullRequest {
    transfer_id: String,
    remote_engine_id: String,
}

/// The bootstrap server's routes (no API key: it is the engines' side channel).
pub(crate) fn bootstrap_router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/query", get(query))
        .route(PULL_PATH, post(serve_pull))
        .fallback(|| async { body::json(StatusCode::NOT_FOUND, &json!({ "detail": "Not Found" })) })
        .with_state(shared)
}

/// `GET /query`: `{"RANK": {"engine_id": ID}, ...}` for every DP rank.
async fn query(State(s): State<Arc<Shared>>) -> Response {
    let ranks: BTreeMap<String, Value> =
        s.kv.rank_engine_ids()
            .enumerate()
            .map(|(r, id)| (r.to_string(), json!({ "engine_id": id })))
            .collect();
    body::json(StatusCode::OK, &json!(ranks))
}

/// `POST /mock/mooncake/pull`: waits for the transfer, then hands it over (frees it).
async fn serve_pull(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    let req: PullRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let detail = format!("invalid pull: {e}");
            return body::json(StatusCode::BAD_REQUEST, &json!({ "detail": detail }));
        }
    };
    let bound = WAIT_LIMIT.min(s.kv.timeout());
    let (id, engine) = (&req.transfer_id, &req.remote_engine_id);
    match s.kv.wait_take(engine, id, bound).await {
        Taken::Tokens(tokens) => body::json(StatusCode::OK, &json!({ "tokens": tokens })),
        Taken::WrongEngine => {
            let detail = format!("transfer {id:?} is not held by engine {engine:?}");
            body::json(StatusCode::NOT_FOUND, &json!({ "detail": detail }))
        }
        Taken::Gone => {
            let detail = format!("transfer {id:?} was already pulled or expired");
            body::json(StatusCode::NOT_FOUND, &json!({ "detail": detail }))
        }
        Taken::Missing => {
            let detail = format!("transfer {id:?} not held within {} ms", bound.as_millis());
            body::json(StatusCode::NOT_FOUND, &json!({ "detail": detail }))
        }
    }
}
