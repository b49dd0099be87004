//! Approximate radix tree over the request text committed to one worker.
//!
//! cache_aware keeps one tree per worker. It is "approximate" because it records what the router
//! sent, not what the worker's KV cache really kept. Nodes live in an arena and are threaded on a
//! recency list, so evicting the least-recently-used leaf costs O(1) and no operation scans the
//! tree.
//!
//! Invariants:
//! - Node 0 is the root: empty edge, never freed, never on the recency list.
//! - Every other live node has a non-empty edge and is on the recency list; a freed node has an
//!   empty edge and no children and is on neither the tree nor the list.
//! - A node's children are sorted by the first char of their edges, and those chars are distinct.
//! - Recency order: every node is older on the list than its parent. An insert moves its whole
//!   path to the new end, deepest node oldest, and a split places the new upper node just newer
//!   than the lower one. So the oldest node is always a leaf, and evicting from the old end never
//!   strands a hot path.
//! - `chars` is the sum of `edge_chars` over the live nodes: the size of the tree.
//! - Lengths are counted in chars (Unicode scalar values), never bytes; edges split only on char
//!   boundaries.
//! - No clock is read: recency is insertion order.
//! - Every edge holds valid UTF-8 (it is cut from a `&str` at char boundaries only).
//!
//! Layout: a node is one 64-byte cache line. An edge of up to [`INLINE_EDGE`] bytes and up to
//! [`INLINE_CHILDREN`] children live in the node itself; only longer edges and wider nodes
//! point elsewhere. Trees are large (up to `max_tree_size` chars per worker) and every rank
//! walks one per candidate, so the walk is bound by cache misses, not instructions: with the
//! edge and the children behind their own pointers a level cost three misses, now usually one.

use smallvec::SmallVec;

type NodeId = u32;
const ROOT: NodeId = 0;
/// "No node" in the recency links.
const NIL: NodeId = NodeId::MAX;
/// Longest edge, in bytes, kept inside its node.
const INLINE_EDGE: usize = 16;
/// Most children kept inside their node.
const INLINE_CHILDREN: usize = 2;

/// An edge's text as UTF-8 bytes (see the module invariants).
type Edge = SmallVec<[u8; INLINE_EDGE]>;

#[derive(Debug)]
#[repr(align(64))]
struct Node {
    parent: NodeId,
    /// Recency list neighbours (`NIL` at the ends).
    older: NodeId,
    newer: NodeId,
    /// At most `MAX_INDEXED_CHARS`: texts are cut to that before they reach a tree.
    edge_chars: u32,
    edge: Edge,
    /// Sorted by first char of the child's edge.
    children: SmallVec<[(char, NodeId); INLINE_CHILDREN]>,
}

const _: () = assert!(
    std::mem::size_of::<Node>() == 64,
    "a node is one cache line"
);

impl Node {
    fn new(parent: NodeId, edge: &[u8], edge_chars: usize) -> Self {
        Node {
            parent,
            older: NIL,
            newer: NIL,
            edge_chars: chars_u32(edge_chars),
            edge: Edge::from_slice(edge),
            children: SmallVec::new(),
        }
    }

    fn edge_chars(&self) -> usize {
        self.edge_chars as usize
    }
}

/// A char count as stored in a node: an edge is part of one text, and texts are cut to
/// `MAX_INDEXED_CHARS` before they reach a tree, so the saturation is never reached.
fn chars_u32(chars: usize) -> u32 {
    u32::try_from(chars).unwrap_or(u32::MAX)
}

/// One worker's tree. See the module docs for its invariants.
#[derive(Debug)]
pub(crate) struct RadixTree {
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    chars: usize,
    oldest: NodeId,
    newest: NodeId,
}

impl Default for RadixTree {
    fn default() -> Self {
        Self {
            nodes: vec![Node::new(ROOT, b"", 0)],
            free: Vec::new(),
            chars: 0,
            oldest: NIL,
            newest: NIL,
        }
    }
}

/// Whether byte `b` starts a char (is not a UTF-8 continuation byte).
fn starts_char(b: u8) -> bool {
    (b as i8) >= -0x40
}

/// Length of the common prefix of `edge` and `text` as `(bytes, chars)`; `bytes` is a char
/// boundary of both. `edge_chars` is `edge`'s char count (saves a recount on a full match).
fn common_prefix(edge: &[u8], text: &str, edge_chars: usize) -> (usize, usize) {
    let mut n = common_bytes(edge, text.as_bytes());
    if n == edge.len() {
        return (n, edge_chars);
    }
    // Identical bytes up to a char boundary of `edge` decode identically in `text`.
    while !starts_char(edge[n]) {
        n -= 1;
    }
    (n, edge[..n].iter().filter(|&&b| starts_char(b)).count())
}

