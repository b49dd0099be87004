//! vLLM mode's stand-in for a NIXL transfer: a consumer (decode leg) pulls its prompt's KV
//! blocks from the producer its `kv_transfer_params` name with one HTTP request to that
//! producer's own port, `POST /mock/nixl/pull` with
//! `{"remote_engine_id","remote_request_id","remote_block_ids"}`.
//!
//! The producer ([`serve_pull`]) answers 200 and frees the blocks when it holds exactly
//! those blocks for that request under that engine id, 404 otherwise (400 for a malformed
//! body), so a second pull of the same request fails. A pull ([`pull`]) takes at most
//! [`PULL_TIMEOUT`]; any failure is the consumer's cue to recompute.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{Method, Request, StatusCode, header};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use serde::Deserialize;
use serde_json::json;

use super::body::{self, JSON};
use super::kv_params::RemotePrefill;
use crate::state::Shared;

/// The path of the pull on the producer's port.
pub(crate) const PULL_PATH: &str = "/mock/nixl/pull";

/// Longest a pull may take before the consumer gives up and recomputes.
pub(crate) const PULL_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Pulls `remote`'s blocks from its producer; `Err` says why they could not be had.
pub(crate) async fn pull(remote: &RemotePrefill) -> Result<(), String> {
    let authority = crate::bootstrap::authority(&remote.host, remote.port);
    let body = json!({
        "remote_engine_id": remote.engine_id,
        "remote_request_id": remote.request_id,
        "remote_block_ids": remote.block_ids,
    });
    let uri = format!("http://{authority}{PULL_PATH}");
    post_json(&uri, &body, PULL_TIMEOUT)
        .await
        .map_err(|e| format!("pull from {authority}: {e}"))
}

/// POSTs `body` to `uri` through the shared client, within `limit`; `Ok` on a 2xx answer
/// (the other connectors' hand-overs use it too).
pub(crate) async fn post_json(
    uri: &str,
    body: &serde_json::Value,
    limit: Duration,
) -> Result<(), String> {
    let req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::CONTENT_TYPE, JSON)
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
