use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;

fn tree_with(items: &[&str]) -> RadixTree {
    let mut t = RadixTree::default();
    for text in items {
        t.insert(text);
        t.check_invariants();
    }
    t
}

fn evict_all(t: &mut RadixTree, max: usize) {
    assert!(t.evict(max, usize::MAX));
    t.check_invariants();
}

#[test]
fn insert_and_match_prefixes() {
    let t = tree_with(&["hello world", "help"]);
    let u = tree_with(&["hello there"]);
    assert_eq!(t.match_len("hello world!"), 11);
    assert_eq!(u.match_len("hello thorn"), 8);
    assert_eq!(t.match_len("hello thorn"), 6);
    assert_eq!(t.match_len("helpless"), 4);
    assert_eq!(u.match_len("helpless"), 3);
    assert_eq!(t.match_len("xyz"), 0);
    assert_eq!(t.match_len(""), 0);
    // "hello world" + "p" (the help branch).
    assert_eq!(t.chars(), 12);
    assert_eq!(u.chars(), 11);
    assert_eq!(RadixTree::default().chars(), 0);
}

#[test]
fn reinserting_is_idempotent_for_size() {
    let mut t = tree_with(&["abcdef"]);
    let nodes = t.node_count();
    t.insert("abcdef");
    t.insert("abc");
    t.check_invariants();
    assert_eq!(t.chars(), 6);
    assert_eq!(
        t.node_count(),
        nodes + 1,
        "only the split at 'abc' adds a node"
    );
}

#[test]
fn counts_chars_not_bytes_and_splits_on_char_boundaries() {
    let t = tree_with(&["日本語のテキスト"]);
    let u = tree_with(&["日本人"]);
    let v = tree_with(&["héllo", "hèllo"]);
    assert_eq!(t.chars(), 8);
    assert_eq!(u.chars(), 3);
    assert_eq!(t.match_len("日本人です"), 2);
    assert_eq!(u.match_len("日本人です"), 3);
    // 'é' and 'è' share their first UTF-8 byte; the split must not land inside it.
    assert_eq!(v.match_len("hêllo"), 1);
    assert_eq!(v.chars(), 9);
}

#[test]
fn partial_edges_count_their_matched_part() {
    let t = tree_with(&["abcdef"]);
    assert_eq!(t.match_len("abcxyz"), 3);
}

#[test]
fn evict_removes_least_recently_used_leaves_first() {
    let mut t = tree_with(&["old-aaaaaaaa", "new-bbbbbbbb"]);
    assert_eq!(t.chars(), 24);
    evict_all(&mut t, 12);
    assert_eq!(t.chars(), 12);
    assert_eq!(t.match_len("new-bbbbbbbb"), 12);
    assert_eq!(t.match_len("old-aaaaaaaa"), 0);
}

#[test]
fn insert_refreshes_recency() {
    let mut t = tree_with(&["first-xxxx", "second-yyyy"]);
    t.insert("first-xxxx");
    evict_all(&mut t, 10);
    assert_eq!(t.match_len("first-xxxx"), 10);
    assert_eq!(t.match_len("second-yyyy"), 0);
}

#[test]
fn evict_trims_leaves_before_their_shared_prefix() {
    let mut t = tree_with(&["shared prefix / one", "shared prefix / two", "other"]);
    // "shared prefix / " (16) + "one" (3) + "two" (3) + "other" (5).
    assert_eq!(t.chars(), 27);
    t.insert("shared prefix / one");
    evict_all(&mut t, 19);
    // "two" then "other" go (oldest leaves); the refreshed path stays whole.
    assert_eq!(t.chars(), 19);
    assert_eq!(t.match_len("shared prefix / one"), 19);
    assert_eq!(t.match_len("shared prefix / two"), 16);
    assert_eq!(t.match_len("other"), 0);
}

#[test]
fn a_split_keeps_the_upper_half_newer() {
    // "abcdef" is split by "abcxyz": the upper "abc" must outlive both leaves.
    let mut t = tree_with(&["abcdef", "abcxyz"]);
    evict_all(&mut t, 6);
    assert_eq!(t.match_len("abcxyz"), 6);
    assert_eq!(t.match_len("abcdef"), 3);
    evict_all(&mut t, 3);
    assert_eq!(t.match_len("abcq"), 3);
}

#[test]
fn evict_to_zero_frees_everything_and_nodes_are_reused() {
    let mut t = tree_with(&["abc", "abd", "xyz"]);
    evict_all(&mut t, 0);
    assert_eq!(t.node_count(), 1);
    assert_eq!(t.chars(), 0);
    t.insert("again");
    t.check_invariants();
    assert_eq!(t.node_count(), 2);
    assert_eq!(t.nodes.len(), 5, "freed nodes reused");
}

