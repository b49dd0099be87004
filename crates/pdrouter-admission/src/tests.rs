//! Unit tests of the controller (deterministic: current-thread runtime, paused clock for time).

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::*;

// ---------------------------------------------------------------- helpers

#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Inflight(String, u32),
    Queued(usize),
    Admitted(Duration),
    Rejected(Rejection),
    Forgotten(String),
}

#[derive(Default)]
struct Rec(Mutex<Vec<Ev>>);

impl Rec {
    fn take(&self) -> Vec<Ev> {
        std::mem::take(&mut *self.0.lock())
    }
}

impl Observer for Rec {
    fn inflight_changed(&self, key: &std::sync::Arc<str>, inflight: u32) {
        self.0.lock().push(Ev::Inflight((**key).into(), inflight));
    }
    fn queued_changed(&self, queued: usize) {
        self.0.lock().push(Ev::Queued(queued));
    }
    fn admitted(&self, waited: Duration) {
        self.0.lock().push(Ev::Admitted(waited));
    }
    fn rejected(&self, reason: Rejection) {
        self.0.lock().push(Ev::Rejected(reason));
    }
    fn slot_forgotten(&self, key: &str) {
        self.0.lock().push(Ev::Forgotten(key.into()));
    }
}

struct Worker {
    slot: Arc<Slot>,
    healthy: bool,
    /// A lazily half-opening breaker: unhealthy until this instant.
    open_until: Option<Instant>,
}

#[derive(Default)]
struct World {
    workers: Vec<Worker>,
    /// (request id, committed worker key), in commit order.
    commits: Vec<(u32, String)>,
    /// Calls to `Sel::rank` so far.
    ranks: usize,
}

type Shared = Arc<Mutex<World>>;

#[derive(Clone, Copy)]
enum Target {
    Any,
    Strict(usize),
}

struct Sel {
    world: Shared,
    target: Target,
    id: u32,
    priority: Priority,
}

impl Selector for Sel {
    type Choice = String;

    fn rank(&mut self, has_room: &dyn Fn(&Slot) -> bool) -> Ranking<String> {
        let mut world = self.world.lock();
        world.ranks += 1;
        let now = Instant::now();
        let healthy = |w: &Worker| w.healthy && w.open_until.is_none_or(|t| now >= t);
        let matching: Vec<&Worker> = match self.target {
            Target::Any => world.workers.iter().filter(|w| healthy(w)).collect(),
            Target::Strict(k) => world
                .workers
                .get(k)
                .filter(|w| healthy(w))
                .into_iter()
                .collect(),
        };
        if matching.is_empty() {
            return Ranking::Unavailable;
        }
        Ranking::Candidates(
            matching
                .into_iter()
                .filter(|w| has_room(&w.slot))
                .map(|w| (Arc::clone(&w.slot), w.slot.key().to_owned()))
                .collect(),
        )
    }

    fn commit(&mut self, choice: &String) {
        self.world.lock().commits.push((self.id, choice.clone()));
    }

    fn priority(&self) -> Priority {
        self.priority
    }

    fn wait_class(&self) -> Option<Box<str>> {
        Some(match self.target {
            Target::Any => "any".into(),
            Target::Strict(k) => format!("strict {k}").into(),
        })
    }
}

struct Fixture {
    adm: Admission,
    rec: Arc<Rec>,
    world: Shared,
    next_id: AtomicU32,
}

impl Fixture {
    fn new(n: u32, q: usize, t_secs: u64, workers: &[&str]) -> Self {
        Self::with(n, q, t_secs, None, workers)
    }

    fn with(
        n: u32,
        q: usize,
        t_secs: u64,
        priorities: Option<PriorityClasses>,
        workers: &[&str],
    ) -> Self {
        let rec = Arc::new(Rec::default());
        let adm = Admission::new(
            AdmissionConfig {
                max_inflight_per_worker: n,
                max_inflight_tokens_per_worker: None,
                queue_size: q,
                queue_timeout: Duration::from_secs(t_secs),
                priorities,
            },
            rec.clone(),
        );
        let world: Shared = Arc::default();
        for key in workers {
            world.lock().workers.push(Worker {
                slot: adm.slot(key),
                healthy: true,
                open_until: None,
            });
        }
        Fixture {
            adm,
            rec,
            world,
            next_id: AtomicU32::new(0),
        }
    }

    fn sel(&self, target: Target) -> Sel {
        self.sel_at(target, Priority::Default)
    }

    fn sel_at(&self, target: Target, priority: Priority) -> Sel {
        Sel {
            world: self.world.clone(),
            target,
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            priority,
        }
    }

    fn spawn_at(
        &self,
        target: Target,
        priority: Priority,
    ) -> JoinHandle<Result<Admitted<String>, Rejected>> {
        let adm = self.adm.clone();
        let sel = self.sel_at(target, priority);
        tokio::spawn(async move { adm.acquire(sel).await })
    }

    async fn get(&self, target: Target) -> Result<Admitted<String>, Rejected> {
        self.adm.acquire(self.sel(target)).await
    }

