//! Inference request validation and the routing facts extracted from it.
//!
//! A request is parsed once here; everything downstream (policies, bootstrap injection, load
//! units) reads [`ParsedRequest`]. Shape errors name the field so the client knows what to fix.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::json_map::{Field, Fields, SCAN_UP_TO};

/// The inference endpoints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// SGLang native `/generate`.
    Generate,
    /// OpenAI `/v1/chat/completions`.
    ChatCompletions,
    /// OpenAI `/v1/completions`.
    Completions,
    /// OpenAI `/v1/responses`.
    Responses,
}

impl Endpoint {
    /// Every inference endpoint.
    pub const ALL: [Endpoint; 4] = [
        Self::Generate,
        Self::ChatCompletions,
        Self::Completions,
        Self::Responses,
    ];

    /// The path, identical on the router and on the engines.
    pub fn path(self) -> &'static str {
        match self {
            Self::Generate => "/generate",
            Self::ChatCompletions => "/v1/chat/completions",
            Self::Completions => "/v1/completions",
            Self::Responses => "/v1/responses",
        }
    }
}

/// Largest `n` accepted (parallel samples per prompt).
pub const MAX_N: u64 = 1024;
/// Most prompts one request may list (every route and transport).
pub const MAX_PROMPTS: usize = 256;
/// Most backend sub-requests (prompts × `n`) one request may fan out to, on every route and
/// transport: what a request builds per leg (bootstrap arrays, token-id plans) is bounded by
/// this times a small constant, whatever the client sends.
pub const MAX_CHOICES: usize = 1024;
/// Characters of request text kept for cache-aware routing.
const ROUTING_TEXT_CHARS: usize = 4096;

/// Fields the router itself may add to a forwarded body (besides `model`, which it adds only
/// when the client named none).
const ROUTER_FIELDS: [&str; 5] = [
    "bootstrap_host",
    "bootstrap_port",
    "bootstrap_room",
    "routed_dp_rank",
    "disagg_prefill_dp_rank",
];

/// A validated inference request.
///
/// The parsed JSON tree is dropped after validation on the common path: forwarded bodies are
/// the received bytes with the router's fields spliced in at the top of the object, so a
/// request waiting in the admission queue holds its bytes, not a tree. The tree is kept when
/// the body already has a field the router sets, so that field is replaced, not doubled, and
/// when the request is for token-id workers, whose translation reads the tree
/// ([`parse_keeping_tree`]) rather than parsing the bytes a second time.
#[derive(Debug)]
pub struct ParsedRequest {
    /// Which endpoint.
    pub endpoint: Endpoint,
    /// The body as received.
    pub raw: Bytes,
    object: Option<Arc<Map<String, Value>>>,
    /// The model the client named (a non-empty string), if any.
    pub model: Option<Arc<str>>,
    /// `stream: true`.
    pub stream: bool,
    /// Text used for cache-aware routing (a prefix of the prompt).
    pub text: Arc<str>,
    /// Number of prompts when the input is a list (batch), else `None`.
    pub batch: Option<usize>,
    /// Parallel samples per prompt.
    pub n: usize,
    /// `/generate` asks for logprobs (`return_logprob` true, for the request or any prompt).
    pub logprobs: bool,
    /// Prompt tokens the request makes its Prefill worker process (see [`estimate_tokens`]),
    /// charged against an admission token budget.
    pub prompt_tokens: u64,
}

impl ParsedRequest {
    /// The body's JSON object, when it was kept (see the type's docs).
    pub fn tree(&self) -> Option<&Map<String, Value>> {
        self.object.as_deref()
    }

    /// [`ParsedRequest::tree`], shared: for work that outlives the borrow (an image chat's
    /// messages, on the CPU pool) without copying the body.
    pub fn shared_tree(&self) -> Option<Arc<Map<String, Value>>> {
        self.object.clone()
    }

