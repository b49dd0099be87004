//! vLLM mode's KV transfer state: the blocks a producer (prefill leg) holds for the consumer
//! that will pull them, like vLLM's NIXL and Mooncake connectors, or (LMCache) the entries a
//! consumer keeps of what its producer pushed, and the transfer counters of both sides.
//!
//! Invariants:
//! - A held entry is keyed by its `remote_request_id` (NIXL), its `transfer_id` (Mooncake) or
//!   its prompt key (LMCache) and owned by one engine id (this worker's, or under Mooncake the
//!   id of the DP rank that computed it, [`KvTable::rank_engine_ids`]); it lives until a pull
//!   takes it (with the same engine id, and for NIXL the same block ids) or until
//!   [`KvTable::timeout`] after it was produced, whichever comes first; then its blocks are
//!   freed (counted pulled or expired).
//! - A Mooncake pull that finds nothing yet waits for the entry ([`KvTable::wait_take`]),
//!   woken by every new entry and bounded by its caller, since both legs run at once. A table
//!   that remembers what is gone ([`KvTable::remember_gone`], Mooncake's) keeps the keys of
//!   entries pulled or expired for one more timeout (at most [`MAX_HELD`] of them), so a pull
//!   for one is refused at once instead of waiting; holding the key again forgets it.
//! - At most [`MAX_HELD`] requests are held: a producer beyond that is refused, never stored.
//!   The deadline index holds exactly one entry per held request, so both maps stay within
//!   that bound whatever the request rate.
//! - Every operation sweeps expired entries first, so an expired entry is never pulled nor
//!   counted held; one sweeper task per worker ([`KvTable::spawn_sweeper`], aborted when its
//!   handle drops) frees them on time even when nothing else happens.
//! - The timeout is the same for every entry, so deadlines grow with insertion order: the
//!   earliest deadline is the oldest entry's, and a new entry never makes the sweeper's
//!   current wait too long (it needs waking only when the table was empty).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// Prompt tokens per KV block (vLLM's default block size).
pub(crate) const BLOCK_TOKENS: u64 = 16;

/// Most requests whose blocks are held at once.
pub(crate) const MAX_HELD: usize = 100_000;

/// Longest hold honoured: a longer timeout (`--kv-abort-timeout-ms` takes any `u64`) is cut
/// to it, so a deadline always fits in an `Instant`.
const MAX_TIMEOUT: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Blocks a prompt of `tokens` tokens fills (the last one possibly partly).
pub(crate) fn blocks_for(tokens: u64) -> u64 {
    tokens.div_ceil(BLOCK_TOKENS)
}

/// `tokens` rounded down to a whole block: what a consumer gets of a prompt whose every
/// block moved.
pub(crate) fn whole_blocks(tokens: u64) -> u64 {
    tokens / BLOCK_TOKENS * BLOCK_TOKENS
}

/// The prompt tokens a consumer gets from the producer's full blocks: `tokens` rounded down
/// to a whole block, at most what `blocks` blocks carry.
pub(crate) fn transferred_tokens(tokens: u64, blocks: usize) -> u64 {
    (tokens / BLOCK_TOKENS * BLOCK_TOKENS).min(blocks as u64 * BLOCK_TOKENS)
}

/// A snapshot of the transfer counters (merged into `MockStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct KvSnapshot {
    pub(crate) held_requests: u64,
    pub(crate) held_blocks: u64,
    pub(crate) produced_total: u64,
    pub(crate) pulled_total: u64,
    pub(crate) expired_total: u64,
    pub(crate) relayed_total: u64,
    pub(crate) recomputed_total: u64,
    pub(crate) pull_failed_total: u64,
    pub(crate) early_end_total: u64,
    pub(crate) pushed_total: u64,
    pub(crate) push_failed_total: u64,
}

/// Why a producer's blocks could not be held.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct TableFull;

impl std::fmt::Display for TableFull {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KV cache full: {MAX_HELD} requests held")
    }
}

/// The held blocks of one worker and its transfer counters.
#[derive(Debug)]
pub(crate) struct KvTable {
    core: Arc<Core>,
}

