//! power_of_two: sample two distinct candidates, prefer the less loaded.
//!
//! Invariants:
//! - Stateless: rank and commit never change anything.
//! - Only the two sampled candidates' loads are read. The lower-loaded one goes first (a tie is
//!   broken at random), the other second, then the rest as a fallback in ring order after the
//!   first sample. With one candidate it is returned alone.

use rand::RngExt;

use crate::{WorkerRef, order};

/// The power_of_two policy.
#[derive(Debug, Default)]
pub(crate) struct PowerOfTwo;

impl PowerOfTwo {
    /// See the module docs.
    pub(crate) fn rank<W: WorkerRef>(&self, workers: &[W], out: &mut Vec<usize>) {
        out.clear();
        let n = workers.len();
        match n {
            0 => return,
            1 => return out.push(0),
            _ => {}
        }
        let mut rng = rand::rng();
        let a = rng.random_range(0..n);
        let mut b = rng.random_range(0..n - 1);
        if b >= a {
            b += 1;
        }
        let (la, lb) = (workers[a].load(), workers[b].load());
        let a_first = la < lb || (la == lb && rng.random::<bool>());
        let (first, second) = if a_first { (a, b) } else { (b, a) };
        out.reserve(n);
        out.push(first);
        out.push(second);
        order::rotation_except(n, a + 1, &[a, b], out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::workers;

    fn check_permutation(out: &[usize], n: usize) {
        let mut sorted = out.to_vec();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..n).collect::<Vec<_>>());
    }

    #[test]
    fn prefers_lower_of_the_two() {
        let ws = workers(&[10, 0]);
        let mut out = Vec::new();
        for _ in 0..100 {
            PowerOfTwo.rank(&ws, &mut out);
            assert_eq!(out, [1, 0]);
        }
    }

    #[test]
    fn never_puts_the_most_loaded_first_and_spreads() {
        let ws = workers(&[5, 1, 9, 3]);
        let mut out = Vec::new();
        let mut firsts = [0usize; 4];
        for _ in 0..2000 {
            PowerOfTwo.rank(&ws, &mut out);
            check_permutation(&out, 4);
            assert!(ws[out[0]].load <= ws[out[1]].load);
            firsts[out[0]] += 1;
        }
        assert_eq!(firsts[2], 0);
        // Worker 3 wins whenever paired with 0 or 2: 2 of 6 pairs.
        assert!(firsts[3] > 400, "{firsts:?}");
    }

    #[test]
    fn ties_are_random() {
        let ws = workers(&[4, 4]);
        let mut out = Vec::new();
        let mut zero_first = 0;
        for _ in 0..1000 {
            PowerOfTwo.rank(&ws, &mut out);
            zero_first += usize::from(out[0] == 0);
        }
        assert!((300..700).contains(&zero_first), "{zero_first}");
    }

    #[test]
    fn single_and_empty() {
        let mut out = vec![3];
        PowerOfTwo.rank(&workers(&[]), &mut out);
        assert!(out.is_empty());
        PowerOfTwo.rank(&workers(&[7]), &mut out);
        assert_eq!(out, [0]);
    }
}
