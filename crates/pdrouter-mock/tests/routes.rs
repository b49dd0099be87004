//! Routes and response shapes.

mod common;

use common::{get, post, post_raw};
use hyper::StatusCode;
use pdrouter_mock::{MockConfig, MockWorker, Role};
use serde_json::{Value, json};

async fn worker(role: Role) -> MockWorker {
    MockWorker::start(MockConfig::new(role))
        .await
        .expect("start worker")
}

fn toks(n: u32) -> String {
    (0..n).map(|k| format!(" tok{k}")).collect()
}

#[tokio::test]
async fn health_routes_answer_200() {
    let w = worker(Role::Regular).await;
    assert_eq!(get(w.addr(), "/health").await.status, StatusCode::OK);
    assert_eq!(
        get(w.addr(), "/health_generate").await.status,
        StatusCode::OK
    );
    assert_eq!(get(w.addr(), "/nope").await.status, StatusCode::NOT_FOUND);
    w.shutdown().await;
}

#[tokio::test]
async fn info_routes_report_config() {
    for (role, mode) in [
        (Role::Prefill, "prefill"),
        (Role::Decode, "decode"),
        (Role::Regular, "null"),
    ] {
        let mut cfg = MockConfig::new(role);
        cfg.dp_size = 4;
        cfg.model = "my/model".into();
        let w = MockWorker::start(cfg).await.unwrap();
        let info = get(w.addr(), "/get_server_info").await;
        assert_eq!(info.status, StatusCode::OK);
        assert_eq!(
            info.json(),
            json!({"model_path": "my/model", "served_model_name": "my/model", "dp_size": 4,
                   "disaggregation_mode": mode, "max_running_requests": 128, "version": "mock"})
        );
        let mi = get(w.addr(), "/get_model_info").await.json();
        assert_eq!(
            mi,
            json!({"model_path": "my/model", "tokenizer_path": "my/model", "is_generation": true})
        );
        let models = get(w.addr(), "/v1/models").await.json();
        assert_eq!(models["object"], "list");
        assert_eq!(models["data"].as_array().unwrap().len(), 1);
        assert_eq!(models["data"][0]["id"], "my/model");
        assert_eq!(models["data"][0]["object"], "model");
        w.shutdown().await;
    }
}

