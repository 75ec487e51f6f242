//! Reading a count tree: what a tree answers, whether it is live (a
//! [`CountTree`](super::CountTree), which takes writes and checkpoints) or
//! frozen (a [`FrozenTree`](super::FrozenTree): a small board's idle root
//! leaf kept without the live tree's bookkeeping).

use super::node::{check_node, collect, collect_crowded, digit, prefetch_entries, Node};

/// A tree's nodes and its branching, borrowed: every read of a tree.
#[derive(Debug, Clone, Copy)]
pub struct TreeView<'a> {
    pub(super) root: &'a Node,
    /// Key bits each level takes: log2 of the branching factor.
    pub(super) bits: u32,
}

impl TreeView<'_> {
    /// Whether the tree is still one sorted leaf of keys and counts (the
    /// compact form every small board has) rather than burst into nodes.
    pub fn is_compact(&self) -> bool {
        matches!(self.root, Node::Leaf(_))
    }

    /// Number of players (sum of all counts): the root's, summed from at
    /// most [`LEAF_CAPACITY`](super::LEAF_CAPACITY) entries or 256 slots
    /// rather than stored.
    pub fn total(&self) -> u64 {
        match self.root {
            Node::Leaf(leaf) => leaf.entries.iter().map(|e| e.count()).sum(),
            Node::Inner(slots) => slots.iter().map(|slot| slot.count).fold(0, u64::saturating_add),
        }
    }

    /// Starts loading the leaf that holds `key` into the CPU cache, so a
    /// [`CountTree::add`](super::CountTree::add) of it soon after does not
    /// wait for memory. A score change removes one key and adds another, in
    /// leaves far apart: asking for the second leaf first overlaps the two
    /// waits.
    pub fn prefetch(&self, key: u128) {
        self.prefetch_many(std::slice::from_ref(&key));
    }

    /// Starts loading the leaves that hold `keys` into the CPU cache, the
    /// paths walked side by side a level at a time: each level's nodes are
    /// independent loads, so their waits for memory overlap, where walking
    /// one path after another waits for every node in turn.
    pub fn prefetch_many(&self, keys: &[u128]) {
        const GROUP: usize = 16;
        for group in keys.chunks(GROUP) {
            let mut nodes: [Option<&Node>; GROUP] = [None; GROUP];
            nodes[..group.len()].fill(Some(self.root));
            let mut depth = 0u32;
            loop {
                let mut walking = false;
                for (node, &key) in nodes.iter_mut().zip(group) {
                    match *node {
                        Some(Node::Inner(slots)) => {
                            *node = slots[digit(key, depth, self.bits)].child.as_ref();
                            walking |= node.is_some();
                        }
                        Some(Node::Leaf(leaf)) => {
                            prefetch_entries(&leaf.entries);
                            *node = None;
                        }
                        None => {}
                    }
                }
                if !walking {
                    break;
                }
                depth += 1;
            }
        }
    }

    /// How many players have a key strictly less than `key` (rank before it).
    pub fn count_before(&self, key: u128) -> u64 {
        let mut node = self.root;
        let mut depth = 0u32;
        let mut before = 0u64;
        loop {
            match node {
                Node::Leaf(leaf) => {
                    prefetch_entries(&leaf.entries);
                    let end = leaf.entries.partition_point(|e| e.key() < key);
                    return before + leaf.entries[..end].iter().map(|e| e.count()).sum::<u64>();
                }
                Node::Inner(slots) => {
                    let d = digit(key, depth, self.bits);
                    before += slots[..d].iter().map(|slot| slot.count).sum::<u64>();
                    match &slots[d].child {
                        Some(child) => node = child,
                        None => return before,
                    }
                    depth += 1;
                }
            }
        }
    }

    /// All `(key, count)` pairs in key order.
    pub fn entries(&self) -> Vec<(u128, u64)> {
        let mut out = Vec::new();
        collect(self.root, &mut out);
        out
    }

    /// The keys held by at least `min` players, in key order: found without
    /// visiting the sub-ranges that hold fewer.
    pub fn crowded_keys(&self, min: u64) -> Vec<u128> {
        let mut out = Vec::new();
        if self.total() >= min {
            collect_crowded(self.root, min, &mut out);
        }
        out
    }

    /// Verifies every inner count equals the sum below it and every leaf is
    /// sorted, in range and positive. Used by tests and `rankd check`.
    pub fn check(&self) -> Result<(), String> {
        check_node(self.root, self.bits, 0, 0).map(|_| ())
    }
}