    fn spawn(&self, target: Target) -> JoinHandle<Result<Admitted<String>, Rejected>> {
        let adm = self.adm.clone();
        let sel = self.sel(target);
        tokio::spawn(async move { adm.acquire(sel).await })
    }

    fn slot(&self, k: usize) -> Arc<Slot> {
        self.world.lock().workers[k].slot.clone()
    }

    fn commits(&self) -> Vec<(u32, String)> {
        self.world.lock().commits.clone()
    }

    fn assert_clean(&self) {
        assert_eq!(self.adm.queued(), 0, "queued");
        assert_eq!(self.adm.inflight_total(), 0, "inflight");
    }
}

async fn settle() {
    for _ in 0..16 {
        tokio::task::yield_now().await;
    }
}

async fn done(
    h: JoinHandle<Result<Admitted<String>, Rejected>>,
) -> Result<Admitted<String>, Rejected> {
    assert!(h.is_finished(), "task should have finished");
    h.await.expect("task did not panic")
}

// ---------------------------------------------------------------- fast path and limits

#[tokio::test]
async fn fast_path_reserves_and_releases() {
    let f = Fixture::new(2, 0, 1, &["w0"]);
    let a = f.get(Target::Any).await.unwrap();
    assert_eq!(a.choice, "w0");
    assert_eq!(a.waited, Duration::ZERO);
    assert_eq!(a.permit.slot().key(), "w0");
    let b = f.get(Target::Any).await.unwrap();
    assert_eq!(f.slot(0).inflight(), 2);
    assert_eq!(f.get(Target::Any).await.unwrap_err(), Rejection::QueueFull);
    assert_eq!(f.slot(0).inflight(), 2, "limit never exceeded");
    drop(a);
    assert_eq!(f.slot(0).inflight(), 1);
    drop(b);
    assert_eq!(
        f.rec.take(),
        vec![
            Ev::Inflight("w0".into(), 1),
            Ev::Admitted(Duration::ZERO),
            Ev::Inflight("w0".into(), 2),
            Ev::Admitted(Duration::ZERO),
            Ev::Rejected(Rejection::QueueFull),
            Ev::Inflight("w0".into(), 1),
            Ev::Inflight("w0".into(), 0),
        ]
    );
    assert_eq!(f.commits().len(), 2);
    f.assert_clean();
}

#[tokio::test]
async fn spreads_over_workers_in_rank_order() {
    let f = Fixture::new(1, 0, 1, &["w0", "w1"]);
    let a = f.get(Target::Any).await.unwrap();
    let b = f.get(Target::Any).await.unwrap();
    assert_eq!((a.choice.as_str(), b.choice.as_str()), ("w0", "w1"));
    assert_eq!(f.get(Target::Any).await.unwrap_err(), Rejection::QueueFull);
    drop((a, b));
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn per_worker_limits_change_at_run_time() {
    let f = Fixture::new(1, 4, 60, &["w0", "w1"]);
    let w0 = f.slot(0);
    assert_eq!(
        (w0.limit(), w0.token_limit()),
        (1, None),
        "starts as configured"
    );
    f.adm.set_limits(&w0, 2, None);
    f.adm.set_limits(&f.slot(1), 0, None);
    let a = f.get(Target::Any).await.unwrap();
    let b = f.get(Target::Any).await.unwrap();
    assert_eq!((a.choice.as_str(), b.choice.as_str()), ("w0", "w0"));
    // w0 is at its raised limit and w1 admits nothing: a third request waits.
    let c = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 1);
    // Raising w1's limit admits the waiter at once, without any release.
    f.adm.set_limits(&f.slot(1), 1, None);
    settle().await;
    let c = done(c).await.unwrap();
    assert_eq!(c.choice, "w1");
    // Lowering w0 below what it holds revokes nothing; it admits again only under the limit.
    f.adm.set_limits(&w0, 1, None);
    assert_eq!(w0.inflight(), 2);
    let d = f.spawn(Target::Strict(0));
    settle().await;
    drop(a);
    settle().await;
    assert!(!d.is_finished(), "1 in flight is not under a limit of 1");
    assert_eq!(w0.inflight(), 1);
    drop(b);
    settle().await;
    let d = done(d).await.unwrap();
    assert_eq!(w0.inflight(), 1);
    drop((c, d));
    f.assert_clean();
}

#[tokio::test]
async fn a_token_budget_set_at_run_time_is_enforced() {
    let f = Fixture::new(8, 0, 1, &["w0"]);
    let w0 = f.slot(0);
    f.adm.set_limits(&w0, 8, Some(1));
    assert_eq!(w0.token_limit(), Some(1));
    // Every request costs at least one token: the second does not fit.
    let a = f.get(Target::Any).await.unwrap();
    assert_eq!(f.get(Target::Any).await.unwrap_err(), Rejection::QueueFull);
    f.adm.set_limits(&w0, 8, None);
    let b = f.get(Target::Any).await.unwrap();
    assert_eq!(w0.inflight(), 2);
    drop((a, b));
    f.assert_clean();
}

