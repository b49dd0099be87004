//! Model-based property test of priority classes in the admission controller.
//!
//! Random sequences of arrivals (any worker or one strict worker, each with a random priority),
//! releases, cancellations and clock advances run on a paused-clock current-thread runtime, with
//! per-priority queue sizes, timeouts and starvation ages. After every step:
//!
//! - per-worker in-flight count ≤ N;
//! - per-priority queue bound: never more waiters of a priority than its queue size, and an
//!   arrival is refused `QueueFull` exactly when its priority's queue is full and no worker it
//!   may use has room;
//! - class ordering, FIFO within a priority, promotion: when a waiter is admitted on worker w,
//!   no waiter still queued that could use w comes before it — a promoted waiter (waited past
//!   its priority's starvation age) before any other, promoted ones oldest first, the rest by
//!   priority, oldest first within one;
//! - no bypass: an arrival is admitted at once only if no waiter could use its worker;
//! - no stranding: no waiter is left queued while a worker it may use has room;
//! - no starvation and deadlines: a waiter leaves by its priority's deadline, never earlier
//!   by timeout;
//! - at the end (release everything, cancel the rest) `queued() == 0` and
//!   `inflight_total() == 0`, and the per-priority levels the observer saw are all zero.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pdrouter_admission::{
    Admission, AdmissionConfig, Admitted, ClassSettings, Observer, Permit, Priority,
    PriorityClasses, Ranking, Rejected, Rejection, Selector, Slot,
};
use proptest::prelude::*;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const WORKERS: usize = 2;

/// (queue size, timeout s, starvation age s) per priority, lowest first.
const CLASSES: [(usize, u64, Option<u64>); 4] = [
    (3, 40, Some(8)),
    (3, 30, Some(12)),
    (2, 20, None),
    (2, 20, None),
];

fn classes() -> PriorityClasses {
    PriorityClasses(CLASSES.map(|(q, t, s)| ClassSettings {
        queue_size: q,
        queue_timeout: Duration::from_secs(t),
        starvation_after: s.map(Duration::from_secs),
    }))
}

#[derive(Debug, Clone)]
enum Op {
    Arrive(Option<usize>, usize),
    Release(usize),
    Cancel(usize),
    Advance(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (proptest::option::weighted(0.7, 0..WORKERS), 0..4usize)
            .prop_map(|(t, p)| Op::Arrive(t, p)),
        4 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Cancel),
        3 => (1u64..9000).prop_map(Op::Advance),
    ]
}

struct Sel {
    slots: Arc<Vec<Arc<Slot>>>,
    target: Option<usize>,
    priority: Priority,
}

impl Selector for Sel {
    type Choice = usize;
    fn rank(&mut self, has_room: &dyn Fn(&Slot) -> bool) -> Ranking<usize> {
        Ranking::Candidates(
            (0..WORKERS)
                .filter(|k| self.target.is_none_or(|t| t == *k))
                .filter(|&k| has_room(&self.slots[k]))
                .map(|k| (Arc::clone(&self.slots[k]), k))
                .collect(),
        )
    }
    fn commit(&mut self, _: &usize) {}
    fn wait_class(&self) -> Option<Box<str>> {
        Some(format!("{:?}", self.target).into())
    }
    fn priority(&self) -> Priority {
        self.priority
    }
}

#[derive(Default)]
struct Levels(Mutex<[(usize, usize); 4]>);
impl Observer for Levels {
    fn priority_levels(&self, priority: Priority, queued: usize, inflight: usize) {
        self.0.lock()[priority.index()] = (queued, inflight);
    }
}

struct Waiting {
    target: Option<usize>,
    priority: Priority,
    since: Instant,
    handle: JoinHandle<()>,
}

type Outcome = (u64, Result<Admitted<usize>, Rejected>);

