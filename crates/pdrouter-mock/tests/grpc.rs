//! gRPC mode: SGLang's scheduler protocol through a tonic client, plus the
//! plain HTTP routes on the same port.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{TIMEOUT, get, post, wait_until};
use hyper::StatusCode;
use pdrouter_mock::{GRPC_OUTPUT_TEXT, MockConfig, MockWorker, Role};
use pdrouter_proto::common::GetTokenizerRequest;
use pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient;
use pdrouter_proto::scheduler::{
    AbortRequest, GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk,
    GetModelInfoRequest, GetServerInfoRequest, HealthCheckRequest, generate_complete::MatchedStop,
    generate_response::Response,
};
use pdrouter_tokenizer::{bundle, bytelevel};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

type Client = SglangSchedulerClient<Channel>;

async fn start(role: Role, tune: impl FnOnce(&mut MockConfig)) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.grpc = true;
    tune(&mut cfg);
    MockWorker::start(cfg).await.expect("start gRPC mock")
}

async fn client(w: &MockWorker) -> Client {
    assert_eq!(w.url(), format!("grpc://{}", w.addr()));
    common::grpc_client(w.addr()).await
}

fn request(id: &str, input: &str, ticket: Option<(u16, i32)>) -> GenerateRequest {
    common::grpc_request(id, input, ticket)
}

async fn stats(addr: SocketAddr) -> Value {
    get(addr, "/mock/stats").await.json()
}

async fn next(s: &mut Streaming<GenerateResponse>) -> Option<Response> {
    tokio::time::timeout(TIMEOUT, s.message())
        .await
        .expect("message in time")
        .expect("stream ok")
        .map(|m| m.response.expect("a response"))
}

/// Every message of a stream: its chunks and its one final complete.
async fn collect(
    mut s: Streaming<GenerateResponse>,
) -> (Vec<GenerateStreamChunk>, GenerateComplete) {
    let mut chunks = Vec::new();
    let mut complete = None;
    while let Some(r) = next(&mut s).await {
        match r {
            Response::Chunk(c) => {
                assert!(complete.is_none(), "chunk after complete");
                chunks.push(c);
            }
            Response::Complete(c) => {
                assert!(complete.replace(c).is_none(), "two completes");
            }
            Response::Error(e) => panic!("error message {e:?}"),
        }
    }
    (chunks, complete.expect("a complete"))
}

fn text_ids(n: usize) -> Vec<u32> {
    GRPC_OUTPUT_TEXT
        .bytes()
        .cycle()
        .take(n)
        .map(u32::from)
        .collect()
}

/// `fut`, or a panic after [`TIMEOUT`].
async fn within<T>(fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(TIMEOUT, fut).await.expect("in time")
}

/// Sends `Abort` for `id`; whether a running request had it.
async fn abort(c: &mut Client, id: &str) -> bool {
    let req = AbortRequest {
        request_id: id.to_owned(),
        reason: "test".to_owned(),
    };
    c.abort(req).await.unwrap().into_inner().success
}

async fn inflight_is(addr: SocketAddr, n: u64) {
    wait_until(&format!("inflight {n}"), || async move {
        stats(addr).await["inflight"] == n
    })
    .await;
}

#[tokio::test]
async fn regular_streams_chunks_then_a_complete_repeating_them() {
    let w = start(Role::Regular, |c| c.output_tokens = 5).await;
    let mut c = client(&w).await;
    let resp = c.generate(request("r1", "hello", None)).await.unwrap();
    let (chunks, complete) = collect(resp.into_inner()).await;

    let mut expected = text_ids(4);
    expected.push(bytelevel::EOS_TOKEN_IDS[0]);
    let streamed: Vec<u32> = chunks.iter().flat_map(|c| c.token_ids.clone()).collect();
    assert_eq!(chunks.len(), 5);
    assert_eq!(streamed, expected);
    assert_eq!(
        chunks
            .iter()
            .map(|c| c.completion_tokens)
            .collect::<Vec<_>>(),
        vec![1, 2, 3, 4, 5]
    );
    assert!(chunks.iter().all(|c| c.prompt_tokens == 5));
    assert_eq!(complete.output_ids, expected);
    assert_eq!(complete.finish_reason, "stop");
    assert_eq!(
        complete.matched_stop,
        Some(MatchedStop::MatchedTokenId(bytelevel::EOS_TOKEN_IDS[0]))
    );
    assert_eq!(
        (
            complete.prompt_tokens,
            complete.completion_tokens,
            complete.cached_tokens
        ),
        (5, 5, 0)
    );

    inflight_is(w.addr(), 0).await;
    let st = stats(w.addr()).await;
    assert_eq!(st["role"], "regular");
    assert_eq!(st["requests_total"], 1);
    assert_eq!(st["max_inflight"], 1);
    assert_eq!(st["aborts_total"], 0);
    assert_eq!(st["last_output_ids"], json!(expected));
    let last = &st["last_request"];
    assert_eq!(last["request_id"], "r1");
    assert_eq!(last["original_text"], "hello");
    assert_eq!(last["input_ids"], json!(bytelevel::encode_plain("hello")));
    assert_eq!(last["stream"], true);
    assert_eq!(last["sampling_params"]["temperature"], json!(0.7));
    assert_eq!(last["sampling_params"]["top_k"], -1);
    assert_eq!(last["sampling_params"]["max_new_tokens"], Value::Null);
    assert_eq!(last["disaggregated_params"], Value::Null);
    w.shutdown().await;
}

