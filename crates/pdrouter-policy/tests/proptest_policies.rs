//! Property tests over the public API: for every policy, random worker sets, loads and texts,
//! rank yields distinct in-range indices (non-empty for non-empty input) and nothing panics;
//! cache_aware trees respect `max_tree_size` after `evict`.

use pdrouter_policy::{
    AssignmentMode, CacheAwareConfig, ManualConfig, Policy, PolicyKind, PolicySettings,
    RequestInfo, WorkerRef,
};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Worker {
    url: String,
    load: u64,
}

impl WorkerRef for Worker {
    fn url(&self) -> &str {
        &self.url
    }
    fn load(&self) -> u64 {
        self.load
    }
}

fn kind() -> impl Strategy<Value = PolicyKind> {
    proptest::sample::select(PolicyKind::ALL.to_vec())
}

/// Workers drawn from a small url pool (so urls recur across steps); duplicates allowed.
fn worker_set() -> impl Strategy<Value = Vec<Worker>> {
    proptest::collection::vec((0usize..12, prop_oneof![0u64..5, 0u64..300]), 0..10).prop_map(|ws| {
        ws.into_iter()
            .map(|(u, load)| Worker {
                url: format!("http://worker-{u}:8000"),
                load,
            })
            .collect()
    })
}

/// Texts over a tiny alphabet (ASCII and multi-byte) so prefixes are shared often.
fn text() -> impl Strategy<Value = Option<String>> {
    proptest::option::of(
        proptest::collection::vec(
            prop_oneof![Just('a'), Just('b'), Just(' '), Just('é'), Just('語')],
            0..40,
        )
        .prop_map(|cs| cs.into_iter().collect()),
    )
}

#[derive(Debug, Clone)]
enum Op {
    RankCommit {
        workers: Vec<Worker>,
        text: Option<String>,
        key: Option<String>,
        commit: bool,
    },
    Evict,
    Remove(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (worker_set(), text(), proptest::option::of("[a-c]{0,3}"), any::<bool>()).prop_map(
            |(workers, text, key, commit)| Op::RankCommit { workers, text, key, commit }
        ),
        1 => Just(Op::Evict),
        1 => (0usize..12).prop_map(Op::Remove),
    ]
}

fn config() -> impl Strategy<Value = CacheAwareConfig> {
    (0.0f32..1.0, 0u64..100, 1.0f32..3.0, 0usize..60).prop_map(|(t, abs, rel, max)| {
        CacheAwareConfig {
            cache_threshold: t,
            balance_abs_threshold: abs,
            balance_rel_threshold: rel,
            max_tree_size: max,
        }
    })
}

