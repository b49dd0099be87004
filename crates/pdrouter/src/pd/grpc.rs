//! The gRPC half of a PD attempt: after the pair selection and admission that HTTP PD uses
//! too (`Dispatcher::pd_attempt`), one `GenerateRequest` per prompt is sent to both workers
//! at once, each prompt with its own ticket.
//!
//! Invariants, as for HTTP PD: the Prefill stream is drained by its own task ([`PrefillLeg`])
//! that owns the admission permit and the Prefill load and drops them at Prefill stream end,
//! error or cancellation; Decode load lives in the response (the SSE body, or until the whole
//! answer is built). Every `Generate` stream is a `LegStream` (read per leg through [`Legs`]),
//! which sends `Abort` when it is dropped unfinished: a failed start of one leg aborts the
//! other, and a client disconnect (the body dropped) aborts both. Only Decode's tokens reach
//! the client; Prefill contributes only the prompt logprobs, placed ahead of Decode's.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use pdrouter_proto::scheduler::DisaggregatedParams;
use pdrouter_proto::scheduler::generate_response::Response as Msg;
use pdrouter_tokenizer::Tokenizer;
use tokio::time::Instant;

use super::{Holds, PrefillLeg};
use crate::dispatch::{Dispatcher, RequestCtx, worker_ok};
use crate::error::{ApiError, Leg};
use crate::grpc::client::Legs;
use crate::grpc::output::{self, Delta, InputLogprob, Output};
use crate::grpc::translate::{self, Answer, Events, Plan};
use crate::registry::{LoadGuard, Worker};
use crate::request::ParsedRequest;

/// Largest bootstrap room (rooms are uniform in `[0, 2^31)`).
const MAX_ROOM: i32 = i32::MAX;

fn status_error(leg: Leg, url: &str, s: &tonic::Status) -> ApiError {
    ApiError::grpc_status(leg, url, s.code(), s.message())
}

/// A request translated for gRPC workers, with the tokenizer that detokenizes its answer.
#[derive(Debug)]
pub(crate) struct GrpcPlan {
    plan: Arc<Plan>,
    tokenizer: Arc<Tokenizer>,
}

impl GrpcPlan {
    /// The prompts' lengths as the tokenizer counted them, summed, times the samples per
    /// prompt (each sample is prefilled), as the HTTP estimate counts them.
    pub(crate) fn prompt_tokens(&self) -> u64 {
        let prompts: u64 = self.plan.prompt_tokens.iter().map(|&t| u64::from(t)).sum();
        prompts.saturating_mul(self.plan.n as u64).max(1)
    }
}

impl Dispatcher {
    /// Translates `req` once for every attempt.
    pub(crate) async fn grpc_plan(&self, req: &ParsedRequest) -> Result<Box<GrpcPlan>, ApiError> {
        let Some(t) = &self.tokenizer else {
            return Err(ApiError::internal("gRPC PD mode without a tokenizer"));
        };
        let plan = translate::plan(req, &t.tokenizer).await?;
        Ok(Box::new(GrpcPlan {
            plan: Arc::new(plan),
            tokenizer: t.tokenizer.clone(),
        }))
    }

