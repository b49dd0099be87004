use std::sync::atomic::{AtomicUsize, Ordering};

use pdrouter_admission::{ClassSettings, PriorityOutcome};

use super::*;

#[derive(Debug, Default)]
struct Counts {
    allowed: AtomicUsize,
    rejected: AtomicUsize,
}

impl LimiterObserver for Counts {
    fn decided(&self, allowed: bool) {
        if allowed {
            self.allowed.fetch_add(1, Ordering::Relaxed);
        } else {
            self.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }
    fn levels(&self, _inflight: usize, _queued: usize) {}
}

impl pdrouter_admission::Observer for Counts {}

fn limiter(max: usize, queue: usize, rate: Option<f64>) -> (Limiter, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let l = Limiter::new(
        LimiterConfig {
            max_concurrent: max,
            queue_size: queue,
            queue_timeout: Duration::from_secs(10),
            tokens_per_second: rate,
            priorities: None,
        },
        counts.clone(),
    );
    (l, counts)
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

fn spawn_acquire(l: &Limiter) -> tokio::task::JoinHandle<Result<Permit, Refusal>> {
    let l = l.clone();
    tokio::spawn(async move { l.acquire(Priority::Default).await })
}

#[tokio::test(start_paused = true)]
async fn admits_to_the_limit_then_queues_in_arrival_order() {
    let (l, counts) = limiter(2, 4, None);
    let a = l.acquire(Priority::Default).await.unwrap();
    let b = l.acquire(Priority::Default).await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (l, order) = (l.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let p = l.acquire(Priority::Default).await.unwrap();
            order.lock().push(i);
            p
        }));
        settle().await;
    }
    assert_eq!((l.inflight(), l.queued()), (2, 3));
    drop(a);
    settle().await;
    assert_eq!(*order.lock(), [0]);
    drop(b);
    settle().await;
    assert_eq!(*order.lock(), [0, 1]);
    assert_eq!((l.inflight(), l.queued()), (2, 1));
    let mut held = Vec::new();
    for w in waiters.drain(..2) {
        held.push(w.await.unwrap());
    }
    held.clear();
    settle().await;
    assert_eq!(*order.lock(), [0, 1, 2]);
    drop(waiters.pop().unwrap().await.unwrap());
    assert_eq!((l.inflight(), l.queued()), (0, 0));
    assert_eq!(counts.allowed.load(Ordering::Relaxed), 5);
}

