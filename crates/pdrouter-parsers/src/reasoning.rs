//! Reasoning parsing: model text split into `reasoning_content` and content.
//!
//! [`ReasoningKind`] names a model family's reasoning markup; [`ReasoningKind::new_parser`]
//! makes a streaming [`ReasoningParser`] for one response, [`split_all`] splits a whole
//! output. Invariants, for every kind and any chunking of the same output:
//! - the joined deltas of [`ReasoningParser::push`]… then [`ReasoningParser::finish`] equal
//!   [`split_all`] of the whole text;
//! - a marker cut across pieces is held back until decided, never emitted as text;
//! - think-style kinds: one reasoning block; its markers appear in neither field, so
//!   reasoning followed by content is the output without the markers. Without an end marker
//!   everything after the start is reasoning.
//! - Harmony: analysis bodies are reasoning; content is every other message's body, except
//!   that tool-call messages stay verbatim in the content for the Harmony tool parser (see
//!   [`ReasoningKind::Harmony`]).
//!
//! Whether the output starts inside the block is per request: the template may already have
//! opened it in the generation prompt (DeepSeek-R1, Qwen3 thinking models, MiniMax M2), or the
//! request may have turned thinking off. [`ReasoningKind::starts_in_reasoning_after`] decides
//! it from the rendered prompt.

mod harmony;
mod think;

use crate::names::{canonical, lookup, match_model};
use crate::scan;
use harmony::HarmonySplit;
use think::Think;

/// Reasoning and content text.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReasoningDelta {
    pub reasoning: String,
    pub content: String,
}

impl ReasoningDelta {
    /// Nothing in either field.
    pub fn is_empty(&self) -> bool {
        self.reasoning.is_empty() && self.content.is_empty()
    }

    /// Appends `other`'s fields to this one's.
    pub fn append(&mut self, other: ReasoningDelta) {
        self.reasoning.push_str(&other.reasoning);
        self.content.push_str(&other.content);
    }
}

/// A model family's reasoning markup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReasoningKind {
    /// `<think>…</think>`; the template opens the block.
    DeepSeekR1,
    /// `<think>…</think>` written by the model.
    Qwen3,
    /// Qwen3 thinking models: `<think>…</think>`, the template opens the block.
    Qwen3Thinking,
    /// Kimi: `◁think▷…◁/think▷` written by the model.
    Kimi,
    /// Kimi K2 Thinking: `<think>…</think>`, output starts in the block.
    KimiThinking,
    /// GLM-4.5 and later: `<think>…</think>` written by the model.
    Glm45,
    /// Step3: `<think>…</think>`, output starts in the block.
    Step3,
    /// MiniMax M2: `<think>…</think>`, the template opens the block.
    Minimax,
    /// DeepSeek V3.1 thinking mode: `<think>…</think>` written by the model (or by the
    /// template when thinking is on: see [`ReasoningKind::starts_in_reasoning_after`]).
    DeepSeekV31,
    /// gpt-oss Harmony channels: analysis is reasoning; final and preamble bodies are content;
    /// tool-call messages (`to=…`) are left in the content verbatim, so the router runs the
    /// Harmony tool parser on the content.
    Harmony,
}

const THINK: (&str, &str) = ("<think>", "</think>");
const KIMI: (&str, &str) = ("◁think▷", "◁/think▷");

/// Canonical name (SMG's `--reasoning-parser`), then aliases; compared normalized.
const NAMES: [(ReasoningKind, &[&str]); 10] = [
    (ReasoningKind::DeepSeekR1, &["deepseek_r1"]),
    (ReasoningKind::Qwen3, &["qwen3"]),
    (ReasoningKind::Qwen3Thinking, &["qwen3_thinking"]),
    (ReasoningKind::Kimi, &["kimi"]),
    (ReasoningKind::KimiThinking, &["kimi_thinking"]),
    (ReasoningKind::Glm45, &["glm45"]),
    (ReasoningKind::Step3, &["step3"]),
    (ReasoningKind::Minimax, &["minimax"]),
    (ReasoningKind::DeepSeekV31, &["deepseek_v31", "deepseek_v3"]),
    (ReasoningKind::Harmony, &["harmony", "gpt_oss"]),
];

/// Model-name patterns (lowercase, `_` written `-`), the longest substring match decides.
const MODEL_PATTERNS: &[(&str, Option<ReasoningKind>)] = &[
    ("deepseek-r1", Some(ReasoningKind::DeepSeekR1)),
    ("deepseek-v3.1", Some(ReasoningKind::DeepSeekV31)),
    ("deepseek-v3-1", Some(ReasoningKind::DeepSeekV31)),
    ("qwen", Some(ReasoningKind::Qwen3)),
    ("qwen3", Some(ReasoningKind::Qwen3)),
    ("qwen3-thinking", Some(ReasoningKind::Qwen3Thinking)),
    ("qwen-thinking", Some(ReasoningKind::Qwen3Thinking)),
    ("a22b-thinking", Some(ReasoningKind::Qwen3Thinking)),
    ("a3b-thinking", Some(ReasoningKind::Qwen3Thinking)),
    ("qwq", Some(ReasoningKind::Qwen3Thinking)),
    ("qwq-32b", Some(ReasoningKind::Qwen3Thinking)),
    ("kimi", Some(ReasoningKind::Kimi)),
    ("kimi-k2-thinking", Some(ReasoningKind::KimiThinking)),
    ("glm45", Some(ReasoningKind::Glm45)),
    ("glm47", Some(ReasoningKind::Glm45)),
    ("glm-4.5", Some(ReasoningKind::Glm45)),
    ("glm-4.6", Some(ReasoningKind::Glm45)),
    ("glm-4.7", Some(ReasoningKind::Glm45)),
    ("glm-5", Some(ReasoningKind::Glm45)),
    ("step3", Some(ReasoningKind::Step3)),
    ("step-3", Some(ReasoningKind::Step3)),
    ("minimax", Some(ReasoningKind::Minimax)),
    ("mm-m2", Some(ReasoningKind::Minimax)),
    ("gpt-oss", Some(ReasoningKind::Harmony)),
];

