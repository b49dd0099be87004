//! The endpoints translated for gRPC PD workers, end to end over real gRPC mocks:
//! `/v1/completions` (string, list and token-id prompts), `/v1/responses` (text, with the
//! Responses event sequence), `n > 1`, `/generate` batches, logprobs (Prefill's prompt
//! logprobs ahead of Decode's), and the worker's reported default sampling parameters.

use std::time::Duration;

use crate::support::*;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(10);

/// The mock's output text, from its start: every token is one byte.
const TEXT: &str = "The quick brown fox jumps over the lazy dög. ";

/// Logprob the mock gives generated position `i`.
fn out_lp(i: usize) -> f64 {
    -((i % 32) as f64 + 1.0) / 8.0
}

/// Logprob the mock gives prompt position `j` (none for the first).
fn in_lp(j: usize) -> Value {
    if j == 0 {
        Value::Null
    } else {
        json!(-((j % 16) as f64 + 1.0) / 16.0)
    }
}

/// Texts of a streamed OpenAI answer, per choice index.
fn texts_by_index(events: &[Value], field: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for e in events {
        for c in e["choices"].as_array().into_iter().flatten() {
            let i = c["index"].as_u64().unwrap() as usize;
            if out.len() <= i {
                out.resize(i + 1, String::new());
            }
            let piece = match field {
                "delta" => c["delta"]["content"].as_str(),
                _ => c["text"].as_str(),
            };
            out[i].push_str(piece.unwrap_or(""));
        }
    }
    out
}

