//! Every metric the router exports: names, types, help text, labels and buckets, in one place.
//!
//! Label values are bounded: worker URLs as configured (with `@rank`), route templates,
//! enumerated reasons and codes — never raw messages. A removed worker's series are removed
//! once it holds nothing in flight. Nothing a client sends becomes a label as it is: the
//! method is one of those the router serves or `other` ([`method_label`]), the path a route
//! template or `other`, the status a number in 100..=999 and the error code one of the
//! router's own (`&'static str`).

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry as PromRegistry;

use crate::registry::{BreakerState, Event, Worker, WorkerStatus};

/// Label: one worker.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    /// Worker URL as configured.
    pub worker: String,
}

/// Labels: method and route template.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// HTTP method the router serves, or `other` ([`method_label`]).
    pub method: String,
    /// Route template (`other` for unknown paths).
    pub path: String,
}

/// Labels: response status and error code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    /// Numeric status.
    pub status_code: String,
    /// `X-SMG-Error-Code`, or `none`.
    pub error_code: String,
}

/// Label: routed endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    /// Route template.
    pub route: String,
}

/// Labels: endpoint and error code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// Route template.
    pub route: String,
    /// Error code.
    pub error_code: String,
}

/// Labels: breaker transition.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TransitionLabels {
    /// Worker URL.
    pub worker: String,
    /// New state.
    pub to: String,
}

/// Label: admission rejection reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `queue_full`, `queue_timeout` or `unavailable`.
    pub reason: String,
}

/// Label: a global limiter decision.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `allowed` or `rejected`.
    pub result: &'static str,
}

/// Label: a priority class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabel {
    /// `bulk`, `default`, `interactive` or `system`.
    pub class: &'static str,
}

/// Labels: a priority class and how a request of it left the queue.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmitLabels {
    /// The class.
    pub class: &'static str,
    /// `admitted`, `rejected_queue_full`, `rejected_queue_timeout`, `rejected_unavailable` or
    /// `client_cancelled`.
    pub outcome: &'static str,
}

/// Labels: a request's class capped by its tenant.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClampLabels {
    /// A tenant listed in the priority file, `other` or `anonymous`.
    pub tenant: String,
    /// The class the header asked for.
    pub requested_class: &'static str,
    /// The class it got.
    pub effective_class: &'static str,
}

/// Label: a tenant (listed in the priority file, `other` or `anonymous`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    /// The tenant.
    pub tenant: String,
}

/// Label: how a Prefill leg that outlived Decode ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    /// `drained`, `failed` or `aborted`.
    pub outcome: String,
}

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

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The `method` label: a method some route serves (`HEAD` with `GET`), else `other`. Any token
/// is a valid extension method, so taking it as sent would let clients create series (each
/// with a histogram) without bound, before any key is checked.
pub fn method_label(method: &http::Method) -> &'static str {
    use http::Method;
    match *method {
        Method::GET => "GET",
        Method::HEAD => "HEAD",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        _ => "other",
    }
}

fn latency_histogram() -> Histogram {
    // 1 ms .. ~10 min: covers tiny requests through long generations and queue waits.
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        120.0, 300.0, 600.0,
    ])
}

