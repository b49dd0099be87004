//! The gRPC protocol of SGLang-style scheduler workers, as prost messages
//! with a tonic client and server.
//!
//! The `.proto` files under `proto/` are compiled at build time by `protox`
//! (no system `protoc`). Generated modules mirror the protobuf packages,
//! because generated code names types of other packages by relative path:
//!
//! * [`scheduler`] (`sglang.grpc.scheduler`): the `SglangScheduler` service
//!   (`Generate`, `HealthCheck`, `Abort`, `GetModelInfo`, `GetServerInfo`,
//!   `GetTokenizer`) and its messages; client in
//!   [`scheduler::sglang_scheduler_client`], server trait in
//!   [`scheduler::sglang_scheduler_server`].
//! * [`common`] (`smg.grpc.common`): the `GetTokenizer` request and chunk, and the
//!   multimodal `Modality`.
//! * [`tokenspeed_scheduler`] (`tokenspeed.grpc.scheduler`): TokenSpeed's `TokenSpeedScheduler`
//!   service (the same six methods) and its messages; client in
//!   [`tokenspeed_scheduler::token_speed_scheduler_client`].
//! * [`tokenspeed_encoder`] (`tokenspeed.grpc.encoder`): TokenSpeed's `TokenSpeedEncoder`
//!   service (`Encode`), used for EPD.
//! * [`vllm_engine`] (`vllm.grpc.engine`): vLLM's `VllmEngine` service (`Generate`,
//!   `HealthCheck`, `Abort`, `GetModelInfo`, `GetServerInfo`, `GetTokenizer`); client in
//!   [`vllm_engine::vllm_engine_client`].
//! * [`grpc::health::v1`] (`grpc.health.v1`): the standard health service's `Check`, how
//!   encode workers are health-checked.
//!
//! Invariant: field numbers and types are the wire contract with real
//! engines; the tests below pin the ones a router relies on.

/// Generated code of package `smg.*`.
pub mod smg {
    /// Generated code of package `smg.grpc.*`.
    pub mod grpc {
        /// Package `smg.grpc.common`.
        #[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
        pub mod common {
            include!(concat!(env!("OUT_DIR"), "/smg.grpc.common.rs"));
        }
    }
}

/// Generated code of package `sglang.*`.
pub mod sglang {
    /// Generated code of package `sglang.grpc.*`.
    pub mod grpc {
        /// Package `sglang.grpc.scheduler`.
        #[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
        pub mod scheduler {
            include!(concat!(env!("OUT_DIR"), "/sglang.grpc.scheduler.rs"));
        }
    }
}

/// Generated code of package `tokenspeed.*`.
pub mod tokenspeed {
    /// Generated code of package `tokenspeed.grpc.*`.
    pub mod grpc {
        /// Package `tokenspeed.grpc.scheduler`.
        #[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
        pub mod scheduler {
            include!(concat!(env!("OUT_DIR"), "/tokenspeed.grpc.scheduler.rs"));
        }
        /// Package `tokenspeed.grpc.encoder`.
        #[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
        pub mod encoder {
            include!(concat!(env!("OUT_DIR"), "/tokenspeed.grpc.encoder.rs"));
        }
    }
}

/// Generated code of package `vllm.*`.
pub mod vllm {
    /// Generated code of package `vllm.grpc.*`.
    pub mod grpc {
        /// Package `vllm.grpc.engine`.
        #[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
        pub mod engine {
            include!(concat!(env!("OUT_DIR"), "/vllm.grpc.engine.rs"));
        }
    }
}

/// Generated code of package `grpc.*`.
pub mod grpc {
    /// Generated code of package `grpc.health.*`.
    pub mod health {
        /// Package `grpc.health.v1`: the standard health service.
        #[allow(missing_docs, unreachable_pub, clippy::all, clippy::pedantic)]
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
        }
    }
}

/// The well-known types (`Struct`, `Value`, `Timestamp`) the messages use.
pub use prost_types;
pub use sglang::grpc::scheduler;
pub use smg::grpc::common;
pub use tokenspeed::grpc::encoder as tokenspeed_encoder;
pub use tokenspeed::grpc::scheduler as tokenspeed_scheduler;
pub use vllm::grpc::engine as vllm_engine;

/// Full name of the scheduler service, the first segment of its method paths
/// (`/sglang.grpc.scheduler.SglangScheduler/Generate`, ...).
pub const SCHEDULER_SERVICE: &str = "sglang.grpc.scheduler.SglangScheduler";

