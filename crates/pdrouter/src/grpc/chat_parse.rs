//! A chat answer's text as an OpenAI-compatible server returns it: the reasoning split off into
//! `reasoning_content` and the model's tool-call markup turned into `tool_calls`, whole or
//! streamed, with the parsers of `pdrouter_parsers`.
//!
//! Which parsers run is decided once per request ([`ChatParsing::new`]): the configured
//! `--tool-call-parser` / `--reasoning-parser`, else the ones the model's name suggests, else
//! none. A tool parser runs only when the request offers tools and `tool_choice` is not
//! `"none"`; a forced call (`"required"`, a named function) is read with the bare-JSON parser,
//! its output being constrained to that JSON (`super::tool_choice`); `parallel_tool_calls:
//! false` keeps at most the first call. A reasoning parser runs unless `separate_reasoning`
//! is false. The reasoning parser
//! starts inside the reasoning when the rendered prompt opened it (and outside when the
//! template closed it, thinking turned off), else as the model family usually does.
//!
//! Invariants: reasoning never reaches the tool parser; the streamed deltas of a choice join to
//! what the whole-text parse of that choice gives (the parsers guarantee it for any chunking);
//! a tool parser whose trigger tokens are special tokens of the tokenizer has them kept in the
//! decoded text (so it can see them), and whatever of them the parser did not consume is
//! removed from what the client sees.

use pdrouter_parsers::{
    ReasoningKind, ReasoningParser, ToolCall, ToolDelta, ToolKind, ToolParser, ToolSet,
};
use pdrouter_tokenizer::Tokenizer;
use serde_json::{Map, Value};

use super::tool_choice::{self, Choice};
use crate::config::ChatParsers;
use crate::error::ApiError;

/// What the client's chat body asks of the answer's parsing.
#[derive(Debug, Clone)]
pub(crate) struct ChatAsk {
    /// The functions offered (`tools`), when tool calls are to be parsed.
    tools: Option<ToolSet>,
    /// `separate_reasoning` (default true).
    separate_reasoning: bool,
    /// `tool_choice`.
    choice: Choice,
    /// `parallel_tool_calls` (default true).
    parallel: bool,
    /// Thinking turned off (`reasoning_effort: "none"`, `enable_thinking`/`thinking` false).
    thinking_off: bool,
}

/// Boolean field `k` of `o`, true when absent.
fn flag_or_true(o: &Map<String, Value>, k: &str) -> Result<bool, ApiError> {
    match o.get(k) {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(ApiError::invalid_field(k, "must be a boolean")),
    }
}

impl ChatAsk {
    /// Reads `tool_choice` (or the deprecated `function_call`) and `separate_reasoning` from a
    /// chat body whose tools are `tools`.
    pub(crate) fn of(o: &Map<String, Value>, tools: Option<&Value>) -> Result<Self, ApiError> {
        let choice = tool_choice::choice(o, tools)?;
        let parallel = flag_or_true(o, "parallel_tool_calls")?;
        let none = choice == Choice::None;
        let tools = tools.map(|t| {
            let mut set = ToolSet::from_openai_tools(t);
            // Calls of other functions are text: the parser knows only the allowed ones.
            if matches!(choice, Choice::Allowed { .. } | Choice::Named(_)) {
                set.retain(|name| choice.allows(name));
            }
            set
        });
        let separate_reasoning = flag_or_true(o, "separate_reasoning")?;
        Ok(ChatAsk {
            tools: tools.filter(|t| !t.is_empty() && !none),
            separate_reasoning,
            choice,
            parallel,
            thinking_off: crate::chat_template::thinking_off(o),
        })
    }

    /// The output constraint a forced call needs (the JSON schema of the allowed calls).
    pub(crate) fn constraint(&self, tools: Option<&Value>) -> Option<String> {
        tool_choice::forced_schema(&self.choice, tools?, self.parallel)
    }

    /// Whether the answer must be a call (its output constrained to the calls' JSON).
    fn forced(&self) -> bool {
        self.choice.forced()
    }
}

/// How one request's chat answers are parsed.
#[derive(Debug, Clone)]
pub struct ChatParsing {
    tools: ToolSet,
    tool: Option<ToolKind>,
    reasoning: Option<ReasoningKind>,
    starts_in_reasoning: bool,
    /// Trigger tokens kept in the decoded text for the tool parser, removed from the client's.
    strip: &'static [&'static str],
    /// `parallel_tool_calls: false`: at most one call.
    max_calls: Option<usize>,
}

impl ChatParsing {
    /// The parsing of a request asking `ask`, for model `model` (a name or path), whose
    /// rendered prompt is `prompt`; `None` when no parser runs.
    pub(crate) fn new(
        ask: ChatAsk,
        parsers: ChatParsers,
        model: &str,
        prompt: &str,
        tokenizer: &Tokenizer,
    ) -> Option<Self> {
        // A forced call's output is constrained to the calls' JSON, read as such.
        let tool = ask.tools.as_ref().and_then(|_| match ask.forced() {
            true => Some(ToolKind::Json),
            false => parsers.tool.or_else(|| ToolKind::for_model(model)),
        });
        let reasoning = ask
            .separate_reasoning
            .then(|| {
                parsers
                    .reasoning
                    .or_else(|| ReasoningKind::for_model(model))
            })
            .flatten();
        if tool.is_none() && reasoning.is_none() {
            return None;
        }
        let strip = tool.map_or(&[][..], |k| {
            let special = k.trigger_tokens().iter().any(|t| {
                tokenizer
                    .token_to_id(t)
                    .is_some_and(|id| tokenizer.is_special(id))
            });
            if special { k.trigger_tokens() } else { &[] }
        });
        let starts_in_reasoning = reasoning.is_some_and(|r| match ask.thinking_off {
            true => r.prompt_opens_reasoning(prompt),
            false => r.starts_in_reasoning_after(prompt),
        });
        Some(ChatParsing {
            tools: ask.tools.unwrap_or_default(),
            tool,
            reasoning,
            starts_in_reasoning,
            strip,
            max_calls: (!ask.parallel).then_some(1),
        })
    }

