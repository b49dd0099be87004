//! Block formats whose arguments are tagged plain-text values, typed by the parameter schema.
//!
//! - `qwen_xml` (Qwen3-Coder): `<tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n
//!   </parameter>\n…</function>\n</tool_call>`. One newline on each side of a value is layout.
//!   Values of parameters the schema does not type stay strings.
//! - `glm45_moe` (GLM-4.5/4.6): `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V
//!   </arg_value>\n…</tool_call>`: the name is the first line.
//! - `glm47_moe` (GLM-4.7): the same tags without the newlines,
//!   `<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>`: the name ends
//!   at the first whitespace or tag.
//! - `minimax_m2`: `<minimax:tool_call>\n<invoke name="NAME">\n<parameter name="K">V
//!   </parameter>\n</invoke>\n…</minimax:tool_call>`, several invokes a block.
//! - `step3`: inside `<｜tool_calls_begin｜>…<｜tool_calls_end｜>`, blocks
//!   `<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name="NAME"><steptml:parameter
//!   name="K">V</steptml:parameter>…</steptml:invoke><｜tool_call_end｜>`.
//!
//! GLM, MiniMax and Step3 values the schema does not type are JSON when they read as a JSON
//! literal, else strings (their templates write non-string values as JSON).

use super::ToolSet;
use super::calls::{ArgsBuilder, Undeclared, typed_value};
use super::tagged::Markup;

pub(crate) const QWEN_XML: Markup = Markup {
    section: None,
    begin: "<tool_call>",
    end: "</tool_call>",
    body: qwen_xml,
};

pub(crate) const GLM45: Markup = Markup {
    section: None,
    begin: "<tool_call>",
    end: "</tool_call>",
    body: glm45,
};

pub(crate) const GLM47: Markup = Markup {
    section: None,
    begin: "<tool_call>",
    end: "</tool_call>",
    body: glm47,
};

pub(crate) const MINIMAX_M2: Markup = Markup {
    section: None,
    begin: "<minimax:tool_call>",
    end: "</minimax:tool_call>",
    body: minimax_m2,
};

const STEP3_CALLS_BEGIN: &str = "<｜tool_calls_begin｜>";
const STEP3_CALLS_END: &str = "<｜tool_calls_end｜>";
const STEP3_CALL_BEGIN: &str = "<｜tool_call_begin｜>";
const STEP3_CALL_END: &str = "<｜tool_call_end｜>";
const STEP3_SEP: &str = "<｜tool_sep｜>";

/// The Step3 special tokens.
pub(crate) const STEP3_TOKENS: &[&str] = &[
    STEP3_CALLS_BEGIN,
    STEP3_CALLS_END,
    STEP3_CALL_BEGIN,
    STEP3_CALL_END,
    STEP3_SEP,
];

pub(crate) const STEP3: Markup = Markup {
    section: Some((STEP3_CALLS_BEGIN, STEP3_CALLS_END)),
    begin: STEP3_CALL_BEGIN,
    end: STEP3_CALL_END,
    body: step3,
};

type Calls = Option<Vec<(String, String)>>;

/// Builds the arguments of `name` from `(key, raw value)` pairs.
fn build<'a>(
    name: &str,
    pairs: impl IntoIterator<Item = (&'a str, &'a str)>,
    tools: &ToolSet,
    undeclared: Undeclared,
) -> Calls {
    if name.is_empty() || !tools.contains(name) {
        return None;
    }
    let mut args = ArgsBuilder::default();
    for (key, value) in pairs {
        let key = key.trim();
        args.insert(
            key,
            typed_value(value, tools.param_type(name, key), undeclared),
        );
    }
    Some(vec![(name.to_string(), args.finish())])
}

fn qwen_xml(body: &str, tools: &ToolSet) -> Calls {
    let rest = body.trim().strip_prefix("<function=")?;
    let (name, rest) = rest.split_once('>')?;
    let params = rest.trim_end().strip_suffix("</function>")?;
    let mut pairs = Vec::new();
    let mut rest = params.trim_start();
    while !rest.is_empty() {
        let p = rest.strip_prefix("<parameter=")?;
        let (key, p) = p.split_once('>')?;
        let close = parameter_close(p)?;
        let value = &p[..close];
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        pairs.push((key, value));
        rest = p[close + "</parameter>".len()..].trim_start();
    }
    build(name.trim(), pairs, tools, Undeclared::Text)
}

