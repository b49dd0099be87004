//! `tool_choice` and `parallel_tool_calls` of a chat request with tools: a forced call
//! (`"required"`, a named function, or `allowed_tools` in mode `required`) becomes an output
//! constraint, the JSON schema of a list
//! of `{"name", "parameters"}` objects naming only the allowed functions, and its answer is
//! read with the bare-JSON tool parser whatever the model family, so the constrained output
//! and its parse always agree; `parallel_tool_calls: false` caps that list (and every parse)
//! at one call. `allowed_tools` in mode `auto` constrains nothing; its calls of functions
//! outside the allowed list are read as text. All of `tools` is rendered in the prompt either
//! way (the point of `allowed_tools`: the prompt, and so its cache, stays the same).
//!
//! We constrain a forced call with a JSON schema for every model family rather than with the
//! family's structural tag: the engine's grammar backends all take JSON schemas, and the
//! parse of a constrained output is then one format, whatever the family writes unforced.
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
    /// Calls of these functions only (`allowed_tools`); at least one when `required`.
    Allowed { names: Vec<String>, required: bool },
}

impl Choice {
    /// Whether the answer must be a call (its output constrained to the calls' JSON).
    pub(crate) fn forced(&self) -> bool {
        match self {
            Choice::Required | Choice::Named(_) => true,
            Choice::Allowed { required, .. } => *required,
            Choice::Auto | Choice::None => false,
        }
    }

    /// Whether function `name` may be called.
    pub(crate) fn allows(&self, name: &str) -> bool {
        match self {
            Choice::Auto | Choice::Required => true,
            Choice::Named(n) => n == name,
            Choice::Allowed { names, .. } => names.iter().any(|n| n == name),
            Choice::None => false,
        }
    }
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
    let field = match o.get("tool_choice") {
        Some(v) if !v.is_null() => "tool_choice",
        _ => "function_call",
    };
    let bad = |what: &str| ApiError::invalid_field(field, what);
    let c = match o.get(field) {
        None | Some(Value::Null) => return Ok(Choice::Auto),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => Choice::Auto,
            "none" => return Ok(Choice::None),
            "required" => Choice::Required,
            other => return Err(bad(&format!("'{other}' is not auto, none or required"))),
        },
        Some(Value::Object(m)) if m.get("type") == Some(&json!("allowed_tools")) => {
            allowed(m.get("allowed_tools"), &offered)?
        }
        Some(Value::Object(m)) if m.get("type").is_some_and(|t| t != "function") => {
            return Err(bad("'type' must be function or allowed_tools"));
        }
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

/// `allowed_tools: {"mode": "auto" | "required", "tools": [{"type": "function", "function":
/// {"name": …}}]}`, every name offered in `tools`.
fn allowed(spec: Option<&Value>, offered: &dyn Fn(&str) -> bool) -> Result<Choice, ApiError> {
    let spec = spec.and_then(Value::as_object).ok_or_else(|| {
        bad("allowed_tools needs an 'allowed_tools' object with 'mode' and 'tools'")
    })?;
    let required = match spec.get("mode").and_then(Value::as_str) {
        Some("auto") => false,
        Some("required") => true,
        _ => return Err(bad("allowed_tools.mode must be auto or required")),
    };
    let list = spec
        .get("tools")
        .and_then(Value::as_array)
        .filter(|l| !l.is_empty())
        .ok_or_else(|| bad("allowed_tools.tools must be a non-empty array"))?;
    let mut names = Vec::with_capacity(list.len());
    for (i, t) in list.iter().enumerate() {
        let name = t
            .pointer("/function/name")
            .or(t.get("name"))
            .and_then(Value::as_str)
            .ok_or_else(|| bad(&format!("allowed_tools.tools[{i}] must name a function")))?;
        if !offered(name) {
            return Err(bad(&format!(
                "allowed_tools.tools[{i}] names '{name}', which is not in 'tools'"
            )));
        }
        names.push(name.to_owned());
    }
    Ok(Choice::Allowed { names, required })
}

/// The JSON schema a forced call's output must follow: a list of one (or, with `parallel`,
/// one or more) calls of the allowed functions.
pub(crate) fn forced_schema(choice: &Choice, tools: &Value, parallel: bool) -> Option<String> {
    if !choice.forced() {
        return None;
    }
    let allowed = |name: &str| choice.allows(name);
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

    #[test]
    fn allowed_tools_restrict_the_calls_and_force_one_when_required() {
        let t = tools();
        let spec = |mode: &str, names: &[&str]| {
            let tools: Vec<Value> = names
                .iter()
                .map(|n| json!({"type": "function", "function": {"name": n}}))
                .collect();
            obj(json!({"tool_choice": {"type": "allowed_tools",
                "allowed_tools": {"mode": mode, "tools": tools}}}))
        };
        let auto = choice(&spec("auto", &["b"]), Some(&t)).unwrap();
        assert!(!auto.forced() && auto.allows("b") && !auto.allows("a"));
        assert!(forced_schema(&auto, &t, true).is_none());
        let req = choice(&spec("required", &["a"]), Some(&t)).unwrap();
        assert!(req.forced());
        let s: Value = serde_json::from_str(&forced_schema(&req, &t, true).unwrap()).unwrap();
        assert_eq!(s["items"]["anyOf"].as_array().unwrap().len(), 1);
        assert_eq!(
            s["items"]["anyOf"][0]["properties"]["name"]["enum"],
            json!(["a"])
        );
        for (bad, says) in [
            (spec("auto", &["zz"]), "not in 'tools'"),
            (spec("sometimes", &["a"]), "mode"),
            (spec("auto", &[]), "non-empty"),
            (
                obj(json!({"tool_choice": {"type": "allowed_tools"}})),
                "allowed_tools",
            ),
        ] {
            let e = format!("{:?}", choice(&bad, Some(&t)).unwrap_err());
            assert!(e.contains(says) && e.contains("tool_choice"), "{e}");
        }
    }
}
