//! Bucket boundaries for approximate ranks: an equi-depth partition of a
//! tree's keys, read off its nodes, and the counts before many sorted keys
//! in one walk.
//!
//! A count tree's inner nodes already count the players of fixed key
//! ranges; its top levels are buckets. Taking one fixed level would give
//! uniform *key* ranges, which on a skewed distribution (Zipf, normal) puts
//! most players in a few buckets. So [`TreeView::bucket_bounds`] refines
//! best first instead: it keeps splitting the bucket holding the most
//! players into its child ranges (a leaf into its distinct keys) until
//! every bucket holds at most `per_bucket` players or the bucket budget is
//! spent. Only a single key cannot be split (on a competition or dense
//! board, a single *score*: its players share a rank, so splitting them by
//! name would tell nothing), and then its edges are exact.
//!
//! A bucket keeps its node's whole key range, not just the keys it holds:
//! every shard's tree splits the key space at the same places, so the
//! shards (which hold random players, placed by a hash) propose nearly the
//! same boundaries and their union stays about one shard's size. Only the
//! tree's first key and its last key + 1 are added, so a key before every
//! player or after every player is exact.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::node::{child_ref, level_bits, NodeRef, KEY_BITS};
use super::TreeView;

/// Score-key bits of a tree key: the high half. Below them lies the tiebreak.
const SCORE_BITS: u32 = 64;

/// How [`TreeView::bucket_bounds`] may split.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BucketShape {
    /// Most players a bucket should hold (a single key or score may hold more).
    pub per_bucket: u64,
    /// Most buckets to refine into (before neighbours holding at most
    /// `per_bucket` together are joined again); past it, the heaviest are
    /// left unsplit.
    pub max_buckets: usize,
    /// Whether to split within a score by tiebreak: only ordinal boards
    /// rank players of one score apart (by their tree keys). Other boards
    /// rank by score alone, so their boundaries stay on score edges
    /// (tiebreak 0), where every rank key of theirs lies.
    pub split_ties: bool,
}

/// A node waiting in the best-first refinement, heaviest first.
struct Candidate<'a> {
    count: u64,
    start: u128,
    depth: u32,
    node: NodeRef<'a>,
}

impl PartialEq for Candidate<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Candidate<'_> {}
impl PartialOrd for Candidate<'_> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Candidate<'_> {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.count, std::cmp::Reverse(self.start)).cmp(&(other.count, std::cmp::Reverse(other.start)))
    }
}

/// A bucket made: the keys `[start, end)` (`None`: to the end of the key
/// space), holding `count` players.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    start: u128,
    end: Option<u128>,
    count: u64,
}

/// Joins neighbouring buckets (sorted, disjoint) while the join holds at
/// most `per_bucket` players: splitting by fixed child ranges leaves many
/// nearly empty ones. Any two buckets left side by side then hold more than
/// `per_bucket` together, so at most about `2 * players / per_bucket`
/// remain; a bucket over `per_bucket` (one key) is never joined, so its
/// edges stay. Overlapping buckets are always joined.
fn merge_small(buckets: Vec<Bucket>, per_bucket: u64) -> Vec<Bucket> {
    let mut out: Vec<Bucket> = Vec::with_capacity(buckets.len());
    for bucket in buckets {
        match out.last_mut() {
            Some(last) if last.count + bucket.count <= per_bucket || overlap(last, &bucket) => {
                last.end = bucket.end.max(last.end).filter(|_| last.end.is_some() && bucket.end.is_some());
                last.count += bucket.count;
            }
            _ => out.push(bucket),
        }
    }
    out
}

/// Whether `next` (starting no earlier) starts before `last` ends: two
/// halves of one score's keys, when a level's digit straddles the score
/// and tiebreak halves (branchings 32 and 128) and ties are not split.
fn overlap(last: &Bucket, next: &Bucket) -> bool {
    last.end.is_none_or(|end| next.start < end)
}

/// What splitting a bucket makes.
enum Pieces<'a> {
    /// Final buckets.
    Keys(Vec<Bucket>),
    /// Sub-ranges to refine further.
    Children(Vec<Candidate<'a>>),
}

impl<'a> Pieces<'a> {
    fn len(&self) -> usize {
        match self {
            Self::Keys(keys) => keys.len(),
            Self::Children(children) => children.len(),
        }
    }
}

