//! Drives a worker connection's task so that the streams many callers open at once leave in
//! one write.
//!
//! h2 writes whatever its streams have queued each time the connection's task is polled, and
//! a caller that opens a stream wakes that task. Tokio runs a task woken by the running task
//! right after it (its LIFO slot), so under load every call's few hundred bytes went out in
//! a `writev` of their own: on loopback, where a write also does the receiver's TCP work,
//! that was the larger part of the router's kernel time per gRPC request. Here a wake that
//! comes from another task (a caller queueing a stream, a call dropped) lets every task that
//! is ready run first, and the connection is polled once after them; a wake from the I/O
//! driver (the worker's answer arrived, the socket is writable again) or from another thread
//! is acted on at once, so answers are read as soon as they arrive.
//!
//! Invariants:
//! - No wake is lost: a wake that arrives while a deferred poll is due is folded into that
//!   poll (the flag that folds it is cleared before the connection is polled, so the poll
//!   sees what the wake announced).
//! - A deferred poll waits for the runtime to run out of ready tasks or to look at its I/O
//!   driver (tokio's `yield_now`), never for a timer: at concurrency 1 it costs one empty
//!   poll of the driver.
//! - The wrapper holds no buffer of its own: what is written, and when the socket is ready,
//!   stays h2's.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures_util::task::AtomicWaker;

/// What the connection's wakers share with the task that drives it.
#[derive(Default)]
struct Shared {
    /// The driving task's own waker.
    task: AtomicWaker,
    /// A wake came from a task (not the I/O driver) since the connection was last polled.
    from_task: AtomicBool,
    /// A deferred poll is due: wakes until then need not reach the task.
    deferred: AtomicBool,
}

impl Wake for Shared {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.deferred.load(Ordering::Acquire) {
            return;
        }
        if tokio::task::try_id().is_some() {
            self.from_task.store(true, Ordering::Release);
        }
        self.task.wake();
    }
}

/// Runs `conn` to completion, gathering the wakes of callers that are ready at once into
/// one poll (see the module's docs).
pub(super) async fn drive<F: Future + Unpin>(mut conn: F) -> F::Output {
    let shared = Arc::new(Shared::default());
    let waker = Waker::from(shared.clone());
    loop {
        let mut polled = false;
        let done = poll_fn(|cx| {
            if polled {
                // Woken since the connection was polled: decide below whether to wait.
                return Poll::Ready(None);
            }
            polled = true;
            shared.task.register(cx.waker());
            shared.deferred.store(false, Ordering::Release);
            match Pin::new(&mut conn).poll(&mut Context::from_waker(&waker)) {
                Poll::Ready(out) => Poll::Ready(Some(out)),
                Poll::Pending => Poll::Pending,
            }
        })
        .await;
        if let Some(out) = done {
            return out;
        }
        if shared.from_task.swap(false, Ordering::AcqRel) {
            shared.deferred.store(true, Ordering::Release);
            tokio::task::yield_now().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use parking_lot::Mutex;

    use super::*;

    /// A connection stand-in: counts its polls, and ends once `until` things are queued.
    struct Counting {
        polls: Arc<AtomicUsize>,
        callers: Callers,
        until: usize,
        /// A poll that finds exactly one queued has another thread queue one more and wake
        /// after the count was read: a wake that lands while the connection is polled.
        racing: bool,
    }

    impl Future for Counting {
        type Output = usize;
        fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls.fetch_add(1, Ordering::Relaxed);
            // The waker is stored before the count is read, as h2 registers before it looks
            // at its queues.
            *self.callers.waker.lock() = Some(cx.waker().clone());
            let queued = self.callers.queued.load(Ordering::Acquire);
            if queued >= self.until {
                return Poll::Ready(queued);
            }
            if self.racing && queued == 1 {
                let c = self.callers.clone();
                std::thread::spawn(move || c.queue()).join().unwrap();
            }
            Poll::Pending
        }
    }

    /// What a caller does to the connection: queue something and wake it.
    #[derive(Clone, Default)]
    struct Callers {
        queued: Arc<AtomicUsize>,
        waker: Arc<Mutex<Option<Waker>>>,
    }

    impl Callers {
        fn queue(&self) {
            self.queued.fetch_add(1, Ordering::AcqRel);
            if let Some(w) = self.waker.lock().as_ref() {
                w.wake_by_ref();
            }
        }
    }

    fn counting(until: usize) -> (Counting, Arc<AtomicUsize>, Callers) {
        let polls = Arc::new(AtomicUsize::new(0));
        let callers = Callers::default();
        let conn = Counting {
            polls: polls.clone(),
            callers: callers.clone(),
            until,
            racing: false,
        };
        (conn, polls, callers)
    }

    // A multi-thread runtime with one worker has the LIFO slot that made each caller's wake
    // run the connection at once; the tasks run on the worker, not on the test's thread.

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn callers_ready_together_are_served_by_one_poll() {
        let (conn, polls, callers) = counting(8);
        let (before, after, queued) = tokio::spawn(async move {
            let task = tokio::spawn(drive(conn));
            tokio::task::yield_now().await;
            let before = polls.load(Ordering::Relaxed);
            for _ in 0..8 {
                let c = callers.clone();
                tokio::spawn(async move { c.queue() });
            }
            let queued = task.await.unwrap();
            (before, polls.load(Ordering::Relaxed), queued)
        })
        .await
        .unwrap();
        assert_eq!(before, 1, "the connection is polled once when it starts");
        assert_eq!(queued, 8);
        assert_eq!(after - before, 1, "one poll served all eight callers");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_wake_from_outside_a_task_polls_at_once() {
        let (conn, polls, callers) = counting(3);
        let seen = tokio::spawn(async move {
            let task = tokio::spawn(drive(conn));
            tokio::task::yield_now().await;
            let mut seen = Vec::new();
            for _ in 0..3 {
                // Woken from a plain thread, as the I/O driver wakes it: no task is running.
                let c = callers.clone();
                std::thread::spawn(move || c.queue()).join().unwrap();
                // The connection runs before this task's deferred turn comes back.
                tokio::task::yield_now().await;
                seen.push(polls.load(Ordering::Relaxed));
            }
            assert_eq!(task.await.unwrap(), 3);
            seen
        })
        .await
        .unwrap();
        assert_eq!(
            seen,
            [2, 3, 4],
            "each wake polled the connection before the next"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn wakes_during_a_deferred_poll_are_seen_by_it() {
        // Callers keep queueing while a deferred poll is due; their wakes are folded into
        // it, and the last must still be seen or the connection would never end.
        for until in 1..=6 {
            let (conn, _polls, callers) = counting(until);
            let task = tokio::spawn(drive(conn));
            tokio::spawn(async move {
                for _ in 0..until {
                    callers.queue();
                    tokio::task::yield_now().await;
                }
            });
            assert_eq!(task.await.unwrap(), until);
        }
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_wake_while_the_connection_is_polled_is_not_lost() {
        // A caller's wake defers the poll; during that deferred poll another thread queues
        // and wakes after the connection looked. That wake must reach the task. (The paused
        // clock turns a lost wake into the timeout at once, instead of a hang.)
        let (mut conn, _polls, callers) = counting(2);
        conn.racing = true;
        let task = tokio::spawn(drive(conn));
        tokio::task::yield_now().await;
        tokio::spawn(async move { callers.queue() });
        let done = tokio::time::timeout(std::time::Duration::from_secs(60), task).await;
        assert_eq!(done.expect("a wake was lost").unwrap(), 2);
    }
}