/// All metric handles.
#[derive(Debug)]
pub struct Metrics {
    registry: PromRegistry,
    http_requests: Family<RouteLabels, Counter>,
    http_duration: HistFamily<RouteLabels>,
    http_responses: Family<ResponseLabels, Counter>,
    http_connections: Gauge,
    router_requests: Family<EndpointLabel, Counter>,
    router_errors: Family<ErrorLabels, Counter>,
    worker_active: Family<WorkerLabel, Gauge>,
    worker_health: Family<WorkerLabel, Gauge>,
    worker_cb_state: Family<WorkerLabel, Gauge>,
    worker_cb_transitions: Family<TransitionLabels, Counter>,
    worker_retries: Family<EndpointLabel, Counter>,
    pd_ttft: Histogram,
    pd_prefill_duration: Histogram,
    pd_prefill_after_decode: Family<OutcomeLabel, Counter>,
    pd_encode_requests: Family<WorkerLabel, Counter>,
    pd_encode_failures: Family<WorkerLabel, Counter>,
    admission_inflight: Family<WorkerLabel, Gauge>,
    admission_inflight_tokens: Family<WorkerLabel, Gauge>,
    admission_limit: Family<WorkerLabel, Gauge>,
    admission_limit_tokens: Family<WorkerLabel, Gauge>,
    admission_queued: Gauge,
    admission_wait: Histogram,
    admission_rejections: Family<ReasonLabel, Counter>,
    rate_limit: Family<ResultLabel, Counter>,
    rate_limit_inflight: Gauge,
    rate_limit_queued: Gauge,
    manual_keys: Gauge,
    store_share: Family<WorkerLabel, Gauge>,
    store_global_limit: Family<WorkerLabel, Gauge>,
    store_rtt: Histogram,
    store_errors: Counter,
    store_lease_age: Gauge<f64, std::sync::atomic::AtomicU64>,
    scheduler_admit: Family<AdmitLabels, Counter>,
    scheduler_wait: HistFamily<ClassLabel>,
    scheduler_clamp: Family<ClampLabels, Counter>,
    scheduler_unknown: Family<TenantLabel, Counter>,
    scheduler_promotions: Family<ClassLabel, Counter>,
    scheduler_inflight: Family<ClassLabel, Gauge>,
    scheduler_queue_depth: Family<ClassLabel, Gauge>,
    scheduler_queue_limit: Family<ClassLabel, Gauge>,
}

