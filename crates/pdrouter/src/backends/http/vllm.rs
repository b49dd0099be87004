//! vLLM engines over HTTP. With the NIXL connector, a sequential handoff; with LMCache the
//! same order without params (the Prefill stores the prompt's KV, Decode finds it by the
//! prompt); with Mooncake both legs at once ([`super::mooncake`]).
//!
//! NIXL, once the core has picked and admitted the pair:
//! 1. The Prefill leg is the client's body with `stream: false`, no `stream_options`, no
//!    `min_tokens`, capped at one token (`max_completion_tokens: 1` when the client used that
//!    key, else `max_tokens: 1`) and marked `kv_transfer_params: {"do_remote_decode": true,
//!    "do_remote_prefill": false}`. The leg task reads its JSON answer whole (bounded) and
//!    keeps the answer's top-level `kv_transfer_params`.
//! 2. When that answer has been read, the leg task releases the Prefill slot and load; only
//!    then is the Decode leg sent: the client's body unchanged but for those params, verbatim.
//!    Its answer, streamed or not, is the client's.
//! 3. A Prefill that ended before its cap (`kv_transfer_params: null`, e.g. EOS or a stop
//!    string first) freed its KV: Decode is sent without params and computes the prompt
//!    itself; the client is served and the handoff is counted as recomputed.
//!
//! LMCache: the Prefill leg as above but without `kv_transfer_params`; once its answer has
//! been read, the Decode leg is the client's body unchanged.
//!
//! Invariants:
//! - One handoff feeds one Decode request: a request for several choices (`n` > 1) or
//!   several prompts skips the Prefill leg (its slot and load are released at once) and Decode
//!   computes the prompt; counted as skipped.
//! - Both legs carry the request's `X-Request-Id` (every upstream request does).
//! - A Prefill failure is the Prefill worker's (its 4xx the client's 4xx) and never touches
//!   the Decode worker's breaker: Decode is not contacted before the Prefill answered.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::proxy::client::UpstreamBody;
use axum::body::Body;
use axum::response::Response;
use http_body_util::BodyExt;
use serde_json::{Map, Value};
use tokio::time::Instant;

use super::exchange::{exchange, model_fill, relay_response};
use super::legs::{capped, prefill_body, with_params};
use super::relay::{FirstByte, RelayBody};
use crate::config::KvConnector;
use crate::core::leg::{self, LegJob, PrefillAnswer, PrefillHolds};
use crate::core::{Core, Pair, RequestCtx, worker_ok};
use crate::error::{ApiError, Leg};
use crate::metrics::KvHandoff;
use crate::proxy::client::UpstreamClient;
use crate::registry::Worker;
use crate::request::{Endpoint, ParsedRequest};

/// Most bytes of a Prefill answer read (a one-token answer is a few hundred bytes).
const PREFILL_ANSWER_LIMIT: usize = crate::proxy::client::INFO_BODY_LIMIT;

/// A vLLM Prefill worker's JSON answer, read whole by the leg task.
struct VllmPrefill {
    body: UpstreamBody,
    worker: Arc<Worker>,
    /// The answer carries `kv_transfer_params` to take (NIXL); else it is only read.
    params: bool,
}

impl PrefillAnswer for VllmPrefill {
    /// The answer's `kv_transfer_params` (JSON null when the Prefill ended early).
    type Kept = Value;

    async fn drain(&mut self, _keep: bool) -> Result<Option<Value>, ApiError> {
        let url = self.worker.url();
        let limited = http_body_util::Limited::new(&mut self.body, PREFILL_ANSWER_LIMIT);
        let bytes = match limited.collect().await {
            Ok(c) => c.to_bytes(),
            Err(e) if e.is::<http_body_util::LengthLimitError>() => {
                return Err(ApiError::upstream_too_large(
                    Leg::Prefill,
                    url,
                    PREFILL_ANSWER_LIMIT,
                ));
            }
            Err(_) => return Err(ApiError::upstream_broken(Leg::Prefill, url)),
        };
        if !self.params {
            return Ok(Some(Value::Null));
        }
        Ok(Some(handoff_params(&bytes, url)?))
    }
}

