//! `/v1/chat/completions`: messages through the chat template; one choice per sample.

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value, json};

use super::{
    Answer, DONE, Input, LogprobAsk, ReasoningTokens, Source, UsageJson, data, finish_str, flag,
    include_usage, matched, sampling, top_count, usage_json,
};
use crate::chat_template::{ChatPrompt, request_tools, template_messages, template_vars};
use crate::error::ApiError;
use crate::grpc::chat_parse::{ChatAsk, ChatDelta, ChoiceParser};
use crate::grpc::output::Delta;
use crate::grpc::translate::logprobs;
use crate::json_map::Field as _;

/// `body` is shared so that a chat with images can keep it for the image path without a copy.
pub(crate) fn input(body: &Arc<Map<String, Value>>) -> Result<Input, ApiError> {
    let o = &**body;
    let messages = o
        .field("messages")
        .filter(|m| m.is_array())
        .ok_or_else(|| ApiError::invalid_field("messages", "must be an array"))?;
    check_messages(messages)?;
    // Image parts need the encode path (pixels to encode workers, placeholders expanded in
    // the prompt), which `plan` takes or refuses; rendered as text they would reach the
    // engine as an image token without an image.
    let images = pdrouter_vision::image_parts(messages).map_err(|e| ApiError::image_prompt(&e))?;
    let tools = request_tools(o)?;
    let vars = template_vars(o)?;
    let prompt = if images.is_empty() {
        Source::Chat(ChatPrompt::new(
            &*template_messages(messages)?,
            tools.as_deref(),
            &vars,
        )?)
    } else {
        Source::Images(crate::images::ImageChat::new(
            Arc::clone(body),
            tools.as_deref().cloned(),
            vars,
        ))
    };
    let output = flag(o, "logprobs")?.unwrap_or(false);
    let top = top_count(o, "top_logprobs")?;
    if top.is_some() && !output {
        return Err(ApiError::invalid_field(
            "top_logprobs",
            "needs 'logprobs': true",
        ));
    }
    let (mut params, unset) = sampling(o, &["max_completion_tokens", "max_tokens"])?;
    if let Some(c) = response_format(o)? {
        if params.constraint.is_some() {
            return Err(ApiError::invalid_field(
                "response_format",
                "cannot be combined with regex, json_schema or ebnf: one constraint per request",
            ));
        }
        params.constraint = Some(c);
    }
    let ask = ChatAsk::of(o, tools.as_deref())?;
    if let Some(schema) = ask.constraint(tools.as_deref()) {
        if params.constraint.is_some() {
            return Err(ApiError::invalid_field(
                "tool_choice",
                "forces a call, whose output is constrained; it cannot be combined with \
                 response_format, regex, json_schema or ebnf",
            ));
        }
        params.constraint =
            Some(pdrouter_proto::scheduler::sampling_params::Constraint::JsonSchema(schema));
    }
    Ok(Input {
        prompts: vec![prompt],
        params,
        unset,
        logprobs: LogprobAsk {
            output,
            top: top.unwrap_or(0),
            ..LogprobAsk::default()
        },
        include_usage: include_usage(o)?,
        instructions: None,
        echo: false,
        chat: Some(ask),
    })
}

/// Each message an object with a string `role` and a `content` that is a string, a list of
/// parts or null (absent: an assistant turn of tool calls).
fn check_messages(messages: &Value) -> Result<(), ApiError> {
    for (i, m) in messages.as_array().into_iter().flatten().enumerate() {
        let Some(m) = m.as_object() else {
            return Err(ApiError::invalid_field(
                &format!("messages[{i}]"),
                "must be an object with 'role' and 'content'",
            ));
        };
        if !m.field("role").is_some_and(Value::is_string) {
            return Err(ApiError::invalid_field(
                &format!("messages[{i}].role"),
                "must be a string",
            ));
        }
        match m.field("content") {
            None | Some(Value::Null | Value::String(_) | Value::Array(_)) => {}
            Some(_) => {
                return Err(ApiError::invalid_field(
                    &format!("messages[{i}].content"),
                    "must be a string, a list of content parts or null",
                ));
            }
        }
    }
    Ok(())
}

