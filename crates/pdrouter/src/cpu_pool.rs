//! The low-priority threads large prompts are tokenized on: large request bodies parsed
//! (`http`), prompts rendered and tokenized (`grpc::translate`), images decoded and
//! preprocessed (`images`); and the one that encodes long prompts' `Generate` messages
//! ([`encode`], for `grpc::encoded`), a queue of its own so that a request already admitted
//! never waits behind other requests' tokenization.
//!
//! Tokenizing a 32k-token prompt costs tens of milliseconds of CPU. On tokio's blocking pool
//! that thread competes as an equal with the runtime's worker threads, so on a router with
//! one or two cores a small request arriving meanwhile waits for a scheduler time slice
//! behind it. These threads lower their own scheduling priority when they start: on Linux
//! the `SCHED_IDLE` policy, which the scheduler preempts as soon as a normal thread wakes
//! (nice [`NICE`] if the policy is refused; a nice-19 thread still keeps the CPU for the rest
//! of its slice, about a millisecond); elsewhere they run at normal priority. So the kernel
//! runs the async workers first whenever both are ready, and tokenization takes the CPU they
//! leave idle.
//!
//! Invariants (per pool):
//! - At most its thread count of jobs run at once ([`threads`] tokenizing, one encoding);
//!   later ones wait in arrival order, at most [`MAX_WAITING`] of them: past that a job is
//!   refused at once ([`PoolError::Full`], a 503 with `Retry-After` to the client; an encoding
//!   is then done by its caller), and a job that waited longer than [`MAX_WAIT`] is dropped
//!   unrun when its turn comes ([`PoolError::Late`], the same), so a queue can hold neither
//!   unbounded work nor work nobody will wait for.
//! - A job whose caller went away before the job started is dropped unrun (what it holds,
//!   a request's body or pixels, is freed then); one already running runs to its end and only
//!   its result is dropped.
//! - A job that panics is reported to its caller as an error; its thread keeps serving.
//! - The threads are started on first use and live as long as the process.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::oneshot;

use crate::error::ApiError;

/// Nice value of the pool's threads: the lowest CPU share Linux offers to a normal thread,
/// so a runtime worker woken by a socket preempts tokenization at once.
pub const NICE: i32 = 19;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// Most jobs waiting for a thread at once.
pub const MAX_WAITING: usize = 256;
/// Longest a job may wait for a thread.
pub const MAX_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// One pool: its threads, started on first use, and the count of jobs waiting for them.
struct Pool {
    name: &'static str,
    threads: fn() -> usize,
    queue: OnceLock<Mutex<Sender<Job>>>,
    waiting: AtomicUsize,
}

/// The tokenizing pool.
static TOKENIZE: Pool = Pool::new("tokenize", threads);
/// The encoding pool: one thread (encoding a 32k-token message takes well under a
/// millisecond).
static ENCODE: Pool = Pool::new("encode", || 1);

/// Why a job did not give its result.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolError {
    /// [`MAX_WAITING`] jobs were waiting already.
    Full,
    /// It waited longer than [`MAX_WAIT`].
    Late,
    /// It panicked.
    Panicked,
    /// The pool is gone.
    Stopped,
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PoolError::Full => "the tokenizer queue is full",
            PoolError::Late => "the tokenizer queue was too slow",
            PoolError::Panicked => "tokenizer job panicked",
            PoolError::Stopped => "tokenizer pool stopped",
        })
    }
}

impl PoolError {
    /// The client's answer: busy (503, retry in a second) or the router's own failure.
    pub(crate) fn into_api_error(self) -> ApiError {
        match self {
            PoolError::Full | PoolError::Late => ApiError::tokenizer_busy(),
            other => ApiError::internal(format!("tokenizer task failed: {other}")),
        }
    }
}

