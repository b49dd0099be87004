//! What a vLLM-mode generation request asks of the KV connector, read from its body: its
//! `kv_transfer_params` ([`KvLeg`]: none, produce for a remote decode, or consume a remote
//! prefill), whether a producer request is one the mock accepts, and the prompt marker that
//! makes a prefill end early. Nothing here holds, pulls or answers.
//!
//! The mock is stricter than vLLM where a looser router would hide a bug: a producer request
//! must not stream, must have no `stream_options` and must cap its output at exactly one
//! token. Every refusal is a 400 message naming the field.

use serde_json::{Map, Value, json};

use super::request::Api;

/// A prompt containing this text makes the model's first token EOS: a prefill ends before
/// its token cap (finish `stop`, no tokens, nothing held), as a real prompt sometimes does.
pub(crate) const EOS_MARKER: &str = "[[eos]]";

/// The part a request plays in a disaggregated (NIXL) deployment.
#[derive(Debug, PartialEq)]
pub(crate) enum KvLeg {
    /// No transfer: an ordinary request, computed whole.
    Plain,
    /// `do_remote_decode`: the prefill leg, whose KV a consumer will pull.
    Produce,
    /// `do_remote_prefill`: the decode leg, pulling its prompt's KV from a producer first.
    Consume(RemotePrefill),
}

/// Where a consumer's prompt KV is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RemotePrefill {
    pub(crate) engine_id: String,
    pub(crate) request_id: String,
    pub(crate) block_ids: Vec<u64>,
    pub(crate) host: String,
    pub(crate) port: u16,
}

const PARAMS: &str = "kv_transfer_params";

/// A field of the params: `Ok(None)` when absent or null, `Err` when of another type.
fn field<'a, T>(
    params: &'a Map<String, Value>,
    name: &str,
    what: &str,
    get: impl FnOnce(&'a Value) -> Option<T>,
) -> Result<Option<T>, String> {
    match params.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => get(v)
            .map(Some)
            .ok_or_else(|| format!("{PARAMS}.{name} must be {what}")),
    }
}

fn required<T>(v: Option<T>, name: &str) -> Result<T, String> {
    v.ok_or_else(|| format!("{PARAMS}.{name} is required with do_remote_prefill"))
}

fn block_ids(v: &Value) -> Option<Vec<u64>> {
    v.as_array()?.iter().map(Value::as_u64).collect()
}

/// Reads `kv_transfer_params` (absent or null: [`KvLeg::Plain`]). Every known field is
/// type-checked when given; a consumer needs all of its remote fields.
pub(crate) fn leg(req: &Map<String, Value>) -> Result<KvLeg, String> {
    let p = match req.get(PARAMS) {
        None | Some(Value::Null) => return Ok(KvLeg::Plain),
        Some(Value::Object(p)) => p,
        Some(_) => return Err(format!("{PARAMS} must be an object")),
    };
    let flag = |name| field(p, name, "a boolean", Value::as_bool).map(|b| b.unwrap_or(false));
    let decode = flag("do_remote_decode")?;
    let prefill = flag("do_remote_prefill")?;
    let text = "a string";
    let engine_id = field(p, "remote_engine_id", text, Value::as_str)?;
    let request_id = field(p, "remote_request_id", text, Value::as_str)?;
    let blocks = field(p, "remote_block_ids", "an array of block ids", block_ids)?;
    let host = field(p, "remote_host", text, Value::as_str)?;
    let port = field(p, "remote_port", "a port number", |v| {
        v.as_u64().and_then(|n| u16::try_from(n).ok())
    })?;
    field(p, "tp_size", "a positive integer", |v| {
        v.as_u64().filter(|&n| n > 0)
    })?;
    match (decode, prefill) {
        (true, true) => Err(format!(
            "{PARAMS}: do_remote_decode and do_remote_prefill cannot both be true"
        )),
        (true, false) => Ok(KvLeg::Produce),
        (false, true) => Ok(KvLeg::Consume(RemotePrefill {
            engine_id: required(engine_id, "remote_engine_id")?.to_owned(),
            request_id: required(request_id, "remote_request_id")?.to_owned(),
            block_ids: required(blocks, "remote_block_ids")?,
            host: required(host, "remote_host")?.to_owned(),
            port: required(port, "remote_port")?,
        })),
        (false, false) => Ok(KvLeg::Plain),
    }
}

