//! Request validation: accepted shapes, the routing facts, and the errors naming the field.

use super::*;

fn err(endpoint: Endpoint, body: &str) -> String {
    parse(endpoint, Bytes::copy_from_slice(body.as_bytes()))
        .unwrap_err()
        .message
}

fn ok(endpoint: Endpoint, body: &[u8]) -> ParsedRequest {
    parse(endpoint, Bytes::copy_from_slice(body)).unwrap()
}

fn json(b: &Bytes) -> Value {
    serde_json::from_slice(b).unwrap()
}

#[test]
fn fan_out_is_bounded_on_every_route_before_anything_is_built() {
    let prompts = |k: usize| vec!["\"\""; k].join(",");
    let ids = vec!["[1]"; 300].join(",");
    let cases = [
        (
            Endpoint::Generate,
            format!(
                r#"{{"text":[{}],"sampling_params":{{"n":500}}}}"#,
                prompts(2000)
            ),
            ["'text'", "at most 256 prompts"],
        ),
        (
            Endpoint::Generate,
            format!(
                r#"{{"text":[{}],"sampling_params":{{"n":5}}}}"#,
                prompts(256)
            ),
            ["'sampling_params.n'", "at most 1024"],
        ),
        (
            Endpoint::Generate,
            r#"{"input_ids":[[1],[2],[3]],"sampling_params":{"n":400}}"#.to_string(),
            ["'sampling_params.n'", "3 prompts × 400 samples"],
        ),
        (
            Endpoint::Generate,
            format!(r#"{{"input_ids":[{ids}]}}"#),
            ["'input_ids'", "lists 300 prompts"],
        ),
        (
            Endpoint::Completions,
            format!(r#"{{"prompt":[{}],"n":8}}"#, prompts(200)),
            ["'n'", "200 prompts × 8 samples"],
        ),
    ];
    for (endpoint, body, wanted) in cases {
        let e = err(endpoint, &body);
        assert!(wanted.iter().all(|w| e.contains(w)), "{e}");
    }
    // At the bound it is served.
    let r = ok(
        Endpoint::Completions,
        format!(r#"{{"prompt":[{}],"n":4}}"#, prompts(256)).as_bytes(),
    );
    assert_eq!(r.sub_requests(), 1024);
    let r = ok(
        Endpoint::ChatCompletions,
        br#"{"messages":[{"role":"user","content":"x"}],"n":1024}"#,
    );
    assert_eq!(r.sub_requests(), 1024);
}

#[test]
fn the_tree_is_kept_when_asked() {
    let raw = Bytes::from_static(br#"{"text":"hi","sampling_params":{"temperature":0}}"#);
    let kept = parse_keeping_tree(Endpoint::Generate, raw.clone()).unwrap();
    assert_eq!(
        Some(&Value::Object(kept.tree().unwrap().clone())),
        Some(&json(&raw))
    );
    assert!(parse(Endpoint::Generate, raw).unwrap().tree().is_none());
}

#[test]
fn fields_are_spliced_without_a_tree_and_replaced_with_one() {
    let r = ok(Endpoint::Generate, br#"  {"text":"hi"} "#);
    assert!(r.object.is_none());
    // A named model is never replaced, so it does not need the tree either.
    assert!(
        ok(Endpoint::Generate, br#"{"text":"hi","model":"m"}"#)
            .object
            .is_none()
    );
    let b = r.body_with(&[
        ("bootstrap_room", Value::from(7)),
        ("bootstrap_port", Value::Null),
    ]);
    assert_eq!(
        json(&b),
        serde_json::json!({"text":"hi","bootstrap_room":7,"bootstrap_port":null})
    );
    assert_eq!(r.body_with(&[]), r.raw);
    // The client already sent a field the router sets: replaced, never doubled.
    let r = ok(Endpoint::Generate, br#"{"text":"hi","bootstrap_room":1}"#);
    assert!(r.object.is_some());
    let b = r.body_with(&[("bootstrap_room", Value::from(9))]);
    assert_eq!(
        json(&b),
        serde_json::json!({"text":"hi","bootstrap_room":9})
    );
    assert_eq!(
        String::from_utf8_lossy(&b)
            .matches("bootstrap_room")
            .count(),
        1
    );
}

#[test]
fn a_filled_in_model_is_added_once() {
    let r = ok(Endpoint::Completions, br#"{"prompt":"x","model":null}"#);
    assert!(r.model.is_none());
    let b = r.body_with(&[("model", Value::from("m"))]);
    assert_eq!(json(&b)["model"], "m");
    assert_eq!(String::from_utf8_lossy(&b).matches("model").count(), 1);
    let named = ok(Endpoint::Completions, br#"{"prompt":"x","model":"a"}"#);
    assert_eq!(named.model.as_deref(), Some("a"));
    assert!(
        ok(Endpoint::Completions, br#"{"prompt":"x","model":""}"#)
            .model
            .is_none()
    );
}

#[test]
fn malformed_and_wrong_shapes_name_the_problem() {
    assert!(err(Endpoint::ChatCompletions, "{").contains("not valid JSON"));
    assert!(err(Endpoint::ChatCompletions, "[1]").contains("JSON object"));
    assert!(err(Endpoint::ChatCompletions, r#"{"messages":"hi"}"#).contains("'messages'"));
    assert!(err(Endpoint::ChatCompletions, r#"{"messages":[1]}"#).contains("messages[0]"));
    assert!(
        err(
            Endpoint::ChatCompletions,
            r#"{"messages":[{"role":"user","content":"x"}],"stream":"yes"}"#
        )
        .contains("'stream'")
    );
    assert!(
        err(
            Endpoint::ChatCompletions,
            r#"{"messages":[{"role":"user","content":"x"}],"n":0}"#
        )
        .contains("'n'")
    );
    assert!(err(Endpoint::Completions, r#"{"model":"m"}"#).contains("'prompt'"));
    assert!(err(Endpoint::Generate, r#"{"text":5}"#).contains("'text'"));
    assert!(err(Endpoint::Generate, r#"{}"#).contains("'text'"));
    assert!(err(Endpoint::Responses, r#"{"input":3}"#).contains("'input'"));
}

#[test]
fn batches_and_samples() {
    let r = ok(Endpoint::Generate, br#"{"text":["a","b","c"]}"#);
    assert_eq!(
        (r.batch, r.sub_requests(), r.is_batched()),
        (Some(3), 3, true)
    );
    let r = ok(Endpoint::Generate, br#"{"input_ids":[1,2,3]}"#);
    assert_eq!((r.batch, r.is_batched()), (None, false));
    let r = ok(
        Endpoint::Generate,
        br#"{"input_ids":[[1],[2]],"sampling_params":{"n":2}}"#,
    );
    assert_eq!(r.sub_requests(), 4);
    let r = ok(Endpoint::Completions, br#"{"prompt":[1,2,3]}"#);
    assert_eq!(r.batch, None);
    let r = ok(Endpoint::Completions, br#"{"prompt":["x","y"],"n":3}"#);
    assert_eq!(r.sub_requests(), 6);
    let r = ok(
        Endpoint::ChatCompletions,
        br#"{"messages":[{"role":"user","content":"hello"}],"n":2,"stream":true}"#,
    );
    assert_eq!((r.n, r.stream, &*r.text), (2, true, "hello"));
}

#[test]
fn prompt_tokens_are_estimated_from_text_and_counted_from_ids() {
    // 17 bytes of text ("user" + 13): 5 tokens.
    let chat = ok(
        Endpoint::ChatCompletions,
        br#"{"messages":[{"role":"user","content":"hello, world!"}]}"#,
    );
    assert_eq!(chat.prompt_tokens, 5);
    // Token ids are exact, times the samples.
    let ids = ok(
        Endpoint::Generate,
        br#"{"input_ids":[1,2,3,4,5,6,7],"sampling_params":{"n":2}}"#,
    );
    assert_eq!(ids.prompt_tokens, 14);
    // A batch sums its prompts: 8 bytes (2) + 3 ids.
    let batch = ok(Endpoint::Completions, br#"{"prompt":["abcdefgh",[1,2,3]]}"#);
    assert_eq!(batch.prompt_tokens, 5);
    // Never zero.
    let empty = ok(Endpoint::Generate, br#"{"text":""}"#);
    assert_eq!(empty.prompt_tokens, 1);
    let input = ok(Endpoint::Responses, br#"{"input":"abcde"}"#);
    assert_eq!(input.prompt_tokens, 2);
}

#[test]
fn the_field_list_answers_as_the_map_did() {
    // A repeated key counts with its last value, as the map keeps it.
    let r = ok(
        Endpoint::Generate,
        br#"{"text":"first","stream":true,"text":"last"}"#,
    );
    assert_eq!(&*r.text, "last");
    assert!(r.stream);
    assert_eq!(
        err(
            Endpoint::Generate,
            r#"{"text":"ok","stream":false,"stream":"yes"}"#
        ),
        err(Endpoint::Generate, r#"{"text":"ok","stream":"yes"}"#)
    );
    // An escaped key names the same field.
    let r = ok(Endpoint::Generate, br#"{"te\u0078t":"escaped"}"#);
    assert_eq!(&*r.text, "escaped");
    // A router field, repeated: the tree is kept and the field replaced once.
    let r = ok(
        Endpoint::Generate,
        br#"{"bootstrap_room":1,"text":"hi","bootstrap_room":2}"#,
    );
    let tree = r.tree().map(|t| Value::Object(t.clone()));
    assert_eq!(
        tree,
        Some(serde_json::json!({"bootstrap_room":2,"text":"hi"}))
    );
    let b = r.body_with(&[("bootstrap_room", Value::from(9))]);
    assert_eq!(
        json(&b),
        serde_json::json!({"bootstrap_room":9,"text":"hi"})
    );
    // A wide object takes the map's way, with the same answers.
    let mut wide = serde_json::Map::new();
    for i in 0..40 {
        wide.insert(format!("extra_{i}"), Value::from(i));
    }
    wide.insert("text".into(), Value::from("wide"));
    wide.insert("sampling_params".into(), serde_json::json!({"n": 2}));
    let raw = serde_json::to_vec(&wide).unwrap();
    let r = ok(Endpoint::Generate, &raw);
    assert_eq!((&*r.text, r.n, r.tree().is_none()), ("wide", 2, true));
    wide.insert("sampling_params".into(), serde_json::json!({"n": 0}));
    let raw = serde_json::to_vec(&wide).unwrap();
    let wide_err = parse(Endpoint::Generate, Bytes::from(raw))
        .unwrap_err()
        .message;
    assert_eq!(
        wide_err,
        err(
            Endpoint::Generate,
            r#"{"text":"x","sampling_params":{"n":0}}"#
        )
    );
    // Not an object, or not JSON: the same answers as before.
    for body in ["[1]", "\"s\"", "3", "null"] {
        assert!(
            err(Endpoint::Generate, body).contains("JSON object"),
            "{body}"
        );
    }
    for body in ["{", "{\"text\":}", "[1] x", "{\"text\":\"a\"} x"] {
        assert!(
            !err(Endpoint::Generate, body).contains("must be a JSON object"),
            "{body}"
        );
    }
}
