//! Engine mode: a prefill worker that behaves like a continuous-batching
//! engine (bounded running set, FIFO queue, prefill time proportional to the
//! prompt) and the KV bootstrap rendezvous between prefill and decode.
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
//! * The prefill worker serves `GET /room/{room}` on a separate bootstrap
//!   port; the answer comes only once that room's prefill has finished
//!   (long poll).
//! * A decode worker in engine mode asks that endpoint (from the
//!   `bootstrap_host`/`bootstrap_port`/`bootstrap_room` in its request body)
//!   and starts generating only after the answer.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};
use tokio::sync::{Semaphore, mpsc, oneshot, watch};
use tokio::time::Instant;

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

/// How long a finished room stays answerable.
const ROOM_RETENTION: Duration = Duration::from_secs(300);
/// Longest a bootstrap long poll is held before it answers 504.
pub(crate) const LONG_POLL_LIMIT: Duration = Duration::from_secs(600);

/// Rendezvous of bootstrap rooms: finished rooms and their waiters.
#[derive(Debug, Default)]
pub(crate) struct Rooms {
    inner: Mutex<RoomsInner>,
}

#[derive(Debug, Default)]
struct RoomsInner {
    /// `true` once the room's prefill finished.
    rooms: HashMap<u64, watch::Sender<bool>>,
    /// Finished rooms in finishing order, for expiry.
    finished: VecDeque<(Instant, u64)>,
    /// What finished each room, when its finisher said (an encode worker: the item's
    /// content hash), until it expires.
    tags: HashMap<u64, String>,
}

impl Rooms {
    fn lock(&self) -> std::sync::MutexGuard<'_, RoomsInner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks `room` finished and wakes its waiters.
    pub(crate) fn finish(&self, room: u64) {
        self.finish_tagged(room, None);
    }

    /// Marks `room` finished with what finished it (shown by `GET /room/{room}`).
    pub(crate) fn finish_tagged(&self, room: u64, tag: Option<String>) {
        let now = Instant::now();
        let mut inner = self.lock();
        if let Some(tag) = tag {
            inner.tags.insert(room, tag);
        }
        inner
            .rooms
            .entry(room)
            .or_insert_with(|| watch::Sender::new(false))
            .send_replace(true);
        inner.finished.push_back((now, room));
        while let Some(&(at, old)) = inner.finished.front() {
            if now.duration_since(at) < ROOM_RETENTION {
                break;
            }
            inner.finished.pop_front();
            inner.rooms.remove(&old);
            inner.tags.remove(&old);
        }
    }

    /// What finished `room`, if its finisher said.
    pub(crate) fn tag(&self, room: u64) -> Option<String> {
        self.lock().tags.get(&room).cloned()
    }

    /// Whether `room` has finished (and not yet expired).
    #[cfg(test)]
    pub(crate) fn is_finished(&self, room: u64) -> bool {
        self.lock().rooms.get(&room).is_some_and(|s| *s.borrow())
    }

    /// Waits until `room` has finished. Cancel-safe: a dropped waiter leaves
    /// no entry behind for a room that never finished.
    pub(crate) async fn wait(&self, room: u64) {
        let rx = self
            .lock()
            .rooms
            .entry(room)
            .or_insert_with(|| watch::Sender::new(false))
            .subscribe();
        let mut waiter = RoomWaiter {
            rooms: self,
            room,
            rx: Some(rx),
        };
        if let Some(rx) = waiter.rx.as_mut() {
            // The sender lives in the map until the room finishes or expires.
            let _ = rx.wait_for(|done| *done).await;
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().rooms.len()
    }
}

/// Removes a never-finished room's entry when its last waiter goes away.
#[derive(Debug)]
struct RoomWaiter<'a> {
    rooms: &'a Rooms,
    room: u64,
    rx: Option<watch::Receiver<bool>>,
}

impl Drop for RoomWaiter<'_> {
    fn drop(&mut self) {
        drop(self.rx.take());
        let mut inner = self.rooms.lock();
        let abandoned = inner
            .rooms
            .get(&self.room)
            .is_some_and(|s| !*s.borrow() && s.receiver_count() == 0);
        if abandoned {
            inner.rooms.remove(&self.room);
        }
    }
}

