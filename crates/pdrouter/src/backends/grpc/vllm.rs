//! gRPC PD over vLLM engines: the connector's parameters travel as JSON text on the calls
//! (`kv_transfer_params_json`) and on the Prefill's final answer, and the legs run in the
//! order the pair's connector needs.
//!
//! - **NIXL**: the Prefill call is the Decode call capped at one token, not streamed, asking
//!   for a remote decode; the leg task reads it to its `Complete`, keeps the parameters it
//!   returned and then releases the slot and load; only then is Decode sent, with those
//!   parameters verbatim (none when the Prefill returned none: it ended before its cap and
//!   freed its KV, so Decode recomputes the prompt; counted either way).
//! - **LMCache**: the same order without parameters.
//! - **Mooncake**: both legs at once, one fresh transfer id, Decode told the Prefill's
//!   bootstrap address and its rank's engine id (`crate::kv_handoff`); the Prefill call is
//!   pinned to that rank.
//!
//! Invariants:
//! - A pair shares one connector, as each worker reports it in `GetServerInfo` (the
//!   configured one for a worker that reports none); a connector the router does not drive,
//!   a mismatch or a Prefill configured as a pure consumer (or a Decode as a pure producer)
//!   is refused with 501 before anything is sent.
//! - One handoff feeds one Decode request: several prompts or samples skip the Prefill (its
//!   slot and load are released at once) and Decode computes the prompt; counted as skipped.
//! - Prompt logprobs come from the Prefill when it runs (Decode is not asked for them, so
//!   they are not counted twice), else from Decode.

use std::sync::Arc;

use axum::response::Response;
use tokio::time::Instant;

use super::answer::{self, GrpcPlan, Source};
use super::calls::{self, channel, status_error};
use super::encode::EncodeCalls;
use super::prefill::GrpcPrefill;
use super::{GrpcBackend, PrefillLeg};
use crate::config::KvConnector;
use crate::core::leg::{self, LegJob, PrefillHolds};
use crate::core::{Core, Pair, RequestCtx};
use crate::error::{ApiError, Leg};
use crate::grpc::client::Legs;
use crate::grpc::runtime::{Call, Runtime};
use crate::kv_handoff;
use crate::metrics::KvHandoff;
use crate::registry::Worker;

/// The connector `worker` moves its KV with: what it reports, else the configured one.
async fn connector_of(core: &Core, worker: &Worker, leg: Leg) -> Result<KvConnector, ApiError> {
    let kv = channel(worker, leg)?
        .vllm_kv(core.cfg.health.timeout)
        .await
        .map_err(|s| status_error(leg, worker.url(), &s))?;
    let wrong_role = match leg {
        Leg::Prefill => "kv_consumer",
        _ => "kv_producer",
    };
    if kv.role == wrong_role {
        return Err(ApiError::not_implemented(format!(
            "{} worker {} is configured as {wrong_role}; its --kv-transfer-config cannot take \
             that part of a Prefill/Decode pair",
            leg.as_str(),
            worker.url()
        )));
    }
    match (kv.connector, kv.connector_name.as_str()) {
        (Some(c), _) => Ok(c),
        (None, "") => Ok(worker.connector()),
        (None, other) => Err(ApiError::not_implemented(format!(
            "{} worker {} moves its KV with {other}; the router drives NixlConnector, \
             MooncakeConnector and LMCache",
            leg.as_str(),
            worker.url()
        ))),
    }
}

/// The connector both workers of the pair share.
async fn pair_connector(
    core: &Core,
    prefill: &Worker,
    decode: &Worker,
) -> Result<KvConnector, ApiError> {
    let p = connector_of(core, prefill, Leg::Prefill).await?;
    let d = connector_of(core, decode, Leg::Decode).await?;
    if p != d {
        return Err(ApiError::not_implemented(format!(
            "Prefill worker {} moves its KV with {} and Decode worker {} with {}; a PD pair \
             must share one connector",
            prefill.url(),
            p.name(),
            decode.url(),
            d.name()
        )));
    }
    Ok(p)
}