    /// The body to forward: as received, plus `fields`, each replacing a field of the same
    /// name. `model` may be one of them only when the client named none.
    pub fn body_with(&self, fields: &[(&'static str, Value)]) -> Bytes {
        if fields.is_empty() {
            return self.raw.clone();
        }
        let all = fields.iter().cloned();
        match &self.object {
            Some(object) => {
                let mut object = Map::clone(object);
                for (k, v) in all {
                    object.insert(k.to_string(), v);
                }
                Bytes::from(serde_json::to_vec(&object).unwrap_or_default())
            }
            None => splice(&self.raw, all),
        }
    }

    /// Backend sub-requests: one per prompt per sample.
    pub fn sub_requests(&self) -> usize {
        self.batch.unwrap_or(1).max(1) * self.n
    }

    /// Whether bootstrap fields must be arrays.
    pub fn is_batched(&self) -> bool {
        self.batch.is_some() || self.n > 1
    }
}

fn is_int_array(v: &[Value]) -> bool {
    v.iter()
        .all(|x| x.as_u64().is_some() || x.as_i64().is_some())
}

fn field_type(
    field: &str,
    v: Option<&Value>,
    ok: fn(&Value) -> bool,
    want: &str,
) -> Result<(), ApiError> {
    match v {
        None | Some(Value::Null) => Ok(()),
        Some(v) if ok(v) => Ok(()),
        Some(_) => Err(ApiError::invalid_field(field, format!("must be {want}"))),
    }
}

fn truncate(s: &str) -> Arc<str> {
    match s.char_indices().nth(ROUTING_TEXT_CHARS) {
        Some((cut, _)) => Arc::from(&s[..cut]),
        None => Arc::from(s),
    }
}

/// A prompt that is a string, a list of strings, token ids or a list of token-id lists.
/// Returns (batch size if a list of prompts, routing text).
fn prompt_shape(
    field: &str,
    v: &Value,
    allow_ids: bool,
) -> Result<(Option<usize>, Arc<str>), ApiError> {
    match v {
        Value::String(s) => Ok((None, truncate(s))),
        Value::Array(items) if items.is_empty() => {
            Err(ApiError::invalid_field(field, "must not be an empty list"))
        }
        Value::Array(items) if allow_ids && is_int_array(items) => Ok((None, Arc::from(""))),
        Value::Array(items) => {
            let mut first_text: Option<Arc<str>> = None;
            for (i, item) in items.iter().enumerate() {
                match item {
                    Value::String(s) => {
                        if first_text.is_none() {
                            first_text = Some(truncate(s));
                        }
                    }
                    Value::Array(ids) if allow_ids && is_int_array(ids) => {}
                    _ => {
                        return Err(ApiError::invalid_field(
                            &format!("{field}[{i}]"),
                            if allow_ids {
                                "must be a string or a list of token ids"
                            } else {
                                "must be a string"
                            },
                        ));
                    }
                }
            }
            Ok((
                Some(items.len()),
                first_text.unwrap_or_else(|| Arc::from("")),
            ))
        }
        _ => Err(ApiError::invalid_field(
            field,
            if allow_ids {
                "must be a string, a list of strings, or token ids"
            } else {
                "must be a string or a list of strings"
            },
        )),
    }
}

/// Bytes per token assumed when estimating from text: about right for English with common
/// BPE tokenizers, and on the high side (more tokens) for code and most other languages' text
/// counted in UTF-8 bytes.
pub const BYTES_PER_TOKEN: u64 = 4;

/// The prompt tokens of a request without a tokenizer: every integer in the prompt counts as one
/// token (token ids are exact), and all its text counts as its UTF-8 bytes divided by
/// [`BYTES_PER_TOKEN`], rounded up; the total is multiplied by `n` (each sample is prefilled)
/// and is at least 1. The prompt is `messages` (chat: every string in it, roles and tool calls
/// included), `prompt` (completions), `input` (responses) or `text`/`input_ids` (generate).
pub fn estimate_tokens(prompt: &Value, n: usize) -> u64 {
    fn walk(v: &Value, bytes: &mut u64, ids: &mut u64) {
        match v {
            Value::String(s) => *bytes = bytes.saturating_add(s.len() as u64),
            Value::Number(_) => *ids = ids.saturating_add(1),
            Value::Array(items) => items.iter().for_each(|i| walk(i, bytes, ids)),
            Value::Object(fields) => fields.values().for_each(|f| walk(f, bytes, ids)),
            Value::Bool(_) | Value::Null => {}
        }
    }
    let (mut bytes, mut ids) = (0, 0);
    walk(prompt, &mut bytes, &mut ids);
    ids.saturating_add(bytes.div_ceil(BYTES_PER_TOKEN))
        .saturating_mul(n as u64)
        .max(1)
}

fn chat_text(messages: &[Value]) -> Result<Arc<str>, ApiError> {
    let mut text = String::new();
    for (i, m) in messages.iter().enumerate() {
        let Some(obj) = m.as_object() else {
            return Err(ApiError::invalid_field(
                &format!("messages[{i}]"),
                "must be an object",
            ));
        };
        match obj.field("role") {
            Some(Value::String(_)) => {}
            _ => {
                return Err(ApiError::invalid_field(
                    &format!("messages[{i}].role"),
                    "must be a string",
                ));
            }
        }
        match obj.field("content") {
            Some(c @ (Value::String(_) | Value::Array(_))) => push_content_text(&mut text, c),
            None | Some(Value::Null) => {}
            Some(_) => {
                return Err(ApiError::invalid_field(
                    &format!("messages[{i}].content"),
                    "must be a string, a list of content parts, or null",
                ));
            }
        }
        if text.len() > ROUTING_TEXT_CHARS * 4 {
            break;
        }
    }
    Ok(truncate(&text))
}

fn positive_n(field: &str, v: Option<&Value>) -> Result<usize, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(1),
        Some(v) => match v.as_u64() {
            Some(n) if (1..=MAX_N).contains(&n) => Ok(n as usize),
            _ => Err(ApiError::invalid_field(
                field,
                format!("must be an integer from 1 to {MAX_N}"),
            )),
        },
    }
}

