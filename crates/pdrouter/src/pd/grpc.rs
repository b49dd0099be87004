//! The gRPC half of a PD attempt: after the pair selection and admission that HTTP PD uses
//! too (`Dispatcher::pd_attempt`), one `GenerateRequest` is sent to both workers at once.
//!
//! Invariants, as for HTTP PD: the Prefill stream is drained by its own task ([`PrefillLeg`])
//! that owns the admission permit and the Prefill load and drops them at Prefill stream end,
//! error or cancellation; Decode load lives in the response (the SSE body, or until the whole
//! answer is built). Every `Generate` stream is a [`LegStream`], which sends `Abort` when it is
//! dropped unfinished: a failed start of one leg aborts the other, and a client disconnect
//! (the body dropped) aborts both. Only Decode's tokens reach the client.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::sync::Arc;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use pdrouter_proto::scheduler::generate_complete::MatchedStop;
use pdrouter_proto::scheduler::generate_response::Response as Msg;
use pdrouter_proto::scheduler::{DisaggregatedParams, GenerateError, GenerateResponse};
use pdrouter_tokenizer::{FinishReason, TextStream, Tokenizer};
use tokio::time::Instant;

use super::{Holds, PrefillLeg};
use crate::dispatch::{Dispatcher, RequestCtx, worker_ok};
use crate::error::{ApiError, Leg};
use crate::grpc::client::LegStream;
use crate::grpc::translate::{self, Plan, Usage};
use crate::registry::{LoadGuard, Worker};
use crate::request::ParsedRequest;

/// Largest bootstrap room (rooms are uniform in `[0, 2^31)`).
const MAX_ROOM: i32 = i32::MAX;

fn status_error(leg: Leg, url: &str, s: &tonic::Status) -> ApiError {
    ApiError::grpc_status(leg, url, s.code(), s.message())
}

fn message_error(leg: Leg, url: &str, e: &GenerateError) -> ApiError {
    let status = e
        .http_status_code
        .parse::<u16>()
        .ok()
        .and_then(|c| http::StatusCode::from_u16(c).ok())
        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    ApiError::upstream_status(leg, url, status, &e.message)
}

/// Decode's output turned into text, with the router's stop conditions.
struct Output {
    text: TextStream,
    ids: Vec<u32>,
    full: String,
    usage: Usage,
    finish: Option<FinishReason>,
    /// The engine sent its `Complete` (or the stream ended).
    ended: bool,
}

impl Output {
    fn new(tokenizer: Arc<Tokenizer>, plan: &Plan) -> Self {
        Self {
            text: TextStream::new(tokenizer, plan.decode, plan.stop.clone()),
            ids: Vec::new(),
            full: String::new(),
            usage: Usage {
                prompt: plan.prompt_tokens,
                ..Usage::default()
            },
            finish: None,
            ended: false,
        }
    }

    fn push_ids(&mut self, ids: &[u32]) -> Result<String, ApiError> {
        let mut delta = String::new();
        for &id in ids {
            if self.finish.is_some() {
                break;
            }
            self.ids.push(id);
            let step = self
                .text
                .push(id)
                .map_err(|e| ApiError::internal(format!("detokenizing: {e}")))?;
            delta.push_str(&step.text);
            if let Some(f) = step.finish {
                self.usage.completion = u32::try_from(self.ids.len()).unwrap_or(u32::MAX);
                self.finish = Some(f);
            }
        }
        Ok(delta)
    }

