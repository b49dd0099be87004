//! prefix_hash: requests that share a prompt prefix go to the same worker, unless it is
//! overloaded.
//!
//! The key is the first `prefix_token_count` token ids when the caller has them
//! ([`RequestInfo::prefix_tokens`]), else the first `4 × prefix_token_count` characters of the
//! request text: a router in front of HTTP workers sees text, not token ids, and four
//! characters per token is the usual average for English text under BPE tokenizers, so the
//! prefix covers about as much of the prompt. The key is placed on the same hash ring as
//! consistent_hashing (see `consistent_hash.rs`).
//!
//! Invariants:
//! - Deterministic for a fixed worker set and loads: the same prefix ranks the same order.
//! - A worker is *overloaded* when its load exceeds both `load_factor ×` the candidates' mean
//!   load and the mean plus [`OVERLOAD_ABS_MARGIN`]; overloaded workers keep their ring order but
//!   go after every other worker. When all are overloaded, the ring order stands.
//! - rank writes a full permutation; commit changes nothing; rank only maintains the ring cache.

use crate::consistent_hash::ConsistentHash;
use crate::hash::hash_bytes;
use crate::{RequestInfo, WorkerRef};

/// Characters per token assumed when turning `prefix_token_count` into a text prefix.
pub const CHARS_PER_TOKEN: usize = 4;

/// A worker is overloaded only if its load is also this much above the mean: at small loads
/// (a mean of 1 or 2 requests) the relative factor alone would move prefixes on noise.
pub const OVERLOAD_ABS_MARGIN: u64 = 10;

/// Knobs of the prefix_hash policy (SMG's names and defaults).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefixHashConfig {
    /// Tokens of the prompt that make the key (`4 ×` as many characters of text).
    pub prefix_token_count: usize,
    /// Load above `load_factor × mean` counts as overloaded.
    pub load_factor: f64,
}

impl Default for PrefixHashConfig {
    fn default() -> Self {
        Self {
            prefix_token_count: 256,
            load_factor: 1.25,
        }
    }
}

/// The prefix_hash policy.
#[derive(Debug, Default)]
pub(crate) struct PrefixHash {
    config: PrefixHashConfig,
    ring: ConsistentHash,
}

/// The first `chars` characters of `text` (all of it when shorter).
fn prefix(text: &str, chars: usize) -> &str {
    match text.char_indices().nth(chars) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}

impl PrefixHash {
    pub(crate) fn new(config: PrefixHashConfig) -> Self {
        Self {
            config,
            ring: ConsistentHash::default(),
        }
    }

    /// See the module docs.
    pub(crate) fn rank<W: WorkerRef>(
        &self,
        workers: &[W],
        req: &RequestInfo<'_>,
        out: &mut Vec<usize>,
    ) {
        match req.prefix_tokens.filter(|ids| !ids.is_empty()) {
            Some(ids) => {
                let ids = &ids[..ids.len().min(self.config.prefix_token_count)];
                let bytes: Vec<u8> = ids.iter().flat_map(|id| id.to_le_bytes()).collect();
                self.ring.rank_point(workers, hash_bytes(&bytes), out);
            }
            None => {
                let chars = self
                    .config
                    .prefix_token_count
                    .saturating_mul(CHARS_PER_TOKEN);
                let key = RequestInfo {
                    text: req.text.map(|t| prefix(t, chars)),
                    routing_key: None,
                    ..*req
                };
                self.ring.rank(workers, &key, out);
            }
        }
        if workers.len() < 2 {
            return;
        }
        let total: u64 = workers
            .iter()
            .map(|w| w.load())
            .fold(0, u64::saturating_add);
        let mean = total as f64 / workers.len() as f64;
        let overloaded = |i: usize| {
            let load = workers[i].load();
            load as f64 > mean * self.config.load_factor
                && load as f64 > mean + OVERLOAD_ABS_MARGIN as f64
        };
        if out.iter().all(|&i| overloaded(i)) {
            return;
        }
        // Stable partition: ring order within each group.
        let (fine, busy): (Vec<usize>, Vec<usize>) = out.iter().partition(|&&i| !overloaded(i));
        out.clear();
        out.extend(fine);
        out.extend(busy);
    }

