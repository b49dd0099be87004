//! JSON views of protocol messages: what `GET /mock/stats` shows of a
//! `GenerateRequest` (SGLang's, TokenSpeed's or vLLM's), and `google.protobuf.Struct` <-> JSON.

use pdrouter_proto::scheduler::{GenerateRequest, SamplingParams, sampling_params::Constraint};
use pdrouter_proto::tokenspeed_scheduler as ts;
use pdrouter_proto::vllm_engine as vl;
use prost_types::value::Kind;
use serde_json::{Map, Value, json};

/// A float as JSON, by its shortest decimal form (0.7f32 shows as 0.7, not
/// 0.699999988); NaN and infinities as null.
fn float(v: f32) -> Value {
    v.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

fn sampling(p: &SamplingParams) -> Value {
    let mut v = json!({
        "temperature": float(p.temperature),
        "top_p": float(p.top_p),
        "top_k": p.top_k,
        "min_p": float(p.min_p),
        "frequency_penalty": float(p.frequency_penalty),
        "presence_penalty": float(p.presence_penalty),
        "repetition_penalty": float(p.repetition_penalty),
        "max_new_tokens": p.max_new_tokens,
        "stop": p.stop,
        "stop_token_ids": p.stop_token_ids,
        "skip_special_tokens": p.skip_special_tokens,
        "spaces_between_special_tokens": p.spaces_between_special_tokens,
        "n": p.n,
        "min_new_tokens": p.min_new_tokens,
        "ignore_eos": p.ignore_eos,
        "no_stop_trim": p.no_stop_trim,
        "stream_interval": p.stream_interval,
        "logit_bias": p.logit_bias.iter()
            .map(|(k, b)| (k.clone(), float(*b)))
            .collect::<Map<_, _>>(),
        "custom_params": p.custom_params.as_ref().map(struct_to_json),
    });
    if let (Some(c), Value::Object(map)) = (&p.constraint, &mut v) {
        let (key, text) = match c {
            Constraint::Regex(s) => ("regex", s),
            Constraint::JsonSchema(s) => ("json_schema", s),
            Constraint::EbnfGrammar(s) => ("ebnf_grammar", s),
            Constraint::StructuralTag(s) => ("structural_tag", s),
        };
        map.insert(key.to_owned(), Value::String(text.clone()));
    }
    v
}

/// The fields of a `GenerateRequest` a router test checks.
pub(crate) fn generate_request(r: &GenerateRequest) -> Value {
    let tokenized = r.tokenized.as_ref();
    json!({
        "request_id": r.request_id,
        "input_ids": tokenized.map(|t| t.input_ids.as_slice()).unwrap_or_default(),
        "original_text": tokenized.map(|t| t.original_text.as_str()).unwrap_or_default(),
        "sampling_params": r.sampling_params.as_ref().map(sampling),
        "disaggregated_params": r.disaggregated_params.as_ref().map(|d| json!({
            "bootstrap_host": d.bootstrap_host,
            "bootstrap_port": d.bootstrap_port,
            "bootstrap_room": d.bootstrap_room,
        })),
        "stream": r.stream,
        "return_logprob": r.return_logprob,
        "logprob_start_len": r.logprob_start_len,
        "top_logprobs_num": r.top_logprobs_num,
        "data_parallel_rank": r.data_parallel_rank,
        "lora_id": r.lora_id,
    })
}

/// The fields of a TokenSpeed `GenerateRequest` a router test checks, as sent: a sampling
/// scalar the request left out is `null`, and `sampling_set` names the ones it carried.
pub(crate) fn tokenspeed_request(r: &ts::GenerateRequest) -> Value {
    let tokenized = r.tokenized.as_ref();
    let sampling = r.sampling_params.as_ref().map(|p| {
        let opt = |v: Option<f32>| v.map_or(Value::Null, float);
        let scalars = [
            ("temperature", opt(p.temperature)),
            ("top_p", opt(p.top_p)),
            ("top_k", json!(p.top_k)),
            ("min_p", opt(p.min_p)),
            ("frequency_penalty", opt(p.frequency_penalty)),
            ("presence_penalty", opt(p.presence_penalty)),
            ("repetition_penalty", opt(p.repetition_penalty)),
            ("max_new_tokens", json!(p.max_new_tokens)),
        ];
        let set: Vec<&str> = scalars
            .iter()
            .filter(|(_, v)| !v.is_null())
            .map(|(k, _)| *k)
            .collect();
        let mut map: Map<String, Value> = scalars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.clone()))
            .collect();
        map.insert("sampling_set".to_owned(), json!(set));
        map.insert("stop".to_owned(), json!(p.stop));
        map.insert("stop_token_ids".to_owned(), json!(p.stop_token_ids));
        map.insert("n".to_owned(), json!(p.n));
        map.insert("ignore_eos".to_owned(), json!(p.ignore_eos));
        map.insert("sampling_seed".to_owned(), json!(p.sampling_seed));
        map.insert(
            "logit_bias".to_owned(),
            p.logit_bias
                .iter()
                .map(|(k, b)| (k.clone(), float(*b)))
                .collect::<Map<_, _>>()
                .into(),
        );
        Value::Object(map)
    });
    json!({
        "runtime": "tokenspeed",
        "request_id": r.request_id,
        "input_ids": tokenized.map(|t| t.input_ids.as_slice()).unwrap_or_default(),
        "original_text": tokenized.map(|t| t.original_text.as_str()).unwrap_or_default(),
        "sampling_params": sampling,
        "kv_bootstrap_info": r.kv_bootstrap_info.as_ref().map(|d| json!({
            "bootstrap_host": d.bootstrap_host,
            "bootstrap_port": d.bootstrap_port,
            "bootstrap_room": d.bootstrap_room,
        })),
        "has_mm_inputs": r.mm_inputs.is_some(),
        "has_encode_bootstrap_info": r.encode_bootstrap_info.is_some(),
        "mm_items": r.mm_inputs.as_ref().map(|m| m.items.iter().map(mm_item).collect::<Vec<_>>()),
        "encode_bootstrap_info": r.encode_bootstrap_info.as_ref().map(|e| e.items.iter().map(|i| json!({
            "item_index": i.item_index,
            "bootstrap_host": i.bootstrap_host,
            "bootstrap_port": i.bootstrap_port,
            "bootstrap_room": i.bootstrap_room,
        })).collect::<Vec<_>>()),
        "stream": r.stream,
        "return_logprob": r.return_logprob,
        "logprob_start_len": r.logprob_start_len,
        "top_logprobs_num": r.top_logprobs_num,
        "data_parallel_rank": r.data_parallel_rank,
    })
}

