//! Formats whose calls are bare JSON, delimited by their own brackets: `json`, `llama`,
//! `mistral`.
//!
//! - `json`: the output starts (after whitespace) with a call object
//!   `{"name": …, "arguments"|"parameters": {…}}` or an array of them; text after it is text.
//!   Output that does not start with `{` or `[` is all text.
//! - `llama` (Llama 3.x): at the start of output, or after `<|python_tag|>` anywhere, call
//!   objects separated by `;`. The tag itself is always consumed.
//! - `mistral`: `[TOOL_CALLS]` followed by an array of call objects (or one object), or by the
//!   v11+ form `NAME[ARGS]{…}` (also `NAME[CALL_ID]ID[ARGS]{…}`, or `NAME{…}` when the
//!   `[ARGS]` token was not kept); each `[TOOL_CALLS]` opens one such block.
//!
//! An array is all or nothing: unless every element is a call to a known function, the whole
//! array comes out as text. A block that does not close before end of output is text.

use super::ToolSet;
use super::calls::{call_from_object, named_call};
use super::stream::{Emitter, Format};
use crate::json::{self, BracketEnd};
use crate::scan::{self, Hit, Step};

/// The calls in a JSON call object or array of them.
fn calls_from_value(raw: &str, tools: &ToolSet) -> Option<Vec<(String, String)>> {
    if raw.starts_with('{') {
        return call_from_object(raw, tools).map(|c| vec![c]);
    }
    let elements = json::elements(raw)?;
    if elements.is_empty() {
        return None;
    }
    elements
        .into_iter()
        .map(|e| call_from_object(e, tools))
        .collect()
}

fn emit(out: &mut Emitter, calls: Vec<(String, String)>) {
    for (name, args) in calls {
        out.call(name, args);
    }
}

