//! Every metric the router exports: names, types, help text, labels and buckets.
//!
//! Label values are bounded: worker URLs as configured (with `@rank`), route templates,
//! enumerated reasons and codes — never raw messages. A removed worker's series are removed
//! once it holds nothing in flight. Nothing a client sends becomes a label as it is: the
//! method is one of those the router serves or `other` ([`method_label`]), the path a route
//! template or `other`, the status a number in 100..=999 and the error code one of the
//! router's own (`&'static str`).
//!
//! Each submodule owns one group of families (their names, help, labels and buckets, and
//! how they are updated): `requests` (HTTP and routing), `workers` (load, health, breakers,
//! retries), `pd` (PD timings, EPD Encode calls, Prefill legs after Decode), `admission`
//! (Prefill admission), `limiter` (the global limiter), `store` (the admission store),
//! `scheduler` (priority classes) and `discovery` (Kubernetes pod discovery); `labels` and `family` are what they share. [`Metrics`]
//! registers the groups in a fixed order, which is the exposition's order, and is the one
//! handle the rest of the router holds. The submodules import nothing from this one.
//!
//! The exposition is a wire contract (dashboards read it): the `tests` submodule compares
//! it with a golden file.

mod admission;
mod discovery;
mod family;
mod labels;
mod limiter;
mod pd;
mod requests;
mod scheduler;
mod store;
mod workers;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry as PromRegistry;

use crate::registry::{Event, Worker};

use admission::AdmissionMetrics;
pub use labels::{
    AdmitLabels, ClampLabels, ClassLabel, EndpointLabel, ErrorLabels, OutcomeLabel, ReasonLabel,
    ResponseLabels, ResultLabel, RouteLabels, TenantLabel, TransitionLabels, WorkerLabel,
};
use limiter::LimiterMetrics;
use pd::PdMetrics;
pub use pd::{AfterDecode, KvHandoff};
use requests::RequestMetrics;
pub use requests::method_label;
use scheduler::SchedulerMetrics;
use store::StoreMetrics;
use workers::WorkerMetrics;

/// All metric handles.
#[derive(Debug)]
pub struct Metrics {
    registry: PromRegistry,
    requests: RequestMetrics,
    workers: WorkerMetrics,
    pd: PdMetrics,
    admission: AdmissionMetrics,
    limiter: LimiterMetrics,
    manual_keys: Gauge,
    store: StoreMetrics,
    scheduler: SchedulerMetrics,
    discovery: discovery::DiscoveryMetrics,
}

impl Metrics {
    /// Creates and registers every family.
    pub fn new() -> Arc<Self> {
        let mut registry = PromRegistry::default();
        // prometheus-client appends `_total` to counters itself. The order of registration is
        // the order of the exposition.
        let requests = RequestMetrics::register(&mut registry);
        let workers = WorkerMetrics::register(&mut registry);
        let pd = PdMetrics::register(&mut registry);
        let admission = AdmissionMetrics::register(&mut registry);
        let limiter = LimiterMetrics::register(&mut registry);
        let manual_keys = Gauge::default();
        registry.register(
            "smg_manual_policy_cache_entries",
            "Routing keys the manual policy remembers",
            manual_keys.clone(),
        );
        let store = StoreMetrics::register(&mut registry);
        let scheduler = SchedulerMetrics::register(&mut registry);
        let discovery = discovery::DiscoveryMetrics::register(&mut registry);
        Arc::new(Self {
            registry,
            requests,
            workers,
            pd,
            admission,
            limiter,
            manual_keys,
            store,
            scheduler,
            discovery,
        })
    }

    /// Pod discovery registered a worker of `role`.
    pub fn discovery_registered(&self, role: &'static str) {
        self.discovery.registered(role);
    }

    /// Pod discovery removed a worker of `role`.
    pub fn discovery_deregistered(&self, role: &'static str) {
        self.discovery.deregistered(role);
    }

