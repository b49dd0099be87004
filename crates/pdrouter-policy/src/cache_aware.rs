//! cache_aware: prefix-cache affinity with load-balance thresholds.
//!
//! One approximate radix tree (see `radix_tree.rs`) over request text is shared by all workers;
//! each node records which worker urls hold that prefix and when each last used it.
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
//! - Only commit changes the tree (inserting the text for the chosen worker, stamping a fresh
//!   logical tick); rank reads it. evict and remove_worker shrink it.
//! - Workers are identified by url: any url may appear in or vanish from the slice between calls;
//!   urls the tree never saw match nothing and hold zero chars.
//! - Only the first [`MAX_INDEXED_CHARS`] chars of a text are indexed
//!   and matched; the match rate is computed against that truncated length.
//! - Memory: evict trims every worker to `max_tree_size` chars; between evicts, a commit that
//!   pushes its worker past twice that trims the worker on the spot. Shared nodes count once per
//!   holder, so the tree holds at most `workers × 2 × max_tree_size` chars.
//! - No lock is held while caller code (`WorkerRef::url`/`load`) runs: loads and urls are
//!   snapshot first.

use std::fmt;

use parking_lot::RwLock;

use crate::radix_tree::RadixTree;
use crate::registry::{Registry, SliceCache};
use crate::{CacheAwareConfig, MAX_INDEXED_CHARS, RequestInfo, WorkerRef, order};

/// The cache_aware policy.
pub(crate) struct CacheAware {
    config: CacheAwareConfig,
    state: RwLock<State>,
}

#[derive(Debug, Default)]
struct State {
    registry: Registry,
    tree: RadixTree,
    /// Resolution of the last slice ranked (an optimisation only).
    cache: SliceCache,
}

impl fmt::Debug for CacheAware {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut d = f.debug_struct("CacheAware");
        d.field("config", &self.config);
        if let Some(state) = self.state.try_read() {
            d.field("workers", &state.registry.len())
                .field("nodes", &state.tree.node_count());
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
            state: RwLock::default(),
        }
    }

    fn imbalanced(&self, keys: &[u64]) -> bool {
        let loads = keys.iter().map(|&k| order::load_of(k));
        let (Some(min), Some(max)) = (loads.clone().min(), loads.max()) else {
            return false;
        };
        max - min > self.config.balance_abs_threshold
            && max as f32 > min as f32 * self.config.balance_rel_threshold
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
        let urls: Vec<&str> = workers.iter().map(WorkerRef::url).collect();
        let state = self.state.read();
        let fresh = (!state.cache.matches(&state.registry, &urls))
            .then(|| SliceCache::build(&state.registry, &urls));
        let slots = fresh.as_ref().unwrap_or(&state.cache);
        let choice = state.choose(slots, text, chars, keys, self.config.cache_threshold);
        drop(state);
        if let Some(fresh) = fresh {
            let mut state = self.state.write();
            if fresh.generation() == state.registry.generation() {
                state.cache = fresh;
            }
        }
        choice
    }

    /// Inserts the request text into the tree for `url`.
    pub(crate) fn commit(&self, url: &str, req: &RequestInfo<'_>) {
        let Some((text, _)) = indexed(req.text) else {
            return;
        };
        let max = self.config.max_tree_size;
        let mut state = self.state.write();
        let state = &mut *state;
        let (id, _) = state.registry.intern(url);
        state.tree.insert(text, id);
        if state.tree.tenant_chars(id) > max.saturating_mul(2) {
            state.tree.evict_tenant(id, max);
        }
    }

    /// Trims every worker to `max_tree_size` chars.
    pub(crate) fn evict(&self) {
        self.state.write().tree.evict(self.config.max_tree_size);
    }

    /// Forgets the url's tree.
    pub(crate) fn remove_worker(&self, url: &str) {
        let mut state = self.state.write();
        if let Some(id) = state.registry.remove(url) {
            state.tree.remove_tenant(id);
        }
    }

    /// Chars held for `url`.
    pub(crate) fn cached_chars(&self, url: &str) -> usize {
        let state = self.state.read();
        state
            .registry
            .get(url)
            .map_or(0, |id| state.tree.tenant_chars(id))
    }
}

impl State {
    fn choose(
        &self,
        slots: &SliceCache,
        text: &str,
        chars: usize,
        keys: &[u64],
        threshold: f32,
    ) -> usize {
        let mut path = Vec::new();
        self.tree.match_path(text, &mut path);
        // Tenant sets are ancestor-closed, so the deepest path node holding any candidate gives
        // the best match; all candidates on it match equally and the lowest key (load) wins.
        for &(node, matched) in path.iter().rev() {
            let best = self
                .tree
                .tenants(node)
                .iter()
                .filter_map(|&(id, _)| slots.position(id))
                .map(|i| keys[i])
                .min();
            if let Some(key) = best {
                if matched as f32 / chars as f32 > threshold {
                    return order::index_of(key);
                }
                break;
            }
        }
        (0..keys.len())
            .min_by_key(|&i| {
                let held = slots.id(i).map_or(0, |id| self.tree.tenant_chars(id));
                (held, keys[i])
            })
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests;
