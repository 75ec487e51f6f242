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
//! A config and a tree are held independently, as before they shared an
//! entry: a dropped board's config goes at once and its trees as they are
//! forgotten, and replay may meet a tree before its board's config.

use std::collections::HashMap;
use std::sync::Arc;

use super::id_table::{IdTable, Slot};
use crate::board::BoardConfig;
use crate::key::TreeId;
use crate::tree::CountTree;
use crate::FastHasher;

/// One board's entry: absent once it holds neither.
#[derive(Debug, Default)]
struct Holding {
    config: Option<Arc<BoardConfig>>,
    all_time: Option<Box<CountTree>>,
}

impl Slot for Holding {
    fn is_vacant(&self) -> bool {
        self.config.is_none() && self.all_time.is_none()
    }
}

/// A shard's boards' configs and count trees; see the module docs.
#[derive(Debug, Default)]
pub(super) struct Holdings {
    boards: IdTable<Holding>,
    /// Trees of any view but the all-time one, by id.
    periodic: HashMap<TreeId, Box<CountTree>, FastHasher>,
    /// Entries of `boards` with a config.
    configs: usize,
    /// Entries of `boards` with an all-time tree.
    all_time_trees: usize,
}

/// The board of `tree` if it is a board's all-time tree, the one held in
/// the board's entry.
fn all_time_board(tree: &TreeId) -> Option<u64> {
    tree.is_all_time().then_some(tree.board)
}

impl Holdings {
    /// Room for `boards` boards of consecutive ids without growing.
    pub(super) fn with_capacity(boards: usize) -> Self {
        Self { boards: IdTable::with_capacity(boards), ..Self::default() }
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

    /// The tree `tree`, if held.
    pub(super) fn tree(&self, tree: &TreeId) -> Option<&CountTree> {
        match all_time_board(tree) {
            Some(board) => self.boards.get(board)?.all_time.as_deref(),
            None => self.periodic.get(tree).map(|t| &**t),
        }
    }

    /// The tree `tree`, if held, to change.
    pub(super) fn tree_mut(&mut self, tree: &TreeId) -> Option<&mut CountTree> {
        match all_time_board(tree) {
            Some(board) => self.boards.get_mut(board)?.all_time.as_deref_mut(),
            None => self.periodic.get_mut(tree).map(|t| &mut **t),
        }
    }

    /// The tree `tree`, made empty with `branching` (validated at open) if
    /// not held yet.
    pub(super) fn tree_or_new(&mut self, tree: TreeId, branching: u32) -> &mut CountTree {
        let new = || Box::new(CountTree::new(branching).expect("branching validated at open"));
        match all_time_board(&tree) {
            Some(board) => {
                let holding = self.boards.get_or_default(board);
                self.all_time_trees += usize::from(holding.all_time.is_none());
                holding.all_time.get_or_insert_with(new)
            }
            None => self.periodic.entry(tree).or_insert_with(new),
        }
    }

    /// Stops holding `tree`; returns it.
    pub(super) fn remove_tree(&mut self, tree: &TreeId) -> Option<Box<CountTree>> {
        let Some(board) = all_time_board(tree) else { return self.periodic.remove(tree) };
        let gone = self.take_from(board, |holding| holding.all_time.take())?;
        self.all_time_trees -= 1;
        Some(gone)
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

    /// Every tree held, in no order.
    pub(super) fn trees(&self) -> impl Iterator<Item = (TreeId, &CountTree)> {
        let all_time = self
            .boards
            .iter()
            .filter_map(|(board, holding)| Some((TreeId::all_time(board), holding.all_time.as_deref()?)));
        all_time.chain(self.periodic.iter().map(|(&id, tree)| (id, &**tree)))
    }

    /// Every tree held, to change, in no order.
    pub(super) fn trees_mut(&mut self) -> impl Iterator<Item = (TreeId, &mut CountTree)> {
        let all_time = self
            .boards
            .iter_mut()
            .filter_map(|(board, holding)| Some((TreeId::all_time(board), holding.all_time.as_deref_mut()?)));
        all_time.chain(self.periodic.iter_mut().map(|(&id, tree)| (id, &mut **tree)))
    }

    /// The ids of every tree held, in no order.
    pub(super) fn tree_ids(&self) -> impl Iterator<Item = TreeId> + '_ {
        self.trees().map(|(id, _)| id)
    }

    /// The ids of the trees of periodic windows: the only ones that expire.
    pub(super) fn periodic_tree_ids(&self) -> impl Iterator<Item = TreeId> + '_ {
        self.periodic.keys().copied()
    }

    /// The ids of board `board`'s trees.
    pub(super) fn trees_of(&self, board: u64) -> Vec<TreeId> {
        let all_time = self.boards.get(board).and_then(|h| h.all_time.as_ref()).map(|_| TreeId::all_time(board));
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
        let mut held = Holdings::default();
        let dense = Arc::new(BoardConfig { ties: Ties::Dense, ..BoardConfig::default() });
        assert!(held.insert_config(1, BoardConfig::default().into()).is_none());
        assert!(held.insert_config(1, dense.clone()).is_some_and(|old| old.ties == Ties::Competition));
        held.tree_or_new(TreeId::all_time(1), 16).add(5, 1);
        held.tree_or_new(TreeId::all_time(2), 16).add(6, 2); // a tree before its config (replay)
        held.tree_or_new(daily(1, 3), 16).add(7, 1);
        assert_eq!((held.configs().len(), held.tree_count()), (1, 3));
        assert_eq!(ids(&held), [TreeId::all_time(1), daily(1, 3), TreeId::all_time(2)]);
        assert_eq!(held.tree(&TreeId::all_time(2)).map(CountTree::total), Some(2));
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

    #[test]
    fn filled_as_a_shard_opens() {
        // Configs in id order, then trees in id order, a periodic one among
        // them and one without a config (a dropped board's, until replay).
        let config = |keep| Arc::new(BoardConfig { keep, ..BoardConfig::default() });
        let mut held = Holdings::with_capacity(3);
        for (id, keep) in [(1, 1), (3, 3), (4, 4)] {
            held.insert_config(id, config(keep));
        }
        for (tree, total) in
            [(TreeId::all_time(1), 1), (daily(1, 2), 12), (TreeId::all_time(2), 2), (TreeId::all_time(4), 4)]
        {
            held.tree_or_new(tree, 4).add(1, total);
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
        let mut held = Holdings::default();
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
                    held.tree_or_new(tree, 4).add(1, 1);
                    *trees.entry(tree).or_default() += 1;
                }
                _ => assert_eq!(held.remove_tree(&tree).map(|t| t.total() as i64), trees.remove(&tree)),
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
