//! The router's Prefill admission: per-worker in-flight counts, tokens and limits, the wait
//! queue and its rejections, as the admission controller reports them
//! ([`pdrouter_admission::Observer`], implemented by `Metrics`). A worker's
//! series go when the controller says its forgotten slot is idle.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::family::latency_histogram;
use super::labels::{ReasonLabel, WorkerLabel};
use crate::registry::Worker;

/// The Prefill admission families.
#[derive(Debug)]
pub(super) struct AdmissionMetrics {
    inflight: Family<WorkerLabel, Gauge>,
    inflight_tokens: Family<WorkerLabel, Gauge>,
    limit: Family<WorkerLabel, Gauge>,
    limit_tokens: Family<WorkerLabel, Gauge>,
    queued: Gauge,
    wait: Histogram,
    rejections: Family<ReasonLabel, Counter>,
}

impl AdmissionMetrics {
    /// Creates the families and registers them, in exposition order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let inflight: Family<WorkerLabel, Gauge> = Family::default();
        let inflight_tokens: Family<WorkerLabel, Gauge> = Family::default();
        let limit: Family<WorkerLabel, Gauge> = Family::default();
        let limit_tokens: Family<WorkerLabel, Gauge> = Family::default();
        let queued: Gauge = Gauge::default();
        let wait: Histogram = latency_histogram();
        let rejections: Family<ReasonLabel, Counter> = Family::default();
        registry.register(
            "smg_pd_prefill_admission_inflight",
            "Prefill requests this router has in flight per Prefill worker (router admission only)",
            inflight.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_inflight_tokens",
            "Prompt tokens of the Prefill requests this router has in flight per Prefill worker \
             (router admission only; estimated from the body for HTTP workers)",
            inflight_tokens.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_limit",
            "Prefill requests this router admits at once per Prefill worker (its current limit; \
             changes at run time with --prefill-max-inflight-requests-per-worker auto)",
            limit.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_limit_tokens",
            "Prompt tokens this router admits at once per Prefill worker (its current token \
             budget; changes at run time with --prefill-max-inflight-tokens-per-worker auto)",
            limit_tokens.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_queued",
            "Requests waiting in this router's Prefill admission queue",
            queued.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_wait_seconds",
            "Time admitted requests waited for a Prefill slot (0 when admitted at once)",
            wait.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_rejections",
            "Requests rejected by Prefill admission, by reason",
            rejections.clone(),
        );
        Self {
            inflight,
            inflight_tokens,
            limit,
            limit_tokens,
            queued,
            wait,
            rejections,
        }
    }

    /// A worker was registered: a Prefill worker's slot series start from the slot's state.
    pub(super) fn worker_added(&self, w: &Worker) {
        if let Some(slot) = w.slot() {
            let l = WorkerLabel::of(w);
            self.inflight
                .get_or_create(&l)
                .set(i64::from(slot.inflight()));
            self.inflight_tokens
                .get_or_create(&l)
                .set(i64::from(slot.inflight_tokens()));
            self.limits(l.url(), slot.limit(), slot.token_limit());
        }
    }

    /// A Prefill worker's admission limits (`key` = its slot key): the count unless there is
    /// none (only a token budget), the token budget if any.
    pub(super) fn limits(&self, key: &str, count: u32, tokens: Option<u32>) {
        let l = WorkerLabel::key(key);
        if count != crate::config::NO_COUNT_LIMIT {
            self.limit.get_or_create(&l).set(i64::from(count));
        }
        if let Some(t) = tokens {
            self.limit_tokens.get_or_create(&l).set(i64::from(t));
        }
    }

    /// The in-flight count of the slot `key`.
    pub(super) fn inflight_changed(&self, key: &Arc<str>, inflight: u32) {
        self.inflight
            .get_or_create(&WorkerLabel::shared(key))
            .set(i64::from(inflight));
    }

    /// The in-flight prompt tokens of the slot `key`.
    pub(super) fn tokens_changed(&self, key: &Arc<str>, tokens: u32) {
        self.inflight_tokens
            .get_or_create(&WorkerLabel::shared(key))
            .set(i64::from(tokens));
    }

    /// The queue length.
    pub(super) fn queued_changed(&self, queued: usize) {
        self.queued.set(queued as i64);
    }

    /// A request was admitted after waiting `waited`.
    pub(super) fn admitted(&self, waited: Duration) {
        self.wait.observe(waited.as_secs_f64());
    }

    /// A request was rejected.
    pub(super) fn rejected(&self, reason: pdrouter_admission::Rejection) {
        self.rejections
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().to_string(),
            })
            .inc();
    }

    /// The slot `key` was forgotten and is idle: its series go.
    pub(super) fn slot_forgotten(&self, key: &str) {
        let label = WorkerLabel::key(key);
        self.inflight.remove(&label);
        self.inflight_tokens.remove(&label);
        self.limit.remove(&label);
        self.limit_tokens.remove(&label);
    }
}
