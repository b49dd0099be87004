//! `tool_choice` and `parallel_tool_calls` of a chat request with tools: a forced call
//! (`"required"` or a named function) becomes an output constraint, the JSON schema of a list
//! of `{"name", "parameters"}` objects naming only the allowed functions, and its answer is
//! read with the bare-JSON tool parser whatever the model family, so the constrained output
//! and its parse always agree; `parallel_tool_calls: false` caps that list (and every parse)
//! at one call.
//!
//! Invariants: a forced choice without tools, a named function the request does not offer,
//! or a choice of another shape is a 400 naming `tool_choice`; the constraint is built from
//! the client's own parameter schemas (an absent one allows any object).

use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// What the request's `tool_choice` asks.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Choice {
    /// The model may answer or call (`auto`, the default with tools).
    Auto,
    /// No call is parsed (`none`).
    None,
    /// At least one call, of any offered function (`required`).
    Required,
    /// A call of this function.
    Named(String),
}

fn bad(what: &str) -> ApiError {
    ApiError::invalid_field("tool_choice", what)
}

/// Reads `tool_choice` (or the deprecated `function_call`) against `tools`.
pub(crate) fn choice(o: &Map<String, Value>, tools: Option<&Value>) -> Result<Choice, ApiError> {
    let offered = |name: &str| {
        tools.and_then(Value::as_array).is_some_and(|ts| {
            ts.iter()
                .any(|t| t.pointer("/function/name") == Some(&json!(name)))
        })
    };
    let has_tools = tools
        .and_then(Value::as_array)
        .is_some_and(|t| !t.is_empty());
    let c = match o.get("tool_choice").or(o.get("function_call")) {
        None | Some(Value::Null) => return Ok(Choice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Choice::Auto,
            "none" => return Ok(Choice::None),
            "required" => Choice::Required,
            other => return Err(bad(&format!("'{other}' is not auto, none or required"))),
        },
        Some(Value::Object(m)) => {
            let name = m
                .get("function")
                .and_then(|f| f.get("name"))
                .or(m.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| bad("an object must name a function: {\"type\": \"function\", \"function\": {\"name\": ...}}"))?;
            if !offered(name) {
                return Err(bad(&format!("names '{name}', which is not in 'tools'")));
            }
            Choice::Named(name.to_owned())
        }
        Some(_) => return Err(bad("must be a string or an object")),
    };
    if c != Choice::Auto && !has_tools {
        return Err(bad("forces a call but the request has no 'tools'"));
    }
    Ok(c)
}

/// The JSON schema a forced call's output must follow: a list of one (or, with `parallel`,
/// one or more) calls of the allowed functions.
pub(crate) fn forced_schema(choice: &Choice, tools: &Value, parallel: bool) -> Option<String> {
    let allowed = |name: &str| match choice {
        Choice::Required => true,
        Choice::Named(n) => n == name,
        Choice::Auto | Choice::None => false,
    };
    let branches: Vec<Value> = tools
        .as_array()?
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let name = f.get("name")?.as_str()?;
            allowed(name).then(|| {
                let params = f
                    .get("parameters")
                    .filter(|p| p.is_object())
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object"}));
                json!({"type": "object",
                    "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
                    "required": ["name", "parameters"]})
            })
        })
        .collect();
    if branches.is_empty() {
        return None;
    }
    let mut schema = json!({"type": "array", "minItems": 1, "items": {"anyOf": branches}});
    if !parallel {
        schema["maxItems"] = json!(1);
    }
    Some(schema.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!(),
        }
    }

    fn tools() -> Value {
        json!([{"type": "function", "function": {"name": "a",
                "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}},
               {"type": "function", "function": {"name": "b"}}])
    }

    #[test]
    fn choices_are_read_and_checked_against_the_tools() {
        let t = tools();
        let c = |v: Value| choice(&obj(v), Some(&t));
        assert_eq!(c(json!({})).unwrap(), Choice::Auto);
        assert_eq!(c(json!({"tool_choice": "none"})).unwrap(), Choice::None);
        assert_eq!(
            c(json!({"tool_choice": "required"})).unwrap(),
            Choice::Required
        );
        let named = json!({"tool_choice": {"type": "function", "function": {"name": "b"}}});
        assert_eq!(c(named).unwrap(), Choice::Named("b".into()));
        assert_eq!(
            c(json!({"function_call": {"name": "a"}})).unwrap(),
            Choice::Named("a".into())
        );
        for bad in [
            json!({"tool_choice": {"type": "function", "function": {"name": "zz"}}}),
            json!({"tool_choice": "always"}),
            json!({"tool_choice": 3}),
            json!({"tool_choice": {"type": "function"}}),
        ] {
            let e = format!("{:?}", c(bad.clone()).unwrap_err());
            assert!(e.contains("tool_choice"), "{bad}: {e}");
        }
        let e = choice(&obj(json!({"tool_choice": "required"})), None).unwrap_err();
        assert!(format!("{e:?}").contains("no 'tools'"));
    }

    #[test]
    fn a_forced_call_is_a_list_of_the_allowed_functions() {
        let t = tools();
        let s: Value =
            serde_json::from_str(&forced_schema(&Choice::Required, &t, true).unwrap()).unwrap();
        assert_eq!(s["type"], "array");
        assert_eq!(s["items"]["anyOf"].as_array().unwrap().len(), 2);
        assert!(s.get("maxItems").is_none());
        let one = Choice::Named("a".into());
        let s: Value = serde_json::from_str(&forced_schema(&one, &t, false).unwrap()).unwrap();
        let branch = &s["items"]["anyOf"][0];
        assert_eq!(branch["properties"]["name"]["enum"], json!(["a"]));
        assert_eq!(
            branch["properties"]["parameters"]["properties"]["x"]["type"],
            "integer"
        );
        assert_eq!(s["maxItems"], 1);
        assert!(forced_schema(&Choice::Auto, &t, true).is_none());
    }
}
