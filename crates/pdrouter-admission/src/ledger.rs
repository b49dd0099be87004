//! The slot ledger: one [`Slot`] (in-flight counter and its limits) per worker identity.
//!
//! The ledger maps a key to a `Weak<Slot>`. The entry lives exactly as long as the slot does:
//! the slot's `Drop` removes it. So the same key yields the same `Arc<Slot>` while anything (a
//! registry entry, a selector, a permit) still holds it, and a worker that is removed and
//! registered again keeps its in-flight count. (Removing the entry earlier, e.g. as soon as a
//! forgotten worker is idle, could hand out a second slot for the same key while a stale handle
//! to the first one can still be reserved, and the two together could exceed the limit.)

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::config::Limits;
use crate::observer::Observer;
use crate::service::Service;

type Map = Mutex<HashMap<Box<str>, Weak<Slot>>>;

/// The slot is registered (the normal state).
const LIVE: u8 = 0;
/// [`Ledger::forget`] was called; `slot_forgotten` fires once it is idle.
const FORGOTTEN: u8 = 1;
/// Forgotten and `slot_forgotten` has fired for the current idle period.
const REPORTED: u8 = 2;

/// `max_tokens` when the slot has no token budget.
const NO_BUDGET: u32 = u32::MAX;

/// The admission state of one worker identity: its key, its in-flight Prefill count, the
/// prompt tokens those requests hold, and the limits they are held to.
///
/// Obtained from [`Admission::slot`](crate::Admission::slot); selectors return it with each
/// candidate. The count and tokens are changed only by the controller, together (one atomic
/// word), never beyond the slot's limits as they were when the reservation was made. The limits
/// start as configured and change only through
/// [`Admission::set_limits`](crate::Admission::set_limits); lowering them never revokes a
/// reservation, it only stops new ones until the load is under the new limits.
pub struct Slot {
    /// Shared, so an observer can keep it (a metric label) without copying it.
    key: Arc<str>,
    /// `count << 32 | tokens`. Tokens fit in 32 bits: a reservation either fits a budget that
    /// is a `u32`, or is alone on the slot with at most `u32::MAX` tokens.
    load: AtomicU64,
    /// The count limit.
    max_count: AtomicU32,
    /// The token budget; [`NO_BUDGET`] for none.
    max_tokens: AtomicU32,
    /// One bit (slot number modulo 64) used as a cheap filter of waiters interested in the slot.
    pub(crate) bit: u64,
    state: AtomicU8,
    ledger: Weak<Map>,
    /// How long this worker's permits hold it, and since when the ones in flight have.
    pub(crate) service: Service,
}

impl Slot {
    /// The worker identity (URL, or URL@rank) this slot counts for.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The same, shared.
    pub fn shared_key(&self) -> &Arc<str> {
        &self.key
    }

    /// The number of admitted requests currently holding this slot.
    pub fn inflight(&self) -> u32 {
        split(self.load.load(SeqCst)).0
    }

    /// The prompt tokens the admitted requests on this slot hold.
    pub fn inflight_tokens(&self) -> u32 {
        split(self.load.load(SeqCst)).1
    }

    /// The most requests this slot admits at once (its current limit).
    pub fn limit(&self) -> u32 {
        self.max_count.load(SeqCst)
    }

    /// The prompt tokens this slot's requests may hold at once, if it has a token budget.
    pub fn token_limit(&self) -> Option<u32> {
        let budget = self.max_tokens.load(SeqCst);
        (budget != NO_BUDGET).then_some(budget)
    }

    /// The limits a reservation is checked against now. The two limits are read separately:
    /// a reservation racing with [`set_limits`](Slot::set_limits) sees the old or the new value
    /// of each, both of which were valid limits a moment ago.
    fn limits(&self) -> Limits {
        Limits {
            count: self.limit(),
            tokens: self.token_limit(),
        }
    }

    pub(crate) fn set_limits(&self, limits: Limits) {
        self.max_count.store(limits.count, SeqCst);
        // A budget of `u32::MAX` tokens could not refuse anything a 32-bit load holds anyway.
        self.max_tokens
            .store(limits.tokens.unwrap_or(NO_BUDGET), SeqCst);
    }

    /// Whether a request of `tokens` would fit now.
    pub(crate) fn has_room(&self, tokens: u32) -> bool {
        let (count, held) = split(self.load.load(SeqCst));
        self.limits().fits(count, held, tokens)
    }

    /// Whether not even a one-token request would fit now.
    pub(crate) fn is_full(&self) -> bool {
        let (count, held) = split(self.load.load(SeqCst));
        self.limits().full(count, held)
    }

