//! The count tree: how rankd answers "how many players rank before this key?"
//! in O(log n) without scanning players.
//!
//! This is the design of the Google Code Jam ranking library: the whole key
//! space is split into `branching` equal sub-ranges, each of those again, and
//! so on; every node counts the players in its sub-range. A rank query walks
//! one root-to-leaf path and sums the counts of the sibling ranges that come
//! before the key. Because the boundaries are fixed (they depend only on the
//! key, never on the data), every shard's tree splits the key space the same
//! way, which is what lets the router combine shards.
//!
//! Keys are `u128`: the high 64 bits are the score mapped so that *smaller is
//! better* (see [`crate::key`]), the low 64 bits a tiebreak. The tree is exact
//! over the whole range and sparse: a sub-range only gets a node once it holds
//! players, and a node whose sub-range holds at most [`LEAF_CAPACITY`] distinct
//! keys is a sorted *leaf* rather than a chain of single-child nodes (a burst
//! trie). Memory therefore grows with the players, not with the score range.
//!
//! Persistence: only leaves are stored (the inner counts are sums of leaves and
//! are rebuilt on load). The tree remembers which leaves changed since the last
//! [`CountTree::take_dirty`] so a batch writes each changed leaf once.

mod buckets;
mod encoding;
mod entries;
mod frozen;
mod node;
mod packed;
mod repack;
mod snapshot;
#[cfg(test)]
mod testing;
mod view;

pub use buckets::BucketShape;
pub use encoding::{CorruptLeaf, LeafEncoding};
pub use frozen::FrozenTree;
pub use node::{prefetch_entries, LeafId};
pub use repack::Repacked;
pub use snapshot::{LeafSlice, SlicePicker};
pub use view::{TiebreakHeld, TreeView};

use encoding::decode_leaf;
use node::{add_at, digit, empty_slots, leaf_id_of, level_width, max_depth, Changes, Leaf, Node};
use snapshot::Snapshot;
use std::collections::HashSet;

/// Leaves changed since the last checkpoint: every change to a leaf but a
/// compact root (whose mark records it) inserts here.
type LeafSet = HashSet<LeafId, crate::FastHasher>;

/// What a tree keeps for its next checkpoint besides its leaves' marks.
/// Boxed, and absent from most trees: a compact tree's changed root is
/// known by its mark alone (see [`CountTree::root_changed`]), and a
/// snapshot is seldom under way. A shard holds a tree per board; kept
/// inline these took a tree from jemalloc's 64-byte class to its 80.
#[derive(Debug, Default)]
struct Pending {
    /// Leaves changed since the last checkpoint, but a compact root.
    dirty: LeafSet,
    /// The changed leaves of a checkpoint being taken, if one is.
    snapshot: Option<Snapshot>,
}

/// A leaf bursts into an inner node once it holds more distinct keys than
/// this. Small enough that the linear sum inside a leaf stays cheap, large
/// enough that inner nodes (which cost `branching` counters) stay rare.
pub const LEAF_CAPACITY: usize = 64;

/// The branching factors a tree can be built with.
pub const BRANCHINGS: [u32; 8] = [2, 4, 8, 16, 32, 64, 128, 256];

/// Default branching factor: within noise of the fastest on add + rank
/// (`benches/engine.rs`, group `tree_branching`), where narrower factors are
/// slower and wide ones take more memory. Data dirs keep the factor they
/// were made with.
pub const DEFAULT_BRANCHING: u32 = 16;

/// The count tree of one board window period in one shard.
#[derive(Debug)]
pub struct CountTree {
    /// Key bits each level takes: log2 of the branching factor.
    bits: u32,
    /// The top of the tree: a leaf until it bursts.
    root: Node,
    /// The changed leaves the marks do not record, and a snapshot.
    pending: Option<Box<Pending>>,
    /// Bumped whenever the changed leaves are taken, which unmarks every
    /// leaf at once; see [`Leaf::marked`]. Never 0, the mark of a leaf
    /// never changed.
    round: u32,
    /// Bumped when a snapshot starts copying; see [`Leaf::epoch`].
    epoch: u32,
    /// A snapshot of the compact root not yet handed out: the root is
    /// copied when the snapshot's slice is taken, or first when it is about
    /// to change. A byte of the tree's padding where a [`Pending`] box and
    /// a set of one leaf cost a million small boards ~300 bytes each at
    /// every checkpoint.
    root_snapshot: RootSnapshot,
}

/// Where a compact root's snapshot is ([`CountTree::root_snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RootSnapshot {
    /// None wanted (or it is a [`Pending`] snapshot, as any tree's).
    Off,
    /// Wanted; the slices' budget has not reached it yet.
    Waiting,
    /// Counted in a slice's budget: the next slice taken copies it.
    Reached,
}