struct Harness {
    adm: Admission,
    levels: Arc<Levels>,
    slots: Arc<Vec<Arc<Slot>>>,
    tx: mpsc::UnboundedSender<Outcome>,
    rx: mpsc::UnboundedReceiver<Outcome>,
    next_id: u64,
    waiting: BTreeMap<u64, Waiting>,
    held: Vec<Permit>,
}

fn uses(target: Option<usize>, worker: usize) -> bool {
    target.is_none_or(|t| t == worker)
}

/// Where a waiter stands in a dispatch: (not promoted, priority from the top, arrival).
type Key = (u8, u8, u64);

/// The order a dispatch at `now` serves waiters in (smaller first).
fn key(w: &Waiting, id: u64, now: Instant) -> Key {
    let (_, _, starve) = CLASSES[w.priority.index()];
    let starved = starve.is_some_and(|s| now.duration_since(w.since) >= Duration::from_secs(s));
    if starved {
        (0, 0, id)
    } else {
        (1, 3 - w.priority as u8, id)
    }
}

impl Harness {
    fn new() -> Self {
        let levels = Arc::new(Levels::default());
        let adm = Admission::new(
            AdmissionConfig {
                max_inflight_per_worker: 1,
                max_inflight_tokens_per_worker: None,
                queue_size: 100,
                queue_timeout: Duration::from_secs(3600),
                priorities: Some(classes()),
            },
            levels.clone(),
        );
        let slots = Arc::new((0..WORKERS).map(|k| adm.slot(&format!("w{k}"))).collect());
        let (tx, rx) = mpsc::unbounded_channel();
        Harness {
            adm,
            levels,
            slots,
            tx,
            rx,
            next_id: 0,
            waiting: BTreeMap::new(),
            held: Vec::new(),
        }
    }

    async fn settle() {
        for _ in 0..32 {
            tokio::task::yield_now().await;
        }
    }

    fn has_room(&self, target: Option<usize>) -> bool {
        (0..WORKERS).any(|k| uses(target, k) && self.slots[k].inflight() == 0)
    }

    /// Checks every outcome that arrived, against the state before the step.
    fn absorb(&mut self, now: Instant) {
        let before: Vec<(u64, Key, Option<usize>)> = self
            .waiting
            .iter()
            .map(|(&id, w)| (id, key(w, id, now), w.target))
            .collect();
        let mut admitted = Vec::new();
        while let Ok((id, result)) = self.rx.try_recv() {
            let w = self.waiting.remove(&id).expect("outcome of a known waiter");
            match result {
                Ok(a) => {
                    admitted.push((id, key(&w, id, now), a.choice));
                    self.held.push(a.permit);
                }
                Err(r) => {
                    assert_eq!(r.reason, Rejection::QueueTimeout, "a waiter only times out");
                    let timeout = Duration::from_secs(CLASSES[w.priority.index()].1);
                    assert!(now.duration_since(w.since) >= timeout, "timed out early");
                }
            }
        }
        for (id, k, worker) in &admitted {
            // Everyone still waiting (or admitted later in this step) that could use the
            // worker comes after the admitted one.
            for (other, ok, target) in &before {
                let still_there = self.waiting.contains_key(other);
                let admitted_later = admitted.iter().any(|(a, ak, _)| a == other && ak > k);
                if other != id && uses(*target, *worker) && (still_there || admitted_later) {
                    assert!(
                        ok > k,
                        "waiter {other} {ok:?} outranked admitted {id} {k:?}"
                    );
                }
            }
        }
    }

    fn check(&self, now: Instant) {
        for s in self.slots.iter() {
            assert!(s.inflight() <= 1, "limit exceeded");
        }
        let mut by_priority = [0usize; 4];
        for w in self.waiting.values() {
            by_priority[w.priority.index()] += 1;
            assert!(!self.has_room(w.target), "stranded waiter");
            let timeout = Duration::from_secs(CLASSES[w.priority.index()].1);
            assert!(
                now.duration_since(w.since) <= timeout,
                "waited past its deadline"
            );
        }
        for p in Priority::ALL {
            assert!(
                by_priority[p.index()] <= CLASSES[p.index()].0,
                "queue bound"
            );
        }
        assert_eq!(self.adm.queued(), self.waiting.len());
    }

