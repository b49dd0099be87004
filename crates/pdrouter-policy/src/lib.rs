//! Worker-selection policies for pdrouter.
//!
//! Every policy has the same two-step shape: [`Policy::rank`] orders the candidates without
//! changing any state, and [`Policy::commit`] records the choice the caller actually reserved.
//! A stateful policy (cache_aware's trees, round_robin's counter) therefore never remembers a
//! choice that was not then used.
//!
//! Invariants (as absences): this crate does no I/O, knows nothing of HTTP, clocks or async
//! runtimes; it never holds a lock across a call into caller code.

use std::fmt;

mod bucket;
mod cache_aware;
mod consistent_hash;
mod hash;
mod manual;
mod order;
mod power_of_two;
mod prefix_hash;
mod radix_tree;
mod random;
mod registry;
mod round_robin;
#[cfg(test)]
mod testutil;

pub use bucket::{ADJUST_INTERVAL_SECS as BUCKET_ADJUST_INTERVAL_SECS, BucketConfig};
pub use manual::{AssignmentMode, MAX_KEYS as MANUAL_MAX_KEYS, ManualConfig};
pub use prefix_hash::{CHARS_PER_TOKEN, OVERLOAD_ABS_MARGIN, PrefixHashConfig};

/// How many leading chars of a request's text cache_aware indexes and matches. Longer texts are
/// truncated to this many chars (Unicode scalar values) before insertion and matching, and the
/// match rate is computed against the truncated length.
pub const MAX_INDEXED_CHARS: usize = 4096;

/// What a policy may see of one candidate worker.
pub trait WorkerRef {
    /// Stable identity of the worker (its URL, with `@rank` for a DP rank).
    fn url(&self) -> &str;
    /// Current in-flight load as the router counts it.
    fn load(&self) -> u64;
}

/// The parts of a request a policy may use.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestInfo<'a> {
    /// Request text (prompt or flattened messages), for cache_aware.
    pub text: Option<&'a str>,
    /// `X-SMG-Routing-Key`, for consistent_hashing and manual.
    pub routing_key: Option<&'a str>,
    /// The caller's monotonic clock in seconds, for the policies that keep time-bound state
    /// (manual's idle keys, bucket's window); this crate reads no clock itself.
    pub now_secs: u64,
    /// The prompt's leading token ids, when the caller has a tokenizer: prefix_hash keys on
    /// them instead of on characters of `text`.
    pub prefix_tokens: Option<&'a [u32]>,
}

/// Which algorithm a [`Policy`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PolicyKind {
    /// Uniformly random.
    Random,
    /// Cycle through the candidates.
    RoundRobin,
    /// Sample two, take the less loaded.
    PowerOfTwo,
    /// Prefix-cache affinity with load-balance thresholds.
    CacheAware,
    /// Hash ring over worker URLs keyed by the routing key.
    ConsistentHashing,
    /// Hash ring keyed by the prompt's prefix, with a load-factor override.
    PrefixHash,
    /// Sticky assignment of routing keys to workers.
    Manual,
    /// Ranges of request length per worker, adapted to the traffic.
    Bucket,
}

impl PolicyKind {
    /// Every policy, in the order of [`NAMES`](Self::NAMES).
    pub const ALL: [PolicyKind; 8] = [
        PolicyKind::Random,
        PolicyKind::RoundRobin,
        PolicyKind::PowerOfTwo,
        PolicyKind::CacheAware,
        PolicyKind::ConsistentHashing,
        PolicyKind::PrefixHash,
        PolicyKind::Manual,
        PolicyKind::Bucket,
    ];

    /// Every policy name accepted on the command line.
    pub const NAMES: [&'static str; 8] = [
        "random",
        "round_robin",
        "power_of_two",
        "cache_aware",
        "consistent_hashing",
        "prefix_hash",
        "manual",
        "bucket",
    ];

    /// Parses a command-line policy name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "random" => Self::Random,
            "round_robin" => Self::RoundRobin,
            "power_of_two" => Self::PowerOfTwo,
            "cache_aware" => Self::CacheAware,
            "consistent_hashing" => Self::ConsistentHashing,
            "prefix_hash" => Self::PrefixHash,
            "manual" => Self::Manual,
            "bucket" => Self::Bucket,
            _ => return None,
        })
    }

    /// The command-line name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Random => "random",
            Self::RoundRobin => "round_robin",
            Self::PowerOfTwo => "power_of_two",
            Self::CacheAware => "cache_aware",
            Self::ConsistentHashing => "consistent_hashing",
            Self::PrefixHash => "prefix_hash",
            Self::Manual => "manual",
            Self::Bucket => "bucket",
        }
    }
}

