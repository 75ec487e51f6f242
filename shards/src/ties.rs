//! Order statistics inside a tie: how a deep `top` page finds its start in
//! O(log n) when many players share one count-tree key.
//!
//! A tree key of a competition or dense board is the score and the first
//! 8 bytes of the name (`crate::key::tiebreak`), so players with an equal
//! score whose names share those bytes (`user:00250000`, `user:00250001`)
//! are one key with a count. Counting within such a key needs the rest of
//! the names. A shard therefore keeps, for every key holding at least
//! [`GROUP_AT`] of its players, a [`TieGroup`]: a count tree over the next
//! 16 name bytes (a *chunk*), and for each chunk value itself that crowded
//! a deeper group over the 16 bytes after, and so on. The groups live in
//! memory only: they are rebuilt from the score index when a shard opens,
//! and cost nothing on boards without large ties.

use std::collections::HashMap;

use crate::key::TreeId;
use crate::tree::CountTree;
use crate::FastHasher;

/// Players of one key (or chunk value) on a shard from which they get a
/// group of their own: fewer are counted by reading them from the index.
pub const GROUP_AT: u64 = 256;

/// A group whose players fall below this is dropped. Below [`GROUP_AT`], so
/// a key on the edge is not rebuilt on every write.
const GROUP_UNTIL: u64 = GROUP_AT / 4;

/// Bytes of a name the tree key holds.
pub const TIEBREAK_BYTES: usize = 8;

/// Bytes of a name one level of groups counts by.
pub const CHUNK_BYTES: usize = 16;

/// Levels of groups below a tree key: enough to cover a 256-byte name.
pub const MAX_DEPTH: usize = (256 - TIEBREAK_BYTES).div_ceil(CHUNK_BYTES);

/// The branching of a group's count trees.
const BRANCHING: u32 = 16;

/// The chunk of `name` a group at `depth` (1 = right below the tree key)
/// counts by: its bytes `8 + 16 (depth - 1)` on, zero-padded, big-endian,
/// so chunks order like the names.
pub fn chunk(name: &[u8], depth: usize) -> u128 {
    let start = TIEBREAK_BYTES + CHUNK_BYTES * (depth - 1);
    let mut buf = [0u8; CHUNK_BYTES];
    if let Some(rest) = name.get(start..) {
        let n = rest.len().min(CHUNK_BYTES);
        buf[..n].copy_from_slice(&rest[..n]);
    }
    u128::from_be_bytes(buf)
}

/// The name bytes every player of a group shares, padded: the tiebreak of
/// `key` and the chunks of `path`.
pub fn group_prefix(key: u128, path: &[u128]) -> Vec<u8> {
    let mut out = Vec::with_capacity(TIEBREAK_BYTES + CHUNK_BYTES * path.len());
    out.extend_from_slice(&(key as u64).to_be_bytes());
    for c in path {
        out.extend_from_slice(&c.to_be_bytes());
    }
    out
}

/// The first name at or after which every name whose padded prefix is at
/// least `prefix` sorts: `prefix` without its trailing zero bytes (a name
/// shorter than the prefix is padded with zeros).
pub fn first_name_from(prefix: &[u8]) -> &[u8] {
    let len = prefix.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    &prefix[..len]
}

/// Every tie group of one shard, by tree and key.
#[derive(Debug, Default)]
pub struct TieGroups {
    groups: HashMap<(TreeId, u128), TieGroup, FastHasher>,
}

/// The players of one key (or one chunk value below it) on a shard,
/// counted by their next chunk.
#[derive(Debug)]
pub struct TieGroup {
    /// Players by chunk value.
    counts: CountTree,
    /// Chunk values with [`GROUP_AT`] players or more, grouped one level down.
    deeper: HashMap<u128, TieGroup, FastHasher>,
}

/// A group a change made crowded enough to need building: the caller reads
/// its names from the index and hands them to [`TieGroups::install`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Crowded {
    /// The tree.
    pub tree: TreeId,
    /// The tree key.
    pub key: u128,
    /// The chunks from the key down to the group (empty: the key's own).
    pub path: Vec<u128>,
}