/// The constraint of vLLM's sampling parameters as `{KIND: VALUE}` (`null`: none).
fn vllm_constraint(c: &vl::sampling_params::Constraint) -> Value {
    use vl::sampling_params::Constraint as C;
    match c {
        C::JsonSchema(s) => json!({ "json_schema": s }),
        C::Regex(s) => json!({ "regex": s }),
        C::Grammar(s) => json!({ "grammar": s }),
        C::StructuralTag(s) => json!({ "structural_tag": s }),
        C::JsonObject(b) => json!({ "json_object": b }),
        C::Choice(choice) => json!({ "choice": choice.choices }),
    }
}

/// Every field of vLLM's sampling parameters, as sent: an optional one the request left out
/// is `null`.
fn vllm_sampling(p: &vl::SamplingParams) -> Value {
    json!({
        "temperature": p.temperature.map_or(Value::Null, float),
        "top_p": float(p.top_p),
        "top_k": p.top_k,
        "min_p": float(p.min_p),
        "frequency_penalty": float(p.frequency_penalty),
        "presence_penalty": float(p.presence_penalty),
        "repetition_penalty": float(p.repetition_penalty),
        "max_tokens": p.max_tokens,
        "min_tokens": p.min_tokens,
        "stop": p.stop,
        "stop_token_ids": p.stop_token_ids,
        "skip_special_tokens": p.skip_special_tokens,
        "spaces_between_special_tokens": p.spaces_between_special_tokens,
        "ignore_eos": p.ignore_eos,
        "n": p.n,
        "constraint": p.constraint.as_ref().map(vllm_constraint),
        "logprobs": p.logprobs,
        "prompt_logprobs": p.prompt_logprobs,
        "seed": p.seed,
        "include_stop_str_in_output": p.include_stop_str_in_output,
        "logit_bias": p.logit_bias.iter()
            .map(|(id, b)| (id.to_string(), float(*b)))
            .collect::<Map<_, _>>(),
        "truncate_prompt_tokens": p.truncate_prompt_tokens,
    })
}

