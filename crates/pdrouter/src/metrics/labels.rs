//! The label sets of the router's families. Every value is bounded: worker URLs as
//! configured (with `@rank`), route templates, enumerated reasons, codes and classes, and
//! tenants named in the priority file (else `other` or `anonymous`).

use prometheus_client::encoding::EncodeLabelSet;

use crate::registry::Worker;

/// Label: one worker.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    /// Worker URL as configured.
    pub worker: String,
}

impl WorkerLabel {
    /// The label of a registered worker.
    pub(super) fn of(w: &Worker) -> Self {
        Self::key(w.url())
    }

    /// The label of a worker known by its URL (an admission slot's key).
    pub(super) fn key(key: &str) -> Self {
        WorkerLabel {
            worker: key.to_string(),
        }
    }
}

/// Labels: method and route template.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// HTTP method the router serves, or `other` (`method_label`).
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
