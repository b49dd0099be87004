//! TokenSpeed mode through tonic clients: only TokenSpeed's service answers, Generate over the
//! same engine model, and the EPD coupling — a Prefill waits until every item's room reached
//! an encode worker holding that item (bounded), a Decode waits for its Prefill's KV room.

mod common;

use std::time::Duration;

use pdrouter_mock::{GrpcRuntime, MockConfig, MockWorker, Role};
use pdrouter_proto::scheduler::HealthCheckRequest as SgHealth;
use pdrouter_proto::scheduler::sglang_scheduler_client::SglangSchedulerClient;
use pdrouter_proto::tokenspeed_encoder::token_speed_encoder_client::TokenSpeedEncoderClient;
use pdrouter_proto::tokenspeed_encoder::{EncodeItemAssignment, EncodeRequest};
use pdrouter_proto::tokenspeed_scheduler::token_speed_scheduler_client::TokenSpeedSchedulerClient;
use pdrouter_proto::tokenspeed_scheduler::{
    EncodeBootstrapInfo, EncodeItemBootstrapInfo, GenerateRequest, HealthCheckRequest,
    KvBootstrapInfo, MultimodalInputs, MultimodalItem, TensorData, TokenizedInput,
    generate_response::Response, tensor_data::Payload,
};
use pdrouter_tokenizer::bytelevel;
use tonic::Code;

async fn start(role: Role) -> MockWorker {
    start_tuned(role, |_| {}).await
}

async fn start_tuned(role: Role, tune: impl FnOnce(&mut MockConfig)) -> MockWorker {
    let mut cfg = MockConfig::new(role);
    cfg.grpc = true;
    cfg.grpc_runtime = GrpcRuntime::TokenSpeed;
    cfg.output_tokens = 4;
    tune(&mut cfg);
    MockWorker::start(cfg).await.expect("start TokenSpeed mock")
}

/// An image item as the router describes it: content hash, encoder input shape and dtype,
/// and the pixels only when `pixels` (an `Encode` request).
fn item(hash: &[u8], pixels: bool) -> MultimodalItem {
    MultimodalItem {
        content_hash: hash.to_vec(),
        encoder_input: Some(TensorData {
            shape: vec![16, 1176],
            dtype: "bfloat16".to_owned(),
            payload: pixels.then(|| Payload::Inline(vec![0; 16 * 1176 * 2])),
        }),
        ..Default::default()
    }
}

fn url(w: &MockWorker) -> String {
    format!("http://{}", w.addr())
}

fn generate(
    id: &str,
    kv: Option<KvBootstrapInfo>,
    items: &[(&MockWorker, i64)],
) -> GenerateRequest {
    GenerateRequest {
        request_id: id.to_owned(),
        tokenized: Some(TokenizedInput {
            input_ids: bytelevel::encode_plain("hi"),
            original_text: "hi".to_owned(),
        }),
        sampling_params: Some(Default::default()),
        kv_bootstrap_info: kv,
        mm_inputs: (!items.is_empty()).then(|| MultimodalInputs {
            items: items.iter().map(|_| item(&[0xca, 0xfe], false)).collect(),
        }),
        encode_bootstrap_info: (!items.is_empty()).then(|| EncodeBootstrapInfo {
            items: items
                .iter()
                .enumerate()
                .map(|(i, (w, room))| EncodeItemBootstrapInfo {
                    item_index: i as u32,
                    bootstrap_host: "127.0.0.1".to_owned(),
                    bootstrap_port: i32::from(w.addr().port()),
                    bootstrap_room: *room,
                })
                .collect(),
        }),
        ..Default::default()
    }
}

fn encode(room: i64) -> EncodeRequest {
    encode_item(room, &[0xca, 0xfe])
}

