//! A chat request's `messages`, `tools` and `chat_template_kwargs` as the chat template's
//! input, the one way both prompt paths render a chat: text-only chats (`grpc::translate`)
//! and chats with images (`images`, after flattening a string-content template's parts).

use pdrouter_tokenizer::{ChatInput, TemplateValue};
use serde_json::Value;

/// Chat messages (with optional tools and template kwargs) for the template.
pub(crate) fn chat_input(
    messages: &Value,
    tools: Option<&Value>,
    kwargs: Option<&Value>,
) -> ChatInput {
    ChatInput {
        messages: TemplateValue::from_serialize(messages),
        tools: tools
            .filter(|t| !t.is_null())
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
