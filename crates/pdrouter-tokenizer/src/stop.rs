//! Stop conditions applied in the router: stop strings on the detokenized text, stop token ids
//! and EOS on the ids, and the finish reason a sequence ends with.
//!
//! Definition (what the output equals, however the text is split into tokens): the text stops
//! at the first point where it ends with a stop string (the earliest end; of several stop
//! strings ending there, the longest). The output is the text before that stop string, or
//! through it with `no_stop_trim`.
//!
//! Invariants:
//! - [`StopMatcher`] never emits a character that could still be the start of a stop string:
//!   it holds back the longest suffix of the text that is a proper prefix of some stop string,
//!   and lets it go once it can no longer match (or at [`StopMatcher::flush`]). So trimmed
//!   output never contains a stop string.
//! - A stop token id or EOS never reaches the text, with or without `skip_special_tokens` and
//!   whatever `no_stop_trim` says (that flag is about stop strings).
//! - After a stop, [`TextStream`] ignores further ids: the sequence is over.
//! - Stop conditions are bounded ([`MAX_STOP_STRINGS`] strings of at most
//!   [`MAX_STOP_STRING_BYTES`], [`MAX_STOP_TOKEN_IDS`] ids), so the per-token cost is bounded.

use std::sync::Arc;

use crate::detok::DecodeStream;
use crate::error::{DecodeError, StopError};
use crate::tokenizer::{DecodeOptions, Tokenizer};

/// Most stop strings per request.
pub const MAX_STOP_STRINGS: usize = 32;
/// Longest stop string, in bytes.
pub const MAX_STOP_STRING_BYTES: usize = 512;
/// Most stop token ids per request (EOS ids not counted).
pub const MAX_STOP_TOKEN_IDS: usize = 256;

/// Why a sequence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    /// A stop token id or an EOS id was generated.
    StopToken(u32),
    /// A stop string appeared in the text.
    StopString(String),
    /// The engine ended the sequence as stopped, with nothing matched here.
    Stop,
    /// The token limit was reached.
    Length,
    /// The sequence was aborted.
    Abort,
}

impl FinishReason {
    /// The OpenAI `finish_reason`: `stop`, `length` or `abort`.
    pub fn as_str(&self) -> &'static str {
        match self {
            FinishReason::StopToken(_) | FinishReason::StopString(_) | FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
    }

    /// The matched stop token id, for `matched_stop`.
    pub fn matched_token(&self) -> Option<u32> {
        match self {
            FinishReason::StopToken(id) => Some(*id),
            _ => None,
        }
    }

    /// The matched stop string, for `matched_stop`.
    pub fn matched_text(&self) -> Option<&str> {
        match self {
            FinishReason::StopString(s) => Some(s),
            _ => None,
        }
    }
}

/// A request's stop conditions, validated.
#[derive(Debug, Clone, Default)]
pub struct StopConditions {
    strings: Vec<String>,
    token_ids: Vec<u32>,
    no_stop_trim: bool,
}

impl StopConditions {
    /// `stop` strings (empty ones are ignored: they cannot mark a point in the text),
    /// `stop_token_ids`, and the tokenizer's EOS ids unless `ignore_eos`. `no_stop_trim` keeps
    /// a matched stop string in the output.
    pub fn new(
        tokenizer: &Tokenizer,
        stop: &[String],
        stop_token_ids: &[u32],
        ignore_eos: bool,
        no_stop_trim: bool,
    ) -> Result<Self, StopError> {
        if stop_token_ids.len() > MAX_STOP_TOKEN_IDS {
            return Err(StopError::TooManyTokenIds {
                limit: MAX_STOP_TOKEN_IDS,
            });
        }
        if let Some(&id) = stop_token_ids.iter().find(|id| !tokenizer.knows(**id)) {
            return Err(StopError::UnknownTokenId {
                id,
                vocab_size: tokenizer.vocab_size(),
            });
        }
        let eos: &[u32] = if ignore_eos {
            &[]
        } else {
            tokenizer.eos_token_ids()
        };
        let mut token_ids: Vec<u32> = stop_token_ids.to_vec();
        token_ids.extend_from_slice(eos);
        token_ids.sort_unstable();
        token_ids.dedup();
        let mut conditions = Self::strings(stop, no_stop_trim)?;
        conditions.token_ids = token_ids;
        Ok(conditions)
    }

    /// Stop strings only (no token ids), for text that does not come from token ids.
    pub fn strings(stop: &[String], no_stop_trim: bool) -> Result<Self, StopError> {
        let strings: Vec<String> = stop.iter().filter(|s| !s.is_empty()).cloned().collect();
        if strings.len() > MAX_STOP_STRINGS {
            return Err(StopError::TooManyStrings {
                limit: MAX_STOP_STRINGS,
            });
        }
        if strings.iter().any(|s| s.len() > MAX_STOP_STRING_BYTES) {
            return Err(StopError::StringTooLong {
                limit: MAX_STOP_STRING_BYTES,
            });
        }
        Ok(StopConditions {
            strings,
            token_ids: Vec::new(),
            no_stop_trim,
        })
    }

