//! The library's ids for byte-level BPE tokenizers, without its bookkeeping.
//!
//! The library runs every input through `NormalizedString`s that keep, for each byte, where it
//! came from in the input: every split slices those tables and the byte-level step rewrites
//! them byte by byte. The router wants ids only, so for the tokenizer shape most chat models
//! ship (Qwen, Llama 3, DeepSeek, GPT-2 style) this module does the same steps on plain
//! strings: added tokens split out by the same leftmost-longest automaton, the same split
//! pattern (the library's own regex engine), the same byte-to-character table, then the
//! library's BPE merges on each piece (on ids, [`crate::merge`], where the model allows it;
//! else the library's model itself), whose ids for a word are kept for next time
//! ([`crate::word_cache`]).
//!
//! Invariants:
//! - A [`Fast`] exists only for a configuration it reproduces exactly: no normalizer or NFC;
//!   a pre-tokenizer that is `ByteLevel` without a prefix space, or a sequence of one
//!   isolating, non-inverted regex `Split` and such a `ByteLevel` without its own regex; a BPE
//!   model without dropout; added tokens matched in the raw text (not normalized, no
//!   stripping, not single-word) and special tokens not encoded as text. Any other
//!   configuration is left to the library's pipeline.
//! - Inputs it does not cover (non-ASCII text under NFC, whose normalization is not the
//!   identity) are answered `None`, and the caller runs the library's pipeline.
//! - For every input it answers, the ids are the library's (tested against it with the real
//!   Qwen3 tokenizer and the byte-level test tokenizer on generated texts).

use daachorse::{DoubleArrayAhoCorasick, DoubleArrayAhoCorasickBuilder, MatchKind};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::split::SplitPattern;
use tokenizers::tokenizer::pattern::Pattern as _;
use tokenizers::utils::SysRegex;
use tokenizers::{Model as _, ModelWrapper, SplitDelimiterBehavior};

use crate::merge::Merges;
use crate::word_cache::WordCache;

/// GPT-2's split pattern, which `ByteLevel` applies when asked to split itself.
const GPT2_PATTERN: &str =
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// The fast route for one tokenizer (see the module docs).
pub(crate) struct Fast {
    /// Added tokens' contents, valued by id; `None` when there are none.
    added: Option<DoubleArrayAhoCorasick<u32>>,
    /// The normalizer is NFC: only ASCII text (which NFC leaves alone) is taken.
    nfc: bool,
    /// The split pattern, if the pre-tokenizer splits.
    split: Option<SysRegex>,
    /// Byte-level characters by byte.
    chars: [char; 256],
    /// The model's merges on ids, when the model is one [`Merges`] reproduces.
    merges: Option<Merges>,
    /// Ids of words encoded before.
    words: WordCache,
}

impl Fast {
    /// The fast route for `tokenizer`, if its configuration is one it reproduces.
    pub(crate) fn new(tokenizer: &tokenizers::Tokenizer) -> Option<Fast> {
        let nfc = match tokenizer.get_normalizer() {
            None => false,
            Some(NormalizerWrapper::NFC(_)) => true,
            Some(_) => return None,
        };
        let plain =
            |b: &ByteLevel, own_regex: bool| !b.add_prefix_space && b.use_regex == own_regex;
        let split = match tokenizer.get_pre_tokenizer()? {
            PreTokenizerWrapper::ByteLevel(b) if plain(b, true) => Some(GPT2_PATTERN.to_owned()),
            PreTokenizerWrapper::ByteLevel(b) if plain(b, false) => None,
            PreTokenizerWrapper::Sequence(seq) => match seq.as_ref() {
                [
                    PreTokenizerWrapper::Split(s),
                    PreTokenizerWrapper::ByteLevel(b),
                ] if plain(b, false)
                    && !s.invert
                    && s.behavior == SplitDelimiterBehavior::Isolated =>
                {
                    match &s.pattern {
                        SplitPattern::Regex(p) => Some(p.clone()),
                        SplitPattern::String(_) => return None,
                    }
                }
                _ => return None,
            },
            _ => return None,
        };
        let split = match split {
            Some(p) => Some(SysRegex::new(&p).ok()?),
            None => None,
        };
        let chars = byte_chars();
        let merges = match tokenizer.get_model() {
            ModelWrapper::BPE(bpe) if bpe.dropout.is_none() => Merges::new(bpe, &chars),
            _ => return None,
        };
        let vocab = tokenizer.get_added_vocabulary();
        if vocab.get_encode_special_tokens() {
            return None;
        }
        let mut pairs = Vec::new();
        for (id, t) in vocab.get_added_tokens_decoder() {
            if t.normalized || t.lstrip || t.rstrip || t.single_word {
                return None;
            }
            if !t.content.is_empty() {
                pairs.push((t.content.clone(), *id));
            }
        }
        let added = if pairs.is_empty() {
            None
        } else {
            let built = DoubleArrayAhoCorasickBuilder::new()
                .match_kind(MatchKind::LeftmostLongest)
                .build_with_values(pairs);
            Some(built.ok()?)
        };
        Some(Fast {
            added,
            nfc,
            split,
            chars,
            merges,
            words: WordCache::new(),
        })
    }

