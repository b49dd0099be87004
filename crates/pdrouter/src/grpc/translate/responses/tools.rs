//! `/v1/responses` function tools as chat's: its flat tools (`{"type": "function", "name",
//! "parameters"}`) and `tool_choice` in chat's shapes, so the chat template, the tool parser
//! and the forced-call constraint serve both endpoints; its `function_call` and
//! `function_call_output` input items as the assistant and tool turns templates expect.
//!
//! Invariants: only function tools are served (another type is a 501 naming it); a tool's
//! keys keep the client's order; consecutive `function_call` items are one assistant turn.

use serde_json::{Map, Value, json};

use super::super::unsupported;
use crate::chat_template::check_function;
use crate::error::ApiError;

/// The request's tools in chat's shape; `None` without tools.
pub(super) fn chat_tools(o: &Map<String, Value>) -> Result<Option<Value>, ApiError> {
    let list = match o.get("tools") {
        None | Some(Value::Null) => return Ok(None),
        Some(Value::Array(l)) if l.is_empty() => return Ok(None),
        Some(Value::Array(l)) => l,
        Some(_) => return Err(ApiError::invalid_field("tools", "must be an array")),
    };
    let mut out = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let field = format!("tools[{i}]");
        match t.get("type").and_then(Value::as_str) {
            Some("function") => {}
            Some(other) => {
                let other: String = other.chars().take(64).collect();
                return Err(unsupported(&format!("{field} of type '{other}'")));
            }
            None => {
                return Err(ApiError::invalid_field(
                    &format!("{field}.type"),
                    "is required",
                ));
            }
        }
        check_function(Some(t), &field)?;
        let f: Map<String, Value> = t
            .as_object()
            .into_iter()
            .flatten()
            .filter(|(k, _)| !matches!(k.as_str(), "type" | "strict"))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        out.push(json!({"type": "function", "function": f}));
    }
    Ok(Some(Value::Array(out)))
}

/// The body's `tool_choice` and `parallel_tool_calls` in chat's shapes, for `ChatAsk`.
pub(super) fn chat_choice(o: &Map<String, Value>) -> Map<String, Value> {
    let mut out = Map::new();
    if let Some(p) = o.get("parallel_tool_calls") {
        out.insert("parallel_tool_calls".into(), p.clone());
    }
    let Some(c) = o.get("tool_choice") else {
        return out;
    };
    let chat = match c.get("type").and_then(Value::as_str) {
        Some("function") if c.get("function").is_none() => {
            json!({"type": "function", "function": {"name": c.get("name")}})
        }
        Some("allowed_tools") if c.get("allowed_tools").is_none() => {
            json!({"type": "allowed_tools", "allowed_tools": {
                "mode": c.get("mode"), "tools": c.get("tools")}})
        }
        _ => c.clone(),
    };
    out.insert("tool_choice".into(), chat);
    out
}

/// A `function_call` input item as a chat tool call.
pub(super) fn call(item: &Map<String, Value>, field: &str) -> Result<Value, ApiError> {
    let text = |k: &str| {
        item.get(k)
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid_field(&format!("{field}.{k}"), "must be a string"))
    };
    Ok(json!({"id": text("call_id")?, "type": "function",
        "function": {"name": text("name")?, "arguments": text("arguments")?}}))
}

/// A `function_call_output` input item as a chat tool message.
pub(super) fn output(item: &Map<String, Value>, field: &str) -> Result<Value, ApiError> {
    let id = item
        .get("call_id")
        .and_then(Value::as_str)
        .ok_or_else(|| ApiError::invalid_field(&format!("{field}.call_id"), "must be a string"))?;
    let content = match item.get("output") {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(_)) => super::text_of(&item["output"], &format!("{field}.output"))?,
        _ => {
            return Err(ApiError::invalid_field(
                &format!("{field}.output"),
                "must be a string or a list of content parts",
            ));
        }
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}
