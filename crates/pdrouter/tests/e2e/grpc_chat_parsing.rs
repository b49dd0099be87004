//! gRPC chat answers parsed by the router, end to end: a mock that writes a model's reasoning
//! and tool-call markup, and the router turning it into `reasoning_content`, `tool_calls` and
//! `finish_reason: "tool_calls"`, whole and streamed (the streamed deltas joining to the whole
//! answer), in regular and PD mode; without tools the markup stays text.

use crate::support::*;
use pdrouter::config::{ChatParsers, Config};
use pdrouter_parsers::{ReasoningKind, ToolKind};
use serde_json::{Value, json};

pub(crate) const OUT: &str = "<think>The user wants the weather.</think>Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n</tool_call>";

pub(crate) const ARGS: &str = r#"{"city":"Paris","days":2}"#;

pub(crate) fn qwen(cfg: &mut Config) {
    cfg.chat_parsers = ChatParsers {
        tool: Some(ToolKind::Qwen),
        reasoning: Some(ReasoningKind::Qwen3),
    };
}

/// A mock of `role` writing `OUT` then EOS.
pub(crate) async fn writer(role: Role) -> MockWorker {
    grpc_mock(role, |c| {
        c.output_text = Some(OUT.to_owned());
        c.output_tokens = u32::try_from(OUT.len()).unwrap() + 1;
    })
    .await
}

