//! vLLM workers over gRPC, end to end against mock workers speaking only vLLM's engine
//! protocol: runtime detection, regular mode (sampling fields sent as vLLM's message holds
//! them), PD over NIXL (the Prefill capped and read whole before Decode, its returned params
//! verbatim on Decode's call, the KV pulled), a Prefill that ends early (recomputed),
//! several samples skipping the Prefill, Mooncake (both legs at once, one transfer id, the
//! rank's engine id), LMCache, refused pairs, prompt logprobs from the Prefill, `/workers`,
//! and nothing held afterwards.

use std::time::Duration;

use crate::support::*;
use pdrouter::RouterHandle;
use pdrouter::config::{Config, Mode};
use pdrouter::grpc::runtime::Runtime;
use pdrouter_mock::{GrpcRuntime, KvConnectorKind};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(10);

async fn vllm(role: Role, kv: KvConnectorKind, tune: impl FnOnce(&mut MockConfig)) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.grpc = true;
    cfg.grpc_runtime = GrpcRuntime::Vllm;
    cfg.kv_connector = kv;
    tune(&mut cfg);
    MockWorker::start(cfg).await.expect("mock starts")
}

/// A gRPC PD router over `p` and `d` with admission on (a limit these tests never reach):
/// every request takes and releases a Prefill slot.
async fn pd_router(p: &MockWorker, d: &MockWorker, tune: impl FnOnce(&mut Config)) -> RouterHandle {
    let mut cfg = pd_config(&[p], &[d]);
    cfg.mode = Mode::PdGrpc;
    cfg.workers[0].bootstrap_port = p.bootstrap_addr().map(|a| a.port());
    cfg.admission = admission(64, 16, 30);
    tune(&mut cfg);
    router(cfg).await
}

fn last(w: &MockWorker) -> Value {
    w.stats()
        .last_request
        .expect("a request reached the worker")
}

/// The sampling parameters of the last request `w` received.
fn sampling(w: &MockWorker) -> Value {
    last(w)["sampling_params"].clone()
}

/// A prompt of several KV blocks (so a relay shows as cached tokens).
const PROMPT: &str = "one two three four five six seven eight nine ten eleven twelve \
    thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty";