/// The prefill engine of one worker: its scheduler, queue statistics, rooms.
#[derive(Debug)]
pub(crate) struct Engine {
    pub(crate) config: EngineConfig,
    scheduler: Scheduler,
    stats: Arc<QueueStats>,
    /// The worker's rooms (shared with [`Shared`](crate::state::Shared)).
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

/// The bootstrap endpoint's routes: `GET /room/{room}` (long poll) and
/// `GET /health`.
pub(crate) fn bootstrap_router(rooms: Arc<Rooms>) -> Router {
    room_routes(rooms).route("/health", get(|| async { StatusCode::OK }))
}

/// `GET /room/{room}` alone (a gRPC worker serves it on its own port).
pub(crate) fn room_routes<S>(rooms: Arc<Rooms>) -> Router<S> {
    Router::new()
        .route("/room/{room}", get(room))
        .with_state(rooms)
}

async fn room(State(rooms): State<Arc<Rooms>>, Path(room): Path<String>) -> Response {
    let Ok(room) = room.parse::<u64>() else {
        return (StatusCode::BAD_REQUEST, "room must be an unsigned integer").into_response();
    };
    match tokio::time::timeout(LONG_POLL_LIMIT, rooms.wait(room)).await {
        Ok(()) => axum::Json(json!({ "room": room, "ready": true, "tag": rooms.tag(room) }))
            .into_response(),
        Err(_) => (StatusCode::GATEWAY_TIMEOUT, "prefill did not finish").into_response(),
    }
}

/// The rooms a request body names (`bootstrap_room` as a number or an array
/// of numbers).
pub(crate) fn rooms_of(req: &serde_json::Map<String, Value>) -> Vec<u64> {
    match req.get("bootstrap_room") {
        Some(Value::Number(n)) => n.as_u64().into_iter().collect(),
        Some(Value::Array(items)) => items.iter().filter_map(Value::as_u64).collect(),
        _ => Vec::new(),
    }
}

/// The `(host, port, room)` rendezvous points of a decode request; entries
/// whose port is null or missing are skipped (nothing to ask).
pub(crate) fn bootstrap_points(req: &serde_json::Map<String, Value>) -> Vec<(String, u16, u64)> {
    let as_list = |key: &str| match req.get(key) {
        Some(Value::Array(items)) => items.clone(),
        Some(v) => vec![v.clone()],
        None => Vec::new(),
    };
    let (hosts, ports, rooms) = (
        as_list("bootstrap_host"),
        as_list("bootstrap_port"),
        as_list("bootstrap_room"),
    );
    rooms
        .iter()
        .enumerate()
        .filter_map(|(i, room)| {
            let host = hosts.get(i).or(hosts.first())?.as_str()?.to_owned();
            let port = u16::try_from(ports.get(i).or(ports.first())?.as_u64()?).ok()?;
            Some((host, port, room.as_u64()?))
        })
        .collect()
}

/// Asks `http://host:port/room/{room}` and waits for its answer.
pub(crate) async fn await_room(host: &str, port: u16, room: u64) -> Result<(), String> {
    await_room_tag(host, port, room).await.map(drop)
}

/// [`await_room`], returning the room's tag (what finished it), if any.
pub(crate) async fn await_room_tag(
    host: &str,
    port: u16,
    room: u64,
) -> Result<Option<String>, String> {
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let uri: hyper::Uri = format!("http://{authority}/room/{room}")
        .parse()
        .map_err(|e| format!("bootstrap {authority}: {e}"))?;
    let resp = bootstrap_client()
        .get(uri)
        .await
        .map_err(|e| format!("bootstrap {authority}: {e}"))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    if status.is_success() {
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        Ok(answer["tag"].as_str().map(str::to_owned))
    } else {
        Err(format!("bootstrap {authority} room {room}: {status}"))
    }
}

/// Most idle bootstrap connections kept per prefill worker.
const BOOTSTRAP_IDLE_PER_HOST: usize = 32;

/// The client of the bootstrap long polls, shared by the process: a decode worker asks a
/// room per request, and a new connection each time would cost its prefill worker an accept
/// (and both a handshake) per request; kept-alive connections are reused instead.
fn bootstrap_client() -> &'static Client<HttpConnector, Empty<Bytes>> {
    static CLIENT: OnceLock<Client<HttpConnector, Empty<Bytes>>> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(BOOTSTRAP_IDLE_PER_HOST)
            .build(connector)
    })
}

/// Waits for every rendezvous point of a decode request (concurrently).
pub(crate) async fn await_bootstrap(req: &serde_json::Map<String, Value>) -> Result<(), String> {
    let points = bootstrap_points(req);
    let waits = points
        .iter()
        .map(|(host, port, room)| await_room(host, *port, *room));
    for r in futures_util::future::join_all(waits).await {
        r?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn rooms_answer_only_after_finish() {
        let rooms = Arc::new(Rooms::default());
        let r = Arc::clone(&rooms);
        let waiter = tokio::spawn(async move { r.wait(7).await });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        assert!(!rooms.is_finished(7));
        rooms.finish(7);
        waiter.await.unwrap();
        assert!(rooms.is_finished(7));
        // A late waiter returns at once.
        rooms.wait(7).await;
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_waiters_leave_nothing_behind() {
        let rooms = Rooms::default();
        let _ = tokio::time::timeout(Duration::from_millis(5), rooms.wait(1)).await;
        assert_eq!(rooms.len(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn finished_rooms_expire() {
        let rooms = Rooms::default();
        rooms.finish(1);
        tokio::time::advance(ROOM_RETENTION + Duration::from_secs(1)).await;
        rooms.finish(2);
        assert!(!rooms.is_finished(1));
        assert!(rooms.is_finished(2));
        assert_eq!(rooms.len(), 1);
    }

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

    #[test]
    fn bootstrap_points_pair_hosts_ports_and_rooms() {
        let req = |v: Value| v.as_object().unwrap().clone();
        let one =
            req(json!({"bootstrap_host":"10.0.0.1","bootstrap_port":8998,"bootstrap_room":5}));
        assert_eq!(
            bootstrap_points(&one),
            vec![("10.0.0.1".to_owned(), 8998, 5)]
        );
        let batch = req(json!({
            "bootstrap_host":["a","b"],"bootstrap_port":[1,null],"bootstrap_room":[10,11]
        }));
        assert_eq!(bootstrap_points(&batch), vec![("a".to_owned(), 1, 10)]);
        let no_port = req(json!({"bootstrap_host":"a","bootstrap_port":null,"bootstrap_room":1}));
        assert!(bootstrap_points(&no_port).is_empty());
        assert_eq!(rooms_of(&batch), vec![10, 11]);
        assert_eq!(rooms_of(&one), vec![5]);
        assert!(rooms_of(&req(json!({}))).is_empty());
    }
}
