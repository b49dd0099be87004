use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;

use super::*;

fn tree_with(items: &[(&str, WorkerId)]) -> RadixTree {
    let mut t = RadixTree::default();
    for &(text, tenant) in items {
        t.insert(text, tenant);
        t.check_invariants();
    }
    t
}

#[test]
fn insert_and_match_prefixes() {
    let t = tree_with(&[("hello world", 0), ("hello there", 1), ("help", 0)]);
    assert_eq!(t.prefix_match("hello world!", 0), 11);
    assert_eq!(t.prefix_match("hello thorn", 1), 8);
    assert_eq!(t.prefix_match("hello thorn", 0), 6);
    assert_eq!(t.prefix_match("helpless", 0), 4);
    assert_eq!(t.prefix_match("helpless", 1), 3);
    assert_eq!(t.prefix_match("xyz", 0), 0);
    assert_eq!(t.prefix_match("", 0), 0);
    // "hello world" + "p" (the help branch) for 0; "hello there" for 1.
    assert_eq!(t.tenant_chars(0), 12);
    assert_eq!(t.tenant_chars(1), 11);
    assert_eq!(t.tenant_chars(7), 0);
}

#[test]
fn reinserting_is_idempotent_for_size() {
    let mut t = tree_with(&[("abcdef", 0)]);
    let nodes = t.node_count();
    t.insert("abcdef", 0);
    t.insert("abc", 0);
    t.check_invariants();
    assert_eq!(t.tenant_chars(0), 6);
    assert_eq!(
        t.node_count(),
        nodes + 1,
        "only the split at 'abc' adds a node"
    );
}

#[test]
fn counts_chars_not_bytes_and_splits_on_char_boundaries() {
    let t = tree_with(&[
        ("日本語のテキスト", 0),
        ("日本人", 1),
        ("héllo", 2),
        ("hèllo", 2),
    ]);
    assert_eq!(t.tenant_chars(0), 8);
    assert_eq!(t.tenant_chars(1), 3);
    assert_eq!(t.prefix_match("日本人です", 0), 2);
    assert_eq!(t.prefix_match("日本人です", 1), 3);
    // 'é' and 'è' share their first UTF-8 byte; the split must not land inside it.
    assert_eq!(t.prefix_match("hêllo", 2), 1);
    assert_eq!(t.tenant_chars(2), 9);
}

#[test]
fn match_path_reports_partial_edges() {
    let t = tree_with(&[("abcdef", 0)]);
    let mut path = Vec::new();
    t.match_path("abcxyz", &mut path);
    assert_eq!(path.len(), 1);
    assert_eq!(path[0].1, 3);
    assert_eq!(t.tenants(path[0].0), &[(0, 1)]);
}

#[test]
fn evict_removes_least_recently_used_leaves_first() {
    let mut t = tree_with(&[("old-aaaaaaaa", 0), ("new-bbbbbbbb", 0)]);
    assert_eq!(t.tenant_chars(0), 24);
    t.evict(12);
    t.check_invariants();
    assert_eq!(t.tenant_chars(0), 12);
    assert_eq!(t.prefix_match("new-bbbbbbbb", 0), 12);
    assert_eq!(t.prefix_match("old-aaaaaaaa", 0), 0);
}

#[test]
fn insert_refreshes_recency() {
    let mut t = tree_with(&[("first-xxxx", 0), ("second-yyyy", 0)]);
    t.insert("first-xxxx", 0);
    t.evict(10);
    t.check_invariants();
    assert_eq!(t.prefix_match("first-xxxx", 0), 10);
    assert_eq!(t.prefix_match("second-yyyy", 0), 0);
}