/// `raw` (a JSON object, already validated) with `fields` inserted first. The caller guarantees
/// none of the fields is already present.
fn splice(raw: &[u8], fields: impl Iterator<Item = (&'static str, Value)>) -> Bytes {
    let open = raw
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(0);
    let rest = &raw[open + 1..];
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let mut out = Vec::with_capacity(raw.len() + 128);
    out.push(b'{');
    for (i, (k, v)) in fields.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        // Writing to a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, k);
        out.push(b':');
        let _ = serde_json::to_writer(&mut out, &v);
    }
    if !empty {
        out.push(b',');
    }
    out.extend_from_slice(rest);
    Bytes::from(out)
}

/// Parses and validates a request body for `endpoint`.
pub fn parse(endpoint: Endpoint, raw: Bytes) -> Result<ParsedRequest, ApiError> {
    parse_body(endpoint, raw, false)
}

/// [`parse`], keeping the JSON tree for [`ParsedRequest::tree`] (requests translated for
/// token-id workers, which read the whole body anyway).
pub fn parse_keeping_tree(endpoint: Endpoint, raw: Bytes) -> Result<ParsedRequest, ApiError> {
    parse_body(endpoint, raw, true)
}

fn parse_body(endpoint: Endpoint, raw: Bytes, keep_tree: bool) -> Result<ParsedRequest, ApiError> {
    let (mut req, object) = if keep_tree {
        let body = object_of(&raw)?;
        (validate(endpoint, &body)?.0, Some(body))
    } else {
        // The common path reads the top level as its list of fields; the map is built when it
        // is kept, when the object is wide (a hashed lookup beats a scan), or to answer a body
        // that is not an object (or not JSON) exactly as before.
        match serde_json::from_slice::<Fields<'_>>(&raw) {
            Ok(fields) if fields.len() <= SCAN_UP_TO => {
                let (req, replaces) = validate(endpoint, &fields)?;
                (req, replaces.then(|| fields.into_map()))
            }
            parsed => {
                let body = match parsed {
                    Ok(fields) => fields.into_map(),
                    Err(_) => object_of(&raw)?,
                };
                let (req, replaces) = validate(endpoint, &body)?;
                (req, replaces.then_some(body))
            }
        }
    };
    // Moved in once nothing borrows it (a clone would allocate a shared header for a body
    // that came as a `Vec`).
    req.raw = raw;
    req.object = object.map(Arc::new);
    Ok(req)
}

/// The body as a JSON object, or the error naming what is wrong with it.
fn object_of(raw: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice(raw).map_err(ApiError::malformed_json)? {
        Value::Object(body) => Ok(body),
        _ => Err(ApiError::bad_request(
            "invalid_request",
            "request body must be a JSON object",
        )),
    }
}

