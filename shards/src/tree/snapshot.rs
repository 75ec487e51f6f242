//! Snapshots of the changed leaves for checkpoints: copied at once or a
//! slice at a time (copy on write meanwhile), and picked into the leaves a
//! checkpoint writes.

use super::encoding::{encode_entries, LeafEncoding};
use super::node::{leaves_from, level_bits, prefetch_entries, unmark_all, Entry, LeafId, KEY_BITS};
use super::{CountTree, LeafSet, Node, Pending, RootSnapshot};
use std::collections::{BTreeMap, VecDeque};

/// A snapshot's copies of leaves made as they were about to change (copy on
/// write), in key order.
pub(super) type CopiesOnWrite = BTreeMap<LeafId, Box<[Entry]>>;

/// Keeps a compact root's `entries`, about to change while its snapshot
/// ([`CountTree::root_snapshot`]) waits, as that snapshot's one slice.
pub(super) fn keep_root_snapshot(pending: &mut Option<Box<Pending>>, entries: &[Entry]) {
    pending.get_or_insert_default().snapshot = Some(Snapshot {
        changed: Some(Changed::Root),
        walked: LeafCopies::of_root(entries),
        ahead: CopiesOnWrite::new(),
        walk: None,
    });
}

/// The leaves a snapshot found changed.
#[derive(Debug)]
enum Changed {
    /// A compact tree's root, known by its mark: a set of one would be an
    /// allocation for each of a million small boards at every checkpoint.
    Root,
    /// Any leaves, a burst tree's.
    Leaves(LeafSet),
}

impl Changed {
    /// The leaves, in no order.
    fn into_ids(self) -> Vec<LeafId> {
        match self {
            Self::Root => vec![LeafId::ROOT],
            Self::Leaves(set) => set.into_iter().collect(),
        }
    }
}

/// The changed leaves of a checkpoint, as they were when it began, copied
/// out and handed out a slice at a time ([`CountTree::begin_snapshot`]).
#[derive(Debug)]
pub(super) struct Snapshot {
    /// The leaves changed before it began, for the writer to pick out of
    /// the copies; handed out with the first slice.
    changed: Option<Changed>,
    /// Leaves the walk copied since the last slice was handed out, in key
    /// order.
    walked: LeafCopies,
    /// Leaves copied when about to change, ahead of the walk (copy on
    /// write), until the walk passes them: then they are in key order with
    /// the walked ones.
    pub(super) ahead: CopiesOnWrite,
    /// Where the walk copying the leaves goes on: leaves whose sub-range
    /// starts before it were copied (or made since). `None`: done.
    pub(super) walk: Option<u128>,
}

impl CountTree {
    /// Copies out the leaves changed since the last call, for another thread
    /// to encode and write: a snapshot taken at once, as its only slice (a
    /// [`SlicePicker`] picks the leaves to write out of it).
    ///
    /// It runs on the shard's thread, where every request waits for it: when
    /// many leaves changed (at a checkpoint nearly all have), it copies every
    /// leaf into one buffer in a single prefetching walk in key order, and
    /// leaves picking out the changed ones, the encoding and the keys to the
    /// writing thread.
    pub fn take_dirty(&mut self) -> LeafSlice {
        debug_assert!(!self.has_snapshot(), "a snapshot is being taken: abandon it first");
        self.take_dirty_by(self.mostly_changed())
    }

    /// Whether so many leaves changed that copying every leaf in one walk
    /// beats looking the changed ones up (see [`MOSTLY_CHANGED_PLAYERS_PER_LEAF`]).
    fn mostly_changed(&self) -> bool {
        self.dirty_len() as u64 >= self.total() / MOSTLY_CHANGED_PLAYERS_PER_LEAF
    }

    /// Whether the root is a leaf changed since the last checkpoint: the
    /// one leaf of a compact tree is marked, never put in the set.
    pub(super) fn root_changed(&self) -> bool {
        matches!(&self.root, Node::Leaf(leaf) if leaf.marked == self.round)
    }

    /// How many leaves changed since the last checkpoint.
    fn dirty_len(&self) -> usize {
        self.pending.as_ref().map_or(0, |p| p.dirty.len()) + usize::from(self.root_changed())
    }

