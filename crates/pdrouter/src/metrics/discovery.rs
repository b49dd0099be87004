//! Kubernetes pod discovery: the workers it registered, by role, and its registrations,
//! deregistrations and sync errors (a failed LIST or WATCH, an unreadable pod).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Label: a worker role.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct RoleLabel {
    /// `regular`, `prefill`, `decode` or `encode`.
    pub(super) worker_type: &'static str,
}

/// The discovery families.
#[derive(Debug)]
pub(super) struct DiscoveryMetrics {
    workers: Family<RoleLabel, Gauge>,
    registrations: Family<RoleLabel, Counter>,
    deregistrations: Family<RoleLabel, Counter>,
    sync_errors: Counter,
}

impl DiscoveryMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let m = Self {
            workers: Family::default(),
            registrations: Family::default(),
            deregistrations: Family::default(),
            sync_errors: Counter::default(),
        };
        registry.register(
            "smg_discovery_workers",
            "Workers registered by Kubernetes pod discovery, by role",
            m.workers.clone(),
        );
        registry.register(
            "smg_discovery_registrations",
            "Workers pod discovery registered",
            m.registrations.clone(),
        );
        registry.register(
            "smg_discovery_deregistrations",
            "Workers pod discovery removed (pod deleted, terminating or not ready)",
            m.deregistrations.clone(),
        );
        registry.register(
            "smg_discovery_sync_errors",
            "Failed pod LISTs and WATCHes, and pods whose annotations could not be read",
            m.sync_errors.clone(),
        );
        m
    }

    pub(super) fn registered(&self, role: &'static str) {
        let l = RoleLabel { worker_type: role };
        self.registrations.get_or_create(&l).inc();
        self.workers.get_or_create(&l).inc();
    }

    pub(super) fn deregistered(&self, role: &'static str) {
        let l = RoleLabel { worker_type: role };
        self.deregistrations.get_or_create(&l).inc();
        self.workers.get_or_create(&l).dec();
    }

    pub(super) fn sync_error(&self) {
        self.sync_errors.inc();
    }
}