/// jemalloc's 48-byte class: a server of a million small boards holds a
/// tree a board a shard. Hence no stored total (see [`CountTree::total`]).
const _: () = assert!(std::mem::size_of::<CountTree>() == 48);

/// Rejected branching factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("branching factor {0} is not one of 2, 4, 8, 16, 32, 64, 128, 256")]
pub struct BadBranching(pub u32);

/// Validates a branching factor and returns its number of key bits per level.
pub fn branching_bits(branching: u32) -> Result<u32, BadBranching> {
    if BRANCHINGS.contains(&branching) {
        Ok(branching.trailing_zeros())
    } else {
        Err(BadBranching(branching))
    }
}

impl CountTree {
    /// An empty tree. `branching` must be one of [`BRANCHINGS`].
    pub fn new(branching: u32) -> Result<Self, BadBranching> {
        Ok(Self {
            bits: branching_bits(branching)?,
            root: Node::Leaf(Leaf::default()),
            pending: None,
            round: 1,
            epoch: 0,
            root_snapshot: RootSnapshot::Off,
        })
    }

    /// This tree's reads (see [`TreeView`]).
    pub fn view(&self) -> TreeView<'_> {
        TreeView::live(self.root.as_node_ref(), self.bits)
    }

    /// See [`TreeView::is_compact`].
    pub fn is_compact(&self) -> bool {
        self.view().is_compact()
    }

    /// See [`TreeView::total`].
    pub fn total(&self) -> u64 {
        self.view().total()
    }

    /// Adds `delta` players at `key` and returns how many hold it now.
    /// Removing more than present is a caller bug; it is clamped (below an
    /// inner node the counts then disagree, which [`CountTree::check`]
    /// catches in tests; a compact tree has no count to disagree).
    pub fn add(&mut self, key: u128, delta: i64) -> u64 {
        if delta == 0 {
            let through = key.checked_add(1).map_or_else(|| self.total(), |next| self.count_before(next));
            return through - self.count_before(key);
        }
        let Self { root, bits, pending, round, epoch, root_snapshot } = self;
        let mut changes = Changes { pending, round: *round, epoch: *epoch, root_snapshot };
        add_at(root, *bits, 0, key, delta, &mut changes)
    }

    /// See [`TreeView::prefetch`].
    pub fn prefetch(&self, key: u128) {
        self.view().prefetch(key);
    }

    /// See [`TreeView::count_before`].
    pub fn count_before(&self, key: u128) -> u64 {
        self.view().count_before(key)
    }

    /// See [`TreeView::entries`].
    pub fn entries(&self) -> Vec<(u128, u64)> {
        self.view().entries()
    }

    /// Places a stored leaf back into the tree while loading. Leaves may come
    /// in any order; inner nodes on the way are created as needed.
    pub fn install_leaf(&mut self, id: LeafId, bytes: &[u8], encoding: LeafEncoding) -> Result<(), CorruptLeaf> {
        let leaf = decode_leaf(bytes, encoding)?;
        if leaf.entries.is_empty() {
            return Ok(());
        }
        let leaf_total: u64 = leaf.entries.iter().map(|e| e.count()).sum();
        if leaf.entries.iter().any(|e| leaf_id_of(e.key(), id.depth, self.bits) != id) {
            return Err(CorruptLeaf("leaf key outside its range"));
        }
        if u32::from(id.depth) > max_depth(self.bits) {
            return Err(CorruptLeaf("leaf deeper than the tree"));
        }
        let mut node = &mut self.root;
        for depth in 0..u32::from(id.depth) {
            if let Node::Leaf(existing) = node {
                if !existing.entries.is_empty() {
                    return Err(CorruptLeaf("leaves overlap"));
                }
                *node = Node::Inner(empty_slots(level_width(depth, self.bits)));
            }
            let Node::Inner(slots) = node else { unreachable!("made inner above") };
            let slot = &mut slots[digit(id.prefix, depth, self.bits)];
            slot.count += leaf_total;
            node = slot.child.get_or_insert_with(|| Node::Leaf(Leaf::empty(self.epoch)));
        }
        match node {
            Node::Leaf(existing) if existing.entries.is_empty() => {
                *node = Node::Leaf(Leaf { epoch: self.epoch, ..leaf });
                Ok(())
            }
            _ => Err(CorruptLeaf("leaves overlap")),
        }
    }

    /// See [`TreeView::check`].
    pub fn check(&self) -> Result<(), String> {
        self.view().check()
    }

    fn leaf_at(&self, id: LeafId) -> Option<&Leaf> {
        let mut node = &self.root;
        for depth in 0..u32::from(id.depth) {
            match node {
                Node::Inner(slots) => node = slots[digit(id.prefix, depth, self.bits)].child.as_ref()?,
                Node::Leaf(_) => return None,
            }
        }
        match node {
            Node::Leaf(leaf) if !leaf.entries.is_empty() => Some(leaf),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{extreme_key, loaded, store, Oracle};
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_compact_tree_marks_its_root_without_a_set() {
        let mut tree = CountTree::new(16).expect("branching");
        tree.add(7, 1);
        tree.add(9, 1);
        assert!(tree.pending.is_none() && tree.root_changed());
        assert_eq!(tree.take_dirty_set(), LeafSet::from_iter([LeafId::ROOT]));
        assert!(tree.pending.is_none() && !tree.root_changed());
        tree.mark_dirty([LeafId::ROOT]);
        assert!(tree.pending.is_none() && tree.root_changed(), "given back: marked again");
    }

    #[test]
    fn a_bursting_root_joins_the_changed_leaves() {
        let mut tree = CountTree::new(16).expect("branching");
        tree.add(1, 1);
        tree.take_dirty_set();
        for key in 0..=LEAF_CAPACITY as u128 {
            tree.add(key << 120, 1);
        }
        assert!(!tree.is_compact());
        let changed = tree.take_dirty_set();
        assert!(changed.contains(&LeafId::ROOT), "the stored root leaf must be deleted");
        assert!(changed.len() > 1);
        tree.mark_dirty([LeafId::ROOT]);
        assert_eq!(tree.take_dirty_set(), LeafSet::from_iter([LeafId::ROOT]), "kept in the set once burst");
    }

    /// Writes the leaves changed since the last reload to `disk` and loads
    /// a fresh tree from it.
    fn reload(
        tree: &mut CountTree,
        disk: &mut BTreeMap<LeafId, Vec<u8>>,
        branching: u32,
        encoding: LeafEncoding,
        copy_all: bool,
    ) -> CountTree {
        store(disk, tree.take_dirty_by(copy_all), encoding);
        loaded(disk, branching, encoding)
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        #[test]
        fn matches_oracle_and_survives_reload(
            branching in proptest::sample::select(BRANCHINGS.to_vec()),
            encoding in prop_oneof![Just(LeafEncoding::Fixed), Just(LeafEncoding::Delta)],
            ops in proptest::collection::vec((extreme_key(), prop_oneof![Just(1i64), Just(-1), Just(3)]), 1..600),
            probes in proptest::collection::vec(extreme_key(), 1..40),
            copy_all in proptest::collection::vec(any::<bool>(), 8),
        ) {
            let mut tree = CountTree::new(branching).unwrap();
            let mut oracle = Oracle::default();
            let mut disk = BTreeMap::new();
            for (i, (key, delta)) in ops.iter().enumerate() {
                // Never remove what is not there: the shard never does.
                let delta = if *delta < 0 && !oracle.0.contains_key(key) { 1 } else { *delta };
                tree.add(*key, delta);
                oracle.add(*key, delta);
                if i % 97 == 0 {
                    tree = reload(&mut tree, &mut disk, branching, encoding, copy_all[i / 97]);
                }
            }
            tree.check().map_err(TestCaseError::fail)?;
            prop_assert_eq!(tree.total(), oracle.0.values().sum::<u64>());
            let entries = oracle.entries();
            prop_assert_eq!(tree.entries(), entries);
            tree.view().prefetch_many(&probes); // walks any shape, keys in any order
            for probe in probes.iter().chain(oracle.0.keys()) {
                prop_assert_eq!(tree.count_before(*probe), oracle.before(*probe));
                prop_assert_eq!(tree.count_before(probe.wrapping_add(1)), oracle.before(probe.wrapping_add(1)));
            }
            let reloaded = reload(&mut tree, &mut disk, branching, encoding, copy_all[7]);
            reloaded.check().map_err(TestCaseError::fail)?;
            prop_assert_eq!(reloaded.entries(), tree.entries());
            prop_assert_eq!(reloaded.total(), tree.total());
        }
    }

    #[test]
    fn rejects_bad_branching_and_corrupt_leaves() {
        assert_eq!(CountTree::new(3).unwrap_err(), BadBranching(3));
        let mut tree = CountTree::new(16).unwrap();
        assert!(tree.install_leaf(LeafId { prefix: 0, depth: 0 }, &[1, 2, 3], LeafEncoding::Fixed).is_err());
        let bad_delta: [&[u8]; 5] = [
            &[0x80],                                                             // varint cut short
            &[5, 1],                                                             // entry cut short
            &[5, 1, 0],                                                          // zero count
            &[5, 1, 1, 0, 1, 1],                                                 // same key twice
            &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 0, 1], // 70-bit varint
        ];
        for bytes in bad_delta {
            let mut tree = CountTree::new(16).unwrap();
            assert!(
                tree.install_leaf(LeafId { prefix: 0, depth: 0 }, bytes, LeafEncoding::Delta).is_err(),
                "{bytes:?}"
            );
        }
    }
}
