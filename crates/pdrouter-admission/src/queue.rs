//! The wait list: waiters in arrival order, O(1) push and O(1) removal from anywhere.
//!
//! A slab of nodes threaded on an intrusive doubly-linked list (indices, not pointers). A
//! waiter is named by a [`WaiterId`] (index + generation), so a stale id (the waiter was
//! already granted or removed) is detected and ignored. Walking visits live waiters only, so
//! tombstones never accumulate behind a long-lived head.

use std::cell::Cell;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::ledger::Slot;
use crate::permit::Permit;
use crate::selector::{Ranking, Selector};

const NIL: u32 = u32::MAX;

/// Outcome of one rank-and-reserve step.
pub(crate) enum Reserve<C> {
    /// The slot was reserved for this choice (not yet committed).
    Reserved(Arc<Slot>, C),
    /// Matching workers exist but none could be reserved.
    Full,
    /// No healthy matching worker.
    Unavailable,
}

/// Filtering, policy ranking and reservation as one step: reserves the first candidate (in rank
/// order) that still has room. `interest` accumulates the bits of every slot asked about.
pub(crate) fn rank_reserve<S: Selector>(
    selector: &mut S,
    limit: u32,
    interest: &Cell<u64>,
) -> Reserve<S::Choice> {
    let has_room = |slot: &Slot| {
        interest.set(interest.get() | slot.bit);
        slot.inflight() < limit
    };
    match selector.rank(&has_room) {
        Ranking::Unavailable => Reserve::Unavailable,
        Ranking::Candidates(candidates) => {
            for (slot, choice) in candidates {
                // A selector may return a slot without asking about it; it still interests us.
                interest.set(interest.get() | slot.bit);
                if slot.try_reserve(limit) {
                    return Reserve::Reserved(slot, choice);
                }
            }
            Reserve::Full
        }
    }
}

/// A type-erased waiting request: its selector and the channel its grant goes through.
pub(crate) trait Waiter: Send {
    /// Rank and reserve; on success commit the choice (kept for [`Waiter::grant`]) and return the
    /// reserved slot. Called with the queue lock held.
    fn try_reserve(&mut self, limit: u32, interest: &Cell<u64>) -> Option<Arc<Slot>>;
    /// Hands the permit to the waiting caller. Called outside the lock. Gives the permit back if
    /// the caller is gone.
    fn grant(self: Box<Self>, permit: Permit, waited: Duration) -> Result<(), Permit>;
}

/// What a waiting caller receives.
pub(crate) struct Grant<C> {
    pub(crate) choice: C,
    pub(crate) permit: Permit,
    pub(crate) waited: Duration,
}

pub(crate) struct TypedWaiter<S: Selector> {
    selector: S,
    choice: Option<S::Choice>,
    tx: oneshot::Sender<Grant<S::Choice>>,
}

impl<S: Selector> TypedWaiter<S> {
    pub(crate) fn new(selector: S, tx: oneshot::Sender<Grant<S::Choice>>) -> Self {
        TypedWaiter {
            selector,
            choice: None,
            tx,
        }
    }
}

impl<S: Selector> Waiter for TypedWaiter<S> {
    fn try_reserve(&mut self, limit: u32, interest: &Cell<u64>) -> Option<Arc<Slot>> {
        match rank_reserve(&mut self.selector, limit, interest) {
            Reserve::Reserved(slot, choice) => {
                self.selector.commit(&choice);
                self.choice = Some(choice);
                Some(slot)
            }
            Reserve::Full | Reserve::Unavailable => None,
        }
    }

    fn grant(self: Box<Self>, permit: Permit, waited: Duration) -> Result<(), Permit> {
        let TypedWaiter {
            selector,
            choice,
            tx,
        } = *self;
        drop(selector);
        let choice = choice.expect("grant follows a successful try_reserve");
        tx.send(Grant {
            choice,
            permit,
            waited,
        })
        .map_err(|grant| grant.permit)
    }
}

/// One waiting request.
pub(crate) struct Entry {
    pub(crate) waiter: Box<dyn Waiter>,
    pub(crate) enqueued_at: Instant,
    /// Bits of the slots its last ranking asked about (see [`Selector::rank`]).
    pub(crate) interest: u64,
}

/// Names a waiter in the [`WaitQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaiterId {
    index: u32,
    generation: u64,
}

/// The part of a node a dispatch walk reads for every waiter, kept dense (16 bytes) so that
/// skipping thousands of uninterested waiters stays within cache.
#[derive(Clone, Copy)]
struct Link {
    prev: u32,
    /// Next in the list when occupied, next free node when vacant.
    next: u32,
    interest: u64,
}

/// The rest of a node.
struct Body {
    /// Queue-wide push number of the current occupant (unique, never reused).
    generation: u64,
    entry: Option<(Box<dyn Waiter>, Instant)>,
}

/// Waiters in arrival order.
pub(crate) struct WaitQueue {
    links: Vec<Link>,
    bodies: Vec<Body>,
    free: u32,
    head: u32,
    tail: u32,
    len: usize,
    next_generation: u64,
}

