//! Per-worker load, health and circuit-breaker series, and retries by endpoint. A worker's
//! series come with its registration and go with its removal (its load gauge once it holds
//! nothing in flight), so a removed worker leaves no stale series behind.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::{EndpointLabel, TransitionLabels, WorkerLabel};
use crate::registry::{BreakerState, Worker, WorkerStatus};

/// The per-worker families and retries.
#[derive(Debug)]
pub(super) struct WorkerMetrics {
    active: Family<WorkerLabel, Gauge>,
    /// Removals from `active` so far. A worker keeps a handle on its load series with the
    /// count at the time; the handle is the family's series while the count is unchanged
    /// (only a removal can replace a series), and is taken again after any removal.
    active_removals: AtomicU64,
    health: Family<WorkerLabel, Gauge>,
    cb_state: Family<WorkerLabel, Gauge>,
    cb_transitions: Family<TransitionLabels, Counter>,
    retries: Family<EndpointLabel, Counter>,
}

impl WorkerMetrics {
    /// Creates the families and registers them, in exposition order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let active: Family<WorkerLabel, Gauge> = Family::default();
        let health: Family<WorkerLabel, Gauge> = Family::default();
        let cb_state: Family<WorkerLabel, Gauge> = Family::default();
        let cb_transitions: Family<TransitionLabels, Counter> = Family::default();
        let retries: Family<EndpointLabel, Counter> = Family::default();
        registry.register(
            "smg_worker_requests_active",
            "Backend requests in flight per worker (one per sub-request)",
            active.clone(),
        );
        registry.register(
            "smg_worker_health",
            "1 if the worker is ready, else 0",
            health.clone(),
        );
        registry.register(
            "smg_worker_cb_state",
            "Circuit breaker state per worker: 0 closed, 1 open, 2 half-open",
            cb_state.clone(),
        );
        registry.register(
            "smg_worker_cb_transitions",
            "Circuit breaker state changes per worker",
            cb_transitions.clone(),
        );
        registry.register(
            "smg_worker_retries",
            "Retried backend attempts, by endpoint",
            retries.clone(),
        );
        Self {
            active,
            active_removals: AtomicU64::new(0),
            health,
            cb_state,
            cb_transitions,
            retries,
        }
    }

    /// One retry.
    pub(super) fn retry(&self, route: &'static str) {
        self.retries.get_or_create(&EndpointLabel { route }).inc();
    }

    /// Worker load changed.
    pub(super) fn load(&self, w: &Worker) {
        let load = w.load();
        if w.status() == WorkerStatus::Draining && load == 0 {
            self.remove_active(&WorkerLabel::of(w));
            return;
        }
        // Read before the handle is used: a removal after this read leaves the set below
        // as if it had come first (the series goes), which is what a lookup racing the
        // removal could give too.
        let removals = self.active_removals.load(Ordering::Acquire);
        let mut kept = w.load_series.lock();
        match &*kept {
            Some((at, series)) if *at == removals => {
                series.set(load as i64);
            }
            _ => {
                let series = self.active.get_or_create(&WorkerLabel::of(w)).clone();
                series.set(load as i64);
                *kept = Some((removals, series));
            }
        }
    }

    /// Removes a load series; every kept handle is taken again on its next use.
    fn remove_active(&self, l: &WorkerLabel) {
        self.active.remove(l);
        self.active_removals.fetch_add(1, Ordering::AcqRel);
    }

    /// A worker was registered: its series start from its current state.
    pub(super) fn added(&self, w: &Worker) {
        let l = WorkerLabel::of(w);
        self.health
            .get_or_create(&l)
            .set(i64::from(w.status() == WorkerStatus::Ready));
        self.cb_state
            .get_or_create(&l)
            .set(w.breaker().state() as i64);
        self.active.get_or_create(&l).set(w.load() as i64);
    }

    /// A worker's registration left: its series go (the load gauge only once it is idle).
    pub(super) fn removed(&self, w: &Worker) {
        let l = WorkerLabel::of(w);
        self.health.remove(&l);
        self.cb_state.remove(&l);
        for to in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            self.cb_transitions.remove(&TransitionLabels {
                worker: l.url().to_owned(),
                to: to.as_str().to_string(),
            });
        }
        if w.load() == 0 {
            self.remove_active(&l);
        }
    }

    /// A worker's status changed. Draining is not a health state: the gauge keeps its value.
    pub(super) fn status_changed(&self, w: &Worker, to: WorkerStatus) {
        if to != WorkerStatus::Draining {
            self.health
                .get_or_create(&WorkerLabel::of(w))
                .set(i64::from(to == WorkerStatus::Ready));
        }
    }

    /// A worker's circuit breaker changed state.
    pub(super) fn breaker_changed(&self, w: &Worker, to: BreakerState) {
        let l = WorkerLabel::of(w);
        self.cb_state.get_or_create(&l).set(to as i64);
        self.cb_transitions
            .get_or_create(&TransitionLabels {
                worker: l.url().to_owned(),
                to: to.as_str().to_string(),
            })
            .inc();
    }
}
