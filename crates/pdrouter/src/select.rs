//! Worker selection: filter → rank → reserve → commit, shared by every dispatch path.
//!
//! [`Candidates`] is the per-request selector. It re-reads the registry snapshot on every call
//! (so a waiter sees the worker set as it is when it is served), keeps only routable workers of
//! the wanted type (or the strict `X-SMG-Target-Worker`) that serve the wanted model, drops
//! those without room, and asks
//! the policy for an order. The policy commits only the choice that was reserved: through
//! [`pdrouter_admission::Selector::commit`] with admission, or right after the pick without it.
//! Its wait class is (worker type, strict target, model): everything else that filters
//! candidates is worker state shared by all requests, which is what lets admission re-rank only
//! the oldest waiter of each class.

use std::sync::Arc;

use pdrouter_admission::{Priority, Ranking, Selector, Slot};
use pdrouter_policy::{Policy, RequestInfo};
use smallvec::SmallVec;

use crate::config::WorkerType;
use crate::error::ApiError;
use crate::registry::{Registry, Worker};

/// Candidates of one worker type ranked without a heap allocation (a larger fleet spills to
/// the heap, as before).
const INLINE_CANDIDATES: usize = 8;

/// The policies' clock: whole seconds since this process first asked (monotonic, from
/// `tokio::time`, so paused-clock tests drive it). Requests and [`Policy::tick`] read the same
/// clock.
pub fn policy_clock_secs() -> u64 {
    static START: std::sync::OnceLock<tokio::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(tokio::time::Instant::now)
        .elapsed()
        .as_secs()
}

/// What a request asks of selection.
#[derive(Debug, Clone)]
pub struct Wanted {
    /// Routing text (cache_aware).
    pub text: Arc<str>,
    /// `X-SMG-Routing-Key`.
    pub routing_key: Option<Arc<str>>,
    /// `X-SMG-Target-Worker`: strict index into the workers of the type.
    pub target: Option<usize>,
    /// Only workers that serve this model (see [`Worker::serves`]); `None`: any worker.
    pub model: Option<Arc<str>>,
    /// The prompt's leading token ids, when the router has a tokenizer and prefix_hash is in
    /// use with http:// workers.
    pub prefix_tokens: Option<Arc<Vec<u32>>>,
}

/// A selector for one request and one worker type.
#[derive(Debug)]
pub struct Candidates {
    registry: Arc<Registry>,
    policy: Arc<Policy>,
    worker_type: WorkerType,
    wanted: Wanted,
    order: Vec<usize>,
    prompt_tokens: u32,
    /// Only gRPC workers of this runtime (a Decode paired with its Prefill); `None`: any.
    /// Kept out of [`Wanted`]: it fits this struct's padding, and queued waiters hold one.
    runtime: Option<crate::grpc::runtime::Runtime>,
    /// Only HTTP workers of this engine and KV connector (a Decode paired with its Prefill);
    /// `None`: any.
    pairing: Option<crate::config::HttpPairing>,
    priority: Priority,
}

impl Candidates {
    /// A selector over `worker_type` workers.
    pub fn new(
        registry: Arc<Registry>,
        policy: Arc<Policy>,
        worker_type: WorkerType,
        wanted: Wanted,
    ) -> Self {
        Self {
            registry,
            policy,
            worker_type,
            wanted,
            order: Vec::new(),
            prompt_tokens: 1,
            runtime: None,
            pairing: None,
            priority: Priority::Default,
        }
    }

    /// Only workers of `runtime`, when given.
    pub fn with_runtime(mut self, runtime: Option<crate::grpc::runtime::Runtime>) -> Self {
        self.runtime = runtime;
        self
    }

    /// Only HTTP workers of `pairing`, when given (a PD pair speaks one engine's handoff).
    pub fn with_pairing(mut self, pairing: Option<crate::config::HttpPairing>) -> Self {
        self.pairing = pairing;
        self
    }

    /// The request's priority class, for admission with priority classes (default `default`).
    pub fn with_priority(mut self, priority: Priority) -> Self {
        self.priority = priority;
        self
    }

