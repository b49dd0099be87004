//! gRPC workers (SGLang's or TokenSpeed's scheduler protocol, vLLM's engine protocol): the per-worker channel and
//! runtime, the router-side tokenizer, and the translation between OpenAI/SGLang JSON and
//! token-id generation.
//!
//! - [`runtime`]: the router's one working form of a `Generate` call ([`runtime::Call`])
//!   and its conversion to and from each engine protocol's messages (the protocols and the
//!   KV ticket themselves are `crate::engine`'s, re-exported there).
//! - [`client`]: one lazily connected tonic channel per worker, runtime detection by
//!   `HealthCheck`, `GetModelInfo`, `GetTokenizer`, and `Generate` calls.
//! - [`stream`]: [`stream::LegStream`], a `Generate` stream of any runtime read in SGLang's
//!   form, that sends `Abort` when it is dropped before its end, and [`stream::Legs`].
//! - [`vllm`]: vLLM's messages to and from the working form, and its KV configuration.
//! - [`info`]: `GetModelInfo` and `GetServerInfo` shown as SGLang's HTTP server shows
//!   `/get_model_info` and `/get_server_info`.
//! - [`tokenizer`]: where the router's tokenizer comes from, resolved once at startup.
//! - [`translate`]: request bodies to `GenerateRequest`s, the output back to response bodies
//!   and SSE events (per endpoint).
//! - [`plan`]: a request translated once ([`plan::Plan`]), what every attempt sends.
//! - [`output`]: the engine's messages turned into choices (text, finish, usage, logprobs).
//! - [`tool_choice`]: a forced call (`tool_choice`) as an output constraint.
//! - [`chat_parse`]: a chat choice's text split into reasoning, content and tool calls, whole
//!   or streamed (the parsers chosen per request).
//!
//! Below this module, and used by it: `crate::engine`, `crate::cpu_pool` (the low-priority
//! threads prompts are tokenized on) and `crate::images` (a request's images, which plans and
//! calls carry).
//!
//! What a request does with these (selection, admission, the legs, the answer) is the request
//! core's and the gRPC backend's (`backends::grpc`); this module knows neither.

pub mod bulk;
pub mod chat_parse;
pub mod client;
mod coalesce;
pub mod encoded;
pub mod info;
mod lane;
pub mod output;
pub mod plan;
mod replies;
pub mod runtime;
pub mod stream;
pub mod tokenizer;
pub mod tool_choice;
pub mod translate;
pub mod vllm;