    /// Counts `leaves` as changed: a compact root by its mark.
    pub(super) fn mark_dirty(&mut self, leaves: impl IntoIterator<Item = LeafId>) {
        for id in leaves {
            match &mut self.root {
                Node::Leaf(root) if id == LeafId::ROOT => root.marked = self.round,
                _ => {
                    self.pending.get_or_insert_default().dirty.insert(id);
                }
            }
        }
    }

    /// Moves the set of changed leaves out, the marked root among them, and
    /// starts a new round. A large set leaves room for as many again, so
    /// the next grows without rehashing; a small one leaves nothing.
    pub(super) fn take_dirty_set(&mut self) -> LeafSet {
        let root = self.root_changed();
        let mut dirty = match self.pending.as_deref_mut() {
            Some(Pending { dirty, .. }) if dirty.len() > 16 => {
                let room = LeafSet::with_capacity_and_hasher(dirty.len(), Default::default());
                std::mem::replace(dirty, room)
            }
            Some(Pending { dirty, .. }) => std::mem::take(dirty),
            None => LeafSet::default(),
        };
        if root {
            dirty.insert(LeafId::ROOT);
        }
        self.next_round();
        self.drop_idle_pending();
        dirty
    }

    /// Frees the [`Pending`] box once it holds nothing.
    fn drop_idle_pending(&mut self) {
        if self.pending.as_ref().is_some_and(|p| p.dirty.capacity() == 0 && p.snapshot.is_none()) {
            self.pending = None;
        }
    }

    fn snapshot(&self) -> Option<&Snapshot> {
        self.pending.as_ref()?.snapshot.as_ref()
    }

    fn set_snapshot(&mut self, snapshot: Snapshot) {
        self.pending.get_or_insert_default().snapshot = Some(snapshot);
    }

    fn take_snapshot(&mut self) -> Option<Snapshot> {
        let snapshot = self.pending.as_mut()?.snapshot.take();
        self.drop_idle_pending();
        snapshot
    }

    /// Starts a new [`CountTree::round`] after `dirty` was emptied. When the
    /// counter wraps (after 2^32 checkpoints) every mark is cleared, so no
    /// leaf marked 2^32 rounds ago passes for one in the set.
    fn next_round(&mut self) {
        self.round = self.round.wrapping_add(1);
        if self.round == 0 {
            unmark_all(&mut self.root);
            self.round = 1;
        }
    }

    /// [`CountTree::take_dirty`], copying every leaf or looking up the
    /// changed ones as told.
    pub(super) fn take_dirty_by(&mut self, copy_all: bool) -> LeafSlice {
        let changed = self.take_dirty_set();
        let walked = if copy_all && !changed.is_empty() {
            self.copy_every_leaf(changed.len())
        } else {
            self.copy_changed(&changed)
        };
        LeafSlice { changed: Some(Changed::Leaves(changed)), walked, ahead: CopiesOnWrite::new(), upto: None }
    }

    /// Copies every non-empty leaf, in key order, in one walk that asks
    /// memory for the leaves ahead ([`copy_leaves`]); `leaves` is about how
    /// many there are.
    fn copy_every_leaf(&self, leaves: usize) -> LeafCopies {
        let mut out = LeafCopies::default();
        // At most an entry per player.
        out.entries.reserve(usize::try_from(self.total()).unwrap_or(0));
        out.leaves.reserve(leaves);
        let mut ahead = VecDeque::with_capacity(COPY_PREFETCH_AHEAD + 1);
        copy_leaves(&self.root, self.bits, 0, 0, &mut ahead, &mut out);
        for (id, entries) in ahead {
            out.push(id, entries);
        }
        out
    }

    /// Copies the `changed` leaves that still exist and hold keys, in key
    /// order, each looked up from the root.
    fn copy_changed(&self, changed: &LeafSet) -> LeafCopies {
        let mut ids: Vec<LeafId> = changed.iter().copied().collect();
        ids.sort_unstable();
        let mut out = LeafCopies::default();
        for id in ids {
            if let Some(leaf) = self.leaf_at(id).filter(|leaf| !leaf.entries.is_empty()) {
                out.push(id, &leaf.entries);
            }
        }
        out
    }

