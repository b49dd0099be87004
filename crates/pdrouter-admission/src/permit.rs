//! The RAII reservation ([`Permit`]) and what an admitted request gets ([`Admitted`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::controller::Inner;
use crate::ledger::Slot;
use crate::priority::Priority;

/// A successful admission.
#[derive(Debug)]
pub struct Admitted<C> {
    /// The selector's choice for the reserved worker.
    pub choice: C,
    /// The reservation; dropping it releases the slot.
    pub permit: Permit,
    /// How long the request waited in the queue ([`Duration::ZERO`] if it did not wait).
    pub waited: Duration,
}

/// One reserved unit of a worker's Prefill slot (with the request's prompt tokens), released
/// exactly once, when it is dropped.
///
/// The router moves it into whatever lives until the Prefill phase ends (the Prefill response
/// body), and shares it between all backend sub-requests of one client request by wrapping it in
/// an `Arc<Permit>`: the slot is released when the last clone drops, so a batch holds one slot.
/// Releasing hands the unit directly to the oldest waiter that can use it.
#[must_use = "dropping the permit releases the slot at once"]
pub struct Permit {
    slot: Arc<Slot>,
    inner: Arc<Inner>,
    tokens: u32,
    priority: Priority,
    armed: bool,
}

impl Permit {
    /// Counts the reservation in its priority's in-flight total, which its release undoes.
    pub(crate) fn new(slot: Arc<Slot>, inner: Arc<Inner>, tokens: u32, priority: Priority) -> Self {
        inner.held(priority);
        Permit {
            slot,
            inner,
            tokens,
            priority,
            armed: true,
        }
    }

    /// The reserved worker's slot.
    pub fn slot(&self) -> &Arc<Slot> {
        &self.slot
    }

    /// The prompt tokens this reservation holds on the slot.
    pub fn tokens(&self) -> u32 {
        self.tokens
    }

    /// The priority class the request was admitted under.
    pub fn priority(&self) -> Priority {
        self.priority
    }

    /// Takes the reservation out without releasing it (the caller releases it).
    pub(crate) fn disarm(mut self) -> (Arc<Slot>, u32, Priority) {
        self.armed = false;
        (Arc::clone(&self.slot), self.tokens, self.priority)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.armed {
            self.armed = false;
            self.inner.release(&self.slot, self.tokens, self.priority);
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("key", &self.slot.key())
            .field("tokens", &self.tokens)
            .field("priority", &self.priority)
            .field("inflight", &self.slot.inflight())
            .finish()
    }
}
