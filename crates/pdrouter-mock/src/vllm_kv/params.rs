//! What a vLLM-mode generation request asks of the KV connector, read from its body (an
//! OpenAI JSON body, or the body-like map the gRPC front builds from its message): its
//! `kv_transfer_params` ([`KvLeg`]: none, produce for a remote decode, or consume a remote
//! prefill), in the fields of the configured connector (NIXL's, Mooncake's; LMCache's legs
//! carry none), whether a producer request is one the mock accepts, and the prompt marker
//! that makes a prefill end early. Nothing here holds, pulls or answers.
//!
//! The mock is stricter than vLLM where a looser router would hide a bug: a producer request
//! must not stream, must have no `stream_options` and must cap its output at exactly one
//! token. Every refusal is a message naming the field (HTTP: a 400; gRPC: INVALID_ARGUMENT).

use serde_json::{Map, Value, json};

use crate::config::KvConnectorKind;

/// The shape of the body whose fields are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Body {
    /// `/v1/completions`' (`prompt`, `max_tokens`); the gRPC front builds one of these.
    Completion,
    /// `/v1/chat/completions`' (`messages`, `max_completion_tokens` before `max_tokens`).
    Chat,
}

/// A prompt containing this text makes the model's first token EOS: a prefill ends before
/// its token cap (finish `stop`, no tokens, nothing held), as a real prompt sometimes does.
pub(crate) const EOS_MARKER: &str = "[[eos]]";

/// The part a request plays in a disaggregated deployment.
#[derive(Debug, PartialEq)]
pub(crate) enum KvLeg {
    /// No transfer: an ordinary request, computed whole (LMCache: every request).
    Plain,
    /// NIXL `do_remote_decode`: the prefill leg, whose KV a consumer will pull.
    Produce,
    /// NIXL `do_remote_prefill`: the decode leg, pulling its prompt's KV from a producer first.
    Consume(RemotePrefill),
    /// Mooncake `do_remote_decode`: the prefill leg, holding its KV under `transfer_id` for
    /// the engine id of DP rank `rank` (0 as parsed; the front sets it from the request: HTTP's
    /// `X-data-parallel-rank` header, gRPC's `data_parallel_rank`).
    ProduceTransfer { transfer_id: String, rank: u32 },
    /// Mooncake `do_remote_prefill`: the decode leg, pulling through the producer's bootstrap
    /// server (waiting for it, since both legs run at once).
    Fetch(MooncakeSource),
}

impl KvLeg {
    /// Whether this is a prefill leg (checked strictly, answered with one token).
    pub(crate) fn produces(&self) -> bool {
        matches!(self, KvLeg::Produce | KvLeg::ProduceTransfer { .. })
    }
}

/// Where a Mooncake consumer's prompt KV is held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MooncakeSource {
    /// The producer's bootstrap server, `http://host:port` (no trailing `/`).
    pub(crate) bootstrap_addr: String,
    pub(crate) engine_id: String,
    pub(crate) transfer_id: String,
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
    required_with(v, name, "do_remote_prefill")
}

fn required_with<T>(v: Option<T>, name: &str, with: &str) -> Result<T, String> {
    v.ok_or_else(|| format!("{PARAMS}.{name} is required with {with}"))
}

/// The params object: `None` when absent or null.
fn params(req: &Map<String, Value>) -> Result<Option<&Map<String, Value>>, String> {
    match req.get(PARAMS) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(p)) => Ok(Some(p)),
        Some(_) => Err(format!("{PARAMS} must be an object")),
    }
}

fn flags(p: &Map<String, Value>) -> Result<(bool, bool), String> {
    let flag = |name| field(p, name, "a boolean", Value::as_bool).map(|b| b.unwrap_or(false));
    let (decode, prefill) = (flag("do_remote_decode")?, flag("do_remote_prefill")?);
    if decode && prefill {
        return Err(format!(
            "{PARAMS}: do_remote_decode and do_remote_prefill cannot both be true"
        ));
    }
    Ok((decode, prefill))
}

