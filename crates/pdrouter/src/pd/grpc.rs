//! The gRPC half of a PD attempt: after the pair selection and admission that HTTP PD uses
//! too (`Dispatcher::pd_attempt`), one `GenerateRequest` per prompt is sent to both workers
//! at once, each prompt with its own ticket. In EPD a request with images first starts one
//! `Encode` per image item (`grpc::encode`), and its Prefill carries each item's encode ticket.
//!
//! Invariants, as for HTTP PD: the Prefill streams are started and drained by their own task
//! ([`PrefillLeg`]) that owns the admission permit and the Prefill load and drops them at
//! Prefill stream end, error or cancellation — or once Decode has the whole answer (the KV has
//! moved), the streams then getting the grace to end on their own, counted like HTTP's. Decode
//! load lives in the answer (`grpc::answer`). Every `Generate` stream is a `LegStream` (read
//! per leg through `Legs`), which sends `Abort` when it is dropped unfinished: a failed start
//! of one leg aborts the other, and a client disconnect (the body dropped) aborts both. Only
//! Decode's tokens reach the client; Prefill contributes only the prompt logprobs, placed
//! ahead of Decode's.

use std::future::poll_fn;

use axum::response::Response;
use pdrouter_proto::scheduler::generate_response::Response as Msg;
use tokio::time::Instant;

use super::{Holds, PrefillLeg};
use crate::dispatch::{Dispatcher, RequestCtx, worker_ok};
use crate::error::{ApiError, Leg};
use crate::grpc::answer::{self, GrpcPlan, Source, status_error};
use crate::grpc::client::Legs;
use crate::grpc::output::{self, InputLogprob};
use crate::grpc::runtime::{Call, KvTicket};

