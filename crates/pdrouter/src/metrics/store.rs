//! The admission store (`--admission-store`): this replica's share of each Prefill worker's
//! limit, and the health of its exchanges with the store (round trip, failures, lease age).

use std::sync::atomic::AtomicU64;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::family::latency_histogram;
use super::labels::WorkerLabel;

/// The admission-store families.
#[derive(Debug)]
pub(super) struct StoreMetrics {
    share: Family<WorkerLabel, Gauge>,
    global_limit: Family<WorkerLabel, Gauge>,
    rtt: Histogram,
    errors: Counter,
    lease_age: Gauge<f64, AtomicU64>,
}

impl StoreMetrics {
    /// Creates the families and registers them, in exposition order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let share: Family<WorkerLabel, Gauge> = Family::default();
        let global_limit: Family<WorkerLabel, Gauge> = Family::default();
        let rtt: Histogram = latency_histogram();
        let errors: Counter = Counter::default();
        let lease_age: Gauge<f64, AtomicU64> = Gauge::default();
        registry.register(
            "smg_pd_prefill_admission_share",
            "This replica's share of each Prefill worker's limit (--admission-store only)",
            share.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_global_limit",
            "Each Prefill worker's limit across the admission group (--admission-store only)",
            global_limit.clone(),
        );
        registry.register(
            "smg_admission_store_rtt_seconds",
            "Round-trip time of this replica's successful admission-store exchanges",
            rtt.clone(),
        );
        registry.register(
            "smg_admission_store_errors",
            "Admission-store exchanges that failed (error or timeout)",
            errors.clone(),
        );
        registry.register(
            "smg_admission_store_lease_age_seconds",
            "Time since this replica's leases were last renewed (+Inf before the first renewal)",
            lease_age.clone(),
        );
        Self {
            share,
            global_limit,
            rtt,
            errors,
            lease_age,
        }
    }

    /// The share of worker `key` applied by this replica, of `global_limit`.
    pub(super) fn share(&self, key: &str, share: u32, global_limit: u32) {
        let l = WorkerLabel::key(key);
        self.share.get_or_create(&l).set(i64::from(share));
        self.global_limit
            .get_or_create(&l)
            .set(i64::from(global_limit));
    }

    /// Worker `key` left the registry: its share series go.
    pub(super) fn share_removed(&self, key: &str) {
        let l = WorkerLabel::key(key);
        self.share.remove(&l);
        self.global_limit.remove(&l);
    }

    /// A successful exchange took `rtt`.
    pub(super) fn exchanged(&self, rtt: Duration) {
        self.rtt.observe(rtt.as_secs_f64());
    }

    /// An exchange failed.
    pub(super) fn failed(&self) {
        self.errors.inc();
    }

    /// Time since the leases were last renewed (`None`: never, shown as +Inf).
    pub(super) fn lease_age(&self, age: Option<Duration>) {
        self.lease_age
            .set(age.map_or(f64::INFINITY, |a| a.as_secs_f64()));
    }
}