/// Reads the request's leg in the fields of `connector` (absent or null params: plain).
pub(crate) fn leg_for(
    connector: KvConnectorKind,
    req: &Map<String, Value>,
) -> Result<KvLeg, String> {
    match connector {
        KvConnectorKind::Nixl => leg(req),
        KvConnectorKind::Mooncake => mooncake_leg(req),
        // LMCache's router sends plain requests: params are a router bug worth a 400.
        KvConnectorKind::LmCache => match params(req)? {
            None => Ok(KvLeg::Plain),
            Some(_) => Err(format!("{PARAMS} is not used with the LMCache connector")),
        },
    }
}

/// Mooncake's params: `transfer_id` on both legs; the consumer's `remote_bootstrap_addr`
/// (an `http://host:port` URL) and `remote_engine_id`.
fn mooncake_leg(req: &Map<String, Value>) -> Result<KvLeg, String> {
    let Some(p) = params(req)? else {
        return Ok(KvLeg::Plain);
    };
    let (decode, prefill) = flags(p)?;
    let text = "a string";
    let transfer_id = field(p, "transfer_id", text, Value::as_str)?;
    let engine_id = field(p, "remote_engine_id", text, Value::as_str)?;
    let url = "an http://host:port URL";
    let addr = field(p, "remote_bootstrap_addr", url, |v| {
        let s = v.as_str()?.trim_end_matches('/');
        let rest = s.strip_prefix("http://")?;
        let ok = !rest.is_empty() && !rest.contains('/') && s.parse::<axum::http::Uri>().is_ok();
        ok.then_some(s)
    })?;
    if decode {
        let id = required_with(transfer_id, "transfer_id", "do_remote_decode")?;
        return Ok(KvLeg::ProduceTransfer {
            transfer_id: id.to_owned(),
            rank: 0,
        });
    }
    if !prefill {
        return Ok(KvLeg::Plain);
    }
    Ok(KvLeg::Fetch(MooncakeSource {
        bootstrap_addr: required(addr, "remote_bootstrap_addr")?.to_owned(),
        engine_id: required(engine_id, "remote_engine_id")?.to_owned(),
        transfer_id: required(transfer_id, "transfer_id")?.to_owned(),
    }))
}

fn block_ids(v: &Value) -> Option<Vec<u64>> {
    v.as_array()?.iter().map(Value::as_u64).collect()
}

