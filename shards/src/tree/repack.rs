//! Repacking: moving leaves to fresh allocations, a few at a time, so the
//! allocator can give back the memory their old places pinned.

use super::entries::Entries;
use super::node::{leaves_from, Node};
use super::{CountTree, FrozenTree};

/// What a step of [`CountTree::repack`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Repacked {
    /// Leaves looked at.
    pub visited: usize,
    /// Of those, leaves moved to a fresh allocation.
    pub moved: usize,
}

impl CountTree {
    /// Visits up to `budget` leaves, in key order from the first whose
    /// sub-range starts at or after `from`, and moves each that `should_move`
    /// picks (given the address of its entries) to a fresh allocation of the
    /// same capacity. Returns what it did and where the next step starts
    /// (`None`: the walk reached the end of the tree). The tree may change
    /// between steps; leaves that appear behind the cursor are new
    /// allocations anyway.
    ///
    /// Why move memory that is in use: leaves grow through the allocator's
    /// size classes together and leave stragglers that pin mostly empty
    /// slabs. An allocator that hands out its oldest slabs' free slots first
    /// (jemalloc) packs moved leaves into them, and the slabs left empty go
    /// back to the OS. Which leaves are worth moving only the allocator
    /// knows, hence `should_move`. See `Shard::repack_step`.
    pub fn repack(
        &mut self,
        from: u128,
        budget: usize,
        should_move: impl FnMut(*const u8) -> bool,
    ) -> (Repacked, Option<u128>) {
        repack_node(&mut self.root, self.bits, from, budget, should_move)
    }
}

impl FrozenTree {
    /// [`CountTree::repack`] of the one leaf: the walk starts at key 0 and
    /// ends after it.
    pub fn repack(
        &mut self,
        budget: usize,
        mut should_move: impl FnMut(*const u8) -> bool,
    ) -> (Repacked, Option<u128>) {
        if budget == 0 {
            return (Repacked::default(), Some(0));
        }
        let moved = self.address().is_some_and(&mut should_move);
        if moved {
            self.move_buffer();
        }
        (Repacked { visited: 1, moved: usize::from(moved) }, None)
    }
}

/// Moves `entries` to a fresh allocation of the same capacity.
fn move_entries(entries: &mut Entries) {
    let mut fresh = Vec::with_capacity(entries.capacity());
    fresh.extend_from_slice(entries);
    *entries = fresh.into();
}

/// [`CountTree::repack`] of the tree under `root`.
fn repack_node(
    root: &mut Node,
    bits: u32,
    from: u128,
    budget: usize,
    mut should_move: impl FnMut(*const u8) -> bool,
) -> (Repacked, Option<u128>) {
    let (mut left, mut done) = (budget, Repacked::default());
    let next = leaves_from(root, bits, 0, 0, from, &mut |_, leaf| {
        if leaf.entries.capacity() == 0 {
            return true;
        }
        if left == 0 {
            return false;
        }
        left -= 1;
        done.visited += 1;
        if should_move(leaf.entries.as_ptr().cast()) {
            move_entries(&mut leaf.entries);
            done.moved += 1;
        }
        true
    });
    (done, next)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::node::{Entry, Node};
    use crate::tree::testing::{extreme_key, Oracle};
    use crate::tree::BRANCHINGS;
    use proptest::prelude::*;

    /// Leaves in key order: a leaf moved by repack changes its address, not
    /// its contents, so the test can tell moved from unmoved by the pointer.
    fn leaf_addresses(tree: &CountTree) -> Vec<(u128, *const Entry)> {
        fn walk(node: &Node, out: &mut Vec<(u128, *const Entry)>) {
            match node {
                Node::Leaf(leaf) if leaf.entries.capacity() > 0 => {
                    out.push((leaf.entries[0].key(), leaf.entries.as_ptr()));
                }
                Node::Leaf(_) => {}
                Node::Inner(slots) => slots.iter().filter_map(|s| s.child.as_ref()).for_each(|c| walk(c, out)),
            }
        }
        let mut out = Vec::new();
        walk(&tree.root, &mut out);
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// A repacking pass in steps of any budget visits every leaf of an
        /// unchanged tree once, and changes no count; with writes between
        /// the steps it still ends and the tree stays exact.
        #[test]
        fn repack_moves_each_leaf_once_and_keeps_counts(
            branching in proptest::sample::select(BRANCHINGS.to_vec()),
            keys in proptest::collection::vec(extreme_key(), 1..800),
            budget in 1usize..40,
            churn in proptest::collection::vec(extreme_key(), 0..200),
        ) {
            let mut tree = CountTree::new(branching).unwrap();
            let mut oracle = Oracle::default();
            for key in &keys {
                tree.add(*key, 1);
                oracle.add(*key, 1);
            }
            let leaves = leaf_addresses(&tree);
            let entries = tree.entries();
            // First a pass that moves nothing: every leaf seen, none moved.
            let mut from = 0u128;
            let mut seen = 0;
            loop {
                let (done, next) = tree.repack(from, budget, |_| false);
                prop_assert_eq!(done.moved, 0);
                seen += done.visited;
                match next {
                    Some(k) => from = k,
                    None => break,
                }
            }
            prop_assert_eq!(seen, leaves.len());
            prop_assert_eq!(&leaf_addresses(&tree), &leaves);
            // Then one that moves every leaf it is shown, each exactly once.
            let (mut from, mut moved, mut steps) = (0u128, 0usize, 0usize);
            loop {
                let mut shown = Vec::new();
                let (done, next) = tree.repack(from, budget, |ptr| { shown.push(ptr); true });
                prop_assert!(done.visited <= budget && done.moved == done.visited);
                prop_assert_eq!(shown.len(), done.visited);
                prop_assert!(shown.iter().all(|p| leaves.iter().any(|(_, old)| old.cast::<u8>() == *p)));
                moved += done.moved;
                steps += 1;
                match next {
                    Some(k) => { prop_assert!(done.visited == budget && k >= from); from = k; }
                    None => break,
                }
            }
            prop_assert_eq!(moved, leaves.len());
            prop_assert!(steps <= leaves.len() / budget + 1);
            prop_assert_eq!(tree.entries(), entries);
            tree.check().map_err(TestCaseError::fail)?;
            for ((key, before), (key_after, after)) in leaves.iter().zip(leaf_addresses(&tree)) {
                prop_assert_eq!(*key, key_after);
                prop_assert_ne!(*before, after, "leaf at {:#x} not moved", key);
            }

            // Writes between steps: the pass still ends, counts stay exact.
            let (mut from, mut churn) = (0u128, churn.into_iter());
            loop {
                if let Some(key) = churn.next() {
                    let delta = if oracle.0.contains_key(&key) { -1 } else { 1 };
                    tree.add(key, delta);
                    oracle.add(key, delta);
                }
                match tree.repack(from, budget, |_| true).1 {
                    Some(k) => from = k,
                    None => break,
                }
            }
            tree.check().map_err(TestCaseError::fail)?;
            let expected = oracle.entries();
            prop_assert_eq!(tree.entries(), expected);
            for key in oracle.0.keys() {
                prop_assert_eq!(tree.count_before(*key), oracle.before(*key));
            }
        }
    }
}
