//! `pdrouter demo` (HTTP mocks), `pdrouter demo --grpc` (gRPC mocks, the router tokenizing
//! with the tokenizer they serve) and `pdrouter demo --epd` (an image request through its
//! Encode mock) start, answer a chat request, and stop on SIGTERM.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::Value;
use support::*;

/// Starts the demo on a free port without its burst; returns the child and the router's
/// address from its banner, once the demo says it is serving. Its output keeps being read
/// (a closed pipe would fail its later prints).
fn start_demo(extra: &[&str]) -> (Child, std::net::SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_pdrouter"))
        .args(["demo", "--port", "0", "--burst", "false"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("pdrouter demo starts");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.expect("demo output");
        if let Some(rest) = line.strip_prefix("pdrouter demo: PD router on http://") {
            let a = rest.split_whitespace().next().unwrap_or_default();
            addr = Some(a.parse().expect("an address in the banner"));
        }
        if line.starts_with("Serving until") {
            break;
        }
    }
    std::thread::spawn(move || lines.for_each(drop));
    (child, addr.expect("the demo's banner"))
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
    let v = demo_answer(args, CHAT).await;
    let text = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!text.is_empty(), "{v}");
}

/// Starts `pdrouter demo ARGS`, posts the chat `body`, checks it is answered (200, a chat
/// completion) and that the demo stops cleanly on SIGTERM; returns the answer.
async fn demo_answer(args: &'static [&'static str], body: &str) -> Value {
    let (mut child, addr) = tokio::task::spawn_blocking(move || start_demo(args))
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
    v
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
