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
use crate::proxy::client::{UpstreamClient, UpstreamError, json_post};
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
    path: &str,
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
    path: &str,
    body: Bytes,
    ctx: &RequestCtx,
    timeout: std::time::Duration,
    extra: Vec<(http::HeaderName, http::HeaderValue)>,
) -> Result<http::Response<crate::proxy::client::UpstreamBody>, ApiError> {
    let mut req = json_post(
        worker.base_url(),
        path,
        body,
        worker.api_key(),
        &ctx.request_id,
    );
    if let Some(f) = &ctx.forwarded {
        f.apply(&mut req, worker.api_key().is_some());
    }
    crate::telemetry::propagate_to_worker(req.headers_mut());
    for (name, value) in extra {
        req.headers_mut().insert(name, value);
    }
    let resp = client
        .send(req, timeout)
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

/// Copies a worker's response head, minus hop-by-hop headers, around `body`.
pub(crate) fn relay_response(parts: http::response::Parts, body: Body) -> Response {
    let mut resp = Response::new(body);
    *resp.status_mut() = parts.status;
    for (name, value) in &parts.headers {
        if matches!(
            name.as_str(),
            "connection"
                | "keep-alive"
                | "transfer-encoding"
                | "te"
                | "trailer"
                | "upgrade"
                | "proxy-connection"
                | "date"
                | "server"
        ) {
            continue;
        }
        resp.headers_mut().append(name.clone(), value.clone());
    }
    resp
}
