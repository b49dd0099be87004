//! Property test of per-worker token budgets.
//!
//! Random arrivals (prompt sizes from 1 to twice the budget) and releases run on a current-thread
//! runtime against two workers, with or without a count limit, all in one wait class. After
//! every step:
//!
//! - per worker, the count is within its limit, and the tokens held (the sum of the held
//!   permits' tokens, which the slot reports too) are within the budget, unless the worker holds
//!   a single request (an oversized prompt runs alone);
//! - a request is admitted only in arrival order (one class: FIFO);
//! - no stranding: when requests wait, the oldest does not fit on any worker.
//!
//! At the end every held permit is released, oldest first, until everything was admitted: no
//! request starves, and counts and tokens return to zero.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use pdrouter_admission::{
    Admission, AdmissionConfig, Admitted, Observer, Permit, Ranking, Rejected, Selector, Slot,
};
use proptest::prelude::*;
use tokio::sync::mpsc;

struct NoObserver;
impl Observer for NoObserver {}

struct AnyOf {
    slots: Vec<Arc<Slot>>,
    tokens: u64,
}

impl Selector for AnyOf {
    type Choice = usize;
    fn rank(&mut self, has_room: &dyn Fn(&Slot) -> bool) -> Ranking<usize> {
        let with_room = self.slots.iter().enumerate().filter(|(_, s)| has_room(s));
        Ranking::Candidates(with_room.map(|(i, s)| (s.clone(), i)).collect())
    }
    fn commit(&mut self, _: &usize) {}
    fn wait_class(&self) -> Option<Box<str>> {
        Some("any".into())
    }
    fn prompt_tokens(&self) -> u64 {
        self.tokens
    }
}

#[derive(Debug, Clone)]
enum Op {
    Arrive(u64),
    /// Release the held permit at this index (modulo the number held).
    Release(usize),
}

fn op(budget: u64) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (1..=2 * budget).prop_map(Op::Arrive),
        2 => any::<usize>().prop_map(Op::Release),
    ]
}

type Outcome = (u32, u64, Result<Admitted<usize>, Rejected>);

struct Harness {
    adm: Admission,
    slots: Vec<Arc<Slot>>,
    count: Option<u32>,
    budget: u32,
    tx: mpsc::UnboundedSender<Outcome>,
    rx: mpsc::UnboundedReceiver<Outcome>,
    next_id: u32,
    /// Waiting requests: id → tokens.
    waiting: BTreeMap<u32, u64>,
    /// Held permits: (id, worker, permit).
    held: Vec<(u32, usize, Permit)>,
    admitted: u32,
}

impl Harness {
    async fn settle() {
        for _ in 0..32 {
            tokio::task::yield_now().await;
        }
    }

    fn fits(&self, w: usize, tokens: u64) -> bool {
        let s = &self.slots[w];
        let count = s.inflight();
        count < self.count.unwrap_or(u32::MAX)
            && (count == 0 || u64::from(s.inflight_tokens()) + tokens <= u64::from(self.budget))
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Arrive(tokens) => {
                let id = self.next_id;
                self.next_id += 1;
                self.waiting.insert(id, tokens);
                let sel = AnyOf {
                    slots: self.slots.clone(),
                    tokens,
                };
                let adm = self.adm.clone();
                let tx = self.tx.clone();
                tokio::spawn(async move {
                    let r = adm.acquire(sel).await;
                    let _ = tx.send((id, tokens, r));
                });
            }
            Op::Release(i) => {
                if !self.held.is_empty() {
                    let i = i % self.held.len();
                    drop(self.held.remove(i));
                }
            }
        }
        Self::settle().await;
        while let Ok((id, tokens, r)) = self.rx.try_recv() {
            let admitted = r.map_err(|e| TestCaseError::fail(format!("{id} rejected: {e:?}")))?;
            let oldest = self.waiting.keys().next().copied();
            prop_assert_eq!(Some(id), oldest, "one class is served in arrival order");
            self.waiting.remove(&id);
            prop_assert_eq!(u64::from(admitted.permit.tokens()), tokens);
            self.admitted += 1;
            self.held.push((id, admitted.choice, admitted.permit));
        }
        for (w, slot) in self.slots.iter().enumerate() {
            let mine: Vec<_> = self.held.iter().filter(|(_, k, _)| *k == w).collect();
            let tokens: u64 = mine.iter().map(|(_, _, p)| u64::from(p.tokens())).sum();
            prop_assert_eq!(slot.inflight() as usize, mine.len());
            prop_assert_eq!(u64::from(slot.inflight_tokens()), tokens);
            prop_assert!(slot.inflight() <= self.count.unwrap_or(u32::MAX));
            prop_assert!(
                mine.len() <= 1 || tokens <= u64::from(self.budget),
                "worker {} holds {} tokens in {} requests over budget {}",
                w,
                tokens,
                mine.len(),
                self.budget
            );
        }
        if let Some((&id, &tokens)) = self.waiting.iter().next() {
            for w in 0..self.slots.len() {
                prop_assert!(!self.fits(w, tokens), "{} stranded: fits on {}", id, w);
            }
        }
        Ok(())
    }
}

fn run(count: Option<u32>, budget: u32, ops: &[Op]) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let adm = Admission::new(
            AdmissionConfig {
                max_inflight_per_worker: count.unwrap_or(u32::MAX),
                max_inflight_tokens_per_worker: Some(budget),
                queue_size: 1000,
                queue_timeout: Duration::from_secs(3600),
                priorities: None,
            },
            Arc::new(NoObserver),
        );
        let slots = vec![adm.slot("w0"), adm.slot("w1")];
        let (tx, rx) = mpsc::unbounded_channel();
        let mut h = Harness {
            adm,
            slots,
            count,
            budget,
            tx,
            rx,
            next_id: 0,
            waiting: BTreeMap::new(),
            held: Vec::new(),
            admitted: 0,
        };
        for op in ops {
            h.step(op).await?;
        }
        // Drain: release the oldest held request until everything has been admitted.
        let mut rounds = 0;
        while !h.held.is_empty() {
            rounds += 1;
            prop_assert!(rounds <= 10_000, "drain does not end");
            h.step(&Op::Release(0)).await?;
        }
        prop_assert!(h.waiting.is_empty(), "starved: {:?}", h.waiting);
        prop_assert_eq!(h.admitted, h.next_id);
        prop_assert_eq!(h.adm.queued(), 0);
        prop_assert_eq!(h.adm.inflight_total(), 0);
        for s in &h.slots {
            prop_assert_eq!(s.inflight_tokens(), 0);
        }
        Ok(())
    })
}

proptest! {
    #[test]
    fn token_budget_never_exceeded_and_nobody_starves(
        (budget, ops) in (1u32..=50).prop_flat_map(|b| {
            (Just(b), proptest::collection::vec(op(u64::from(b)), 1..80))
        }),
        count in proptest::option::of(1u32..=3),
    ) {
        run(count, budget, &ops)?;
    }
}

/// Found by the property: once a large head is admitted on the worker that freed up, the
/// smaller request behind it fits on the other worker and must not stay queued.
#[test]
fn a_smaller_successor_is_not_stranded_behind_a_larger_head() {
    let ops = [Op::Arrive(2), Op::Arrive(1), Op::Arrive(2), Op::Arrive(1)];
    run(Some(2), 2, &ops).unwrap();
}