    /// A pod LIST or WATCH failed, or a pod could not be read.
    pub fn discovery_sync_error(&self) {
        self.discovery.sync_error();
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// The share of worker `key` applied by this replica, of `global_limit`.
    pub fn store_share(&self, key: &str, share: u32, global_limit: u32) {
        self.store.share(key, share, global_limit);
    }

    /// Worker `key` left the registry: its share series go.
    pub fn store_share_removed(&self, key: &str) {
        self.store.share_removed(key);
    }

    /// A successful admission-store exchange took `rtt`.
    pub fn store_exchanged(&self, rtt: Duration) {
        self.store.exchanged(rtt);
    }

    /// An admission-store exchange failed.
    pub fn store_failed(&self) {
        self.store.failed();
    }

    /// Time since the leases were last renewed (`None`: never).
    pub fn store_lease_age(&self, age: Option<Duration>) {
        self.store.lease_age(age);
    }

    /// The classes' configured queue sizes (set once at startup when priority classes are on).
    pub fn priority_limits(&self, classes: &pdrouter_admission::PriorityClasses) {
        self.scheduler.limits(classes);
    }

    /// How a request's class was found: counts unknown header values and clamps.
    pub fn priority_resolved(&self, r: &crate::priority::Resolution<'_>) {
        self.scheduler.resolved(r);
    }

    /// Routing keys the manual policies remember in all.
    pub fn manual_keys(&self, keys: usize) {
        self.manual_keys.set(keys as i64);
    }

    /// One HTTP request handled. `path` is a route template (or `other`), `code` one of the
    /// router's error codes.
    pub fn http_request(
        &self,
        method: &http::Method,
        path: &str,
        status: http::StatusCode,
        code: Option<&'static str>,
        elapsed: Duration,
    ) {
        self.requests
            .http_request(method, path, status, code, elapsed);
    }

    /// A client connection was accepted.
    pub fn connection_opened(&self) {
        self.requests.connection_opened();
    }

    /// A client connection closed.
    pub fn connection_closed(&self) {
        self.requests.connection_closed();
    }

    /// One inference request routed.
    pub fn routed(&self, route: &'static str) {
        self.requests.routed(route);
    }

    /// One inference request failed.
    pub fn route_error(&self, route: &'static str, code: &'static str) {
        self.requests.route_error(route, code);
    }

    /// One retry.
    pub fn retry(&self, route: &'static str) {
        self.workers.retry(route);
    }

    /// PD time to first byte.
    pub fn ttft(&self, d: Duration) {
        self.pd.ttft(d);
    }

    /// PD Prefill leg duration.
    pub fn prefill_duration(&self, d: Duration) {
        self.pd.prefill_duration(d);
    }

    /// An Encode call to `w` was sent.
    pub fn encode_sent(&self, w: &Worker) {
        self.pd.encode_sent(w);
    }

    /// An Encode call to `w` failed.
    pub fn encode_failed(&self, w: &Worker) {
        self.pd.encode_failed(w);
    }

    /// A Prefill leg that outlived Decode ended.
    pub fn prefill_after_decode(&self, outcome: AfterDecode) {
        self.pd.prefill_after_decode(outcome);
    }

    /// A vLLM PD handoff went as `outcome` says.
    pub fn kv_handoff(&self, outcome: KvHandoff) {
        self.pd.kv_handoff(outcome);
    }

    /// Worker load changed.
    pub fn worker_load(&self, w: &Worker) {
        self.workers.load(w);
    }

    /// Applies a registry event to the per-worker series.
    pub fn on_event(&self, e: &Event) {
        match e {
            Event::Registered(w) => self.add_worker(w),
            Event::Replaced { old, new } => {
                self.workers.removed(old);
                self.add_worker(new);
            }
            Event::Removed(w) => {
                self.workers.removed(w);
                // Counters survive a replacement (same URL), not a removal.
                self.pd.worker_removed(w);
            }
            Event::StatusChanged { worker, to, .. } => self.workers.status_changed(worker, *to),
            Event::BreakerChanged { worker, to } => self.workers.breaker_changed(worker, *to),
        }
    }

    fn add_worker(&self, w: &Worker) {
        self.workers.added(w);
        self.admission.worker_added(w);
    }

    /// A Prefill worker's admission limits (`key` = its slot key): the count unless there is
    /// none (only a token budget), the token budget if any.
    pub fn admission_limits(&self, key: &str, count: u32, tokens: Option<u32>) {
        self.admission.limits(key, count, tokens);
    }
}

impl crate::limiter::LimiterObserver for Metrics {
    fn decided(&self, allowed: bool) {
        self.limiter.decided(allowed);
    }

    fn levels(&self, inflight: usize, queued: usize) {
        self.limiter.levels(inflight, queued);
    }
}

impl pdrouter_admission::Observer for Metrics {
    fn inflight_changed(&self, key: &Arc<str>, inflight: u32) {
        self.admission.inflight_changed(key, inflight);
    }

    fn tokens_changed(&self, key: &Arc<str>, tokens: u32) {
        self.admission.tokens_changed(key, tokens);
    }

    fn queued_changed(&self, queued: usize) {
        self.admission.queued_changed(queued);
    }

    fn admitted(&self, waited: Duration) {
        self.admission.admitted(waited);
    }

    fn rejected(&self, reason: pdrouter_admission::Rejection) {
        self.admission.rejected(reason);
    }

    fn priority_outcome(
        &self,
        priority: pdrouter_admission::Priority,
        outcome: pdrouter_admission::PriorityOutcome,
    ) {
        self.scheduler.outcome(priority, outcome);
    }

    fn priority_levels(
        &self,
        priority: pdrouter_admission::Priority,
        queued: usize,
        inflight: usize,
    ) {
        self.scheduler.levels(priority, queued, inflight);
    }

    fn slot_forgotten(&self, key: &str) {
        self.admission.slot_forgotten(key);
    }
}
