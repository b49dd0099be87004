//! [`Tokenizer`]: a loaded HF tokenizer with its model's EOS ids and chat template.
//!
//! Invariants:
//! - Immutable after loading, `Send + Sync`: share one behind an `Arc`.
//! - [`Tokenizer::encode`] never adds special tokens (the chat template writes them) and never
//!   truncates or pads, whatever `tokenizer.json` configures.
//! - Every call is synchronous and CPU-bound: callers on an async runtime run inputs longer than
//!   [`Tokenizer::offload_threshold`] on a blocking pool (`spawn_blocking`), so a large prompt never
//!   stalls the reactor.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::config::{self, ModelFiles};
use crate::error::{DecodeError, EncodeError, LoadError, TemplateError};
use crate::fast::Fast;
use crate::template::{ChatInput, ChatTemplate};

/// Inputs (prompt text, or a rendered chat prompt) above this many bytes should be encoded
/// off the async reactor. Measured with the Qwen3 tokenizer (`benches/tokenizer.rs`, `encode/N`):
/// 0.4–0.6 µs per byte of English text on a loaded 2-core machine, over half of it in the
/// pre-tokenizer's pattern (fancy-regex: its look-ahead needs a backtracking engine). So 1 KiB
/// blocks a reactor thread for about 0.6 ms at most, and a 32k-token prompt (150 ms) never does.
pub const OFFLOAD_THRESHOLD_BYTES: usize = 1024;

/// [`OFFLOAD_THRESHOLD_BYTES`] for tokenizers that take the fast route (`fast.rs`):
/// `benches/tokenizer.rs` measures it 4-7 times faster than the pipeline (1,024 tokens, 4.7 KB,
/// in 0.13 ms against 0.74 ms on the 2-core machine), so 8 KiB holds a reactor thread no longer
/// than 1 KiB does through the pipeline.
pub const FAST_OFFLOAD_THRESHOLD_BYTES: usize = 8 << 10;

/// How token ids become text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOptions {
    /// Leave out special tokens (`<|im_end|>`, ...). Non-special added tokens stay.
    pub skip_special_tokens: bool,
    /// Put one space between an added token that stays in the text and the text around it, as
    /// HF's Python tokenizers do. HF's fast tokenizers, which engines use for `tokenizer.json`
    /// models, never insert these spaces; the default (`false`) matches what engines return.
    pub spaces_between_special_tokens: bool,
}

impl Default for DecodeOptions {
    fn default() -> Self {
        DecodeOptions {
            skip_special_tokens: true,
            spaces_between_special_tokens: false,
        }
    }
}

#[derive(Debug, Clone)]
struct AddedToken {
    content: String,
    special: bool,
}