impl Metrics {
    /// Creates and registers every family.
    pub fn new() -> Arc<Self> {
        let mut registry = PromRegistry::default();
        let m = Self {
            http_requests: Family::default(),
            http_duration: Family::new_with_constructor(latency_histogram),
            http_responses: Family::default(),
            http_connections: Gauge::default(),
            router_requests: Family::default(),
            router_errors: Family::default(),
            worker_active: Family::default(),
            worker_health: Family::default(),
            worker_cb_state: Family::default(),
            worker_cb_transitions: Family::default(),
            worker_retries: Family::default(),
            pd_ttft: latency_histogram(),
            pd_prefill_duration: latency_histogram(),
            pd_prefill_after_decode: Family::default(),
            pd_encode_requests: Family::default(),
            pd_encode_failures: Family::default(),
            admission_inflight: Family::default(),
            admission_inflight_tokens: Family::default(),
            admission_limit: Family::default(),
            admission_limit_tokens: Family::default(),
            admission_queued: Gauge::default(),
            admission_wait: latency_histogram(),
            admission_rejections: Family::default(),
            rate_limit: Family::default(),
            rate_limit_inflight: Gauge::default(),
            rate_limit_queued: Gauge::default(),
            manual_keys: Gauge::default(),
            store_share: Family::default(),
            store_global_limit: Family::default(),
            store_rtt: latency_histogram(),
            store_errors: Counter::default(),
            store_lease_age: Gauge::default(),
            scheduler_admit: Family::default(),
            scheduler_wait: Family::new_with_constructor(latency_histogram),
            scheduler_clamp: Family::default(),
            scheduler_unknown: Family::default(),
            scheduler_promotions: Family::default(),
            scheduler_inflight: Family::default(),
            scheduler_queue_depth: Family::default(),
            scheduler_queue_limit: Family::default(),
            registry: PromRegistry::default(),
        };
        // prometheus-client appends `_total` to counters itself.
        registry.register(
            "smg_http_requests",
            "HTTP requests received, by method and route",
            m.http_requests.clone(),
        );
        registry.register(
            "smg_http_request_duration_seconds",
            "Time from request received to response head sent, by method and route",
            m.http_duration.clone(),
        );
        registry.register(
            "smg_http_responses",
            "HTTP responses sent, by status and error code",
            m.http_responses.clone(),
        );
        registry.register(
            "smg_http_connections_active",
            "Client connections open on the router's listener (at most --max-connections)",
            m.http_connections.clone(),
        );
        registry.register(
            "smg_router_requests",
            "Inference requests routed, by endpoint",
            m.router_requests.clone(),
        );
        registry.register(
            "smg_router_request_errors",
            "Inference requests that ended in an error, by endpoint and code",
            m.router_errors.clone(),
        );
        registry.register(
            "smg_worker_requests_active",
            "Backend requests in flight per worker (one per sub-request)",
            m.worker_active.clone(),
        );
        registry.register(
            "smg_worker_health",
            "1 if the worker is ready, else 0",
            m.worker_health.clone(),
        );
        registry.register(
            "smg_worker_cb_state",
            "Circuit breaker state per worker: 0 closed, 1 open, 2 half-open",
            m.worker_cb_state.clone(),
        );
        registry.register(
            "smg_worker_cb_transitions",
            "Circuit breaker state changes per worker",
            m.worker_cb_transitions.clone(),
        );
        registry.register(
            "smg_worker_retries",
            "Retried backend attempts, by endpoint",
            m.worker_retries.clone(),
        );
        registry.register(
            "smg_pd_ttft_seconds",
            "PD time to first byte of the Decode answer, from request received",
            m.pd_ttft.clone(),
        );
        registry.register(
            "smg_pd_prefill_duration_seconds",
            "PD Prefill leg time, from send to end of body",
            m.pd_prefill_duration.clone(),
        );
        registry.register(
            "smg_pd_encode_requests",
            "EPD Encode calls sent (one per image item), per Encode worker",
            m.pd_encode_requests.clone(),
        );
        registry.register(
            "smg_pd_encode_failures",
            "EPD Encode calls that failed, timed out or were not accepted, per Encode worker \
             (the request's fate is the Prefill's: it waits for the embedding itself)",
            m.pd_encode_failures.clone(),
        );
        registry.register(
            "smg_pd_prefill_after_decode",
            "PD Prefill legs still open when Decode had delivered the whole answer (their slot \
             freed then), by how they ended: drained, failed, or aborted after the grace",
            m.pd_prefill_after_decode.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_inflight",
            "Prefill requests this router has in flight per Prefill worker (router admission only)",
            m.admission_inflight.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_inflight_tokens",
            "Prompt tokens of the Prefill requests this router has in flight per Prefill worker \
             (router admission only; estimated from the body for HTTP workers)",
            m.admission_inflight_tokens.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_limit",
            "Prefill requests this router admits at once per Prefill worker (its current limit; \
             changes at run time with --prefill-max-inflight-requests-per-worker auto)",
            m.admission_limit.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_limit_tokens",
            "Prompt tokens this router admits at once per Prefill worker (its current token \
             budget; changes at run time with --prefill-max-inflight-tokens-per-worker auto)",
            m.admission_limit_tokens.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_queued",
            "Requests waiting in this router's Prefill admission queue",
            m.admission_queued.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_wait_seconds",
            "Time admitted requests waited for a Prefill slot (0 when admitted at once)",
            m.admission_wait.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_rejections",
            "Requests rejected by Prefill admission, by reason",
            m.admission_rejections.clone(),
        );
        registry.register(
            "smg_http_rate_limit",
            "Global limiter decisions (--max-concurrent-requests), by result: allowed or rejected",
            m.rate_limit.clone(),
        );
        registry.register(
            "smg_http_rate_limit_inflight",
            "Requests holding a global limiter permit",
            m.rate_limit_inflight.clone(),
        );
        registry.register(
            "smg_http_rate_limit_queued",
            "Requests waiting for a global limiter permit",
            m.rate_limit_queued.clone(),
        );
        registry.register(
            "smg_manual_policy_cache_entries",
            "Routing keys the manual policy remembers",
            m.manual_keys.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_share",
            "This replica's share of each Prefill worker's limit (--admission-store only)",
            m.store_share.clone(),
        );
        registry.register(
            "smg_pd_prefill_admission_global_limit",
            "Each Prefill worker's limit across the admission group (--admission-store only)",
            m.store_global_limit.clone(),
        );
        registry.register(
            "smg_admission_store_rtt_seconds",
            "Round-trip time of this replica's successful admission-store exchanges",
            m.store_rtt.clone(),
        );
        registry.register(
            "smg_admission_store_errors",
            "Admission-store exchanges that failed (error or timeout)",
            m.store_errors.clone(),
        );
        registry.register(
            "smg_admission_store_lease_age_seconds",
            "Time since this replica's leases were last renewed (+Inf before the first renewal)",
            m.store_lease_age.clone(),
        );
        registry.register(
            "smg_scheduler_admit",
            "Priority classes: how requests left the queue the classes order, by class and \
             outcome (admitted, rejected_queue_full, rejected_queue_timeout, \
             rejected_unavailable, client_cancelled)",
            m.scheduler_admit.clone(),
        );
        registry.register(
            "smg_scheduler_queue_wait_seconds",
            "Priority classes: time in the queue before admission, timeout or cancellation, by \
             class (0 when admitted at once)",
            m.scheduler_wait.clone(),
        );
        registry.register(
            "smg_scheduler_clamp",
            "Requests whose X-SMG-Priority class was capped by their tenant's maximum class",
            m.scheduler_clamp.clone(),
        );
        registry.register(
            "smg_scheduler_unknown_priority_value",
            "Requests whose X-SMG-Priority named no class (served as default), by tenant",
            m.scheduler_unknown.clone(),
        );
        registry.register(
            "smg_scheduler_starvation_promotion",
            "Requests admitted ahead of their class because they waited past its starvation age",
            m.scheduler_promotions.clone(),
        );
        registry.register(
            "smg_scheduler_inflight",
            "Priority classes: admitted requests holding their place, by class",
            m.scheduler_inflight.clone(),
        );
        registry.register(
            "smg_scheduler_queue_depth",
            "Priority classes: requests waiting, by class",
            m.scheduler_queue_depth.clone(),
        );
        registry.register(
            "smg_scheduler_queue_size_limit",
            "Priority classes: the configured queue size of each class",
            m.scheduler_queue_limit.clone(),
        );
        Arc::new(Self { registry, ..m })
    }