/// `response_format` as an output constraint: `json_object` any JSON object, `json_schema` its
/// `schema`, `text` none.
fn response_format(
    o: &Map<String, Value>,
) -> Result<Option<pdrouter_proto::scheduler::sampling_params::Constraint>, ApiError> {
    use pdrouter_proto::scheduler::sampling_params::Constraint;
    let Some(f) = o.field("response_format").filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let bad = |what: &str| ApiError::invalid_field("response_format", what);
    match f.field("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Constraint::JsonSchema(r#"{"type":"object"}"#.into()))),
        Some("json_schema") => {
            let schema = f
                .pointer("/json_schema/schema")
                .filter(|s| s.is_object() || s.is_boolean())
                .ok_or_else(|| bad("json_schema needs a 'json_schema.schema' object"))?;
            Ok(Some(Constraint::JsonSchema(schema.to_string())))
        }
        _ => Err(bad("'type' must be text, json_object or json_schema")),
    }
}

fn choice_logprobs(a: &Answer<'_>, index: usize, range: std::ops::Range<usize>) -> Value {
    if !a.plan.logprobs.output {
        return Value::Null;
    }
    let lps = &a.out.choices[index].logprobs[range];
    logprobs::chat(&a.out.tokenizer, lps)
}

/// A choice's finish: `tool_calls` when it called a function and stopped on its own.
fn finish_of(a: &Answer<'_>, index: usize, called: bool) -> Value {
    let f = a.out.choices[index].finish.as_ref();
    match finish_str(f) {
        Value::String(s) if called && s == "stop" => json!("tool_calls"),
        other => other,
    }
}

/// The usage, with the reasoning's length in tokens when reasoning is parsed.
fn usage_with(a: &Answer<'_>, reasoning: &[&str]) -> UsageJson {
    let mut usage = usage_json(a.out.usage());
    if a.plan.chat.as_ref().is_some_and(|c| c.reasons()) {
        let tokens: usize = reasoning
            .iter()
            .map(|r| a.out.tokenizer.encode(r).map_or(0, |ids| ids.len()))
            .sum();
        usage.completion_tokens_details = Some(ReasoningTokens {
            reasoning_tokens: tokens,
        });
    }
    usage
}

fn tool_calls_json(calls: &[(String, pdrouter_parsers::ToolCall)]) -> Value {
    calls
        .iter()
        .enumerate()
        .map(|(i, (id, c))| {
            json!({"index": i, "id": id, "type": "function",
                "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

/// The whole non-streaming body, serialized. Written as typed structs rather than a JSON tree:
/// this is every non-streaming chat answer's path, and a tree costs an allocation per key.
/// Keys are in the order the OpenAI API documents them (and SGLang's server writes them).
pub(crate) fn body(a: &Answer<'_>) -> Vec<u8> {
    let parsed: Vec<_> = a
        .out
        .choices
        .iter()
        .map(|c| a.plan.chat.as_ref().map(|p| p.parse_whole(&c.full)))
        .collect();
    let reasoning: Vec<&str> = parsed
        .iter()
        .flatten()
        .map(|p| p.reasoning.as_str())
        .collect();
    let reasons = a.plan.chat.as_ref().is_some_and(|c| c.reasons());
    let choices: Vec<FullChoice<'_>> = a
        .out
        .choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let called = parsed[i].as_ref().is_some_and(|p| !p.calls.is_empty());
            let message = match &parsed[i] {
                None => FullMessage {
                    role: "assistant",
                    content: Some(&c.full),
                    reasoning_content: None,
                    tool_calls: None,
                },
                Some(p) => FullMessage {
                    role: "assistant",
                    content: (!called || !p.content.is_empty()).then_some(p.content.as_str()),
                    reasoning_content: reasons
                        .then(|| Some(p.reasoning.as_str()).filter(|r| !r.is_empty())),
                    tool_calls: called.then(|| tool_calls_json(&p.calls)),
                },
            };
            FullChoice {
                message,
                logprobs: choice_logprobs(a, i, 0..c.logprobs.len()),
                index: i,
                finish_reason: finish_of(a, i, called),
                matched_stop: matched(c.finish.as_ref()),
            }
        })
        .collect();
    let body = FullBody {
        id: ChatId(a.id),
        object: "chat.completion",
        created: a.created,
        model: a.model,
        choices,
        usage: usage_with(a, &reasoning),
    };
    serde_json::to_vec(&body).unwrap_or_default()
}

#[derive(serde::Serialize)]
struct FullBody<'a> {
    id: ChatId<'a>,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<FullChoice<'a>>,
    usage: UsageJson,
}

#[derive(serde::Serialize)]
struct FullChoice<'a> {
    message: FullMessage<'a>,
    logprobs: Value,
    index: usize,
    finish_reason: Value,
    matched_stop: Value,
}

#[derive(serde::Serialize)]
struct FullMessage<'a> {
    role: &'static str,
    content: Option<&'a str>,
    /// Present (possibly null) only when reasoning is parsed.
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<Option<&'a str>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<Value>,
}