/// Full name of TokenSpeed's scheduler service.
pub const TOKENSPEED_SCHEDULER_SERVICE: &str = "tokenspeed.grpc.scheduler.TokenSpeedScheduler";

/// Full name of vLLM's engine service.
pub const VLLM_ENGINE_SERVICE: &str = "vllm.grpc.engine.VllmEngine";

/// Full name of TokenSpeed's encode service.
pub const TOKENSPEED_ENCODER_SERVICE: &str = "tokenspeed.grpc.encoder.TokenSpeedEncoder";

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::scheduler::{
        DisaggregatedParams, GenerateComplete, GenerateRequest, GenerateResponse,
        GenerateStreamChunk, SamplingParams, TokenizedInput, generate_response, sampling_params,
    };
    use super::*;

    /// Decodes a message into `(field number, wire type, payload)` triples,
    /// without using the generated code, so renumbering shows up.
    fn fields(mut buf: &[u8]) -> Vec<(u32, u8, Vec<u8>)> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            let key = prost::encoding::decode_varint(&mut buf).expect("key");
            let (number, wire) = ((key >> 3) as u32, (key & 7) as u8);
            let payload = match wire {
                0 => {
                    let v = prost::encoding::decode_varint(&mut buf).expect("varint");
                    let mut b = Vec::new();
                    prost::encoding::encode_varint(v, &mut b);
                    b
                }
                1 => {
                    let (p, rest) = buf.split_at(8);
                    buf = rest;
                    p.to_vec()
                }
                2 => {
                    let len = prost::encoding::decode_varint(&mut buf).expect("len") as usize;
                    let (p, rest) = buf.split_at(len);
                    buf = rest;
                    p.to_vec()
                }
                5 => {
                    let (p, rest) = buf.split_at(4);
                    buf = rest;
                    p.to_vec()
                }
                w => panic!("unexpected wire type {w}"),
            };
            out.push((number, wire, payload));
        }
        out
    }

    fn field(buf: &[u8], number: u32) -> (u8, Vec<u8>) {
        let found: Vec<_> = fields(buf)
            .into_iter()
            .filter(|(n, _, _)| *n == number)
            .collect();
        assert_eq!(found.len(), 1, "field {number} once in {:?}", fields(buf));
        let (_, wire, payload) = found.into_iter().next().unwrap();
        (wire, payload)
    }

    fn varint(payload: &[u8]) -> u64 {
        prost::encoding::decode_varint(&mut &payload[..]).unwrap()
    }

    fn request() -> GenerateRequest {
        GenerateRequest {
            request_id: "req-1".to_owned(),
            tokenized: Some(TokenizedInput {
                original_text: "hi".to_owned(),
                input_ids: vec![104, 105],
            }),
            sampling_params: Some(SamplingParams {
                temperature: 0.5,
                top_k: -1,
                max_new_tokens: Some(0),
                stop_token_ids: vec![7],
                n: 1,
                constraint: Some(sampling_params::Constraint::JsonSchema("{}".to_owned())),
                ..Default::default()
            }),
            disaggregated_params: Some(DisaggregatedParams {
                bootstrap_host: "10.0.0.1".to_owned(),
                bootstrap_port: 8998,
                bootstrap_room: 12345,
            }),
            data_parallel_rank: 3,
            stream: true,
            ..Default::default()
        }
    }

    #[test]
    fn generate_request_round_trips() {
        let req = request();
        let bytes = req.encode_to_vec();
        assert_eq!(GenerateRequest::decode(bytes.as_slice()).unwrap(), req);
    }

    #[test]
    fn generate_request_field_numbers_match_the_engines() {
        let bytes = request().encode_to_vec();
        assert_eq!(field(&bytes, 1), (2, b"req-1".to_vec()));
        assert_eq!(varint(&field(&bytes, 16).1), 3);
        assert_eq!(field(&bytes, 17), (0, vec![1]));

        let (wire, tokenized) = field(&bytes, 2);
        assert_eq!(wire, 2);
        assert_eq!(field(&tokenized, 1).1, b"hi".to_vec());
        // Packed repeated uint32.
        assert_eq!(field(&tokenized, 2), (2, vec![104, 105]));

        let (_, disagg) = field(&bytes, 10);
        assert_eq!(field(&disagg, 1).1, b"10.0.0.1".to_vec());
        assert_eq!(varint(&field(&disagg, 2).1), 8998);
        assert_eq!(varint(&field(&disagg, 3).1), 12345);

        let (_, sampling) = field(&bytes, 4);
        assert_eq!(field(&sampling, 1), (5, 0.5f32.to_le_bytes().to_vec()));
        // int32 -1 is a ten-byte varint.
        assert_eq!(varint(&field(&sampling, 3).1) as i64 as i32, -1);
        // `optional`: an explicit zero is still on the wire.
        assert_eq!(field(&sampling, 8), (0, vec![0]));
        assert_eq!(field(&sampling, 10), (2, vec![7]));
        assert_eq!(field(&sampling, 14).1, b"{}".to_vec());
        assert_eq!(varint(&field(&sampling, 17).1), 1);

        // Unset optional: absent.
        let unset = SamplingParams::default().encode_to_vec();
        assert!(fields(&unset).iter().all(|(n, _, _)| *n != 8));
    }

    #[test]
    fn generate_response_field_numbers_match_the_engines() {
        let chunk = GenerateResponse {
            request_id: "r".to_owned(),
            response: Some(generate_response::Response::Chunk(GenerateStreamChunk {
                token_ids: vec![65],
                prompt_tokens: 2,
                completion_tokens: 1,
                cached_tokens: 4,
                index: 1,
                ..Default::default()
            })),
        }
        .encode_to_vec();
        let (_, c) = field(&chunk, 2);
        assert_eq!(field(&c, 1), (2, vec![65]));
        assert_eq!(varint(&field(&c, 2).1), 2);
        assert_eq!(varint(&field(&c, 3).1), 1);
        assert_eq!(varint(&field(&c, 4).1), 4);
        assert_eq!(varint(&field(&c, 8).1), 1);

        let complete = GenerateResponse {
            request_id: "r".to_owned(),
            response: Some(generate_response::Response::Complete(GenerateComplete {
                output_ids: vec![65, 66],
                finish_reason: "stop".to_owned(),
                prompt_tokens: 2,
                completion_tokens: 2,
                matched_stop: Some(scheduler::generate_complete::MatchedStop::MatchedTokenId(
                    66,
                )),
                ..Default::default()
            })),
        }
        .encode_to_vec();
        let (_, c) = field(&complete, 3);
        assert_eq!(field(&c, 1), (2, vec![65, 66]));
        assert_eq!(field(&c, 2).1, b"stop".to_vec());
        assert_eq!(varint(&field(&c, 3).1), 2);
        assert_eq!(varint(&field(&c, 4).1), 2);
        assert_eq!(varint(&field(&c, 8).1), 66);
    }

    #[test]
    fn tokenizer_chunk_field_numbers_match_the_engines() {
        let bytes = common::GetTokenizerChunk {
            data: vec![1, 2],
            sha256: "ab".to_owned(),
        }
        .encode_to_vec();
        assert_eq!(field(&bytes, 1), (2, vec![1, 2]));
        assert_eq!(field(&bytes, 2), (2, b"ab".to_vec()));
    }

    #[test]
    fn method_paths_name_the_engines_service() {
        use scheduler::sglang_scheduler_server::SERVICE_NAME;
        assert_eq!(SERVICE_NAME, SCHEDULER_SERVICE);
    }

    mod vllm;

    mod tokenspeed {
        use prost::Message;

        use super::{field, fields, varint};
        use crate::tokenspeed_encoder::{EncodeItemAssignment, EncodeRequest, EncodeResponse};
        use crate::tokenspeed_scheduler::{
            EncodeBootstrapInfo, EncodeItemBootstrapInfo, GenerateComplete, GenerateRequest,
            GenerateResponse, GenerateStreamChunk, HealthCheckResponse, KvBootstrapInfo,
            MultimodalInputs, MultimodalItem, PlaceholderRange, SamplingParams, TensorData,
            TokenizedInput, generate_complete, generate_response, tensor_data,
        };

        fn request() -> GenerateRequest {
            GenerateRequest {
                request_id: "req-1".to_owned(),
                tokenized: Some(TokenizedInput {
                    input_ids: vec![104, 105],
                    original_text: "hi".to_owned(),
                }),
                sampling_params: Some(SamplingParams {
                    temperature: Some(0.0),
                    top_k: Some(-1),
                    max_new_tokens: Some(9),
                    stop_token_ids: vec![7],
                    n: 2,
                    ..Default::default()
                }),
                logprob_start_len: Some(0),
                stream: true,
                kv_bootstrap_info: Some(KvBootstrapInfo {
                    bootstrap_host: "10.0.0.1".to_owned(),
                    bootstrap_port: 8998,
                    bootstrap_room: (1 << 62) + 5,
                }),
                encode_bootstrap_info: Some(EncodeBootstrapInfo {
                    items: vec![EncodeItemBootstrapInfo {
                        item_index: 1,
                        bootstrap_host: "10.0.0.2".to_owned(),
                        bootstrap_port: 9100,
                        bootstrap_room: i64::MAX,
                    }],
                }),
                data_parallel_rank: Some(3),
                ..Default::default()
            }
        }

        #[test]
        fn generate_request_field_numbers_match_the_engine() {
            let bytes = request().encode_to_vec();
            assert_eq!(field(&bytes, 1), (2, b"req-1".to_vec()));
            assert_eq!(varint(&field(&bytes, 5).1), 0);
            assert_eq!(field(&bytes, 8), (0, vec![1]));
            assert_eq!(varint(&field(&bytes, 12).1), 3);

            // Swapped against SGLang: ids are field 1, the text field 2.
            let (_, tokenized) = field(&bytes, 2);
            assert_eq!(field(&tokenized, 1), (2, vec![104, 105]));
            assert_eq!(field(&tokenized, 2).1, b"hi".to_vec());

            let (_, kv) = field(&bytes, 11);
            assert_eq!(field(&kv, 1).1, b"10.0.0.1".to_vec());
            assert_eq!(varint(&field(&kv, 2).1), 8998);
            // int64: a room above 2^31 survives.
            assert_eq!(varint(&field(&kv, 3).1), (1 << 62) + 5);

            let (_, enc) = field(&bytes, 10);
            let (_, item) = field(&enc, 1);
            assert_eq!(varint(&field(&item, 1).1), 1);
            assert_eq!(field(&item, 2).1, b"10.0.0.2".to_vec());
            assert_eq!(varint(&field(&item, 3).1), 9100);
            assert_eq!(varint(&field(&item, 4).1), i64::MAX as u64);

            let (_, sampling) = field(&bytes, 3);
            // `optional`: explicit zeros are on the wire.
            assert_eq!(field(&sampling, 1), (5, 0f32.to_le_bytes().to_vec()));
            assert_eq!(varint(&field(&sampling, 3).1) as i64 as i32, -1);
            assert_eq!(varint(&field(&sampling, 8).1), 9);
            assert_eq!(field(&sampling, 11), (2, vec![7]));
            assert_eq!(varint(&field(&sampling, 15).1), 2);
        }

        #[test]
        fn unset_sampling_scalars_are_absent() {
            let bytes = SamplingParams::default().encode_to_vec();
            assert!(fields(&bytes).is_empty(), "{:?}", fields(&bytes));
            let only_top_p = SamplingParams {
                top_p: Some(0.5),
                ..Default::default()
            }
            .encode_to_vec();
            let numbers: Vec<u32> = fields(&only_top_p).iter().map(|f| f.0).collect();
            assert_eq!(numbers, vec![2]);
        }

        #[test]
        fn multimodal_items_field_numbers_match_the_engine() {
            let mm = MultimodalInputs {
                items: vec![MultimodalItem {
                    modality: crate::common::Modality::Image as i32,
                    content_hash: vec![0xab],
                    encoder_input: Some(TensorData {
                        shape: vec![4, 1176],
                        dtype: "bfloat16".to_owned(),
                        payload: Some(tensor_data::Payload::Inline(vec![1, 2])),
                    }),
                    placeholders: vec![PlaceholderRange {
                        offset: 3,
                        length: 1,
                    }],
                    placeholder_token_id: Some(151_655),
                    ..Default::default()
                }],
            }
            .encode_to_vec();
            let (_, item) = field(&mm, 1);
            assert_eq!(varint(&field(&item, 1).1), 1);
            assert_eq!(field(&item, 2).1, vec![0xab]);
            let (_, t) = field(&item, 3);
            assert_eq!(field(&t, 1).1, {
                let mut b = vec![4];
                prost::encoding::encode_varint(1176, &mut b);
                b
            });
            assert_eq!(field(&t, 2).1, b"bfloat16".to_vec());
            assert_eq!(field(&t, 3).1, vec![1, 2]);
            let (_, ph) = field(&item, 5);
            assert_eq!(varint(&field(&ph, 1).1), 3);
            assert_eq!(varint(&field(&item, 6).1), 151_655);
        }

        #[test]
        fn generate_response_field_numbers_match_the_engine() {
            let chunk = GenerateResponse {
                request_id: "r".to_owned(),
                response: Some(generate_response::Response::Chunk(GenerateStreamChunk {
                    token_ids: vec![65],
                    prompt_tokens: 2,
                    completion_tokens: 1,
                    cached_tokens: 4,
                    index: 1,
                    ..Default::default()
                })),
            }
            .encode_to_vec();
            let (_, c) = field(&chunk, 2);
            assert_eq!(field(&c, 1), (2, vec![65]));
            assert_eq!(varint(&field(&c, 2).1), 2);
            assert_eq!(varint(&field(&c, 3).1), 1);
            assert_eq!(varint(&field(&c, 4).1), 4);
            assert_eq!(varint(&field(&c, 6).1), 1);

            let complete = GenerateResponse {
                request_id: "r".to_owned(),
                response: Some(generate_response::Response::Complete(GenerateComplete {
                    output_ids: vec![65, 66],
                    finish_reason: "stop".to_owned(),
                    prompt_tokens: 2,
                    completion_tokens: 2,
                    matched_stop: Some(generate_complete::MatchedStop::MatchedStopStr(
                        "x".to_owned(),
                    )),
                    index: 1,
                    ..Default::default()
                })),
            }
            .encode_to_vec();
            let (_, c) = field(&complete, 3);
            assert_eq!(field(&c, 1), (2, vec![65, 66]));
            assert_eq!(field(&c, 2).1, b"stop".to_vec());
            assert_eq!(varint(&field(&c, 3).1), 2);
            assert_eq!(varint(&field(&c, 4).1), 2);
            assert_eq!(field(&c, 8).1, b"x".to_vec());
            assert_eq!(varint(&field(&c, 9).1), 1);

            let health = HealthCheckResponse {
                healthy: true,
                message: "ok".to_owned(),
            }
            .encode_to_vec();
            assert_eq!(field(&health, 1), (0, vec![1]));
        }

        #[test]
        fn encode_request_field_numbers_match_the_engine() {
            let bytes = EncodeRequest {
                request_id: "e".to_owned(),
                mm_inputs: Some(MultimodalInputs {
                    items: vec![MultimodalItem::default()],
                }),
                items: vec![EncodeItemAssignment {
                    bootstrap_room: (1 << 40) + 1,
                }],
            }
            .encode_to_vec();
            assert_eq!(field(&bytes, 1).1, b"e".to_vec());
            let (wire, mm) = field(&bytes, 2);
            assert_eq!(wire, 2);
            assert_eq!(field(&mm, 1).1, Vec::<u8>::new());
            let (_, a) = field(&bytes, 3);
            assert_eq!(varint(&field(&a, 1).1), (1 << 40) + 1);
            let accepted = EncodeResponse { accepted: true }.encode_to_vec();
            assert_eq!(field(&accepted, 1), (0, vec![1]));
        }

        #[test]
        fn standard_health_check_field_numbers() {
            use crate::grpc::health::v1::health_check_response::ServingStatus;
            use crate::grpc::health::v1::{HealthCheckRequest, HealthCheckResponse};
            let req = HealthCheckRequest {
                service: "s".to_owned(),
            }
            .encode_to_vec();
            assert_eq!(field(&req, 1).1, b"s".to_vec());
            let resp = HealthCheckResponse {
                status: ServingStatus::Serving as i32,
            }
            .encode_to_vec();
            assert_eq!(field(&resp, 1), (0, vec![1]));
            assert_eq!(ServingStatus::NotServing as i32, 2);
            assert_eq!(
                crate::grpc::health::v1::health_server::SERVICE_NAME,
                "grpc.health.v1.Health"
            );
        }

        #[test]
        fn method_paths_name_the_engines_services() {
            use crate::tokenspeed_encoder::token_speed_encoder_server::SERVICE_NAME as ENC;
            use crate::tokenspeed_scheduler::token_speed_scheduler_server::SERVICE_NAME;
            assert_eq!(SERVICE_NAME, crate::TOKENSPEED_SCHEDULER_SERVICE);
            assert_eq!(ENC, crate::TOKENSPEED_ENCODER_SERVICE);
        }
    }
}
