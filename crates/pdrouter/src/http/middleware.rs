//! Request id, access metrics and API-key checks.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State};
use axum::http::{HeaderValue, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use tokio::time::Instant;
use tracing::Instrument;

use super::AppState;
use crate::error::{ApiError, ErrorCode};

/// Request id carried on the request as an extension.
#[derive(Debug, Clone)]
pub(crate) struct RequestId(pub(crate) String);

const REQUEST_ID: &str = "x-request-id";

fn valid_id(v: &HeaderValue) -> Option<String> {
    let s = v.to_str().ok()?;
    (!s.is_empty() && s.len() <= 128 && s.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| s.to_string())
}

fn new_id() -> String {
    format!(
        "{:016x}{:016x}",
        rand::random::<u64>(),
        rand::random::<u64>()
    )
}

/// Assigns the request id, opens the request span, records access metrics, echoes the id.
pub(crate) async fn observe(
    State(state): State<Arc<AppState>>,
    mut req: Request,
    next: Next,
) -> Response {
    let started = Instant::now();
    let id = req
        .headers()
        .get(REQUEST_ID)
        .and_then(valid_id)
        .unwrap_or_else(new_id);
    let path = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| p.as_str())
        .to_string();
    let method = req.method().as_str().to_string();
    req.extensions_mut().insert(RequestId(id.clone()));
    let span = tracing::info_span!("request", request_id = %id, method = %method, path = %path);
    let mut resp = next.run(req).instrument(span.clone()).await;
    let status = resp.status().as_u16();
    let code = resp.extensions().get::<ErrorCode>().map(|c| c.0);
    span.in_scope(|| {
        if status >= 500 {
            tracing::warn!(status, code, "request failed");
        } else if status >= 400 {
            tracing::debug!(status, code, "request rejected");
        } else {
            tracing::debug!(status, "request answered");
        }
    });
    state
        .metrics
        .http_request(&method, &path, status, code, started.elapsed());
    if let Ok(v) = HeaderValue::from_str(&id) {
        resp.headers_mut().insert(REQUEST_ID, v);
    }
    resp
}

/// Constant-time equality, so the key cannot be guessed byte by byte from response times.
fn same_key(given: &[u8], expected: &[u8]) -> bool {
    let mut diff = given.len() ^ expected.len();
    for (i, b) in expected.iter().enumerate() {
        diff |= usize::from(given.get(i).copied().unwrap_or(0) ^ b);
    }
    diff == 0
}

/// Requires `Authorization: Bearer <--api-key>` when a key is configured.
pub(crate) async fn auth(State(state): State<Arc<AppState>>, req: Request, next: Next) -> Response {
    if let Some(key) = &state.cfg.api_key {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !same_key(given.trim().as_bytes(), key.as_bytes()) {
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_comparison() {
        assert!(same_key(b"secret", b"secret"));
        assert!(!same_key(b"secreT", b"secret"));
        assert!(!same_key(b"secret1", b"secret"));
        assert!(!same_key(b"", b"secret"));
    }
}