/// The first char of a non-empty UTF-8 edge (NUL for an empty one).
fn first_char(edge: &[u8]) -> char {
    let width = match edge.first() {
        None => return char::default(),
        Some(0..=0x7f) => 1,
        Some(0xc0..=0xdf) => 2,
        Some(0xe0..=0xef) => 3,
        Some(_) => 4,
    };
    std::str::from_utf8(&edge[..width.min(edge.len())])
        .ok()
        .and_then(|s| s.chars().next())
        .unwrap_or_default()
}

/// Length of the common prefix of two byte strings. Compares eight bytes at a time: every
/// candidate's tree is matched on every rank, so this is the policy's inner loop.
fn common_bytes(a: &[u8], b: &[u8]) -> usize {
    let len = a.len().min(b.len());
    let mut n = 0;
    while n + 8 <= len {
        let x = u64::from_le_bytes(a[n..n + 8].try_into().unwrap_or_default());
        let y = u64::from_le_bytes(b[n..n + 8].try_into().unwrap_or_default());
        let diff = x ^ y;
        if diff != 0 {
            return n + (diff.trailing_zeros() / 8) as usize;
        }
        n += 8;
    }
    n + a[n..len]
        .iter()
        .zip(&b[n..len])
        .take_while(|(x, y)| x == y)
        .count()
}

impl RadixTree {
    /// Characters the tree holds.
    pub(crate) fn chars(&self) -> usize {
        self.chars
    }

    /// Number of live nodes, root included.
    #[cfg(test)]
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    fn child(&self, node: NodeId, c: char) -> Option<NodeId> {
        let children = &self.nodes[node as usize].children;
        let i = children.binary_search_by_key(&c, |e| e.0).ok()?;
        Some(children[i].1)
    }

