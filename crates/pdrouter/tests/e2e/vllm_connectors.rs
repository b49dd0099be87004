//! vLLM PD over the Mooncake and LMCache connectors, against the mock's vLLM mode: the
//! Mooncake legs at once with one transfer id, Decode told the Prefill's bootstrap address and
//! its DP rank's engine id; LMCache's Prefill capped at one token, then Decode with the
//! client's body; and the per-worker runtime and connector of `POST /workers`.

use std::time::Duration;

use crate::support::*;
use pdrouter::RouterHandle;
use pdrouter::config::KvConnector;
use pdrouter_mock::{HttpRuntime, KvConnectorKind};

async fn vllm(
    role: Role,
    connector: KvConnectorKind,
    tune: impl FnOnce(&mut MockConfig),
) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.http_runtime = HttpRuntime::Vllm;
    cfg.kv_connector = connector;
    tune(&mut cfg);
    MockWorker::start(cfg).await.expect("mock starts")
}

async fn connector_router(p: &MockWorker, d: &MockWorker, connector: KvConnector) -> RouterHandle {
    let mut cfg = pd_config(&[p], &[d]);
    cfg.workers[0].bootstrap_port = p.bootstrap_addr().map(|a| a.port());
    cfg.kv_connector = connector;
    cfg.admission = admission(64, 16, 30);
    router(cfg).await
}

const PROMPT: &str = r#"{"prompt":"abcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcd","max_tokens":4}"#;

#[tokio::test]
async fn mooncake_legs_share_a_transfer_id_and_the_kv_moves() {
    let p = vllm(Role::Prefill, KvConnectorKind::Mooncake, |_| {}).await;
    let d = vllm(Role::Decode, KvConnectorKind::Mooncake, |c| {
        c.output_tokens = 4
    })
    .await;
    let r = connector_router(&p, &d, KvConnector::Mooncake).await;
    let reply = post(r.addr(), "/v1/completions", PROMPT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    assert!(cached.as_u64().unwrap() > 0, "{}", reply.text());
    let pk = p.stats().last_request.unwrap()["kv_transfer_params"].clone();
    let dk = d.stats().last_request.unwrap()["kv_transfer_params"].clone();
    assert_eq!(pk["do_remote_decode"], true);
    assert_eq!(pk["transfer_id"], dk["transfer_id"]);
    let port = p.bootstrap_addr().unwrap().port();
    assert_eq!(
        dk["remote_bootstrap_addr"],
        format!("http://127.0.0.1:{port}")
    );
    assert_eq!(dk["do_remote_prefill"], true);
    assert_eq!(p.stats().last_request.unwrap()["max_tokens"], 1);
    assert_eq!(d.stats().last_request.unwrap()["max_tokens"], 4);
    assert_eq!(d.stats().kv_relayed_total, 1);
    assert!(eventually(Duration::from_secs(10), || p.stats().kv_held_requests == 0).await);

    let stream = r#"{"messages":[{"role":"user","content":"abcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcdabcd"}],"stream":true}"#;
    let reply = post(r.addr(), "/v1/chat/completions", stream).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().trim_end().ends_with("data: [DONE]"));
    assert_eq!(d.stats().kv_relayed_total, 2);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn mooncake_decode_gets_the_engine_id_of_the_rank_its_prefill_ran_on() {
    let p = vllm(Role::Prefill, KvConnectorKind::Mooncake, |c| c.dp_size = 2).await;
    let d = vllm(Role::Decode, KvConnectorKind::Mooncake, |_| {}).await;
    let r = connector_router(&p, &d, KvConnector::Mooncake).await;
    let query = get(p.bootstrap_addr().unwrap(), "/query").await.json();
    for _ in 0..6 {
        let reply = post(r.addr(), "/v1/completions", PROMPT).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let rank = p.stats().last_headers.unwrap()["x-data-parallel-rank"][0].clone();
        let dk = d.stats().last_request.unwrap()["kv_transfer_params"].clone();
        assert_eq!(
            dk["remote_engine_id"], query[&rank]["engine_id"],
            "rank {rank}"
        );
    }
    assert_eq!(d.stats().kv_relayed_total, 6, "every pull found its blocks");
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn lmcache_prefill_is_capped_and_decode_finds_the_kv_by_its_prompt() {
    let d = vllm(Role::Decode, KvConnectorKind::LmCache, |c| {
        c.output_tokens = 4
    })
    .await;
    let p = vllm(Role::Prefill, KvConnectorKind::LmCache, |c| {
        c.lmcache_peer = Some(d.url());
    })
    .await;
    let r = connector_router(&p, &d, KvConnector::Lmcache).await;
    let reply = post(r.addr(), "/v1/completions", PROMPT).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let cached = reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"].clone();
    assert!(cached.as_u64().unwrap() > 0, "{}", reply.text());
    let prefill = p.stats().last_request.unwrap();
    assert_eq!(prefill["max_tokens"], 1);
    assert!(prefill.get("kv_transfer_params").is_none(), "{prefill}");
    let decode = d.stats().last_request.unwrap();
    assert_eq!(decode["max_tokens"], 4);
    assert!(decode.get("kv_transfer_params").is_none(), "{decode}");
    assert_eq!(d.stats().kv_relayed_total, 1);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn post_workers_takes_a_workers_runtime_and_connector() {
    let p = vllm(Role::Prefill, KvConnectorKind::Nixl, |_| {}).await;
    let d = vllm(Role::Decode, KvConnectorKind::Nixl, |_| {}).await;
    let r = connector_router(&p, &d, KvConnector::Nixl).await;
    let extra = vllm(Role::Decode, KvConnectorKind::LmCache, |_| {}).await;
    for (body, field) in [
        (
            format!(
                r#"{{"url":"{}","worker_type":"decode","runtime":"trtllm"}}"#,
                extra.url()
            ),
            "runtime",
        ),
        (
            format!(
                r#"{{"url":"{}","worker_type":"decode","kv_connector":"p2p"}}"#,
                extra.url()
            ),
            "kv_connector",
        ),
        (
            format!(
                r#"{{"url":"{}","worker_type":"decode","kv_connector":7}}"#,
                extra.url()
            ),
            "kv_connector",
        ),
    ] {
        let reply = post(r.addr(), "/workers", &body).await;
        assert_eq!(reply.status, 400, "{body}: {}", reply.text());
        assert!(reply.text().contains(field), "{}", reply.text());
    }
    let body = format!(
        r#"{{"url":"{}","worker_type":"decode","runtime":"vllm","kv_connector":"lmcache"}}"#,
        extra.url()
    );
    let reply = post(r.addr(), "/workers", &body).await;
    assert!((200..300).contains(&reply.status), "{}", reply.text());
    let workers = get(r.addr(), "/workers").await.json();
    let added = workers["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["url"] == extra.url())
        .cloned()
        .unwrap();
    assert_eq!(added["runtime"], "vllm");
    assert_eq!(added["kv_connector"], "lmcache");
    // A NIXL Prefill pairs only with a NIXL Decode: the LMCache one is never chosen.
    for _ in 0..4 {
        let reply = post(r.addr(), "/v1/completions", PROMPT).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
    }
    assert_eq!(extra.stats().requests_total, 0);
    assert_eq!(d.stats().requests_total, 4);
}
