//! OpenAI/SGLang JSON to a token-id `GenerateRequest`, and token ids back to response bodies.
//!
//! Served: `/v1/chat/completions` (chat template with the generation prompt) and `/generate`
//! (`text` or `input_ids`), one prompt and one sample each. Everything else a gRPC worker
//! would need translated is refused with 501 `not_implemented` naming what to use instead,
//! never forwarded half-translated. Sampling fields the client leaves unset are sent with the
//! engines' defaults (proto zeros would be rejected or change the sampling).

use std::sync::Arc;

use pdrouter_proto::scheduler::{GenerateRequest, SamplingParams, TokenizedInput, sampling_params};
use pdrouter_tokenizer::{
    ChatInput, DecodeOptions, FinishReason, OFFLOAD_THRESHOLD_BYTES, StopConditions, TemplateValue,
    Tokenizer,
};
use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::request::{Endpoint, ParsedRequest};

/// A request translated once, sent (with a fresh ticket) by every attempt.
#[derive(Debug)]
pub struct Plan {
    /// The request without `request_id` and `disaggregated_params`.
    pub request: GenerateRequest,
    /// Chat or generate.
    pub endpoint: Endpoint,
    /// SSE answer.
    pub stream: bool,
    /// The model the client named (empty: the Decode worker's, per attempt).
    pub model: String,
    /// Stop conditions matched in the router.
    pub stop: StopConditions,
    /// Detokenizer options.
    pub decode: DecodeOptions,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// Prompt length in tokens.
    pub prompt_tokens: u32,
}

fn unsupported(what: &str) -> ApiError {
    ApiError::not_implemented(format!(
        "{what} is not served for gRPC workers yet; use /v1/chat/completions or /generate \
         with one prompt and n = 1, or HTTP workers"
    ))
}

fn num(o: &Map<String, Value>, k: &str) -> Result<Option<f64>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .filter(|f| f.is_finite())
            .map(Some)
            .ok_or_else(|| ApiError::invalid_field(k, "must be a number")),
    }
}

fn uint(o: &Map<String, Value>, k: &str) -> Result<Option<u32>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|n| u32::try_from(n).ok())
            .map(Some)
            .ok_or_else(|| ApiError::invalid_field(k, "must be a non-negative integer below 2^32")),
    }
}

fn flag(o: &Map<String, Value>, k: &str) -> Result<Option<bool>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(_) => Err(ApiError::invalid_field(k, "must be true or false")),
    }
}

fn ids(v: &Value, k: &str) -> Result<Vec<u32>, ApiError> {
    v.as_array()
        .and_then(|a| {
            a.iter()
                .map(|x| x.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect::<Option<Vec<u32>>>()
        })
        .ok_or_else(|| ApiError::invalid_field(k, "must be an array of token ids"))
}

fn strings(o: &Map<String, Value>, k: &str) -> Result<Vec<String>, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s.clone()]),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| x.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| ApiError::invalid_field(k, "must be a string or an array of strings")),
        Some(_) => Err(ApiError::invalid_field(
            k,
            "must be a string or an array of strings",
        )),
    }
}

/// Sampling fields from `o` (top level for chat, `sampling_params` for `/generate`).
fn sampling(o: &Map<String, Value>, max_keys: &[&str]) -> Result<SamplingParams, ApiError> {
    let f = |k: &str, default: f32| num(o, k).map(|v| v.map_or(default, |x| x as f32));
    let mut max_new_tokens = None;
    for k in max_keys {
        if let Some(m) = uint(o, k)? {
            max_new_tokens = Some(m);
            break;
        }
    }
    let top_k = match o.get("top_k") {
        None | Some(Value::Null) => -1,
        Some(v) => v
            .as_i64()
            .and_then(|n| i32::try_from(n).ok())
            .ok_or_else(|| ApiError::invalid_field("top_k", "must be an integer"))?,
    };
    let constraint = match (o.get("regex"), o.get("json_schema"), o.get("ebnf")) {
        (Some(Value::String(r)), _, _) => Some(sampling_params::Constraint::Regex(r.clone())),
        (_, Some(Value::String(j)), _) => Some(sampling_params::Constraint::JsonSchema(j.clone())),
        (_, _, Some(Value::String(e))) => Some(sampling_params::Constraint::EbnfGrammar(e.clone())),
        _ => None,
    };
    Ok(SamplingParams {
        temperature: f("temperature", 1.0)?,
        top_p: f("top_p", 1.0)?,
        top_k,
        min_p: f("min_p", 0.0)?,
        frequency_penalty: f("frequency_penalty", 0.0)?,
        presence_penalty: f("presence_penalty", 0.0)?,
        repetition_penalty: f("repetition_penalty", 1.0)?,
        max_new_tokens,
        stop: strings(o, "stop")?,
        stop_token_ids: match o.get("stop_token_ids") {
            None | Some(Value::Null) => Vec::new(),
            Some(v) => ids(v, "stop_token_ids")?,
        },
        skip_special_tokens: flag(o, "skip_special_tokens")?.unwrap_or(true),
        spaces_between_special_tokens: flag(o, "spaces_between_special_tokens")?.unwrap_or(true),
        constraint,
        n: 1,
        min_new_tokens: uint(o, "min_new_tokens")?
            .or(uint(o, "min_tokens")?)
            .unwrap_or(0),
        ignore_eos: flag(o, "ignore_eos")?.unwrap_or(false),
        no_stop_trim: flag(o, "no_stop_trim")?.unwrap_or(false),
        ..Default::default()
    })
}

