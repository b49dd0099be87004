//! Self-sizing Prefill limits (`auto`): each Prefill's end is fed to its worker's control law
//! ([`pdrouter_admission::autosize`]) and the law's answer becomes the worker's admission
//! limit ([`Admission::set_limits`]) and its `smg_pd_prefill_admission_limit*` gauge.
//!
//! What a Prefill tells the law is decided where its permit is released
//! ([`SizedPermit::release`]): a Prefill that ended well is a completion (prompt tokens,
//! time from admission to the end, and what its worker had in flight); a refusal as
//! overloaded (429/503) is an overload; any other failure says nothing about the worker's
//! capacity and is not reported. A permit dropped without `release` (the request cancelled)
//! reports nothing either.
//!
//! Invariants: the permit is released exactly once, by dropping it, whether or not the Prefill
//! was reported; a worker's law lives from its first report until the worker is removed
//! ([`Sizer::forget`]); the sizer's lock is held only to step a law, never while admission
//! wakes waiters.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;
use pdrouter_admission::{Admission, AutoConfig, AutoLimit, Completion, Permit, Slot, Unit};
use tokio::time::Instant;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// The control laws of one router's Prefill workers, and where their answers go.
#[derive(Debug)]
pub(crate) struct Sizer {
    config: AutoConfig,
    admission: Admission,
    metrics: Arc<Metrics>,
    /// Per slot key.
    laws: Mutex<HashMap<Box<str>, AutoLimit>>,
}

impl Sizer {
    pub(crate) fn new(config: AutoConfig, admission: Admission, metrics: Arc<Metrics>) -> Self {
        Sizer {
            config,
            admission,
            metrics,
            laws: Mutex::new(HashMap::new()),
        }
    }

    /// Watches a Prefill admitted now.
    pub(crate) fn watch(self: &Arc<Self>, permit: Permit) -> SizedPermit {
        SizedPermit {
            permit,
            watch: Some((Arc::clone(self), Instant::now())),
        }
    }

    /// Forgets a removed worker's law (a worker registered again starts afresh).
    pub(crate) fn forget(&self, key: &str) {
        self.laws.lock().remove(key);
    }

    /// The current `auto` limit of the worker `key`, once it has reported.
    #[cfg(test)]
    pub(crate) fn limit_of(&self, key: &str) -> Option<u32> {
        self.laws.lock().get(key).map(AutoLimit::limit)
    }

    /// Steps `slot`'s law with how its Prefill ended and applies the answer.
    fn report(&self, slot: &Slot, prompt_tokens: u32, started: Instant, ended: Ended) {
        let now = Instant::now();
        let inflight = match self.config.unit {
            Unit::Requests => slot.inflight(),
            Unit::Tokens => slot.inflight_tokens(),
        };
        let limit = {
            let mut laws = self.laws.lock();
            let law = laws
                .entry(Box::from(slot.key()))
                .or_insert_with(|| AutoLimit::new(self.config));
            match ended {
                Ended::Done => law.on_completion(
                    Completion {
                        prompt_tokens,
                        duration: now.saturating_duration_since(started),
                        inflight,
                    },
                    now,
                ),
                Ended::Overloaded => law.on_overload(now),
            }
        };
        let (count, tokens) = match self.config.unit {
            Unit::Requests => (limit, slot.token_limit()),
            Unit::Tokens => (slot.limit(), Some(limit)),
        };
        if (count, tokens) != (slot.limit(), slot.token_limit()) {
            self.admission.set_limits(slot, count, tokens);
            self.metrics.admission_limits(slot.key(), count, tokens);
        }
    }
}

/// What a Prefill's end says about its worker's capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// It completed.
    Done,
    /// The worker refused it as overloaded.
    Overloaded,
}

impl Ended {
    fn of<T>(outcome: &Result<T, ApiError>) -> Option<Ended> {
        match outcome {
            Ok(_) => Some(Ended::Done),
            Err(e) if e.worker_overloaded => Some(Ended::Overloaded),
            Err(_) => None,
        }
    }
}

/// An admission permit that, with an `auto` limit, reports how its Prefill ended when it is
/// released.
#[derive(Debug)]
#[must_use = "dropping the permit releases the slot at once"]
pub(crate) struct SizedPermit {
    permit: Permit,
    /// The sizer and the admission instant, with an `auto` limit.
    watch: Option<(Arc<Sizer>, Instant)>,
}

impl SizedPermit {
    /// A permit whose limit is fixed: released as is.
    pub(crate) fn fixed(permit: Permit) -> Self {
        SizedPermit {
            permit,
            watch: None,
        }
    }

    /// Reports how the Prefill ended (with an `auto` limit), then releases the slot.
    pub(crate) fn release<T>(self, outcome: &Result<T, ApiError>) {
        if let (Some((sizer, started)), Some(ended)) = (&self.watch, Ended::of(outcome)) {
            sizer.report(self.permit.slot(), self.permit.tokens(), *started, ended);
        }
        drop(self);
    }
}

