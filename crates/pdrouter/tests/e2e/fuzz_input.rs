//! Seeded fuzzing of request bodies and headers: whatever a client sends, the router answers
//! with a status that is not 500, in the documented error shape when it is an error, and nothing
//! leaks.

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
