//! gRPC PD over real gRPC mock workers on ephemeral ports: both legs with one ticket, router-
//! side tokenization and detokenization, stop strings, admission, aborts on disconnect, and
//! the refusals (mixed pools, bad URLs, unreachable workers, endpoints not served yet).

use std::time::Duration;

use crate::support::*;
use pdrouter::config::{Config, Mode, WorkerType};
use pdrouter_tokenizer::bytelevel;
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(10);

const CHAT_USAGE: &str = r#"{"messages":[{"role":"user","content":"hello there"}],"stream":true,"stream_options":{"include_usage":true}}"#;

#[tokio::test]
async fn both_legs_get_one_request_concurrently_with_the_same_ticket() {
    let (p, d, cfg) = pair(60).await;
    let r = router(cfg).await;
    p.controls().set_hang(true);
    let addr = r.addr();
    let call = tokio::spawn(async move { post(addr, "/v1/chat/completions", CHAT).await });
    // Decode has the request while Prefill is still held: the legs were sent together.
    assert!(
        eventually(WAIT, || p.stats().inflight == 1
            && d.stats().requests_total == 1)
        .await,
        "both legs in flight at once"
    );
    p.controls().set_hang(false);
    let reply = call.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    let pl = p.stats().last_request.unwrap();
    let dl = d.stats().last_request.unwrap();
    assert_eq!(pl["request_id"], dl["request_id"]);
    assert_eq!(pl["disaggregated_params"], dl["disaggregated_params"]);
    assert_eq!(pl["input_ids"], dl["input_ids"]);
    let ticket = &dl["disaggregated_params"];
    assert_eq!(ticket["bootstrap_host"], "127.0.0.1");
    assert_eq!(ticket["bootstrap_port"], p.addr().port());
    let room = ticket["bootstrap_room"].as_i64().unwrap();
    assert!((0..1 << 31).contains(&room));
    // Unset sampling fields go out as the engines' defaults; no limit stays unset.
    let sp = &dl["sampling_params"];
    assert_eq!(sp["temperature"], 1.0);
    assert_eq!(sp["top_p"], 1.0);
    assert_eq!(sp["top_k"], -1);
    assert_eq!(sp["min_p"], 0.0);
    assert_eq!(sp["repetition_penalty"], 1.0);
    assert_eq!(sp["n"], 1);
    assert_eq!(sp["skip_special_tokens"], true);
    assert_eq!(sp["spaces_between_special_tokens"], true);
    assert!(sp["max_new_tokens"].is_null());
    // The chat template was applied with the generation prompt.
    let prompt = dl["original_text"].as_str().unwrap();
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");

    let v = reply.json();
    assert_eq!(v["object"], "chat.completion");
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(text, detokenized(&d));
    assert!(text.contains("dög"), "multibyte text intact: {text}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let inputs = dl["input_ids"].as_array().unwrap().len() as u64;
    assert_eq!(v["usage"]["prompt_tokens"], inputs);
    assert_eq!(v["usage"]["completion_tokens"], 60);
    assert_eq!(v["usage"]["total_tokens"], inputs + 60);
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn streaming_chat_text_is_the_detokenized_output() {
    let (_p, d, cfg) = pair(60).await;
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT_USAGE).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("content-type"), Some("text/event-stream"));
    assert!(reply.text().ends_with("data: [DONE]\n\n"));
    let events = sse_events(&reply.text());
    assert_eq!(events[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = events
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, detokenized(&d));
    assert!(text.contains("dög"));
    let finishes: Vec<&Value> = events
        .iter()
        .map(|e| &e["choices"][0]["finish_reason"])
        .filter(|f| !f.is_null())
        .collect();
    assert_eq!(finishes, [&Value::from("stop")]);
    let usage = &events.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 60);
    let inputs = d.stats().last_request.unwrap()["input_ids"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(usage["prompt_tokens"], inputs);
    assert_eq!(metric(&r, "smg_pd_ttft_seconds_count"), Some(1.0));
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn stop_strings_spanning_tokens_end_the_text() {
    let (_p, _d, cfg) = pair(60).await;
    let r = router(cfg).await;
    // Every output token is one byte, so "lazy d" spans six tokens.
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"stop":["lazy d"],"max_tokens":50}"#;
    let reply = post(r.addr(), "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "The quick brown fox jumps over the "
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["choices"][0]["matched_stop"], "lazy d");

    let stream = r#"{"messages":[{"role":"user","content":"hi"}],"stop":"ö","stream":true}"#;
    let reply = post(r.addr(), "/v1/chat/completions", stream).await;
    let text: String = sse_events(&reply.text())
        .iter()
        .filter_map(|e| e["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "The quick brown fox jumps over the lazy d");
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn max_tokens_becomes_max_new_tokens_and_length_finishes() {
    let (_p, d, cfg) = pair(60).await;
    let r = router(cfg).await;
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":5}"#;
    let reply = post(r.addr(), "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        d.stats().last_request.unwrap()["sampling_params"]["max_new_tokens"],
        5
    );
    let v = reply.json();
    assert_eq!(v["choices"][0]["message"]["content"], "The q");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["completion_tokens"], 5);
}

#[tokio::test]
async fn generate_takes_text_or_input_ids() {
    let (_p, d, cfg) = pair(20).await;
    let r = router(cfg).await;
    let reply = post(r.addr(), "/generate", r#"{"text":"héllo"}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["text"], detokenized(&d));
    assert_eq!(v["meta_info"]["prompt_tokens"], 6);
    assert_eq!(v["meta_info"]["completion_tokens"], 20);
    assert_eq!(v["meta_info"]["finish_reason"]["type"], "stop");
    assert_eq!(
        d.stats().last_request.unwrap()["input_ids"],
        serde_json::json!(bytelevel::encode_plain("héllo"))
    );

    let reply = post(
        r.addr(),
        "/generate",
        r#"{"input_ids":[104,105],"sampling_params":{"max_new_tokens":3},"stream":true}"#,
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let events = sse_events(&reply.text());
    let last = events.last().unwrap();
    assert_eq!(last["text"], "The");
    let counts: Vec<&Value> = events
        .iter()
        .map(|e| &e["meta_info"]["completion_tokens"])
        .collect();
    assert_eq!(counts.first(), Some(&&Value::from(1)), "{events:?}");
    assert_eq!(last["meta_info"]["finish_reason"]["type"], "length");
    assert_eq!(last["output_ids"].as_array().unwrap().len(), 3);

    let reply = post(r.addr(), "/generate", r#"{"input_ids":[999999]}"#).await;
    assert_eq!(reply.status, 400, "{}", reply.text());
}

#[tokio::test]
async fn tokenizer_from_a_path_is_used() {
    let (_p, d, mut cfg) = pair(10).await;
    let dir = tokenizer_dir();
    cfg.tokenizer.tokenizer_path = Some(dir.path().join("tokenizer.json"));
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        reply.json()["choices"][0]["message"]["content"],
        detokenized(&d)
    );

    let mut bad = pair(10).await.2;
    bad.tokenizer.tokenizer_path = Some(dir.path().join("missing.json"));
    let err = pdrouter::start(bad).await.unwrap_err().to_string();
    assert!(err.contains("--tokenizer-path"), "{err}");
}

#[tokio::test]
async fn chat_template_file_and_bad_chat_input_are_client_errors() {
    let (p, d, mut cfg) = pair(5).await;
    let dir = tokenizer_dir();
    let template = dir.path().join("strict.jinja");
    std::fs::write(
        &template,
        "{% for m in messages %}{% if m.role == 'tool' %}{{ raise_exception('no tools here') }}\
         {% endif %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}>{% endif %}",
    )
    .unwrap();
    cfg.tokenizer.tokenizer_path = Some(dir.path().to_owned());
    cfg.tokenizer.chat_template = Some(template);
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(
        d.stats().last_request.unwrap()["original_text"],
        "[user]hello there>"
    );
    let before = p.stats().requests_total;
    for body in [
        r#"{"messages":[{"role":"tool","content":"x"}]}"#,
        r#"{"messages":"hi"}"#,
        r#"{"messages":[{"role":"user","content":"x"}],"temperature":"hot"}"#,
    ] {
        let reply = post(r.addr(), "/v1/chat/completions", body).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.text());
        assert_eq!(reply.error_code(), "invalid_request");
    }
    assert_eq!(p.stats().requests_total, before, "nothing was sent");
    assert_eq!(total_load(&r), 0);
}

#[tokio::test]
async fn admission_limits_grpc_prefill_and_releases_at_prefill_end() {
    let (p, _d, mut cfg) = pair(10).await;
    cfg.admission = admission(1, 1, 30);
    let r = router(cfg).await;
    p.controls().set_hang(true);
    let addr = r.addr();
    let first = tokio::spawn(async move { post(addr, "/v1/chat/completions", CHAT).await });
    assert!(eventually(WAIT, || p.stats().inflight == 1).await);
    let second = tokio::spawn(async move { post(addr, "/v1/chat/completions", CHAT).await });
    assert!(
        eventually(WAIT, || metric(&r, "smg_pd_prefill_admission_queued")
            == Some(1.0))
        .await
    );
    let third = post(addr, "/v1/chat/completions", CHAT).await;
    assert_eq!(third.status, 429);
    assert_eq!(third.error_code(), "pd_prefill_queue_full");
    p.controls().set_hang(false);
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    assert!(
        eventually(WAIT, || metric(&r, "smg_pd_prefill_admission_inflight")
            == Some(0.0))
        .await
    );
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn the_prefill_slot_is_released_at_prefill_end_not_decode_end() {
    let (_p, d, mut cfg) = endless_pair().await;
    cfg.admission = admission(1, 0, 30);
    let r = router(cfg).await;
    let body = open_chat_stream(r.addr(), 0).await;
    // Decode keeps streaming; the Prefill slot is free again and a second request gets it.
    assert!(
        eventually(WAIT, || metric(&r, "smg_pd_prefill_admission_inflight")
            == Some(0.0))
        .await
    );
    assert_eq!(d.stats().inflight, 1);
    let second = post(
        r.addr(),
        "/generate",
        r#"{"text":"x","sampling_params":{"max_new_tokens":2}}"#,
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.text());
    drop(body);
    assert!(eventually(WAIT, || d.stats().inflight == 0 && total_load(&r) == 0).await);
}

#[tokio::test]
async fn a_failing_decode_is_retried_on_another_pair() {
    let p = grpc_mock(Role::Prefill, |_| {}).await;
    let bad = grpc_mock(Role::Decode, |c| c.fail_rate = 1.0).await;
    let good = grpc_mock(Role::Decode, |c| c.output_tokens = 5).await;
    let mut cfg = pd_config(&[&p], &[&bad, &good]);
    cfg.mode = Mode::PdGrpc;
    cfg.workers[0].bootstrap_port = Some(p.addr().port());
    cfg.decode_policy = pdrouter_policy::PolicyKind::RoundRobin;
    with_retries(&mut cfg);
    let r = router(cfg).await;
    served_around(&r, &bad).await;
    assert!(eventually(WAIT, || total_load(&r) == 0 && p.stats().inflight == 0).await);
}

#[tokio::test]
async fn a_prefill_failing_to_start_aborts_the_decode_leg() {
    let p = grpc_mock(Role::Prefill, |c| c.fail_rate = 1.0).await;
    let d = grpc_mock(Role::Decode, |_| {}).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.mode = Mode::PdGrpc;
    cfg.workers[0].bootstrap_port = Some(p.addr().port());
    cfg.admission = admission(2, 2, 30);
    cfg.breaker.failure_threshold = 1;
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(reply.error_code(), "prefill_worker_error");
    // The failure is charged to the Prefill worker only.
    let snap = r.registry().snapshot();
    assert!(!snap.of_type(WorkerType::Prefill)[0].is_routable());
    assert!(snap.of_type(WorkerType::Decode)[0].is_routable());
    drop(snap);
    assert!(
        eventually(WAIT, || d.stats().aborts_total >= 1).await,
        "Decode aborted"
    );
    assert!(eventually(WAIT, || d.stats().inflight == 0 && total_load(&r) == 0).await);
    assert_eq!(metric(&r, "smg_pd_prefill_admission_inflight"), Some(0.0));
}

#[tokio::test]
async fn client_disconnect_aborts_the_running_legs() {
    let (p, d, mut cfg) = endless_pair().await;
    cfg.admission = admission(4, 4, 30);
    let r = router(cfg).await;
    let body = open_chat_stream(r.addr(), 2).await;
    assert_eq!(d.stats().inflight, 1);
    drop(body);
    assert!(
        eventually(WAIT, || d.stats().aborts_total >= 1).await,
        "Decode aborted"
    );
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn fields_not_served_over_grpc_answer_501_naming_them() {
    let (_p, d, cfg) = pair(5).await;
    let r = router(cfg).await;
    for (path, body, field) in [
        (
            "/v1/completions",
            r#"{"prompt":"x","echo":true,"logprobs":1}"#,
            "'echo' with 'logprobs'",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"x","suffix":"y"}"#,
            "'suffix'",
        ),
        (
            "/v1/responses",
            r#"{"input":"x","tools":[{"type":"web_search"}]}"#,
            "tools[0] of type 'web_search'",
        ),
        (
            "/generate",
            r#"{"text":["a","b"],"return_logprob":[true,false]}"#,
            "'return_logprob'",
        ),
        (
            "/v1/responses",
            r#"{"input":"x","previous_response_id":"resp_1"}"#,
            "'previous_response_id'",
        ),
        (
            "/v1/responses",
            r#"{"input":[{"type":"computer_call","call_id":"c"}]}"#,
            "computer_call",
        ),
    ] {
        let reply = post(r.addr(), path, body).await;
        assert_eq!(reply.status, 501, "{path}: {}", reply.text());
        assert_eq!(reply.error_code(), "not_implemented");
        assert!(reply.text().contains(field), "{path}: {}", reply.text());
    }
    assert_eq!(d.stats().requests_total, 0, "nothing was sent");
}

#[tokio::test]
async fn unreachable_grpc_workers_answer_503() {
    // Held for the whole test, so nothing else takes the ports.
    let (dp, dd) = (dead_url(), dead_url());
    let workers = vec![
        spec(&format!("grpc://{}", dp.addr()), WorkerType::Prefill),
        spec(&format!("grpc://{}", dd.addr()), WorkerType::Decode),
    ];
    let mut cfg = Config::with_workers(Mode::PdGrpc, workers);
    cfg.health.enabled = false;
    cfg.retry.max_attempts = 1;
    cfg.health.timeout = Duration::from_secs(1);
    // Without a tokenizer flag the tokenizer must come from a worker: none answers.
    let err = pdrouter::start(cfg.clone()).await.unwrap_err().to_string();
    assert!(err.contains("--tokenizer-path"), "{err}");
    let dir = tokenizer_dir();
    cfg.tokenizer.tokenizer_path = Some(dir.path().to_owned());
    let r = router(cfg).await;
    let reply = post(r.addr(), "/v1/chat/completions", CHAT).await;
    assert_eq!(reply.status, 503, "{}", reply.text());
    assert!(reply.error_code().ends_with("_connect_failed"));
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn health_checks_and_model_id_go_through_grpc() {
    let (p, d, mut cfg) = pair(5).await;
    cfg.health.enabled = true;
    let r = router(cfg).await;
    let ready = |r: &pdrouter::RouterHandle| {
        r.registry()
            .snapshot()
            .all()
            .iter()
            .all(|w| w.is_routable() && w.model_id().is_some())
    };
    assert!(eventually(WAIT, || ready(&r)).await);
    drop((p, d));
}

#[tokio::test]
async fn workers_api_keeps_one_transport() {
    let (_p, _d, cfg) = pair(5).await;
    let r = router(cfg).await;
    let reply = post(
        r.addr(),
        "/workers",
        r#"{"url":"http://127.0.0.1:9","worker_type":"decode"}"#,
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    let reply = post(
        r.addr(),
        "/workers",
        r#"{"url":"grpc://127.0.0.1","worker_type":"decode"}"#,
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
    let extra = grpc_mock(Role::Decode, |c| c.output_tokens = 3).await;
    let body = format!(r#"{{"url":"{}","worker_type":"decode"}}"#, extra.url());
    let reply = post(r.addr(), "/workers", &body).await;
    assert_eq!(reply.status, 202, "{}", reply.text());
    assert_eq!(r.registry().snapshot().of_type(WorkerType::Decode).len(), 2);

    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let http = router(pd_config(&[&p], &[&d])).await;
    let reply = post(
        http.addr(),
        "/workers",
        r#"{"url":"grpc://127.0.0.1:9","worker_type":"decode"}"#,
    )
    .await;
    assert_eq!(reply.status, 400, "{}", reply.text());
}

#[test]
fn mixed_pools_exit_2() {
    for args in [
        &[
            "--pd-disaggregation",
            "--prefill",
            "http://127.0.0.1:1",
            "--decode",
            "grpc://127.0.0.1:2",
        ][..],
        &["--worker-urls", "http://127.0.0.1:1", "grpc://127.0.0.1:2"][..],
        &[
            "--pd-disaggregation",
            "--prefill",
            "grpc://127.0.0.1",
            "--decode",
            "grpc://127.0.0.1:2",
        ][..],
        &[
            "--worker-urls",
            "http://127.0.0.1:1",
            "--chat-template",
            "/x",
        ][..],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdrouter"))
            .arg("launch")
            .args(args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
}

/// With gRPC workers the token budget charges the tokenizer's count, not the byte estimate.
#[tokio::test]
async fn token_budget_charges_the_tokenizer_count() {
    let (p, _d, mut cfg) = pair(2).await;
    cfg.admission = Some(pdrouter::config::AdmissionSettings {
        max_inflight_per_worker: pdrouter::config::NO_COUNT_LIMIT,
        max_inflight_tokens_per_worker: Some(100),
        queue_size: 4,
        queue_timeout: Duration::from_secs(30),
        auto: None,
        priorities: None,
    });
    let r = router(cfg).await;
    let gauge = "smg_pd_prefill_admission_inflight_tokens{";
    p.controls().set_hang(true);
    let addr = r.addr();
    // "héllo": 6 tokens for the byte-level tokenizer; the HTTP estimate would be 2 (6 bytes).
    let held = tokio::spawn(async move { post(addr, "/generate", r#"{"text":"héllo"}"#).await });
    assert!(eventually(WAIT, || p.controls().hung() == 1).await);
    assert!(eventually(WAIT, || metric(&r, gauge) == Some(6.0)).await);
    p.controls().set_hang(false);
    let reply = held.await.unwrap();
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        eventually(WAIT, || metric(&r, gauge) == Some(0.0)
            && total_load(&r) == 0)
        .await
    );
}

#[tokio::test]
async fn long_prompts_go_on_a_second_connection_so_short_ones_are_not_queued_behind_them() {
    let (p, d, cfg) = pair(2).await;
    let r = router(cfg).await;
    let reply = post(r.addr(), "/generate", r#"{"text":"hi"}"#).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    // Counted on the Decode mock: the router is the only one to connect to it (the Decode mock
    // itself connects to the Prefill mock's port for KV rooms).
    let before = d.stats().connections_total;
    // Just above the bulk threshold (text plus four bytes per id): byte-level ids, one per byte.
    let long = "w".repeat(14 * 1024);
    let body = serde_json::json!({ "text": long }).to_string();
    for _ in 0..2 {
        let reply = post(r.addr(), "/generate", &body).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let bulk = d.stats().connections_total;
    assert_eq!(bulk, before + 1, "one bulk connection per worker, reused");
    // Both legs carry the same message (encoded once for the two): the whole prompt, one
    // byte-level id per byte, and the same request id and KV ticket.
    let decoded = d.stats().last_request.unwrap();
    let ids = decoded["input_ids"].as_array().unwrap();
    assert_eq!(ids.len(), 14 * 1024);
    assert!(ids.iter().all(|id| id == u32::from(b'w')));
    assert_eq!(decoded["original_text"], long.as_str());
    assert!(decoded["disaggregated_params"]["bootstrap_room"].is_number());
    assert_eq!(p.stats().last_request.unwrap(), decoded);
    // Short prompts stay on the first connection; a prompt at the threshold too.
    let short = serde_json::json!({ "text": "w".repeat(12 * 1024) }).to_string();
    for b in [r#"{"text":"hi"}"#, short.as_str()] {
        let reply = post(r.addr(), "/generate", b).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(d.stats().connections_total, bulk);
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

/// Long prompts' streams are relayed at normal priority (only their encoding runs at idle
/// priority): once a long prompt's stream has started, every core is kept busy by
/// normal-priority threads, and the stream still runs to its end. The busy threads stop only
/// once it has, so the rest of the stream was relayed under saturation; its pace is printed,
/// not asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_prompt_streams_make_progress_while_the_cpu_is_saturated() {
    use http_body_util::BodyExt as _;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let (_p, d, cfg) = pair_tuned(|c| {
        c.output_tokens = 200;
        c.token_interval = Duration::from_millis(2);
    })
    .await;
    let r = router(cfg).await;
    // Above the bulk threshold: this prompt goes on the bulk lane.
    let long = "w".repeat(20 * 1024);
    let body = serde_json::json!({ "text": long, "stream": true }).to_string();
    let (status, mut stream) = open_stream(r.addr(), "/generate", body.leak()).await;
    assert_eq!(status, 200);
    let mut text = Vec::new();
    let first = stream.frame().await.expect("a first frame").unwrap();
    text.extend_from_slice(first.data_ref().expect("data"));
    let stop = Arc::new(AtomicBool::new(false));
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let hogs: Vec<_> = (0..cores)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let started = tokio::time::Instant::now();
    let mut frames = 1;
    while let Some(frame) = stream.frame().await {
        if let Some(data) = frame.unwrap().data_ref() {
            text.extend_from_slice(data);
            frames += 1;
        }
    }
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    for h in hogs {
        h.join().unwrap();
    }
    eprintln!("long-prompt stream beside {cores} busy threads: {frames} frames, {took:?}");
    let text = String::from_utf8(text).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let events = sse_events(&text);
    let last = events.last().unwrap();
    assert_eq!(last["meta_info"]["completion_tokens"], 200, "{last}");
    let sent = d.stats().last_request.unwrap();
    assert_eq!(sent["input_ids"].as_array().unwrap().len(), 20 * 1024);
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}