/// Finish reasons of a streamed OpenAI answer, per choice index.
fn finishes_by_index(events: &[Value]) -> Vec<(u64, String)> {
    let mut out: Vec<(u64, String)> = events
        .iter()
        .flat_map(|e| e["choices"].as_array().cloned().unwrap_or_default())
        .filter(|c| !c["finish_reason"].is_null())
        .map(|c| {
            (
                c["index"].as_u64().unwrap(),
                c["finish_reason"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn completions_take_string_list_and_token_id_prompts() {
    let (_p, d, cfg) = pair(10).await;
    let r = router(cfg).await;
    // Nine text tokens, then EOS: stopped, and the EOS is not in the text.
    let reply = post(r.addr(), "/v1/completions", r#"{"prompt":"hello"}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], &TEXT[..9]);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["prompt_tokens"], 5);
    assert_eq!(v["usage"]["completion_tokens"], 10);
    assert_eq!(d.stats().last_request.unwrap()["original_text"], "hello");

    // A list of strings: one generation per prompt, one choice each.
    let before = d.stats().requests_total;
    let reply = post(
        r.addr(),
        "/v1/completions",
        r#"{"prompt":["hi","héllo"],"max_tokens":4}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["text"], "The ");
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(v["usage"]["prompt_tokens"], 2 + 6);
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert_eq!(d.stats().requests_total, before + 2);

    // Token ids, and a list of token-id lists.
    let reply = post(
        r.addr(),
        "/v1/completions",
        r#"{"prompt":[104,105],"max_tokens":3}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["choices"].as_array().unwrap().len(), 1);
    assert_eq!(
        d.stats().last_request.unwrap()["input_ids"],
        json!([104, 105])
    );
    let reply = post(
        r.addr(),
        "/v1/completions",
        r#"{"prompt":[[104],[105,106,107]],"max_tokens":3}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["usage"]["prompt_tokens"], 4);
    let reply = post(r.addr(), "/v1/completions", r#"{"prompt":[3.5]}"#).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn large_bodies_are_parsed_and_checked_like_small_ones() {
    let (_p, d, cfg) = pair(4).await;
    let r = router(cfg).await;
    // Well past the size parsed off the async workers.
    let prompt = "x".repeat(16 * 1024);
    let body = json!({"prompt": prompt, "max_tokens": 2}).to_string();
    let reply = post(r.addr(), "/v1/completions", &body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["usage"]["prompt_tokens"], 16 * 1024);
    let sent = d.stats().last_request.unwrap();
    assert_eq!(sent["input_ids"].as_array().unwrap().len(), 16 * 1024);
    // The same size, malformed or of the wrong shape: the client's mistake, named.
    let broken = format!("{{\"prompt\":\"{prompt}\"");
    let reply = post(r.addr(), "/v1/completions", &broken).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    let wrong = json!({"prompt": prompt, "max_tokens": "two"}).to_string();
    let reply = post(r.addr(), "/v1/completions", &wrong).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    assert!(reply.text().contains("max_tokens"), "{}", reply.text());
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn streaming_completions_with_stops_and_usage() {
    let (_p, d, cfg) = pair(40).await;
    let r = router(cfg).await;
    let body = r#"{"prompt":["a","b"],"stop":["brown"],"stream":true,"stream_options":{"include_usage":true}}"#;
    let reply = post(r.addr(), "/v1/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().ends_with("data: [DONE]\n\n"));
    let events = sse_events(&reply.text());
    assert_eq!(
        texts_by_index(&events, "text"),
        ["The quick ", "The quick "]
    );
    assert_eq!(
        finishes_by_index(&events),
        [(0, "stop".to_owned()), (1, "stop".to_owned())]
    );
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["prompt_tokens"], 2);
    // The stop string was sent to the engine too.
    assert_eq!(
        d.stats().last_request.unwrap()["sampling_params"]["stop"],
        json!(["brown"])
    );

    // A stop token ends the text before it, and is reported as the matched stop.
    let body = r#"{"prompt":"a","stop_token_ids":[32]}"#;
    let v = post(r.addr(), "/v1/completions", body).await.json();
    assert_eq!(v["choices"][0]["text"], "The");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["matched_stop"], 32);
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn completions_echo_the_prompt_first() {
    let (_p, _d, cfg) = pair(40).await;
    let r = router(cfg).await;
    let body = r#"{"prompt":["Say: ",[104,105]],"echo":true,"max_tokens":3}"#;
    let v = post(r.addr(), "/v1/completions", body).await.json();
    assert_eq!(v["choices"][0]["text"], "Say: The");
    assert_eq!(v["choices"][1]["text"], "hiThe");
    assert_eq!(v["usage"]["completion_tokens"], 6);
    let body = r#"{"prompt":"Say: ","echo":true,"max_tokens":3,"stream":true}"#;
    let events = sse_events(&post(r.addr(), "/v1/completions", body).await.text());
    assert_eq!(events[0]["choices"][0]["text"], "Say: ");
    assert_eq!(texts_by_index(&events, "text"), ["Say: The"]);
}

#[tokio::test]
async fn n_samples_are_the_engines_n_with_indexed_choices() {
    let (_p, d, cfg) = pair(6).await;
    let r = router(cfg).await;
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"n":3}"#;
    let reply = post(r.addr(), "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(d.stats().last_request.unwrap()["sampling_params"]["n"], 3);
    assert_eq!(d.stats().requests_total, 1, "one generation with n = 3");
    let v = reply.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], &TEXT[..5]);
        assert_eq!(c["finish_reason"], "stop");
    }
    let prompt = d.stats().last_request.unwrap()["input_ids"]
        .as_array()
        .unwrap()
        .len();
    // The prompt counts once; every sample's output counts.
    assert_eq!(v["usage"]["prompt_tokens"], prompt);
    assert_eq!(v["usage"]["completion_tokens"], 18);

    let body = r#"{"messages":[{"role":"user","content":"hi"}],"n":2,"stream":true}"#;
    let reply = post(r.addr(), "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let events = sse_events(&reply.text());
    let roles: Vec<&Value> = events
        .iter()
        .filter(|e| e["choices"][0]["delta"]["role"] == "assistant")
        .map(|e| &e["choices"][0]["index"])
        .collect();
    assert_eq!(roles, [&json!(0), &json!(1)]);
    assert_eq!(texts_by_index(&events, "delta"), [&TEXT[..5], &TEXT[..5]]);
    assert_eq!(
        finishes_by_index(&events),
        [(0, "stop".to_owned()), (1, "stop".to_owned())]
    );

    // Completions: prompt i, sample j is choice i * n + j.
    let body = r#"{"prompt":["a","bb"],"n":2,"max_tokens":2}"#;
    let v = post(r.addr(), "/v1/completions", body).await.json();
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 4);
    assert!(choices.iter().enumerate().all(|(i, c)| c["index"] == i));
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 8);
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn generate_batches_answer_a_list() {
    let (_p, d, cfg) = pair(20).await;
    let r = router(cfg).await;
    let body = r#"{"text":["a","bb"],"sampling_params":{"max_new_tokens":3}}"#;
    let reply = post(r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    let items = v.as_array().expect("a list");
    assert_eq!(items.len(), 2);
    for (i, it) in items.iter().enumerate() {
        assert_eq!(it["text"], "The");
        assert_eq!(it["meta_info"]["prompt_tokens"], i + 1);
        assert_eq!(it["meta_info"]["completion_tokens"], 3);
        assert_eq!(it["meta_info"]["finish_reason"]["type"], "length");
    }
    let body = r#"{"input_ids":[[104],[105,106]],"sampling_params":{"max_new_tokens":2,"n":2}}"#;
    let before = d.stats().requests_total;
    let v = post(r.addr(), "/generate", body).await.json();
    assert_eq!(v.as_array().unwrap().len(), 4);
    assert_eq!(v[2]["meta_info"]["prompt_tokens"], 2);
    assert_eq!(d.stats().requests_total, before + 2);

    let body = r#"{"text":["a","bb"],"sampling_params":{"max_new_tokens":3},"stream":true}"#;
    let reply = post(r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().ends_with("data: [DONE]\n\n"));
    let events = sse_events(&reply.text());
    for i in 0..2 {
        let last = events.iter().rfind(|e| e["index"] == i).unwrap();
        assert_eq!(last["text"], "The");
        assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
    }
    // A single prompt with n = 1 stays one object.
    let v = post(r.addr(), "/generate", r#"{"text":"a"}"#).await.json();
    assert!(v.is_object());
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn chat_and_completions_logprobs_come_from_the_engine() {
    let (_p, d, cfg) = pair(30).await;
    let r = router(cfg).await;
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"logprobs":true,"top_logprobs":2}"#;
    let reply = post(r.addr(), "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let sent = d.stats().last_request.unwrap();
    assert_eq!(sent["return_logprob"], true);
    assert_eq!(sent["top_logprobs_num"], 2);
    let v = reply.json();
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 4);
    for (i, e) in content.iter().enumerate() {
        assert_eq!(e["token"], &TEXT[i..=i]);
        assert_eq!(e["logprob"].as_f64().unwrap(), out_lp(i));
        assert_eq!(e["top_logprobs"].as_array().unwrap().len(), 2);
        assert_eq!(e["top_logprobs"][0]["token"], &TEXT[i..=i]);
    }
    let stream = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":4,"logprobs":true,"stream":true}"#;
    let events = sse_events(&post(r.addr(), "/v1/chat/completions", stream).await.text());
    let streamed: Vec<f64> = events
        .iter()
        .filter_map(|e| e["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .map(|e| e["logprob"].as_f64().unwrap())
        .collect();
    assert_eq!(streamed, (0..4).map(out_lp).collect::<Vec<_>>());

    let body = r#"{"prompt":"hi","max_tokens":3,"logprobs":1}"#;
    let v = post(r.addr(), "/v1/completions", body).await.json();
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["T", "h", "e"]));
    assert_eq!(lp["text_offset"], json!([0, 1, 2]));
    assert_eq!(lp["token_logprobs"][2].as_f64().unwrap(), out_lp(2));
    assert_eq!(lp["top_logprobs"][0].as_object().unwrap().len(), 1);
    let without = post(
        r.addr(),
        "/v1/completions",
        r#"{"prompt":"hi","max_tokens":1}"#,
    )
    .await;
    assert!(without.json()["choices"][0]["logprobs"].is_null());
    assert_eq!(d.stats().last_request.unwrap()["return_logprob"], false);
    let too_many =
        r#"{"messages":[{"role":"user","content":"hi"}],"logprobs":true,"top_logprobs":21}"#;
    assert_eq!(
        post(r.addr(), "/v1/chat/completions", too_many)
            .await
            .status,
        400
    );
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn generate_logprobs_put_prefills_prompt_logprobs_first() {
    let (p, d, cfg) = pair(30).await;
    let r = router(cfg).await;
    let body = r#"{"input_ids":[104,105,106],"return_logprob":true,"logprob_start_len":0,"top_logprobs_num":1,"sampling_params":{"max_new_tokens":3}}"#;
    let reply = post(r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    for w in [&p, &d] {
        let sent = w.stats().last_request.unwrap();
        assert_eq!(sent["return_logprob"], true);
        assert_eq!(sent["logprob_start_len"], 0);
        assert_eq!(sent["top_logprobs_num"], 1);
    }
    let v = reply.json();
    let meta = &v["meta_info"];
    // The Prefill mock reports the prompt's logprobs; the Decode mock reports none.
    assert_eq!(
        meta["input_token_logprobs"],
        json!([
            [in_lp(0), 104, null],
            [in_lp(1), 105, null],
            [in_lp(2), 106, null]
        ])
    );
    assert_eq!(
        meta["output_token_logprobs"],
        json!([
            [out_lp(0), 84, null],
            [out_lp(1), 104, null],
            [out_lp(2), 101, null]
        ])
    );
    assert_eq!(
        meta["output_top_logprobs"][0],
        json!([[out_lp(0), 84, null]])
    );

    // Streaming: the last event carries them too.
    let stream = r#"{"input_ids":[104,105],"return_logprob":true,"logprob_start_len":1,"return_text_in_logprobs":true,"stream":true,"sampling_params":{"max_new_tokens":2}}"#;
    let events = sse_events(&post(r.addr(), "/generate", stream).await.text());
    let last = &events.last().unwrap()["meta_info"];
    assert_eq!(last["input_token_logprobs"], json!([[in_lp(1), 105, "i"]]));
    assert_eq!(
        last["output_token_logprobs"][1],
        json!([out_lp(1), 104, "h"])
    );
    let bad = r#"{"text":"x","return_logprob":true,"logprob_start_len":-5}"#;
    assert_eq!(post(r.addr(), "/generate", bad).await.status, 400);
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

/// `(event name, payload)` of a Responses stream.
fn response_events(body: &str) -> Vec<(String, Value)> {
    body.split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (head, data) = e.split_once('\n').expect("event and data lines");
            let name = head.strip_prefix("event: ").expect("an event line");
            let data = data.strip_prefix("data: ").expect("a data line");
            (name.to_owned(), serde_json::from_str(data).unwrap())
        })
        .collect()
}

#[tokio::test]
async fn responses_answer_text_input_and_stream_the_event_sequence() {
    let (_p, d, cfg) = pair(12).await;
    let r = router(cfg).await;
    let body = r#"{"input":"hi there","instructions":"be brief"}"#;
    let reply = post(r.addr(), "/v1/responses", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let prompt = d.stats().last_request.unwrap()["original_text"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        prompt.contains("system\nbe brief") && prompt.contains("user\nhi there"),
        "{prompt}"
    );
    let v = reply.json();
    assert_eq!(v["object"], "response");
    assert_eq!(v["status"], "completed");
    assert_eq!(v["instructions"], "be brief");
    assert_eq!(v["output"][0]["role"], "assistant");
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["output"][0]["content"][0]["text"], detokenized(&d));
    assert_eq!(v["usage"]["output_tokens"], 12);

    let body = r#"{"input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"max_output_tokens":5}"#;
    let v = post(r.addr(), "/v1/responses", body).await.json();
    assert_eq!(v["status"], "incomplete");
    assert_eq!(v["incomplete_details"]["reason"], "max_output_tokens");
    assert_eq!(v["output"][0]["content"][0]["text"], &TEXT[..5]);

    let reply = post(r.addr(), "/v1/responses", r#"{"input":"hi","stream":true}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let events = response_events(&reply.text());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    let deltas = names
        .iter()
        .filter(|n| **n == "response.output_text.delta")
        .count();
    assert!(deltas >= 1);
    let mut expected = vec![
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ];
    expected.extend(std::iter::repeat_n("response.output_text.delta", deltas));
    expected.extend([
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.completed",
    ]);
    assert_eq!(names, expected);
    for (i, (name, v)) in events.iter().enumerate() {
        assert_eq!(v["type"], name.as_str());
        assert_eq!(v["sequence_number"], i);
    }
    let text: String = events
        .iter()
        .filter_map(|(_, v)| v["delta"].as_str())
        .collect();
    assert_eq!(text, detokenized(&d));
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], text);
    assert_eq!(events[0].1["response"]["status"], "in_progress");
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn streaming_responses_answer_the_real_status_when_the_backend_cannot_start() {
    let (p, _d, mut cfg) = pair(5).await;
    cfg.admission = admission(1, 0, 30);
    let r = router(cfg).await;
    p.controls().set_hang(true);
    let addr = r.addr();
    let first = tokio::spawn(async move { post(addr, "/v1/responses", r#"{"input":"a"}"#).await });
    assert!(eventually(WAIT, || p.stats().inflight == 1).await);
    let reply = post(addr, "/v1/responses", r#"{"input":"b","stream":true}"#).await;
    assert_eq!(reply.status, 429, "{}", reply.text());
    assert_eq!(reply.error_code(), "pd_prefill_queue_full");
    p.controls().set_hang(false);
    assert_eq!(first.await.unwrap().status, 200);

    // A Decode worker that fails before its first token: its status, not 200.
    let (_p, _d, cfg) = pair_tuned(|c| c.fail_rate = 1.0).await;
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/responses", r#"{"input":"b","stream":true}"#).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn the_workers_default_sampling_params_fill_unset_fields() {
    let (_p, d, mut cfg) = pair_tuned(|c| {
        c.output_tokens = 30;
        c.default_sampling_params =
            Some(r#"{"temperature":0.25,"top_k":7,"max_new_tokens":4}"#.to_owned());
    })
    .await;
    cfg.health.enabled = true;
    let r = router(cfg).await;
    let learned = |r: &pdrouter::RouterHandle| {
        r.registry()
            .snapshot()
            .all()
            .iter()
            .all(|w| w.model().is_some())
    };
    assert!(eventually(WAIT, || learned(&r)).await);
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"temperature":0.9}"#;
    let reply = post(r.addr(), "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let sp = &d.stats().last_request.unwrap()["sampling_params"];
    // The client's value wins; the worker's defaults fill what it left unset; the engine
    // defaults fill the rest.
    assert_eq!(sp["temperature"].as_f64().unwrap() as f32, 0.9);
    assert_eq!(sp["top_k"], 7);
    assert_eq!(sp["max_new_tokens"], 4);
    assert_eq!(sp["top_p"], 1.0);
    let v = reply.json();
    assert_eq!(v["choices"][0]["message"]["content"], "The ");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[tokio::test]
async fn a_disconnect_aborts_every_prompts_generation() {
    let (p, d, mut cfg) = endless_pair().await;
    cfg.admission = admission(4, 4, 30);
    let r = router(cfg).await;
    let body = r#"{"prompt":["a","b"],"n":2,"stream":true}"#;
    let (status, mut body) = open_stream(r.addr(), "/v1/completions", body).await;
    assert_eq!(status, 200);
    tokio::time::timeout(WAIT, http_body_util::BodyExt::frame(&mut body))
        .await
        .unwrap();
    assert_eq!(d.stats().inflight, 2, "one generation per prompt");
    drop(body);
    assert!(
        eventually(WAIT, || d.stats().aborts_total >= 2).await,
        "both generations aborted"
    );
    assert_legs_released(&r, &p, &d).await;
}
