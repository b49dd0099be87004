//! Matching parser names and served model names to kinds, shared by both parser families.

/// Parser names compare lowercase, trimmed, with `-` read as `_`.
pub(crate) fn normalize(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('-', "_")
}

/// `kind`'s canonical name: the first of its names in `table`.
pub(crate) fn canonical<T: Copy + PartialEq>(
    table: &[(T, &[&'static str])],
    kind: T,
) -> &'static str {
    table
        .iter()
        .find(|(k, _)| *k == kind)
        .map_or("", |(_, names)| names[0])
}

/// The kind `name` (canonical or alias, see [`normalize`]) names in `table`.
pub(crate) fn lookup<T: Copy>(table: &[(T, &[&'static str])], name: &str) -> Option<T> {
    let name = normalize(name);
    table
        .iter()
        .find(|(_, names)| names.contains(&name.as_str()))
        .map(|(k, _)| *k)
}

/// Longest model name normalized on the stack; longer or non-ASCII names take a `String`.
const INLINE_MODEL: usize = 128;

/// The kind of the longest of `patterns` found in `model` (lowercased, `_` read as `-`), the
/// first listed on a tie; a pattern mapped to `None` claims the model for no kind.
///
/// Runs on every chat request that may parse reasoning or tool calls, so the usual name (short
/// ASCII) is normalized into a stack buffer and the patterns are found by a plain scan: the
/// general substring search sets up a searcher per pattern, which cost more than the scan
/// over a name of a few dozen bytes.
pub(crate) fn match_model<T: Copy>(model: &str, patterns: &[(&str, Option<T>)]) -> Option<T> {
    let mut buf = [0u8; INLINE_MODEL];
    let owned;
    let model: &[u8] = if model.len() <= INLINE_MODEL && model.is_ascii() {
        let out = &mut buf[..model.len()];
        for (d, s) in out.iter_mut().zip(model.bytes()) {
            *d = match s.to_ascii_lowercase() {
                b'_' => b'-',
                c => c,
            };
        }
        out
    } else {
        owned = model.to_lowercase().replace('_', "-");
        owned.as_bytes()
    };
    longest(patterns, |p| contains(model, p.as_bytes()))
}

/// The kind of the longest of `patterns` that is `found`, the first listed on a tie.
fn longest<T: Copy>(patterns: &[(&str, Option<T>)], found: impl Fn(&str) -> bool) -> Option<T> {
    let mut best: Option<&(&str, Option<T>)> = None;
    for entry in patterns.iter().filter(|(p, _)| found(p)) {
        if best.is_none_or(|b| entry.0.len() > b.0.len()) {
            best = Some(entry);
        }
    }
    best.and_then(|(_, kind)| *kind)
}

/// Whether `needle` occurs in `hay` (bytes of UTF-8 text: the same answer as `str::contains`).
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    let Some(last_start) = hay.len().checked_sub(needle.len()) else {
        return false;
    };
    (0..=last_start).any(|i| hay[i] == first && hay[i + 1..i + needle.len()] == *rest)
}

#[cfg(test)]
mod match_tests {
    use proptest::prelude::*;

    use super::{longest, match_model};

    /// The matcher as first written: every name through `to_lowercase` and `str::contains`.
    fn reference(model: &str, patterns: &[(&str, Option<u8>)]) -> Option<u8> {
        let model = model.to_lowercase().replace('_', "-");
        longest(patterns, |p| model.contains(p))
    }

    const PATTERNS: &[(&str, Option<u8>)] = &[
        ("qwen", Some(1)),
        ("qwen3", Some(2)),
        ("qwen3-coder", Some(3)),
        ("deepseek-v3-1", Some(4)),
        ("deepseek-v3.1", Some(4)),
        ("gpt-oss", None),
        ("é", Some(5)),
        ("k2", Some(6)),
        ("", Some(7)),
    ];

    #[test]
    fn names_match_as_they_did() {
        for (model, want) in [
            ("Qwen/Qwen3-8B", Some(2)),
            ("QWEN3_CODER-30B", Some(3)),
            ("deepseek-ai/DeepSeek-V3.1", Some(4)),
            ("openai/gpt-oss-20b", None),
            ("mock-model", Some(7)),
            ("Kimi-K2-Instruct", Some(6)),
            ("ÉTÉ-qwen", Some(1)),
            ("ÉCOLE", Some(5)),
            ("q", Some(7)),
        ] {
            assert_eq!(match_model(model, PATTERNS), want, "{model}");
            assert_eq!(reference(model, PATTERNS), want, "{model}");
        }
        assert_eq!(match_model(&"Qwen3-".repeat(40), PATTERNS), Some(2));
    }

    proptest! {
        #[test]
        fn any_name_matches_as_the_reference(
            model in "[a-zA-Z0-9_./\\-]{0,40}|[qQwWeEnN3_\\-kK2éÉ]{0,12}|.{0,200}",
        ) {
            prop_assert_eq!(match_model(&model, PATTERNS), reference(&model, PATTERNS));
        }
    }
}
