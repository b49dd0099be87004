//! Tool-call parsing: model text in, OpenAI `tool_calls` and the remaining content out.
//!
//! [`ToolKind`] names a model family's format; [`ToolKind::new_parser`] makes a streaming
//! [`ToolParser`] for one response, [`parse_all`] parses a whole output. Invariants, for every
//! format and any chunking of the same output:
//! - the deltas of [`ToolParser::push`]… then [`ToolParser::finish`], joined by
//!   [`ToolParse::from_deltas`], equal [`parse_all`] of the whole text;
//! - a call is emitted once its markup has closed and checked out, as `Call { index, name }`
//!   then one `Args { index, fragment }` holding the whole arguments (a call that turns out
//!   malformed or never closes must still be able to come out as text, so nothing of it is
//!   sent earlier); indices count from 0 over the calls emitted;
//! - `arguments` is a compact JSON object, keys in the model's order;
//! - only functions in the [`ToolSet`] are called; a call block that does not make a valid
//!   call to one of them (unknown name, malformed arguments, never closed) comes out as text,
//!   verbatim. Pure framing is consumed either way: the section markers of `deepseek`,
//!   `deepseek31`, `kimik2` and `step3`, Llama's `<|python_tag|>`; `harmony` drops analysis
//!   bodies (the reasoning parser reports them) and stray end tokens;
//! - text that could be the start of markup is held back until it is decided; whitespace
//!   directly before a call, and after the last one at the end, is dropped; other text
//!   passes through unchanged.
//!
//! The router should detokenize with the special tokens of [`ToolKind::trigger_tokens`]
//! kept, or the markup never reaches the parser. Run it on the reasoning parser's content.

mod bodies;
mod calls;
mod harmony;
mod json_formats;
mod pythonic;
mod stream;
mod tagged;
mod toolset;
mod xml;

pub use toolset::ToolSet;

use crate::names::{canonical, lookup, match_model};
use stream::Stream;
use tagged::Tagged;

/// A complete tool call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    /// The function, one of the request's.
    pub name: String,
    /// The arguments: compact JSON object text, keys in the order the model wrote them.
    pub arguments: String,
}

/// One piece of streamed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolDelta {
    /// Content text.
    Text(String),
    /// Call number `index` begins, to function `name`.
    Call { index: usize, name: String },
    /// A fragment of call `index`'s arguments; a call's fragments concatenate to its
    /// `arguments`.
    Args { index: usize, fragment: String },
}

/// A streaming parser for one response.
pub trait ToolParser: Send {
    /// Streaming: feed a piece of model text, get what can be emitted now.
    fn push(&mut self, text: &str) -> Vec<ToolDelta>;
    /// End of output: flush (text held back as a possible call that never completed is
    /// returned as `Text`).
    fn finish(&mut self) -> Vec<ToolDelta>;
}

/// A whole output parsed: the content left and the calls.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ToolParse {
    pub text: String,
    pub calls: Vec<ToolCall>,
}

impl ToolParse {
    /// Joins streamed deltas: texts concatenated, each call rebuilt from its `Call` and `Args`.
    pub fn from_deltas(deltas: impl IntoIterator<Item = ToolDelta>) -> Self {
        let mut parse = Self::default();
        for d in deltas {
            match d {
                ToolDelta::Text(t) => parse.text.push_str(&t),
                ToolDelta::Call { index, name } => {
                    if parse.calls.len() <= index {
                        parse.calls.resize_with(index + 1, || ToolCall {
                            name: String::new(),
                            arguments: String::new(),
                        });
                    }
                    parse.calls[index].name = name;
                }
                ToolDelta::Args { index, fragment } => {
                    if let Some(c) = parse.calls.get_mut(index) {
                        c.arguments.push_str(&fragment);
                    }
                }
            }
        }
        parse
    }
}

/// Parses a whole output (non-streaming); equal to the joined stream of the same text.
pub fn parse_all(kind: ToolKind, text: &str, tools: &ToolSet) -> ToolParse {
    let mut parser = kind.new_parser(tools);
    let mut deltas = parser.push(text);
    deltas.extend(parser.finish());
    ToolParse::from_deltas(deltas)
}

/// The id the model family itself uses for call `index`, when it has one: Kimi K2's
/// `functions.NAME:IDX`. `None` for the others (the router makes its own ids).
pub fn call_id(kind: ToolKind, name: &str, index: usize) -> Option<String> {
    (kind == ToolKind::KimiK2).then(|| format!("functions.{name}:{index}"))
}

