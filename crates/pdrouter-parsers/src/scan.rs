//! Marker search over a streaming buffer, and the loop that feeds a buffer to a state machine.
//!
//! Every parser here is a state machine over the text not yet consumed. A step looks only at
//! the start of that text and either consumes some of it (emitting what it decided) or asks
//! for more. Its decisions depend on the bytes present and on whether the output has ended,
//! never on where the pieces were cut, so any chunking of the same output gives the same
//! joined result.

/// What a state machine did with the start of the unconsumed text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    /// This many bytes were consumed (0 only together with a change of state).
    Consumed(usize),
    /// Nothing can be decided before more text arrives (never returned at end of output).
    NeedMore,
}

/// Where a marker search ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hit {
    /// `markers[marker]` starts at byte `at`.
    Found { at: usize, marker: usize },
    /// No marker is present, but the text from byte `at` to the end is a proper prefix of one:
    /// everything before `at` is safe to emit, the rest must wait.
    Partial(usize),
    /// No marker and no prefix of one: all of the text is safe to emit.
    None,
}

/// The earliest occurrence of any of `markers` in `hay` (the longest marker on a tie), else
/// the earliest suffix of `hay` that a marker could still complete. One pass that stops at
/// the first match, so a marker waiting at the start of a long held-back text costs nothing.
pub(crate) fn find_first(hay: &str, markers: &[&str]) -> Hit {
    if let [m] = markers {
        if let Some(at) = hay.find(m) {
            return Hit::Found { at, marker: 0 };
        }
        return partial_suffix(hay, markers).map_or(Hit::None, Hit::Partial);
    }
    let bytes = hay.as_bytes();
    let is_first = |b: &u8| markers.iter().any(|m| m.as_bytes().first() == Some(b));
    let mut from = 0;
    while let Some(rel) = bytes[from..].iter().position(is_first) {
        // The first byte of a marker is never a UTF-8 continuation byte: `at` is a boundary.
        let at = from + rel;
        let found = markers
            .iter()
            .enumerate()
            .filter(|(_, m)| hay[at..].starts_with(**m))
            .max_by_key(|(_, m)| m.len());
        if let Some((marker, _)) = found {
            return Hit::Found { at, marker };
        }
        from = at + 1;
    }
    match partial_suffix(hay, markers) {
        Some(at) => Hit::Partial(at),
        None => Hit::None,
    }
}

/// The start of the longest suffix of `hay` that is a proper, non-empty prefix of a marker.
pub(crate) fn partial_suffix(hay: &str, markers: &[&str]) -> Option<usize> {
    let longest = markers.iter().map(|m| m.len()).max().unwrap_or(0);
    let min_start = hay.len().saturating_sub(longest.saturating_sub(1));
    (min_start..hay.len())
        .filter(|&at| hay.is_char_boundary(at))
        .find(|&at| {
            let tail = &hay[at..];
            markers
                .iter()
                .any(|m| m.len() > tail.len() && m.starts_with(tail))
        })
}

/// Is `text` a proper prefix of some marker (so more text could still make it one)?
pub(crate) fn is_proper_prefix(text: &str, markers: &[&str]) -> bool {
    markers
        .iter()
        .any(|m| m.len() > text.len() && m.starts_with(text))
}

/// The largest char boundary of `s` at or below `i`.
pub(crate) fn floor_boundary(s: &str, i: usize) -> usize {
    let mut i = i.min(s.len());
    while !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// The length of the leading whitespace of `s`.
pub(crate) fn leading_ws(s: &str) -> usize {
    s.len() - s.trim_start().len()
}

/// Feeds `buf` to `step` until it asks for more (or, at `eof`, until nothing is left), then
/// drops the consumed bytes. Returns whatever a misbehaving machine left unconsumed at end of
/// output, for the caller to flush as plain text; the machines here leave nothing.
pub(crate) fn drive(
    buf: &mut String,
    eof: bool,
    mut step: impl FnMut(&str, bool) -> Step,
) -> Option<String> {
    let mut start = 0;
    let mut idle = 0;
    while start < buf.len() {
        match step(&buf[start..], eof) {
            Step::Consumed(0) => {
                // A change of state without consuming: bounded, or the machine is stuck.
                idle += 1;
                debug_assert!(idle < 16, "state machine made no progress");
                if idle >= 16 {
                    break;
                }
            }
            Step::Consumed(n) => {
                debug_assert!(buf.is_char_boundary(start + n));
                start += n;
                idle = 0;
            }
            Step::NeedMore => {
                debug_assert!(!eof, "a state machine asked for more text at end of output");
                break;
            }
        }
    }
    let leftover = (eof && start < buf.len()).then(|| buf[start..].to_string());
    if leftover.is_some() {
        buf.clear();
    } else {
        buf.drain(..start);
    }
    leftover
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_earliest_then_longest() {
        let hay = "ab<x><xy>";
        assert_eq!(
            find_first(hay, &["<xy>", "<x>"]),
            Hit::Found { at: 2, marker: 1 }
        );
        assert_eq!(find_first("abc<x", &["<xy>"]), Hit::Partial(3));
        assert_eq!(find_first("abc", &["<xy>"]), Hit::None);
        assert_eq!(find_first("a<", &["<x>", "<<<"]), Hit::Partial(1));
    }

    #[test]
    fn partial_respects_char_boundaries() {
        let m = "<｜tool▁sep｜>";
        let cut = &m[..4]; // "<｜": the fullwidth bar is three bytes
        assert_eq!(partial_suffix(&format!("hé{cut}"), &[m]), Some(3));
        assert_eq!(floor_boundary("é", 1), 0);
    }
}