    /// The gRPC half of a PD attempt, once the pair is chosen (see `pd_attempt`).
    pub(crate) async fn grpc_pd_send(
        &self,
        ctx: &RequestCtx,
        grpc: &GrpcPlan,
        holds: Holds,
    ) -> Result<Response, ApiError> {
        let (plan, tokenizer) = (grpc.plan.clone(), grpc.tokenizer.clone());
        let (prefill, decode) = (holds.prefill, holds.decode);
        let (Some(pch), Some(dch)) = (prefill.grpc(), decode.grpc()) else {
            return Err(ApiError::internal("a gRPC PD pair without gRPC channels"));
        };
        let defaults = decode
            .model()
            .map(|m| m.sampling_defaults.clone())
            .unwrap_or_default();
        let mut reqs = plan.requests_with(&defaults);
        // The answer's id: the first prompt's request id, the only one for a single prompt.
        let mut request_id = String::new();
        let several = reqs.len() > 1;
        for (i, greq) in reqs.iter_mut().enumerate() {
            let room = rand::random_range(0..=MAX_ROOM);
            greq.request_id = if several {
                format!("{}-{room:x}-{i}", ctx.request_id)
            } else {
                format!("{}-{room:x}", ctx.request_id)
            };
            if i == 0 {
                request_id = format!("{}-{room:x}", ctx.request_id);
            }
            greq.disaggregated_params = Some(DisaggregatedParams {
                bootstrap_host: prefill.bootstrap_host().to_owned(),
                bootstrap_port: prefill.bootstrap_port().map_or(0, i32::from),
                bootstrap_room: room,
            });
        }
        let timeout = self.cfg.request_timeout;
        let deadline = crate::config::deadline_after(Instant::now(), timeout);
        let started = Instant::now();
        // A leg that fails to start is charged to its worker and ends the attempt at once:
        // the other leg's calls are dropped, which aborts them.
        let start = |leg: Leg, w: &Arc<Worker>, out| {
            let (w, registry) = (w.clone(), self.registry.clone());
            async move {
                let r = match tokio::time::timeout_at(deadline, out).await {
                    Ok(Ok(s)) => Ok(s),
                    Ok(Err(s)) => Err(status_error(leg, w.url(), &s)),
                    Err(_) => Err(ApiError::upstream_timeout(leg, w.url())),
                };
                if let Err(e) = &r {
                    registry.record_outcome(&w, worker_ok(&r));
                    tracing::warn!(
                        code = e.code,
                        leg = leg.as_str(),
                        "gRPC leg failed to start"
                    );
                }
                r
            }
        };
        let prefill_span = crate::telemetry::leg_span(Leg::Prefill, prefill.url());
        let (mut p, mut d): (Legs, Legs) = tokio::try_join!(
            tracing::Instrument::instrument(
                start(Leg::Prefill, &prefill, Legs::start(pch, reqs.clone())),
                prefill_span.clone(),
            ),
            tracing::Instrument::instrument(
                start(Leg::Decode, &decode, Legs::start(dch, reqs)),
                crate::telemetry::leg_span(Leg::Decode, decode.url()),
            ),
        )?;
        let (outcome_tx, outcome) = tokio::sync::oneshot::channel();
        // Prefill's prompt logprobs, per prompt, when the client asked for them.
        let (input_tx, input_rx) = tokio::sync::oneshot::channel::<Vec<Vec<InputLogprob>>>();
        let want_input = plan.logprobs.input_from.is_some();
        let prompts = plan.requests.len();
        let leg_task = {
            let registry = self.registry.clone();
            let metrics = self.metrics.clone();
            let worker = prefill.clone();
            async move {
                let url = worker.url().to_owned();
                let mut inputs: Vec<Option<Vec<InputLogprob>>> = vec![None; prompts];
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
                        if want_input && let (Some(l), Some(slot @ None)) = (lps, inputs.get_mut(i))
                        {
                            *slot = Some(output::input_logprobs(l));
                        }
                    }
                };
                let result = match tokio::time::timeout_at(deadline, drain).await {
                    Ok(r) => r,
                    Err(_) => Err(ApiError::upstream_timeout(Leg::Prefill, &url)),
                };
                // The release point: the slot and the load go with the Prefill streams' end,
                // their failure, or (the task aborted) their cancellation.
                drop(p);
                drop(holds.permit);
                drop(holds.prefill_load);
                if want_input {
                    let _ =
                        input_tx.send(inputs.into_iter().map(Option::unwrap_or_default).collect());
                }
                // gRPC prompt logprobs travel on their own channel (token ids, not JSON).
                let _ = outcome_tx.send(result.clone().map(|()| None));
                metrics.prefill_duration(started.elapsed());
                registry.record_outcome(&worker, worker_ok(&result));
            }
        };
        // No `decode_done` signal: a gRPC Prefill stream ends on its own right after the
        // hand-over, and one still open when the answer is done is aborted with the answer.
        let mut leg = PrefillLeg {
            handle: Some(tokio::spawn(tracing::Instrument::instrument(
                leg_task,
                prefill_span,
            ))),
            outcome: Some(outcome),
            decode_done: None,
            logprobs: None,
        };

        // The response head waits for Decode's first message, so a failure before it (of
        // either leg) is answered with its real status and may be retried.
        let url = decode.url().to_owned();
        let mut out = Output::new(tokenizer, &plan);
        let first = async {
            tokio::select! {
                m = d.next() => m,
                outcome = poll_fn(|cx| leg.poll_outcome(cx)) => {
                    outcome?;
                    d.next().await
                }
            }
            .map_err(|s| status_error(Leg::Decode, &url, &s))
        };
        let first = match tokio::time::timeout_at(deadline, first).await {
            Ok(r) => r,
            Err(_) => Err(ApiError::upstream_timeout(Leg::Decode, &url)),
        };
        let first = first.and_then(|m| match m {
            Some((i, m)) => out.absorb(i, m, &url).map(|d| vec![d]),
            None => out.eof(&url),
        });
        self.registry.record_outcome(&decode, worker_ok(&first));
        let first = first?;
        // Decode's first message carries its first token: the time to first token.
        self.metrics.ttft(ctx.started.elapsed());
        let model = match plan.model.as_str() {
            "" => decode.model().map(|m| m.id.clone()).unwrap_or_default(),
            named => named.to_owned(),
        };
        let state = Relay {
            plan,
            model,
            id: request_id,
            out,
            d,
            leg: Some(leg),
            input: want_input.then_some(input_rx),
            url,
            deadline,
            _decode_load: holds.decode_load,
        };
        if state.plan.stream {
            Ok(state.into_sse(first))
        } else {
            state.into_full().await
        }
    }
}