impl TreeView<'_> {
    /// Sorted, distinct boundary keys of an equi-depth partition of this
    /// tree (see the module docs): both edges of every bucket (the end
    /// omitted when it would pass the last key). Empty for an empty tree.
    pub fn bucket_bounds(&self, shape: BucketShape) -> Vec<u128> {
        self.with_root(|root| self.bucket_bounds_from(root, shape))
    }

    fn bucket_bounds_from(&self, root: NodeRef<'_>, shape: BucketShape) -> Vec<u128> {
        let mut buckets: Vec<Bucket> = Vec::new();
        let mut heap = BinaryHeap::new();
        let total = self.total();
        if total > 0 {
            heap.push(Candidate { count: total, start: 0, depth: 0, node: root });
        }
        let per_bucket = shape.per_bucket.max(1);
        while let Some(c) = heap.pop() {
            let single_score = !shape.split_ties && self.bits * c.depth >= SCORE_BITS;
            let pieces = if c.count <= per_bucket || single_score { None } else { self.pieces(&c, shape.split_ties) };
            let fits = |p: &Pieces<'_>| buckets.len() + heap.len() + p.len() <= shape.max_buckets;
            match pieces.filter(fits) {
                None => buckets.push(self.whole(&c, shape.split_ties)),
                Some(Pieces::Keys(keys)) => buckets.extend(keys),
                Some(Pieces::Children(children)) => heap.extend(children),
            }
        }
        buckets.sort_unstable_by_key(|b| b.start);
        let merged = merge_small(buckets, per_bucket);
        let mut bounds: Vec<u128> = merged.into_iter().flat_map(|b| [Some(b.start), b.end]).flatten().collect();
        if total > 0 {
            bounds.push(edge(extreme(root, false), shape.split_ties));
            bounds.extend(end_after(extreme(root, true), shape.split_ties));
        }
        bounds.sort_unstable();
        bounds.dedup();
        bounds
    }

    /// What splitting `c` makes: a leaf's distinct keys (or scores) as
    /// final buckets, or an inner node's non-empty children to refine on.
    fn pieces<'a>(&self, c: &Candidate<'a>, split_ties: bool) -> Option<Pieces<'a>> {
        match c.node {
            NodeRef::Leaf(entries) => {
                let mut keys: Vec<Bucket> = Vec::new();
                for entry in entries {
                    let start = edge(entry.key(), split_ties);
                    match keys.last_mut() {
                        Some(last) if last.start == start => last.count += entry.count(),
                        _ => keys.push(Bucket { start, end: end_after(entry.key(), split_ties), count: entry.count() }),
                    }
                }
                (keys.len() > 1).then_some(Pieces::Keys(keys))
            }
            NodeRef::Inner(slots) if !split_ties && self.bits * (c.depth + 1) > SCORE_BITS => {
                // The children's digit straddles the score and tiebreak
                // halves: split into whole scores instead, each final.
                let shift = KEY_BITS - self.bits * c.depth - level_bits(c.depth, self.bits);
                let mut scores: Vec<Bucket> = Vec::new();
                for (d, slot) in slots.iter().enumerate().filter(|(_, slot)| slot.count > 0) {
                    let start = edge(c.start | ((d as u128) << shift), false);
                    match scores.last_mut() {
                        Some(last) if last.start == start => last.count += slot.count,
                        _ => scores.push(Bucket { start, end: end_after(start, false), count: slot.count }),
                    }
                }
                (scores.len() > 1).then_some(Pieces::Keys(scores))
            }
            NodeRef::Inner(slots) => {
                let shift = KEY_BITS - self.bits * c.depth - level_bits(c.depth, self.bits);
                let children = slots.iter().enumerate().filter_map(|(d, slot)| {
                    let child = child_ref(slot).filter(|_| slot.count > 0)?;
                    let start = c.start | ((d as u128) << shift);
                    Some(Candidate { count: slot.count, start, depth: c.depth + 1, node: child })
                });
                Some(Pieces::Children(children.collect()))
            }
        }
    }

    /// `c` as a bucket: its node's whole key range (widened to whole
    /// scores unless `split_ties`).
    fn whole(&self, c: &Candidate<'_>, split_ties: bool) -> Bucket {
        let span = KEY_BITS - (self.bits * c.depth).min(KEY_BITS);
        let start = edge(c.start, split_ties);
        let end = match span {
            KEY_BITS => None,
            span if !split_ties && span < SCORE_BITS => end_after(start, false),
            span => c.start.checked_add(1u128 << span),
        };
        Bucket { start, end, count: c.count }
    }

    /// For each of `keys` (ascending), how many players sort strictly
    /// before it: [`TreeView::count_before`] of each, in one walk that
    /// visits each node on their paths once.
    pub fn count_before_sorted(&self, keys: &[u128]) -> Vec<u64> {
        debug_assert!(keys.is_sorted());
        let mut out = Vec::with_capacity(keys.len());
        self.with_root(|root| before_sorted(root, self.bits, 0, 0, 0, keys, &mut out));
        out
    }
}

/// The first (or `last`) key under a non-empty node.
fn extreme(mut node: NodeRef<'_>, last: bool) -> u128 {
    loop {
        match node {
            NodeRef::Leaf(entries) => {
                let entry = if last { entries.last() } else { entries.first() };
                return entry.map_or(0, |e| e.key());
            }
            NodeRef::Inner(slots) => {
                let mut children = slots.iter().filter(|s| s.count > 0).filter_map(child_ref);
                let next = if last { children.next_back() } else { children.next() };
                match next {
                    Some(child) => node = child,
                    None => return 0,
                }
            }
        }
    }
}

/// Where a bucket holding `key` starts: the key itself, or its score's
/// first key.
fn edge(key: u128, split_ties: bool) -> u128 {
    if split_ties {
        key
    } else {
        key >> SCORE_BITS << SCORE_BITS
    }
}

