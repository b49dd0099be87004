//! random: a uniformly random first pick.
//!
//! Invariants:
//! - Stateless: rank and commit never change anything.
//! - rank writes a full permutation: the random pick, then the others in ring order after it
//!   (the fallback order carries no meaning beyond "distinct and complete").

use rand::RngExt;

use crate::order;

/// The random policy.
#[derive(Debug, Default)]
pub(crate) struct RandomPolicy;

impl RandomPolicy {
    /// See the module docs.
    pub(crate) fn rank(&self, n: usize, out: &mut Vec<usize>) {
        out.clear();
        if n == 0 {
            return;
        }
        order::rotation(n, rand::rng().random_range(0..n), out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permutation_with_uniform_first() {
        let mut out = Vec::new();
        let mut firsts = [0usize; 4];
        for _ in 0..4000 {
            RandomPolicy.rank(4, &mut out);
            let mut sorted = out.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2, 3]);
            firsts[out[0]] += 1;
        }
        // Each bucket expects 1000; 700 is > 10 standard deviations away.
        assert!(firsts.iter().all(|&c| c > 700), "{firsts:?}");
    }

    #[test]
    fn empty_and_single() {
        let mut out = vec![9];
        RandomPolicy.rank(0, &mut out);
        assert!(out.is_empty());
        RandomPolicy.rank(1, &mut out);
        assert_eq!(out, [0]);
    }
}
