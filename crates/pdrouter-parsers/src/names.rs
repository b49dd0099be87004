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

/// The kind of the longest of `patterns` found in `model` (lowercased, `_` read as `-`), the
/// first listed on a tie; a pattern mapped to `None` claims the model for no kind.
pub(crate) fn match_model<T: Copy>(model: &str, patterns: &[(&str, Option<T>)]) -> Option<T> {
    let model = model.to_lowercase().replace('_', "-");
    let mut best: Option<&(&str, Option<T>)> = None;
    for entry in patterns.iter().filter(|(p, _)| model.contains(p)) {
        if best.is_none_or(|b| entry.0.len() > b.0.len()) {
            best = Some(entry);
        }
    }
    best.and_then(|(_, kind)| *kind)
}
