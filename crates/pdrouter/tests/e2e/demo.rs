//! `pdrouter demo` (HTTP mocks), `pdrouter demo --grpc` (gRPC mocks, the router tokenizing
//! with the tokenizer they serve) and `pdrouter demo --epd` (an image request through its
//! Encode mock) start, answer a chat request, and stop on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::*;
use serde_json::Value;

/// Starts the demo on a free port without its burst; returns the child, the router's
/// address from its banner and what it printed, once the demo says it is serving. Its output
/// keeps being read (a closed pipe would fail its later prints).
fn start_demo(extra: &[&str]) -> (Child, std::net::SocketAddr, Vec<String>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pdrouter"))
        .args(["demo", "--port", "0", "--burst", "false"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("pdrouter demo starts");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let mut addr = None;
    let mut printed = Vec::new();
    for line in lines.by_ref() {
        let line = line.expect("demo output");
        printed.push(line.clone());
        if let Some(rest) = line.strip_prefix("pdrouter demo: PD router on http://") {
            let a = rest.split_whitespace().next().unwrap_or_default();
            addr = Some(a.parse().expect("an address in the banner"));
        }
        if line.starts_with("Serving until") {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr.expect("the demo's banner"), printed)
}

over_transports!(
    [http => Http, grpc => Grpc, vllm => Vllm]
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    demo_answers_a_chat_request
);

async fn demo_answers_a_chat_request(t: Transport) {
    let args: &'static [&'static str] = match t {
        Transport::Http => &[],
        Transport::Grpc => &["--grpc"],
        Transport::Vllm => &["--vllm"],
        Transport::TokenSpeed | Transport::GrpcVllm => {
            unreachable!("the demo runs SGLang's or vLLM's HTTP protocol")
        }
    };
    let (v, printed) = demo_answer(args, CHAT).await;
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty(), "{v}");
    if t == Transport::Grpc {
        // The agent example: the model's reasoning and its call, parsed by the router.
        let printed = printed.join("\n");
        for line in [
            "reasoning_content: \"The user wants the weather in Paris; get_weather gives it.\"",
            "content:           \"Let me look that up.\"",
            r#"tool_calls[0]:     get_weather {"city":"Paris"}"#,
            "finish_reason:     \"tool_calls\"",
        ] {
            assert!(printed.contains(line), "{line} in\n{printed}");
        }
    }
}

/// Starts `pdrouter demo ARGS`, posts the chat `body`, checks it is answered (200, a chat
/// completion) and that the demo stops cleanly on SIGTERM; returns the answer and what the
/// demo printed before serving.
async fn demo_answer(args: &'static [&'static str], body: &str) -> (Value, Vec<String>) {
    let (mut child, addr, printed) = tokio::task::spawn_blocking(move || start_demo(args))
        .await
        .unwrap();
    let reply = tokio::time::timeout(
        Duration::from_secs(30),
        post(addr, "/v1/chat/completions", body),
    )
    .await
    .expect("answered in time");
    assert_eq!(reply.status, 200, "{}", reply.text());
    let v = reply.json();
    assert_eq!(v["object"], "chat.completion");
    sigterm(&child);
    let status = tokio::task::spawn_blocking(move || child.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    (v, printed)
}

/// `pdrouter demo --epd` answers a chat request with an image through its Encode mock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epd_demo_answers_an_image_request() {
    // The 8 x 8 PNG of the demo's banner.
    let body = r#"{"model":"mock-model","messages":[{"role":"user","content":[
        {"type":"text","text":"What is this?"},
        {"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAAEUlEQVR4nGM4ISeHFTEMLQkAkL9BAbKfPiIAAAAASUVORK5CYII="}}]}]}"#;
    demo_answer(&["--epd"], body).await;
}
