//! Ids of words the fast route has encoded before, kept per thread.
//!
//! A chat prompt is mostly words seen many times over (the template's markup, role names,
//! common words); the BPE model merges each one again and hands its tokens back as one
//! `String` per token, which the fast route then drops for the ids. This cache keeps the ids.
//!
//! Invariants:
//! - An entry holds exactly the ids the BPE model gives for its word: the route that fills it
//!   has no dropout, so a word's ids never change, and a hit is the model's answer.
//! - Bounded per thread: at most [`TOKENIZERS_PER_THREAD`] tokenizers' caches, each of at
//!   most [`ENTRIES`] words of at most [`WORD_BYTES`] bytes; a full cache is emptied and
//!   refilled (what is hot comes back at once), and the least recently used tokenizer's cache
//!   is dropped for a new one. Nothing grows with what clients send.
//! - Per thread, so a lookup takes no lock; a cache lives and dies with its thread.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

/// Words kept per tokenizer per thread.
pub(crate) const ENTRIES: usize = 8192;
/// Longest word kept, in bytes: longer ones are rare repeats and costly to hold.
pub(crate) const WORD_BYTES: usize = 48;
/// Tokenizers whose caches a thread keeps (a router serves a few models).
pub(crate) const TOKENIZERS_PER_THREAD: usize = 4;

type Words = HashMap<Box<str>, Box<[u32]>, foldhash::fast::RandomState>;

thread_local! {
    /// Most recently used first.
    static CACHES: RefCell<Vec<(u64, Words)>> = const { RefCell::new(Vec::new()) };
}

static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// One tokenizer's share of every thread's cache.
pub(crate) struct WordCache {
    id: u64,
}

impl WordCache {
    pub(crate) fn new() -> WordCache {
        WordCache {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        }
    }

    /// Appends `word`'s ids to `ids`: the cached ones, or those `encode` appends (kept for
    /// next time when the word is short enough and `encode` succeeds).
    pub(crate) fn extend<E>(
        &self,
        word: &str,
        ids: &mut Vec<u32>,
        encode: impl FnOnce(&str, &mut Vec<u32>) -> Result<(), E>,
    ) -> Result<(), E> {
        if word.len() > WORD_BYTES {
            return encode(word, ids);
        }
        // Looked up and filled in two borrows: `encode` runs with the cache released.
        let hit = CACHES.with_borrow_mut(|caches| {
            let words = self.words(caches);
            words
                .get(word)
                .map(|hit| ids.extend_from_slice(hit))
                .is_some()
        });
        if hit {
            return Ok(());
        }
        let start = ids.len();
        encode(word, ids)?;
        CACHES.with_borrow_mut(|caches| {
            let words = self.words(caches);
            if words.len() >= ENTRIES {
                words.clear();
            }
            words.insert(word.into(), ids[start..].into());
        });
        Ok(())
    }

    /// This tokenizer's cache on this thread, moved to the front (made if missing, dropping
    /// the least recently used one beyond the bound).
    fn words<'a>(&self, caches: &'a mut Vec<(u64, Words)>) -> &'a mut Words {
        match caches.iter().position(|(id, _)| *id == self.id) {
            Some(0) => {}
            Some(at) => caches[..=at].rotate_right(1),
            None => {
                caches.truncate(TOKENIZERS_PER_THREAD - 1);
                caches.insert(0, (self.id, Words::default()));
            }
        }
        &mut caches[0].1
    }

    /// Words this tokenizer has cached on the calling thread.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        CACHES.with_borrow(|caches| {
            caches
                .iter()
                .find(|(id, _)| *id == self.id)
                .map_or(0, |(_, w)| w.len())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fake(word: &str, ids: &mut Vec<u32>) -> Result<(), ()> {
        ids.extend(word.bytes().map(u32::from));
        Ok(())
    }

    #[test]
    fn a_hit_gives_what_the_miss_encoded_without_encoding_again() {
        let cache = WordCache::new();
        let mut ids = vec![7];
        cache.extend("ab", &mut ids, fake).unwrap();
        cache
            .extend("ab", &mut ids, |_, _| -> Result<(), ()> {
                panic!("encoded again")
            })
            .unwrap();
        assert_eq!(ids, [7, 97, 98, 97, 98]);
    }

    #[test]
    fn failures_and_long_words_are_not_kept() {
        let cache = WordCache::new();
        let mut ids = Vec::new();
        assert!(cache.extend("x", &mut ids, |_, _| Err(())).is_err());
        let long = "y".repeat(WORD_BYTES + 1);
        cache.extend(&long, &mut ids, fake).unwrap();
        assert_eq!(cache.len(), 0);
        assert_eq!(ids.len(), WORD_BYTES + 1);
    }

    #[test]
    fn the_cache_stays_within_its_bounds() {
        let cache = WordCache::new();
        let mut ids = Vec::new();
        for i in 0..ENTRIES * 2 + 5 {
            cache.extend(&i.to_string(), &mut ids, fake).unwrap();
            assert!(cache.len() <= ENTRIES);
        }
        let others: Vec<WordCache> = (0..TOKENIZERS_PER_THREAD * 2)
            .map(|_| WordCache::new())
            .collect();
        for other in &others {
            other.extend("z", &mut ids, fake).unwrap();
        }
        CACHES.with_borrow(|c| assert_eq!(c.len(), TOKENIZERS_PER_THREAD));
        // The first one's cache was the least recently used: dropped.
        assert_eq!(cache.len(), 0);
        assert_eq!(others.last().unwrap().len(), 1);
    }
}