    /// The share of worker `key` applied by this replica, of `global_limit`.
    pub fn store_share(&self, key: &str, share: u32, global_limit: u32) {
        let l = WorkerLabel {
            worker: key.to_string(),
        };
        self.store_share.get_or_create(&l).set(i64::from(share));
        self.store_global_limit
            .get_or_create(&l)
            .set(i64::from(global_limit));
    }

    /// Worker `key` left the registry: its share series go.
    pub fn store_share_removed(&self, key: &str) {
        let l = WorkerLabel {
            worker: key.to_string(),
        };
        self.store_share.remove(&l);
        self.store_global_limit.remove(&l);
    }

    /// A successful admission-store exchange took `rtt`.
    pub fn store_exchanged(&self, rtt: Duration) {
        self.store_rtt.observe(rtt.as_secs_f64());
    }

    /// An admission-store exchange failed.
    pub fn store_failed(&self) {
        self.store_errors.inc();
    }

    /// Time since the leases were last renewed (`None`: never).
    pub fn store_lease_age(&self, age: Option<Duration>) {
        self.store_lease_age
            .set(age.map_or(f64::INFINITY, |a| a.as_secs_f64()));
    }

    /// The classes' configured queue sizes (set once at startup when priority classes are on).
    pub fn priority_limits(&self, classes: &pdrouter_admission::PriorityClasses) {
        for p in pdrouter_admission::Priority::ALL {
            let label = ClassLabel { class: p.as_str() };
            self.scheduler_queue_limit
                .get_or_create(&label)
                .set(classes.get(p).queue_size as i64);
            self.scheduler_queue_depth.get_or_create(&label).set(0);
            self.scheduler_inflight.get_or_create(&label).set(0);
        }
    }

    /// How a request's class was found: counts unknown header values and clamps.
    pub fn priority_resolved(&self, r: &crate::priority::Resolution<'_>) {
        if r.unknown_value {
            self.scheduler_unknown
                .get_or_create(&TenantLabel {
                    tenant: r.tenant.to_string(),
                })
                .inc();
        }
        if r.priority < r.requested {
            self.scheduler_clamp
                .get_or_create(&ClampLabels {
                    tenant: r.tenant.to_string(),
                    requested_class: r.requested.as_str(),
                    effective_class: r.priority.as_str(),
                })
                .inc();
        }
    }

    fn priority_outcome(
        &self,
        priority: pdrouter_admission::Priority,
        outcome: pdrouter_admission::PriorityOutcome,
    ) {
        use pdrouter_admission::{PriorityOutcome, Rejection};
        let class = priority.as_str();
        let (name, waited) = match outcome {
            PriorityOutcome::Admitted { waited, promoted } => {
                if promoted {
                    self.scheduler_promotions
                        .get_or_create(&ClassLabel { class })
                        .inc();
                }
                ("admitted", waited)
            }
            PriorityOutcome::Rejected { reason, waited } => (
                match reason {
                    Rejection::QueueFull => "rejected_queue_full",
                    Rejection::QueueTimeout => "rejected_queue_timeout",
                    Rejection::Unavailable => "rejected_unavailable",
                },
                waited,
            ),
            PriorityOutcome::Cancelled { waited } => ("client_cancelled", waited),
        };
        self.scheduler_admit
            .get_or_create(&AdmitLabels {
                class,
                outcome: name,
            })
            .inc();
        self.scheduler_wait
            .get_or_create(&ClassLabel { class })
            .observe(waited.as_secs_f64());
    }