/// The fields of a vLLM `GenerateRequest` as sent: `input` names the prompt's form
/// (`"tokenized"`, `"text"` or `null`), `kv_transfer_params_json` is the parsed object (the
/// string itself when it is not JSON; `null` when absent), absent optional fields are `null`.
pub(crate) fn vllm_request(r: &vl::GenerateRequest) -> Value {
    use vl::generate_request::Input;
    let (input, tokenized, text) = match &r.input {
        Some(Input::Tokenized(t)) => ("tokenized", Some(t), None),
        Some(Input::Text(s)) => ("text", None, Some(s)),
        None => ("", None, None),
    };
    let kv = r
        .kv_transfer_params_json
        .as_deref()
        .map(|j| serde_json::from_str::<Value>(j).unwrap_or_else(|_| Value::String(j.to_owned())));
    json!({
        "runtime": "vllm",
        "request_id": r.request_id,
        "input": (!input.is_empty()).then_some(input),
        "input_ids": tokenized.map(|t| t.input_ids.as_slice()).unwrap_or_default(),
        "original_text": tokenized.map(|t| t.original_text.as_str()).unwrap_or_default(),
        "text": text,
        "sampling_params": r.sampling_params.as_ref().map(vllm_sampling),
        "stream": r.stream,
        "kv_transfer_params_json": kv,
        "data_parallel_rank": r.data_parallel_rank,
    })
}

/// A tensor's shape, dtype and inline payload size (`null`: no payload).
fn tensor(t: &ts::TensorData) -> Value {
    json!({
        "shape": t.shape,
        "dtype": t.dtype,
        "payload_bytes": t.payload.as_ref().map(|p| match p {
            ts::tensor_data::Payload::Inline(b) => b.len(),
        }),
    })
}

/// What `/mock/stats` shows of one multimodal item of a `Generate` request.
fn mm_item(it: &ts::MultimodalItem) -> Value {
    let grid = it
        .model_specific_tensors
        .get("image_grid_thw")
        .and_then(|t| t.payload.as_ref())
        .map(|ts::tensor_data::Payload::Inline(b)| {
            b.chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap_or_default()))
                .collect::<Vec<_>>()
        });
    json!({
        "modality": it.modality,
        "content_hash": super::encoder::hex(&it.content_hash),
        "encoder_input": it.encoder_input.as_ref().map(tensor),
        "image_grid_thw": grid,
        "model_specific_tensors": it.model_specific_tensors.iter()
            .map(|(k, t)| (k.clone(), tensor(t)))
            .collect::<Map<_, _>>(),
        "placeholders": it.placeholders.iter().map(|p| json!([p.offset, p.length])).collect::<Vec<_>>(),
        "placeholder_token_id": it.placeholder_token_id,
    })
}

fn value_to_json(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StructValue(s)) => struct_to_json(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_to_json).collect()),
    }
}

/// A `Struct` as a JSON object.
pub(crate) fn struct_to_json(s: &prost_types::Struct) -> Value {
    Value::Object(
        s.fields
            .iter()
            .map(|(k, v)| (k.clone(), value_to_json(v)))
            .collect(),
    )
}

fn json_to_value(v: &Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.iter().map(json_to_value).collect(),
        }),
        Value::Object(map) => Kind::StructValue(object_to_struct(map)),
    };
    prost_types::Value { kind: Some(kind) }
}

