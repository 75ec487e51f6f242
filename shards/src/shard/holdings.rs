//! What a shard holds of each board: its config and its count trees.
//!
//! A board's config and its all-time tree (the one tree most boards have)
//! share one entry, kept by board id in an [`IdTable`]; periodic windows'
//! trees are in a map of their own. A million small boards held a config
//! map and a tree map of a million entries each: two tables of two million
//! buckets a shard, where one entry a board suffices. It also makes a
//! board's trees and the periodic trees (the only ones that expire) found
//! without a look at every tree.
//!
//! An all-time tree that is small and idle is kept frozen, inline in the
//! entry (see [`FrozenTree`]); a write thaws it, and it freezes again once
//! a checkpoint has handed its change out ([`Holdings::freeze_if_idle`]) or
//! the next checkpoint finds it idle ([`Holdings::visit_live_trees`]).
//!
//! A config and a tree are held independently, as before they shared an
//! entry: a dropped board's config goes at once and its trees as they are
//! forgotten, and replay may meet a tree before its board's config.

use std::collections::HashMap;
use std::sync::Arc;

use super::id_table::{IdTable, Slot};
use crate::board::BoardConfig;
use crate::key::TreeId;
use crate::tree::{CorruptLeaf, CountTree, FrozenTree, LeafEncoding, LeafId, TreeView};
use crate::FastHasher;

/// A board's all-time tree, as its entry keeps it.
#[derive(Debug, Default)]
enum AllTime {
    #[default]
    Absent,
    /// Small and idle: its root leaf, inline.
    Frozen(FrozenTree),
    /// Taking writes, or part of a checkpoint.
    Live(Box<CountTree>),
}

/// One board's entry: absent once it holds neither.
#[derive(Debug, Default)]
struct Holding {
    config: Option<Arc<BoardConfig>>,
    all_time: AllTime,
}

/// A frozen tree inline (15 bytes: its packed leaf, or a pointer to it)
/// and its variant's tag in 16, a config in 8: a page of 64 entries is 1.5
/// KiB. Against a 16-byte entry and a 48-byte box per tree, an idle small
/// board costs 40 bytes less a shard; a page whose other 63 ids hold
/// nothing here (see [`IdTable`]) costs 504 bytes more.
const _: () = assert!(std::mem::size_of::<Holding>() == 24);

impl Slot for Holding {
    fn is_vacant(&self) -> bool {
        self.config.is_none() && matches!(self.all_time, AllTime::Absent)
    }
}

impl AllTime {
    /// The tree to change, thawed if frozen; `None` if absent.
    fn live(&mut self, branching: u32) -> Option<&mut CountTree> {
        if let Self::Frozen(_) = self {
            let Self::Frozen(frozen) = std::mem::take(self) else { unreachable!("frozen just above") };
            *self = Self::Live(frozen.thaw(branching));
        }
        match self {
            Self::Live(tree) => Some(tree),
            _ => None,
        }
    }

    fn view(&self, branching: u32) -> Option<TreeView<'_>> {
        match self {
            Self::Absent => None,
            Self::Frozen(frozen) => Some(frozen.view(branching)),
            Self::Live(tree) => Some(tree.view()),
        }
    }

    /// Freezes a live tree that is small and idle; whether it did.
    fn freeze_if_idle(&mut self) -> bool {
        if let Self::Live(_) = self {
            let Self::Live(tree) = std::mem::take(self) else { unreachable!("live just above") };
            *self = match tree.freeze() {
                Ok(frozen) => Self::Frozen(frozen),
                Err(tree) => Self::Live(tree),
            };
        }
        matches!(self, Self::Frozen(_))
    }
}

/// A shard's trees by form (see [`crate::Shard::tree_forms`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeForms {
    /// Small and idle, kept as their one sorted leaf ([`FrozenTree`]).
    pub frozen: usize,
    /// One sorted leaf, taking writes or part of a checkpoint.
    pub compact: usize,
    /// Burst into nodes, as of the last checkpoint.
    pub burst: usize,
}