impl WaitQueue {
    pub(crate) fn new() -> Self {
        WaitQueue {
            links: Vec::new(),
            bodies: Vec::new(),
            free: NIL,
            head: NIL,
            tail: NIL,
            len: 0,
            next_generation: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Appends a waiter (the newest).
    pub(crate) fn push(&mut self, entry: Entry) -> WaiterId {
        let index = if self.free != NIL {
            let index = self.free;
            self.free = self.links[index as usize].next;
            index
        } else {
            let index = u32::try_from(self.links.len()).expect("fewer than 2^32 waiters");
            self.links.push(Link {
                prev: NIL,
                next: NIL,
                interest: 0,
            });
            self.bodies.push(Body {
                generation: 0,
                entry: None,
            });
            index
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        let tail = self.tail;
        self.links[index as usize] = Link {
            prev: tail,
            next: NIL,
            interest: entry.interest,
        };
        self.bodies[index as usize] = Body {
            generation,
            entry: Some((entry.waiter, entry.enqueued_at)),
        };
        if tail == NIL {
            self.head = index;
        } else {
            self.links[tail as usize].next = index;
        }
        self.tail = index;
        self.len += 1;
        WaiterId { index, generation }
    }

    /// Removes the waiter if it is still there.
    pub(crate) fn remove(&mut self, id: WaiterId) -> Option<Entry> {
        let body = self.bodies.get(id.index as usize)?;
        if body.generation != id.generation || body.entry.is_none() {
            return None;
        }
        Some(self.remove_at(id.index))
    }

    /// The oldest waiter's position.
    pub(crate) fn first(&self) -> Option<u32> {
        (self.head != NIL).then_some(self.head)
    }

    /// The position after `index` (which must be occupied).
    pub(crate) fn next(&self, index: u32) -> Option<u32> {
        let next = self.links[index as usize].next;
        (next != NIL).then_some(next)
    }

    /// The interest bits of the waiter at an occupied position.
    pub(crate) fn interest(&self, index: u32) -> u64 {
        self.links[index as usize].interest
    }

    /// Re-ranks the waiter at an occupied position (see [`Waiter::try_reserve`]) and records the
    /// slots it asked about.
    pub(crate) fn try_reserve(&mut self, index: u32, limit: u32) -> Option<Arc<Slot>> {
        let (waiter, _) = self.bodies[index as usize]
            .entry
            .as_mut()
            .expect("position is occupied");
        let interest = Cell::new(0);
        let reserved = waiter.try_reserve(limit, &interest);
        self.links[index as usize].interest = interest.get();
        reserved
    }

    /// Unlinks the waiter at an occupied position.
    pub(crate) fn remove_at(&mut self, index: u32) -> Entry {
        let (waiter, enqueued_at) = self.bodies[index as usize]
            .entry
            .take()
            .expect("position is occupied");
        let link = &mut self.links[index as usize];
        let (prev, next, interest) = (link.prev, link.next, link.interest);
        link.prev = NIL;
        link.next = self.free;
        self.free = index;
        if prev == NIL {
            self.head = next;
        } else {
            self.links[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.links[next as usize].prev = prev;
        }
        self.len -= 1;
        if self.len == 0 && self.links.len() > 1024 {
            // Give back the memory of a burst. Generations are queue-wide and never reused, so
            // an old id cannot match a node created later.
            self.links = Vec::new();
            self.bodies = Vec::new();
            self.free = NIL;
        }
        Entry {
            waiter,
            enqueued_at,
            interest,
        }
    }
}

impl fmt::Debug for WaitQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitQueue").field("len", &self.len).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Dummy;
    impl Waiter for Dummy {
        fn try_reserve(&mut self, _: u32, _: &Cell<u64>) -> Option<Arc<Slot>> {
            None
        }
        fn grant(self: Box<Self>, _: Permit, _: Duration) -> Result<(), Permit> {
            Ok(())
        }
    }

    fn entry(tag: u64) -> Entry {
        Entry {
            waiter: Box::new(Dummy),
            enqueued_at: Instant::now(),
            interest: tag,
        }
    }

    fn tags(q: &WaitQueue) -> Vec<u64> {
        let mut out = Vec::new();
        let mut cur = q.first();
        while let Some(i) = cur {
            out.push(q.interest(i));
            cur = q.next(i);
        }
        out
    }

    #[test]
    fn push_remove_keeps_order_and_rejects_stale_ids() {
        let mut q = WaitQueue::new();
        let ids: Vec<_> = (0..5).map(|t| q.push(entry(t))).collect();
        assert_eq!(tags(&q), [0, 1, 2, 3, 4]);
        assert!(q.remove(ids[2]).is_some());
        assert!(q.remove(ids[2]).is_none(), "stale id");
        assert!(q.remove(ids[0]).is_some());
        assert!(q.remove(ids[4]).is_some());
        assert_eq!(tags(&q), [1, 3]);
        // Reused nodes get new generations; old ids do not match them.
        let new = q.push(entry(9));
        assert!(q.remove(ids[4]).is_none());
        assert_eq!(tags(&q), [1, 3, 9]);
        assert_eq!(q.len(), 3);
        for id in [ids[1], ids[3], new] {
            assert!(q.remove(id).is_some());
        }
        assert_eq!(q.len(), 0);
        assert!(q.first().is_none());
    }
}
