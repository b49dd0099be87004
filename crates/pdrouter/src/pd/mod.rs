//! HTTP PD dispatch: one Prefill and one Decode request per client request.
//!
//! Order of a PD attempt, and why:
//! 1. Prefill selection — through admission when it is on (may wait, may be rejected).
//! 2. Decode selection and Decode load — only after the Prefill reservation succeeded, so a
//!    waiting or rejected request never inflates Decode load.
//! 3. Both legs are sent at once. The Prefill leg runs as its own task ([`PrefillLeg`]) that
//!    drains the Prefill body concurrently with Decode and drops the admission permit and the
//!    Prefill load at Prefill end-of-body, error or cancellation — or as soon as Decode has
//!    delivered its whole answer and the Prefill worker has answered, whichever comes first:
//!    by then the KV has moved. A Prefill body still open at that point gets
//!    [`Config::prefill_grace_after_decode`] to end on its own, without the slot, and is
//!    aborted after it (counted either way). A Prefill worker that has not answered at all
//!    keeps the slot: it may still be computing.
//! 4. The client's response head is sent once Decode answered and either the Prefill phase
//!    is over as above or (streaming only) Decode produced its first frame; a Prefill failure
//!    before that is answered with its real status, after it as an SSE error event. A client
//!    disconnect aborts both legs.
//! 5. A `/generate` request with `return_logprob` keeps the Prefill answer (bounded) to put its
//!    prompt logprobs in front of Decode's ([`logprobs`]): the leg's outcome then waits for
//!    the Prefill body's end (the grace bounds it after Decode is done), a non-streaming answer
//!    is read whole and merged, and streamed events carrying the list wait for the outcome.
//!    The slot and load are released exactly as in 3.
//!
//! [`Config::prefill_grace_after_decode`]: crate::config::Config::prefill_grace_after_decode

pub mod bootstrap;
pub mod grpc;
pub mod logprobs;

use std::collections::VecDeque;
use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::Frame;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::WorkerType;
use crate::dispatch::{Dispatcher, RequestCtx, exchange, relay_response, worker_ok};
use crate::error::{ApiError, Leg};
use crate::metrics::{AfterDecode, Metrics};
use crate::proxy::relay::{FirstByte, RelayBody};
use crate::registry::{LoadGuard, Worker};
use crate::request::ParsedRequest;
use crate::select::{Candidates, Wanted};
use crate::sizing::SizedPermit;
use logprobs::{PromptLogprobs, SseMerge};

/// What the Prefill leg reports when the Prefill phase is over: success with the Prefill's
/// prompt logprobs (when the request asked for them and the answer carried them), or the
/// leg's error.
pub(crate) type PrefillOutcome = Result<Option<PromptLogprobs>, ApiError>;

/// Most bytes of a Prefill answer kept to read its prompt logprobs (the cap on every worker
/// body the router reads whole).
const PREFILL_CAPTURE_LIMIT: usize = crate::proxy::client::INFO_BODY_LIMIT;

/// Most bytes of a non-streaming Decode answer read whole to merge prompt logprobs into it.
const DECODE_MERGE_LIMIT: usize = SseMerge::EVENT_LIMIT;

/// The Prefill leg running in its own task, seen from the request.
///
/// Its outcome arrives when the Prefill phase is over for the request: the Prefill body ended,
/// the leg failed, or — after [`PrefillLeg::decode_done`] — the Prefill worker has answered.
/// Dropping the leg before that aborts the task, which releases the slot and load it holds;
/// after it the task holds nothing and ends on its own within the grace.
#[derive(Debug)]
pub struct PrefillLeg {
    handle: Option<JoinHandle<()>>,
    outcome: Option<oneshot::Receiver<PrefillOutcome>>,
    decode_done: Option<oneshot::Sender<()>>,
    /// The Prefill's prompt logprobs, once the outcome brought them.
    logprobs: Option<PromptLogprobs>,
}

impl PrefillLeg {
    /// Polls for the outcome of the Prefill phase.
    pub fn poll_outcome(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        let Some(rx) = self.outcome.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let out = std::task::ready!(std::pin::Pin::new(rx).poll(cx));
        self.outcome = None;
        self.handle = None;
        Poll::Ready(match out {
            Ok(Ok(logprobs)) => {
                self.logprobs = logprobs;
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ApiError::internal("prefill task ended early")),
        })
    }

