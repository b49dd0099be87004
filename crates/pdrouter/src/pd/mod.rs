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
//!
//! [`Config::prefill_grace_after_decode`]: crate::config::Config::prefill_grace_after_decode

pub mod bootstrap;
pub mod grpc;

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

/// The Prefill leg running in its own task, seen from the request.
///
/// Its outcome arrives when the Prefill phase is over for the request: the Prefill body ended,
/// the leg failed, or — after [`PrefillLeg::decode_done`] — the Prefill worker has answered.
/// Dropping the leg before that aborts the task, which releases the slot and load it holds;
/// after it the task holds nothing and ends on its own within the grace.
#[derive(Debug)]
pub struct PrefillLeg {
    handle: Option<JoinHandle<()>>,
    outcome: Option<oneshot::Receiver<Result<(), ApiError>>>,
    decode_done: Option<oneshot::Sender<()>>,
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
        Poll::Ready(out.unwrap_or_else(|_| Err(ApiError::internal("prefill task ended early"))))
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
    _permit: Option<pdrouter_admission::Permit>,
    _load: LoadGuard,
}

/// The Prefill leg task's side of [`PrefillLeg`].
struct LegSignals {
    decode_done: oneshot::Receiver<()>,
    outcome: oneshot::Sender<Result<(), ApiError>>,
}

/// Runs the Prefill leg: `send` gets the response head, then its body is drained, all before
/// `deadline`. The holds are dropped and the outcome reported when the body ends or the leg
/// fails — or, once the worker has answered, when Decode is done (the KV has moved); the rest
/// of the body then gets `grace` to end before it is dropped, which aborts the request.
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
    } = signals;
    let timed_out = || ApiError::upstream_timeout(Leg::Prefill, url);
    let head = tokio::time::timeout_at(deadline, send)
        .await
        .unwrap_or_else(|_| Err(timed_out()));
    let mut body = match head {
        Ok(resp) => resp.into_body(),
        Err(e) => {
            drop(holds);
            let _ = outcome.send(Err(e.clone()));
            return Some(Err(e));
        }
    };
    let drain = async {
        while let Some(frame) = body.frame().await {
            frame.map_err(|_| ApiError::upstream_broken(Leg::Prefill, url))?;
        }
        Ok(())
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
            drop(holds);
            let _ = outcome.send(Ok(()));
            let r = tokio::time::timeout(grace, &mut drain).await.ok();
            metrics.prefill_after_decode(match &r {
                Some(Ok(())) => AfterDecode::Drained,
                Some(Err(_)) => AfterDecode::Failed,
                None => AfterDecode::Aborted,
            });
            r
        }
        r = &mut drain => {
            drop(holds);
            let _ = outcome.send(r.clone());
            Some(r)
        }
    }
}

/// What a PD attempt holds once its workers are chosen (either transport).
pub(crate) struct Holds {
    pub(crate) prefill: std::sync::Arc<crate::registry::Worker>,
    pub(crate) permit: Option<pdrouter_admission::Permit>,
    pub(crate) prefill_load: LoadGuard,
    pub(crate) decode: std::sync::Arc<crate::registry::Worker>,
    pub(crate) decode_load: LoadGuard,
}

impl Dispatcher {
    /// One PD attempt over either transport: `grpc` is the request translated for gRPC
    /// workers, `None` for HTTP ones. Selection and admission are the same for both.
    pub(crate) async fn pd_attempt(
        &self,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        grpc: Option<&grpc::GrpcPlan>,
    ) -> Result<Response, ApiError> {
        let units = req.sub_requests() as u64;
        let prefill_sel = || {
            Candidates::new(
                self.registry.clone(),
                self.prefill_policy.clone(),
                WorkerType::Prefill,
                Self::wanted(req, ctx),
            )
        };
        // The selector is built as a temporary moved straight into `acquire`: a named local
        // would keep a dead copy of it in this future for the whole wait.
        let (prefill, permit) = match &self.admission {
            Some(adm) => match adm.acquire(prefill_sel().checked_target()?).await {
                Ok(admitted) => (admitted.choice, Some(admitted.permit)),
                Err(r) => {
                    tracing::debug!(reason = r.as_str(), "prefill admission rejected");
                    return Err(ApiError::admission(r, adm.config().queue_timeout.as_secs()));
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
                model: req
                    .model
                    .clone()
                    .or_else(|| prefill.model().map(|m| Arc::from(m.id.as_str()))),
                ..Self::wanted(req, ctx)
            },
        )
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
                    _permit: permit,
                    _load: prefill_load,
                };
                let signals = LegSignals {
                    decode_done: decode_done_rx,
                    outcome: outcome_tx,
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
            handle: Some(tokio::spawn(tracing::Instrument::in_current_span(leg_task))),
            outcome: Some(outcome),
            decode_done: Some(decode_done),
        };

        let decode_head = exchange(
            &self.client,
            &decode,
            Leg::Decode,
            path,
            decode_body,
            ctx,
            timeout,
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
        let (inner, leg) = if decode_complete {
            leg.decode_finished();
            (None, None)
        } else {
            (Some(body), Some(leg))
        };
        let relay = RelayBody::new(
            inner,
            read,
            leg,
            req.stream,
            decode_load,
            Some(FirstByte {
                started: ctx.started,
                metrics: self.metrics.clone(),
            }),
        );
        Ok(relay_response(parts, Body::new(relay)))
    }
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
