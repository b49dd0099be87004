//! In-flight generations by request id, so `Abort` can stop them.
//!
//! Invariants: an entry lives while at least one generation with that id
//! holds its [`AbortHandle`]; an `Abort` wakes every such generation and
//! removes the entry, so a later request reusing the id starts un-aborted.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

#[derive(Debug, Default)]
pub(crate) struct Aborts {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    /// Generation of the entry (tells a replaced entry apart) and its signal.
    by_id: HashMap<String, (u64, watch::Sender<bool>)>,
    next_generation: u64,
}

impl Aborts {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a generation with `request_id` until the handle is dropped.
    pub(crate) fn register(self: &Arc<Self>, request_id: &str) -> AbortHandle {
        let mut inner = self.lock();
        let next = inner.next_generation;
        let (generation, sender) = inner
            .by_id
            .entry(request_id.to_owned())
            .or_insert_with(|| (next, watch::Sender::new(false)));
        let (generation, rx) = (*generation, sender.subscribe());
        if generation == next {
            inner.next_generation += 1;
        }
        AbortHandle {
            aborts: Arc::clone(self),
            request_id: request_id.to_owned(),
            generation,
            rx,
        }
    }

    /// Aborts every running generation with `request_id`; `false` if none.
    pub(crate) fn abort(&self, request_id: &str) -> bool {
        match self.lock().by_id.remove(request_id) {
            Some((_, sender)) => {
                sender.send_replace(true);
                true
            }
            None => false,
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().by_id.len()
    }
}

/// One generation's registration; unregisters on drop.
#[derive(Debug)]
pub(crate) struct AbortHandle {
    aborts: Arc<Aborts>,
    request_id: String,
    generation: u64,
    rx: watch::Receiver<bool>,
}

impl AbortHandle {
    /// Resolves once the generation is aborted (never, otherwise).
    /// Cancel-safe.
    pub(crate) async fn aborted(&mut self) {
        // The value is set before the sender is dropped, so a closed channel
        // without `true` means the entry went away without an abort.
        if self.rx.wait_for(|aborted| *aborted).await.is_err() {
            std::future::pending::<()>().await;
        }
    }

    /// Whether an abort has arrived.
    pub(crate) fn is_aborted(&self) -> bool {
        *self.rx.borrow()
    }
}

impl Drop for AbortHandle {
    fn drop(&mut self) {
        let mut inner = self.aborts.lock();
        let last = inner.by_id.get(&self.request_id).is_some_and(|(g, s)| {
            // Our own receiver still counts until `self.rx` is dropped.
            *g == self.generation && s.receiver_count() <= 1
        });
        if last {
            inner.by_id.remove(&self.request_id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn abort_wakes_every_holder_and_clears_the_id() {
        let aborts = Arc::new(Aborts::default());
        let mut a = aborts.register("r");
        let mut b = aborts.register("r");
        let other = aborts.register("s");
        assert!(aborts.abort("r"));
        a.aborted().await;
        b.aborted().await;
        assert!(!other.is_aborted());
        // The id is free again: a new request is not aborted.
        let fresh = aborts.register("r");
        assert!(!fresh.is_aborted());
        drop((a, b));
        assert_eq!(aborts.len(), 2);
        drop((fresh, other));
        assert_eq!(aborts.len(), 0);
        assert!(!aborts.abort("r"));
    }

    #[tokio::test]
    async fn dropping_the_last_holder_unregisters() {
        let aborts = Arc::new(Aborts::default());
        let a = aborts.register("r");
        let b = aborts.register("r");
        drop(a);
        assert_eq!(aborts.len(), 1);
        drop(b);
        assert_eq!(aborts.len(), 0);
    }
}
