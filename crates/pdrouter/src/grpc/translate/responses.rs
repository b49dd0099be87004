//! `/v1/responses`, text only: `input` (a string, or message items whose content is text) and
//! `instructions` become chat messages for the template; the answer is one assistant message.
//!
//! A stream is the Responses event sequence, each event with its `sequence_number`:
//! `response.created`, `response.in_progress`, `response.output_item.added`,
//! `response.content_part.added`, `response.output_text.delta`..., `response.output_text.done`,
//! `response.content_part.done`, `response.output_item.done`, `response.completed`.

use bytes::Bytes;
use pdrouter_tokenizer::FinishReason;
use serde_json::{Map, Value, json};

use super::{Answer, Input, LogprobAsk, Source, flag, sampling, unsupported};
use crate::chat_template::ChatPrompt;
use crate::error::ApiError;
use crate::grpc::output::Delta;

fn text_of(content: &Value, field: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match p.get("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        let t = p.get("text").and_then(Value::as_str).ok_or_else(|| {
                            ApiError::invalid_field(
                                &format!("{field}[{j}].text"),
                                "must be a string",
                            )
                        })?;
                        text.push_str(t);
                    }
                    Some(other) => {
                        return Err(unsupported(&format!(
                            "content of type '{other}' on /v1/responses"
                        )));
                    }
                    None => {
                        return Err(ApiError::invalid_field(
                            &format!("{field}[{j}].type"),
                            "is required",
                        ));
                    }
                }
            }
            Ok(text)
        }
        _ => Err(ApiError::invalid_field(
            field,
            "must be a string or a list of content parts",
        )),
    }
}

fn messages(o: &Map<String, Value>) -> Result<(Vec<Value>, Option<String>), ApiError> {
    let instructions = match o.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid_field("instructions", "must be a string")),
    };
    let mut out = Vec::new();
    if let Some(s) = &instructions {
        out.push(json!({"role": "system", "content": s}));
    }
    match o.get("input") {
        Some(Value::String(s)) => out.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, it) in items.iter().enumerate() {
                let field = format!("input[{i}]");
                let Some(item) = it.as_object() else {
                    return Err(ApiError::invalid_field(&field, "must be an object"));
                };
                match item.get("type").and_then(Value::as_str) {
                    None | Some("message") => {}
                    Some(other) => {
                        return Err(unsupported(&format!("input items of type '{other}'")));
                    }
                }
                let role = item
                    .get("role")
                    .and_then(Value::as_str)
                    .filter(|r| matches!(*r, "user" | "assistant" | "system" | "developer"))
                    .ok_or_else(|| {
                        ApiError::invalid_field(
                            &format!("{field}.role"),
                            "must be user, assistant, system or developer",
                        )
                    })?;
                let role = if role == "developer" { "system" } else { role };
                let content = item.get("content").unwrap_or(&Value::Null);
                let text = text_of(content, &format!("{field}.content"))?;
                out.push(json!({"role": role, "content": text}));
            }
        }
        _ => {
            return Err(ApiError::invalid_field(
                "input",
                "must be a string or a list of input items",
            ));
        }
    }
    Ok((out, instructions))
}

pub(crate) fn input(o: &Map<String, Value>) -> Result<Input, ApiError> {
    if o.get("previous_response_id").is_some_and(|v| !v.is_null()) {
        return Err(unsupported("'previous_response_id'"));
    }
    if flag(o, "background")? == Some(true) {
        return Err(unsupported("'background'"));
    }
    if o.get("tools")
        .is_some_and(|t| t.as_array().is_none_or(|a| !a.is_empty()) && !t.is_null())
    {
        return Err(unsupported("'tools' on /v1/responses"));
    }
    match o.get("text") {
        None | Some(Value::Null) => {}
        Some(Value::Object(t)) => {
            if let Some(fmt) = t.get("format").filter(|f| !f.is_null())
                && fmt.get("type").and_then(Value::as_str) != Some("text")
            {
                return Err(unsupported("'text.format' other than text"));
            }
        }
        Some(_) => return Err(ApiError::invalid_field("text", "must be an object")),
    }
    let (messages, instructions) = messages(o)?;
    let (params, unset) = sampling(o, &["max_output_tokens"])?;
    Ok(Input {
        prompts: vec![Source::Chat(ChatPrompt::new(
            &Value::Array(messages),
            None,
            &crate::chat_template::TemplateVars::default(),
        )?)],
        params,
        unset,
        logprobs: LogprobAsk::default(),
        include_usage: false,
        instructions,
        echo: false,
        chat: None,
    })
}

