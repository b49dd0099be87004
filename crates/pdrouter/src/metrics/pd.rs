//! Prefill/decode timings, EPD Encode calls per Encode worker, and how Prefill legs that
//! outlived their Decode ended ([`AfterDecode`]).

use std::sync::OnceLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::family::latency_histogram;
use super::labels::{OutcomeLabel, WorkerLabel};
use crate::registry::Worker;

/// How a Prefill leg still open when Decode had delivered the whole answer ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterDecode {
    /// Its body ended within the grace.
    Drained,
    /// It failed (broke, errored or timed out) within the grace.
    Failed,
    /// The grace ran out and the router dropped it.
    Aborted,
}

impl AfterDecode {
    fn as_str(self) -> &'static str {
        match self {
            Self::Drained => "drained",
            Self::Failed => "failed",
            Self::Aborted => "aborted",
        }
    }
}

/// How a sequential KV handoff (vLLM PD) went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvHandoff {
    /// The Prefill answered with transfer params, relayed to Decode.
    Relayed,
    /// The Prefill ended before its one-token cap (no params): Decode computed the prompt.
    Recomputed,
    /// The request needed several Decode requests (`n` > 1, several prompts): no Prefill leg.
    Skipped,
}

impl KvHandoff {
    fn as_str(self) -> &'static str {
        match self {
            Self::Relayed => "relayed",
            Self::Recomputed => "recomputed",
            Self::Skipped => "skipped",
        }
    }
}

/// The PD and EPD families.
#[derive(Debug)]
pub(super) struct PdMetrics {
    ttft: Histogram,
    prefill_duration: Histogram,
    encode_requests: Family<WorkerLabel, Counter>,
    encode_failures: Family<WorkerLabel, Counter>,
    prefill_after_decode: Family<OutcomeLabel, Counter>,
    kv_handoffs: Family<OutcomeLabel, Counter>,
    /// Kept handles of the outcome series (never removed), by the outcome's index: an
    /// outcome counted per request costs an increment, not a label and a lookup.
    after_decode_series: [OnceLock<Counter>; 3],
    kv_handoff_series: [OnceLock<Counter>; 3],
}

impl PdMetrics {
    /// Creates the families and registers them, in exposition order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let ttft: Histogram = latency_histogram();
        let prefill_duration: Histogram = latency_histogram();
        let encode_requests: Family<WorkerLabel, Counter> = Family::default();
        let encode_failures: Family<WorkerLabel, Counter> = Family::default();
        let prefill_after_decode: Family<OutcomeLabel, Counter> = Family::default();
        let kv_handoffs: Family<OutcomeLabel, Counter> = Family::default();
        registry.register(
            "smg_pd_ttft_seconds",
            "PD time to first byte of the Decode answer, from request received",
            ttft.clone(),
        );
        registry.register(
            "smg_pd_prefill_duration_seconds",
            "PD Prefill leg time, from send to end of body",
            prefill_duration.clone(),
        );
        registry.register(
            "smg_pd_encode_requests",
            "EPD Encode calls sent (one per image item), per Encode worker",
            encode_requests.clone(),
        );
        registry.register(
            "smg_pd_encode_failures",
            "EPD Encode calls that failed, timed out or were not accepted, per Encode worker \
             (the request's fate is the Prefill's: it waits for the embedding itself)",
            encode_failures.clone(),
        );
        registry.register(
            "smg_pd_prefill_after_decode",
            "PD Prefill legs still open when Decode had delivered the whole answer (their slot \
             freed then), by how they ended: drained, failed, or aborted after the grace",
            prefill_after_decode.clone(),
        );
        registry.register(
            "smg_pd_kv_handoffs",
            "vLLM PD handoffs, by outcome: relayed (Decode got the Prefill's transfer params), \
             recomputed (the Prefill ended before its cap; Decode computed the prompt), skipped \
             (several choices or prompts: Decode alone)",
            kv_handoffs.clone(),
        );
        Self {
            ttft,
            prefill_duration,
            encode_requests,
            encode_failures,
            prefill_after_decode,
            kv_handoffs,
            after_decode_series: Default::default(),
            kv_handoff_series: Default::default(),
        }
    }

    /// A vLLM PD handoff went as `outcome` says.
    pub(super) fn kv_handoff(&self, outcome: KvHandoff) {
        outcome_series(
            &self.kv_handoffs,
            &self.kv_handoff_series[outcome as usize],
            outcome.as_str(),
        )
        .inc();
    }

    /// PD time to first byte.
    pub(super) fn ttft(&self, d: Duration) {
        self.ttft.observe(d.as_secs_f64());
    }

    /// PD Prefill leg duration.
    pub(super) fn prefill_duration(&self, d: Duration) {
        self.prefill_duration.observe(d.as_secs_f64());
    }

    /// An Encode call to `w` was sent.
    pub(super) fn encode_sent(&self, w: &Worker) {
        self.encode_requests
            .get_or_create(&WorkerLabel::of(w))
            .inc();
    }

    /// An Encode call to `w` failed.
    pub(super) fn encode_failed(&self, w: &Worker) {
        self.encode_failures
            .get_or_create(&WorkerLabel::of(w))
            .inc();
    }

    /// A Prefill leg that outlived Decode ended.
    pub(super) fn prefill_after_decode(&self, outcome: AfterDecode) {
        outcome_series(
            &self.prefill_after_decode,
            &self.after_decode_series[outcome as usize],
            outcome.as_str(),
        )
        .inc();
    }

    /// A worker was removed (not replaced): its Encode counters go. A replacement keeps the
    /// URL, and with it the counts.
    pub(super) fn worker_removed(&self, w: &Worker) {
        let l = WorkerLabel::of(w);
        self.encode_requests.remove(&l);
        self.encode_failures.remove(&l);
    }
}

/// The series of `outcome` in `family`, kept in `kept` from its first use on.
fn outcome_series<'a>(
    family: &Family<OutcomeLabel, Counter>,
    kept: &'a OnceLock<Counter>,
    outcome: &str,
) -> &'a Counter {
    kept.get_or_init(|| {
        family
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_string(),
            })
            .clone()
    })
}
