//! Model-based property test of the admission controller.
//!
//! Random sequences of operations (arrivals for any worker or a strict worker, releases,
//! cancellations, cancellations racing with a grant, clock advances, worker add/remove, health
//! flips followed by `notify`) run on a paused-clock current-thread runtime. After every step the
//! controller is compared with a model and these are checked:
//!
//! - per-worker in-flight count ≤ N and equal to the permits actually held;
//! - an arrival is admitted iff an eligible worker has room (Unavailable / QueueFull / waits
//!   otherwise, exactly as predicted);
//! - FIFO among competitors and no bypass: when a request is admitted on worker w, no older
//!   request that could use w is still waiting;
//! - no stranding: no waiter is left waiting while one of its eligible workers has room;
//! - deadlines: a waiter times out exactly when its deadline has passed, not earlier;
//! - `commit` is called at most once per request, and for an admitted request with its worker;
//! - at the end (release everything, cancel the rest) `queued() == 0` and `inflight_total() == 0`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use pdrouter_admission::{
    Admission, AdmissionConfig, Admitted, Observer, Permit, RETRY_AFTER_CAP, Ranking, Rejected,
    Rejection, Selector, Slot,
};
use proptest::prelude::*;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

const WORKERS: usize = 4;
const TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Clone)]
enum Op {
    Arrive(Option<usize>),
    Release(usize),
    Cancel(usize),
    ReleaseThenCancel(usize, usize),
    Advance(u64),
    Add(usize),
    Remove(usize),
    Health(usize, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => proptest::option::weighted(0.6, 0..WORKERS).prop_map(Op::Arrive),
        4 => any::<usize>().prop_map(Op::Release),
        1 => any::<usize>().prop_map(Op::Cancel),
        1 => (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Op::ReleaseThenCancel(a, b)),
        2 => (1u64..6000).prop_map(Op::Advance),
        1 => (0..WORKERS).prop_map(Op::Add),
        1 => (0..WORKERS).prop_map(Op::Remove),
        2 => ((0..WORKERS), any::<bool>()).prop_map(|(k, h)| Op::Health(k, h)),
    ]
}

#[derive(Default)]
struct World {
    /// Present workers: slot and health.
    workers: [Option<(Arc<Slot>, bool)>; WORKERS],
    commits: Vec<(u32, String)>,
}

impl World {
    /// Present, healthy workers a request may use, in rank (index) order.
    fn eligible(&self, target: Option<usize>) -> Vec<Arc<Slot>> {
        (0..WORKERS)
            .filter(|k| target.is_none_or(|t| t == *k))
            .filter_map(|k| match &self.workers[k] {
                Some((slot, true)) => Some(Arc::clone(slot)),
                _ => None,
            })
            .collect()
    }
}

struct Sel {
    world: Arc<Mutex<World>>,
    target: Option<usize>,
    id: u32,
    /// Whether it names its wait class (else every waiter is a class of its own).
    classed: bool,
}

impl Selector for Sel {
    type Choice = String;
    fn rank(&mut self, has_room: &dyn Fn(&Slot) -> bool) -> Ranking<String> {
        let eligible = self.world.lock().eligible(self.target);
        if eligible.is_empty() {
            return Ranking::Unavailable;
        }
        Ranking::Candidates(
            eligible
                .into_iter()
                .filter(|s| has_room(s))
                .map(|s| {
                    let key = s.key().to_owned();
                    (s, key)
                })
                .collect(),
        )
    }
    fn commit(&mut self, choice: &String) {
        self.world.lock().commits.push((self.id, choice.clone()));
    }
    fn wait_class(&self) -> Option<Box<str>> {
        self.classed.then(|| format!("{:?}", self.target).into())
    }
}

struct NoObserver;
impl Observer for NoObserver {}

struct Waiting {
    target: Option<usize>,
    deadline: Instant,
    handle: JoinHandle<()>,
}

struct Harness {
    adm: Admission,
    n: u32,
    q: usize,
    world: Arc<Mutex<World>>,
    rx: mpsc::UnboundedReceiver<(u32, Result<Admitted<String>, Rejected>)>,
    tx: mpsc::UnboundedSender<(u32, Result<Admitted<String>, Rejected>)>,
    next_id: u32,
    /// Whether selectors name their wait class.
    classed: bool,
    /// Waiting requests by id (ids grow with arrival order).
    waiting: BTreeMap<u32, Waiting>,
    /// Held permits (request id, permit).
    held: Vec<(u32, Permit)>,
    /// Requests cancelled by the test (a grant may still have been committed for them).
    cancelled: Vec<u32>,
}

fn key(k: usize) -> String {
    format!("http://w{k}")
}

