//! The Prefill leg: one task per PD attempt, for every transport, that sends the Prefill
//! request, reads its answer to the end and owns the Prefill slot and load until the Prefill
//! phase is over for the request.
//!
//! Invariants (the same for every engine and transport):
//! - The admission permit and the Prefill load are dropped at the answer's end, the leg's
//!   failure or the task's cancellation — or as soon as Decode has delivered its whole answer
//!   and the Prefill worker has answered ([`PrefillLeg::decode_done`]), whichever comes first:
//!   by then the KV has moved. A Prefill worker that has not answered at all keeps the slot:
//!   it may still be computing.
//! - A Prefill answer still open once Decode is done gets the configured grace to end on its
//!   own, holding nothing, and is then dropped, which aborts the request (counted either way).
//! - The outcome reaches the request when the Prefill phase is over; a leg asked to keep
//!   something of its answer (prompt logprobs, a KV handoff) reports only when its answer has
//!   ended, or fails when the grace ran out first (what it was to keep is then missing).
//! - The breaker is charged once per leg, by [`worker_ok`], unless the leg was aborted after
//!   Decode was done (the worker had answered and the KV had moved).
//! - Dropping the [`PrefillLeg`] before the outcome aborts the task, which releases what it
//!   holds; after it the task holds nothing and ends on its own within the grace.

use std::future::{Future, poll_fn};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::worker_ok;
use crate::error::{ApiError, Leg};
use crate::metrics::{AfterDecode, Metrics};
use crate::registry::{LoadGuard, Registry, Worker};
use crate::sizing::SizedPermit;

/// A transport's Prefill answer, once its head (or stream start) is in.
pub(crate) trait PrefillAnswer: Send + 'static {
    /// What the leg keeps of the answer when asked to.
    type Kept: Send + 'static;

    /// Reads the answer to its end, keeping what the request needs when `keep` is set.
    /// Dropping the future (the leg aborted) must cancel the worker's request.
    fn drain(
        &mut self,
        keep: bool,
    ) -> impl Future<Output = Result<Option<Self::Kept>, ApiError>> + Send;
}

/// What the Prefill leg reports when the Prefill phase is over.
type Outcome<K> = Result<Option<K>, ApiError>;

/// The Prefill leg running in its own task, seen from the request.
#[derive(Debug)]
pub struct PrefillLeg<K> {
    handle: Option<JoinHandle<()>>,
    outcome: Option<oneshot::Receiver<Outcome<K>>>,
    decode_done: Option<oneshot::Sender<()>>,
    /// What the leg kept of its answer, once the outcome brought it.
    kept: Option<K>,
}

impl<K> PrefillLeg<K> {
    /// Polls for the outcome of the Prefill phase.
    pub fn poll_outcome(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), ApiError>> {
        let Some(rx) = self.outcome.as_mut() else {
            return Poll::Ready(Ok(()));
        };
        let out = std::task::ready!(std::pin::Pin::new(rx).poll(cx));
        self.outcome = None;
        self.handle = None;
        Poll::Ready(match out {
            Ok(Ok(kept)) => {
                self.kept = kept;
                Ok(())
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ApiError::internal("prefill task ended early")),
        })
    }

    /// The outcome of the Prefill phase, awaited.
    pub async fn outcome(&mut self) -> Result<(), ApiError> {
        poll_fn(|cx| self.poll_outcome(cx)).await
    }

    /// What the leg kept of its answer, after a successful outcome that carried it.
    pub fn take_kept(&mut self) -> Option<K> {
        self.kept.take()
    }

    /// What the leg kept, in place (a sequential handoff takes its part before Decode is
    /// sent and leaves the rest for the answer).
    pub fn kept_mut(&mut self) -> Option<&mut K> {
        self.kept.as_mut()
    }

    /// Tells the leg that Decode has delivered its whole answer: the KV has moved, so once the
    /// Prefill worker has answered (at once, if it has), the leg releases its slot and load.
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

    /// Runs `decode` (the start of a Decode leg) beside this leg. A Prefill failure first ends
    /// the attempt with that failure (`decode` is dropped, which cancels it). Returns Decode's
    /// result and whether the Prefill phase ended meanwhile.
    pub async fn beside<T>(
        &mut self,
        decode: impl Future<Output = T>,
    ) -> Result<(T, bool), ApiError> {
        tokio::pin!(decode);
        tokio::select! {
            r = &mut decode => Ok((r, false)),
            outcome = poll_fn(|cx| self.poll_outcome(cx)) => {
                outcome?;
                Ok((decode.await, true))
            }
        }
    }
}

impl<K> Drop for PrefillLeg<K> {
    fn drop(&mut self) {
        if let Some(h) = self.handle.take() {
            h.abort();
        }
    }
}

/// What the Prefill leg task holds until the Prefill phase is over for the request.
pub(crate) struct PrefillHolds {
    permit: Option<SizedPermit>,
    load: LoadGuard,
}

impl PrefillHolds {
    pub(crate) fn new(permit: Option<SizedPermit>, load: LoadGuard) -> Self {
        PrefillHolds { permit, load }
    }

