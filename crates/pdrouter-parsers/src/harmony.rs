//! The Harmony message stream of gpt-oss, cut into headers and bodies. Both the Harmony tool
//! parser and the Harmony reasoning parser read model output through this splitter.
//!
//! An assistant turn is a run of messages, `<|start|>assistant<|channel|>CHANNEL …<|message|>
//! BODY<|end|>`; the first one usually begins at `<|channel|>` (the prompt ended with
//! `<|start|>assistant`). The header may name a recipient, `to=functions.NAME`, in its role
//! part or its channel part, and a content type (`<|constrain|>json` or a bare `json`).
//! A body ends at `<|end|>`, `<|call|>` or `<|return|>`, at the next `<|start|>` or
//! `<|channel|>` (an engine that dropped the end token), or at end of output. Text outside any
//! message is passed on as such; end tokens outside a message are dropped.

use crate::scan::{self, Hit, Step};

pub(crate) const START: &str = "<|start|>";
pub(crate) const CHANNEL: &str = "<|channel|>";
pub(crate) const MESSAGE: &str = "<|message|>";
pub(crate) const CONSTRAIN: &str = "<|constrain|>";
pub(crate) const END: &str = "<|end|>";
pub(crate) const CALL: &str = "<|call|>";
pub(crate) const RETURN: &str = "<|return|>";

/// Every Harmony special token a parser must see.
pub(crate) const TOKENS: &[&str] = &[START, CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN];

/// A message header as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    /// The channel (`analysis`, `commentary`, `final`), empty when none was given.
    pub(crate) channel: String,
    /// The recipient (`functions.get_weather`), for tool calls.
    pub(crate) recipient: Option<String>,
    /// The header text verbatim, from its opening token through `<|message|>`.
    pub(crate) raw: String,
}

/// How a body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Term<'a> {
    /// At this end token (`<|end|>`, `<|call|>`, `<|return|>`).
    Token(&'a str),
    /// At the next message's opening token, no end token between.
    Opener,
    /// At end of output.
    Eof,
}

/// What the splitter saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event<'a> {
    /// Text outside any message.
    Text(&'a str),
    /// A message header; its body follows.
    Header(Header),
    /// A piece of the current message's body.
    Body(&'a str),
    /// The current message ended.
    End(Term<'a>),
}

#[derive(Debug, Clone)]
pub(crate) struct Splitter {
    in_body: bool,
    /// How far a pending header has been searched for `<|message|>`.
    searched: usize,
}

impl Splitter {
    /// A splitter for output that starts outside a message, or, with `in_analysis`, inside
    /// the body of an analysis message the prompt opened (its header is not reported).
    pub(crate) fn new(in_analysis: bool) -> Self {
        Self {
            in_body: in_analysis,
            searched: 0,
        }
    }

    /// Decides what it can about the start of `buf`, reporting through `f`.
    pub(crate) fn step<'b>(
        &mut self,
        buf: &'b str,
        eof: bool,
        f: &mut impl FnMut(Event<'b>),
    ) -> Step {
        if self.in_body {
            self.body(buf, eof, f)
        } else {
            self.outside(buf, eof, f)
        }
    }

    /// End of output: closes a message still open.
    pub(crate) fn finish<'b>(&mut self, f: &mut impl FnMut(Event<'b>)) {
        if self.in_body {
            self.in_body = false;
            f(Event::End(Term::Eof));
        }
    }

    fn outside<'b>(&mut self, buf: &'b str, eof: bool, f: &mut impl FnMut(Event<'b>)) -> Step {
        let markers = [START, CHANNEL, END, CALL, RETURN];
        match scan::find_first(buf, &markers) {
            Hit::Found { at: 0, marker } if marker >= 2 => Step::Consumed(markers[marker].len()),
            Hit::Found { at: 0, .. } => match buf[self.searched..].find(MESSAGE) {
                Some(m) => {
                    let raw = &buf[..self.searched + m + MESSAGE.len()];
                    self.searched = 0;
                    f(Event::Header(parse_header(raw)));
                    self.in_body = true;
                    Step::Consumed(raw.len())
                }
                None if !eof => {
                    let safe = buf.len().saturating_sub(MESSAGE.len() - 1);
                    self.searched = scan::floor_boundary(buf, safe);
                    Step::NeedMore
                }
                None => {
                    self.searched = 0;
                    f(Event::Text(buf));
                    Step::Consumed(buf.len())
                }
            },
            Hit::Found { at, .. } | Hit::Partial(at) if at > 0 => {
                f(Event::Text(&buf[..at]));
                Step::Consumed(at)
            }
            Hit::Partial(_) if !eof => Step::NeedMore,
            _ => {
                f(Event::Text(buf));
                Step::Consumed(buf.len())
            }
        }
    }

    fn body<'b>(&mut self, buf: &'b str, eof: bool, f: &mut impl FnMut(Event<'b>)) -> Step {
        let markers = [END, CALL, RETURN, START, CHANNEL];
        match scan::find_first(buf, &markers) {
            Hit::Found { at: 0, marker } => {
                self.in_body = false;
                if marker < 3 {
                    f(Event::End(Term::Token(markers[marker])));
                    Step::Consumed(markers[marker].len())
                } else {
                    f(Event::End(Term::Opener));
                    Step::Consumed(0)
                }
            }
            Hit::Found { at, .. } | Hit::Partial(at) if at > 0 => {
                f(Event::Body(&buf[..at]));
                Step::Consumed(at)
            }
            Hit::Partial(_) if !eof => Step::NeedMore,
            _ => {
                f(Event::Body(buf));
                Step::Consumed(buf.len())
            }
        }
    }
}

/// Channel and recipient of a header (`raw` runs from its opening token through
/// `<|message|>`).
fn parse_header(raw: &str) -> Header {
    let h = raw.strip_suffix(MESSAGE).unwrap_or(raw);
    let (role_part, channel_part) = match h.strip_prefix(START) {
        Some(rest) => rest.split_once(CHANNEL).unwrap_or((rest, "")),
        None => ("", h.strip_prefix(CHANNEL).unwrap_or(h)),
    };
    let words = |s: &'_ str| -> Vec<String> {
        s.replace(CONSTRAIN, " ")
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let channel_words = words(channel_part);
    let recipient = words(role_part)
        .into_iter()
        .chain(channel_words.iter().cloned())
        .find_map(|w| w.strip_prefix("to=").map(str::to_string));
    let channel = channel_words
        .into_iter()
        .find(|w| !w.starts_with("to="))
        .unwrap_or_default();
    Header {
        channel,
        recipient,
        raw: raw.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers() {
        let h = parse_header(
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>",
        );
        assert_eq!(h.channel, "commentary");
        assert_eq!(h.recipient.as_deref(), Some("functions.get_weather"));
        let h =
            parse_header("<|start|>assistant to=functions.f<|channel|>commentary json<|message|>");
        assert_eq!(h.channel, "commentary");
        assert_eq!(h.recipient.as_deref(), Some("functions.f"));
        let h = parse_header("<|start|>assistant<|channel|>final<|message|>");
        assert_eq!((h.channel.as_str(), h.recipient), ("final", None));
    }
}