    /// The Prefill's prompt logprobs, after a successful outcome that carried them.
    pub fn take_logprobs(&mut self) -> Option<PromptLogprobs> {
        self.logprobs.take()
    }

    /// Tells the leg that Decode has delivered its whole answer: the KV has moved, so once the
    /// Prefill worker has answered (at once, if it has), the leg releases its slot and load
    /// and reports success.
    pub fn decode_done(&mut self) {
        if let Some(tx) = self.decode_done.take() {
            let _ = tx.send(());
        }
    }

    /// [`PrefillLeg::decode_done`], then lets the task finish on its own.
    pub fn decode_finished(mut self) {
        self.decode_done();
        self.handle = None;
    }
}

impl Drop for PrefillLeg {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.abort();
        }
    }
}

/// What the Prefill leg task holds until the Prefill phase is over for the request.
struct PrefillHolds {
    permit: Option<SizedPermit>,
    _load: LoadGuard,
}

impl PrefillHolds {
    /// Releases the slot and load, telling a self-sizing limit how the Prefill ended (`Ok`:
    /// it is over for the request).
    fn release<T>(self, outcome: &Result<T, ApiError>) {
        crate::sizing::release(self.permit, outcome);
    }
}

/// The Prefill leg task's side of [`PrefillLeg`].
struct LegSignals {
    decode_done: oneshot::Receiver<()>,
    outcome: oneshot::Sender<PrefillOutcome>,
    /// Keep the body to read its prompt logprobs: the outcome then waits for the body's
    /// end, also after Decode is done (the slot and load are released as without it).
    capture: bool,
}

/// Runs the Prefill leg: `send` gets the response head, then its body is drained, all before
/// `deadline`. The holds are dropped and the outcome reported when the body ends or the leg
/// fails — or, once the worker has answered, when Decode is done (the KV has moved); the rest
/// of the body then gets `grace` to end before it is dropped, which aborts the request. A
/// capturing leg reports its outcome only when its body has ended (or the grace ran out: an
/// error, since the prompt logprobs are then missing), though it drops the holds as early.
/// Returns the leg's own result, `None` when it was aborted that way.
async fn run_prefill_leg(
    send: impl Future<Output = Result<http::Response<Incoming>, ApiError>>,
    url: &str,
    deadline: Instant,
    holds: PrefillHolds,
    signals: LegSignals,
    grace: std::time::Duration,
    metrics: &Metrics,
) -> Option<Result<(), ApiError>> {
    let LegSignals {
        mut decode_done,
        outcome,
        capture,
    } = signals;
    let timed_out = || ApiError::upstream_timeout(Leg::Prefill, url);
    let head = tokio::time::timeout_at(deadline, send)
        .await
        .unwrap_or_else(|_| Err(timed_out()));
    let mut body = match head {
        Ok(resp) => resp.into_body(),
        Err(e) => {
            holds.release(&Err::<(), _>(e.clone()));
            let _ = outcome.send(Err(e.clone()));
            return Some(Err(e));
        }
    };
    let drain = async {
        let mut kept = Vec::new();
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| ApiError::upstream_broken(Leg::Prefill, url))?;
            if let (true, Some(data)) = (capture, frame.data_ref()) {
                if kept.len() + data.len() > PREFILL_CAPTURE_LIMIT {
                    return Err(ApiError::upstream_too_large(
                        Leg::Prefill,
                        url,
                        PREFILL_CAPTURE_LIMIT,
                    ));
                }
                kept.extend_from_slice(data);
            }
        }
        Ok(capture.then(|| PromptLogprobs::from_body(&kept)))
    };
    let drain = async {
        tokio::time::timeout_at(deadline, drain)
            .await
            .unwrap_or_else(|_| Err(timed_out()))
    };
    tokio::pin!(drain);
    tokio::select! {
        // Decode first: a leg that outlived Decode is counted however soon it ends.
        biased;
        // A dropped sender (the request is being torn down) disables this branch.
        Ok(()) = &mut decode_done => {
            // Decode has the whole answer: the Prefill is over for the request.
            holds.release(&Ok::<(), ApiError>(()));
            let mut outcome = Some(outcome);
            if !capture && let Some(tx) = outcome.take() {
                let _ = tx.send(Ok(None));
            }
            let r = drain_after_decode(&mut drain, grace, metrics).await;
            let status = r.as_ref().map(leg_status);
            if let Some(tx) = outcome {
                let _ = tx.send(r.unwrap_or_else(|| Err(timed_out())));
            }
            status
        }
        r = &mut drain => {
            holds.release(&r);
            let status = leg_status(&r);
            let _ = outcome.send(r);
            Some(status)
        }
    }
}

