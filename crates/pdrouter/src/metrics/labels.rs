//! The label sets of the router's families. Every value is bounded: worker URLs as
//! configured (with `@rank`), route templates, enumerated reasons, codes and classes, and
//! tenants named in the priority file (else `other` or `anonymous`).

//!
//! Labels updated on every request borrow or share their values (`&'static str`, a shared
//! URL, a number) instead of owning a fresh string: a series is looked up by its label set on
//! each update, and building that key must not allocate.

use std::borrow::Cow;
use std::sync::Arc;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};

use crate::registry::Worker;

/// A label value shared with its owner (a worker's URL): cloning it is a reference count.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct SharedValue(pub Arc<str>);

impl EncodeLabelValue for SharedValue {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        EncodeLabelValue::encode(&&*self.0, encoder)
    }
}

/// Label: one worker.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WorkerLabel {
    /// Worker URL as configured.
    pub worker: SharedValue,
}

impl WorkerLabel {
    /// The label of a registered worker (its own URL string, shared).
    pub(super) fn of(w: &Worker) -> Self {
        WorkerLabel {
            worker: SharedValue(w.url_shared().clone()),
        }
    }

    /// The label of a worker known by its URL (an admission slot's key).
    pub(super) fn key(key: &str) -> Self {
        WorkerLabel {
            worker: SharedValue(Arc::from(key)),
        }
    }

    /// The label of a worker whose URL is already shared (an admission slot's own key).
    pub(super) fn shared(key: &Arc<str>) -> Self {
        WorkerLabel {
            worker: SharedValue(key.clone()),
        }
    }

    /// The URL.
    pub(super) fn url(&self) -> &str {
        &self.worker.0
    }
}

/// Labels: method and route template.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// HTTP method the router serves, or `other` (`method_label`).
    pub method: &'static str,
    /// Route template (`other` for unknown paths); borrowed for the inference routes.
    pub path: Cow<'static, str>,
}

/// The route templates answered most: their labels borrow these instead of copying.
pub(super) const HOT_ROUTES: [&str; 6] = [
    "/generate",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/health",
    "other",
];

impl RouteLabels {
    /// The labels of `method` on the route template `path`.
    pub(super) fn new(method: &'static str, path: &str) -> Self {
        let path = match hot_route(path) {
            Some(i) => Cow::Borrowed(HOT_ROUTES[i]),
            None => Cow::Owned(path.to_owned()),
        };
        RouteLabels { method, path }
    }
}

/// The index of `path` in [`HOT_ROUTES`].
pub(super) fn hot_route(path: &str) -> Option<usize> {
    HOT_ROUTES.iter().position(|r| *r == path)
}

/// Labels: response status and error code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResponseLabels {
    /// Numeric status.
    pub status_code: u16,
    /// `X-SMG-Error-Code`, or `none`.
    pub error_code: &'static str,
}

/// Label: routed endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EndpointLabel {
    /// Route template.
    pub route: &'static str,
}

/// Labels: endpoint and error code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    /// Route template.
    pub route: &'static str,
    /// Error code.
    pub error_code: &'static str,
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