/// The Prefill's call from Decode's: capped at one token (whatever the client asked), not
/// streamed, on the Prefill's DP rank.
fn prefill_call(decode: &Call, prefill: &Worker) -> Call {
    let mut c = decode.clone();
    c.req.stream = false;
    if let Some(p) = c.req.sampling_params.as_mut() {
        p.max_new_tokens = Some(1);
        p.min_new_tokens = 0;
    }
    // The cap is the router's, so it is sent even when the client set none.
    c.unset = c
        .unset
        .iter()
        .copied()
        .filter(|k| *k != "max_new_tokens")
        .collect();
    c.dp_rank = prefill.dp_rank();
    c.shared = None;
    c
}

/// Starts the Prefill leg task with `call`; with `keep` its outcome waits for the answer's
/// end and brings what it kept.
fn spawn_prefill(
    core: &Core,
    prefill: Arc<Worker>,
    holds: PrefillHolds,
    call: Call,
    deadline: Instant,
    keep: bool,
) -> PrefillLeg {
    let start = {
        let worker = prefill.clone();
        move || async move {
            let streams = Legs::start(channel(&worker, Leg::Prefill)?, vec![call])
                .await
                .map_err(|s| status_error(Leg::Prefill, worker.url(), &s))?;
            Ok(GrpcPrefill {
                streams,
                worker,
                prompts: 1,
                _encodes: EncodeCalls::default(),
            })
        }
    };
    leg::spawn(start, LegJob::new(core, prefill, holds, deadline, keep))
}

/// Sends the legs of `pair` as its connector needs them and builds the answer from Decode's
/// streams.
pub(super) async fn send(
    backend: &GrpcBackend,
    core: &Core,
    ctx: &RequestCtx,
    grpc: &GrpcPlan,
    pair: Pair,
) -> Result<Response, ApiError> {
    let plan = grpc.plan.clone();
    let Pair {
        prefill,
        permit,
        prefill_load,
        decode,
        decode_load,
    } = pair;
    let dch = channel(&decode, Leg::Decode)?;
    let connector = pair_connector(core, &prefill, &decode).await?;
    let tag = u64::from(rand::random::<u32>());
    let (mut dcalls, request_id) = calls::calls(&plan, Runtime::Vllm, &decode, ctx, tag);
    calls::on_rank(&mut dcalls, &decode);
    let deadline = crate::config::deadline_after(Instant::now(), core.cfg.request_timeout);
    let holds = PrefillHolds::new(permit, prefill_load);
    let mut leg = match dcalls.as_mut_slice() {
        [one] if one.samples() == 1 => {
            let mut pcall = prefill_call(one, &prefill);
            // Prompt logprobs are the Prefill's to report.
            one.req.logprob_start_len = -1;
            let nixl = connector == KvConnector::Nixl;
            if connector == KvConnector::Mooncake {
                let timeout = core.cfg.health.timeout;
                let ids = kv_handoff::engine_ids(&backend.client, &prefill, timeout).await?;
                let h = kv_handoff::mooncake(&prefill, &ids, &ctx.request_id);
                pcall.kv_params = Some(h.prefill.to_string());
                pcall.dp_rank = h.rank.or(pcall.dp_rank);
                one.kv_params = Some(h.decode.to_string());
                let keep = plan.logprobs.input_from.is_some();
                Some(spawn_prefill(core, prefill, holds, pcall, deadline, keep))
            } else {
                if nixl {
                    pcall.kv_params = Some(kv_handoff::nixl_prefill_params().to_string());
                }
                let url = prefill.url().to_owned();
                let mut leg = spawn_prefill(core, prefill, holds, pcall, deadline, true);
                leg.outcome().await?;
                if nixl {
                    let text = leg.kept_mut().and_then(|k| k.kv_params.take());
                    one.kv_params = kv_handoff::returned_params_text(text, &url)?;
                    core.metrics.kv_handoff(match one.kv_params {
                        Some(_) => KvHandoff::Relayed,
                        None => KvHandoff::Recomputed,
                    });
                }
                Some(leg)
            }
        }
        _ => {
            drop(holds);
            core.metrics.kv_handoff(KvHandoff::Skipped);
            None
        }
    };
    let decode_start = answer::start(
        Leg::Decode,
        &decode,
        Legs::start(dch, dcalls),
        deadline,
        &core.registry,
    );
    let stream = match leg.as_mut() {
        Some(leg) => {
            tokio::pin!(decode_start);
            leg.beside(&mut decode_start).await?.0?
        }
        None => decode_start.await?,
    };
    let src = Source {
        worker: decode,
        stream,
        load: decode_load,
        leg,
    };
    answer::answer(core, ctx, grpc, request_id, src, deadline).await
}