impl TieGroup {
    /// A group at `depth` of `names` (sorted or not), with its deeper groups.
    fn from_names(names: &mut [&[u8]], depth: usize) -> Self {
        let mut group =
            Self { counts: CountTree::new(BRANCHING).expect("a valid branching"), deeper: HashMap::default() };
        names.sort_unstable_by_key(|n| chunk(n, depth));
        for same in names.chunk_by_mut(|a, b| chunk(a, depth) == chunk(b, depth)) {
            let c = chunk(same[0], depth);
            group.counts.add(c, same.len() as i64);
            if same.len() as u64 >= GROUP_AT && depth < MAX_DEPTH {
                group.deeper.insert(c, Self::from_names(same, depth + 1));
            }
        }
        // Never written anywhere: nothing to remember as changed.
        group.counts.forget_dirty();
        group
    }

    fn total(&self) -> u64 {
        self.counts.total()
    }

    /// Adds `delta` of `name` at `depth`; returns the path below this group
    /// of a group that should now exist and does not.
    fn add(&mut self, name: &[u8], depth: usize, delta: i64) -> Option<Vec<u128>> {
        let c = chunk(name, depth);
        let count = self.counts.add(c, delta);
        if let Some(deeper) = self.deeper.get_mut(&c) {
            let mut crowded = deeper.add(name, depth + 1, delta);
            if deeper.total() < GROUP_UNTIL {
                self.deeper.remove(&c);
                crowded = None;
            }
            return crowded.map(|mut path| {
                path.insert(0, c);
                path
            });
        }
        (count >= GROUP_AT && depth < MAX_DEPTH).then(|| vec![c])
    }

    /// The group `path` leads to from here, if there is one.
    fn find(&self, path: &[u128]) -> Option<&Self> {
        match path.split_first() {
            None => Some(self),
            Some((c, rest)) => self.deeper.get(c)?.find(rest),
        }
    }

    fn find_mut(&mut self, path: &[u128]) -> Option<&mut Self> {
        match path.split_first() {
            None => Some(self),
            Some((c, rest)) => self.deeper.get_mut(c)?.find_mut(rest),
        }
    }
}

impl TieGroups {
    /// Follows a change of one player at `key` of `tree`, whose count in the
    /// tree is `count` after it. Returns a group the change made crowded.
    pub fn add(&mut self, tree: TreeId, key: u128, count: u64, name: &[u8], delta: i64) -> Option<Crowded> {
        let Some(group) = self.groups.get_mut(&(tree, key)) else {
            return (count >= GROUP_AT).then(|| Crowded { tree, key, path: Vec::new() });
        };
        let path = group.add(name, 1, delta);
        if group.total() < GROUP_UNTIL {
            self.groups.remove(&(tree, key));
            return None;
        }
        path.map(|path| Crowded { tree, key, path })
    }

    /// Builds the group `crowded` names from every name it holds (read from
    /// the index, which already has the change that crowded it).
    pub fn install(&mut self, crowded: &Crowded, names: &mut [&[u8]]) {
        let depth = crowded.path.len() + 1;
        let group = TieGroup::from_names(names, depth);
        match crowded.path.split_last() {
            None => {
                self.groups.insert((crowded.tree, crowded.key), group);
            }
            Some((last, above)) => {
                if let Some(parent) = self.groups.get_mut(&(crowded.tree, crowded.key)).and_then(|g| g.find_mut(above))
                {
                    parent.deeper.insert(*last, group);
                }
            }
        }
    }

    /// For each pivot, the players of the group (`key` of `tree`, then the
    /// chunks of `path`) whose next chunk is below it; `None` when the group
    /// has no counts of its own (it holds fewer than [`GROUP_AT`] players
    /// here, so the caller counts them from the index).
    pub fn count_before(&self, tree: TreeId, key: u128, path: &[u128], pivots: &[u128]) -> Option<Vec<u64>> {
        let group = self.groups.get(&(tree, key))?.find(path)?;
        Some(pivots.iter().map(|&p| group.counts.count_before(p)).collect())
    }

    /// Forgets every group of `tree` (dropped or expired).
    pub fn forget(&mut self, tree: TreeId) {
        self.groups.retain(|(t, _), _| *t != tree);
    }

    /// Forgets every group.
    pub fn clear(&mut self) {
        self.groups.clear();
    }

