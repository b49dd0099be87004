//! A chat request's `messages`, `tools` and `chat_template_kwargs` as the chat template's
//! input, the one way both prompt paths render a chat: text-only chats (`grpc::translate`)
//! and chats with images (`images`, after flattening a string-content template's parts).
//!
//! The messages reach the template as an engine's own server hands them over: an assistant
//! message's `content: null` (what the OpenAI SDK sends back with `tool_calls`) is the empty
//! string, and the `arguments` of earlier turns' tool calls, JSON text on the wire, are the
//! objects they encode (templates iterate or `tojson` them; a string would be encoded twice).
//! `tools: []` is no tools, and the deprecated `functions` are `tools` of type `function`.
//!
//! Invariant: a body that needs none of this is rendered from the client's own tree (no
//! copy); a tool call whose `arguments` is not JSON text of an object is refused (400 naming
//! it) rather than rendered.

use std::borrow::Cow;

use pdrouter_tokenizer::{ChatInput, TemplateValue};
use serde_json::{Map, Value};

use crate::error::ApiError;

/// Chat messages (with optional tools and template kwargs) for the template.
pub(crate) fn chat_input(
    messages: &Value,
    tools: Option<&Value>,
    kwargs: Option<&Value>,
) -> ChatInput {
    ChatInput {
        messages: TemplateValue::from_serialize(messages),
        tools: tools
            .filter(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty()))
            .map(TemplateValue::from_serialize),
        add_generation_prompt: true,
        kwargs: match kwargs {
            Some(Value::Object(k)) => k
                .iter()
                .map(|(k, v)| (k.clone(), TemplateValue::from_serialize(v)))
                .collect(),
            _ => Vec::new(),
        },
    }
}

/// Whether message `m` needs rewriting for the template.
fn needs_rewrite(m: &Value) -> bool {
    m.get("content").is_some_and(Value::is_null)
        || m.get("tool_calls")
            .and_then(Value::as_array)
            .is_some_and(|calls| {
                calls.iter().any(|c| {
                    c.pointer("/function/arguments")
                        .is_some_and(Value::is_string)
                })
            })
}

/// The messages as the template is to see them (see the module doc).
pub(crate) fn template_messages(messages: &Value) -> Result<Cow<'_, Value>, ApiError> {
    let Some(list) = messages.as_array() else {
        return Ok(Cow::Borrowed(messages));
    };
    if !list.iter().any(needs_rewrite) {
        return Ok(Cow::Borrowed(messages));
    }
    let mut list = list.clone();
    for (i, m) in list.iter_mut().enumerate() {
        if m.get("content").is_some_and(Value::is_null) {
            m["content"] = Value::String(String::new());
        }
        let calls = m.get_mut("tool_calls").and_then(Value::as_array_mut);
        for (j, call) in calls.into_iter().flatten().enumerate() {
            let Some(args) = call.pointer_mut("/function/arguments") else {
                continue;
            };
            if let Value::String(text) = args {
                let field = format!("messages[{i}].tool_calls[{j}].function.arguments");
                *args = match serde_json::from_str::<Value>(text) {
                    Ok(v @ Value::Object(_)) => v,
                    _ => {
                        return Err(ApiError::invalid_field(
                            &field,
                            "must be JSON text of an object",
                        ));
                    }
                };
            }
        }
    }
    Ok(Cow::Owned(Value::Array(list)))
}

/// The request's tools: `tools`, else the deprecated `functions` as tools of type
/// `function`; `None` when there are none.
pub(crate) fn request_tools(o: &Map<String, Value>) -> Result<Option<Cow<'_, Value>>, ApiError> {
    match (o.get("tools"), o.get("functions")) {
        (Some(t), _) if !t.is_null() => {
            if !t.is_array() {
                return Err(ApiError::invalid_field("tools", "must be an array"));
            }
            Ok(Some(Cow::Borrowed(t)))
        }
        (_, Some(Value::Array(fs))) => {
            let tools = fs
                .iter()
                .map(|f| serde_json::json!({"type": "function", "function": f}))
                .collect();
            Ok(Some(Cow::Owned(Value::Array(tools))))
        }
        (_, None | Some(Value::Null)) => Ok(None),
        (_, Some(_)) => Err(ApiError::invalid_field("functions", "must be an array")),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn null_content_and_string_arguments_are_what_templates_expect() {
        let m = json!([
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
            {"role": "tool", "tool_call_id": "c", "content": "2"},
        ]);
        let out = template_messages(&m).unwrap();
        assert_eq!(out[1]["content"], "");
        assert_eq!(
            out[1]["tool_calls"][0]["function"]["arguments"],
            json!({"a": 1})
        );
        assert_eq!(out[2], m[2]);
        let plain = json!([{"role": "user", "content": "hi"}]);
        assert!(matches!(
            template_messages(&plain).unwrap(),
            Cow::Borrowed(_)
        ));
        let bad = json!([{"role": "assistant", "content": "", "tool_calls": [{"function":
            {"name": "f", "arguments": "not json"}}]}]);
        let e = format!("{:?}", template_messages(&bad).unwrap_err());
        assert!(
            e.contains("messages[0].tool_calls[0].function.arguments"),
            "{e}"
        );
    }

    /// Qwen3's own template renders the second turn of a tool conversation as the SDK sends
    /// it back (content null, arguments as JSON text) once the messages are normalized; as
    /// sent it fails, which is what clients got before.
    #[test]
    fn a_two_turn_tool_conversation_renders_with_qwen3s_template() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../pdrouter-tokenizer/tests/fixtures/qwen3");
        let t = pdrouter_tokenizer::Tokenizer::load(&dir, None).unwrap();
        let tools = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
        let m = json!([
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ]);
        assert!(
            t.apply_chat_template(&chat_input(&m, Some(&tools), None))
                .is_err()
        );
        let fixed = template_messages(&m).unwrap();
        let text = t
            .apply_chat_template(&chat_input(&fixed, Some(&tools), None))
            .unwrap();
        assert!(
            text.contains(r#"{"name": "get_weather", "arguments": {"city": "Paris"}}"#),
            "{text}"
        );
        assert!(
            text.contains("<tool_response>\n18 C\n</tool_response>"),
            "{text}"
        );
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
    }

    #[test]
    fn functions_are_tools_and_empty_tools_none() {
        let Value::Object(o) = json!({"functions": [{"name": "f", "parameters": {}}]}) else {
            unreachable!()
        };
        let t = request_tools(&o).unwrap().unwrap();
        assert_eq!(t[0]["type"], "function");
        assert_eq!(t[0]["function"]["name"], "f");
        let Value::Object(o) = json!({"tools": 3}) else {
            unreachable!()
        };
        assert!(request_tools(&o).is_err());
        let input = chat_input(&json!([]), Some(&json!([])), None);
        assert!(input.tools.is_none());
    }
}