/// Everything to the end of output is text.
fn all_text(buf: &str, out: &mut Emitter) -> Step {
    out.text(buf);
    Step::Consumed(buf.len())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JsonState {
    Start,
    Text,
}

#[derive(Debug)]
pub(crate) struct Json {
    tools: ToolSet,
    state: JsonState,
    scan: BracketEnd,
}

impl Json {
    pub(crate) fn new(tools: &ToolSet) -> Self {
        Self {
            tools: tools.clone(),
            state: JsonState::Start,
            scan: BracketEnd::json(),
        }
    }
}

impl Format for Json {
    fn step(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        if self.state == JsonState::Text {
            return all_text(buf, out);
        }
        let ws = scan::leading_ws(buf);
        let rest = &buf[ws..];
        if !(rest.starts_with('{') || rest.starts_with('[')) {
            if rest.is_empty() && !eof {
                return Step::NeedMore;
            }
            self.state = JsonState::Text;
            return Step::Consumed(0);
        }
        let Some(n) = self.scan.scan(rest) else {
            return if eof {
                all_text(buf, out)
            } else {
                Step::NeedMore
            };
        };
        self.state = JsonState::Text;
        out.text(&buf[..ws]);
        match calls_from_value(&rest[..n], &self.tools) {
            Some(calls) => emit(out, calls),
            None => out.text(&rest[..n]),
        }
        Step::Consumed(ws + n)
    }
}

const PYTHON_TAG: &str = "<|python_tag|>";

/// The Llama 3 special token before a tool call.
pub(crate) const LLAMA_TOKENS: &[&str] = &[PYTHON_TAG];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LlamaState {
    /// Start of output: a call object may come first.
    Start,
    Text,
    /// Expecting a call object.
    Calls,
    /// After a call: `;` and another, or text.
    AfterCall,
}

#[derive(Debug)]
pub(crate) struct Llama {
    tools: ToolSet,
    state: LlamaState,
    scan: BracketEnd,
}

impl Llama {
    pub(crate) fn new(tools: &ToolSet) -> Self {
        Self {
            tools: tools.clone(),
            state: LlamaState::Start,
            scan: BracketEnd::json(),
        }
    }

    fn start(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        let ws = scan::leading_ws(buf);
        let rest = &buf[ws..];
        if rest.starts_with('{') {
            self.state = LlamaState::Calls;
            Step::Consumed(0)
        } else if rest.starts_with(PYTHON_TAG) {
            out.text(&buf[..ws]);
            self.state = LlamaState::Calls;
            Step::Consumed(ws + PYTHON_TAG.len())
        } else if !eof && (rest.is_empty() || scan::is_proper_prefix(rest, &[PYTHON_TAG])) {
            Step::NeedMore
        } else {
            self.state = LlamaState::Text;
            Step::Consumed(0)
        }
    }

    fn text(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        match scan::find_first(buf, &[PYTHON_TAG]) {
            Hit::Found { at: 0, .. } => {
                self.state = LlamaState::Calls;
                Step::Consumed(PYTHON_TAG.len())
            }
            Hit::Found { at, .. } | Hit::Partial(at) if at > 0 => {
                out.text(&buf[..at]);
                Step::Consumed(at)
            }
            Hit::Partial(_) if !eof => Step::NeedMore,
            _ => all_text(buf, out),
        }
    }

    fn call(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        let ws = scan::leading_ws(buf);
        let rest = &buf[ws..];
        if !rest.starts_with('{') {
            if rest.is_empty() && !eof {
                return Step::NeedMore;
            }
            self.state = LlamaState::Text;
            return Step::Consumed(0);
        }
        let Some(n) = self.scan.scan(rest) else {
            return if eof {
                all_text(buf, out)
            } else {
                Step::NeedMore
            };
        };
        self.scan = BracketEnd::json();
        match call_from_object(&rest[..n], &self.tools) {
            Some((name, args)) => {
                out.text(&buf[..ws]);
                out.call(name, args);
                self.state = LlamaState::AfterCall;
            }
            None => {
                out.text(&buf[..ws + n]);
                self.state = LlamaState::Text;
            }
        }
        Step::Consumed(ws + n)
    }

    fn after_call(&mut self, buf: &str, eof: bool) -> Step {
        let ws = scan::leading_ws(buf);
        let rest = &buf[ws..];
        if rest.starts_with(';') {
            self.state = LlamaState::Calls;
            Step::Consumed(ws + 1)
        } else if rest.is_empty() && !eof {
            Step::NeedMore
        } else {
            self.state = LlamaState::Text;
            Step::Consumed(0)
        }
    }
}

impl Format for Llama {
    fn step(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        match self.state {
            LlamaState::Start => self.start(buf, eof, out),
            LlamaState::Text => self.text(buf, eof, out),
            LlamaState::Calls => self.call(buf, eof, out),
            LlamaState::AfterCall => self.after_call(buf, eof),
        }
    }
}

const TOOL_CALLS: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

/// The Mistral control tokens of a tool call.
pub(crate) const MISTRAL_TOKENS: &[&str] = &[TOOL_CALLS, ARGS, CALL_ID];

/// How far a `[TOOL_CALLS]` block has been made out.
enum Block {
    NeedMore,
    /// The block is this long and holds these calls.
    Calls(usize, Vec<(String, String)>),
    /// The first this-many bytes are not a call: text.
    Invalid(usize),
}

#[derive(Debug)]
pub(crate) struct Mistral {
    tools: ToolSet,
    scan: BracketEnd,
}

impl Mistral {
    pub(crate) fn new(tools: &ToolSet) -> Self {
        Self {
            tools: tools.clone(),
            scan: BracketEnd::json(),
        }
    }

    /// `buf` starts with `[TOOL_CALLS]`.
    fn block(&mut self, buf: &str) -> Block {
        let i = TOOL_CALLS.len() + scan::leading_ws(&buf[TOOL_CALLS.len()..]);
        let rest = &buf[i..];
        match rest.chars().next() {
            None => Block::NeedMore,
            Some('[' | '{') => match self.scan.scan(rest) {
                None => Block::NeedMore,
                Some(n) => match calls_from_value(&rest[..n], &self.tools) {
                    Some(calls) => Block::Calls(i + n, calls),
                    None => Block::Invalid(i + n),
                },
            },
            Some(c) if is_name_char(c) => self.named(buf, i),
            Some(_) => Block::Invalid(i),
        }
    }

    /// The v11+ form from byte `i`: `NAME[CALL_ID]ID[ARGS]{…}`, the id and `[ARGS]` optional.
    fn named(&mut self, buf: &str, i: usize) -> Block {
        let Some(len) = buf[i..].find(|c| !is_name_char(c)) else {
            return Block::NeedMore;
        };
        let name = &buf[i..i + len];
        let mut j = i + len;
        if let Some(id) = buf[j..].strip_prefix(CALL_ID) {
            let id_len = id
                .find(|c: char| !c.is_ascii_alphanumeric())
                .unwrap_or(id.len());
            let after = &id[id_len..];
            if after.starts_with(ARGS) {
                j += CALL_ID.len() + id_len;
            } else if after.is_empty() || scan::is_proper_prefix(after, &[ARGS]) {
                return Block::NeedMore;
            } else {
                return Block::Invalid(j);
            }
        } else if scan::is_proper_prefix(&buf[j..], &[ARGS, CALL_ID]) {
            return Block::NeedMore;
        }
        if buf[j..].starts_with(ARGS) {
            j += ARGS.len();
        }
        j += scan::leading_ws(&buf[j..]);
        let rest = &buf[j..];
        if rest.is_empty() {
            return Block::NeedMore;
        }
        if !rest.starts_with('{') {
            return Block::Invalid(j);
        }
        match self.scan.scan(rest) {
            None => Block::NeedMore,
            Some(n) => match named_call(name, &rest[..n], &self.tools) {
                Some(call) => Block::Calls(j + n, vec![call]),
                None => Block::Invalid(j + n),
            },
        }
    }
}

fn is_name_char(c: char) -> bool {
    c.is_alphanumeric() || matches!(c, '_' | '-' | '.')
}

impl Format for Mistral {
    fn step(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        match scan::find_first(buf, &[TOOL_CALLS]) {
            Hit::Found { at: 0, .. } => {}
            Hit::Found { at, .. } | Hit::Partial(at) if at > 0 => {
                out.text(&buf[..at]);
                return Step::Consumed(at);
            }
            Hit::Partial(_) if !eof => return Step::NeedMore,
            _ => return all_text(buf, out),
        }
        let block = self.block(buf);
        if !matches!(block, Block::NeedMore) {
            self.scan = BracketEnd::json();
        }
        match block {
            Block::NeedMore if !eof => Step::NeedMore,
            Block::NeedMore => {
                self.scan = BracketEnd::json();
                all_text(buf, out)
            }
            Block::Calls(n, calls) => {
                emit(out, calls);
                Step::Consumed(n)
            }
            Block::Invalid(n) => {
                out.text(&buf[..n]);
                Step::Consumed(n)
            }
        }
    }
}