    /// Reserves one request of `tokens` if it fits. Never exceeds the limits.
    pub(crate) fn try_reserve(&self, tokens: u32) -> bool {
        let limits = self.limits();
        let mut cur = self.load.load(SeqCst);
        loop {
            let (count, held) = split(cur);
            if !limits.fits(count, held, tokens) {
                return false;
            }
            let next = (u64::from(count + 1) << 32) | u64::from(held + tokens);
            match self.load.compare_exchange_weak(cur, next, SeqCst, SeqCst) {
                Ok(_) => return true,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Gives back one reservation of `tokens`.
    pub(crate) fn unreserve(&self, tokens: u32) {
        self.load.fetch_sub((1 << 32) | u64::from(tokens), SeqCst);
    }

    /// Whether the slot is in a forgotten state (the slow bookkeeping path is needed).
    pub(crate) fn is_forgotten(&self) -> bool {
        self.state.load(SeqCst) != LIVE
    }
}

impl fmt::Debug for Slot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Slot")
            .field("key", &self.key)
            .field("inflight", &self.inflight())
            .field("tokens", &self.inflight_tokens())
            .field("limit", &self.limit())
            .field("token_limit", &self.token_limit())
            .field("forgotten", &self.is_forgotten())
            .field("expected_hold", &self.service.expected())
            .finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        // Remove our own entry, unless the key was already given to a new slot.
        let Some(map) = self.ledger.upgrade() else {
            return;
        };
        let mut map = map.lock();
        if let Some(weak) = map.get(&*self.key)
            && std::ptr::eq(weak.as_ptr(), self)
        {
            map.remove(&*self.key);
        }
    }
}

/// `(count, tokens)` of a slot's load word.
fn split(load: u64) -> (u32, u32) {
    ((load >> 32) as u32, load as u32)
}

/// Key → slot map.
///
/// Lock order: the queue lock may be held while the ledger lock is taken (a slot dropped under
/// the queue lock removes its entry), never the reverse. No `Arc<Slot>` is dropped while the
/// ledger lock is held (that would re-enter it).
pub(crate) struct Ledger {
    map: Arc<Map>,
    next_id: AtomicU64,
    /// The limits a new slot starts with.
    initial: Limits,
}

impl Ledger {
    pub(crate) fn new(initial: Limits) -> Self {
        Ledger {
            map: Arc::new(Mutex::new(HashMap::new())),
            next_id: AtomicU64::new(0),
            initial,
        }
    }

    /// The slot for `key`: the existing one (with its current limits) if anything holds it,
    /// else a new idle one with the configured limits. A forgotten slot becomes live again.
    pub(crate) fn slot(&self, key: &str) -> Arc<Slot> {
        let mut map = self.map.lock();
        if let Some(slot) = map.get(key).and_then(Weak::upgrade) {
            slot.state.store(LIVE, SeqCst);
            return slot;
        }
        let id = self.next_id.fetch_add(1, SeqCst);
        let slot = Arc::new(Slot {
            key: key.into(),
            load: AtomicU64::new(0),
            max_count: AtomicU32::new(self.initial.count),
            max_tokens: AtomicU32::new(self.initial.tokens.unwrap_or(NO_BUDGET)),
            bit: 1 << (id % 64),
            state: AtomicU8::new(LIVE),
            ledger: Arc::downgrade(&self.map),
            service: Service::new(),
        });
        map.insert(key.into(), Arc::downgrade(&slot));
        slot
    }

    /// Marks `key` forgotten; fires `slot_forgotten` now if it is idle.
    pub(crate) fn forget(&self, key: &str, observer: &dyn Observer) {
        let (slot, fire) = {
            let map = self.map.lock();
            let Some(slot) = map.get(key).and_then(Weak::upgrade) else {
                drop(map);
                observer.slot_forgotten(key);
                return;
            };
            slot.state.store(FORGOTTEN, SeqCst);
            let fire = slot.inflight() == 0;
            if fire {
                slot.state.store(REPORTED, SeqCst);
            }
            (slot, fire)
        };
        if fire {
            observer.slot_forgotten(key);
        }
        drop(slot);
    }

    /// A forgotten slot was reserved again (stale selection): re-arm its idle report.
    pub(crate) fn reserved_forgotten(&self, slot: &Slot) {
        let _map = self.map.lock();
        let _ = slot
            .state
            .compare_exchange(REPORTED, FORGOTTEN, SeqCst, SeqCst);
    }

    /// A forgotten slot may have become idle: report it once.
    pub(crate) fn released_forgotten(&self, slot: &Slot, observer: &dyn Observer) {
        let fire = {
            let _map = self.map.lock();
            slot.inflight() == 0
                && slot
                    .state
                    .compare_exchange(FORGOTTEN, REPORTED, SeqCst, SeqCst)
                    .is_ok()
        };
        if fire {
            observer.slot_forgotten(slot.key());
        }
    }

    /// Live slots (collected under the lock, returned to be used and dropped outside it).
    pub(crate) fn live(&self) -> Vec<Arc<Slot>> {
        self.map.lock().values().filter_map(Weak::upgrade).collect()
    }

    /// Number of entries (live or not yet cleaned up).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().len()
    }
}

impl fmt::Debug for Ledger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ledger")
            .field("entries", &self.map.lock().len())
            .finish()
    }
}