/// Reads `kv_transfer_params` (absent or null: [`KvLeg::Plain`]). Every known field is
/// type-checked when given; a consumer needs all of its remote fields.
fn leg(req: &Map<String, Value>) -> Result<KvLeg, String> {
    let Some(p) = params(req)? else {
        return Ok(KvLeg::Plain);
    };
    let (decode, prefill) = flags(p)?;
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
        (true, _) => Ok(KvLeg::Produce),
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
pub(crate) fn check_producer(body: Body, req: &Map<String, Value>) -> Result<(), String> {
    let leg = "a prefill leg (kv_transfer_params.do_remote_decode)";
    let given = |name: &str| req.get(name).filter(|v| !v.is_null());
    match given("stream") {
        None | Some(Value::Bool(false)) => {}
        Some(v) => return Err(format!("{leg} must not stream (stream: {v})")),
    }
    if given("stream_options").is_some() {
        return Err(format!("{leg} must not have stream_options"));
    }
    let (name, cap) = match (body, given("max_completion_tokens")) {
        (Body::Chat, Some(v)) => ("max_completion_tokens", Some(v)),
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
pub(crate) fn has_eos_marker(body: Body, req: &Map<String, Value>) -> bool {
    match body {
        Body::Completion => req.get("prompt").is_some_and(text_has_marker),
        Body::Chat => match req.get("messages") {
            Some(Value::Array(msgs)) => msgs
                .iter()
                .any(|m| m.get("content").is_some_and(text_has_marker)),
            _ => false,
        },
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
        assert!(ok(Body::Completion, json!({"max_tokens": 1, "stream": false})).is_ok());
        assert!(
            ok(
                Body::Chat,
                json!({"max_completion_tokens": 1, "max_tokens": 9})
            )
            .is_ok()
        );
        assert!(ok(Body::Chat, json!({"max_tokens": 1, "min_tokens": 1})).is_ok());
        let err = |api, v: Value| check_producer(api, &obj(v)).unwrap_err();
        assert!(err(Body::Completion, json!({"max_tokens": 1, "stream": true})).contains("stream"));
        assert!(
            err(
                Body::Completion,
                json!({"max_tokens": 1, "stream_options": {"include_usage": true}})
            )
            .contains("stream_options")
        );
        assert!(err(Body::Completion, json!({"max_tokens": 2})).contains("max_tokens exactly 1"));
        assert!(err(Body::Completion, json!({})).contains("absent"));
        assert!(
            err(
                Body::Chat,
                json!({"max_completion_tokens": 2, "max_tokens": 1})
            )
            .contains("max_completion_tokens")
        );
        assert!(
            err(Body::Completion, json!({"max_tokens": 1, "min_tokens": 2})).contains("min_tokens")
        );
    }

    #[test]
    fn the_marker_is_found_in_prompts_and_message_contents() {
        let has = |api, v: Value| has_eos_marker(api, &obj(v));
        assert!(has(Body::Completion, json!({"prompt": "a [[eos]] b"})));
        assert!(has(Body::Completion, json!({"prompt": ["x", "[[eos]]"]})));
        assert!(!has(Body::Completion, json!({"prompt": "[[eos]"})));
        assert!(has(
            Body::Chat,
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "[[eos]]"}]}]})
        ));
        assert!(!has(
            Body::Chat,
            json!({"messages": [{"role": "user", "content": "hi"}]})
        ));
    }

    #[test]
    fn mooncake_legs_read_transfer_ids_and_check_the_bootstrap_url() {
        let mc = |v: Value| leg_for(KvConnectorKind::Mooncake, &obj(v));
        let produce = json!({"kv_transfer_params": {
            "do_remote_decode": true, "do_remote_prefill": false, "transfer_id": "t1"}});
        let want = KvLeg::ProduceTransfer {
            transfer_id: "t1".into(),
            rank: 0,
        };
        assert_eq!(mc(produce), Ok(want));
        let consume = json!({"kv_transfer_params": {
            "do_remote_decode": false, "do_remote_prefill": true, "transfer_id": "t1",
            "remote_engine_id": "e", "remote_bootstrap_addr": "http://127.0.0.1:9/"}});
        let Ok(KvLeg::Fetch(src)) = mc(consume.clone()) else {
            panic!("a consumer");
        };
        assert_eq!(src.bootstrap_addr, "http://127.0.0.1:9");
        assert_eq!(mc(json!({})), Ok(KvLeg::Plain));
        let err = |path: &str, v: Value| {
            let mut c = consume.clone();
            c["kv_transfer_params"][path] = v;
            mc(c).unwrap_err()
        };
        assert!(err("transfer_id", json!(7)).contains("transfer_id must be a string"));
        assert!(err("remote_engine_id", json!([])).contains("remote_engine_id"));
        for bad in ["127.0.0.1:9", "https://h:1", "http://", "http://h:1/x"] {
            assert!(err("remote_bootstrap_addr", json!(bad)).contains("remote_bootstrap_addr"));
        }
        assert!(err("transfer_id", Value::Null).contains("transfer_id is required"));
        let no_id = json!({"kv_transfer_params": {"do_remote_decode": true}});
        assert!(mc(no_id).unwrap_err().contains("transfer_id is required"));
        let lm = leg_for(KvConnectorKind::LmCache, &obj(consumer()));
        assert!(lm.unwrap_err().contains("LMCache"));
        let lm = leg_for(
            KvConnectorKind::LmCache,
            &obj(json!({"kv_transfer_params": null})),
        );
        assert_eq!(lm, Ok(KvLeg::Plain));
    }
}
