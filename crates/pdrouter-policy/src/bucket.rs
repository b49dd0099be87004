//! bucket: each worker takes a range of request lengths, ranges adapted to the traffic.
//!
//! Meant for Prefill workers, whose work grows with the prompt: short and long prompts go to
//! different workers so a short one never queues behind a long one. The length of a request is
//! its text's character count. Worker `i` (in the order the policy first saw them) owns the
//! lengths up to `upper[i]`, the last one everything above. (Workers are ordered as first
//! seen.) Initially the first
//! [`INITIAL_SPAN`] characters are split evenly; every [`ADJUST_INTERVAL_SECS`]
//! ([`Bucket::adjust`], called by the router) the bounds are recomputed from the lengths
//! committed within the last interval, so that each worker gets about the same number of
//! characters.
//!
//! Invariants:
//! - rank changes no choice-derived state (it only adds workers it has not seen to the
//!   ranges, in candidate order). It puts first the worker whose range holds the request's length,
//!   then the others by characters committed to them in the window (fewest first). When the
//!   window (as of the last commit or adjust) is imbalanced (max − min above `balance_abs_threshold` and max above
//!   `balance_rel_threshold ×` min, over the candidates) the length is ignored and the order
//!   is by characters alone.
//! - commit records `(now, length, worker)` in the window; entries older than the window are
//!   dropped on every commit and adjust, and the window holds at most [`MAX_WINDOW`] entries,
//!   so memory is bounded whatever the traffic.
//! - Bounds are strictly increasing and the last is unbounded, so every length has a worker.
//! - Bounds are recomputed only when the per-worker share of the window moved by more than
//!   a factor of two since the last recomputation (no churn on steady traffic), or when the
//!   worker set changed (then the even initial split is restored).

use std::collections::{HashMap, VecDeque};

use parking_lot::Mutex;

use crate::{RequestInfo, WorkerRef, order};

/// Seconds between recomputations of the bounds, and the length of the window they use.
pub const ADJUST_INTERVAL_SECS: u64 = 5;

/// Lengths split evenly between the workers before any traffic was seen.
pub(crate) const INITIAL_SPAN: u64 = 4096;

/// Most requests the window remembers (oldest dropped first).
pub(crate) const MAX_WINDOW: usize = 100_000;

/// Thresholds of the bucket policy (shared with cache_aware's flags, as in SMG).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketConfig {
    /// Absolute spread of windowed characters that counts as imbalance.
    pub balance_abs_threshold: u64,
    /// ...when max is also above min times this.
    pub balance_rel_threshold: f32,
}

#[derive(Debug)]
struct Seen {
    at: u64,
    chars: u64,
    url: Box<str>,
}

#[derive(Debug, Default)]
struct State {
    urls: Vec<Box<str>>,
    /// Inclusive upper bound of each url's range; the last is `u64::MAX`.
    upper: Vec<u64>,
    window: VecDeque<Seen>,
    chars: HashMap<Box<str>, u64>,
    /// Per-worker share of the window at the last recomputation.
    share: u64,
}

impl State {
    fn even_split(&mut self) {
        let n = self.urls.len() as u64;
        self.upper = (1..=n)
            .map(|i| {
                if i == n {
                    u64::MAX
                } else {
                    i * (INITIAL_SPAN / n).max(1) - 1
                }
            })
            .collect();
        self.share = 0;
    }

    fn expire(&mut self, now: u64) {
        while let Some(front) = self.window.front() {
            if now.saturating_sub(front.at) <= ADJUST_INTERVAL_SECS
                && self.window.len() <= MAX_WINDOW
            {
                break;
            }
            if let Some(old) = self.window.pop_front()
                && let Some(c) = self.chars.get_mut(&old.url)
            {
                *c = c.saturating_sub(old.chars);
            }
        }
    }

    /// The url whose range holds `len`.
    fn owner(&self, len: u64) -> Option<&str> {
        let i = self.upper.partition_point(|&u| u < len);
        self.urls.get(i).map(|u| &**u)
    }

