//! The boards in name order, for `boards` pages, in about 8 bytes a board.
//!
//! A `BTreeSet` of board pointers took 22 bytes a board on a server of a
//! million boards: boards are mostly created in name order (`lvl:0000001`,
//! `lvl:0000002`, …), and a B-tree splits a full node in half, so appending
//! leaves every node about half full. Here the boards sit in sorted chunks
//! of fixed capacity: a name past the end of a full chunk starts a new
//! chunk instead of splitting it, so names that arrive in order (even
//! several such runs interleaved) fill their chunks; other inserts split a
//! full chunk in half, as a B-tree does.

use std::ops::Bound;

use rankd_shards::SharedBoard;

/// Boards a chunk holds: 2 KiB of pointers, a few hundred bytes moved by an
/// insert or a removal inside it.
const CHUNK: usize = 256;

/// See the module docs.
#[derive(Default)]
pub struct NameOrder {
    /// Non-empty chunks of capacity [`CHUNK`], each sorted by name, every
    /// name of a chunk before every name of the next.
    chunks: Vec<Vec<SharedBoard>>,
    len: usize,
}

impl NameOrder {
    /// The boards of `sorted` (strictly ascending names), chunks full.
    pub fn from_sorted(sorted: Vec<SharedBoard>) -> Self {
        debug_assert!(sorted.windows(2).all(|w| w[0].name < w[1].name), "names sorted, once each");
        let len = sorted.len();
        let chunks = sorted.chunks(CHUNK).map(new_chunk).collect();
        Self { chunks, len }
    }

    /// Boards held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Adds `board`, whose name must not be held.
    pub fn insert(&mut self, board: SharedBoard) {
        self.len += 1;
        // The first chunk whose last name is past this one, else the last.
        let mut at = self.chunk_for(&board.name).min(self.chunks.len().saturating_sub(1));
        let Some(chunk) = self.chunks.get(at) else {
            self.chunks.push(new_chunk(&[board]));
            return;
        };
        let mut pos = chunk.partition_point(|held| held.name < board.name);
        debug_assert!(chunk.get(pos).is_none_or(|held| held.name != board.name), "inserted once");
        if pos == 0 && at > 0 {
            // Between two chunks: the end of the earlier one.
            at -= 1;
            pos = self.chunks[at].len();
        }
        let chunk = &mut self.chunks[at];
        if chunk.len() < CHUNK {
            chunk.insert(pos, board);
        } else if pos == CHUNK {
            // Past a full chunk's end: names arriving in order fill chunks.
            self.chunks.insert(at + 1, new_chunk(&[board]));
        } else {
            let mut upper = new_chunk(&chunk[CHUNK / 2..]);
            chunk.truncate(CHUNK / 2);
            if pos <= CHUNK / 2 {
                chunk.insert(pos, board);
            } else {
                upper.insert(pos - CHUNK / 2, board);
            }
            self.chunks.insert(at + 1, upper);
        }
    }

    /// Removes and returns the board called `name`, if held.
    pub fn remove(&mut self, name: &str) -> Option<SharedBoard> {
        let (at, pos) = self.find(name)?;
        let chunk = &mut self.chunks[at];
        let board = chunk.remove(pos);
        self.len -= 1;
        if chunk.is_empty() {
            self.chunks.remove(at);
        } else if chunk.len() < CHUNK / 4 {
            // Mass drops leave no trail of near-empty chunks: a small chunk
            // joins a neighbour when both fit in one.
            let fits = |other: usize| self.chunks.get(other).is_some_and(|o| o.len() + self.chunks[at].len() <= CHUNK);
            let pair = [at.checked_sub(1), Some(at + 1)].into_iter().flatten().find(|&other| fits(other));
            if let Some(other) = pair {
                let (into, from) = (at.min(other), at.max(other));
                let joined = self.chunks.remove(from);
                self.chunks[into].extend(joined);
            }
        }
        Some(board)
    }

    /// The board called `name`, if held.
    #[cfg(test)]
    pub fn get(&self, name: &str) -> Option<&SharedBoard> {
        self.find(name).map(|(at, pos)| &self.chunks[at][pos])
    }

    /// The boards from `start` on, in name order.
    pub fn range_from<'a>(&'a self, start: Bound<&str>) -> impl Iterator<Item = &'a SharedBoard> + 'a {
        let before_start = |held: &SharedBoard| match start {
            Bound::Included(start) => *held.name < *start,
            Bound::Excluded(start) => *held.name <= *start,
            Bound::Unbounded => false,
        };
        let at = self.chunks.partition_point(|chunk| chunk.last().is_some_and(before_start));
        let skip = self.chunks.get(at).map_or(0, |chunk| chunk.partition_point(before_start));
        self.chunks[at..].iter().flatten().skip(skip)
    }

    /// Where the board called `name` is held: its chunk and its place there.
    fn find(&self, name: &str) -> Option<(usize, usize)> {
        let at = self.chunk_for(name);
        let pos = self.chunks.get(at)?.binary_search_by(|held| (*held.name).cmp(name)).ok()?;
        Some((at, pos))
    }

    /// The index of the first chunk whose last name is `name` or past it
    /// (`chunks.len()` if none).
    fn chunk_for(&self, name: &str) -> usize {
        self.chunks.partition_point(|chunk| chunk.last().is_some_and(|last| *last.name < *name))
    }
}

