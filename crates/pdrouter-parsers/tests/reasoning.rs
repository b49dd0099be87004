//! Reasoning fixtures per kind: block present or not, no end marker (all reasoning), partial
//! markers that never complete, output starting inside the block or not; each checked whole,
//! cut at every char boundary, char by char and under random chunking. Then the pipeline the
//! router runs: reasoning first, the tool parser on the content.

mod common;

use common::{boundaries, chars, cut_at, tools};
use pdrouter_parsers::*;
use proptest::prelude::*;

#[derive(Debug, Clone, Copy)]
struct Case {
    kind: ReasoningKind,
    in_reasoning: bool,
    text: &'static str,
    reasoning: &'static str,
    content: &'static str,
}

const fn case(
    kind: ReasoningKind,
    in_reasoning: bool,
    text: &'static str,
    reasoning: &'static str,
    content: &'static str,
) -> Case {
    Case {
        kind,
        in_reasoning,
        text,
        reasoning,
        content,
    }
}

use ReasoningKind as K;

const CASES: &[Case] = &[
    // Qwen3: the model writes the block itself.
    case(
        K::Qwen3,
        false,
        "<think>\nStep 1.\n</think>\n\nAnswer.",
        "\nStep 1.\n",
        "\n\nAnswer.",
    ),
    case(K::Qwen3, false, "Just an answer.", "", "Just an answer."),
    case(
        K::Qwen3,
        false,
        "<think>thinking forever",
        "thinking forever",
        "",
    ),
    case(K::Qwen3, false, "a <thin", "", "a <thin"),
    case(K::Qwen3, false, "<think>x </thi", "x </thi", ""),
    case(K::Qwen3, false, "pre<think>r</think>c", "r", "prec"),
    case(
        K::Qwen3,
        false,
        "<think>a</think>b<think>c</think>",
        "a",
        "b<think>c</think>",
    ),
    case(K::Qwen3, false, "<think></think>", "", ""),
    // Started inside the block by the router (a template that opened it).
    case(
        K::Qwen3,
        true,
        "mid-thought</think>done",
        "mid-thought",
        "done",
    ),
    // DeepSeek-R1: the template opens the block; the model may repeat the start marker.
    case(
        K::DeepSeekR1,
        true,
        "reasoning here</think>answer",
        "reasoning here",
        "answer",
    ),
    case(K::DeepSeekR1, true, "<think>r</think>a", "r", "a"),
    case(
        K::DeepSeekR1,
        true,
        "<thinking is fun",
        "<thinking is fun",
        "",
    ),
    case(K::DeepSeekR1, true, "<thi", "<thi", ""),
    case(K::DeepSeekR1, false, "no think tags", "", "no think tags"),
    case(
        K::Qwen3Thinking,
        true,
        "Let me think…</think>42",
        "Let me think…",
        "42",
    ),
    case(K::Kimi, false, "◁think▷deep◁/think▷done", "deep", "done"),
    case(K::Kimi, false, "◁thi", "", "◁thi"),
    case(K::KimiThinking, true, "hmm</think>ok", "hmm", "ok"),
    case(
        K::Glm45,
        false,
        "<think>plan</think>\nresult",
        "plan",
        "\nresult",
    ),
    case(K::Step3, true, "a</think>b", "a", "b"),
    case(
        K::Minimax,
        true,
        "thinking about it</think>\n\nHello",
        "thinking about it",
        "\n\nHello",
    ),
    case(K::DeepSeekV31, false, "<think>v31</think>out", "v31", "out"),
    // Harmony: analysis is reasoning, final is content, calls stay verbatim in the content.
    case(
        K::Harmony,
        false,
        "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>",
        "Think.",
        "Hi!",
    ),
    case(
        K::Harmony,
        false,
        "<|channel|>analysis<|message|>Need tool.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"SF\"}<|call|>",
        "Need tool.",
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\":\"SF\"}<|call|>",
    ),
    case(
        K::Harmony,
        true,
        "more thinking<|end|><|start|>assistant<|channel|>final<|message|>ok",
        "more thinking",
        "ok",
    ),
    case(
        K::Harmony,
        false,
        "<|channel|>analysis<|message|>cut off",
        "cut off",
        "",
    ),
    case(
        K::Harmony,
        false,
        "<|channel|>analys",
        "",
        "<|channel|>analys",
    ),
    case(
        K::Harmony,
        false,
        "<|channel|>commentary to=functions.get_time<|message|>{}<|start|>assistant<|channel|>final<|message|>x",
        "",
        "<|channel|>commentary to=functions.get_time<|message|>{}<|end|>x",
    ),
];