#[derive(Debug)]
struct Core {
    engine_id: Arc<str>,
    /// Mooncake: the engine id of each DP rank, `{engine_id}-dp{rank}`.
    rank_ids: Vec<Arc<str>>,
    /// Wakes every waiting Mooncake pull when an entry is held.
    produced: Notify,
    timeout: Duration,
    held: Mutex<Held>,
    /// Wakes the sweeper when an entry arrives in an empty table.
    arrived: Notify,
    counters: Counters,
}

#[derive(Debug, Default)]
struct Counters {
    produced: AtomicU64,
    pulled: AtomicU64,
    expired: AtomicU64,
    relayed: AtomicU64,
    recomputed: AtomicU64,
    pull_failed: AtomicU64,
    early_end: AtomicU64,
    pushed: AtomicU64,
    push_failed: AtomicU64,
}

#[derive(Debug, Default)]
struct Held {
    /// The keys recently freed, when the table remembers them.
    gone: Option<Gone>,
    by_id: HashMap<String, Entry>,
    /// Insertion sequence number → deadline and request id (one per `by_id` entry).
    deadlines: BTreeMap<u64, (Instant, String)>,
    blocks: u64,
    next_seq: u64,
    next_block: u64,
}

#[derive(Debug)]
struct Entry {
    seq: u64,
    blocks: Vec<u64>,
    engine_id: Arc<str>,
    /// The prompt tokens the blocks carry.
    tokens: u64,
}

/// What a pull by key ([`KvTable::take_key`]) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Taken {
    /// Held under that engine id: freed; the prompt tokens it carried.
    Tokens(u64),
    /// Held under another engine id: left held.
    WrongEngine,
    /// Not held (not yet, or no longer when the table does not remember).
    Missing,
    /// Pulled or expired a short while ago (a table that remembers what is gone).
    Gone,
}

/// Keys of entries freed recently, each until its own deadline: a bounded FIFO of
/// `(until, seq, key)`, `by_key` naming the live record of each key.
#[derive(Debug, Default)]
struct Gone {
    by_key: HashMap<String, u64>,
    order: VecDeque<(Instant, u64, String)>,
    next: u64,
}

impl Gone {
    fn add(&mut self, key: String, until: Instant) {
        let seq = self.next;
        self.next += 1;
        self.by_key.insert(key.clone(), seq);
        self.order.push_back((until, seq, key));
        if self.order.len() > MAX_HELD {
            self.pop_oldest();
        }
    }

    fn pop_oldest(&mut self) {
        if let Some((_, seq, key)) = self.order.pop_front()
            && self.by_key.get(&key) == Some(&seq)
        {
            self.by_key.remove(&key);
        }
    }

    fn sweep(&mut self, now: Instant) {
        while self.order.front().is_some_and(|(until, ..)| *until <= now) {
            self.pop_oldest();
        }
    }
}

impl Held {
    fn remove(&mut self, request_id: &str) -> Option<Entry> {
        let entry = self.by_id.remove(request_id)?;
        self.deadlines.remove(&entry.seq);
        self.blocks -= entry.blocks.len() as u64;
        Some(entry)
    }

    /// Frees every entry whose deadline is at or before `now` (remembered, if the table
    /// does, for `keep` after its deadline); returns how many.
    fn sweep(&mut self, now: Instant, keep: Duration) -> u64 {
        let mut freed = 0;
        while let Some(entry) = self.deadlines.first_entry() {
            if entry.get().0 > now {
                break;
            }
            let (at, id) = entry.remove();
            if let Some(e) = self.by_id.remove(&id) {
                self.blocks -= e.blocks.len() as u64;
            }
            if let Some(gone) = &mut self.gone {
                gone.add(id, at + keep);
            }
            freed += 1;
        }
        if let Some(gone) = &mut self.gone {
            gone.sweep(now);
        }
        freed
    }
}