/// Runs `f` inline for small inputs, on the blocking pool for large ones.
async fn offload<T: Send + 'static>(
    size: usize,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, ApiError> {
    if size <= OFFLOAD_THRESHOLD_BYTES {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ApiError::internal(format!("tokenizer task failed: {e}")))
}

/// Translates a request for gRPC PD workers.
pub async fn plan(req: &ParsedRequest, tokenizer: &Arc<Tokenizer>) -> Result<Plan, ApiError> {
    match req.endpoint {
        Endpoint::Completions => return Err(unsupported("/v1/completions")),
        Endpoint::Responses => return Err(unsupported("/v1/responses")),
        Endpoint::ChatCompletions | Endpoint::Generate => {}
    }
    if req.batch.is_some() {
        return Err(unsupported("a batch of prompts"));
    }
    if req.n > 1 {
        return Err(unsupported("n > 1"));
    }
    let body: Value = serde_json::from_slice(&req.raw).map_err(ApiError::malformed_json)?;
    let Value::Object(o) = body else {
        return Err(ApiError::malformed_json("expected an object"));
    };
    let model = req.model.as_deref().unwrap_or_default().to_owned();
    let size = req.raw.len();
    let (original_text, input_ids, params, include_usage) = match req.endpoint {
        Endpoint::ChatCompletions => {
            if flag(&o, "logprobs")? == Some(true) {
                return Err(unsupported("logprobs"));
            }
            let messages = o
                .get("messages")
                .filter(|m| m.is_array())
                .ok_or_else(|| ApiError::invalid_field("messages", "must be an array"))?;
            let input = ChatInput {
                messages: TemplateValue::from_serialize(messages),
                tools: o
                    .get("tools")
                    .filter(|t| !t.is_null())
                    .map(TemplateValue::from_serialize),
                add_generation_prompt: true,
                kwargs: match o.get("chat_template_kwargs") {
                    Some(Value::Object(k)) => k
                        .iter()
                        .map(|(k, v)| (k.clone(), TemplateValue::from_serialize(v)))
                        .collect(),
                    _ => Vec::new(),
                },
            };
            let tok = tokenizer.clone();
            let (text, ids) = offload(size, move || {
                let text = tok
                    .apply_chat_template(&input)
                    .map_err(|e| ApiError::bad_request("invalid_request", e.to_string()))?;
                let ids = tok
                    .encode(&text)
                    .map_err(|e| ApiError::bad_request("invalid_request", e.to_string()))?;
                Ok::<_, ApiError>((text, ids))
            })
            .await??;
            let params = sampling(&o, &["max_completion_tokens", "max_tokens"])?;
            let usage = matches!(
                o.get("stream_options"),
                Some(Value::Object(so)) if so.get("include_usage") == Some(&Value::Bool(true))
            );
            (text, ids, params, usage)
        }
        _ => {
            if flag(&o, "return_logprob")? == Some(true) {
                return Err(unsupported("return_logprob"));
            }
            let sp = match o.get("sampling_params") {
                None | Some(Value::Null) => Map::new(),
                Some(Value::Object(m)) => m.clone(),
                Some(_) => {
                    return Err(ApiError::invalid_field(
                        "sampling_params",
                        "must be an object",
                    ));
                }
            };
            let params = sampling(&sp, &["max_new_tokens"])?;
            match (o.get("text"), o.get("input_ids")) {
                (Some(Value::String(t)), None) => {
                    let tok = tokenizer.clone();
                    let t = t.clone();
                    let (text, ids) = offload(size, move || {
                        let ids = tok
                            .encode(&t)
                            .map_err(|e| ApiError::bad_request("invalid_request", e.to_string()))?;
                        Ok::<_, ApiError>((t, ids))
                    })
                    .await??;
                    (text, ids, params, false)
                }
                (None, Some(v)) => {
                    let input = ids(v, "input_ids")?;
                    tokenizer
                        .check_ids(&input)
                        .map_err(|e| ApiError::invalid_field("input_ids", e))?;
                    (String::new(), input, params, false)
                }
                _ => {
                    return Err(ApiError::invalid_field(
                        "text",
                        "or 'input_ids' (exactly one) is required",
                    ));
                }
            }
        }
    };
    if input_ids.is_empty() {
        return Err(ApiError::bad_request(
            "invalid_request",
            "the prompt is empty after tokenization",
        ));
    }
    let stop = StopConditions::new(
        tokenizer,
        &params.stop,
        &params.stop_token_ids,
        params.ignore_eos,
        params.no_stop_trim,
    )
    .map_err(|e| ApiError::invalid_field("stop", e))?;
    let decode = DecodeOptions {
        skip_special_tokens: params.skip_special_tokens,
        spaces_between_special_tokens: false,
    };
    let prompt_tokens = u32::try_from(input_ids.len()).unwrap_or(u32::MAX);
    Ok(Plan {
        request: GenerateRequest {
            tokenized: Some(TokenizedInput {
                original_text,
                input_ids,
            }),
            sampling_params: Some(params),
            logprob_start_len: -1,
            stream: true,
            ..Default::default()
        },
        endpoint: req.endpoint,
        stream: req.stream,
        model,
        stop,
        decode,
        include_usage,
        prompt_tokens,
    })
}

