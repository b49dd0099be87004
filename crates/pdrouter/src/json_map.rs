//! Field lookups in request bodies without hashing.
//!
//! The body tree keeps the client's key order (serde_json's ordered map), and every `get` on
//! it hashes the key with SipHash before probing: a few hundred instructions, against a
//! handful of keys in a typical body, and the router looks up dozens of fields per request
//! (most of them absent). Below [`SCAN_UP_TO`] keys a scan comparing lengths, then bytes, is
//! several times cheaper; above it the map's index is used.
//!
//! Invariant: [`Field::field`] answers exactly what `get` answers, for every map.
//!
//! [`Fields`] goes one step further for the body's top level: its fields in order, without
//! the map at all (building it hashes every key too), for the common path that reads a few
//! fields and drops the tree. Its `field` answers what the map built from the same text
//! answers.

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::{Map, Value};

/// Largest map scanned instead of looked up.
pub(crate) const SCAN_UP_TO: usize = 16;

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

/// A JSON object's top-level fields in the order written, keys borrowed from the text when
/// they hold no escapes.
#[derive(Debug)]
pub(crate) struct Fields<'a>(Vec<(Cow<'a, str>, Value)>);

impl Fields<'_> {
    /// Fields written, repeated keys counted each time.
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// The map serde_json builds from the same text: a repeated key keeps its first place and
    /// its last value.
    pub(crate) fn into_map(self) -> Map<String, Value> {
        let mut map = Map::new();
        for (k, v) in self.0 {
            map.insert(k.into_owned(), v);
        }
        map
    }
}

impl Field for Fields<'_> {
    /// The last value written under `name`, as the map keeps it.
    #[inline]
    fn field(&self, name: &str) -> Option<&Value> {
        self.0
            .iter()
            .rev()
            .find(|(k, _)| k.as_ref() == name)
            .map(|(_, v)| v)
    }
}

impl<'de> Deserialize<'de> for Fields<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Object;
        impl<'de> Visitor<'de> for Object {
            type Value = Fields<'de>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fields<'de>, A::Error> {
                let mut fields = Vec::new();
                while let Some(Key(k)) = map.next_key()? {
                    fields.push((k, map.next_value()?));
                }
                Ok(Fields(fields))
            }
        }
        d.deserialize_map(Object)
    }
}

/// A key, borrowed from the text unless it had to be unescaped.
#[derive(Deserialize)]
#[serde(transparent)]
struct Key<'a>(#[serde(borrow)] Cow<'a, str>);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_answer_what_the_map_answers() {
        let bodies = [
            r#"{}"#,
            r#"{"a":1,"b":{"c":[1,2]},"text":"hi"}"#,
            // Repeated keys: the map keeps the first place and the last value.
            r#"{"a":1,"b":2,"a":3}"#,
            r#"{"te\u0078t":"escaped key","text":"plain"}"#,
            r#"{"k\"q":null,"":true,"é":"x"}"#,
        ];
        for body in bodies {
            let map: Map<String, Value> = serde_json::from_str(body).unwrap();
            let fields: Fields<'_> = serde_json::from_str(body).unwrap();
            for probe in ["a", "b", "c", "text", "k\"q", "", "é", "missing"] {
                assert_eq!(fields.field(probe), map.field(probe), "{body} {probe:?}");
            }
            let rebuilt = fields.into_map();
            assert_eq!(rebuilt, map, "{body}");
            let order = |m: &Map<String, Value>| m.keys().cloned().collect::<Vec<_>>();
            assert_eq!(order(&rebuilt), order(&map), "{body}");
        }
        // A key without escapes is read in place, not copied.
        let fields: Fields<'_> = serde_json::from_str(bodies[3]).unwrap();
        let borrowed: Vec<bool> = fields
            .0
            .iter()
            .map(|(k, _)| matches!(k, Cow::Borrowed(_)))
            .collect();
        assert_eq!(borrowed, [false, true]);
        for not_an_object in ["[1]", "\"s\"", "3", "null", "{\"a\":}"] {
            assert!(serde_json::from_str::<Fields<'_>>(not_an_object).is_err());
        }
    }

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
