//! The wait list: waiters grouped by wait class and priority, each (wait class, priority) list
//! in arrival order; O(1) push and O(1) removal from anywhere, O(log lists) to find the next
//! list head a dispatch walk visits.
//!
//! A slab of nodes, each threaded on an intrusive doubly-linked list (indices, not pointers) of
//! its wait class and priority. A waiter is named by a [`WaiterId`] (index + generation);
//! generations are queue-wide push numbers, so they also give arrival order, and a stale id
//! (the waiter was already granted or removed) is detected and ignored.
//!
//! Invariants:
//! - A wait class exists exactly while it has waiters; a waiter without a class key
//!   ([`Selector::wait_class`] is `None`) is alone in a class of its own.
//! - `heads[p]` maps the generation of the oldest waiter of every wait class's priority-`p`
//!   list to its position. A class's interest is the bits of the slots the most recent ranking
//!   of any of its members asked about.
//! - A walk ([`WaitQueue::next`]) visits promoted waiters (past their class's starvation age)
//!   oldest first, then the rest by priority, highest first, oldest first within a priority.
//! - Only list heads are ever re-ranked while queued, and once a visited waiter of a wait class
//!   cannot reserve, nobody else of that wait class is visited in the same walk: the members
//!   of a class are interchangeable (the [`Selector::wait_class`] contract), so nobody it
//!   serves later could reserve either (and with a token budget, must not overtake it).
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
use crate::priority::{Priority, PriorityClasses};
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
    fn grant(
        self: Box<Self>,
        permit: Permit,
        waited: Duration,
        promoted: bool,
    ) -> Result<(), Permit>;
}

/// What a waiting caller receives. Kept as small as it was before promotion existed (the wait
/// in nanoseconds beside the flag, rather than a `Duration` with its padding): the acquire
/// future of every waiting request has room for one.
pub(crate) struct Grant<C> {
    pub(crate) choice: C,
    pub(crate) permit: Permit,
    waited_nanos: u64,
    /// Served by starvation promotion.
    pub(crate) promoted: bool,
}

impl<C> Grant<C> {
    /// How long the request waited.
    pub(crate) fn waited(&self) -> Duration {
        Duration::from_nanos(self.waited_nanos)
    }
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

    fn grant(
        self: Box<Self>,
        permit: Permit,
        waited: Duration,
        promoted: bool,
    ) -> Result<(), Permit> {
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
            waited_nanos: u64::try_from(waited.as_nanos()).unwrap_or(u64::MAX),
            promoted,
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
    /// Its priority class.
    pub(crate) priority: Priority,
}

/// Names a waiter in the [`WaitQueue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WaiterId {
    index: u32,
    generation: u64,
}

/// A slab node.
struct Node {
    /// Neighbours in its (wait class, priority) list when occupied; `next` is the next free
    /// node when vacant.
    prev: u32,
    next: u32,
    class: u32,
    priority: Priority,
    /// Queue-wide push number of the current occupant (unique, never reused).
    generation: u64,
    entry: Option<(Box<dyn Waiter>, Instant)>,
}

/// One (wait class, priority) list, oldest first.
#[derive(Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY: List = List {
    head: NIL,
    tail: NIL,
};

/// The waiters of one wait class: one list per priority.
struct Class {
    key: Option<Box<str>>,
    lists: [List; 4],
    members: usize,
    /// The bits of the slots the most recent ranking of any member asked about.
    interest: u64,
    /// The walk (see [`Walk::number`]) in which one of its waiters could not reserve.
    blocked_in: u64,
}

/// Where a dispatch walk is (see [`WaitQueue::next`]); from [`WaitQueue::walk`].
pub(crate) struct Walk {
    /// Per priority: the lowest arrival number not yet visited.
    from: [u64; 4],
    /// Still visiting promoted waiters.
    promoted: bool,
    /// This walk's number: wait classes marked with it had a waiter that could not reserve,
    /// and nobody else of theirs is visited (a mark instead of a list: no allocation).
    number: u64,
}

/// A waiter a walk visits.
pub(crate) struct Visit {
    pub(crate) index: u32,
    /// Visited because it waited past its class's starvation age.
    pub(crate) promoted: bool,
}

