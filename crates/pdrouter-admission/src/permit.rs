//! The RAII reservation ([`Permit`]) and what an admitted request gets ([`Admitted`]).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::ledger::Slot;
use crate::priority::Priority;
use crate::service::Hold;

/// What a permit's unit goes back to: the controller that granted it. A trait, so that the
/// controller (which creates permits and hands them to waiters) depends on this module and
/// not the other way round.
pub(crate) trait Release: Send + Sync {
    /// A permit of `priority` was created; its release undoes this.
    fn held(&self, priority: Priority);
    /// Releases one unit of `slot` holding `tokens` (the permit's drop).
    fn release(self: Arc<Self>, slot: &Arc<Slot>, tokens: u32, priority: Priority);
}

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
///
/// Its life, from admission to release, is one observed Prefill duration of its worker (what
/// `Retry-After` is estimated from), once it has reached its caller.
#[must_use = "dropping the permit releases the slot at once"]
pub struct Permit {
    slot: Arc<Slot>,
    /// Where the unit goes back; `None` once released or [disarmed](Permit::disarm).
    owner: Option<Arc<dyn Release>>,
    tokens: u32,
    priority: Priority,
    /// Its admission, in the slot's in-flight set.
    hold: Hold,
    /// It reached its caller, so its release is an observed hold.
    delivered: bool,
}

impl Permit {
    /// Counts the reservation in its priority's in-flight total, which its release undoes, and
    /// in its slot's in-flight set as admitted at `now`. `delivered`: it is handed to its caller
    /// now (else [`delivered`](Permit::delivered) says when).
    pub(crate) fn new(
        slot: Arc<Slot>,
        owner: Arc<dyn Release>,
        tokens: u32,
        priority: Priority,
        now: Instant,
        delivered: bool,
    ) -> Self {
        owner.held(priority);
        let hold = slot.service.start(now, slot.inflight());
        Permit {
            slot,
            owner: Some(owner),
            tokens,
            priority,
            hold,
            delivered,
        }
    }

    /// The permit reached its caller: its release will be an observed hold.
    pub(crate) fn delivered(&mut self) {
        self.delivered = true;
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
    /// Its hold is not observed: nobody received it.
    pub(crate) fn disarm(mut self) -> (Arc<Slot>, u32, Priority) {
        self.owner = None;
        self.slot.service.end(self.hold, None);
        (Arc::clone(&self.slot), self.tokens, self.priority)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(owner) = self.owner.take() {
            // Out of the in-flight set before the unit is handed on.
            let released = self.delivered.then(Instant::now);
            self.slot.service.end(self.hold, released);
            owner.release(&self.slot, self.tokens, self.priority);
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