impl fmt::Display for PolicyKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Knobs of the cache_aware policy (SMG's names and defaults).
#[derive(Debug, Clone, Copy)]
pub struct CacheAwareConfig {
    /// Minimum prefix match rate (0..=1) to route by cache affinity.
    pub cache_threshold: f32,
    /// Load spread (max - min) above which the system counts as imbalanced...
    pub balance_abs_threshold: u64,
    /// ...when also max > min * this factor.
    pub balance_rel_threshold: f32,
    /// Maximum characters kept per worker tree; eviction trims to it.
    pub max_tree_size: usize,
}

impl Default for CacheAwareConfig {
    fn default() -> Self {
        Self {
            cache_threshold: 0.3,
            balance_abs_threshold: 64,
            balance_rel_threshold: 1.5,
            max_tree_size: 1 << 24,
        }
    }
}

/// Every policy's knobs; each policy reads only its own.
#[derive(Debug, Clone, Copy, Default)]
pub struct PolicySettings {
    /// cache_aware (its balance thresholds are bucket's too, as in SMG).
    pub cache: CacheAwareConfig,
    /// prefix_hash.
    pub prefix_hash: PrefixHashConfig,
    /// manual.
    pub manual: ManualConfig,
}

/// A worker-selection policy: [`rank`](Self::rank) orders candidates without changing state,
/// [`commit`](Self::commit) records the candidate the caller actually reserved.
///
/// `Send + Sync`; share one per worker pool (e.g. behind an `Arc`). Rank writes a full
/// permutation of the candidate indices for every policy (callers may stop early).
#[derive(Debug)]
pub struct Policy {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Random(random::RandomPolicy),
    RoundRobin(round_robin::RoundRobin),
    PowerOfTwo(power_of_two::PowerOfTwo),
    CacheAware(cache_aware::CacheAware),
    ConsistentHashing(consistent_hash::ConsistentHash),
    PrefixHash(prefix_hash::PrefixHash),
    Manual(manual::Manual),
    Bucket(bucket::Bucket),
}

impl Policy {
    /// Creates a policy with default settings apart from cache_aware's.
    pub fn new(kind: PolicyKind, cache: CacheAwareConfig) -> Self {
        Self::with_settings(
            kind,
            PolicySettings {
                cache,
                ..PolicySettings::default()
            },
        )
    }

    /// Creates a policy; each kind reads only its own part of `settings`.
    pub fn with_settings(kind: PolicyKind, settings: PolicySettings) -> Self {
        let cache = settings.cache;
        let inner = match kind {
            PolicyKind::Random => Inner::Random(random::RandomPolicy),
            PolicyKind::RoundRobin => Inner::RoundRobin(round_robin::RoundRobin::default()),
            PolicyKind::PowerOfTwo => Inner::PowerOfTwo(power_of_two::PowerOfTwo),
            PolicyKind::CacheAware => Inner::CacheAware(cache_aware::CacheAware::new(cache)),
            PolicyKind::ConsistentHashing => {
                Inner::ConsistentHashing(consistent_hash::ConsistentHash::default())
            }
            PolicyKind::PrefixHash => {
                Inner::PrefixHash(prefix_hash::PrefixHash::new(settings.prefix_hash))
            }
            PolicyKind::Manual => Inner::Manual(manual::Manual::new(settings.manual)),
            PolicyKind::Bucket => Inner::Bucket(bucket::Bucket::new(BucketConfig {
                balance_abs_threshold: cache.balance_abs_threshold,
                balance_rel_threshold: cache.balance_rel_threshold,
            })),
        };
        Self { inner }
    }

    /// Which algorithm this policy runs.
    pub fn kind(&self) -> PolicyKind {
        match self.inner {
            Inner::Random(_) => PolicyKind::Random,
            Inner::RoundRobin(_) => PolicyKind::RoundRobin,
            Inner::PowerOfTwo(_) => PolicyKind::PowerOfTwo,
            Inner::CacheAware(_) => PolicyKind::CacheAware,
            Inner::ConsistentHashing(_) => PolicyKind::ConsistentHashing,
            Inner::PrefixHash(_) => PolicyKind::PrefixHash,
            Inner::Manual(_) => PolicyKind::Manual,
            Inner::Bucket(_) => PolicyKind::Bucket,
        }
    }

    /// Clears `out` and writes indices into `workers`, best first. Must not change any policy state.
    /// Non-empty whenever `workers` is non-empty. May be a prefix of the full order (at least 1,
    /// ideally 2+ so the caller can fall back when a reservation races), but never contains duplicates.
    ///
    /// (Every policy here currently writes the full order.)
    pub fn rank<W: WorkerRef>(&self, workers: &[W], req: &RequestInfo<'_>, out: &mut Vec<usize>) {
        match &self.inner {
            Inner::Random(p) => p.rank(workers.len(), out),
            Inner::RoundRobin(p) => p.rank(workers.len(), out),
            Inner::PowerOfTwo(p) => p.rank(workers, out),
            Inner::CacheAware(p) => p.rank(workers, req, out),
            Inner::ConsistentHashing(p) => p.rank(workers, req, out),
            Inner::PrefixHash(p) => p.rank(workers, req, out),
            Inner::Manual(p) => p.rank(workers, req, out),
            Inner::Bucket(p) => p.rank(workers, req, out),
        }
    }

    /// Records that `workers[chosen]` was actually used for `req` (cache_aware inserts the text into that
    /// worker's tree; round_robin advances its counter). Called only for reserved choices.
    ///
    /// An out-of-range `chosen` is ignored.
    pub fn commit<W: WorkerRef>(&self, workers: &[W], chosen: usize, req: &RequestInfo<'_>) {
        let Some(worker) = workers.get(chosen) else {
            return;
        };
        match &self.inner {
            Inner::RoundRobin(p) => p.commit(),
            Inner::CacheAware(p) => p.commit(worker.url(), req),
            Inner::Manual(p) => p.commit(worker.url(), req),
            Inner::Bucket(p) => p.commit(worker.url(), req),
            Inner::Random(_)
            | Inner::PowerOfTwo(_)
            | Inner::ConsistentHashing(_)
            | Inner::PrefixHash(_) => {}
        }
    }

    /// Periodic upkeep at `now_secs` on the caller's clock (the same clock as
    /// [`RequestInfo::now_secs`]): manual forgets keys idle past `max_idle_secs`, bucket
    /// recomputes its length ranges. Call it every [`BUCKET_ADJUST_INTERVAL_SECS`] or more
    /// often; no-op for other policies.
    pub fn tick(&self, now_secs: u64) {
        match &self.inner {
            Inner::Manual(p) => {
                p.expire_idle(now_secs);
            }
            Inner::Bucket(p) => p.adjust(now_secs),
            _ => {}
        }
    }

    /// Routing keys manual currently remembers (0 for other policies).
    pub fn manual_keys(&self) -> usize {
        match &self.inner {
            Inner::Manual(p) => p.keys(),
            _ => 0,
        }
    }

    /// Trims cache_aware trees so each holds at most `max_tree_size` characters, evicting least-recently-used
    /// leaves first (the router calls it periodically). No-op for other policies.
    pub fn evict(&self) {
        if let Inner::CacheAware(p) = &self.inner {
            p.evict();
        }
    }

    /// Forgets all state kept for the worker with this url (worker removed).
    pub fn remove_worker(&self, url: &str) {
        match &self.inner {
            Inner::CacheAware(p) => p.remove_worker(url),
            Inner::ConsistentHashing(p) => p.remove_worker(url),
            Inner::PrefixHash(p) => p.remove_worker(url),
            Inner::Manual(p) => p.remove_worker(url),
            Inner::Bucket(p) => p.remove_worker(url),
            Inner::Random(_) | Inner::RoundRobin(_) | Inner::PowerOfTwo(_) => {}
        }
    }

    /// Characters the cache_aware tree currently holds for the worker with this url (0 for an
    /// unknown url and for other policies). For metrics and tests.
    pub fn cached_chars(&self, url: &str) -> usize {
        match &self.inner {
            Inner::CacheAware(p) => p.cached_chars(url),
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use testutil::workers;

    #[test]
    fn names_round_trip_and_kind_matches() {
        for (kind, name) in PolicyKind::ALL.iter().zip(PolicyKind::NAMES) {
            assert_eq!(PolicyKind::parse(name), Some(*kind));
            assert_eq!(kind.to_string(), name);
            assert_eq!(
                Policy::new(*kind, CacheAwareConfig::default()).kind(),
                *kind
            );
        }
        assert_eq!(PolicyKind::parse("nope"), None);
    }

    #[test]
    fn policy_is_send_sync_debug() {
        fn check<T: Send + Sync + fmt::Debug>() {}
        check::<Policy>();
    }

    #[test]
    fn every_policy_ranks_a_permutation() {
        let ws = workers(&[3, 1, 4, 1, 5]);
        let req = RequestInfo {
            text: Some("hello"),
            ..Default::default()
        };
        for kind in PolicyKind::ALL {
            let p = Policy::new(kind, CacheAwareConfig::default());
            let mut out = vec![99];
            p.rank(&[] as &[testutil::W], &req, &mut out);
            assert!(out.is_empty(), "{kind}");
            p.rank(&ws, &req, &mut out);
            let mut sorted = out.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2, 3, 4], "{kind}");
            p.commit(&ws, out[0], &req);
            p.commit(&ws, 17, &req); // out of range: ignored
            p.evict();
            p.remove_worker(&ws[0].url);
        }
    }

    #[test]
    fn deterministic_policies_rank_twice_the_same() {
        let ws = workers(&[3, 1, 4, 1, 5]);
        let req = RequestInfo {
            text: Some("some prompt"),
            routing_key: Some("key"),
            ..Default::default()
        };
        for kind in [
            PolicyKind::RoundRobin,
            PolicyKind::CacheAware,
            PolicyKind::ConsistentHashing,
            PolicyKind::PrefixHash,
            PolicyKind::Bucket,
        ] {
            let p = Policy::new(kind, CacheAwareConfig::default());
            let (mut a, mut b) = (Vec::new(), Vec::new());
            p.rank(&ws, &req, &mut a);
            p.rank(&ws, &req, &mut b);
            assert_eq!(a, b, "{kind}");
        }
    }

    #[test]
    fn commit_drives_state() {
        let ws = workers(&[0, 0, 0]);
        let req = RequestInfo {
            text: Some("prompt text"),
            ..Default::default()
        };
        let rr = Policy::new(PolicyKind::RoundRobin, CacheAwareConfig::default());
        let mut out = Vec::new();
        rr.rank(&ws, &req, &mut out);
        assert_eq!(out[0], 0);
        rr.commit(&ws, 0, &req);
        rr.rank(&ws, &req, &mut out);
        assert_eq!(out[0], 1);

        let ca = Policy::new(PolicyKind::CacheAware, CacheAwareConfig::default());
        ca.rank(&ws, &req, &mut out);
        assert_eq!(ca.cached_chars(&ws[out[0]].url), 0);
        ca.commit(&ws, 2, &req);
        assert_eq!(ca.cached_chars(&ws[2].url), 11);
        ca.rank(&ws, &req, &mut out);
        assert_eq!(out[0], 2);
        ca.remove_worker(&ws[2].url);
        assert_eq!(ca.cached_chars(&ws[2].url), 0);
        assert_eq!(rr.cached_chars(&ws[2].url), 0);
    }

    #[test]
    fn concurrent_use_is_safe() {
        let ws = workers(&[1, 2, 3, 4, 5, 6]);
        for kind in PolicyKind::ALL {
            let p = Policy::new(
                kind,
                CacheAwareConfig {
                    max_tree_size: 64,
                    ..CacheAwareConfig::default()
                },
            );
            std::thread::scope(|s| {
                for t in 0..4 {
                    let (p, ws) = (&p, &ws);
                    s.spawn(move || {
                        let mut out = Vec::new();
                        for i in 0..300 {
                            let text = format!("thread {t} prompt {}", i % 17);
                            let key = format!("k{}", i % 5);
                            let req = RequestInfo {
                                text: Some(&text),
                                routing_key: Some(&key),
                                now_secs: i as u64,
                                prefix_tokens: None,
                            };
                            let slice = &ws[..(i % ws.len()) + 1];
                            p.rank(slice, &req, &mut out);
                            assert_eq!(out.len(), slice.len());
                            p.commit(slice, out[0], &req);
                            if i % 50 == 0 {
                                p.evict();
                                p.tick(i as u64);
                                p.remove_worker(&ws[t].url);
                            }
                        }
                    });
                }
            });
            p.evict();
            for w in &ws {
                assert!(p.cached_chars(&w.url) <= 64);
            }
        }
    }
}
