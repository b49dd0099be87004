//! consistent_hashing: a hash ring of virtual nodes over worker urls.
//!
//! Each url owns [`VNODES_PER_WORKER`] points `hash(url, i)` on a 64-bit ring (deterministic
//! FNV-1a + finalizer, see `hash.rs`). A request's key is its routing key, else its text, else a
//! random point. rank walks the ring clockwise from `hash(key)` and yields distinct workers that
//! are present in the current slice.
//!
//! Invariants:
//! - The ring is a pure function of the set of urls it holds; hashing is seed-free, so the same
//!   key maps to the same worker across calls, processes and replicas while the set is unchanged.
//! - The ring may hold urls absent from the current slice (they are skipped). Skipping a url is
//!   exactly equivalent to a ring without it, so removing (or filtering out) one worker only moves
//!   the keys that were on it, and adding one only moves keys onto it.
//! - The ring is rebuilt (re-sorted) only when a url it has never seen shows up, or pruned when
//!   absent urls outnumber present ones; an unchanged slice costs one string comparison per
//!   worker plus a binary search and a short walk.
//! - rank writes a full permutation: up to [`RING_PREFIX`] distinct workers in ring order, then
//!   every other worker in slice order starting after the first pick.
//! - commit changes nothing; rank only maintains the ring cache described above.

use parking_lot::RwLock;
use rand::RngExt;

use std::fmt;

use crate::hash::{derive, hash_str};
use crate::registry::{Registry, SliceCache, WorkerId};
use crate::{RequestInfo, WorkerRef, order};

/// Virtual nodes per worker url.
pub(crate) const VNODES_PER_WORKER: u32 = 160;

/// How many workers rank takes from the ring walk before falling back to slice order.
pub(crate) const RING_PREFIX: usize = 4;

/// The consistent_hashing policy.
#[derive(Debug, Default)]
pub(crate) struct ConsistentHash {
    ring: RwLock<Ring>,
}

#[derive(Default)]
struct Ring {
    registry: Registry,
    /// Sorted `(point, worker)`.
    vnodes: Vec<(u64, WorkerId)>,
    cache: SliceCache,
}

impl fmt::Debug for Ring {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ring")
            .field("workers", &self.registry.len())
            .field("vnodes", &self.vnodes.len())
            .finish_non_exhaustive()
    }
}

/// The ring points of one url.
fn vnode_points(url: &str) -> impl Iterator<Item = u64> {
    let base = hash_str(url);
    (0..u64::from(VNODES_PER_WORKER)).map(move |i| derive(base, i))
}

impl Ring {
    /// Makes the ring hold every url of the slice and refreshes the slice cache.
    fn sync(&mut self, urls: &[&str]) {
        let mut added = false;
        for &url in urls {
            let (id, new) = self.registry.intern(url);
            if new {
                added = true;
                self.vnodes.extend(vnode_points(url).map(|p| (p, id)));
            }
        }
        if added {
            self.vnodes.sort_unstable();
        }
        self.cache = SliceCache::build(&self.registry, urls);
        // Bound memory when urls churn without remove_worker: drop absent urls once they
        // outnumber present ones. Equivalent for routing, since absent urls are skipped anyway.
        if self.registry.len() > 2 * self.cache.distinct() + 16 {
            let absent: Vec<WorkerId> = (0..self.registry.capacity() as WorkerId)
                .filter(|&id| self.registry.url(id).is_some() && self.cache.position(id).is_none())
                .collect();
            for &id in &absent {
                if let Some(url) = self.registry.url(id).map(str::to_owned) {
                    self.registry.remove(&url);
                }
            }
            let cache = &self.cache;
            self.vnodes.retain(|&(_, id)| cache.position(id).is_some());
            self.cache = SliceCache::build(&self.registry, urls);
        }
    }

    fn remove(&mut self, url: &str) {
        if let Some(id) = self.registry.remove(url) {
            self.vnodes.retain(|&(_, w)| w != id);
        }
    }

    /// Writes the rank order for a ring point; the cache must match the slice of `n` workers.
    fn walk(&self, point: u64, n: usize, out: &mut Vec<usize>) {
        out.reserve(n);
        let target = self.cache.distinct().min(RING_PREFIX);
        if target > 0 {
            let start = self.vnodes.partition_point(|&(p, _)| p < point);
            let (before, after) = self.vnodes.split_at(start);
            for &(_, id) in after.iter().chain(before) {
                if let Some(i) = self.cache.position(id)
                    && !out.contains(&i)
                {
                    out.push(i);
                    if out.len() == target {
                        break;
                    }
                }
            }
        }
        let mut head = [0usize; RING_PREFIX];
        let h = out.len();
        head[..h].copy_from_slice(out);
        order::rotation_except(n, out.first().map_or(0, |&f| f + 1), &head[..h], out);
    }
}

