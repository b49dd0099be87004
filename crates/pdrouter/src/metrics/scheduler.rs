//! Priority classes: how requests of each class left the queue and how long they waited,
//! clamps and unknown header values by tenant, starvation promotions, and each class's
//! waiting and admitted counts against its configured queue size. Class labels are the four
//! classes' names; tenants are those of the priority file, `other` or `anonymous`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use pdrouter_admission::{Priority, PriorityClasses, PriorityOutcome, Rejection};

use super::family::{HistFamily, latency_histogram};
use super::labels::{AdmitLabels, ClampLabels, ClassLabel, TenantLabel};

/// The priority-class families.
#[derive(Debug)]
pub(super) struct SchedulerMetrics {
    admit: Family<AdmitLabels, Counter>,
    wait: HistFamily<ClassLabel>,
    clamp: Family<ClampLabels, Counter>,
    unknown: Family<TenantLabel, Counter>,
    promotions: Family<ClassLabel, Counter>,
    inflight: Family<ClassLabel, Gauge>,
    queue_depth: Family<ClassLabel, Gauge>,
    queue_limit: Family<ClassLabel, Gauge>,
}

impl SchedulerMetrics {
    /// Creates the families and registers them, in exposition order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let admit: Family<AdmitLabels, Counter> = Family::default();
        let wait: HistFamily<ClassLabel> = Family::new_with_constructor(latency_histogram);
        let clamp: Family<ClampLabels, Counter> = Family::default();
        let unknown: Family<TenantLabel, Counter> = Family::default();
        let promotions: Family<ClassLabel, Counter> = Family::default();
        let inflight: Family<ClassLabel, Gauge> = Family::default();
        let queue_depth: Family<ClassLabel, Gauge> = Family::default();
        let queue_limit: Family<ClassLabel, Gauge> = Family::default();
        registry.register(
            "smg_scheduler_admit",
            "Priority classes: how requests left the queue the classes order, by class and \
             outcome (admitted, rejected_queue_full, rejected_queue_timeout, \
             rejected_unavailable, client_cancelled)",
            admit.clone(),
        );
        registry.register(
            "smg_scheduler_queue_wait_seconds",
            "Priority classes: time in the queue before admission, timeout or cancellation, by \
             class (0 when admitted at once)",
            wait.clone(),
        );
        registry.register(
            "smg_scheduler_clamp",
            "Requests whose X-SMG-Priority class was capped by their tenant's maximum class",
            clamp.clone(),
        );
        registry.register(
            "smg_scheduler_unknown_priority_value",
            "Requests whose X-SMG-Priority named no class (served as default), by tenant",
            unknown.clone(),
        );
        registry.register(
            "smg_scheduler_starvation_promotion",
            "Requests admitted ahead of their class because they waited past its starvation age",
            promotions.clone(),
        );
        registry.register(
            "smg_scheduler_inflight",
            "Priority classes: admitted requests holding their place, by class",
            inflight.clone(),
        );
        registry.register(
            "smg_scheduler_queue_depth",
            "Priority classes: requests waiting, by class",
            queue_depth.clone(),
        );
        registry.register(
            "smg_scheduler_queue_size_limit",
            "Priority classes: the configured queue size of each class",
            queue_limit.clone(),
        );
        Self {
            admit,
            wait,
            clamp,
            unknown,
            promotions,
            inflight,
            queue_depth,
            queue_limit,
        }
    }

    /// The classes' configured queue sizes, and their levels at zero.
    pub(super) fn limits(&self, classes: &PriorityClasses) {
        for p in Priority::ALL {
            let label = ClassLabel { class: p.as_str() };
            self.queue_limit
                .get_or_create(&label)
                .set(classes.get(p).queue_size as i64);
            self.queue_depth.get_or_create(&label).set(0);
            self.inflight.get_or_create(&label).set(0);
        }
    }

    /// How a request's class was found: counts unknown header values and clamps.
    pub(super) fn resolved(&self, r: &crate::priority::Resolution<'_>) {
        if r.unknown_value {
            self.unknown
                .get_or_create(&TenantLabel {
                    tenant: r.tenant.to_string(),
                })
                .inc();
        }
        if r.priority < r.requested {
            self.clamp
                .get_or_create(&ClampLabels {
                    tenant: r.tenant.to_string(),
                    requested_class: r.requested.as_str(),
                    effective_class: r.priority.as_str(),
                })
                .inc();
        }
    }

    /// How a request of `priority` left the queue.
    pub(super) fn outcome(&self, priority: Priority, outcome: PriorityOutcome) {
        let class = priority.as_str();
        let (name, waited) = match outcome {
            PriorityOutcome::Admitted { waited, promoted } => {
                if promoted {
                    self.promotions.get_or_create(&ClassLabel { class }).inc();
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
        self.admit
            .get_or_create(&AdmitLabels {
                class,
                outcome: name,
            })
            .inc();
        self.wait
            .get_or_create(&ClassLabel { class })
            .observe(waited.as_secs_f64());
    }

    /// The requests of `priority` waiting and admitted now.
    pub(super) fn levels(&self, priority: Priority, queued: usize, inflight: usize) {
        let label = ClassLabel {
            class: priority.as_str(),
        };
        self.queue_depth.get_or_create(&label).set(queued as i64);
        self.inflight.get_or_create(&label).set(inflight as i64);
    }
}
