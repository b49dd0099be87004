//! vLLM mode's stand-in for a NIXL transfer: a consumer (decode leg) pulls its prompt's KV
//! blocks from the producer its `kv_transfer_params` name with one HTTP request to that
//! producer's own port (an HTTP or a gRPC worker's), `POST /mock/nixl/pull` with
//! `{"remote_engine_id","remote_request_id","remote_block_ids"}`.
//!
//! The producer ([`serve_pull`]) answers 200 and frees the blocks when it holds exactly
//! those blocks for that request under that engine id, 404 otherwise (400 for a malformed
//! body), so a second pull of the same request fails. The pull itself is
//! [`crate::vllm_kv::transfer::nixl_pull`]; any failure is the consumer's cue to recompute.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::body;
use crate::state::Shared;

pub(crate) use crate::vllm_kv::transfer::NIXL_PULL_PATH as PULL_PATH;

#[derive(Debug, Deserialize)]
struct PullRequest {
    remote_engine_id: String,
    remote_request_id: String,
    remote_block_ids: Vec<u64>,
}

/// `POST /mock/nixl/pull` on a producer: hands over (frees) the blocks it holds.
pub(crate) async fn serve_pull(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    let req: PullRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let detail = format!("invalid pull: {e}");
            return body::json(StatusCode::BAD_REQUEST, &json!({ "detail": detail }));
        }
    };
    if s.kv.take(
        &req.remote_engine_id,
        &req.remote_request_id,
        &req.remote_block_ids,
    ) {
        let blocks = req.remote_block_ids.len();
        body::json(StatusCode::OK, &json!({ "blocks": blocks }))
    } else {
        let detail = format!(
            "no blocks held for request {:?} of engine {:?} with those block ids",
            req.remote_request_id, req.remote_engine_id
        );
        body::json(StatusCode::NOT_FOUND, &json!({ "detail": detail }))
    }
}
