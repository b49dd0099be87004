//! cache_aware: prefix-cache affinity with load-balance thresholds.
//!
//! Each worker (by url) has its own approximate radix tree (see `radix_tree.rs`) of the request
//! text committed to it, behind its own lock.
//!
//! rank, in order:
//! 1. No usable text (`None` or empty) → lowest load first.
//! 2. Imbalanced loads (`max - min > balance_abs_threshold` and
//!    `max > min * balance_rel_threshold`, over the candidates) → lowest load first.
//! 3. Otherwise, with `match_rate = best candidate match / text chars`: if
//!    `match_rate > cache_threshold` the best-matching candidate goes first (ties: lower load),
//!    else the candidate holding the fewest chars (ties: lower load).
//!
//! The remaining candidates always follow by ascending load (ties: lower slice position), so rank
//! writes a full permutation.
//!
//! Invariants:
//! - Only commit changes a tree (inserting the text into the chosen worker's tree); rank reads.
//!   evict and remove_worker shrink them.
//! - Locking: the url → tree map sits behind a read-write lock that is written only when a url
//!   is committed for the first time or removed; rank and commit take it for reading. rank then
//!   reads each candidate's tree under that tree's read lock, one at a time; commit writes one
//!   tree under its write lock. No state is shared between candidate sets, so a candidate set that
//!   differs on every call (admission filtering out full workers) costs nothing extra. Lock order
//!   is map, then one tree; nothing takes the map while holding a tree.
//! - Workers are identified by url: any url may appear in or vanish from the slice between calls;
//!   urls never committed match nothing and hold zero chars.
//! - Only the first [`MAX_INDEXED_CHARS`] chars of a text are indexed
//!   and matched; the match rate is computed against that truncated length.
//! - Memory: evict (the router's periodic tick) trims every tree to `max_tree_size` chars; a
//!   commit that pushes its tree past twice that evicts least-recently-used leaves until it is
//!   back within twice the limit. Each tree thus holds at most `2 × max_tree_size` chars. Eviction
//!   pops leaves off a recency list (no scan); a commit evicts at most about as many nodes as it
//!   inserted chars, and evict works in batches of [`EVICT_BATCH`] nodes, dropping the tree's lock
//!   between batches so ranks and commits for that worker interleave with a long trim.
//! - No lock is held while caller code (`WorkerRef::url`/`load`) runs: loads and urls are
//!   snapshot first.

use std::collections::HashMap;
use std::fmt;

use parking_lot::RwLock;
use smallvec::SmallVec;

use crate::hash::WordBuildHasher;
use crate::radix_tree::RadixTree;
use crate::{CacheAwareConfig, MAX_INDEXED_CHARS, RequestInfo, WorkerRef, order};

/// Most nodes evict removes from one tree per lock hold.
pub(crate) const EVICT_BATCH: usize = 1024;

/// The cache_aware policy.
pub(crate) struct CacheAware {
    config: CacheAwareConfig,
    /// Trees sit in the map itself (no `Arc`): one pointer chase less per candidate per rank.
    trees: RwLock<HashMap<Box<str>, RwLock<RadixTree>, WordBuildHasher>>,
}

impl fmt::Debug for CacheAware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("CacheAware");
        d.field("config", &self.config);
        if let Some(trees) = self.trees.try_read() {
            d.field("workers", &trees.len());
        }
        d.finish_non_exhaustive()
    }
}

/// The indexed part of a request's text and its length in chars; None when empty.
fn indexed(text: Option<&str>) -> Option<(&str, usize)> {
    let text = text?;
    let mut chars = 0;
    for (at, _) in text.char_indices() {
        if chars == MAX_INDEXED_CHARS {
            return Some((&text[..at], chars));
        }
        chars += 1;
    }
    (chars > 0).then_some((text, chars))
}

impl CacheAware {
    pub(crate) fn new(config: CacheAwareConfig) -> Self {
        Self {
            config,
            trees: RwLock::default(),
        }
    }

