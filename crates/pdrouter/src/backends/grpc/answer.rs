//! A worker's `Generate` streams turned into the client's answer, for every gRPC path (PD,
//! where the streams are Decode's, and regular mode): the request translated once
//! ([`GrpcPlan`]), and the answer as one JSON body or as SSE ([`answer`]).
//!
//! Invariants: the response head waits for the streams' first message, so a failure before
//! it is answered with its real status and may be retried; the answer ([`Relay`]) owns the
//! streams, the answering worker's load and (PD) the Prefill leg, so dropping it — a client
//! disconnect — aborts what still runs and releases the load. Once Decode has the whole
//! answer, the Prefill leg is told so: it frees its slot and gets the grace to end.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use pdrouter_tokenizer::Tokenizer;
use tokio::time::Instant;

use super::PrefillLeg;
use super::calls::status_error;
use crate::core::{Core, RequestCtx, worker_ok};
use crate::error::{ApiError, Leg};
use crate::grpc::client::Legs;
use crate::grpc::output::{Delta, InputLogprob, Output};
use crate::grpc::translate::{self, Answer, Events, Plan};
use crate::registry::{LoadGuard, Worker};

/// A request translated for gRPC workers, with the tokenizer that detokenizes its answer.
#[derive(Debug)]
pub(crate) struct GrpcPlan {
    pub(crate) plan: Arc<Plan>,
    tokenizer: Arc<Tokenizer>,
}

impl GrpcPlan {
    pub(crate) fn new(plan: Arc<Plan>, tokenizer: Arc<Tokenizer>) -> Self {
        GrpcPlan { plan, tokenizer }
    }

    /// The prompts' lengths as the tokenizer counted them, summed, times the samples per
    /// prompt (each sample is prefilled), as the HTTP estimate counts them.
    pub(crate) fn prompt_tokens(&self) -> u64 {
        let prompts: u64 = self.plan.prompt_tokens.iter().map(|&t| u64::from(t)).sum();
        prompts.saturating_mul(self.plan.n as u64).max(1)
    }
}

/// Turns `src`'s streams into the client's answer. Waits for their first message, so a
/// failure before it (of the streams, or of the Prefill leg) is returned as an error; the
/// answering worker is charged with its own outcome.
pub(super) async fn answer(
    core: &Core,
    ctx: &RequestCtx,
    grpc: &GrpcPlan,
    request_id: String,
    src: Source,
    deadline: Instant,
) -> Result<Response, ApiError> {
    let Source {
        worker,
        mut stream,
        load,
        mut leg,
    } = src;
    let plan = grpc.plan.clone();
    let url = worker.url().to_owned();
    let pd = leg.is_some();
    let kind = if pd { Leg::Decode } else { Leg::Worker };
    let mut out = Output::new(grpc.tokenizer.clone(), &plan);
    // A Prefill failure is the Prefill leg's to charge, not this worker's.
    let mut prefill_failed = false;
    let first = async {
        match leg.as_mut() {
            Some(leg) => tokio::select! {
                m = stream.next() => m,
                outcome = poll_fn(|cx| leg.poll_outcome(cx)) => {
                    if let Err(e) = outcome {
                        prefill_failed = true;
                        return Err(e);
                    }
                    stream.next().await
                }
            },
            None => stream.next().await,
        }
        .map_err(|s| status_error(kind, &url, &s))
    };
    let first = match tokio::time::timeout_at(deadline, first).await {
        Ok(r) => r,
        Err(_) => Err(ApiError::upstream_timeout(kind, &url)),
    };
    let first = first.and_then(|m| match m {
        Some((i, m)) => out.absorb(i, m, &url).map(|d| vec![d]),
        None => out.eof(&url),
    });
    if !prefill_failed {
        core.registry.record_outcome(&worker, worker_ok(&first));
    }
    let first = first?;
    if pd {
        // Decode's first message carries its first token: the time to first token.
        core.metrics.ttft(ctx.started.elapsed());
    }
    let model = match plan.model.as_str() {
        "" => worker.model().map(|m| m.id.clone()).unwrap_or_default(),
        named => named.to_owned(),
    };
    let state = Relay {
        plan,
        model,
        id: request_id,
        out,
        d: stream,
        leg,
        keep_input: pd && grpc.plan.logprobs.input_from.is_some(),
        input: None,
        url,
        kind,
        deadline,
        _load: load,
    };
    if state.plan.stream {
        Ok(state.into_sse(first))
    } else {
        state.into_full().await
    }
}