    fn alloc(&mut self, node: Node) -> NodeId {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                let id = NodeId::try_from(self.nodes.len())
                    .ok()
                    .filter(|&id| id != NIL)
                    .expect("fewer than 2^32 - 1 nodes");
                self.nodes.push(node);
                id
            }
        }
    }

    /// Takes `node` off the recency list.
    fn unlink(&mut self, node: NodeId) {
        let Node { older, newer, .. } = self.nodes[node as usize];
        match older {
            NIL => self.oldest = newer,
            o => self.nodes[o as usize].newer = newer,
        }
        match newer {
            NIL => self.newest = older,
            n => self.nodes[n as usize].older = older,
        }
        let n = &mut self.nodes[node as usize];
        n.older = NIL;
        n.newer = NIL;
    }

    /// Puts an unlinked `node` on the recency list just older than `before`, or at the new end
    /// when `before` is `NIL`.
    fn link_before(&mut self, node: NodeId, before: NodeId) {
        let older = match before {
            NIL => self.newest,
            b => self.nodes[b as usize].older,
        };
        {
            let n = &mut self.nodes[node as usize];
            n.older = older;
            n.newer = before;
        }
        match older {
            NIL => self.oldest = node,
            o => self.nodes[o as usize].newer = node,
        }
        match before {
            NIL => self.newest = node,
            b => self.nodes[b as usize].older = node,
        }
    }

    /// Inserts `text`, making its whole path the most recently used.
    pub(crate) fn insert(&mut self, text: &str) {
        let mut node = ROOT;
        // The path node just touched: the next (deeper) one goes just older than it.
        let mut above = NIL;
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let Some(child) = self.child(node, c) else {
                let edge_chars = rest.chars().count();
                let leaf = self.alloc(Node::new(node, rest.as_bytes(), edge_chars));
                let children = &mut self.nodes[node as usize].children;
                let at = children.partition_point(|e| e.0 < c);
                children.insert(at, (c, leaf));
                self.link_before(leaf, above);
                self.chars += edge_chars;
                return;
            };
            let n = &self.nodes[child as usize];
            let (bytes, chars) = common_prefix(&n.edge, rest, n.edge_chars());
            let child = if bytes < n.edge.len() {
                self.split(child, bytes, chars)
            } else {
                self.unlink(child);
                child
            };
            self.link_before(child, above);
            above = child;
            rest = &rest[bytes..];
            node = child;
        }
    }

    /// Splits `node`'s edge after `bytes` (= `chars` chars, 0 < chars < edge_chars); returns the
    /// new upper node, which takes `node`'s place under its parent. The upper node is returned
    /// unlinked (the caller places it on the recency list, newer than `node`).
    fn split(&mut self, node: NodeId, bytes: usize, chars: usize) -> NodeId {
        let n = &mut self.nodes[node as usize];
        // Both halves copied: each lands inside its node when short enough.
        let mut upper = Node::new(n.parent, &n.edge[..bytes], chars);
        n.edge = Edge::from_slice(&n.edge[bytes..]);
        n.edge_chars -= chars_u32(chars);
        let parent = n.parent;
        let head_first = first_char(&upper.edge);
        upper.children.push((first_char(&n.edge), node));
        let mid = self.alloc(upper);
        self.nodes[node as usize].parent = mid;
        let siblings = &mut self.nodes[parent as usize].children;
        if let Ok(i) = siblings.binary_search_by_key(&head_first, |e| e.0) {
            siblings[i].1 = mid;
        }
        mid
    }

    /// Chars of `text` matched by the tree: the longest common prefix of `text` and anything
    /// inserted (and not evicted since).
    pub(crate) fn match_len(&self, text: &str) -> usize {
        let mut node = ROOT;
        let mut rest = text;
        let mut depth = 0;
        while let Some(c) = rest.chars().next() {
            let Some(child) = self.child(node, c) else {
                break;
            };
            let n = &self.nodes[child as usize];
            let (bytes, chars) = common_prefix(&n.edge, rest, n.edge_chars());
            depth += chars;
            if bytes < n.edge.len() {
                break;
            }
            rest = &rest[bytes..];
            node = child;
        }
        depth
    }

    /// Evicts least-recently-used leaves until the tree holds at most `max` chars or `budget`
    /// nodes were removed; returns whether it is within `max`.
    pub(crate) fn evict(&mut self, max: usize, budget: usize) -> bool {
        for _ in 0..budget {
            if self.chars <= max {
                return true;
            }
            self.evict_oldest();
        }
        self.chars <= max
    }

    /// Removes the least-recently-used node, which is a leaf (module docs).
    fn evict_oldest(&mut self) {
        let id = self.oldest;
        if id == NIL {
            return;
        }
        debug_assert!(self.nodes[id as usize].children.is_empty());
        self.unlink(id);
        let c = first_char(&self.nodes[id as usize].edge);
        let n = &mut self.nodes[id as usize];
        let (parent, edge_chars) = (n.parent, n.edge_chars());
        n.edge = Edge::new();
        n.edge_chars = 0;
        let siblings = &mut self.nodes[parent as usize].children;
        if let Ok(i) = siblings.binary_search_by_key(&c, |e| e.0) {
            siblings.remove(i);
        }
        self.chars -= edge_chars;
        self.free.push(id);
    }

    /// Panics if any module invariant is broken.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let root = &self.nodes[ROOT as usize];
        assert!(root.edge.is_empty());
        assert!(root.older == NIL && root.newer == NIL, "root on the list");
        let free: std::collections::HashSet<NodeId> = self.free.iter().copied().collect();
        assert_eq!(free.len(), self.free.len(), "free list has duplicates");
        // Recency positions, oldest first.
        let mut rank = std::collections::HashMap::new();
        let (mut cur, mut prev) = (self.oldest, NIL);
        while cur != NIL {
            assert_eq!(self.nodes[cur as usize].older, prev, "broken back link");
            assert!(rank.insert(cur, rank.len()).is_none(), "list cycle");
            (prev, cur) = (cur, self.nodes[cur as usize].newer);
        }
        assert_eq!(self.newest, prev);
        let mut chars = 0;
        let mut stack = vec![ROOT];
        while let Some(id) = stack.pop() {
            let n = &self.nodes[id as usize];
            assert!(
                n.children.windows(2).all(|w| w[0].0 < w[1].0),
                "children unsorted"
            );
            for &(c, child) in &n.children {
                let ch = &self.nodes[child as usize];
                assert!(!free.contains(&child), "freed node reachable");
                assert_eq!(ch.parent, id);
                let edge = std::str::from_utf8(&ch.edge).expect("edges are UTF-8");
                assert_eq!(edge.chars().next(), Some(c));
                assert_eq!(first_char(&ch.edge), c);
                assert_eq!(edge.chars().count(), ch.edge_chars());
                chars += ch.edge_chars();
                let pos = rank.get(&child).expect("live node on the list");
                if id != ROOT {
                    assert!(pos < &rank[&id], "child newer than its parent");
                }
                stack.push(child);
            }
        }
        assert_eq!(rank.len() + 1, self.node_count(), "leaked nodes");
        for &id in &self.free {
            let n = &self.nodes[id as usize];
            assert!(n.edge.is_empty() && n.children.is_empty());
        }
        assert_eq!(chars, self.chars, "char count drifted");
    }
}

#[cfg(test)]
mod tests;
