//! Small deterministic hashing: FNV-1a (64-bit) followed by a murmur3-style finalizer.
//!
//! Invariants:
//! - The output depends only on the input bytes: no per-process seed, no `RandomState`, no
//!   platform dependence. A consistent-hash ring therefore maps the same key to the same worker
//!   across restarts and across router replicas.
//! - [`hash_str`] always applies [`mix64`], because plain FNV-1a spreads similar inputs (e.g.
//!   `"http://w1#0"`, `"http://w1#1"`) poorly over the high bits a ring lookup relies on.

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

/// murmur3's 64-bit finalizer: a bijection with full avalanche.
pub(crate) fn mix64(mut x: u64) -> u64 {
    x ^= x >> 33;
    x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
    x ^= x >> 33;
    x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    x ^= x >> 33;
    x
}

/// Deterministic, well-mixed 64-bit hash of a string.
pub(crate) fn hash_str(s: &str) -> u64 {
    let mut h = Fnv1a::default();
    h.write(s.as_bytes());
    mix64(h.finish())
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
    }
}
