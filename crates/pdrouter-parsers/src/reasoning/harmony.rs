//! Harmony (gpt-oss) output split by channel: analysis bodies are reasoning; final bodies,
//! commentary bodies without a recipient (preambles) and text outside messages are content,
//! their markup removed; messages with a recipient (tool calls) are content verbatim, header,
//! body and end token, so that the Harmony tool parser run on the content finds them. A call
//! message ended only by the next message's header gets an `<|end|>` in the content, since
//! that header may not follow it there.

use super::ReasoningDelta;
use crate::harmony::{END, Event, Splitter, Term};
use crate::scan::Step;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Current {
    None,
    Reasoning,
    Content,
    Verbatim,
}

#[derive(Debug, Clone)]
pub(crate) struct HarmonySplit {
    split: Splitter,
    current: Current,
}

impl HarmonySplit {
    pub(crate) fn new(in_analysis: bool) -> Self {
        Self {
            split: Splitter::new(in_analysis),
            current: if in_analysis {
                Current::Reasoning
            } else {
                Current::None
            },
        }
    }

    pub(crate) fn step(&mut self, buf: &str, eof: bool, out: &mut ReasoningDelta) -> Step {
        let current = &mut self.current;
        self.split
            .step(buf, eof, &mut |e| on_event(current, out, e))
    }

    pub(crate) fn finish(&mut self, out: &mut ReasoningDelta) {
        let current = &mut self.current;
        self.split.finish(&mut |e| on_event(current, out, e));
    }

    pub(crate) fn in_reasoning(&self) -> bool {
        self.current == Current::Reasoning
    }
}

fn on_event(current: &mut Current, out: &mut ReasoningDelta, event: Event<'_>) {
    match event {
        Event::Text(t) => out.content.push_str(t),
        Event::Header(h) => {
            *current = if h.recipient.is_some() {
                out.content.push_str(&h.raw);
                Current::Verbatim
            } else if h.channel == "analysis" {
                Current::Reasoning
            } else {
                Current::Content
            };
        }
        Event::Body(b) => match current {
            Current::Reasoning => out.reasoning.push_str(b),
            _ => out.content.push_str(b),
        },
        Event::End(term) => {
            if *current == Current::Verbatim {
                match term {
                    Term::Token(t) => out.content.push_str(t),
                    Term::Opener => out.content.push_str(END),
                    Term::Eof => {}
                }
            }
            *current = Current::None;
        }
    }
}
