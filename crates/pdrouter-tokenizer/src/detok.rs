//! [`DecodeStream`]: token ids in, one at a time; text deltas out.
//!
//! Method: the stream keeps a short window of ids, split at a read offset into a prefix
//! (already emitted, kept as context for decoders whose output depends on neighbours, such as
//! SentencePiece's leading-space rule) and the unread ids. Each step decodes the whole window;
//! the delta is what it adds to the prefix's text. Then the window slides: the unread ids
//! become the prefix.
//!
//! Invariants:
//! - A delta never ends inside a UTF-8 sequence: while the window's text ends with U+FFFD
//!   (what a byte-level decoder makes of an incomplete sequence), or adds nothing past the
//!   prefix, the ids are held back, up to [`MAX_HELD_TOKENS`] (valid UTF-8 needs at most 3
//!   held; only invalid bytes reach the bound, and are then emitted as U+FFFD like a full
//!   decode shows them).
//! - For decoders whose output for a prefix of ids is a prefix of the output for all ids
//!   (byte-level BPE, SentencePiece, WordPiece without clean-up) the concatenation of all
//!   deltas and [`DecodeStream::flush`] equals `decode(all ids)`.
//! - A token that adds no text (a skipped special token) is dropped from the window at once,
//!   so the window, and each step's cost, stay bounded whatever the model generates.

use std::sync::Arc;

use crate::error::DecodeError;
use crate::tokenizer::{DecodeOptions, Tokenizer};

/// Most unread ids held back waiting for an incomplete UTF-8 sequence to complete.
pub const MAX_HELD_TOKENS: usize = 16;

/// Incremental detokenizer for one output sequence.
#[derive(Debug)]
pub struct DecodeStream {
    tokenizer: Arc<Tokenizer>,
    options: DecodeOptions,
    /// The window: `ids[..read]` is the emitted prefix, `ids[read..]` the unread ids.
    ids: Vec<u32>,
    read: usize,
    /// `decode(ids[..read])`.
    prefix_text: String,
}

impl DecodeStream {
    pub fn new(tokenizer: Arc<Tokenizer>, options: DecodeOptions) -> Self {
        DecodeStream {
            tokenizer,
            options,
            ids: Vec::with_capacity(8),
            read: 0,
            prefix_text: String::new(),
        }
    }

    /// The decoding options this stream uses.
    pub fn options(&self) -> DecodeOptions {
        self.options
    }

    /// Adds one id; returns the new text it completes, if any.
    pub fn step(&mut self, id: u32) -> Result<Option<String>, DecodeError> {
        self.ids.push(id);
        let text = self.tokenizer.decode(&self.ids, self.options)?;
        if text == self.prefix_text {
            self.ids.pop();
            return Ok(None);
        }
        let held = self.ids.len() - self.read;
        let complete = text.len() > self.prefix_text.len() && !text.ends_with('\u{FFFD}');
        if !complete && held < MAX_HELD_TOKENS {
            return Ok(None);
        }
        let delta = self.delta(&text);
        self.slide(text)?;
        Ok(Some(delta).filter(|d| !d.is_empty()))
    }

    /// Ends the sequence: the text of ids still held back (an incomplete UTF-8 sequence shows
    /// as U+FFFD, as in a full decode). The stream starts afresh afterwards.
    pub fn flush(&mut self) -> Result<Option<String>, DecodeError> {
        if self.ids.len() == self.read {
            self.reset();
            return Ok(None);
        }
        let text = self.tokenizer.decode(&self.ids, self.options)?;
        let delta = self.delta(&text);
        self.reset();
        Ok(Some(delta).filter(|d| !d.is_empty()))
    }

    /// What `text` (the window's text) adds to the emitted prefix. A decoder that rewrote the
    /// prefix's text (not prefix-stable) gets its text past the longest common prefix.
    fn delta(&self, text: &str) -> String {
        if let Some(rest) = text.strip_prefix(self.prefix_text.as_str()) {
            return rest.to_owned();
        }
        let common = text
            .char_indices()
            .zip(self.prefix_text.chars())
            .find(|((_, a), b)| a != b)
            .map_or(text.len().min(self.prefix_text.len()), |((i, _), _)| i);
        let common = (0..=common)
            .rev()
            .find(|i| text.is_char_boundary(*i))
            .unwrap_or(0);
        text[common..].to_owned()
    }

    /// The unread ids become the prefix; `text` is the whole window's text.
    fn slide(&mut self, text: String) -> Result<(), DecodeError> {
        // With no prefix yet (a sequence's first text) the new prefix is the whole window,
        // whose text is known: no second decode.
        let whole_window = self.read == 0;
        self.ids.drain(..self.read);
        self.read = self.ids.len();
        self.prefix_text = if whole_window {
            text
        } else {
            self.tokenizer.decode(&self.ids, self.options)?
        };
        Ok(())
    }

    fn reset(&mut self) {
        self.ids.clear();
        self.read = 0;
        self.prefix_text.clear();
    }
}
