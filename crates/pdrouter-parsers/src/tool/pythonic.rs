//! The `pythonic` format (Llama 4, Llama 3.2 with a pythonic template): a Python list of
//! calls with keyword arguments, `[get_weather(city="Paris", days=3), get_time()]`, anywhere
//! in the text, optionally wrapped in `<|python_start|>…<|python_end|>`.
//!
//! A `[` opens a call list only when an identifier and `(` follow it; any other `[` is text.
//! Arguments are Python literals (strings with either quote, numbers, `True`/`False`/`None`,
//! lists, tuples, dicts with string keys) converted to JSON, keyword order kept. The list is
//! all or nothing: a positional argument, an unknown function or any other literal makes the
//! whole list text.

use super::ToolSet;
use super::calls::{ArgsBuilder, string};
use super::stream::{Emitter, Format};
use crate::json::BracketEnd;
use crate::scan::{self, Hit, Step};

const PY_START: &str = "<|python_start|>";
const PY_END: &str = "<|python_end|>";

/// The Llama 4 special tokens around code.
pub(crate) const PYTHONIC_TOKENS: &[&str] = &[PY_START, PY_END];

#[derive(Debug)]
pub(crate) struct Pythonic {
    tools: ToolSet,
    scan: BracketEnd,
}

impl Pythonic {
    pub(crate) fn new(tools: &ToolSet) -> Self {
        Self {
            tools: tools.clone(),
            scan: BracketEnd::python(),
        }
    }

    /// A call list at byte `off` of `buf` (after the wrapper start, when `wrapped`).
    fn list(&mut self, buf: &str, off: usize, wrapped: bool, eof: bool, out: &mut Emitter) -> Step {
        match opens_call_list(&buf[off..]) {
            None if !eof => return Step::NeedMore,
            Some(true) => {}
            _ => {
                let n = if wrapped { PY_START.len() } else { 1 };
                out.text(&buf[..n]);
                return Step::Consumed(n);
            }
        }
        let Some(n) = self.scan.scan(&buf[off..]) else {
            return if eof {
                self.scan = BracketEnd::python();
                out.text(buf);
                Step::Consumed(buf.len())
            } else {
                Step::NeedMore
            };
        };
        let mut total = off + n;
        if wrapped {
            let ws = scan::leading_ws(&buf[total..]);
            let tail = &buf[total + ws..];
            if tail.starts_with(PY_END) {
                total += ws + PY_END.len();
            } else if !eof && (tail.is_empty() || scan::is_proper_prefix(tail, &[PY_END])) {
                return Step::NeedMore;
            }
        }
        self.scan = BracketEnd::python();
        match parse_calls(&buf[off..off + n], &self.tools) {
            Some(calls) => {
                for (name, args) in calls {
                    out.call(name, args);
                }
            }
            None => out.text(&buf[..total]),
        }
        Step::Consumed(total)
    }
}

impl Format for Pythonic {
    fn step(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        match scan::find_first(buf, &["[", PY_START]) {
            Hit::Found { at: 0, marker: 0 } => self.list(buf, 0, false, eof, out),
            Hit::Found { at: 0, .. } => {
                let off = PY_START.len() + scan::leading_ws(&buf[PY_START.len()..]);
                self.list(buf, off, true, eof, out)
            }
            Hit::Found { at, .. } | Hit::Partial(at) if at > 0 => {
                out.text(&buf[..at]);
                Step::Consumed(at)
            }
            Hit::Partial(_) if !eof => Step::NeedMore,
            _ => {
                out.text(buf);
                Step::Consumed(buf.len())
            }
        }
    }
}

/// Does `s` (starting at a `[`) open a call list, `[name(`? `None`: cannot tell yet.
fn opens_call_list(s: &str) -> Option<bool> {
    let mut chars = s
        .strip_prefix('[')?
        .chars()
        .skip_while(|c| c.is_whitespace());
    match chars.next() {
        None => return None,
        Some(c) if c.is_alphabetic() || c == '_' => {}
        Some(_) => return Some(false),
    }
    let mut rest = chars.skip_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.');
    let mut rest = std::iter::from_fn(|| rest.next()).skip_while(|c| c.is_whitespace());
    rest.next().map(|c| c == '(')
}