/// The `kv_transfer_params` of a Prefill answer: an object, or null when the Prefill ended
/// before its cap.
fn handoff_params(answer: &[u8], url: &str) -> Result<Value, ApiError> {
    let v: Value = serde_json::from_slice(answer)
        .map_err(|_| ApiError::upstream_unreadable(Leg::Prefill, url, "kv_transfer_params"))?;
    crate::kv_handoff::returned_params(v.get("kv_transfer_params"), url)
}

/// Whether one Prefill answer can feed the request's Decode: one prompt, one choice.
fn one_handoff(req: &ParsedRequest) -> bool {
    req.sub_requests() == 1
}

/// The client's body as an object (a body the router parsed without keeping its tree is
/// parsed again: only vLLM pairs rewrite fields beyond splicing).
fn object_of(req: &ParsedRequest) -> Result<Map<String, Value>, ApiError> {
    match req.tree() {
        Some(t) => Ok(t.clone()),
        None => serde_json::from_slice(&req.raw)
            .map_err(|e| ApiError::invalid_field("body", format!("must be a JSON object: {e}"))),
    }
}

/// Sends the legs as `connector` wants them and relays Decode's answer: NIXL and LMCache
/// one after the other (here), Mooncake at once.
pub(super) async fn send(
    client: &UpstreamClient,
    core: &Core,
    req: &ParsedRequest,
    ctx: &RequestCtx,
    pair: Pair,
    connector: KvConnector,
) -> Result<Response, ApiError> {
    if !matches!(
        req.endpoint,
        Endpoint::Completions | Endpoint::ChatCompletions
    ) {
        return Err(ApiError::not_implemented(format!(
            "{} with vLLM Prefill/Decode workers: they hand over the KV cache for \
             /v1/completions and /v1/chat/completions",
            req.endpoint.path()
        )));
    }
    let mut body = object_of(req)?;
    if let Some((k, v)) = model_fill(req, &pair.prefill) {
        body.insert(k.into(), v);
    }
    if connector == KvConnector::Mooncake && one_handoff(req) {
        let p = &pair.prefill;
        let ids = super::mooncake::engine_ids(client, p, core.cfg.health.timeout).await?;
        let legs = super::mooncake::legs(body.clone(), capped(body), p, &ids, &ctx.request_id);
        return super::pd::send(client, core, req, ctx, pair, Some(legs)).await;
    }
    let Pair {
        prefill,
        permit,
        prefill_load,
        decode,
        decode_load,
    } = pair;
    let timeout = core.cfg.request_timeout;
    let path = req.endpoint.path();
    let params = if one_handoff(req) {
        let holds = PrefillHolds::new(permit, prefill_load);
        prefill_first(client, core, req, ctx, prefill, holds, &body, connector).await?
    } else {
        drop((permit, prefill_load));
        core.metrics.kv_handoff(KvHandoff::Skipped);
        Value::Null
    };
    let head = tracing::Instrument::instrument(
        exchange(
            client,
            &decode,
            Leg::Decode,
            path,
            with_params(body, params),
            ctx,
            timeout,
        ),
        crate::telemetry::leg_span(Leg::Decode, decode.url()),
    )
    .await;
    core.registry.record_outcome(&decode, worker_ok(&head));
    let (parts, body) = head?.into_parts();
    let first_byte = FirstByte {
        started: ctx.started,
        metrics: core.metrics.clone(),
    };
    let relay = RelayBody::new(
        Some(body),
        VecDeque::new(),
        None,
        req.stream,
        decode_load,
        Some(first_byte),
    );
    Ok(relay_response(parts, Body::new(relay)))
}

