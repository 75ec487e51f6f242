//! Reading a count tree: what a tree answers, whether it is live (a
//! [`CountTree`](super::CountTree), which takes writes and checkpoints) or
//! frozen (a [`FrozenTree`]: a small board's idle root leaf, packed,
//! kept without the live tree's bookkeeping).

use super::node::{check_node, child_ref, collect, collect_crowded, digit, prefetch_entries, NodeRef};
use super::packed::Unpacked;
use super::FrozenTree;

/// A tree's nodes and its branching, borrowed: every read of a tree.
#[derive(Debug, Clone, Copy)]
pub struct TreeView<'a> {
    root: Root<'a>,
    /// Key bits each level takes: log2 of the branching factor.
    pub(super) bits: u32,
}

/// Where a compact tree holds the keys of one tiebreak (see
/// [`TreeView::find_tiebreak`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TiebreakHeld {
    /// No key has it.
    Nowhere,
    /// One key has it, held by one player.
    Once(u128),
    /// More keys or players have it.
    More,
}

/// Where a read starts.
#[derive(Debug, Clone, Copy)]
enum Root<'a> {
    /// A live tree's root node.
    Node(NodeRef<'a>),
    /// A frozen tree: one leaf, packed, searched in place by a rank and a
    /// total, unpacked onto the stack by other reads.
    Frozen(&'a FrozenTree),
}

impl<'a> TreeView<'a> {
    /// The reads of a live tree whose root is `root`.
    pub(super) fn live(root: NodeRef<'a>, bits: u32) -> Self {
        Self { root: Root::Node(root), bits }
    }

    /// The reads of a frozen tree.
    pub(super) fn frozen(tree: &'a FrozenTree, bits: u32) -> Self {
        Self { root: Root::Frozen(tree), bits }
    }
}

impl TreeView<'_> {
    /// Runs `read` from the root node: a frozen tree's leaf unpacked onto
    /// the stack for it.
    pub(super) fn with_root<R>(&self, read: impl FnOnce(NodeRef<'_>) -> R) -> R {
        match self.root {
            Root::Node(root) => read(root),
            Root::Frozen(tree) => {
                let mut entries = Unpacked::new();
                tree.leaf().unpack_into(&mut entries);
                read(NodeRef::Leaf(&entries))
            }
        }
    }

    /// Whether the tree is still one sorted leaf of keys and counts (the
    /// compact form every small board has) rather than burst into nodes.
    pub fn is_compact(&self) -> bool {
        matches!(self.root, Root::Frozen(_) | Root::Node(NodeRef::Leaf(_)))
    }

    /// Number of players (sum of all counts): the root's, summed from at
    /// most [`LEAF_CAPACITY`](super::LEAF_CAPACITY) entries or 256 slots
    /// rather than stored.
    pub fn total(&self) -> u64 {
        match self.root {
            Root::Frozen(tree) => tree.leaf().total(),
            Root::Node(NodeRef::Leaf(entries)) => entries.iter().map(|e| e.count()).sum(),
            Root::Node(NodeRef::Inner(slots)) => slots.iter().map(|slot| slot.count).fold(0, u64::saturating_add),
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
        let root = match self.root {
            Root::Node(root) => root,
            // One leaf: its packed bytes (on the heap past 14 bytes).
            Root::Frozen(tree) => return prefetch_entries(tree.bytes()),
        };
        const GROUP: usize = 16;
        for group in keys.chunks(GROUP) {
            let mut nodes: [Option<NodeRef<'_>>; GROUP] = [None; GROUP];
            nodes[..group.len()].fill(Some(root));
            let mut depth = 0u32;
            loop {
                let mut walking = false;
                for (node, &key) in nodes.iter_mut().zip(group) {
                    match *node {
                        Some(NodeRef::Inner(slots)) => {
                            *node = child_ref(&slots[digit(key, depth, self.bits)]);
                            walking |= node.is_some();
                        }
                        Some(NodeRef::Leaf(entries)) => {
                            prefetch_entries(entries);
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
        let mut node = match self.root {
            Root::Node(root) => root,
            // Searched in place: a rank unpacks nothing.
            Root::Frozen(tree) => return tree.leaf().count_before(key),
        };
        let mut depth = 0u32;
        let mut before = 0u64;
        loop {
            match node {
                NodeRef::Leaf(entries) => {
                    prefetch_entries(entries);
                    let end = entries.partition_point(|e| e.key() < key);
                    return before + entries[..end].iter().map(|e| e.count()).sum::<u64>();
                }
                NodeRef::Inner(slots) => {
                    let d = digit(key, depth, self.bits);
                    before += slots[..d].iter().map(|slot| slot.count).sum::<u64>();
                    match child_ref(&slots[d]) {
                        Some(child) => node = child,
                        None => return before,
                    }
                    depth += 1;
                }
            }
        }
    }

    /// In a compact tree, where the keys whose low half is `tiebreak` are;
    /// `None` for a tree burst into nodes, where that would visit every leaf.
    /// A small board's leaf is a few entries: read in place, nothing unpacked.
    pub fn find_tiebreak(&self, tiebreak: u64) -> Option<TiebreakHeld> {
        let mut held = TiebreakHeld::Nowhere;
        let mut see = |key: u128, count: u64| {
            if key as u64 == tiebreak {
                held = match held {
                    TiebreakHeld::Nowhere if count == 1 => TiebreakHeld::Once(key),
                    _ => TiebreakHeld::More,
                };
            }
        };
        match self.root {
            Root::Frozen(tree) => {
                let leaf = tree.leaf();
                (0..leaf.len()).for_each(|i| see(leaf.key(i), leaf.count(i)));
            }
            Root::Node(NodeRef::Leaf(entries)) => entries.iter().for_each(|e| see(e.key(), e.count())),
            Root::Node(NodeRef::Inner(_)) => return None,
        }
        Some(held)
    }

    /// All `(key, count)` pairs in key order.
    pub fn entries(&self) -> Vec<(u128, u64)> {
        let mut out = Vec::new();
        self.with_root(|root| collect(root, &mut out));
        out
    }

    /// The keys held by at least `min` players, in key order: found without
    /// visiting the sub-ranges that hold fewer.
    pub fn crowded_keys(&self, min: u64) -> Vec<u128> {
        let mut out = Vec::new();
        if self.total() >= min {
            self.with_root(|root| collect_crowded(root, min, &mut out));
        }
        out
    }

    /// Verifies every inner count equals the sum below it and every leaf is
    /// sorted, in range and positive. Used by tests and `rankd check`.
    pub fn check(&self) -> Result<(), String> {
        self.with_root(|root| check_node(root, self.bits, 0, 0).map(|_| ()))
    }
}