#[test]
fn evict_trims_shared_paths_without_touching_other_tenants() {
    let mut t = tree_with(&[
        ("shared prefix / one", 0),
        ("shared prefix / two", 1),
        ("shared prefix / three", 0),
    ]);
    // Tenant 0: "shared prefix / " (16) + "one" (3) + "t" (1) + "hree" (4); tenant 1: 19.
    assert_eq!(t.tenant_chars(0), 24);
    t.evict(19);
    t.check_invariants();
    // "one" (oldest) then "hree" go; the "t" shared with tenant 1 stays for tenant 0.
    assert_eq!(t.tenant_chars(0), 17);
    assert_eq!(t.prefix_match("shared prefix / one", 0), 16);
    assert_eq!(t.prefix_match("shared prefix / three", 0), 17);
    assert_eq!(t.tenant_chars(1), 19);
    assert_eq!(t.prefix_match("shared prefix / two", 1), 19);
}

#[test]
fn evict_to_zero_frees_everything() {
    let mut t = tree_with(&[("abc", 0), ("abd", 1), ("xyz", 0)]);
    t.evict(0);
    t.check_invariants();
    assert_eq!(t.node_count(), 1);
    assert_eq!(t.tenant_chars(0), 0);
    assert_eq!(t.tenant_chars(1), 0);
}

#[test]
fn evict_tenant_only_touches_that_tenant() {
    let mut t = tree_with(&[("abcdef", 0), ("abcdef", 1)]);
    t.evict_tenant(0, 2);
    t.check_invariants();
    assert_eq!(t.tenant_chars(0), 0, "a whole leaf edge goes at once");
    assert_eq!(t.tenant_chars(1), 6);
}

#[test]
fn remove_tenant_frees_private_nodes() {
    let mut t = tree_with(&[("shared-a", 0), ("shared-b", 1), ("mine", 0)]);
    t.remove_tenant(0);
    t.check_invariants();
    assert_eq!(t.tenant_chars(0), 0);
    assert_eq!(t.prefix_match("shared-a", 0), 0);
    assert_eq!(t.prefix_match("shared-b", 1), 8);
    // Root + "shared-" + "a"/"b" split leftovers: only tenant 1's path remains.
    assert_eq!(t.node_count(), 3);
    // Freed nodes are reused.
    t.insert("again", 0);
    t.check_invariants();
    assert_eq!(t.node_count(), 4);
}

/// Naive model: per tenant, the set of inserted strings.
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
    fn matches_naive_model(ops in proptest::collection::vec((text_strategy(), 0u32..4), 0..40),
                           probes in proptest::collection::vec(text_strategy(), 1..10)) {
        let mut t = RadixTree::default();
        let mut model: BTreeMap<WorkerId, BTreeSet<String>> = BTreeMap::new();
        for (text, tenant) in &ops {
            t.insert(text, *tenant);
            model.entry(*tenant).or_default().insert(text.clone());
        }
        t.check_invariants();
        for tenant in 0..4 {
            let strings = model.get(&tenant).cloned().unwrap_or_default();
            prop_assert_eq!(t.tenant_chars(tenant), model_chars(&strings));
            for p in &probes {
                prop_assert_eq!(t.prefix_match(p, tenant), model_match(&strings, p));
            }
        }
    }

    #[test]
    fn evict_bounds_and_keeps_latest(ops in proptest::collection::vec((text_strategy(), 0u32..3), 1..40),
                                     max in 0usize..20, remove in proptest::option::of(0u32..3)) {
        let mut t = RadixTree::default();
        for (text, tenant) in &ops {
            t.insert(text, *tenant);
        }
        if let Some(r) = remove {
            t.remove_tenant(r);
            t.check_invariants();
            prop_assert_eq!(t.tenant_chars(r), 0);
        }
        t.evict(max);
        t.check_invariants();
        for tenant in 0..3 {
            prop_assert!(t.tenant_chars(tenant) <= max);
        }
        // The most recent insert survives whole when it fits.
        let (last, tenant) = ops.last().unwrap();
        if remove != Some(*tenant) && last.chars().count() <= max {
            prop_assert_eq!(t.prefix_match(last, *tenant), last.chars().count());
        }
    }
}
