//! Parser names (SMG's canonical names, SGLang's spellings as aliases) and the model-name
//! patterns, longest match winning.

use pdrouter_parsers::*;

#[test]
fn tool_names_round_trip() {
    for kind in ToolKind::ALL {
        assert_eq!(ToolKind::parse(kind.name()), Some(kind), "{kind}");
        assert_eq!(ToolKind::parse(&kind.name().to_uppercase()), Some(kind));
        assert_eq!(kind.to_string(), kind.name());
    }
    let names: Vec<_> = ToolKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(
        names,
        [
            "json",
            "qwen",
            "qwen_xml",
            "llama",
            "pythonic",
            "mistral",
            "deepseek",
            "deepseek31",
            "kimik2",
            "glm45_moe",
            "glm47_moe",
            "minimax_m2",
            "step3",
            "harmony"
        ]
    );
}

#[test]
fn tool_aliases() {
    let aliases = [
        ("qwen25", ToolKind::Qwen),
        ("hermes", ToolKind::Qwen),
        ("qwen_coder", ToolKind::QwenXml),
        ("qwen3_coder", ToolKind::QwenXml),
        ("llama3", ToolKind::Llama),
        ("llama4", ToolKind::Pythonic),
        ("deepseekv3", ToolKind::DeepSeek),
        ("deepseekv31", ToolKind::DeepSeek31),
        ("kimi_k2", ToolKind::KimiK2),
        ("glm45", ToolKind::Glm45Moe),
        ("glm", ToolKind::Glm45Moe),
        ("glm47", ToolKind::Glm47Moe),
        ("minimax-m2", ToolKind::MinimaxM2),
        ("gpt-oss", ToolKind::Harmony),
        ("gpt_oss", ToolKind::Harmony),
        (" Qwen-XML ", ToolKind::QwenXml),
    ];
    for (name, kind) in aliases {
        assert_eq!(ToolKind::parse(name), Some(kind), "{name}");
    }
    for unknown in ["", "qwen2", "deepseekv32", "passthrough", "cohere", "glm4"] {
        assert_eq!(ToolKind::parse(unknown), None, "{unknown}");
    }
}

#[test]
fn tool_for_model() {
    let models = [
        ("Qwen/Qwen3-8B", Some(ToolKind::Qwen)),
        ("qwen3", Some(ToolKind::Qwen)),
        ("Qwen/Qwen2.5-7B-Instruct", Some(ToolKind::Qwen)),
        (
            "Qwen/Qwen3-Coder-480B-A35B-Instruct",
            Some(ToolKind::QwenXml),
        ),
        ("qwen3-coder", Some(ToolKind::QwenXml)),
        ("deepseek-ai/DeepSeek-V3-0324", Some(ToolKind::DeepSeek)),
        ("deepseek-v3", Some(ToolKind::DeepSeek)),
        (
            "deepseek-ai/DeepSeek-V3.1-Terminus",
            Some(ToolKind::DeepSeek31),
        ),
        ("deepseek-v3.1", Some(ToolKind::DeepSeek31)),
        ("deepseek-ai/DeepSeek-V3.2-Exp", Some(ToolKind::DeepSeek31)),
        ("deepseek-ai/DeepSeek-V3.2", None),
        ("meta-llama/Llama-3.2-3B-Instruct", Some(ToolKind::Llama)),
        ("meta-llama/Llama-3.1-8B-Instruct", Some(ToolKind::Llama)),
        ("llama-3", Some(ToolKind::Llama)),
        (
            "meta-llama/Llama-4-Scout-17B-16E-Instruct",
            Some(ToolKind::Pythonic),
        ),
        (
            "mistralai/Mistral-7B-Instruct-v0.3",
            Some(ToolKind::Mistral),
        ),
        (
            "mistralai/Ministral-8B-Instruct-2410",
            Some(ToolKind::Mistral),
        ),
        ("moonshotai/Kimi-K2-Instruct", Some(ToolKind::KimiK2)),
        ("kimi_k2", Some(ToolKind::KimiK2)),
        ("zai-org/GLM-4.5-Air", Some(ToolKind::Glm45Moe)),
        ("zai-org/GLM-4.6", Some(ToolKind::Glm45Moe)),
        ("zai-org/GLM-4.7", Some(ToolKind::Glm47Moe)),
        ("MiniMaxAI/MiniMax-M2", Some(ToolKind::MinimaxM2)),
        ("stepfun-ai/step3", Some(ToolKind::Step3)),
        ("openai/gpt-oss-120b", Some(ToolKind::Harmony)),
        ("my-finetune", None),
        ("", None),
    ];
    for (model, kind) in models {
        assert_eq!(ToolKind::for_model(model), kind, "{model}");
    }
}

#[test]
fn reasoning_names_round_trip() {
    for kind in ReasoningKind::ALL {
        assert_eq!(ReasoningKind::parse(kind.name()), Some(kind), "{kind}");
    }
    let names: Vec<_> = ReasoningKind::ALL.iter().map(|k| k.name()).collect();
    assert_eq!(
        names,
        [
            "deepseek_r1",
            "qwen3",
            "qwen3_thinking",
            "kimi",
            "kimi_thinking",
            "glm45",
            "step3",
            "minimax",
            "deepseek_v31",
            "harmony"
        ]
    );
    let aliases = [
        ("deepseek-r1", ReasoningKind::DeepSeekR1),
        ("qwen3-thinking", ReasoningKind::Qwen3Thinking),
        ("deepseek-v3", ReasoningKind::DeepSeekV31),
        ("gpt-oss", ReasoningKind::Harmony),
        ("GPT_OSS", ReasoningKind::Harmony),
    ];
    for (name, kind) in aliases {
        assert_eq!(ReasoningKind::parse(name), Some(kind), "{name}");
    }
    for unknown in ["", "think", "passthrough", "qwen"] {
        assert_eq!(ReasoningKind::parse(unknown), None, "{unknown}");
    }
}

#[test]
fn reasoning_for_model() {
    use ReasoningKind as K;
    let models = [
        ("deepseek-ai/DeepSeek-R1-0528", Some(K::DeepSeekR1)),
        ("deepseek-ai/DeepSeek-V3.1", Some(K::DeepSeekV31)),
        ("Qwen/Qwen3-8B", Some(K::Qwen3)),
        ("Qwen/Qwen3-235B-A22B-Thinking-2507", Some(K::Qwen3Thinking)),
        ("Qwen/Qwen3-30B-A3B-Thinking-2507", Some(K::Qwen3Thinking)),
        ("qwen3-thinking", Some(K::Qwen3Thinking)),
        ("Qwen/QwQ-32B", Some(K::Qwen3Thinking)),
        ("moonshotai/Kimi-K2-Instruct", Some(K::Kimi)),
        ("moonshotai/Kimi-K2-Thinking", Some(K::KimiThinking)),
        ("zai-org/GLM-4.5", Some(K::Glm45)),
        ("zai-org/GLM-4.7", Some(K::Glm45)),
        ("stepfun-ai/step3", Some(K::Step3)),
        ("MiniMaxAI/MiniMax-M2", Some(K::Minimax)),
        ("openai/gpt-oss-20b", Some(K::Harmony)),
        ("meta-llama/Llama-3.1-8B", None),
    ];
    for (model, kind) in models {
        assert_eq!(ReasoningKind::for_model(model), kind, "{model}");
    }
}
