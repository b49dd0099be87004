//! Property: whatever the worker set looks like (status, breaker, type, strict target),
//! selection only ever picks a routable worker of the wanted type, and answers 503 exactly
//! when there is none — for every policy.

use std::sync::Arc;
use std::time::Duration;

use pdrouter::config::{BreakerConfig, WorkerSpec, WorkerType};
use pdrouter::registry::{Registry, WorkerStatus};
use pdrouter::select::{Candidates, Wanted};
use pdrouter_policy::{CacheAwareConfig, Policy, PolicyKind};
use proptest::prelude::*;

fn status(i: u8) -> WorkerStatus {
    match i % 5 {
        0 => WorkerStatus::Pending,
        1 | 2 => WorkerStatus::Ready,
        3 => WorkerStatus::NotReady,
        _ => WorkerStatus::Failed,
    }
}

proptest! {
    #[test]
    fn only_routable_workers_are_picked(
        workers in proptest::collection::vec((any::<bool>(), 0u8..5, any::<bool>()), 0..12),
        policy in 0usize..5,
        target in proptest::option::of(0usize..14),
        text in "[a-z ]{0,40}",
    ) {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            let reg = Registry::new(
                BreakerConfig {
                    enabled: true,
                    failure_threshold: 1,
                    success_threshold: 1,
                    timeout: Duration::from_secs(3600),
                    window: Duration::from_secs(3600),
                },
                None,
            );
            for (i, (prefill, st, broken)) in workers.iter().enumerate() {
                let t = if *prefill { WorkerType::Prefill } else { WorkerType::Decode };
                let spec = WorkerSpec::new(format!("http://10.0.0.{i}:8000"), t);
                let w = reg.register(&spec, None, status(*st)).unwrap().remove(0);
                if *broken {
                    reg.record_outcome(&w, false);
                }
            }
            let kind = PolicyKind::parse(PolicyKind::NAMES[policy]).unwrap();
            let policy = Arc::new(Policy::new(kind, CacheAwareConfig::default()));
            let wanted = Wanted { text: Arc::from(text.as_str()), routing_key: None, target, model: None, prefix_tokens: None };
            let picked = Candidates::new(reg.clone(), policy, WorkerType::Prefill, wanted).pick();
            let snap = reg.snapshot();
            let prefills = snap.of_type(WorkerType::Prefill);
            let eligible: Vec<_> = match target {
                Some(i) => prefills.get(i).filter(|w| w.is_routable()).into_iter().collect(),
                None => prefills.iter().filter(|w| w.is_routable()).collect(),
            };
            match picked {
                Ok(w) => {
                    prop_assert!(w.is_routable());
                    prop_assert_eq!(w.worker_type(), WorkerType::Prefill);
                    if let Some(i) = target {
                        prop_assert!(Arc::ptr_eq(&w, &prefills[i]));
                    }
                }
                Err(e) => {
                    prop_assert!(eligible.is_empty(), "503 although {} eligible", eligible.len());
                    prop_assert_eq!(e.status.as_u16(), 503);
                }
            }
            Ok(())
        })?;
    }
}
