//! The composition root's wiring: breaker transitions reach admission waiters, metrics and
//! selection in the right order.

use std::time::Duration;

use pdrouter_admission::Rejection;
use pdrouter_policy::{CacheAwareConfig, PolicyKind};

use super::*;
use crate::config::{BreakerConfig, WorkerType};
use crate::select::{Candidates, Wanted};

fn series(metrics: &Metrics, name: &str) -> Option<f64> {
    metrics
        .encode()
        .lines()
        .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
}

/// The race that used to strand waiters: something reads the breaker at its half-open
/// instant before the registry's timer runs. Here a metrics scrape, the state `GET /workers`
/// shows and a new request's selection all look first; the transition must still be
/// published once, by the timer, and the slot go to the request that was already waiting.
#[tokio::test(start_paused = true)]
async fn half_open_seen_first_by_readers_is_still_published_once_and_goes_to_the_waiter() {
    let metrics = Metrics::new();
    let admission = Admission::new(
        AdmissionConfig {
            max_inflight_per_worker: 1,
            max_inflight_tokens_per_worker: None,
            queue_size: 4,
            queue_timeout: Duration::from_secs(600),
            priorities: None,
        },
        metrics.clone() as Arc<dyn Observer>,
    );
    let timeout = Duration::from_secs(10);
    let breaker = BreakerConfig {
        enabled: true,
        failure_threshold: 1,
        success_threshold: 1,
        timeout,
        window: Duration::from_secs(120),
    };
    let registry = Registry::new(breaker, Some(admission.clone()));
    let policy = Arc::new(Policy::new(
        PolicyKind::RoundRobin,
        CacheAwareConfig::default(),
    ));
    wire_events(
        &registry,
        &metrics,
        Some(&admission),
        std::slice::from_ref(&policy),
    );
    let seen = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let s = seen.clone();
    registry.subscribe(Arc::new(move |e: &Event| {
        if let Event::BreakerChanged { to, .. } = e {
            s.lock().push(to.as_str());
        }
    }));
    let spec = WorkerSpec::new("http://p:1", WorkerType::Prefill);
    let w = registry
        .register(&spec, None, WorkerStatus::Ready)
        .unwrap()
        .remove(0);
    let selector = || {
        Candidates::new(
            registry.clone(),
            policy.clone(),
            WorkerType::Prefill,
            Wanted {
                text: Arc::from("hi"),
                routing_key: None,
                target: None,
                model: None,
                prefix_tokens: None,
            },
        )
    };
    let gauge = "smg_worker_cb_state{worker=\"http://p:1\"}";
    let half_opens = "smg_worker_cb_transitions_total{worker=\"http://p:1\",to=\"half_open\"}";

    // Half a tick off the timer wheel's millisecond grid, so the half-open instant comes
    // strictly before the tick its timer fires on: the window in which readers look first.
    tokio::time::advance(Duration::from_micros(500)).await;
    let first = admission.acquire(selector()).await.unwrap();
    let adm = admission.clone();
    let sel = selector();
    let waiter = tokio::spawn(async move { adm.acquire(sel).await });
    while admission.queued() == 0 {
        tokio::task::yield_now().await;
    }
    registry.record_outcome(&w, false);
    assert_eq!(series(&metrics, gauge), Some(1.0));
    drop(first);
    assert_eq!(admission.queued(), 1, "open: the freed slot is not usable");

    tokio::time::advance(timeout).await;
    assert_eq!(*seen.lock(), ["open"], "the timer has not run yet");
    assert_eq!(series(&metrics, gauge), Some(1.0));
    assert_eq!(w.breaker().state(), BreakerState::Open);
    assert_eq!(
        admission.acquire(selector()).await.err().map(|r| r.reason),
        Some(Rejection::Unavailable),
        "an arrival at the due instant does not get the slot"
    );
    assert_eq!(*seen.lock(), ["open"], "reading changed nothing");

    tokio::time::advance(Duration::from_millis(1)).await;
    let admitted = waiter.await.unwrap().expect("the waiter gets the slot");
    assert!(Arc::ptr_eq(&admitted.choice, &w));
    assert_eq!(*seen.lock(), ["open", "half_open"]);
    assert_eq!(series(&metrics, gauge), Some(2.0));
    assert_eq!(series(&metrics, half_opens), Some(1.0));
    assert_eq!(w.breaker().state(), BreakerState::HalfOpen);

    // A later arrival queues behind the admitted waiter; nothing is left held afterwards.
    let adm = admission.clone();
    let sel = selector();
    let later = tokio::spawn(async move { adm.acquire(sel).await });
    while admission.queued() == 0 {
        tokio::task::yield_now().await;
    }
    drop(admitted);
    drop(later.await.unwrap().expect("admitted once the slot frees"));
    assert_eq!(admission.inflight_total(), 0);
    assert_eq!(admission.queued(), 0);
    assert_eq!(*seen.lock(), ["open", "half_open"]);
}