    /// Whether the decoded text must keep special tokens (the tool parser's triggers are).
    pub(crate) fn keeps_special_tokens(&self) -> bool {
        !self.strip.is_empty()
    }

    /// Whether answers carry `reasoning_content`.
    pub(crate) fn reasons(&self) -> bool {
        self.reasoning.is_some()
    }

    fn clean(&self, mut text: String) -> String {
        for t in self.strip {
            if text.contains(t) {
                text = text.replace(t, "");
            }
        }
        text
    }

    /// A whole choice's text, parsed.
    pub fn parse_whole(&self, text: &str) -> Parsed {
        let (reasoning, content) = match self.reasoning {
            Some(k) => {
                let d = pdrouter_parsers::split_all(k, self.starts_in_reasoning, text);
                (d.reasoning, d.content)
            }
            None => (String::new(), text.to_owned()),
        };
        let (content, calls) = match self.tool {
            Some(k) => {
                let p = pdrouter_parsers::parse_all(k, &content, &self.tools);
                (p.text, p.calls)
            }
            None => (content, Vec::new()),
        };
        Parsed {
            reasoning: self.clean(reasoning),
            content: self.clean(content),
            calls: calls
                .into_iter()
                .take(self.max_calls.unwrap_or(usize::MAX))
                .enumerate()
                .map(|(i, c)| (self.call_id(&c.name, i), c))
                .collect(),
        }
    }

    /// The id of the `index`-th call of a choice: the family's own where it has one (Kimi's
    /// `functions.NAME:N`), else `call_` and 24 random hex digits.
    fn call_id(&self, name: &str, index: usize) -> String {
        self.tool
            .and_then(|k| pdrouter_parsers::call_id(k, name, index))
            .unwrap_or_else(|| format!("call_{:024x}", rand::random::<u128>() >> 32))
    }

    /// The streaming state of one choice.
    pub fn choice(&self) -> ChoiceParser {
        ChoiceParser {
            reasoning: self
                .reasoning
                .map(|k| k.new_parser(self.starts_in_reasoning)),
            tool: self.tool.map(|k| k.new_parser(&self.tools)),
            calls: 0,
            reasoning_text: String::new(),
        }
    }
}

/// A whole choice's text, parsed: each call with its id.
#[derive(Debug, Default)]
pub struct Parsed {
    pub reasoning: String,
    pub content: String,
    pub calls: Vec<(String, ToolCall)>,
}

/// What one piece of a streamed choice adds, in order.
#[derive(Debug, PartialEq)]
pub enum ChatDelta {
    Reasoning(String),
    Content(String),
    /// A call starts: its position among the choice's calls, id and function.
    Call {
        index: usize,
        id: String,
        name: String,
    },
    /// A piece of the call's arguments.
    Args {
        index: usize,
        fragment: String,
    },
}

/// One streamed choice's parsers.
pub struct ChoiceParser {
    reasoning: Option<ReasoningParser>,
    tool: Option<Box<dyn ToolParser>>,
    /// Calls started so far.
    calls: usize,
    /// The reasoning so far (for its token count in the usage).
    reasoning_text: String,
}

impl std::fmt::Debug for ChoiceParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChoiceParser")
            .field("calls", &self.calls)
            .finish()
    }
}

impl ChoiceParser {
    /// What `text`, the next piece of the choice, adds (`end`: the choice ended after it).
    pub fn push(&mut self, p: &ChatParsing, text: &str, end: bool) -> Vec<ChatDelta> {
        let mut out = Vec::new();
        let (reasoning, mut content) = match self.reasoning.as_mut() {
            Some(r) => {
                let mut d = r.push(text);
                if end {
                    d.append(r.finish());
                }
                (d.reasoning, d.content)
            }
            None => (String::new(), text.to_owned()),
        };
        let reasoning = p.clean(reasoning);
        if !reasoning.is_empty() {
            self.reasoning_text.push_str(&reasoning);
            out.push(ChatDelta::Reasoning(reasoning));
        }
        match self.tool.as_mut() {
            Some(t) => {
                let mut deltas = t.push(&content);
                if end {
                    deltas.extend(t.finish());
                }
                let max = p.max_calls.unwrap_or(usize::MAX);
                for d in deltas {
                    if let ToolDelta::Call { index, .. } | ToolDelta::Args { index, .. } = &d
                        && *index >= max
                    {
                        continue;
                    }
                    out.push(match d {
                        ToolDelta::Text(s) => ChatDelta::Content(p.clean(s)),
                        ToolDelta::Call { index, name } => {
                            self.calls = self.calls.max(index + 1);
                            ChatDelta::Call {
                                index,
                                id: p.call_id(&name, index),
                                name,
                            }
                        }
                        ToolDelta::Args { index, fragment } => ChatDelta::Args { index, fragment },
                    });
                }
            }
            None => {
                content = p.clean(content);
                out.push(ChatDelta::Content(content));
            }
        }
        out.retain(
            |d| !matches!(d, ChatDelta::Content(s) | ChatDelta::Reasoning(s) if s.is_empty()),
        );
        out
    }

    /// Whether the choice has called a function.
    pub fn called(&self) -> bool {
        self.calls > 0
    }

    /// The reasoning streamed so far.
    pub fn reasoning(&self) -> &str {
        &self.reasoning_text
    }
}

#[cfg(test)]
mod tests;
