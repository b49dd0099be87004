//! Engine mode: a prefill worker that behaves like a continuous-batching
//! engine (bounded running set, FIFO queue, prefill time proportional to the
//! prompt).
//!
//! A prefill engine schedules in one of two ways:
//!
//! * **Independent slots** (the default): a request waits in the engine's own
//!   FIFO queue for one of [`EngineConfig::max_running`] slots, then
//!   "computes" for `delay + prompt_tokens / prefill_tokens_per_sec`, then
//!   marks its bootstrap room(s) finished and answers. Slots do not share
//!   anything, so `max_running` slots are `max_running` times the throughput.
//! * **Chunked prefill** ([`EngineConfig::chunk_tokens`] set): one scheduler
//!   loop runs forward steps, like an SGLang scheduler with chunked prefill.
//!   Each step takes requests from the head of one FIFO queue, at most
//!   `max_running` of them and at most `chunk_tokens` prompt tokens in all
//!   (the last request taken may get only part of its prompt, the rest in
//!   the following steps); the step lasts
//!   `step_overhead + step_tokens / prefill_tokens_per_sec`. A request
//!   answers at the end of the step that computes its last token. Arrivals
//!   join the queue at the next step boundary. The engine's throughput is
//!   therefore bounded by its token rate whatever the concurrency; batching
//!   only amortises the fixed per-step cost, as on a GPU, where a forward
//!   step over a few short prompts costs little more than over one.
//!
//! A request's rooms are marked finished in the worker's [`Rooms`] when its prefill ends
//! (the rendezvous itself is in [`crate::bootstrap`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{Semaphore, mpsc, oneshot};
use tokio::time::Instant;

use crate::bootstrap::Rooms;

/// Engine-mode settings of a [`MockConfig`](crate::MockConfig).
#[derive(Clone, Debug, PartialEq)]
pub struct EngineConfig {
    /// Requests in prefill at once (the engine's running batch); the rest
    /// wait in the engine's FIFO. Reported as `max_running_requests`.
    pub max_running: usize,
    /// Prefill speed: a prompt of `T` tokens takes `T / rate` seconds.
    pub prefill_tokens_per_sec: f64,
    /// Port of the prefill worker's KV bootstrap endpoint (0 = ephemeral).
    pub bootstrap_port: u16,
    /// Chunked prefill: the prompt tokens one forward step computes, shared
    /// by the requests in the step (see the module docs); `None` runs
    /// independent slots.
    pub chunk_tokens: Option<u64>,
    /// Chunked prefill: the fixed cost of one forward step, whatever its
    /// size.
    pub step_overhead: Duration,
}

impl EngineConfig {
    /// `max_running` 8, 10 000 tokens/s, ephemeral bootstrap port,
    /// independent slots.
    pub fn new() -> Self {
        EngineConfig {
            max_running: 8,
            prefill_tokens_per_sec: 10_000.0,
            bootstrap_port: 0,
            chunk_tokens: None,
            step_overhead: Duration::ZERO,
        }
    }

    /// Time to prefill `tokens` tokens.
    pub fn prefill_time(&self, tokens: u64) -> Duration {
        if self.prefill_tokens_per_sec.is_finite() && self.prefill_tokens_per_sec > 0.0 {
            Duration::from_secs_f64(tokens as f64 / self.prefill_tokens_per_sec)
        } else {
            Duration::ZERO
        }
    }
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig::new()
    }
}

/// The prefill engine of one worker: its scheduler, queue statistics, rooms.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) config: EngineConfig,
    scheduler: Scheduler,
    stats: Arc<QueueStats>,
    /// The worker's rooms (the same ones its bootstrap endpoint answers from).
    pub(crate) rooms: Arc<Rooms>,
}

/// How requests get compute time (see the module docs).
#[derive(Debug)]
enum Scheduler {
    /// `max_running` independent slots, FIFO (tokio's semaphore is fair).
    Slots(Semaphore),
    /// One chunked-prefill step loop, started by the first request.
    Steps {
        jobs: mpsc::UnboundedSender<Job>,
        /// The loop's end of `jobs`, until the loop starts.
        idle: Mutex<Option<mpsc::UnboundedReceiver<Job>>>,
    },
}

/// Requests waiting for compute and the longest wait seen.
#[derive(Debug, Default)]
struct QueueStats {
    queued: AtomicU64,
    max_wait_us: AtomicU64,
}

