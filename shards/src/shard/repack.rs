//! Leaf repacking: after each checkpoint, a pass between rounds moves
//! count-tree leaves off sparse allocator slabs so the memory goes back.

use super::Shard;
use crate::tree::Repacked;

impl Shard {
    /// Starts a repacking pass over every tree: a checkpoint comes after a
    /// tree's worth of changes, and with them a tree's worth of leaf
    /// reallocations.
    pub(super) fn begin_repacking(&mut self) {
        self.repacking = self.held.tree_ids().map(|tree| (tree, 0)).collect();
    }

    /// Whether a leaf-repacking pass is under way (one starts at every
    /// checkpoint; [`Shard::repack_step`] advances it).
    pub fn is_repacking(&self) -> bool {
        !self.repacking.is_empty()
    }

    /// Visits up to `budget` count-tree leaves and moves those `should_move`
    /// picks (by the address of their entries) to fresh allocations: a slice
    /// of the pass a checkpoint started, small enough to run between rounds.
    /// Changes nothing a reader sees.
    ///
    /// Steady writes reallocate leaves all the time, and the allocator's
    /// slabs fill with stragglers of the sizes leaves grew out of (see
    /// [`CountTree::repack`](crate::CountTree::repack)); moving the leaves on
    /// sparse slabs lets the allocator pack them into fuller ones and return
    /// the rest. It works with an allocator that can say how full a
    /// pointer's slab is and fills its oldest slabs first, with its
    /// per-thread cache bypassed during the step (otherwise each new copy
    /// takes the slot the previous leaf just left): the server runs it on
    /// jemalloc that way.
    pub fn repack_step(&mut self, budget: usize, mut should_move: impl FnMut(*const u8) -> bool) -> Repacked {
        let mut done = Repacked::default();
        while let Some((tree, from)) = self.repacking.last_mut() {
            let Some((step, next)) = self.held.repack(tree, *from, budget - done.visited, &mut should_move) else {
                self.repacking.pop(); // expired since the pass began
                continue;
            };
            done.visited += step.visited;
            done.moved += step.moved;
            match next {
                Some(key) => {
                    *from = key;
                    break;
                }
                None => {
                    self.repacking.pop();
                }
            }
        }
        if self.repacking.is_empty() {
            self.repacking = Vec::new(); // a tree's 32 bytes, per tree, between passes
        }
        done
    }
}
