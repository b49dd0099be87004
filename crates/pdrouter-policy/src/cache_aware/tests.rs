use super::*;
use crate::testutil::{W, named, workers};

fn cfg() -> CacheAwareConfig {
    CacheAwareConfig {
        cache_threshold: 0.5,
        balance_abs_threshold: 64,
        balance_rel_threshold: 1.5,
        max_tree_size: 1000,
    }
}

fn text(t: &str) -> RequestInfo<'_> {
    RequestInfo {
        text: Some(t),
        routing_key: None,
        ..Default::default()
    }
}

fn rank(ca: &CacheAware, ws: &[W], t: Option<&str>) -> Vec<usize> {
    let mut out = Vec::new();
    ca.rank(
        ws,
        &RequestInfo {
            text: t,
            routing_key: None,
            ..Default::default()
        },
        &mut out,
    );
    let mut sorted = out.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        (0..ws.len()).collect::<Vec<_>>(),
        "not a permutation"
    );
    out
}

fn commit(ca: &CacheAware, ws: &[W], chosen: usize, t: &str) {
    ca.commit(&ws[chosen].url, &text(t));
}

const PROMPT: &str =
    "You are a helpful assistant. Answer the question: what is the capital of France?";

#[test]
fn no_text_orders_by_load() {
    let ca = CacheAware::new(cfg());
    let ws = workers(&[5, 2, 9, 2]);
    assert_eq!(rank(&ca, &ws, None), [1, 3, 0, 2]);
    assert_eq!(rank(&ca, &ws, Some("")), [1, 3, 0, 2]);
    assert!(rank(&ca, &[] as &[W], Some("x")).is_empty());
}

#[test]
fn commit_creates_affinity_and_rank_alone_does_not() {
    let ca = CacheAware::new(cfg());
    let ws = workers(&[3, 0, 1, 2]);
    // Empty trees: smallest tree ties → lowest load first; then by load.
    let first = rank(&ca, &ws, Some(PROMPT));
    assert_eq!(first, [1, 2, 3, 0]);
    assert_eq!(
        rank(&ca, &ws, Some(PROMPT)),
        first,
        "rank must not change state"
    );
    assert_eq!(ca.cached_chars(&ws[1].url), 0);

    commit(&ca, &ws, 2, PROMPT);
    let follow_up = format!("{PROMPT} And of Germany?");
    assert_eq!(rank(&ca, &ws, Some(&follow_up)), [2, 1, 3, 0]);
    assert_eq!(ca.cached_chars(&ws[2].url), PROMPT.chars().count());
}

#[test]
fn best_match_ties_go_to_lower_load() {
    let ca = CacheAware::new(cfg());
    let ws = workers(&[7, 4, 0]);
    commit(&ca, &ws, 0, PROMPT);
    commit(&ca, &ws, 1, PROMPT);
    assert_eq!(rank(&ca, &ws, Some(PROMPT)), [1, 2, 0]);
}

#[test]
fn deeper_match_beats_lower_load() {
    let ca = CacheAware::new(cfg());
    let ws = workers(&[10, 0]);
    commit(&ca, &ws, 0, PROMPT);
    commit(&ca, &ws, 1, &PROMPT[..50]);
    assert_eq!(rank(&ca, &ws, Some(PROMPT))[0], 0);
}

#[test]
fn low_match_rate_picks_smallest_tree() {
    let ca = CacheAware::new(cfg());
    let ws = workers(&[0, 1, 2]);
    commit(&ca, &ws, 0, "abcdXXXXXXXXXXXXXXXX");
    commit(&ca, &ws, 1, "zzzzzzzz");
    commit(&ca, &ws, 2, "yyyyyyyyyyyy");
    // "abcd" matches 4 of 8 chars: 0.5 is not > 0.5, so no affinity; worker 1 holds least.
    assert_eq!(rank(&ca, &ws, Some("abcdefgh")), [1, 0, 2]);
    // 5 of 8 crosses the threshold.
    assert_eq!(rank(&ca, &ws, Some("abcdXfgh")), [0, 1, 2]);
}

#[test]
fn smallest_tree_ties_go_to_lower_load() {
    let ca = CacheAware::new(cfg());
    let ws = workers(&[0, 9, 5]);
    commit(&ca, &ws, 0, "something else entirely");
    assert_eq!(rank(&ca, &ws, Some("unrelated")), [2, 0, 1]);
}

#[test]
fn imbalance_switches_to_load_order() {
    let ca = CacheAware::new(cfg());
    let ws = workers(&[100, 10, 50]);
    commit(&ca, &ws, 0, PROMPT);
    // 100 - 10 > 64 and 100 > 15: imbalanced, affinity ignored.
    assert_eq!(rank(&ca, &ws, Some(PROMPT)), [1, 2, 0]);
    // Absolute spread alone is not enough: 1000 vs 900 is within 1.5x.
    let ws = workers(&[1000, 900]);
    commit(&ca, &ws, 0, PROMPT);
    assert_eq!(rank(&ca, &ws, Some(PROMPT)), [0, 1]);
    // Relative spread alone is not enough: 60 vs 0 is within 64.
    let ws = workers(&[60, 0]);
    assert_eq!(rank(&ca, &ws, Some(PROMPT)), [0, 1]);
}