/// The calls of a complete list text, converted to JSON arguments.
pub(crate) fn parse_calls(src: &str, tools: &ToolSet) -> Option<Vec<(String, String)>> {
    let mut p = Py { s: src, i: 0 };
    let calls = p.seq('[', ']', |p| p.call(tools))?;
    p.ws();
    (p.i == src.len() && !calls.is_empty()).then_some(calls)
}

/// A cursor over Python source.
struct Py<'a> {
    s: &'a str,
    i: usize,
}

impl<'a> Py<'a> {
    fn peek(&self) -> Option<char> {
        self.s[self.i..].chars().next()
    }

    fn ws(&mut self) {
        self.i += scan::leading_ws(&self.s[self.i..]);
    }

    fn eat(&mut self, c: char) -> bool {
        self.ws();
        if self.peek() == Some(c) {
            self.i += c.len_utf8();
            true
        } else {
            false
        }
    }

    /// `open item (, item)* ,? close`.
    fn seq<T>(
        &mut self,
        open: char,
        close: char,
        mut item: impl FnMut(&mut Self) -> Option<T>,
    ) -> Option<Vec<T>> {
        if !self.eat(open) {
            return None;
        }
        let mut items = Vec::new();
        loop {
            if self.eat(close) {
                return Some(items);
            }
            if !items.is_empty() {
                if !self.eat(',') {
                    return None;
                }
                if self.eat(close) {
                    return Some(items);
                }
            }
            self.ws();
            items.push(item(self)?);
        }
    }

