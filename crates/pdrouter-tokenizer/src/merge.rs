//! BPE merges of one word straight on ids, for the fast route.
//!
//! The library's model answers a word as one `Token` per piece, each with its own copy of the
//! piece's text; the fast route wants the ids only. This module merges on ids with the
//! model's own vocabulary and merge ranks, read from the model once at load.
//!
//! Invariants:
//! - A [`Merges`] exists only for a model whose words start as one symbol per byte (every
//!   byte-level character is in the vocabulary, so neither unknown tokens nor byte fallback
//!   can arise), with no dropout, no (or an empty) subword prefix and word suffix, and
//!   `ignore_merges` off.
//!   Other models keep the library's model.
//! - The merge order is the library's: the pending merge of lowest rank first, leftmost
//!   among equals, an entry skipped when the pair at its place no longer makes its token.
//!   So the ids are the library's (tested against it with real merge tables).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use tokenizers::models::bpe::BPE;

type Table = HashMap<(u32, u32), (u32, u32), foldhash::fast::RandomState>;

/// A model's merges by pair of ids: the rank and the merged token's id.
pub(crate) struct Merges {
    /// The id of each byte's byte-level character.
    byte_ids: [u32; 256],
    table: Table,
}

/// The fields of the library's serialized model this module needs.
#[derive(serde::Deserialize)]
struct Wire {
    dropout: Option<f32>,
    continuing_subword_prefix: Option<String>,
    end_of_word_suffix: Option<String>,
    ignore_merges: bool,
    vocab: HashMap<String, u32>,
    /// In rank order.
    merges: Vec<(String, String)>,
}

#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: Option<usize>,
    next: Option<usize>,
    alive: bool,
}

impl Merges {
    /// The merges of `model`, when it is one this module reproduces; `chars` maps bytes to
    /// their byte-level characters.
    pub(crate) fn new(model: &BPE, chars: &[char; 256]) -> Option<Merges> {
        let text = serde_json::to_string(model).ok()?;
        let wire: Wire = serde_json::from_str(&text).ok()?;
        drop(text);
        // An empty prefix or suffix (as Qwen's files write) changes nothing.
        let set = |s: &Option<String>| s.as_ref().is_some_and(|s| !s.is_empty());
        if wire.dropout.is_some()
            || set(&wire.continuing_subword_prefix)
            || set(&wire.end_of_word_suffix)
            || wire.ignore_merges
        {
            return None;
        }
        let vocab = &wire.vocab;
        let mut byte_ids = [0u32; 256];
        let mut buf = [0u8; 4];
        for (id, c) in byte_ids.iter_mut().zip(chars) {
            *id = *vocab.get(&*c.encode_utf8(&mut buf))?;
        }
        let mut table = Table::with_capacity_and_hasher(wire.merges.len(), Default::default());
        let mut joined = String::new();
        for (rank, (a, b)) in wire.merges.iter().enumerate() {
            joined.clear();
            joined.push_str(a);
            joined.push_str(b);
            let pair = (*vocab.get(a)?, *vocab.get(b)?);
            table.insert(pair, (u32::try_from(rank).ok()?, *vocab.get(&joined)?));
        }
        Some(Merges { byte_ids, table })
    }

