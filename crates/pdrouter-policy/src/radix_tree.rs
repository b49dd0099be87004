//! Approximate radix tree over request text, shared by all workers ("tenants").
//!
//! One tree holds the text every worker was committed; each node records which tenants hold the
//! prefix ending at that node and, per tenant, the logical tick of its last insert through it.
//! It is "approximate" because it records what the router sent, not what the worker's KV cache
//! really kept.
//!
//! Invariants:
//! - Node 0 is the root: empty edge, no tenants, never freed.
//! - Every other live node has a non-empty edge and at least one tenant. A freed node has an
//!   empty edge, no tenants and no children (that is how an arena scan tells them apart).
//! - A node's children are sorted by the first char of their edges, and those chars are distinct.
//! - Tenant sets are ancestor-closed: a tenant holding a node holds its parent (unless the parent
//!   is the root). So a tenant's matched prefix is the depth of the deepest path node it holds,
//!   and a node without tenants has no children.
//! - A tenant's tick on a node is >= its tick on every descendant (an insert stamps the whole
//!   path with one fresh tick), so evicting least-recently-used leaves never strands a hot path.
//! - `chars[t]` is the sum of `edge_chars` over the nodes `t` holds: the size of `t`'s own tree.
//! - Lengths are counted in chars (Unicode scalar values), never bytes; edges split only on char
//!   boundaries.
//! - Ticks come from a logical counter bumped per insert; no clock is read.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use crate::registry::WorkerId;

type NodeId = u32;
const ROOT: NodeId = 0;

#[derive(Debug, Default)]
struct Node {
    parent: NodeId,
    edge: String,
    edge_chars: usize,
    /// Sorted by first char of the child's edge.
    children: Vec<(char, NodeId)>,
    /// Sorted by tenant id: `(tenant, last access tick)`.
    tenants: Vec<(WorkerId, u64)>,
}

impl Node {
    fn holds(&self, t: WorkerId) -> bool {
        self.tick_of(t).is_some()
    }

    fn tick_of(&self, t: WorkerId) -> Option<u64> {
        let i = self.tenants.binary_search_by_key(&t, |e| e.0).ok()?;
        Some(self.tenants[i].1)
    }
}

/// The shared tree. See the module docs for its invariants.
#[derive(Debug)]
pub(crate) struct RadixTree {
    nodes: Vec<Node>,
    free: Vec<NodeId>,
    /// By tenant id: chars held.
    chars: Vec<usize>,
    tick: u64,
}

impl Default for RadixTree {
    fn default() -> Self {
        Self {
            nodes: vec![Node::default()],
            free: Vec::new(),
            chars: Vec::new(),
            tick: 0,
        }
    }
}

/// Length of the common prefix of `edge` and `text` as `(bytes, chars)`; `bytes` is a char
/// boundary of both. `edge_chars` is `edge`'s char count (saves a recount on a full match).
fn common_prefix(edge: &str, text: &str, edge_chars: usize) -> (usize, usize) {
    let mut n = edge
        .bytes()
        .zip(text.bytes())
        .take_while(|(a, b)| a == b)
        .count();
    if n == edge.len() {
        return (n, edge_chars);
    }
    // Identical bytes up to a char boundary of `edge` decode identically in `text`.
    while !edge.is_char_boundary(n) {
        n -= 1;
    }
    (n, edge[..n].chars().count())
}

impl RadixTree {
    /// Characters tenant `t` holds.
    pub(crate) fn tenant_chars(&self, t: WorkerId) -> usize {
        self.chars.get(t as usize).copied().unwrap_or(0)
    }

    /// Number of live nodes, root included.
    pub(crate) fn node_count(&self) -> usize {
        self.nodes.len() - self.free.len()
    }

    fn child(&self, node: NodeId, c: char) -> Option<NodeId> {
        let children = &self.nodes[node as usize].children;
        let i = children.binary_search_by_key(&c, |e| e.0).ok()?;
        Some(children[i].1)
    }

    fn first_char(&self, node: NodeId) -> char {
        self.nodes[node as usize]
            .edge
            .chars()
            .next()
            .unwrap_or_default()
    }

    fn alloc(&mut self, node: Node) -> NodeId {
        match self.free.pop() {
            Some(id) => {
                self.nodes[id as usize] = node;
                id
            }
            None => {
                let id = NodeId::try_from(self.nodes.len()).expect("fewer than 2^32 nodes");
                self.nodes.push(node);
                id
            }
        }
    }