    /// Releases the slot and load, telling a self-sizing limit how the Prefill ended (`Ok`:
    /// it is over for the request).
    fn release<T>(self, outcome: &Result<T, ApiError>) {
        crate::sizing::release(self.permit, outcome);
        drop(self.load);
    }
}

/// Everything the leg task needs besides its request.
pub(crate) struct LegJob {
    worker: Arc<Worker>,
    holds: PrefillHolds,
    /// The leg's answer, its end included, comes by then.
    deadline: Instant,
    /// Keep what the answer carries for the request (see [`PrefillAnswer::drain`]).
    keep: bool,
    grace: std::time::Duration,
    registry: Arc<Registry>,
    metrics: Arc<Metrics>,
}

impl LegJob {
    /// The leg on `worker` holding `holds`, its answer due by `deadline`, with the core's
    /// grace, registry and metrics.
    pub(crate) fn new(
        core: &super::Core,
        worker: Arc<Worker>,
        holds: PrefillHolds,
        deadline: Instant,
        keep: bool,
    ) -> Self {
        LegJob {
            worker,
            holds,
            deadline,
            keep,
            grace: core.cfg.prefill_grace_after_decode,
            registry: core.registry.clone(),
            metrics: core.metrics.clone(),
        }
    }
}

/// Spawns the Prefill leg: `start` sends the request and yields its answer, which the task
/// then drains (see the module docs for when it releases what it holds).
///
/// `start` is a closure called inside the task, not a future: an unstarted future is as large
/// as its whole state machine, and the task would hold it twice (captured, then awaited). For
/// the same reason the task is one `async fn` whose parameters are only small handles: every
/// PD request allocates and fills that future (it is boxed once, below, and then moves as a
/// pointer), so every byte of it counts.
pub(crate) fn spawn<A, F, Fut>(start: F, job: LegJob) -> PrefillLeg<A::Kept>
where
    A: PrefillAnswer,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Result<A, ApiError>> + Send + 'static,
{
    let (decode_done, decode_done_rx) = oneshot::channel();
    let (outcome_tx, outcome) = oneshot::channel();
    let span = crate::telemetry::leg_span(Leg::Prefill, job.worker.url());
    let signals = Signals {
        decode_done: decode_done_rx,
        outcome: outcome_tx,
    };
    let task = run(start, job, signals);
    PrefillLeg {
        // Boxed here, once: the task cell then holds a pointer, and the future is not copied
        // again on its way through `spawn`.
        handle: Some(tokio::spawn(Box::pin(tracing::Instrument::instrument(
            task, span,
        )))),
        outcome: Some(outcome),
        decode_done: Some(decode_done),
        kept: None,
    }
}

/// The leg task's side of [`PrefillLeg`].
struct Signals<K> {
    decode_done: oneshot::Receiver<()>,
    outcome: oneshot::Sender<Outcome<K>>,
}

/// The leg task: runs the leg before its deadline, then counts how it went (not when it was
/// aborted after Decode was done: the grace ran out).
///
/// One `async fn` on purpose: every nested one would store its own copy of `start`.
async fn run<A, F, Fut>(start: F, job: LegJob, signals: Signals<A::Kept>)
where
    A: PrefillAnswer,
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<A, ApiError>>,
{
    let started = Instant::now();
    let Signals {
        mut decode_done,
        outcome,
    } = signals;
    let (url, deadline, keep) = (job.worker.url(), job.deadline, job.keep);
    let timed_out = || ApiError::upstream_timeout(Leg::Prefill, url);
    // `start()` is made inside the timeout, so its state exists once in the task.
    let head = tokio::time::timeout_at(deadline, start())
        .await
        .unwrap_or_else(|_| Err(timed_out()));
    let holds = job.holds;
    let ended = match head {
        Err(e) => {
            tracing::warn!(code = e.code, "Prefill leg failed to start");
            holds.release(&Err::<(), _>(e.clone()));
            let _ = outcome.send(Err(e.clone()));
            Some(Err(e))
        }
        Ok(mut answer) => {
            let drain = async {
                tokio::time::timeout_at(deadline, answer.drain(keep))
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
                    if !keep && let Some(tx) = outcome.take() {
                        let _ = tx.send(Ok(None));
                    }
                    let r = drain_after_decode(&mut drain, job.grace, &job.metrics).await;
                    let status = r.as_ref().map(status_of);
                    if let Some(tx) = outcome {
                        let _ = tx.send(r.unwrap_or_else(|| Err(timed_out())));
                    }
                    status
                }
                r = &mut drain => {
                    holds.release(&r);
                    let status = status_of(&r);
                    let _ = outcome.send(r);
                    Some(status)
                }
            }
        }
    };
    if let Some(result) = ended {
        job.metrics.prefill_duration(started.elapsed());
        job.registry.record_outcome(&job.worker, worker_ok(&result));
    }
}

/// Gives a Prefill leg that outlived Decode `grace` to end and counts how it went; `None`
/// when the grace ran out (dropping `drain` then aborts the leg).
async fn drain_after_decode<T>(
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

/// The leg's own result, without what it kept.
fn status_of<K>(r: &Outcome<K>) -> Result<(), ApiError> {
    r.as_ref().map(|_| ()).map_err(Clone::clone)
}

#[cfg(test)]
mod tests;