/// The streams whose tokens reach the client, with what the answer holds while they run.
pub(crate) struct Source {
    /// The worker streaming the answer (Decode in PD), charged with its outcome.
    pub(crate) worker: Arc<Worker>,
    pub(crate) stream: Legs,
    /// That worker's load, released with the answer.
    pub(crate) load: LoadGuard,
    /// PD: the Prefill leg still running.
    pub(crate) leg: Option<PrefillLeg>,
}

/// Starts a worker's streams within `deadline`; a failure is charged to `worker` at once.
/// The call runs in `leg`'s span.
pub(crate) async fn start(
    leg: Leg,
    worker: &Arc<Worker>,
    call: impl std::future::Future<Output = Result<Legs, tonic::Status>>,
    deadline: Instant,
    registry: &Arc<crate::registry::Registry>,
) -> Result<Legs, ApiError> {
    let call = tracing::Instrument::instrument(
        tokio::time::timeout_at(deadline, call),
        crate::telemetry::leg_span(leg, worker.url()),
    );
    let r = match call.await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(s)) => Err(status_error(leg, worker.url(), &s)),
        Err(_) => Err(ApiError::upstream_timeout(leg, worker.url())),
    };
    if let Err(e) = &r {
        registry.record_outcome(worker, worker_ok(&r));
        tracing::warn!(
            code = e.code,
            leg = leg.as_str(),
            "gRPC stream failed to start"
        );
    }
    r
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
    /// The Prefill's prompt logprobs go ahead of Decode's (the leg keeps them).
    keep_input: bool,
    /// What the Prefill leg kept, once its outcome came.
    input: Option<Vec<Vec<InputLogprob>>>,
    url: String,
    /// Which leg the streams are, for errors.
    kind: Leg,
    deadline: Instant,
    _load: LoadGuard,
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
                Err(_) => return Some(Err(ApiError::upstream_timeout(self.kind, &self.url))),
                Ok(Err(e)) => return Some(Err(e)),
                // The Prefill phase is over: what the leg kept stays for the answer.
                Ok(Ok(None)) => {
                    self.input = self
                        .leg
                        .take()
                        .and_then(|mut leg| leg.take_kept())
                        .map(|k| k.inputs);
                }
                Ok(Ok(Some(m))) => break m,
            }
        };
        Some(match msg {
            Ok(Some((i, m))) => self.out.absorb(i, m, &self.url).map(|d| vec![d]),
            Ok(None) => self.out.eof(&self.url),
            Err(s) => Err(status_error(self.kind, &self.url, &s)),
        })
    }

    /// After Decode: waits for Prefill (real engines finish Decode only after Prefill did,
    /// so this costs nothing) and puts its prompt logprobs ahead of Decode's. A Prefill
    /// failure surfaces as its status.
    async fn finish_prefill(&mut self) -> Result<(), ApiError> {
        // Decode has the whole answer, so the KV has moved: the Prefill leg frees its slot
        // now (its stream gets the grace to end on its own). A Prefill failure that came
        // first still surfaces as its status.
        if let Some(mut leg) = self.leg.take() {
            leg.decode_done();
            leg.outcome().await?;
            self.input = leg.take_kept().map(|k| k.inputs);
            leg.decode_finished();
        }
        if std::mem::take(&mut self.keep_input) {
            let inputs = self.input.take().unwrap_or_default();
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
        let mut resp = Response::new(Body::from(body));
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
                    // events.
                    if relay.out.done() {
                        done = true;
                        if relay.keep_input {
                            if let Err(e) = relay.finish_prefill().await {
                                queue.push_back(events.error(&relay.answer(created), &e));
                                continue;
                            }
                        } else if let Some(leg) = relay.leg.take() {
                            // The Prefill leg frees its slot and ends within the grace.
                            leg.decode_finished();
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
