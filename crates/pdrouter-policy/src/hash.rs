//! Small deterministic hashing.
//!
//! - [`Fnv1a`]: classic FNV-1a 64, used as the `Hasher` of the url interning maps.
//! - [`hash_bytes`]: the ring hash. FNV-1a's xor-multiply step applied a 64-bit word at a time
//!   (with a rotate so high bits feed later words, and the length folded in), followed by
//!   murmur3's finalizer [`mix64`]. Word-at-a-time keeps hashing a 4 KiB prompt cheap; the
//!   finalizer spreads similar inputs (e.g. urls differing in one digit) over the high bits a
//!   ring lookup relies on.
//!
//! Invariant: outputs depend only on the input bytes (no per-process seed, no `RandomState`, no
//! endianness dependence: words are read little-endian), so a consistent-hash ring maps the same
//! key to the same worker across restarts and across router replicas.

use std::hash::{BuildHasherDefault, Hasher};

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64-bit hasher; also used (through [`FnvBuildHasher`]) for the url interning maps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fnv1a(u64);

impl Default for Fnv1a {
    fn default() -> Self {
        Self(FNV_OFFSET)
    }
}

impl Hasher for Fnv1a {
    fn write(&mut self, bytes: &[u8]) {
        let mut h = self.0;
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(FNV_PRIME);
        }
        self.0 = h;
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// `BuildHasher` for maps keyed by worker urls (operator-controlled, so no flooding concern).
pub(crate) type FnvBuildHasher = BuildHasherDefault<Fnv1a>;

/// Word-at-a-time `Hasher` (built on [`hash_bytes`]) for cache_aware's url → tree map, which
/// rank probes once per candidate: FNV's byte loop was a large share of a rank's time.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WordHasher(u64);

impl Default for WordHasher {
    fn default() -> Self {
        Self(FNV_OFFSET)
    }
}

impl Hasher for WordHasher {
    fn write(&mut self, bytes: &[u8]) {
        self.0 = word_step(self.0, hash_bytes(bytes));
    }

    fn finish(&self) -> u64 {
        mix64(self.0)
    }
}

/// `BuildHasher` for cache_aware's url map.
pub(crate) type WordBuildHasher = BuildHasherDefault<WordHasher>;

/// murmur3's 64-bit finalizer: a bijection with full avalanche.
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// Odd multiplier (2^64 / golden ratio) for the word step.
const WORD_MUL: u64 = 0x9e37_79b9_7f4a_7c15;

fn word_step(h: u64, word: u64) -> u64 {
    (h ^ word).wrapping_mul(WORD_MUL).rotate_left(29)
}

/// Deterministic, well-mixed 64-bit hash of a byte string (the ring hash).
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    let mut h = FNV_OFFSET ^ (bytes.len() as u64).wrapping_mul(WORD_MUL);
    let mut words = bytes.chunks_exact(8);
    for w in &mut words {
        let mut buf = [0u8; 8];
        buf.copy_from_slice(w);
        h = word_step(h, u64::from_le_bytes(buf));
    }
    let rest = words.remainder();
    if !rest.is_empty() {
        let mut buf = [0u8; 8];
        buf[..rest.len()].copy_from_slice(rest);
        h = word_step(h, u64::from_le_bytes(buf));
    }
    mix64(h)
}

/// [`hash_bytes`] of a string.
pub(crate) fn hash_str(s: &str) -> u64 {
    hash_bytes(s.as_bytes())
}

/// The `i`-th derived hash of `base` (distinct for distinct `i`: `mix64` is a bijection).
pub(crate) fn derive(base: u64, i: u64) -> u64 {
    mix64(base.wrapping_add(i.wrapping_add(1).wrapping_mul(WORD_MUL)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fnv(bytes: &[u8]) -> u64 {
        let mut h = Fnv1a::default();
        h.write(bytes);
        h.finish()
    }

    #[test]
    fn word_hasher_separates_similar_urls() {
        let h = |s: &str| {
            let mut h = WordHasher::default();
            h.write(s.as_bytes());
            h.finish()
        };
        assert_eq!(h("http://w1:8000"), h("http://w1:8000"));
        assert_ne!(h("http://w1:8000"), h("http://w2:8000"));
        assert_ne!(h(""), h("\0"));
    }

    #[test]
    fn fnv1a_reference_vectors() {
        assert_eq!(fnv(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn hash_str_is_deterministic_and_mixed() {
        assert_eq!(hash_str("key"), hash_str("key"));
        assert_ne!(hash_str("w#0"), hash_str("w#1"));
        // Similar inputs differ in the top bits too.
        assert_ne!(hash_str("w#0") >> 48, hash_str("w#1") >> 48);
        assert_eq!(mix64(0), 0);
        // Length is folded in: trailing zero bytes change the hash.
        assert_ne!(hash_bytes(b"a"), hash_bytes(b"a\0"));
        assert_ne!(hash_bytes(b""), hash_bytes(b"\0"));
        assert_ne!(hash_bytes(b"12345678x"), hash_bytes(b"12345678y"));
        assert_ne!(derive(1, 0), derive(1, 1));
    }

    const PINNED: [u64; 4] = [
        17_280_346_270_528_514_342,
        14_607_299_707_259_051_085,
        17_027_239_667_526_116_621,
        791_169_551_867_273_750,
    ];

    #[test]
    fn ring_hash_is_pinned() {
        // Changing the hash would remap every key on every router: pin a few outputs.
        let pinned: Vec<u64> = ["", "a", "session-1", "http://10.0.0.1:8000"]
            .iter()
            .map(|s| hash_str(s))
            .collect();
        assert_eq!(pinned, PINNED);
    }
}
