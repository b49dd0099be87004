//! Prompt logprobs in HTTP PD: wherever Decode's answer (or each of its events) carries
//! `meta_info.input_token_logprobs`, the client sees the Prefill's list followed by Decode's —
//! what one regular worker answers. The mocks split the prompt's list between the roles (the
//! Prefill reports all positions but the last, Decode the last), so a merged answer equals a
//! regular mock's answer and a missing or misordered half shows.

use std::time::Duration;

use crate::support::*;
use serde_json::{Value, json};

/// How long any single step may take before the test gives up (never a pass condition).
const PATIENCE: Duration = Duration::from_secs(30);

struct Pd {
    _p: MockWorker,
    _d: MockWorker,
    regular: MockWorker,
    r: pdrouter::RouterHandle,
}

async fn pd() -> Pd {
    let p = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let regular = mock(Role::Regular, 0).await;
    let r = router(pd_config(&[&p], &[&d])).await;
    Pd {
        _p: p,
        _d: d,
        regular,
        r,
    }
}

fn sse_events(text: &str) -> Vec<Value> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).expect("event JSON"))
        .collect()
}

fn prompt_list(item: &Value) -> Value {
    item["meta_info"]["input_token_logprobs"].clone()
}

/// What a regular worker answers for `body` (without the PD-only fields).
async fn single_server(s: &Pd, body: &str) -> Value {
    let reply = post(s.regular.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    reply.json()
}

#[tokio::test]
async fn non_streaming_answers_get_the_prefill_list_first() {
    let s = pd().await;
    let body =
        r#"{"input_ids":[5,6,7,8,9],"return_logprob":true,"sampling_params":{"max_new_tokens":3}}"#;
    let reply = post(s.r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        reply
            .header("content-length")
            .is_none_or(|l| l == reply.body.len().to_string()),
        "a stale content-length"
    );
    let v = reply.json();
    let want = single_server(&s, body).await;
    assert_eq!(prompt_list(&v), prompt_list(&want));
    assert_eq!(prompt_list(&v).as_array().unwrap().len(), 5);
    assert_eq!(
        v["meta_info"]["output_token_logprobs"],
        want["meta_info"]["output_token_logprobs"]
    );

    // Batches: each item gets its own prompt's list.
    let body = r#"{"input_ids":[[1,2,3],[4,5,6,7]],"return_logprob":true,"sampling_params":{"max_new_tokens":2}}"#;
    let reply = post(s.r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let items = reply.json();
    let want = single_server(&s, body).await;
    let items = items.as_array().expect("a batch answers an array");
    assert_eq!(items.len(), 2);
    for (got, want) in items.iter().zip(want.as_array().unwrap()) {
        assert_eq!(prompt_list(got), prompt_list(want));
    }
    assert_eq!(prompt_list(&items[1]).as_array().unwrap().len(), 4);
    assert!(eventually(PATIENCE, || total_load(&s.r) == 0).await);
}

#[tokio::test]
async fn every_streamed_event_gets_the_prefill_list_first() {
    let s = pd().await;
    // The Prefill answers a streaming request with SSE, so this also reads an SSE Prefill.
    let body = r#"{"input_ids":[3,1,4,1,5,9],"return_logprob":true,"stream":true,"sampling_params":{"max_new_tokens":4}}"#;
    let reply = post(s.r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let text = reply.text();
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    let events = sse_events(&text);
    assert_eq!(events.len(), 4, "{text}");
    let regular = post(s.regular.addr(), "/generate", body).await.text();
    let regular = prompt_list(&sse_events(&regular)[0]);
    assert_eq!(regular.as_array().unwrap().len(), 6);
    for e in &events {
        assert_eq!(prompt_list(e), regular, "{e}");
    }

    // A streamed batch: events are matched by their index.
    let body = r#"{"text":["abcdefgh","abcdefghijkl"],"return_logprob":true,"stream":true,"sampling_params":{"max_new_tokens":2}}"#;
    let reply = post(s.r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let events = sse_events(&reply.text());
    assert_eq!(events.len(), 4);
    for e in &events {
        let n = e["meta_info"]["prompt_tokens"].as_u64().unwrap() as usize;
        let list = prompt_list(e);
        let list = list.as_array().unwrap();
        assert_eq!(list.len(), n, "{e}");
        assert_eq!(list[0], json!([null, 0, null]));
        assert_eq!(list[n - 1][1], json!(n - 1));
    }
    assert!(eventually(PATIENCE, || total_load(&s.r) == 0).await);
}

#[tokio::test]
async fn without_return_logprob_answers_are_relayed_unchanged() {
    let s = pd().await;
    let reply = post(s.r.addr(), "/generate", r#"{"input_ids":[1,2,3]}"#).await;
    assert_eq!(reply.status, 200);
    assert!(
        reply.json()["meta_info"]
            .get("input_token_logprobs")
            .is_none()
    );
    // Asked for through a per-prompt list: merged.
    let reply = post(
        s.r.addr(),
        "/generate",
        r#"{"input_ids":[[1,2,3]],"return_logprob":[true]}"#,
    )
    .await;
    assert_eq!(prompt_list(&reply.json()[0]).as_array().unwrap().len(), 3);
}

/// The Prefill body stays open after Decode is done: the slot and load are released as
/// without logprobs, and the answer, which needs the Prefill's list, completes once the
/// Prefill body ends (within the grace).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_body_outliving_decode_frees_its_slot_before_the_merge() {
    let p = mock(Role::Prefill, 0).await;
    p.controls().set_hold_body_open(true);
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p], &[&d]);
    cfg.admission = admission(1, 4, 60);
    cfg.prefill_grace_after_decode = Duration::from_secs(3600);
    let r = router(cfg).await;
    let adm = r.admission().unwrap().clone();
    let addr = r.addr();
    for stream in [false, true] {
        let body = format!(
            r#"{{"input_ids":[7,8,9],"return_logprob":true,"stream":{stream},"sampling_params":{{"max_new_tokens":2}}}}"#
        );
        p.controls().set_hold_body_open(true);
        let answer = tokio::spawn(async move { post(addr, "/generate", &body).await });
        assert!(
            eventually(PATIENCE, || p.stats().requests_total >= 1
                && adm.inflight_total() == 0
                && p.stats().inflight == 1)
            .await,
            "slot {} prefill inflight {}",
            adm.inflight_total(),
            p.stats().inflight
        );
        assert!(
            !answer.is_finished(),
            "the merge waits for the Prefill's list"
        );
        p.controls().set_hold_body_open(false);
        let reply = tokio::time::timeout(PATIENCE, answer)
            .await
            .expect("completes once the Prefill body ends")
            .unwrap();
        assert_eq!(reply.status, 200, "{}", reply.text());
        let first = if stream {
            sse_events(&reply.text())[0].clone()
        } else {
            reply.json()
        };
        assert_eq!(
            prompt_list(&first),
            json!([[null, 7, null], [-0.125, 8, null], [-0.1875, 9, null]])
        );
        assert!(eventually(PATIENCE, || p.stats().inflight == 0).await);
    }
    r.shutdown(Duration::from_secs(1)).await;
}

#[tokio::test]
async fn a_prefill_answer_over_the_capture_limit_is_a_bad_response() {
    let s = pd().await;
    // About 20 bytes of logprobs per prompt id: 80,000 ids answer well over 1 MiB.
    let ids: Vec<String> = (0..80_000).map(|i| (i % 50_000).to_string()).collect();
    let body = format!(
        r#"{{"input_ids":[{}],"return_logprob":true,"sampling_params":{{"max_new_tokens":1}}}}"#,
        ids.join(",")
    );
    let reply = post(s.r.addr(), "/generate", &body).await;
    assert_eq!(reply.status, 502, "{}", reply.text());
    assert_eq!(reply.error_code(), "prefill_bad_response");
    assert!(
        reply.text().contains("1048576-byte limit"),
        "{}",
        reply.text()
    );
    assert!(eventually(PATIENCE, || total_load(&s.r) == 0).await);
    // Without logprobs the same prompt is relayed as usual.
    let body = body.replace(r#""return_logprob":true,"#, "");
    assert_eq!(post(s.r.addr(), "/generate", &body).await.status, 200);
}