#[tokio::test]
async fn generate_single() {
    let w = worker(Role::Regular).await;
    let r = post(
        w.addr(),
        "/generate",
        &json!({"text": "hello world, how are you"}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.content_type().starts_with("application/json"));
    let v = r.json();
    assert_eq!(v["text"], toks(8));
    let meta = &v["meta_info"];
    assert!(meta["id"].as_str().is_some_and(|s| !s.is_empty()));
    // The worker's own output length is a natural end: the EOS id.
    assert_eq!(meta["finish_reason"]["type"], "stop");
    assert!(meta["finish_reason"]["matched"].is_u64());
    assert!(meta.get("input_token_logprobs").is_none());
    assert_eq!(meta["completion_tokens"], 8);
    assert!(meta["prompt_tokens"].as_u64().unwrap() > 0);
    w.shutdown().await;
}

#[tokio::test]
async fn generate_caps_tokens_and_echoes_rid() {
    let w = worker(Role::Regular).await;
    let v = post(
        w.addr(),
        "/generate",
        &json!({"input_ids": [1, 2, 3, 4, 5], "rid": "req-7", "sampling_params": {"max_new_tokens": 3}}),
    )
    .await
    .json();
    assert_eq!(v["text"], " tok0 tok1 tok2");
    assert_eq!(v["meta_info"]["id"], "req-7");
    assert_eq!(v["meta_info"]["prompt_tokens"], 5);
    assert_eq!(
        v["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 3})
    );
    // A larger cap does not raise the count above --output-tokens.
    let v = post(
        w.addr(),
        "/generate",
        &json!({"text": "x", "sampling_params": {"max_new_tokens": 100}}),
    )
    .await
    .json();
    assert_eq!(v["meta_info"]["completion_tokens"], 8);
    w.shutdown().await;
}

#[tokio::test]
async fn generate_batch_returns_array() {
    let w = worker(Role::Decode).await;
    let r = post(
        w.addr(),
        "/generate",
        &json!({"text": ["a", "bb", "ccc"], "bootstrap_room": [1, 2, 3], "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    let items = v.as_array().expect("array");
    assert_eq!(items.len(), 3);
    for item in items {
        assert_eq!(item["text"], toks(2));
        assert_eq!(item["meta_info"]["completion_tokens"], 2);
    }
    let ids: Vec<_> = items.iter().map(|i| i["meta_info"]["id"].clone()).collect();
    assert_ne!(ids[0], ids[1]);

    let v = post(
        w.addr(),
        "/generate",
        &json!({"input_ids": [[1, 2], [3, 4, 5]], "bootstrap_room": [1, 2]}),
    )
    .await
    .json();
    let items = v.as_array().expect("array");
    assert_eq!(items.len(), 2);
    assert_eq!(items[1]["meta_info"]["prompt_tokens"], 3);
    w.shutdown().await;
}

#[tokio::test]
async fn generate_stream_is_cumulative_and_ends_with_done() {
    let w = worker(Role::Regular).await;
    let r = post(
        w.addr(),
        "/generate",
        &json!({"text": "hi", "stream": true, "sampling_params": {"max_new_tokens": 4}}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(r.content_type().starts_with("text/event-stream"));
    let events = r.sse_json();
    assert_eq!(events.len(), 4);
    for (k, ev) in events.iter().enumerate() {
        let k = k as u32 + 1;
        assert_eq!(ev["text"], toks(k));
        assert_eq!(ev["meta_info"]["completion_tokens"], k);
        if k < 4 {
            assert_eq!(ev["meta_info"]["finish_reason"], Value::Null);
        }
    }
    assert_eq!(
        events[3]["meta_info"]["finish_reason"],
        json!({"type": "length", "length": 4})
    );
    w.shutdown().await;
}

#[tokio::test]
async fn generate_batch_stream_has_indexed_items() {
    let w = worker(Role::Regular).await;
    let r = post(
        w.addr(),
        "/generate",
        &json!({"text": ["a", "b"], "stream": true, "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    let events = r.sse_json();
    assert_eq!(events.len(), 4);
    let last: Vec<_> = events
        .iter()
        .filter(|e| e["meta_info"]["finish_reason"].is_object())
        .collect();
    assert_eq!(last.len(), 2);
    let mut idx: Vec<_> = last.iter().map(|e| e["index"].as_u64().unwrap()).collect();
    idx.sort_unstable();
    assert_eq!(idx, [0, 1]);
    w.shutdown().await;
}

#[tokio::test]
async fn chat_completion_with_n_choices() {
    let w = worker(Role::Regular).await;
    let r = post(
        w.addr(),
        "/v1/chat/completions",
        &json!({"model": "req-model", "n": 2, "max_tokens": 5,
                "messages": [{"role": "user", "content": "Tell me a story"}]}),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    let v = r.json();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "req-model");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["role"], "assistant");
        assert_eq!(c["message"]["content"], toks(5));
        assert_eq!(c["finish_reason"], "length");
    }
    let usage = &v["usage"];
    assert_eq!(usage["completion_tokens"], 10);
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["prompt_tokens"].as_u64().unwrap() + 10
    );
    w.shutdown().await;
}

#[tokio::test]
async fn chat_default_model_and_stream_chunks() {
    let w = worker(Role::Regular).await;
    let v = post(
        w.addr(),
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}]}),
    )
    .await
    .json();
    assert_eq!(v["model"], "mock-model");
    assert_eq!(v["choices"][0]["message"]["content"], toks(8));

    let r = post(
        w.addr(),
        "/v1/chat/completions",
        &json!({"stream": true, "max_tokens": 3, "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    assert!(r.content_type().starts_with("text/event-stream"));
    let events = r.sse_json();
    for ev in &events {
        assert_eq!(ev["object"], "chat.completion.chunk");
    }
    let content: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(content, toks(3));
    let finishes: Vec<_> = events
        .iter()
        .filter(|e| e["choices"][0]["finish_reason"] == "length")
        .collect();
    assert_eq!(finishes.len(), 1);
    let usage = events.last().unwrap();
    assert_eq!(usage["choices"], json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 3);
    w.shutdown().await;
}

#[tokio::test]
async fn completions_array_prompt_times_n() {
    let w = worker(Role::Regular).await;
    let v = post(
        w.addr(),
        "/v1/completions",
        &json!({"prompt": ["one", "two", "three"], "n": 2, "max_tokens": 2}),
    )
    .await
    .json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "mock-model");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 6);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], toks(2));
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(v["usage"]["completion_tokens"], 12);

    let v = post(w.addr(), "/v1/completions", &json!({"prompt": [1, 2, 3]}))
        .await
        .json();
    assert_eq!(v["choices"].as_array().unwrap().len(), 1);
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    w.shutdown().await;
}

#[tokio::test]
async fn completions_stream() {
    let w = worker(Role::Regular).await;
    let r = post(
        w.addr(),
        "/v1/completions",
        &json!({"prompt": "p", "stream": true, "max_tokens": 3}),
    )
    .await;
    let events = r.sse_json();
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, toks(3));
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    w.shutdown().await;
}

#[tokio::test]
async fn responses_minimal() {
    let w = worker(Role::Regular).await;
    let v = post(
        w.addr(),
        "/v1/responses",
        &json!({"input": "hi", "max_output_tokens": 2}),
    )
    .await
    .json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["output"][0]["content"][0]["text"], toks(2));
    assert_eq!(v["usage"]["output_tokens"], 2);

    w.shutdown().await;
}

