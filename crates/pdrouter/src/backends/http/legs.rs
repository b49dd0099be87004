//! The bodies of vLLM's legs, shared by every connector: the client's body capped for a
//! Prefill leg, and a body with the connector's `kv_transfer_params` put in.
//!
//! Invariant: a Prefill body never carries the client's own `kv_transfer_params`; a body's
//! params are exactly the ones given here (none for null).

use bytes::Bytes;
use serde_json::{Map, Value};

/// The NIXL Prefill leg's body: capped, and asking for a remote decode (see [`super::vllm`]).
pub(crate) fn prefill_body(body: Map<String, Value>) -> Bytes {
    with_params(capped(body), crate::kv_handoff::nixl_prefill_params())
}

/// The client's body as every vLLM Prefill leg is sent it: not streamed, capped at one token
/// (in the spelling the client used), no `min_tokens`, no params of the client's.
pub(crate) fn capped(mut body: Map<String, Value>) -> Map<String, Value> {
    body.remove("kv_transfer_params");
    body.insert("stream".into(), Value::Bool(false));
    body.remove("stream_options");
    body.remove("min_tokens");
    let cap = if body.contains_key("max_completion_tokens") {
        body.remove("max_tokens");
        "max_completion_tokens"
    } else {
        "max_tokens"
    };
    body.insert(cap.into(), Value::from(1));
    body
}

/// `body` with `params` as its `kv_transfer_params`, verbatim (none when null): the Decode
/// leg's body is the client's with the Prefill's params, when it gave any.
pub(crate) fn with_params(mut body: Map<String, Value>, params: Value) -> Bytes {
    if params.is_null() {
        body.remove("kv_transfer_params");
    } else {
        body.insert("kv_transfer_params".into(), params);
    }
    Bytes::from(serde_json::to_vec(&body).unwrap_or_default())
}