/// A chunk of `boards`, with room for [`CHUNK`].
fn new_chunk(boards: &[SharedBoard]) -> Vec<SharedBoard> {
    let mut chunk = Vec::with_capacity(CHUNK);
    chunk.extend_from_slice(boards);
    chunk
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;
    use rankd_shards::{Board, BoardConfig};

    use super::*;

    fn board(id: u64, name: String) -> SharedBoard {
        SharedBoard::new(Board { id, name: name.into(), config: BoardConfig::default().into() })
    }

    /// What the index and the oracle hold, in order, and the chunks' shape.
    fn check(order: &NameOrder, oracle: &BTreeMap<String, u64>) {
        let held: Vec<(String, u64)> = order.range_from(Bound::Unbounded).map(|b| (b.name.to_string(), b.id)).collect();
        let expected: Vec<(String, u64)> = oracle.iter().map(|(name, id)| (name.clone(), *id)).collect();
        assert_eq!(held, expected);
        assert_eq!(order.len(), oracle.len());
        assert!(order.chunks.iter().all(|chunk| !chunk.is_empty() && chunk.len() <= CHUNK));
    }

    #[derive(Debug, Clone)]
    enum Step {
        Insert(u16),
        Remove(u16),
        /// Names in order: `run` a prefix, counting up from `from`.
        Run {
            run: u8,
            from: u16,
            count: u16,
        },
    }

    fn step() -> impl Strategy<Value = Step> {
        prop_oneof![
            3 => any::<u16>().prop_map(Step::Insert),
            2 => any::<u16>().prop_map(Step::Remove),
            1 => (0..3u8, any::<u16>(), 0..700u16).prop_map(|(run, from, count)| Step::Run { run, from, count }),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Inserts (random and in runs), removals, lookups and ranges from
        /// every kind of start equal a `BTreeMap`'s.
        #[test]
        fn the_order_equals_a_btree_map(steps in prop::collection::vec(step(), 1..60), probes in prop::collection::vec(any::<u16>(), 8)) {
            let mut order = NameOrder::default();
            let mut oracle = BTreeMap::new();
            let mut next_id = 0;
            let mut insert = |order: &mut NameOrder, oracle: &mut BTreeMap<String, u64>, name: String| {
                if !oracle.contains_key(&name) {
                    next_id += 1;
                    oracle.insert(name.clone(), next_id);
                    order.insert(board(next_id, name));
                }
            };
            for step in steps {
                match step {
                    Step::Insert(n) => insert(&mut order, &mut oracle, format!("r{n}")),
                    Step::Remove(n) => {
                        // Mostly a held name: the n-th, wrapping.
                        let name = oracle.keys().nth(usize::from(n) % (oracle.len() + 1)).cloned().unwrap_or(format!("r{n}"));
                        prop_assert_eq!(order.remove(&name).map(|b| b.id), oracle.remove(&name));
                    }
                    Step::Run { run, from, count } => {
                        for n in from..from.saturating_add(count) {
                            insert(&mut order, &mut oracle, format!("s{run}:{n:05}"));
                        }
                    }
                }
                check(&order, &oracle);
            }
            for probe in probes {
                let name = format!("r{probe}");
                prop_assert_eq!(order.get(&name).map(|b| b.id), oracle.get(&name).copied());
                for (start, bound) in [(Bound::Included(&*name), Bound::Included(name.clone())), (Bound::Excluded(&*name), Bound::Excluded(name.clone()))] {
                    let got: Vec<u64> = order.range_from(start).map(|b| b.id).collect();
                    let want: Vec<u64> = oracle.range((bound, Bound::Unbounded)).map(|(_, id)| *id).collect();
                    prop_assert_eq!(got, want);
                }
            }
        }
    }

    #[test]
    fn names_in_order_fill_their_chunks() {
        let mut order = NameOrder::default();
        // Two runs interleaved, as boards of two prefixes created together.
        for n in 0..10 * CHUNK + 3 {
            order.insert(board(2 * n as u64, format!("a:{n:06}")));
            order.insert(board(2 * n as u64 + 1, format!("b:{n:06}")));
        }
        assert_eq!(order.chunks.len(), 2 * 11, "each run's chunks full but its last");
        let sorted: Vec<SharedBoard> = order.range_from(Bound::Unbounded).cloned().collect();
        assert_eq!(NameOrder::from_sorted(sorted).chunks.len(), 21);
    }

    #[test]
    fn dropping_most_boards_leaves_few_chunks() {
        let sorted: Vec<SharedBoard> = (0..20 * CHUNK).map(|n| board(n as u64, format!("x{n:06}"))).collect();
        let mut order = NameOrder::from_sorted(sorted);
        for n in (0..20 * CHUNK).filter(|n| n % 16 != 0) {
            assert!(order.remove(&format!("x{n:06}")).is_some());
        }
        assert_eq!(order.len(), 20 * CHUNK / 16);
        assert!(order.chunks.len() <= 10, "{} chunks for {} boards", order.chunks.len(), order.len());
    }
}