/// A shard's boards' configs and count trees; see the module docs.
#[derive(Debug)]
pub(super) struct Holdings {
    boards: IdTable<Holding>,
    /// Trees of any view but the all-time one, by id. Never frozen: few.
    periodic: HashMap<TreeId, Box<CountTree>, FastHasher>,
    /// Entries of `boards` with a config.
    configs: usize,
    /// Entries of `boards` with an all-time tree.
    all_time_trees: usize,
    /// Of those, frozen ones.
    frozen_trees: usize,
    /// The shard's branching factor (validated at open): a frozen tree
    /// does not keep its own.
    branching: u32,
}

/// The board of `tree` if it is a board's all-time tree, the one held in
/// the board's entry.
fn all_time_board(tree: &TreeId) -> Option<u64> {
    tree.is_all_time().then_some(tree.board)
}

impl Holdings {
    /// Nothing held yet, for trees of `branching` (validated at open).
    pub(super) fn new(branching: u32) -> Self {
        Self::with_capacity(0, branching)
    }

    /// Room for `boards` boards of consecutive ids without growing.
    pub(super) fn with_capacity(boards: usize, branching: u32) -> Self {
        Self {
            boards: IdTable::with_capacity(boards),
            periodic: HashMap::default(),
            configs: 0,
            all_time_trees: 0,
            frozen_trees: 0,
            branching,
        }
    }

    // Configs.

    /// The config of board `board`, if held.
    pub(super) fn config(&self, board: u64) -> Option<&Arc<BoardConfig>> {
        self.boards.get(board)?.config.as_ref()
    }

    /// The config of board `board`, if held, to be replaced by an equal one.
    pub(super) fn config_mut(&mut self, board: u64) -> Option<&mut Arc<BoardConfig>> {
        self.boards.get_mut(board)?.config.as_mut()
    }

    /// Holds `config` for board `board`; returns the one it replaces.
    pub(super) fn insert_config(&mut self, board: u64, config: Arc<BoardConfig>) -> Option<Arc<BoardConfig>> {
        let old = self.boards.get_or_default(board).config.replace(config);
        self.configs += usize::from(old.is_none());
        old
    }

    /// Stops holding board `board`'s config (its trees stay); returns it.
    pub(super) fn remove_config(&mut self, board: u64) -> Option<Arc<BoardConfig>> {
        let old = self.take_from(board, |holding| holding.config.take())?;
        self.configs -= 1;
        Some(old)
    }

    /// Every config held, by board id, in no order.
    pub(super) fn configs(&self) -> impl ExactSizeIterator<Item = (u64, &Arc<BoardConfig>)> {
        Configs { boards: self.boards.iter(), left: self.configs }
    }

    // Trees.

