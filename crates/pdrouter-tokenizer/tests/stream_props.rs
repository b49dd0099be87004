//! Property tests: the detokenizer and the stop matcher give the same text whatever the split.

mod support;

use std::sync::Arc;

use pdrouter_tokenizer::bytelevel::{self, ENDOFTEXT, IM_END, IM_START, TOOL_CALL_START};
use pdrouter_tokenizer::*;
use proptest::prelude::*;

fn stream_all(tk: &Arc<Tokenizer>, ids: &[u32], options: DecodeOptions) -> (Vec<String>, String) {
    let mut stream = DecodeStream::new(tk.clone(), options);
    let mut deltas = Vec::new();
    for &id in ids {
        if let Some(delta) = stream.step(id).unwrap() {
            deltas.push(delta);
        }
    }
    deltas.extend(stream.flush().unwrap());
    let joined = deltas.concat();
    (deltas, joined)
}

/// Text from a small alphabet with multibyte characters, so stop strings match often.
fn small_text(max: usize) -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop::sample::select(vec!["a", "b", " ", "é", "世", "🦀", "\n"]),
        0..max,
    )
    .prop_map(|parts| parts.concat())
}

/// The reference: cut the full text at the earliest end of any stop string.
fn reference_cut(text: &str, stops: &[String], no_stop_trim: bool) -> (String, Option<String>) {
    let mut best: Option<(usize, usize, &String)> = None;
    for stop in stops.iter().filter(|s| !s.is_empty()) {
        if let Some(start) = text.find(stop.as_str()) {
            let end = start + stop.len();
            if best.is_none_or(|(s, e, _)| end < e || (end == e && start < s)) {
                best = Some((start, end, stop));
            }
        }
    }
    match best {
        Some((start, end, stop)) => {
            let cut = if no_stop_trim { end } else { start };
            (text[..cut].to_owned(), Some(stop.clone()))
        }
        None => (text.to_owned(), None),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn bytes_of_any_text_stream_back_to_the_text(text in "\\PC{0,40}") {
        let tk = support::bytelevel();
        let ids = bytelevel::encode_plain(&text);
        let (deltas, joined) = stream_all(&tk, &ids, DecodeOptions::default());
        prop_assert_eq!(&joined, &text);
        if !text.contains('\u{FFFD}') {
            prop_assert!(deltas.iter().all(|d| !d.contains('\u{FFFD}')), "broken sequence in {:?}", deltas);
        }
    }

    #[test]
    fn added_tokens_stream_like_a_full_decode(
        text in small_text(30),
        inserts in proptest::collection::vec((any::<prop::sample::Index>(), prop::sample::select(vec![IM_START, IM_END, ENDOFTEXT, TOOL_CALL_START])), 0..4),
        skip in any::<bool>(),
        spaces in any::<bool>(),
    ) {
        let tk = support::bytelevel();
        let mut ids = bytelevel::encode_plain(&text);
        for (at, id) in inserts {
            let at = at.index(ids.len() + 1);
            ids.insert(at, id);
        }
        let options = DecodeOptions { skip_special_tokens: skip, spaces_between_special_tokens: spaces };
        let (_, joined) = stream_all(&tk, &ids, options);
        prop_assert_eq!(joined, tk.decode(&ids, options).unwrap());
    }

    #[test]
    fn stop_matcher_equals_the_reference_cut_whatever_the_split(
        text in small_text(40),
        stops in proptest::collection::vec(small_text(4), 1..4),
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 0..10),
        no_stop_trim in any::<bool>(),
    ) {
        // Split the text at random char boundaries.
        let bounds: Vec<usize> = text.char_indices().map(|(i, _)| i).chain([text.len()]).collect();
        let mut points: Vec<usize> = cuts.iter().map(|c| bounds[c.index(bounds.len())]).collect();
        points.extend([0, text.len()]);
        points.sort_unstable();
        points.dedup();
        let conditions = StopConditions::strings(&stops, no_stop_trim).unwrap();
        let mut matcher = StopMatcher::new(conditions);
        let mut out = String::new();
        for pair in points.windows(2) {
            out.push_str(&matcher.push(&text[pair[0]..pair[1]]));
        }
        if matcher.matched().is_none() {
            out.push_str(&matcher.flush());
        }
        let (want, matched) = reference_cut(&text, &stops, no_stop_trim);
        prop_assert_eq!(&out, &want);
        prop_assert_eq!(matcher.matched(), matched.as_deref());
        if !no_stop_trim {
            for stop in stops.iter().filter(|s| !s.is_empty()) {
                prop_assert!(!out.contains(stop.as_str()));
            }
        }
    }

    #[test]
    fn text_stream_cuts_at_stop_tokens_and_strings(
        text in small_text(40),
        stops in proptest::collection::vec(small_text(3), 0..3),
        stop_at in proptest::option::of(any::<prop::sample::Index>()),
        no_stop_trim in any::<bool>(),
    ) {
        let tk = support::bytelevel();
        let mut ids = bytelevel::encode_plain(&text);
        if let Some(at) = stop_at {
            ids.insert(at.index(ids.len() + 1), IM_END);
        }
        let conditions = StopConditions::new(&tk, &stops, &[], false, no_stop_trim).unwrap();
        let mut stream = TextStream::new(tk.clone(), DecodeOptions::default(), conditions);
        let mut out = String::new();
        let mut finish = None;
        for &id in &ids {
            let step = stream.push(id).unwrap();
            out.push_str(&step.text);
            if step.finish.is_some() {
                finish = step.finish;
                break;
            }
        }
        if finish.is_none() {
            let step = stream.finish(FinishReason::Length).unwrap();
            out.push_str(&step.text);
            finish = step.finish;
        }
        let eos_at = ids.iter().position(|id| *id == IM_END).unwrap_or(ids.len());
        let before = tk.decode(&ids[..eos_at], DecodeOptions::default()).unwrap();
        let (want, matched) = reference_cut(&before, &stops, no_stop_trim);
        let want_finish = match (matched, eos_at < ids.len()) {
            (Some(s), _) => FinishReason::StopString(s),
            (None, true) => FinishReason::StopToken(IM_END),
            (None, false) => FinishReason::Length,
        };
        prop_assert_eq!(out, want);
        prop_assert_eq!(finish, Some(want_finish));
        prop_assert!(stream.push(b'a'.into()).unwrap() == Step::default(), "a finished stream ignores ids");
    }
}

#[test]
fn invalid_bytes_are_held_back_only_so_long() {
    let tk = support::bytelevel();
    let ids: Vec<u32> = std::iter::repeat_n(0x80, 40)
        .chain(bytelevel::encode_plain("ok"))
        .collect();
    let mut stream = DecodeStream::new(tk.clone(), DecodeOptions::default());
    let mut out = String::new();
    let mut emitted_early = false;
    for (i, &id) in ids.iter().enumerate() {
        if let Some(delta) = stream.step(id).unwrap() {
            emitted_early |= i < 39;
            out.push_str(&delta);
        }
    }
    out.extend(stream.flush().unwrap());
    assert!(
        emitted_early,
        "a run of invalid bytes is not held to the end"
    );
    assert_eq!(out, tk.decode(&ids, DecodeOptions::default()).unwrap());
    assert_eq!(out, format!("{}ok", "\u{FFFD}".repeat(40)));
}