/// A model family's tool-call format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolKind {
    /// The whole output is a call object or an array of them.
    Json,
    /// Qwen 2.5/3 and Hermes: `<tool_call>{json}</tool_call>`.
    Qwen,
    /// Qwen3-Coder: `<tool_call><function=NAME><parameter=P>…`.
    QwenXml,
    /// Llama 3.x: `{"name", "parameters"}` objects, `;`-separated, after `<|python_tag|>`.
    Llama,
    /// Llama 4: `[f(a=1), g()]`.
    Pythonic,
    /// Mistral: `[TOOL_CALLS]` and a JSON array, or `NAME[ARGS]{…}`.
    Mistral,
    /// DeepSeek V3.
    DeepSeek,
    /// DeepSeek V3.1.
    DeepSeek31,
    /// Kimi K2.
    KimiK2,
    /// GLM-4.5/4.6.
    Glm45Moe,
    /// GLM-4.7.
    Glm47Moe,
    /// MiniMax M2.
    MinimaxM2,
    /// Step3.
    Step3,
    /// gpt-oss Harmony.
    Harmony,
}

/// Canonical name, then aliases, per kind: SMG's `--tool-call-parser` names first, SGLang's
/// spellings after. Compared after [`normalize`].
const NAMES: [(ToolKind, &[&str]); 14] = [
    (ToolKind::Json, &["json"]),
    (ToolKind::Qwen, &["qwen", "qwen25", "hermes"]),
    (
        ToolKind::QwenXml,
        &["qwen_xml", "qwen_coder", "qwen3_coder"],
    ),
    (ToolKind::Llama, &["llama", "llama3"]),
    (ToolKind::Pythonic, &["pythonic", "llama4"]),
    (ToolKind::Mistral, &["mistral"]),
    (
        ToolKind::DeepSeek,
        &["deepseek", "deepseekv3", "deepseek_v3"],
    ),
    (
        ToolKind::DeepSeek31,
        &["deepseek31", "deepseekv31", "deepseek_v31"],
    ),
    (ToolKind::KimiK2, &["kimik2", "kimi_k2"]),
    (ToolKind::Glm45Moe, &["glm45_moe", "glm45", "glm"]),
    (ToolKind::Glm47Moe, &["glm47_moe", "glm47"]),
    (ToolKind::MinimaxM2, &["minimax_m2"]),
    (ToolKind::Step3, &["step3"]),
    (ToolKind::Harmony, &["harmony", "gpt_oss"]),
];

/// Model-name patterns (lowercase, `_` written `-`), matched as substrings of the normalized
/// model name; the longest matching pattern decides (the first listed on a tie). `None`: a family whose format is not
/// one of these (so a shorter pattern must not claim it).
const MODEL_PATTERNS: &[(&str, Option<ToolKind>)] = &[
    ("qwen", Some(ToolKind::Qwen)),
    ("qwq", Some(ToolKind::Qwen)),
    ("qwen3-coder", Some(ToolKind::QwenXml)),
    ("qwen3.5", Some(ToolKind::QwenXml)),
    ("qwen3.6", Some(ToolKind::QwenXml)),
    ("llama-3", Some(ToolKind::Llama)),
    ("llama3", Some(ToolKind::Llama)),
    ("llama-3.2", Some(ToolKind::Llama)),
    ("llama-4", Some(ToolKind::Pythonic)),
    ("llama4", Some(ToolKind::Pythonic)),
    ("mistral", Some(ToolKind::Mistral)),
    ("mixtral", Some(ToolKind::Mistral)),
    ("ministral", Some(ToolKind::Mistral)),
    ("devstral", Some(ToolKind::Mistral)),
    ("magistral", Some(ToolKind::Mistral)),
    ("deepseek-v3", Some(ToolKind::DeepSeek)),
    ("deepseek-r1", Some(ToolKind::DeepSeek)),
    ("deepseek-v3.1", Some(ToolKind::DeepSeek31)),
    ("deepseek-v3.2-exp", Some(ToolKind::DeepSeek31)),
    ("deepseek-v3.2", None),
    ("kimi-k2", Some(ToolKind::KimiK2)),
    ("glm-4.5", Some(ToolKind::Glm45Moe)),
    ("glm-4.6", Some(ToolKind::Glm45Moe)),
    ("glm45", Some(ToolKind::Glm45Moe)),
    ("glm-4.7", Some(ToolKind::Glm47Moe)),
    ("glm47", Some(ToolKind::Glm47Moe)),
    ("minimax", Some(ToolKind::MinimaxM2)),
    ("minimax-m2", Some(ToolKind::MinimaxM2)),
    ("step3", Some(ToolKind::Step3)),
    ("step-3", Some(ToolKind::Step3)),
    ("gpt-oss", Some(ToolKind::Harmony)),
];

