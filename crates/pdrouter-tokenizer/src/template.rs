//! Chat templates: HF Jinja templates rendered with minijinja, with the semantics HF templates
//! rely on.
//!
//! What a template sees, as in HF `apply_chat_template`:
//! - `messages`, `tools` (none when absent), `documents` (none), `add_generation_prompt`, the
//!   special tokens that `tokenizer_config.json` sets (`bos_token`, `eos_token`, `pad_token`,
//!   ...; unset ones stay undefined), and the request's extra template arguments.
//! - `raise_exception(message)`: aborts with [`TemplateError::Raised`] carrying the message.
//! - `tojson`: Python `json.dumps` output (`", "`/`": "` separators, `ensure_ascii` false,
//!   `indent`, `separators`, `sort_keys`), never HTML-escaped.
//! - Python string and dict methods (`strip`, `split`, `startswith`, `items()`, `get`, ...),
//!   `namespace`, loop controls (`break`/`continue`), `strftime_now(format)` (UTC).
//! - Jinja's whitespace settings as HF sets them: `trim_blocks` and `lstrip_blocks` on.
//!
//! Invariants: a template compiles once (at load); rendering is pure apart from
//! `strftime_now`, and bounded by minijinja's recursion limit. Object keys keep the order the
//! caller's `Serialize` yields them (for `serde_json::Value` that needs its `preserve_order`
//! feature; HF renders tool schemas in the client's order).

use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, Rest, Value, ValueKind, ValueOrKwargs};
use minijinja::{Environment, Error, ErrorKind};
use serde::Serialize;

use crate::error::{LoadError, TemplateError};

const NAME: &str = "chat";

/// How a template expects `message.content`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentFormat {
    /// A string: OpenAI content parts must be flattened to text before rendering.
    String,
    /// OpenAI content parts (`[{"type": "text", "text": ...}, ...]`), iterated by the template.
    OpenAi,
}

/// A value handed to a template, built from anything serde can serialise.
#[derive(Debug, Clone, Default)]
pub struct TemplateValue(Value);

impl TemplateValue {
    pub fn from_serialize<T: Serialize + ?Sized>(value: &T) -> Self {
        TemplateValue(Value::from(minijinja::value::Serde(value)))
    }
}

/// One rendering: the conversation and its options.
#[derive(Debug, Clone, Default)]
pub struct ChatInput {
    /// The `messages` array.
    pub messages: TemplateValue,
    /// The `tools` array, if the request has one.
    pub tools: Option<TemplateValue>,
    /// End the prompt with the opening of an assistant turn.
    pub add_generation_prompt: bool,
    /// Extra template variables (a request's `chat_template_kwargs`, e.g. `enable_thinking`);
    /// they may override special tokens but not the names above.
    pub kwargs: Vec<(String, TemplateValue)>,
}

/// A compiled chat template with the special tokens it is rendered with. `Send + Sync`.
pub struct ChatTemplate {
    env: Environment<'static>,
    /// `(name, token)` as template values, made once: every rendering shares them.
    special_tokens: Arc<[(Value, Value)]>,
    content_format: ContentFormat,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("content_format", &self.content_format)
            .field("special_tokens", &self.special_tokens)
            .finish_non_exhaustive()
    }
}

/// Carried as the source of the error `raise_exception` returns, to tell it from other
/// rendering errors.
#[derive(Debug)]
struct Raised(String);

impl std::fmt::Display for Raised {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Raised {}

const RESERVED: [&str; 4] = ["messages", "tools", "documents", "add_generation_prompt"];

/// The variables a rendering sees, answered by name without building a map: the template
/// looks them up on every use, and a map of them hashed each name (and was built per
/// rendering). Precedence as when they were one map filled in this order: the reserved names,
/// then the request's extra arguments (the last of a repeated name wins), then the special
/// tokens. Enumerated in the map's order: special tokens, extra arguments not already named,
/// the reserved names.
#[derive(Debug)]
struct Root {
    messages: Value,
    tools: Value,
    add_generation_prompt: bool,
    arguments: Arguments,
    special_tokens: Arc<[(Value, Value)]>,
}

/// Most scanned arguments: a request may send any number, and beyond a few a lookup by name
/// goes through a map again, so no lookup costs more than a scan of this many.
const SCANNED_ARGUMENTS: usize = 16;

/// The request's extra template arguments.
#[derive(Debug)]
enum Arguments {
    /// Up to [`SCANNED_ARGUMENTS`], in the request's order, scanned from the last.
    Few(Vec<(Value, Value)>),
    /// More: a map in which a repeated name holds its last value.
    Many(Value),
}

impl Arguments {
    fn new(kwargs: &[(String, TemplateValue)]) -> Self {
        let pairs = kwargs
            .iter()
            .map(|(name, value)| (Value::from(name.as_str()), value.0.clone()));
        if kwargs.len() <= SCANNED_ARGUMENTS {
            Arguments::Few(pairs.collect())
        } else {
            Arguments::Many(Value::from_pairs(pairs.collect::<Vec<_>>()))
        }
    }