fn encode_item(room: i64, hash: &[u8]) -> EncodeRequest {
    EncodeRequest {
        request_id: "enc".to_owned(),
        mm_inputs: Some(MultimodalInputs {
            items: vec![item(hash, true)],
        }),
        items: vec![EncodeItemAssignment {
            bootstrap_room: room,
        }],
    }
}

#[tokio::test]
async fn only_tokenspeeds_service_answers() {
    let w = start(Role::Regular).await;
    let mut ts = TokenSpeedSchedulerClient::connect(url(&w)).await.unwrap();
    assert!(
        ts.health_check(HealthCheckRequest {})
            .await
            .unwrap()
            .into_inner()
            .healthy
    );
    let mut sg = SglangSchedulerClient::connect(url(&w)).await.unwrap();
    let err = sg.health_check(SgHealth {}).await.unwrap_err();
    assert_eq!(err.code(), Code::Unimplemented);
    let mut stream = ts
        .generate(generate("r", None, &[]))
        .await
        .unwrap()
        .into_inner();
    let mut completes = 0;
    while let Some(m) = stream.message().await.unwrap() {
        if let Some(Response::Complete(c)) = m.response {
            assert_eq!(c.output_ids.len(), 4);
            completes += 1;
        }
    }
    assert_eq!(completes, 1);
    assert_eq!(w.stats().last_request.unwrap()["runtime"], "tokenspeed");
}

#[tokio::test]
async fn encode_role_needs_tokenspeed_over_grpc() {
    let mut cfg = MockConfig::new(Role::Encode);
    assert!(MockWorker::start(cfg.clone()).await.is_err());
    cfg.grpc = true;
    assert!(MockWorker::start(cfg.clone()).await.is_err());
    cfg.grpc_runtime = GrpcRuntime::TokenSpeed;
    let w = MockWorker::start(cfg).await.unwrap();
    let mut enc = TokenSpeedEncoderClient::connect(url(&w)).await.unwrap();
    let mut two_rooms = encode(1);
    two_rooms
        .items
        .push(EncodeItemAssignment { bootstrap_room: 2 });
    let err = enc.encode(two_rooms).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(w.stats().encode_items_total, 0);

    // The standard health service follows the `healthy` control.
    use pdrouter_proto::grpc::health::v1::health_check_response::ServingStatus;
    use pdrouter_proto::grpc::health::v1::{
        HealthCheckRequest as Check, health_client::HealthClient,
    };
    let mut health = HealthClient::connect(url(&w)).await.unwrap();
    let status = |r: tonic::Response<pdrouter_proto::grpc::health::v1::HealthCheckResponse>| {
        r.into_inner().status
    };
    assert_eq!(
        status(health.check(Check::default()).await.unwrap()),
        ServingStatus::Serving as i32
    );
    w.controls().set_healthy(false);
    assert_eq!(
        status(health.check(Check::default()).await.unwrap()),
        ServingStatus::NotServing as i32
    );
}

