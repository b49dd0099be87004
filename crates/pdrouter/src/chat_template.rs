//! A chat request's `messages`, `tools` and template variables as the chat template's
//! input, the one way both prompt paths render a chat: text-only chats (`grpc::translate`)
//! and chats with images (`images`, after flattening a string-content template's parts).
//!
//! The messages reach the template as an engine's own server hands them over: an assistant
//! message's `content: null` (what the OpenAI SDK sends back with `tool_calls`) is the empty
//! string, and the `arguments` of earlier turns' tool calls, JSON text on the wire, are the
//! objects they encode (templates iterate or `tojson` them; a string would be encoded twice).
//! A template that expects string content gets text-only content-part arrays joined by
//! newlines ([`ChatPrompt`]), as vLLM's server does; one that walks parts gets them as sent.
//! `tools: []` is no tools, and the deprecated `functions` are `tools` of type `function`.
//! The template's variables are `chat_template_kwargs` plus `reasoning_effort` (and
//! `add_generation_prompt` from the body); effort
//! `"none"` also turns thinking off (`enable_thinking` and `thinking` false) unless the
//! kwargs say otherwise.
//!
//! Invariant: a body that needs none of this is rendered from the client's own tree (no
//! copy); a tool call whose `arguments` is not JSON text of an object, a tool that is not a
//! named function, a content part that is neither text nor an image, and kwargs that are not
//! an object are refused (400 naming them) rather than rendered.

use std::borrow::Cow;

use pdrouter_tokenizer::{ChatInput, ContentFormat, TemplateValue, Tokenizer};
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::json_map::Field as _;

/// What a chat body sets of the template's input beyond `messages` and `tools`.
#[derive(Debug, Clone)]
pub(crate) struct TemplateVars {
    /// Extra variables: `chat_template_kwargs`, `reasoning_effort`.
    kwargs: Vec<(String, TemplateValue)>,
    /// `add_generation_prompt` (default true).
    generation_prompt: bool,
}

impl Default for TemplateVars {
    fn default() -> Self {
        TemplateVars {
            kwargs: Vec::new(),
            generation_prompt: true,
        }
    }
}

/// `reasoning_effort` values (OpenAI's, `none` turning thinking off).
const EFFORTS: [&str; 6] = ["none", "minimal", "low", "medium", "high", "xhigh"];

/// The template variables a chat body asks for: `add_generation_prompt`,
/// `chat_template_kwargs` (an object), then `reasoning_effort` unless the kwargs set it and,
/// for effort `none`, thinking turned off unless the kwargs set either thinking switch.
pub(crate) fn template_vars(o: &Map<String, Value>) -> Result<TemplateVars, ApiError> {
    let generation_prompt = match o.field("add_generation_prompt") {
        None | Some(Value::Null) => true,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::invalid_field(
                "add_generation_prompt",
                "must be a boolean",
            ));
        }
    };
    let kwargs = template_kwargs(o)?;
    Ok(TemplateVars {
        kwargs,
        generation_prompt,
    })
}

fn template_kwargs(o: &Map<String, Value>) -> Result<Vec<(String, TemplateValue)>, ApiError> {
    let mut out: Vec<(String, TemplateValue)> = match o.field("chat_template_kwargs") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Object(k)) => k
            .iter()
            .map(|(k, v)| (k.clone(), TemplateValue::from_serialize(v)))
            .collect(),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "chat_template_kwargs",
                "must be an object",
            ));
        }
    };
    let effort = match o.field("reasoning_effort") {
        None | Some(Value::Null) => return Ok(out),
        Some(Value::String(e)) if EFFORTS.contains(&e.as_str()) => e.clone(),
        Some(_) => {
            return Err(ApiError::invalid_field(
                "reasoning_effort",
                format!("must be one of {}", EFFORTS.join(", ")),
            ));
        }
    };
    let has = |out: &[(String, TemplateValue)], k: &str| out.iter().any(|(name, _)| name == k);
    // The two thinking switches are one: kwargs that set either keep both as given, so the
    // template and the parser (`thinking_off`) always agree.
    if effort == "none" && !has(&out, "enable_thinking") && !has(&out, "thinking") {
        for k in ["enable_thinking", "thinking"] {
            out.push((k.to_owned(), TemplateValue::from_serialize(&false)));
        }
    }
    if !has(&out, "reasoning_effort") {
        out.push((
            "reasoning_effort".into(),
            TemplateValue::from_serialize(&effort),
        ));
    }
    Ok(out)
}