impl Dispatcher {
    /// The gRPC half of a PD attempt, once the pair is chosen (see `pd_attempt`).
    pub(crate) async fn grpc_pd_send(
        &self,
        ctx: &RequestCtx,
        grpc: &GrpcPlan,
        holds: Holds,
    ) -> Result<Response, ApiError> {
        let plan = grpc.plan.clone();
        let (prefill, decode) = (holds.prefill, holds.decode);
        let Some(dch) = decode.grpc() else {
            return Err(ApiError::internal("a gRPC Decode worker without a channel"));
        };
        let Some(pch) = prefill.grpc() else {
            return Err(ApiError::internal(
                "a gRPC Prefill worker without a channel",
            ));
        };
        // Known from the health checks, so selection already paired the Decode worker with
        // the Prefill's runtime; learned here when health checks are off.
        let timeout = self.cfg.health.timeout;
        let runtime = pch
            .detect(timeout)
            .await
            .map_err(|s| status_error(Leg::Prefill, prefill.url(), &s))?;
        let decode_runtime = dch
            .detect(timeout)
            .await
            .map_err(|s| status_error(Leg::Decode, decode.url(), &s))?;
        if runtime != decode_runtime {
            return Err(ApiError::not_implemented(format!(
                "Prefill worker {} speaks {runtime} and Decode worker {} speaks \
                 {decode_runtime}; a PD pair must share one runtime",
                prefill.url(),
                decode.url()
            )));
        }
        if plan.logprobs.input_from.is_some() && !runtime.serves_prompt_logprobs() {
            return Err(crate::grpc::translate::unsupported_on(
                "prompt logprobs (logprob_start_len)",
                runtime,
            ));
        }
        if plan.images.is_some() && runtime != crate::grpc::runtime::Runtime::TokenSpeed {
            return Err(ApiError::not_implemented(format!(
                "image inputs need TokenSpeed workers; Prefill worker {} speaks {runtime}",
                prefill.url()
            )));
        }
        let defaults = decode
            .model()
            .map(|m| m.sampling_defaults.clone())
            .unwrap_or_default();
        let mut calls = plan.calls(runtime, &defaults);
        // The answer's id: the first prompt's request id, the only one for a single prompt.
        let mut request_id = String::new();
        let several = calls.len() > 1;
        for (i, call) in calls.iter_mut().enumerate() {
            let ticket =
                KvTicket::fresh(prefill.bootstrap_host(), prefill.bootstrap_port(), runtime);
            let room = ticket.room;
            call.req.request_id = if several {
                format!("{}-{room:x}-{i}", ctx.request_id)
            } else {
                format!("{}-{room:x}", ctx.request_id)
            };
            if i == 0 {
                request_id = format!("{}-{room:x}", ctx.request_id);
            }
            call.kv = Some(ticket);
        }
        // EPD: each image item goes to its Encode worker now; the Prefill is told where each
        // embedding comes from, the Decode only what the items are.
        let encode = match &plan.images {
            Some(images) => {
                self.start_encodes(&ctx.request_id, images, self.cfg.request_timeout)?
            }
            None => Vec::new(),
        };
        // A DP-aware pool routes each leg to its own worker entry's rank.
        let mut dcalls = calls.clone();
        for c in &mut calls {
            c.dp_rank = prefill.dp_rank();
            c.images.encode.clone_from(&encode);
        }
        for c in &mut dcalls {
            c.dp_rank = decode.dp_rank();
        }
        for (p, d) in calls.iter_mut().zip(dcalls.iter_mut()) {
            Call::share_encoding(p, d);
        }
        let reqs = calls;
        let dreqs = dcalls;
        let started = Instant::now();
        let deadline = crate::config::deadline_after(started, self.cfg.request_timeout);
        let (outcome_tx, outcome) = tokio::sync::oneshot::channel();
        let (decode_done_tx, mut decode_done) = tokio::sync::oneshot::channel::<()>();
        // Prefill's prompt logprobs, per prompt, when the client asked for them.
        let (input_tx, input_rx) = tokio::sync::oneshot::channel::<Vec<Vec<InputLogprob>>>();
        let want_input = plan.logprobs.input_from.is_some();
        let prompts = plan.requests.len();
        // Both legs start at once. The Prefill leg task starts its own streams, so its slot
        // goes with the Prefill streams' end however long Decode takes to start; its failed
        // start (its outcome) ends the attempt and drops the Decode calls (Abort).
        let leg_task = {
            let registry = self.registry.clone();
            let metrics = self.metrics.clone();
            let worker = prefill.clone();
            let grace = self.cfg.prefill_grace_after_decode;
            let (permit, load) = (holds.permit, holds.prefill_load);
            async move {
                let url = worker.url().to_owned();
                let timed_out = || ApiError::upstream_timeout(Leg::Prefill, &url);
                let Some(pch) = worker.grpc() else {
                    let e = ApiError::internal("a gRPC Prefill worker without a channel");
                    let _ = outcome_tx.send(Err(e));
                    return;
                };
                let mut p = match tokio::time::timeout_at(deadline, Legs::start(pch, reqs)).await {
                    Ok(Ok(p)) => p,
                    failed => {
                        let e = match failed {
                            Ok(Err(s)) => status_error(Leg::Prefill, &url, &s),
                            _ => timed_out(),
                        };
                        tracing::warn!(code = e.code, "gRPC Prefill failed to start");
                        crate::sizing::release(permit, &Err::<(), _>(e.clone()));
                        drop(load);
                        let _ = outcome_tx.send(Err(e.clone()));
                        registry.record_outcome(&worker, false);
                        return;
                    }
                };
                let mut inputs: Vec<Option<Vec<InputLogprob>>> = vec![None; prompts];
                let ended = {
                    let drain = async {
                        loop {
                            let (i, m) = match p.next().await {
                                Ok(Some(m)) => m,
                                Ok(None) => return Ok(()),
                                Err(s) => return Err(status_error(Leg::Prefill, &url, &s)),
                            };
                            let lps = match &m.response {
                                Some(Msg::Error(e)) => {
                                    return Err(output::engine_error(Leg::Prefill, &url, e));
                                }
                                Some(Msg::Chunk(c)) => c.input_logprobs.as_ref(),
                                Some(Msg::Complete(c)) => c.input_logprobs.as_ref(),
                                None => None,
                            };
                            // The first report of a prompt's logprobs is kept (every sample
                            // repeats it, and the `Complete` repeats the first chunk's).
                            if want_input
                                && let (Some(l), Some(slot @ None)) = (lps, inputs.get_mut(i))
                            {
                                *slot = Some(output::input_logprobs(l));
                            }
                        }
                    };
                    let drain = async {
                        tokio::time::timeout_at(deadline, drain)
                            .await
                            .unwrap_or_else(|_| Err(timed_out()))
                    };
                    tokio::pin!(drain);
                    tokio::select! {
                        // Decode first: a leg that outlived Decode is counted however soon
                        // it ends.
                        biased;
                        // A dropped sender (the request torn down) disables this branch.
                        Ok(()) = &mut decode_done => {
                            // The KV has moved: the slot and load go now; the streams get
                            // the grace to end (prompt logprobs, when asked for, follow
                            // on their own channel when they do).
                            crate::sizing::release(permit, &Ok::<(), ApiError>(()));
                            drop(load);
                            let _ = outcome_tx.send(Ok(None));
                            super::drain_after_decode(&mut drain, grace, &metrics).await
                        }
                        // The release point: the slot and the load go with the Prefill
                        // streams' end, their failure, or (the task aborted) cancellation.
                        r = &mut drain => {
                            crate::sizing::release(permit, &r);
                            drop(load);
                            // gRPC prompt logprobs travel on their own channel.
                            let _ = outcome_tx.send(r.clone().map(|()| None));
                            Some(r)
                        }
                    }
                };
                drop(p);
                if want_input {
                    let _ =
                        input_tx.send(inputs.into_iter().map(Option::unwrap_or_default).collect());
                }
                // Not charged when aborted after Decode was done: the worker had answered
                // and the KV had moved.
                if let Some(result) = ended {
                    metrics.prefill_duration(started.elapsed());
                    registry.record_outcome(&worker, worker_ok(&result));
                }
            }
        };
        let mut leg = PrefillLeg {
            handle: Some(tokio::spawn(tracing::Instrument::instrument(
                leg_task,
                crate::telemetry::leg_span(Leg::Prefill, prefill.url()),
            ))),
            outcome: Some(outcome),
            decode_done: Some(decode_done_tx),
            logprobs: None,
        };
        let d = {
            let decode_start = tracing::Instrument::instrument(
                answer::start(
                    Leg::Decode,
                    &decode,
                    Legs::start(dch, dreqs),
                    deadline,
                    &self.registry,
                ),
                crate::telemetry::leg_span(Leg::Decode, decode.url()),
            );
            tokio::pin!(decode_start);
            tokio::select! {
                d = &mut decode_start => d?,
                outcome = poll_fn(|cx| leg.poll_outcome(cx)) => {
                    outcome?;
                    decode_start.await?
                }
            }
        };
        let src = Source {
            worker: decode,
            stream: d,
            load: holds.decode_load,
            leg: Some(leg),
            input: want_input.then_some(input_rx),
        };
        self.grpc_answer(ctx, grpc, request_id, src, deadline).await
    }
}