#[tokio::test]
async fn prefill_waits_for_every_encoded_item_and_decode_for_the_prefill() {
    let (e1, e2) = (start(Role::Encode).await, start(Role::Encode).await);
    let (p, d) = (start(Role::Prefill).await, start(Role::Decode).await);
    let kv = KvBootstrapInfo {
        bootstrap_host: "127.0.0.1".to_owned(),
        bootstrap_port: i32::from(p.addr().port()),
        bootstrap_room: (1 << 62) + 9,
    };
    let (r1, r2) = ((1 << 45) + 1, (1 << 45) + 2);
    let items = [(&e1, r1), (&e2, r2)];
    let mut pc = TokenSpeedSchedulerClient::connect(url(&p)).await.unwrap();
    let mut dc = TokenSpeedSchedulerClient::connect(url(&d)).await.unwrap();
    let prefill = tokio::spawn({
        let req = generate("r", Some(kv.clone()), &items);
        async move { pc.generate(req).await.map(|s| s.into_inner()) }
    });
    let decode = tokio::spawn({
        let req = generate("r", Some(kv.clone()), &[]);
        async move { dc.generate(req).await.map(|s| s.into_inner()) }
    });
    // Neither leg can start: no item has been encoded yet.
    common::wait_until("both legs held", || async {
        p.stats().inflight == 1 && d.stats().inflight == 1
    })
    .await;
    let mut enc1 = TokenSpeedEncoderClient::connect(url(&e1)).await.unwrap();
    assert!(enc1.encode(encode(r1)).await.unwrap().into_inner().accepted);
    // Checked from below only: however long it is given, the Prefill cannot start.
    let mut prefill = prefill;
    assert!(
        tokio::time::timeout(Duration::from_millis(50), &mut prefill)
            .await
            .is_err(),
        "one item is still missing"
    );
    let mut enc2 = TokenSpeedEncoderClient::connect(url(&e2)).await.unwrap();
    assert!(enc2.encode(encode(r2)).await.unwrap().into_inner().accepted);

    let mut ps = prefill.await.unwrap().unwrap();
    while ps.message().await.unwrap().is_some() {}
    let mut ds = decode.await.unwrap().unwrap();
    let mut ids = Vec::new();
    while let Some(m) = ds.message().await.unwrap() {
        if let Some(Response::Complete(c)) = m.response {
            ids = c.output_ids;
        }
    }
    assert_eq!(ids.len(), 4);
    for (e, room) in [(&e1, r1), (&e2, r2)] {
        let st = e.stats();
        assert_eq!(st.encode_items_total, 1);
        let last = st.last_request.unwrap();
        assert_eq!(last["items"][0]["bootstrap_room"], room);
        assert_eq!(last["items"][0]["content_hash"], "cafe");
        assert_eq!(last["items"][0]["shape"], serde_json::json!([16, 1176]));
    }
    let pl = p.stats().last_request.unwrap();
    assert_eq!(pl["has_encode_bootstrap_info"], true);
    assert_eq!(pl["kv_bootstrap_info"]["bootstrap_room"], (1_i64 << 62) + 9);
}

#[tokio::test]
async fn prefill_fails_when_an_embedding_never_comes_or_is_another_items() {
    let e = start(Role::Encode).await;
    let p = start_tuned(Role::Prefill, |c| {
        c.encode_wait = Duration::from_millis(200)
    })
    .await;
    let kv = KvBootstrapInfo {
        bootstrap_host: "127.0.0.1".to_owned(),
        bootstrap_port: i32::from(p.addr().port()),
        bootstrap_room: 5,
    };
    let mut pc = TokenSpeedSchedulerClient::connect(url(&p)).await.unwrap();
    // Nobody encodes the item: the bounded wait ends the request.
    let err = pc
        .generate(generate("never", Some(kv.clone()), &[(&e, 11)]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    // The room was finished with another picture than the one the request names.
    let mut enc = TokenSpeedEncoderClient::connect(url(&e)).await.unwrap();
    assert!(
        enc.encode(encode_item(12, &[0xbe, 0xef]))
            .await
            .unwrap()
            .into_inner()
            .accepted
    );
    let err = pc
        .generate(generate("other", Some(kv.clone()), &[(&e, 12)]))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("beef"), "{err:?}");
    // Pixels in the Generate request itself are refused: they go to the encode worker.
    let mut with_pixels = generate("pixels", Some(kv), &[(&e, 12)]);
    with_pixels.mm_inputs.as_mut().unwrap().items[0] = item(&[0xbe, 0xef], true);
    let err = pc.generate(with_pixels).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    // An Encode without its pixels is refused.
    let mut no_pixels = encode(13);
    no_pixels.mm_inputs.as_mut().unwrap().items[0] = item(&[0xca, 0xfe], false);
    let err = enc.encode(no_pixels).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    common::wait_until("the Prefill idle", || async { p.stats().inflight == 0 }).await;
}