/// Gives a Prefill leg that outlived Decode `grace` to end and counts how it went; `None`
/// when the grace ran out (dropping `drain` then aborts the leg). Both transports' leg tasks
/// end this way once Decode is done.
pub(crate) async fn drain_after_decode<T>(
    drain: impl Future<Output = Result<T, ApiError>>,
    grace: std::time::Duration,
    metrics: &Metrics,
) -> Option<Result<T, ApiError>> {
    let r = tokio::time::timeout(grace, drain).await.ok();
    metrics.prefill_after_decode(match &r {
        Some(Ok(_)) => AfterDecode::Drained,
        Some(Err(_)) => AfterDecode::Failed,
        None => AfterDecode::Aborted,
    });
    r
}

/// The leg's own result, without what it read.
fn leg_status(r: &PrefillOutcome) -> Result<(), ApiError> {
    r.as_ref().map(|_| ()).map_err(Clone::clone)
}

/// What a PD attempt holds once its workers are chosen (either transport).
pub(crate) struct Holds {
    pub(crate) prefill: std::sync::Arc<crate::registry::Worker>,
    pub(crate) permit: Option<SizedPermit>,
    pub(crate) prefill_load: LoadGuard,
    pub(crate) decode: std::sync::Arc<crate::registry::Worker>,
    pub(crate) decode_load: LoadGuard,
}

/// The queue timeout of a request of `priority`, in seconds (a plain function: computed in the
/// attempt's future it would take room there for the whole wait).
fn timeout_secs(
    adm: &pdrouter_admission::Admission,
    priority: pdrouter_admission::Priority,
) -> u64 {
    adm.config().classes().get(priority).queue_timeout.as_secs()
}

impl Dispatcher {
    /// One PD attempt over either transport: `grpc` is the request translated for gRPC
    /// workers, `None` for HTTP ones. Selection and admission are the same for both.
    pub(crate) async fn pd_attempt(
        &self,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        grpc: Option<&crate::grpc::answer::GrpcPlan>,
    ) -> Result<Response, ApiError> {
        let units = req.sub_requests() as u64;
        let prefill_sel = || {
            Candidates::new(
                self.registry.clone(),
                self.prefill_policy.clone(),
                WorkerType::Prefill,
                self.wanted(req, ctx, &self.prefill_policy),
            )
        };
        // The selector is built as a temporary moved straight into `acquire`: a named local
        // would keep a dead copy of it in this future for the whole wait.
        let (prefill, permit) = match &self.admission {
            Some(adm) => match crate::telemetry::in_admission_span(
                adm.acquire(
                    prefill_sel()
                        // gRPC counts the prompt with the tokenizer; HTTP estimates it.
                        .with_prompt_tokens(grpc.map_or(
                            req.prompt_tokens,
                            crate::grpc::answer::GrpcPlan::prompt_tokens,
                        ))
                        .with_priority(ctx.priority)
                        .checked_target()?,
                ),
            )
            .await
            {
                Ok(admitted) => (
                    admitted.choice,
                    Some(match &self.sizer {
                        Some(sizer) => sizer.watch(admitted.permit),
                        None => SizedPermit::fixed(admitted.permit),
                    }),
                ),
                Err(r) => {
                    tracing::debug!(reason = r.reason.as_str(), "prefill admission rejected");
                    return Err(ApiError::admission(r, timeout_secs(adm, ctx.priority)));
                }
            },
            None => (prefill_sel().pick()?, None),
        };
        let prefill_load = LoadGuard::new(prefill.clone(), units);
        let decode = Candidates::new(
            self.registry.clone(),
            self.decode_policy.clone(),
            WorkerType::Decode,
            Wanted {
                target: None,
                // Without a named model, Decode serves what the chosen Prefill serves.
                model: self
                    .routed_model(req)
                    .or_else(|| prefill.model().map(|m| Arc::from(m.id.as_str()))),
                ..self.wanted(req, ctx, &self.decode_policy)
            },
        )
        // A gRPC Decode worker must speak its Prefill's runtime (same KV hand-over).
        .with_runtime(prefill.runtime())
        .pick()?;
        let decode_load = LoadGuard::new(decode.clone(), units);
        let holds = Holds {
            prefill,
            permit,
            prefill_load,
            decode,
            decode_load,
        };
        // The sending half is boxed so that a request parked in the admission queue above
        // holds only the small selection state, not room for every later stage (this future
        // lives, per waiter, for as long as it waits).
        match grpc {
            None => Box::pin(self.pd_send(req, ctx, holds)).await,
            Some(plan) => Box::pin(self.grpc_pd_send(ctx, plan, holds)).await,
        }
    }

