//! One reasoning block between a start and an end marker (`<think>…</think>`, Kimi's
//! `◁think▷…◁/think▷`).
//!
//! Before the block, text is content; the start marker opens the block; inside, text is
//! reasoning up to the end marker; after it, everything is content (a second start marker is
//! just text). Output that starts inside the block (the prompt opened it) may still repeat
//! the start marker first: it is dropped. Markers are never part of either text, so the
//! reasoning followed by the content is the output with its markers removed.

use super::ReasoningDelta;
use crate::scan::{self, Hit, Step};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not in the block yet.
    Before,
    /// In the block, nothing seen yet: a repeated start marker is dropped.
    Fresh,
    /// In the block.
    In,
    /// Past the block.
    After,
}

#[derive(Debug, Clone)]
pub(crate) struct Think {
    start: &'static str,
    end: &'static str,
    state: State,
}

impl Think {
    pub(crate) fn new(start: &'static str, end: &'static str, in_reasoning: bool) -> Self {
        let state = if in_reasoning {
            State::Fresh
        } else {
            State::Before
        };
        Self { start, end, state }
    }

    pub(crate) fn step(&mut self, buf: &str, eof: bool, out: &mut ReasoningDelta) -> Step {
        match self.state {
            State::Before => self.until(self.start, State::In, buf, eof, &mut out.content),
            State::Fresh => {
                if buf.starts_with(self.start) {
                    self.state = State::In;
                    Step::Consumed(self.start.len())
                } else if !eof && scan::is_proper_prefix(buf, &[self.start]) {
                    Step::NeedMore
                } else {
                    self.state = State::In;
                    Step::Consumed(0)
                }
            }
            State::In => self.until(self.end, State::After, buf, eof, &mut out.reasoning),
            State::After => {
                out.content.push_str(buf);
                Step::Consumed(buf.len())
            }
        }
    }

    /// Text into `sink` up to `marker`, which moves to `next`.
    fn until(
        &mut self,
        marker: &str,
        next: State,
        buf: &str,
        eof: bool,
        sink: &mut String,
    ) -> Step {
        match scan::find_first(buf, &[marker]) {
            Hit::Found { at: 0, .. } => {
                self.state = next;
                Step::Consumed(marker.len())
            }
            Hit::Found { at, .. } | Hit::Partial(at) if at > 0 => {
                sink.push_str(&buf[..at]);
                Step::Consumed(at)
            }
            Hit::Partial(_) if !eof => Step::NeedMore,
            _ => {
                sink.push_str(buf);
                Step::Consumed(buf.len())
            }
        }
    }

    /// Where text that a misbehaving step left at end of output belongs.
    pub(crate) fn in_reasoning(&self) -> bool {
        matches!(self.state, State::Fresh | State::In)
    }
}