#[tokio::test]
async fn limits_stops_and_non_streaming_requests() {
    let w = start(Role::Regular, |c| c.output_tokens = 8).await;
    let mut c = client(&w).await;

    let mut capped = request("cap", "x", None);
    capped.sampling_params.as_mut().unwrap().max_new_tokens = Some(3);
    let (chunks, done) = collect(c.generate(capped).await.unwrap().into_inner()).await;
    assert_eq!(chunks.len(), 3);
    assert_eq!(
        (done.output_ids, done.finish_reason.as_str()),
        (text_ids(3), "length")
    );

    // Stop at the first space, which is generated (and reported) too.
    let mut stop = request("stop", "x", None);
    stop.sampling_params.as_mut().unwrap().stop_token_ids = vec![u32::from(b' ')];
    let (_, done) = collect(c.generate(stop).await.unwrap().into_inner()).await;
    assert_eq!(done.output_ids, bytelevel::encode_plain("The "));
    assert_eq!(done.finish_reason, "stop");
    assert_eq!(done.matched_stop, Some(MatchedStop::MatchedTokenId(32)));

    // Not streaming: the complete alone, with every id.
    let mut whole = request("whole", "x", None);
    whole.stream = false;
    whole.sampling_params.as_mut().unwrap().ignore_eos = true;
    let (chunks, done) = collect(c.generate(whole).await.unwrap().into_inner()).await;
    assert!(chunks.is_empty());
    assert_eq!(
        (done.output_ids, done.finish_reason.as_str()),
        (text_ids(8), "length")
    );

    // Bad input: a clear status, counted, nothing left in flight.
    let mut empty = request("empty", "x", None);
    empty.tokenized = None;
    let err = c.generate(empty).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    inflight_is(w.addr(), 0).await;
    assert_eq!(stats(w.addr()).await["requests_total"], 4);
    w.shutdown().await;
}

#[tokio::test]
async fn decode_waits_for_the_prefill_of_its_room() {
    let p = start(Role::Prefill, |_| {}).await;
    let d = start(Role::Decode, |c| c.output_tokens = 3).await;
    let ticket = Some((p.addr().port(), 42));
    p.controls().set_hang(true);

    let mut pc = client(&p).await;
    let mut dc = client(&d).await;
    let decode = tokio::spawn(async move {
        let resp = dc.generate(request("pd-1", "hi", ticket)).await.unwrap();
        collect(resp.into_inner()).await
    });
    let prefill = tokio::spawn(async move {
        let resp = pc.generate(request("pd-1", "hi", ticket)).await.unwrap();
        collect(resp.into_inner()).await
    });
    inflight_is(p.addr(), 1).await;
    inflight_is(d.addr(), 1).await;
    // The prefill is held by the hang switch, so its room is not finished.
    assert!(stats(d.addr()).await["last_output_ids"].is_null());
    assert!(!decode.is_finished());

    p.controls().set_hang(false);
    let (p_chunks, p_done) = within(prefill).await.unwrap();
    let (d_chunks, d_done) = within(decode).await.unwrap();
    // A prefill engine samples the first token only.
    assert_eq!(p_chunks.len(), 1);
    assert_eq!(
        (p_done.output_ids, p_done.finish_reason.as_str()),
        (text_ids(1), "length")
    );
    assert_eq!(d_chunks.len(), 3);
    let mut expected = text_ids(2);
    expected.push(bytelevel::EOS_TOKEN_IDS[0]);
    assert_eq!(d_done.output_ids, expected);

    let last = &stats(d.addr()).await["last_request"];
    assert_eq!(
        last["disaggregated_params"],
        json!({"bootstrap_host": "127.0.0.1", "bootstrap_port": p.addr().port(), "bootstrap_room": 42})
    );
    // A second decode of the same (finished) room streams at once.
    let mut dc = client(&d).await;
    let resp = dc.generate(request("pd-2", "hi", ticket)).await.unwrap();
    assert_eq!(collect(resp.into_inner()).await.0.len(), 3);
    // A prefill or decode request without a ticket is refused.
    let err = dc
        .generate(request("no-ticket", "hi", None))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    p.shutdown().await;
    d.shutdown().await;
}

