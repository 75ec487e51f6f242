//! The in-memory layout of a count tree (inner nodes of counted slots,
//! sorted leaves of packed entries) and the recursive walks over it.

use super::entries::Entries;
use super::snapshot::{keep_root_snapshot, CopiesOnWrite};
#[cfg(doc)]
use super::CountTree; // for doc links
use super::{Pending, RootSnapshot, LEAF_CAPACITY};

pub(super) const KEY_BITS: u32 = 128;

/// Where a leaf sits: its depth and the key bits above it (lower bits zero).
/// This is also the leaf's identity on disk.
///
/// Packed to 8-byte alignment: 24 bytes instead of the 32 a 16-aligned
/// `u128` pads it to. The set of leaves changed since the last checkpoint
/// holds one per leaf, as does each checkpoint's sorted list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(C, packed(8))]
pub struct LeafId {
    /// Key bits shared by every key in the leaf, lower bits cleared.
    pub prefix: u128,
    /// Number of levels above the leaf (0 = the root).
    pub depth: u8,
}

const _: () = assert!(std::mem::size_of::<LeafId>() == 24);

impl LeafId {
    /// The root leaf's id: the whole key range at depth 0, the one leaf of
    /// a compact tree.
    pub const ROOT: Self = Self { prefix: 0, depth: 0 };
}

#[derive(Debug)]
pub(super) enum Node {
    Leaf(Leaf),
    Inner(Box<[Slot]>),
}

/// A node as reads see it: a leaf's sorted entries or an inner node's
/// slots. A frozen tree's root is entries without a [`Leaf`] around them.
#[derive(Debug, Clone, Copy)]
pub(super) enum NodeRef<'a> {
    Leaf(&'a [Entry]),
    Inner(&'a [Slot]),
}

impl Node {
    /// This node as reads see it.
    pub(super) fn as_node_ref(&self) -> NodeRef<'_> {
        match self {
            Node::Leaf(leaf) => NodeRef::Leaf(&leaf.entries),
            Node::Inner(slots) => NodeRef::Inner(slots),
        }
    }
}

/// Sorted keys of one sub-range with their player counts.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Leaf {
    /// Sorted by key, so a rank's last step is a binary search.
    pub(super) entries: Entries,
    /// The tree's [`CountTree::epoch`] when the leaf was made or last
    /// copied into a snapshot: while a snapshot is being copied, a leaf of
    /// an older epoch is one it still needs as it was.
    pub(super) epoch: u32,
    /// The tree's [`CountTree::round`] when the leaf was last put in the
    /// set of changed leaves: while they are equal it is there, and a
    /// change need not hash its id into the set again (the set is large:
    /// an insert waits for memory). Fits beside `epoch`: a leaf is 24
    /// bytes.
    pub(super) marked: u32,
}

const _: () = assert!(std::mem::size_of::<Leaf>() == 24);

impl Leaf {
    /// A leaf made now, in the tree's epoch `epoch`: it holds nothing a
    /// snapshot under way still needs.
    pub(super) fn empty(epoch: u32) -> Self {
        Self { entries: Entries::default(), epoch, marked: 0 }
    }
}

/// One distinct key of a leaf and how many players hold it.
///
/// Leaves hold every player, so this layout is most of a tree's memory: a
/// plain `(u128, u64)` takes 32 bytes (u128 is 16-aligned), this takes 20.
/// A count saturates at `u32::MAX` players on one key.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C, packed(4))]
pub(super) struct Entry {
    /// The key's high half (the score key): halves rather than a `u128`,
    /// so the packed entry needs no 16-byte alignment.
    pub(super) key_high: u64,
    /// The key's low half (the tiebreak).
    pub(super) key_low: u64,
    /// Players on the key, saturating at `u32::MAX` (see [`Entry::new`]):
    /// four bytes keep an entry at 20.
    count: u32,
}

impl Entry {
    pub(super) fn new(key: u128, count: u64) -> Self {
        Self { key_high: (key >> 64) as u64, key_low: key as u64, count: u32::try_from(count).unwrap_or(u32::MAX) }
    }

    pub(super) fn key(self) -> u128 {
        (u128::from(self.key_high) << 64) | u128::from(self.key_low)
    }