/// A waiting job's place in its pool's count, given back when the job starts or is dropped.
struct Waiting(&'static AtomicUsize);

impl Waiting {
    /// A place while fewer than `limit` jobs wait in `count`.
    fn claim(count: &'static AtomicUsize, limit: usize) -> Option<Waiting> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .ok()
            .map(|_| Waiting(count))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// How many threads tokenize at once: one per core, at most four.
pub fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 4)
}

impl Pool {
    const fn new(name: &'static str, threads: fn() -> usize) -> Self {
        Pool {
            name,
            threads,
            queue: OnceLock::new(),
            waiting: AtomicUsize::new(0),
        }
    }

    fn queue(&self) -> &Mutex<Sender<Job>> {
        self.queue.get_or_init(|| {
            let (tx, rx) = channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..(self.threads)() {
                let rx = rx.clone();
                let name = self.name;
                let spawned = std::thread::Builder::new()
                    .name(format!("pdrouter-{name}-{i}"))
                    .spawn(move || serve(name, &rx));
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, pool = name, "cannot start a CPU pool thread");
                }
            }
            Mutex::new(tx)
        })
    }

    /// Runs `f` on this pool, refused while `max_waiting` jobs wait and dropped unrun once it
    /// waited `max_wait`.
    async fn run<T: Send + 'static>(
        &'static self,
        max_wait: std::time::Duration,
        max_waiting: usize,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, PoolError> {
        let place = Waiting::claim(&self.waiting, max_waiting).ok_or(PoolError::Full)?;
        let queued = tokio::time::Instant::now();
        let (tx, rx) = oneshot::channel();
        let job: Job = Box::new(move || {
            drop(place);
            // Nobody waits for the result any more (the client left): skip the work.
            if tx.is_closed() {
                return;
            }
            if queued.elapsed() >= max_wait {
                let _ = tx.send(Err(PoolError::Late));
                return;
            }
            let out = catch_unwind(AssertUnwindSafe(f)).map_err(|_| PoolError::Panicked);
            let _ = tx.send(out);
        });
        self.queue()
            .lock()
            .map_err(|_| PoolError::Stopped)?
            .send(job)
            .map_err(|_| PoolError::Stopped)?;
        rx.await.unwrap_or(Err(PoolError::Stopped))
    }
}

fn serve(name: &str, rx: &Mutex<Receiver<Job>>) {
    lower_priority(name);
    loop {
        // The lock is held only while taking a job, never while running one.
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        match job {
            Ok(job) => job(),
            Err(_) => return,
        }
    }
}

/// Moves the calling thread to `SCHED_IDLE`, or to nice [`NICE`] where that policy is
/// refused (on Linux policy and nice value belong to the thread, so the runtime's threads are
/// left be); `what` names the thread in the debug line logged if both are refused. Elsewhere
/// the thread keeps normal priority.
#[cfg(target_os = "linux")]
pub(crate) fn lower_priority(what: &str) {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id,
    };
    let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
    if set_thread_priority_and_policy(thread_native_id(), ThreadPriority::Min, idle).is_ok() {
        return;
    }
    let tid = rustix::thread::gettid();
    if let Err(e) = rustix::process::setpriority_process(Some(tid), NICE) {
        tracing::debug!(error = %e, thread = what, "thread keeps normal priority");
    }
}

#[cfg(not(target_os = "linux"))]
pub(crate) fn lower_priority(_what: &str) {}

/// Runs `f` on the tokenizing pool and waits for its result without blocking the runtime.
pub async fn run<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PoolError> {
    TOKENIZE.run(MAX_WAIT, MAX_WAITING, f).await
}

/// Runs `f`, an encoding, on the encoding pool's thread (idle priority, as the tokenizing
/// threads), with the same bounds.
pub async fn encode<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PoolError> {
    ENCODE.run(MAX_WAIT, MAX_WAITING, f).await
}

/// [`run`] on the tokenizing pool with other bounds (tests use small ones: the pool is
/// shared by every test of the process).
#[cfg(test)]
async fn run_within<T: Send + 'static>(
    max_wait: std::time::Duration,
    max_waiting: usize,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, PoolError> {
    TOKENIZE.run(max_wait, max_waiting, f).await
}

