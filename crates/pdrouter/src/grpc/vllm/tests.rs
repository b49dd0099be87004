use pdrouter_proto::scheduler::{SamplingParams, TokenizedInput};

use super::*;

fn call(unset: &[&'static str]) -> Call {
    Call {
        req: GenerateRequest {
            request_id: "r".to_owned(),
            tokenized: Some(TokenizedInput {
                original_text: "hi".to_owned(),
                input_ids: vec![1, 2, 3],
            }),
            sampling_params: Some(SamplingParams {
                temperature: 0.0,
                top_p: 0.9,
                top_k: -1,
                repetition_penalty: 1.0,
                max_new_tokens: Some(1),
                min_new_tokens: 0,
                n: 1,
                no_stop_trim: true,
                logit_bias: [("42".to_owned(), 2.0)].into(),
                constraint: Some(sampling_params::Constraint::EbnfGrammar("g".to_owned())),
                ..Default::default()
            }),
            logprob_start_len: -1,
            stream: false,
            ..Default::default()
        },
        unset: unset.into(),
        dp_rank: Some(1),
        kv: None,
        images: Default::default(),
        shared: None,
        kv_params: Some(r#"{"do_remote_decode":true}"#.to_owned()),
        seed: Some(7),
    }
}

#[test]
fn a_call_becomes_vllms_message() {
    let r = call(&[]).into_vllm();
    assert_eq!(r.request_id, "r");
    let Some(vl::generate_request::Input::Tokenized(t)) = &r.input else {
        panic!("{r:?}")
    };
    assert_eq!(
        (t.input_ids.as_slice(), t.original_text.as_str()),
        (&[1, 2, 3][..], "hi")
    );
    assert!(!r.stream);
    assert_eq!(
        r.kv_transfer_params_json.as_deref(),
        Some(r#"{"do_remote_decode":true}"#)
    );
    assert_eq!(r.data_parallel_rank, Some(1));
    let p = r.sampling_params.unwrap();
    // An explicit zero temperature is sent; SGLang's "any token" top_k is vLLM's 0.
    assert_eq!(p.temperature, Some(0.0));
    assert_eq!((p.top_p, p.top_k, p.max_tokens), (0.9, 0, Some(1)));
    assert!(p.include_stop_str_in_output);
    assert_eq!(p.logit_bias.get(&42), Some(&2.0));
    assert_eq!(
        p.constraint,
        Some(vl::sampling_params::Constraint::Grammar("g".to_owned()))
    );
    assert_eq!((p.logprobs, p.prompt_logprobs), (None, None));
    assert_eq!(p.seed, Some(7));
    assert!(seed_fits(Some(7)) && !seed_fits(Some(1 << 40)));
}

#[test]
fn unset_temperature_and_cap_are_left_to_the_engine() {
    let r = call(&["temperature", "max_new_tokens"]).into_vllm();
    let p = r.sampling_params.unwrap();
    assert_eq!((p.temperature, p.max_tokens), (None, None));
    let mut c = call(&[]);
    c.req.sampling_params.as_mut().unwrap().top_k = 20;
    assert_eq!(c.into_vllm().sampling_params.unwrap().top_k, 20);
}

#[test]
fn logprob_asks_become_vllms_counts() {
    let mut c = call(&[]);
    c.req.return_logprob = true;
    c.req.top_logprobs_num = 3;
    c.req.logprob_start_len = 2;
    let p = c.into_vllm().sampling_params.unwrap();
    assert_eq!((p.logprobs, p.prompt_logprobs), (Some(3), Some(3)));
}

#[test]
fn what_vllm_cannot_carry_is_named() {
    let base = call(&[]).req;
    assert_eq!(unsupported(&base), None);
    let mut r = base.clone();
    r.token_ids_logprob = vec![1];
    assert_eq!(unsupported(&r), Some("token_ids_logprob"));
    let mut r = base.clone();
    r.sampling_params.as_mut().unwrap().stream_interval = Some(2);
    assert_eq!(unsupported(&r), Some("stream_interval"));
    let mut r = base;
    r.sampling_params
        .as_mut()
        .unwrap()
        .logit_bias
        .insert("x".to_owned(), 1.0);
    assert!(unsupported(&r).unwrap().starts_with("logit_bias"));
}

#[test]
fn answers_read_as_sglangs_with_the_handoff_kept() {
    let complete = vl::GenerateResponse {
        response: Some(vl::generate_response::Response::Complete(
            vl::GenerateComplete {
                output_ids: vec![5],
                finish_reason: "length".to_owned(),
                prompt_tokens: 4,
                completion_tokens: 1,
                cached_tokens: 0,
                index: 1,
                input_logprobs: Some(vl::InputLogProbs {
                    token_logprobs: (0..4)
                        .map(|i| vl::InputTokenLogProb {
                            value: (i > 0).then_some(-(i as f32)),
                        })
                        .collect(),
                    token_ids: vec![10, 11, 12, 13],
                    top_logprobs: Vec::new(),
                }),
                matched_stop: Some(vl::generate_complete::MatchedStop::MatchedTokenId(5)),
                kv_transfer_params_json: Some(r#"{"remote_engine_id":"e"}"#.to_owned()),
                ..Default::default()
            },
        )),
    };
    let (m, kv) = response_from_vllm(complete, "req-1", 2);
    assert_eq!(m.request_id, "req-1");
    assert_eq!(kv.as_deref(), Some(r#"{"remote_engine_id":"e"}"#));
    let Some(generate_response::Response::Complete(c)) = m.response else {
        panic!("{m:?}")
    };
    assert_eq!((c.index, c.completion_tokens, c.prompt_tokens), (1, 1, 4));
    assert_eq!(
        c.matched_stop,
        Some(generate_complete::MatchedStop::MatchedTokenId(5))
    );
    // Prompt logprobs from the client's start position.
    let input = c.input_logprobs.unwrap();
    assert_eq!(input.token_ids, vec![12, 13]);
    assert_eq!(input.token_logprobs[0].value, Some(-2.0));

    let chunk = vl::GenerateResponse {
        response: Some(vl::generate_response::Response::Chunk(
            vl::GenerateStreamChunk {
                token_ids: vec![7],
                cached_tokens: 16,
                index: 2,
                ..Default::default()
            },
        )),
    };
    let (m, kv) = response_from_vllm(chunk, "r", 0);
    assert_eq!(kv, None);
    let Some(generate_response::Response::Chunk(c)) = m.response else {
        panic!("{m:?}")
    };
    assert_eq!((c.token_ids, c.cached_tokens, c.index), (vec![7], 16, 2));
}

#[test]
fn server_info_gives_the_kv_configuration_and_dp_size() {
    let info = server_info_from_vllm(vl::GetServerInfoResponse {
        server_type: "vllm-grpc".to_owned(),
        kv_connector: "NixlConnector".to_owned(),
        kv_role: "kv_producer".to_owned(),
        kv_engine_id: "e0".to_owned(),
        data_parallel_size: 4,
        active_requests: 2,
        ..Default::default()
    });
    let kv = VllmKv::of(&info);
    assert_eq!(kv.connector, Some(KvConnector::Nixl));
    assert_eq!(
        (kv.role.as_str(), kv.connector_name.as_str()),
        ("kv_producer", "NixlConnector")
    );
    let json = crate::grpc::info::server_info_json(&info);
    assert_eq!(json["dp_size"], 4);
    assert_eq!(json["kv_engine_id"], "e0");
    assert_eq!(json["server_type"], "vllm-grpc");
    assert_eq!(json["active_requests"], 2);
    assert_eq!(
        VllmKv::of(&server_info_from_vllm(Default::default())),
        VllmKv::default()
    );
}

#[test]
fn connector_class_names_are_recognised() {
    for (class, want) in [
        ("NixlConnector", Some(KvConnector::Nixl)),
        ("MooncakeConnector", Some(KvConnector::Mooncake)),
        ("LMCacheConnectorV1", Some(KvConnector::Lmcache)),
        ("", None),
        ("P2pNcclConnector", None),
    ] {
        assert_eq!(connector_of(class), want, "{class}");
    }
}
