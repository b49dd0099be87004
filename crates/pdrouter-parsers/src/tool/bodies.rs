//! Block formats whose arguments are JSON: Qwen/Hermes, DeepSeek V3 and V3.1, Kimi K2.
//!
//! - `qwen`: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`, one call a block.
//! - `deepseek` (V3): inside `<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>`, blocks
//!   `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n```json\n{…}\n```<｜tool▁call▁end｜>`.
//! - `deepseek31` (V3.1): the same section, blocks
//!   `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{…}<｜tool▁call▁end｜>`.
//! - `kimik2`: inside `<|tool_calls_section_begin|>…<|tool_calls_section_end|>`, blocks
//!   `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{…}<|tool_call_end|>`.
//!
//! (The DeepSeek markers use U+FF5C FULLWIDTH VERTICAL LINE and U+2581 LOWER ONE EIGHTH BLOCK.)

use super::ToolSet;
use super::calls::{call_from_object, named_call};
use super::tagged::Markup;

pub(crate) const QWEN: Markup = Markup {
    section: None,
    begin: "<tool_call>",
    end: "</tool_call>",
    body: qwen,
};

const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";

/// The DeepSeek special tokens, for detokenizing with them kept.
pub(crate) const DEEPSEEK_TOKENS: &[&str] = &[
    DS_CALLS_BEGIN,
    DS_CALLS_END,
    DS_CALL_BEGIN,
    DS_CALL_END,
    DS_SEP,
];

pub(crate) const DEEPSEEK_V3: Markup = Markup {
    section: Some((DS_CALLS_BEGIN, DS_CALLS_END)),
    begin: DS_CALL_BEGIN,
    end: DS_CALL_END,
    body: deepseek_v3,
};

pub(crate) const DEEPSEEK_V31: Markup = Markup {
    section: Some((DS_CALLS_BEGIN, DS_CALLS_END)),
    begin: DS_CALL_BEGIN,
    end: DS_CALL_END,
    body: deepseek_v31,
};

const KIMI_SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const KIMI_SECTION_END: &str = "<|tool_calls_section_end|>";
const KIMI_CALL_BEGIN: &str = "<|tool_call_begin|>";
const KIMI_CALL_END: &str = "<|tool_call_end|>";
const KIMI_ARGS: &str = "<|tool_call_argument_begin|>";

/// The Kimi K2 special tokens.
pub(crate) const KIMI_TOKENS: &[&str] = &[
    KIMI_SECTION_BEGIN,
    KIMI_SECTION_END,
    KIMI_CALL_BEGIN,
    KIMI_CALL_END,
    KIMI_ARGS,
];

pub(crate) const KIMI_K2: Markup = Markup {
    section: Some((KIMI_SECTION_BEGIN, KIMI_SECTION_END)),
    begin: KIMI_CALL_BEGIN,
    end: KIMI_CALL_END,
    body: kimi_k2,
};

fn qwen(body: &str, tools: &ToolSet) -> Option<Vec<(String, String)>> {
    call_from_object(body.trim(), tools).map(|c| vec![c])
}

fn deepseek_v3(body: &str, tools: &ToolSet) -> Option<Vec<(String, String)>> {
    let (kind, rest) = body.split_once(DS_SEP)?;
    if kind.trim() != "function" {
        return None;
    }
    let (name, args) = rest.split_once('\n')?;
    let args = args.trim();
    let args = args
        .strip_prefix("```json")
        .or_else(|| args.strip_prefix("```"))
        .map_or(args, |a| a.strip_suffix("```").unwrap_or(a));
    named_call(name, args, tools).map(|c| vec![c])
}

fn deepseek_v31(body: &str, tools: &ToolSet) -> Option<Vec<(String, String)>> {
    let (name, args) = body.split_once(DS_SEP)?;
    named_call(name, args, tools).map(|c| vec![c])
}

fn kimi_k2(body: &str, tools: &ToolSet) -> Option<Vec<(String, String)>> {
    let (id, args) = body.split_once(KIMI_ARGS)?;
    named_call(kimi_name(id)?, args, tools).map(|c| vec![c])
}

/// The function name in a Kimi call id `functions.NAME:IDX`.
fn kimi_name(id: &str) -> Option<&str> {
    let id = id.trim();
    let id = id.strip_prefix("functions.").unwrap_or(id);
    let name = match id.rsplit_once(':') {
        Some((name, idx)) if idx.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => id,
    };
    (!name.is_empty()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kimi_names() {
        assert_eq!(kimi_name(" functions.get_weather:0 "), Some("get_weather"));
        assert_eq!(kimi_name("search:12"), Some("search"));
        assert_eq!(kimi_name("functions.a:b"), Some("a:b"));
        assert_eq!(kimi_name("functions.:1"), None);
    }
}
