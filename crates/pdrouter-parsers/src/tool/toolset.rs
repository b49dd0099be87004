//! The functions a request offers: their names, and where given, their parameter schemas.

use serde_json::Value;

/// The functions in a request's `tools`. A call is only a call when it names one of them;
/// anything else the model wrote stays text. Parameter schemas, where given, type the values
/// of formats that write arguments as plain text (`qwen_xml`, `glm45_moe`, `minimax_m2`, …).
#[derive(Debug, Clone, Default)]
pub struct ToolSet {
    functions: Vec<Function>,
}

#[derive(Debug, Clone)]
struct Function {
    name: String,
    parameters: Option<Value>,
}

impl ToolSet {
    /// Functions known by name only.
    pub fn new<I, S>(names: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::with_schemas(names.into_iter().map(|n| (n, None)))
    }

    /// Functions with their parameter JSON schemas (`{"type": "object", "properties": …}`).
    pub fn with_schemas<I, S>(functions: I) -> Self
    where
        I: IntoIterator<Item = (S, Option<Value>)>,
        S: Into<String>,
    {
        let mut set = Self::default();
        for (name, parameters) in functions {
            let name = name.into();
            match set.functions.iter_mut().find(|f| f.name == name) {
                Some(f) => f.parameters = parameters,
                None => set.functions.push(Function { name, parameters }),
            }
        }
        set
    }

    /// Keeps only the functions `keep` accepts by name.
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.functions.retain(|f| keep(&f.name));
    }

    /// From an OpenAI `tools` array: `[{"type": "function", "function": {"name": …,
    /// "parameters": {…}}}]`. Entries that are not functions, or have no name, are skipped.
    pub fn from_openai_tools(tools: &Value) -> Self {
        let entries = tools.as_array().map(Vec::as_slice).unwrap_or_default();
        Self::with_schemas(entries.iter().filter_map(|t| {
            let f = t.get("function")?;
            let name = f.get("name")?.as_str()?;
            Some((name.to_string(), f.get("parameters").cloned()))
        }))
    }

    /// Does the request offer a function of this name?
    pub fn contains(&self, name: &str) -> bool {
        self.functions.iter().any(|f| f.name == name)
    }

    /// The function names, in the order given.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.functions.iter().map(|f| f.name.as_str())
    }

    /// How many functions.
    pub fn len(&self) -> usize {
        self.functions.len()
    }

    /// No functions at all.
    pub fn is_empty(&self) -> bool {
        self.functions.is_empty()
    }

    /// The JSON-schema type declared for `param` of `function`: `type` itself, the first
    /// non-`null` entry of a `type` list, or the first typed `anyOf`/`oneOf` branch.
    pub fn param_type(&self, function: &str, param: &str) -> Option<&str> {
        let f = self.functions.iter().find(|f| f.name == function)?;
        let schema = f.parameters.as_ref()?.get("properties")?.get(param)?;
        schema_type(schema)
    }
}

fn schema_type(schema: &Value) -> Option<&str> {
    match schema.get("type") {
        Some(Value::String(t)) => return Some(t),
        Some(Value::Array(ts)) => {
            return ts.iter().filter_map(Value::as_str).find(|t| *t != "null");
        }
        _ => {}
    }
    ["anyOf", "oneOf"]
        .iter()
        .filter_map(|k| schema.get(*k)?.as_array())
        .flatten()
        .find_map(|branch| schema_type(branch).filter(|t| *t != "null"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn openai_tools_and_types() {
        let tools = json!([
            {"type": "function", "function": {"name": "f", "parameters": {
                "type": "object",
                "properties": {
                    "n": {"type": "integer"},
                    "o": {"type": ["null", "object"]},
                    "u": {"anyOf": [{"type": "null"}, {"type": "boolean"}]},
                    "s": {"description": "untyped"}
                }
            }}},
            {"type": "function", "function": {"name": "g"}},
            {"type": "other"}
        ]);
        let set = ToolSet::from_openai_tools(&tools);
        assert_eq!(set.names().collect::<Vec<_>>(), ["f", "g"]);
        assert!(set.contains("g") && !set.contains("h"));
        assert_eq!(set.param_type("f", "n"), Some("integer"));
        assert_eq!(set.param_type("f", "o"), Some("object"));
        assert_eq!(set.param_type("f", "u"), Some("boolean"));
        assert_eq!(set.param_type("f", "s"), None);
        assert_eq!(set.param_type("g", "x"), None);
    }
}
