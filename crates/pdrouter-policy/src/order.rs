//! Helpers that turn candidates into rank orders.
//!
//! Invariants:
//! - Every helper appends distinct indices in `0..n`; together with the policies' own first
//!   picks they produce a permutation of `0..n`.
//! - Loads are read once into a snapshot ("load keys") before sorting, so a load that changes
//!   concurrently can never make the sort comparator inconsistent.
//! - A load key packs `min(load, u32::MAX) << 32 | index`: sorting keys orders by load and then
//!   by index. Loads above `u32::MAX` compare equal.
//! - Nothing is allocated for up to [`INLINE`] candidates (keys and the counting sort's
//!   buckets are kept inline): a PD request ranks its few workers twice.

use smallvec::SmallVec;

use crate::WorkerRef;

/// Candidates whose per-rank scratch stays inline (on the stack).
pub(crate) const INLINE: usize = 8;

/// Load keys, one per candidate.
pub(crate) type Keys = SmallVec<[u64; INLINE]>;

/// Snapshot of `(load, index)` for every worker, packed into sortable `u64`s.
pub(crate) fn load_keys<W: WorkerRef>(workers: &[W]) -> Keys {
    debug_assert!(u32::try_from(workers.len()).is_ok());
    workers
        .iter()
        .enumerate()
        .map(|(i, w)| pack(w.load(), i))
        .collect()
}

fn pack(load: u64, index: usize) -> u64 {
    (load.min(u64::from(u32::MAX)) << 32) | (index as u64 & 0xffff_ffff)
}

/// The (saturated) load of a key.
pub(crate) fn load_of(key: u64) -> u64 {
    key >> 32
}

/// The worker index of a key.
pub(crate) fn index_of(key: u64) -> usize {
    (key & 0xffff_ffff) as usize
}

/// Pushes `first` (if any), then every other index by ascending load (ties: lower index).
///
/// `keys` must be in index order (as [`load_keys`] returns them). When the load range is small
/// relative to the candidate count (the usual case) this is a stable counting sort, O(n + range);
/// otherwise a sort of the packed keys.
pub(crate) fn by_load(keys: &mut [u64], first: Option<usize>, out: &mut Vec<usize>) {
    out.reserve(keys.len());
    out.extend(first);
    let loads = keys.iter().map(|&k| load_of(k));
    let (Some(min), Some(max)) = (loads.clone().min(), loads.max()) else {
        return;
    };
    let range = (max - min) as usize;
    if range > 4 * keys.len() + 64 {
        keys.sort_unstable();
        out.extend(
            keys.iter()
                .map(|&k| index_of(k))
                .filter(|&i| Some(i) != first),
        );
        return;
    }
    // Up to 4 * INLINE + 65 buckets: on the stack for INLINE candidates (a plain array, not
    // a SmallVec, whose kilobyte of inline storage is copied when it is made).
    const BUCKETS: usize = 4 * INLINE + 65;
    let mut inline;
    let mut spilled;
    let starts: &mut [usize] = if range < BUCKETS {
        inline = [0usize; BUCKETS];
        &mut inline[..=range]
    } else {
        spilled = vec![0usize; range + 1];
        &mut spilled
    };
    let rest = keys.iter().filter(|&&k| Some(index_of(k)) != first);
    for &k in rest.clone() {
        starts[(load_of(k) - min) as usize] += 1;
    }
    let mut at = out.len();
    for s in starts.iter_mut() {
        let count = *s;
        *s = at;
        at += count;
    }
    out.resize(at, 0);
    for &k in rest {
        let slot = &mut starts[(load_of(k) - min) as usize];
        out[*slot] = index_of(k);
        *slot += 1;
    }
}

/// Pushes the rotation `start, start + 1, ..., n - 1, 0, ..., start - 1` (`start` taken mod
/// `n`) minus the indices in `skip` (at most [`MAX_SKIP`] of them, any order, duplicates fine).
pub(crate) fn rotation_except(n: usize, start: usize, skip: &[usize], out: &mut Vec<usize>) {
    if n == 0 {
        return;
    }
    let start = start % n;
    let mut sorted = [0usize; MAX_SKIP];
    let sorted = &mut sorted[..skip.len()];
    sorted.copy_from_slice(skip);
    sorted.sort_unstable();
    let sorted = &*sorted;
    out.reserve(n);
    // Pushes `lo..hi` minus `sorted`.
    let mut emit = |lo: usize, hi: usize| {
        let mut cur = lo;
        for &s in sorted {
            if s >= cur && s < hi {
                out.extend(cur..s);
                cur = s + 1;
            }
        }
        out.extend(cur..hi.max(cur));
    };
    emit(start, n);
    emit(0, start);
}

/// Most indices [`rotation_except`] can skip.
pub(crate) const MAX_SKIP: usize = 8;

/// Pushes `start, start + 1, ..., n - 1, 0, ..., start - 1`.
pub(crate) fn rotation(n: usize, start: usize, out: &mut Vec<usize>) {
    out.reserve(n);
    out.extend((start..n).chain(0..start.min(n)));
}

/// Whether loads spanning `min..=max` are out of balance: apart by more than `abs` and with
/// `max` above `rel` times `min`. The rule cache_aware and bucket share for giving up their
/// preference and taking the least-loaded worker.
pub(crate) fn imbalanced(min: u64, max: u64, abs: u64, rel: f32) -> bool {
    max.saturating_sub(min) > abs && max as f64 > f64::from(rel) * min as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::workers;

    #[test]
    fn by_load_orders_and_dedups_first() {
        let ws = workers(&[5, 1, 3, 1]);
        let mut keys = load_keys(&ws);
        assert_eq!(load_of(keys[0]), 5);
        assert_eq!(index_of(keys[2]), 2);
        let mut out = Vec::new();
        by_load(&mut keys, Some(2), &mut out);
        assert_eq!(out, [2, 1, 3, 0]);
        let mut keys = load_keys(&ws);
        out.clear();
        by_load(&mut keys, None, &mut out);
        assert_eq!(out, [1, 3, 2, 0]);
    }

    #[test]
    fn by_load_wide_range_uses_sort() {
        let ws = workers(&[1_000_000, 0, 500, 0, 7]);
        let mut keys = load_keys(&ws);
        let mut out = vec![42];
        by_load(&mut keys, Some(3), &mut out);
        assert_eq!(out, [42, 3, 1, 4, 2, 0]);
        let mut keys = load_keys(&ws);
        out.clear();
        by_load(&mut keys, None, &mut out);
        assert_eq!(out, [1, 3, 4, 2, 0]);
        let mut keys = load_keys(&workers(&[]));
        out.clear();
        by_load(&mut keys, None, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn rotation_except_skips() {
        let mut out = Vec::new();
        rotation_except(6, 4, &[5, 1, 1], &mut out);
        assert_eq!(out, [4, 0, 2, 3]);
        out.clear();
        rotation_except(3, 3, &[], &mut out);
        assert_eq!(out, [0, 1, 2]);
        out.clear();
        rotation_except(2, 1, &[0, 1], &mut out);
        assert!(out.is_empty());
        rotation_except(0, 0, &[], &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn huge_loads_saturate() {
        assert_eq!(load_of(pack(u64::MAX, 7)), u64::from(u32::MAX));
        assert_eq!(index_of(pack(u64::MAX, 7)), 7);
    }

    #[test]
    fn rotation_wraps() {
        let mut out = Vec::new();
        rotation(4, 2, &mut out);
        assert_eq!(out, [2, 3, 0, 1]);
        out.clear();
        rotation(3, 0, &mut out);
        assert_eq!(out, [0, 1, 2]);
    }
}