    /// Recomputes the bounds from the window's lengths (see the module docs).
    fn rebalance(&mut self) {
        let n = self.urls.len();
        if n == 0 || self.window.is_empty() {
            return;
        }
        let mut lens: Vec<u64> = self.window.iter().map(|s| s.chars).collect();
        lens.sort_unstable();
        let total: u64 = lens.iter().fold(0, |a, &b| a.saturating_add(b));
        let share = (total / n as u64).max(1);
        let old = self.share;
        if old != 0 && share <= 2 * old && old <= 2 * share {
            return;
        }
        self.share = share;
        let mut upper = Vec::with_capacity(n);
        let mut acc = 0u64;
        let mut lens = lens.into_iter().peekable();
        while upper.len() + 1 < n {
            let floor = upper.last().map_or(0, |&u: &u64| u + 1);
            match lens.next() {
                Some(len) => {
                    acc = acc.saturating_add(len);
                    // Equal lengths stay in one range.
                    if acc >= share && lens.peek() != Some(&len) {
                        upper.push(len.max(floor));
                        acc = 0;
                    }
                }
                None => upper.push(floor.saturating_add(share)),
            }
        }
        upper.push(u64::MAX);
        self.upper = upper;
    }
}

/// The bucket policy.
#[derive(Debug)]
pub(crate) struct Bucket {
    config: BucketConfig,
    state: Mutex<State>,
}

fn length(req: &RequestInfo<'_>) -> u64 {
    req.text.map_or(0, |t| t.chars().count() as u64)
}

impl Bucket {
    pub(crate) fn new(config: BucketConfig) -> Self {
        Self {
            config,
            state: Mutex::new(State::default()),
        }
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
        let mut state = self.state.lock();
        // Workers join the ranges as they are first seen (derived from the worker set, not
        // from any choice, so rank may record it).
        if workers
            .iter()
            .any(|w| !state.urls.iter().any(|u| **u == *w.url()))
        {
            for w in workers {
                if !state.urls.iter().any(|u| **u == *w.url()) {
                    state.urls.push(w.url().into());
                }
            }
            state.even_split();
        }
        let chars: Vec<u64> = workers
            .iter()
            .map(|w| state.chars.get(w.url()).copied().unwrap_or(0))
            .collect();
        let owner = state.owner(length(req)).map(str::to_owned);
        drop(state);
        let (min, max) = (
            chars.iter().copied().min().unwrap_or(0),
            chars.iter().copied().max().unwrap_or(0),
        );
        let imbalanced = order::imbalanced(
            min,
            max,
            self.config.balance_abs_threshold,
            self.config.balance_rel_threshold,
        );
        let first = if imbalanced {
            None
        } else {
            owner.and_then(|o| workers.iter().position(|w| w.url() == o))
        };
        // Reuse the load ordering with the windowed characters as the "load".
        let mut keys: order::Keys = chars
            .iter()
            .enumerate()
            .map(|(i, &c)| (c.min(u64::from(u32::MAX)) << 32) | i as u64)
            .collect();
        order::by_load(&mut keys, first, out);
    }

    /// Records the reserved worker for this request.
    pub(crate) fn commit(&self, url: &str, req: &RequestInfo<'_>) {
        let len = length(req);
        let mut state = self.state.lock();
        if !state.urls.iter().any(|u| &**u == url) {
            state.urls.push(url.into());
            state.even_split();
        }
        state.expire(req.now_secs);
        state.window.push_back(Seen {
            at: req.now_secs,
            chars: len,
            url: url.into(),
        });
        *state.chars.entry(url.into()).or_default() += len;
        state.expire(req.now_secs);
    }

    /// Drops entries older than the window and recomputes the bounds if due.
    pub(crate) fn adjust(&self, now_secs: u64) {
        let mut state = self.state.lock();
        state.expire(now_secs);
        state.rebalance();
    }

    pub(crate) fn remove_worker(&self, url: &str) {
        let mut state = self.state.lock();
        let before = state.urls.len();
        state.urls.retain(|u| &**u != url);
        if state.urls.len() != before {
            state.even_split();
        }
        state.window.retain(|s| &*s.url != url);
        state.chars.remove(url);
    }