#[tokio::test(start_paused = true)]
async fn a_full_queue_refuses_at_once_and_size_zero_never_waits() {
    let (l, counts) = limiter(1, 1, None);
    let _held = l.acquire(Priority::Default).await.unwrap();
    let waiter = spawn_acquire(&l);
    settle().await;
    assert_eq!(
        l.acquire(Priority::Default).await.unwrap_err(),
        Refusal::QueueFull
    );
    assert_eq!(counts.rejected.load(Ordering::Relaxed), 1);
    waiter.abort();
    let (l, _) = limiter(1, 0, None);
    let _held = l.acquire(Priority::Default).await.unwrap();
    assert_eq!(
        l.acquire(Priority::Default).await.unwrap_err(),
        Refusal::QueueFull
    );
    assert_eq!(l.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_times_out_at_its_deadline_and_leaves_the_queue() {
    let (l, counts) = limiter(1, 4, None);
    let held = l.acquire(Priority::Default).await.unwrap();
    let start = Instant::now();
    let waiter = spawn_acquire(&l);
    settle().await;
    tokio::time::advance(Duration::from_millis(9_999)).await;
    settle().await;
    assert!(!waiter.is_finished());
    assert_eq!(waiter.await.unwrap().unwrap_err(), Refusal::QueueTimeout);
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    assert_eq!((l.inflight(), l.queued()), (1, 0));
    assert_eq!(counts.rejected.load(Ordering::Relaxed), 1);
    drop(held);
    assert_eq!(l.inflight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_waiter_leaves_and_the_next_one_is_served() {
    let (l, _) = limiter(1, 4, None);
    let held = l.acquire(Priority::Default).await.unwrap();
    let gone = spawn_acquire(&l);
    settle().await;
    let next = spawn_acquire(&l);
    settle().await;
    assert_eq!(l.queued(), 2);
    gone.abort();
    settle().await;
    assert_eq!(l.queued(), 1);
    drop(held);
    let p = next.await.unwrap().unwrap();
    assert_eq!((l.inflight(), l.queued()), (1, 0));
    drop(p);
    assert_eq!(l.inflight(), 0);
}

#[tokio::test(start_paused = true)]
async fn the_rate_spaces_admissions_after_the_burst() {
    // Capacity 2 (the burst), one token per second after that.
    let (l, _) = limiter(2, 8, Some(1.0));
    let start = Instant::now();
    drop(l.acquire(Priority::Default).await.unwrap());
    drop(l.acquire(Priority::Default).await.unwrap());
    // Concurrency is free, but the bucket is empty: the third waits for a token.
    let third = spawn_acquire(&l);
    settle().await;
    assert_eq!(l.queued(), 1);
    let p = third.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(1));
    drop(p);
    assert_eq!((l.inflight(), l.queued()), (0, 0));
}

/// Random mixes of holds, releases, cancellations and timeouts leave nothing behind.
#[tokio::test(start_paused = true)]
async fn nothing_leaks_under_random_mixes() {
    use rand::{RngExt, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let (l, counts) = limiter(3, 5, Some(20.0));
    let mut tasks = Vec::new();
    for step in 0..300 {
        let hold = Duration::from_millis(rng.random_range(0..400));
        let l2 = l.clone();
        tasks.push(tokio::spawn(async move {
            if let Ok(p) = l2.acquire(Priority::Default).await {
                tokio::time::sleep(hold).await;
                drop(p);
            }
        }));
        if rng.random_range(0..4) == 0
            && let Some(t) = tasks.get(rng.random_range(0..tasks.len()))
        {
            t.abort();
        }
        if step % 7 == 0 {
            tokio::time::advance(Duration::from_millis(rng.random_range(0..300))).await;
        }
        settle().await;
        assert!(l.inflight() <= 3);
        assert!(l.queued() <= 5);
    }
    tokio::time::advance(Duration::from_secs(60)).await;
    for t in tasks {
        let _ = t.await;
    }
    assert_eq!((l.inflight(), l.queued()), (0, 0));
    assert!(counts.allowed.load(Ordering::Relaxed) > 0);
    assert!(counts.rejected.load(Ordering::Relaxed) > 0);
}

#[test]
fn fifo_pops_in_order_and_removes_any() {
    let mut f = Fifo::default();
    let a = f.push('a');
    let _b = f.push('b');
    let c = f.push('c');
    assert_eq!(f.remove(c), Some('c'));
    assert_eq!(f.remove(c), None);
    assert_eq!(f.pop(), Some('a'));
    assert_eq!(f.remove(a), None);
    assert_eq!(f.len(), 1);
    assert_eq!(f.pop(), Some('b'));
    assert!(f.is_empty());
}

// ---------------------------------------------------------------- priority classes

#[derive(Debug, Default)]
struct ByClass {
    admitted: parking_lot::Mutex<Vec<(Priority, bool)>>,
    levels: parking_lot::Mutex<[(usize, usize); 4]>,
}

impl LimiterObserver for ByClass {
    fn decided(&self, _: bool) {}
    fn levels(&self, _: usize, _: usize) {}
}

impl pdrouter_admission::Observer for ByClass {
    fn priority_outcome(&self, priority: Priority, outcome: PriorityOutcome) {
        if let PriorityOutcome::Admitted { promoted, .. } = outcome {
            self.admitted.lock().push((priority, promoted));
        }
    }
    fn priority_levels(&self, priority: Priority, queued: usize, inflight: usize) {
        self.levels.lock()[priority.index()] = (queued, inflight);
    }
}

fn prioritized(classes: [(usize, u64, Option<u64>); 4]) -> (Limiter, Arc<ByClass>) {
    let obs = Arc::new(ByClass::default());
    let l = Limiter::new(
        LimiterConfig {
            max_concurrent: 1,
            queue_size: 100,
            queue_timeout: Duration::from_secs(600),
            tokens_per_second: None,
            priorities: Some(PriorityClasses(classes.map(|(q, t, s)| ClassSettings {
                queue_size: q,
                queue_timeout: Duration::from_secs(t),
                starvation_after: s.map(Duration::from_secs),
            }))),
        },
        obs.clone(),
    );
    (l, obs)
}

fn spawn_at(l: &Limiter, p: Priority) -> tokio::task::JoinHandle<Result<Permit, Refusal>> {
    let l = l.clone();
    tokio::spawn(async move { l.acquire(p).await })
}

#[tokio::test(start_paused = true)]
async fn classes_are_served_highest_first_then_in_arrival_order() {
    let (l, obs) = prioritized([(10, 600, None); 4]);
    let mut held = l.acquire(Priority::Default).await.unwrap();
    let order = [
        Priority::Bulk,
        Priority::Interactive,
        Priority::Default,
        Priority::Interactive,
    ];
    let mut waiters: Vec<_> = order.iter().map(|&p| Some(spawn_at(&l, p))).collect();
    settle().await;
    for i in [1, 3, 2, 0] {
        drop(held);
        settle().await;
        let h = waiters[i].take().unwrap();
        assert!(h.is_finished(), "waiter {i} next");
        held = h.await.unwrap().unwrap();
    }
    drop(held);
    let got: Vec<Priority> = obs.admitted.lock().iter().map(|(p, _)| *p).collect();
    assert_eq!(
        got,
        [
            Priority::Default,
            Priority::Interactive,
            Priority::Interactive,
            Priority::Default,
            Priority::Bulk
        ]
    );
    assert_eq!(*obs.levels.lock(), [(0, 0); 4]);
    assert_eq!((l.inflight(), l.queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn each_class_has_its_own_bound_and_timeout_and_the_starved_go_first() {
    let mut c = [(10, 600, None); 4];
    c[Priority::Bulk.index()] = (1, 600, Some(30));
    c[Priority::Interactive.index()] = (10, 5, None);
    let (l, obs) = prioritized(c);
    let held = l.acquire(Priority::System).await.unwrap();
    let bulk = spawn_at(&l, Priority::Bulk);
    settle().await;
    assert_eq!(
        l.acquire(Priority::Bulk).await.unwrap_err(),
        Refusal::QueueFull
    );
    let quick = spawn_at(&l, Priority::Interactive);
    settle().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    settle().await;
    assert_eq!(quick.await.unwrap().unwrap_err(), Refusal::QueueTimeout);
    tokio::time::sleep(Duration::from_secs(25)).await;
    // Bulk has waited 30 s: promoted ahead of a fresh interactive waiter.
    let fresh = spawn_at(&l, Priority::Interactive);
    settle().await;
    drop(held);
    settle().await;
    assert!(bulk.is_finished() && !fresh.is_finished());
    drop(bulk.await.unwrap().unwrap());
    settle().await;
    drop(fresh.await.unwrap().unwrap());
    assert!(obs.admitted.lock().contains(&(Priority::Bulk, true)));
    assert_eq!(*obs.levels.lock(), [(0, 0); 4]);
}

#[tokio::test(start_paused = true)]
async fn without_classes_the_priority_is_ignored() {
    let (l, _) = limiter(1, 10, None);
    let held = l.acquire(Priority::Default).await.unwrap();
    let bulk = spawn_at(&l, Priority::Bulk);
    let system = spawn_at(&l, Priority::System);
    settle().await;
    drop(held);
    settle().await;
    assert!(bulk.is_finished() && !system.is_finished(), "one FIFO");
    drop(bulk.await.unwrap().unwrap());
    settle().await;
    drop(system.await.unwrap().unwrap());
}

#[test]
fn refusals_answer_429_with_retry_after_or_408() {
    let full = Refusal::QueueFull.into_api_error(7);
    assert_eq!(
        (
            full.status.as_u16(),
            full.code,
            full.retry_after,
            full.retryable
        ),
        (429, "rate_limit_exceeded", Some(1), false)
    );
    assert_eq!(
        full.message,
        "the router is at --max-concurrent-requests and its queue is full; retry later"
    );
    let timeout = Refusal::QueueTimeout.into_api_error(7);
    assert_eq!(
        (timeout.status.as_u16(), timeout.code, timeout.retry_after),
        (408, "queue_timeout", None)
    );
    assert_eq!(
        timeout.message,
        "waited 7s in the router's request queue without being admitted; retry later"
    );
}
