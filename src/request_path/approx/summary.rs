//! One tree's bucket summary: the players before each bucket boundary,
//! summed over the shards, and the estimate, with its bound, of the players
//! before any key. Plain data and arithmetic, no actors.
//!
//! With boundaries `b_1 < … < b_m` and `C_j` the players with a key below
//! `b_j` (`b_0 = 0`, `C_0 = 0`; past `b_m` the key space ends with all
//! `total` players), a key `q` with `b_j ≤ q < b_{j+1}` has between `C_j`
//! and `C_{j+1}` players before it: exactly `C_j` when `q = b_j`. The
//! estimate interpolates linearly by `q`'s place between the two
//! boundaries, and its error is its distance to the farther of those
//! limits, so the exact count always lies within `estimate ± error` (for
//! the board as it was when the counts were taken).

/// The players before one key: `before`, give or take `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// The estimate.
    pub before: u64,
    /// The exact count lies within `before ± error`.
    pub error: u64,
}

/// A shard's counts did not fit the boundaries they were asked for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("a shard answered {got} bucket counts for {want} boundaries")]
pub struct Mismatch {
    /// Counts answered.
    pub got: usize,
    /// Boundaries asked about.
    pub want: usize,
}

/// The summed counts at a tree's bucket boundaries. See the module docs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Summary {
    /// Boundary keys, ascending, none 0.
    bounds: Vec<u128>,
    /// Players before each boundary, over every shard.
    before: Vec<u64>,
    /// Players in the tree, over every shard.
    total: u64,
}

impl Summary {
    /// Sums each shard's `(before, total)`, its counts before each of
    /// `bounds` (ascending) and its total.
    pub fn merge<'a>(bounds: &[u128], shards: impl IntoIterator<Item = (&'a [u64], u64)>) -> Result<Self, Mismatch> {
        let mut before = vec![0u64; bounds.len()];
        let mut total = 0u64;
        for (counts, shard_total) in shards {
            if counts.len() != bounds.len() {
                return Err(Mismatch { got: counts.len(), want: bounds.len() });
            }
            before.iter_mut().zip(counts).for_each(|(sum, n)| *sum = sum.saturating_add(*n));
            total = total.saturating_add(shard_total);
        }
        // Key 0 has no player before it: not a boundary worth keeping.
        let skip = bounds.iter().take_while(|&&b| b == 0).count();
        let (bounds, mut before) = (bounds[skip..].to_vec(), before.split_off(skip));
        // Each shard counted at one moment, so its counts never decrease
        // along the keys; kept so whatever a shard says, the limits below
        // stay ordered.
        let mut floor = 0;
        for n in &mut before {
            floor = (*n).max(floor).min(total);
            *n = floor;
        }
        Ok(Self { bounds, before, total })
    }

    /// Players in the tree.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Boundaries held.
    pub fn bounds(&self) -> usize {
        self.bounds.len()
    }

    /// The players before `key`, estimated. `u128::MAX` counts everyone
    /// (what an ordinal `rank_of_score` of the worst score asks).
    pub fn before(&self, key: u128) -> Estimate {
        if key == u128::MAX {
            return Estimate { before: self.total, error: 0 };
        }
        let j = self.bounds.partition_point(|&b| b <= key);
        let (lo_key, lo) = match j {
            0 => (0, 0),
            j => (self.bounds[j - 1], self.before[j - 1]),
        };
        if j > 0 && lo_key == key {
            return Estimate { before: lo, error: 0 };
        }
        let (width, hi) = match self.bounds.get(j) {
            Some(&hi_key) => ((hi_key - lo_key) as f64, self.before[j]),
            None => ((u128::MAX - lo_key) as f64 + 1.0, self.total),
        };
        let share = ((key - lo_key) as f64 / width).clamp(0.0, 1.0);
        let before = (lo + ((hi - lo) as f64 * share).round() as u64).clamp(lo, hi);
        Estimate { before, error: (before - lo).max(hi - before) }
    }
}