    /// Starts a snapshot of the leaves changed since the last one, as they
    /// are now, for a checkpoint: [`CountTree::take_dirty`] without making
    /// the caller wait for the copy or hold all of it at once. When few
    /// leaves changed they are copied here and now; otherwise
    /// [`CountTree::continue_snapshot`] copies the leaves a slice at a time,
    /// and until it is done a leaf about to change is copied first (copy on
    /// write), so what comes out is the tree of this moment. Taken all at
    /// once, the copy would hold up every request of the shard.
    /// [`CountTree::take_slice`] hands the copies out in key order as the
    /// walk passes them, to be written while the rest is copied.
    ///
    /// Changes from now on count towards the next snapshot.
    pub fn begin_snapshot(&mut self) {
        debug_assert!(!self.has_snapshot(), "one snapshot at a time");
        if self.dirty_len() == 0 {
            return;
        }
        if self.is_compact() && self.pending.is_none() {
            // Only the root's mark records the change: the root, now of an
            // older epoch, is copied when its slice is taken or before it
            // changes, whichever comes first.
            self.next_round();
            self.epoch = self.epoch.wrapping_add(1);
            self.root_snapshot = RootSnapshot::Waiting;
            return;
        }
        if !self.mostly_changed() {
            let LeafSlice { changed, walked, .. } = self.take_dirty_by(false);
            self.set_snapshot(Snapshot { changed, walked, ahead: CopiesOnWrite::new(), walk: None });
            return;
        }
        let changed = Some(Changed::Leaves(self.take_dirty_set()));
        // Every leaf is now of an older epoch: not yet copied.
        self.epoch = self.epoch.wrapping_add(1);
        self.set_snapshot(Snapshot {
            changed,
            walked: LeafCopies::default(),
            ahead: CopiesOnWrite::new(),
            walk: Some(0),
        });
    }

    /// Copies up to `budget` more leaves into the snapshot being taken;
    /// returns what is left of the budget (all of it when there is no copy
    /// under way).
    pub fn continue_snapshot(&mut self, budget: usize) -> usize {
        match self.root_snapshot {
            RootSnapshot::Waiting if budget > 0 => {
                self.root_snapshot = RootSnapshot::Reached; // copied by `take_slice`
                return budget - 1;
            }
            RootSnapshot::Waiting | RootSnapshot::Reached => return budget,
            RootSnapshot::Off => {}
        }
        let Self { root, bits, epoch, pending: Some(pending), .. } = self else { return budget };
        let Some(snapshot) = &mut pending.snapshot else { return budget };
        let Some(from) = snapshot.walk else { return budget };
        let (mut left, out, epoch) = (budget, &mut snapshot.walked, *epoch);
        snapshot.walk = leaves_from(root, *bits, 0, 0, from, &mut |id, leaf| {
            if leaf.epoch == epoch || leaf.entries.is_empty() {
                return true; // copied on write, or made since
            }
            if left == 0 {
                return false;
            }
            left -= 1;
            // Of this epoch now: a change to it is not copied again.
            leaf.epoch = epoch;
            out.push(id, &leaf.entries);
            true
        });
        left
    }

    /// Whether a snapshot has begun and not yet been handed out whole.
    pub fn has_snapshot(&self) -> bool {
        self.root_snapshot != RootSnapshot::Off || self.snapshot().is_some()
    }

    /// Whether a snapshot has begun and is not yet fully copied.
    pub fn is_copying_snapshot(&self) -> bool {
        self.root_snapshot == RootSnapshot::Waiting || self.snapshot().is_some_and(|s| s.walk.is_some())
    }

    /// Hands out the snapshot's copies the walk has passed, in key order
    /// after those of the slices before (the last slice, once the copy is
    /// done, ends the snapshot); `None` without a snapshot. A
    /// [`SlicePicker`] turns the slices into the leaves to write.
    pub fn take_slice(&mut self) -> Option<LeafSlice> {
        match self.root_snapshot {
            RootSnapshot::Off => {}
            RootSnapshot::Waiting => return Some(LeafSlice::nothing_yet()),
            RootSnapshot::Reached => {
                self.root_snapshot = RootSnapshot::Off;
                let Node::Leaf(root) = &mut self.root else { unreachable!("a root snapshot is of a compact tree") };
                // Unchanged since the snapshot began (a change copies it first).
                root.epoch = self.epoch;
                let walked = LeafCopies::of_root(&root.entries);
                return Some(LeafSlice {
                    changed: Some(Changed::Root),
                    walked,
                    ahead: CopiesOnWrite::new(),
                    upto: None,
                });
            }
        }
        let snapshot = self.pending.as_mut()?.snapshot.as_mut()?;
        let ahead = match snapshot.walk {
            Some(walk) => {
                let later = snapshot.ahead.split_off(&LeafId { prefix: walk, depth: 0 });
                std::mem::replace(&mut snapshot.ahead, later)
            }
            None => std::mem::take(&mut snapshot.ahead),
        };
        let room = snapshot.walked.empty_like();
        let slice = LeafSlice {
            changed: snapshot.changed.take(),
            walked: std::mem::replace(&mut snapshot.walked, room),
            ahead,
            upto: snapshot.walk,
        };
        if slice.upto.is_none() {
            self.take_snapshot();
        }
        Some(slice)
    }