fn item_id(a: &Answer<'_>) -> String {
    format!("msg_{}", a.id)
}

fn status(f: Option<&FinishReason>) -> (&'static str, Value) {
    match f {
        Some(FinishReason::Length) => ("incomplete", json!({"reason": "max_output_tokens"})),
        Some(FinishReason::Abort) => ("cancelled", Value::Null),
        _ => ("completed", Value::Null),
    }
}

fn part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": []})
}

fn message(a: &Answer<'_>, status: &str, content: Value) -> Value {
    json!({
        "type": "message",
        "id": item_id(a),
        "status": status,
        "role": "assistant",
        "content": content,
    })
}

/// The response object; `in_progress` for the events before the output.
pub(crate) fn body(a: &Answer<'_>, in_progress: Option<()>) -> Value {
    let c = &a.out.choices[0];
    let (status, incomplete, output, usage) = match in_progress {
        Some(()) => ("in_progress", Value::Null, json!([]), Value::Null),
        None => {
            let (status, incomplete) = status(c.finish.as_ref());
            let u = a.out.usage();
            let item_status = if status == "completed" {
                "completed"
            } else {
                "incomplete"
            };
            (
                status,
                incomplete,
                json!([message(a, item_status, json!([part(&c.full)]))]),
                json!({
                    "input_tokens": u.prompt,
                    "input_tokens_details": {"cached_tokens": u.cached},
                    "output_tokens": u.completion,
                    "output_tokens_details": {"reasoning_tokens": 0},
                    "total_tokens": u.prompt.saturating_add(u.completion),
                }),
            )
        }
    };
    let sp = a.plan.requests[0].sampling_params.as_ref();
    json!({
        "id": format!("resp_{}", a.id),
        "object": "response",
        "created_at": a.created,
        "status": status,
        "error": null,
        "incomplete_details": incomplete,
        "instructions": a.plan.instructions,
        "max_output_tokens": sp.and_then(|s| s.max_new_tokens),
        "model": a.model,
        "output": output,
        "temperature": sp.map(|s| s.temperature),
        "top_p": sp.map(|s| s.top_p),
        "usage": usage,
    })
}

fn event(kind: &str, mut v: Value, seq: &mut u64) -> Bytes {
    v["type"] = json!(kind);
    v["sequence_number"] = json!(*seq);
    *seq += 1;
    Bytes::from(format!("event: {kind}\ndata: {v}\n\n"))
}

pub(crate) fn start(a: &Answer<'_>, seq: &mut u64) -> Vec<Bytes> {
    let resp = body(a, Some(()));
    vec![
        event("response.created", json!({"response": resp}), seq),
        event("response.in_progress", json!({"response": resp}), seq),
        event(
            "response.output_item.added",
            json!({"output_index": 0, "item": message(a, "in_progress", json!([]))}),
            seq,
        ),
        event(
            "response.content_part.added",
            json!({"item_id": item_id(a), "output_index": 0, "content_index": 0, "part": part("")}),
            seq,
        ),
    ]
}

pub(crate) fn delta(a: &Answer<'_>, d: &Delta, seq: &mut u64) -> Vec<Bytes> {
    if d.text.is_empty() {
        return Vec::new();
    }
    vec![event(
        "response.output_text.delta",
        json!({
            "item_id": item_id(a),
            "output_index": 0,
            "content_index": 0,
            "delta": d.text,
            "logprobs": [],
        }),
        seq,
    )]
}

pub(crate) fn end(a: &Answer<'_>, seq: &mut u64) -> Vec<Bytes> {
    let c = &a.out.choices[0];
    let full = body(a, None);
    let item = full["output"][0].clone();
    let done = match full["status"].as_str() {
        Some("completed") => "response.completed",
        _ => "response.incomplete",
    };
    vec![
        event(
            "response.output_text.done",
            json!({
                "item_id": item_id(a),
                "output_index": 0,
                "content_index": 0,
                "text": c.full,
                "logprobs": [],
            }),
            seq,
        ),
        event(
            "response.content_part.done",
            json!({"item_id": item_id(a), "output_index": 0, "content_index": 0, "part": part(&c.full)}),
            seq,
        ),
        event(
            "response.output_item.done",
            json!({"output_index": 0, "item": item}),
            seq,
        ),
        event(done, json!({"response": full}), seq),
    ]
}

pub(crate) fn error(e: &ApiError, seq: &mut u64) -> Bytes {
    let body = e.body_json();
    event(
        "error",
        json!({
            "code": body["error"]["code"],
            "message": body["error"]["message"],
            "param": null,
        }),
        seq,
    )
}
