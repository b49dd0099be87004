//! Every tool-call format on its fixtures (common::fixtures), each checked whole, cut at
//! every char boundary and char by char (common::check_tool); names of calls, ids, trigger
//! tokens.

mod common;

use common::fixtures::*;
use common::{check_tool, tools};
use pdrouter_parsers::*;

#[test]
fn qwen() {
    check_tool(ToolKind::Qwen, QWEN);
}

#[test]
fn qwen_xml() {
    check_tool(ToolKind::QwenXml, QWEN_XML);
}

#[test]
fn glm45_moe() {
    check_tool(ToolKind::Glm45Moe, GLM45);
}

#[test]
fn glm47_moe() {
    check_tool(ToolKind::Glm47Moe, GLM47);
}

#[test]
fn deepseek() {
    check_tool(ToolKind::DeepSeek, DEEPSEEK);
}

#[test]
fn deepseek31() {
    check_tool(ToolKind::DeepSeek31, DEEPSEEK31);
}

#[test]
fn kimik2() {
    check_tool(ToolKind::KimiK2, KIMI_K2);
}

#[test]
fn minimax_m2() {
    check_tool(ToolKind::MinimaxM2, MINIMAX_M2);
}

#[test]
fn step3() {
    check_tool(ToolKind::Step3, STEP3);
}

#[test]
fn llama() {
    check_tool(ToolKind::Llama, LLAMA);
}

#[test]
fn pythonic() {
    check_tool(ToolKind::Pythonic, PYTHONIC);
}

#[test]
fn mistral() {
    check_tool(ToolKind::Mistral, MISTRAL);
}

#[test]
fn json() {
    check_tool(ToolKind::Json, JSON);
}

#[test]
fn harmony() {
    check_tool(ToolKind::Harmony, HARMONY);
}

#[test]
fn every_kind_has_fixtures() {
    for kind in ToolKind::ALL {
        let fixtures = ALL.iter().find(|(k, _)| *k == kind).map(|(_, f)| *f);
        let fixtures = fixtures.unwrap_or_else(|| panic!("{kind} has no fixtures"));
        assert!(
            fixtures.iter().any(|f| f.calls.len() >= 2),
            "{kind}: two calls"
        );
        assert!(
            fixtures.iter().any(|f| f.calls.is_empty()),
            "{kind}: no call"
        );
    }
}

/// Text with no markup in it passes straight through, on the push that brought it.
#[test]
fn plain_text_is_not_delayed() {
    let tools = tools();
    for kind in ToolKind::ALL {
        let mut p = kind.new_parser(&tools);
        let got = p.push("Hello world");
        let text: String = got
            .into_iter()
            .map(|d| match d {
                ToolDelta::Text(t) => t,
                other => panic!("{kind}: {other:?}"),
            })
            .collect();
        assert_eq!(text, "Hello world", "{kind}");
        assert_eq!(p.finish(), [], "{kind}");
    }
}

#[test]
fn call_ids() {
    assert_eq!(
        call_id(ToolKind::KimiK2, "get_weather", 1).as_deref(),
        Some("functions.get_weather:1")
    );
    for kind in ToolKind::ALL.into_iter().filter(|k| *k != ToolKind::KimiK2) {
        assert_eq!(call_id(kind, "f", 0), None);
    }
}

#[test]
fn empty_tool_set_calls_nothing() {
    let none = ToolSet::default();
    for (kind, fixtures) in ALL {
        for f in *fixtures {
            let got = parse_all(*kind, f.text, &none);
            assert!(got.calls.is_empty(), "{kind} {:?}", f.name);
        }
    }
}

#[test]
fn trigger_tokens_cover_the_markup() {
    for kind in ToolKind::ALL {
        for token in kind.trigger_tokens() {
            assert!(!token.is_empty());
        }
    }
    assert!(
        ToolKind::DeepSeek
            .trigger_tokens()
            .contains(&"<｜tool▁sep｜>")
    );
    assert!(ToolKind::Harmony.trigger_tokens().contains(&"<|call|>"));
    assert!(ToolKind::Mistral.trigger_tokens().contains(&"[TOOL_CALLS]"));
}