#[test]
fn workers_identified_by_url_across_slices() {
    let ca = CacheAware::new(cfg());
    let ws = named(&["a", "b", "c"]);
    commit(&ca, &ws, 1, PROMPT);
    // Reordered and shrunk slice: "b" is now at position 1 of ["c", "b"].
    assert_eq!(rank(&ca, &named(&["c", "b"]), Some(PROMPT))[0], 1);
    assert_eq!(rank(&ca, &named(&["b", "c", "a"]), Some(PROMPT))[0], 0);
    // Without "b", nobody matches: smallest tree (all zero) → lowest load → position 0.
    assert_eq!(rank(&ca, &named(&["c", "a"]), Some(PROMPT)), [0, 1]);
    // A brand-new url is fine too.
    assert_eq!(rank(&ca, &named(&["new", "b"]), Some(PROMPT))[0], 1);
    // Duplicated urls still give a permutation.
    rank(&ca, &named(&["b", "b", "a"]), Some(PROMPT));
}

#[test]
fn evict_bounds_size_and_keeps_recent() {
    let mut c = cfg();
    c.max_tree_size = 40;
    let ca = CacheAware::new(c);
    let ws = workers(&[0]);
    let old = "old old old old old old old old!"; // 32 chars
    let new = "new new new new new new new new!"; // 32 chars
    commit(&ca, &ws, 0, old);
    commit(&ca, &ws, 0, new);
    assert_eq!(ca.cached_chars(&ws[0].url), 64);
    ca.evict();
    assert!(ca.cached_chars(&ws[0].url) <= 40);
    let ws2 = workers(&[0, 0]);
    // Worker 0 still has the recent prompt cached...
    assert_eq!(rank(&ca, &ws2, Some(new))[0], 0);
    // ...but not the old one: worker 1 (empty tree) is smaller, and 0 holds only 32 chars.
    assert_eq!(ca.cached_chars(&ws[0].url), 32);
    assert_eq!(rank(&ca, &ws2, Some(old))[0], 1);
}

#[test]
fn commit_trims_a_worker_past_twice_the_limit() {
    let mut c = cfg();
    c.max_tree_size = 10;
    let ca = CacheAware::new(c);
    let ws = workers(&[0]);
    commit(&ca, &ws, 0, "aaaaaaaaaaaaaaa"); // 15: under 2 × 10, kept
    assert_eq!(ca.cached_chars(&ws[0].url), 15);
    commit(&ca, &ws, 0, "bbbbbbbb"); // 23 > 20: trimmed to <= 10 at once
    assert_eq!(ca.cached_chars(&ws[0].url), 8);
}

#[test]
fn remove_worker_forgets_its_tree() {
    let ca = CacheAware::new(cfg());
    let ws = workers(&[5, 0]);
    commit(&ca, &ws, 0, PROMPT);
    assert_eq!(rank(&ca, &ws, Some(PROMPT))[0], 0);
    ca.remove_worker(&ws[0].url);
    assert_eq!(ca.cached_chars(&ws[0].url), 0);
    assert_eq!(rank(&ca, &ws, Some(PROMPT)), [1, 0]);
    // The url coming back starts from scratch; unknown urls are a no-op.
    ca.remove_worker("http://never-seen");
    commit(&ca, &ws, 0, "fresh");
    assert_eq!(ca.cached_chars(&ws[0].url), 5);
}

#[test]
fn long_text_is_truncated() {
    let ca = CacheAware::new(CacheAwareConfig::default());
    let ws = workers(&[0, 0]);
    let long = "é".repeat(MAX_INDEXED_CHARS + 500);
    commit(&ca, &ws, 1, &long);
    assert_eq!(ca.cached_chars(&ws[1].url), MAX_INDEXED_CHARS);
    // Same first 4096 chars, different tail: still a full (truncated) match.
    let other = format!("{}xyz", "é".repeat(MAX_INDEXED_CHARS + 10));
    assert_eq!(rank(&ca, &ws, Some(&other))[0], 1);
    assert_eq!(indexed(Some("abc")), Some(("abc", 3)));
    assert_eq!(indexed(Some("")), None);
    assert_eq!(indexed(None), None);
}

#[test]
fn commit_without_text_is_noop() {
    let ca = CacheAware::new(cfg());
    let ws = workers(&[0]);
    ca.commit(&ws[0].url, &RequestInfo::default());
    ca.commit(&ws[0].url, &text(""));
    assert_eq!(ca.cached_chars(&ws[0].url), 0);
    assert!(format!("{ca:?}").contains("CacheAware"));
}
