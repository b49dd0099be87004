//! Field lookups in request bodies without hashing.
//!
//! The body tree keeps the client's key order (serde_json's ordered map), and every `get` on
//! it hashes the key with SipHash before probing: a few hundred instructions, against a
//! handful of keys in a typical body, and the router looks up dozens of fields per request
//! (most of them absent). Below [`SCAN_UP_TO`] keys a scan comparing lengths, then bytes, is
//! several times cheaper; above it the map's index is used.
//!
//! Invariant: [`Field::field`] answers exactly what `get` answers, for every map.

use serde_json::{Map, Value};

/// Largest map scanned instead of looked up.
const SCAN_UP_TO: usize = 16;

/// `get` by field name, for body objects and values.
pub(crate) trait Field {
    /// The value of field `name`, as `get(name)` would return it.
    fn field(&self, name: &str) -> Option<&Value>;
}

impl Field for Map<String, Value> {
    #[inline]
    fn field(&self, name: &str) -> Option<&Value> {
        if self.len() <= SCAN_UP_TO {
            self.iter()
                .find(|(k, _)| k.as_str() == name)
                .map(|(_, v)| v)
        } else {
            self.get(name)
        }
    }
}

impl Field for Value {
    /// `None` unless an object, as `Value::get` with a name.
    #[inline]
    fn field(&self, name: &str) -> Option<&Value> {
        self.as_object().and_then(|o| o.field(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_what_get_answers_at_every_size() {
        for n in [0, 1, 3, SCAN_UP_TO, SCAN_UP_TO + 1, 40] {
            let mut m = Map::new();
            for i in 0..n {
                m.insert(format!("k{i}"), Value::from(i));
            }
            for probe in ["k0", "k3", "k16", "k39", "missing", "", "K0"] {
                assert_eq!(m.field(probe), m.get(probe), "{n} keys, {probe:?}");
            }
            let v = Value::Object(m.clone());
            assert_eq!(v.field("k0"), v.get("k0"));
        }
        assert_eq!(Value::from(3).field("k0"), None);
        assert_eq!(serde_json::json!(["k0"]).field("k0"), None);
    }
}