/// A JSON object as a `Struct`.
pub(crate) fn object_to_struct(map: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: map
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use pdrouter_proto::scheduler::{DisaggregatedParams, TokenizedInput};

    use super::*;

    #[test]
    fn structs_round_trip_through_json() {
        let v = json!({"dp_size": 4.0, "name": "m", "ok": true, "none": null,
                       "list": [1.0, "a"], "nested": {"x": 0.5}});
        let s = object_to_struct(v.as_object().unwrap());
        assert_eq!(struct_to_json(&s), v);
    }

    #[test]
    fn generate_request_view_shows_what_was_sent() {
        let r = GenerateRequest {
            request_id: "r1".to_owned(),
            tokenized: Some(TokenizedInput {
                original_text: "hi".to_owned(),
                input_ids: vec![104, 105],
            }),
            sampling_params: Some(SamplingParams {
                temperature: 0.7,
                top_k: -1,
                max_new_tokens: Some(5),
                constraint: Some(Constraint::Regex("a+".to_owned())),
                ..Default::default()
            }),
            disaggregated_params: Some(DisaggregatedParams {
                bootstrap_host: "h".to_owned(),
                bootstrap_port: 9,
                bootstrap_room: 3,
            }),
            stream: true,
            ..Default::default()
        };
        let v = generate_request(&r);
        assert_eq!(v["request_id"], "r1");
        assert_eq!(v["input_ids"], json!([104, 105]));
        assert_eq!(v["original_text"], "hi");
        assert_eq!(v["sampling_params"]["temperature"], json!(0.7));
        assert_eq!(v["sampling_params"]["top_k"], -1);
        assert_eq!(v["sampling_params"]["max_new_tokens"], 5);
        assert_eq!(v["sampling_params"]["regex"], "a+");
        assert_eq!(v["disaggregated_params"]["bootstrap_room"], 3);
        assert_eq!(v["stream"], true);
        let bare = generate_request(&GenerateRequest::default());
        assert_eq!(bare["sampling_params"], Value::Null);
        assert_eq!(bare["disaggregated_params"], Value::Null);
        assert_eq!(bare["input_ids"], json!([]));
    }

    #[test]
    fn vllm_request_view_shows_absent_optionals_as_null() {
        let r = vl::GenerateRequest {
            request_id: "v1".to_owned(),
            input: Some(vl::generate_request::Input::Tokenized(vl::TokenizedInput {
                original_text: "hi".to_owned(),
                input_ids: vec![104, 105],
            })),
            sampling_params: Some(vl::SamplingParams {
                max_tokens: Some(1),
                logprobs: Some(2),
                constraint: Some(vl::sampling_params::Constraint::Choice(
                    vl::ChoiceConstraint {
                        choices: vec!["a".to_owned()],
                    },
                )),
                ..Default::default()
            }),
            kv_transfer_params_json: Some(r#"{"do_remote_decode":true}"#.to_owned()),
            data_parallel_rank: Some(1),
            ..Default::default()
        };
        let v = vllm_request(&r);
        assert_eq!(
            (v["runtime"].as_str(), v["input"].as_str()),
            (Some("vllm"), Some("tokenized"))
        );
        assert_eq!(v["input_ids"], json!([104, 105]));
        assert_eq!(v["text"], Value::Null);
        let sp = &v["sampling_params"];
        assert_eq!(
            (sp["max_tokens"].as_u64(), sp["logprobs"].as_i64()),
            (Some(1), Some(2))
        );
        assert_eq!(
            (&sp["temperature"], &sp["seed"]),
            (&Value::Null, &Value::Null)
        );
        assert_eq!(sp["constraint"], json!({"choice": ["a"]}));
        assert_eq!(
            v["kv_transfer_params_json"],
            json!({"do_remote_decode": true})
        );
        assert_eq!(v["data_parallel_rank"], 1);
        let text = vl::GenerateRequest {
            input: Some(vl::generate_request::Input::Text("t".to_owned())),
            kv_transfer_params_json: Some("{bad".to_owned()),
            ..Default::default()
        };
        let v = vllm_request(&text);
        assert_eq!(
            (v["input"].as_str(), v["text"].as_str()),
            (Some("text"), Some("t"))
        );
        assert_eq!(v["kv_transfer_params_json"], "{bad", "kept as sent");
        assert_eq!(
            (&v["sampling_params"], &v["data_parallel_rank"]),
            (&Value::Null, &Value::Null)
        );
        assert_eq!(
            vllm_request(&vl::GenerateRequest::default())["input"],
            Value::Null
        );
    }
}