impl ReasoningKind {
    /// Every kind.
    pub const ALL: [ReasoningKind; 10] = [
        ReasoningKind::DeepSeekR1,
        ReasoningKind::Qwen3,
        ReasoningKind::Qwen3Thinking,
        ReasoningKind::Kimi,
        ReasoningKind::KimiThinking,
        ReasoningKind::Glm45,
        ReasoningKind::Step3,
        ReasoningKind::Minimax,
        ReasoningKind::DeepSeekV31,
        ReasoningKind::Harmony,
    ];

    /// The canonical `--reasoning-parser` name.
    pub fn name(self) -> &'static str {
        canonical(&NAMES, self)
    }

    /// The kind a parser name (canonical or alias, any case, `-` or `_`) names.
    pub fn parse(name: &str) -> Option<Self> {
        lookup(&NAMES, name)
    }

    /// The reasoning markup a served model uses, from its name (case-insensitive substring
    /// patterns, the longest match wins); `None` for a model not known here.
    pub fn for_model(model: &str) -> Option<Self> {
        match_model(model, MODEL_PATTERNS)
    }

    /// The start and end markers of the block; `None` for Harmony, whose reasoning is a
    /// channel.
    pub fn markers(self) -> Option<(&'static str, &'static str)> {
        match self {
            ReasoningKind::Kimi => Some(KIMI),
            ReasoningKind::Harmony => None,
            _ => Some(THINK),
        }
    }

    /// Does output start inside the reasoning block with the family's usual template?
    pub fn starts_in_reasoning_by_default(self) -> bool {
        matches!(
            self,
            ReasoningKind::DeepSeekR1
                | ReasoningKind::Qwen3Thinking
                | ReasoningKind::KimiThinking
                | ReasoningKind::Step3
                | ReasoningKind::Minimax
        )
    }

    /// Does output start inside the block after this rendered `prompt`? Yes when the prompt
    /// ends (trailing whitespace aside) with the start marker (Harmony: with an open
    /// analysis message), no when it ends with the end marker (thinking turned off by an
    /// empty block), else the family's default.
    pub fn starts_in_reasoning_after(self, prompt: &str) -> bool {
        self.prompt_opens_reasoning(prompt) || {
            let p = prompt.trim_end();
            !self.markers().is_some_and(|(_, end)| p.ends_with(end))
                && self.starts_in_reasoning_by_default()
        }
    }

    /// Whether `prompt` itself opens the reasoning block: it ends (trailing whitespace aside)
    /// with the start marker, or Harmony's open analysis message. A request that turned
    /// thinking off starts inside the block only then.
    pub fn prompt_opens_reasoning(self, prompt: &str) -> bool {
        let p = prompt.trim_end();
        match self.markers() {
            Some((start, _)) => p.ends_with(start),
            None => p.ends_with("<|channel|>analysis<|message|>"),
        }
    }

    /// A streaming parser for one response; `starts_in_reasoning` says whether the output
    /// begins inside the block (see [`ReasoningKind::starts_in_reasoning_after`]).
    pub fn new_parser(self, starts_in_reasoning: bool) -> ReasoningParser {
        let machine = match self.markers() {
            Some((start, end)) => Machine::Think(Think::new(start, end, starts_in_reasoning)),
            None => Machine::Harmony(HarmonySplit::new(starts_in_reasoning)),
        };
        ReasoningParser {
            machine,
            buf: String::new(),
        }
    }
}

impl std::fmt::Display for ReasoningKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A streaming reasoning splitter for one response.
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    machine: Machine,
    buf: String,
}

#[derive(Debug, Clone)]
enum Machine {
    Think(Think),
    Harmony(HarmonySplit),
}

impl ReasoningParser {
    /// Feeds a piece of model text; returns what can be emitted now.
    pub fn push(&mut self, text: &str) -> ReasoningDelta {
        self.buf.push_str(text);
        self.run(false)
    }

    /// End of output: flushes what was held back (a partial marker is text of the section
    /// it was in).
    pub fn finish(&mut self) -> ReasoningDelta {
        let mut out = self.run(true);
        if let Machine::Harmony(h) = &mut self.machine {
            h.finish(&mut out);
        }
        out
    }

    fn run(&mut self, eof: bool) -> ReasoningDelta {
        let mut out = ReasoningDelta::default();
        let machine = &mut self.machine;
        let leftover = scan::drive(&mut self.buf, eof, |buf, eof| match machine {
            Machine::Think(t) => t.step(buf, eof, &mut out),
            Machine::Harmony(h) => h.step(buf, eof, &mut out),
        });
        if let Some(rest) = leftover {
            let in_reasoning = match &self.machine {
                Machine::Think(t) => t.in_reasoning(),
                Machine::Harmony(h) => h.in_reasoning(),
            };
            if in_reasoning {
                out.reasoning.push_str(&rest);
            } else {
                out.content.push_str(&rest);
            }
        }
        out
    }
}

/// Splits a whole output; equal to the joined stream of the same text.
pub fn split_all(kind: ReasoningKind, starts_in_reasoning: bool, text: &str) -> ReasoningDelta {
    let mut parser = kind.new_parser(starts_in_reasoning);
    let mut out = parser.push(text);
    out.append(parser.finish());
    out
}