impl ToolKind {
    /// Every kind.
    pub const ALL: [ToolKind; 14] = [
        ToolKind::Json,
        ToolKind::Qwen,
        ToolKind::QwenXml,
        ToolKind::Llama,
        ToolKind::Pythonic,
        ToolKind::Mistral,
        ToolKind::DeepSeek,
        ToolKind::DeepSeek31,
        ToolKind::KimiK2,
        ToolKind::Glm45Moe,
        ToolKind::Glm47Moe,
        ToolKind::MinimaxM2,
        ToolKind::Step3,
        ToolKind::Harmony,
    ];

    /// The canonical `--tool-call-parser` name.
    pub fn name(self) -> &'static str {
        canonical(&NAMES, self)
    }

    /// The kind a parser name (canonical or alias, any case, `-` or `_`) names.
    pub fn parse(name: &str) -> Option<Self> {
        lookup(&NAMES, name)
    }

    /// The format a served model uses, from its name (case-insensitive substring patterns,
    /// the longest match wins); `None` for a model not known here.
    pub fn for_model(model: &str) -> Option<Self> {
        match_model(model, MODEL_PATTERNS)
    }

    /// A streaming parser for one response offering `tools`.
    pub fn new_parser(self, tools: &ToolSet) -> Box<dyn ToolParser> {
        let tagged = |m| -> Box<dyn ToolParser> { Box::new(Stream::new(Tagged::new(m, tools))) };
        match self {
            ToolKind::Json => Box::new(Stream::new(json_formats::Json::new(tools))),
            ToolKind::Qwen => tagged(bodies::QWEN),
            ToolKind::QwenXml => tagged(xml::QWEN_XML),
            ToolKind::Llama => Box::new(Stream::new(json_formats::Llama::new(tools))),
            ToolKind::Pythonic => Box::new(Stream::new(pythonic::Pythonic::new(tools))),
            ToolKind::Mistral => Box::new(Stream::new(json_formats::Mistral::new(tools))),
            ToolKind::DeepSeek => tagged(bodies::DEEPSEEK_V3),
            ToolKind::DeepSeek31 => tagged(bodies::DEEPSEEK_V31),
            ToolKind::KimiK2 => tagged(bodies::KIMI_K2),
            ToolKind::Glm45Moe => tagged(xml::GLM45),
            ToolKind::Glm47Moe => tagged(xml::GLM47),
            ToolKind::MinimaxM2 => tagged(xml::MINIMAX_M2),
            ToolKind::Step3 => tagged(xml::STEP3),
            ToolKind::Harmony => Box::new(Stream::new(harmony::Harmony::new(tools))),
        }
    }

    /// The special-token markup the parser needs to see: detokenize with these kept.
    pub fn trigger_tokens(self) -> &'static [&'static str] {
        match self {
            ToolKind::Json => &[],
            ToolKind::Qwen | ToolKind::QwenXml => &["<tool_call>", "</tool_call>"],
            ToolKind::Llama => json_formats::LLAMA_TOKENS,
            ToolKind::Pythonic => pythonic::PYTHONIC_TOKENS,
            ToolKind::Mistral => json_formats::MISTRAL_TOKENS,
            ToolKind::DeepSeek | ToolKind::DeepSeek31 => bodies::DEEPSEEK_TOKENS,
            ToolKind::KimiK2 => bodies::KIMI_TOKENS,
            ToolKind::Glm45Moe | ToolKind::Glm47Moe => &[
                "<tool_call>",
                "</tool_call>",
                "<arg_key>",
                "</arg_key>",
                "<arg_value>",
                "</arg_value>",
            ],
            ToolKind::MinimaxM2 => &["<minimax:tool_call>", "</minimax:tool_call>"],
            ToolKind::Step3 => xml::STEP3_TOKENS,
            ToolKind::Harmony => crate::harmony::TOKENS,
        }
    }
}

impl std::fmt::Display for ToolKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