fn run<'a>(c: &Case, pieces: impl IntoIterator<Item = &'a str>) -> ReasoningDelta {
    let mut p = c.kind.new_parser(c.in_reasoning);
    let mut out = ReasoningDelta::default();
    for piece in pieces {
        out.append(p.push(piece));
    }
    out.append(p.finish());
    out
}

fn want(c: &Case) -> ReasoningDelta {
    ReasoningDelta {
        reasoning: c.reasoning.to_string(),
        content: c.content.to_string(),
    }
}

#[test]
fn whole_cut_and_char_by_char() {
    for c in CASES {
        assert_eq!(split_all(c.kind, c.in_reasoning, c.text), want(c), "{c:?}");
        for cut in boundaries(c.text) {
            let got = run(c, [&c.text[..cut], &c.text[cut..]]);
            assert_eq!(got, want(c), "{c:?} cut at {cut}");
        }
        assert_eq!(run(c, chars(c.text)), want(c), "{c:?} char by char");
    }
}

#[test]
fn every_kind_is_covered() {
    for kind in ReasoningKind::ALL {
        assert!(CASES.iter().any(|c| c.kind == kind), "{kind}");
    }
}

#[test]
fn partial_marker_is_held_back() {
    let mut p = ReasoningKind::Qwen3.new_parser(false);
    assert_eq!(
        p.push("Hi <th"),
        ReasoningDelta {
            reasoning: String::new(),
            content: "Hi ".into()
        }
    );
    assert_eq!(
        p.push("ink>deep"),
        ReasoningDelta {
            reasoning: "deep".into(),
            content: String::new()
        }
    );
    assert_eq!(p.push(" </thi").reasoning, " ");
    let end = p.push("nk>answer");
    assert_eq!(
        (end.reasoning.as_str(), end.content.as_str()),
        ("", "answer")
    );
    assert!(p.finish().is_empty());
}

#[test]
fn defaults_and_prompts() {
    let starts: Vec<_> = ReasoningKind::ALL
        .into_iter()
        .filter(|k| k.starts_in_reasoning_by_default())
        .collect();
    assert_eq!(
        starts,
        [
            K::DeepSeekR1,
            K::Qwen3Thinking,
            K::KimiThinking,
            K::Step3,
            K::Minimax
        ]
    );
    assert!(K::Qwen3.starts_in_reasoning_after("<|im_start|>assistant\n<think>\n"));
    assert!(!K::DeepSeekR1.starts_in_reasoning_after("<｜Assistant｜><think>\n\n</think>\n\n"));
    assert!(K::DeepSeekR1.starts_in_reasoning_after("<｜Assistant｜>"));
    assert!(!K::Glm45.starts_in_reasoning_after("<|assistant|>"));
    assert!(K::Kimi.starts_in_reasoning_after("…◁think▷"));
    assert!(
        K::Harmony.starts_in_reasoning_after("<|start|>assistant<|channel|>analysis<|message|>")
    );
    assert!(!K::Harmony.starts_in_reasoning_after("<|start|>assistant"));
    assert_eq!(K::Kimi.markers(), Some(("◁think▷", "◁/think▷")));
    assert_eq!(K::Harmony.markers(), None);
}