/// Where a bucket whose last key is `key` ends (exclusive): the next key,
/// or the next score's first key; `None` past the key space.
fn end_after(key: u128, split_ties: bool) -> Option<u128> {
    if split_ties {
        key.checked_add(1)
    } else {
        edge(key, false).checked_add(1 << SCORE_BITS)
    }
}

/// Pushes onto `out` the count before each of `keys` (ascending, all within
/// the node's range, which starts at `start`), `base` players lying before
/// the node.
fn before_sorted(node: NodeRef<'_>, bits: u32, depth: u32, start: u128, base: u64, keys: &[u128], out: &mut Vec<u64>) {
    match node {
        NodeRef::Leaf(entries) => {
            let (mut i, mut before) = (0, base);
            for &key in keys {
                while let Some(entry) = entries.get(i).filter(|e| e.key() < key) {
                    before += entry.count();
                    i += 1;
                }
                out.push(before);
            }
        }
        NodeRef::Inner(slots) => {
            let shift = KEY_BITS - bits * depth - level_bits(depth, bits);
            let mut rest = keys;
            let mut before = base;
            for (d, slot) in slots.iter().enumerate() {
                if rest.is_empty() {
                    return;
                }
                let child_start = start | ((d as u128) << shift);
                let child_last = child_start | ((1u128 << shift) - 1);
                let inside = rest.partition_point(|&k| k <= child_last);
                let (here, after) = rest.split_at(inside);
                match child_ref(slot) {
                    Some(child) if !here.is_empty() => {
                        before_sorted(child, bits, depth + 1, child_start, before, here, out);
                    }
                    _ => out.extend(std::iter::repeat_n(before, here.len())),
                }
                before += slot.count;
                rest = after;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::testing::extreme_key;
    use crate::tree::CountTree;
    use crate::tree::BRANCHINGS;
    use proptest::prelude::*;

    /// Players (with their keys) between two boundaries, by brute force.
    fn between(keys: &[u128], lo: u128, hi: Option<u128>) -> u64 {
        keys.iter().filter(|&&k| k >= lo && hi.is_none_or(|hi| k < hi)).count() as u64
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn bounds_split_heavy_buckets_and_counts_match_single_walks(
            branching in proptest::sample::select(BRANCHINGS.to_vec()),
            scores in proptest::collection::vec(prop_oneof![0u64..40, any::<u64>()], 1..700),
            tiebreaks in proptest::collection::vec(prop_oneof![0u64..3, any::<u64>()], 700),
            per_bucket in 1u64..50,
            split_ties: bool,
            probes in proptest::collection::vec(extreme_key(), 0..30),
        ) {
            let mut tree = CountTree::new(branching).unwrap();
            let keys: Vec<u128> = scores.iter().zip(&tiebreaks).map(|(&s, &t)| (u128::from(s) << 64) | u128::from(t)).collect();
            for &key in &keys {
                tree.add(key, 1);
            }
            let shape = BucketShape { per_bucket, max_buckets: 100_000, split_ties };
            let bounds = tree.view().bucket_bounds(shape);
            prop_assert!(bounds.windows(2).all(|w| w[0] < w[1]));
            // Every player lies in a bucket, and a bucket over budget is one
            // key (or one score).
            let mut covered = 0;
            for (i, &lo) in bounds.iter().enumerate() {
                let hi = bounds.get(i + 1).copied();
                let n = between(&keys, lo, hi);
                covered += n;
                if n > per_bucket {
                    let inside: Vec<u128> = keys.iter().copied().filter(|&k| k >= lo && hi.is_none_or(|hi| k < hi)).map(|k| edge(k, split_ties)).collect();
                    prop_assert!(inside.iter().all(|&k| k == inside[0]), "bucket {lo:#x} holds {n} > {per_bucket}");
                }
            }
            prop_assert_eq!(covered, keys.len() as u64, "no player before the first bound");
            if !split_ties {
                prop_assert!(bounds.iter().all(|b| *b as u64 == 0));
            }
            let mut sorted: Vec<u128> = bounds.iter().copied().chain(probes).chain(keys.iter().copied()).collect();
            sorted.sort_unstable();
            let walked = tree.view().count_before_sorted(&sorted);
            let single: Vec<u64> = sorted.iter().map(|&k| tree.count_before(k)).collect();
            prop_assert_eq!(walked, single);
        }
    }

    #[test]
    fn the_budget_bounds_the_buckets() {
        let mut tree = CountTree::new(16).unwrap();
        for k in 0..10_000u128 {
            tree.add((k * 7919) << 64, 1);
        }
        for max_buckets in [1, 2, 10, 100, 1000] {
            let shape = BucketShape { per_bucket: 1, max_buckets, split_ties: false };
            let bounds = tree.view().bucket_bounds(shape);
            assert!(bounds.len() <= 2 * max_buckets + 2, "{max_buckets}: {}", bounds.len());
        }
        assert!(CountTree::new(16)
            .unwrap()
            .view()
            .bucket_bounds(BucketShape { per_bucket: 1, max_buckets: 9, split_ties: true })
            .is_empty());
        assert!(tree.view().count_before_sorted(&[]).is_empty());
    }
}
