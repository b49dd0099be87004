//! The backends: what the request core needs of each engine and transport, one module per
//! kind of worker (see [`crate::core::Backend`]).
//!
//! - [`http`]: SGLang-style engines over HTTP — both PD legs sent at once with one bootstrap
//!   ticket, the Decode body relayed frame by frame.
//! - [`grpc`]: SGLang's and TokenSpeed's schedulers and vLLM's engine over gRPC — token ids
//!   the router made, one ticket per prompt (vLLM: the connector's parameters), EPD's
//!   `Encode` calls, the answer built from Decode's tokens.
//!
//! Backends never import each other; what they share lives in the core or below it.

pub mod grpc;
pub mod http;