#[test]
fn edges_and_children_beyond_the_node_spill_out_and_come_back() {
    // 40 bytes: longer than an edge kept in its node; the split after 12 bytes (4 chars)
    // leaves a short upper half (back in its node) over a long lower one, and six children
    // spill the upper node's child list.
    let long = "语".repeat(4) + &"x".repeat(28);
    let stem = &long[..12];
    let mut t = tree_with(&[&long]);
    let mut items = vec![long.clone()];
    for c in ['a', 'b', 'c', 'd', 'é'] {
        let text = format!("{stem}{c}");
        t.insert(&text);
        t.check_invariants();
        items.push(text);
    }
    let split = t.child(ROOT, '语').expect("the stem");
    assert_eq!(t.nodes[split as usize].edge.as_slice(), stem.as_bytes());
    assert!(
        !t.nodes[split as usize].edge.spilled(),
        "a short edge is back in its node"
    );
    assert!(t.nodes[split as usize].children.spilled());
    assert_eq!(t.match_len(&long), 32);
    assert_eq!(t.match_len(&format!("{stem}c!")), 5);
    assert_eq!(t.match_len(&format!("{stem}é")), 5);
    assert_eq!(t.match_len(&format!("{stem}è")), 4);
    assert_eq!(t.chars(), 32 + 5);
    evict_all(&mut t, 0);
    assert_eq!(t.node_count(), 1);
}

#[test]
fn evict_work_is_bounded_by_its_budget() {
    let mut t = tree_with(&["a1", "b2", "c3", "d4"]);
    assert!(!t.evict(0, 1));
    assert_eq!(t.chars(), 6);
    assert!(!t.evict(0, 2));
    assert_eq!(t.chars(), 2);
    assert!(t.evict(0, 5));
    assert!(t.evict(0, 0), "already within the limit");
    t.check_invariants();
}

/// Naive model: the set of inserted strings.
fn model_match(strings: &BTreeSet<String>, text: &str) -> usize {
    strings
        .iter()
        .map(|s| {
            s.chars()
                .zip(text.chars())
                .take_while(|(a, b)| a == b)
                .count()
        })
        .max()
        .unwrap_or(0)
}

fn model_chars(strings: &BTreeSet<String>) -> usize {
    let mut prefixes = BTreeSet::new();
    for s in strings {
        for (i, _) in s.char_indices().skip(1) {
            prefixes.insert(&s[..i]);
        }
        if !s.is_empty() {
            prefixes.insert(s.as_str());
        }
    }
    prefixes.len()
}

fn text_strategy() -> impl Strategy<Value = String> {
    // Small alphabet (with multi-byte chars) so prefixes collide a lot.
    proptest::collection::vec(
        prop_oneof![Just('a'), Just('b'), Just('é'), Just('è'), Just('語')],
        0..12,
    )
    .prop_map(|cs| cs.into_iter().collect())
}

proptest! {
    #[test]
    fn matches_naive_model(ops in proptest::collection::vec(text_strategy(), 0..40),
                           probes in proptest::collection::vec(text_strategy(), 1..10)) {
        let mut t = RadixTree::default();
        let mut model = BTreeSet::new();
        for text in &ops {
            t.insert(text);
            model.insert(text.clone());
        }
        t.check_invariants();
        prop_assert_eq!(t.chars(), model_chars(&model));
        for p in &probes {
            prop_assert_eq!(t.match_len(p), model_match(&model, p));
        }
    }

    #[test]
    fn evict_bounds_and_keeps_latest(ops in proptest::collection::vec(text_strategy(), 1..40),
                                     max in 0usize..20, budget in 1usize..4) {
        let mut t = RadixTree::default();
        for text in &ops {
            t.insert(text);
            // Bounded steps, as commits do: each call removes at most `budget` nodes.
            t.evict(2 * max, budget);
            t.check_invariants();
        }
        while !t.evict(max, budget) {}
        t.check_invariants();
        prop_assert!(t.chars() <= max);
        // The most recent insert survives whole when it fits.
        let last = ops.last().unwrap();
        if last.chars().count() <= max {
            prop_assert_eq!(t.match_len(last), last.chars().count());
        }
        // Whatever is left is a subset of what was inserted.
        let model: BTreeSet<String> = ops.iter().cloned().collect();
        for p in &ops {
            prop_assert!(t.match_len(p) <= model_match(&model, p));
        }
    }
}

proptest! {
    #[test]
    fn common_bytes_matches_naive(a in proptest::collection::vec(0u8..3, 0..40),
                                  b in proptest::collection::vec(0u8..3, 0..40)) {
        let naive = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        prop_assert_eq!(common_bytes(&a, &b), naive);
        let same = [a.as_slice(), &[9]].concat();
        prop_assert_eq!(common_bytes(&a, &same), a.len());
    }
}
