//! Priority classes at the router's edge: each request's class from `X-SMG-Priority`, capped by
//! its tenant's maximum. The settings (`--priority-scheduler-*` flags and the YAML file) are
//! parsed and checked in `crate::config::priority` and re-exported here.
//!
//! The classes order exactly one queue: Prefill admission's when a Prefill limit is set,
//! otherwise the global limiter's (`--max-concurrent-requests`). Each class's queue size and
//! timeout default to that queue's own flags; the YAML overrides them per class.
//!
//! Invariants:
//! - A request's class never fails it: a missing, unknown or unreadable `X-SMG-Priority` is
//!   `default` (counted when present but unknown); the value is matched in any ASCII case with
//!   surrounding whitespace ignored.
//! - The class is capped, never raised: `min(asked, tenant's maximum)`. The tenant is read
//!   only with `--trust-tenant-header`; an unlisted or absent tenant has
//!   `--priority-scheduler-default-max-class`.
//! - Metric labels stay bounded: a tenant label is one listed in the YAML, `other` or
//!   `anonymous`.
//! - Everything in the file is checked at startup (unknown keys, class names, ranges); a bad
//!   file exits 2 with one line naming what is wrong.

use http::HeaderMap;
use pdrouter_admission::Priority;

// The settings (flags and the YAML file) are configuration, parsed and checked at startup.
pub use crate::config::priority::{
    ClassOverride, DEFAULT_TENANT_HEADER, MAX_CLASS_QUEUE_SIZE, MAX_CLASS_SECS, PrioritySettings,
    STARVATION_SECS, class_flag, load, parse, tenant_header,
};

/// The request header naming a class.
pub const PRIORITY_HEADER: &str = "x-smg-priority";

/// One request's class and how it was found (for the metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolution<'a> {
    /// The class it waits with.
    pub priority: Priority,
    /// The class the header asked for (`default` without the header).
    pub requested: Priority,
    /// The header was present but named no class.
    pub unknown_value: bool,
    /// The tenant's metric label: a listed tenant's file key, `other` or `anonymous`.
    pub tenant: &'a str,
}

impl PrioritySettings {
    /// The class of a request with these headers.
    pub fn resolve<'a>(&'a self, headers: &HeaderMap) -> Resolution<'a> {
        let (requested, unknown_value) = match headers.get(PRIORITY_HEADER) {
            None => (Priority::Default, false),
            Some(v) => match v.to_str().ok().and_then(Priority::from_header) {
                Some(p) => (p, false),
                None => (Priority::Default, true),
            },
        };
        let tenant = self.tenant_header.as_ref().and_then(|name| {
            let value = headers.get(name)?.to_str().ok()?.trim();
            (!value.is_empty()).then_some(value)
        });
        let (tenant, max) = match tenant {
            None => ("anonymous", self.default_max_class),
            Some(t) => match self.tenants.get_key_value(t) {
                Some((key, &max)) => (key.as_str(), max),
                None => ("other", self.default_max_class),
            },
        };
        Resolution {
            priority: requested.min(max),
            requested,
            unknown_value,
            tenant,
        }
    }
}

#[cfg(test)]
mod tests;