    fn get(&self, name: &str) -> Option<Value> {
        match self {
            Arguments::Few(pairs) => pairs
                .iter()
                .rev()
                .find(|(key, _)| key.as_str() == Some(name))
                .map(|(_, value)| value.clone()),
            Arguments::Many(map) => map.get_attr(name).ok().filter(|v| !v.is_undefined()),
        }
    }

    fn names(&self) -> Vec<Value> {
        match self {
            Arguments::Few(pairs) => pairs.iter().map(|(key, _)| key.clone()).collect(),
            Arguments::Many(map) => map.try_iter().map(Iterator::collect).unwrap_or_default(),
        }
    }
}

impl Root {
    fn lookup(&self, name: &str) -> Option<Value> {
        match name {
            "messages" => Some(self.messages.clone()),
            "tools" => Some(self.tools.clone()),
            "documents" => Some(Value::from(())),
            "add_generation_prompt" => Some(Value::from(self.add_generation_prompt)),
            _ => self.arguments.get(name).or_else(|| {
                self.special_tokens
                    .iter()
                    .find(|(key, _)| key.as_str() == Some(name))
                    .map(|(_, value)| value.clone())
            }),
        }
    }

    fn names(&self) -> Vec<Value> {
        let mut names: Vec<Value> = self.special_tokens.iter().map(|(k, _)| k.clone()).collect();
        for key in self.arguments.names() {
            if !names.contains(&key) {
                names.push(key);
            }
        }
        names.extend(RESERVED.iter().map(|name| Value::from(*name)));
        names
    }
}

impl Object for Root {
    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.lookup(key.as_str()?)
    }

    fn get_value_by_str(self: &Arc<Self>, key: &str) -> Option<Value> {
        self.lookup(key)
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.names())
    }
}

impl ChatTemplate {
    /// Compiles `source`; `file` names it in errors.
    pub(crate) fn compile(
        source: String,
        special_tokens: Vec<(&'static str, String)>,
        file: &std::path::Path,
    ) -> Result<Self, LoadError> {
        let mut env = Environment::new();
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .expect("the default delimiters are valid");
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source)
            .map_err(|e| LoadError::Template {
                file: file.to_owned(),
                detail: e.to_string(),
            })?;
        let special_tokens = special_tokens
            .iter()
            .map(|(name, token)| (Value::from(*name), Value::from(token.as_str())))
            .collect();
        let mut template = ChatTemplate {
            env,
            special_tokens,
            content_format: ContentFormat::String,
        };
        template.content_format = template.probe_content_format();
        Ok(template)
    }

    /// Renders the prompt for `input`.
    pub fn render(&self, input: &ChatInput) -> Result<String, TemplateError> {
        if let Some((name, _)) = input
            .kwargs
            .iter()
            .find(|(name, _)| RESERVED.contains(&name.as_str()))
        {
            return Err(TemplateError::ReservedArgument { name: name.clone() });
        }
        let root = Root {
            messages: input.messages.0.clone(),
            tools: input
                .tools
                .as_ref()
                .map_or(Value::from(()), |t| t.0.clone()),
            add_generation_prompt: input.add_generation_prompt,
            arguments: Arguments::new(&input.kwargs),
            special_tokens: self.special_tokens.clone(),
        };
        let template = self
            .env
            .get_template(NAME)
            .map_err(|e| TemplateError::Render {
                detail: e.to_string(),
            })?;
        template
            .render(Value::from_object(root))
            .map_err(|e| match raised(&e) {
                Some(message) => TemplateError::Raised { message },
                None => TemplateError::Render {
                    detail: e.to_string(),
                },
            })
    }

