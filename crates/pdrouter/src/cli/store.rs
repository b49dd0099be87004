//! Admission-store flags: sharing the Prefill limits with other router replicas through Redis.
//! They are listed under "Prefill admission", after admission's own flags.

use clap::Args;

use crate::config::{AdmissionSettings, ConfigError, RawStore, StoreSettings};

/// The `--admission-store*` and `--admission-group` flags of "Prefill admission".
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// Share the per-worker Prefill limits with the other router replicas of
    /// --admission-group through this Redis store: redis://[user:pass@]host[:port][/db]
    /// (credentials are never logged). Needs a positive
    /// --prefill-max-inflight-requests-per-worker, which then bounds each worker across the
    /// group.
    #[arg(long, value_name = "URL", help_heading = "Prefill admission")]
    pub admission_store: Option<String>,
    /// Replicas with the same group share limits (default "default"; letters, digits, '-',
    /// '_', '.').
    #[arg(long, value_name = "NAME", help_heading = "Prefill admission")]
    pub admission_group: Option<String>,
    /// Milliseconds between a replica's exchanges with the admission store, 10-1000 (default
    /// 200; while replicas compete for a share, early exchanges too, on average one per
    /// fortieth of it and at least 5 ms, in bursts of at most 4).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub admission_store_interval_ms: Option<i64>,
    /// How long a replica's leases outlive its last exchange in the store, in ms,
    /// 1000-3600000 (default 3000; at least 3 intervals).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub admission_store_lease_ttl_ms: Option<i64>,
    /// Once a replica's leases could have expired without the store: hold (admit nothing;
    /// requests wait or get the usual 429/503) or local (admit up to N / replicas last seen
    /// per worker; the group bound may be exceeded). Default hold.
    #[arg(long, value_name = "hold|local", help_heading = "Prefill admission")]
    pub admission_store_fallback: Option<String>,
}

impl StoreArgs {
    /// The store settings, `None` without `--admission-store`. The store shares admission's
    /// request limit, so it is given admission's settings (the rules are [`RawStore::resolve`]'s).
    pub(super) fn resolve(
        self,
        admission: Option<&AdmissionSettings>,
    ) -> Result<Option<StoreSettings>, ConfigError> {
        RawStore {
            url: self.admission_store,
            group: self.admission_group,
            interval_ms: self.admission_store_interval_ms,
            lease_ttl_ms: self.admission_store_lease_ttl_ms,
            fallback: self.admission_store_fallback,
        }
        .resolve(admission)
    }
}
