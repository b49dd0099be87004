//! Turning what a model wrote into a call's `(name, arguments)`: JSON call objects, raw JSON
//! argument objects, and argument objects built from plain-text values typed by the schema.
//!
//! Arguments are always a compact JSON object whose keys are in the order the model wrote
//! them: raw JSON is validated and minified, never re-serialized through `Value`.

use super::ToolSet;
use crate::json;

/// A call as a JSON object, `{"name": …, "arguments": {…}}` (or `"parameters"`), checked
/// against `tools`. `None` when malformed or naming an unknown function. Arguments given as a
/// JSON string holding an object are unwrapped; absent or `null` arguments are `{}`.
pub(crate) fn call_from_object(raw: &str, tools: &ToolSet) -> Option<(String, String)> {
    let members = json::members(raw)?;
    let field = |k: &str| members.iter().find(|(key, _)| key == k).map(|(_, v)| *v);
    let name = json::as_string(field("name")?)?;
    if !tools.contains(&name) {
        return None;
    }
    let args = match field("arguments").or_else(|| field("parameters")) {
        None => "{}".to_string(),
        Some(v) if json::is_null(v) => "{}".to_string(),
        Some(v) => args_object(v).or_else(|| args_object(&json::as_string(v)?))?,
    };
    Some((name, args))
}

/// Raw JSON arguments: a valid object, minified. An empty text means no arguments: `{}`.
pub(crate) fn args_object(raw: &str) -> Option<String> {
    if raw.trim().is_empty() {
        return Some("{}".to_string());
    }
    json::is_object(raw).then(|| json::minify(raw.trim()))
}

/// A named call with raw JSON arguments, checked against `tools`.
pub(crate) fn named_call(name: &str, raw_args: &str, tools: &ToolSet) -> Option<(String, String)> {
    let name = name.trim();
    if !tools.contains(name) {
        return None;
    }
    Some((name.to_string(), args_object(raw_args)?))
}

/// What a value of a parameter the schema does not type becomes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Undeclared {
    /// Always a string.
    Text,
    /// JSON when the text is a JSON literal (or Python `True`/`False`/`None`), else a string.
    Infer,
}

/// The JSON text of a parameter value the model wrote as plain text. A declared `string`
/// stays the exact text; `number`/`integer`/`boolean`/`null`/`object`/`array` are parsed
/// (the text trimmed) and fall back to a string when the text is not of that type.
pub(crate) fn typed_value(raw: &str, ty: Option<&str>, undeclared: Undeclared) -> String {
    let t = raw.trim();
    let parsed = match ty {
        Some("string") => None,
        Some("number" | "integer") => number(t),
        Some("boolean") => boolean(t),
        Some("null") => (t == "null" || t == "None").then(|| "null".to_string()),
        Some("object") => t.starts_with('{').then(|| json_text(t)).flatten(),
        Some("array") => t.starts_with('[').then(|| json_text(t)).flatten(),
        Some(_) => None,
        None => match undeclared {
            Undeclared::Text => None,
            Undeclared::Infer => json_text(t).or_else(|| python_literal(t)),
        },
    };
    parsed.unwrap_or_else(|| string(raw))
}

/// A JSON string literal.
pub(crate) fn string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".to_string())
}

fn json_text(t: &str) -> Option<String> {
    (!t.is_empty() && json::is_valid(t)).then(|| json::minify(t))
}

fn number(t: &str) -> Option<String> {
    let first = t.bytes().next()?;
    (first == b'-' || first.is_ascii_digit())
        .then(|| json_text(t))
        .flatten()
}

fn boolean(t: &str) -> Option<String> {
    match t.to_ascii_lowercase().as_str() {
        "true" => Some("true".to_string()),
        "false" => Some("false".to_string()),
        _ => None,
    }
}

fn python_literal(t: &str) -> Option<String> {
    match t {
        "True" => Some("true".to_string()),
        "False" => Some("false".to_string()),
        "None" => Some("null".to_string()),
        _ => None,
    }
}

/// A JSON object built member by member, in insertion order (a repeated key keeps its first
/// place and its last value).
#[derive(Debug, Default)]
pub(crate) struct ArgsBuilder {
    members: Vec<(String, String)>,
}

impl ArgsBuilder {
    /// Adds `key` with `value`, already JSON text.
    pub(crate) fn insert(&mut self, key: &str, value: String) {
        match self.members.iter_mut().find(|(k, _)| k == key) {
            Some(m) => m.1 = value,
            None => self.members.push((key.to_string(), value)),
        }
    }

    /// The compact object.
    pub(crate) fn finish(self) -> String {
        let mut out = String::from("{");
        for (i, (k, v)) in self.members.iter().enumerate() {
            if i > 0 {
                out.push(',');
            }
            out.push_str(&string(k));
            out.push(':');
            out.push_str(v);
        }
        out.push('}');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_objects() {
        let tools = ToolSet::new(["f"]);
        let c = |s| call_from_object(s, &tools);
        assert_eq!(
            c(r#"{"name": "f", "arguments": {"z": 1, "a": [1, 2]}}"#),
            Some(("f".into(), r#"{"z":1,"a":[1,2]}"#.into()))
        );
        assert_eq!(
            c(r#"{"name":"f","parameters":{"q":"a b"}}"#),
            Some(("f".into(), r#"{"q":"a b"}"#.into()))
        );
        assert_eq!(
            c(r#"{"name":"f","arguments":"{\"x\": 1}"}"#),
            Some(("f".into(), r#"{"x":1}"#.into()))
        );
        assert_eq!(c(r#"{"name":"f"}"#), Some(("f".into(), "{}".into())));
        assert_eq!(c(r#"{"name":"g","arguments":{}}"#), None);
        assert_eq!(c(r#"{"name":"f","arguments":[1]}"#), None);
        assert_eq!(c(r#"{"name":"f","arguments":{"#), None);
    }

    #[test]
    fn typed_values() {
        use Undeclared::*;
        assert_eq!(typed_value("42", Some("string"), Infer), r#""42""#);
        assert_eq!(typed_value(" 42\n", Some("integer"), Text), "42");
        assert_eq!(typed_value("4x", Some("number"), Text), r#""4x""#);
        assert_eq!(typed_value("True", Some("boolean"), Text), "true");
        assert_eq!(
            typed_value("{\"b\": 1, \"a\": 2}", Some("object"), Text),
            r#"{"b":1,"a":2}"#
        );
        assert_eq!(typed_value("[1, 2]", None, Text), r#""[1, 2]""#);
        assert_eq!(typed_value("[1, 2]", None, Infer), "[1,2]");
        assert_eq!(typed_value("None", None, Infer), "null");
        assert_eq!(typed_value("Tokyo", None, Infer), r#""Tokyo""#);
        let mut b = ArgsBuilder::default();
        b.insert("z", "1".into());
        b.insert("a", "2".into());
        b.insert("z", "3".into());
        assert_eq!(b.finish(), r#"{"z":3,"a":2}"#);
    }
}