fn chat(stream: bool, tools: bool) -> String {
    let mut body = json!({
        "messages": [{"role": "user", "content": "weather in Paris?"}],
        "stream": stream,
        "stream_options": {"include_usage": true},
    });
    if tools {
        body["tools"] = json!([{"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    }
    if !stream {
        body.as_object_mut().unwrap().remove("stream_options");
    }
    body.to_string()
}

fn assert_whole(v: &Value) {
    let choice = &v["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{v}");
    let m = &choice["message"];
    assert_eq!(m["reasoning_content"], "The user wants the weather.", "{v}");
    assert_eq!(m["content"], "Let me check.", "{v}");
    let call = &m["tool_calls"][0];
    assert_eq!(call["type"], "function");
    assert_eq!(call["function"]["name"], "get_weather");
    assert_eq!(call["function"]["arguments"], ARGS);
    let id = call["id"].as_str().unwrap();
    assert!(id.starts_with("call_") && id.len() == 29, "{id}");
    let details = &v["usage"]["completion_tokens_details"];
    assert!(details["reasoning_tokens"].as_u64().unwrap() > 0, "{v}");
}

/// A streamed call: name, id, arguments.
type Call = (String, String, String);

/// The streamed chunks joined: reasoning, content, the calls, the finish reason, and the
/// usage chunk.
fn joined(body: &str) -> (String, String, Vec<Call>, Value, Value) {
    let (mut reasoning, mut content, mut calls) = (String::new(), String::new(), Vec::new());
    let (mut finish, mut usage) = (Value::Null, Value::Null);
    for e in sse_events(body) {
        if !e["usage"].is_null() {
            usage = e["usage"].clone();
        }
        let Some(c) = e["choices"].get(0) else {
            continue;
        };
        let d = &c["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or_default());
        content.push_str(d["content"].as_str().unwrap_or_default());
        for t in d["tool_calls"].as_array().into_iter().flatten() {
            let i = t["index"].as_u64().unwrap() as usize;
            if calls.len() <= i {
                let name = t["function"]["name"].as_str().unwrap().to_owned();
                let id = t["id"].as_str().unwrap().to_owned();
                calls.push((name, id, String::new()));
            }
            calls[i]
                .2
                .push_str(t["function"]["arguments"].as_str().unwrap_or_default());
        }
        if !c["finish_reason"].is_null() {
            finish = c["finish_reason"].clone();
        }
    }
    (reasoning, content, calls, finish, usage)
}

#[tokio::test]
async fn regular_mode_answers_carry_reasoning_and_tool_calls() {
    let w = writer(Role::Regular).await;
    let mut cfg = regular_config(&[&w]);
    qwen(&mut cfg);
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", &chat(false, true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_whole(&reply.json());

    let reply = post(r.addr(), "/v1/chat/completions", &chat(true, true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let (reasoning, content, calls, finish, usage) = joined(&reply.text());
    assert_eq!(reasoning, "The user wants the weather.");
    assert_eq!(content, "Let me check.");
    assert_eq!(calls.len(), 1, "{}", reply.text());
    assert_eq!(calls[0].0, "get_weather");
    assert!(calls[0].1.starts_with("call_"));
    assert_eq!(calls[0].2, ARGS);
    assert_eq!(finish, "tool_calls");
    assert!(
        usage["completion_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(eventually(std::time::Duration::from_secs(10), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn without_tools_the_markup_stays_text_and_without_parsers_everything_does() {
    let w = writer(Role::Regular).await;
    let mut cfg = regular_config(&[&w]);
    qwen(&mut cfg);
    let r = router(cfg).await;
    let v = post(r.addr(), "/v1/chat/completions", &chat(false, false))
        .await
        .json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "The user wants the weather.");
    assert!(
        m["content"].as_str().unwrap().contains("<tool_call>"),
        "{v}"
    );
    assert!(m.get("tool_calls").is_none(), "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // No parser configured and a model name that suggests none: the text as generated.
    let plain = router(regular_config(&[&w])).await;
    let v = post(plain.addr(), "/v1/chat/completions", &chat(false, true))
        .await
        .json();
    let m = &v["choices"][0]["message"];
    assert_eq!(m["content"], OUT, "{v}");
    assert!(m.get("reasoning_content").is_none(), "{v}");
}

#[tokio::test]
async fn pd_answers_are_parsed_like_regular_ones() {
    let p = grpc_mock(Role::Prefill, |_| {}).await;
    let d = writer(Role::Decode).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.mode = pdrouter::config::Mode::PdGrpc;
    cfg.workers[0].bootstrap_port = Some(p.addr().port());
    cfg.admission = admission(64, 16, 30);
    qwen(&mut cfg);
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", &chat(false, true)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_whole(&reply.json());
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn response_format_becomes_the_output_constraint() {
    let w = grpc_mock(Role::Regular, |_| {}).await;
    let r = router(regular_config(&[&w])).await;
    let sent = |body: Value| {
        let addr = r.addr();
        async move {
            let reply = post(addr, "/v1/chat/completions", &body.to_string()).await;
            (reply.status, reply.text())
        }
    };
    let msgs = json!([{"role": "user", "content": "json please"}]);
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let (status, text) = sent(json!({"messages": msgs, "response_format":
        {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}))
    .await;
    assert_eq!(status, 200, "{text}");
    let sp = w.stats().last_request.unwrap()["sampling_params"].clone();
    let sent_schema: Value = serde_json::from_str(sp["json_schema"].as_str().unwrap()).unwrap();
    assert_eq!(sent_schema, schema);
    let (status, _) =
        sent(json!({"messages": msgs, "response_format": {"type": "json_object"}})).await;
    assert_eq!(status, 200);
    let sp = w.stats().last_request.unwrap()["sampling_params"].clone();
    assert_eq!(sp["json_schema"], r#"{"type":"object"}"#);
    let (status, _) = sent(json!({"messages": msgs, "response_format": {"type": "text"}})).await;
    assert_eq!(status, 200);
    assert!(
        w.stats().last_request.unwrap()["sampling_params"]
            .get("json_schema")
            .is_none()
    );
    for bad in [json!({"type": "json_schema"}), json!({"type": "yaml"})] {
        let (status, text) = sent(json!({"messages": msgs, "response_format": bad})).await;
        assert_eq!(status, 400, "{text}");
        assert!(text.contains("response_format"), "{text}");
    }
    let (status, text) = sent(json!({"messages": msgs, "regex": "a+",
        "response_format": {"type": "json_object"}}))
    .await;
    assert_eq!(status, 400, "{text}");
}

#[tokio::test]
async fn the_second_turn_of_a_tool_conversation_is_rendered() {
    let w = grpc_mock(Role::Regular, |_| {}).await;
    let r = router(regular_config(&[&w])).await;
    let body = json!({
        "messages": [
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1",
                "type": "function", "function": {"name": "get_weather",
                "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ],
        "tools": [{"type": "function", "function": {"name": "get_weather"}}],
    });
    let reply = post(r.addr(), "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let mut bad = body.clone();
    bad["messages"][1]["tool_calls"][0]["function"]["arguments"] = json!("not json");
    let reply = post(r.addr(), "/v1/chat/completions", &bad.to_string()).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply
            .text()
            .contains("messages[1].tool_calls[0].function.arguments")
    );
}

/// A mock writing `text` then EOS.
async fn writing(text: &str) -> MockWorker {
    let text = text.to_owned();
    grpc_mock(Role::Regular, move |c| {
        c.output_tokens = u32::try_from(text.len()).unwrap() + 1;
        c.output_text = Some(text);
    })
    .await
}

#[tokio::test]
async fn a_forced_call_is_constrained_and_read_as_json() {
    let calls = r#"[{"name": "get_weather", "parameters": {"city": "Paris"}}, {"name": "get_weather", "parameters": {"city": "Rome"}}]"#;
    let w = writing(calls).await;
    let mut cfg = regular_config(&[&w]);
    qwen(&mut cfg);
    let r = router(cfg).await;
    let mut body: Value = serde_json::from_str(&chat(false, true)).unwrap();
    body["tool_choice"] = json!("required");
    let reply = post(r.addr(), "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    let sp = w.stats().last_request.unwrap()["sampling_params"].clone();
    let schema: Value = serde_json::from_str(sp["json_schema"].as_str().unwrap()).unwrap();
    assert_eq!(schema["type"], "array", "{schema}");
    let tool_calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(tool_calls.len(), 2, "{v}");
    assert_eq!(tool_calls[1]["function"]["arguments"], r#"{"city":"Rome"}"#);
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");

    // One call at most: the schema says so and the parse keeps the first.
    body["parallel_tool_calls"] = json!(false);
    body["tool_choice"] = json!({"type": "function", "function": {"name": "get_weather"}});
    let v = post(r.addr(), "/v1/chat/completions", &body.to_string())
        .await
        .json();
    let sp = w.stats().last_request.unwrap()["sampling_params"].clone();
    let schema: Value = serde_json::from_str(sp["json_schema"].as_str().unwrap()).unwrap();
    assert_eq!(schema["maxItems"], 1, "{schema}");
    let tool_calls = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(tool_calls.len(), 1, "{v}");
    assert_eq!(
        tool_calls[0]["function"]["arguments"],
        r#"{"city":"Paris"}"#
    );

    // Streamed: the same one call.
    body["stream"] = json!(true);
    let reply = post(r.addr(), "/v1/chat/completions", &body.to_string()).await;
    let (_, _, calls, finish, _) = joined(&reply.text());
    assert_eq!(calls.len(), 1, "{}", reply.text());
    assert_eq!(calls[0].2, r#"{"city":"Paris"}"#);
    assert_eq!(finish, "tool_calls");

    for (bad, what) in [
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (
            json!({"tool_choice": "required", "response_format": {"type": "json_object"}}),
            "tool_choice",
        ),
        (json!({"parallel_tool_calls": "no"}), "parallel_tool_calls"),
    ] {
        let mut b: Value = serde_json::from_str(&chat(false, true)).unwrap();
        for (k, v) in bad.as_object().unwrap() {
            b[k] = v.clone();
        }
        let reply = post(r.addr(), "/v1/chat/completions", &b.to_string()).await;
        assert_eq!(reply.status, 400, "{}", reply.text());
        assert!(reply.text().contains(what), "{}", reply.text());
    }
    let mut b: Value = serde_json::from_str(&chat(false, false)).unwrap();
    b["tool_choice"] = json!("required");
    let reply = post(r.addr(), "/v1/chat/completions", &b.to_string()).await;
    assert_eq!(reply.status, 400, "no tools: {}", reply.text());
}

#[tokio::test]
async fn logit_bias_and_seed_reach_the_engines_that_take_them() {
    let body = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let sp = |w: &MockWorker| w.stats().last_request.unwrap()["sampling_params"].clone();
    // SGLang: the bias; its message has no seed (documented as not sent).
    let w = grpc_mock(Role::Regular, |_| {}).await;
    let r = router(regular_config(&[&w])).await;
    let reply = post(
        r.addr(),
        "/v1/chat/completions",
        &body(json!({"logit_bias": {"65": 5}, "seed": 3})),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(sp(&w)["logit_bias"], json!({"65": 5.0}));
    for bad in [
        json!({"logit_bias": {"a": 1}}),
        json!({"logit_bias": {"1": 500}}),
        json!({"logit_bias": [1]}),
    ] {
        let reply = post(r.addr(), "/v1/chat/completions", &body(bad)).await;
        assert_eq!(reply.status, 400, "{}", reply.text());
        assert!(reply.text().contains("logit_bias"));
    }
    let reply = post(r.addr(), "/v1/chat/completions", &body(json!({"seed": -1}))).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    // TokenSpeed: both.
    let t = grpc_mock(Role::Regular, |c| {
        c.grpc_runtime = pdrouter_mock::GrpcRuntime::TokenSpeed
    })
    .await;
    let r = router(regular_config(&[&t])).await;
    let reply = post(
        r.addr(),
        "/v1/completions",
        &json!({"prompt": "x", "seed": 42, "logit_bias": {"7": -2}}).to_string(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(sp(&t)["sampling_seed"], 42);
    assert_eq!(sp(&t)["logit_bias"], json!({"7": -2.0}));
    // vLLM: both, the seed within its int32.
    let v = grpc_mock(Role::Regular, |c| {
        c.grpc_runtime = pdrouter_mock::GrpcRuntime::Vllm
    })
    .await;
    let r = router(regular_config(&[&v])).await;
    let reply = post(
        r.addr(),
        "/v1/chat/completions",
        &body(json!({"seed": 42, "logit_bias": {"9": 1.5}})),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(sp(&v)["seed"], 42);
    assert_eq!(sp(&v)["logit_bias"], json!({"9": 1.5}));
    let reply = post(
        r.addr(),
        "/v1/chat/completions",
        &body(json!({"seed": 1u64 << 40})),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("seed"));
}

/// A chat body with `OUT`'s tool and `extra` fields.
fn with(extra: Value) -> String {
    let mut b: Value = serde_json::from_str(&chat(false, true)).unwrap();
    b["tools"]
        .as_array_mut()
        .unwrap()
        .push(json!({"type": "function", "function": {"name": "get_time"}}));
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

fn allowed(mode: &str, name: &str) -> Value {
    json!({"tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": mode,
        "tools": [{"type": "function", "function": {"name": name}}]}}})
}

#[tokio::test]
async fn allowed_tools_limit_what_is_parsed_and_what_is_forced() {
    let w = writer(Role::Regular).await;
    let mut cfg = regular_config(&[&w]);
    qwen(&mut cfg);
    let r = router(cfg).await;
    let sp = || w.stats().last_request.unwrap()["sampling_params"].clone();
    // Auto over the called function: parsed as usual, nothing constrained; every tool is in
    // the prompt.
    let v = post(
        r.addr(),
        "/v1/chat/completions",
        &with(allowed("auto", "get_weather")),
    )
    .await
    .json();
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls", "{v}");
    assert!(sp().get("json_schema").is_none());
    let prompt = w.stats().last_request.unwrap()["original_text"].clone();
    assert!(prompt.as_str().unwrap().contains("get_time"), "{prompt}");
    // Auto over another function: the model's call of get_weather is text.
    let v = post(
        r.addr(),
        "/v1/chat/completions",
        &with(allowed("auto", "get_time")),
    )
    .await
    .json();
    let m = &v["choices"][0]["message"];
    assert!(m.get("tool_calls").is_none(), "{v}");
    assert!(
        m["content"].as_str().unwrap().contains("get_weather"),
        "{v}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // Required: the allowed functions only, as the output's schema.
    let reply = post(
        r.addr(),
        "/v1/chat/completions",
        &with(allowed("required", "get_time")),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let schema: Value = serde_json::from_str(sp()["json_schema"].as_str().unwrap()).unwrap();
    assert_eq!(
        schema["items"]["anyOf"][0]["properties"]["name"]["enum"],
        json!(["get_time"])
    );
    assert_eq!(schema["items"]["anyOf"].as_array().unwrap().len(), 1);
    let reply = post(
        r.addr(),
        "/v1/chat/completions",
        &with(allowed("required", "nope")),
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("allowed_tools.tools[0]"));
}

#[tokio::test]
async fn reasoning_effort_none_turns_thinking_off_for_the_template_and_the_parser() {
    // A model that thinks from its first token unless told not to.
    let w = writing("Just the answer.").await;
    let mut cfg = regular_config(&[&w]);
    cfg.chat_parsers.reasoning = Some(ReasoningKind::Qwen3Thinking);
    let r = router(cfg).await;
    let body = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b.to_string()
    };
    let v = post(r.addr(), "/v1/chat/completions", &body(json!({})))
        .await
        .json();
    assert_eq!(
        v["choices"][0]["message"]["reasoning_content"], "Just the answer.",
        "{v}"
    );
    for off in [
        json!({"reasoning_effort": "none"}),
        json!({"chat_template_kwargs": {"enable_thinking": false}}),
    ] {
        let v = post(r.addr(), "/v1/chat/completions", &body(off.clone()))
            .await
            .json();
        let m = &v["choices"][0]["message"];
        assert_eq!(m["content"], "Just the answer.", "{off}: {v}");
        assert_eq!(m["reasoning_content"], Value::Null, "{off}: {v}");
    }
    let reply = post(
        r.addr(),
        "/v1/chat/completions",
        &body(json!({"reasoning_effort": "high"})),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    for (bad, names) in [
        (json!({"reasoning_effort": "extreme"}), "reasoning_effort"),
        (json!({"reasoning_effort": 3}), "reasoning_effort"),
        (json!({"chat_template_kwargs": [1]}), "chat_template_kwargs"),
    ] {
        let reply = post(r.addr(), "/v1/chat/completions", &body(bad)).await;
        assert_eq!(reply.status, 400, "{}", reply.text());
        assert!(reply.text().contains(names), "{}", reply.text());
    }
}

#[tokio::test]
async fn malformed_tool_arrays_are_refused_naming_the_entry() {
    let w = grpc_mock(Role::Regular, |_| {}).await;
    let r = router(regular_config(&[&w])).await;
    let msgs = json!([{"role": "user", "content": "hi"}]);
    for (tools, names) in [
        (json!([{"type": "function"}]), "tools[0].function"),
        (
            json!([{"type": "function", "function": {"name": "a"}}, {"function": {"name": "b"}}]),
            "tools[1].type",
        ),
        (
            json!([{"type": "code_interpreter", "function": {"name": "a"}}]),
            "tools[0].type",
        ),
        (
            json!([{"type": "function", "function": {"name": ""}}]),
            "tools[0].function.name",
        ),
        (
            json!([{"type": "function", "function": {"name": "a", "parameters": "{}"}}]),
            "tools[0].function.parameters",
        ),
        (json!(["get_weather"]), "tools[0].type"),
    ] {
        let body = json!({"messages": msgs, "tools": tools});
        let reply = post(r.addr(), "/v1/chat/completions", &body.to_string()).await;
        assert_eq!(reply.status, 400, "{tools}: {}", reply.text());
        assert!(reply.text().contains(names), "{tools}: {}", reply.text());
    }
    let body = json!({"messages": msgs, "functions": [{"description": "x"}]});
    let reply = post(r.addr(), "/v1/chat/completions", &body.to_string()).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply.text().contains("functions[0].name"),
        "{}",
        reply.text()
    );
    assert_eq!(w.stats().requests_total, 0, "nothing reached the engine");
}
