//! The Prefill-leg task on a paused clock, with a scripted answer: when it releases what it
//! holds, what it reports, and how it charges the breaker.

use std::time::Duration;

use tokio::sync::oneshot;

use super::*;
use crate::config::{BreakerConfig, WorkerSpec, WorkerType};
use crate::registry::{BreakerState, WorkerStatus};

/// An answer whose end (and what it keeps) the test decides.
struct Scripted {
    end: Option<oneshot::Receiver<Result<Option<u32>, ApiError>>>,
}

impl PrefillAnswer for Scripted {
    type Kept = u32;

    async fn drain(&mut self, _keep: bool) -> Result<Option<u32>, ApiError> {
        match self.end.take() {
            Some(rx) => rx.await.unwrap_or(Ok(None)),
            None => std::future::pending().await,
        }
    }
}

struct Fixture {
    registry: Arc<Registry>,
    worker: Arc<Worker>,
    metrics: Arc<Metrics>,
}

fn fixture() -> Fixture {
    let breaker = BreakerConfig {
        enabled: true,
        failure_threshold: 1,
        success_threshold: 1,
        timeout: Duration::from_secs(60),
        window: Duration::from_secs(120),
    };
    let registry = Registry::new(breaker, None);
    let spec = WorkerSpec::new("http://p:1", WorkerType::Prefill);
    let worker = registry
        .register(&spec, None, WorkerStatus::Ready)
        .unwrap()
        .remove(0);
    Fixture {
        registry,
        worker,
        metrics: Metrics::new(),
    }
}

const GRACE: Duration = Duration::from_secs(2);

impl Fixture {
    fn job(&self, keep: bool) -> LegJob {
        LegJob {
            worker: self.worker.clone(),
            holds: PrefillHolds::new(None, LoadGuard::new(self.worker.clone(), 1)),
            deadline: Instant::now() + Duration::from_secs(30),
            keep,
            grace: GRACE,
            registry: self.registry.clone(),
            metrics: self.metrics.clone(),
        }
    }

    /// A leg whose answer starts at once and ends when the returned sender says.
    fn leg(
        &self,
        keep: bool,
    ) -> (
        PrefillLeg<u32>,
        oneshot::Sender<Result<Option<u32>, ApiError>>,
    ) {
        let (tx, rx) = oneshot::channel();
        let start = move || async move { Ok(Scripted { end: Some(rx) }) };
        (spawn(start, self.job(keep)), tx)
    }

    fn after_decode(&self, outcome: &str) -> bool {
        self.metrics.encode().contains(&format!(
            "smg_pd_prefill_after_decode_total{{outcome=\"{outcome}\"}} 1"
        ))
    }
}

/// Lets the spawned task run until it waits again.
async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn the_load_goes_with_the_answers_end() {
    let f = fixture();
    let (mut leg, end) = f.leg(false);
    settle().await;
    assert_eq!(f.worker.load(), 1, "held while the answer runs");
    end.send(Ok(None)).unwrap();
    leg.outcome().await.unwrap();
    settle().await;
    assert_eq!(f.worker.load(), 0);
    assert_eq!(f.worker.breaker().state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn decode_done_releases_at_once_and_the_grace_aborts_a_leg_that_does_not_end() {
    let f = fixture();
    let (mut leg, _end) = f.leg(false);
    settle().await;
    leg.decode_done();
    leg.outcome().await.unwrap();
    settle().await;
    assert_eq!(f.worker.load(), 0, "released once Decode is done");
    tokio::time::advance(GRACE + Duration::from_millis(1)).await;
    settle().await;
    assert!(f.after_decode("aborted"), "{}", f.metrics.encode());
    // Aborted after Decode was done: not the worker's failure.
    assert_eq!(f.worker.breaker().state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn a_leg_ending_within_the_grace_is_counted_drained() {
    let f = fixture();
    let (mut leg, end) = f.leg(false);
    settle().await;
    leg.decode_done();
    leg.outcome().await.unwrap();
    end.send(Ok(None)).unwrap();
    settle().await;
    assert!(f.after_decode("drained"), "{}", f.metrics.encode());
}

#[tokio::test(start_paused = true)]
async fn a_kept_answer_reports_only_at_its_end_though_it_releases_at_decode_done() {
    let f = fixture();
    let (mut leg, end) = f.leg(true);
    settle().await;
    leg.decode_done();
    settle().await;
    assert_eq!(f.worker.load(), 0, "released once Decode is done");
    let waiting = tokio::time::timeout(Duration::from_millis(100), leg.outcome()).await;
    assert!(waiting.is_err(), "the outcome waits for what the leg keeps");
    end.send(Ok(Some(7))).unwrap();
    leg.outcome().await.unwrap();
    assert_eq!(leg.take_kept(), Some(7));
}

#[tokio::test(start_paused = true)]
async fn a_kept_answer_missing_after_the_grace_is_an_error() {
    let f = fixture();
    let (mut leg, _end) = f.leg(true);
    settle().await;
    leg.decode_done();
    let e = leg.outcome().await.unwrap_err();
    assert_eq!(e.code, ApiError::upstream_timeout(Leg::Prefill, "x").code);
}

#[tokio::test(start_paused = true)]
async fn a_retryable_failure_counts_against_the_worker() {
    let f = fixture();
    let url = f.worker.url().to_owned();
    let start =
        move || async move { Err::<Scripted, _>(ApiError::upstream_broken(Leg::Prefill, &url)) };
    let mut leg = spawn(start, f.job(false));
    assert!(leg.outcome().await.is_err());
    settle().await;
    assert_eq!(f.worker.load(), 0);
    assert_eq!(f.worker.breaker().state(), BreakerState::Open);
}

#[tokio::test(start_paused = true)]
async fn a_client_error_does_not_count_against_the_worker() {
    let f = fixture();
    let url = f.worker.url().to_owned();
    let start = move || async move {
        Err::<Scripted, _>(ApiError::upstream_status(
            Leg::Prefill,
            &url,
            http::StatusCode::BAD_REQUEST,
            "bad",
        ))
    };
    let mut leg = spawn(start, f.job(false));
    assert!(leg.outcome().await.is_err());
    settle().await;
    assert_eq!(f.worker.breaker().state(), BreakerState::Closed);
}

#[tokio::test(start_paused = true)]
async fn dropping_the_leg_before_its_outcome_releases_what_it_holds() {
    let f = fixture();
    let (leg, _end) = f.leg(false);
    settle().await;
    assert_eq!(f.worker.load(), 1);
    drop(leg);
    settle().await;
    assert_eq!(f.worker.load(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_prefill_failure_ends_the_decode_start_beside_it() {
    let f = fixture();
    let (mut leg, end) = f.leg(false);
    end.send(Err(ApiError::upstream_broken(Leg::Prefill, "p")))
        .unwrap();
    let decode = std::future::pending::<()>();
    assert!(leg.beside(decode).await.is_err());
}