/// Whether a chat body turns thinking off: `enable_thinking` or `thinking` false in its
/// kwargs, else `reasoning_effort: "none"` (kwargs that set either win, as in the template).
pub(crate) fn thinking_off(o: &Map<String, Value>) -> bool {
    let kw = o.field("chat_template_kwargs").and_then(Value::as_object);
    let set: Vec<&Value> = ["enable_thinking", "thinking"]
        .iter()
        .filter_map(|k| kw?.get(*k))
        .collect();
    if !set.is_empty() {
        return set.contains(&&Value::Bool(false));
    }
    o.field("reasoning_effort").and_then(Value::as_str) == Some("none")
}

/// Chat messages (with optional tools and template variables) for the template.
pub(crate) fn chat_input(
    messages: &Value,
    tools: Option<&Value>,
    vars: &TemplateVars,
) -> ChatInput {
    ChatInput {
        messages: TemplateValue::from_serialize(messages),
        tools: tools
            .filter(|t| !t.is_null() && t.as_array().is_none_or(|a| !a.is_empty()))
            .map(TemplateValue::from_serialize),
        add_generation_prompt: vars.generation_prompt,
        kwargs: vars.kwargs.clone(),
    }
}

/// A text-only chat ready for either kind of template: as sent, and (when some message's
/// content is a list of parts) with those parts joined for templates that expect strings.
#[derive(Debug)]
pub(crate) struct ChatPrompt {
    parts: ChatInput,
    flat: Option<ChatInput>,
}

impl ChatPrompt {
    /// The prompt of `messages` (already [`template_messages`]) with `tools` and `vars`.
    pub(crate) fn new(
        messages: &Value,
        tools: Option<&Value>,
        vars: &TemplateVars,
    ) -> Result<Self, ApiError> {
        let has_parts = messages.as_array().is_some_and(|l| {
            l.iter()
                .any(|m| m.field("content").is_some_and(Value::is_array))
        });
        let flat = match has_parts {
            true => {
                let flat = pdrouter_vision::flatten_content(messages)
                    .map_err(|e| ApiError::image_prompt(&e))?;
                Some(chat_input(&flat, tools, vars))
            }
            false => None,
        };
        Ok(ChatPrompt {
            parts: chat_input(messages, tools, vars),
            flat,
        })
    }

    /// The input `tokenizer`'s template is to render.
    pub(crate) fn for_template(&self, tokenizer: &Tokenizer) -> &ChatInput {
        let strings = tokenizer
            .chat_template()
            .is_none_or(|t| t.content_format() == ContentFormat::String);
        match (&self.flat, strings) {
            (Some(flat), true) => flat,
            _ => &self.parts,
        }
    }
}