impl QueueStats {
    fn waited(&self, since: Instant) {
        let waited = u64::try_from(since.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.max_wait_us.fetch_max(waited, Ordering::SeqCst);
    }
}

/// A prefill handed to the step loop.
#[derive(Debug)]
struct Job {
    /// Prompt tokens still to compute (at least 1: an empty prompt still
    /// takes a step).
    remaining: u64,
    arrived: Instant,
    /// Whether a step has computed part of it yet.
    started: bool,
    /// Told when the last token is computed; a closed receiver means the
    /// request went away and the job is dropped.
    done: oneshot::Sender<()>,
}

/// Counts one request as queued in the engine until dropped.
#[derive(Debug)]
struct Queued<'a>(&'a AtomicU64);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Engine {
    pub(crate) fn new(config: EngineConfig, rooms: Arc<Rooms>) -> Self {
        let scheduler = if config.chunk_tokens.is_some() {
            let (jobs, idle) = mpsc::unbounded_channel();
            Scheduler::Steps {
                jobs,
                idle: Mutex::new(Some(idle)),
            }
        } else {
            Scheduler::Slots(Semaphore::new(config.max_running.max(1)))
        };
        Engine {
            scheduler,
            config,
            stats: Arc::default(),
            rooms,
        }
    }

    /// Requests waiting in the engine's FIFO for compute (chunked prefill:
    /// not yet in any step).
    pub(crate) fn queue_len(&self) -> u64 {
        self.stats.queued.load(Ordering::SeqCst)
    }

    /// The longest time a request has waited for compute.
    pub(crate) fn max_queue_wait(&self) -> Duration {
        Duration::from_micros(self.stats.max_wait_us.load(Ordering::SeqCst))
    }

    /// Resets the longest queue wait to zero.
    pub(crate) fn reset_max_queue_wait(&self) {
        self.stats.max_wait_us.store(0, Ordering::SeqCst);
    }

    /// One prefill, then `rooms` marked finished.
    ///
    /// Independent slots: wait for a slot (FIFO), wait for `hold` while
    /// holding it (the worker's hang switch: a stalled engine keeps its
    /// running slots), compute for `extra + tokens / rate`, release the slot.
    /// Chunked prefill: wait for `hold`, then `extra` (time before the request
    /// reaches the scheduler), then the steps that compute `tokens`.
    pub(crate) async fn prefill(
        &self,
        tokens: u64,
        extra: Duration,
        rooms: &[u64],
        hold: impl std::future::Future<Output = ()>,
    ) {
        match &self.scheduler {
            Scheduler::Slots(slots) => {
                let t0 = Instant::now();
                self.stats.queued.fetch_add(1, Ordering::SeqCst);
                let queued = Queued(&self.stats.queued);
                // The semaphore is never closed.
                let Ok(_slot) = slots.acquire().await else {
                    return;
                };
                drop(queued);
                self.stats.waited(t0);
                hold.await;
                let work = extra.saturating_add(self.config.prefill_time(tokens));
                if !work.is_zero() {
                    tokio::time::sleep(work).await;
                }
            }
            Scheduler::Steps { jobs, idle } => {
                hold.await;
                if !extra.is_zero() {
                    tokio::time::sleep(extra).await;
                }
                let idle = idle.lock().unwrap_or_else(|e| e.into_inner()).take();
                if let Some(rx) = idle {
                    tokio::spawn(run_steps(self.config.clone(), rx, Arc::clone(&self.stats)));
                }
                let (done, finished) = oneshot::channel();
                self.stats.queued.fetch_add(1, Ordering::SeqCst);
                let job = Job {
                    remaining: tokens.max(1),
                    arrived: Instant::now(),
                    started: false,
                    done,
                };
                if jobs.send(job).is_err() || finished.await.is_err() {
                    // The loop ends only with the engine.
                    return;
                }
            }
        }
        for &room in rooms {
            self.rooms.finish(room);
        }
    }
}