/// A tokenizer loaded from `tokenizer.json` and the model files beside it.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// The same ids without the library's bookkeeping, for the configurations it covers.
    fast: Option<Fast>,
    added: HashMap<u32, AddedToken>,
    eos_token_ids: Vec<u32>,
    template: Option<ChatTemplate>,
    vocab_size: u32,
    source: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    /// A summary: the vocabulary would fill a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size)
            .field("eos_token_ids", &self.eos_token_ids)
            .field("chat_template", &self.template)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads from `path`, a `tokenizer.json` file or a directory holding one. The optional files
    /// (`tokenizer_config.json`, `generation_config.json`, `config.json`,
    /// `chat_template.jinja`/`chat_template.json`) are read from that directory, or from the
    /// file's directory. `chat_template` (a `.jinja` file, or a `.json` file with a
    /// `chat_template` field) replaces the template found there.
    pub fn load(path: &Path, chat_template: Option<&Path>) -> Result<Self, LoadError> {
        let (json_path, dir) = if path.is_dir() {
            (path.join("tokenizer.json"), path.to_owned())
        } else {
            let dir = path
                .parent()
                .map_or_else(|| PathBuf::from("."), Path::to_owned);
            (path.to_owned(), dir)
        };
        if !json_path.is_file() {
            return Err(LoadError::NoTokenizerJson {
                path: path.to_owned(),
            });
        }
        let mut inner =
            tokenizers::Tokenizer::from_file(&json_path).map_err(|e| LoadError::Tokenizer {
                path: json_path.clone(),
                detail: e.to_string(),
            })?;
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| LoadError::Tokenizer {
                path: json_path.clone(),
                detail: e.to_string(),
            })?;
        let added = inner
            .get_added_tokens_decoder()
            .into_iter()
            .map(|(id, t)| {
                let token = AddedToken {
                    content: t.content,
                    special: t.special,
                };
                (id, token)
            })
            .collect();

        let files = ModelFiles::read(&dir)?;
        let config_path = dir.join("tokenizer_config.json");
        let mut eos_token_ids = Vec::new();
        if let Some(eos) = &files.tokenizer_config.eos_token {
            let id =
                inner
                    .token_to_id(eos.content())
                    .ok_or_else(|| LoadError::UnknownSpecialToken {
                        file: config_path.clone(),
                        name: "eos_token",
                        token: eos.content().to_owned(),
                    })?;
            eos_token_ids.push(id);
        }
        for id in files.eos_token_ids {
            if !eos_token_ids.contains(&id) {
                eos_token_ids.push(id);
            }
        }

        let source = match chat_template {
            Some(file) => Some((config::template_file(file)?, file.to_owned())),
            None => files.chat_template,
        };
        let special = files.tokenizer_config.special_tokens();
        let template = source
            .map(|(text, file)| ChatTemplate::compile(text, special, &file))
            .transpose()?;
        let vocab_size = u32::try_from(inner.get_vocab_size(true)).unwrap_or(u32::MAX);
        Ok(Tokenizer {
            fast: Fast::new(&inner),
            inner,
            added,
            vocab_size,
            eos_token_ids,
            template,
            source: path.to_owned(),
        })
    }

    /// The path it was loaded from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Token ids of `text`, without special tokens added around it. Added tokens written in
    /// the text (`<|im_start|>`, ...) become their ids, as the chat template expects.
    ///
    /// The ids are the library's (`encode_fast(text, false)`): byte-level BPE tokenizers take
    /// a route without the library's offset bookkeeping (see `fast.rs`), the others
    /// [`Tokenizer::encode_pipeline`].
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        let fast = self
            .fast
            .as_ref()
            .and_then(|f| f.encode(self.inner.get_model(), text));
        match fast {
            Some(r) => r.map_err(|e| EncodeError::Tokenizer {
                detail: e.to_string(),
            }),
            None => self.encode_pipeline(text),
        }
    }

    /// The input size above which a caller on an async runtime should encode off it:
    /// [`FAST_OFFLOAD_THRESHOLD_BYTES`] on the fast route, else [`OFFLOAD_THRESHOLD_BYTES`].
    pub fn offload_threshold(&self) -> usize {
        if self.fast.is_some() {
            FAST_OFFLOAD_THRESHOLD_BYTES
        } else {
            OFFLOAD_THRESHOLD_BYTES
        }
    }

    /// Whether [`Tokenizer::encode`] takes the fast route for this tokenizer's configuration.
    pub fn has_fast_route(&self) -> bool {
        self.fast.is_some()
    }

    /// [`Tokenizer::encode`] through the library's pipeline (added tokens, normalizer,
    /// pre-tokenizer, model), the ids read straight from the tokenized pieces: the `Encoding`
    /// the library would build around them (type ids, masks, offsets, one string per token)
    /// and its post-processing are left out. Without special tokens, truncation or padding
    /// (all off here) the post-processors leave the ids as they are.
    pub fn encode_pipeline(&self, text: &str) -> Result<Vec<u32>, EncodeError> {
        use tokenizers::{Model as _, OffsetReferential, OffsetType, PreTokenizer as _};
        let failed = |e: tokenizers::Error| EncodeError::Tokenizer {
            detail: e.to_string(),
        };
        let inner = &self.inner;
        let mut pieces = inner
            .get_added_vocabulary()
            .extract_and_normalize(inner.get_normalizer(), text);
        if let Some(p) = inner.get_pre_tokenizer() {
            p.pre_tokenize(&mut pieces).map_err(failed)?;
        }
        let model = inner.get_model();
        pieces
            .tokenize(|piece| model.tokenize(piece.get()))
            .map_err(failed)?;
        let splits = pieces.get_splits(OffsetReferential::Normalized, OffsetType::None);
        let count = splits
            .iter()
            .map(|(_, _, t)| t.as_ref().map_or(0, Vec::len))
            .sum();
        let mut ids = Vec::with_capacity(count);
        for (_, _, tokens) in splits {
            ids.extend(tokens.iter().flatten().map(|t| t.id));
        }
        Ok(ids)
    }

    /// Checks that every id is in the vocabulary (client-supplied `input_ids`).
    pub fn check_ids(&self, ids: &[u32]) -> Result<(), EncodeError> {
        match ids.iter().find(|id| !self.knows(**id)) {
            Some(&id) => Err(EncodeError::UnknownTokenId {
                id,
                vocab_size: self.vocab_size(),
            }),
            None => Ok(()),
        }
    }

    /// Whether `id` is a token of this tokenizer.
    pub fn knows(&self, id: u32) -> bool {
        self.added.contains_key(&id) || self.inner.id_to_token(id).is_some()
    }

    /// Number of ids, added tokens included.
    pub fn vocab_size(&self) -> u32 {
        self.vocab_size
    }

    /// Text of `ids`. Ids outside the vocabulary decode to nothing, as in HF.
    pub fn decode(&self, ids: &[u32], options: DecodeOptions) -> Result<String, DecodeError> {
        let has_spaced_added = options.spaces_between_special_tokens
            && ids.iter().any(|id| self.is_kept_added(*id, options));
        if !has_spaced_added {
            return self.decode_run(ids, options.skip_special_tokens);
        }
        // HF's Python tokenizers: runs of ordinary tokens decode together; every added token
        // that stays is its own piece; pieces are joined with one space.
        let mut pieces: Vec<String> = Vec::new();
        let mut run: Vec<u32> = Vec::new();
        for &id in ids {
            if options.skip_special_tokens && self.is_special(id) {
                continue;
            }
            match self.added.get(&id) {
                Some(token) => {
                    if !run.is_empty() {
                        pieces.push(self.decode_run(&run, false)?);
                        run.clear();
                    }
                    pieces.push(token.content.clone());
                }
                None => run.push(id),
            }
        }
        if !run.is_empty() {
            pieces.push(self.decode_run(&run, false)?);
        }
        Ok(pieces.join(" "))
    }

    fn decode_run(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, DecodeError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| DecodeError {
                detail: e.to_string(),
            })
    }

    fn is_kept_added(&self, id: u32, options: DecodeOptions) -> bool {
        self.added
            .get(&id)
            .is_some_and(|t| !(options.skip_special_tokens && t.special))
    }

    /// Whether `id` is a special token (left out by `skip_special_tokens`).
    pub fn is_special(&self, id: u32) -> bool {
        self.added.get(&id).is_some_and(|t| t.special)
    }

    /// The id of a token written as text (`"<|im_end|>"`), if it is one token.
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary entry of `id` (byte-level tokenizers show bytes as their stand-in chars).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Ids that end generation: `tokenizer_config.json`'s `eos_token`, then
    /// `generation_config.json`'s and `config.json`'s `eos_token_id` (one id or a list), each
    /// once.
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.eos_token_ids
    }

    /// The chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    /// Renders a conversation with the chat template.
    pub fn apply_chat_template(&self, input: &ChatInput) -> Result<String, TemplateError> {
        self.template
            .as_ref()
            .ok_or(TemplateError::NoTemplate)?
            .render(input)
    }
}