    /// Drops the snapshot being taken, if any: the leaves it holds as
    /// changed count as changed again, for the next one (a checkpoint taken
    /// at once supersedes it). Those it handed out with a slice must be
    /// given back with [`CountTree::mark_changed`].
    pub fn abandon_snapshot(&mut self) {
        if std::mem::replace(&mut self.root_snapshot, RootSnapshot::Off) != RootSnapshot::Off {
            self.mark_dirty([LeafId::ROOT]);
        } else if let Some(Snapshot { changed: Some(changed), .. }) = self.take_snapshot() {
            self.mark_dirty(changed.into_ids());
        }
    }

    /// Counts `leaves` as changed since the last checkpoint: those of an
    /// abandoned snapshot that were handed out.
    pub fn mark_changed(&mut self, leaves: impl IntoIterator<Item = LeafId>) {
        self.mark_dirty(leaves);
    }

    /// Forgets which leaves changed, for trees that are never persisted
    /// (benchmarks, scratch trees), so the dirty set does not grow.
    pub fn clear_dirty(&mut self) {
        if let Some(pending) = &mut self.pending {
            pending.dirty.clear();
        }
        self.next_round();
    }

    /// [`CountTree::clear_dirty`], freeing the set's memory too: for trees
    /// kept in memory only (tie groups), which never take their changes.
    pub fn forget_dirty(&mut self) {
        if let Some(pending) = &mut self.pending {
            pending.dirty = LeafSet::default();
        }
        self.next_round();
        self.drop_idle_pending();
    }
}

/// [`CountTree::take_dirty`] copies every leaf when at least one leaf in
/// this many players changed: at a checkpoint, with leaves a few players
/// each, nearly all have. Below, it looks up only the changed ones.
const MOSTLY_CHANGED_PLAYERS_PER_LEAF: u64 = 64;

/// Copies of leaves' entries, in one buffer, each leaf with its place in it.
#[derive(Debug, Default)]
struct LeafCopies {
    /// Each leaf copied, in key order, with where its entries sit in `entries`.
    leaves: Vec<(LeafId, std::ops::Range<usize>)>,
    /// Every copied leaf's entries, back to back: one allocation, not one a leaf.
    entries: Vec<Entry>,
}

impl LeafCopies {
    /// A compact root's copy: nothing if it holds nothing (its stored leaf
    /// is then deleted).
    fn of_root(entries: &[Entry]) -> Self {
        let mut out = Self::default();
        if !entries.is_empty() {
            out.push(LeafId::ROOT, entries);
        }
        out
    }

    fn push(&mut self, id: LeafId, entries: &[Entry]) {
        let start = self.entries.len();
        self.entries.extend_from_slice(entries);
        self.leaves.push((id, start..self.entries.len()));
    }

    fn iter(&self) -> impl Iterator<Item = (LeafId, &[Entry])> + '_ {
        self.leaves.iter().map(|(id, range)| (*id, &self.entries[range.clone()]))
    }

    /// Empty, with room for as much as this holds: the next slice of a
    /// walk copies about as much, and grown from nothing its buffers were
    /// reallocated a dozen times a slice on the shard's thread.
    fn empty_like(&self) -> Self {
        Self { leaves: Vec::with_capacity(self.leaves.len()), entries: Vec::with_capacity(self.entries.len()) }
    }
}

/// A slice of a snapshot ([`CountTree::take_slice`]): copies of leaves as
/// they were when it began, in key order after every earlier slice's, with
/// the snapshot's changed leaves in the first. Unchanged leaves are among
/// the copies too (when most changed, the walk copies every leaf: cheaper
/// than looking the changed ones up), for a [`SlicePicker`] to drop on the
/// writing thread.
#[derive(Debug)]
pub struct LeafSlice {
    /// The snapshot's changed leaves, in the first slice only: what a
    /// [`SlicePicker`] picks out of the copies.
    changed: Option<Changed>,
    /// Leaves the walk copied, in key order.
    walked: LeafCopies,
    /// Copied on write; none is among `walked`.
    ahead: CopiesOnWrite,
    /// Leaves whose sub-range starts here or after come in later slices;
    /// `None`: the last slice.
    upto: Option<u128>,
}