/// Waiters by wait class and priority, each list in arrival order.
pub(crate) struct WaitQueue {
    nodes: Vec<Node>,
    free: u32,
    classes: Vec<Class>,
    free_classes: Vec<u32>,
    by_key: HashMap<Box<str>, u32>,
    /// Per priority: arrival number of the oldest waiter of each wait class's list → position.
    heads: [BTreeMap<u64, u32>; 4],
    len: usize,
    by_priority: [usize; 4],
    next_generation: u64,
    /// Walks started so far (walk numbers start at 1; a class's 0 means never blocked). A
    /// `Cell` so that starting a walk needs no exclusive borrow (the queue is behind a mutex).
    walks: Cell<u64>,
}

impl WaitQueue {
    pub(crate) fn new() -> Self {
        WaitQueue {
            nodes: Vec::new(),
            free: NIL,
            classes: Vec::new(),
            free_classes: Vec::new(),
            by_key: HashMap::new(),
            heads: Default::default(),
            len: 0,
            by_priority: [0; 4],
            next_generation: 0,
            walks: Cell::new(0),
        }
    }

    /// Starts a dispatch walk.
    pub(crate) fn walk(&self) -> Walk {
        self.walks.set(self.walks.get() + 1);
        Walk {
            from: [0; 4],
            promoted: true,
            number: self.walks.get(),
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Waiters of each priority, indexed by [`Priority::index`].
    pub(crate) fn lens(&self) -> [usize; 4] {
        self.by_priority
    }

    /// Whether a request of `priority` in the named wait class would be served after one of
    /// its class's waiters: one of at least its priority, or a promoted one, waits. Never for
    /// `None` (each such request is a class of its own).
    pub(crate) fn outranked(
        &self,
        key: Option<&str>,
        priority: Priority,
        classes: &PriorityClasses,
        now: Instant,
    ) -> bool {
        let Some(&c) = key.and_then(|k| self.by_key.get(k)) else {
            return false;
        };
        let class = &self.classes[c as usize];
        Priority::ALL.into_iter().any(|p| {
            let head = class.lists[p.index()].head;
            head != NIL
                && (p >= priority || {
                    let (_, since) = self.nodes[head as usize].entry.as_ref().expect("occupied");
                    classes.starved(p, *since, now)
                })
        })
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
            lists: [EMPTY; 4],
            members: 0,
            interest: 0,
            blocked_in: 0,
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

    /// Appends a waiter (the newest of its wait class and priority).
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
                priority: Priority::Default,
                generation: 0,
                entry: None,
            });
            index
        };
        let generation = self.next_generation;
        self.next_generation += 1;
        let p = entry.priority.index();
        let class = &mut self.classes[c as usize];
        let tail = class.lists[p].tail;
        // The newest ranking speaks for the whole class.
        class.interest = entry.interest;
        class.members += 1;
        class.lists[p].tail = index;
        if tail == NIL {
            class.lists[p].head = index;
            self.heads[p].insert(generation, index);
        } else {
            self.nodes[tail as usize].next = index;
        }
        self.nodes[index as usize] = Node {
            prev: tail,
            next: NIL,
            class: c,
            priority: entry.priority,
            generation,
            entry: Some((entry.waiter, entry.enqueued_at)),
        };
        self.len += 1;
        self.by_priority[p] += 1;
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

    /// The oldest list head of `priority`, at or after arrival number `from`, whose wait class
    /// is not blocked in `walk` and (with `bit`) is interested in that slot.
    fn first(&self, priority: usize, from: u64, bit: Option<u64>, walk: u64) -> Option<(u64, u32)> {
        self.heads[priority]
            .range(from..)
            .find(|&(_, &index)| {
                let class = &self.classes[self.nodes[index as usize].class as usize];
                bit.is_none_or(|b| class.interest & b != 0) && class.blocked_in != walk
            })
            .map(|(&generation, &index)| (generation, index))
    }