fn completion(extra: &str) -> String {
    format!(r#"{{"prompt":"{PROMPT}","max_tokens":4{extra}}}"#)
}

#[tokio::test]
async fn regular_mode_sends_vllms_message() {
    let w = vllm(Role::Regular, KvConnectorKind::Nixl, |c| {
        c.output_tokens = 3
    })
    .await;
    let r = router(regular_config(&[&w])).await;
    let reply = post(r.addr(), "/v1/completions", &completion("")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        !reply.json()["choices"][0]["text"]
            .as_str()
            .unwrap()
            .is_empty()
    );
    let req = sampling(&w);
    // Left unset by the client: absent, the engine's defaults apply.
    assert_eq!(req["temperature"], Value::Null, "{req}");
    assert_eq!(req["max_tokens"], 4);
    assert_eq!(last(&w)["kv_transfer_params_json"], Value::Null);
    let body =
        r#"{"messages":[{"role":"user","content":"hi"}],"temperature":0,"top_k":-1,"stream":true}"#;
    let reply = post(r.addr(), "/v1/chat/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(reply.text().trim_end().ends_with("data: [DONE]"));
    let req = sampling(&w);
    assert_eq!(req["temperature"], 0.0, "an explicit zero is sent: {req}");
    assert_eq!(req["top_k"], 0, "SGLang's -1 is vLLM's 0: {req}");
    assert_eq!(req["max_tokens"], Value::Null, "{req}");
    assert_eq!(last(&w)["stream"], true);
    let runtime = r.registry().snapshot().all()[0].runtime();
    assert_eq!(runtime, Some(Runtime::Vllm));
    assert!(eventually(WAIT, || total_load(&r) == 0).await);
}

#[tokio::test]
async fn nixl_prefill_params_reach_decode_and_the_kv_moves() {
    let p = vllm(Role::Prefill, KvConnectorKind::Nixl, |_| {}).await;
    let d = vllm(Role::Decode, KvConnectorKind::Nixl, |c| c.output_tokens = 4).await;
    let r = pd_router(&p, &d, |_| {}).await;
    for (path, body) in [
        ("/v1/completions", completion(",\"min_tokens\":2")),
        (
            "/v1/chat/completions",
            format!(
                r#"{{"messages":[{{"role":"user","content":"{PROMPT}"}}],"stream":true,"max_completion_tokens":4}}"#
            ),
        ),
    ] {
        let reply = post(r.addr(), path, &body).await;
        assert_eq!(reply.status, 200, "{path}: {}", reply.text());
        let pr = last(&p);
        assert_eq!(pr["sampling_params"]["max_tokens"], 1, "{pr}");
        assert_eq!(pr["sampling_params"]["min_tokens"], 0, "{pr}");
        assert_eq!(pr["stream"], false);
        assert_eq!(
            pr["kv_transfer_params_json"],
            serde_json::json!({"do_remote_decode": true, "do_remote_prefill": false})
        );
        let dr = last(&d);
        let cap = &dr["sampling_params"]["max_tokens"];
        assert_eq!(cap, 4, "Decode keeps the client's cap: {dr}");
        let kv = &dr["kv_transfer_params_json"];
        assert_eq!(kv["do_remote_prefill"], true, "{dr}");
        assert_eq!(kv["remote_port"], p.addr().port());
        assert_eq!(pr["input_ids"], dr["input_ids"]);
        if path == "/v1/completions" {
            let usage = &reply.json()["usage"];
            let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64();
            assert!(cached.unwrap() > 0, "the KV was relayed: {usage}");
        } else {
            assert!(reply.text().trim_end().ends_with("data: [DONE]"));
        }
    }
    assert!(
        eventually(WAIT, || p.stats().kv_held_requests == 0).await,
        "pulled"
    );
    assert_eq!(d.stats().kv_relayed_total, 2);
    assert_eq!(kv_handoffs(&r, "relayed"), 2.0);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn an_early_ended_prefill_is_recomputed_and_several_samples_skip_it() {
    let p = vllm(Role::Prefill, KvConnectorKind::Nixl, |_| {}).await;
    let d = vllm(Role::Decode, KvConnectorKind::Nixl, |c| c.output_tokens = 3).await;
    let r = pd_router(&p, &d, |_| {}).await;
    let body = r#"{"prompt":"stop here [[eos]] please","max_tokens":3}"#;
    let reply = post(r.addr(), "/v1/completions", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let cached = &reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert_eq!(cached, 0);
    assert_eq!(last(&d)["kv_transfer_params_json"], Value::Null);
    assert_eq!(kv_handoffs(&r, "recomputed"), 1.0);
    assert_eq!(p.stats().kv_held_requests, 0);

    let prefills = p.stats().requests_total;
    let reply = post(r.addr(), "/v1/completions", &completion(",\"n\":2")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.json()["choices"].as_array().unwrap().len(), 2);
    assert_eq!(p.stats().requests_total, prefills, "the Prefill is skipped");
    assert_eq!(sampling(&d)["n"], 2);
    assert_eq!(kv_handoffs(&r, "skipped"), 1.0);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn mooncake_legs_share_a_transfer_id_and_the_ranks_engine_id() {
    let p = vllm(Role::Prefill, KvConnectorKind::Mooncake, |c| c.dp_size = 2).await;
    let d = vllm(Role::Decode, KvConnectorKind::Mooncake, |c| {
        c.output_tokens = 4
    })
    .await;
    let r = pd_router(&p, &d, |_| {}).await;
    let query = get(p.bootstrap_addr().unwrap(), "/query").await.json();
    for _ in 0..4 {
        let reply = post(r.addr(), "/v1/completions", &completion("")).await;
        assert_eq!(reply.status, 200, "{}", reply.text());
        let cached = &reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"];
        assert!(cached.as_u64().unwrap() > 0, "{}", reply.text());
        let (pr, dr) = (last(&p), last(&d));
        let (pk, dk) = (
            &pr["kv_transfer_params_json"],
            &dr["kv_transfer_params_json"],
        );
        assert_eq!(pk["do_remote_decode"], true, "{pr}");
        assert_eq!(pk["transfer_id"], dk["transfer_id"]);
        let rank = pr["data_parallel_rank"]
            .as_u64()
            .expect("the Prefill's rank");
        assert_eq!(dk["remote_engine_id"], query[rank.to_string()]["engine_id"]);
        let port = p.bootstrap_addr().unwrap().port();
        assert_eq!(
            dk["remote_bootstrap_addr"],
            format!("http://127.0.0.1:{port}")
        );
        assert_eq!(pr["sampling_params"]["max_tokens"], 1);
    }
    assert_eq!(d.stats().kv_relayed_total, 4);
    assert!(eventually(WAIT, || p.stats().kv_held_requests == 0).await);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn lmcache_prefill_runs_first_without_params() {
    let peer = vllm(Role::Decode, KvConnectorKind::LmCache, |c| {
        c.output_tokens = 2
    })
    .await;
    let p = vllm(Role::Prefill, KvConnectorKind::LmCache, |c| {
        c.lmcache_peer = Some(peer.url().replace("grpc://", "http://"))
    })
    .await;
    let r = pd_router(&p, &peer, |_| {}).await;
    let reply = post(r.addr(), "/v1/completions", &completion("")).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let pr = last(&p);
    assert_eq!(pr["sampling_params"]["max_tokens"], 1);
    assert_eq!(pr["kv_transfer_params_json"], Value::Null);
    assert_eq!(last(&peer)["kv_transfer_params_json"], Value::Null);
    let cached = &reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert!(
        cached.as_u64().unwrap() > 0,
        "LMCache had the prompt: {}",
        reply.text()
    );
    assert_legs_released(&r, &p, &peer).await;
}

#[tokio::test]
async fn a_pair_of_two_connectors_is_refused_before_anything_is_sent() {
    let p = vllm(Role::Prefill, KvConnectorKind::Nixl, |_| {}).await;
    let d = vllm(Role::Decode, KvConnectorKind::Mooncake, |_| {}).await;
    let r = pd_router(&p, &d, |_| {}).await;
    let reply = post(r.addr(), "/v1/completions", &completion("")).await;
    assert_eq!(reply.status, 501, "{}", reply.text());
    let msg = reply.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(msg.contains("nixl") && msg.contains("mooncake"), "{msg}");
    assert_eq!(p.stats().requests_total, 0);
    assert_eq!(d.stats().requests_total, 0);
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn prompt_logprobs_come_from_the_prefill_cut_to_the_start() {
    let p = vllm(Role::Prefill, KvConnectorKind::Nixl, |_| {}).await;
    let d = vllm(Role::Decode, KvConnectorKind::Nixl, |c| c.output_tokens = 2).await;
    let r = pd_router(&p, &d, |_| {}).await;
    let body = r#"{"text":"a b c d e f","return_logprob":true,"logprob_start_len":2,"sampling_params":{"max_new_tokens":2}}"#;
    let reply = post(r.addr(), "/generate", body).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let meta = &reply.json()["meta_info"];
    let input = meta["input_token_logprobs"]
        .as_array()
        .expect("prompt logprobs");
    let prompt = last(&p)["input_ids"].as_array().unwrap().len();
    assert_eq!(input.len(), prompt - 2, "{meta}");
    assert_eq!(sampling(&p)["prompt_logprobs"], 0, "asked of the Prefill");
    assert_eq!(
        sampling(&d)["prompt_logprobs"],
        Value::Null,
        "not of Decode"
    );
    assert_legs_released(&r, &p, &d).await;
}

#[tokio::test]
async fn workers_show_the_runtime_and_the_reported_connector() {
    let p = vllm(Role::Prefill, KvConnectorKind::Mooncake, |_| {}).await;
    let d = vllm(Role::Decode, KvConnectorKind::Mooncake, |_| {}).await;
    let r = pd_router(&p, &d, |c| c.health.enabled = true).await;
    let ready = eventually(WAIT, || {
        r.registry()
            .snapshot()
            .all()
            .iter()
            .all(|w| w.kv_connector() == Some(pdrouter::config::KvConnector::Mooncake))
    })
    .await;
    assert!(ready, "the connector is learned from GetServerInfo");
    let workers = get(r.addr(), "/workers").await.json();
    for w in workers["workers"].as_array().unwrap() {
        assert_eq!(w["runtime"], "vllm", "{w}");
        assert_eq!(w["kv_connector"], "mooncake", "{w}");
    }
    let info = get(r.addr(), "/get_server_info").await.json();
    assert!(info.to_string().contains("MooncakeConnector"), "{info}");
}
