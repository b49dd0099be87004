//! `/v1/responses` with function tools over gRPC workers: the model's reasoning, text and
//! tool-call markup become `reasoning`, `message` and `function_call` output items, whole and
//! streamed (the streamed items equal to the final response's); `function_call` and
//! `function_call_output` input items carry a tool conversation's second turn to the template.

use serde_json::{Value, json};

use crate::grpc_chat_parsing::{ARGS, qwen, writer};
use crate::support::*;

fn body(stream: bool, extra: Value) -> String {
    let mut b = json!({
        "input": "weather in Paris?",
        "stream": stream,
        "tools": [{"type": "function", "name": "get_weather", "description": "Weather.",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    });
    for (k, v) in extra.as_object().unwrap() {
        b[k] = v.clone();
    }
    b.to_string()
}

/// The Responses stream's events (`event:` and `data:` lines).
fn events(text: &str) -> Vec<Value> {
    text.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn assert_items(output: &Value) {
    let items = output.as_array().unwrap();
    assert_eq!(items.len(), 3, "{output}");
    assert_eq!(items[0]["type"], "reasoning");
    assert_eq!(
        items[0]["content"][0]["text"],
        "The user wants the weather."
    );
    assert_eq!(items[1]["type"], "message");
    assert_eq!(items[1]["content"][0]["text"], "Let me check.");
    let call = &items[2];
    assert_eq!(call["type"], "function_call");
    assert_eq!(call["name"], "get_weather");
    assert_eq!(call["arguments"], ARGS);
    assert_eq!(call["status"], "completed");
    assert!(
        call["call_id"].as_str().unwrap().starts_with("call_"),
        "{call}"
    );
    assert!(call["id"].as_str().unwrap().starts_with("fc_"), "{call}");
}

#[tokio::test]
async fn tool_calls_and_reasoning_are_output_items_whole_and_streamed() {
    let w = writer(Role::Regular).await;
    let mut cfg = regular_config(&[&w]);
    qwen(&mut cfg);
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/responses", &body(false, json!({}))).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_items(&v["output"]);
    assert!(
        v["usage"]["output_tokens_details"]["reasoning_tokens"]
            .as_u64()
            .unwrap()
            > 0
    );
    let prompt = w.stats().last_request.unwrap()["original_text"].clone();
    assert!(prompt.as_str().unwrap().contains("get_weather"), "{prompt}");

    let reply = post(r.addr(), "/v1/responses", &body(true, json!({}))).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let evs = events(&reply.text());
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e["sequence_number"], i, "{e}");
    }
    let joined = |kind: &str| -> String {
        evs.iter()
            .filter(|e| e["type"] == kind)
            .map(|e| e["delta"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(
        joined("response.reasoning_text.delta"),
        "The user wants the weather."
    );
    assert_eq!(joined("response.output_text.delta"), "Let me check.");
    assert_eq!(joined("response.function_call_arguments.delta"), ARGS);
    let done: Vec<Value> = evs
        .iter()
        .filter(|e| e["type"] == "response.output_item.done")
        .map(|e| e["item"].clone())
        .collect();
    let last = evs.last().unwrap();
    assert_eq!(last["type"], "response.completed", "{last}");
    assert_items(&last["response"]["output"]);
    assert_eq!(Value::Array(done), last["response"]["output"]);
    // Each item is opened, fed and closed before the next opens.
    let kinds: Vec<&str> = evs.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let added: Vec<usize> = (0..kinds.len())
        .filter(|&i| kinds[i] == "response.output_item.added")
        .collect();
    let closed: Vec<usize> = (0..kinds.len())
        .filter(|&i| kinds[i] == "response.output_item.done")
        .collect();
    assert_eq!(added.len(), 3, "{kinds:?}");
    for k in 0..3 {
        assert!(added[k] < closed[k], "{kinds:?}");
        if k + 1 < 3 {
            assert!(closed[k] < added[k + 1], "{kinds:?}");
        }
    }
    assert!(eventually(std::time::Duration::from_secs(10), || total_load(&r) == 0).await);
}

#[tokio::test]
async fn tool_choice_and_a_second_turn_reach_the_engine() {
    let w = writer(Role::Regular).await;
    let mut cfg = regular_config(&[&w]);
    qwen(&mut cfg);
    let r = router(cfg).await;
    let sp = || w.stats().last_request.unwrap()["sampling_params"].clone();
    let forced = json!({"tool_choice": {"type": "function", "name": "get_weather"}});
    let reply = post(r.addr(), "/v1/responses", &body(false, forced)).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let schema: Value = serde_json::from_str(sp()["json_schema"].as_str().unwrap()).unwrap();
    assert_eq!(
        schema["items"]["anyOf"][0]["properties"]["name"]["enum"],
        json!(["get_weather"])
    );

    let turn = json!({"input": [
        {"role": "user", "content": "weather in Paris?"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
            "arguments": "{\"city\": \"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C"},
    ]});
    let reply = post(r.addr(), "/v1/responses", &body(false, turn.clone())).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let prompt = w.stats().last_request.unwrap()["original_text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        prompt.contains("18 C") && prompt.contains("Paris"),
        "{prompt}"
    );

    let mut bad = turn.clone();
    bad["input"][2].as_object_mut().unwrap().remove("call_id");
    let reply = post(r.addr(), "/v1/responses", &body(false, bad)).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(
        reply.text().contains("input[2].call_id"),
        "{}",
        reply.text()
    );
    let search = json!({"tools": [{"type": "web_search"}]});
    let reply = post(r.addr(), "/v1/responses", &body(false, search)).await;
    assert_eq!(reply.status, 501, "{}", reply.text());
    assert!(reply.text().contains("tools[0]"), "{}", reply.text());
    let nameless = json!({"tools": [{"type": "function"}]});
    let reply = post(r.addr(), "/v1/responses", &body(false, nameless)).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("tools[0].name"), "{}", reply.text());
}