impl LeafSlice {
    /// A slice of a snapshot the copy has not reached yet: idle.
    fn nothing_yet() -> Self {
        Self { changed: None, walked: LeafCopies::default(), ahead: CopiesOnWrite::new(), upto: Some(0) }
    }

    /// Whether the slice carries nothing and more follow (an empty last
    /// slice still tells the writer the snapshot's end).
    pub fn is_idle(&self) -> bool {
        self.changed.is_none() && self.walked.leaves.is_empty() && self.ahead.is_empty() && self.upto.is_some()
    }

    /// The copies, walked and copied on write merged, in key order.
    fn copies(&self) -> impl Iterator<Item = (LeafId, &[Entry])> + '_ {
        let mut walked = self.walked.iter().peekable();
        let mut ahead = self.ahead.iter().map(|(id, entries)| (*id, &entries[..])).peekable();
        std::iter::from_fn(move || match (walked.peek(), ahead.peek()) {
            (Some(w), Some(a)) if a.0 < w.0 => ahead.next(),
            (Some(_), _) => walked.next(),
            (None, _) => ahead.next(),
        })
    }
}

/// Turns one tree's snapshot slices, in order, into the leaves a
/// checkpoint writes: each changed leaf that exists with its encoding, and
/// each that no longer does (`None`), in key order across slices (what
/// writing straight to sorted tables needs).
#[derive(Debug, Default)]
pub struct SlicePicker {
    /// The snapshot's changed leaves, sorted.
    changed: Vec<LeafId>,
    /// How many of `changed` earlier slices covered.
    next: usize,
}

