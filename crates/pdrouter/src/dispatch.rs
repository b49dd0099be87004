//! Request dispatch: the state every routing path shares, and the retry loop around it.
//!
//! One attempt selects workers, sends, and returns a response whose body owns every guard the
//! request holds. A failed attempt is retried (fresh selection, backoff with jitter) only when
//! the error says a retry may help and nothing has reached the client yet; local admission
//! rejections never are.

use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body_util::BodyExt;
use pdrouter_admission::Admission;
use pdrouter_policy::Policy;
use serde_json::Value;
use tokio::time::Instant;

use crate::config::{Config, Mode, WorkerType};
use crate::error::{ApiError, Leg};
use crate::metrics::Metrics;
use crate::proxy::client::{UpstreamClient, UpstreamError, json_post};
use crate::proxy::forward::Forwarded;
use crate::proxy::retry::backoff;
use crate::registry::{Registry, Worker};
use crate::request::ParsedRequest;
use crate::select::Wanted;

/// Per-request facts from the HTTP layer.
#[derive(Debug, Clone)]
pub struct RequestCtx {
    /// `x-request-id` (a `Box<str>`: this struct lives in every waiting request's future).
    pub request_id: Box<str>,
    /// `X-SMG-Target-Worker` (a `u32`, which leaves room for `priority` in the request's
    /// future, held for the whole wait).
    pub target: Option<u32>,
    /// `X-SMG-Routing-Key`.
    pub routing_key: Option<Arc<str>>,
    /// Client headers passed on to workers (trace context, client credential).
    pub forwarded: Option<Arc<Forwarded>>,
    /// When the request arrived.
    pub started: Instant,
    /// Its priority class (`default` unless priority classes are on).
    pub priority: pdrouter_admission::Priority,
}

/// Everything routing needs, built once by the composition root.
#[derive(Debug)]
pub struct Dispatcher {
    pub(crate) cfg: Arc<Config>,
    pub(crate) registry: Arc<Registry>,
    pub(crate) client: UpstreamClient,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) admission: Option<Admission>,
    /// Sizes the admission limits at run time (`auto`), when configured.
    pub(crate) sizer: Option<Arc<crate::sizing::Sizer>>,
    pub(crate) policy: Arc<Policy>,
    pub(crate) prefill_policy: Arc<Policy>,
    pub(crate) decode_policy: Arc<Policy>,
    /// Chooses each image's Encode worker (EPD).
    pub(crate) encode_policy: Arc<Policy>,
    /// What gRPC chat requests' image parts get: served in EPD over a vision model.
    pub(crate) images: crate::images::ImageSupport,
    /// The router's tokenizer, for gRPC workers.
    pub(crate) tokenizer: Option<Arc<crate::grpc::tokenizer::RouterTokenizer>>,
}

impl Dispatcher {
    /// Routes one inference request, retrying where allowed.
    ///
    /// Takes its arguments by reference so that a request parked in the admission queue holds
    /// them once, in the caller's future, not again in this one's.
    pub async fn route(
        &self,
        req: &mut ParsedRequest,
        ctx: &RequestCtx,
    ) -> Result<Response, ApiError> {
        let route = req.endpoint.path();
        self.metrics.routed(route);
        // gRPC workers take token ids: the request is translated once, for every attempt.
        // Boxed, like the attempts below: an HTTP request parked in the admission queue
        // holds this future, which must not grow by the translation's state.
        let grpc = match self.cfg.mode {
            Mode::PdGrpc | Mode::RegularGrpc | Mode::EpdGrpc => {
                match Box::pin(self.grpc_plan(req)).await {
                    Ok(plan) => Some(plan),
                    Err(e) => {
                        self.metrics.route_error(route, e.code);
                        return Err(e);
                    }
                }
            }
            _ => None,
        };
        let mut attempt = 1;
        let result = loop {
            if let Err(e) = self.check_model(req) {
                break Err(e);
            }
            let outcome = match self.cfg.mode {
                // EPD without images is TokenSpeed PD.
                Mode::PdHttp | Mode::PdGrpc | Mode::EpdGrpc => {
                    self.pd_attempt(req, ctx, grpc.as_deref()).await
                }
                // Boxed: regular requests never wait for admission, and inline their attempt
                // would size every PD request's future (a parked waiter's) to it.
                Mode::Regular | Mode::RegularGrpc => {
                    Box::pin(self.regular_attempt(req, ctx, grpc.as_deref())).await
                }
            };
            match outcome {
                Err(e) if e.retryable && attempt < self.cfg.retry.max_attempts => {
                    attempt += 1;
                    self.metrics.retry(route);
                    tracing::debug!(code = e.code, attempt, "retrying");
                    tokio::time::sleep(backoff(&self.cfg.retry, attempt)).await;
                }
                other => break other,
            }
        };
        if let Err(e) = &result {
            self.metrics.route_error(route, e.code);
        }
        result
    }