    /// Inserts `text` for tenant `t`, stamping the whole path with a fresh tick.
    pub(crate) fn insert(&mut self, text: &str, t: WorkerId) {
        if self.chars.len() <= t as usize {
            self.chars.resize(t as usize + 1, 0);
        }
        self.tick += 1;
        let tick = self.tick;
        let mut node = ROOT;
        let mut rest = text;
        while let Some(c) = rest.chars().next() {
            let Some(child) = self.child(node, c) else {
                let edge_chars = rest.chars().count();
                let leaf = self.alloc(Node {
                    parent: node,
                    edge: rest.to_owned(),
                    edge_chars,
                    children: Vec::new(),
                    tenants: vec![(t, tick)],
                });
                let children = &mut self.nodes[node as usize].children;
                let at = children.partition_point(|e| e.0 < c);
                children.insert(at, (c, leaf));
                self.chars[t as usize] += edge_chars;
                return;
            };
            let n = &self.nodes[child as usize];
            let (bytes, chars) = common_prefix(&n.edge, rest, n.edge_chars);
            let child = if bytes < n.edge.len() {
                self.split(child, bytes, chars)
            } else {
                child
            };
            self.touch(child, t, tick);
            rest = &rest[bytes..];
            node = child;
        }
    }

    /// Splits `node`'s edge after `bytes` (= `chars` chars, 0 < chars < edge_chars); returns the
    /// new upper node, which takes `node`'s place under its parent.
    fn split(&mut self, node: NodeId, bytes: usize, chars: usize) -> NodeId {
        let n = &mut self.nodes[node as usize];
        let tail = n.edge.split_off(bytes);
        let head = std::mem::replace(&mut n.edge, tail);
        n.edge_chars -= chars;
        let parent = n.parent;
        let tenants = n.tenants.clone();
        let tail_first = n.edge.chars().next().unwrap_or_default();
        let head_first = head.chars().next().unwrap_or_default();
        let mid = self.alloc(Node {
            parent,
            edge: head,
            edge_chars: chars,
            children: vec![(tail_first, node)],
            tenants,
        });
        self.nodes[node as usize].parent = mid;
        let siblings = &mut self.nodes[parent as usize].children;
        if let Ok(i) = siblings.binary_search_by_key(&head_first, |e| e.0) {
            siblings[i].1 = mid;
        }
        mid
    }

    fn touch(&mut self, node: NodeId, t: WorkerId, tick: u64) {
        let n = &mut self.nodes[node as usize];
        match n.tenants.binary_search_by_key(&t, |e| e.0) {
            Ok(i) => n.tenants[i].1 = tick,
            Err(i) => {
                n.tenants.insert(i, (t, tick));
                self.chars[t as usize] += n.edge_chars;
            }
        }
    }

    /// Collects the nodes on `text`'s path, each with the chars matched through it (a final
    /// partially matched edge counts its matched part). Clears `path` first.
    pub(crate) fn match_path(&self, text: &str, path: &mut Vec<(NodeId, usize)>) {
        path.clear();
        let mut node = ROOT;
        let mut rest = text;
        let mut depth = 0;
        while let Some(c) = rest.chars().next() {
            let Some(child) = self.child(node, c) else {
                break;
            };
            let n = &self.nodes[child as usize];
            let (bytes, chars) = common_prefix(&n.edge, rest, n.edge_chars);
            depth += chars;
            path.push((child, depth));
            if bytes < n.edge.len() {
                break;
            }
            rest = &rest[bytes..];
            node = child;
        }
    }

    /// Tenants (with ticks) holding `node`, sorted by id.
    pub(crate) fn tenants(&self, node: NodeId) -> &[(WorkerId, u64)] {
        &self.nodes[node as usize].tenants
    }

    /// Chars of `text` matched by tenant `t`'s tree.
    #[cfg(test)]
    pub(crate) fn prefix_match(&self, text: &str, t: WorkerId) -> usize {
        let mut path = Vec::new();
        self.match_path(text, &mut path);
        path.iter()
            .rev()
            .find(|&&(n, _)| self.nodes[n as usize].holds(t))
            .map_or(0, |&(_, d)| d)
    }

    fn is_leaf_for(&self, node: NodeId, t: WorkerId) -> bool {
        self.nodes[node as usize]
            .children
            .iter()
            .all(|&(_, c)| !self.nodes[c as usize].holds(t))
    }

    /// Trims every tenant to at most `max` chars, least-recently-used leaves first.
    pub(crate) fn evict(&mut self, max: usize) {
        let over: Vec<bool> = self.chars.iter().map(|&c| c > max).collect();
        if !over.contains(&true) {
            return;
        }
        let mut heaps: Vec<BinaryHeap<Reverse<(u64, NodeId)>>> =
            over.iter().map(|_| BinaryHeap::new()).collect();
        for id in 1..self.nodes.len() {
            let id = id as NodeId;
            for &(t, tick) in &self.nodes[id as usize].tenants {
                if over[t as usize] && self.is_leaf_for(id, t) {
                    heaps[t as usize].push(Reverse((tick, id)));
                }
            }
        }
        for (t, heap) in heaps.into_iter().enumerate() {
            if over[t] {
                self.drain(t as WorkerId, max, heap);
            }
        }
    }

