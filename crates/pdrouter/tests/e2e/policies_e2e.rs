//! manual, prefix_hash and bucket through the router, and `--model-alias`: which worker each
//! request reached is read from the mocks' own request counters.

use crate::support::*;
use pdrouter::config::WorkerType;
use pdrouter_policy::{AssignmentMode, PolicyKind};

async fn three() -> Vec<MockWorker> {
    let mut ws = Vec::new();
    for _ in 0..3 {
        ws.push(mock(Role::Regular, 0).await);
    }
    ws
}

fn counts(ws: &[MockWorker]) -> Vec<u64> {
    ws.iter().map(|w| w.stats().requests_total).collect()
}

fn completion(prompt: &str) -> String {
    serde_json::json!({ "prompt": prompt, "max_tokens": 1 }).to_string()
}

#[tokio::test]
async fn manual_pins_each_routing_key_and_min_group_spreads_keys() {
    let ws = three().await;
    let mut cfg = regular_config(&ws.iter().collect::<Vec<_>>());
    cfg.policy = PolicyKind::Manual;
    cfg.manual.assignment_mode = AssignmentMode::MinGroup;
    let r = router(cfg).await;
    for key in ["alice", "bob", "carol"] {
        let before = counts(&ws);
        for _ in 0..4 {
            let reply = send(
                r.addr(),
                "POST",
                "/v1/completions",
                completion("hi"),
                &[("x-smg-routing-key", key)],
            )
            .await;
            assert_eq!(reply.status, 200, "{}", reply.text());
        }
        let after = counts(&ws);
        let moved: Vec<u64> = after.iter().zip(&before).map(|(a, b)| a - b).collect();
        assert_eq!(
            moved.iter().filter(|&&n| n == 4).count(),
            1,
            "{key}: {moved:?}"
        );
    }
    // min_group gave each key its own worker.
    assert_eq!(counts(&ws), [4, 4, 4]);
}

#[tokio::test]
async fn prefix_hash_keeps_a_shared_prefix_on_one_worker() {
    let ws = three().await;
    let mut cfg = regular_config(&ws.iter().collect::<Vec<_>>());
    cfg.policy = PolicyKind::PrefixHash;
    // 4 tokens: the first 16 characters of the prompt.
    cfg.prefix_hash.prefix_token_count = 4;
    let r = router(cfg).await;
    for i in 0..12 {
        let reply = post(
            r.addr(),
            "/v1/completions",
            &completion(&format!("You are helpful. Question {i}")),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let mut c = counts(&ws);
    c.sort_unstable();
    assert_eq!(c, [0, 0, 12]);
    // Different prefixes spread.
    for i in 0..24 {
        post(
            r.addr(),
            "/v1/completions",
            &completion(&format!("{i:02} differs early on, same later")),
        )
        .await;
    }
    assert!(counts(&ws).iter().filter(|&&n| n > 0).count() >= 2);
}

/// With a tokenizer the key is the first N token ids (here one byte each), not 4N characters.
#[tokio::test]
async fn prefix_hash_uses_the_tokenizer_when_given() {
    let dir = tempfile::tempdir().unwrap();
    for (name, data) in pdrouter_tokenizer::bytelevel::files() {
        std::fs::write(dir.path().join(name), data).unwrap();
    }
    let ws = three().await;
    let mut cfg = regular_config(&ws.iter().collect::<Vec<_>>());
    cfg.policy = PolicyKind::PrefixHash;
    cfg.prefix_hash.prefix_token_count = 4;
    cfg.tokenizer.tokenizer_path = Some(dir.path().to_owned());
    let r = router(cfg).await;
    // Same first 4 bytes, different from the 5th on: one key with the tokenizer (16
    // characters without it would differ).
    for i in 0..12 {
        let reply = post(
            r.addr(),
            "/v1/completions",
            &completion(&format!("abcd{i:02}-varies-within-sixteen")),
        )
        .await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    let mut c = counts(&ws);
    c.sort_unstable();
    assert_eq!(c, [0, 0, 12]);
}

#[tokio::test]
async fn bucket_sends_short_and_long_prompts_to_different_prefill_workers() {
    let p0 = mock(Role::Prefill, 0).await;
    let p1 = mock(Role::Prefill, 0).await;
    let d = mock(Role::Decode, 0).await;
    let mut cfg = pd_config(&[&p0, &p1], &[&d]);
    cfg.prefill_policy = PolicyKind::Bucket;
    // Length alone decides (no load-balance override) for this check.
    cfg.cache.balance_abs_threshold = 1_000_000;
    let r = router(cfg).await;
    for _ in 0..3 {
        let reply = post(r.addr(), "/v1/completions", &completion("short prompt")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    // Before any traffic the first 4096 characters are split evenly: 2048+ is p1's.
    let long = "word ".repeat(700);
    for _ in 0..2 {
        let reply = post(r.addr(), "/v1/completions", &completion(&long)).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(p0.stats().requests_total, 3);
    assert_eq!(p1.stats().requests_total, 2);
}

#[tokio::test]
async fn a_model_alias_reaches_the_workers_of_its_model() {
    let w = mock(Role::Regular, 0).await;
    let mut cfg = regular_config(&[&w]);
    cfg.model_aliases = vec![("friendly-name".into(), "mock-model".into())];
    let r = router(cfg).await;
    assert!(
        r.registry().snapshot().of_type(WorkerType::Regular)[0]
            .model_id()
            .is_some(),
        "the worker's model is known"
    );
    let chat = |model: &str| {
        serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "hi"}]
        })
        .to_string()
    };
    let ok = post(r.addr(), "/v1/chat/completions", &chat("friendly-name")).await;
    assert_eq!(ok.status, 200, "{}", ok.text());
    let unknown = post(r.addr(), "/v1/chat/completions", &chat("other-name")).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.error_code(), "model_not_found");
    assert_eq!(w.stats().requests_total, 1);
}
