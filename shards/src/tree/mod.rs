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

use std::collections::{BTreeMap, HashSet, VecDeque};

/// Leaves changed since the last checkpoint; every `add` inserts here.
type LeafSet = HashSet<LeafId, crate::FastHasher>;

/// A snapshot's copies of leaves made as they were about to change (copy on
/// write), in key order.
type CopiesOnWrite = BTreeMap<LeafId, Box<[Entry]>>;

/// A leaf bursts into an inner node once it holds more distinct keys than
/// this. Small enough that the linear sum inside a leaf stays cheap, large
/// enough that inner nodes (which cost `branching` counters) stay rare.
pub const LEAF_CAPACITY: usize = 64;

/// The branching factors a tree can be built with.
pub const BRANCHINGS: [u32; 8] = [2, 4, 8, 16, 32, 64, 128, 256];

/// Default branching factor, chosen by measurement (`benches/engine.rs`,
/// group `tree_branching`, 1M players, add + rank): 16 is within noise of the
/// fastest (32/64/256 were 9-12% faster on the least-disturbed samples, 16
/// first on criterion's estimates), 2-8 are 1.2-1.9x slower, and 64 costs
/// ~30% more memory. Data dirs keep the factor they were made with.
pub const DEFAULT_BRANCHING: u32 = 16;

const KEY_BITS: u32 = 128;

/// How leaves are stored. A data dir keeps the encoding it was made with
/// (the shard records it), like its branching factor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeafEncoding {
    /// 24 bytes an entry: the key and the count, big-endian. Data dirs made
    /// before the delta encoding.
    Fixed,
    /// Varints, an entry at a time: the key's high half (the score) as the
    /// difference from the previous entry's, the low half (the tiebreak),
    /// the count. 10M players with evenly spread scores: ~11 bytes an entry,
    /// so a checkpoint writes (and holds in memtables until flushed) and a
    /// start reads less than half of what `Fixed` takes.
    Delta,
}

impl LeafEncoding {
    /// The byte a shard records for it.
    pub fn code(self) -> u8 {
        match self {
            Self::Fixed => 1,
            Self::Delta => 2,
        }
    }

    /// The encoding a recorded byte names.
    pub fn from_code(code: u8) -> Option<Self> {
        match code {
            1 => Some(Self::Fixed),
            2 => Some(Self::Delta),
            _ => None,
        }
    }
}

/// Where a leaf sits: its depth and the key bits above it (lower bits zero).
/// This is also the leaf's identity on disk.
///
/// Packed to 8-byte alignment: 24 bytes instead of the 32 a 16-aligned
/// `u128` pads it to. The set of leaves changed since the last checkpoint
/// holds one per leaf (~244k a shard at 10M players on 2 shards, in a hash
/// table twice that many slots wide), as does each checkpoint's sorted list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C, packed(8))]
pub struct LeafId {
    /// Key bits shared by every key in the leaf, lower bits cleared.
    pub prefix: u128,
    /// Number of levels above the leaf (0 = the root).
    pub depth: u8,
}

const _: () = assert!(std::mem::size_of::<LeafId>() == 24);

#[derive(Debug)]
enum Node {
    Leaf(Leaf),
    Inner(Box<[Slot]>),
}

/// Sorted keys of one sub-range with their player counts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Leaf {
    entries: Vec<Entry>,
    /// The tree's [`CountTree::epoch`] when the leaf was made or last
    /// copied into a snapshot: while a snapshot is being copied, a leaf of
    /// an older epoch is one it still needs as it was.
    epoch: u32,
    /// The tree's [`CountTree::round`] when the leaf was last put in the
    /// set of changed leaves: while they are equal it is there, and a
    /// change need not hash its id into the set again. Every change did,
    /// and the set (a few hundred thousand leaves a shard at 10M players)
    /// made that insert a wait for memory on most writes. Fits in the
    /// padding after `epoch`: a leaf stays 32 bytes.
    marked: u32,
}

const _: () = assert!(std::mem::size_of::<Leaf>() == 32);

impl Leaf {
    /// A leaf made now, in the tree's epoch `epoch`: it holds nothing a
    /// snapshot under way still needs.
    fn empty(epoch: u32) -> Self {
        Self { entries: Vec::new(), epoch, marked: 0 }
    }
}

/// One distinct key of a leaf and how many players hold it.
///
/// Leaves hold every player, so this layout is most of a tree's memory: a
/// plain `(u128, u64)` takes 32 bytes (u128 is 16-aligned), this takes 20.
/// A count saturates at `u32::MAX` players on one key.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(4))]
struct Entry {
    key_high: u64,
    key_low: u64,
    count: u32,
}

