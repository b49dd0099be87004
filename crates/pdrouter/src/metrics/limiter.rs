//! The global limiter (`--max-concurrent-requests`): its decisions and its levels, as it
//! reports them ([`LimiterObserver`](crate::limiter::LimiterObserver), implemented by
//! `Metrics`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::labels::ResultLabel;

/// The global limiter families.
#[derive(Debug)]
pub(super) struct LimiterMetrics {
    decisions: Family<ResultLabel, Counter>,
    inflight: Gauge,
    queued: Gauge,
}

impl LimiterMetrics {
    /// Creates the families and registers them, in exposition order.
    pub(super) fn register(registry: &mut Registry) -> Self {
        let decisions: Family<ResultLabel, Counter> = Family::default();
        let inflight: Gauge = Gauge::default();
        let queued: Gauge = Gauge::default();
        registry.register(
            "smg_http_rate_limit",
            "Global limiter decisions (--max-concurrent-requests), by result: allowed or rejected",
            decisions.clone(),
        );
        registry.register(
            "smg_http_rate_limit_inflight",
            "Requests holding a global limiter permit",
            inflight.clone(),
        );
        registry.register(
            "smg_http_rate_limit_queued",
            "Requests waiting for a global limiter permit",
            queued.clone(),
        );
        Self {
            decisions,
            inflight,
            queued,
        }
    }

    /// One limiter decision.
    pub(super) fn decided(&self, allowed: bool) {
        let result = if allowed { "allowed" } else { "rejected" };
        self.decisions.get_or_create(&ResultLabel { result }).inc();
    }

    /// Permits held and requests waiting.
    pub(super) fn levels(&self, inflight: usize, queued: usize) {
        self.inflight.set(inflight as i64);
        self.queued.set(queued as i64);
    }
}
