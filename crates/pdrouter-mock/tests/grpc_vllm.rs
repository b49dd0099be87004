//! vLLM's engine gRPC protocol (`--grpc --runtime vllm`) through tonic clients: only vLLM's
//! service answers, generation over the shared engine model, and the KV hand-over of HTTP
//! vLLM mode (NIXL's pull, Mooncake's rendezvous by transfer id, LMCache's push) with the
//! same KV table and counters, shown by `/mock/stats`.

mod common;

use std::net::SocketAddr;

use common::{TIMEOUT, get, wait_until};
use hyper::StatusCode;
use pdrouter_mock::{
    GRPC_OUTPUT_TEXT, GrpcRuntime, HttpRuntime, KvConnectorKind, MockConfig, MockWorker, Role,
};
use pdrouter_proto::common::GetTokenizerRequest;
use pdrouter_proto::scheduler::HealthCheckRequest as SgHealth;
use pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient;
use pdrouter_proto::tokenspeed_scheduler::HealthCheckRequest as TsHealth;
use pdrouter_proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use pdrouter_proto::vllm_engine::vllm_engine_client::VllmEngineClient;
use pdrouter_proto::vllm_engine::{
    AbortRequest, GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk,
    GetModelInfoRequest, GetServerInfoRequest, HealthCheckRequest, SamplingParams, TokenizedInput,
    generate_request::Input, generate_response::Response,
};
use pdrouter_tokenizer::{bundle, bytelevel};
use serde_json::{Value, json};
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

type Client = VllmEngineClient<Channel>;

/// A vLLM gRPC worker's config: 4 output tokens, the given connector.
fn vllm(role: Role, connector: KvConnectorKind) -> MockConfig {
    let mut cfg = MockConfig::new(role);
    cfg.grpc = true;
    cfg.grpc_runtime = GrpcRuntime::Vllm;
    cfg.kv_connector = connector;
    cfg.output_tokens = 4;
    cfg
}

async fn start(cfg: MockConfig) -> MockWorker {
    MockWorker::start(cfg).await.expect("start vLLM gRPC mock")
}

fn url(w: &MockWorker) -> String {
    format!("http://{}", w.addr())
}

async fn client(w: &MockWorker) -> Client {
    assert_eq!(w.url(), format!("grpc://{}", w.addr()));
    within(VllmEngineClient::connect(url(w)))
        .await
        .expect("connect")
}

/// `fut`, or a panic after [`TIMEOUT`].
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, fut).await.expect("in time")
}

async fn stats(addr: SocketAddr) -> Value {
    get(addr, "/mock/stats").await.json()
}

/// A request for the byte-level ids of `text`, at most `max` tokens, with KV parameters.
fn request(
    id: &str,
    text: &str,
    max: Option<u32>,
    stream: bool,
    kv: Option<&str>,
) -> GenerateRequest {
    GenerateRequest {
        request_id: id.to_owned(),
        input: Some(Input::Tokenized(TokenizedInput {
            original_text: text.to_owned(),
            input_ids: bytelevel::encode_plain(text),
        })),
        sampling_params: Some(SamplingParams {
            temperature: Some(0.0),
            max_tokens: max,
            n: 1,
            ..Default::default()
        }),
        stream,
        kv_transfer_params_json: kv.map(str::to_owned),
        data_parallel_rank: None,
    }
}

async fn next(s: &mut Streaming<GenerateResponse>) -> Option<Response> {
    within(s.message())
        .await
        .expect("stream ok")
        .map(|m| m.response.expect("a response"))
}

/// Every message of a stream: its chunks and its completes, in order.
async fn collect(
    mut s: Streaming<GenerateResponse>,
) -> (Vec<GenerateStreamChunk>, Vec<GenerateComplete>) {
    let (mut chunks, mut completes) = (Vec::new(), Vec::new());
    while let Some(r) = next(&mut s).await {
        match r {
            Response::Chunk(c) => {
                assert!(completes.is_empty(), "chunk after a complete");
                chunks.push(c);
            }
            Response::Complete(c) => completes.push(c),
        }
    }
    (chunks, completes)
}

