//! The admission store: router replicas of one `--admission-group` share each Prefill
//! worker's limit through Redis (`--admission-store`).
//!
//! The sharing itself (leases, fallback, demand) is `pdrouter_admission::shares`; this module
//! holds what is specific to Redis and to the router: the URL (credentials never shown), the
//! client and its Lua script ([`redis::RedisLeases`]), and the observer that turns the
//! sharer's events into metrics and log lines ([`Reporter`]).
//!
//! Store traffic: one script call per replica per `--admission-store-interval-ms`, carrying
//! every Prefill worker of the replica, and on average at most one per poll (a fortieth of the
//! interval) while replicas compete for a worker (early exchanges, paced, see
//! `pdrouter_admission::shares`); one pub/sub subscription per replica for the group's pushes;
//! nothing per request.
//!
//! Invariants (store side, see `lease.lua`): a grant never exceeds the group limit minus what
//! every other live replica holds or was granted; leases are renewed only by an exchange and
//! expire by the store's clock; an exchange older than the replica's last one changes nothing.

pub mod redis;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use pdrouter_admission::{Fallback, ShareObserver, StoreError};

// The checked store URL is configuration (checked at startup); re-exported for the store's code.
pub use crate::config::StoreUrl;
use crate::metrics::Metrics;

/// A fresh replica id: random, so a restarted replica never inherits its old leases.
pub fn replica_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// Metrics and warnings for the sharer. Failures are logged once when they start and once
/// when the fallback engages (then at debug), so a store outage does not flood the log.
#[derive(Debug)]
pub struct Reporter {
    metrics: Arc<Metrics>,
    failing: AtomicBool,
}

impl Reporter {
    /// A reporter feeding `metrics`.
    pub fn new(metrics: Arc<Metrics>) -> Arc<Self> {
        Arc::new(Reporter {
            metrics,
            failing: AtomicBool::new(false),
        })
    }
}

impl ShareObserver for Reporter {
    fn share_changed(&self, key: &str, share: u32, global_limit: u32) {
        self.metrics.store_share(key, share, global_limit);
    }

    fn share_removed(&self, key: &str) {
        self.metrics.store_share_removed(key);
    }

    fn exchanged(&self, rtt: Duration) {
        self.metrics.store_exchanged(rtt);
        if self.failing.swap(false, Ordering::Relaxed) {
            tracing::info!("admission store reachable again");
        }
    }

    fn exchange_failed(&self, error: &StoreError) {
        self.metrics.store_failed();
        if self.failing.swap(true, Ordering::Relaxed) {
            tracing::debug!(%error, "admission store exchange failed");
        } else {
            tracing::warn!(
                %error,
                "admission store exchange failed; keeping the current shares until the lease \
                 could have expired"
            );
        }
    }

    fn lease_age(&self, age: Option<Duration>) {
        self.metrics.store_lease_age(age);
    }

    fn fallback_engaged(&self, fallback: Fallback) {
        tracing::warn!(
            fallback = fallback.as_str(),
            "admission store leases could have expired: no longer admitting on shared limits"
        );
    }

    fn recovered(&self) {
        tracing::info!("admission store leases renewed; shared limits back in force");
    }
}