    fn priority_levels(
        &self,
        priority: pdrouter_admission::Priority,
        queued: usize,
        inflight: usize,
    ) {
        let label = ClassLabel {
            class: priority.as_str(),
        };
        self.scheduler_queue_depth
            .get_or_create(&label)
            .set(queued as i64);
        self.scheduler_inflight
            .get_or_create(&label)
            .set(inflight as i64);
    }

    /// Routing keys the manual policies remember in all.
    pub fn manual_keys(&self, keys: usize) {
        self.manual_keys.set(keys as i64);
    }

    /// Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
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
        let route = RouteLabels {
            method: method_label(method).to_string(),
            path: path.to_string(),
        };
        self.http_requests.get_or_create(&route).inc();
        self.http_duration
            .get_or_create(&route)
            .observe(elapsed.as_secs_f64());
        self.http_responses
            .get_or_create(&ResponseLabels {
                status_code: status.as_u16().to_string(),
                error_code: code.unwrap_or("none").to_string(),
            })
            .inc();
    }

    /// A client connection was accepted.
    pub fn connection_opened(&self) {
        self.http_connections.inc();
    }

    /// A client connection closed.
    pub fn connection_closed(&self) {
        self.http_connections.dec();
    }

    /// One inference request routed.
    pub fn routed(&self, route: &str) {
        self.router_requests
            .get_or_create(&EndpointLabel {
                route: route.to_string(),
            })
            .inc();
    }

    /// One inference request failed.
    pub fn route_error(&self, route: &str, code: &str) {
        self.router_errors
            .get_or_create(&ErrorLabels {
                route: route.to_string(),
                error_code: code.to_string(),
            })
            .inc();
    }

    /// One retry.
    pub fn retry(&self, route: &str) {
        self.worker_retries
            .get_or_create(&EndpointLabel {
                route: route.to_string(),
            })
            .inc();
    }

    /// PD time to first byte.
    pub fn ttft(&self, d: Duration) {
        self.pd_ttft.observe(d.as_secs_f64());
    }

    /// PD Prefill leg duration.
    pub fn prefill_duration(&self, d: Duration) {
        self.pd_prefill_duration.observe(d.as_secs_f64());
    }

    /// An Encode call to `w` was sent.
    pub fn encode_sent(&self, w: &Worker) {
        self.pd_encode_requests.get_or_create(&Self::label(w)).inc();
    }

    /// An Encode call to `w` failed.
    pub fn encode_failed(&self, w: &Worker) {
        self.pd_encode_failures.get_or_create(&Self::label(w)).inc();
    }

    /// A Prefill leg that outlived Decode ended.
    pub fn prefill_after_decode(&self, outcome: AfterDecode) {
        self.pd_prefill_after_decode
            .get_or_create(&OutcomeLabel {
                outcome: outcome.as_str().to_string(),
            })
            .inc();
    }

    fn label(w: &Worker) -> WorkerLabel {
        WorkerLabel {
            worker: w.url().to_string(),
        }
    }

    /// Worker load changed.
    pub fn worker_load(&self, w: &Worker) {
        let l = Self::label(w);
        let load = w.load();
        if w.status() == WorkerStatus::Draining && load == 0 {
            self.worker_active.remove(&l);
        } else {
            self.worker_active.get_or_create(&l).set(load as i64);
        }
    }

    /// Applies a registry event to the per-worker series.
    pub fn on_event(&self, e: &Event) {
        match e {
            Event::Registered(w) => self.add_worker(w),
            Event::Replaced { old, new } => {
                self.remove_worker(old);
                self.add_worker(new);
            }
            Event::Removed(w) => {
                self.remove_worker(w);
                // Counters survive a replacement (same URL), not a removal.
                let l = Self::label(w);
                self.pd_encode_requests.remove(&l);
                self.pd_encode_failures.remove(&l);
            }
            Event::StatusChanged { worker, to, .. } => {
                if *to != WorkerStatus::Draining {
                    self.worker_health
                        .get_or_create(&Self::label(worker))
                        .set(i64::from(*to == WorkerStatus::Ready));
                }
            }
            Event::BreakerChanged { worker, to } => {
                let l = Self::label(worker);
                self.worker_cb_state.get_or_create(&l).set(*to as i64);
                self.worker_cb_transitions
                    .get_or_create(&TransitionLabels {
                        worker: l.worker,
                        to: to.as_str().to_string(),
                    })
                    .inc();
            }
        }
    }

    fn add_worker(&self, w: &Worker) {
        let l = Self::label(w);
        self.worker_health
            .get_or_create(&l)
            .set(i64::from(w.status() == WorkerStatus::Ready));
        self.worker_cb_state
            .get_or_create(&l)
            .set(w.breaker().state() as i64);
        self.worker_active.get_or_create(&l).set(w.load() as i64);
        if let Some(slot) = w.slot() {
            self.admission_inflight
                .get_or_create(&l)
                .set(i64::from(slot.inflight()));
            self.admission_inflight_tokens
                .get_or_create(&l)
                .set(i64::from(slot.inflight_tokens()));
            self.admission_limits(&l.worker, slot.limit(), slot.token_limit());
        }
    }

    /// A Prefill worker's admission limits (`key` = its slot key): the count unless there is
    /// none (only a token budget), the token budget if any.
    pub fn admission_limits(&self, key: &str, count: u32, tokens: Option<u32>) {
        let l = WorkerLabel {
            worker: key.to_string(),
        };
        if count != crate::config::NO_COUNT_LIMIT {
            self.admission_limit.get_or_create(&l).set(i64::from(count));
        }
        if let Some(t) = tokens {
            self.admission_limit_tokens
                .get_or_create(&l)
                .set(i64::from(t));
        }
    }

    fn remove_worker(&self, w: &Worker) {
        let l = Self::label(w);
        self.worker_health.remove(&l);
        self.worker_cb_state.remove(&l);
        for to in [
            BreakerState::Closed,
            BreakerState::Open,
            BreakerState::HalfOpen,
        ] {
            self.worker_cb_transitions.remove(&TransitionLabels {
                worker: l.worker.clone(),
                to: to.as_str().to_string(),
            });
        }
        if w.load() == 0 {
            self.worker_active.remove(&l);
        }
    }
}