    async fn step(&mut self, op: Op) {
        let now = Instant::now();
        match op {
            Op::Arrive(target, p) => {
                let priority = Priority::ALL[p];
                let id = self.next_id;
                self.next_id += 1;
                let room = self.has_room(target);
                let queued_of_p = self
                    .waiting
                    .values()
                    .filter(|w| w.priority == priority)
                    .count();
                let blocked_by_waiter = self.waiting.values().any(|w| {
                    (0..WORKERS).any(|k| {
                        uses(target, k) && uses(w.target, k) && self.slots[k].inflight() == 0
                    })
                });
                assert!(
                    !blocked_by_waiter,
                    "no stranding means nobody waits for a free slot"
                );
                let sel = Sel {
                    slots: self.slots.clone(),
                    target,
                    priority,
                };
                let adm = self.adm.clone();
                let tx = self.tx.clone();
                let handle = tokio::spawn(async move {
                    let r = adm.acquire(sel).await;
                    let _ = tx.send((id, r));
                });
                self.waiting.insert(
                    id,
                    Waiting {
                        target,
                        priority,
                        since: now,
                        handle,
                    },
                );
                Self::settle().await;
                if let Ok((got, result)) = self.rx.try_recv() {
                    assert_eq!(got, id);
                    self.waiting.remove(&id);
                    match result {
                        Ok(a) => {
                            assert!(room, "admitted without room");
                            self.held.push(a.permit);
                        }
                        Err(r) => {
                            assert_eq!(r.reason, Rejection::QueueFull);
                            assert!(!room && queued_of_p >= CLASSES[p].0, "refused wrongly");
                        }
                    }
                } else {
                    assert!(!room, "waits although a worker has room");
                    assert!(queued_of_p < CLASSES[p].0, "queued past its bound");
                }
            }
            Op::Release(i) => {
                if !self.held.is_empty() {
                    let permit = self.held.swap_remove(i % self.held.len());
                    drop(permit);
                    Self::settle().await;
                    self.absorb(now);
                }
            }
            Op::Cancel(i) => {
                if !self.waiting.is_empty() {
                    let id = *self.waiting.keys().nth(i % self.waiting.len()).unwrap();
                    let w = self.waiting.remove(&id).unwrap();
                    w.handle.abort();
                    Self::settle().await;
                    // A grant may have raced; keep what arrived for it.
                    while let Ok((got, result)) = self.rx.try_recv() {
                        if let Ok(a) = result {
                            assert_eq!(got, id, "only the cancelled one may race");
                            self.held.push(a.permit);
                        }
                    }
                }
            }
            Op::Advance(ms) => {
                let end = now + Duration::from_millis(ms);
                // One second at a time, so each timeout is seen close to its deadline.
                while Instant::now() < end {
                    let step = (end - Instant::now()).min(Duration::from_secs(1));
                    tokio::time::advance(step).await;
                    Self::settle().await;
                    self.absorb(Instant::now());
                }
            }
        }
        self.check(Instant::now());
    }

    async fn finish(mut self) {
        self.held.clear();
        Self::settle().await;
        for (_, w) in std::mem::take(&mut self.waiting) {
            w.handle.abort();
        }
        Self::settle().await;
        while let Ok((_, result)) = self.rx.try_recv() {
            drop(result);
        }
        Self::settle().await;
        assert_eq!(self.adm.queued(), 0);
        assert_eq!(self.adm.inflight_total(), 0);
        assert_eq!(*self.levels.0.lock(), [(0, 0); 4], "levels back to zero");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn priority_classes_keep_their_invariants(ops in proptest::collection::vec(op(), 1..120)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut h = Harness::new();
            for op in ops {
                h.step(op).await;
            }
            h.finish().await;
        });
    }
}