    pub(super) fn count(self) -> u64 {
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
/// one allocation and a few adjacent cache lines.
#[derive(Debug)]
pub(super) struct Slot {
    /// Players in the sub-range: what a rank walk sums before its digit.
    pub(super) count: u64,
    /// The sub-range's node, absent while it holds no player.
    pub(super) child: Option<Node>,
}

/// The slots of a new inner node with `width` empty sub-ranges.
pub(super) fn empty_slots(width: usize) -> Box<[Slot]> {
    std::iter::repeat_with(|| Slot { count: 0, child: None }).take(width).collect()
}

/// Deepest level a leaf can sit at: below it every key is one value.
pub(super) fn max_depth(bits: u32) -> u32 {
    KEY_BITS.div_ceil(bits)
}

/// Key bits consumed by the level at `depth` (the last level may be narrower).
pub(super) fn level_bits(depth: u32, bits: u32) -> u32 {
    bits.min(KEY_BITS - bits * depth)
}

pub(super) fn level_width(depth: u32, bits: u32) -> usize {
    1usize << level_bits(depth, bits)
}

/// The child index of `key` at `depth`.
pub(super) fn digit(key: u128, depth: u32, bits: u32) -> usize {
    let used = bits * depth;
    let width = level_bits(depth, bits);
    let shift = KEY_BITS - used - width;
    ((key >> shift) & ((1u128 << width) - 1)) as usize
}

pub(super) fn leaf_id_of(key: u128, depth: u8, bits: u32) -> LeafId {
    let used = (bits * u32::from(depth)).min(KEY_BITS);
    let prefix = if used == 0 { 0 } else { key & (u128::MAX << (KEY_BITS - used)) };
    LeafId { prefix, depth }
}

/// Asks the CPU to load `entries` without waiting for them: a leaf's
/// entries (or a frozen leaf's packed bytes) ahead of the binary search, a
/// board ahead of its lookup. A leaf is up to ~1.3 KB, and the search's
/// probes each waited for memory in turn; asked for all at once, the waits
/// overlap.
pub fn prefetch_entries<T>(entries: &[T]) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = entries;
    #[cfg(target_arch = "x86_64")]
    {
        let start = entries.as_ptr().cast::<i8>();
        let mut offset = 0;
        for _ in 0..lines_touched(start as usize, std::mem::size_of_val(entries)) {
            // SAFETY: prefetching is a hint that never faults, and the address
            // is inside the slice or, on its last line, less than 64 bytes past
            // its end (`wrapping_add`: no out-of-bounds `add`).
            unsafe { std::arch::x86_64::_mm_prefetch(start.wrapping_add(offset), std::arch::x86_64::_MM_HINT_T0) };
            offset += 64;
        }
    }
}

/// The cache lines `bytes` bytes from `address` touch: the first may start
/// before them, so 48 bytes can span two.
fn lines_touched(address: usize, bytes: usize) -> usize {
    (address % 64 + bytes).div_ceil(64)
}

/// What an [`add_at`] records besides the counts.
pub(super) struct Changes<'a> {
    /// The tree's changed leaves, which every changed leaf but a compact
    /// root joins, and its snapshot.
    pub(super) pending: &'a mut Option<Box<Pending>>,
    /// The tree's [`CountTree::round`]: a leaf marked with it changed.
    pub(super) round: u32,
    /// The tree's [`CountTree::epoch`]: a leaf of another is copied before
    /// it changes, while a snapshot is being copied.
    pub(super) epoch: u32,
    /// The tree's [`CountTree::root_snapshot`]: the compact root is copied
    /// before it changes.
    pub(super) root_snapshot: &'a mut RootSnapshot,
}

impl Changes<'_> {
    /// Counts leaf `id` as changed.
    fn changed(&mut self, id: LeafId) {
        self.pending.get_or_insert_default().dirty.insert(id);
    }

    /// Where a leaf goes, as it was, before its first change while a
    /// snapshot is being copied.
    fn copies_on_write(&mut self) -> Option<&mut CopiesOnWrite> {
        let snapshot = self.pending.as_mut()?.snapshot.as_mut()?;
        snapshot.walk.is_some().then_some(&mut snapshot.ahead)
    }
}

/// Returns the key's count after the change.
pub(super) fn add_at(node: &mut Node, bits: u32, depth: u32, key: u128, delta: i64, changes: &mut Changes<'_>) -> u64 {
    match node {
        Node::Leaf(leaf) => {
            prefetch_entries(&leaf.entries);
            let id = leaf_id_of(key, depth as u8, bits);
            if leaf.epoch != changes.epoch {
                leaf.epoch = changes.epoch;
                if depth == 0 && *changes.root_snapshot != RootSnapshot::Off {
                    *changes.root_snapshot = RootSnapshot::Off;
                    keep_root_snapshot(changes.pending, &leaf.entries);
                } else if let Some(snapshot) = changes.copies_on_write() {
                    if !leaf.entries.is_empty() {
                        snapshot.insert(id, leaf.entries[..].into());
                    }
                }
            }
            if leaf.marked != changes.round {
                leaf.marked = changes.round;
                if depth > 0 {
                    changes.changed(id); // a compact root's mark is its record
                }
            }
            let count = match leaf.entries.binary_search_by(|e| e.key().cmp(&key)) {
                Ok(i) => {
                    let count = leaf.entries[i].count().saturating_add_signed(delta);
                    if count == 0 {
                        leaf.entries.edit(|entries| entries.remove(i));
                    } else {
                        leaf.entries[i] = Entry::new(key, count);
                    }
                    count
                }
                Err(i) if delta > 0 => {
                    leaf.entries.edit(|entries| {
                        reserve_one(entries);
                        entries.insert(i, Entry::new(key, delta.unsigned_abs()));
                    });
                    delta.unsigned_abs()
                }
                Err(_) => 0,
            };
            if leaf.entries.len() > LEAF_CAPACITY && depth < max_depth(bits) {
                if depth == 0 {
                    changes.changed(id); // the stored root leaf is to be deleted
                }
                let entries = std::mem::take(&mut leaf.entries);
                *node = burst(entries.into_vec(), bits, depth, changes);
            }
            count
        }
        Node::Inner(slots) => {
            let slot = &mut slots[digit(key, depth, bits)];
            slot.count = slot.count.saturating_add_signed(delta);
            let child = slot.child.get_or_insert_with(|| Node::Leaf(Leaf::empty(changes.epoch)));
            let count = add_at(child, bits, depth + 1, key, delta, changes);
            if slot.count == 0 {
                slot.child = None;
            }
            count
        }
    }
}

