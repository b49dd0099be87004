//! round_robin: cycle through the candidates.
//!
//! Invariants:
//! - The only state is one counter; rank reads it (`counter % len` goes first, then the following
//!   positions, wrapping) and never changes it; only commit advances it, by one per commit.
//! - Positions are slice positions: when the slice changes size the cycle simply continues from
//!   `counter % new_len`.

use std::sync::atomic::{AtomicUsize, Ordering};

use crate::order;

/// The round_robin policy.
#[derive(Debug, Default)]
pub(crate) struct RoundRobin {
    counter: AtomicUsize,
}

impl RoundRobin {
    /// See the module docs.
    pub(crate) fn rank(&self, n: usize, out: &mut Vec<usize>) {
        out.clear();
        if n == 0 {
            return;
        }
        order::rotation(n, self.counter.load(Ordering::Relaxed) % n, out);
    }

    /// Advances the counter.
    pub(crate) fn commit(&self) {
        self.counter.fetch_add(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_does_not_advance_commit_does() {
        let rr = RoundRobin::default();
        let mut a = Vec::new();
        let mut b = Vec::new();
        rr.rank(3, &mut a);
        rr.rank(3, &mut b);
        assert_eq!(a, [0, 1, 2]);
        assert_eq!(a, b);
        rr.commit();
        rr.rank(3, &mut a);
        assert_eq!(a, [1, 2, 0]);
        rr.commit();
        rr.commit();
        rr.rank(3, &mut a);
        assert_eq!(a, [0, 1, 2]);
    }

    #[test]
    fn follows_slice_size_changes() {
        let rr = RoundRobin::default();
        for _ in 0..5 {
            rr.commit();
        }
        let mut out = Vec::new();
        rr.rank(2, &mut out);
        assert_eq!(out, [1, 0]);
        rr.rank(4, &mut out);
        assert_eq!(out, [1, 2, 3, 0]);
        rr.rank(0, &mut out);
        assert!(out.is_empty());
    }
}