    /// Takes one Decode message; returns the text it adds.
    fn absorb(&mut self, m: GenerateResponse, url: &str) -> Result<String, ApiError> {
        match m.response {
            Some(Msg::Chunk(c)) => {
                if c.prompt_tokens > 0 {
                    self.usage.prompt = c.prompt_tokens;
                }
                self.usage.cached = c.cached_tokens;
                self.push_ids(&c.token_ids)
            }
            Some(Msg::Complete(c)) => {
                self.ended = true;
                // The final ids repeat what the chunks carried; they count only when no
                // chunk came at all.
                let mut delta = if self.ids.is_empty() {
                    self.push_ids(&c.output_ids)?
                } else {
                    String::new()
                };
                if c.prompt_tokens > 0 {
                    self.usage.prompt = c.prompt_tokens;
                }
                self.usage.cached = c.cached_tokens;
                if self.finish.is_none() {
                    let (tok, text) = match &c.matched_stop {
                        Some(MatchedStop::MatchedTokenId(id)) => (Some(*id), None),
                        Some(MatchedStop::MatchedStopStr(s)) => (None, Some(s.as_str())),
                        None => (None, None),
                    };
                    let reason = translate::engine_finish(&c.finish_reason, tok, text);
                    let step = self
                        .text
                        .finish(reason.clone())
                        .map_err(|e| ApiError::internal(format!("detokenizing: {e}")))?;
                    delta.push_str(&step.text);
                    self.finish = Some(step.finish.unwrap_or(reason));
                    self.usage.completion = c
                        .completion_tokens
                        .max(u32::try_from(self.ids.len()).unwrap_or(u32::MAX));
                }
                Ok(delta)
            }
            Some(Msg::Error(e)) => Err(message_error(Leg::Decode, url, &e)),
            None => Err(ApiError::upstream_broken(Leg::Decode, url)),
        }
    }

    /// The stream ended without a `Complete`.
    fn eof(&mut self, url: &str) -> Result<String, ApiError> {
        self.ended = true;
        if self.finish.is_some() {
            return Ok(String::new());
        }
        Err(ApiError::upstream_broken(Leg::Decode, url))
    }
}

/// A request translated for gRPC workers, with the tokenizer that detokenizes its answer.
#[derive(Debug)]
pub(crate) struct GrpcPlan {
    plan: Arc<Plan>,
    tokenizer: Arc<Tokenizer>,
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
        let room = rand::random_range(0..=MAX_ROOM);
        let request_id = format!("{}-{room:x}", ctx.request_id);
        let mut greq = plan.request.clone();
        greq.request_id.clone_from(&request_id);
        greq.disaggregated_params = Some(DisaggregatedParams {
            bootstrap_host: prefill.bootstrap_host().to_owned(),
            bootstrap_port: prefill.bootstrap_port().map_or(0, i32::from),
            bootstrap_room: room,
        });
        let timeout = self.cfg.request_timeout;
        let deadline = crate::config::deadline_after(Instant::now(), timeout);
        let started = Instant::now();
        // A leg that fails to start is charged to its worker and ends the attempt at once:
        // the other leg's call is dropped, which aborts it.
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
        let (mut p, mut d): (LegStream, LegStream) = tokio::try_join!(
            start(Leg::Prefill, &prefill, pch.generate(greq.clone())),
            start(Leg::Decode, &decode, dch.generate(greq)),
        )?;
        let (outcome_tx, outcome) = tokio::sync::oneshot::channel();
        let leg_task = {
            let registry = self.registry.clone();
            let metrics = self.metrics.clone();
            let worker = prefill.clone();
            async move {
                let url = worker.url().to_owned();
                let drain = async {
                    loop {
                        match p.next().await {
                            Ok(Some(GenerateResponse {
                                response: Some(Msg::Error(e)),
                                ..
                            })) => return Err(message_error(Leg::Prefill, &url, &e)),
                            Ok(Some(_)) => {}
                            Ok(None) => return Ok(()),
                            Err(s) => return Err(status_error(Leg::Prefill, &url, &s)),
                        }
                    }
                };
                let result = match tokio::time::timeout_at(deadline, drain).await {
                    Ok(r) => r,
                    Err(_) => Err(ApiError::upstream_timeout(Leg::Prefill, &url)),
                };
                // The release point: the slot and the load go with the Prefill stream's end,
                // its failure, or (the task aborted) its cancellation.
                drop(p);
                drop(holds.permit);
                drop(holds.prefill_load);
                let _ = outcome_tx.send(result.clone().map(|()| None));
                metrics.prefill_duration(started.elapsed());
                registry.record_outcome(&worker, worker_ok(&result));
            }
        };
        // No `decode_done` signal: a gRPC Prefill stream ends on its own right after the
        // hand-over, and one still open when the answer is done is aborted with the answer.
        let mut leg = PrefillLeg {
            handle: Some(tokio::spawn(tracing::Instrument::in_current_span(leg_task))),
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
            Some(m) => out.absorb(m, &url),
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
            url,
            deadline,
            _decode_load: holds.decode_load,
        };
        if state.plan.stream {
            Ok(state.into_sse(first))
        } else {
            state.into_full(first).await
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
    d: LegStream,
    leg: Option<PrefillLeg>,
    url: String,
    deadline: Instant,
    _decode_load: LoadGuard,
}

impl Relay {
    /// The next piece of text, or `None` once Decode ended. A Prefill failure while Decode is
    /// still running ends the answer with that error.
    async fn next_delta(&mut self) -> Option<Result<String, ApiError>> {
        if self.out.ended {
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
            Ok(Some(m)) => self.out.absorb(m, &self.url),
            Ok(None) => self.out.eof(&self.url),
            Err(s) => Err(status_error(Leg::Decode, &self.url, &s)),
        })
    }

