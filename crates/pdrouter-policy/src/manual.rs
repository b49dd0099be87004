//! manual: sticky assignment of routing keys (`X-SMG-Routing-Key`) to workers.
//!
//! The first request with a key is placed by the assignment mode; later requests with that key
//! go to the same worker for as long as it is a candidate. Unlike consistent_hashing, adding a
//! worker moves no key. When a key's worker is not a candidate (unhealthy, removed, full), the
//! key is placed again and remembers both workers, the original first, so it returns to the
//! original once that is back (at most [`MAX_WORKERS_PER_KEY`] per key).
//!
//! Invariants:
//! - rank changes nothing; commit records the reserved worker for the request's key and the
//!   key's last use (the caller's clock, in seconds).
//! - Memory is bounded: at most [`MAX_KEYS`] keys are remembered (a new key beyond that is
//!   routed by the assignment mode without being remembered), each in at most about
//!   [`MAX_KEY_BYTES`] (a longer key is remembered by a 128-bit digest of it, so two long
//!   keys share a worker only if their digests collide); keys idle for longer than
//!   `max_idle_secs` are dropped by [`Manual::expire_idle`], which the router calls periodically.
//! - No scan holds every key: keys live in [`SHARDS`] maps, each under its own lock, and
//!   expiry and a worker's removal walk them one shard at a time, so a request waits for at
//!   most one shard's walk (about 1/64 of the keys), never for all of them.
//! - A request without a key is placed by the assignment mode and remembers nothing.
//! - rank writes a full permutation: the key's worker first (if it is a candidate), then the
//!   rest in the assignment mode's order.

use std::collections::HashMap;

use parking_lot::Mutex;
use rand::RngExt;

use crate::{RequestInfo, WorkerRef, order};

/// Most workers remembered per key (the original and the latest replacement).
pub(crate) const MAX_WORKERS_PER_KEY: usize = 2;

/// Most keys remembered at once (about 100 bytes each plus the key).
pub const MAX_KEYS: usize = 1 << 20;

/// Longest routing key remembered as given; a longer one is remembered by its digest.
pub(crate) const MAX_KEY_BYTES: usize = 256;

/// How a key seen for the first time picks its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AssignmentMode {
    /// Uniformly at random.
    Random,
    /// The worker with the fewest in-flight requests.
    MinLoad,
    /// The worker with the fewest keys assigned.
    MinGroup,
}

impl AssignmentMode {
    /// Command-line names.
    pub const NAMES: [&'static str; 3] = ["random", "min_load", "min_group"];

    /// Parses a command-line name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "random" => Self::Random,
            "min_load" => Self::MinLoad,
            "min_group" => Self::MinGroup,
            _ => return None,
        })
    }
}

/// Knobs of the manual policy (SMG's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManualConfig {
    /// How a new key is placed.
    pub assignment_mode: AssignmentMode,
    /// A key unused for longer than this is forgotten.
    pub max_idle_secs: u64,
}

impl Default for ManualConfig {
    fn default() -> Self {
        Self {
            assignment_mode: AssignmentMode::Random,
            max_idle_secs: 4 * 3600,
        }
    }
}

#[derive(Debug)]
struct Entry {
    /// Oldest first; the last is the current assignment.
    urls: Vec<Box<str>>,
    last_used: u64,
}

/// Maps the keys are spread over, each under its own lock.
pub(crate) const SHARDS: usize = 64;

type Shard = HashMap<Box<str>, Entry>;

/// Keys whose current assignment is each url (for `min_group`). Locked after a shard, never
/// before one.
#[derive(Debug, Default)]
struct Counts(HashMap<Box<str>, usize>);

impl Counts {
    fn count(&mut self, url: &str, delta: isize) {
        if delta > 0 {
            *self.0.entry(url.into()).or_default() += 1;
        } else if let Some(n) = self.0.get_mut(url) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.0.remove(url);
            }
        }
    }
}

