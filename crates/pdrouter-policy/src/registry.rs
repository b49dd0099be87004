//! Url interning for consistent_hashing.
//!
//! Workers are identified by url only; a [`Registry`] maps each url it has seen to a dense
//! [`WorkerId`] so per-worker state can live in plain vectors. A [`SliceCache`] remembers how the
//! last `workers` slice resolved, so a rank over an unchanged slice costs one string comparison
//! per worker instead of one hash-map lookup.
//!
//! Invariants:
//! - A live url has exactly one id and an id belongs to at most one live url. Removed ids are
//!   reused, so whoever owns per-id state must clear it before (or when) removing the url.
//! - `generation` increases on every intern of a new url and every removal. A [`SliceCache`] is
//!   valid only for the generation it was built at, so a reused id can never be misattributed.

use std::collections::HashMap;

use crate::hash::FnvBuildHasher;

/// Dense id of an interned worker url.
pub(crate) type WorkerId = u32;

/// Url <-> id table.
#[derive(Debug, Default)]
pub(crate) struct Registry {
    by_url: HashMap<Box<str>, WorkerId, FnvBuildHasher>,
    urls: Vec<Option<Box<str>>>,
    free: Vec<WorkerId>,
    generation: u64,
}

impl Registry {
    /// The id of `url`, if it is interned.
    pub(crate) fn get(&self, url: &str) -> Option<WorkerId> {
        self.by_url.get(url).copied()
    }

    /// Returns the id of `url`, interning it if needed; the flag tells whether it was new.
    pub(crate) fn intern(&mut self, url: &str) -> (WorkerId, bool) {
        if let Some(id) = self.get(url) {
            return (id, false);
        }
        let boxed: Box<str> = url.into();
        let id = match self.free.pop() {
            Some(id) => {
                self.urls[id as usize] = Some(boxed.clone());
                id
            }
            None => {
                let id = WorkerId::try_from(self.urls.len()).expect("fewer than 2^32 workers");
                self.urls.push(Some(boxed.clone()));
                id
            }
        };
        self.by_url.insert(boxed, id);
        self.generation += 1;
        (id, true)
    }

    /// Forgets `url`, returning the id it had.
    pub(crate) fn remove(&mut self, url: &str) -> Option<WorkerId> {
        let id = self.by_url.remove(url)?;
        self.urls[id as usize] = None;
        self.free.push(id);
        self.generation += 1;
        Some(id)
    }

    /// The url interned under `id`.
    pub(crate) fn url(&self, id: WorkerId) -> Option<&str> {
        self.urls.get(id as usize)?.as_deref()
    }

    /// Every id handed out so far is below this.
    pub(crate) fn capacity(&self) -> usize {
        self.urls.len()
    }

    /// Number of live urls.
    pub(crate) fn len(&self) -> usize {
        self.by_url.len()
    }

    /// Changes whenever the url <-> id mapping changes.
    pub(crate) fn generation(&self) -> u64 {
        self.generation
    }
}

/// How one `workers` slice (by position) resolved against a [`Registry`] generation.
#[derive(Debug, Default)]
pub(crate) struct SliceCache {
    generation: u64,
    urls: Vec<Box<str>>,
    /// By id: the first slice position holding that id, or `u32::MAX`.
    pos: Vec<u32>,
    distinct: usize,
}

const ABSENT: u32 = u32::MAX;

impl SliceCache {
    /// Resolves `urls` (a slice's urls, in order) against `registry`.
    pub(crate) fn build(registry: &Registry, urls: &[&str]) -> Self {
        let mut pos = vec![ABSENT; registry.capacity()];
        let mut distinct = 0;
        for (i, url) in urls.iter().enumerate() {
            let Some(id) = registry.get(url) else {
                continue;
            };
            let slot = &mut pos[id as usize];
            if *slot == ABSENT {
                *slot = u32::try_from(i).unwrap_or(ABSENT);
                distinct += 1;
            }
        }
        Self {
            generation: registry.generation(),
            urls: urls.iter().map(|&u| u.into()).collect(),
            pos,
            distinct,
        }
    }

    /// Whether this cache still describes `urls` under `registry`.
    pub(crate) fn matches(&self, registry: &Registry, urls: &[&str]) -> bool {
        self.generation == registry.generation()
            && self.urls.len() == urls.len()
            && self.urls.iter().zip(urls).all(|(a, b)| **a == **b)
    }

    /// The first slice position of `id`, if the slice holds it.
    pub(crate) fn position(&self, id: WorkerId) -> Option<usize> {
        match self.pos.get(id as usize) {
            Some(&p) if p != ABSENT => Some(p as usize),
            _ => None,
        }
    }

    /// Number of distinct interned urls in the slice.
    pub(crate) fn distinct(&self) -> usize {
        self.distinct
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intern_remove_reuse() {
        let mut r = Registry::default();
        assert_eq!(r.intern("a"), (0, true));
        assert_eq!(r.intern("b"), (1, true));
        assert_eq!(r.intern("a"), (0, false));
        let g = r.generation();
        assert_eq!(r.remove("a"), Some(0));
        assert!(r.generation() > g);
        assert_eq!(r.remove("a"), None);
        assert_eq!(r.get("a"), None);
        assert_eq!(r.intern("c"), (0, true));
        assert_eq!(r.url(0), Some("c"));
        assert_eq!(r.len(), 2);
        assert_eq!(r.capacity(), 2);
    }

    #[test]
    fn slice_cache_resolves_and_invalidates() {
        let mut r = Registry::default();
        r.intern("a");
        r.intern("b");
        let urls = ["b", "x", "a", "b"];
        let c = SliceCache::build(&r, &urls);
        assert!(c.matches(&r, &urls));
        assert!(!c.matches(&r, &["b", "x", "a"]));
        assert!(!c.matches(&r, &["b", "x", "a", "a"]));
        assert_eq!(c.position(1), Some(0));
        assert_eq!(c.position(0), Some(2));
        assert_eq!(c.distinct(), 2);
        r.intern("x");
        assert!(!c.matches(&r, &urls));
    }
}