/// `chatcmpl-` and the request id, written without building the string.
struct ChatId<'a>(&'a str);

impl serde::Serialize for ChatId<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&format_args!("chatcmpl-{}", self.0))
    }
}

fn chunk(a: &Answer<'_>, choices: Value, usage: impl serde::Serialize) -> Bytes {
    data(&json!({
        "id": format!("chatcmpl-{}", a.id),
        "object": "chat.completion.chunk",
        "created": a.created,
        "model": a.model,
        "choices": choices,
        "usage": usage,
    }))
}

/// The assistant role, once per choice.
pub(crate) fn start(a: &Answer<'_>) -> Vec<Bytes> {
    (0..a.out.choices.len())
        .map(|i| {
            chunk(
                a,
                json!([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": null, "finish_reason": null}]),
                Value::Null,
            )
        })
        .collect()
}

/// One parsed piece of a streamed choice as its `delta` object.
fn delta_json(d: ChatDelta) -> Value {
    match d {
        ChatDelta::Content(s) => json!({"content": s}),
        ChatDelta::Reasoning(s) => json!({"reasoning_content": s}),
        ChatDelta::Call { index, id, name } => json!({"tool_calls": [{
            "index": index, "id": id, "type": "function",
            "function": {"name": name, "arguments": ""}}]}),
        ChatDelta::Args { index, fragment } => json!({"tool_calls": [{
            "index": index, "function": {"arguments": fragment}}]}),
    }
}

/// The events of what one message added to a choice; `parsers` holds each choice's parsing
/// state when the request's answers are parsed.
pub(crate) fn delta(
    a: &Answer<'_>,
    d: &Delta,
    parsers: &mut Vec<Option<ChoiceParser>>,
) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut called = false;
    let mut pieces = match a.plan.chat.as_deref() {
        Some(p) => {
            if parsers.len() < a.out.choices.len() {
                parsers.resize_with(a.out.choices.len(), || None);
            }
            let state = parsers[d.index].get_or_insert_with(|| p.choice());
            let pieces = state.push(p, &d.text, d.finished);
            called = state.called();
            pieces
        }
        None if !d.text.is_empty() => vec![ChatDelta::Content(d.text.clone())],
        None => Vec::new(),
    };
    // Logprobs of tokens whose text is held back (or empty) still go out, with no text.
    if pieces.is_empty() && !d.logprobs.is_empty() {
        pieces.push(ChatDelta::Content(String::new()));
    }
    // The logprobs ride on the first event of the message.
    let mut logprobs =
        (!pieces.is_empty()).then(|| choice_logprobs(a, d.index, d.logprobs.clone()));
    for piece in pieces {
        out.push(chunk(
            a,
            json!([{"index": d.index, "delta": delta_json(piece),
                "logprobs": logprobs.take().unwrap_or(Value::Null),
                "finish_reason": null}]),
            Value::Null,
        ));
    }
    if d.finished {
        let f = a.out.choices[d.index].finish.as_ref();
        out.push(chunk(
            a,
            json!([{
                "index": d.index,
                "delta": {},
                "logprobs": null,
                "finish_reason": finish_of(a, d.index, called),
                "matched_stop": matched(f),
            }]),
            Value::Null,
        ));
    }
    out
}

pub(crate) fn end(a: &Answer<'_>, parsers: &[Option<ChoiceParser>]) -> Vec<Bytes> {
    let mut out = Vec::new();
    if a.plan.include_usage {
        let reasoning: Vec<&str> = parsers.iter().flatten().map(|p| p.reasoning()).collect();
        out.push(chunk(a, json!([]), usage_with(a, &reasoning)));
    }
    out.push(DONE);
    out
}