/// The chunked-prefill scheduler: forward steps over the head of the FIFO
/// until the engine (the jobs' sender) goes away.
async fn run_steps(
    config: EngineConfig,
    mut arrivals: mpsc::UnboundedReceiver<Job>,
    stats: Arc<QueueStats>,
) {
    let chunk = config.chunk_tokens.unwrap_or(u64::MAX).max(1);
    let max_running = config.max_running.max(1);
    let mut fifo: VecDeque<Job> = VecDeque::new();
    loop {
        if fifo.is_empty() {
            match arrivals.recv().await {
                Some(job) => fifo.push_back(job),
                None => return,
            }
        }
        while let Ok(job) = arrivals.try_recv() {
            fifo.push_back(job);
        }
        // Requests that went away leave the queue (and the running set).
        let before = fifo.len();
        fifo.retain(|j| !j.done.is_closed() || j.started);
        let gone = (before - fifo.len()) as u64;
        stats.queued.fetch_sub(gone, Ordering::SeqCst);
        fifo.retain(|j| !j.done.is_closed());
        if fifo.is_empty() {
            continue;
        }

        // Form the step: FIFO, at most max_running requests and chunk tokens.
        let mut budget = chunk;
        let mut shares = Vec::with_capacity(max_running);
        for job in fifo.iter_mut().take(max_running) {
            if budget == 0 {
                break;
            }
            let share = job.remaining.min(budget);
            budget -= share;
            shares.push(share);
            if !job.started {
                job.started = true;
                stats.queued.fetch_sub(1, Ordering::SeqCst);
                stats.waited(job.arrived);
            }
        }
        let step_tokens = chunk - budget;
        let step = config
            .step_overhead
            .saturating_add(config.prefill_time(step_tokens));
        tokio::time::sleep(step).await;

        for (job, share) in fifo.iter_mut().zip(&shares) {
            job.remaining -= share;
        }
        // Only the last request of a step can be unfinished, so the
        // finished ones are at the front.
        while fifo.front().is_some_and(|j| j.remaining == 0) {
            if let Some(job) = fifo.pop_front() {
                let _ = job.done.send(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn engine_runs_at_most_max_running_and_queues_fifo() {
        let engine = Arc::new(Engine::new(
            EngineConfig {
                max_running: 2,
                prefill_tokens_per_sec: 1000.0,
                bootstrap_port: 0,
                ..EngineConfig::new()
            },
            Arc::default(),
        ));
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5u64 {
            let (e, o) = (Arc::clone(&engine), Arc::clone(&order));
            tasks.push(tokio::spawn(async move {
                // 1000 tokens = 1 s each.
                e.prefill(1000, Duration::ZERO, &[i], async {}).await;
                o.lock().unwrap().push(i);
            }));
            // Arrive in a known order.
            tokio::task::yield_now().await;
        }
        assert_eq!(engine.queue_len(), 3);
        let t0 = Instant::now();
        for t in tasks {
            t.await.unwrap();
        }
        // Two at a time, one second each: 3 rounds.
        assert_eq!(t0.elapsed().as_secs(), 3);
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
        assert_eq!(engine.queue_len(), 0);
        assert_eq!(engine.max_queue_wait(), Duration::from_secs(2));
        assert!((0..5).all(|r| engine.rooms.is_finished(r)));
        engine.reset_max_queue_wait();
        assert_eq!(engine.max_queue_wait(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn prefill_time_is_proportional_to_tokens() {
        let cfg = EngineConfig {
            max_running: 1,
            prefill_tokens_per_sec: 200.0,
            bootstrap_port: 0,
            ..EngineConfig::new()
        };
        assert_eq!(cfg.prefill_time(100), Duration::from_millis(500));
        assert_eq!(cfg.prefill_time(0), Duration::ZERO);
        let engine = Engine::new(cfg, Arc::default());
        let t0 = Instant::now();
        engine
            .prefill(400, Duration::from_millis(100), &[], async {})
            .await;
        assert_eq!(t0.elapsed(), Duration::from_millis(2100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_queued_prefill_leaves_the_queue() {
        let engine = Arc::new(Engine::new(
            EngineConfig {
                max_running: 1,
                prefill_tokens_per_sec: 1.0,
                bootstrap_port: 0,
                ..EngineConfig::new()
            },
            Arc::default(),
        ));
        let e = Arc::clone(&engine);
        let running =
            tokio::spawn(async move { e.prefill(10, Duration::ZERO, &[], async {}).await });
        tokio::task::yield_now().await;
        let e = Arc::clone(&engine);
        let queued =
            tokio::spawn(async move { e.prefill(10, Duration::ZERO, &[], async {}).await });
        tokio::task::yield_now().await;
        assert_eq!(engine.queue_len(), 1);
        queued.abort();
        let _ = queued.await;
        assert_eq!(engine.queue_len(), 0);
        running.abort();
    }

    fn chunked(max_running: usize, rate: f64, chunk: u64, overhead_ms: u64) -> Arc<Engine> {
        Arc::new(Engine::new(
            EngineConfig {
                max_running,
                prefill_tokens_per_sec: rate,
                bootstrap_port: 0,
                chunk_tokens: Some(chunk),
                step_overhead: Duration::from_millis(overhead_ms),
            },
            Arc::default(),
        ))
    }

    /// Starts `tokens.len()` prefills in order; each task answers its
    /// finishing time since the start.
    async fn start_all(
        engine: &Arc<Engine>,
        tokens: &[u64],
    ) -> Vec<tokio::task::JoinHandle<Duration>> {
        let t0 = Instant::now();
        let mut tasks = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            let e = Arc::clone(engine);
            tasks.push(tokio::spawn(async move {
                e.prefill(t, Duration::ZERO, &[i as u64], async {}).await;
                t0.elapsed()
            }));
        }
        // A current-thread runtime runs spawned tasks in spawn order, so the
        // prefills arrive in order and the step loop (spawned by the first)
        // runs after all of them have arrived.
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
        tasks
    }

    async fn finish_times(tasks: Vec<tokio::task::JoinHandle<Duration>>) -> Vec<u128> {
        let mut out = Vec::new();
        for t in tasks {
            out.push(t.await.unwrap().as_millis());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn chunked_steps_batch_at_most_max_running_requests() {
        // 10 tokens each at 1000 tokens/s plus 100 ms per step: four share
        // the first step (140 ms), the other two the second (120 ms).
        let engine = chunked(4, 1000.0, 1000, 100);
        let tasks = start_all(&engine, &[10; 6]).await;
        assert_eq!(
            finish_times(tasks).await,
            vec![140, 140, 140, 140, 260, 260]
        );
        assert_eq!(engine.queue_len(), 0);
        assert_eq!(engine.max_queue_wait(), Duration::from_millis(140));
        assert!((0..6).all(|r| engine.rooms.is_finished(r)));
    }

    #[tokio::test(start_paused = true)]
    async fn chunked_steps_share_one_token_budget_in_fifo_order() {
        // A 1000-token prompt ahead of two short ones, 512 tokens per step,
        // 1000 tokens/s, 10 ms per step: the long one takes the first step
        // alone (522 ms); the second step computes its last 488 tokens and
        // 24 of the next prompt's 100 (522 ms); the third the remaining 76
        // and the last prompt's 100 (186 ms).
        let engine = chunked(4, 1000.0, 512, 10);
        let tasks = start_all(&engine, &[1000, 100, 100]).await;
        assert_eq!(
            engine.queue_len(),
            2,
            "the short prompts wait behind the long one"
        );
        assert_eq!(finish_times(tasks).await, vec![1044, 1230, 1230]);
        assert_eq!(engine.queue_len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn chunked_throughput_is_the_token_rate_whatever_the_concurrency() {
        // Without step overhead, eight 500-token prompts take 4 s at
        // 1000 tokens/s whether one or eight run at once.
        for running in [1, 8] {
            let engine = chunked(running, 1000.0, 4096, 0);
            let tasks = start_all(&engine, &[500; 8]).await;
            assert_eq!(*finish_times(tasks).await.last().unwrap(), 4000);
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_cancelled_chunked_prefill_leaves_the_queue_and_the_step() {
        let engine = chunked(1, 1000.0, 100, 0);
        let tasks = start_all(&engine, &[1000, 1000, 100]).await;
        let mut tasks = tasks.into_iter();
        let (first, second, third) = (
            tasks.next().unwrap(),
            tasks.next().unwrap(),
            tasks.next().unwrap(),
        );
        assert_eq!(engine.queue_len(), 2);
        // The running one and a queued one go away: the last prompt is next.
        first.abort();
        second.abort();
        let _ = (first.await, second.await);
        let done = third.await.unwrap();
        assert_eq!(engine.queue_len(), 0);
        // At most the step in progress (100 ms) before its own 100 ms.
        assert!(done <= Duration::from_millis(200), "{done:?}");
    }
}
