//! Matching parser names and served model names to kinds, shared by both parser families.

/// Parser names compare lowercase, trimmed, with `-` read as `_`.
pub(crate) fn normalize(name: &str) -> String {
    name.trim().to_ascii_lowercase().replace('-', "_")
}

/// The kind of the longest of `patterns` found in `model` (lowercased, `_` read as `-`);
/// a pattern mapped to `None` claims the model for no kind.
pub(crate) fn match_model<T: Copy>(model: &str, patterns: &[(&str, Option<T>)]) -> Option<T> {
    let model = model.to_lowercase().replace('_', "-");
    patterns
        .iter()
        .filter(|(p, _)| model.contains(p))
        .max_by_key(|(p, _)| p.len())
        .and_then(|(_, kind)| *kind)
}
