//! The consumer's and producer's side of the stand-ins for the KV transfers, the same whichever
//! front (HTTP or gRPC) the worker speaks: a NIXL consumer's pull from its producer's own port,
//! a Mooncake consumer's pull through its producer's bootstrap server, an LMCache producer's
//! push to its consumer, all plain HTTP/1.1 JSON requests through the process's peer client.
//! The serving sides are HTTP routes (`crate::http`'s `nixl`, `mooncake` and `lmcache`), which
//! both fronts mount.
//!
//! Invariant: every exchange is bounded (its `*_TIMEOUT`); any failure is an `Err` naming the
//! peer, the caller's cue to recompute (or, for a push, to answer anyway).

use std::time::Duration;

use axum::http::{Method, Request, header};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use serde_json::{Map, Value, json};

use super::params::{Body, MooncakeSource, RemotePrefill};

/// NIXL: the path of the pull on the producer's port.
pub(crate) const NIXL_PULL_PATH: &str = "/mock/nixl/pull";

/// NIXL: longest a pull may take before the consumer gives up and recomputes.
pub(crate) const NIXL_PULL_TIMEOUT: Duration = Duration::from_secs(5);

/// Mooncake: the path of the pull on the producer's bootstrap server.
pub(crate) const MOONCAKE_PULL_PATH: &str = "/mock/mooncake/pull";

/// Mooncake: longest a pull waits (on the producer) for its producer leg to finish.
pub(crate) const MOONCAKE_WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Mooncake: the consumer's bound on a whole pull, the producer's wait plus time to answer.
const MOONCAKE_PULL_TIMEOUT: Duration = Duration::from_secs(35);

/// LMCache: the path of the push on the consumer's port.
pub(crate) const LMCACHE_PUSH_PATH: &str = "/mock/lmcache/push";

/// LMCache: longest a push may take before the producer gives up (and still answers).
const LMCACHE_PUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// Pulls `remote`'s blocks from its NIXL producer; `Err` says why they could not be had.
pub(crate) async fn nixl_pull(remote: &RemotePrefill) -> Result<(), String> {
    let authority = crate::bootstrap::authority(&remote.host, remote.port);
    let body = json!({
        "remote_engine_id": remote.engine_id,
        "remote_request_id": remote.request_id,
        "remote_block_ids": remote.block_ids,
    });
    let uri = format!("http://{authority}{NIXL_PULL_PATH}");
    post_json(&uri, &body, NIXL_PULL_TIMEOUT)
        .await
        .map_err(|e| format!("pull from {authority}: {e}"))
}

/// Pulls `src`'s prompt KV from its Mooncake producer's bootstrap server; `Err` says why not.
pub(crate) async fn mooncake_pull(src: &MooncakeSource) -> Result<(), String> {
    let uri = format!("{}{MOONCAKE_PULL_PATH}", src.bootstrap_addr);
    let body = json!({ "transfer_id": src.transfer_id, "remote_engine_id": src.engine_id });
    post_json(&uri, &body, MOONCAKE_PULL_TIMEOUT)
        .await
        .map_err(|e| format!("pull from {}: {e}", src.bootstrap_addr))
}

/// Pushes `tokens` tokens of KV for `key` to the LMCache consumer at `peer` (`http://host:port`).
pub(crate) async fn lmcache_push(peer: &str, key: &str, tokens: u64) -> Result<(), String> {
    let uri = format!("{}{LMCACHE_PUSH_PATH}", peer.trim_end_matches('/'));
    let body = json!({ "prompt_key": key, "tokens": tokens });
    post_json(&uri, &body, LMCACHE_PUSH_TIMEOUT)
        .await
        .map_err(|e| format!("push to {peer}: {e}"))
}

/// 64-bit FNV-1a: stable across processes and builds, unlike the std hasher's contract.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// LMCache: the key of the request's prompt, `None` when it has none to key.
///
/// Invariant: it depends on the prompt alone (completions: `prompt`; chat: the messages' roles
/// and contents), never on the token cap, streaming or sampling, so the Decode leg of the same
/// client prompt finds what its Prefill leg pushed.
pub(crate) fn prompt_key(body: Body, req: &Map<String, Value>) -> Option<String> {
    let canonical = match body {
        Body::Completion => json!(["completion", req.get("prompt")?]),
        Body::Chat => {
            let msgs: Vec<Value> = req
                .get("messages")?
                .as_array()?
                .iter()
                .map(|m| json!([m.get("role"), m.get("content")]))
                .collect();
            json!(["chat", msgs])
        }
    };
    let text = canonical.to_string();
    Some(format!("{:016x}-{}", fnv1a(text.as_bytes()), text.len()))
}

/// POSTs `body` to `uri` through the shared peer client, within `limit`; `Ok` on a 2xx answer.
async fn post_json(uri: &str, body: &Value, limit: Duration) -> Result<(), String> {
    let req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let exchange = async {
        let resp = crate::bootstrap::peer_client()
            .request(req)
            .await
            .map_err(|e| e.to_string())?;
        let status = resp.status();
        // Read to the end so the connection goes back to the pool.
        let _ = resp.into_body().collect().await;
        if status.is_success() {
            Ok(())
        } else {
            Err(status.to_string())
        }
    };
    match tokio::time::timeout(limit, exchange).await {
        Ok(result) => result,
        Err(_) => Err("timed out".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(body: Body, v: Value) -> Option<String> {
        prompt_key(body, v.as_object().unwrap())
    }

    #[test]
    fn the_key_is_the_prompts_alone() {
        let a = key(Body::Completion, json!({"prompt": "hi", "max_tokens": 1}));
        let b = key(
            Body::Completion,
            json!({"prompt": "hi", "max_tokens": 9, "stream": true}),
        );
        assert!(a.is_some());
        assert_eq!(a, b);
        assert_ne!(a, key(Body::Completion, json!({"prompt": "hi!"})));
        let msgs = json!([{"role": "user", "content": "hi"}]);
        let c = key(
            Body::Chat,
            json!({"messages": msgs, "max_completion_tokens": 1}),
        );
        let d = key(Body::Chat, json!({"messages": msgs, "max_tokens": 5}));
        assert_eq!(c, d);
        assert_ne!(c, a, "chat and completions never share a key");
        let other = json!([{"role": "system", "content": "hi"}]);
        assert_ne!(c, key(Body::Chat, json!({"messages": other})));
        assert_eq!(key(Body::Completion, json!({})), None);
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
    }
}
