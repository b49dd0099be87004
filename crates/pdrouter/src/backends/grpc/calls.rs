//! What every attempt does to a request's `Generate` calls, in PD and regular mode alike:
//! the worker's runtime (known from the health checks, learned here when they are off), what
//! that runtime cannot serve refused with 501, the unset sampling fields filled from the
//! worker's reported defaults, and fresh request ids, so an `Abort` of a failed attempt never
//! hits its retry.

use crate::core::RequestCtx;
use crate::error::{ApiError, Leg};
use crate::grpc::runtime::{Call, Runtime};
use crate::grpc::translate::Plan;
use crate::registry::Worker;

/// `status` on `leg` to `url` as the client's error.
pub(super) fn status_error(leg: Leg, url: &str, status: &tonic::Status) -> ApiError {
    ApiError::grpc_status(leg, url, status.code(), status.message())
}

/// `worker`'s gRPC channel.
pub(super) fn channel(
    worker: &Worker,
    leg: Leg,
) -> Result<&crate::grpc::client::WorkerChannel, ApiError> {
    worker.grpc().ok_or_else(|| {
        ApiError::internal(format!("a gRPC {} worker without a channel", leg.as_str()))
    })
}

/// The runtime `worker` speaks, asked within `timeout` when not known yet.
pub(super) async fn runtime(
    worker: &Worker,
    leg: Leg,
    timeout: std::time::Duration,
) -> Result<Runtime, ApiError> {
    channel(worker, leg)?
        .detect(timeout)
        .await
        .map_err(|s| status_error(leg, worker.url(), &s))
}

/// Refuses what `runtime` cannot serve of `plan` (501 naming it).
pub(super) fn check(plan: &Plan, runtime: Runtime) -> Result<(), ApiError> {
    if plan.logprobs.input_from.is_some() && !runtime.serves_prompt_logprobs() {
        return Err(crate::grpc::translate::unsupported_on(
            "prompt logprobs (logprob_start_len)",
            runtime,
        ));
    }
    if runtime == Runtime::Vllm && !crate::grpc::vllm::seed_fits(plan.seed) {
        return Err(ApiError::invalid_field(
            "seed",
            "must be below 2^31 for vLLM workers (their seed is an int32)",
        ));
    }
    if runtime == Runtime::Vllm
        && let Some(field) = plan
            .requests
            .iter()
            .find_map(crate::grpc::vllm::unsupported)
    {
        return Err(crate::grpc::translate::unsupported_on(field, runtime));
    }
    Ok(())
}

/// The calls of one attempt, one per prompt, for a worker of `runtime` whose reported
/// sampling defaults are `defaults_of`'s, each named after the client's request id and
/// `tag` (a value fresh per attempt): `{id}-{tag:x}` for a single prompt, with `-{i}` appended
/// per prompt when there are several. Returns the calls and the answer's id (`{id}-{tag:x}`).
pub(super) fn calls(
    plan: &Plan,
    runtime: Runtime,
    defaults_of: &Worker,
    ctx: &RequestCtx,
    tag: u64,
) -> (Vec<Call>, String) {
    // Borrowed from the worker's model entry: the defaults are read, not copied, per request.
    let model = defaults_of.model();
    let none = serde_json::Map::new();
    let defaults = model.as_ref().map_or(&none, |m| &m.sampling_defaults);
    let mut calls = plan.calls(runtime, defaults);
    let base = format!("{}-{tag:x}", ctx.request_id);
    let several = calls.len() > 1;
    for (i, call) in calls.iter_mut().enumerate() {
        call.req.request_id = if several {
            format!("{base}-{i}")
        } else {
            base.clone()
        };
    }
    (calls, base)
}

/// Routes `calls` to `worker`'s DP rank (a DP-aware pool lists one entry per rank).
pub(super) fn on_rank(calls: &mut [Call], worker: &Worker) {
    for c in calls {
        c.dp_rank = worker.dp_rank();
    }
}
