//! JSON as the model wrote it: where a bracketed value ends in a growing buffer, the top-level
//! members of an object as raw slices, and whitespace removal that keeps key order.
//!
//! serde_json here is built without `preserve_order`, so a parsed `Value` would sort object
//! keys. Arguments keep the model's key order by never going through `Value`: syntax is
//! checked by deserializing into `IgnoredAny`, and the text kept is the model's own, minified.

use serde::de::IgnoredAny;

/// Finds where the bracketed value at the start of a growing text ends. Resumable: call
/// [`BracketEnd::scan`] again with the same text grown longer and it continues where it
/// stopped. Strings are skipped with their escapes; brackets of every kind nest together
/// (mismatched kinds are left for the real parser to reject).
#[derive(Debug, Clone, Default)]
pub(crate) struct BracketEnd {
    pos: usize,
    depth: usize,
    quote: Option<u8>,
    escape: bool,
    python: bool,
    /// The end, once found: later calls return it again.
    end: Option<usize>,
}

impl BracketEnd {
    /// A scanner for JSON: `"` strings, `{}` and `[]`.
    pub(crate) fn json() -> Self {
        Self::default()
    }

    /// A scanner for Python literals: `'` and `"` strings, `()` too.
    pub(crate) fn python() -> Self {
        Self {
            python: true,
            ..Self::default()
        }
    }

    /// The byte length of the value at the start of `text` once its closing bracket has
    /// arrived. `text` must start with an opening bracket and only ever grow between calls.
    pub(crate) fn scan(&mut self, text: &str) -> Option<usize> {
        if self.end.is_some() {
            return self.end;
        }
        let bytes = text.as_bytes();
        while self.pos < bytes.len() {
            let b = bytes[self.pos];
            self.pos += 1;
            if let Some(q) = self.quote {
                if self.escape {
                    self.escape = false;
                } else if b == b'\\' {
                    self.escape = true;
                } else if b == q {
                    self.quote = None;
                }
                continue;
            }
            let closes = matches!(b, b'}' | b']') || (self.python && b == b')');
            let opens = matches!(b, b'{' | b'[') || (self.python && b == b'(');
            if b == b'"' || (self.python && b == b'\'') {
                self.quote = Some(b);
            } else if opens {
                self.depth += 1;
            } else if closes && self.close() {
                self.end = Some(self.pos);
                return self.end;
            }
        }
        None
    }

    fn close(&mut self) -> bool {
        self.depth = self.depth.saturating_sub(1);
        self.depth == 0
    }
}

/// Is `raw` one complete, valid JSON value (surrounding whitespace allowed)?
pub(crate) fn is_valid(raw: &str) -> bool {
    serde_json::from_str::<IgnoredAny>(raw).is_ok()
}

/// Is `raw` a valid JSON object?
pub(crate) fn is_object(raw: &str) -> bool {
    raw.trim_start().starts_with('{') && is_valid(raw)
}

/// `raw` (valid JSON) without the whitespace between tokens; strings and key order untouched.
pub(crate) fn minify(raw: &str) -> String {
    let mut out = String::with_capacity(raw.len());
    let mut in_str = false;
    let mut escape = false;
    for c in raw.chars() {
        if in_str {
            out.push(c);
            if escape {
                escape = false;
            } else if c == '\\' {
                escape = true;
            } else if c == '"' {
                in_str = false;
            }
        } else if c == '"' {
            in_str = true;
            out.push(c);
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            out.push(c);
        }
    }
    out
}

/// The top-level members of the JSON object `raw`, in the model's order: each key decoded and
/// its value as the raw slice of `raw`. `None` when `raw` is not a valid object.
pub(crate) fn members(raw: &str) -> Option<Vec<(String, &str)>> {
    if !is_object(raw) {
        return None;
    }
    let bytes = raw.as_bytes();
    let mut i = skip_ws(bytes, 0) + 1; // past `{`
    let mut out = Vec::new();
    loop {
        i = skip_ws(bytes, i);
        match bytes.get(i)? {
            b'}' => return Some(out),
            b',' => {
                i += 1;
                continue;
            }
            b'"' => {}
            _ => return None,
        }
        let key_end = string_end(bytes, i)?;
        let key: String = serde_json::from_str(&raw[i..key_end]).ok()?;
        i = skip_ws(bytes, key_end);
        if bytes.get(i) != Some(&b':') {
            return None;
        }
        i = skip_ws(bytes, i + 1);
        let end = value_end(raw, i)?;
        out.push((key, &raw[i..end]));
        i = end;
    }
}

