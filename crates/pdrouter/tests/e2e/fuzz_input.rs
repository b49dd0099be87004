//! Seeded fuzzing of request bodies and headers: whatever a client sends, the router answers
//! with a status that is not 500, in the documented error shape when it is an error, and nothing
//! leaks. Over HTTP PD with generic bodies; over gRPC workers (regular, with the tool and
//! reasoning parsers) and EPD with the fields the router itself translates there: messages and
//! content parts, images, tool arrays and choices, schemas, template variables, token ids,
//! unicode edge cases.

use std::time::Duration;

use crate::support::*;
use rand::{RngExt, SeedableRng};
use serde_json::{Map, Value, json};

const KEYS: [&str; 14] = [
    "messages",
    "prompt",
    "text",
    "input_ids",
    "input",
    "n",
    "stream",
    "model",
    "sampling_params",
    "max_tokens",
    "bootstrap_room",
    "bootstrap_host",
    "content",
    "role",
];

fn value(rng: &mut rand::rngs::StdRng, depth: u32) -> Value {
    match rng.random_range(0..if depth == 0 { 5 } else { 8 }) {
        0 => Value::Null,
        1 => Value::Bool(rng.random_bool(0.5)),
        2 => json!(rng.random_range(-3i64..5)),
        3 => json!(rng.random::<f64>() * 1e6),
        4 => Value::String(
            ["", "hi", "user", "x".repeat(50).as_str(), "\u{1F600}"][rng.random_range(0..5)]
                .to_string(),
        ),
        5 | 6 => Value::Array(
            (0..rng.random_range(0..4))
                .map(|_| value(rng, depth - 1))
                .collect(),
        ),
        _ => object(rng, depth - 1),
    }
}

fn object(rng: &mut rand::rngs::StdRng, depth: u32) -> Value {
    let mut m = Map::new();
    for _ in 0..rng.random_range(0..5) {
        m.insert(
            KEYS[rng.random_range(0..KEYS.len())].to_string(),
            value(rng, depth),
        );
    }
    Value::Object(m)
}

#[tokio::test]
async fn no_client_input_gets_a_500() {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.max_payload_size = 64 * 1024;
    let r = router(cfg).await;
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let paths = [
        "/generate",
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/workers",
    ];
    let mut seen = std::collections::BTreeMap::new();
    for i in 0..400 {
        let body = match i % 4 {
            0 => (0..rng.random_range(0..64))
                .map(|_| rng.random::<u8>())
                .collect::<Vec<u8>>(),
            _ => serde_json::to_vec(&object(&mut rng, 3)).unwrap(),
        };
        let target = rng.random_range(0..4).to_string();
        let headers: Vec<(&str, &str)> = match i % 5 {
            0 => vec![("x-smg-target-worker", target.as_str())],
            1 => vec![("x-smg-routing-key", "k"), ("x-request-id", "fuzz")],
            _ => vec![],
        };
        let path = paths[i % paths.len()];
        let reply = send(r.addr(), "POST", path, body, &headers).await;
        assert_ne!(reply.status, 500, "{path}: {}", reply.text());
        if reply.status >= 400 {
            reply.error_code();
        }
        *seen.entry(reply.status).or_insert(0) += 1;
    }
    // The fuzzing reached both the rejections and the happy path.
    assert!(
        seen.contains_key(&200) && seen.contains_key(&400),
        "{seen:?}"
    );
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", CHAT).await.status,
        200
    );
}

/// Text that templates, tokenizers and parsers find awkward.
fn odd_text(rng: &mut rand::rngs::StdRng) -> Value {
    const STRANGE: [&str; 9] = [
        "",
        "\u{0}",
        "\u{feff}",
        "\u{1F600}\u{200d}",
        "<|im_end|>",
        "<tool_call>",
        "e\u{301}",
        "\u{10FFFF}",
        "a\nb",
    ];
    Value::String(STRANGE[rng.random_range(0..STRANGE.len())].to_owned())
}