impl crate::limiter::LimiterObserver for Metrics {
    fn decided(&self, allowed: bool) {
        let result = if allowed { "allowed" } else { "rejected" };
        self.rate_limit.get_or_create(&ResultLabel { result }).inc();
    }

    fn levels(&self, inflight: usize, queued: usize) {
        self.rate_limit_inflight.set(inflight as i64);
        self.rate_limit_queued.set(queued as i64);
    }
}

impl pdrouter_admission::Observer for Metrics {
    fn inflight_changed(&self, key: &str, inflight: u32) {
        self.admission_inflight
            .get_or_create(&WorkerLabel {
                worker: key.to_string(),
            })
            .set(i64::from(inflight));
    }

    fn tokens_changed(&self, key: &str, tokens: u32) {
        self.admission_inflight_tokens
            .get_or_create(&WorkerLabel {
                worker: key.to_string(),
            })
            .set(i64::from(tokens));
    }

    fn queued_changed(&self, queued: usize) {
        self.admission_queued.set(queued as i64);
    }

    fn admitted(&self, waited: Duration) {
        self.admission_wait.observe(waited.as_secs_f64());
    }

    fn rejected(&self, reason: pdrouter_admission::Rejection) {
        self.admission_rejections
            .get_or_create(&ReasonLabel {
                reason: reason.as_str().to_string(),
            })
            .inc();
    }

    fn priority_outcome(
        &self,
        priority: pdrouter_admission::Priority,
        outcome: pdrouter_admission::PriorityOutcome,
    ) {
        Metrics::priority_outcome(self, priority, outcome);
    }

    fn priority_levels(
        &self,
        priority: pdrouter_admission::Priority,
        queued: usize,
        inflight: usize,
    ) {
        Metrics::priority_levels(self, priority, queued, inflight);
    }

    fn slot_forgotten(&self, key: &str) {
        let label = WorkerLabel {
            worker: key.to_string(),
        };
        self.admission_inflight.remove(&label);
        self.admission_inflight_tokens.remove(&label);
        self.admission_limit.remove(&label);
        self.admission_limit_tokens.remove(&label);
    }
}

#[cfg(test)]
mod tests;