#[tokio::test]
async fn responses_stream_has_the_full_event_sequence() {
    let w = worker(Role::Regular).await;
    let r = post(
        w.addr(),
        "/v1/responses",
        &json!({"input": "hi", "stream": true, "max_output_tokens": 2}),
    )
    .await;
    let body = r.text();
    assert!(!body.contains("[DONE]"), "{body}");
    let events: Vec<Value> = r
        .sse_data()
        .iter()
        .map(|d| serde_json::from_str(d).expect("JSON event"))
        .collect();
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    // Every data line has its own `event:` line naming the same type.
    let named: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect();
    assert_eq!(named, kinds);
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i);
    }
    assert_eq!(events[0]["response"]["status"], "in_progress");
    let item_id = events[2]["item"]["id"].clone();
    assert_eq!(events[2]["item"]["status"], "in_progress");
    for e in &events[3..9] {
        if e["type"] != "response.output_item.done" {
            assert_eq!(e["item_id"], item_id);
            assert_eq!(
                (e["output_index"].clone(), e["content_index"].clone()),
                (json!(0), json!(0))
            );
        }
    }
    assert_eq!(
        events[3]["part"],
        json!({"type": "output_text", "text": "", "annotations": []})
    );
    assert_eq!(events[6]["text"], toks(2));
    assert_eq!(events[7]["part"]["text"], toks(2));
    assert_eq!(events[8]["item"]["content"][0]["text"], toks(2));
    assert_eq!(events[8]["item"]["status"], "completed");
    let done = &events[9]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["id"], item_id);
    assert_eq!(done["usage"]["output_tokens"], 2);
    w.shutdown().await;
}

#[tokio::test]
async fn stop_strings_and_ids_end_generation_with_stop() {
    let w = worker(Role::Regular).await;
    let chat = post(
        w.addr(),
        "/v1/chat/completions",
        &json!({"stop": "tok3", "messages": [{"role": "user", "content": "x"}]}),
    )
    .await
    .json();
    assert_eq!(chat["choices"][0]["message"]["content"], " tok0 tok1 tok2 ");
    assert_eq!(chat["choices"][0]["finish_reason"], "stop");
    assert_eq!(chat["usage"]["completion_tokens"], 4);

    let r = post(
        w.addr(),
        "/v1/completions",
        &json!({"prompt": "p", "stream": true, "stop": ["nope", "tok1"]}),
    )
    .await;
    let events = r.sse_json();
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, " tok0 ");
    assert_eq!(
        events.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );

    let g = post(
        w.addr(),
        "/generate",
        &json!({"text": "x", "sampling_params": {"stop_token_ids": [1002], "max_new_tokens": 6}}),
    )
    .await
    .json();
    assert_eq!(g["text"], toks(2));
    assert_eq!(g["meta_info"]["completion_tokens"], 3);
    assert_eq!(
        g["meta_info"]["finish_reason"],
        json!({"type": "stop", "matched": 1002})
    );
    let g = post(
        w.addr(),
        "/generate",
        &json!({"text": "x", "sampling_params": {"stop": "tok1"}}),
    )
    .await
    .json();
    assert_eq!(
        g["meta_info"]["finish_reason"],
        json!({"type": "stop", "matched": "tok1"})
    );
    w.shutdown().await;
}

