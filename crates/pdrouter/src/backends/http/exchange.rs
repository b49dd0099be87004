//! One upstream HTTP exchange with a worker, and how its failures and response head reach
//! the client: the only place a worker's error status or transport failure becomes a client
//! error, and where hop-by-hop headers are dropped from a relayed head.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde_json::Value;

use crate::core::RequestCtx;
use crate::error::{ApiError, Leg};
use crate::proxy::client::{Fields, UpstreamClient, UpstreamError, worker_post};
use crate::registry::Worker;
use crate::request::ParsedRequest;

/// The `model` the router adds to a body whose client named none: the model the chosen
/// worker serves, so the engine and its answer agree on one name.
pub(crate) fn model_fill(req: &ParsedRequest, worker: &Worker) -> Option<(&'static str, Value)> {
    match &req.model {
        Some(_) => None,
        None => worker
            .model()
            .map(|m| ("model", Value::String(m.id.clone()))),
    }
}

/// One upstream exchange: POSTs `body` to `path` on `worker`, with the worker's credential and
/// the headers the client passes on (see [`crate::proxy::forward::Forwarded`]), and returns
/// its 2xx response head. A transport failure or an error status becomes `leg`'s client
/// error, with a bounded
/// prefix of the worker's error body as the message. Charging the breaker is the caller's,
/// because a Prefill leg only knows its outcome once its body has been drained.
pub(crate) async fn exchange(
    client: &UpstreamClient,
    worker: &Worker,
    leg: Leg,
    path: &'static str,
    body: Bytes,
    ctx: &RequestCtx,
    timeout: std::time::Duration,
) -> Result<http::Response<crate::proxy::client::UpstreamBody>, ApiError> {
    exchange_with(client, worker, leg, path, body, ctx, timeout, Vec::new()).await
}

/// [`exchange`], with `extra` headers for this worker only (e.g. the DP rank a vLLM
/// Prefill runs on).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn exchange_with(
    client: &UpstreamClient,
    worker: &Worker,
    leg: Leg,
    path: &'static str,
    body: Bytes,
    ctx: &RequestCtx,
    timeout: std::time::Duration,
    extra: Vec<(http::HeaderName, http::HeaderValue)>,
) -> Result<http::Response<crate::proxy::client::UpstreamBody>, ApiError> {
    let mut req = worker_post(worker.origin(), path, body, &ctx.request_id);
    if let Some(f) = &ctx.forwarded {
        f.apply(&mut req, worker.api_key().is_some());
    }
    crate::telemetry::propagate_to_worker(req.headers_mut());
    for (name, value) in extra {
        req.headers_mut().insert(name, value);
    }
    // A Prefill leg's answer is read for its status and body only.
    let fields = if leg == Leg::Prefill {
        Fields::Dropped
    } else {
        Fields::Kept
    };
    let resp = client
        .send_with(req, timeout, fields)
        .await
        .map_err(|e| upstream_error(e, leg, worker.url()))?;
    let status = resp.status();
    if status.is_success() {
        return Ok(resp);
    }
    let detail = error_detail(resp.into_body()).await;
    Err(ApiError::upstream_status(
        leg,
        worker.url(),
        status,
        &detail,
    ))
}

/// Maps a transport failure on `leg` to the client error.
pub(crate) fn upstream_error(e: UpstreamError, leg: Leg, url: &str) -> ApiError {
    match e {
        UpstreamError::Connect => ApiError::connect_failed(leg, url),
        UpstreamError::Timeout => ApiError::upstream_timeout(leg, url),
        UpstreamError::Broken => ApiError::upstream_broken(leg, url),
        UpstreamError::TooLarge => {
            ApiError::upstream_too_large(leg, url, crate::proxy::client::INFO_BODY_LIMIT)
        }
    }
}

/// Reads (a bounded prefix of) an error response body for the message.
async fn error_detail(body: crate::proxy::client::UpstreamBody) -> String {
    let limited = http_body_util::Limited::new(body, 4096);
    match tokio::time::timeout(std::time::Duration::from_secs(5), limited.collect()).await {
        Ok(Ok(c)) => {
            let bytes = c.to_bytes();
            match serde_json::from_slice::<serde_json::Value>(&bytes) {
                Ok(v) => v["error"]["message"]
                    .as_str()
                    .or_else(|| v["message"].as_str())
                    .map(str::to_string)
                    .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned()),
                Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
            }
        }
        _ => String::new(),
    }
}

/// A worker's response head, minus hop-by-hop headers, around `body`.
pub(crate) fn relay_response(parts: http::response::Parts, body: Body) -> Response {
    let mut headers = parts.headers;
    // Most answers carry one or two of these (a `date`, a `server`): only those are removed,
    // and the rest of the head moves over as it is.
    let mut present = [None; HOP_BY_HOP.len()];
    for name in headers.keys() {
        if let Some(i) = HOP_BY_HOP.iter().position(|h| name.as_str() == *h) {
            present[i] = Some(HOP_BY_HOP[i]);
        }
    }
    for name in present.into_iter().flatten() {
        headers.remove(name);
    }
    let mut resp = Response::new(body);
    *resp.status_mut() = parts.status;
    *resp.headers_mut() = headers;
    resp
}

/// Headers of one connection (and the worker's own `date` and `server`), never relayed.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "transfer-encoding",
    "te",
    "trailer",
    "upgrade",
    "proxy-connection",
    "date",
    "server",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relayed_head_keeps_the_answers_headers_but_not_the_connections() {
        let upstream = http::Response::builder()
            .status(http::StatusCode::CREATED)
            .header("content-type", "application/json")
            .header("Date", "Mon, 07 Dec 2026 10:00:00 GMT")
            .header("x-engine", "a")
            .header("connection", "keep-alive")
            .header("x-engine", "b")
            .header("server", "uvicorn")
            .header("keep-alive", "timeout=5")
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap();
        let (parts, ()) = upstream.into_parts();
        let resp = relay_response(parts, Body::empty());
        assert_eq!(resp.status(), http::StatusCode::CREATED);
        let kept: Vec<_> = resp
            .headers()
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            kept,
            [
                ("content-type", "application/json"),
                ("x-engine", "a"),
                ("x-engine", "b")
            ]
        );
        let (parts, ()) = http::Response::new(()).into_parts();
        assert!(relay_response(parts, Body::empty()).headers().is_empty());
    }
}