    async fn pd_send(
        &self,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        holds: Holds,
    ) -> Result<Response, ApiError> {
        let Holds {
            prefill,
            permit,
            prefill_load,
            decode,
            decode_load,
        } = holds;
        let (prefill_body, decode_body) = bootstrap::bodies(req, &prefill, &decode);
        let capture = req.logprobs;
        let path = req.endpoint.path();
        let timeout = self.cfg.request_timeout;
        let (decode_done, decode_done_rx) = oneshot::channel();
        let (outcome_tx, outcome) = oneshot::channel();
        let leg_task = {
            let client = self.client.clone();
            let registry = self.registry.clone();
            let metrics = self.metrics.clone();
            let worker = prefill.clone();
            let ctx = ctx.clone();
            let grace = self.cfg.prefill_grace_after_decode;
            async move {
                let started = Instant::now();
                let send = exchange(
                    &client,
                    &worker,
                    Leg::Prefill,
                    path,
                    prefill_body,
                    &ctx,
                    timeout,
                );
                let holds = PrefillHolds {
                    permit,
                    _load: prefill_load,
                };
                let signals = LegSignals {
                    decode_done: decode_done_rx,
                    outcome: outcome_tx,
                    capture,
                };
                let ended = run_prefill_leg(
                    send,
                    worker.url(),
                    started + timeout,
                    holds,
                    signals,
                    grace,
                    &metrics,
                )
                .await;
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
            decode_done: Some(decode_done),
            logprobs: None,
        };

        let decode_head = tracing::Instrument::instrument(
            exchange(
                &self.client,
                &decode,
                Leg::Decode,
                path,
                decode_body,
                ctx,
                timeout,
            ),
            crate::telemetry::leg_span(Leg::Decode, decode.url()),
        );
        tokio::pin!(decode_head);
        let mut prefill_done = false;
        let head = tokio::select! {
            r = &mut decode_head => r,
            outcome = poll_fn(|cx| leg.poll_outcome(cx)) => {
                // A Prefill failure cancels the Decode leg (dropped on return).
                outcome?;
                prefill_done = true;
                decode_head.await
            }
        };
        self.registry.record_outcome(&decode, worker_ok(&head));
        let resp = head?;
        let (parts, mut body) = resp.into_parts();
        let mut read = VecDeque::new();
        let mut decode_complete = false;
        if !prefill_done {
            let wait = prefill_or_decode(&mut leg, &mut body, &mut read, req.stream, &decode);
            decode_complete = match tokio::time::timeout(timeout, wait).await {
                Ok(r) => r?,
                Err(_) => return Err(ApiError::upstream_timeout(Leg::Decode, decode.url())),
            };
        }
        let first_byte = Some(FirstByte {
            started: ctx.started,
            metrics: self.metrics.clone(),
        });
        if capture && !req.stream {
            // The Prefill phase is over (a non-streaming answer waits for it): merge its
            // prompt logprobs into Decode's whole answer.
            let rest = (!decode_complete).then_some(body);
            let whole = read_whole(read, rest, timeout, &decode).await?;
            let merged = match leg.take_logprobs() {
                Some(lp) => lp.merge_body(whole),
                None => whole,
            };
            let mut parts = parts;
            parts.headers.remove(http::header::CONTENT_LENGTH);
            let read = VecDeque::from([Frame::data(merged)]);
            let relay = RelayBody::new(None, read, None, false, decode_load, first_byte);
            return Ok(relay_response(parts, Body::new(relay)));
        }
        let (inner, leg) = match (decode_complete, capture) {
            (true, false) => {
                leg.decode_finished();
                (None, None)
            }
            // Decode's events wait for the Prefill's logprobs; Decode is done already.
            (true, true) => (None, Some(leg)),
            (false, _) => (Some(body), Some(leg)),
        };
        let mut relay = RelayBody::new(inner, read, leg, req.stream, decode_load, first_byte);
        if capture {
            relay = relay.merging_logprobs(decode.url());
        }
        Ok(relay_response(parts, Body::new(relay)))
    }
}

/// Decode's whole answer: the frames `read` so far, then the rest of `body` (at most
/// [`DECODE_MERGE_LIMIT`] bytes in all, within `timeout`).
async fn read_whole(
    read: VecDeque<Frame<Bytes>>,
    body: Option<Incoming>,
    timeout: std::time::Duration,
    decode: &Worker,
) -> Result<Bytes, ApiError> {
    let too_large = || ApiError::upstream_too_large(Leg::Decode, decode.url(), DECODE_MERGE_LIMIT);
    let mut whole = bytes::BytesMut::new();
    for f in read {
        if let Some(d) = f.data_ref() {
            whole.extend_from_slice(d);
        }
    }
    let Some(mut body) = body else {
        return Ok(whole.freeze());
    };
    let rest = async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|_| ApiError::upstream_broken(Leg::Decode, decode.url()))?;
            if let Some(d) = frame.data_ref() {
                if whole.len() + d.len() > DECODE_MERGE_LIMIT {
                    return Err(too_large());
                }
                whole.extend_from_slice(d);
            }
        }
        Ok(())
    };
    match tokio::time::timeout(timeout, rest).await {
        Ok(r) => r?,
        Err(_) => return Err(ApiError::upstream_timeout(Leg::Decode, decode.url())),
    }
    Ok(whole.freeze())
}

