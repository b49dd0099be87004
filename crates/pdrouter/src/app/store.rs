//! Sharing the Prefill limits with other replicas through the admission store
//! (`--admission-store`): the sharer over the registry's Prefill slots, its first exchange
//! before serving, and the events that make it exchange early (other replicas' pushes, new
//! workers).

use std::sync::Arc;

use pdrouter_admission::{Admission, ShareConfig, Sharer};
use tokio::task::JoinHandle;

use super::{Parts, StartError};
use crate::admission_store::redis::RedisLeases;
use crate::metrics::Metrics;
use crate::registry::{Event, Registry};

/// With `--admission-store` (and admission on), starts sharing the Prefill limits: one
/// exchange now, then the sharer's own ticks, other replicas' pushes and new workers' nudges.
pub(super) async fn share_through_store(
    parts: &Parts,
    background: &mut Vec<JoinHandle<()>>,
) -> Result<Option<Arc<Sharer>>, StartError> {
    let (Some(store), Some(adm), Some(limits)) = (
        &parts.cfg.admission_store,
        &parts.admission,
        parts.cfg.admission,
    ) else {
        return Ok(None);
    };
    let (sharer, leases) = start_sharer(store, adm, limits, &parts.registry, &parts.metrics)?;
    // One exchange before serving, so a reachable store's shares are in force from the
    // first request (bounded by the exchange timeout).
    sharer.tick().await;
    background.push(sharer.spawn());
    // Other replicas' pushes: exchange early when a share should move. A lost or
    // refused subscription is retried once per lease TTL (polls cover meanwhile).
    let weak = Arc::downgrade(&sharer);
    background.push(
        leases.listen(store.lease_ttl, store.lease_ttl, move |push| {
            if let Some(s) = weak.upgrade() {
                s.pushed(push);
            }
        }),
    );
    // A new worker's slot admits nothing until its first share: ask for it at once.
    let weak = Arc::downgrade(&sharer);
    parts.registry.subscribe(Arc::new(move |e: &Event| {
        if matches!(e, Event::Registered(_) | Event::Replaced { .. })
            && let Some(s) = weak.upgrade()
        {
            s.nudge();
        }
    }));
    Ok(Some(sharer))
}

/// The sharer of `--admission-store` over the registry's Prefill slots, and the Redis lease
/// client for this replica it exchanges through.
fn start_sharer(
    store: &crate::config::StoreSettings,
    admission: &Admission,
    limits: crate::config::AdmissionSettings,
    registry: &Arc<Registry>,
    metrics: &Arc<Metrics>,
) -> Result<(Arc<Sharer>, Arc<RedisLeases>), StartError> {
    let share = ShareConfig {
        limit: limits.max_inflight_per_worker,
        token_limit: limits.max_inflight_tokens_per_worker,
        interval: store.interval,
        lease_ttl: store.lease_ttl,
        fallback: store.fallback,
    };
    let replica = crate::admission_store::replica_id();
    let leases = Arc::new(
        RedisLeases::new(
            &store.url,
            &store.group,
            replica.clone(),
            store.lease_ttl,
            share.call_timeout(),
        )
        .map_err(StartError::Store)?,
    );
    tracing::info!(
        store = %store.url,
        group = %store.group,
        %replica,
        interval_ms = store.interval.as_millis() as u64,
        lease_ttl_ms = store.lease_ttl.as_millis() as u64,
        fallback = store.fallback.as_str(),
        "sharing Prefill limits through the admission store"
    );
    let reg = Arc::clone(registry);
    let slots = Box::new(move || {
        reg.snapshot()
            .all()
            .iter()
            .filter_map(|w| w.slot().cloned())
            .collect()
    });
    let sharer = Sharer::new(
        admission.clone(),
        leases.clone(),
        share,
        slots,
        crate::admission_store::Reporter::new(metrics.clone()),
    );
    Ok((sharer, leases))
}