    /// A named model must be served by a registered worker of every type the request needs
    /// (a worker whose model is not known yet counts), or nothing is sent: 404. A type with
    /// no worker at all is left to selection (503, like any request).
    fn check_model(&self, req: &ParsedRequest) -> Result<(), ApiError> {
        let Some(model) = self.routed_model(req) else {
            return Ok(());
        };
        let model = &*model;
        let types: &[WorkerType] = match self.cfg.mode {
            // Encode workers serve no model of their own.
            Mode::PdHttp | Mode::PdGrpc | Mode::EpdGrpc => {
                &[WorkerType::Prefill, WorkerType::Decode]
            }
            Mode::Regular | Mode::RegularGrpc => &[WorkerType::Regular],
        };
        let snap = self.registry.snapshot();
        let unserved = types.iter().any(|t| {
            let ws = snap.of_type(*t);
            !ws.is_empty() && !ws.iter().any(|w| w.serves(model))
        });
        if unserved {
            return Err(ApiError::model_not_found(model));
        }
        Ok(())
    }

    /// What selection with `policy` needs of the request.
    pub(crate) fn wanted(&self, req: &ParsedRequest, ctx: &RequestCtx, policy: &Policy) -> Wanted {
        Wanted {
            text: req.text.clone(),
            routing_key: ctx.routing_key.clone(),
            target: ctx.target.map(|t| t as usize),
            model: self.routed_model(req),
            prefix_tokens: (policy.kind() == pdrouter_policy::PolicyKind::PrefixHash)
                .then(|| self.prefix_tokens(req))
                .flatten(),
        }
    }

    /// The first `--prefix-token-count` token ids of the prompt, for prefix_hash in front of
    /// http:// workers when the router was given a tokenizer (gRPC requests carry their ids
    /// in the plan instead).
    fn prefix_tokens(&self, req: &ParsedRequest) -> Option<Arc<Vec<u32>>> {
        if self.cfg.mode.is_grpc() {
            return None;
        }
        let tokenizer = self.tokenizer.as_ref()?;
        let count = self.cfg.prefix_hash.prefix_token_count;
        // A token is rarely longer than 16 characters: encoding that much of the text yields
        // the first `count` ids without tokenizing a long prompt whole.
        let chars = count.saturating_mul(16);
        let text = match req.text.char_indices().nth(chars) {
            Some((end, _)) => &req.text[..end],
            None => &req.text,
        };
        match tokenizer.tokenizer.encode(text) {
            Ok(mut ids) => {
                ids.truncate(count);
                // A thin pointer: the selector a queued request holds stays small.
                Some(Arc::new(ids))
            }
            Err(e) => {
                tracing::debug!(error = %e, "prefix_hash: could not tokenize; keying on text");
                None
            }
        }
    }

    /// The model the request is routed for: `--model-alias` names resolve to their model.
    pub(crate) fn routed_model(&self, req: &ParsedRequest) -> Option<Arc<str>> {
        let named = req.model.as_ref()?;
        let model = self.cfg.resolve_model(named);
        Some(if model == &**named {
            named.clone()
        } else {
            Arc::from(model)
        })
    }
}

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
/// the headers the client passes on (see [`Forwarded`]), and returns its 2xx response head. A transport failure or an error status becomes `leg`'s client error, with a bounded
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
) -> Result<http::Response<hyper::body::Incoming>, ApiError> {
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

/// Whether an outcome speaks well of the worker: transport errors and 408/429/5xx count
/// against it (the retryable ones), a 4xx the request caused does not.
pub(crate) fn worker_ok<T>(outcome: &Result<T, ApiError>) -> bool {
    !matches!(outcome, Err(e) if e.retryable)
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
async fn error_detail(body: hyper::body::Incoming) -> String {
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
