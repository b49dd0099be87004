//! Formats whose calls are blocks between a begin and an end marker, optionally inside a
//! section (`qwen`, `qwen_xml`, `glm4x_moe`, `deepseek`, `deepseek31`, `kimik2`, `minimax_m2`,
//! `step3`).
//!
//! Outside a section (or a block, for formats without sections) text passes through, holding
//! back only a possible start of the entry marker. A block is held until its end marker
//! arrives; its body is then parsed by the format's body function. A body that gives calls to
//! known functions emits them; any other block comes out verbatim as text, markers included.
//! Section markers themselves are consumed; text between the blocks of a section is text
//! like any other (the emitter drops the layout whitespace before and after calls). A block
//! still open at end of output comes out as text; an open section simply ends.

use super::ToolSet;
use super::stream::{Emitter, Format};
use crate::scan::{self, Hit, Step};

/// Parses a block body (between the markers) into its calls, `None` if it is not a valid
/// call to known functions.
pub(crate) type BodyFn = fn(&str, &ToolSet) -> Option<Vec<(String, String)>>;

/// The markup of one block-delimited format.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Markup {
    /// Section begin and end markers, for formats that wrap their calls in one.
    pub(crate) section: Option<(&'static str, &'static str)>,
    pub(crate) begin: &'static str,
    pub(crate) end: &'static str,
    pub(crate) body: BodyFn,
}

#[derive(Debug)]
pub(crate) struct Tagged {
    markup: Markup,
    tools: ToolSet,
    in_section: bool,
    /// How far the pending block has been searched for its end marker (0: not yet).
    searched: usize,
}

impl Tagged {
    pub(crate) fn new(markup: Markup, tools: &ToolSet) -> Self {
        Self {
            markup,
            tools: tools.clone(),
            in_section: false,
            searched: 0,
        }
    }

    /// Text mode: pass text through up to the entry marker.
    fn outside(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        let entry = self.markup.section.map_or(self.markup.begin, |s| s.0);
        match scan::find_first(buf, &[entry]) {
            Hit::Found { at: 0, .. } if self.markup.section.is_some() => {
                self.in_section = true;
                Step::Consumed(entry.len())
            }
            Hit::Found { at: 0, .. } => self.block(buf, eof, out),
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

    /// Inside a section: blocks, the section end, or text between them.
    fn inside(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        let (_, section_end) = self.markup.section.unwrap_or_default();
        if buf.starts_with(section_end) {
            self.in_section = false;
            return Step::Consumed(section_end.len());
        }
        if buf.starts_with(self.markup.begin) {
            return self.block(buf, eof, out);
        }
        let markers = [self.markup.begin, section_end];
        match scan::find_first(buf, &markers) {
            Hit::Partial(0) if !eof => Step::NeedMore,
            Hit::Found { at, .. } | Hit::Partial(at) if at > 0 => {
                out.text(&buf[..at]);
                Step::Consumed(at)
            }
            _ => {
                out.text(buf);
                Step::Consumed(buf.len())
            }
        }
    }

    /// `buf` starts with the begin marker: wait for the end marker, then parse the body.
    fn block(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        let Markup {
            begin, end, body, ..
        } = self.markup;
        let from = self.searched.max(begin.len());
        let Some(rel) = buf[from..].find(end) else {
            if eof {
                self.searched = 0;
                out.text(buf);
                return Step::Consumed(buf.len());
            }
            let safe = buf.len().saturating_sub(end.len() - 1).max(begin.len());
            self.searched = scan::floor_boundary(buf, safe);
            return Step::NeedMore;
        };
        self.searched = 0;
        let stop = from + rel;
        let total = stop + end.len();
        match body(&buf[begin.len()..stop], &self.tools) {
            Some(calls) if !calls.is_empty() => {
                for (name, args) in calls {
                    out.call(name, args);
                }
            }
            _ => out.text(&buf[..total]),
        }
        Step::Consumed(total)
    }
}

impl Format for Tagged {
    fn step(&mut self, buf: &str, eof: bool, out: &mut Emitter) -> Step {
        if self.in_section {
            self.inside(buf, eof, out)
        } else {
            self.outside(buf, eof, out)
        }
    }
}