/// A producer request must answer in one piece with exactly one token: `stream` false or
/// absent, no `stream_options`, the token cap (`max_tokens`; chat: `max_completion_tokens`,
/// else `max_tokens`) exactly 1 and `min_tokens` at most 1.
pub(crate) fn check_producer(api: Api, req: &Map<String, Value>) -> Result<(), String> {
    let leg = "a prefill leg (kv_transfer_params.do_remote_decode)";
    let given = |name: &str| req.get(name).filter(|v| !v.is_null());
    match given("stream") {
        None | Some(Value::Bool(false)) => {}
        Some(v) => return Err(format!("{leg} must not stream (stream: {v})")),
    }
    if given("stream_options").is_some() {
        return Err(format!("{leg} must not have stream_options"));
    }
    let (name, cap) = match (api, given("max_completion_tokens")) {
        (Api::Chat, Some(v)) => ("max_completion_tokens", Some(v)),
        _ => ("max_tokens", given("max_tokens")),
    };
    if cap.and_then(Value::as_u64) != Some(1) {
        let got = cap.map_or_else(|| "absent".to_owned(), Value::to_string);
        return Err(format!("{leg} needs {name} exactly 1 (got {got})"));
    }
    if let Some(min) = given("min_tokens")
        && min.as_u64().is_none_or(|m| m > 1)
    {
        return Err(format!("{leg} needs min_tokens at most 1 (got {min})"));
    }
    Ok(())
}

/// Whether a text, a list of texts or content parts (`{"text": ..}`) contains the marker.
fn text_has_marker(v: &Value) -> bool {
    match v {
        Value::String(s) => s.contains(EOS_MARKER),
        Value::Array(items) => items.iter().any(text_has_marker),
        Value::Object(part) => part.get("text").is_some_and(text_has_marker),
        _ => false,
    }
}

/// Whether the prompt (completions: `prompt`; chat: any message's content) contains
/// [`EOS_MARKER`].
pub(crate) fn has_eos_marker(api: Api, req: &Map<String, Value>) -> bool {
    match api {
        Api::Completion => req.get("prompt").is_some_and(text_has_marker),
        Api::Chat => match req.get("messages") {
            Some(Value::Array(msgs)) => msgs
                .iter()
                .any(|m| m.get("content").is_some_and(text_has_marker)),
            _ => false,
        },
        Api::Generate | Api::Responses => false,
    }
}