    /// The tree `tree`, if held, to read.
    pub(super) fn tree(&self, tree: &TreeId) -> Option<TreeView<'_>> {
        match all_time_board(tree) {
            Some(board) => self.boards.get(board)?.all_time.view(self.branching),
            None => self.periodic.get(tree).map(|t| t.view()),
        }
    }

    /// The tree `tree`, if held, to change: thawed if frozen.
    pub(super) fn tree_mut(&mut self, tree: &TreeId) -> Option<&mut CountTree> {
        match all_time_board(tree) {
            Some(board) => {
                let all_time = &mut self.boards.get_mut(board)?.all_time;
                self.frozen_trees -= usize::from(matches!(all_time, AllTime::Frozen(_)));
                all_time.live(self.branching)
            }
            None => self.periodic.get_mut(tree).map(|t| &mut **t),
        }
    }

    /// The tree `tree` to change, thawed if frozen, made empty if not held
    /// yet.
    pub(super) fn tree_or_new(&mut self, tree: TreeId) -> &mut CountTree {
        let branching = self.branching;
        let new = || Box::new(CountTree::new(branching).expect("branching validated at open"));
        match all_time_board(&tree) {
            Some(board) => {
                let all_time = &mut self.boards.get_or_default(board).all_time;
                match all_time {
                    AllTime::Absent => {
                        self.all_time_trees += 1;
                        *all_time = AllTime::Live(new());
                    }
                    AllTime::Frozen(_) => self.frozen_trees -= 1,
                    AllTime::Live(_) => {}
                }
                all_time.live(branching).expect("held: made above")
            }
            None => self.periodic.entry(tree).or_insert_with(new),
        }
    }

    /// Places a stored leaf of `tree` while the shard loads (see
    /// [`CountTree::install_leaf`]): a compact tree's root leaf, met first,
    /// makes it frozen.
    pub(super) fn install_leaf(
        &mut self,
        tree: TreeId,
        id: LeafId,
        bytes: &[u8],
        encoding: LeafEncoding,
    ) -> Result<(), CorruptLeaf> {
        if let (Some(board), LeafId::ROOT) = (all_time_board(&tree), id) {
            let all_time = &mut self.boards.get_or_default(board).all_time;
            if let AllTime::Absent = all_time {
                if let Some(frozen) = FrozenTree::load_root(bytes, encoding)? {
                    *all_time = AllTime::Frozen(frozen);
                    self.all_time_trees += 1;
                    self.frozen_trees += 1;
                } else {
                    self.boards.tidy(board);
                }
                return Ok(());
            }
        }
        self.tree_or_new(tree).install_leaf(id, bytes, encoding)
    }

    /// Stops holding `tree`; returns how many players it held.
    pub(super) fn remove_tree(&mut self, tree: &TreeId) -> Option<u64> {
        let Some(board) = all_time_board(tree) else { return self.periodic.remove(tree).map(|t| t.total()) };
        let branching = self.branching;
        let (players, was_frozen) = self.take_from(board, |holding| {
            let gone = std::mem::take(&mut holding.all_time);
            Some((gone.view(branching)?.total(), matches!(gone, AllTime::Frozen(_))))
        })?;
        self.all_time_trees -= 1;
        self.frozen_trees -= usize::from(was_frozen);
        Some(players)
    }

    /// What `take` takes out of board `board`'s entry; the entry goes once
    /// it holds nothing.
    fn take_from<T>(&mut self, board: u64, take: impl FnOnce(&mut Holding) -> Option<T>) -> Option<T> {
        let taken = take(self.boards.get_mut(board)?)?;
        self.boards.tidy(board);
        Some(taken)
    }

    /// Trees held.
    pub(super) fn tree_count(&self) -> usize {
        self.all_time_trees + self.periodic.len()
    }

    /// Of those, frozen ones.
    pub(super) fn frozen_count(&self) -> usize {
        self.frozen_trees
    }

    /// Every tree held, to read, in no order.
    pub(super) fn trees(&self) -> impl Iterator<Item = (TreeId, TreeView<'_>)> {
        let branching = self.branching;
        let all_time = self
            .boards
            .iter()
            .filter_map(move |(board, holding)| Some((TreeId::all_time(board), holding.all_time.view(branching)?)));
        all_time.chain(self.periodic.iter().map(|(&id, tree)| (id, tree.view())))
    }

    /// Calls `visit` on every live tree, in no order; then freezes each
    /// all-time tree `visit` left small and idle. A frozen tree has no
    /// changed leaf and no snapshot: nothing a checkpoint does concerns it.
    pub(super) fn visit_live_trees(&mut self, mut visit: impl FnMut(TreeId, &mut CountTree)) {
        let mut frozen = 0;
        for (board, holding) in self.boards.iter_mut() {
            if let AllTime::Live(tree) = &mut holding.all_time {
                visit(TreeId::all_time(board), tree);
                frozen += usize::from(holding.all_time.freeze_if_idle());
            }
        }
        self.frozen_trees += frozen;
        self.periodic.iter_mut().for_each(|(&id, tree)| visit(id, tree));
    }

    /// Freezes `tree` if it is a small, idle all-time tree.
    pub(super) fn freeze_if_idle(&mut self, tree: &TreeId) {
        let Some(holding) = all_time_board(tree).and_then(|board| self.boards.get_mut(board)) else { return };
        if let AllTime::Live(_) = holding.all_time {
            self.frozen_trees += usize::from(holding.all_time.freeze_if_idle());
        }
    }

    /// The ids of every tree held, in no order.
    pub(super) fn tree_ids(&self) -> impl Iterator<Item = TreeId> + '_ {
        self.trees().map(|(id, _)| id)
    }

    /// Moves leaves of `tree` off sparse allocator slabs, as
    /// [`CountTree::repack`] does; a frozen tree stays frozen.
    pub(super) fn repack(
        &mut self,
        tree: &TreeId,
        from: u128,
        budget: usize,
        should_move: impl FnMut(*const u8) -> bool,
    ) -> Option<(crate::tree::Repacked, Option<u128>)> {
        let live = match all_time_board(tree) {
            Some(board) => match &mut self.boards.get_mut(board)?.all_time {
                AllTime::Absent => return None,
                AllTime::Frozen(frozen) => return Some(frozen.repack(budget, should_move)),
                AllTime::Live(tree) => tree,
            },
            None => self.periodic.get_mut(tree)?,
        };
        Some(live.repack(from, budget, should_move))
    }

    /// The ids of the trees of periodic windows: the only ones that expire.
    pub(super) fn periodic_tree_ids(&self) -> impl Iterator<Item = TreeId> + '_ {
        self.periodic.keys().copied()
    }

    /// The ids of board `board`'s trees.
    pub(super) fn trees_of(&self, board: u64) -> Vec<TreeId> {
        let all_time =
            self.boards.get(board).filter(|h| !matches!(h.all_time, AllTime::Absent)).map(|_| TreeId::all_time(board));
        all_time.into_iter().chain(self.periodic.keys().filter(|t| t.board == board).copied()).collect()
    }
}