    /// Whether the template iterates content parts or expects string content.
    pub fn content_format(&self) -> ContentFormat {
        self.content_format
    }

    /// Heuristic, decided once at load: render one user message whose content is a list with
    /// one text part. A template that walks the parts prints the part's text and not the
    /// list's own representation (which shows the `"type"` key); one that expects a string
    /// prints the list as a whole or fails on it.
    fn probe_content_format(&self) -> ContentFormat {
        const PROBE: &str = "pdrouter-content-probe";
        let part =
            serde_json::json!([{ "role": "user", "content": [{ "type": "text", "text": PROBE }] }]);
        let input = ChatInput {
            messages: TemplateValue::from_serialize(&part),
            add_generation_prompt: true,
            ..ChatInput::default()
        };
        match self.render(&input) {
            Ok(out)
                if out.contains(PROBE) && !out.contains("\"type\"") && !out.contains("'type'") =>
            {
                ContentFormat::OpenAi
            }
            _ => ContentFormat::String,
        }
    }
}

fn raised(err: &Error) -> Option<String> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(Raised(message)) = e.downcast_ref::<Raised>() {
            return Some(message.clone());
        }
        source = e.source();
    }
    None
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message.clone()).with_source(Raised(message)))
}

fn strftime_now(format: String) -> Result<Value, Error> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    strftime(&format, now).map(Value::from)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// C `strftime` for a UTC time, the directives templates use (`%d %b %Y` and the like).
pub(crate) fn strftime(format: &str, unix_secs: i64) -> Result<String, Error> {
    let days = unix_secs.div_euclid(86_400);
    let secs = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[month as usize - 1];
    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let directive = chars.next().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidOperation,
                "strftime_now: format ends with '%'",
            )
        })?;
        let _ = match directive {
            'Y' => write!(out, "{year}"),
            'y' => write!(out, "{:02}", year.rem_euclid(100)),
            'm' => write!(out, "{month:02}"),
            'd' => write!(out, "{day:02}"),
            'e' => write!(out, "{day:2}"),
            'j' => write!(out, "{yday:03}"),
            'H' => write!(out, "{hour:02}"),
            'I' => write!(out, "{:02}", (hour + 11) % 12 + 1),
            'p' => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            'M' => write!(out, "{minute:02}"),
            'S' => write!(out, "{second:02}"),
            'B' => write!(out, "{month_name}"),
            'b' | 'h' => write!(out, "{}", &month_name[..3]),
            'A' => write!(out, "{}", WEEKDAYS[weekday]),
            'a' => write!(out, "{}", &WEEKDAYS[weekday][..3]),
            'u' => write!(out, "{}", weekday + 1),
            'w' => write!(out, "{}", (weekday + 1) % 7),
            'F' => write!(out, "{year}-{month:02}-{day:02}"),
            'T' => write!(out, "{hour:02}:{minute:02}:{second:02}"),
            'Z' => write!(out, "UTC"),
            'z' => write!(out, "+0000"),
            '%' => write!(out, "%"),
            other => {
                let msg = format!("strftime_now: unsupported directive %{other}");
                return Err(Error::new(ErrorKind::InvalidOperation, msg));
            }
        };
    }
    Ok(out)
}

/// Proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// HF's `tojson`: `tojson(ensure_ascii=False, indent=None, separators=None, sort_keys=False)`,
/// positional or by keyword, with Python `json.dumps` formatting.
fn tojson(value: &Value, args: Rest<ValueOrKwargs>) -> Result<Value, Error> {
    let mut args = args.into_values();
    let kwargs = match args.last() {
        Some(last) if last.is_kwargs() => Kwargs::try_from(args.pop().unwrap_or_default())?,
        _ => Kwargs::from_iter(std::iter::empty::<(String, Value)>()),
    };
    if args.len() > 4 {
        let msg = "tojson takes at most 4 arguments";
        return Err(Error::new(ErrorKind::TooManyArguments, msg));
    }
    let mut positional = args.into_iter();
    let mut pick = |name: &str| -> Result<Option<Value>, Error> {
        // As in Python, the n-th positional argument binds the n-th parameter.
        let by_position = positional.next();
        let named: Option<Value> = kwargs.get(name)?;
        Ok(named
            .or(by_position)
            .filter(|v| !v.is_none() && !v.is_undefined()))
    };
    let ensure_ascii = pick("ensure_ascii")?.is_some_and(|v| v.is_true());
    let indent = pick("indent")?;
    let separators = pick("separators")?;
    let sort_keys = pick("sort_keys")?.is_some_and(|v| v.is_true());
    let indent = match indent {
        None => None,
        Some(v) if v.kind() == ValueKind::String => Some(v.as_str().unwrap_or_default().to_owned()),
        Some(v) => Some(" ".repeat(usize::try_from(i64::try_from(v)?.max(0)).unwrap_or(0))),
    };
    let (item_sep, key_sep) = match separators {
        Some(seps) => {
            let mut it = seps.try_iter()?;
            let item = it.next().and_then(|v| v.as_str().map(str::to_owned));
            let key = it.next().and_then(|v| v.as_str().map(str::to_owned));
            match (item, key) {
                (Some(item), Some(key)) => (item, key),
                _ => {
                    let msg = "tojson: separators must be two strings";
                    return Err(Error::new(ErrorKind::InvalidOperation, msg));
                }
            }
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    kwargs.assert_all_used()?;
    let style = JsonStyle {
        ensure_ascii,
        sort_keys,
        indent,
        item_sep,
        key_sep,
    };
    let mut out = String::new();
    style.write(&mut out, value, 0)?;
    Ok(Value::from(out))
}

struct JsonStyle {
    ensure_ascii: bool,
    sort_keys: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
}

impl JsonStyle {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &Value, depth: usize) -> Result<(), Error> {
        match value.kind() {
            ValueKind::Undefined | ValueKind::None => out.push_str("null"),
            ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
            ValueKind::Number => write_number(out, value),
            ValueKind::String | ValueKind::Bytes => {
                self.write_str(out, value.as_str().unwrap_or_default());
            }
            ValueKind::Seq | ValueKind::Iterable => {
                out.push('[');
                let mut empty = true;
                for (i, item) in value.try_iter()?.enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write(out, &item, depth + 1)?;
                    empty = false;
                }
                if !empty {
                    self.newline(out, depth);
                }
                out.push(']');
            }
            ValueKind::Map => {
                let mut entries: Vec<(String, Value)> = Vec::new();
                for key in value.try_iter()? {
                    let entry = value.get_item(&key)?;
                    let key = match key.as_str() {
                        Some(s) => s.to_owned(),
                        None => {
                            let mut k = String::new();
                            self.write(&mut k, &key, 0)?;
                            k
                        }
                    };
                    entries.push((key, entry));
                }
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(&b.0));
                }
                out.push('{');
                for (i, (key, entry)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write_str(out, key);
                    out.push_str(&self.key_sep);
                    self.write(out, entry, depth + 1)?;
                }
                if !entries.is_empty() {
                    self.newline(out, depth);
                }
                out.push('}');
            }
            other => {
                let msg = format!("tojson: a {other} is not JSON serializable");
                return Err(Error::new(ErrorKind::InvalidOperation, msg));
            }
        }
        Ok(())
    }

    fn write_str(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{8}' => out.push_str("\\b"),
                '\u{c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

/// Python's `repr` of a number: integers as is; floats with a `.0` when integral, exponent
/// form (`1e+20`, `1e-05`) outside `[1e-4, 1e16)`, `NaN`/`Infinity` as `json.dumps` writes them.
fn write_number(out: &mut String, value: &Value) {
    if value.is_integer() {
        let _ = write!(out, "{value}");
        return;
    }
    let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
    if f.is_nan() {
        out.push_str("NaN");
    } else if f.is_infinite() {
        out.push_str(if f > 0.0 { "Infinity" } else { "-Infinity" });
    } else if f != 0.0 && (f.abs() >= 1e16 || f.abs() < 1e-4) {
        let s = format!("{f:e}");
        let (mantissa, exp) = s.split_once('e').unwrap_or((&s, "0"));
        let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
        let _ = write!(out, "{mantissa}e{sign}{digits:0>2}");
    } else {
        let s = format!("{f}");
        out.push_str(&s);
        if !s.contains('.') {
            out.push_str(".0");
        }
    }
}

#[cfg(test)]
mod tests;