impl ConsistentHash {
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
        let key = req
            .routing_key
            .filter(|k| !k.is_empty())
            .or(req.text.filter(|t| !t.is_empty()));
        let point = match key {
            Some(key) => hash_str(key),
            None => rand::rng().random(),
        };
        self.rank_point(workers, point, out);
    }

    /// Ranks from a ring point computed by the caller (prefix_hash's token key).
    pub(crate) fn rank_point<W: WorkerRef>(&self, workers: &[W], point: u64, out: &mut Vec<usize>) {
        out.clear();
        let n = workers.len();
        if n == 0 {
            return;
        }
        let urls: Vec<&str> = workers.iter().map(WorkerRef::url).collect();
        {
            let ring = self.ring.read();
            if ring.cache.matches(&ring.registry, &urls) {
                return ring.walk(point, n, out);
            }
        }
        let mut ring = self.ring.write();
        if !ring.cache.matches(&ring.registry, &urls) {
            ring.sync(&urls);
        }
        ring.walk(point, n, out);
    }

    /// Drops the url's virtual nodes.
    pub(crate) fn remove_worker(&self, url: &str) {
        self.ring.write().remove(url);
    }

    #[cfg(test)]
    fn ring_len(&self) -> usize {
        self.ring.read().vnodes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{W, named, workers};

    fn first(ch: &ConsistentHash, ws: &[W], key: &str) -> String {
        let mut out = Vec::new();
        let req = RequestInfo {
            routing_key: Some(key),
            ..Default::default()
        };
        ch.rank(ws, &req, &mut out);
        ws[out[0]].url.clone()
    }

    fn keys() -> Vec<String> {
        (0..2000).map(|i| format!("session-{i}")).collect()
    }

    #[test]
    fn same_key_same_worker_and_full_permutation() {
        let ch = ConsistentHash::default();
        let ws = workers(&[0; 16]);
        let mut a = Vec::new();
        let mut b = Vec::new();
        let req = RequestInfo {
            routing_key: Some("user-42"),
            text: Some("ignored when a routing key is present"),
            ..Default::default()
        };
        ch.rank(&ws, &req, &mut a);
        ch.rank(&ws, &req, &mut b);
        assert_eq!(a, b);
        let mut sorted = a.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..16).collect::<Vec<_>>());
        // Deterministic across instances (no per-process seed).
        let other = ConsistentHash::default();
        other.rank(&ws, &req, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn text_is_the_fallback_key() {
        let ch = ConsistentHash::default();
        let ws = workers(&[0; 8]);
        let by_text = RequestInfo {
            text: Some("prompt"),
            ..Default::default()
        };
        let by_key = RequestInfo {
            routing_key: Some("prompt"),
            ..Default::default()
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        ch.rank(&ws, &by_text, &mut a);
        ch.rank(&ws, &by_key, &mut b);
        assert_eq!(a, b);
    }

    #[test]
    fn no_key_is_random_but_complete() {
        let ch = ConsistentHash::default();
        let ws = workers(&[0; 4]);
        let mut out = Vec::new();
        let mut seen = [false; 4];
        for _ in 0..400 {
            ch.rank(&ws, &RequestInfo::default(), &mut out);
            assert_eq!(out.len(), 4);
            seen[out[0]] = true;
        }
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn keys_spread_over_workers() {
        let ch = ConsistentHash::default();
        let ws = workers(&[0; 8]);
        let mut counts = std::collections::HashMap::new();
        for k in keys() {
            *counts.entry(first(&ch, &ws, &k)).or_insert(0usize) += 1;
        }
        assert_eq!(counts.len(), 8);
        // 250 expected each; 160 vnodes keep the spread well within 2x.
        assert!(
            counts.values().all(|&c| (125..500).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn removing_a_worker_only_moves_its_keys() {
        let ch = ConsistentHash::default();
        let ws = workers(&[0; 10]);
        let before: Vec<String> = keys().iter().map(|k| first(&ch, &ws, k)).collect();
        let removed = ws[3].url.clone();
        let fewer: Vec<W> = ws.iter().filter(|w| w.url != removed).cloned().collect();
        // Both by filtering the slice and by remove_worker.
        for explicit in [false, true] {
            if explicit {
                ch.remove_worker(&removed);
                assert_eq!(ch.ring_len(), 9 * VNODES_PER_WORKER as usize);
            }
            for (k, old) in keys().iter().zip(&before) {
                let new = first(&ch, &fewer, k);
                if *old == removed {
                    assert_ne!(new, removed);
                } else {
                    assert_eq!(&new, old, "key {k} moved off a surviving worker");
                }
            }
        }
    }

    #[test]
    fn adding_a_worker_only_moves_keys_onto_it() {
        let ch = ConsistentHash::default();
        let ws = workers(&[0; 10]);
        let fewer = &ws[..9];
        let before: Vec<String> = keys().iter().map(|k| first(&ch, fewer, k)).collect();
        let mut moved = 0;
        for (k, old) in keys().iter().zip(&before) {
            let new = first(&ch, &ws, k);
            if new != *old {
                assert_eq!(new, ws[9].url);
                moved += 1;
            }
        }
        assert!(moved > 50, "{moved}");
    }

    #[test]
    fn reordered_slice_keeps_mapping_by_url() {
        let ch = ConsistentHash::default();
        let ws = workers(&[0; 6]);
        let mut rev = ws.clone();
        rev.reverse();
        for k in keys().iter().take(200) {
            assert_eq!(first(&ch, &ws, k), first(&ch, &rev, k));
        }
    }

    #[test]
    fn duplicates_and_absent_urls_stay_distinct() {
        let ch = ConsistentHash::default();
        let ws = named(&["a", "b", "a", "c", "b"]);
        let mut out = Vec::new();
        for k in keys().iter().take(50) {
            let req = RequestInfo {
                routing_key: Some(k),
                ..Default::default()
            };
            ch.rank(&ws, &req, &mut out);
            let mut sorted = out.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2, 3, 4]);
        }
    }

    #[test]
    fn churn_is_pruned() {
        let ch = ConsistentHash::default();
        let mut out = Vec::new();
        for round in 0..50 {
            let ws = named(&[&format!("gen{round}-a"), &format!("gen{round}-b")]);
            ch.rank(&ws, &RequestInfo::default(), &mut out);
            assert_eq!(out.len(), 2);
        }
        assert!(ch.ring_len() <= (2 * 2 + 16 + 2) * VNODES_PER_WORKER as usize);
    }
}