    #[cfg(test)]
    fn upper(&self) -> Vec<u64> {
        self.state.lock().upper.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{W, workers};

    fn bucket(abs: u64, rel: f32) -> Bucket {
        Bucket::new(BucketConfig {
            balance_abs_threshold: abs,
            balance_rel_threshold: rel,
        })
    }

    fn route(b: &Bucket, ws: &[W], len: usize, now: u64) -> usize {
        let text = "a".repeat(len);
        let req = RequestInfo {
            text: Some(&text),
            now_secs: now,
            ..Default::default()
        };
        let mut out = Vec::new();
        b.rank(ws, &req, &mut out);
        let mut sorted = out.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..ws.len()).collect::<Vec<_>>());
        b.commit(&ws[out[0]].url, &req);
        out[0]
    }

    /// Registers the workers in order without skewing the window.
    fn seed(b: &Bucket, ws: &[W]) {
        for w in ws {
            b.commit(&w.url, &RequestInfo::default());
        }
    }

    #[test]
    fn initial_ranges_split_the_first_4096_chars() {
        let b = bucket(1_000_000, 1000.0);
        let ws = workers(&[0; 3]);
        seed(&b, &ws);
        assert_eq!(b.upper(), [1364, 2729, u64::MAX]);
        assert_eq!(route(&b, &ws, 10, 0), 0);
        assert_eq!(route(&b, &ws, 2000, 0), 1);
        assert_eq!(route(&b, &ws, 100_000, 0), 2);
    }

    #[test]
    fn rank_alone_places_unseen_workers_in_candidate_order() {
        let b = bucket(1_000_000, 1000.0);
        let ws = workers(&[0; 2]);
        let long = "x".repeat(3000);
        let mut out = Vec::new();
        let req = RequestInfo {
            text: Some(&long),
            ..Default::default()
        };
        b.rank(&ws, &req, &mut out);
        assert_eq!(
            out[0], 1,
            "3000 chars are the second worker's (2048 and up)"
        );
        assert_eq!(b.upper(), [2047, u64::MAX]);
        assert!(b.state.lock().window.is_empty(), "no choice recorded");
    }

    #[test]
    fn bounds_follow_the_traffic() {
        let b = bucket(1_000_000, 1000.0);
        let ws = workers(&[0; 3]);
        seed(&b, &ws);
        for len in [5, 10, 15, 20, 24, 26] {
            route(&b, &ws, len, 1);
        }
        b.adjust(2);
        // 100 chars, about 33 per worker.
        assert_eq!(b.upper(), [20, 26, u64::MAX]);
        assert_eq!(route(&b, &ws, 21, 2), 1);
        assert_eq!(route(&b, &ws, 27, 2), 2);
        // Steady traffic of the same size does not move them.
        for len in [5, 10, 15, 20, 24, 26] {
            route(&b, &ws, len, 10);
        }
        b.adjust(11);
        assert_eq!(b.upper(), [20, 26, u64::MAX]);
    }

    #[test]
    fn imbalance_sends_to_the_least_charged_worker() {
        let b = bucket(32, 1.0001);
        let ws = workers(&[0; 3]);
        seed(&b, &ws);
        assert_eq!(route(&b, &ws, 100, 0), 0);
        // w0 has 100 chars, the others 0: imbalanced, the length no longer decides.
        let next = route(&b, &ws, 10, 0);
        assert_ne!(next, 0);
        // Old entries leave the window at the next adjust: balanced again.
        b.adjust(ADJUST_INTERVAL_SECS + 10);
        assert_eq!(route(&b, &ws, 10, ADJUST_INTERVAL_SECS + 10), 0);
    }

    #[test]
    fn window_is_bounded_and_removed_worker_forgotten() {
        let b = bucket(u64::MAX, 1.0);
        let ws = workers(&[0; 2]);
        seed(&b, &ws);
        for _ in 0..(MAX_WINDOW + 10) {
            b.commit(&ws[0].url, &RequestInfo::default());
        }
        assert!(b.state.lock().window.len() <= MAX_WINDOW);
        b.remove_worker(&ws[0].url);
        assert_eq!(b.upper(), [u64::MAX]);
        assert!(b.state.lock().window.iter().all(|s| *s.url != *ws[0].url));
    }

    #[test]
    fn bounds_stay_strictly_increasing_on_odd_traffic() {
        let b = bucket(u64::MAX, 1.0);
        let ws = workers(&[0; 5]);
        seed(&b, &ws);
        for _ in 0..50 {
            route(&b, &ws, 7, 1);
        }
        b.adjust(1);
        let u = b.upper();
        assert!(u.windows(2).all(|p| p[0] < p[1]), "{u:?}");
        assert_eq!(*u.last().unwrap(), u64::MAX);
    }
}
