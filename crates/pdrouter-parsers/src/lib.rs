//! Model text to OpenAI `tool_calls` and `reasoning_content`, for workers that only see token
//! ids (gRPC engines), where the router itself must read the model's markup.
//!
//! - [`tool`]: tool-call formats per model family ([`ToolKind`]: Hermes/Qwen, Qwen3-Coder XML,
//!   Llama 3 JSON, pythonic, Mistral, DeepSeek V3/V3.1, Kimi K2, GLM-4.5/4.7, MiniMax M2,
//!   Step3, gpt-oss Harmony, bare JSON), streaming ([`ToolParser`]) and whole ([`parse_all`]).
//! - [`reasoning`]: reasoning blocks (`<think>`, Kimi's `◁think▷`) and Harmony's analysis
//!   channel ([`ReasoningKind`]), streaming ([`ReasoningParser`]) and whole ([`split_all`]).
//! - Names: each kind's canonical name is SMG's (`--tool-call-parser`, `--reasoning-parser`),
//!   SGLang's spellings are accepted as aliases; `for_model` picks a kind from a served
//!   model's name, the longest matching pattern winning.
//!
//! Invariants (tested for every format at every cut point and under random chunking):
//! streaming never changes the result, the joined deltas of any chunking equal the whole-text
//! parse; text that might be the start of markup is held back until decided, never emitted
//! early, and comes out as text if it was not markup after all (at the latest at `finish`);
//! calls name only functions in the request's [`ToolSet`] and carry a compact JSON object in
//! the model's key order. A call is emitted once its markup has closed, its arguments whole:
//! a call that turns out malformed can then still come out as text. A response runs the
//! reasoning parser first and the tool parser on its content.
//!
//! Knows nothing of networking, async runtimes or tokenizers: plain synchronous state
//! machines over `&str`, each parser `Send` and owned by one response. The cost is linear in
//! the output; a held-back call is searched incrementally, not rescanned per piece.
//!
//! ```
//! use pdrouter_parsers::*;
//!
//! let tools = ToolSet::new(["get_weather"]);
//! let out = "<think>User wants weather.</think>Let me check.\n<tool_call>\n\
//!            {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
//! let split = split_all(ReasoningKind::Qwen3, false, out);
//! assert_eq!(split.reasoning, "User wants weather.");
//! let parsed = parse_all(ToolKind::Qwen, &split.content, &tools);
//! assert_eq!(parsed.text, "Let me check.");
//! assert_eq!(parsed.calls[0].name, "get_weather");
//! assert_eq!(parsed.calls[0].arguments, r#"{"city":"Paris"}"#);
//!
//! // Streaming gives the same, cut anywhere.
//! let mut parser = ToolKind::Qwen.new_parser(&tools);
//! let mut deltas = Vec::new();
//! for piece in split.content.as_bytes().chunks(5) {
//!     deltas.extend(parser.push(std::str::from_utf8(piece).unwrap()));
//! }
//! deltas.extend(parser.finish());
//! assert_eq!(ToolParse::from_deltas(deltas), parsed);
//! ```

mod harmony;
mod json;
mod names;
mod scan;

pub mod reasoning;
pub mod tool;

pub use reasoning::{ReasoningDelta, ReasoningKind, ReasoningParser, split_all};
pub use tool::{ToolCall, ToolDelta, ToolKind, ToolParse, ToolParser, ToolSet, call_id, parse_all};