/// Everything an answer holds while it is produced; dropping it aborts the legs still running
/// and releases the Decode load.
struct Relay {
    plan: Arc<Plan>,
    /// The model named in the answer.
    model: String,
    id: String,
    out: Output,
    d: Legs,
    leg: Option<PrefillLeg>,
    /// Prefill's prompt logprobs, when asked for.
    input: Option<tokio::sync::oneshot::Receiver<Vec<Vec<InputLogprob>>>>,
    url: String,
    deadline: Instant,
    _decode_load: LoadGuard,
}

impl Relay {
    /// What the next Decode message added, or `None` once every choice ended. A Prefill
    /// failure while Decode is still running ends the answer with that error.
    async fn next_deltas(&mut self) -> Option<Result<Vec<Delta>, ApiError>> {
        if self.out.done() {
            return None;
        }
        let msg = loop {
            let next = async {
                match self.leg.as_mut() {
                    Some(leg) => tokio::select! {
                        m = self.d.next() => Ok(Some(m)),
                        outcome = poll_fn(|cx| leg.poll_outcome(cx)) => outcome.map(|()| None),
                    },
                    None => Ok(Some(self.d.next().await)),
                }
            };
            match tokio::time::timeout_at(self.deadline, next).await {
                Err(_) => return Some(Err(ApiError::upstream_timeout(Leg::Decode, &self.url))),
                Ok(Err(e)) => return Some(Err(e)),
                Ok(Ok(None)) => self.leg = None,
                Ok(Ok(Some(m))) => break m,
            }
        };
        Some(match msg {
            Ok(Some((i, m))) => self.out.absorb(i, m, &self.url).map(|d| vec![d]),
            Ok(None) => self.out.eof(&self.url),
            Err(s) => Err(status_error(Leg::Decode, &self.url, &s)),
        })
    }

    /// After Decode: waits for Prefill (real engines finish Decode only after Prefill did,
    /// so this costs nothing) and puts its prompt logprobs ahead of Decode's. A Prefill
    /// failure surfaces as its status.
    async fn finish_prefill(&mut self) -> Result<(), ApiError> {
        if let Some(mut leg) = self.leg.take() {
            poll_fn(|cx| leg.poll_outcome(cx)).await?;
        }
        if let Some(rx) = self.input.take()
            && let Ok(inputs) = rx.await
        {
            for (i, lps) in inputs.into_iter().enumerate() {
                self.out.prepend_input_logprobs(i, lps);
            }
        }
        Ok(())
    }

    fn answer(&self, created: u64) -> Answer<'_> {
        Answer {
            plan: &self.plan,
            model: &self.model,
            id: &self.id,
            out: &self.out,
            created,
        }
    }

    async fn into_full(mut self) -> Result<Response, ApiError> {
        while let Some(deltas) = self.next_deltas().await {
            deltas?;
        }
        self.finish_prefill().await?;
        let body = translate::full_body(&self.answer(translate::now()));
        let mut resp = Response::new(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok(resp)
    }

    fn into_sse(self, first: Vec<Delta>) -> Response {
        let mut events = Events::new();
        let queue: VecDeque<Bytes> = events.start(&self.answer(events.created)).into();
        let state = (self, events, queue, Some(first), false);
        let stream = futures_util::stream::unfold(
            state,
            |(mut relay, mut events, mut queue, mut first, mut done)| async move {
                loop {
                    if let Some(b) = queue.pop_front() {
                        return Some((
                            Ok::<_, std::convert::Infallible>(b),
                            (relay, events, queue, first, done),
                        ));
                    }
                    if done {
                        return None;
                    }
                    let deltas = match first.take() {
                        Some(f) => Some(Ok(f)),
                        None => relay.next_deltas().await,
                    };
                    let created = events.created;
                    let deltas = match deltas {
                        Some(Ok(deltas)) => deltas,
                        Some(Err(e)) => {
                            queue.push_back(events.error(&relay.answer(created), &e));
                            done = true;
                            continue;
                        }
                        None => Vec::new(),
                    };
                    // Prefill's prompt logprobs, when asked for, are in before the last
                    // events; otherwise a Prefill stream still open is aborted with the answer.
                    if relay.out.done() {
                        done = true;
                        if relay.input.is_some()
                            && let Err(e) = relay.finish_prefill().await
                        {
                            queue.push_back(events.error(&relay.answer(created), &e));
                            continue;
                        }
                    }
                    let answer = relay.answer(created);
                    for d in &deltas {
                        queue.extend(events.delta(&answer, d));
                    }
                    if done {
                        queue.extend(events.end(&answer));
                    }
                }
            },
        );
        let mut resp = Response::new(Body::from_stream(stream));
        let h = resp.headers_mut();
        h.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("text/event-stream"),
        );
        h.insert(
            http::header::CACHE_CONTROL,
            http::HeaderValue::from_static("no-cache"),
        );
        resp
    }
}