/// The `</parameter>` that closes a value: the first one followed (past whitespace) by the
/// next parameter or the end, so a value may itself contain the closing tag's text.
fn parameter_close(p: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(rel) = p[from..].find("</parameter>") {
        let at = from + rel;
        let after = p[at + "</parameter>".len()..].trim_start();
        if after.is_empty() || after.starts_with("<parameter=") {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

fn glm45(body: &str, tools: &ToolSet) -> Calls {
    let end = [body.find('\n'), body.find("<arg_key>")]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(body.len());
    glm_pairs(body[..end].trim(), &body[end..], tools)
}

fn glm47(body: &str, tools: &ToolSet) -> Calls {
    let s = body.trim_start();
    let end = s
        .find(|c: char| c.is_whitespace() || c == '<')
        .unwrap_or(s.len());
    glm_pairs(&s[..end], &s[end..], tools)
}

fn glm_pairs(name: &str, mut rest: &str, tools: &ToolSet) -> Calls {
    let mut pairs = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest.strip_prefix("<arg_key>")?.split_once("</arg_key>")?;
        let after = after.trim_start().strip_prefix("<arg_value>")?;
        let (value, after) = after.split_once("</arg_value>")?;
        pairs.push((key, value));
        rest = after;
    }
    build(name, pairs, tools, Undeclared::Infer)
}

/// A run of `<TAG name="N">INNER</TAG>` elements separated by whitespace, as `(N, INNER)`.
fn named_elements<'a>(mut s: &'a str, open: &str, close: &str) -> Option<Vec<(&'a str, &'a str)>> {
    let mut out = Vec::new();
    loop {
        s = s.trim_start();
        if s.is_empty() {
            return Some(out);
        }
        let attrs = s.strip_prefix(open)?;
        if !attrs.starts_with(char::is_whitespace) {
            return None;
        }
        let attrs = attrs.trim_start().strip_prefix("name")?.trim_start();
        let attrs = attrs.strip_prefix('=')?.trim_start().strip_prefix('"')?;
        let (name, after) = attrs.split_once('"')?;
        let (inner, after) = after.trim_start().strip_prefix('>')?.split_once(close)?;
        out.push((name, inner));
        s = after;
    }
}

fn minimax_m2(body: &str, tools: &ToolSet) -> Calls {
    let invokes = named_elements(body, "<invoke", "</invoke>")?;
    let mut calls = Vec::new();
    for (name, inner) in invokes {
        let params = named_elements(inner, "<parameter", "</parameter>")?;
        calls.extend(build(name.trim(), params, tools, Undeclared::Infer)?);
    }
    Some(calls)
}

fn step3(body: &str, tools: &ToolSet) -> Calls {
    let (kind, rest) = body.split_once(STEP3_SEP)?;
    if kind.trim() != "function" {
        return None;
    }
    let invokes = named_elements(rest, "<steptml:invoke", "</steptml:invoke>")?;
    let [(name, inner)] = invokes.as_slice() else {
        return None;
    };
    let params = named_elements(inner, "<steptml:parameter", "</steptml:parameter>")?;
    build(name.trim(), params, tools, Undeclared::Infer)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_elements_need_exact_markup() {
        let s = r#" <invoke name="a"><p/></invoke>
            <invoke  name = "b" >x</invoke> "#;
        assert_eq!(
            named_elements(s, "<invoke", "</invoke>"),
            Some(vec![("a", "<p/>"), ("b", "x")])
        );
        assert_eq!(named_elements("junk", "<invoke", "</invoke>"), None);
        assert_eq!(
            named_elements(r#"<invokes name="a"></invoke>"#, "<invoke", "</invoke>"),
            None
        );
    }

    #[test]
    fn qwen_xml_values_may_hold_closing_tags() {
        let p = "\nsee </parameter> here\n</parameter>\n<parameter=b>";
        assert_eq!(parameter_close(p), p.rfind("</parameter>"));
    }
}