/// [`Holdings::configs`]: the entries with a config, counted.
struct Configs<I> {
    boards: I,
    left: usize,
}

impl<'a, I: Iterator<Item = (u64, &'a Holding)>> Iterator for Configs<I> {
    type Item = (u64, &'a Arc<BoardConfig>);

    fn next(&mut self) -> Option<Self::Item> {
        let found = self.boards.by_ref().find_map(|(board, holding)| Some((board, holding.config.as_ref()?)));
        self.left -= usize::from(found.is_some());
        found
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl<'a, I: Iterator<Item = (u64, &'a Holding)>> ExactSizeIterator for Configs<I> {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::board::{Ties, Window};
    use std::collections::BTreeMap;

    fn daily(board: u64, period: u32) -> TreeId {
        TreeId { board, window: Window::Daily.code(), period }
    }

    fn ids(holdings: &Holdings) -> Vec<TreeId> {
        let mut ids: Vec<TreeId> = holdings.tree_ids().collect();
        ids.sort();
        ids
    }

    #[test]
    fn configs_and_trees_are_held_apart_in_one_entry() {
        let mut held = Holdings::new(16);
        let dense = Arc::new(BoardConfig { ties: Ties::Dense, ..BoardConfig::default() });
        assert!(held.insert_config(1, BoardConfig::default().into()).is_none());
        assert!(held.insert_config(1, dense.clone()).is_some_and(|old| old.ties == Ties::Competition));
        held.tree_or_new(TreeId::all_time(1)).add(5, 1);
        held.tree_or_new(TreeId::all_time(2)).add(6, 2); // a tree before its config (replay)
        held.tree_or_new(daily(1, 3)).add(7, 1);
        assert_eq!((held.configs().len(), held.tree_count()), (1, 3));
        assert_eq!(ids(&held), [TreeId::all_time(1), daily(1, 3), TreeId::all_time(2)]);
        assert_eq!(held.tree(&TreeId::all_time(2)).map(|t| t.total()), Some(2));
        assert_eq!(held.trees_of(1), [TreeId::all_time(1), daily(1, 3)]);
        assert_eq!(held.periodic_tree_ids().collect::<Vec<_>>(), [daily(1, 3)]);

        // Its config goes, its trees stay; then they go too.
        assert!(held.remove_config(1).is_some_and(|c| Arc::ptr_eq(&c, &dense)));
        assert!(held.remove_config(1).is_none());
        assert_eq!(held.configs().len(), 0);
        assert_eq!(held.tree_mut(&TreeId::all_time(1)).map(|t| t.add(5, 1)), Some(2));
        assert!(held.remove_tree(&TreeId::all_time(1)).is_some());
        assert!(held.remove_tree(&TreeId::all_time(1)).is_none());
        assert!(held.remove_tree(&daily(1, 3)).is_some());
        assert_eq!(held.boards.iter().count(), 1, "board 1's entry went with its last holding");
        assert_eq!(held.tree_count(), 1);
    }

    /// Takes every live tree's changes, as a checkpoint does.
    fn checkpointed(held: &mut Holdings) {
        held.visit_live_trees(|_, tree| drop(tree.take_dirty()));
    }

    #[test]
    fn idle_small_trees_freeze_and_thaw_for_writes() {
        let mut held = Holdings::new(16);
        held.insert_config(1, BoardConfig::default().into());
        held.tree_or_new(TreeId::all_time(1)).add(5, 1);
        held.tree_or_new(TreeId::all_time(2)).add(6, 1);
        // Keys far apart: board 2's leaf packs past what fits inline.
        held.tree_or_new(TreeId::all_time(2)).add(1 << 120, 1);
        held.tree_or_new(daily(1, 3)).add(7, 1);
        // Changed since the last checkpoint: a visit leaves them live.
        held.visit_live_trees(|_, _| {});
        assert_eq!(held.frozen_count(), 0);
        // Checkpointed: the all-time trees freeze, the periodic one stays live.
        checkpointed(&mut held);
        assert_eq!((held.frozen_count(), held.tree_count()), (2, 3));
        assert_eq!(held.tree(&TreeId::all_time(1)).map(|t| t.entries()), Some(vec![(5, 1)]));
        assert_eq!(held.trees().count(), 3);
        assert_eq!(held.trees_of(2), [TreeId::all_time(2)]);
        let mut visited = Vec::new();
        held.visit_live_trees(|id, _| visited.push(id));
        assert_eq!(visited, [daily(1, 3)], "a visit passes frozen trees by");

        // Repacking moves a frozen tree's leaf if it is on the heap (not
        // if it is inline) and leaves it frozen.
        let (step, next) = held.repack(&TreeId::all_time(1), 0, 8, |_| true).expect("held");
        assert_eq!((step.visited, step.moved, next, held.frozen_count()), (1, 0, None, 2));
        let (step, next) = held.repack(&TreeId::all_time(2), 0, 8, |_| true).expect("held");
        assert_eq!((step.visited, step.moved, next, held.frozen_count()), (1, 1, None, 2));
        assert_eq!(held.tree(&TreeId::all_time(1)).map(|t| t.entries()), Some(vec![(5, 1)]));
        assert_eq!(held.tree(&TreeId::all_time(2)).map(|t| t.entries()), Some(vec![(6, 1), (1 << 120, 1)]));

        // A write thaws a tree, and so does any change.
        assert_eq!(held.tree_or_new(TreeId::all_time(1)).add(5, 1), 2);
        assert_eq!(held.frozen_count(), 1);
        assert!(held.tree_mut(&TreeId::all_time(2)).is_some());
        assert_eq!(held.frozen_count(), 0);
        checkpointed(&mut held);
        assert_eq!(held.frozen_count(), 2);

        // A frozen tree removed takes its entry with it.
        assert_eq!(held.remove_tree(&TreeId::all_time(2)), Some(2));
        assert_eq!((held.frozen_count(), held.tree_count()), (1, 2));
        assert_eq!(held.boards.iter().count(), 1, "board 2's entry went with its tree");
    }

    #[test]
    fn a_stored_root_leaf_loads_frozen() {
        use crate::tree::SlicePicker;
        let mut tree = CountTree::new(16).expect("branching");
        tree.add(3, 1);
        tree.add(9, 2);
        let mut stored = Vec::new();
        let picked = SlicePicker::default().pick(tree.take_dirty(), LeafEncoding::Delta, |leaf, bytes| {
            stored.push((leaf, bytes));
            Ok::<(), std::convert::Infallible>(())
        });
        let Ok(()) = picked;
        let [(LeafId::ROOT, Some(bytes))] = stored.as_slice() else { panic!("one root leaf: {stored:?}") };

        let mut held = Holdings::new(16);
        held.install_leaf(TreeId::all_time(1), LeafId::ROOT, bytes, LeafEncoding::Delta).expect("valid");
        assert_eq!((held.frozen_count(), held.tree_count()), (1, 1));
        assert_eq!(held.tree(&TreeId::all_time(1)).map(|t| t.entries()), Some(vec![(3, 1), (9, 2)]));
        // A periodic tree's root loads live; a second leaf over a root is corrupt.
        held.install_leaf(daily(1, 2), LeafId::ROOT, bytes, LeafEncoding::Delta).expect("valid");
        assert_eq!((held.frozen_count(), held.tree_count()), (1, 2));
        let deeper = LeafId { prefix: 0, depth: 1 };
        assert!(held.install_leaf(TreeId::all_time(1), deeper, bytes, LeafEncoding::Delta).is_err());
    }

    #[test]
    fn filled_as_a_shard_opens() {
        // Configs in id order, then trees in id order, a periodic one among
        // them and one without a config (a dropped board's, until replay).
        let config = |keep| Arc::new(BoardConfig { keep, ..BoardConfig::default() });
        let mut held = Holdings::with_capacity(3, 4);
        for (id, keep) in [(1, 1), (3, 3), (4, 4)] {
            held.insert_config(id, config(keep));
        }
        for (tree, total) in
            [(TreeId::all_time(1), 1), (daily(1, 2), 12), (TreeId::all_time(2), 2), (TreeId::all_time(4), 4)]
        {
            held.tree_or_new(tree).add(1, total);
        }
        let configs: BTreeMap<u64, u32> = held.configs().map(|(id, c)| (id, c.keep)).collect();
        assert_eq!(configs, BTreeMap::from([(1, 1), (3, 3), (4, 4)]));
        let trees: BTreeMap<TreeId, u64> = held.trees().map(|(id, t)| (id, t.total())).collect();
        let expected =
            [(TreeId::all_time(1), 1), (daily(1, 2), 12), (TreeId::all_time(2), 2), (TreeId::all_time(4), 4)];
        assert_eq!(trees, BTreeMap::from(expected));
        assert_eq!((held.configs().len(), held.tree_count(), held.boards.iter().count()), (3, 4, 4));
    }

    #[test]
    fn counts_follow_a_map_of_each() {
        // Random inserts and removals against a config map and a tree map.
        let mut held = Holdings::new(16);
        let mut configs: BTreeMap<u64, u32> = BTreeMap::new();
        let mut trees: BTreeMap<TreeId, i64> = BTreeMap::new();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..5000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let board = state % 17;
            let tree = if state & 0x100 == 0 { TreeId::all_time(board) } else { daily(board, (state >> 9) as u32 % 3) };
            match (state >> 20) % 4 {
                0 => {
                    let keep = (state >> 30) as u32 % 5;
                    held.insert_config(board, BoardConfig { keep, ..BoardConfig::default() }.into());
                    configs.insert(board, keep);
                }
                1 => assert_eq!(held.remove_config(board).map(|c| c.keep), configs.remove(&board)),
                2 => {
                    held.tree_or_new(tree).add(1, 1);
                    *trees.entry(tree).or_default() += 1;
                }
                _ => assert_eq!(held.remove_tree(&tree).map(|players| players as i64), trees.remove(&tree)),
            }
            let held_configs: BTreeMap<u64, u32> = held.configs().map(|(id, c)| (id, c.keep)).collect();
            assert_eq!(held_configs, configs);
            assert_eq!(held.configs().len(), configs.len());
            let held_trees: BTreeMap<TreeId, i64> = held.trees().map(|(id, t)| (id, t.total() as i64)).collect();
            assert_eq!(held_trees, trees);
            assert_eq!(held.tree_count(), trees.len());
        }
        for board in configs.into_keys() {
            held.remove_config(board);
        }
        for tree in trees.into_keys() {
            held.remove_tree(&tree);
        }
        assert_eq!((held.configs().len(), held.tree_count(), held.boards.pages()), (0, 0, 0), "nothing left");
    }
}