    /// Appends the ids of the word whose raw bytes are `word`.
    pub(crate) fn extend(&self, word: &[u8], ids: &mut Vec<u32>) {
        let n = word.len();
        let mut symbols: Vec<Symbol> = word
            .iter()
            .enumerate()
            .map(|(i, b)| Symbol {
                id: self.byte_ids[usize::from(*b)],
                prev: i.checked_sub(1),
                next: (i + 1 < n).then_some(i + 1),
                alive: true,
            })
            .collect();
        // Min-heap on (rank, position): the lowest rank first, the leftmost among equals.
        let mut queue: BinaryHeap<Reverse<(u32, usize, u32)>> = symbols
            .windows(2)
            .enumerate()
            .filter_map(|(at, w)| {
                let &(rank, new) = self.table.get(&(w[0].id, w[1].id))?;
                Some(Reverse((rank, at, new)))
            })
            .collect();
        while let Some(Reverse((_, at, new))) = queue.pop() {
            let here = symbols[at];
            let Some(next) = here.next.filter(|_| here.alive) else {
                continue;
            };
            let right = symbols[next];
            // Stale: the pair here changed since this entry was queued.
            if self.table.get(&(here.id, right.id)).map(|m| m.1) != Some(new) {
                continue;
            }
            symbols[at].id = new;
            symbols[at].next = right.next;
            symbols[next].alive = false;
            if let Some(after) = right.next {
                symbols[after].prev = Some(at);
            }
            if let Some(before) = here.prev
                && let Some(&(rank, made)) = self.table.get(&(symbols[before].id, new))
            {
                queue.push(Reverse((rank, before, made)));
            }
            if let Some(after) = right.next
                && let Some(&(rank, made)) = self.table.get(&(new, symbols[after].id))
            {
                queue.push(Reverse((rank, at, made)));
            }
        }
        ids.extend(symbols.iter().filter(|s| s.alive).map(|s| s.id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use tokenizers::Model as _;

    /// A model over the 256 byte characters with merges that overlap, chain, and make the
    /// same token from two different pairs (the case where a queued entry can go stale yet
    /// still name the token the pair now makes).
    fn model() -> (BPE, [char; 256]) {
        let chars = crate::fast::byte_chars();
        let mut vocab: std::collections::HashMap<String, u32> = chars
            .iter()
            .enumerate()
            .map(|(i, c)| (c.to_string(), u32::try_from(i).unwrap()))
            .collect();
        let merges: Vec<(&str, &str)> = vec![
            ("a", "b"),
            ("b", "c"),
            ("a", "a"),
            ("ab", "c"),
            ("a", "bc"),
            ("aa", "a"),
            ("c", "a"),
            ("ca", "b"),
            ("abc", "abc"),
            ("aa", "aa"),
        ];
        for (a, b) in &merges {
            let next = u32::try_from(vocab.len()).unwrap();
            vocab.entry(format!("{a}{b}")).or_insert(next);
        }
        (built(&vocab, &merges, serde_json::json!({})), chars)
    }

    /// The library's model from its serialized form, `extra` fields added.
    fn built(
        vocab: &std::collections::HashMap<String, u32>,
        merges: &[(&str, &str)],
        extra: serde_json::Value,
    ) -> BPE {
        let mut model = serde_json::json!({"type": "BPE", "vocab": vocab, "merges": merges,
            "continuing_subword_prefix": "", "end_of_word_suffix": ""});
        if let (Some(m), Some(e)) = (model.as_object_mut(), extra.as_object()) {
            m.extend(e.clone());
        }
        serde_json::from_str(&model.to_string()).unwrap()
    }

    fn library(bpe: &BPE, chars: &[char; 256], word: &[u8]) -> Vec<u32> {
        let mapped: String = word.iter().map(|b| chars[usize::from(*b)]).collect();
        bpe.tokenize(&mapped)
            .unwrap()
            .into_iter()
            .map(|t| t.id)
            .collect()
    }

    proptest! {
        #[test]
        fn merges_on_ids_give_the_librarys_ids(word in "[abc]{0,40}|[abc ]{0,12}|\\PC{0,6}") {
            let (bpe, chars) = model();
            let merges = Merges::new(&bpe, &chars).unwrap();
            let mut ids = vec![u32::MAX];
            merges.extend(word.as_bytes(), &mut ids);
            let expected = library(&bpe, &chars, word.as_bytes());
            prop_assert_eq!(&ids[1..], expected.as_slice());
        }
    }

    #[test]
    fn models_it_does_not_reproduce_are_refused() {
        let (bpe, chars) = model();
        assert!(Merges::new(&bpe, &chars).is_some());
        let small = [("a".to_owned(), 0), ("b".to_owned(), 1)].into();
        let none = serde_json::json!({});
        assert!(
            Merges::new(&built(&small, &[], none), &chars).is_none(),
            "bytes missing"
        );
        let vocab = bpe.get_vocab();
        let prefixed = built(
            &vocab,
            &[],
            serde_json::json!({"continuing_subword_prefix": "##"}),
        );
        assert!(Merges::new(&prefixed, &chars).is_none(), "subword prefix");
        let ignoring = built(&vocab, &[], serde_json::json!({"ignore_merges": true}));
        assert!(Merges::new(&ignoring, &chars).is_none(), "ignore_merges");
    }
}