/// Releases a Prefill slot, if admission gave one, as [`SizedPermit::release`] does.
pub(crate) fn release<T>(permit: Option<SizedPermit>, outcome: &Result<T, ApiError>) {
    if let Some(p) = permit {
        p.release(outcome);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use pdrouter_admission::{AdmissionConfig, Observer, Ranking, Selector};

    use super::*;
    use crate::error::Leg;

    /// The one worker, for a request of `.1` prompt tokens.
    struct One(Arc<Slot>, u64);

    impl Selector for One {
        type Choice = ();
        fn rank(&mut self, has_room: &dyn Fn(&Slot) -> bool) -> Ranking<()> {
            let room = has_room(&self.0);
            Ranking::Candidates(room.then(|| (self.0.clone(), ())).into_iter().collect())
        }
        fn commit(&mut self, _: &()) {}
        fn prompt_tokens(&self) -> u64 {
            self.1
        }
    }

    fn sizer(unit: Unit, min: u32, max: u32) -> (Arc<Sizer>, Arc<Slot>) {
        let metrics = Metrics::new();
        let (count, tokens) = match unit {
            Unit::Requests => (min, None),
            Unit::Tokens => (crate::config::NO_COUNT_LIMIT, Some(min)),
        };
        let admission = Admission::new(
            AdmissionConfig {
                max_inflight_per_worker: count,
                max_inflight_tokens_per_worker: tokens,
                queue_size: 16,
                queue_timeout: Duration::from_secs(600),
                priorities: None,
            },
            metrics.clone() as Arc<dyn Observer>,
        );
        let slot = admission.slot("http://p:1");
        let config = AutoConfig { unit, min, max };
        (Arc::new(Sizer::new(config, admission, metrics)), slot)
    }

    async fn admit(s: &Arc<Sizer>, slot: &Arc<Slot>) -> SizedPermit {
        let admitted = s.admission.acquire(One(slot.clone(), 100)).await.unwrap();
        s.watch(admitted.permit)
    }

    /// Rounds of the slot's whole limit in flight, each taking 20 ms (released together, so
    /// only the first release of a round sees the limit binding).
    async fn full_rounds(s: &Arc<Sizer>, slot: &Arc<Slot>, rounds: usize) {
        for _ in 0..rounds {
            let held: Vec<_> =
                futures_util::future::join_all((0..slot.limit()).map(|_| admit(s, slot))).await;
            tokio::time::advance(Duration::from_millis(20)).await;
            for p in held {
                p.release(&Ok::<(), ApiError>(()));
            }
        }
    }

    #[tokio::test(start_paused = true)]
    async fn completions_raise_a_binding_limit_and_set_the_slot_and_gauge() {
        let (s, slot) = sizer(Unit::Requests, 1, 8);
        assert_eq!(slot.limit(), 1);
        full_rounds(&s, &slot, 40).await;
        assert_eq!(
            slot.limit(),
            8,
            "grew to max while always full at the baseline"
        );
        assert_eq!(s.limit_of("http://p:1"), Some(8));
        assert_eq!(slot.inflight(), 0);
        let text = s.metrics.encode();
        assert!(
            text.contains("smg_pd_prefill_admission_limit{worker=\"http://p:1\"} 8"),
            "{text}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_overloaded_worker_halves_the_limit_and_other_failures_say_nothing() {
        let (s, slot) = sizer(Unit::Requests, 2, 16);
        full_rounds(&s, &slot, 200).await;
        assert_eq!(slot.limit(), 16);
        let broken = ApiError::upstream_broken(Leg::Prefill, "http://p:1");
        admit(&s, &slot).await.release(&Err::<(), _>(broken));
        assert_eq!(slot.limit(), 16, "a broken body is not a capacity signal");
        let busy = ApiError::upstream_status(
            Leg::Prefill,
            "http://p:1",
            http::StatusCode::SERVICE_UNAVAILABLE,
            "busy",
        );
        admit(&s, &slot).await.release(&Err::<(), _>(busy));
        assert_eq!(slot.limit(), 8);
        assert_eq!(slot.inflight(), 0);
        // Cancelled: released, not reported.
        drop(admit(&s, &slot).await);
        assert_eq!((slot.limit(), slot.inflight()), (8, 0));
        s.forget("http://p:1");
        assert_eq!(s.limit_of("http://p:1"), None);
    }

    #[tokio::test(start_paused = true)]
    async fn an_auto_token_budget_keeps_the_count_limit() {
        let (s, slot) = sizer(Unit::Tokens, 1000, 100_000);
        s.admission.set_limits(&slot, 3, Some(1000));
        for _ in 0..20 {
            let admitted = s.admission.acquire(One(slot.clone(), 400)).await.unwrap();
            let p = s.watch(admitted.permit);
            tokio::time::advance(Duration::from_millis(10)).await;
            p.release(&Ok::<(), ApiError>(()));
        }
        assert_eq!(slot.limit(), 3);
        assert_eq!(
            slot.token_limit(),
            Some(1000),
            "one 400-token request never binds 1000"
        );
    }
}