/// Answers one bootstrap long poll when told to; reports the path asked.
async fn gate() -> (
    u16,
    tokio::sync::oneshot::Receiver<String>,
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (asked_tx, asked) = tokio::sync::oneshot::channel();
    let (open, open_rx) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let (mut sock, _) = listener.accept().await.unwrap();
        let mut buf = vec![0u8; 1024];
        let n = sock.read(&mut buf).await.unwrap();
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        let path = head.split_whitespace().nth(1).unwrap_or("").to_owned();
        let _ = asked_tx.send(path);
        let _ = open_rx.await;
        sock.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
            .await
            .unwrap();
    });
    (port, asked, open, task)
}

#[tokio::test]
async fn decode_streams_only_after_the_bootstrap_answers() {
    let d = start(Role::Decode, |c| c.output_tokens = 2).await;
    let (port, asked, open, gate_task) = gate().await;
    let mut dc = client(&d).await;
    let decode = tokio::spawn(async move {
        let resp = dc
            .generate(request("g", "hi", Some((port, 7))))
            .await
            .unwrap();
        collect(resp.into_inner()).await
    });
    // The decode is now blocked on our socket: nothing can have streamed.
    assert_eq!(within(asked).await.unwrap(), "/room/7");
    let st = stats(d.addr()).await;
    assert_eq!(
        (st["inflight"].clone(), st["last_output_ids"].clone()),
        (json!(1), Value::Null)
    );
    open.send(()).unwrap();
    let (chunks, _) = within(decode).await.unwrap();
    assert_eq!(chunks.len(), 2);
    within(gate_task).await.unwrap();
    d.shutdown().await;
}

/// A worker generating one token an hour, and a stream (of request `id`)
/// that has delivered its first chunk and stays open.
async fn slow_stream(
    id: &str,
) -> (
    MockWorker,
    Client,
    Streaming<GenerateResponse>,
    GenerateStreamChunk,
) {
    let w = start(Role::Regular, |c| {
        c.token_interval = Duration::from_secs(3600)
    })
    .await;
    let mut c = client(&w).await;
    let mut s = c
        .generate(request(id, "x", None))
        .await
        .unwrap()
        .into_inner();
    let Some(Response::Chunk(first)) = next(&mut s).await else {
        panic!("first message is a chunk");
    };
    (w, c, s, first)
}

#[tokio::test]
async fn abort_ends_the_stream_and_is_counted() {
    let (w, mut c, mut s, first) = slow_stream("ab-1").await;
    assert!(abort(&mut c, "ab-1").await);
    let Some(Response::Complete(done)) = next(&mut s).await else {
        panic!("an aborted stream ends with a complete");
    };
    assert_eq!(done.finish_reason, "abort");
    assert_eq!(done.output_ids, first.token_ids);
    assert!(next(&mut s).await.is_none());

    // An unknown id: answered, counted, not a success.
    assert!(!abort(&mut c, "nobody").await);

    // An abort also ends a request still held by the hang switch.
    w.controls().set_hang(true);
    let mut c2 = c.clone();
    let held = tokio::spawn(async move {
        let resp = c2.generate(request("ab-2", "x", None)).await.unwrap();
        collect(resp.into_inner()).await
    });
    inflight_is(w.addr(), 1).await;
    assert!(abort(&mut c, "ab-2").await);
    let (chunks, done) = within(held).await.unwrap();
    assert!(chunks.is_empty());
    assert_eq!(
        (done.finish_reason.as_str(), done.output_ids.len()),
        ("abort", 0)
    );

    inflight_is(w.addr(), 0).await;
    assert_eq!(stats(w.addr()).await["aborts_total"], 3);
    w.shutdown().await;
}

#[tokio::test]
async fn a_client_that_goes_away_leaves_nothing_in_flight() {
    let (w, c, s, _) = slow_stream("gone").await;
    inflight_is(w.addr(), 1).await;
    drop(s);
    drop(c);
    inflight_is(w.addr(), 0).await;
    w.shutdown().await;
}

