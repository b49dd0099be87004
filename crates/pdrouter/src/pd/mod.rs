//! HTTP PD dispatch: one Prefill and one Decode request per client request.
//!
//! Order of a PD attempt, and why:
//! 1. Prefill selection — through admission when it is on (may wait, may be rejected).
//! 2. Decode selection and Decode load — only after the Prefill reservation succeeded, so a
//!    waiting or rejected request never inflates Decode load.
//! 3. Both legs are sent at once. The Prefill leg runs as its own task ([`PrefillLeg`]) that
//!    drains the Prefill body concurrently with Decode and drops the admission permit and the
//!    Prefill load at Prefill end-of-body, error or cancellation — never later, whatever the
//!    Decode leg is doing.
//! 4. The client's response head is sent once Decode answered and either Prefill finished or
//!    (streaming only) Decode produced its first frame; a Prefill failure before that is
//!    answered with its real status, after it as an SSE error event. A client disconnect
//!    aborts both legs.

pub mod bootstrap;

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::Response;
use http_body_util::BodyExt;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::WorkerType;
use crate::dispatch::{Dispatcher, RequestCtx, exchange, relay_response, worker_ok};
use crate::error::{ApiError, Leg};
use crate::proxy::relay::{FirstByte, RelayBody};
use crate::registry::LoadGuard;
use crate::request::ParsedRequest;
use crate::select::{Candidates, Wanted};

/// The Prefill leg running in its own task. Dropping it before it finished (and without
/// [`PrefillLeg::detach`]) aborts the task, which releases the slot and load it holds.
#[derive(Debug)]
pub struct PrefillLeg {
    handle: Option<JoinHandle<Result<(), ApiError>>>,
}

impl PrefillLeg {
    /// Polls for the leg's outcome.
    pub fn poll_outcome(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        let Some(h) = self.handle.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let out = std::task::ready!(std::pin::Pin::new(h).poll(cx));
        self.handle = None;
        Poll::Ready(match out {
            Ok(r) => r,
            Err(e) => Err(ApiError::internal(format!("prefill task failed: {e}"))),
        })
    }

    /// Lets the leg run to its end on its own.
    pub fn detach(mut self) {
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

/// What a PD attempt holds once its workers are chosen.
struct Holds {
    prefill: std::sync::Arc<crate::registry::Worker>,
    permit: Option<pdrouter_admission::Permit>,
    prefill_load: LoadGuard,
    decode: std::sync::Arc<crate::registry::Worker>,
    decode_load: LoadGuard,
}

impl Dispatcher {
    pub(crate) async fn pd_attempt(
        &self,
        req: &ParsedRequest,
        ctx: &RequestCtx,
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
        // The sending half is boxed so that a request parked in the admission queue above
        // holds only the small selection state, not room for every later stage (this future
        // lives, per waiter, for as long as it waits).
        Box::pin(self.pd_send(
            req,
            ctx,
            Holds {
                prefill,
                permit,
                prefill_load,
                decode,
                decode_load,
            },
        ))
        .await
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
        let leg_task = {
            let client = self.client.clone();
            let registry = self.registry.clone();
            let metrics = self.metrics.clone();
            let worker = prefill.clone();
            let ctx = ctx.clone();
            async move {
                let started = Instant::now();
                let url = worker.url().to_string();
                let result = tokio::time::timeout(timeout, async {
                    let resp = exchange(
                        &client,
                        &worker,
                        Leg::Prefill,
                        path,
                        prefill_body,
                        &ctx,
                        timeout,
                    )
                    .await?;
                    let mut body = resp.into_body();
                    while let Some(frame) = body.frame().await {
                        frame.map_err(|_| ApiError::upstream_broken(Leg::Prefill, &url))?;
                    }
                    Ok(())
                })
                .await
                .unwrap_or_else(|_| Err(ApiError::upstream_timeout(Leg::Prefill, &url)));
                // Release point: end of Prefill body, or its failure.
                drop(permit);
                drop(prefill_load);
                metrics.prefill_duration(started.elapsed());
                registry.record_outcome(&worker, worker_ok(&result));
                result
            }
        };
        let mut leg = PrefillLeg {
            handle: Some(tokio::spawn(tracing::Instrument::in_current_span(leg_task))),
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
        let first = if prefill_done {
            None
        } else {
            let wait_first = async {
                tokio::select! {
                    outcome = poll_fn(|cx| leg.poll_outcome(cx)) => outcome.map(|()| None),
                    frame = body.frame() => match frame {
                        Some(Ok(f)) => Ok(Some(f)),
                        Some(Err(_)) => Err(ApiError::upstream_broken(Leg::Decode, decode.url())),
                        None => Ok(None),
                    },
                }
            };
            let first = match tokio::time::timeout(timeout, wait_first).await {
                Ok(r) => r?,
                Err(_) => return Err(ApiError::upstream_timeout(Leg::Decode, decode.url())),
            };
            // A non-streaming answer is one block that real engines can only finish after
            // Prefill did, so waiting for Prefill costs nothing and lets a Prefill failure
            // surface as its real status (and be retried) instead of racing a mock Decode.
            if !req.stream {
                poll_fn(|cx| leg.poll_outcome(cx)).await?;
            }
            first
        };
        let relay = RelayBody::new(
            body,
            first,
            Some(leg),
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