impl SlicePicker {
    /// Calls `write` with the leaves of `slice` (the next of this tree's
    /// snapshot) to write, in key order; stops at the first error.
    pub fn pick<E>(
        &mut self,
        mut slice: LeafSlice,
        encoding: LeafEncoding,
        mut write: impl FnMut(LeafId, Option<Vec<u8>>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.pass(&mut slice);
        let rest = &self.changed[self.next..];
        let end = self.next + slice.upto.map_or(rest.len(), |upto| rest.partition_point(|id| id.prefix < upto));
        let mut changed = self.changed[self.next..end].iter().copied().peekable();
        self.next = end;
        let mut copies = slice.copies().peekable();
        loop {
            match (copies.peek(), changed.peek()) {
                (Some(&(id, entries)), Some(&c)) if id == c => {
                    write(id, Some(encode_entries(entries, encoding)))?;
                    copies.next();
                    changed.next();
                }
                (Some(&(id, _)), Some(&c)) if c < id => {
                    write(c, None)?;
                    changed.next();
                }
                (Some(_), _) => {
                    copies.next(); // unchanged
                }
                (None, Some(&c)) => {
                    write(c, None)?;
                    changed.next();
                }
                (None, None) => return Ok(()),
            }
        }
    }

    /// Takes the next slice without writing anything: only the changed
    /// leaves it hands out, if it is the first, are kept, sorted (for
    /// [`SlicePicker::pick`] and [`SlicePicker::into_changed`]).
    pub fn pass(&mut self, slice: &mut LeafSlice) {
        if let Some(changed) = slice.changed.take() {
            self.changed = changed.into_ids();
            self.changed.sort_unstable();
            self.next = 0;
        }
    }

    /// The snapshot's changed leaves: what an abandoned snapshot gives back
    /// ([`CountTree::mark_changed`]).
    pub fn into_changed(self) -> Vec<LeafId> {
        self.changed
    }
}

/// How many leaves ahead [`CountTree::take_dirty`] asks memory for.
const COPY_PREFETCH_AHEAD: usize = 8;

/// Copies every non-empty leaf under `node` (the node with id
/// `prefix`/`depth`) into `out` in key order, `COPY_PREFETCH_AHEAD` leaves
/// behind the walk: the leaves are scattered over the heap, each a wait for
/// memory when copied in turn, so the walk asks for each as it finds it and
/// the waits overlap. `ahead` holds the leaves found and not yet copied.
fn copy_leaves<'a>(
    node: &'a Node,
    bits: u32,
    depth: u32,
    prefix: u128,
    ahead: &mut VecDeque<(LeafId, &'a [Entry])>,
    out: &mut LeafCopies,
) {
    match node {
        Node::Leaf(leaf) => {
            if !leaf.entries.is_empty() {
                prefetch_entries(&leaf.entries);
                ahead.push_back((LeafId { prefix, depth: depth as u8 }, &leaf.entries));
                if ahead.len() > COPY_PREFETCH_AHEAD {
                    if let Some((id, entries)) = ahead.pop_front() {
                        out.push(id, entries);
                    }
                }
            }
        }
        Node::Inner(slots) => {
            let shift = KEY_BITS - bits * depth - level_bits(depth, bits);
            for (d, slot) in slots.iter().enumerate() {
                if let Some(child) = &slot.child {
                    copy_leaves(child, bits, depth + 1, prefix | ((d as u128) << shift), ahead, out);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::testing::{extreme_key, loaded, pick_into, store, store_written, written, Oracle, Written};
    use crate::tree::BRANCHINGS;
    use proptest::prelude::*;

    #[test]
    fn a_leaf_changed_again_after_its_round_is_taken_is_written_again() {
        let mut tree = CountTree::new(16).expect("valid branching");
        tree.add(5, 1);
        assert_eq!(written(tree.take_dirty(), LeafEncoding::Delta).len(), 1);
        tree.add(5, 1);
        tree.add(6, 1);
        assert_eq!(written(tree.take_dirty(), LeafEncoding::Delta).len(), 1, "marked again after the take");
        assert!(written(tree.take_dirty(), LeafEncoding::Delta).is_empty(), "unchanged since");
    }

    #[test]
    fn a_wrapped_round_unmarks_every_leaf() {
        let mut tree = CountTree::new(16).expect("valid branching");
        tree.add(5, 1); // marked in round 1
        written(tree.take_dirty(), LeafEncoding::Delta);
        // 2^32 - 3 takes later, the next one wraps back to round 1.
        tree.round = u32::MAX;
        assert!(written(tree.take_dirty(), LeafEncoding::Delta).is_empty());
        assert_eq!(tree.round, 1);
        tree.add(5, 1);
        assert_eq!(
            written(tree.take_dirty(), LeafEncoding::Delta).len(),
            1,
            "a mark of round 1 long ago must not hide the change"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// A snapshot copied in slices of any size, with changes between
        /// the slices, and written slice by slice as it is copied, writes
        /// every leaf key in order once (what sorted tables need) and
        /// stores the tree as it was when the snapshot began; the changes
        /// made meanwhile go to the next one. An abandoned snapshot loses
        /// nothing, whether or not it handed out its changed leaves: the
        /// next checkpoint writes them.
        #[test]
        fn snapshot_in_slices_is_the_tree_when_it_began(
            branching in proptest::sample::select(BRANCHINGS.to_vec()),
            encoding in prop_oneof![Just(LeafEncoding::Fixed), Just(LeafEncoding::Delta)],
            ops in proptest::collection::vec((extreme_key(), prop_oneof![Just(1i64), Just(-1), Just(2)]), 1..900),
            cycles in proptest::collection::vec((0usize..300, 1usize..24, 0usize..6, 0usize..4, 0usize..4), 1..5),
        ) {
            let mut tree = CountTree::new(branching).unwrap();
            let mut oracle = Oracle::default();
            let mut disk = BTreeMap::new();
            let mut ops = ops.iter();
            let mut apply = |tree: &mut CountTree, oracle: &mut Oracle, n: usize| {
                for (key, delta) in ops.by_ref().take(n) {
                    // Never remove what is not there: the shard never does.
                    let delta = if *delta < 0 && !oracle.0.contains_key(key) { 1 } else { *delta };
                    tree.add(*key, delta);
                    oracle.add(*key, delta);
                }
            };
            // `abandon_after`: 0 never, else after that many slices;
            // `after_begin`: changes before the first slice is copied.
            for (before, budget, between, abandon_after, after_begin) in cycles {
                apply(&mut tree, &mut oracle, before);
                tree.begin_snapshot();
                let at_begin = oracle.entries();
                apply(&mut tree, &mut oracle, after_begin);
                let mut picker = SlicePicker::default();
                let mut written: Vec<Written> = Vec::new();
                let mut slices = 0;
                let mut abandoned = false;
                loop {
                    if abandon_after > 0 && slices == abandon_after {
                        abandoned = true;
                        break;
                    }
                    tree.continue_snapshot(budget);
                    let Some(slice) = tree.take_slice() else { break };
                    let last = slice.upto.is_none();
                    pick_into(&mut picker, slice, encoding, &mut written);
                    slices += 1;
                    if last {
                        break;
                    }
                    apply(&mut tree, &mut oracle, between);
                }
                // In key order, once each, across slices.
                prop_assert!(written.windows(2).all(|w| w[0].0 < w[1].0), "leaves out of order: {:?}",
                    written.iter().map(|w| w.0).collect::<Vec<_>>());
                if abandoned {
                    tree.abandon_snapshot();
                    tree.mark_changed(picker.into_changed());
                    prop_assert!(tree.take_slice().is_none());
                    store(&mut disk, tree.take_dirty(), encoding);
                    let now = oracle.entries();
                    prop_assert_eq!(loaded(&disk, branching, encoding).entries(), now);
                    continue;
                }
                prop_assert!(!tree.is_copying_snapshot());
                store_written(&mut disk, written);
                let stored = loaded(&disk, branching, encoding);
                stored.check().map_err(TestCaseError::fail)?;
                prop_assert_eq!(stored.entries(), at_begin);
            }
            tree.check().map_err(TestCaseError::fail)?;
            store(&mut disk, tree.take_dirty(), encoding);
            let entries = oracle.entries();
            prop_assert_eq!(loaded(&disk, branching, encoding).entries(), entries);
        }
    }

    /// A compact tree's snapshot is a flag, not a boxed snapshot and a set
    /// of one leaf: a shard of a million small boards takes one of each at
    /// a checkpoint. A change before the slice is taken keeps the root as
    /// it was.
    #[test]
    fn a_compact_trees_snapshot_allocates_only_when_its_root_changes_first() {
        let mut tree = CountTree::new(16).unwrap();
        tree.add(7, 1);
        tree.add(9, 2);
        tree.begin_snapshot();
        assert!(tree.has_snapshot() && tree.pending.is_none());
        assert_eq!(tree.continue_snapshot(0), 0);
        assert!(tree.take_slice().is_some_and(|slice| slice.is_idle()), "not reached by a budget yet");
        assert!(tree.is_copying_snapshot());
        assert_eq!(tree.continue_snapshot(5), 4, "the root is one leaf of the budget");
        assert!(!tree.is_copying_snapshot());
        let mut picked = Vec::new();
        pick_into(&mut SlicePicker::default(), tree.take_slice().unwrap(), LeafEncoding::Fixed, &mut picked);
        assert_eq!(picked.len(), 1);
        assert!(!tree.has_snapshot() && tree.pending.is_none());

        tree.add(7, -1); // changed: snapshot again
        tree.begin_snapshot();
        tree.add(9, -2); // the root empties before its slice is taken
        tree.add(11, 1);
        assert!(tree.pending.as_ref().is_some_and(|p| p.snapshot.is_some()), "copied before the change");
        let mut picked = Vec::new();
        pick_into(&mut SlicePicker::default(), tree.take_slice().unwrap(), LeafEncoding::Fixed, &mut picked);
        let mut disk = BTreeMap::new();
        store_written(&mut disk, picked);
        assert_eq!(loaded(&disk, 16, LeafEncoding::Fixed).entries(), vec![(9, 2)]);
        assert!(!tree.has_snapshot() && tree.pending.is_none(), "the box goes with the slice");
        assert_eq!(tree.entries(), vec![(11, 1)]);
    }

    #[test]
    fn emptied_leaves_are_deleted_on_disk() {
        let mut tree = CountTree::new(4).unwrap();
        for k in 0..200u128 {
            tree.add(k << 100, 1);
        }
        let before = written(tree.take_dirty(), LeafEncoding::Delta);
        assert!(before.iter().any(|(_, b)| b.is_some()));
        for k in 0..200u128 {
            tree.add(k << 100, -1);
        }
        let after = written(tree.take_dirty(), LeafEncoding::Delta);
        assert!(!after.is_empty());
        assert!(after.iter().all(|(_, b)| b.is_none()));
    }
}
