//! What a gRPC engine says about itself (`GetModelInfo`, `GetServerInfo`), shown in the JSON
//! shapes SGLang's HTTP server gives `/get_model_info` and `/get_server_info`, so clients and
//! dashboards reading those routes work the same whichever protocol the workers speak.
//!
//! Invariants: every field the engine sent appears in the JSON; fields that carry JSON text
//! are parsed (kept as text when they are not valid JSON) and empty text is `null`; a server
//! info's launch arguments are at the top level, as SGLang's HTTP server puts them, and the
//! reply's own fields win over a launch argument of the same name.

use std::time::Duration;

use pdrouter_proto::prost_types::{self, value::Kind};
use pdrouter_proto::scheduler::{GetModelInfoResponse, GetServerInfoResponse};
use serde_json::{Map, Value, json};
use tonic::Status;

use crate::grpc::client::WorkerChannel;

/// Which description to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Info {
    Model,
    Server,
}

/// Asks the worker for `what` within `timeout` and renders it.
/// Either runtime's answer is shown in SGLang's shape.
pub async fn fetch(ch: &WorkerChannel, what: Info, timeout: Duration) -> Result<Value, Status> {
    match what {
        Info::Model => Ok(model_info_json(&ch.fetch_model_info(timeout).await?)),
        Info::Server => Ok(server_info_json(&ch.fetch_server_info(timeout).await?)),
    }
}

/// `GetModelInfo` as `/get_model_info` JSON.
pub fn model_info_json(r: &GetModelInfoResponse) -> Value {
    json!({
        "model_path": r.model_path,
        "tokenizer_path": r.tokenizer_path,
        "is_generation": r.is_generation,
        "preferred_sampling_params": json_text(&r.preferred_sampling_params),
        "weight_version": r.weight_version,
        "served_model_name": r.served_model_name,
        "max_context_length": r.max_context_length,
        "vocab_size": r.vocab_size,
        "supports_vision": r.supports_vision,
        "model_type": r.model_type,
        "eos_token_ids": r.eos_token_ids,
        "pad_token_id": r.pad_token_id,
        "bos_token_id": r.bos_token_id,
        "max_req_input_len": r.max_req_input_len,
        "architectures": r.architectures,
        "id2label": json_text(&r.id2label_json),
        "num_labels": r.num_labels,
        "default_sampling_params": json_text(&r.default_sampling_params_json),
    })
}

/// `GetServerInfo` as `/get_server_info` JSON.
pub fn server_info_json(r: &GetServerInfoResponse) -> Value {
    let mut out = r.server_args.as_ref().map(struct_json).unwrap_or_default();
    let own = json!({
        "scheduler_info": r.scheduler_info.as_ref().map(struct_json),
        "active_requests": r.active_requests,
        "is_paused": r.is_paused,
        "last_receive_timestamp": r.last_receive_timestamp,
        "uptime_seconds": r.uptime_seconds,
        "version": r.sglang_version,
        "server_type": r.server_type,
        "start_time": r.start_time.as_ref().map(|t| t.to_string()),
        "max_total_num_tokens": r.max_total_num_tokens,
    });
    if let Value::Object(own) = own {
        out.extend(own);
    }
    Value::Object(out)
}

fn json_text(s: &str) -> Value {
    if s.is_empty() {
        return Value::Null;
    }
    serde_json::from_str(s).unwrap_or_else(|_| Value::String(s.to_owned()))
}

fn struct_json(s: &prost_types::Struct) -> Map<String, Value> {
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value_json(v)))
        .collect()
}

/// The largest integer an `f64` holds exactly.
const EXACT_INT: f64 = 9_007_199_254_740_992.0;

fn value_json(v: &prost_types::Value) -> Value {
    match &v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(*b),
        Some(Kind::StringValue(s)) => Value::String(s.clone()),
        // Struct numbers are doubles; counts such as dp_size read better as integers.
        Some(Kind::NumberValue(n)) if n.fract() == 0.0 && n.abs() <= EXACT_INT => {
            Value::from(*n as i64)
        }
        Some(Kind::NumberValue(n)) => {
            serde_json::Number::from_f64(*n).map_or(Value::Null, Value::Number)
        }
        Some(Kind::StructValue(s)) => Value::Object(struct_json(s)),
        Some(Kind::ListValue(l)) => Value::Array(l.values.iter().map(value_json).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn val(kind: Kind) -> prost_types::Value {
        prost_types::Value { kind: Some(kind) }
    }

    #[test]
    fn server_args_are_flattened_and_numbers_keep_their_kind() {
        let args = prost_types::Struct {
            fields: [
                ("dp_size".to_owned(), val(Kind::NumberValue(2.0))),
                ("mem_fraction".to_owned(), val(Kind::NumberValue(0.5))),
                ("version".to_owned(), val(Kind::StringValue("arg".into()))),
                (
                    "list".to_owned(),
                    val(Kind::ListValue(prost_types::ListValue {
                        values: vec![val(Kind::BoolValue(true)), val(Kind::NullValue(0))],
                    })),
                ),
                ("nan".to_owned(), val(Kind::NumberValue(f64::NAN))),
            ]
            .into_iter()
            .collect(),
        };
        let v = server_info_json(&GetServerInfoResponse {
            server_args: Some(args),
            sglang_version: "0.5".into(),
            active_requests: 3,
            ..Default::default()
        });
        assert_eq!(v["dp_size"], json!(2));
        assert_eq!(v["mem_fraction"], json!(0.5));
        assert_eq!(v["list"], json!([true, null]));
        assert_eq!(v["nan"], Value::Null);
        assert_eq!(v["version"], json!("0.5"), "the reply's own field wins");
        assert_eq!(v["active_requests"], json!(3));
        assert_eq!(v["scheduler_info"], Value::Null);
    }

    #[test]
    fn json_text_fields_are_parsed_or_kept() {
        let v = model_info_json(&GetModelInfoResponse {
            model_path: "m".into(),
            preferred_sampling_params: r#"{"temperature":0.2}"#.into(),
            id2label_json: "not json".into(),
            ..Default::default()
        });
        assert_eq!(v["model_path"], json!("m"));
        assert_eq!(v["preferred_sampling_params"], json!({"temperature": 0.2}));
        assert_eq!(v["id2label"], json!("not json"));
        assert_eq!(v["default_sampling_params"], Value::Null);
    }
}
