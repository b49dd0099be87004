//! The thread that relays long prompts to gRPC workers.
//!
//! A 32k-token prompt is a few hundred kilobytes per leg: writing it to the worker's
//! connection holds a thread for a fraction of a millisecond, and on the router's async
//! workers that is time every small request arriving meanwhile waits. So the bulk lanes'
//! connections (see [`super::lane`]) are made and driven by their own single-threaded runtime
//! on this thread: their connection tasks, and with them the socket writes of long prompts and
//! the reads of their answers, run here. Encoding the message, the CPU-heavy part, is done
//! before, on the idle-priority encoding thread (see [`crate::cpu_pool::encode`]); this
//! thread keeps normal priority, because it relays answers as well: at idle priority a
//! saturated CPU could hold a long prompt's token stream back indefinitely and let the
//! connection miss its keep-alive acknowledgements, dropping every stream on it.
//!
//! Invariants:
//! - One thread, started on first use, living as long as the process, at the priority the
//!   process was given.
//! - If it cannot be started, a bulk lane runs on the caller's runtime, as the shared lane does.

use std::sync::OnceLock;

use tokio::runtime::{Builder, Handle};

/// Prompts larger than this (text plus token ids, in bytes) go on the bulk lane.
pub const BULK_PROMPT_BYTES: usize = 64 << 10;

/// The bulk thread's runtime, started on first use (`None` if it could not be: the lane then
/// runs on the caller's runtime).
pub(super) fn handle() -> Option<&'static Handle> {
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
        .spawn(move || rt.block_on(std::future::pending::<()>()));
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

    /// The bulk thread relays at the caller's priority: a lowered one could starve streams.
    #[tokio::test]
    async fn tasks_run_on_the_bulk_thread_at_normal_priority() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        handle().expect("the bulk thread starts").spawn(async move {
            let name = std::thread::current().name().map(str::to_owned);
            #[cfg(target_os = "linux")]
            let policy = crate::cpu_pool::tests::own_priority();
            #[cfg(not(target_os = "linux"))]
            let policy = ();
            let _ = tx.send((name, policy));
        });
        let (name, _policy) = rx.await.unwrap();
        assert_eq!(name.as_deref(), Some("pdrouter-bulk"));
        #[cfg(target_os = "linux")]
        assert_eq!(_policy, crate::cpu_pool::tests::own_priority());
    }
}
