//! vLLM's engine protocol: the field numbers and types a router relies on.

use prost::Message;

use super::{field, fields, varint};
use crate::vllm_engine::{
    GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk,
    GetServerInfoResponse, InputLogProbs, InputTokenLogProb, SamplingParams, TokenizedInput,
    generate_complete, generate_request, generate_response, sampling_params,
};

fn request() -> GenerateRequest {
    GenerateRequest {
        request_id: "req-1".to_owned(),
        input: Some(generate_request::Input::Tokenized(TokenizedInput {
            original_text: "hi".to_owned(),
            input_ids: vec![104, 105],
        })),
        sampling_params: Some(SamplingParams {
            temperature: Some(0.0),
            top_p: 0.5,
            top_k: 40,
            max_tokens: Some(1),
            min_tokens: 2,
            stop_token_ids: vec![7],
            n: 3,
            constraint: Some(sampling_params::Constraint::Grammar("g".to_owned())),
            logprobs: Some(2),
            prompt_logprobs: Some(0),
            seed: Some(-5),
            include_stop_str_in_output: true,
            logit_bias: [(11, -1.5)].into(),
            ..Default::default()
        }),
        stream: true,
        kv_transfer_params_json: Some(r#"{"do_remote_decode":true}"#.to_owned()),
        data_parallel_rank: Some(0),
    }
}

#[test]
fn generate_request_field_numbers_match_the_engine() {
    let bytes = request().encode_to_vec();
    assert_eq!(field(&bytes, 1), (2, b"req-1".to_vec()));
    assert_eq!(field(&bytes, 5), (0, vec![1]));
    assert_eq!(field(&bytes, 8).1, br#"{"do_remote_decode":true}"#.to_vec());
    // `optional`: rank 0 is on the wire.
    assert_eq!(field(&bytes, 9), (0, vec![0]));

    let (wire, tokenized) = field(&bytes, 2);
    assert_eq!(wire, 2);
    assert_eq!(field(&tokenized, 1).1, b"hi".to_vec());
    assert_eq!(field(&tokenized, 2), (2, vec![104, 105]));

    let (_, s) = field(&bytes, 4);
    assert_eq!(field(&s, 1), (5, 0f32.to_le_bytes().to_vec()));
    assert_eq!(field(&s, 2), (5, 0.5f32.to_le_bytes().to_vec()));
    assert_eq!(varint(&field(&s, 3).1), 40);
    assert_eq!(varint(&field(&s, 8).1), 1);
    assert_eq!(varint(&field(&s, 9).1), 2);
    assert_eq!(field(&s, 11), (2, vec![7]));
    assert_eq!(varint(&field(&s, 15).1), 3);
    assert_eq!(field(&s, 18).1, b"g".to_vec());
    assert_eq!(varint(&field(&s, 22).1), 2);
    assert_eq!(field(&s, 23), (0, vec![0]));
    assert_eq!(varint(&field(&s, 24).1) as i64 as i32, -5);
    assert_eq!(field(&s, 25), (0, vec![1]));
    // map<int32, float>: an entry message of key 1, value 2.
    let (_, entry) = field(&s, 26);
    assert_eq!(varint(&field(&entry, 1).1), 11);
    assert_eq!(field(&entry, 2), (5, (-1.5f32).to_le_bytes().to_vec()));

    let text = GenerateRequest {
        input: Some(generate_request::Input::Text("plain".to_owned())),
        ..Default::default()
    }
    .encode_to_vec();
    assert_eq!(field(&text, 3).1, b"plain".to_vec());
    // Unset optionals are absent.
    assert!(fields(&SamplingParams::default().encode_to_vec()).is_empty());
}

#[test]
fn constraints_use_the_engines_numbers() {
    use sampling_params::Constraint as C;
    let cases = [
        (C::JsonSchema("{}".to_owned()), 16),
        (C::Regex("a".to_owned()), 17),
        (C::StructuralTag("t".to_owned()), 19),
        (C::JsonObject(true), 20),
    ];
    for (c, number) in cases {
        let bytes = SamplingParams {
            constraint: Some(c),
            ..Default::default()
        }
        .encode_to_vec();
        let numbers: Vec<u32> = fields(&bytes).iter().map(|f| f.0).collect();
        assert_eq!(numbers, vec![number]);
    }
}

#[test]
fn generate_response_field_numbers_match_the_engine() {
    let chunk = GenerateResponse {
        response: Some(generate_response::Response::Chunk(GenerateStreamChunk {
            token_ids: vec![65],
            prompt_tokens: 2,
            completion_tokens: 1,
            cached_tokens: 4,
            input_logprobs: Some(InputLogProbs {
                token_logprobs: vec![InputTokenLogProb { value: None }],
                token_ids: vec![9],
                ..Default::default()
            }),
            index: 1,
            ..Default::default()
        })),
    }
    .encode_to_vec();
    let (_, c) = field(&chunk, 1);
    assert_eq!(field(&c, 1), (2, vec![65]));
    assert_eq!(varint(&field(&c, 2).1), 2);
    assert_eq!(varint(&field(&c, 3).1), 1);
    assert_eq!(varint(&field(&c, 4).1), 4);
    let (_, input) = field(&c, 6);
    assert_eq!(field(&input, 1), (2, vec![]));
    assert_eq!(field(&input, 2), (2, vec![9]));
    assert_eq!(varint(&field(&c, 7).1), 1);

    let complete = GenerateResponse {
        response: Some(generate_response::Response::Complete(GenerateComplete {
            output_ids: vec![65, 66],
            finish_reason: "length".to_owned(),
            prompt_tokens: 2,
            completion_tokens: 2,
            cached_tokens: 16,
            index: 2,
            matched_stop: Some(generate_complete::MatchedStop::MatchedStopStr(
                "x".to_owned(),
            )),
            kv_transfer_params_json: Some("{}".to_owned()),
            ..Default::default()
        })),
    }
    .encode_to_vec();
    let (_, c) = field(&complete, 2);
    assert_eq!(field(&c, 1), (2, vec![65, 66]));
    assert_eq!(field(&c, 2).1, b"length".to_vec());
    assert_eq!(varint(&field(&c, 3).1), 2);
    assert_eq!(varint(&field(&c, 4).1), 2);
    assert_eq!(varint(&field(&c, 5).1), 16);
    assert_eq!(varint(&field(&c, 8).1), 2);
    assert_eq!(field(&c, 11).1, b"x".to_vec());
    assert_eq!(field(&c, 12).1, b"{}".to_vec());
    let token = GenerateComplete {
        matched_stop: Some(generate_complete::MatchedStop::MatchedTokenId(7)),
        ..Default::default()
    }
    .encode_to_vec();
    assert_eq!(varint(&field(&token, 10).1), 7);
}

#[test]
fn server_info_field_numbers_match_the_engine() {
    let bytes = GetServerInfoResponse {
        active_requests: 3,
        server_type: "vllm-grpc".to_owned(),
        kv_connector: "NixlConnector".to_owned(),
        kv_role: "kv_producer".to_owned(),
        kv_engine_id: "e0".to_owned(),
        data_parallel_size: 2,
        uptime_seconds: 1.5,
        ..Default::default()
    }
    .encode_to_vec();
    assert_eq!(varint(&field(&bytes, 1).1), 3);
    assert_eq!(field(&bytes, 4), (1, 1.5f64.to_le_bytes().to_vec()));
    assert_eq!(field(&bytes, 5).1, b"vllm-grpc".to_vec());
    assert_eq!(field(&bytes, 6).1, b"NixlConnector".to_vec());
    assert_eq!(field(&bytes, 7).1, b"kv_producer".to_vec());
    assert_eq!(field(&bytes, 8).1, b"e0".to_vec());
    assert_eq!(varint(&field(&bytes, 9).1), 2);
}

#[test]
fn abort_and_model_info_field_numbers_match_the_engine() {
    use crate::vllm_engine::{AbortRequest, GetModelInfoResponse};
    let abort = AbortRequest {
        request_ids: vec!["a".to_owned(), "b".to_owned()],
    }
    .encode_to_vec();
    let ids: Vec<_> = fields(&abort).into_iter().map(|f| (f.0, f.2)).collect();
    assert_eq!(ids, vec![(1, b"a".to_vec()), (1, b"b".to_vec())]);
    let info = GetModelInfoResponse {
        served_model_name: "m".to_owned(),
        eos_token_ids: vec![2],
        max_context_length: 4096,
        tokenizer_path: "/t".to_owned(),
        ..Default::default()
    }
    .encode_to_vec();
    assert_eq!(varint(&field(&info, 3).1), 4096);
    assert_eq!(field(&info, 6).1, b"m".to_vec());
    assert_eq!(field(&info, 7).1, b"/t".to_vec());
    assert_eq!(field(&info, 10), (2, vec![2]));
}

#[test]
fn method_paths_name_the_engines_service() {
    use crate::vllm_engine::vllm_engine_server::SERVICE_NAME;
    assert_eq!(SERVICE_NAME, crate::VLLM_ENGINE_SERVICE);
}