    /// The next waiter a dispatch walk visits: first the promoted ones (waited past their
    /// class's starvation age at `now`) oldest first, then the others by priority, highest
    /// first, oldest first within a priority. Only list heads are candidates and the walk
    /// resumes after each one it returned, so it visits every list at most once per priority
    /// pass, and a head's successor (newer) later in the same walk. With `bit`, only wait
    /// classes interested in that slot are visited.
    pub(crate) fn next(
        &self,
        walk: &mut Walk,
        bit: Option<u64>,
        classes: &PriorityClasses,
        now: Instant,
    ) -> Option<Visit> {
        if walk.promoted {
            let mut oldest: Option<(u64, usize, u32)> = None;
            for p in Priority::ALL {
                let i = p.index();
                // Cheap skips first: without priority classes nobody is ever promoted, and
                // most priorities have nobody waiting.
                if self.by_priority[i] == 0 || classes.get(p).starvation_after.is_none() {
                    continue;
                }
                // Within a list, age falls with arrival: if its first candidate is not starved,
                // nobody after it is.
                if let Some((generation, index)) = self.first(i, walk.from[i], bit, walk.number)
                    && let Some((_, since)) = &self.nodes[index as usize].entry
                    && classes.starved(p, *since, now)
                    && oldest.is_none_or(|(g, _, _)| generation < g)
                {
                    oldest = Some((generation, i, index));
                }
            }
            if let Some((generation, i, index)) = oldest {
                walk.from[i] = generation + 1;
                return Some(Visit {
                    index,
                    promoted: true,
                });
            }
            walk.promoted = false;
        }
        for p in Priority::ALL.into_iter().rev() {
            let i = p.index();
            if self.by_priority[i] == 0 {
                continue;
            }
            if let Some((generation, index)) = self.first(i, walk.from[i], bit, walk.number) {
                walk.from[i] = generation + 1;
                return Some(Visit {
                    index,
                    promoted: false,
                });
            }
        }
        None
    }

    /// Keeps the rest of this waiter's wait class out of the walk: it could not reserve, so
    /// nobody its class serves after it may (without a token budget they could not either).
    pub(crate) fn block(&mut self, walk: &Walk, index: u32) {
        let c = self.nodes[index as usize].class;
        self.classes[c as usize].blocked_in = walk.number;
    }

    /// Re-ranks the waiter at an occupied position (see [`Waiter::try_reserve`]) and records the
    /// slots it asked about as its class's interest.
    pub(crate) fn try_reserve(&mut self, index: u32) -> Option<Arc<Slot>> {
        let node = &mut self.nodes[index as usize];
        let (waiter, _) = node.entry.as_mut().expect("position is occupied");
        let interest = Cell::new(0);
        let reserved = waiter.try_reserve(&interest);
        self.classes[node.class as usize].interest = interest.get();
        reserved
    }

    /// Unlinks the waiter at an occupied position.
    pub(crate) fn remove_at(&mut self, index: u32) -> Entry {
        let node = &mut self.nodes[index as usize];
        let (waiter, enqueued_at) = node.entry.take().expect("position is occupied");
        let (prev, next, c, generation, priority) = (
            node.prev,
            node.next,
            node.class,
            node.generation,
            node.priority,
        );
        node.prev = NIL;
        node.next = self.free;
        self.free = index;
        let p = priority.index();
        let class = &mut self.classes[c as usize];
        let list = &mut class.lists[p];
        if next == NIL {
            list.tail = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
        if prev == NIL {
            list.head = next;
            self.heads[p]
                .remove(&generation)
                .expect("a list head is indexed");
            if next != NIL {
                let successor = self.nodes[next as usize].generation;
                self.heads[p].insert(successor, next);
            }
        } else {
            self.nodes[prev as usize].next = next;
        }
        let class = &mut self.classes[c as usize];
        class.members -= 1;
        let interest = class.interest;
        if class.members == 0 {
            if let Some(k) = class.key.take() {
                self.by_key.remove(&k);
            }
            self.free_classes.push(c);
        }
        self.len -= 1;
        self.by_priority[p] -= 1;
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
            priority,
        }
    }
}