    fn imbalanced(&self, keys: &[u64]) -> bool {
        let loads = keys.iter().map(|&k| order::load_of(k));
        let (Some(min), Some(max)) = (loads.clone().min(), loads.max()) else {
            return false;
        };
        order::imbalanced(
            min,
            max,
            self.config.balance_abs_threshold,
            self.config.balance_rel_threshold,
        )
    }

    /// See the module docs.
    pub(crate) fn rank<W: WorkerRef>(
        &self,
        workers: &[W],
        req: &RequestInfo<'_>,
        out: &mut Vec<usize>,
    ) {
        out.clear();
        if workers.is_empty() {
            return;
        }
        let mut keys = order::load_keys(workers);
        let first = match indexed(req.text) {
            Some((text, chars)) if !self.imbalanced(&keys) => {
                Some(self.choose(workers, text, chars, &keys))
            }
            _ => None,
        };
        order::by_load(&mut keys, first, out);
    }

    /// Rule 3 of the module docs; `keys` are the unsorted load keys of `workers`.
    fn choose<W: WorkerRef>(&self, workers: &[W], text: &str, chars: usize, keys: &[u64]) -> usize {
        let urls: SmallVec<[&str; order::INLINE]> = workers.iter().map(WorkerRef::url).collect();
        // Per candidate: (matched chars, held chars).
        let seen: SmallVec<[(usize, usize); order::INLINE]> = {
            let trees = self.trees.read();
            urls.iter()
                .map(|url| {
                    trees.get(*url).map_or((0, 0), |tree| {
                        let tree = tree.read();
                        (tree.match_len(text), tree.chars())
                    })
                })
                .collect()
        };
        // Indexed below as a slice: a SmallVec checks where its items are on every index.
        let seen = &seen[..];
        // Best match, ties to the lowest key (load, then position).
        let best = (0..keys.len()).min_by_key(|&i| (std::cmp::Reverse(seen[i].0), keys[i]));
        if let Some(i) = best
            && seen[i].0 as f32 / chars as f32 > self.config.cache_threshold
        {
            return i;
        }
        (0..keys.len())
            .min_by_key(|&i| (seen[i].1, keys[i]))
            .unwrap_or(0)
    }

    /// Inserts the request text into `url`'s tree.
    pub(crate) fn commit(&self, url: &str, req: &RequestInfo<'_>) {
        let Some((text, chars)) = indexed(req.text) else {
            return;
        };
        let insert = |tree: &mut RadixTree| {
            tree.insert(text);
            // Back within twice the limit: at most one node per inserted char (plus the node
            // that crosses the line), so the work is bounded by what this commit added.
            tree.evict(self.config.max_tree_size.saturating_mul(2), chars + 1);
        };
        {
            let trees = self.trees.read();
            if let Some(tree) = trees.get(url) {
                insert(&mut tree.write());
                return;
            }
        }
        let mut trees = self.trees.write();
        insert(trees.entry(url.into()).or_default().get_mut());
    }

    /// Trims every tree to `max_tree_size` chars, least-recently-used leaves first.
    pub(crate) fn evict(&self) {
        let urls: Vec<Box<str>> = self.trees.read().keys().cloned().collect();
        for url in urls {
            // One batch per lock hold; a url removed meanwhile is simply gone.
            loop {
                let trees = self.trees.read();
                let Some(tree) = trees.get(&url) else {
                    break;
                };
                if tree.write().evict(self.config.max_tree_size, EVICT_BATCH) {
                    break;
                }
            }
        }
    }

    /// Forgets the url's tree.
    pub(crate) fn remove_worker(&self, url: &str) {
        let removed = self.trees.write().remove(url);
        // The tree is freed outside the map lock.
        drop(removed);
    }

    /// Chars held for `url`.
    pub(crate) fn cached_chars(&self, url: &str) -> usize {
        self.trees
            .read()
            .get(url)
            .map_or(0, |tree| tree.read().chars())
    }
}

#[cfg(test)]
mod tests;