/// The manual policy.
#[derive(Debug)]
pub(crate) struct Manual {
    config: ManualConfig,
    shards: Box<[Mutex<Shard>]>,
    per_url: Mutex<Counts>,
    /// Keys remembered, over every shard.
    len: std::sync::atomic::AtomicUsize,
}

impl Manual {
    pub(crate) fn new(config: ManualConfig) -> Self {
        Self {
            config,
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::new())).collect(),
            per_url: Mutex::default(),
            len: Default::default(),
        }
    }

    fn shard(&self, key: &str) -> &Mutex<Shard> {
        &self.shards[crate::hash::hash_str(key) as usize % SHARDS]
    }

    fn key<'a>(req: &RequestInfo<'a>) -> Option<std::borrow::Cow<'a, str>> {
        let key = req.routing_key.filter(|k| !k.is_empty())?;
        if key.len() <= MAX_KEY_BYTES {
            return Some(key.into());
        }
        // NUL cannot appear in a header value, so a digest never equals a key as given.
        let (a, b) = (
            crate::hash::hash_str(key),
            crate::hash::hash_bytes(&key.as_bytes()[1..]),
        );
        Some(format!("\0{a:016x}{b:016x}").into())
    }

    /// See the module docs.
    pub(crate) fn rank<W: WorkerRef>(
        &self,
        workers: &[W],
        req: &RequestInfo<'_>,
        out: &mut Vec<usize>,
    ) {
        out.clear();
        let n = workers.len();
        if n == 0 {
            return;
        }
        let key = Self::key(req);
        let sticky = key.as_deref().and_then(|k| {
            let shard = self.shard(k).lock();
            shard.get(k).and_then(|e| {
                e.urls
                    .iter()
                    .find_map(|u| workers.iter().position(|w| w.url() == &**u))
            })
        });
        match self.config.assignment_mode {
            AssignmentMode::Random => {
                let start = rand::rng().random_range(0..n);
                out.extend(sticky);
                order::rotation_except(n, start, sticky.as_slice(), out);
            }
            AssignmentMode::MinLoad => {
                order::by_load(&mut order::load_keys(workers), sticky, out);
            }
            AssignmentMode::MinGroup => {
                let counts = self.per_url.lock();
                let mut keys: Vec<(usize, usize)> = workers
                    .iter()
                    .enumerate()
                    .map(|(i, w)| (counts.0.get(w.url()).copied().unwrap_or(0), i))
                    .collect();
                drop(counts);
                keys.sort_unstable();
                out.extend(sticky);
                out.extend(
                    keys.into_iter()
                        .map(|(_, i)| i)
                        .filter(|&i| Some(i) != sticky),
                );
            }
        }
    }

    /// Records that the request's key now goes to `url`.
    pub(crate) fn commit(&self, url: &str, req: &RequestInfo<'_>) {
        use std::sync::atomic::Ordering;
        let Some(key) = Self::key(req) else {
            return;
        };
        let mut shard = self.shard(&key).lock();
        if let Some(entry) = shard.get_mut(&*key) {
            entry.last_used = req.now_secs;
            if entry.urls.iter().any(|u| &**u == url) {
                return;
            }
            let old = entry.urls.last().cloned();
            if entry.urls.len() >= MAX_WORKERS_PER_KEY {
                entry.urls.remove(0);
            }
            entry.urls.push(url.into());
            let mut counts = self.per_url.lock();
            if let Some(old) = old {
                counts.count(&old, -1);
            }
            counts.count(url, 1);
            return;
        }
        // Claim room first, so concurrent inserts in other shards cannot overshoot.
        if self
            .len
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_KEYS).then_some(n + 1)
            })
            .is_err()
        {
            return;
        }
        shard.insert(
            key.into_owned().into_boxed_str(),
            Entry {
                urls: vec![url.into()],
                last_used: req.now_secs,
            },
        );
        self.per_url.lock().count(url, 1);
    }

    /// Forgets keys unused for longer than `max_idle_secs` at `now_secs`, one shard at a
    /// time; returns how many.
    pub(crate) fn expire_idle(&self, now_secs: u64) -> usize {
        let max_idle = self.config.max_idle_secs;
        let mut total = 0;
        for shard in &self.shards {
            let mut shard = shard.lock();
            let mut dropped: Vec<Box<str>> = Vec::new();
            shard.retain(|_, e| {
                let keep = now_secs.saturating_sub(e.last_used) <= max_idle;
                if !keep && let Some(u) = e.urls.last() {
                    dropped.push(u.clone());
                }
                keep
            });
            if dropped.is_empty() {
                continue;
            }
            let mut counts = self.per_url.lock();
            for u in &dropped {
                counts.count(u, -1);
            }
            drop(counts);
            self.len
                .fetch_sub(dropped.len(), std::sync::atomic::Ordering::AcqRel);
            total += dropped.len();
        }
        total
    }

    /// Forgets the url in every key (a removed worker), one shard at a time: keys left with
    /// no worker are dropped, a key whose current worker it was counts for its other one.
    pub(crate) fn remove_worker(&self, url: &str) {
        for shard in &self.shards {
            let mut shard = shard.lock();
            let (mut moved, mut gone): (Vec<Box<str>>, usize) = (Vec::new(), 0);
            shard.retain(|_, e| {
                let was_current = e.urls.last().is_some_and(|u| &**u == url);
                e.urls.retain(|u| &**u != url);
                match e.urls.last() {
                    None => {
                        gone += 1;
                        false
                    }
                    Some(now) => {
                        if was_current {
                            moved.push(now.clone());
                        }
                        true
                    }
                }
            });
            if !moved.is_empty() {
                let mut counts = self.per_url.lock();
                for u in &moved {
                    counts.count(u, 1);
                }
            }
            self.len
                .fetch_sub(gone, std::sync::atomic::Ordering::AcqRel);
        }
        self.per_url.lock().0.remove(url);
    }

    /// Keys currently remembered.
    pub(crate) fn keys(&self) -> usize {
        self.len.load(std::sync::atomic::Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{W, workers};

    fn req(key: &str, now: u64) -> RequestInfo<'_> {
        RequestInfo {
            routing_key: Some(key),
            now_secs: now,
            ..Default::default()
        }
    }

    fn route(m: &Manual, ws: &[W], key: &str, now: u64) -> usize {
        let mut out = Vec::new();
        m.rank(ws, &req(key, now), &mut out);
        let mut sorted = out.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..ws.len()).collect::<Vec<_>>());
        m.commit(&ws[out[0]].url, &req(key, now));
        out[0]
    }

    fn manual(mode: AssignmentMode) -> Manual {
        Manual::new(ManualConfig {
            assignment_mode: mode,
            max_idle_secs: 100,
        })
    }

    #[test]
    fn a_key_sticks_to_its_first_worker_even_when_workers_are_added() {
        for mode in [
            AssignmentMode::Random,
            AssignmentMode::MinLoad,
            AssignmentMode::MinGroup,
        ] {
            let m = manual(mode);
            let ws = workers(&[0, 0, 0]);
            let first = route(&m, &ws, "user-1", 0);
            let mut more = ws.clone();
            more.extend(workers(&[0, 0, 0, 0, 0]).into_iter().skip(3));
            for now in 1..20 {
                assert_eq!(route(&m, &more, "user-1", now), first, "{mode:?}");
            }
        }
    }

    #[test]
    fn rank_alone_remembers_nothing() {
        let m = manual(AssignmentMode::Random);
        let ws = workers(&[0; 4]);
        let mut out = Vec::new();
        m.rank(&ws, &req("k", 0), &mut out);
        assert_eq!(m.keys(), 0);
    }

    #[test]
    fn failover_then_back_to_the_original() {
        let m = manual(AssignmentMode::MinLoad);
        let ws = workers(&[0, 5, 9]);
        assert_eq!(route(&m, &ws, "k", 0), 0);
        // w0 not a candidate: the key moves to the least loaded of the rest...
        let without: Vec<W> = ws[1..].to_vec();
        assert_eq!(without[route(&m, &without, "k", 1)].url, "http://w1");
        // ...and returns to w0 when it is back.
        assert_eq!(route(&m, &ws, "k", 2), 0);
    }

    #[test]
    fn min_group_balances_keys_and_min_load_follows_load() {
        let m = manual(AssignmentMode::MinGroup);
        let ws = workers(&[0, 0, 0]);
        let mut per = [0; 3];
        for i in 0..30 {
            per[route(&m, &ws, &format!("k{i}"), 0)] += 1;
        }
        assert_eq!(per, [10, 10, 10]);
        let m = manual(AssignmentMode::MinLoad);
        assert_eq!(route(&m, &workers(&[3, 1, 2]), "x", 0), 1);
    }

    #[test]
    fn long_keys_are_remembered_by_a_bounded_digest_and_stay_sticky() {
        let m = manual(AssignmentMode::Random);
        let ws = workers(&[0, 0, 0]);
        let long = "k".repeat(8 * 1024);
        let other = format!("{}x", "k".repeat(8 * 1024 - 1));
        let mut out = Vec::new();
        m.rank(&ws, &req(&long, 1), &mut out);
        let first = out[0];
        m.commit(&ws[first].url, &req(&long, 1));
        for _ in 0..8 {
            out.clear();
            m.rank(&ws, &req(&long, 2), &mut out);
            assert_eq!(out[0], first, "the long key stays on its worker");
        }
        m.commit(&ws[0].url, &req(&other, 2));
        assert_eq!(m.keys(), 2, "two long keys, two entries");
        for shard in m.shards.iter() {
            assert!(shard.lock().keys().all(|k| k.len() <= MAX_KEY_BYTES));
        }
    }

    #[test]
    fn idle_keys_expire_and_used_ones_stay() {
        let m = manual(AssignmentMode::Random);
        let ws = workers(&[0; 3]);
        route(&m, &ws, "old", 0);
        route(&m, &ws, "busy", 0);
        route(&m, &ws, "busy", 150);
        assert_eq!(m.expire_idle(100), 0, "idle exactly max_idle_secs stays");
        assert_eq!(m.expire_idle(101), 1);
        assert_eq!(m.keys(), 1);
        assert_eq!(m.expire_idle(250), 0);
        assert_eq!(m.expire_idle(251), 1);
        assert_eq!(m.keys(), 0);
        assert!(m.per_url.lock().0.is_empty(), "group counts back to zero");
    }

    #[test]
    fn no_key_remembers_nothing_and_removed_worker_is_forgotten() {
        let m = manual(AssignmentMode::MinGroup);
        let ws = workers(&[0; 2]);
        let mut out = Vec::new();
        let none = RequestInfo::default();
        m.rank(&ws, &none, &mut out);
        m.commit(&ws[out[0]].url, &none);
        assert_eq!(m.keys(), 0);
        let w = route(&m, &ws, "k", 0);
        m.remove_worker(&ws[w].url);
        assert_eq!(m.keys(), 0);
        assert!(m.per_url.lock().0.is_empty());
    }

    /// Keys spread over every shard; a removed worker's keys move their group count to their
    /// other worker, and expiry walks every shard.
    #[test]
    fn group_counts_follow_keys_across_shards() {
        let m = manual(AssignmentMode::MinGroup);
        let ws = workers(&[0; 3]);
        for k in 0..600 {
            route(&m, &ws, &format!("key-{k}"), 0);
        }
        assert_eq!(m.keys(), 600);
        assert!(
            m.shards.iter().all(|s| !s.lock().is_empty()),
            "every shard used"
        );
        let total = |m: &Manual| m.per_url.lock().0.values().sum::<usize>();
        assert_eq!(total(&m), 600);
        // min_group spread them evenly.
        assert!(m.per_url.lock().0.values().all(|&n| n == 200));
        m.remove_worker(&ws[0].url);
        assert_eq!(m.keys(), 400, "keys only on the removed worker are gone");
        assert_eq!(total(&m), 400);
        assert_eq!(m.expire_idle(1_000), 400);
        assert_eq!((m.keys(), total(&m)), (0, 0));
    }
}