impl Entry {
    fn new(key: u128, count: u64) -> Self {
        Self { key_high: (key >> 64) as u64, key_low: key as u64, count: u32::try_from(count).unwrap_or(u32::MAX) }
    }

    fn key(self) -> u128 {
        (u128::from(self.key_high) << 64) | u128::from(self.key_low)
    }

    fn count(self) -> u64 {
        u64::from(self.count)
    }
}

impl std::fmt::Debug for Entry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}:{}", self.key(), self.count())
    }
}

/// Grows a leaf by a quarter rather than doubling: leaves are small and
/// many, and doubling would leave a third of their memory unused on average.
fn reserve_one(entries: &mut Vec<Entry>) {
    if entries.len() == entries.capacity() {
        entries.reserve_exact(entries.len() / 4 + 1);
    }
}

/// One child sub-range of an inner node: how many players it holds, next to
/// the child itself. A rank walk sums the counts before its digit and steps
/// into the child at the digit, so keeping both in one array makes each level
/// one allocation and a few adjacent cache lines; with counts and children in
/// separate arrays behind a boxed node, each level cost three or four cache
/// misses, and at 1M players those misses were most of a rank's time.
#[derive(Debug)]
struct Slot {
    count: u64,
    child: Option<Node>,
}

/// The count tree of one board window period in one shard.
#[derive(Debug)]
pub struct CountTree {
    bits: u32,
    root: Node,
    total: u64,
    dirty: LeafSet,
    /// Bumped whenever `dirty` is emptied, which unmarks every leaf at once;
    /// see [`Leaf::marked`]. Never 0, the mark of a leaf never put there.
    round: u32,
    /// Bumped when a snapshot starts copying; see [`Leaf::epoch`].
    epoch: u32,
    /// The changed leaves of a checkpoint being taken, if one is.
    snapshot: Option<Snapshot>,
}

