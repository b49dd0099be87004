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
//! * [`common`] (`smg.grpc.common`): the `GetTokenizer` request and chunk.
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

/// The well-known types (`Struct`, `Value`, `Timestamp`) the messages use.
pub use prost_types;
pub use sglang::grpc::scheduler;
pub use smg::grpc::common;

/// Full name of the scheduler service, the first segment of its method paths
/// (`/sglang.grpc.scheduler.SglangScheduler/Generate`, ...).
pub const SCHEDULER_SERVICE: &str = "sglang.grpc.scheduler.SglangScheduler";

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
}