/// The boundaries to count at next: every shard's, merged, sorted and
/// deduplicated, thinned evenly to at most `max` (fewer boundaries make
/// wider buckets, never a wrong bound).
pub fn union_bounds(shards: impl IntoIterator<Item = Vec<u128>>, max: usize) -> Vec<u128> {
    let mut all: Vec<u128> = shards.into_iter().flatten().filter(|&b| b != 0).collect();
    all.sort_unstable();
    all.dedup();
    if all.len() > max {
        let step = all.len().div_ceil(max.max(1));
        all = all.into_iter().step_by(step).collect();
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rankd_shards::tree::BucketShape;
    use rankd_shards::CountTree;

    fn oracle_before(keys: &[u128], q: u128) -> u64 {
        if q == u128::MAX {
            return keys.len() as u64;
        }
        keys.iter().filter(|&&k| k < q).count() as u64
    }

    fn key() -> impl Strategy<Value = u128> {
        prop_oneof![
            (0u64..60, 0u64..4).prop_map(|(s, t)| (u128::from(s) << 64) | u128::from(t)),
            (any::<u64>(), any::<u64>()).prop_map(|(s, t)| (u128::from(s) << 64) | u128::from(t)),
            Just(0),
            Just(u128::MAX),
        ]
    }

    /// Shards' trees over `keys` (player `i` on shard `i % shards`), their
    /// bounds unioned, and the summary counted at them.
    fn summarised(keys: &[u128], shards: usize, buckets: usize, split_ties: bool, max: usize) -> Summary {
        let mut trees: Vec<CountTree> = (0..shards).map(|_| CountTree::new(16).unwrap()).collect();
        for (i, &k) in keys.iter().enumerate() {
            trees[i % shards].add(k, 1);
        }
        let bounds = union_bounds(
            trees.iter().map(|t| {
                let per_bucket = t.total().div_ceil(buckets as u64);
                t.view().bucket_bounds(BucketShape { per_bucket, max_buckets: 8 * buckets, split_ties })
            }),
            max,
        );
        let counts: Vec<(Vec<u64>, u64)> =
            trees.iter().map(|t| (t.view().count_before_sorted(&bounds), t.total())).collect();
        Summary::merge(&bounds, counts.iter().map(|(c, t)| (c.as_slice(), *t))).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn the_exact_count_lies_within_the_bound(
            keys in proptest::collection::vec(key(), 0..600),
            probes in proptest::collection::vec(key(), 1..60),
            shards in 1usize..6,
            buckets in 1usize..40,
            split_ties: bool,
            max in prop_oneof![Just(4usize), Just(10_000)],
        ) {
            let summary = summarised(&keys, shards, buckets, split_ties, max);
            prop_assert_eq!(summary.total(), keys.len() as u64);
            for q in probes.iter().chain(&keys).copied().chain(keys.iter().map(|k| k.saturating_add(1))) {
                let q = if split_ties { q } else { q >> 64 << 64 };
                let exact = oracle_before(&keys, q);
                let Estimate { before, error } = summary.before(q);
                prop_assert!(before.abs_diff(exact) <= error, "q {q:#x}: exact {exact}, estimate {before} ± {error}");
                prop_assert!(before <= summary.total());
            }
        }

        #[test]
        fn arbitrary_bounds_still_bound(
            keys in proptest::collection::vec(key(), 0..300),
            bounds in proptest::collection::vec(key(), 0..50),
            probes in proptest::collection::vec(key(), 1..40),
        ) {
            let mut bounds = bounds;
            bounds.sort_unstable();
            bounds.dedup();
            let counts: Vec<u64> = bounds.iter().map(|&b| keys.iter().filter(|&&k| k < b).count() as u64).collect();
            let summary = Summary::merge(&bounds, [(counts.as_slice(), keys.len() as u64)]).unwrap();
            for q in probes {
                let exact = oracle_before(&keys, q);
                let Estimate { before, error } = summary.before(q);
                prop_assert!(before.abs_diff(exact) <= error);
            }
        }
    }

    #[test]
    fn skewed_boards_get_small_bounds() {
        // Zipf-like: score s held by ~ 10_000 / s players; every bucket but
        // the single-score ones holds at most total / buckets.
        let keys: Vec<u128> =
            (1..=2000u64).flat_map(|s| (0..(10_000 / s)).map(move |t| (u128::from(s) << 64) | u128::from(t))).collect();
        let summary = summarised(&keys, 4, 256, false, 100_000);
        let per_bucket = keys.len() as u64 / 256 + 4;
        for s in 1..=2000u64 {
            let Estimate { before, error } = summary.before(u128::from(s) << 64);
            assert!(before.abs_diff(oracle_before(&keys, u128::from(s) << 64)) <= error);
            assert!(error <= per_bucket, "score {s}: ± {error}");
            if s < 30 {
                assert_eq!(error, 0, "a score holding more than a bucket's share has exact edges");
            }
        }
    }

    #[test]
    fn gaps_and_edges_are_exact_and_mismatches_are_refused() {
        let summary = Summary::merge(&[0, 10, 20, 30], [([0u64, 0, 5, 5].as_slice(), 5)]).unwrap();
        assert_eq!(summary.bounds(), 3);
        assert_eq!(summary.before(10), Estimate { before: 0, error: 0 });
        assert_eq!(summary.before(15), Estimate { before: 3, error: 3 }); // 2.5 rounds up
        assert_eq!(summary.before(25), Estimate { before: 5, error: 0 }); // an empty gap
        assert_eq!(summary.before(u128::MAX), Estimate { before: 5, error: 0 });
        assert_eq!(Summary::default().before(7), Estimate { before: 0, error: 0 });
        assert_eq!(Summary::merge(&[1, 2], [([1u64].as_slice(), 1)]).unwrap_err(), Mismatch { got: 1, want: 2 });
        assert_eq!(union_bounds([vec![5, 1, 0], vec![3, 5]], 10), vec![1, 3, 5]);
        assert_eq!(union_bounds([(1..=100).collect()], 10).len(), 10);
    }
}