/// Most Decode bytes a non-streaming request reads ahead while it waits for Prefill to end;
/// past it, it waits for Prefill without reading on.
const DECODE_READ_AHEAD: usize = 4 << 20;

/// Waits, once Decode's response head is in, until the client's response can start. Returns
/// whether Decode's whole answer is already in `read` (the Prefill leg was then told so).
///
/// Streaming: until the Prefill phase is over or Decode's first frame arrives. Non-streaming:
/// until the Prefill phase is over, which includes "Decode has the whole answer and the
/// Prefill worker has answered". A non-streaming answer is one block that real engines can
/// only finish after Prefill did, so waiting for Prefill costs nothing and lets a Prefill
/// failure surface as its real status (and be retried) — but once Decode has the whole
/// answer, the KV has moved and a Prefill body that does not end must not hold it.
async fn prefill_or_decode(
    leg: &mut PrefillLeg,
    body: &mut Incoming,
    read: &mut VecDeque<Frame<Bytes>>,
    stream: bool,
    decode: &Worker,
) -> Result<bool, ApiError> {
    let mut read_bytes = 0;
    let mut decode_complete = false;
    loop {
        tokio::select! {
            biased;
            outcome = poll_fn(|cx| leg.poll_outcome(cx)) => {
                outcome?;
                return Ok(decode_complete);
            }
            frame = body.frame(), if !decode_complete && read_bytes <= DECODE_READ_AHEAD => {
                match frame {
                    Some(Ok(f)) => {
                        read_bytes += f.data_ref().map_or(0, Bytes::len);
                        read.push_back(f);
                        if stream {
                            return Ok(false);
                        }
                    }
                    Some(Err(_)) => {
                        return Err(ApiError::upstream_broken(Leg::Decode, decode.url()));
                    }
                    None => {
                        decode_complete = true;
                        leg.decode_done();
                        if stream {
                            return Ok(true);
                        }
                    }
                }
            }
        }
    }
}
