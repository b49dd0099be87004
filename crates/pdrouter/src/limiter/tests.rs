use std::sync::atomic::{AtomicUsize, Ordering};

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

fn limiter(max: usize, queue: usize, rate: Option<f64>) -> (Limiter, Arc<Counts>) {
    let counts = Arc::new(Counts::default());
    let l = Limiter::new(
        LimiterConfig {
            max_concurrent: max,
            queue_size: queue,
            queue_timeout: Duration::from_secs(10),
            tokens_per_second: rate,
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
    tokio::spawn(async move { l.acquire().await })
}

#[tokio::test(start_paused = true)]
async fn admits_to_the_limit_then_queues_in_arrival_order() {
    let (l, counts) = limiter(2, 4, None);
    let a = l.acquire().await.unwrap();
    let b = l.acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..3 {
        let (l, order) = (l.clone(), order.clone());
        waiters.push(tokio::spawn(async move {
            let p = l.acquire().await.unwrap();
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
    let _held = l.acquire().await.unwrap();
    let waiter = spawn_acquire(&l);
    settle().await;
    assert_eq!(l.acquire().await.unwrap_err(), Refusal::QueueFull);
    assert_eq!(counts.rejected.load(Ordering::Relaxed), 1);
    waiter.abort();
    let (l, _) = limiter(1, 0, None);
    let _held = l.acquire().await.unwrap();
    assert_eq!(l.acquire().await.unwrap_err(), Refusal::QueueFull);
    assert_eq!(l.queued(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_waiter_times_out_at_its_deadline_and_leaves_the_queue() {
    let (l, counts) = limiter(1, 4, None);
    let held = l.acquire().await.unwrap();
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
    let held = l.acquire().await.unwrap();
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
    drop(l.acquire().await.unwrap());
    drop(l.acquire().await.unwrap());
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
            if let Ok(p) = l2.acquire().await {
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