#[tokio::test]
async fn shared_permit_is_one_slot_released_once() {
    let f = Fixture::new(1, 0, 1, &["w0"]);
    let permit = Arc::new(f.get(Target::Any).await.unwrap().permit);
    let subs: Vec<_> = (0..4).map(|_| Arc::clone(&permit)).collect();
    drop(permit);
    assert_eq!(f.slot(0).inflight(), 1);
    for (i, p) in subs.into_iter().enumerate() {
        assert_eq!(
            f.slot(0).inflight(),
            1,
            "still held before sub-request {i} ends"
        );
        drop(p);
    }
    assert_eq!(f.slot(0).inflight(), 0);
    f.assert_clean();
}

#[tokio::test]
async fn unavailable_is_rejected_never_queued() {
    let f = Fixture::new(1, 10, 1, &["w0"]);
    f.world.lock().workers[0].healthy = false;
    assert_eq!(
        f.get(Target::Any).await.unwrap_err(),
        Rejection::Unavailable
    );
    assert_eq!(
        f.get(Target::Strict(5)).await.unwrap_err(),
        Rejection::Unavailable
    );
    // Also on the slow path (someone is waiting).
    f.world.lock().workers[0].healthy = true;
    let held = f.get(Target::Any).await.unwrap();
    let waiter = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 1);
    assert_eq!(
        f.get(Target::Strict(7)).await.unwrap_err(),
        Rejection::Unavailable
    );
    assert_eq!(f.adm.queued(), 1);
    let rejected: Vec<_> = f
        .rec
        .take()
        .into_iter()
        .filter(|e| matches!(e, Ev::Rejected(_)))
        .collect();
    assert_eq!(rejected, vec![Ev::Rejected(Rejection::Unavailable); 3]);
    assert!(f.commits().len() == 1);
    drop(held);
    settle().await;
    drop(done(waiter).await.unwrap());
    f.assert_clean();
}

// ---------------------------------------------------------------- queue bounds and timeouts

#[tokio::test(start_paused = true)]
async fn queue_full_when_q_reached() {
    let f = Fixture::new(1, 2, 60, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let w1 = f.spawn(Target::Any);
    let w2 = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 2);
    assert_eq!(f.get(Target::Any).await.unwrap_err(), Rejection::QueueFull);
    assert_eq!(f.adm.queued(), 2);
    drop(held);
    settle().await;
    drop(done(w1).await.unwrap());
    settle().await;
    drop(done(w2).await.unwrap());
    f.assert_clean();
}