/// A random id shaped like a UUID (version 4), the form vLLM's engine ids take.
fn uuid_like() -> String {
    let v = rand::random::<u128>() & !(0xf << 76) | (0x4 << 76);
    let v = v & !(0x3 << 62) | (0x2 << 62);
    let h = format!("{v:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl KvTable {
    /// An empty table under a fresh engine id (and one per each of `dp_size` ranks); held
    /// blocks expire after `timeout` (at most [`MAX_TIMEOUT`]).
    pub(crate) fn new(timeout: Duration, dp_size: u32) -> Self {
        let engine_id: Arc<str> = uuid_like().into();
        let rank_ids = (0..dp_size.max(1))
            .map(|r| Arc::from(format!("{engine_id}-dp{r}")))
            .collect();
        KvTable {
            core: Arc::new(Core {
                engine_id,
                rank_ids,
                produced: Notify::new(),
                timeout: timeout.min(MAX_TIMEOUT),
                held: Mutex::new(Held::default()),
                arrived: Notify::new(),
                counters: Counters::default(),
            }),
        }
    }

    /// This worker's engine id (`remote_engine_id` of what it produces).
    pub(crate) fn engine_id(&self) -> &str {
        &self.core.engine_id
    }

    /// This table, remembering the keys of entries pulled or expired (see the module docs).
    pub(crate) fn remember_gone(self) -> Self {
        self.core.lock().gone.get_or_insert_default();
        self
    }

    /// Mooncake: the engine ids of every DP rank, in rank order.
    pub(crate) fn rank_engine_ids(&self) -> impl Iterator<Item = &str> {
        self.core.rank_ids.iter().map(|id| &**id)
    }

    /// How long unpulled blocks are held.
    pub(crate) fn timeout(&self) -> Duration {
        self.core.timeout
    }

    /// Holds `blocks` new blocks for `request_id` (replacing, as expired, an entry it
    /// already had) and returns their ids; refused when [`MAX_HELD`] requests are held.
    pub(crate) fn hold(&self, request_id: &str, blocks: u64) -> Result<Vec<u64>, TableFull> {
        let engine = Arc::clone(&self.core.engine_id);
        self.insert(request_id, engine, blocks, blocks * BLOCK_TOKENS)
    }

    /// Mooncake: holds the blocks of a `tokens`-token prompt for `transfer_id`, computed by
    /// DP rank `rank` (which must exist), and wakes the pulls waiting for it.
    pub(crate) fn hold_for_rank(
        &self,
        rank: u32,
        transfer_id: &str,
        tokens: u64,
    ) -> Result<(), TableFull> {
        let engine = Arc::clone(&self.core.rank_ids[rank as usize]);
        self.insert(transfer_id, engine, blocks_for(tokens), tokens)?;
        Ok(())
    }

    /// LMCache consumer: keeps the `tokens`-token KV pushed for `prompt_key`.
    pub(crate) fn store_pushed(&self, prompt_key: &str, tokens: u64) -> Result<(), TableFull> {
        let engine = Arc::clone(&self.core.engine_id);
        self.insert(prompt_key, engine, blocks_for(tokens), tokens)?;
        Ok(())
    }

    fn insert(
        &self,
        request_id: &str,
        engine_id: Arc<str>,
        blocks: u64,
        tokens: u64,
    ) -> Result<Vec<u64>, TableFull> {
        let core = &self.core;
        let mut held = core.lock_swept();
        if held.remove(request_id).is_some() {
            core.counters.expired.fetch_add(1, Ordering::SeqCst);
        }
        if let Some(gone) = &mut held.gone {
            gone.by_key.remove(request_id);
        }
        if held.by_id.len() >= MAX_HELD {
            return Err(TableFull);
        }
        let first = held.next_block;
        held.next_block += blocks;
        let ids: Vec<u64> = (first..first + blocks).collect();
        let seq = held.next_seq;
        held.next_seq += 1;
        let deadline = Instant::now() + core.timeout;
        held.deadlines
            .insert(seq, (deadline, request_id.to_owned()));
        held.blocks += blocks;
        let was_empty = held.by_id.is_empty();
        held.by_id.insert(
            request_id.to_owned(),
            Entry {
                seq,
                blocks: ids.clone(),
                engine_id,
                tokens,
            },
        );
        drop(held);
        core.counters.produced.fetch_add(1, Ordering::SeqCst);
        if was_empty {
            core.arrived.notify_one();
        }
        core.produced.notify_waiters();
        Ok(ids)
    }

    /// A pull by key alone (Mooncake's `transfer_id`, LMCache's prompt key): frees the entry
    /// when it is held under `engine_id` (`None`: whichever).
    pub(crate) fn take_key(&self, engine_id: Option<&str>, key: &str) -> Taken {
        let core = &self.core;
        let mut held = core.lock_swept();
        match held.by_id.get(key) {
            None if held
                .gone
                .as_ref()
                .is_some_and(|g| g.by_key.contains_key(key)) =>
            {
                return Taken::Gone;
            }
            None => return Taken::Missing,
            Some(e) if engine_id.is_some_and(|id| id != &*e.engine_id) => {
                return Taken::WrongEngine;
            }
            Some(_) => {}
        }
        let tokens = held.remove(key).map_or(0, |e| e.tokens);
        if let Some(gone) = &mut held.gone {
            gone.add(key.to_owned(), Instant::now() + core.timeout);
        }
        drop(held);
        core.counters.pulled.fetch_add(1, Ordering::SeqCst);
        Taken::Tokens(tokens)
    }

    /// Mooncake: [`KvTable::take_key`], waiting up to `bound` for the entry to be held when
    /// it is not yet (its producer may still be computing).
    pub(crate) async fn wait_take(&self, engine_id: &str, key: &str, bound: Duration) -> Taken {
        let deadline = Instant::now() + bound.min(MAX_TIMEOUT);
        loop {
            // Registered before the look-up, so an entry held in between still wakes it.
            let produced = self.core.produced.notified();
            tokio::pin!(produced);
            produced.as_mut().enable();
            match self.take_key(Some(engine_id), key) {
                Taken::Missing => {}
                found => return found,
            }
            if tokio::time::timeout_at(deadline, produced).await.is_err() {
                return Taken::Missing;
            }
        }
    }

    /// A consumer's pull: frees and returns `true` when this worker (`engine_id`) holds
    /// `request_id` with exactly `blocks`; anything else leaves the table as it was.
    pub(crate) fn take(&self, engine_id: &str, request_id: &str, blocks: &[u64]) -> bool {
        let core = &self.core;
        if engine_id != &*core.engine_id {
            return false;
        }
        let mut held = core.lock_swept();
        if held
            .by_id
            .get(request_id)
            .is_none_or(|e| e.blocks != blocks)
        {
            return false;
        }
        held.remove(request_id);
        drop(held);
        core.counters.pulled.fetch_add(1, Ordering::SeqCst);
        true
    }

    /// LMCache producer: counts a push its peer accepted (`ok`) or that failed.
    pub(crate) fn record_push(&self, ok: bool) {
        let c = &self.core.counters;
        let counter = if ok { &c.pushed } else { &c.push_failed };
        counter.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a consumer that got its prompt's KV from its producer.
    pub(crate) fn record_relayed(&self) {
        self.core.counters.relayed.fetch_add(1, Ordering::SeqCst);
    }

    /// Counts a request that computed its whole prompt itself (`pull_failed`: because its
    /// pull failed).
    pub(crate) fn record_recomputed(&self, pull_failed: bool) {
        let c = &self.core.counters;
        c.recomputed.fetch_add(1, Ordering::SeqCst);
        if pull_failed {
            c.pull_failed.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Counts a producer whose prefill ended before its token cap (nothing held).
    pub(crate) fn record_early_end(&self) {
        self.core.counters.early_end.fetch_add(1, Ordering::SeqCst);
    }

    /// The counters now (expired entries swept first).
    pub(crate) fn snapshot(&self) -> KvSnapshot {
        let core = &self.core;
        let (held_requests, held_blocks) = {
            let held = core.lock_swept();
            (held.by_id.len() as u64, held.blocks)
        };
        let c = &core.counters;
        let get = |a: &AtomicU64| a.load(Ordering::SeqCst);
        KvSnapshot {
            held_requests,
            held_blocks,
            produced_total: get(&c.produced),
            pulled_total: get(&c.pulled),
            expired_total: get(&c.expired),
            relayed_total: get(&c.relayed),
            recomputed_total: get(&c.recomputed),
            pull_failed_total: get(&c.pull_failed),
            early_end_total: get(&c.early_end),
            pushed_total: get(&c.pushed),
            push_failed_total: get(&c.push_failed),
        }
    }

    /// Starts the task that frees expired entries on time; it ends when the returned
    /// handle is dropped.
    pub(crate) fn spawn_sweeper(&self) -> Sweeper {
        let core = Arc::clone(&self.core);
        Sweeper(tokio::spawn(async move {
            loop {
                // A permit left by an arrival before this wait began is kept by `Notify`,
                // so an entry arriving between the sweep and the wait is not missed.
                match core.sweep_now() {
                    Some(deadline) => tokio::time::sleep_until(deadline).await,
                    None => core.arrived.notified().await,
                }
            }
        }))
    }
}

impl Core {
    fn lock(&self) -> MutexGuard<'_, Held> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The table, with the entries expired by now freed.
    fn lock_swept(&self) -> MutexGuard<'_, Held> {
        let mut held = self.lock();
        let freed = held.sweep(Instant::now(), self.timeout);
        if freed > 0 {
            self.counters.expired.fetch_add(freed, Ordering::SeqCst);
        }
        held
    }

    /// Sweeps; returns the earliest deadline left, if any.
    fn sweep_now(&self) -> Option<Instant> {
        let held = self.lock_swept();
        held.deadlines.first_key_value().map(|(_, (at, _))| *at)
    }
}

/// The sweeper task of a [`KvTable`]; aborted on drop.
#[derive(Debug)]
pub(crate) struct Sweeper(JoinHandle<()>);

impl Drop for Sweeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_math_rounds_up_to_hold_and_down_to_transfer() {
        assert_eq!(blocks_for(0), 0);
        assert_eq!(blocks_for(16), 1);
        assert_eq!(blocks_for(17), 2);
        assert_eq!(transferred_tokens(17, 2), 16);
        assert_eq!(transferred_tokens(15, 1), 0);
        assert_eq!(transferred_tokens(64, 2), 32, "capped by the blocks sent");
        assert_eq!((whole_blocks(15), whole_blocks(33)), (0, 32));
    }

    #[test]
    fn engine_ids_look_like_uuids_and_differ() {
        let a = KvTable::new(Duration::from_secs(1), 1);
        let b = KvTable::new(Duration::from_secs(1), 1);
        assert_ne!(a.engine_id(), b.engine_id());
        let parts: Vec<usize> = a.engine_id().split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12]);
        assert_eq!(&a.engine_id()[14..15], "4");
    }

    #[tokio::test(start_paused = true)]
    async fn an_endless_timeout_is_cut_to_one_that_fits() {
        let t = KvTable::new(Duration::from_millis(u64::MAX), 1);
        assert_eq!(t.timeout(), MAX_TIMEOUT);
        t.hold("r", 1).unwrap();
        assert_eq!(t.snapshot().held_requests, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_pull_takes_exactly_what_is_held_once() {
        let t = KvTable::new(Duration::from_secs(480), 1);
        let ids = t.hold("r1", 3).unwrap();
        assert_eq!(ids.len(), 3);
        let other = t.hold("r2", 1).unwrap();
        assert!(!other.iter().any(|b| ids.contains(b)), "ids are not shared");
        let engine = t.engine_id().to_owned();
        assert!(!t.take("other-engine", "r1", &ids));
        assert!(!t.take(&engine, "r1", &ids[..2]), "block ids must match");
        assert!(!t.take(&engine, "nope", &ids));
        assert_eq!(t.snapshot().held_requests, 2);
        assert!(t.take(&engine, "r1", &ids));
        assert!(!t.take(&engine, "r1", &ids), "a second pull finds nothing");
        let s = t.snapshot();
        assert_eq!((s.held_requests, s.held_blocks), (1, 1));
        assert_eq!(
            (s.produced_total, s.pulled_total, s.expired_total),
            (2, 1, 0)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn unpulled_blocks_expire_on_time_through_the_sweeper() {
        let t = KvTable::new(Duration::from_secs(480), 1);
        assert_eq!(t.timeout(), Duration::from_secs(480));
        let _sweeper = t.spawn_sweeper();
        tokio::time::sleep(Duration::from_secs(1)).await;
        t.hold("a", 2).unwrap();
        tokio::time::sleep(Duration::from_secs(100)).await;
        t.hold("b", 1).unwrap();
        tokio::time::sleep(Duration::from_secs(379)).await;
        let held = |t: &KvTable| {
            let h = t.core.lock();
            (h.by_id.len(), h.deadlines.len())
        };
        assert_eq!(held(&t), (2, 2), "not yet");
        tokio::time::sleep(Duration::from_secs(2)).await;
        // Read the table itself: the sweeper, not this read, must have freed `a`.
        assert_eq!(held(&t), (1, 1));
        tokio::time::sleep(Duration::from_secs(100)).await;
        assert_eq!(held(&t), (0, 0));
        let s = t.snapshot();
        assert_eq!((s.expired_total, s.held_blocks), (2, 0));
        let engine = t.engine_id().to_owned();
        assert!(!t.take(&engine, "a", &[0, 1]));
    }

    #[tokio::test(start_paused = true)]
    async fn the_table_is_bounded_and_a_reused_id_replaces_its_entry() {
        let t = KvTable::new(Duration::from_secs(480), 1);
        t.hold("x", 1).unwrap();
        t.hold("x", 2).unwrap();
        let s = t.snapshot();
        assert_eq!((s.held_requests, s.held_blocks, s.expired_total), (1, 2, 1));
        for i in 1..MAX_HELD {
            t.hold(&format!("r{i}"), 0).unwrap();
        }
        assert_eq!(t.hold("one-more", 1), Err(TableFull));
        assert_eq!(t.snapshot().held_requests, MAX_HELD as u64);
        tokio::time::sleep(Duration::from_secs(481)).await;
        assert_eq!(t.snapshot().held_requests, 0, "swept on access");
        assert!(t.hold("one-more", 1).is_ok());
    }

    #[tokio::test(start_paused = true)]
    async fn a_mooncake_pull_waits_for_its_producer_and_checks_the_rank() {
        let t = Arc::new(KvTable::new(Duration::from_secs(480), 2));
        let ids: Vec<String> = t.rank_engine_ids().map(str::to_owned).collect();
        assert_eq!(ids.len(), 2);
        assert_ne!(ids[0], ids[1]);
        assert_eq!(ids[1], format!("{}-dp1", t.engine_id()));
        let waiter = {
            let (t, id) = (Arc::clone(&t), ids[1].clone());
            tokio::spawn(async move { t.wait_take(&id, "x", Duration::from_secs(30)).await })
        };
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!waiter.is_finished(), "waits for the producer");
        t.hold_for_rank(1, "x", 40).unwrap();
        assert_eq!(waiter.await.unwrap(), Taken::Tokens(40));
        t.hold_for_rank(0, "y", 16).unwrap();
        let wrong = t.wait_take(&ids[1], "y", Duration::from_secs(30)).await;
        assert_eq!(wrong, Taken::WrongEngine, "answered at once, left held");
        assert_eq!(t.snapshot().held_requests, 1);
        let start = Instant::now();
        let none = t.wait_take(&ids[0], "x", Duration::from_secs(3)).await;
        assert_eq!(
            (none, start.elapsed()),
            (Taken::Missing, Duration::from_secs(3))
        );
        assert_eq!(t.take_key(None, "y"), Taken::Tokens(16));
        assert_eq!(t.snapshot().pulled_total, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_remembering_table_refuses_a_gone_key_at_once_for_one_timeout() {
        let t = KvTable::new(Duration::from_secs(10), 1).remember_gone();
        let id = t.rank_engine_ids().next().unwrap().to_owned();
        t.hold_for_rank(0, "pulled", 16).unwrap();
        t.hold_for_rank(0, "expires", 16).unwrap();
        assert_eq!(t.take_key(Some(&id), "pulled"), Taken::Tokens(16));
        assert_eq!(
            t.wait_take(&id, "pulled", Duration::from_secs(30)).await,
            Taken::Gone
        );
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert_eq!(t.take_key(Some(&id), "expires"), Taken::Gone);
        assert_eq!(
            t.take_key(Some(&id), "pulled"),
            Taken::Missing,
            "forgotten after a timeout"
        );
        t.hold_for_rank(0, "expires", 32).unwrap();
        assert_eq!(
            t.take_key(Some(&id), "expires"),
            Taken::Tokens(32),
            "held again"
        );
        tokio::time::sleep(Duration::from_secs(21)).await;
        assert_eq!(t.take_key(None, "expires"), Taken::Missing);
        let plain = KvTable::new(Duration::from_secs(10), 1);
        plain.hold("r", 1).unwrap();
        assert_eq!(plain.take_key(None, "r"), Taken::Tokens(16));
        assert_eq!(
            plain.take_key(None, "r"),
            Taken::Missing,
            "NIXL's table forgets"
        );
    }
}