    pub(crate) fn remove_worker(&self, url: &str) {
        self.ring.remove_worker(url);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::workers;

    fn first(p: &PrefixHash, ws: &[crate::testutil::W], text: &str) -> usize {
        let mut out = Vec::new();
        let req = RequestInfo {
            text: Some(text),
            ..Default::default()
        };
        p.rank(ws, &req, &mut out);
        out[0]
    }

    #[test]
    fn prefix_counts_chars_not_bytes() {
        assert_eq!(prefix("héllo wörld", 4), "héll");
        assert_eq!(prefix("ab", 10), "ab");
        assert_eq!(prefix("", 3), "");
    }

    #[test]
    fn same_prefix_same_worker_different_tail() {
        let p = PrefixHash::new(PrefixHashConfig {
            prefix_token_count: 2,
            load_factor: 1.25,
        });
        let ws = workers(&[0; 8]);
        // 2 tokens = 8 chars: only "system: " decides.
        let a = first(&p, &ws, "system: tell me about cats");
        for tail in ["dogs", "the weather", "x"] {
            assert_eq!(first(&p, &ws, &format!("system: {tail}")), a);
        }
        // Different prefixes spread over several workers.
        let spread: std::collections::HashSet<usize> = (0..64)
            .map(|i| first(&p, &ws, &format!("{i:08} same tail")))
            .collect();
        assert!(spread.len() > 3, "{spread:?}");
    }

    #[test]
    fn overloaded_worker_goes_last_and_others_keep_ring_order() {
        let p = PrefixHash::new(PrefixHashConfig::default());
        let idle = workers(&[0; 4]);
        let text = "a shared prefix";
        let mut ring = Vec::new();
        p.rank(
            &idle,
            &RequestInfo {
                text: Some(text),
                ..Default::default()
            },
            &mut ring,
        );
        let mut loads = [0u64; 4];
        loads[ring[0]] = 100; // mean 25: 100 > 1.25 × 25 and > 25 + 10
        let busy = workers(&loads);
        let mut out = Vec::new();
        p.rank(
            &busy,
            &RequestInfo {
                text: Some(text),
                ..Default::default()
            },
            &mut out,
        );
        assert_eq!(out[..3], ring[1..]);
        assert_eq!(out[3], ring[0]);
        // Below the absolute margin the factor alone does not move the prefix.
        loads[ring[0]] = 8; // mean 2: 8 > 2.5 but not > 12
        let mut out = Vec::new();
        p.rank(
            &workers(&loads),
            &RequestInfo {
                text: Some(text),
                ..Default::default()
            },
            &mut out,
        );
        assert_eq!(out, ring);
    }

    #[test]
    fn token_ids_decide_when_given() {
        let p = PrefixHash::new(PrefixHashConfig {
            prefix_token_count: 3,
            load_factor: 1.25,
        });
        let ws = workers(&[0; 16]);
        let rank = |text: &str, ids: &[u32]| {
            let mut out = Vec::new();
            let req = RequestInfo {
                text: Some(text),
                prefix_tokens: Some(ids),
                ..Default::default()
            };
            p.rank(&ws, &req, &mut out);
            out[0]
        };
        // Only the first 3 ids count; the text is not used.
        let a = rank("one text", &[1, 2, 3, 4]);
        assert_eq!(rank("another text entirely", &[1, 2, 3, 99]), a);
        let spread: std::collections::HashSet<usize> =
            (0..64).map(|i| rank("same", &[i, 2, 3])).collect();
        assert!(spread.len() > 3, "{spread:?}");
    }

    #[test]
    fn all_overloaded_keeps_ring_order() {
        let p = PrefixHash::new(PrefixHashConfig {
            prefix_token_count: 4,
            load_factor: 0.5,
        });
        let ws = workers(&[100, 100, 100]);
        let mut out = Vec::new();
        p.rank(
            &ws,
            &RequestInfo {
                text: Some("t"),
                ..Default::default()
            },
            &mut out,
        );
        let mut sorted = out.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2]);
    }
}