#[tokio::test]
async fn json_schema_answers_are_json() {
    let w = worker(Role::Regular).await;
    let schema = json!({"type": "object", "properties": {"city": {"type": "string"}, "n": {"type": "integer"}},
                        "required": ["city", "n"], "additionalProperties": false});
    let v = post(
        w.addr(),
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "x"}],
                "response_format": {"type": "json_schema", "json_schema": {"name": "C", "schema": schema}}}),
    )
    .await
    .json();
    let content = v["choices"][0]["message"]["content"].as_str().unwrap();
    let doc: Value = serde_json::from_str(content).unwrap();
    assert_eq!(doc, json!({"city": "tok", "n": 0}));
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    w.shutdown().await;
}

#[tokio::test]
async fn generate_logprobs_when_asked() {
    let ids = json!([5, 6, 7, 8]);
    let mut lists = Vec::new();
    for role in [Role::Regular, Role::Prefill, Role::Decode] {
        let w = worker(role).await;
        let v = post(
            w.addr(),
            "/generate",
            &json!({"input_ids": ids, "return_logprob": true, "bootstrap_room": 1,
                    "sampling_params": {"max_new_tokens": 2}}),
        )
        .await
        .json();
        let meta = &v["meta_info"];
        lists.push(meta["input_token_logprobs"].as_array().unwrap().clone());
        let out = meta["output_token_logprobs"].as_array().unwrap();
        assert_eq!(
            out.len(),
            meta["completion_tokens"].as_u64().unwrap() as usize
        );
        assert_eq!(out[0], json!([-0.125, 1000, null]));
        w.shutdown().await;
    }
    assert_eq!(lists[0][0], json!([null, 5, null]));
    assert_eq!(lists[0][3], json!([-0.25, 8, null]));
    assert_eq!((lists[1].len(), lists[2].len()), (3, 1));
    let mut pd = lists[1].clone();
    pd.extend(lists[2].clone());
    assert_eq!(pd, lists[0]);

    // Streamed: every event carries them, output logprobs so far.
    let w = worker(Role::Regular).await;
    let r = post(
        w.addr(),
        "/generate",
        &json!({"text": ["abcdefgh", "abcd"], "return_logprob": true, "stream": true,
                "sampling_params": {"max_new_tokens": 2}}),
    )
    .await;
    let events = r.sse_json();
    assert_eq!(events.len(), 4);
    for e in &events {
        let prompt = e["meta_info"]["prompt_tokens"].as_u64().unwrap() as usize;
        assert_eq!(
            e["meta_info"]["input_token_logprobs"]
                .as_array()
                .unwrap()
                .len(),
            prompt
        );
        assert_eq!(
            e["meta_info"]["output_token_logprobs"]
                .as_array()
                .unwrap()
                .len(),
            e["meta_info"]["completion_tokens"].as_u64().unwrap() as usize
        );
    }
    w.shutdown().await;
}