    /// Trims tenant `t` to at most `max` chars, least-recently-used leaves first.
    pub(crate) fn evict_tenant(&mut self, t: WorkerId, max: usize) {
        if self.tenant_chars(t) <= max {
            return;
        }
        let mut heap = BinaryHeap::new();
        for id in 1..self.nodes.len() {
            let id = id as NodeId;
            if let Some(tick) = self.nodes[id as usize].tick_of(t)
                && self.is_leaf_for(id, t)
            {
                heap.push(Reverse((tick, id)));
            }
        }
        self.drain(t, max, heap);
    }

    /// Pops `t`-leaves (oldest first) until `t` holds at most `max` chars; a parent that becomes
    /// a `t`-leaf joins the heap.
    fn drain(&mut self, t: WorkerId, max: usize, mut heap: BinaryHeap<Reverse<(u64, NodeId)>>) {
        while self.chars[t as usize] > max {
            let Some(Reverse((_, id))) = heap.pop() else {
                break;
            };
            let n = &mut self.nodes[id as usize];
            let Ok(i) = n.tenants.binary_search_by_key(&t, |e| e.0) else {
                continue;
            };
            n.tenants.remove(i);
            self.chars[t as usize] -= n.edge_chars;
            let parent = n.parent;
            if n.tenants.is_empty() {
                self.detach(id);
                self.release(id);
            }
            if parent != ROOT
                && let Some(tick) = self.nodes[parent as usize].tick_of(t)
                && self.is_leaf_for(parent, t)
            {
                heap.push(Reverse((tick, parent)));
            }
        }
    }

    /// Removes `node` from its parent's child list (if still there).
    fn detach(&mut self, node: NodeId) {
        let c = self.first_char(node);
        let parent = self.nodes[node as usize].parent;
        let siblings = &mut self.nodes[parent as usize].children;
        if let Ok(i) = siblings.binary_search_by_key(&c, |e| e.0)
            && siblings[i].1 == node
        {
            siblings.remove(i);
        }
    }

    fn release(&mut self, node: NodeId) {
        debug_assert!(node != ROOT);
        self.nodes[node as usize] = Node::default();
        self.free.push(node);
    }

    /// Forgets tenant `t` everywhere, freeing nodes nobody else holds.
    pub(crate) fn remove_tenant(&mut self, t: WorkerId) {
        if self.tenant_chars(t) == 0 {
            return;
        }
        let mut emptied = Vec::new();
        for id in 1..self.nodes.len() {
            let n = &mut self.nodes[id];
            if let Ok(i) = n.tenants.binary_search_by_key(&t, |e| e.0) {
                n.tenants.remove(i);
                if n.tenants.is_empty() {
                    emptied.push(id as NodeId);
                }
            }
        }
        // Detach everything before releasing anything: a released parent loses its child list.
        for &id in &emptied {
            self.detach(id);
        }
        for id in emptied {
            self.release(id);
        }
        self.chars[t as usize] = 0;
    }

    /// Panics if any module invariant is broken.
    #[cfg(test)]
    pub(crate) fn check_invariants(&self) {
        let root = &self.nodes[ROOT as usize];
        assert!(root.edge.is_empty() && root.tenants.is_empty());
        let mut chars = vec![0usize; self.chars.len()];
        let free: std::collections::HashSet<NodeId> = self.free.iter().copied().collect();
        assert_eq!(free.len(), self.free.len(), "free list has duplicates");
        let mut reachable = 1;
        let mut stack = vec![ROOT];
        while let Some(id) = stack.pop() {
            let n = &self.nodes[id as usize];
            assert!(
                n.children.windows(2).all(|w| w[0].0 < w[1].0),
                "children unsorted"
            );
            assert!(
                n.tenants.windows(2).all(|w| w[0].0 < w[1].0),
                "tenants unsorted"
            );
            for &(c, child) in &n.children {
                reachable += 1;
                let ch = &self.nodes[child as usize];
                assert!(!free.contains(&child), "freed node reachable");
                assert_eq!(ch.parent, id);
                assert_eq!(ch.edge.chars().next(), Some(c));
                assert_eq!(ch.edge.chars().count(), ch.edge_chars);
                assert!(!ch.tenants.is_empty(), "live node without tenants");
                for &(t, tick) in &ch.tenants {
                    chars[t as usize] += ch.edge_chars;
                    if id != ROOT {
                        let parent_tick = n.tick_of(t).expect("tenant sets ancestor-closed");
                        assert!(parent_tick >= tick, "parent tick older than child");
                    }
                }
                stack.push(child);
            }
        }
        assert_eq!(
            reachable,
            self.node_count(),
            "leaked or double-counted nodes"
        );
        for &id in &self.free {
            let n = &self.nodes[id as usize];
            assert!(n.edge.is_empty() && n.tenants.is_empty() && n.children.is_empty());
        }
        assert_eq!(chars, self.chars, "per-tenant char counts drifted");
    }
}

#[cfg(test)]
mod tests;