impl Harness {
    fn new(n: u32, q: usize, classed: bool) -> Self {
        let adm = Admission::new(
            AdmissionConfig {
                max_inflight_per_worker: n,
                max_inflight_tokens_per_worker: None,
                queue_size: q,
                queue_timeout: TIMEOUT,
                priorities: None,
            },
            Arc::new(NoObserver),
        );
        let world: Arc<Mutex<World>> = Arc::default();
        for k in 0..2 {
            world.lock().workers[k] = Some((adm.slot(&key(k)), true));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        Harness {
            adm,
            n,
            q,
            world,
            rx,
            tx,
            next_id: 0,
            classed,
            waiting: BTreeMap::new(),
            held: Vec::new(),
            cancelled: Vec::new(),
        }
    }

    async fn settle() {
        for _ in 0..32 {
            tokio::task::yield_now().await;
        }
    }

    /// The in-flight count of a worker key, read from a slot the test holds (without creating
    /// or re-registering one): a slot nobody holds has nothing in flight.
    fn inflight_of(&self, world: &World, k: &str) -> u32 {
        let registered = world.workers.iter().flatten().map(|(s, _)| s);
        let held = self.held.iter().map(|(_, p)| p.slot());
        registered
            .chain(held)
            .find(|s| s.key() == k)
            .map_or(0, |s| s.inflight())
    }

    async fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let mut predicted_arrival = None;
        match *op {
            Op::Arrive(target) => {
                let id = self.next_id;
                self.next_id += 1;
                let eligible = self.world.lock().eligible(target);
                predicted_arrival = Some(if eligible.is_empty() {
                    Err(Rejection::Unavailable)
                } else if let Some(s) = eligible.iter().find(|s| s.inflight() < self.n) {
                    Ok(Some(s.key().to_owned()))
                } else if self.waiting.len() >= self.q {
                    Err(Rejection::QueueFull)
                } else {
                    Ok(None)
                });
                let adm = self.adm.clone();
                let tx = self.tx.clone();
                let sel = Sel {
                    world: Arc::clone(&self.world),
                    target,
                    id,
                    classed: self.classed,
                };
                let handle = tokio::spawn(async move {
                    let r = adm.acquire(sel).await;
                    let _ = tx.send((id, r));
                });
                self.waiting.insert(
                    id,
                    Waiting {
                        target,
                        deadline: Instant::now() + TIMEOUT,
                        handle,
                    },
                );
            }
            Op::Release(i) => {
                if !self.held.is_empty() {
                    let i = i % self.held.len();
                    drop(self.held.swap_remove(i));
                }
            }
            Op::Cancel(j) => self.cancel(j),
            Op::ReleaseThenCancel(i, j) => {
                if !self.held.is_empty() {
                    let i = i % self.held.len();
                    drop(self.held.swap_remove(i));
                }
                self.cancel(j);
            }
            Op::Advance(ms) => tokio::time::advance(Duration::from_millis(ms)).await,
            Op::Add(k) => {
                let slot = self.adm.slot(&key(k));
                let mut world = self.world.lock();
                if world.workers[k].is_none() {
                    world.workers[k] = Some((slot, true));
                }
                drop(world);
                self.adm.notify();
            }
            Op::Remove(k) => {
                let removed = self.world.lock().workers[k].take();
                if removed.is_some() {
                    drop(removed);
                    self.adm.forget(&key(k));
                }
            }
            Op::Health(k, healthy) => {
                if let Some((_, h)) = &mut self.world.lock().workers[k] {
                    *h = healthy;
                }
                self.adm.notify();
            }
        }
        Self::settle().await;
        self.collect_and_check(predicted_arrival)
    }

    fn cancel(&mut self, j: usize) {
        if self.waiting.is_empty() {
            return;
        }
        let id = *self.waiting.keys().nth(j % self.waiting.len()).unwrap();
        let w = self.waiting.remove(&id).unwrap();
        w.handle.abort();
        self.cancelled.push(id);
    }

