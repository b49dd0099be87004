//! Router-side tokenization for workers that take token ids (gRPC engines).
//!
//! - [`Tokenizer`] ([`tokenizer`]): loads `tokenizer.json` and the model files beside it (EOS
//!   ids, chat template); encodes without adding special tokens; decodes.
//! - [`ChatTemplate`] ([`template`]): renders a conversation as HF `apply_chat_template` does.
//! - [`DecodeStream`] ([`detok`]): token ids to text deltas, never splitting a UTF-8 sequence.
//! - [`TextStream`], [`StopMatcher`] ([`stop`]): stop strings across token boundaries, stop
//!   token ids and EOS, finish reasons.
//! - [`bundle`]: the `GetTokenizer` archive: pack, verify, extract safely.
//! - [`bytelevel`]: a byte-level tokenizer built in code, for mocks and tests.
//!
//! Knows nothing of networking or async runtimes: every call is synchronous and every type is
//! `Send + Sync`; share a [`Tokenizer`] behind an `Arc`. Encoding and rendering cost CPU in
//! proportion to the input: callers on an async runtime run inputs above
//! [`OFFLOAD_THRESHOLD_BYTES`] on a blocking pool. Errors are typed per concern in [`error`],
//! each saying whose fault it is.
//!
//! ```
//! use std::sync::Arc;
//! use pdrouter_tokenizer::*;
//!
//! let dir = tempfile::tempdir().unwrap();
//! for (name, data) in bytelevel::files() {
//!     std::fs::write(dir.path().join(name), data).unwrap();
//! }
//! let tokenizer = Arc::new(Tokenizer::load(dir.path(), None).unwrap());
//! let messages = serde_json::json!([{"role": "user", "content": "hi"}]);
//! let prompt = tokenizer
//!     .apply_chat_template(&ChatInput {
//!         messages: TemplateValue::from_serialize(&messages),
//!         add_generation_prompt: true,
//!         ..ChatInput::default()
//!     })
//!     .unwrap();
//! assert_eq!(prompt, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
//! let ids = tokenizer.encode(&prompt).unwrap();
//! assert_eq!(ids[0], bytelevel::IM_START);
//!
//! let stop = StopConditions::new(&tokenizer, &["!".into()], &[], false, false).unwrap();
//! let mut out = TextStream::new(tokenizer.clone(), DecodeOptions::default(), stop);
//! let step = out.push_all(&bytelevel::encode_plain("héllo! more")).unwrap();
//! assert_eq!(step.text, "héllo");
//! assert_eq!(step.finish, Some(FinishReason::StopString("!".into())));
//! ```

mod config;
mod fast;
mod merge;
mod word_cache;

pub mod bundle;
pub mod bytelevel;
pub mod detok;
pub mod error;
pub mod stop;
pub mod template;
pub mod tokenizer;

pub use detok::DecodeStream;
pub use error::{BundleError, DecodeError, EncodeError, LoadError, StopError, TemplateError};
pub use stop::{FinishReason, Step, StopConditions, StopMatcher, TextStream};
pub use template::{ChatInput, ChatTemplate, ContentFormat, TemplateValue};
pub use tokenizer::{
    DecodeOptions, FAST_OFFLOAD_THRESHOLD_BYTES, OFFLOAD_THRESHOLD_BYTES, Tokenizer,
};