    /// Groups directly below tree keys.
    pub fn len(&self) -> usize {
        self.groups.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.groups.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    const TREE: TreeId = TreeId { board: 1, window: 0, period: 0 };

    /// The names of a key sharing `path`, counted before each pivot, by brute force.
    fn brute(names: &BTreeMap<Vec<u8>, ()>, path: &[u128], pivot: u128) -> u64 {
        names
            .keys()
            .filter(|n| path.iter().enumerate().all(|(i, &c)| chunk(n, i + 1) == c))
            .filter(|n| chunk(n, path.len() + 1) < pivot)
            .count() as u64
    }

    /// Names crowded on a shared prefix, in a few shapes.
    fn name() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            (0u32..600).prop_map(|i| format!("user:{i:08}").into_bytes()),
            (0u32..600).prop_map(|i| format!("guild:alpha-centauri:member:{i}").into_bytes()),
            (0u32..40).prop_map(|i| format!("u{i}").into_bytes()),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Groups built on the way, dropped, rebuilt, count exactly what the
        /// names say, at every depth.
        #[test]
        fn groups_count_like_the_names(ops in proptest::collection::vec((name(), any::<bool>()), 1..3000)) {
            let key = 7u128;
            let mut groups = TieGroups::default();
            let mut names: BTreeMap<Vec<u8>, ()> = BTreeMap::new();
            for (name, add) in ops {
                let delta = match (add, names.contains_key(&name)) {
                    (true, false) => { names.insert(name.clone(), ()); 1 }
                    (false, true) => { names.remove(&name); -1 }
                    _ => continue,
                };
                if let Some(crowded) = groups.add(TREE, key, names.len() as u64, &name, delta) {
                    let mut held: Vec<&[u8]> = names
                        .keys()
                        .filter(|n| crowded.path.iter().enumerate().all(|(i, &c)| chunk(n, i + 1) == c))
                        .map(Vec::as_slice)
                        .collect();
                    groups.install(&crowded, &mut held);
                }
            }
            if (names.len() as u64) >= GROUP_AT {
                let pivots: Vec<u128> = names.keys().map(|n| chunk(n, 1)).chain([0, u128::MAX]).collect();
                let counts = groups.count_before(TREE, key, &[], &pivots);
                prop_assert!(counts.is_some());
                for (p, c) in pivots.iter().zip(counts.unwrap_or_default()) {
                    prop_assert_eq!(c, brute(&names, &[], *p));
                }
                // One level down, under the most crowded first chunk.
                let mut by_chunk: BTreeMap<u128, u64> = BTreeMap::new();
                names.keys().for_each(|n| *by_chunk.entry(chunk(n, 1)).or_default() += 1);
                let (&top, &n) = by_chunk.iter().max_by_key(|(_, n)| **n).expect("names");
                let deeper = groups.count_before(TREE, key, &[top], &pivots);
                // Built at GROUP_AT, kept down to GROUP_UNTIL.
                prop_assert!(deeper.is_some() || n < GROUP_AT);
                prop_assert!(deeper.is_none() || n >= GROUP_UNTIL);
                for (p, c) in pivots.iter().zip(deeper.unwrap_or_default()) {
                    prop_assert_eq!(c, brute(&names, &[top], *p));
                }
            }
            if (names.len() as u64) < GROUP_UNTIL {
                prop_assert!(groups.is_empty());
            }
        }

        /// A name sorts at or after the first name of a prefix exactly when
        /// its padded bytes do: what lets a list start at a chunk.
        #[test]
        fn first_name_from_matches_padding(name in proptest::collection::vec(0u8..4, 0..12), prefix in proptest::collection::vec(0u8..4, 8)) {
            let mut padded = name.clone();
            padded.resize(padded.len().max(prefix.len()), 0);
            prop_assert_eq!(&padded[..prefix.len()] >= prefix.as_slice(), name.as_slice() >= first_name_from(&prefix));
        }
    }

    #[test]
    fn chunks_order_like_names() {
        let names = ["user:00250000", "user:00250001", "user:0025", "user:002500000", "user:002"];
        for a in names {
            for b in names {
                // Chunks compare names that share their first 8 bytes.
                if a < b {
                    assert!(chunk(a.as_bytes(), 1) <= chunk(b.as_bytes(), 1), "{a} {b}");
                }
            }
        }
        assert_eq!(chunk(b"12345678", 1), 0);
        assert_eq!(chunk(b"12345678a", 1), u128::from(b'a') << 120);
    }
}
