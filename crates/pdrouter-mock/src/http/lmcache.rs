//! vLLM mode's stand-in for LMCache's NIXL-backed disaggregation: the router sends the
//! Prefill leg (capped at one token, no `kv_transfer_params`), waits for its answer, then
//! sends the client's body unchanged to Decode. A producer configured with its consumer
//! (`--lmcache-peer`) pushes the prompt's KV there before answering, `POST
//! /mock/lmcache/push` `{"prompt_key","tokens"}`; the consumer keeps it in its KV table
//! until a request with the same prompt uses it or the abort timeout passes. This is the
//! consumer's route ([`serve_push`], on an HTTP or a gRPC worker); the push and the prompt's
//! key are [`crate::vllm_kv::transfer`]'s.

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::json;

use super::body;
use crate::kv;
use crate::state::Shared;

pub(crate) use crate::vllm_kv::transfer::LMCACHE_PUSH_PATH as PUSH_PATH;

#[derive(Debug, Deserialize)]
struct PushRequest {
    prompt_key: String,
    tokens: u64,
}

/// `POST /mock/lmcache/push` on a consumer: keeps the pushed KV for its prompt.
pub(crate) async fn serve_push(State(s): State<Arc<Shared>>, body: Bytes) -> Response {
    let req: PushRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => {
            let detail = format!("invalid push: {e}");
            return body::json(StatusCode::BAD_REQUEST, &json!({ "detail": detail }));
        }
    };
    match s.kv.store_pushed(&req.prompt_key, req.tokens) {
        Ok(()) => body::json(StatusCode::OK, &json!({ "stored": true })),
        Err(kv::TableFull) => {
            let detail = format!("KV table full: {} entries held", kv::MAX_HELD);
            body::json(
                StatusCode::SERVICE_UNAVAILABLE,
                &json!({ "detail": detail }),
            )
        }
    }
}