/// The top-level `kv_transfer_params` of a producer's answer: what its consumer needs to
/// pull the blocks (vLLM's NIXL connector's fields).
pub(crate) fn producer_params(
    engine_id: &str,
    request_id: &str,
    block_ids: &[u64],
    host: &str,
    port: u16,
) -> Value {
    json!({
        "do_remote_prefill": true,
        "do_remote_decode": false,
        "remote_engine_id": engine_id,
        "remote_request_id": request_id,
        "remote_block_ids": block_ids,
        "remote_host": host,
        "remote_port": port,
        "tp_size": 1,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    fn consumer() -> Value {
        json!({"kv_transfer_params": {
            "do_remote_prefill": true, "do_remote_decode": false,
            "remote_engine_id": "e", "remote_request_id": "r",
            "remote_block_ids": [1, 2], "remote_host": "127.0.0.1", "remote_port": 8000,
            "tp_size": 1
        }})
    }

    #[test]
    fn legs_are_told_apart_by_the_flags() {
        assert_eq!(leg(&obj(json!({}))), Ok(KvLeg::Plain));
        assert_eq!(
            leg(&obj(json!({"kv_transfer_params": null}))),
            Ok(KvLeg::Plain)
        );
        let produce = json!({"kv_transfer_params": {
            "do_remote_decode": true, "do_remote_prefill": false,
            "remote_engine_id": null, "remote_block_ids": null, "remote_port": null
        }});
        assert_eq!(leg(&obj(produce)), Ok(KvLeg::Produce));
        let KvLeg::Consume(remote) = leg(&obj(consumer())).unwrap() else {
            panic!("a consumer");
        };
        assert_eq!(
            (remote.block_ids, remote.port, remote.host.as_str()),
            (vec![1, 2], 8000, "127.0.0.1")
        );
    }

    #[test]
    fn malformed_params_name_the_field() {
        let bad = |v: Value| leg(&obj(v)).unwrap_err();
        assert!(bad(json!({"kv_transfer_params": [1]})).contains("kv_transfer_params"));
        let mut c = consumer();
        c["kv_transfer_params"]["remote_port"] = json!("8000");
        assert!(bad(c).contains("remote_port"));
        let mut c = consumer();
        c["kv_transfer_params"]["remote_block_ids"] = json!([1, "x"]);
        assert!(bad(c).contains("remote_block_ids"));
        let mut c = consumer();
        c["kv_transfer_params"]["do_remote_prefill"] = json!("yes");
        assert!(bad(c).contains("do_remote_prefill"));
        let mut c = consumer();
        c["kv_transfer_params"]
            .as_object_mut()
            .unwrap()
            .remove("remote_host");
        assert!(bad(c).contains("remote_host is required"));
        let mut c = consumer();
        c["kv_transfer_params"]["do_remote_decode"] = json!(true);
        assert!(bad(c).contains("both"));
    }

    #[test]
    fn producers_must_answer_one_token_in_one_piece() {
        let ok = |api, v: Value| check_producer(api, &obj(v));
        assert!(ok(Api::Completion, json!({"max_tokens": 1, "stream": false})).is_ok());
        assert!(
            ok(
                Api::Chat,
                json!({"max_completion_tokens": 1, "max_tokens": 9})
            )
            .is_ok()
        );
        assert!(ok(Api::Chat, json!({"max_tokens": 1, "min_tokens": 1})).is_ok());
        let err = |api, v: Value| check_producer(api, &obj(v)).unwrap_err();
        assert!(err(Api::Completion, json!({"max_tokens": 1, "stream": true})).contains("stream"));
        assert!(
            err(
                Api::Completion,
                json!({"max_tokens": 1, "stream_options": {"include_usage": true}})
            )
            .contains("stream_options")
        );
        assert!(err(Api::Completion, json!({"max_tokens": 2})).contains("max_tokens exactly 1"));
        assert!(err(Api::Completion, json!({})).contains("absent"));
        assert!(
            err(
                Api::Chat,
                json!({"max_completion_tokens": 2, "max_tokens": 1})
            )
            .contains("max_completion_tokens")
        );
        assert!(
            err(Api::Completion, json!({"max_tokens": 1, "min_tokens": 2})).contains("min_tokens")
        );
    }

    #[test]
    fn the_marker_is_found_in_prompts_and_message_contents() {
        let has = |api, v: Value| has_eos_marker(api, &obj(v));
        assert!(has(Api::Completion, json!({"prompt": "a [[eos]] b"})));
        assert!(has(Api::Completion, json!({"prompt": ["x", "[[eos]]"]})));
        assert!(!has(Api::Completion, json!({"prompt": "[[eos]"})));
        assert!(has(
            Api::Chat,
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "[[eos]]"}]}]})
        ));
        assert!(!has(
            Api::Chat,
            json!({"messages": [{"role": "user", "content": "hi"}]})
        ));
    }
}