/// Validates a body's fields for `endpoint`: the request without its body and tree (the
/// caller, [`parse_body`], puts them in), and whether the body has a field the router sets
/// (then forwarded bodies are rebuilt from the tree, which the caller keeps).
fn validate(endpoint: Endpoint, body: &impl Field) -> Result<(ParsedRequest, bool), ApiError> {
    check_common_fields(body)?;
    let stream = body
        .field("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let Prompt { batch, text, n } = match endpoint {
        Endpoint::Generate => generate_prompt(body)?,
        Endpoint::ChatCompletions => chat_prompt(body)?,
        Endpoint::Completions => completions_prompt(body)?,
        Endpoint::Responses => responses_prompt(body)?,
    };
    check_fan_out(endpoint, body, batch, n)?;
    let logprobs = endpoint == Endpoint::Generate && wants_logprobs(body);
    let model = body
        .field("model")
        .and_then(Value::as_str)
        .filter(|m| !m.is_empty())
        .map(Arc::from);
    // A named model is forwarded as is, so only an empty or null `model` may be replaced.
    let replaces_field = ROUTER_FIELDS.iter().any(|k| body.field(k).is_some())
        || (model.is_none() && body.field("model").is_some());
    let prompt_tokens = prompt_field(endpoint, body).map_or(1, |p| estimate_tokens(p, n));
    let req = ParsedRequest {
        endpoint,
        raw: Bytes::new(),
        object: None,
        model,
        stream,
        text,
        batch,
        n,
        logprobs,
        prompt_tokens,
    };
    Ok((req, replaces_field))
}

/// Refuses more prompts, or prompts × samples, than one request may fan out to (see
/// [`MAX_CHOICES`]), naming the field to change.
fn check_fan_out(
    endpoint: Endpoint,
    body: &impl Field,
    batch: Option<usize>,
    n: usize,
) -> Result<(), ApiError> {
    let prompts = batch.unwrap_or(1);
    let (list, n_field) = match endpoint {
        Endpoint::Generate if body.field("text").is_some_and(|t| !t.is_null()) => {
            ("text", "sampling_params.n")
        }
        Endpoint::Generate => ("input_ids", "sampling_params.n"),
        _ => ("prompt", "n"),
    };
    if prompts > MAX_PROMPTS {
        return Err(ApiError::invalid_field(
            list,
            format!("lists {prompts} prompts; at most {MAX_PROMPTS} prompts per request"),
        ));
    }
    if prompts.saturating_mul(n) > MAX_CHOICES {
        return Err(ApiError::invalid_field(
            n_field,
            format!(
                "asks for {prompts} prompts × {n} samples; prompts × n must be at most \
                 {MAX_CHOICES}"
            ),
        ));
    }
    Ok(())
}

/// What an endpoint's prompt field tells the router: the batch size (a list of prompts), the
/// routing text and the samples per prompt.
struct Prompt {
    batch: Option<usize>,
    text: Arc<str>,
    n: usize,
}

/// The fields every endpoint shares, type-checked before the endpoint's own.
fn check_common_fields(body: &impl Field) -> Result<(), ApiError> {
    field_type(
        "stream",
        body.field("stream"),
        Value::is_boolean,
        "true or false",
    )?;
    field_type("model", body.field("model"), Value::is_string, "a string")?;
    for f in ["max_tokens", "max_completion_tokens"] {
        field_type(
            f,
            body.field(f),
            |v| v.as_u64().is_some(),
            "a non-negative integer",
        )?;
    }
    Ok(())
}

/// `/generate`: `sampling_params` (and its `n`), then `text`, else `input_ids`.
fn generate_prompt(body: &impl Field) -> Result<Prompt, ApiError> {
    field_type(
        "sampling_params",
        body.field("sampling_params"),
        Value::is_object,
        "an object",
    )?;
    let n = positive_n(
        "sampling_params.n",
        body.field("sampling_params").and_then(|s| s.field("n")),
    )?;
    let (batch, text) = match (body.field("text"), body.field("input_ids")) {
        (Some(t), _) if !t.is_null() => prompt_shape("text", t, false)?,
        (_, Some(ids)) if !ids.is_null() => (input_ids_batch(ids)?, Arc::from("")),
        _ => {
            return Err(ApiError::invalid_field(
                "text",
                "is required (or give 'input_ids')",
            ));
        }
    };
    Ok(Prompt { batch, text, n })
}

