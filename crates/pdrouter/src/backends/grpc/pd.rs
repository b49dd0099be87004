//! gRPC PD: once the core has picked and admitted the pair, one `Generate` per prompt goes to
//! both workers at once, each prompt with its own KV ticket and each leg its worker's DP
//! rank. In EPD a request with images first starts one `Encode` per image item
//! ([`super::encode`]), and its Prefill carries each item's encode ticket.
//!
//! The Prefill streams are the core's leg task's ([`crate::core::leg`]): started and drained
//! there, so the slot goes with their end however long Decode takes to start. Decode's
//! streams go to the answer ([`super::answer`]). Every `Generate` stream sends `Abort` when it
//! is dropped unfinished: a failed start of one leg aborts the other, and a client disconnect
//! (the body dropped) aborts both. Only Decode's tokens reach the client; the Prefill
//! contributes only the prompt logprobs, placed ahead of Decode's.
//!
//! A pair of vLLM workers is [`super::vllm`]'s: its KV handoff has no ticket, and its
//! connector decides the order of the legs.

use axum::response::Response;
use tokio::time::Instant;

use super::answer::{self, GrpcPlan, Source};
use super::calls::{self, channel, status_error};
use super::encode::EncodeCalls;
use super::prefill::GrpcPrefill;
use super::{GrpcBackend, PrefillLeg};
use crate::core::leg::{self, LegJob, PrefillHolds};
use crate::core::{Core, Pair, RequestCtx};
use crate::error::{ApiError, Leg};
use crate::grpc::client::Legs;
use crate::grpc::runtime::{Call, KvTicket, Runtime};
use crate::grpc::translate::Plan;
use crate::registry::Worker;

/// The runtime both workers of a pair speak; a pair must share one (the same KV hand-over).
async fn pair_runtime(core: &Core, prefill: &Worker, decode: &Worker) -> Result<Runtime, ApiError> {
    let timeout = core.cfg.health.timeout;
    let runtime = calls::runtime(prefill, Leg::Prefill, timeout).await?;
    let decode_runtime = calls::runtime(decode, Leg::Decode, timeout).await?;
    if runtime != decode_runtime {
        return Err(ApiError::not_implemented(format!(
            "Prefill worker {} speaks {runtime} and Decode worker {} speaks \
             {decode_runtime}; a PD pair must share one runtime",
            prefill.url(),
            decode.url()
        )));
    }
    Ok(runtime)
}

/// Both legs' calls of one attempt and the answer's id: one ticket per prompt (the first
/// one's room names the attempt), each leg on its worker's DP rank; in EPD each image item's
/// `Encode` started and its ticket on the Prefill's calls.
fn pair_calls(
    backend: &GrpcBackend,
    core: &Core,
    ctx: &RequestCtx,
    plan: &Plan,
    runtime: Runtime,
    prefill: &Worker,
    decode: &Worker,
) -> Result<(Vec<Call>, Vec<Call>, String, EncodeCalls), ApiError> {
    let tickets: Vec<KvTicket> = plan
        .requests
        .iter()
        .map(|_| KvTicket::fresh(prefill.bootstrap_host(), prefill.bootstrap_port(), runtime))
        .collect();
    let tag = tickets.first().map_or(0, |t| t.room);
    let (mut pcalls, request_id) = calls::calls(plan, runtime, decode, ctx, tag);
    for (call, ticket) in pcalls.iter_mut().zip(tickets) {
        call.kv = Some(ticket);
    }
    // EPD: the Prefill is told where each embedding comes from, the Decode only what the
    // items are.
    let (encode, encodes) = match &plan.images {
        Some(images) => {
            backend.start_encodes(core, &ctx.request_id, images, core.cfg.request_timeout)?
        }
        None => (Vec::new(), EncodeCalls::default()),
    };
    let mut dcalls = pcalls.clone();
    calls::on_rank(&mut pcalls, prefill);
    calls::on_rank(&mut dcalls, decode);
    for c in &mut pcalls {
        c.images.encode.clone_from(&encode);
    }
    for (p, d) in pcalls.iter_mut().zip(dcalls.iter_mut()) {
        Call::share_encoding(p, d);
    }
    Ok((pcalls, dcalls, request_id, encodes))
}

/// Sends both legs to `pair` and builds the answer from Decode's streams.
pub(super) async fn send(
    backend: &GrpcBackend,
    core: &Core,
    ctx: &RequestCtx,
    grpc: &GrpcPlan,
    pair: Pair,
) -> Result<Response, ApiError> {
    let plan = grpc.plan.clone();
    let runtime = pair_runtime(core, &pair.prefill, &pair.decode).await?;
    calls::check(&plan, runtime)?;
    if plan.images.is_some() && runtime != Runtime::TokenSpeed {
        return Err(ApiError::not_implemented(format!(
            "image inputs need TokenSpeed workers; Prefill worker {} speaks {runtime}",
            pair.prefill.url()
        )));
    }
    if runtime == Runtime::Vllm {
        // Boxed: its state stays out of the future of every other pair's request.
        return Box::pin(super::vllm::send(backend, core, ctx, grpc, pair)).await;
    }
    let Pair {
        prefill,
        permit,
        prefill_load,
        decode,
        decode_load,
    } = pair;
    let dch = channel(&decode, Leg::Decode)?;
    let (pcalls, dcalls, request_id, encodes) =
        pair_calls(backend, core, ctx, &plan, runtime, &prefill, &decode)?;
    let deadline = crate::config::deadline_after(Instant::now(), core.cfg.request_timeout);
    let keep = plan.logprobs.input_from.is_some();
    let start = {
        let worker = prefill.clone();
        let prompts = plan.requests.len();
        move || async move {
            let streams = Legs::start(channel(&worker, Leg::Prefill)?, pcalls)
                .await
                .map_err(|s| status_error(Leg::Prefill, worker.url(), &s))?;
            Ok(GrpcPrefill {
                streams,
                worker,
                prompts,
                _encodes: encodes,
            })
        }
    };
    let job = LegJob::new(
        core,
        prefill,
        PrefillHolds::new(permit, prefill_load),
        deadline,
        keep,
    );
    let mut leg: PrefillLeg = leg::spawn(start, job);
    let stream = {
        let decode_start = answer::start(
            Leg::Decode,
            &decode,
            Legs::start(dch, dcalls),
            deadline,
            &core.registry,
        );
        // Pinned here, not moved into `beside`. A Prefill failure first ends the attempt
        // and drops the Decode calls (Abort).
        tokio::pin!(decode_start);
        leg.beside(&mut decode_start).await?.0
    };
    let src = Source {
        worker: decode,
        stream: stream?,
        load: decode_load,
        leg: Some(leg),
    };
    answer::answer(core, ctx, grpc, request_id, src, deadline).await
}
