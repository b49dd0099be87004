//! The `harmony` format (gpt-oss): calls are messages addressed `to=functions.NAME` (in the
//! commentary channel) whose body is the JSON arguments, ended by `<|call|>`.
//!
//! It reads either the raw output or the content the Harmony reasoning parser leaves: final
//! and commentary bodies without a recipient are text, text outside messages is text,
//! analysis bodies are dropped (reasoning is the reasoning parser's to report). A message
//! with a recipient is held whole; once it ends (at its end token, the next message or end of
//! output) it is a call when the recipient names a known function and the body is a JSON
//! object, else the message comes out verbatim as text.

use super::ToolSet;
use super::calls::named_call;
use super::stream::{Emitter, Format};
use crate::harmony::{Event, Splitter, Term};
use crate::scan::Step;

#[derive(Debug)]
enum Current {
    /// Outside a message.
    None,
    /// An analysis message: dropped.
    Drop,
    /// A message whose body is content.
    Text,
    /// A message with a recipient: held until it ends.
    Call { raw: String, recipient: String },
}

#[derive(Debug)]
pub(crate) struct Harmony {
    tools: ToolSet,
    split: Splitter,
    current: Current,
}

impl Harmony {
    pub(crate) fn new(tools: &ToolSet) -> Self {
        Self {
            tools: tools.clone(),
            split: Splitter::new(false),
            current: Current::None,
        }
    }
}

/// Handles one splitter event.
fn on_event(current: &mut Current, tools: &ToolSet, out: &mut Emitter, event: Event<'_>) {
    match event {
        Event::Text(t) => out.text(t),
        Event::Header(h) => {
            *current = match h.recipient {
                Some(recipient) => Current::Call {
                    raw: h.raw,
                    recipient,
                },
                None if h.channel == "analysis" => Current::Drop,
                None => Current::Text,
            }
        }
        Event::Body(b) => match current {
            Current::Text => out.text(b),
            Current::Call { raw, .. } => raw.push_str(b),
            Current::None | Current::Drop => {}
        },
        Event::End(term) => {
            if let Current::Call { raw, recipient } = std::mem::replace(current, Current::None) {
                end_call(raw, &recipient, term, tools, out);
            }
        }
    }
}

fn end_call(mut raw: String, recipient: &str, term: Term<'_>, tools: &ToolSet, out: &mut Emitter) {
    let body = raw
        .find(crate::harmony::MESSAGE)
        .map(|m| &raw[m + crate::harmony::MESSAGE.len()..]);
    let call = recipient
        .strip_prefix("functions.")
        .zip(body)
        .and_then(|(name, body)| named_call(name, body, tools));
    match call {
        Some((name, args)) => out.call(name, args),
        None => {
            if let Term::Token(t) = term {
                raw.push_str(t);
            }
            out.text(&raw);
        }
    }
}

impl Format for Harmony {
    fn step(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        let (current, tools) = (&mut self.current, &self.tools);
        self.split
            .step(buf, eof, &mut |e| on_event(current, tools, out, e))
    }

    fn finish(&mut self, out: &mut Emitter) {
        let (current, tools) = (&mut self.current, &self.tools);
        self.split.finish(&mut |e| on_event(current, tools, out, e));
    }
}