/// Runs `req` to its end: its chunks and completes, or the status it failed with.
async fn run(
    c: &mut Client,
    req: GenerateRequest,
) -> Result<(Vec<GenerateStreamChunk>, Vec<GenerateComplete>), Status> {
    let resp = within(c.generate(req)).await?;
    Ok(collect(resp.into_inner()).await)
}

/// Runs `req`, which must answer exactly one complete.
async fn one(c: &mut Client, req: GenerateRequest) -> (Vec<GenerateStreamChunk>, GenerateComplete) {
    let (chunks, mut completes) = run(c, req).await.expect("generate");
    assert_eq!(completes.len(), 1, "{completes:?}");
    (chunks, completes.remove(0))
}

fn text_ids(n: usize) -> Vec<u32> {
    GRPC_OUTPUT_TEXT
        .bytes()
        .cycle()
        .take(n)
        .map(u32::from)
        .collect()
}

const EOS: u32 = bytelevel::EOS_TOKEN_IDS[0];

/// A prompt of 40 byte-level tokens: two whole KV blocks (32 tokens) and part of a third.
const PROMPT: &str = "the prompt whose KV the legs hand over..";

const NIXL_PRODUCER: &str = r#"{"do_remote_decode": true, "do_remote_prefill": false}"#;

#[tokio::test]
async fn only_vllms_service_answers_next_to_the_http_hooks() {
    let w = start(vllm(Role::Regular, KvConnectorKind::Nixl)).await;
    let mut c = client(&w).await;
    let health = c.health_check(HealthCheckRequest {}).await.unwrap();
    assert!(health.into_inner().healthy);
    let mut sg = SglangSchedulerClient::connect(url(&w)).await.unwrap();
    let err = sg.health_check(SgHealth {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    let mut ts = TokenSpeedSchedulerClient::connect(url(&w)).await.unwrap();
    let err = ts.health_check(TsHealth {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);

    assert_eq!(get(w.addr(), "/health").await.status, StatusCode::OK);
    w.controls().set_healthy(false);
    let health = c.health_check(HealthCheckRequest {}).await.unwrap();
    assert!(!health.into_inner().healthy);
    assert_eq!(
        get(w.addr(), "/health").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let st = stats(w.addr()).await;
    assert_eq!(
        (st["runtime"].as_str(), st["kv_connector"].as_str()),
        (Some("vllm"), Some("nixl"))
    );
    w.shutdown().await;
}

#[tokio::test]
async fn model_info_and_tokenizer_are_the_shared_models() {
    let mut cfg = vllm(Role::Decode, KvConnectorKind::Nixl);
    cfg.model = "m1".to_owned();
    cfg.default_sampling_params = Some(r#"{"temperature":0.6}"#.to_owned());
    let w = start(cfg).await;
    let mut c = client(&w).await;
    let m = c
        .get_model_info(GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            m.served_model_name.as_str(),
            m.model_path.as_str(),
            m.tokenizer_path.as_str()
        ),
        ("m1", "m1", "m1")
    );
    assert!(m.is_generation);
    assert_eq!(m.max_context_length, bytelevel::MAX_POSITION_EMBEDDINGS);
    assert_eq!(m.vocab_size, bytelevel::VOCAB_SIZE);
    let eos: Vec<i32> = bytelevel::EOS_TOKEN_IDS.iter().map(|&i| i as i32).collect();
    assert_eq!(m.eos_token_ids, eos);
    assert_eq!(
        m.max_req_input_len,
        bytelevel::MAX_POSITION_EMBEDDINGS as i32 - 1
    );
    assert_eq!(m.default_sampling_params_json, r#"{"temperature":0.6}"#);

    let mut s = c
        .get_tokenizer(GetTokenizerRequest::default())
        .await
        .unwrap()
        .into_inner();
    let mut zip = Vec::new();
    let mut sha = String::new();
    while let Some(chunk) = within(s.message()).await.unwrap() {
        zip.extend_from_slice(&chunk.data);
        sha = chunk.sha256;
    }
    let (_, want) = bundle::pack(bytelevel::files()).unwrap();
    assert_eq!(sha, want);
    assert!(!zip.is_empty());
    w.shutdown().await;
}

#[tokio::test]
async fn server_info_names_the_kv_connector_role_and_engine_id() {
    let cases = [
        (
            Role::Prefill,
            KvConnectorKind::Nixl,
            "NixlConnector",
            "kv_producer",
        ),
        (
            Role::Decode,
            KvConnectorKind::Nixl,
            "NixlConnector",
            "kv_consumer",
        ),
        (
            Role::Prefill,
            KvConnectorKind::Mooncake,
            "MooncakeConnector",
            "kv_producer",
        ),
        (
            Role::Decode,
            KvConnectorKind::LmCache,
            "LMCacheConnectorV1",
            "kv_consumer",
        ),
        (Role::Regular, KvConnectorKind::Nixl, "", ""),
    ];
    for (role, connector, class, kv_role) in cases {
        let mut cfg = vllm(role, connector);
        cfg.dp_size = 2;
        let w = start(cfg).await;
        let info = client(&w)
            .await
            .get_server_info(GetServerInfoRequest {})
            .await
            .unwrap()
            .into_inner();
        let what = format!("{role:?} {connector:?}");
        assert_eq!(info.server_type, "vllm-grpc", "{what}");
        assert_eq!(info.data_parallel_size, 2, "{what}");
        assert_eq!(info.active_requests, 0, "{what}");
        assert!(info.uptime_seconds >= 0.0, "{what}");
        assert_eq!(
            (info.kv_connector.as_str(), info.kv_role.as_str()),
            (class, kv_role),
            "{what}"
        );
        let st = stats(w.addr()).await;
        let engine = match (role, connector) {
            (Role::Regular, _) => String::new(),
            // Mooncake's engine id is rank 0's, the one its bootstrap server names first.
            (_, KvConnectorKind::Mooncake) => {
                let query = get(w.bootstrap_addr().expect("a bootstrap server"), "/query").await;
                assert_eq!(
                    query.json()["0"]["engine_id"],
                    st["engine_ids"][0],
                    "{what}"
                );
                st["engine_ids"][0].as_str().unwrap().to_owned()
            }
            _ => st["engine_id"].as_str().unwrap().to_owned(),
        };
        assert_eq!(info.kv_engine_id, engine, "{what}");
        w.shutdown().await;
    }
}

#[tokio::test]
async fn a_regular_request_streams_or_answers_whole() {
    let w = start(vllm(Role::Regular, KvConnectorKind::Nixl)).await;
    let mut c = client(&w).await;
    // No max_tokens: the model's own length, ending with EOS.
    let (chunks, done) = one(&mut c, request("r1", "hello", None, true, None)).await;
    let mut want = text_ids(3);
    want.push(EOS);
    let streamed: Vec<u32> = chunks.iter().flat_map(|c| c.token_ids.clone()).collect();
    assert_eq!(streamed, want);
    assert_eq!(done.output_ids, want);
    assert_eq!(
        (
            done.finish_reason.as_str(),
            done.prompt_tokens,
            done.completion_tokens
        ),
        ("stop", 5, 4)
    );
    assert_eq!(done.cached_tokens, 0);
    assert!(chunks.iter().all(|c| c.cached_tokens == 0 && c.index == 0));
    assert_eq!(done.kv_transfer_params_json, None);
    assert!(done.output_logprobs.is_none() && done.input_logprobs.is_none());

    // Not streamed: only the complete; max_tokens caps it.
    let (chunks, done) = one(&mut c, request("r2", "hello", Some(2), false, None)).await;
    assert!(chunks.is_empty());
    assert_eq!(
        (done.output_ids, done.finish_reason.as_str()),
        (text_ids(2), "length")
    );

    // n = 2: every chunk and complete once per sample, by index.
    let mut two = request("r3", "hi", Some(3), true, None);
    two.sampling_params.as_mut().unwrap().n = 2;
    let (chunks, completes) = run(&mut c, two).await.unwrap();
    assert_eq!(chunks.len(), 6);
    let indices: Vec<u32> = chunks.iter().map(|c| c.index).collect();
    assert_eq!(indices, [0, 1, 0, 1, 0, 1]);
    let done: Vec<(u32, Vec<u32>)> = completes
        .iter()
        .map(|c| (c.index, c.output_ids.clone()))
        .collect();
    assert_eq!(done, [(0, text_ids(3)), (1, text_ids(3))]);
    w.shutdown().await;
}

#[tokio::test]
async fn logprobs_and_prompt_logprobs_are_asked_for_separately() {
    let w = start(vllm(Role::Regular, KvConnectorKind::Nixl)).await;
    let mut c = client(&w).await;
    let mut req = request("lp", "abc", Some(2), true, None);
    req.sampling_params.as_mut().unwrap().logprobs = Some(3);
    let (chunks, done) = one(&mut c, req).await;
    let out = done.output_logprobs.expect("output logprobs");
    assert_eq!(out.token_ids, text_ids(2));
    assert_eq!(out.top_logprobs.len(), 2);
    assert!(
        out.top_logprobs
            .iter()
            .all(|t| t.values.len() == 3 && t.token_ids.len() == 3)
    );
    assert!(
        done.input_logprobs.is_none(),
        "no prompt logprobs asked for"
    );
    assert!(chunks.iter().all(|c| c.output_logprobs.is_some()));

    let mut req = request("plp", "abc", Some(2), true, None);
    req.sampling_params.as_mut().unwrap().prompt_logprobs = Some(1);
    let (chunks, done) = one(&mut c, req).await;
    let input = done.input_logprobs.expect("prompt logprobs");
    assert_eq!(
        input.token_ids,
        bytelevel::encode_plain("abc"),
        "from the prompt's start"
    );
    assert_eq!(
        input.token_logprobs[0].value, None,
        "the first token has none"
    );
    assert!(input.token_logprobs[1..].iter().all(|l| l.value.is_some()));
    assert!(
        done.output_logprobs.is_none(),
        "no output logprobs asked for"
    );
    assert!(chunks[0].input_logprobs.is_some() && chunks[1].input_logprobs.is_none());
    w.shutdown().await;
}

/// A NIXL Prefill and Decode pair.
async fn nixl_pair() -> (MockWorker, MockWorker) {
    let p = start(vllm(Role::Prefill, KvConnectorKind::Nixl)).await;
    let d = start(vllm(Role::Decode, KvConnectorKind::Nixl)).await;
    (p, d)
}

/// The producer leg: its complete's `kv_transfer_params_json`, as the router reads it.
async fn produce(c: &mut Client, id: &str, prompt: &str) -> Option<String> {
    let (chunks, done) = one(c, request(id, prompt, Some(1), false, Some(NIXL_PRODUCER))).await;
    assert!(chunks.is_empty());
    done.kv_transfer_params_json
}

#[tokio::test]
async fn a_nixl_consumer_pulls_what_its_producer_holds_once() {
    let (p, d) = nixl_pair().await;
    let (mut pc, mut dc) = (client(&p).await, client(&d).await);
    let params = produce(&mut pc, "req-1", PROMPT)
        .await
        .expect("params held");
    let v: Value = serde_json::from_str(&params).unwrap();
    let st = stats(p.addr()).await;
    assert_eq!(v["do_remote_prefill"], true);
    assert_eq!(v["do_remote_decode"], false);
    assert_eq!(v["remote_engine_id"], st["engine_id"]);
    assert_eq!(v["remote_request_id"], "req-1");
    assert_eq!(
        v["remote_block_ids"].as_array().unwrap().len(),
        3,
        "40 tokens: 3 blocks"
    );
    assert_eq!(v["remote_host"], "127.0.0.1");
    assert_eq!(
        v["remote_port"],
        p.addr().port(),
        "the gRPC port, where the pull is served"
    );
    assert_eq!(v["tp_size"], 1);
    assert_eq!(
        (
            st["kv_held_requests"].as_u64(),
            st["kv_held_blocks"].as_u64()
        ),
        (Some(1), Some(3))
    );

    // The router hands the params to the Decode leg verbatim.
    let (chunks, done) = one(
        &mut dc,
        request("req-1", PROMPT, Some(3), true, Some(&params)),
    )
    .await;
    assert_eq!(done.cached_tokens, 32, "the whole blocks that moved");
    assert!(chunks.iter().all(|c| c.cached_tokens == 32));
    assert_eq!(
        (done.output_ids, done.finish_reason.as_str()),
        (text_ids(3), "length")
    );
    let st = stats(p.addr()).await;
    assert_eq!(
        (
            st["kv_held_requests"].as_u64(),
            st["kv_pulled_total"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(stats(d.addr()).await["kv_relayed_total"], 1);

    // The blocks are gone: a second pull fails and the Decode recomputes.
    let (_, again) = one(
        &mut dc,
        request("req-1b", PROMPT, Some(3), false, Some(&params)),
    )
    .await;
    assert_eq!(again.cached_tokens, 0);
    let ds = stats(d.addr()).await;
    assert_eq!(
        (
            ds["kv_pull_failed_total"].as_u64(),
            ds["kv_recomputed_total"].as_u64()
        ),
        (Some(1), Some(1))
    );

    // What the Decode leg received, as sent.
    let last = &ds["last_request"];
    assert_eq!(last["runtime"], "vllm");
    assert_eq!(last["request_id"], "req-1b");
    assert_eq!(last["input"], "tokenized");
    assert_eq!(last["original_text"], PROMPT);
    assert_eq!(last["input_ids"], json!(bytelevel::encode_plain(PROMPT)));
    assert_eq!(last["kv_transfer_params_json"], v, "parsed");
    assert_eq!(last["stream"], false);
    assert_eq!(last["data_parallel_rank"], Value::Null);
    let sp = &last["sampling_params"];
    assert_eq!(
        (sp["temperature"].as_f64(), sp["max_tokens"].as_u64()),
        (Some(0.0), Some(3))
    );
    for absent in [
        "logprobs",
        "prompt_logprobs",
        "seed",
        "constraint",
        "truncate_prompt_tokens",
    ] {
        assert_eq!(sp[absent], Value::Null, "{absent}");
    }
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn an_early_eos_prefill_holds_nothing_and_names_nothing() {
    let (p, d) = nixl_pair().await;
    let mut pc = client(&p).await;
    let req = request(
        "e1",
        "a prompt [[eos]] that ends at once",
        Some(1),
        false,
        Some(NIXL_PRODUCER),
    );
    let (_, done) = one(&mut pc, req).await;
    assert_eq!(
        (
            done.finish_reason.as_str(),
            done.output_ids.len(),
            done.kv_transfer_params_json
        ),
        ("stop", 0, None)
    );
    let st = stats(p.addr()).await;
    assert_eq!(
        (
            st["kv_held_requests"].as_u64(),
            st["prefill_early_end_total"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(st["kv_produced_total"], 0);
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn producers_are_checked_strictly_and_bad_params_refused() {
    let p = start(vllm(Role::Prefill, KvConnectorKind::Nixl)).await;
    let mut c = client(&p).await;
    let refused = [
        (
            request("s", PROMPT, Some(1), true, Some(NIXL_PRODUCER)),
            "must not stream",
        ),
        (
            request("m", PROMPT, Some(2), false, Some(NIXL_PRODUCER)),
            "max_tokens exactly 1",
        ),
        (
            request("a", PROMPT, None, false, Some(NIXL_PRODUCER)),
            "max_tokens exactly 1",
        ),
        (
            request("j", PROMPT, Some(1), false, Some("{nope")),
            "kv_transfer_params_json",
        ),
        (
            request("o", PROMPT, Some(1), false, Some("[1]")),
            "kv_transfer_params_json",
        ),
        (
            request(
                "f",
                PROMPT,
                Some(3),
                false,
                Some(r#"{"do_remote_prefill": true, "remote_port": "x"}"#),
            ),
            "kv_transfer_params_json",
        ),
    ];
    for (req, why) in refused {
        let id = req.request_id.clone();
        let err = run(&mut c, req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{id}: {err:?}");
        assert!(err.message().contains(why), "{id}: {}", err.message());
    }
    let mut text = request("t", PROMPT, Some(1), false, None);
    text.input = Some(Input::Text("hello".to_owned()));
    let err = run(&mut c, text).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(
        err.message().contains("send token ids"),
        "{}",
        err.message()
    );
    let st = stats(p.addr()).await;
    assert_eq!(
        (
            st["kv_produced_total"].as_u64(),
            st["aborts_total"].as_u64()
        ),
        (Some(0), Some(0))
    );
    // A "null" parameter string is no hand-over: a plain request.
    let (_, done) = one(&mut c, request("n", PROMPT, Some(2), false, Some("null"))).await;
    assert_eq!(done.output_ids, text_ids(2));
    let st = stats(p.addr()).await;
    assert_eq!(
        (st["requests_total"].as_u64(), st["inflight"].as_u64()),
        (Some(8), Some(0)),
        "refusals count"
    );
    p.shutdown().await;
}

#[tokio::test]
async fn a_mooncake_pair_meets_by_transfer_id_on_the_producers_dp_rank() {
    // Spelled as HTTP vLLM mode plus --grpc: the same vLLM gRPC worker.
    let mut pcfg = MockConfig::new(Role::Prefill);
    pcfg.grpc = true;
    pcfg.http_runtime = HttpRuntime::Vllm;
    pcfg.kv_connector = KvConnectorKind::Mooncake;
    pcfg.dp_size = 2;
    let p = start(pcfg).await;
    let d = start(vllm(Role::Decode, KvConnectorKind::Mooncake)).await;
    let boot = p
        .bootstrap_addr()
        .expect("a Mooncake prefill serves a bootstrap server");
    let ids = get(boot, "/query").await.json();
    let rank1 = ids["1"]["engine_id"].as_str().unwrap().to_owned();
    let (mut pc, mut dc) = (client(&p).await, client(&d).await);

    // The consumer comes first and waits for its producer.
    let consumer = json!({
        "do_remote_prefill": true, "do_remote_decode": false, "transfer_id": "t1",
        "remote_engine_id": rank1, "remote_bootstrap_addr": format!("http://{boot}"),
    })
    .to_string();
    let decode = tokio::spawn({
        let req = request("dec", PROMPT, Some(3), true, Some(&consumer));
        async move { one(&mut dc, req).await }
    });
    wait_until("the consumer waits", || async {
        stats(d.addr()).await["inflight"] == 1
    })
    .await;
    let producer = r#"{"do_remote_decode": true, "do_remote_prefill": false, "transfer_id": "t1"}"#;
    let mut req = request("pre", PROMPT, Some(1), false, Some(producer));
    req.data_parallel_rank = Some(1);
    let (_, done) = one(&mut pc, req).await;
    assert_eq!(
        done.kv_transfer_params_json, None,
        "the consumer has its own"
    );
    let (_, done) = within(decode).await.unwrap();
    assert_eq!(done.cached_tokens, 32);
    let st = stats(p.addr()).await;
    assert_eq!(
        (
            st["kv_held_requests"].as_u64(),
            st["kv_pulled_total"].as_u64()
        ),
        (Some(0), Some(1))
    );
    assert_eq!(st["last_request"]["data_parallel_rank"], 1);

    // A rank this worker does not have is refused.
    let mut req = request("bad", PROMPT, Some(1), false, Some(producer));
    req.data_parallel_rank = Some(2);
    assert_eq!(
        run(&mut pc, req).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn an_lmcache_producer_pushes_to_its_grpc_peer() {
    let d = start(vllm(Role::Decode, KvConnectorKind::LmCache)).await;
    let mut pcfg = vllm(Role::Prefill, KvConnectorKind::LmCache);
    pcfg.lmcache_peer = Some(url(&d));
    let p = start(pcfg).await;
    let (mut pc, mut dc) = (client(&p).await, client(&d).await);
    let (_, done) = one(&mut pc, request("l1", PROMPT, Some(1), false, None)).await;
    assert_eq!((done.output_ids.len(), done.cached_tokens), (1, 0));
    assert_eq!(stats(p.addr()).await["kv_pushed_total"], 1);
    let (_, done) = one(&mut dc, request("l1", PROMPT, Some(3), false, None)).await;
    assert_eq!(done.cached_tokens, 32);
    let (_, done) = one(&mut dc, request("l2", PROMPT, Some(3), false, None)).await;
    assert_eq!(done.cached_tokens, 0, "a push is used once");
    let bad = request("l3", PROMPT, Some(1), false, Some(NIXL_PRODUCER));
    assert_eq!(
        run(&mut pc, bad).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    p.shutdown().await;
    d.shutdown().await;
}

#[tokio::test]
async fn aborts_and_dropped_streams_count_once_each() {
    let mut cfg = vllm(Role::Regular, KvConnectorKind::Nixl);
    cfg.output_tokens = 10_000;
    cfg.token_interval = std::time::Duration::from_secs(3600);
    let w = start(cfg).await;
    let mut c = client(&w).await;
    let aborts = |w: SocketAddr| async move { stats(w).await["aborts_total"].as_u64().unwrap() };

    let mut s = c
        .generate(request("ab-1", "x", None, true, None))
        .await
        .unwrap()
        .into_inner();
    let Some(Response::Chunk(first)) = next(&mut s).await else {
        panic!("a first chunk");
    };
    let abort = AbortRequest {
        request_ids: vec!["ab-1".to_owned(), "nobody".to_owned()],
    };
    c.abort(abort).await.unwrap();
    let Some(Response::Complete(done)) = next(&mut s).await else {
        panic!("an aborted stream ends with a complete");
    };
    assert_eq!(
        (done.finish_reason.as_str(), done.output_ids),
        ("abort", first.token_ids)
    );
    assert!(next(&mut s).await.is_none());
    assert_eq!(
        aborts(w.addr()).await,
        1,
        "the running one, not the unknown id"
    );

    // A client dropping its stream mid-answer counts one.
    let mut s = c
        .generate(request("ab-2", "x", None, true, None))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(next(&mut s).await, Some(Response::Chunk(_))));
    drop(s);
    wait_until("the dropped stream is counted", || async {
        aborts(w.addr()).await == 2
    })
    .await;
    wait_until("nothing in flight", || async {
        stats(w.addr()).await["inflight"] == 0
    })
    .await;

    // Aborted, then dropped before its end: still one.
    let mut s = c
        .generate(request("ab-3", "x", None, true, None))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(next(&mut s).await, Some(Response::Chunk(_))));
    c.abort(AbortRequest {
        request_ids: vec!["ab-3".to_owned()],
    })
    .await
    .unwrap();
    drop(s);
    wait_until("nothing in flight", || async {
        stats(w.addr()).await["inflight"] == 0
    })
    .await;
    assert_eq!(aborts(w.addr()).await, 3);
    w.shutdown().await;
}