/// The sequential Prefill leg (NIXL, LMCache): sent, its answer read whole (the leg task
/// releases the slot then); returns the transfer params Decode is to get (null: none).
#[allow(clippy::too_many_arguments)]
async fn prefill_first(
    client: &UpstreamClient,
    core: &Core,
    req: &ParsedRequest,
    ctx: &RequestCtx,
    prefill: Arc<Worker>,
    holds: PrefillHolds,
    body: &Map<String, Value>,
    connector: KvConnector,
) -> Result<Value, ApiError> {
    let nixl = connector == KvConnector::Nixl;
    let timeout = core.cfg.request_timeout;
    let path = req.endpoint.path();
    let deadline = crate::config::deadline_after(Instant::now(), timeout);
    let start = {
        let client = client.clone();
        let worker = prefill.clone();
        let ctx = ctx.clone();
        let body = if nixl {
            prefill_body(body.clone())
        } else {
            with_params(capped(body.clone()), Value::Null)
        };
        move || async move {
            let head = exchange(&client, &worker, Leg::Prefill, path, body, &ctx, timeout).await?;
            Ok(VllmPrefill {
                body: head.into_body(),
                worker,
                params: nixl,
            })
        }
    };
    let mut leg = leg::spawn(start, LegJob::new(core, prefill, holds, deadline, true));
    leg.outcome().await?;
    let params = leg.take_kept().unwrap_or(Value::Null);
    // Only NIXL's answer says whether the KV is there to move.
    if nixl {
        core.metrics.kv_handoff(if params.is_null() {
            KvHandoff::Recomputed
        } else {
            KvHandoff::Relayed
        });
    }
    Ok(params)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    #[test]
    fn the_prefill_leg_is_capped_at_one_token_and_asks_for_a_remote_decode() {
        let client = json!({"model": "m", "prompt": "hi", "max_tokens": 50, "min_tokens": 4,
            "stream": true, "stream_options": {"include_usage": true}, "temperature": 0.5});
        let p: Value = serde_json::from_slice(&prefill_body(obj(client))).unwrap();
        assert_eq!(
            p,
            json!({"model": "m", "prompt": "hi", "max_tokens": 1, "stream": false,
                "temperature": 0.5,
                "kv_transfer_params": {"do_remote_decode": true, "do_remote_prefill": false}})
        );
        let chat = json!({"messages": [], "max_completion_tokens": 9, "max_tokens": 9});
        let p: Value = serde_json::from_slice(&prefill_body(obj(chat))).unwrap();
        assert_eq!(p["max_completion_tokens"], 1);
        assert!(
            p.get("max_tokens").is_none(),
            "one spelling of the cap: {p}"
        );
        let uncapped = json!({"messages": []});
        let p: Value = serde_json::from_slice(&prefill_body(obj(uncapped))).unwrap();
        assert_eq!(p["max_tokens"], 1);
    }

    #[test]
    fn the_decode_leg_is_the_clients_body_with_the_params_verbatim() {
        let client = json!({"prompt": "hi", "max_tokens": 50, "stream": true});
        let params = json!({"do_remote_prefill": true, "remote_engine_id": "e",
            "remote_block_ids": [1, 2], "remote_host": "h", "remote_port": 5, "tp_size": 1});
        let d: Value =
            serde_json::from_slice(&with_params(obj(client.clone()), params.clone())).unwrap();
        assert_eq!(d["kv_transfer_params"], params);
        assert_eq!(d["max_tokens"], 50);
        assert_eq!(d["stream"], true);
        let d: Value = serde_json::from_slice(&with_params(obj(client), Value::Null)).unwrap();
        assert!(d.get("kv_transfer_params").is_none(), "recompute: {d}");
    }

    #[test]
    fn the_prefill_answer_gives_params_or_null() {
        let p = handoff_params(br#"{"kv_transfer_params": {"remote_engine_id": "e"}}"#, "u");
        assert_eq!(p.unwrap(), json!({"remote_engine_id": "e"}));
        assert_eq!(
            handoff_params(br#"{"kv_transfer_params": null}"#, "u").unwrap(),
            Value::Null
        );
        assert_eq!(handoff_params(br#"{"id": "x"}"#, "u").unwrap(), Value::Null);
        assert!(handoff_params(b"not json", "u").is_err());
        assert!(handoff_params(br#"{"kv_transfer_params": 3}"#, "u").is_err());
    }
}