    /// The request's prompt tokens, for an admission token budget (default 1).
    pub fn with_prompt_tokens(mut self, tokens: u64) -> Self {
        self.prompt_tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
        self
    }

    fn info(&self) -> RequestInfo<'_> {
        RequestInfo {
            text: Some(&self.wanted.text),
            routing_key: self.wanted.routing_key.as_deref(),
            now_secs: policy_clock_secs(),
            prefix_tokens: self.wanted.prefix_tokens.as_deref().map(Vec::as_slice),
        }
    }

    /// Itself, once [`check_target`](Self::check_target) passed.
    pub fn checked_target(self) -> Result<Self, ApiError> {
        self.check_target().map(|()| self)
    }

    /// Checks the strict target exists (out of range is a 503 before any waiting).
    pub fn check_target(&self) -> Result<(), ApiError> {
        if let Some(i) = self.wanted.target {
            let count = self.registry.snapshot().of_type(self.worker_type).len();
            if i >= count {
                return Err(ApiError::target_out_of_range(
                    i,
                    count,
                    self.worker_type.as_str(),
                ));
            }
        }
        Ok(())
    }

    /// Routable workers that pass `has_room`, ranked by the policy; `None` when no routable
    /// worker matches at all.
    fn ranked(&mut self, has_room: &dyn Fn(&Worker) -> bool) -> Option<Vec<Arc<Worker>>> {
        let snap = self.registry.snapshot();
        let all = snap.of_type(self.worker_type);
        let pool = match self.wanted.target {
            Some(i) => all.get(i..=i).unwrap_or(&[]),
            None => all,
        };
        // Borrow from the snapshot; only the workers the policy ranks are cloned out.
        let mut any_routable = false;
        let model = self.wanted.model.as_deref();
        let (runtime, pairing) = (self.runtime, self.pairing);
        // Inline up to a fleet of `INLINE_CANDIDATES` per type: no allocation per leg.
        let with_room: SmallVec<[&Arc<Worker>; INLINE_CANDIDATES]> = pool
            .iter()
            .filter(|w| {
                w.is_routable()
                    && model.is_none_or(|m| w.serves(m))
                    && runtime.is_none_or(|r| w.runtime() == Some(r))
                    && pairing.is_none_or(|p| w.pairing() == Some(p))
            })
            .inspect(|_| any_routable = true)
            .filter(|w| has_room(w))
            .collect();
        if !any_routable {
            return None;
        }
        if with_room.is_empty() {
            return Some(Vec::new());
        }
        let mut order = std::mem::take(&mut self.order);
        let refs: SmallVec<[&Worker; INLINE_CANDIDATES]> =
            with_room.iter().map(|w| &***w).collect();
        self.policy.rank(&refs, &self.info(), &mut order);
        let ranked = order
            .iter()
            .filter_map(|&i| with_room.get(i).map(|w| Arc::clone(w)))
            .collect();
        self.order = order;
        Some(ranked)
    }

    /// Picks a worker now, without admission: rank, take the first, commit.
    pub fn pick(&mut self) -> Result<Arc<Worker>, ApiError> {
        self.check_target()?;
        let ranked = self.ranked(&|_| true);
        match ranked.and_then(|r| r.into_iter().next()) {
            Some(w) => {
                self.policy.commit(&[&*w], 0, &self.info());
                Ok(w)
            }
            None => Err(match self.wanted.target {
                Some(i) => ApiError::target_unavailable(i),
                None => ApiError::no_worker(self.worker_type.as_str()),
            }),
        }
    }
}

impl Selector for Candidates {
    type Choice = Arc<Worker>;

    fn rank(&mut self, has_room: &dyn Fn(&Slot) -> bool) -> Ranking<Arc<Worker>> {
        let ranked = self.ranked(&|w: &Worker| w.slot().is_some_and(|s| has_room(s)));
        match ranked {
            None => Ranking::Unavailable,
            Some(ws) => Ranking::Candidates(
                ws.into_iter()
                    .filter_map(|w| w.slot().cloned().map(|s| (s, w)))
                    .collect(),
            ),
        }
    }