    /// Whether `id` ends the sequence.
    pub fn is_stop_token(&self, id: u32) -> bool {
        self.token_ids.binary_search(&id).is_ok()
    }
}

/// Applies stop strings to text arriving in pieces.
#[derive(Debug)]
pub struct StopMatcher {
    conditions: StopConditions,
    held: String,
    matched: Option<String>,
}

impl StopMatcher {
    pub fn new(conditions: StopConditions) -> Self {
        StopMatcher {
            conditions,
            held: String::new(),
            matched: None,
        }
    }

    /// The stop string that matched, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.as_deref()
    }

    /// Adds `text`; returns what may be emitted now. Once a stop string matched, returns the
    /// output up to it and nothing afterwards.
    pub fn push(&mut self, text: &str) -> String {
        if self.matched.is_some() {
            return String::new();
        }
        self.held.push_str(text);
        if let Some((start, end, index)) = self.first_match() {
            let keep = if self.conditions.no_stop_trim {
                end
            } else {
                start
            };
            self.held.truncate(keep);
            self.matched = Some(self.conditions.strings[index].clone());
            return std::mem::take(&mut self.held);
        }
        let hold = self.partial_suffix();
        self.held.drain(..self.held.len() - hold).collect()
    }

    /// Text held back as a possible stop string's start, now final.
    pub fn flush(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// `(start, end, index)` of the match that ends first, the longest of those ending there.
    fn first_match(&self) -> Option<(usize, usize, usize)> {
        let mut best: Option<(usize, usize, usize)> = None;
        for (index, stop) in self.conditions.strings.iter().enumerate() {
            if let Some(start) = self.held.find(stop.as_str()) {
                let end = start + stop.len();
                if best.is_none_or(|(s, e, _)| end < e || (end == e && start < s)) {
                    best = Some((start, end, index));
                }
            }
        }
        best
    }

    /// Length of the longest suffix of the held text that is a proper prefix of a stop string.
    fn partial_suffix(&self) -> usize {
        let held = self.held.as_bytes();
        let mut longest = 0;
        for stop in &self.conditions.strings {
            let stop = stop.as_bytes();
            let most = (stop.len() - 1).min(held.len());
            if let Some(k) = (longest + 1..=most)
                .rev()
                .find(|&k| held[held.len() - k..] == stop[..k])
            {
                longest = k;
            }
        }
        longest
    }
}

/// What one step of a [`TextStream`] produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Step {
    /// Text to send now (may be empty).
    pub text: String,
    /// Set on the step that ends the sequence.
    pub finish: Option<FinishReason>,
}

/// One output sequence: detokenizer and stop conditions together. Feed it the ids as they come.
#[derive(Debug)]
pub struct TextStream {
    decode: DecodeStream,
    stop: StopMatcher,
    finish: Option<FinishReason>,
}

impl TextStream {
    pub fn new(tokenizer: Arc<Tokenizer>, options: DecodeOptions, stop: StopConditions) -> Self {
        TextStream {
            decode: DecodeStream::new(tokenizer, options),
            stop: StopMatcher::new(stop),
            finish: None,
        }
    }

    /// Why the sequence ended, once it has.
    pub fn finish_reason(&self) -> Option<&FinishReason> {
        self.finish.as_ref()
    }

    /// Adds one generated id.
    pub fn push(&mut self, id: u32) -> Result<Step, DecodeError> {
        if self.finish.is_some() {
            return Ok(Step::default());
        }
        if self.stop.conditions.is_stop_token(id) {
            return self.end(FinishReason::StopToken(id));
        }
        let Some(delta) = self.decode.step(id)? else {
            return Ok(Step::default());
        };
        let text = self.stop.push(&delta);
        let finish = self
            .stop
            .matched()
            .map(|s| FinishReason::StopString(s.to_owned()));
        self.finish.clone_from(&finish);
        Ok(Step { text, finish })
    }

    /// Adds generated ids in order, up to the one that ends the sequence.
    pub fn push_all(&mut self, ids: &[u32]) -> Result<Step, DecodeError> {
        let mut out = Step::default();
        for &id in ids {
            let step = self.push(id)?;
            out.text.push_str(&step.text);
            if step.finish.is_some() {
                out.finish = step.finish;
                break;
            }
        }
        Ok(out)
    }

    /// The engine ended the sequence for `reason`: returns the text still held back. A stop
    /// string completed by that text wins over `reason`. After an earlier stop, returns nothing.
    pub fn finish(&mut self, reason: FinishReason) -> Result<Step, DecodeError> {
        if self.finish.is_some() {
            return Ok(Step::default());
        }
        self.end(reason)
    }

    fn end(&mut self, reason: FinishReason) -> Result<Step, DecodeError> {
        let tail = self.decode.flush()?.unwrap_or_default();
        let mut text = self.stop.push(&tail);
        let finish = match self.stop.matched() {
            Some(s) => FinishReason::StopString(s.to_owned()),
            None => {
                text.push_str(&self.stop.flush());
                reason
            }
        };
        self.finish = Some(finish.clone());
        Ok(Step {
            text,
            finish: Some(finish),
        })
    }
}