/// Whether message `m` needs rewriting for the template.
fn needs_rewrite(m: &Value) -> bool {
    m.field("content").is_some_and(Value::is_null)
        || m.field("tool_calls")
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
        if m.field("content").is_some_and(Value::is_null) {
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

/// Checks one tool of `tools` (at `field`): a function with a non-empty name, its
/// `parameters` an object when given.
pub(crate) fn check_function(f: Option<&Value>, field: &str) -> Result<(), ApiError> {
    let Some(f) = f.and_then(Value::as_object) else {
        return Err(ApiError::invalid_field(field, "must be an object"));
    };
    match f.field("name") {
        Some(Value::String(n)) if !n.is_empty() => {}
        _ => {
            return Err(ApiError::invalid_field(
                &format!("{field}.name"),
                "must be a non-empty string",
            ));
        }
    }
    match f.field("parameters") {
        None | Some(Value::Null | Value::Object(_)) => {}
        Some(_) => {
            return Err(ApiError::invalid_field(
                &format!("{field}.parameters"),
                "must be a JSON schema object",
            ));
        }
    }
    if f.field("description")
        .is_some_and(|d| !d.is_string() && !d.is_null())
    {
        return Err(ApiError::invalid_field(
            &format!("{field}.description"),
            "must be a string",
        ));
    }
    Ok(())
}

/// The request's tools: `tools`, else the deprecated `functions` as tools of type
/// `function`; `None` when there are none. Every entry must be a named function tool.
pub(crate) fn request_tools(o: &Map<String, Value>) -> Result<Option<Cow<'_, Value>>, ApiError> {
    match (o.field("tools"), o.field("functions")) {
        (Some(t), _) if !t.is_null() => {
            let Some(list) = t.as_array() else {
                return Err(ApiError::invalid_field("tools", "must be an array"));
            };
            for (i, tool) in list.iter().enumerate() {
                match tool.field("type") {
                    Some(Value::String(k)) if k == "function" => {}
                    _ => {
                        return Err(ApiError::invalid_field(
                            &format!("tools[{i}].type"),
                            "must be \"function\" (the only tool type served)",
                        ));
                    }
                }
                check_function(tool.field("function"), &format!("tools[{i}].function"))?;
            }
            Ok(Some(Cow::Borrowed(t)))
        }
        (_, Some(Value::Array(fs))) => {
            for (i, f) in fs.iter().enumerate() {
                check_function(Some(f), &format!("functions[{i}]"))?;
            }
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
            t.apply_chat_template(&chat_input(&m, Some(&tools), &TemplateVars::default()))
                .is_err()
        );
        let fixed = template_messages(&m).unwrap();
        let text = t
            .apply_chat_template(&chat_input(&fixed, Some(&tools), &TemplateVars::default()))
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

    fn qwen3() -> Tokenizer {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../pdrouter-tokenizer/tests/fixtures/qwen3");
        Tokenizer::load(&dir, None).unwrap()
    }

    /// Qwen3's template reads string content only (a list renders as nothing): text parts
    /// are joined for it, as vLLM's server does. Tools reach it in the client's key order,
    /// as Python's json keeps them.
    #[test]
    fn text_parts_are_joined_for_string_templates_and_tools_keep_their_key_order() {
        let t = qwen3();
        let m = json!([{"role": "user", "content": [{"type": "text", "text": "a"},
            {"type": "text", "text": "b"}]}]);
        let p = ChatPrompt::new(&m, None, &TemplateVars::default()).unwrap();
        let text = t.apply_chat_template(p.for_template(&t)).unwrap();
        assert!(text.contains("<|im_start|>user\na\nb<|im_end|>"), "{text}");
        let audio = json!([{"role": "user", "content": [{"type": "input_audio"}]}]);
        let e = format!(
            "{:?}",
            ChatPrompt::new(&audio, None, &TemplateVars::default()).unwrap_err()
        );
        assert!(e.contains("input_audio"), "{e}");

        let tools: Value = serde_json::from_str(
            r#"[{"type": "function", "function": {"name": "f", "parameters": {"type": "object",
            "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}}}]"#,
        )
        .unwrap();
        let plain = json!([{"role": "user", "content": "hi"}]);
        let text = t
            .apply_chat_template(&chat_input(&plain, Some(&tools), &TemplateVars::default()))
            .unwrap();
        let expected = r#"{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"z": {"type": "string"}, "a": {"type": "integer"}}}}}"#;
        assert!(text.contains(expected), "{text}");
    }

    #[test]
    fn reasoning_effort_is_a_template_variable_and_none_turns_thinking_off() {
        let obj = |v: Value| match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        };
        let t = qwen3();
        let m = json!([{"role": "user", "content": "hi"}]);
        let render = |o: &Map<String, Value>| {
            let vars = template_vars(o).unwrap();
            t.apply_chat_template(&chat_input(&m, None, &vars)).unwrap()
        };
        let off = obj(json!({"reasoning_effort": "none"}));
        assert!(
            render(&off).ends_with("<think>\n\n</think>\n\n"),
            "{}",
            render(&off)
        );
        assert!(thinking_off(&off));
        // The client's own kwargs win.
        let on = obj(json!({"reasoning_effort": "none", "chat_template_kwargs":
            {"enable_thinking": true}}));
        assert!(render(&on).ends_with("assistant\n"), "{}", render(&on));
        assert!(!thinking_off(&on));
        // Setting one switch keeps the other unset: no template sees thinking both on and off.
        let on_vars = template_vars(&on).unwrap();
        assert!(!on_vars.kwargs.iter().any(|(k, _)| k == "thinking"));
        let high = obj(json!({"reasoning_effort": "high"}));
        assert!(!thinking_off(&high));
        let vars = template_vars(&high).unwrap();
        assert_eq!(vars.kwargs.len(), 1);
        assert_eq!(vars.kwargs[0].0, "reasoning_effort");
        assert!(template_vars(&obj(json!({"reasoning_effort": "max"}))).is_err());
        let bare = template_vars(&obj(json!({"add_generation_prompt": false}))).unwrap();
        let text = t.apply_chat_template(&chat_input(&m, None, &bare)).unwrap();
        assert!(!text.ends_with("assistant\n"), "{text}");
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
        let input = chat_input(&json!([]), Some(&json!([])), &TemplateVars::default());
        assert!(input.tools.is_none());
    }
}