#[tokio::test]
async fn q0_at_capacity_rejects_at_once() {
    let f = Fixture::new(1, 0, 60, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    assert_eq!(f.get(Target::Any).await.unwrap_err(), Rejection::QueueFull);
    assert_eq!(f.adm.queued(), 0);
    drop(held);
    // Capacity again: admitted.
    drop(f.get(Target::Any).await.unwrap());
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn timeout_after_exactly_t_and_place_goes_to_next() {
    let f = Fixture::new(1, 4, 2, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let start = Instant::now();
    let a = {
        let adm = f.adm.clone();
        let sel = f.sel(Target::Any);
        tokio::spawn(async move {
            let r = adm.acquire(sel).await;
            (r.map(|a| a.choice), Instant::now())
        })
    };
    settle().await;
    tokio::time::advance(Duration::from_secs(1)).await;
    let b = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 2);
    // A's deadline is at start + 2 s.
    tokio::time::advance(Duration::from_millis(999)).await;
    settle().await;
    assert!(!a.is_finished());
    tokio::time::advance(Duration::from_millis(1)).await;
    settle().await;
    let (result, at) = a.await.unwrap();
    assert_eq!(result.unwrap_err(), Rejection::QueueTimeout);
    assert_eq!(at - start, Duration::from_secs(2));
    assert_eq!(f.adm.queued(), 1);
    tokio::time::advance(Duration::from_millis(500)).await;
    drop(held);
    settle().await;
    let b = done(b).await.unwrap();
    assert_eq!(b.waited, Duration::from_millis(1500));
    let evs = f.rec.take();
    assert!(evs.contains(&Ev::Rejected(Rejection::QueueTimeout)));
    assert!(evs.contains(&Ev::Admitted(Duration::from_millis(1500))));
    drop(b);
    f.assert_clean();
}

// ---------------------------------------------------------------- ordering

#[tokio::test]
async fn strict_fifo_among_competitors() {
    let f = Fixture::new(1, 10, 60, &["w0"]);
    let mut held = f.get(Target::Any).await.unwrap();
    let waiters: Vec<_> = (0..5).map(|_| f.spawn(Target::Any)).collect();
    settle().await;
    assert_eq!(f.adm.queued(), 5);
    for h in waiters {
        drop(held);
        settle().await;
        held = done(h).await.unwrap();
    }
    drop(held);
    let ids: Vec<u32> = f.commits().into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, [0, 1, 2, 3, 4, 5], "admitted in arrival order");
    f.assert_clean();
}

#[tokio::test]
async fn no_bypass_new_arrival_does_not_take_released_slot() {
    let f = Fixture::new(1, 10, 60, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let w = f.spawn(Target::Any);
    settle().await;
    // Release and arrive before the waiter's task has even run again.
    drop(held);
    let late = f.spawn(Target::Any);
    settle().await;
    let w = done(w).await.unwrap();
    assert!(!late.is_finished(), "the new arrival waits behind");
    assert_eq!(f.adm.queued(), 1);
    drop(w);
    settle().await;
    drop(done(late).await.unwrap());
    f.assert_clean();
}

#[tokio::test]
async fn no_head_of_line_blocking() {
    let f = Fixture::new(1, 10, 60, &["x", "y"]);
    let hx = f.get(Target::Strict(0)).await.unwrap();
    let hy = f.get(Target::Strict(1)).await.unwrap();
    let a = f.spawn(Target::Strict(0));
    settle().await;
    let b = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 2);
    drop(hy);
    settle().await;
    let b = done(b).await.unwrap();
    assert_eq!(b.choice, "y");
    assert!(!a.is_finished(), "A keeps waiting for x");
    assert_eq!(f.adm.queued(), 1);
    drop(hx);
    settle().await;
    let a = done(a).await.unwrap();
    assert_eq!(a.choice, "x");
    drop((a, b));
    f.assert_clean();
}

#[tokio::test]
async fn late_binding_goes_to_first_freed_worker() {
    let f = Fixture::new(1, 10, 60, &["x", "y"]);
    let hx = f.get(Target::Any).await.unwrap();
    let hy = f.get(Target::Any).await.unwrap();
    let w = f.spawn(Target::Any);
    settle().await;
    let before = f.commits().len();
    drop(hy);
    settle().await;
    let w = done(w).await.unwrap();
    assert_eq!(w.choice, "y");
    assert_eq!(w.permit.slot().key(), "y");
    let commits = f.commits();
    assert_eq!(commits.len(), before + 1, "commit exactly once");
    assert_eq!(commits.last().unwrap(), &(2, "y".to_owned()));
    drop((hx, w));
    f.assert_clean();
}

// ---------------------------------------------------------------- cancellation

#[tokio::test]
async fn cancel_removes_waiter_and_next_gets_capacity() {
    let f = Fixture::new(1, 10, 60, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let a = f.spawn(Target::Any);
    let b = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.adm.queued(), 2);
    a.abort();
    settle().await;
    assert_eq!(f.adm.queued(), 1);
    drop(held);
    settle().await;
    let b = done(b).await.unwrap();
    assert_eq!(f.commits().last().unwrap().0, 2);
    drop(b);
    f.assert_clean();
}

#[tokio::test]
async fn cancel_racing_with_grant_does_not_leak() {
    let f = Fixture::new(1, 10, 60, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let a = f.spawn(Target::Any);
    let b = f.spawn(Target::Any);
    settle().await;
    // The grant is sent to A synchronously; A is cancelled before it runs.
    drop(held);
    assert_eq!(f.slot(0).inflight(), 1);
    a.abort();
    settle().await;
    // A's grant was released and passed on to B.
    let b = done(b).await.unwrap();
    assert_eq!(f.slot(0).inflight(), 1);
    drop(b);
    f.assert_clean();
    // Same with nobody behind.
    let held = f.get(Target::Any).await.unwrap();
    let c = f.spawn(Target::Any);
    settle().await;
    drop(held);
    c.abort();
    settle().await;
    f.assert_clean();
}

#[tokio::test]
async fn dropping_acquire_future_is_cancel_safe() {
    let f = Fixture::new(1, 10, 60, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    {
        let fut = f.get(Target::Any);
        let mut fut = std::pin::pin!(fut);
        assert!(futures_poll_once(fut.as_mut()).is_none());
        assert_eq!(f.adm.queued(), 1);
    }
    assert_eq!(f.adm.queued(), 0);
    drop(held);
    f.assert_clean();
}

fn futures_poll_once<F: std::future::Future>(fut: std::pin::Pin<&mut F>) -> Option<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    match fut.poll(&mut cx) {
        std::task::Poll::Ready(v) => Some(v),
        std::task::Poll::Pending => None,
    }
}

// ---------------------------------------------------------------- notifications

#[tokio::test]
async fn notify_admits_waiters_when_capacity_appears() {
    let f = Fixture::new(1, 10, 60, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let a = f.spawn(Target::Any);
    let b = f.spawn(Target::Any);
    settle().await;
    let slot = f.adm.slot("w1");
    f.world.lock().workers.push(Worker {
        slot,
        healthy: true,
        open_until: None,
    });
    f.adm.notify();
    settle().await;
    let a = done(a).await.unwrap();
    assert_eq!(a.choice, "w1");
    assert!(!b.is_finished());
    drop((held, a));
    settle().await;
    drop(done(b).await.unwrap());
    f.assert_clean();
}

#[tokio::test]
async fn notify_and_release_rank_only_the_oldest_waiter_of_each_class() {
    let f = Fixture::new(1, 100, 60, &["w0", "w1"]);
    let h0 = f.get(Target::Strict(0)).await.unwrap();
    let h1 = f.get(Target::Strict(1)).await.unwrap();
    // 30 waiters in three classes, interleaved: any worker, strict w0, strict w1.
    let targets = [Target::Any, Target::Strict(0), Target::Strict(1)];
    let waiters: Vec<_> = (0..30).map(|i| f.spawn(targets[i % 3])).collect();
    settle().await;
    assert_eq!(f.adm.queued(), 30);

    let before = f.world.lock().ranks;
    f.adm.notify();
    assert_eq!(f.world.lock().ranks - before, 3, "one ranking per class");

    // A release on w0 goes to the oldest waiter that can use it (waiter 0, any worker), ranking
    // only the heads of the classes interested in w0.
    let before = f.world.lock().ranks;
    drop(h0);
    settle().await;
    assert_eq!(f.world.lock().ranks - before, 1);
    let mut waiters = waiters.into_iter();
    let first = done(waiters.next().unwrap()).await.unwrap();
    assert_eq!(first.choice, "w0");
    // Then the strict-w0 class is the oldest that can use w0 (waiter 1 is older than waiter 3).
    let before = f.world.lock().ranks;
    drop(first);
    settle().await;
    assert_eq!(f.world.lock().ranks - before, 1);
    let second = done(waiters.next().unwrap()).await.unwrap();
    assert_eq!(second.choice, "w0");

    // Cancelling everyone else leaves nothing behind.
    for w in waiters {
        w.abort();
        let _ = w.await;
    }
    drop((second, h1));
    settle().await;
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn notify_at_wakes_at_the_instant() {
    let f = Fixture::new(1, 10, 60, &["w0", "w1"]);
    let start = Instant::now();
    let half_open = start + Duration::from_secs(5);
    f.world.lock().workers[1].open_until = Some(half_open);
    let held = f.get(Target::Any).await.unwrap();
    assert_eq!(held.choice, "w0");
    let w = {
        let adm = f.adm.clone();
        let sel = f.sel(Target::Any);
        tokio::spawn(async move {
            let r = adm.acquire(sel).await.unwrap();
            (r, Instant::now())
        })
    };
    settle().await;
    assert_eq!(f.adm.queued(), 1);
    f.adm.notify_at(half_open);
    f.adm.notify_at(half_open); // deduplicated
    // No polling: with the clock paused and auto-advancing, the runtime sleeps to the instant.
    let (admitted, at) = w.await.unwrap();
    assert_eq!(at - start, Duration::from_secs(5));
    assert_eq!(admitted.choice, "w1");
    assert_eq!(admitted.waited, Duration::from_secs(5));
    drop((held, admitted));
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn waiter_keeps_waiting_while_unavailable() {
    let f = Fixture::new(1, 10, 3, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let w = f.spawn(Target::Any);
    settle().await;
    f.world.lock().workers[0].healthy = false;
    f.adm.notify();
    drop(held);
    settle().await;
    assert!(
        !w.is_finished(),
        "unavailable waiter waits (breaker may recover)"
    );
    f.world.lock().workers[0].healthy = true;
    f.adm.notify();
    settle().await;
    drop(done(w).await.unwrap());
    f.assert_clean();
}

// ---------------------------------------------------------------- ledger

#[tokio::test]
async fn ledger_identity_and_re_registration() {
    let f = Fixture::new(2, 0, 1, &[]);
    let a1 = f.adm.slot("a");
    let a2 = f.adm.slot("a");
    assert!(Arc::ptr_eq(&a1, &a2));
    assert_eq!(f.adm.ledger_len(), 1);
    drop((a1, a2));
    assert_eq!(f.adm.ledger_len(), 0, "entry goes with the last Arc");

    // Remove and re-register while a permit holds the slot: same slot, count kept.
    f.world.lock().workers.push(Worker {
        slot: f.adm.slot("a"),
        healthy: true,
        open_until: None,
    });
    let p = f.get(Target::Any).await.unwrap();
    f.world.lock().workers.clear();
    f.adm.forget("a");
    let again = f.adm.slot("a");
    assert_eq!(again.inflight(), 1);
    assert!(Arc::ptr_eq(&again, p.permit.slot()));
    drop(p);
    assert_eq!(again.inflight(), 0);
    assert!(
        !f.rec.take().iter().any(|e| matches!(e, Ev::Forgotten(_))),
        "re-registered before idle: not forgotten"
    );
    drop(again);
    assert_eq!(f.adm.ledger_len(), 0);
}

#[tokio::test]
async fn forget_fires_hook_once_idle() {
    let f = Fixture::new(2, 0, 1, &["a"]);
    let p = f.get(Target::Any).await.unwrap();
    f.world.lock().workers.clear();
    f.rec.take();
    f.adm.forget("a");
    assert!(f.rec.take().is_empty(), "busy: no hook yet");
    drop(p);
    assert_eq!(
        f.rec.take(),
        vec![Ev::Inflight("a".into(), 0), Ev::Forgotten("a".into())]
    );
    assert_eq!(f.adm.ledger_len(), 0);

    // Idle at forget: fires at once.
    let b = f.adm.slot("b");
    f.adm.forget("b");
    assert_eq!(f.rec.take(), vec![Ev::Forgotten("b".into())]);
    drop(b);
    assert_eq!(f.adm.ledger_len(), 0);
    f.assert_clean();
}

// ---------------------------------------------------------------- observer

#[tokio::test(start_paused = true)]
async fn observer_sees_queue_and_wait() {
    let f = Fixture::new(1, 1, 60, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let w = f.spawn(Target::Any);
    settle().await;
    assert_eq!(f.get(Target::Any).await.unwrap_err(), Rejection::QueueFull);
    tokio::time::advance(Duration::from_millis(250)).await;
    drop(held);
    settle().await;
    let w = done(w).await.unwrap();
    drop(w);
    let k = || "w0".to_owned();
    assert_eq!(
        f.rec.take(),
        vec![
            Ev::Inflight(k(), 1),
            Ev::Admitted(Duration::ZERO),
            Ev::Queued(1),
            Ev::Rejected(Rejection::QueueFull),
            // The release hands the slot over: gauge stays at 1.
            Ev::Inflight(k(), 1),
            Ev::Queued(0),
            Ev::Inflight(k(), 1),
            Ev::Admitted(Duration::from_millis(250)),
            Ev::Inflight(k(), 0),
        ]
    );
    f.assert_clean();
}

// ---------------------------------------------------------------- concurrency

#[test]
fn public_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Admission>();
    send_sync::<Permit>();
    send_sync::<Slot>();
    send_sync::<Admitted<String>>();
}

#[test]
fn acquire_future_is_send() {
    fn is_send<T: Send>(_: &T) {}
    let f = Fixture::new(1, 0, 1, &[]);
    let fut = f.adm.acquire(f.sel(Target::Any));
    is_send(&fut);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_limit_and_no_leaks_multi_thread() {
    const N: u32 = 2;
    let f = Arc::new(Fixture::new(N, 10_000, 3600, &["a", "b", "c"]));
    let mut tasks = Vec::new();
    for t in 0..16 {
        let f = Arc::clone(&f);
        tasks.push(tokio::spawn(async move {
            for i in 0..300 {
                let target = if (t + i) % 3 == 0 {
                    Target::Strict(i % 3)
                } else {
                    Target::Any
                };
                let a = f.get(target).await.expect("long timeout, big queue");
                assert!(a.permit.slot().inflight() <= N);
                if i % 7 == 0 {
                    tokio::task::yield_now().await;
                }
                drop(a);
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    for k in 0..3 {
        assert_eq!(f.slot(k).inflight(), 0);
    }
    assert_eq!(f.commits().len(), 16 * 300);
    f.assert_clean();
}

/// Races of every kind (fast path against enqueue, release against cancel and timeout, grants
/// against dropped receivers): outcomes vary run to run, the invariants checked do not.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stress_cancel_timeout_races_multi_thread() {
    const N: u32 = 1;
    let rec = Arc::new(Rec::default());
    let f = Arc::new({
        let mut f = Fixture::new(N, 8, 0, &["a", "b"]);
        f.adm = Admission::new(
            AdmissionConfig {
                max_inflight_per_worker: N,
                max_inflight_tokens_per_worker: None,
                queue_size: 8,
                queue_timeout: Duration::from_micros(200),
                priorities: None,
            },
            rec.clone(),
        );
        let slots = [f.adm.slot("a"), f.adm.slot("b")];
        for (w, s) in f.world.lock().workers.iter_mut().zip(slots) {
            w.slot = s;
        }
        f
    });
    let mut tasks = Vec::new();
    for t in 0..16usize {
        let f = Arc::clone(&f);
        tasks.push(tokio::spawn(async move {
            let (mut ok, mut rejected, mut cancelled) = (0, 0, 0);
            for i in 0..400usize {
                let target = match (t + i) % 4 {
                    0 => Target::Strict(0),
                    1 => Target::Strict(1),
                    _ => Target::Any,
                };
                let fut = f.get(target);
                match tokio::time::timeout(Duration::from_micros(((t * 7 + i) % 150) as u64), fut)
                    .await
                {
                    Ok(Ok(a)) => {
                        ok += 1;
                        assert!(a.permit.slot().inflight() <= N);
                        if i % 3 == 0 {
                            tokio::task::yield_now().await;
                        }
                        drop(a);
                    }
                    Ok(Err(_)) => rejected += 1,
                    Err(_) => cancelled += 1,
                }
            }
            (ok, rejected, cancelled)
        }));
    }
    let mut ok = 0;
    for t in tasks {
        ok += t.await.unwrap().0;
    }
    assert!(ok > 0);
    f.assert_clean();
    let max = rec
        .take()
        .into_iter()
        .filter_map(|e| match e {
            Ev::Inflight(_, n) => Some(n),
            _ => None,
        })
        .max();
    assert!(max <= Some(N));
}

// ---------------------------------------------------------------- priority classes

/// Classes with the given (queue size, timeout s, starvation s) each, lowest first.
fn classes(settings: [(usize, u64, Option<u64>); 4]) -> PriorityClasses {
    PriorityClasses(settings.map(|(q, t, s)| ClassSettings {
        queue_size: q,
        queue_timeout: Duration::from_secs(t),
        starvation_after: s.map(Duration::from_secs),
    }))
}

const ROOMY: [(usize, u64, Option<u64>); 4] = [(10, 600, None); 4];

#[derive(Default)]
struct PrioRec(
    Mutex<Vec<(Priority, PriorityOutcome)>>,
    Mutex<[(usize, usize); 4]>,
);

impl Observer for PrioRec {
    fn priority_outcome(&self, priority: Priority, outcome: PriorityOutcome) {
        self.0.lock().push((priority, outcome));
    }
    fn priority_levels(&self, priority: Priority, queued: usize, inflight: usize) {
        self.1.lock()[priority.index()] = (queued, inflight);
    }
}

#[tokio::test(start_paused = true)]
async fn a_freed_slot_goes_to_the_highest_priority_then_the_oldest() {
    let f = Fixture::with(1, 10, 60, Some(classes(ROOMY)), &["w0"]);
    let mut held = f.get(Target::Any).await.unwrap();
    let order = [
        Priority::Bulk,
        Priority::Default,
        Priority::Interactive,
        Priority::Bulk,
        Priority::System,
        Priority::Interactive,
    ];
    let waiters: Vec<_> = order.iter().map(|&p| f.spawn_at(Target::Any, p)).collect();
    settle().await;
    assert_eq!(f.adm.queued(), 6);
    let mut waiters: Vec<_> = waiters.into_iter().map(Some).collect();
    // Expected ids (arrival numbers 1..=6): system, interactive x2, default, bulk x2.
    for expected in [5, 3, 6, 2, 1, 4] {
        drop(held);
        settle().await;
        let h = waiters[expected as usize - 1].take().unwrap();
        held = done(h).await.unwrap();
    }
    drop(held);
    let ids: Vec<u32> = f.commits().into_iter().map(|(id, _)| id).collect();
    assert_eq!(ids, [0, 5, 3, 6, 2, 1, 4]);
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn without_priority_classes_the_selector_priority_is_ignored() {
    let f = Fixture::new(1, 10, 60, &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let bulk = f.spawn_at(Target::Any, Priority::Bulk);
    let system = f.spawn_at(Target::Any, Priority::System);
    settle().await;
    drop(held);
    settle().await;
    let first = done(bulk).await.unwrap();
    assert!(!system.is_finished());
    assert_eq!(first.permit.priority(), Priority::Default);
    drop(first);
    settle().await;
    drop(done(system).await.unwrap());
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn each_priority_has_its_own_queue_size_and_timeout() {
    let mut c = ROOMY;
    c[Priority::Bulk.index()] = (1, 5, None);
    c[Priority::Interactive.index()] = (2, 30, None);
    let f = Fixture::with(1, 10, 60, Some(classes(c)), &["w0"]);
    let held = f.get(Target::Any).await.unwrap();
    let bulk = f.spawn_at(Target::Any, Priority::Bulk);
    settle().await;
    let second_bulk = f.adm.acquire(f.sel_at(Target::Any, Priority::Bulk)).await;
    assert_eq!(
        second_bulk.unwrap_err(),
        Rejection::QueueFull,
        "bulk queue of 1"
    );
    let i1 = f.spawn_at(Target::Any, Priority::Interactive);
    let i2 = f.spawn_at(Target::Any, Priority::Interactive);
    settle().await;
    let third = f
        .adm
        .acquire(f.sel_at(Target::Any, Priority::Interactive))
        .await;
    assert_eq!(
        third.unwrap_err(),
        Rejection::QueueFull,
        "interactive queue of 2"
    );
    assert_eq!(f.adm.queued(), 3);
    // Bulk gives up after its 5 s; interactive waits on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(done(bulk).await.unwrap_err(), Rejection::QueueTimeout);
    assert!(!i1.is_finished() && !i2.is_finished());
    tokio::time::sleep(Duration::from_secs(25)).await;
    settle().await;
    assert_eq!(done(i1).await.unwrap_err(), Rejection::QueueTimeout);
    assert_eq!(done(i2).await.unwrap_err(), Rejection::QueueTimeout);
    drop(held);
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn a_starved_waiter_is_promoted_ahead_of_higher_priorities() {
    let rec = Arc::new(PrioRec::default());
    let mut c = ROOMY;
    c[Priority::Bulk.index()] = (10, 600, Some(10));
    let adm = Admission::new(
        AdmissionConfig {
            max_inflight_per_worker: 1,
            max_inflight_tokens_per_worker: None,
            queue_size: 10,
            queue_timeout: Duration::from_secs(600),
            priorities: Some(classes(c)),
        },
        rec.clone(),
    );
    let f = Fixture::with(1, 10, 600, None, &[]);
    f.world.lock().workers.push(Worker {
        slot: adm.slot("w0"),
        healthy: true,
        open_until: None,
    });
    let spawn = |p| {
        let adm = adm.clone();
        let sel = f.sel_at(Target::Any, p);
        tokio::spawn(async move { adm.acquire(sel).await })
    };
    let mut held = adm
        .acquire(f.sel_at(Target::Any, Priority::Interactive))
        .await
        .unwrap();
    let bulk = spawn(Priority::Bulk);
    settle().await;
    // A steady stream of interactive requests keeps the slot while the bulk one is young.
    for _ in 0..3 {
        let next = spawn(Priority::Interactive);
        settle().await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        drop(held);
        settle().await;
        held = done(next).await.unwrap();
        assert!(!bulk.is_finished());
    }
    // 9 s waited; one more interactive arrives, and the bulk waiter passes 10 s.
    let late = spawn(Priority::Interactive);
    tokio::time::sleep(Duration::from_secs(1)).await;
    drop(held);
    settle().await;
    let b = done(bulk).await.unwrap();
    assert!(!late.is_finished(), "the promoted bulk waiter went first");
    drop(b);
    settle().await;
    drop(done(late).await.unwrap());
    let promoted: Vec<_> = rec
        .0
        .lock()
        .iter()
        .filter(|(_, o)| matches!(o, PriorityOutcome::Admitted { promoted: true, .. }))
        .map(|(p, _)| *p)
        .collect();
    assert_eq!(promoted, [Priority::Bulk]);
    assert_eq!(*rec.1.lock(), [(0, 0); 4], "levels back to zero");
    assert_eq!(adm.queued(), 0);
    assert_eq!(adm.inflight_total(), 0);
}

#[tokio::test(start_paused = true)]
async fn priority_orders_across_wait_classes_without_head_of_line_blocking() {
    let f = Fixture::with(1, 10, 60, Some(classes(ROOMY)), &["w0", "w1"]);
    let h0 = f.get(Target::Strict(0)).await.unwrap();
    let h1 = f.get(Target::Strict(1)).await.unwrap();
    // Oldest: a bulk waiter for w0 only; then an interactive one for any worker.
    let bulk_w0 = f.spawn_at(Target::Strict(0), Priority::Bulk);
    let inter_any = f.spawn_at(Target::Any, Priority::Interactive);
    let bulk_w1 = f.spawn_at(Target::Strict(1), Priority::Bulk);
    settle().await;
    // w0 frees: the interactive waiter can use it and outranks the older bulk one.
    drop(h0);
    settle().await;
    let i = done(inter_any).await.unwrap();
    assert_eq!(i.choice, "w0");
    assert!(!bulk_w0.is_finished());
    // w1 frees: only bulk_w1 can use it; bulk_w0 (still blocked on w0) does not hold it back.
    drop(h1);
    settle().await;
    let b1 = done(bulk_w1).await.unwrap();
    drop(i);
    settle().await;
    let b0 = done(bulk_w0).await.unwrap();
    drop((b0, b1));
    f.assert_clean();
}

#[tokio::test(start_paused = true)]
async fn outcomes_cover_admit_reject_timeout_and_cancel() {
    let rec = Arc::new(PrioRec::default());
    let mut c = ROOMY;
    c[Priority::Bulk.index()] = (1, 5, None);
    let adm = Admission::new(
        AdmissionConfig {
            max_inflight_per_worker: 1,
            max_inflight_tokens_per_worker: None,
            queue_size: 10,
            queue_timeout: Duration::from_secs(60),
            priorities: Some(classes(c)),
        },
        rec.clone(),
    );
    let f = Fixture::with(1, 10, 60, None, &[]);
    f.world.lock().workers.push(Worker {
        slot: adm.slot("w0"),
        healthy: true,
        open_until: None,
    });
    let held = adm
        .acquire(f.sel_at(Target::Any, Priority::System))
        .await
        .unwrap();
    assert_eq!(rec.1.lock()[Priority::System.index()], (0, 1));
    let timed_out = {
        let adm = adm.clone();
        let sel = f.sel_at(Target::Any, Priority::Bulk);
        tokio::spawn(async move { adm.acquire(sel).await })
    };
    settle().await;
    assert_eq!(rec.1.lock()[Priority::Bulk.index()], (1, 0));
    let full = adm.acquire(f.sel_at(Target::Any, Priority::Bulk)).await;
    assert_eq!(full.unwrap_err(), Rejection::QueueFull);
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(done(timed_out).await.unwrap_err(), Rejection::QueueTimeout);
    let cancelled = {
        let adm = adm.clone();
        let sel = f.sel_at(Target::Any, Priority::Default);
        tokio::spawn(async move { adm.acquire(sel).await })
    };
    settle().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    cancelled.abort();
    settle().await;
    drop(held);
    let got = rec.0.lock().clone();
    let z = Duration::ZERO;
    assert_eq!(
        got,
        [
            (
                Priority::System,
                PriorityOutcome::Admitted {
                    waited: z,
                    promoted: false
                }
            ),
            (
                Priority::Bulk,
                PriorityOutcome::Rejected {
                    reason: Rejection::QueueFull,
                    waited: z
                }
            ),
            (
                Priority::Bulk,
                PriorityOutcome::Rejected {
                    reason: Rejection::QueueTimeout,
                    waited: Duration::from_secs(5)
                }
            ),
            (
                Priority::Default,
                PriorityOutcome::Cancelled {
                    waited: Duration::from_secs(2)
                }
            ),
        ]
    );
    assert_eq!(*rec.1.lock(), [(0, 0); 4]);
}

mod retry_after;
mod shares;