#[tokio::test]
async fn prefill_answers_first_token_and_single_chunk_stream() {
    let w = worker(Role::Prefill).await;
    let v = post(
        w.addr(),
        "/generate",
        &json!({"text": "abc", "bootstrap_room": 7}),
    )
    .await
    .json();
    assert_eq!(v["text"], " tok0");
    assert_eq!(v["meta_info"]["completion_tokens"], 1);

    let r = post(
        w.addr(),
        "/generate",
        &json!({"text": "abc", "bootstrap_room": 7, "stream": true}),
    )
    .await;
    assert!(r.content_type().starts_with("text/event-stream"));
    let events = r.sse_json();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["meta_info"]["finish_reason"]["type"], "length");

    let r = post(
        w.addr(),
        "/v1/chat/completions",
        &json!({"stream": true, "bootstrap_room": 1, "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    let events = r.sse_json();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    assert_eq!(events[0]["choices"][0]["finish_reason"], "length");
    w.shutdown().await;
}

#[tokio::test]
async fn bootstrap_room_required_for_pd_roles() {
    for role in [Role::Prefill, Role::Decode] {
        let w = worker(role).await;
        for path in ["/generate", "/v1/chat/completions", "/v1/completions"] {
            let body =
                json!({"text": "x", "prompt": "x", "messages": [{"role": "user", "content": "x"}]});
            let r = post(w.addr(), path, &body).await;
            assert_eq!(r.status, StatusCode::BAD_REQUEST, "{role} {path}");
            assert_eq!(
                r.json(),
                json!({"error": {"message": "missing bootstrap_room"}})
            );
            let mut ok = body.clone();
            ok["bootstrap_room"] = json!(12345);
            ok["bootstrap_host"] = json!("127.0.0.1");
            assert_eq!(
                post(w.addr(), path, &ok).await.status,
                StatusCode::OK,
                "{role} {path}"
            );
        }
        w.shutdown().await;
    }
    let w = worker(Role::Regular).await;
    assert_eq!(
        post(w.addr(), "/generate", &json!({"text": "x"}))
            .await
            .status,
        StatusCode::OK
    );
    w.shutdown().await;
}

#[tokio::test]
async fn malformed_json_is_400() {
    let w = worker(Role::Regular).await;
    for body in ["{not json", "", "[1,2]"] {
        let r = post_raw(w.addr(), "/generate", body).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "body {body:?}");
        assert!(r.json()["error"]["message"].is_string());
    }
    let r = post_raw(w.addr(), "/v1/chat/completions", "{\"messages\": 3}").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    w.shutdown().await;
}

/// Sends `GET`/`POST path` with `headers` on a fresh connection; returns status and body.
async fn with_headers(
    w: &MockWorker,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> (StatusCode, Value) {
    use http_body_util::{BodyExt, Full};
    let (mut sender, _task) = common::connect(w.addr()).await;
    let mut req = hyper::Request::builder()
        .method(if body.is_some() { "POST" } else { "GET" })
        .uri(path)
        .header("host", w.addr().to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(body.unwrap_or("").to_owned())))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn an_api_key_guards_every_route_but_the_test_hooks() {
    let mut cfg = MockConfig::new(Role::Regular);
    cfg.api_key = Some("k1".into());
    let w = MockWorker::start(cfg).await.unwrap();
    // The generation routes are served past the router (straight to their handler): the
    // key is checked there too.
    for (path, body) in [
        ("/health", None),
        ("/v1/models", None),
        ("/generate", Some(r#"{"text":"hi"}"#)),
        (
            "/v1/chat/completions",
            Some(r#"{"messages":[{"role":"user","content":"hi"}]}"#),
        ),
        ("/v1/completions", Some(r#"{"prompt":"hi"}"#)),
        ("/v1/responses", Some(r#"{"input":"hi"}"#)),
    ] {
        for headers in [
            &[][..],
            &[("authorization", "Bearer k2")][..],
            &[
                ("authorization", "Bearer k1"),
                ("authorization", "Bearer k1"),
            ][..],
        ] {
            let (status, _) = with_headers(&w, path, body, headers).await;
            assert_eq!(status, StatusCode::UNAUTHORIZED, "{path} {headers:?}");
        }
        let (status, _) = with_headers(&w, path, body, &[("authorization", "Bearer k1")]).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    assert_eq!(get(w.addr(), "/mock/stats").await.status, StatusCode::OK);
    // Only a POST takes the direct way: other methods still get the router's 405.
    let (status, _) = with_headers(&w, "/generate", None, &[("authorization", "Bearer k1")]).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    w.shutdown().await;
}

#[tokio::test]
async fn stats_show_the_last_generation_requests_headers() {
    let w = worker(Role::Regular).await;
    assert!(w.stats().last_headers.is_none());
    let headers = [
        ("traceparent", "00-a-b-01"),
        ("x-multi", "1"),
        ("x-multi", "2"),
    ];
    let (status, _) = with_headers(&w, "/generate", Some(r#"{"text":"hi"}"#), &headers).await;
    assert_eq!(status, StatusCode::OK);
    let seen = w.stats().last_headers.unwrap();
    assert_eq!(seen["traceparent"], ["00-a-b-01"]);
    assert_eq!(seen["x-multi"], ["1", "2"]);
    let (_, stats) = with_headers(&w, "/mock/stats", None, &[]).await;
    assert_eq!(stats["last_headers"]["x-multi"], json!(["1", "2"]));
    w.shutdown().await;
}
