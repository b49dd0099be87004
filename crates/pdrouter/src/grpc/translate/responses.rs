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
use crate::chat_template::{ChatPrompt, template_messages};
use crate::grpc::chat_parse::ChatAsk;
use crate::json_map::Field as _;

mod items;
mod tools;

use crate::error::ApiError;
use crate::grpc::output::Delta;
pub(crate) use items::Stream;

fn text_of(content: &Value, field: &str) -> Result<String, ApiError> {
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match p.field("type").and_then(Value::as_str) {
                    Some("input_text" | "output_text" | "text") => {
                        let t = p.field("text").and_then(Value::as_str).ok_or_else(|| {
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
    let instructions = match o.field("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(ApiError::invalid_field("instructions", "must be a string")),
    };
    let mut out = Vec::new();
    if let Some(s) = &instructions {
        out.push(json!({"role": "system", "content": s}));
    }
    match o.field("input") {
        Some(Value::String(s)) => out.push(json!({"role": "user", "content": s})),
        Some(Value::Array(items)) => {
            for (i, it) in items.iter().enumerate() {
                let field = format!("input[{i}]");
                let Some(item) = it.as_object() else {
                    return Err(ApiError::invalid_field(&field, "must be an object"));
                };
                match item.field("type").and_then(Value::as_str) {
                    None | Some("message") => {}
                    Some("function_call") => {
                        let call = tools::call(item, &field)?;
                        // Consecutive calls are one assistant turn.
                        match out.last_mut() {
                            Some(m)
                                if m.field("tool_calls").is_some() && m["role"] == "assistant" =>
                            {
                                if let Some(calls) = m["tool_calls"].as_array_mut() {
                                    calls.push(call);
                                }
                            }
                            _ => out.push(json!({"role": "assistant", "content": null,
                                "tool_calls": [call]})),
                        }
                        continue;
                    }
                    Some("function_call_output") => {
                        out.push(tools::output(item, &field)?);
                        continue;
                    }
                    // An earlier answer's reasoning, handed back: templates drop past
                    // reasoning, and so does the prompt here.
                    Some("reasoning") => continue,
                    Some(other) => {
                        let other: String = other.chars().take(64).collect();
                        return Err(unsupported(&format!("input items of type '{other}'")));
                    }
                }
                let role = item
                    .field("role")
                    .and_then(Value::as_str)
                    .filter(|r| matches!(*r, "user" | "assistant" | "system" | "developer"))
                    .ok_or_else(|| {
                        ApiError::invalid_field(
                            &format!("{field}.role"),
                            "must be user, assistant, system or developer",
                        )
                    })?;
                let role = if role == "developer" { "system" } else { role };
                let content = item.field("content").unwrap_or(&Value::Null);
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
    if o.field("previous_response_id")
        .is_some_and(|v| !v.is_null())
    {
        return Err(unsupported("'previous_response_id'"));
    }
    if flag(o, "background")? == Some(true) {
        return Err(unsupported("'background'"));
    }
    match o.field("text") {
        None | Some(Value::Null) => {}
        Some(Value::Object(t)) => {
            if let Some(fmt) = t.field("format").filter(|f| !f.is_null())
                && fmt.field("type").and_then(Value::as_str) != Some("text")
            {
                return Err(unsupported("'text.format' other than text"));
            }
        }
        Some(_) => return Err(ApiError::invalid_field("text", "must be an object")),
    }
    let (messages, instructions) = messages(o)?;
    let (mut params, unset) = sampling(o, &["max_output_tokens"])?;
    let tools = tools::chat_tools(o)?;
    let ask = ChatAsk::of(&tools::chat_choice(o), tools.as_ref())?;
    if let Some(schema) = ask.constraint(tools.as_ref()) {
        params.constraint =
            Some(pdrouter_proto::scheduler::sampling_params::Constraint::JsonSchema(schema));
    }
    let messages = Value::Array(messages);
    Ok(Input {
        prompts: vec![Source::Chat(ChatPrompt::new(
            &*template_messages(&messages)?,
            tools.as_ref(),
            &crate::chat_template::TemplateVars::default(),
        )?)],
        params,
        unset,
        logprobs: LogprobAsk::default(),
        include_usage: false,
        instructions,
        echo: false,
        chat: Some(ask),
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

/// The response object around `output` (its items) and `reasoning` (for the usage); `None`
/// for the events before the output.
fn response(a: &Answer<'_>, output: Option<(&[Value], &str)>) -> Value {
    let c = &a.out.choices[0];
    let (status, incomplete, output, usage) = match output {
        None => ("in_progress", Value::Null, json!([]), Value::Null),
        Some((items, reasoning)) => {
            let (status, incomplete) = status(c.finish.as_ref());
            let u = a.out.usage();
            let reasoning_tokens = match reasoning {
                "" => 0,
                r => a.out.tokenizer.encode(r).map_or(0, |ids| ids.len()),
            };
            (
                status,
                incomplete,
                Value::Array(items.to_vec()),
                json!({
                    "input_tokens": u.prompt,
                    "input_tokens_details": {"cached_tokens": u.cached},
                    "output_tokens": u.completion,
                    "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
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

/// The whole answer.
pub(crate) fn body(a: &Answer<'_>) -> Value {
    let (items, reasoning) = items::whole(a);
    response(a, Some((&items, &reasoning)))
}

fn event(kind: &str, mut v: Value, seq: &mut u64) -> Bytes {
    v["type"] = json!(kind);
    v["sequence_number"] = json!(*seq);
    *seq += 1;
    Bytes::from(format!("event: {kind}\ndata: {v}\n\n"))
}

pub(crate) fn start(a: &Answer<'_>, s: &mut Stream, seq: &mut u64) -> Vec<Bytes> {
    let resp = response(a, None);
    let mut out = vec![
        event("response.created", json!({"response": resp}), seq),
        event("response.in_progress", json!({"response": resp}), seq),
    ];
    out.extend(s.start(a, seq));
    out
}

pub(crate) fn delta(a: &Answer<'_>, d: &Delta, s: &mut Stream, seq: &mut u64) -> Vec<Bytes> {
    s.delta(a, &d.text, d.finished, seq)
}

pub(crate) fn end(a: &Answer<'_>, s: &mut Stream, seq: &mut u64) -> Vec<Bytes> {
    let mut out = s.finish(a, seq);
    let full = response(a, Some(s.items()));
    let done = match full["status"].as_str() {
        Some("completed") => "response.completed",
        _ => "response.incomplete",
    };
    out.push(event(done, json!({"response": full}), seq));
    out
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