    /// `text`'s ids, or `None` when the text is not one this route covers.
    pub(crate) fn encode(
        &self,
        model: &ModelWrapper,
        text: &str,
    ) -> Option<tokenizers::Result<Vec<u32>>> {
        if self.nfc && !text.is_ascii() {
            return None;
        }
        let mut ids = Vec::with_capacity(text.len() / 3 + 1);
        let mut word = String::new();
        let mut at = 0;
        let r = (|| {
            if let Some(added) = &self.added {
                for m in added.leftmost_find_iter(text) {
                    self.encode_piece(model, &text[at..m.start()], &mut word, &mut ids)?;
                    ids.push(m.value());
                    at = m.end();
                }
            }
            self.encode_piece(model, &text[at..], &mut word, &mut ids)
        })();
        Some(r.map(|()| ids))
    }

    /// Ids of text holding no added token: split, mapped to byte-level characters, BPE.
    fn encode_piece(
        &self,
        model: &ModelWrapper,
        piece: &str,
        word: &mut String,
        ids: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        if piece.is_empty() {
            return Ok(());
        }
        let Some(split) = &self.split else {
            return self.encode_word(model, piece, word, ids);
        };
        // Isolated: matches and the gaps between them are pieces alike.
        for ((start, end), _) in split.find_matches(piece)? {
            if start < end {
                self.encode_word(model, &piece[start..end], word, ids)?;
            }
        }
        Ok(())
    }

    fn encode_word(
        &self,
        model: &ModelWrapper,
        text: &str,
        word: &mut String,
        ids: &mut Vec<u32>,
    ) -> tokenizers::Result<()> {
        self.words.extend(text, ids, |text, ids| {
            if let Some(merges) = &self.merges {
                merges.extend(text.as_bytes(), ids);
                return Ok(());
            }
            word.clear();
            word.extend(text.bytes().map(|b| self.chars[usize::from(b)]));
            ids.extend(model.tokenize(word)?.into_iter().map(|t| t.id));
            Ok(())
        })
    }
}

/// GPT-2's byte-to-character table: printable Latin-1 bytes stand for themselves, the other
/// bytes, in order, for the characters from U+0100 on.
pub(crate) fn byte_chars() -> [char; 256] {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..=255u8 {
        table[usize::from(b)] = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or('\0');
            next += 1;
            c
        };
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen3_merges_on_ids() {
        let file = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/qwen3/tokenizer.json"
        );
        let tokenizer = tokenizers::Tokenizer::from_file(file).unwrap();
        let fast = Fast::new(&tokenizer).unwrap();
        assert!(fast.merges.is_some());
    }

    #[test]
    fn the_byte_table_is_gpt2s() {
        let t = byte_chars();
        assert_eq!(t[usize::from(b'A')], 'A');
        assert_eq!(t[usize::from(b' ')], 'Ġ');
        assert_eq!(t[usize::from(b'\n')], 'Ċ');
        assert_eq!(t[0], 'Ā');
        assert_eq!(t[0xAD], 'Ń');
        assert_eq!(t[0xFF], 'ÿ');
        let ours: std::collections::BTreeSet<char> = t.iter().copied().collect();
        let library: std::collections::BTreeSet<char> = ByteLevel::alphabet().into_iter().collect();
        assert_eq!(ours.len(), 256);
        assert_eq!(ours, library);
    }
}