/// Runs `f` inline for an input of up to `inline_bytes`, on these threads for a larger one
/// (`size` in bytes of what `f` reads: a request body, or the text it tokenizes). The bound is
/// the caller's: what `f` costs per byte (a tokenizer's [`Tokenizer::offload_threshold`],
/// body parsing's own).
///
/// [`Tokenizer::offload_threshold`]: pdrouter_tokenizer::Tokenizer::offload_threshold
pub(crate) async fn offload<T: Send + 'static>(
    inline_bytes: usize,
    size: usize,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    if size <= inline_bytes {
        return Ok(f());
    }
    run(f).await.map_err(PoolError::into_api_error)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    type Held = std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), PoolError>>>>;

    /// Every thread held by a gate (a message on the sender, one per thread, lets one go),
    /// so the next job waits in the queue; the gates' futures are returned, to be awaited.
    async fn hold_every_thread() -> (std::sync::mpsc::Sender<()>, Vec<Held>) {
        let (open, gate) = std::sync::mpsc::channel::<()>();
        let gate = Arc::new(Mutex::new(gate));
        let mut gates: Vec<Held> = (0..threads())
            .map(|_| {
                let gate = gate.clone();
                Box::pin(run(move || {
                    let _ = gate.lock().map(|g| g.recv());
                })) as Held
            })
            .collect();
        // Each first poll queues its gate, in order, before any later job.
        for g in &mut gates {
            assert!(futures_util::poll!(g.as_mut()).is_pending());
        }
        (open, gates)
    }

    /// A job whose caller left while it waited in the queue never runs.
    #[tokio::test]
    async fn a_job_whose_caller_left_before_it_started_is_skipped() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (open, gates) = hold_every_thread().await;
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let mut left = Box::pin(run(move || flag.store(true, Ordering::SeqCst)));
        // Queued (the first poll sends it), then abandoned by its caller.
        assert!(futures_util::poll!(left.as_mut()).is_pending());
        drop(left);
        for _ in 0..threads() {
            open.send(()).unwrap();
        }
        for g in gates {
            g.await.unwrap();
        }
        // Jobs queued after it have run, so it has been taken from the queue.
        for _ in 0..threads() {
            run(|| ()).await.unwrap();
        }
        assert!(!ran.load(Ordering::SeqCst), "the abandoned job ran");
    }

    #[tokio::test]
    async fn runs_jobs_and_reports_a_panic_without_losing_a_thread() {
        assert_eq!(run(|| 2 + 2).await.unwrap(), 4);
        for _ in 0..threads() + 1 {
            let err = run(|| -> u32 { panic!("boom") }).await.unwrap_err();
            assert_eq!(err, PoolError::Panicked);
        }
        // Every thread has survived a panic and still serves.
        let all: Vec<_> = (0..8).map(|i| run(move || i * 10)).collect();
        let mut got = Vec::new();
        for f in all {
            got.push(f.await.unwrap());
        }
        assert_eq!(got, (0..8).map(|i| i * 10).collect::<Vec<_>>());
    }

    /// With every thread held, a job that waited past its deadline is dropped unrun and
    /// answered Late; the bound on waiting jobs refuses the one past it at once.
    #[tokio::test]
    async fn a_late_job_is_dropped_and_a_full_queue_refuses_at_once() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (open, gates) = hold_every_thread().await;
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let late = tokio::spawn(run_within(
            std::time::Duration::ZERO,
            MAX_WAITING,
            move || flag.store(true, Ordering::SeqCst),
        ));
        // A small bound (other tests share the pool, whose own bound they must not meet):
        // filled, the next job is refused without waiting.
        const LIMIT: usize = 4;
        let mut fillers = Vec::new();
        loop {
            let mut f = Box::pin(run_within(MAX_WAIT, LIMIT, || ()));
            match futures_util::poll!(f.as_mut()) {
                std::task::Poll::Ready(r) => {
                    assert_eq!(r, Err(PoolError::Full));
                    break;
                }
                std::task::Poll::Pending => fillers.push(f),
            }
            assert!(fillers.len() <= LIMIT, "the queue has no bound");
        }
        for _ in 0..threads() {
            open.send(()).unwrap();
        }
        for g in gates {
            g.await.unwrap();
        }
        assert_eq!(late.await.unwrap(), Err(PoolError::Late));
        assert!(!ran.load(Ordering::SeqCst), "the late job ran");
        for f in fillers {
            f.await.unwrap();
        }
    }

    /// Encoding has its own thread and queue: with every tokenizing thread held, an encoding
    /// still runs, at idle priority.
    #[tokio::test]
    async fn encoding_runs_on_its_own_idle_thread_beside_busy_tokenizers() {
        let (open, gates) = hold_every_thread().await;
        #[cfg(target_os = "linux")]
        let probe = || {
            (
                std::thread::current().name().map(str::to_owned),
                own_priority(),
            )
        };
        #[cfg(not(target_os = "linux"))]
        let probe = || (std::thread::current().name().map(str::to_owned), ());
        let (name, _lowered) = encode(probe).await.unwrap();
        assert_eq!(name.as_deref(), Some("pdrouter-encode-0"));
        #[cfg(target_os = "linux")]
        assert_lowered_beside_caller(_lowered);
        for _ in 0..threads() {
            open.send(()).unwrap();
        }
        for g in gates {
            g.await.unwrap();
        }
    }

    /// Inputs up to the bound run where the caller runs, larger ones on a pool thread.
    #[tokio::test]
    async fn offload_runs_small_inputs_inline_and_large_ones_on_the_pool() {
        let here = std::thread::current().id();
        let on = |size| offload(100, size, || std::thread::current().id());
        assert_eq!(on(100).await.unwrap(), here);
        assert_ne!(on(101).await.unwrap(), here);
        let bound = pdrouter_tokenizer::OFFLOAD_THRESHOLD_BYTES;
        let default = |size| offload(bound, size, || std::thread::current().id());
        assert_eq!(default(bound).await.unwrap(), here);
        assert_ne!(default(bound + 1).await.unwrap(), here);
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn pool_threads_run_at_idle_priority() {
        let lowered = run(own_priority).await.unwrap();
        assert_lowered_beside_caller(lowered);
    }

    /// The calling thread's scheduling policy and nice value.
    #[cfg(target_os = "linux")]
    pub(crate) fn own_priority() -> (thread_priority::ThreadSchedulePolicy, i32) {
        let policy = thread_priority::thread_schedule_policy().unwrap();
        // PRIO_PROCESS of the calling thread id: on Linux the nice value is per thread.
        let tid = rustix::thread::gettid();
        let nice = rustix::process::getpriority_process(Some(tid)).unwrap();
        (policy, nice)
    }

    /// `lowered`, what a thread of ours gave itself, is `SCHED_IDLE`, or, where this kernel
    /// refuses that policy (some containers do), the nice-[`NICE`] fallback; the calling
    /// thread's, a runtime thread's, is untouched.
    #[cfg(target_os = "linux")]
    pub(crate) fn assert_lowered_beside_caller(
        lowered: (thread_priority::ThreadSchedulePolicy, i32),
    ) {
        use thread_priority::{
            NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
            set_thread_priority_and_policy, thread_native_id, thread_schedule_policy,
        };
        let idle = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Idle);
        let other = ThreadSchedulePolicy::Normal(NormalThreadSchedulePolicy::Other);
        let idle_allowed = std::thread::spawn(move || {
            set_thread_priority_and_policy(thread_native_id(), ThreadPriority::Min, idle).is_ok()
        })
        .join()
        .unwrap();
        if idle_allowed {
            assert_eq!(lowered.0, idle);
        } else {
            eprintln!("SCHED_IDLE is refused here: checking the nice {NICE} fallback instead");
            assert_eq!(lowered, (other, NICE));
        }
        assert_eq!(thread_schedule_policy().unwrap(), other);
    }
}