/// Reasoning first, then the tool parser on the content, as the router runs them.
#[test]
fn reasoning_then_tools() {
    let tools = tools();
    let pipelines: &[(ReasoningKind, bool, ToolKind, &str, &str, &str, usize)] = &[
        (
            K::Qwen3,
            false,
            ToolKind::Qwen,
            "<think>Weather needed.</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}\n</tool_call>",
            "Weather needed.",
            "",
            1,
        ),
        (
            K::DeepSeekR1,
            true,
            ToolKind::DeepSeek,
            "Check time.</think>Sure.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            "Check time.",
            "Sure.",
            1,
        ),
        (
            K::Harmony,
            false,
            ToolKind::Harmony,
            "<|channel|>analysis<|message|>Two lookups.<|end|><|start|>assistant<|channel|>commentary<|message|>One moment.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Oslo\"}<|call|><|start|>assistant<|channel|>analysis<|message|>And time.<|end|><|start|>assistant to=functions.get_time<|channel|>commentary json<|message|>{}",
            "Two lookups.And time.",
            "One moment.",
            2,
        ),
    ];
    for &(rk, start, tk, text, reasoning, content, calls) in pipelines {
        let split = split_all(rk, start, text);
        assert_eq!(split.reasoning, reasoning, "{rk}");
        let parsed = parse_all(tk, &split.content, &tools);
        assert_eq!(parsed.text, content, "{rk}/{tk}");
        assert_eq!(parsed.calls.len(), calls, "{rk}/{tk}");
        // Streamed through both, cut everywhere, the result is the same.
        for cut in boundaries(text) {
            let mut r = rk.new_parser(start);
            let mut t = tk.new_parser(&tools);
            let mut deltas = Vec::new();
            let mut got_reasoning = String::new();
            for piece in [&text[..cut], &text[cut..]] {
                let d = r.push(piece);
                got_reasoning.push_str(&d.reasoning);
                deltas.extend(t.push(&d.content));
            }
            let d = r.finish();
            got_reasoning.push_str(&d.reasoning);
            deltas.extend(t.push(&d.content));
            deltas.extend(t.finish());
            assert_eq!(got_reasoning, reasoning, "{rk} cut {cut}");
            assert_eq!(
                ToolParse::from_deltas(deltas),
                parsed,
                "{rk}/{tk} cut {cut}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_chunking(which in 0usize..1000, cuts in proptest::collection::vec(0usize..512, 0..10)) {
        let c = &CASES[which % CASES.len()];
        let pieces = cut_at(c.text, &cuts);
        prop_assert_eq!(run(c, pieces.iter().map(String::as_str)), want(c), "{:?} {:?}", c, pieces);
    }
}

const ALPHABET: &[&str] = &[
    "<think>",
    "</think>",
    "◁think▷",
    "◁/think▷",
    "<thi",
    "</th",
    "<",
    "/",
    ">",
    "◁",
    "▷",
    "<|start|>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|call|>",
    "<|return|>",
    "<|constrain|>",
    "assistant",
    "analysis",
    "final",
    "commentary",
    " to=functions.f",
    "json",
    "{}",
    "x",
    " ",
    "\n",
    "é",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Any output, any chunking: the same split as the whole output.
    #[test]
    fn any_output_any_chunking(
        kind in 0usize..ReasoningKind::ALL.len(),
        in_reasoning: bool,
        tokens in proptest::collection::vec(0usize..ALPHABET.len(), 0..40),
        cuts in proptest::collection::vec(0usize..1024, 0..12),
    ) {
        let kind = ReasoningKind::ALL[kind];
        let text: String = tokens.iter().map(|&t| ALPHABET[t]).collect();
        let c = Case { kind, in_reasoning, text: "", reasoning: "", content: "" };
        let whole = split_all(kind, in_reasoning, &text);
        let pieces = cut_at(&text, &cuts);
        prop_assert_eq!(run(&c, pieces.iter().map(String::as_str)), whole.clone(), "{} {:?}", kind, pieces);
        prop_assert_eq!(run(&c, chars(&text)), whole, "{} char by char", kind);
    }
}