#[tokio::test]
async fn tokenizer_arrives_in_chunks_whose_checksum_matches() {
    let w = start(Role::Regular, |_| {}).await;
    let mut c = client(&w).await;
    let mut s = c
        .get_tokenizer(GetTokenizerRequest {})
        .await
        .unwrap()
        .into_inner();
    let mut chunks = Vec::new();
    while let Some(chunk) = tokio::time::timeout(TIMEOUT, s.message())
        .await
        .unwrap()
        .unwrap()
    {
        chunks.push(chunk);
    }
    assert!(chunks.len() > 1, "{} chunks", chunks.len());
    let (last, rest) = chunks.split_last().unwrap();
    assert!(rest.iter().all(|c| c.sha256.is_empty()));
    let zip: Vec<u8> = chunks.iter().flat_map(|c| c.data.clone()).collect();
    assert_eq!(last.sha256, bundle::sha256_hex(&zip));
    let (expected, _) = bundle::pack(bytelevel::files()).unwrap();
    assert_eq!(zip, expected);

    // What a router does with it: unpack, load, detokenize a generation.
    let mut receiver = bundle::Receiver::new(bundle::Limits::default());
    for chunk in &chunks {
        receiver.push(&chunk.data, &chunk.sha256).unwrap();
    }
    let unpacked = receiver.finish(&std::env::temp_dir()).unwrap();
    let tokenizer = pdrouter_tokenizer::Tokenizer::load(unpacked.path(), None).unwrap();
    let model = c
        .get_model_info(GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let eos: Vec<i32> = tokenizer
        .eos_token_ids()
        .iter()
        .map(|&id| id as i32)
        .collect();
    assert_eq!(model.eos_token_ids, eos);
    let resp = c.generate(request("t", "x", None)).await.unwrap();
    let (_, done) = collect(resp.into_inner()).await;
    let text = tokenizer
        .decode(
            &done.output_ids,
            pdrouter_tokenizer::DecodeOptions::default(),
        )
        .unwrap();
    // Eight tokens: seven bytes of the text, then EOS (a special token).
    assert_eq!(text, GRPC_OUTPUT_TEXT[..7]);
    w.shutdown().await;
}

#[tokio::test]
async fn info_health_and_http_routes_share_the_port() {
    let w = start(Role::Decode, |c| {
        c.dp_size = 4;
        c.model = "grpc-model".to_owned();
    })
    .await;
    let mut c = client(&w).await;

    let info = c
        .get_server_info(GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let args = info.server_args.expect("server_args");
    let num = |k: &str| match args.fields.get(k).and_then(|v| v.kind.clone()) {
        Some(prost_types::value::Kind::NumberValue(n)) => n,
        other => panic!("{k}: {other:?}"),
    };
    assert_eq!(num("dp_size"), 4.0);
    assert_eq!(info.server_type, "grpc");

    let model = c
        .get_model_info(GetModelInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(model.model_path, "grpc-model");
    assert_eq!(model.tokenizer_path, "grpc-model");
    assert_eq!(model.vocab_size as u32, bytelevel::VOCAB_SIZE);
    assert_eq!(
        model.eos_token_ids,
        bytelevel::EOS_TOKEN_IDS.map(|id| id as i32).to_vec()
    );

    assert!(
        c.health_check(HealthCheckRequest {})
            .await
            .unwrap()
            .into_inner()
            .healthy
    );
    assert_eq!(get(w.addr(), "/health").await.status, StatusCode::OK);
    // The runtime controls reach the gRPC side too.
    let r = post(w.addr(), "/mock/controls", &json!({"healthy": false})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(
        !c.health_check(HealthCheckRequest {})
            .await
            .unwrap()
            .into_inner()
            .healthy
    );
    assert_eq!(
        get(w.addr(), "/health").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(stats(w.addr()).await["role"], "decode");
    w.shutdown().await;
}

#[tokio::test]
async fn fail_rate_one_answers_an_error_status() {
    let w = start(Role::Regular, |c| c.fail_rate = 1.0).await;
    let mut c = client(&w).await;
    let err = c.generate(request("f", "x", None)).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal);
    inflight_is(w.addr(), 0).await;
    assert_eq!(stats(w.addr()).await["requests_total"], 1);
    w.shutdown().await;
}

#[tokio::test]
async fn samples_carry_their_index_and_logprobs_when_asked() {
    let w = start(Role::Regular, |c| c.output_tokens = 3).await;
    let mut c = client(&w).await;
    let mut r = request("n2", "ab", None);
    r.sampling_params.as_mut().unwrap().n = 2;
    r.return_logprob = true;
    r.logprob_start_len = 0;
    let mut s = c.generate(r).await.unwrap().into_inner();
    let (mut chunks, mut completes) = (Vec::new(), Vec::new());
    while let Some(m) = next(&mut s).await {
        match m {
            Response::Chunk(c) => chunks.push(c),
            Response::Complete(c) => completes.push(c),
            Response::Error(e) => panic!("error message {e:?}"),
        }
    }
    let indexes: Vec<u32> = chunks.iter().map(|c| c.index).collect();
    assert_eq!(indexes, vec![0, 1, 0, 1, 0, 1]);
    assert_eq!(
        completes.iter().map(|c| c.index).collect::<Vec<_>>(),
        vec![0, 1]
    );
    for done in &completes {
        assert_eq!(done.output_ids.len(), 3);
        let lp = done.output_logprobs.as_ref().expect("output logprobs");
        assert_eq!(lp.token_ids, done.output_ids);
        assert_eq!(lp.token_logprobs.len(), 3);
        let prompt = done.input_logprobs.as_ref().expect("prompt logprobs");
        assert_eq!(prompt.token_ids, bytelevel::encode_plain("ab"));
        assert_eq!(prompt.token_logprobs[0].value, None);
        assert!(prompt.token_logprobs[1].value.is_some());
    }
    // Prompt logprobs ride on the first chunk of each sample only.
    let with_prompt: Vec<bool> = chunks.iter().map(|c| c.input_logprobs.is_some()).collect();
    assert_eq!(with_prompt, vec![true, true, false, false, false, false]);
    assert!(
        chunks
            .iter()
            .all(|c| c.output_logprobs.as_ref().unwrap().token_ids == c.token_ids)
    );
    w.shutdown().await;
}

#[tokio::test]
async fn a_rank_beyond_dp_size_is_refused() {
    let w = start(Role::Regular, |c| c.dp_size = 2).await;
    let mut c = client(&w).await;
    let mut r = request("rank", "x", None);
    r.data_parallel_rank = 1;
    assert!(c.generate(r.clone()).await.is_ok());
    r.data_parallel_rank = 2;
    let err = c.generate(r).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("dp_size 2"), "{}", err.message());
    w.shutdown().await;
}

#[tokio::test]
async fn shutdown_ends_requests_in_flight() {
    let w = start(Role::Regular, |_| {}).await;
    w.controls().set_hang(true);
    let mut c = client(&w).await;
    let held = tokio::spawn(async move { c.generate(request("held", "x", None)).await });
    inflight_is(w.addr(), 1).await;
    w.shutdown().await;
    let outcome = within(held).await.unwrap();
    assert!(outcome.is_err(), "the call fails, like a killed engine");
}

#[tokio::test]
async fn engine_mode_queues_prefills_and_decodes_max_new_tokens() {
    let engine = |c: &mut MockConfig| {
        c.engine = Some(pdrouter_mock::EngineConfig {
            max_running: 1,
            prefill_tokens_per_sec: 1e6,
            bootstrap_port: 0,
            ..pdrouter_mock::EngineConfig::new()
        });
    };
    let p = start(Role::Prefill, engine).await;
    let d = start(Role::Decode, engine).await;
    assert!(p.bootstrap_addr().is_some());
    let st = stats(p.addr()).await;
    assert_eq!(st["engine_queue_len"], 0);

    // The prefill's room is answered on the engine's bootstrap port too.
    let ticket = Some((p.bootstrap_addr().unwrap().port(), 5));
    let mut pc = client(&p).await;
    let resp = pc.generate(request("e", "hi", ticket)).await.unwrap();
    assert_eq!(collect(resp.into_inner()).await.1.output_ids.len(), 1);
    let mut r = request("e", "hi", ticket);
    r.sampling_params.as_mut().unwrap().max_new_tokens = Some(11);
    let mut dc = client(&d).await;
    let (chunks, done) = collect(dc.generate(r).await.unwrap().into_inner()).await;
    assert_eq!((chunks.len(), done.finish_reason.as_str()), (11, "length"));
    assert_eq!(done.output_ids, text_ids(11));

    let info = pc
        .get_server_info(GetServerInfoRequest {})
        .await
        .unwrap()
        .into_inner();
    let args = info.server_args.unwrap();
    assert_eq!(
        args.fields["max_running_requests"].kind,
        Some(prost_types::value::Kind::NumberValue(1.0))
    );
    p.shutdown().await;
    d.shutdown().await;
}