    fn collect_and_check(
        &mut self,
        predicted_arrival: Option<Result<Option<String>, Rejection>>,
    ) -> Result<(), TestCaseError> {
        let now = Instant::now();
        let mut admitted_now: Vec<(u32, String)> = Vec::new();
        let mut results: HashMap<u32, Result<(), Rejection>> = HashMap::new();
        while let Ok((id, r)) = self.rx.try_recv() {
            let w = self.waiting.remove(&id);
            prop_assert!(w.is_some(), "result for a request not waiting: {id}");
            let w = w.unwrap();
            match r {
                Ok(a) => {
                    prop_assert_eq!(a.permit.slot().key(), a.choice.as_str());
                    admitted_now.push((id, a.choice.clone()));
                    results.insert(id, Ok(()));
                    self.held.push((id, a.permit));
                }
                Err(e) => {
                    if e.reason == Rejection::QueueTimeout {
                        prop_assert!(now >= w.deadline, "timed out early: {id}");
                    }
                    // Queue rejections say when to come back, within the cap; never the timeout.
                    let in_range =
                        |d: Duration| d >= Duration::from_secs(1) && d <= RETRY_AFTER_CAP;
                    match e.reason {
                        Rejection::Unavailable => prop_assert_eq!(e.retry_after, None),
                        _ => prop_assert!(e.retry_after.is_some_and(in_range), "{:?}", e),
                    }
                    results.insert(id, Err(e.reason));
                }
            }
        }

        // Arrival outcome as predicted.
        if let Some(pred) = predicted_arrival {
            let id = self.next_id - 1;
            match pred {
                Err(e) => prop_assert_eq!(results.get(&id), Some(&Err(e)), "arrival {}", id),
                Ok(Some(k)) => {
                    prop_assert!(
                        admitted_now.contains(&(id, k.clone())),
                        "arrival {} should be admitted on {}",
                        id,
                        k
                    );
                }
                Ok(None) => prop_assert!(self.waiting.contains_key(&id), "arrival {} waits", id),
            }
        }
        for (id, r) in &results {
            if let Err(Rejection::QueueFull | Rejection::Unavailable) = r {
                prop_assert_eq!(
                    *id,
                    self.next_id - 1,
                    "only a new arrival is rejected at once"
                );
            }
        }

        let world = self.world.lock();
        // Limits and exact accounting.
        let mut held_per_key: HashMap<String, u32> = HashMap::new();
        for (_, p) in &self.held {
            *held_per_key.entry(p.slot().key().to_owned()).or_default() += 1;
        }
        for k in 0..WORKERS {
            let key = key(k);
            let inflight = self.inflight_of(&world, &key);
            prop_assert!(inflight <= self.n, "{} over the limit", key);
            prop_assert_eq!(
                inflight,
                held_per_key.get(&key).copied().unwrap_or(0),
                "{}",
                key
            );
        }
        prop_assert_eq!(self.adm.queued(), self.waiting.len());
        prop_assert!(self.adm.queued() <= self.q);
        prop_assert_eq!(
            self.adm.inflight_total(),
            self.held.len() as u64,
            "inflight_total"
        );

        // FIFO among competitors / no bypass.
        for (id, k) in &admitted_now {
            for (older, w) in self.waiting.range(..*id) {
                let could_use = world.eligible(w.target).iter().any(|s| s.key() == k);
                prop_assert!(
                    !could_use,
                    "request {} admitted on {} while older {} that could use it waits",
                    id,
                    k,
                    older
                );
            }
        }
        // No stranding; deadlines.
        for (id, w) in &self.waiting {
            prop_assert!(now < w.deadline, "waiter {} past its deadline", id);
            for s in world.eligible(w.target) {
                prop_assert!(
                    s.inflight() >= self.n,
                    "waiter {} stranded: {} has room",
                    id,
                    s.key()
                );
            }
        }
        // Commits: at most once per request, matching the admission.
        let mut committed: HashMap<u32, &str> = HashMap::new();
        for (id, k) in &world.commits {
            prop_assert!(
                committed.insert(*id, k).is_none(),
                "request {} committed twice",
                id
            );
        }
        for (id, p) in &self.held {
            prop_assert_eq!(committed.get(id).copied(), Some(p.slot().key()));
        }
        for id in committed.keys() {
            let admitted = self.held.iter().any(|(h, _)| h == id);
            prop_assert!(
                admitted || self.cancelled.contains(id) || self.was_released(*id),
                "commit for request {} never admitted",
                id
            );
        }
        Ok(())
    }

    fn was_released(&self, id: u32) -> bool {
        // Admitted earlier and released since: not waiting, not held.
        id < self.next_id && !self.waiting.contains_key(&id)
    }

    async fn finish(mut self) -> Result<(), TestCaseError> {
        // Release everything, cancel the rest, and everything returns to zero.
        loop {
            self.held.clear();
            Self::settle().await;
            let mut any = false;
            while let Ok((id, r)) = self.rx.try_recv() {
                self.waiting.remove(&id);
                if let Ok(a) = r {
                    any = true;
                    drop(a);
                }
            }
            if !any {
                break;
            }
        }
        for (_, w) in std::mem::take(&mut self.waiting) {
            w.handle.abort();
        }
        Self::settle().await;
        while let Ok((_, r)) = self.rx.try_recv() {
            drop(r);
        }
        prop_assert_eq!(self.adm.queued(), 0);
        prop_assert_eq!(self.adm.inflight_total(), 0);
        Ok(())
    }
}

fn run(n: u32, q: usize, ops: &[Op], by_timeout: bool, classed: bool) -> Result<(), TestCaseError> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap();
    rt.block_on(async {
        let mut h = Harness::new(n, q, classed);
        for op in ops {
            h.step(op).await?;
        }
        if by_timeout {
            // Let every waiter time out instead of cancelling it.
            tokio::time::advance(TIMEOUT).await;
            h.step(&Op::Advance(1)).await?;
            prop_assert_eq!(h.adm.queued(), 0);
        }
        h.finish().await
    })
}

proptest! {
    // 256 cases by default; PROPTEST_CASES=N runs more.
    #[test]
    fn admission_matches_model(
        n in 1u32..=3,
        q in 0usize..=5,
        ops in proptest::collection::vec(op(), 1..80),
        by_timeout in any::<bool>(),
        classed in any::<bool>(),
    ) {
        run(n, q, &ops, by_timeout, classed)?;
    }
}
