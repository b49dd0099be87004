//! The thread that sends long prompts to gRPC workers.
//!
//! A 32k-token prompt is a few hundred kilobytes per leg: encoding it and writing it to the
//! worker's connection holds a thread for about a millisecond, and on the router's async
//! workers that is a millisecond every small request arriving meanwhile waits. So the bulk
//! lane's connections (see the client's module) are driven by their own single-threaded
//! runtime on this thread: their connection tasks, and with them the encoding and the socket
//! writes of long prompts, run here. The thread lowers its own priority when it starts, as the
//! tokenizer threads do (see [`crate::cpu_pool::lower_priority`]: `SCHED_IDLE` on Linux). A
//! thread at nice 10 was not enough: the kernel lets a running thread finish its time slice
//! before a woken one of the same policy preempts it, so a socket-woken async worker still
//! waited up to a write's length behind this one. An idle-policy thread is preempted at once,
//! and still gets a small share of a saturated CPU, so long prompts are delayed, never
//! starved.
//!
//! Invariants:
//! - One thread, started on first use, living as long as the process.
//! - If it cannot be started, tasks run on the caller's runtime, as on any other channel.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle};

/// Prompts larger than this (text plus token ids, in bytes) go on the bulk lane.
pub const BULK_PROMPT_BYTES: usize = 64 << 10;

/// A task the bulk lane's channels spawn (their connection and request-body tasks).
type Task = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Spawns the tasks of a channel onto the bulk thread's runtime.
#[derive(Debug, Clone, Copy, Default)]
pub struct BulkExecutor;

impl hyper::rt::Executor<Task> for BulkExecutor {
    fn execute(&self, task: Task) {
        match runtime() {
            Some(h) => {
                h.spawn(task);
            }
            None => {
                tokio::spawn(task);
            }
        }
    }
}

/// The bulk thread's runtime, started on first use (`None` if it could not be).
fn runtime() -> Option<&'static Handle> {
    static HANDLE: OnceLock<Option<Handle>> = OnceLock::new();
    HANDLE.get_or_init(start).as_ref()
}

fn start() -> Option<Handle> {
    let rt = match Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the bulk gRPC runtime");
            return None;
        }
    };
    let handle = rt.handle().clone();
    let spawned = std::thread::Builder::new()
        .name("pdrouter-bulk".into())
        .spawn(move || {
            crate::cpu_pool::lower_priority("bulk gRPC");
            rt.block_on(std::future::pending::<()>());
        });
    match spawned {
        Ok(_) => Some(handle),
        Err(e) => {
            tracing::warn!(error = %e, "cannot start the bulk gRPC thread");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_run_on_the_bulk_thread_at_idle_priority() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        hyper::rt::Executor::execute(
            &BulkExecutor,
            Box::pin(async move {
                let name = std::thread::current().name().map(str::to_owned);
                #[cfg(target_os = "linux")]
                let policy = crate::cpu_pool::tests::own_priority();
                #[cfg(not(target_os = "linux"))]
                let policy = ();
                let _ = tx.send((name, policy));
            }),
        );
        let (name, _policy) = rx.await.unwrap();
        assert_eq!(name.as_deref(), Some("pdrouter-bulk"));
        #[cfg(target_os = "linux")]
        crate::cpu_pool::tests::assert_lowered_beside_caller(_policy);
    }
}