    fn commit(&mut self, choice: &Arc<Worker>) {
        self.policy.commit(&[&**choice], 0, &self.info());
    }

    fn prompt_tokens(&self) -> u64 {
        u64::from(self.prompt_tokens)
    }

    fn priority(&self) -> Priority {
        self.priority
    }

    /// Requests of one worker type with the same strict target (or none) and the same model
    /// (or none) filter the same workers the same way; only the policy's order differs.
    fn wait_class(&self) -> Option<Box<str>> {
        let target = self
            .wanted
            .target
            .map_or(String::from("any"), |i| i.to_string());
        // The model goes last and marked, so no model name can make two keys collide.
        let model = self.wanted.model.as_deref().map(|m| format!("model={m}"));
        let runtime = match (self.runtime, self.pairing) {
            (Some(r), _) => r.name(),
            (None, Some(p)) => p.name(),
            (None, None) => "any-runtime",
        };
        let class = format!(
            "{} {target} {runtime} {}",
            self.worker_type.as_str(),
            model.as_deref().unwrap_or("any-model")
        );
        Some(class.into())
    }
}

#[cfg(test)]
mod tests {
    use pdrouter_policy::{CacheAwareConfig, PolicyKind};

    use super::*;
    use crate::config::BreakerConfig;

    fn registry() -> Arc<Registry> {
        Registry::new(
            BreakerConfig {
                enabled: false,
                failure_threshold: 1,
                success_threshold: 1,
                timeout: std::time::Duration::from_secs(1),
                window: std::time::Duration::from_secs(120),
            },
            None,
        )
    }

    fn round_robin() -> Arc<Policy> {
        Arc::new(Policy::new(
            PolicyKind::RoundRobin,
            CacheAwareConfig::default(),
        ))
    }

    fn wanted(target: Option<usize>, model: Option<&str>) -> Wanted {
        Wanted {
            text: "some text".into(),
            routing_key: None,
            target,
            model: model.map(Into::into),
            prefix_tokens: None,
        }
    }

    fn class(worker_type: WorkerType, target: Option<usize>, model: Option<&str>) -> Box<str> {
        Candidates::new(
            registry(),
            round_robin(),
            worker_type,
            wanted(target, model),
        )
        .wait_class()
        .expect("the router always names a class")
    }

    /// A fleet larger than the inline candidate lists ranks and picks as a small one does.
    #[test]
    fn a_fleet_past_the_inline_lists_is_ranked_whole() {
        let registry = registry();
        let n = INLINE_CANDIDATES + 3;
        for i in 0..n {
            let spec =
                crate::config::WorkerSpec::new(format!("http://p{i}:1"), WorkerType::Prefill);
            registry
                .register(&spec, None, crate::registry::WorkerStatus::Ready)
                .expect("registered");
        }
        let policy = round_robin();
        let mut picked = std::collections::HashSet::new();
        for _ in 0..n {
            let mut c = Candidates::new(
                registry.clone(),
                policy.clone(),
                WorkerType::Prefill,
                wanted(None, None),
            );
            assert_eq!(c.ranked(&|_| true).map(|r| r.len()), Some(n));
            picked.insert(c.pick().expect("a worker").url().to_owned());
        }
        assert_eq!(picked.len(), n, "round_robin reaches every worker");
    }

    #[test]
    fn wait_class_is_exactly_what_filters_candidates() {
        use WorkerType::{Decode, Prefill};
        let base = class(Prefill, None, Some("m"));
        // Text and routing key only change the order, never the class.
        assert_eq!(base, class(Prefill, None, Some("m")));
        let others = [
            class(Decode, None, Some("m")),
            class(Prefill, Some(0), Some("m")),
            class(Prefill, None, Some("n")),
            class(Prefill, None, None),
            class(Prefill, None, Some("any-model")),
            class(Prefill, None, Some("")),
        ];
        for (i, a) in others.iter().enumerate() {
            assert_ne!(*a, base);
            for b in &others[i + 1..] {
                assert_ne!(a, b);
            }
        }
    }
}
