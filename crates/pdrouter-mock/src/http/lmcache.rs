//! vLLM mode's stand-in for LMCache's NIXL-backed disaggregation: the router sends the
//! Prefill leg (capped at one token, no `kv_transfer_params`), waits for its answer, then
//! sends the client's body unchanged to Decode. A producer configured with its consumer
//! (`--lmcache-peer`) pushes the prompt's KV there before answering, `POST
//! /mock/lmcache/push` `{"prompt_key","tokens"}`; the consumer keeps it in its KV table
//! until a request with the same prompt uses it or the abort timeout passes.
//!
//! Invariant: [`prompt_key`] depends on the prompt alone (completions: `prompt`; chat: the
//! messages' roles and contents), never on the token cap, streaming or sampling, so the
//! Decode leg of the same client prompt finds what its Prefill leg pushed.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::body;
use super::nixl;
use super::request::Api;
use crate::kv;
use crate::state::Shared;

/// The path of the push on the consumer's port.
pub(crate) const PUSH_PATH: &str = "/mock/lmcache/push";

/// Longest a push may take before the producer gives up (and still answers).
const PUSH_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, Deserialize)]
struct PushRequest {
    prompt_key: String,
    tokens: u64,
}

/// 64-bit FNV-1a: stable across processes and builds, unlike the std hasher's contract.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The key of the request's prompt, `None` when it has none to key.
pub(crate) fn prompt_key(api: Api, req: &Map<String, Value>) -> Option<String> {
    let canonical = match api {
        Api::Completion => json!(["completion", req.get("prompt")?]),
        Api::Chat => {
            let msgs: Vec<Value> = req
                .get("messages")?
                .as_array()?
                .iter()
                .map(|m| json!([m.get("role"), m.get("content")]))
                .collect();
            json!(["chat", msgs])
        }
        Api::Generate | Api::Responses => return None,
    };
    let text = canonical.to_string();
    Some(format!("{:016x}-{}", fnv1a(text.as_bytes()), text.len()))
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

/// Pushes `tokens` tokens of KV for `key` to the consumer at `peer` (`http://host:port`).
pub(crate) async fn push(peer: &str, key: &str, tokens: u64) -> Result<(), String> {
    let uri = format!("{}{PUSH_PATH}", peer.trim_end_matches('/'));
    let body = json!({ "prompt_key": key, "tokens": tokens });
    nixl::post_json(&uri, &body, PUSH_TIMEOUT)
        .await
        .map_err(|e| format!("push to {peer}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(api: Api, v: Value) -> Option<String> {
        prompt_key(api, v.as_object().unwrap())
    }

    #[test]
    fn the_key_is_the_prompts_alone() {
        let a = key(Api::Completion, json!({"prompt": "hi", "max_tokens": 1}));
        let b = key(
            Api::Completion,
            json!({"prompt": "hi", "max_tokens": 9, "stream": true}),
        );
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_ne!(a, key(Api::Completion, json!({"prompt": "hi!"})));
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let c = key(
            Api::Chat,
            json!({"messages": msgs, "max_completion_tokens": 1}),
        );
        let d = key(Api::Chat, json!({"messages": msgs, "max_tokens": 5}));
        assert_eq!(c, d);
        assert_ne!(c, a, "chat and completions never share a key");
        let other = json!([{"role": "system", "content": "hi"}]);
        assert_ne!(c, key(Api::Chat, json!({"messages": other})));
        assert_eq!(key(Api::Completion, json!({})), None);
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