/// The changed leaves of a checkpoint, as they were when it began, copied
/// out and handed out a slice at a time ([`CountTree::begin_snapshot`]).
#[derive(Debug)]
struct Snapshot {
    /// The leaves changed before it began, for the writer to pick out of
    /// the copies; handed out with the first slice.
    changed: Option<LeafSet>,
    /// Leaves the walk copied since the last slice was handed out, in key
    /// order.
    walked: LeafCopies,
    /// Leaves copied when about to change, ahead of the walk (copy on
    /// write), until the walk passes them: then they are in key order with
    /// the walked ones.
    ahead: CopiesOnWrite,
    /// Where the walk copying the leaves goes on: leaves whose sub-range
    /// starts before it were copied (or made since). `None`: done.
    walk: Option<u128>,
}

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
            total: 0,
            dirty: LeafSet::default(),
            round: 1,
            epoch: 0,
            snapshot: None,
        })
    }

    /// Number of players (sum of all counts).
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Adds `delta` players at `key`. Removing more than present is a caller
    /// bug; it is clamped (and caught by [`CountTree::check`] in tests).
    pub fn add(&mut self, key: u128, delta: i64) {
        if delta == 0 {
            return;
        }
        self.total = self.total.saturating_add_signed(delta);
        let mut changes = Changes {
            dirty: &mut self.dirty,
            round: self.round,
            epoch: self.epoch,
            snapshot: self.snapshot.as_mut().filter(|s| s.walk.is_some()).map(|s| &mut s.ahead),
        };
        add_at(&mut self.root, self.bits, 0, key, delta, &mut changes);
    }

    /// Starts loading the leaf that holds `key` into the CPU cache, so a
    /// [`CountTree::add`] of it soon after does not wait for memory. A score
    /// change removes one key and adds another, in leaves far apart: asking
    /// for the second leaf first overlaps the two waits.
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
            nodes[..group.len()].fill(Some(&self.root));
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
        let mut node = &self.root;
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
        collect(&self.root, &mut out);
        out
    }

    /// Copies out the leaves changed since the last call, for another thread
    /// to encode and write: a snapshot taken at once, as its only slice (a
    /// [`SlicePicker`] picks the leaves to write out of it).
    ///
    /// A checkpoint takes nearly every leaf (random changes touch them all
    /// long before a checkpoint is due), and this runs on the shard's
    /// thread, between rounds: every request waits for it. Looking each
    /// changed leaf up from the root, encoding it into its own vector and
    /// building its key there took 100-140 ms at 1M players (~200k leaves),
    /// mostly waiting for memory. When many leaves changed, this copies
    /// every leaf's entries into one buffer in a single walk in key order,
    /// prefetching ahead, and leaves picking out the changed ones (a hash
    /// lookup each), the encoding and the keys to the writing thread.
    pub fn take_dirty(&mut self) -> LeafSlice {
        debug_assert!(self.snapshot.is_none(), "a snapshot is being taken: abandon it first");
        self.take_dirty_by(self.mostly_changed())
    }

    /// Whether so many leaves changed that copying every leaf in one walk
    /// beats looking the changed ones up (see [`MOSTLY_CHANGED_PLAYERS_PER_LEAF`]).
    fn mostly_changed(&self) -> bool {
        self.dirty.len() as u64 >= self.total / MOSTLY_CHANGED_PLAYERS_PER_LEAF
    }

    /// Moves the set of changed leaves out, leaving room for the next one,
    /// which grows about as large: no rehashing on the way.
    fn take_dirty_set(&mut self) -> LeafSet {
        let dirty = std::mem::take(&mut self.dirty);
        self.dirty.reserve(dirty.len());
        self.next_round();
        dirty
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
    fn take_dirty_by(&mut self, copy_all: bool) -> LeafSlice {
        let changed = self.take_dirty_set();
        let walked = if copy_all && !changed.is_empty() {
            self.copy_every_leaf(changed.len())
        } else {
            self.copy_changed(&changed)
        };
        LeafSlice { changed: Some(changed), walked, ahead: CopiesOnWrite::new(), upto: None }
    }

    /// Copies every non-empty leaf, in key order, in one walk that asks
    /// memory for the leaves ahead ([`copy_leaves`]); `leaves` is about how
    /// many there are.
    fn copy_every_leaf(&self, leaves: usize) -> LeafCopies {
        let mut out = LeafCopies::default();
        // At most an entry per player.
        out.entries.reserve(usize::try_from(self.total).unwrap_or(0));
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

    /// Visits up to `budget` leaves, in key order from the first whose
    /// sub-range starts at or after `from`, and moves each that `should_move`
    /// picks (given the address of its entries) to a fresh allocation of the
    /// same capacity. Returns what it did and where the next step starts
    /// (`None`: the walk reached the end of the tree). The tree may change
    /// between steps; leaves that appear behind the cursor are new
    /// allocations anyway.
    ///
    /// Why move memory that is in use: a leaf is reallocated a dozen times
    /// as it grows (each growth step a different allocator size class), and
    /// with scores spread evenly, whole generations of leaves grow through a
    /// size class together and leave a few stragglers on each of its slabs.
    /// The allocator cannot return a slab while one object lives on it: after
    /// a 10M-player prefill that pinned ~150 MB of mostly empty slabs (RSS
    /// 676 MiB over 481 MiB live). An allocator that hands out its oldest
    /// slabs' free slots first (jemalloc) packs moved leaves into them, and
    /// the slabs left empty go back to the OS. Which leaves are worth moving
    /// only the allocator knows, hence `should_move`. See `Shard::repack_step`.
    pub fn repack(
        &mut self,
        from: u128,
        budget: usize,
        should_move: impl FnMut(*const u8) -> bool,
    ) -> (Repacked, Option<u128>) {
        let (mut left, mut done, mut should_move) = (budget, Repacked::default(), should_move);
        let next = leaves_from(&mut self.root, self.bits, 0, 0, from, &mut |_, leaf| {
            if leaf.entries.capacity() == 0 {
                return true;
            }
            if left == 0 {
                return false;
            }
            left -= 1;
            done.visited += 1;
            if should_move(leaf.entries.as_ptr().cast()) {
                let mut fresh = Vec::with_capacity(leaf.entries.capacity());
                fresh.extend_from_slice(&leaf.entries);
                leaf.entries = fresh;
                done.moved += 1;
            }
            true
        });
        (done, next)
    }

    /// Starts a snapshot of the leaves changed since the last one, as they
    /// are now, for a checkpoint: [`CountTree::take_dirty`] without making
    /// the caller wait for the copy or hold all of it at once. When few
    /// leaves changed they are copied here and now; otherwise
    /// [`CountTree::continue_snapshot`] copies the leaves a slice at a time,
    /// and until it is done a leaf about to change is copied first (copy on
    /// write), so what comes out is the tree of this moment. Taken all at
    /// once, the copy held every request of a shard for 17-57 ms at 1M
    /// players (up to 137 ms before it was one walk), every checkpoint.
    /// [`CountTree::take_slice`] hands the copies out in key order as the
    /// walk passes them, to be written while the rest is copied.
    ///
    /// Changes from now on count towards the next snapshot.
    pub fn begin_snapshot(&mut self) {
        debug_assert!(self.snapshot.is_none(), "one snapshot at a time");
        if self.dirty.is_empty() {
            return;
        }
        if !self.mostly_changed() {
            let LeafSlice { changed, walked, .. } = self.take_dirty_by(false);
            self.snapshot = Some(Snapshot { changed, walked, ahead: CopiesOnWrite::new(), walk: None });
            return;
        }
        let changed = Some(self.take_dirty_set());
        // Every leaf is now of an older epoch: not yet copied.
        self.epoch = self.epoch.wrapping_add(1);
        self.snapshot =
            Some(Snapshot { changed, walked: LeafCopies::default(), ahead: CopiesOnWrite::new(), walk: Some(0) });
    }

    /// Copies up to `budget` more leaves into the snapshot being taken;
    /// returns what is left of the budget (all of it when there is no copy
    /// under way).
    pub fn continue_snapshot(&mut self, budget: usize) -> usize {
        let Self { root, bits, epoch, snapshot: Some(snapshot), .. } = self else { return budget };
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

    /// Whether a snapshot has begun and is not yet fully copied.
    pub fn is_copying_snapshot(&self) -> bool {
        self.snapshot.as_ref().is_some_and(|s| s.walk.is_some())
    }

    /// Hands out the snapshot's copies the walk has passed, in key order
    /// after those of the slices before (the last slice, once the copy is
    /// done, ends the snapshot); `None` without a snapshot. A
    /// [`SlicePicker`] turns the slices into the leaves to write.
    pub fn take_slice(&mut self) -> Option<LeafSlice> {
        let snapshot = self.snapshot.as_mut()?;
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
            self.snapshot = None;
        }
        Some(slice)
    }

    /// Drops the snapshot being taken, if any: the leaves it holds as
    /// changed count as changed again, for the next one (a checkpoint taken
    /// at once supersedes it). Those it handed out with a slice must be
    /// given back with [`CountTree::mark_changed`].
    pub fn abandon_snapshot(&mut self) {
        if let Some(Snapshot { changed: Some(changed), .. }) = self.snapshot.take() {
            self.dirty.extend(changed);
        }
    }

    /// Counts `leaves` as changed since the last checkpoint: those of an
    /// abandoned snapshot that were handed out.
    pub fn mark_changed(&mut self, leaves: impl IntoIterator<Item = LeafId>) {
        self.dirty.extend(leaves);
    }

    /// Forgets which leaves changed, for trees that are never persisted
    /// (benchmarks, scratch trees), so the dirty set does not grow.
    pub fn clear_dirty(&mut self) {
        self.dirty.clear();
        self.next_round();
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
        self.total += leaf_total;
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

    /// Verifies every inner count equals the sum below it and every leaf is
    /// sorted, in range and positive. Used by tests and `rankd check`.
    pub fn check(&self) -> Result<(), String> {
        let sum = check_node(&self.root, self.bits, 0, 0)?;
        if sum != self.total {
            return Err(format!("total {} but nodes sum to {sum}", self.total));
        }
        Ok(())
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

/// A stored leaf that cannot be decoded: the data dir is damaged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("corrupt count-tree leaf: {0}")]
pub struct CorruptLeaf(pub &'static str);

/// The slots of a new inner node with `width` empty sub-ranges.
fn empty_slots(width: usize) -> Box<[Slot]> {
    std::iter::repeat_with(|| Slot { count: 0, child: None }).take(width).collect()
}

/// Deepest level a leaf can sit at: below it every key is one value.
fn max_depth(bits: u32) -> u32 {
    KEY_BITS.div_ceil(bits)
}

/// Key bits consumed by the level at `depth` (the last level may be narrower).
fn level_bits(depth: u32, bits: u32) -> u32 {
    bits.min(KEY_BITS - bits * depth)
}

fn level_width(depth: u32, bits: u32) -> usize {
    1usize << level_bits(depth, bits)
}

/// The child index of `key` at `depth`.
fn digit(key: u128, depth: u32, bits: u32) -> usize {
    let used = bits * depth;
    let width = level_bits(depth, bits);
    let shift = KEY_BITS - used - width;
    ((key >> shift) & ((1u128 << width) - 1)) as usize
}

fn leaf_id_of(key: u128, depth: u8, bits: u32) -> LeafId {
    let used = (bits * u32::from(depth)).min(KEY_BITS);
    let prefix = if used == 0 { 0 } else { key & (u128::MAX << (KEY_BITS - used)) };
    LeafId { prefix, depth }
}

/// Asks the CPU to load a leaf's entries ahead of the binary search. A
/// leaf is up to ~1.3 KB, and the search's probes each waited for memory in
/// turn; asked for all at once, the waits overlap.
fn prefetch_entries(entries: &[Entry]) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = entries;
    #[cfg(target_arch = "x86_64")]
    {
        let bytes = std::mem::size_of_val(entries);
        let start = entries.as_ptr().cast::<i8>();
        let mut offset = 0;
        while offset < bytes {
            // SAFETY: prefetching is a hint that never faults, and the address
            // is inside the slice.
            unsafe { std::arch::x86_64::_mm_prefetch(start.add(offset), std::arch::x86_64::_MM_HINT_T0) };
            offset += 64;
        }
    }
}

/// What an [`add_at`] records besides the counts.
struct Changes<'a> {
    dirty: &'a mut LeafSet,
    round: u32,
    epoch: u32,
    /// Where a leaf goes, as it was, before its first change while a
    /// snapshot is being copied.
    snapshot: Option<&'a mut CopiesOnWrite>,
}

fn add_at(node: &mut Node, bits: u32, depth: u32, key: u128, delta: i64, changes: &mut Changes<'_>) {
    match node {
        Node::Leaf(leaf) => {
            prefetch_entries(&leaf.entries);
            let id = leaf_id_of(key, depth as u8, bits);
            if leaf.epoch != changes.epoch {
                leaf.epoch = changes.epoch;
                if let Some(snapshot) = changes.snapshot.as_deref_mut() {
                    if !leaf.entries.is_empty() {
                        snapshot.insert(id, leaf.entries.as_slice().into());
                    }
                }
            }
            if leaf.marked != changes.round {
                leaf.marked = changes.round;
                changes.dirty.insert(id);
            }
            match leaf.entries.binary_search_by(|e| e.key().cmp(&key)) {
                Ok(i) => {
                    let count = leaf.entries[i].count().saturating_add_signed(delta);
                    if count == 0 {
                        leaf.entries.remove(i);
                    } else {
                        leaf.entries[i] = Entry::new(key, count);
                    }
                }
                Err(i) => {
                    if delta > 0 {
                        reserve_one(&mut leaf.entries);
                        leaf.entries.insert(i, Entry::new(key, delta.unsigned_abs()));
                    }
                }
            }
            if leaf.entries.len() > LEAF_CAPACITY && depth < max_depth(bits) {
                let entries = std::mem::take(&mut leaf.entries);
                *node = burst(entries, bits, depth, changes);
            }
        }
        Node::Inner(slots) => {
            let slot = &mut slots[digit(key, depth, bits)];
            slot.count = slot.count.saturating_add_signed(delta);
            let child = slot.child.get_or_insert_with(|| Node::Leaf(Leaf::empty(changes.epoch)));
            add_at(child, bits, depth + 1, key, delta, changes);
            if slot.count == 0 {
                slot.child = None;
            }
        }
    }
}

/// Clears the mark of every leaf under `node` (see [`CountTree::next_round`]).
fn unmark_all(node: &mut Node) {
    match node {
        Node::Leaf(leaf) => leaf.marked = 0,
        Node::Inner(slots) => slots.iter_mut().filter_map(|slot| slot.child.as_mut()).for_each(unmark_all),
    }
}

/// Splits an over-full leaf at `depth` into an inner node with leaf children,
/// recursing while a child is still over-full.
fn burst(entries: Vec<Entry>, bits: u32, depth: u32, changes: &mut Changes<'_>) -> Node {
    let mut slots = empty_slots(level_width(depth, bits));
    let mut groups: Vec<Vec<Entry>> = vec![Vec::new(); slots.len()];
    for entry in entries {
        let d = digit(entry.key(), depth, bits);
        slots[d].count += entry.count();
        groups[d].push(entry);
    }
    for (d, mut group) in groups.into_iter().enumerate() {
        group.shrink_to_fit();
        if let Some(first) = group.first().map(|e| e.key()) {
            let child_depth = depth + 1;
            let child = if group.len() > LEAF_CAPACITY && child_depth < max_depth(bits) {
                burst(group, bits, child_depth, changes)
            } else {
                changes.dirty.insert(leaf_id_of(first, child_depth as u8, bits));
                Node::Leaf(Leaf { entries: group, epoch: changes.epoch, marked: changes.round })
            };
            slots[d].child = Some(child);
        }
    }
    Node::Inner(slots)
}

/// What a step of [`CountTree::repack`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Repacked {
    /// Leaves looked at.
    pub visited: usize,
    /// Of those, leaves moved to a fresh allocation.
    pub moved: usize,
}

/// Calls `visit` on every leaf under `node` (whose sub-range starts at
/// `start`) that starts at or after `from`, in key order, until it returns
/// false; returns where that leaf starts, for the next walk to go on from,
/// or `None` if the walk reached the end. The tree may change between
/// walks: leaves that appear behind the cursor are not visited. The walk of
/// repacking passes and of snapshot slices.
fn leaves_from(
    node: &mut Node,
    bits: u32,
    depth: u32,
    start: u128,
    from: u128,
    visit: &mut impl FnMut(LeafId, &mut Leaf) -> bool,
) -> Option<u128> {
    match node {
        Node::Leaf(leaf) => {
            let go_on = start < from || visit(LeafId { prefix: start, depth: depth as u8 }, leaf);
            (!go_on).then_some(start)
        }
        Node::Inner(slots) => {
            let shift = KEY_BITS - bits * depth - level_bits(depth, bits);
            for (d, slot) in slots.iter_mut().enumerate() {
                let child_start = start | ((d as u128) << shift);
                let child_end = child_start | ((1u128 << shift) - 1);
                if child_end < from {
                    continue;
                }
                if let Some(child) = &mut slot.child {
                    if let Some(next) = leaves_from(child, bits, depth + 1, child_start, from, visit) {
                        return Some(next);
                    }
                }
            }
            None
        }
    }
}

/// [`CountTree::take_dirty`] copies every leaf when at least one leaf in
/// this many players changed: at a checkpoint, with leaves a few players
/// each, nearly all have. Below, it looks up only the changed ones.
const MOSTLY_CHANGED_PLAYERS_PER_LEAF: u64 = 64;

/// Copies of leaves' entries, in one buffer, each leaf with its place in it.
#[derive(Debug, Default)]
struct LeafCopies {
    leaves: Vec<(LeafId, std::ops::Range<usize>)>,
    entries: Vec<Entry>,
}

impl LeafCopies {
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
    changed: Option<LeafSet>,
    walked: LeafCopies,
    /// Copied on write; none is among `walked`.
    ahead: CopiesOnWrite,
    /// Leaves whose sub-range starts here or after come in later slices;
    /// `None`: the last slice.
    upto: Option<u128>,
}

impl LeafSlice {
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
            self.changed = changed.into_iter().collect();
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

fn collect(node: &Node, out: &mut Vec<(u128, u64)>) {
    match node {
        Node::Leaf(leaf) => out.extend(leaf.entries.iter().map(|e| (e.key(), e.count()))),
        Node::Inner(slots) => slots.iter().filter_map(|slot| slot.child.as_ref()).for_each(|c| collect(c, out)),
    }
}

fn check_node(node: &Node, bits: u32, depth: u32, prefix: u128) -> Result<u64, String> {
    match node {
        Node::Leaf(leaf) => {
            let id = LeafId { prefix, depth: depth as u8 };
            for pair in leaf.entries.windows(2) {
                if pair[0].key() >= pair[1].key() {
                    return Err(format!("leaf {id:?} not sorted"));
                }
            }
            let mut sum = 0u64;
            for (key, count) in leaf.entries.iter().map(|e| (e.key(), e.count())) {
                if count == 0 || leaf_id_of(key, depth as u8, bits) != id {
                    return Err(format!("leaf {id:?} holds bad entry {key:#x}:{count}"));
                }
                sum += count;
            }
            Ok(sum)
        }
        Node::Inner(slots) => {
            let width = level_bits(depth, bits);
            let shift = KEY_BITS - bits * depth - width;
            let mut sum = 0u64;
            for (d, slot) in slots.iter().enumerate() {
                let below = match &slot.child {
                    Some(c) => check_node(c, bits, depth + 1, prefix | ((d as u128) << shift))?,
                    None => 0,
                };
                if below != slot.count || (slot.child.is_some() && below == 0) {
                    return Err(format!("inner at depth {depth} child {d}: count {} but {below} below", slot.count));
                }
                sum += below;
            }
            Ok(sum)
        }
    }
}

fn encode_entries(entries: &[Entry], encoding: LeafEncoding) -> Vec<u8> {
    match encoding {
        LeafEncoding::Fixed => {
            let mut out = Vec::with_capacity(entries.len() * 24);
            for entry in entries {
                out.extend_from_slice(&entry.key().to_be_bytes());
                out.extend_from_slice(&entry.count().to_be_bytes());
            }
            out
        }
        LeafEncoding::Delta => {
            let mut out = Vec::with_capacity(entries.len() * 12);
            let mut previous_high = 0u64;
            for entry in entries {
                let (high, low) = (entry.key_high, entry.key_low);
                // Sorted keys: the high halves never decrease.
                put_varint(&mut out, high - previous_high);
                put_varint(&mut out, low);
                put_varint(&mut out, entry.count());
                previous_high = high;
            }
            out
        }
    }
}

/// LEB128: seven bits a byte, low bits first.
fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push(value as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Reads a varint at `*at`, moving past it; `None` if it is cut short or
/// does not fit in 64 bits.
fn take_varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *bytes.get(*at)?;
        *at += 1;
        let bits = u64::from(byte & 0x7f);
        if shift == 63 && bits > 1 {
            return None;
        }
        value |= bits << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

fn decode_leaf(bytes: &[u8], encoding: LeafEncoding) -> Result<Leaf, CorruptLeaf> {
    match encoding {
        LeafEncoding::Fixed => decode_fixed_leaf(bytes),
        LeafEncoding::Delta => decode_delta_leaf(bytes),
    }
}

fn decode_delta_leaf(bytes: &[u8]) -> Result<Leaf, CorruptLeaf> {
    // Every varint ends in a byte below 0x80 and an entry is three of them:
    // the leaf is allocated at its final size, like a fixed one.
    let mut entries: Vec<Entry> = Vec::with_capacity(bytes.iter().filter(|b| **b < 0x80).count() / 3);
    let (mut at, mut previous_high) = (0, 0u64);
    while at < bytes.len() {
        let mut next = || take_varint(bytes, &mut at).ok_or(CorruptLeaf("varint cut short or too long"));
        let (delta, low, count) = (next()?, next()?, next()?);
        let high = previous_high.checked_add(delta).ok_or(CorruptLeaf("key past the key space"))?;
        push_decoded(&mut entries, (u128::from(high) << 64) | u128::from(low), count)?;
        previous_high = high;
    }
    Ok(Leaf { entries, ..Leaf::default() })
}

fn decode_fixed_leaf(bytes: &[u8]) -> Result<Leaf, CorruptLeaf> {
    if bytes.len() % 24 != 0 {
        return Err(CorruptLeaf("length not a multiple of 24"));
    }
    let mut entries = Vec::with_capacity(bytes.len() / 24);
    for chunk in bytes.chunks_exact(24) {
        let (key, count) = chunk.split_at(16);
        let key = u128::from_be_bytes(key.try_into().map_err(|_| CorruptLeaf("key"))?);
        let count = u64::from_be_bytes(count.try_into().map_err(|_| CorruptLeaf("count"))?);
        push_decoded(&mut entries, key, count)?;
    }
    Ok(Leaf { entries, ..Leaf::default() })
}

/// Appends a decoded entry, in either encoding, if the leaf stays one the
/// tree could have written: keys ascending, counts from 1 to `u32::MAX`.
fn push_decoded(entries: &mut Vec<Entry>, key: u128, count: u64) -> Result<(), CorruptLeaf> {
    if count == 0 || count > u64::from(u32::MAX) || entries.last().is_some_and(|e| e.key() >= key) {
        return Err(CorruptLeaf("entries unsorted, empty or over-full"));
    }
    entries.push(Entry::new(key, count));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    /// The oracle: a plain multiset of keys.
    #[derive(Default)]
    struct Oracle(BTreeMap<u128, u64>);

    impl Oracle {
        fn add(&mut self, key: u128, delta: i64) {
            let c = self.0.entry(key).or_default();
            *c = c.saturating_add_signed(delta);
            if *c == 0 {
                self.0.remove(&key);
            }
        }
        /// `(key, count)` pairs in key order, as [`CountTree::entries`] gives them.
        fn entries(&self) -> Vec<(u128, u64)> {
            self.0.iter().map(|(k, c)| (*k, *c)).collect()
        }
        fn before(&self, key: u128) -> u64 {
            self.0.range(..key).map(|(_, c)| c).sum()
        }
    }

    fn extreme_key() -> impl Strategy<Value = u128> {
        prop_oneof![
            Just(0u128),
            Just(u128::MAX),
            Just(1u128 << 127),
            (0u64..8).prop_map(|x| (u128::from(x) << 64) | 7),
            (any::<u64>(), 0u64..4).prop_map(|(hi, lo)| (u128::from(hi) << 64) | u128::from(lo)),
            any::<u128>(),
        ]
    }

    /// A leaf a checkpoint writes: its encoding, or `None` to delete it.
    type Written = (LeafId, Option<Vec<u8>>);

    /// Appends to `out` the leaves `picker` writes for `slice`, the next
    /// slice of its snapshot.
    fn pick_into(picker: &mut SlicePicker, slice: LeafSlice, encoding: LeafEncoding, out: &mut Vec<Written>) {
        picker
            .pick(slice, encoding, |id, bytes| {
                out.push((id, bytes));
                Ok::<(), ()>(())
            })
            .unwrap();
    }

    /// The leaves a checkpoint of `slice` (taken at once) writes, in order.
    fn written(slice: LeafSlice, encoding: LeafEncoding) -> Vec<Written> {
        let mut out = Vec::new();
        pick_into(&mut SlicePicker::default(), slice, encoding, &mut out);
        out
    }

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

    /// Writes a checkpoint's `written` leaves to `disk`: in key order, once each.
    fn store_written(disk: &mut BTreeMap<LeafId, Vec<u8>>, written: Vec<Written>) {
        assert!(written.windows(2).all(|w| w[0].0 < w[1].0), "changed leaves in key order, once each");
        for (id, bytes) in written {
            match bytes {
                Some(b) => disk.insert(id, b),
                None => disk.remove(&id),
            };
        }
    }

    /// Writes a checkpoint of `leaves` (taken at once) to `disk`.
    fn store(disk: &mut BTreeMap<LeafId, Vec<u8>>, leaves: LeafSlice, encoding: LeafEncoding) {
        store_written(disk, written(leaves, encoding));
    }

    fn loaded(disk: &BTreeMap<LeafId, Vec<u8>>, branching: u32, encoding: LeafEncoding) -> CountTree {
        let mut fresh = CountTree::new(branching).unwrap();
        for (id, bytes) in disk {
            fresh.install_leaf(*id, bytes, encoding).unwrap();
        }
        fresh
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
            tree.prefetch_many(&probes); // walks any shape, keys in any order
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
            cycles in proptest::collection::vec((0usize..300, 1usize..24, 0usize..6, 0usize..4), 1..5),
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
            // `abandon_after`: 0 never, else after that many slices.
            for (before, budget, between, abandon_after) in cycles {
                apply(&mut tree, &mut oracle, before);
                tree.begin_snapshot();
                let at_begin = oracle.entries();
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

    #[test]
    fn dense_cluster_bursts_to_full_depth() {
        // 1000 keys differing only in the last bits force bursts down to the
        // deepest level; ranks must stay exact there.
        for branching in BRANCHINGS {
            let mut tree = CountTree::new(branching).unwrap();
            for k in 0..1000u128 {
                tree.add(u128::MAX - k, 1);
            }
            tree.check().unwrap();
            assert_eq!(tree.count_before(u128::MAX), 999);
            assert_eq!(tree.count_before(u128::MAX - 500), 499);
            for k in 0..1000u128 {
                tree.add(u128::MAX - k, -1);
            }
            tree.check().unwrap();
            assert_eq!(tree.total(), 0);
            assert!(tree.entries().is_empty());
        }
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

    proptest! {
        /// Varints round-trip every u64, and the delta encoding takes less
        /// than half the fixed one's bytes for keys spread like scores.
        #[test]
        fn varints_round_trip(values in proptest::collection::vec(any::<u64>(), 0..50)) {
            let mut out = Vec::new();
            values.iter().for_each(|v| put_varint(&mut out, *v));
            let mut at = 0;
            for v in &values {
                prop_assert_eq!(take_varint(&out, &mut at), Some(*v));
            }
            prop_assert_eq!(at, out.len());
        }
    }

    #[test]
    fn delta_leaves_are_less_than_half_as_big() {
        // 40 players in one leaf of a 10M-player tree: scores within 2^44 of
        // each other, arrival sequences up to 10M.
        let mut keys: Vec<u128> =
            (0..40u128).map(|i| (0x1234_5000_0000_0000 + i * 0x1_0000_0000) << 64 | (i * 250_000)).collect();
        keys.sort_unstable();
        let leaf = Leaf { entries: keys.iter().map(|k| Entry::new(*k, 1)).collect(), ..Leaf::default() };
        let (fixed, delta) =
            (encode_entries(&leaf.entries, LeafEncoding::Fixed), encode_entries(&leaf.entries, LeafEncoding::Delta));
        assert_eq!(fixed.len(), 40 * 24);
        assert!(delta.len() * 2 < fixed.len(), "{} bytes", delta.len());
        assert_eq!(decode_leaf(&delta, LeafEncoding::Delta).unwrap(), leaf);
    }
}