impl fmt::Debug for WaitQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WaitQueue")
            .field("len", &self.len)
            .field("by_priority", &self.by_priority)
            .finish()
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
        fn grant(self: Box<Self>, _: Permit, _: Duration, _: bool) -> Result<(), Permit> {
            Ok(())
        }
    }

    fn entry(class: Option<&str>, interest: u64) -> Entry {
        entry_at(class, interest, Priority::Default, Instant::now())
    }

    fn entry_at(class: Option<&str>, interest: u64, priority: Priority, at: Instant) -> Entry {
        Entry {
            waiter: Box::new(Dummy),
            enqueued_at: at,
            interest,
            class: class.map(Into::into),
            priority,
        }
    }

    fn generation(q: &WaitQueue, index: u32) -> u64 {
        q.nodes[index as usize].generation
    }

    /// Arrival numbers of the waiters a walk visits (none reserves), with promotion marks.
    fn walk_with(
        q: &WaitQueue,
        bit: Option<u64>,
        classes: &PriorityClasses,
        now: Instant,
    ) -> Vec<(u64, bool)> {
        let mut out = Vec::new();
        let mut walk = q.walk();
        while let Some(v) = q.next(&mut walk, bit, classes, now) {
            out.push((generation(q, v.index), v.promoted));
        }
        out
    }

    fn walk(q: &WaitQueue, bit: Option<u64>) -> Vec<u64> {
        let classes = PriorityClasses::uniform(10, Duration::from_secs(1));
        walk_with(q, bit, &classes, Instant::now())
            .into_iter()
            .map(|(g, _)| g)
            .collect()
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
        assert_eq!(walk(&q, None), [] as [u64; 0]);
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
        let classes = PriorityClasses::uniform(10, Duration::from_secs(1));
        let mut w = q.walk();
        let v = q
            .next(&mut w, Some(0b100), &classes, Instant::now())
            .unwrap();
        assert!(q.try_reserve(v.index).is_none());
        assert_eq!(walk(&q, Some(0b100)), [] as [u64; 0]);
        for id in [b0, solo, a3] {
            assert!(q.remove(id).is_some());
        }
        assert_eq!(q.len(), 0);
        assert!(q.heads.iter().all(BTreeMap::is_empty) && q.by_key.is_empty());
    }

    #[test]
    fn walks_by_priority_then_arrival_and_promotes_the_starved() {
        let t0 = Instant::now();
        let mut classes = PriorityClasses::uniform(10, Duration::from_secs(100));
        classes.0[Priority::Bulk.index()].starvation_after = Some(Duration::from_secs(10));
        let mut q = WaitQueue::new();
        q.push(entry_at(Some("a"), 1, Priority::Bulk, t0)); // 0
        q.push(entry_at(Some("b"), 1, Priority::Default, t0)); // 1
        q.push(entry_at(Some("a"), 1, Priority::Interactive, t0)); // 2
        q.push(entry_at(
            Some("c"),
            1,
            Priority::Bulk,
            t0 + Duration::from_secs(5),
        )); // 3
        q.push(entry_at(Some("c"), 1, Priority::System, t0)); // 4
        q.push(entry_at(Some("b"), 1, Priority::Default, t0)); // 5 (behind 1 in its list)
        let at = |secs| t0 + Duration::from_secs(secs);
        // Nobody starved: by priority, then arrival; one head per list.
        assert_eq!(
            walk_with(&q, None, &classes, at(1)),
            [(4, false), (2, false), (1, false), (0, false), (3, false)]
        );
        // Bulk 0 starved at 10 s: first; bulk 3 not yet.
        assert_eq!(walk_with(&q, None, &classes, at(10))[0], (0, true));
        assert_eq!(
            walk_with(&q, None, &classes, at(10))[1..],
            [(4, false), (2, false), (1, false), (3, false)]
        );
        // Both starved: in arrival order, ahead of everyone.
        assert_eq!(
            walk_with(&q, None, &classes, at(15))[..2],
            [(0, true), (3, true)]
        );
        // The outranking rule an arrival uses.
        assert!(q.outranked(Some("a"), Priority::Interactive, &classes, at(1)));
        assert!(!q.outranked(Some("a"), Priority::System, &classes, at(1)));
        assert!(
            q.outranked(Some("a"), Priority::System, &classes, at(10)),
            "starved bulk"
        );
        assert!(!q.outranked(Some("zzz"), Priority::Bulk, &classes, at(1)));
        assert_eq!(q.lens(), [2, 2, 1, 1]);
    }

    #[test]
    fn a_blocked_class_is_not_visited_again_in_the_walk() {
        let mut q = WaitQueue::new();
        q.push(entry_at(
            Some("a"),
            1,
            Priority::Interactive,
            Instant::now(),
        ));
        q.push(entry_at(Some("b"), 1, Priority::Default, Instant::now()));
        q.push(entry_at(Some("a"), 1, Priority::Bulk, Instant::now()));
        let classes = PriorityClasses::uniform(10, Duration::from_secs(1));
        let mut walk = q.walk();
        let first = q.next(&mut walk, None, &classes, Instant::now()).unwrap();
        assert_eq!(generation(&q, first.index), 0);
        q.block(&walk, first.index);
        let second = q.next(&mut walk, None, &classes, Instant::now()).unwrap();
        assert_eq!(generation(&q, second.index), 1);
        assert!(
            q.next(&mut walk, None, &classes, Instant::now()).is_none(),
            "a's bulk skipped"
        );
    }
}