/// Token counts of a finished sequence.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: u32,
    /// Generated tokens.
    pub completion: u32,
    /// Prompt tokens served from cache.
    pub cached: u32,
}

fn usage_json(u: Usage) -> Value {
    json!({
        "prompt_tokens": u.prompt,
        "completion_tokens": u.completion,
        "total_tokens": u.prompt.saturating_add(u.completion),
        "prompt_tokens_details": {"cached_tokens": u.cached},
    })
}

fn matched(f: &FinishReason) -> Value {
    match (f.matched_token(), f.matched_text()) {
        (Some(id), _) => json!(id),
        (_, Some(s)) => json!(s),
        _ => Value::Null,
    }
}

fn created() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The whole non-streaming body.
pub fn full_body(
    plan: &Plan,
    model: &str,
    id: &str,
    text: &str,
    ids: &[u32],
    f: &FinishReason,
    u: Usage,
) -> Value {
    match plan.endpoint {
        Endpoint::ChatCompletions => json!({
            "id": format!("chatcmpl-{id}"),
            "object": "chat.completion",
            "created": created(),
            "model": model,
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": f.as_str(),
                "matched_stop": matched(f),
            }],
            "usage": usage_json(u),
        }),
        _ => generate_body(id, text, ids, f, u),
    }
}

fn generate_body(id: &str, text: &str, ids: &[u32], f: &FinishReason, u: Usage) -> Value {
    let finish = match f {
        FinishReason::Length => json!({"type": "length", "length": u.completion}),
        FinishReason::Abort => json!({"type": "abort"}),
        other => json!({"type": "stop", "matched": matched(other)}),
    };
    json!({
        "text": text,
        "output_ids": ids,
        "meta_info": {
            "id": id,
            "prompt_tokens": u.prompt,
            "completion_tokens": u.completion,
            "cached_tokens": u.cached,
            "finish_reason": finish,
        },
    })
}

/// One SSE event for a streaming answer. Chat events carry the delta; `/generate` events
/// carry the text so far, as SGLang streams it. `finish` is set on the last one.
pub fn stream_event(
    plan: &Plan,
    model: &str,
    id: &str,
    delta: &str,
    so_far: (&str, &[u32]),
    finish: Option<&FinishReason>,
    u: Usage,
) -> Vec<Value> {
    match plan.endpoint {
        Endpoint::ChatCompletions => {
            let chunk = |delta: Value, finish: Value, usage: Value| {
                json!({
                    "id": format!("chatcmpl-{id}"),
                    "object": "chat.completion.chunk",
                    "created": created(),
                    "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
                    "usage": usage,
                })
            };
            let mut out = Vec::new();
            if !delta.is_empty() {
                out.push(chunk(json!({"content": delta}), Value::Null, Value::Null));
            }
            if let Some(f) = finish {
                out.push(chunk(json!({}), json!(f.as_str()), Value::Null));
                if plan.include_usage {
                    let mut last = chunk(json!({}), Value::Null, usage_json(u));
                    last["choices"] = json!([]);
                    out.push(last);
                }
            }
            out
        }
        _ => {
            if delta.is_empty() && finish.is_none() {
                return Vec::new();
            }
            let f = finish.cloned().unwrap_or(FinishReason::Stop);
            let mut body = generate_body(id, so_far.0, so_far.1, &f, u);
            if finish.is_none() {
                body["meta_info"]["finish_reason"] = Value::Null;
                body["meta_info"]["completion_tokens"] = json!(so_far.1.len());
            }
            vec![body]
        }
    }
}

/// The first chat event: the assistant role.
pub fn role_event(plan: &Plan, model: &str, id: &str) -> Option<Value> {
    (plan.endpoint == Endpoint::ChatCompletions).then(|| {
        json!({
            "id": format!("chatcmpl-{id}"),
            "object": "chat.completion.chunk",
            "created": created(),
            "model": model,
            "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}],
        })
    })
}

/// The engine's finish reason, as the router's.
pub fn engine_finish(
    reason: &str,
    matched_token: Option<u32>,
    matched_text: Option<&str>,
) -> FinishReason {
    match (reason, matched_token, matched_text) {
        (_, Some(id), _) => FinishReason::StopToken(id),
        (_, _, Some(s)) => FinishReason::StopString(s.to_owned()),
        ("length", ..) => FinishReason::Length,
        ("abort", ..) => FinishReason::Abort,
        _ => FinishReason::Stop,
    }
}