/// Clears the mark of every leaf under `node` (see [`CountTree::next_round`]).
pub(super) fn unmark_all(node: &mut Node) {
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
                changes.changed(leaf_id_of(first, child_depth as u8, bits));
                Node::Leaf(Leaf { entries: group.into(), epoch: changes.epoch, marked: changes.round })
            };
            slots[d].child = Some(child);
        }
    }
    Node::Inner(slots)
}

/// Calls `visit` on every leaf under `node` (whose sub-range starts at
/// `start`) that starts at or after `from`, in key order, until it returns
/// false; returns where that leaf starts, for the next walk to go on from,
/// or `None` if the walk reached the end. The tree may change between
/// walks: leaves that appear behind the cursor are not visited. The walk of
/// repacking passes and of snapshot slices.
pub(super) fn leaves_from(
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

/// The child of `slot`, as reads see it.
pub(super) fn child_ref(slot: &Slot) -> Option<NodeRef<'_>> {
    slot.child.as_ref().map(Node::as_node_ref)
}

pub(super) fn collect(node: NodeRef<'_>, out: &mut Vec<(u128, u64)>) {
    match node {
        NodeRef::Leaf(entries) => out.extend(entries.iter().map(|e| (e.key(), e.count()))),
        NodeRef::Inner(slots) => slots.iter().filter_map(child_ref).for_each(|c| collect(c, out)),
    }
}

/// Appends the keys under `node` held by at least `min` players, skipping
/// sub-ranges that hold fewer in all.
pub(super) fn collect_crowded(node: NodeRef<'_>, min: u64, out: &mut Vec<u128>) {
    match node {
        NodeRef::Leaf(entries) => out.extend(entries.iter().filter(|e| e.count() >= min).map(|e| e.key())),
        NodeRef::Inner(slots) => slots
            .iter()
            .filter(|slot| slot.count >= min)
            .filter_map(child_ref)
            .for_each(|c| collect_crowded(c, min, out)),
    }
}

pub(super) fn check_node(node: NodeRef<'_>, bits: u32, depth: u32, prefix: u128) -> Result<u64, String> {
    match node {
        NodeRef::Leaf(entries) => {
            let id = LeafId { prefix, depth: depth as u8 };
            for pair in entries.windows(2) {
                if pair[0].key() >= pair[1].key() {
                    return Err(format!("leaf {id:?} not sorted"));
                }
            }
            let mut sum = 0u64;
            for (key, count) in entries.iter().map(|e| (e.key(), e.count())) {
                if count == 0 || leaf_id_of(key, depth as u8, bits) != id {
                    return Err(format!("leaf {id:?} holds bad entry {key:#x}:{count}"));
                }
                sum += count;
            }
            Ok(sum)
        }
        NodeRef::Inner(slots) => {
            let width = level_bits(depth, bits);
            let shift = KEY_BITS - bits * depth - width;
            let mut sum = 0u64;
            for (d, slot) in slots.iter().enumerate() {
                let below = match child_ref(slot) {
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

#[cfg(test)]
mod tests {
    use crate::tree::{CountTree, BRANCHINGS};

    #[test]
    fn a_prefetch_covers_every_line_its_bytes_touch() {
        use super::lines_touched;
        assert_eq!(lines_touched(0, 0), 0);
        assert_eq!(lines_touched(64, 1), 1);
        assert_eq!(lines_touched(64, 64), 1);
        assert_eq!(lines_touched(65, 64), 2, "one byte into the next line");
        assert_eq!(lines_touched(40, 48), 2, "a board straddling two lines");
        assert_eq!(lines_touched(48, 96), 3);
        assert_eq!(lines_touched(127, 1), 1);
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
}