/// Values of the fields the gRPC translation reads, malformed as often as not.
fn grpc_value(rng: &mut rand::rngs::StdRng, key: &str) -> Value {
    let good_tool = json!({"type": "function", "function": {"name": "f",
        "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}});
    let pick = rng.random_range(0..6);
    if pick == 0 {
        return value(rng, 2);
    }
    match key {
        "messages" => {
            let part = match rng.random_range(0..5) {
                0 => json!({"type": "text", "text": odd_text(rng)}),
                1 => {
                    json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBOR"}})
                }
                2 => json!({"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}}),
                3 => json!({"type": "input_audio"}),
                _ => value(rng, 1),
            };
            let content = match rng.random_range(0..4) {
                0 => odd_text(rng),
                1 => json!([part]),
                2 => Value::Null,
                _ => json!(7),
            };
            let role = ["user", "assistant", "system", "tool", "", "x"][rng.random_range(0..6)];
            let mut m = json!({"role": role, "content": content});
            if rng.random_bool(0.3) {
                m["tool_calls"] = json!([{"id": "c", "type": "function", "function":
                    {"name": "f", "arguments": (["{}", "not json", "[1]"][rng.random_range(0..3)])}}]);
            }
            json!([m])
        }
        "tools" => match pick {
            1 => json!([good_tool]),
            2 => json!([{"type": "function", "function": {"name": odd_text(rng)}}]),
            3 => json!([{"type": "web_search"}, good_tool]),
            _ => json!([{"type": "function", "function": {"name": "f", "parameters": "x"}}]),
        },
        "tool_choice" => match pick {
            1 => json!("required"),
            2 => json!({"type": "function", "function": {"name": "f"}}),
            3 => json!({"type": "allowed_tools", "allowed_tools": {"mode": "required",
                "tools": [{"type": "function", "function": {"name": "f"}}]}}),
            _ => {
                json!({"type": "allowed_tools", "allowed_tools": {"mode": odd_text(rng), "tools": []}})
            }
        },
        "response_format" => match pick {
            1 => json!({"type": "json_object"}),
            2 => {
                json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}})
            }
            _ => json!({"type": "json_schema", "json_schema": {"schema": odd_text(rng)}}),
        },
        "input_ids" => [
            json!([0, u32::MAX]),
            json!([u64::MAX]),
            json!([-1]),
            json!([1, 2, 3]),
        ][rng.random_range(0..4)]
        .clone(),
        "logit_bias" => json!({"1": 200, "x": 1, "18446744073709551616": 1}),
        "seed" => [json!(-1), json!(1u64 << 40), json!(3)][rng.random_range(0..3)].clone(),
        "reasoning_effort" => json!(["none", "high", "max", ""][rng.random_range(0..4)]),
        "chat_template_kwargs" => json!({"enable_thinking": (rng.random_bool(0.5)),
            "x": odd_text(rng)}),
        "stop" => json!([odd_text(rng), odd_text(rng)]),
        "max_tokens" | "n" | "top_logprobs" => json!(rng.random_range(-2i64..40)),
        "logprobs" | "stream" | "parallel_tool_calls" => json!(rng.random_bool(0.5)),
        _ => odd_text(rng),
    }
}

const GRPC_KEYS: [&str; 19] = [
    "messages",
    "tools",
    "tool_choice",
    "response_format",
    "input_ids",
    "logit_bias",
    "seed",
    "reasoning_effort",
    "chat_template_kwargs",
    "stop",
    "max_tokens",
    "n",
    "top_logprobs",
    "logprobs",
    "stream",
    "parallel_tool_calls",
    "prompt",
    "text",
    "input",
];

/// Sends seeded gRPC-shaped bodies to `r`; every answer is not a 500 and carries the error
/// shape when it is an error; returns the statuses seen.
async fn fuzz_grpc(r: &pdrouter::RouterHandle, seed: u64, rounds: usize) -> Vec<u16> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let paths = [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/responses",
        "/generate",
    ];
    let mut seen = Vec::new();
    for i in 0..rounds {
        let mut body = Map::new();
        body.insert(
            "messages".into(),
            json!([{"role": "user", "content": "hi"}]),
        );
        body.insert("max_tokens".into(), json!(2));
        for _ in 0..rng.random_range(1..5) {
            let key = GRPC_KEYS[rng.random_range(0..GRPC_KEYS.len())];
            body.insert(key.into(), grpc_value(&mut rng, key));
        }
        let path = paths[i % paths.len()];
        let reply = post(r.addr(), path, &Value::Object(body.clone()).to_string()).await;
        assert_ne!(reply.status, 500, "{path} {body:?}: {}", reply.text());
        if reply.status >= 400 {
            reply.error_code();
        }
        seen.push(reply.status);
    }
    seen
}

#[tokio::test]
async fn no_grpc_or_epd_input_gets_a_500() {
    let w = grpc_mock(Role::Regular, |_| {}).await;
    let mut cfg = regular_config(&[&w]);
    cfg.chat_parsers = pdrouter::config::ChatParsers {
        tool: Some(pdrouter_parsers::ToolKind::Qwen),
        reasoning: Some(pdrouter_parsers::ReasoningKind::Qwen3),
    };
    let r = router(cfg).await;
    let seen = fuzz_grpc(&r, 7, 300).await;
    assert!(seen.contains(&200) && seen.contains(&400), "{seen:?}");
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);

    let crate::grpc_epd_images::Epd(es, p, d, cfg, _model) =
        crate::grpc_epd_images::epd(1, |_| {}).await;
    let r = router(cfg).await;
    let seen = fuzz_grpc(&r, 11, 200).await;
    assert!(seen.contains(&400), "{seen:?}");
    assert!(eventually(Duration::from_secs(5), || total_load(&r) == 0).await);
    drop((es, p, d));
}