    fn ident(&mut self) -> Option<&'a str> {
        self.ws();
        let rest = &self.s[self.i..];
        let first = rest.chars().next()?;
        if !(first.is_alphabetic() || first == '_') {
            return None;
        }
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        self.i += len;
        Some(&rest[..len])
    }

    fn call(&mut self, tools: &ToolSet) -> Option<(String, String)> {
        let start = self.i;
        self.ident()?;
        while self.peek() == Some('.') {
            self.i += 1;
            self.ident()?;
        }
        let name = self.s[start..self.i].trim().to_string();
        let mut args = ArgsBuilder::default();
        self.seq('(', ')', |p| {
            let key = p.ident()?;
            if !p.eat('=') {
                return None;
            }
            let value = p.value()?;
            args.insert(key, value);
            Some(())
        })?;
        tools.contains(&name).then(|| (name, args.finish()))
    }

    /// A literal as JSON text.
    fn value(&mut self) -> Option<String> {
        self.ws();
        match self.peek()? {
            '\'' | '"' => self.string().map(|s| string(&s)),
            '[' => self
                .seq('[', ']', Self::value)
                .map(|v| format!("[{}]", v.join(","))),
            '(' => self
                .seq('(', ')', Self::value)
                .map(|v| format!("[{}]", v.join(","))),
            '{' => self.dict(),
            c if c.is_ascii_digit() || matches!(c, '-' | '+' | '.') => self.number(),
            _ => match self.ident()? {
                "True" => Some("true".into()),
                "False" => Some("false".into()),
                "None" => Some("null".into()),
                _ => None,
            },
        }
    }

    fn dict(&mut self) -> Option<String> {
        let mut obj = ArgsBuilder::default();
        self.seq('{', '}', |p| {
            p.ws();
            let key = p.string()?;
            if !p.eat(':') {
                return None;
            }
            let value = p.value()?;
            obj.insert(&key, value);
            Some(())
        })?;
        Some(obj.finish())
    }

    fn number(&mut self) -> Option<String> {
        let rest = &self.s[self.i..];
        let len = rest
            .char_indices()
            .find(|&(k, c)| {
                let sign_ok = matches!(c, '-' | '+') && (k == 0 || rest[..k].ends_with(['e', 'E']));
                !(c.is_ascii_digit() || matches!(c, '_' | '.' | 'e' | 'E') || sign_ok)
            })
            .map_or(rest.len(), |(k, _)| k);
        self.i += len;
        let text: String = rest[..len]
            .chars()
            .filter(|&c| c != '_' && c != '+')
            .collect();
        if text.contains(['.', 'e', 'E']) {
            let f: f64 = text.parse().ok()?;
            serde_json::Number::from_f64(f).map(|n| n.to_string())
        } else {
            text.parse::<i128>().ok().map(|n| n.to_string())
        }
    }

    /// A string literal, `'…'`, `"…"` or triple-quoted, decoded.
    fn string(&mut self) -> Option<String> {
        let q = self.peek().filter(|c| matches!(c, '\'' | '"'))?;
        let triple: String = [q; 3].iter().collect();
        let long = self.s[self.i..].starts_with(&triple);
        self.i += if long { 3 } else { 1 };
        let mut out = String::new();
        loop {
            let rest = &self.s[self.i..];
            let c = rest.chars().next()?;
            if long && rest.starts_with(&triple) {
                self.i += 3;
                return Some(out);
            }
            self.i += c.len_utf8();
            match c {
                '\\' => self.escape(&mut out)?,
                c if c == q && !long => return Some(out),
                '\n' if !long => return None,
                c => out.push(c),
            }
        }
    }

    /// The escape after a backslash.
    fn escape(&mut self, out: &mut String) -> Option<()> {
        let c = self.peek()?;
        self.i += c.len_utf8();
        let simple = match c {
            'n' => Some('\n'),
            't' => Some('\t'),
            'r' => Some('\r'),
            'b' => Some('\u{8}'),
            'f' => Some('\u{c}'),
            'v' => Some('\u{b}'),
            'a' => Some('\u{7}'),
            '0' => Some('\0'),
            '\\' | '\'' | '"' => Some(c),
            _ => None,
        };
        if let Some(s) = simple {
            out.push(s);
            return Some(());
        }
        let digits = match c {
            'x' => 2,
            'u' => 4,
            'U' => 8,
            '\n' => return Some(()),
            _ => {
                out.push('\\');
                out.push(c);
                return Some(());
            }
        };
        let hex = self.s.get(self.i..self.i + digits)?;
        let code = u32::from_str_radix(hex, 16).ok()?;
        self.i += digits;
        out.push(char::from_u32(code)?);
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn literals_to_json() {
        let tools = ToolSet::new(["f", "g", "a.b"]);
        let calls = parse_calls(
            r#"[f(s='it\'s', d="x\ny", n=-3, x=1.5e3, u=1_000, t=True, z=None,
                 l=[1, (2, 3)], m={"k": 'v', 'o': {}}, e=''), g(), a.b(q="""tri"ple""",)]"#,
            &tools,
        )
        .unwrap();
        assert_eq!(calls[0].0, "f");
        assert_eq!(
            calls[0].1,
            r#"{"s":"it's","d":"x\ny","n":-3,"x":1500.0,"u":1000,"t":true,"z":null,"l":[1,[2,3]],"m":{"k":"v","o":{}},"e":""}"#
        );
        assert_eq!(calls[1], ("g".into(), "{}".into()));
        assert_eq!(calls[2], ("a.b".into(), r#"{"q":"tri\"ple"}"#.into()));
    }

    #[test]
    fn rejects() {
        let tools = ToolSet::new(["f"]);
        for bad in [
            "[f(1)]",
            "[h()]",
            "[f(a=x)]",
            "[]",
            "[f(a=1) g()]",
            "[f(a='x)]",
            "[f(a={1: 2})]",
        ] {
            assert_eq!(parse_calls(bad, &tools), None, "{bad}");
        }
    }

    #[test]
    fn call_list_openers() {
        assert_eq!(opens_call_list("[f("), Some(true));
        assert_eq!(opens_call_list("[ a.b ("), Some(true));
        assert_eq!(opens_call_list("[1, 2]"), Some(false));
        assert_eq!(opens_call_list("[link](x)"), Some(false));
        assert_eq!(opens_call_list("[fn"), None);
        assert_eq!(opens_call_list("["), None);
    }
}
