//! The streaming frame every tool format runs in: a buffer of unconsumed text, the format's
//! state machine over it, and the emitter that numbers calls and shapes the text around them.
//!
//! Invariants the emitter keeps, whatever the chunking:
//! - each call is emitted whole, once its markup has closed and checked out: `Call` then one
//!   `Args` with the complete arguments (so a call that turns out malformed or never closes
//!   can still come out as text: nothing about it was sent);
//! - call indices count 0, 1, 2… over the calls actually emitted;
//! - whitespace directly before a call, and after the last call when nothing else follows, is
//!   dropped (layout between markup, not content); all other text passes through unchanged;
//!   adjacent `Text` deltas are merged.

use super::{ToolDelta, ToolParser};
use crate::scan::{self, Step};

/// One tool-call format as a state machine over the unconsumed text.
pub(crate) trait Format: Send {
    /// Decides what it can about the start of `buf` (all text not yet consumed), emitting
    /// through `out`. At `eof` it must consume, never ask for more.
    fn step(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step;

    /// End of output, after the buffer has been consumed: emit anything still held.
    fn finish(&mut self, _out: &mut Emitter) {}
}

/// Collects the deltas of one `push` or `finish`.
#[derive(Debug, Default)]
pub(crate) struct Emitter {
    deltas: Vec<ToolDelta>,
    next_index: usize,
    /// Trailing whitespace of the text so far, held until we know whether a call follows.
    pending_ws: String,
    /// Nothing but whitespace since the last call: dropped if output ends here.
    after_call: bool,
}

impl Emitter {
    /// Plain text (content).
    pub(crate) fn text(&mut self, s: &str) {
        let body = s.trim_end();
        if body.is_empty() {
            self.pending_ws.push_str(s);
            return;
        }
        let mut out = std::mem::take(&mut self.pending_ws);
        out.push_str(body);
        self.pending_ws.push_str(&s[body.len()..]);
        self.after_call = false;
        self.push_text(out);
    }

    /// A complete call to a known function; `arguments` is a compact JSON object.
    pub(crate) fn call(&mut self, name: String, arguments: String) {
        self.pending_ws.clear();
        let index = self.next_index;
        self.next_index += 1;
        self.deltas.push(ToolDelta::Call { index, name });
        self.deltas.push(ToolDelta::Args {
            index,
            fragment: arguments,
        });
        self.after_call = true;
    }

    fn push_text(&mut self, s: String) {
        if let Some(ToolDelta::Text(last)) = self.deltas.last_mut() {
            last.push_str(&s);
        } else {
            self.deltas.push(ToolDelta::Text(s));
        }
    }

    fn end(&mut self) {
        let ws = std::mem::take(&mut self.pending_ws);
        if !ws.is_empty() && !self.after_call {
            self.push_text(ws);
        }
    }

    fn take(&mut self) -> Vec<ToolDelta> {
        std::mem::take(&mut self.deltas)
    }
}

/// A [`ToolParser`] made of a [`Format`] and its buffer.
#[derive(Debug)]
pub(crate) struct Stream<F> {
    format: F,
    buf: String,
    out: Emitter,
}

impl<F: Format> Stream<F> {
    pub(crate) fn new(format: F) -> Self {
        Self {
            format,
            buf: String::new(),
            out: Emitter::default(),
        }
    }

    fn run(&mut self, eof: bool) {
        let (format, out) = (&mut self.format, &mut self.out);
        let leftover = scan::drive(&mut self.buf, eof, |buf, eof| format.step(buf, eof, out));
        if let Some(rest) = leftover {
            self.out.text(&rest);
        }
    }
}

impl<F: Format> ToolParser for Stream<F> {
    fn push(&mut self, text: &str) -> Vec<ToolDelta> {
        self.buf.push_str(text);
        self.run(false);
        self.out.take()
    }

    fn finish(&mut self) -> Vec<ToolDelta> {
        self.run(true);
        self.format.finish(&mut self.out);
        self.out.end();
        self.out.take()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whitespace_around_calls_is_dropped() {
        let mut e = Emitter::default();
        e.text("Hi ");
        e.text("there\n\n");
        e.call("f".into(), "{}".into());
        e.text("\n");
        e.call("f".into(), "{}".into());
        e.text("\n ");
        e.text(" done ");
        e.call("f".into(), "{}".into());
        e.text("\n ");
        e.end();
        let d = e.take();
        assert_eq!(
            d,
            [
                ToolDelta::Text("Hi there".into()),
                ToolDelta::Call {
                    index: 0,
                    name: "f".into()
                },
                ToolDelta::Args {
                    index: 0,
                    fragment: "{}".into()
                },
                ToolDelta::Call {
                    index: 1,
                    name: "f".into()
                },
                ToolDelta::Args {
                    index: 1,
                    fragment: "{}".into()
                },
                ToolDelta::Text("\n  done".into()),
                ToolDelta::Call {
                    index: 2,
                    name: "f".into()
                },
                ToolDelta::Args {
                    index: 2,
                    fragment: "{}".into()
                },
            ]
        );
    }
}