/// The elements of the JSON array `raw` as raw slices, or `None` when `raw` is not a valid
/// array.
pub(crate) fn elements(raw: &str) -> Option<Vec<&str>> {
    if !(raw.trim_start().starts_with('[') && is_valid(raw)) {
        return None;
    }
    let bytes = raw.as_bytes();
    let mut i = skip_ws(bytes, 0) + 1; // past `[`
    let mut out = Vec::new();
    loop {
        i = skip_ws(bytes, i);
        match bytes.get(i)? {
            b']' => return Some(out),
            b',' => i += 1,
            _ => {
                let end = value_end(raw, i)?;
                out.push(&raw[i..end]);
                i = end;
            }
        }
    }
}

/// The decoded text of a raw JSON string value, or `None` when `raw` is not a string.
pub(crate) fn as_string(raw: &str) -> Option<String> {
    if raw.trim_start().starts_with('"') {
        serde_json::from_str(raw).ok()
    } else {
        None
    }
}

/// Is `raw` the JSON literal `null`?
pub(crate) fn is_null(raw: &str) -> bool {
    raw.trim() == "null"
}

fn skip_ws(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && matches!(bytes[i], b' ' | b'\t' | b'\n' | b'\r') {
        i += 1;
    }
    i
}

/// Just past the closing quote of the string starting at `i`.
fn string_end(bytes: &[u8], i: usize) -> Option<usize> {
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'"' => return Some(j + 1),
            _ => j += 1,
        }
    }
    None
}

/// Just past the value (already known valid) starting at `i`.
fn value_end(raw: &str, i: usize) -> Option<usize> {
    let bytes = raw.as_bytes();
    match bytes.get(i)? {
        b'{' | b'[' => BracketEnd::json().scan(&raw[i..]).map(|n| i + n),
        b'"' => string_end(bytes, i),
        _ => {
            let mut j = i;
            while j < bytes.len()
                && !matches!(bytes[j], b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
            {
                j += 1;
            }
            Some(j)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bracket_end_resumes_and_skips_strings() {
        let text = r#"{"a": "}{\"", "b": [1, {"c": 2}]} tail"#;
        let mut s = BracketEnd::json();
        assert_eq!(s.scan(&text[..10]), None);
        assert_eq!(s.scan(&text[..20]), None);
        assert_eq!(s.scan(text), Some(text.len() - 5));
        assert_eq!(s.scan(text), Some(text.len() - 5));
        let mut p = BracketEnd::python();
        assert_eq!(p.scan("[f(a=')'), g()] x"), Some(15));
    }

    #[test]
    fn members_keep_order_and_raw_values() {
        let raw = r#" { "z" : 1 , "a":{"y": [1, 2]}, "s": "x,}" , "n": null } "#;
        let m = members(raw).unwrap();
        let keys: Vec<_> = m.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["z", "a", "s", "n"]);
        assert_eq!(m[1].1, r#"{"y": [1, 2]}"#);
        assert_eq!(m[2].1, r#""x,}""#);
        assert_eq!(m[3].1, "null");
        assert!(members("[1]").is_none());
        assert!(members(r#"{"a": }"#).is_none());
        assert_eq!(
            elements(r#" [ {"a": [1]} , 2, "x" ] "#).unwrap(),
            [r#"{"a": [1]}"#, "2", r#""x""#]
        );
        assert_eq!(elements("[]").unwrap(), Vec::<&str>::new());
    }

    #[test]
    fn minify_keeps_strings() {
        assert_eq!(
            minify("{ \"b\" : \"x y\\\" z\" ,\n \"a\": [1, 2] }"),
            r#"{"b":"x y\" z","a":[1,2]}"#
        );
    }
}
