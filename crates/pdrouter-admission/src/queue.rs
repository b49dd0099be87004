//! The wait list: waiters grouped by wait class, each class in arrival order; O(1) push and
//! O(1) removal from anywhere, O(log classes) to find the oldest waiter of the next class.
//!
//! A slab of nodes, each threaded on an intrusive doubly-linked list (indices, not pointers) of
//! its class. A waiter is named by a [`WaiterId`] (index + generation); generations are
//! queue-wide push numbers, so they also give arrival order, and a stale id (the waiter was
//! already granted or removed) is detected and ignored.
//!
//! Invariants:
//! - A class exists exactly while it has waiters; a waiter without a class key
//!   ([`Selector::wait_class`] is `None`) is alone in a class of its own.
//! - `heads` maps the generation of every class's oldest waiter to that class and to the class's
//!   interest: the bits of the slots the most recent ranking of any of its members asked about.
//!   Walking `heads` in key order visits each class once, oldest head first.
//! - Only heads are ever re-ranked while queued: the members of a class are interchangeable
//!   (the [`Selector::wait_class`] contract), so when the head cannot reserve, nobody behind it
//!   can either.
//!
//! [`Selector::wait_class`]: crate::Selector::wait_class

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
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
/// With `reserve` false nothing has room: the ranking only tells `Full` from `Unavailable`.
pub(crate) fn rank_reserve<S: Selector>(
    selector: &mut S,
    tokens: u32,
    interest: &Cell<u64>,
    reserve: bool,
) -> Reserve<S::Choice> {
    let has_room = |slot: &Slot| {
        interest.set(interest.get() | slot.bit);
        reserve && slot.has_room(tokens)
    };
    match selector.rank(&has_room) {
        Ranking::Unavailable => Reserve::Unavailable,
        Ranking::Candidates(candidates) => {
            for (slot, choice) in candidates {
                // A selector may return a slot without asking about it; it still interests us.
                interest.set(interest.get() | slot.bit);
                if reserve && slot.try_reserve(tokens) {
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
    fn try_reserve(&mut self, interest: &Cell<u64>) -> Option<Arc<Slot>>;
    /// The prompt tokens it reserves.
    fn tokens(&self) -> u32;
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
    tokens: u32,
    tx: oneshot::Sender<Grant<S::Choice>>,
}

impl<S: Selector> TypedWaiter<S> {
    pub(crate) fn new(selector: S, tokens: u32, tx: oneshot::Sender<Grant<S::Choice>>) -> Self {
        TypedWaiter {
            selector,
            choice: None,
            tokens,
            tx,
        }
    }
}

impl<S: Selector> Waiter for TypedWaiter<S> {
    fn try_reserve(&mut self, interest: &Cell<u64>) -> Option<Arc<Slot>> {
        match rank_reserve(&mut self.selector, self.tokens, interest, true) {
            Reserve::Reserved(slot, choice) => {
                self.selector.commit(&choice);
                self.choice = Some(choice);
                Some(slot)
            }
            Reserve::Full | Reserve::Unavailable => None,
        }
    }

    fn tokens(&self) -> u32 {
        self.tokens
    }

    fn grant(self: Box<Self>, permit: Permit, waited: Duration) -> Result<(), Permit> {
        let TypedWaiter {
            selector,
            choice,
            tokens: _,
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
    /// Its wait class (see [`Selector::wait_class`]). Read on push; a removed entry's is `None`.
    pub(crate) class: Option<Box<str>>,
}

/// Names a waiter in the [`WaitQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaiterId {
    index: u32,
    generation: u64,
}

/// A slab node.
struct Node {
    /// Neighbours in the class list when occupied; `next` is the next free node when vacant.
    prev: u32,
    next: u32,
    class: u32,
    /// Queue-wide push number of the current occupant (unique, never reused).
    generation: u64,
    entry: Option<(Box<dyn Waiter>, Instant)>,
}

/// The waiters of one class, oldest first.
struct Class {
    key: Option<Box<str>>,
    head: u32,
    tail: u32,
}

/// What the `heads` index keeps for a class.
#[derive(Clone, Copy)]
struct Head {
    index: u32,
    interest: u64,
}

/// Waiters by class, in arrival order.
pub(crate) struct WaitQueue {
    nodes: Vec<Node>,
    free: u32,
    classes: Vec<Class>,
    free_classes: Vec<u32>,
    by_key: HashMap<Box<str>, u32>,
    /// Generation of each class's oldest waiter → its position and the class's interest.
    heads: BTreeMap<u64, Head>,
    len: usize,
    next_generation: u64,
}

impl WaitQueue {
    pub(crate) fn new() -> Self {
        WaitQueue {
            nodes: Vec::new(),
            free: NIL,
            classes: Vec::new(),
            free_classes: Vec::new(),
            by_key: HashMap::new(),
            heads: BTreeMap::new(),
            len: 0,
            next_generation: 0,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Whether requests of the named class wait (never for `None`: each such is its own class).
    pub(crate) fn has_class(&self, key: Option<&str>) -> bool {
        key.is_some_and(|k| self.by_key.contains_key(k))
    }

    /// The class for `key`, created empty if needed.
    fn class_for(&mut self, key: Option<Box<str>>) -> u32 {
        if let Some(k) = &key
            && let Some(&c) = self.by_key.get(k)
        {
            return c;
        }
        let class = Class {
            key: key.clone(),
            head: NIL,
            tail: NIL,
        };
        let c = match self.free_classes.pop() {
            Some(c) => {
                self.classes[c as usize] = class;
                c
            }
            None => {
                let c = u32::try_from(self.classes.len()).expect("fewer than 2^32 classes");
                self.classes.push(class);
                c
            }
        };
        if let Some(k) = key {
            self.by_key.insert(k, c);
        }
        c
    }

    /// Appends a waiter (the newest of its class).
    pub(crate) fn push(&mut self, entry: Entry) -> WaiterId {
        let c = self.class_for(entry.class);
        let index = if self.free != NIL {
            let index = self.free;
            self.free = self.nodes[index as usize].next;
            index
        } else {
            let index = u32::try_from(self.nodes.len())
                .ok()
                .filter(|&i| i != NIL)
                .expect("fewer than 2^32 - 1 waiters");
            self.nodes.push(Node {
                prev: NIL,
                next: NIL,
                class: 0,
                generation: 0,
                entry: None,
            });
            index
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        let tail = self.classes[c as usize].tail;
        self.nodes[index as usize] = Node {
            prev: tail,
            next: NIL,
            class: c,
            generation,
            entry: Some((entry.waiter, entry.enqueued_at)),
        };
        let class = &mut self.classes[c as usize];
        class.tail = index;
        if tail == NIL {
            class.head = index;
            self.heads.insert(
                generation,
                Head {
                    index,
                    interest: entry.interest,
                },
            );
        } else {
            self.nodes[tail as usize].next = index;
            // The newest ranking speaks for the whole class.
            let head = self.nodes[class.head as usize].generation;
            if let Some(h) = self.heads.get_mut(&head) {
                h.interest = entry.interest;
            }
        }
        self.len += 1;
        WaiterId { index, generation }
    }

    /// Removes the waiter if it is still there.
    pub(crate) fn remove(&mut self, id: WaiterId) -> Option<Entry> {
        let node = self.nodes.get(id.index as usize)?;
        if node.generation != id.generation || node.entry.is_none() {
            return None;
        }
        Some(self.remove_at(id.index))
    }

    /// The oldest waiter, at or after arrival number `from`, of a class whose interest meets
    /// `bit` (any class when `bit` is `None`): its arrival number and position. Only class heads
    /// are candidates, so a walk that resumes after each returned number visits every class at
    /// most once, and a head's successor (newer) is visited later in the same walk.
    pub(crate) fn next_head(&self, from: u64, bit: Option<u64>) -> Option<(u64, u32)> {
        self.heads
            .range(from..)
            .find(|(_, h)| bit.is_none_or(|b| h.interest & b != 0))
            .map(|(&generation, h)| (generation, h.index))
    }

    /// Re-ranks the waiter at an occupied position (see [`Waiter::try_reserve`]) and records the
    /// slots it asked about as its class's interest.
    pub(crate) fn try_reserve(&mut self, index: u32) -> Option<Arc<Slot>> {
        let node = &mut self.nodes[index as usize];
        let (waiter, _) = node.entry.as_mut().expect("position is occupied");
        let interest = Cell::new(0);
        let reserved = waiter.try_reserve(&interest);
        let head = self.classes[node.class as usize].head;
        let head = self.nodes[head as usize].generation;
        if let Some(h) = self.heads.get_mut(&head) {
            h.interest = interest.get();
        }
        reserved
    }

    /// Unlinks the waiter at an occupied position.
    pub(crate) fn remove_at(&mut self, index: u32) -> Entry {
        let node = &mut self.nodes[index as usize];
        let (waiter, enqueued_at) = node.entry.take().expect("position is occupied");
        let (prev, next, c, generation) = (node.prev, node.next, node.class, node.generation);
        node.prev = NIL;
        node.next = self.free;
        self.free = index;
        let class = &mut self.classes[c as usize];
        if next == NIL {
            class.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        let mut interest = 0;
        if prev == NIL {
            class.head = next;
            let head = self
                .heads
                .remove(&generation)
                .expect("a class head is indexed");
            interest = head.interest;
            if next != NIL {
                let successor = self.nodes[next as usize].generation;
                self.heads.insert(
                    successor,
                    Head {
                        index: next,
                        interest,
                    },
                );
            } else {
                if let Some(k) = class.key.take() {
                    self.by_key.remove(&k);
                }
                self.free_classes.push(c);
            }
        } else {
            self.nodes[prev as usize].next = next;
        }
        self.len -= 1;
        if self.len == 0 && self.nodes.len() > 1024 {
            // Give back the memory of a burst. Generations are queue-wide and never reused, so
            // an old id cannot match a node created later.
            self.nodes = Vec::new();
            self.free = NIL;
            self.classes = Vec::new();
            self.free_classes = Vec::new();
        }
        Entry {
            waiter,
            enqueued_at,
            interest,
            class: None,
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
        fn try_reserve(&mut self, _: &Cell<u64>) -> Option<Arc<Slot>> {
            None
        }
        fn tokens(&self) -> u32 {
            1
        }
        fn grant(self: Box<Self>, _: Permit, _: Duration) -> Result<(), Permit> {
            Ok(())
        }
    }

    fn entry(class: Option<&str>, interest: u64) -> Entry {
        Entry {
            waiter: Box::new(Dummy),
            enqueued_at: Instant::now(),
            interest,
            class: class.map(Into::into),
        }
    }

    /// Arrival numbers of the class heads a walk visits, oldest first.
    fn walk(q: &WaitQueue, bit: Option<u64>) -> Vec<u64> {
        let mut out = Vec::new();
        let mut from = 0;
        while let Some((generation, _)) = q.next_head(from, bit) {
            out.push(generation);
            from = generation + 1;
        }
        out
    }

    #[test]
    fn push_remove_keeps_order_and_rejects_stale_ids() {
        let mut q = WaitQueue::new();
        let ids: Vec<_> = (0..5).map(|_| q.push(entry(None, 1))).collect();
        assert_eq!(walk(&q, None), [0, 1, 2, 3, 4], "unclassed: one class each");
        assert!(q.remove(ids[2]).is_some());
        assert!(q.remove(ids[2]).is_none(), "stale id");
        assert!(q.remove(ids[0]).is_some());
        assert!(q.remove(ids[4]).is_some());
        assert_eq!(walk(&q, None), [1, 3]);
        // Reused nodes get new generations; old ids do not match them.
        let new = q.push(entry(None, 1));
        assert!(q.remove(ids[4]).is_none());
        assert_eq!(walk(&q, None), [1, 3, 5]);
        assert_eq!(q.len(), 3);
        for id in [ids[1], ids[3], new] {
            assert!(q.remove(id).is_some());
        }
        assert_eq!(q.len(), 0);
        assert!(q.next_head(0, None).is_none());
        assert!(q.classes.len() == q.free_classes.len() && q.by_key.is_empty());
    }

    #[test]
    fn a_class_shows_only_its_oldest_waiter() {
        let mut q = WaitQueue::new();
        let a0 = q.push(entry(Some("7"), 0b01));
        let b0 = q.push(entry(Some("8"), 0b10));
        let a1 = q.push(entry(Some("7"), 0b01));
        let solo = q.push(entry(None, 0b10));
        let a2 = q.push(entry(Some("7"), 0b11));
        assert_eq!(q.len(), 5);
        assert_eq!(walk(&q, None), [0, 1, 3]);
        // The newest ranking (a2's) speaks for class 7.
        assert_eq!(walk(&q, Some(0b01)), [0]);
        assert_eq!(walk(&q, Some(0b10)), [0, 1, 3]);
        // Removing a head promotes the next of its class, keeping the class interest.
        assert!(q.remove(a0).is_some());
        assert_eq!(walk(&q, None), [1, 2, 3]);
        assert_eq!(walk(&q, Some(0b10)), [1, 2, 3]);
        // Removing from the middle or the tail does not disturb the head.
        assert!(q.remove(a2).is_some());
        assert_eq!(walk(&q, None), [1, 2, 3]);
        assert!(q.remove(a1).is_some());
        assert_eq!(walk(&q, None), [1, 3]);
        // The class is gone once empty; the key makes a fresh one later.
        assert!(!q.by_key.contains_key("7"));
        let a3 = q.push(entry(Some("7"), 0b100));
        assert_eq!(walk(&q, Some(0b100)), [5]);
        // try_reserve records the head's new interest for the class.
        let (_, index) = q.next_head(5, None).unwrap();
        assert!(q.try_reserve(index).is_none());
        assert_eq!(walk(&q, Some(0b100)), [] as [u64; 0]);
        for id in [b0, solo, a3] {
            assert!(q.remove(id).is_some());
        }
        assert_eq!(q.len(), 0);
        assert!(q.heads.is_empty() && q.by_key.is_empty());
    }
}