/// `/generate`'s `input_ids`: one prompt's token ids, or a batch (its size returned) of them.
fn input_ids_batch(ids: &Value) -> Result<Option<usize>, ApiError> {
    match ids {
        Value::Array(items) if !items.is_empty() && is_int_array(items) => Ok(None),
        Value::Array(items)
            if !items.is_empty()
                && items
                    .iter()
                    .all(|x| x.as_array().is_some_and(|a| is_int_array(a))) =>
        {
            Ok(Some(items.len()))
        }
        _ => Err(ApiError::invalid_field(
            "input_ids",
            "must be a list of token ids or a list of such lists",
        )),
    }
}

/// `/v1/chat/completions`: `n`, then a non-empty `messages` list.
fn chat_prompt(body: &impl Field) -> Result<Prompt, ApiError> {
    let n = positive_n("n", body.field("n"))?;
    let text = match body.field("messages") {
        Some(Value::Array(m)) if !m.is_empty() => chat_text(m)?,
        Some(Value::Array(_)) => {
            return Err(ApiError::invalid_field("messages", "must not be empty"));
        }
        None => return Err(ApiError::invalid_field("messages", "is required")),
        Some(_) => {
            return Err(ApiError::invalid_field("messages", "must be an array"));
        }
    };
    Ok(Prompt {
        batch: None,
        text,
        n,
    })
}

/// `/v1/completions`: `n`, then `prompt`.
fn completions_prompt(body: &impl Field) -> Result<Prompt, ApiError> {
    let n = positive_n("n", body.field("n"))?;
    let Some(prompt) = body.field("prompt").filter(|p| !p.is_null()) else {
        return Err(ApiError::invalid_field("prompt", "is required"));
    };
    let (batch, text) = prompt_shape("prompt", prompt, true)?;
    Ok(Prompt { batch, text, n })
}

/// `/v1/responses`: `input`, a string or a list of input items (one sample, no batch).
fn responses_prompt(body: &impl Field) -> Result<Prompt, ApiError> {
    let text = match body.field("input") {
        Some(Value::String(s)) => truncate(s),
        Some(Value::Array(items)) => input_items_text(items),
        None | Some(Value::Null) => {
            return Err(ApiError::invalid_field("input", "is required"));
        }
        Some(_) => {
            return Err(ApiError::invalid_field(
                "input",
                "must be a string or a list of input items",
            ));
        }
    };
    Ok(Prompt {
        batch: None,
        text,
        n: 1,
    })
}

/// The routing text of `/v1/responses` input items: their string contents and text parts.
fn input_items_text(items: &[Value]) -> Arc<str> {
    let mut t = String::new();
    for content in items.iter().filter_map(|it| it.field("content")) {
        push_content_text(&mut t, content);
    }
    truncate(&t)
}

/// A message's or input item's `content`: a string, or the `text` of its parts (anything else
/// adds nothing).
fn push_content_text(out: &mut String, content: &Value) {
    match content {
        Value::String(s) => out.push_str(s),
        Value::Array(parts) => {
            for s in parts
                .iter()
                .filter_map(|p| p.field("text").and_then(Value::as_str))
            {
                out.push_str(s);
            }
        }
        _ => {}
    }
}

/// `/generate`'s `return_logprob`: true for the request, or for any of its prompts.
fn wants_logprobs(body: &impl Field) -> bool {
    match body.field("return_logprob") {
        Some(Value::Bool(b)) => *b,
        Some(Value::Array(each)) => each.iter().any(|v| v.as_bool() == Some(true)),
        _ => false,
    }
}

/// The field whose tokens the Prefill worker processes (see [`estimate_tokens`]).
fn prompt_field(endpoint: Endpoint, body: &impl Field) -> Option<&Value> {
    match endpoint {
        Endpoint::ChatCompletions => body.field("messages"),
        Endpoint::Completions => body.field("prompt"),
        Endpoint::Responses => body.field("input"),
        Endpoint::Generate => body
            .field("text")
            .filter(|t| !t.is_null())
            .or_else(|| body.field("input_ids")),
    }
}

#[cfg(test)]
mod tests;