    async fn into_full(mut self, first: String) -> Result<Response, ApiError> {
        let mut text = first;
        while let Some(delta) = self.next_delta().await {
            text.push_str(&delta?);
        }
        // Real engines finish Decode only after Prefill did; waiting costs nothing and lets a
        // Prefill failure surface as its status.
        if let Some(mut leg) = self.leg.take() {
            poll_fn(|cx| leg.poll_outcome(cx)).await?;
        }
        let finish = self.out.finish.clone().unwrap_or(FinishReason::Stop);
        let body = translate::full_body(
            &self.plan,
            &self.model,
            &self.id,
            &text,
            &self.out.ids,
            &finish,
            self.out.usage,
        );
        let mut resp = Response::new(Body::from(serde_json::to_vec(&body).unwrap_or_default()));
        resp.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        Ok(resp)
    }

    fn into_sse(self, first: String) -> Response {
        let queue: VecDeque<Bytes> = translate::role_event(&self.plan, &self.model, &self.id)
            .into_iter()
            .map(|v| sse(&v))
            .collect();
        let state = (self, queue, Some(first), false);
        let stream = futures_util::stream::unfold(
            state,
            |(mut relay, mut queue, mut first, mut done)| async move {
                loop {
                    if let Some(b) = queue.pop_front() {
                        return Some((
                            Ok::<_, std::convert::Infallible>(b),
                            (relay, queue, first, done),
                        ));
                    }
                    if done {
                        return None;
                    }
                    let delta = match first.take() {
                        Some(f) => Some(Ok(f)),
                        None => relay.next_delta().await,
                    };
                    match delta {
                        Some(Ok(delta)) => {
                            relay.out.full.push_str(&delta);
                            let finish = relay.out.finish.clone().filter(|_| relay.out.ended);
                            for v in translate::stream_event(
                                &relay.plan,
                                &relay.model,
                                &relay.id,
                                &delta,
                                (&relay.out.full, &relay.out.ids),
                                finish.as_ref(),
                                relay.out.usage,
                            ) {
                                queue.push_back(sse(&v));
                            }
                        }
                        Some(Err(e)) => {
                            queue.push_back(e.sse_event());
                            done = true;
                        }
                        None => {
                            queue.push_back(Bytes::from_static(b"data: [DONE]\n\n"));
                            done = true;
                        }
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

fn sse(v: &serde_json::Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}
