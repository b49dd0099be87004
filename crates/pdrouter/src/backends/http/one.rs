//! Regular mode over HTTP: one worker per request, sent the client's body with the router's
//! fields spliced in, its answer relayed frame by frame.

use std::collections::VecDeque;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;

use super::exchange::{exchange, model_fill, relay_response};
use super::relay::RelayBody;
use crate::core::{Core, RequestCtx, worker_ok};
use crate::error::{ApiError, Leg};
use crate::proxy::client::UpstreamClient;
use crate::registry::{LoadGuard, Worker};
use crate::request::ParsedRequest;

/// Sends the request to `worker`; the answer owns `load`.
pub(super) async fn send(
    client: &UpstreamClient,
    core: &Core,
    req: &ParsedRequest,
    ctx: &RequestCtx,
    worker: Arc<Worker>,
    load: LoadGuard,
) -> Result<Response, ApiError> {
    let fields: Vec<(&'static str, serde_json::Value)> = worker
        .dp_rank()
        .map(|r| ("routed_dp_rank", r.into()))
        .into_iter()
        .chain(model_fill(req, &worker))
        .collect();
    let body = req.body_with(&fields);
    let outcome = tracing::Instrument::instrument(
        exchange(
            client,
            &worker,
            Leg::Worker,
            req.endpoint.path(),
            body,
            ctx,
            core.cfg.request_timeout,
        ),
        crate::telemetry::leg_span(Leg::Worker, worker.url()),
    )
    .await;
    core.registry.record_outcome(&worker, worker_ok(&outcome));
    let resp = outcome?;
    let (parts, body) = resp.into_parts();
    let relay = RelayBody::new(Some(body), VecDeque::new(), None, req.stream, load, None);
    Ok(relay_response(parts, Body::new(relay)))
}