fn check_rank(out: &[usize], n: usize) -> Result<(), TestCaseError> {
    prop_assert_eq!(out.is_empty(), n == 0, "empty iff no workers");
    let mut seen = vec![false; n];
    for &i in out {
        prop_assert!(i < n, "index {} out of range {}", i, n);
        prop_assert!(!seen[i], "duplicate index {}", i);
        seen[i] = true;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn rank_is_distinct_in_range_and_non_empty(kind in kind(), cfg in config(),
                                               ops in proptest::collection::vec(op(), 1..30)) {
        let policy = Policy::new(kind, cfg);
        prop_assert_eq!(policy.kind(), kind);
        let mut out = vec![usize::MAX];
        for (now, op) in ops.iter().enumerate() {
            match op {
                Op::RankCommit { workers, text, key, commit } => {
                    let req = RequestInfo { text: text.as_deref(), routing_key: key.as_deref(), ..Default::default() };
                    policy.rank(workers, &req, &mut out);
                    check_rank(&out, workers.len())?;
                    if *commit && !out.is_empty() {
                        policy.commit(workers, out[0], &req);
                    }
                }
                Op::Evict => {
                    policy.evict();
                    policy.tick(now as u64);
                }
                Op::Remove(u) => policy.remove_worker(&format!("http://worker-{u}:8000")),
            }
        }
    }

    #[test]
    fn deterministic_policies_rank_stably(kind in proptest::sample::select(vec![
            PolicyKind::RoundRobin, PolicyKind::CacheAware, PolicyKind::ConsistentHashing]),
        cfg in config(), ops in proptest::collection::vec(op(), 1..20)) {
        let policy = Policy::new(kind, cfg);
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for op in &ops {
            if let Op::RankCommit { workers, text, key, commit } = op {
                let req = RequestInfo { text: text.as_deref(), routing_key: key.as_deref(), ..Default::default() };
                policy.rank(workers, &req, &mut a);
                policy.rank(workers, &req, &mut b);
                // consistent_hashing without any key picks a random start.
                let keyed = key.as_deref().is_some_and(|k| !k.is_empty())
                    || text.as_deref().is_some_and(|t| !t.is_empty());
                if kind != PolicyKind::ConsistentHashing || keyed {
                    prop_assert_eq!(&a, &b);
                }
                if *commit && !a.is_empty() {
                    policy.commit(workers, a[0], &req);
                }
            }
        }
    }

    #[test]
    fn cache_aware_evict_bounds_every_tree(cfg in config(),
                                          commits in proptest::collection::vec((0usize..6, text()), 1..60)) {
        let policy = Policy::new(PolicyKind::CacheAware, cfg);
        let workers: Vec<Worker> = (0..6)
            .map(|u| Worker { url: format!("http://worker-{u}:8000"), load: 0 })
            .collect();
        for (w, text) in &commits {
            let req = RequestInfo { text: text.as_deref(), routing_key: None, ..Default::default() };
            policy.commit(&workers, *w, &req);
            // Between evicts a tree never exceeds twice the limit.
            prop_assert!(policy.cached_chars(&workers[*w].url) <= 2 * cfg.max_tree_size);
        }
        policy.evict();
        for w in &workers {
            prop_assert!(policy.cached_chars(&w.url) <= cfg.max_tree_size);
        }
    }

    /// manual: a key ranks first the oldest of its (at most two) remembered workers that is a
    /// candidate, whatever else happened meanwhile (other keys, worker sets, loads); a key
    /// whose workers are all absent is placed again and remembers the new one too.
    #[test]
    fn manual_keys_stick_while_their_worker_is_a_candidate(
        mode in proptest::sample::select(vec![
            AssignmentMode::Random, AssignmentMode::MinLoad, AssignmentMode::MinGroup]),
        ops in proptest::collection::vec((worker_set(), "[a-d]{1,2}"), 1..40)) {
        let policy = Policy::with_settings(PolicyKind::Manual, PolicySettings {
            manual: ManualConfig { assignment_mode: mode, max_idle_secs: 1_000 },
            ..PolicySettings::default()
        });
        let mut pinned: std::collections::HashMap<String, Vec<String>> = Default::default();
        let mut out = Vec::new();
        for (now, (workers, key)) in ops.iter().enumerate() {
            let req = RequestInfo { routing_key: Some(key), now_secs: now as u64, ..Default::default() };
            policy.rank(workers, &req, &mut out);
            check_rank(&out, workers.len())?;
            let Some(&first) = out.first() else { continue };
            let remembered = pinned.entry(key.clone()).or_default();
            if let Some(url) = remembered.iter().find(|u| workers.iter().any(|w| &&w.url == u)) {
                prop_assert_eq!(&workers[first].url, url);
            }
            policy.commit(workers, first, &req);
            let chosen = workers[first].url.clone();
            if !remembered.contains(&chosen) {
                if remembered.len() == 2 {
                    remembered.remove(0);
                }
                remembered.push(chosen);
            }
        }
        prop_assert!(policy.manual_keys() <= 20, "no more keys than were used");
        policy.tick(10_000);
        prop_assert_eq!(policy.manual_keys(), 0, "every key idle past max_idle_secs is gone");
    }
}
