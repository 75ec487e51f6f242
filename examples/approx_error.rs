//! Measures approximate ranks' error on large boards, without a server: the
//! same count trees, bucket bounds and summary arithmetic the server uses
//! (4 shards, players placed by hash, the default 4096 buckets per shard),
//! against exact ranks from a sort.
//!
//!     cargo run --release --example approx_error [PLAYERS] [SHARDS]
//!
//! For each distribution it prints, as a share of the board, the mean and
//! largest distance between the estimated and the exact rank of every
//! player (competition ties), the mean and largest `error` bound answered,
//! and the same for `rank_of_score` of 100 000 random scores.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rankd::request_path::approx::summary::{union_bounds, Summary};
use rankd::request_path::approx::Limits;
use rankd::request_path::router::shard_of;
use rankd_shards::key::{score_key, tree_key};
use rankd_shards::tree::BucketShape;
use rankd_shards::{CountTree, Order};

fn draw(spread: &str, rng: &mut StdRng, zipf_cdf: &[f64]) -> i64 {
    match spread {
        "uniform" => rng.gen_range(0..1_000_000_000),
        "zipf" => zipf_cdf.partition_point(|&c| c < rng.gen::<f64>()) as i64 + 1,
        _ => {
            let (u1, u2): (f64, f64) = (rng.gen::<f64>().max(1e-12), rng.gen());
            let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
            (1_000_000.0 + 10_000.0 * z).round() as i64
        }
    }
}

#[derive(Default)]
struct Tally {
    n: u64,
    off: f64,
    max_off: u64,
    bound: f64,
    max_bound: u64,
    outside: u64,
}

impl Tally {
    fn add(&mut self, exact: u64, estimate: u64, error: u64) {
        let off = exact.abs_diff(estimate);
        self.n += 1;
        self.off += off as f64;
        self.max_off = self.max_off.max(off);
        self.bound += error as f64;
        self.max_bound = self.max_bound.max(error);
        self.outside += u64::from(off > error);
    }

    fn line(&self, what: &str, players: u64) -> String {
        let share = |x: f64| 100.0 * x / players as f64;
        format!(
            "{what:>14}: |estimate - exact| mean {:.5}% max {:.5}% of the board; error bound mean {:.5}% max {:.5}%; \
             outside the bound: {}",
            share(self.off / self.n as f64),
            share(self.max_off as f64),
            share(self.bound / self.n as f64),
            share(self.max_bound as f64),
            self.outside
        )
    }
}

fn main() {
    let mut args = std::env::args().skip(1);
    let players: u64 = args.next().and_then(|a| a.parse().ok()).unwrap_or(1_000_000);
    let shards: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(4);
    let limits = Limits::default();
    let weights: Vec<f64> = (1..=100_000).map(|k| 1.0 / f64::powf(k as f64, 1.1)).collect();
    let total: f64 = weights.iter().sum();
    let zipf_cdf: Vec<f64> = weights
        .iter()
        .scan(0.0, |acc, w| {
            *acc += w / total;
            Some(*acc)
        })
        .collect();
    println!("{players} players on {shards} shards, {} buckets per shard", limits.buckets);
    for spread in ["uniform", "zipf", "normal"] {
        let mut rng = StdRng::seed_from_u64(7);
        let scores: Vec<i64> = (0..players).map(|_| draw(spread, &mut rng, &zipf_cdf)).collect();
        let mut trees: Vec<CountTree> = (0..shards).map(|_| CountTree::new(16).expect("branching")).collect();
        let keys: Vec<u128> = scores.iter().map(|&s| tree_key(score_key(s, Order::Desc), 0)).collect();
        for (i, &key) in keys.iter().enumerate() {
            let name = format!("player:{i}");
            trees[shard_of(&name, shards)].add(key | u128::from(i as u64 + 1), 1);
        }
        let started = std::time::Instant::now();
        let bounds = union_bounds(
            trees.iter().map(|t| {
                let per_bucket = t.total().div_ceil(limits.buckets as u64);
                t.view().bucket_bounds(BucketShape { per_bucket, max_buckets: 8 * limits.buckets, split_ties: false })
            }),
            limits.max_bounds,
        );
        let counts: Vec<(Vec<u64>, u64)> =
            trees.iter().map(|t| (t.view().count_before_sorted(&bounds), t.total())).collect();
        let summary = Summary::merge(&bounds, counts.iter().map(|(c, t)| (c.as_slice(), *t))).expect("merge");
        let took = started.elapsed();
        let mut sorted = keys.clone();
        sorted.sort_unstable();
        let mut ranks = Tally::default();
        for &key in &keys {
            let exact = sorted.partition_point(|&k| k < key) as u64;
            let estimate = summary.before(key);
            ranks.add(exact, estimate.before, estimate.error);
        }
        let mut of_score = Tally::default();
        for _ in 0..100_000 {
            let key = tree_key(score_key(draw(spread, &mut rng, &zipf_cdf) + rng.gen_range(-2..=2), Order::Desc), 0);
            let estimate = summary.before(key);
            of_score.add(sorted.partition_point(|&k| k < key) as u64, estimate.before, estimate.error);
        }
        let distinct = {
            let mut s = scores.clone();
            s.sort_unstable();
            s.dedup();
            s.len()
        };
        println!(
            "{spread}: {distinct} distinct scores, {} boundaries, summary built in {:.1} ms (one thread, all shards)",
            summary.bounds(),
            took.as_secs_f64() * 1000.0
        );
        println!("{}", ranks.line("rank", players));
        println!("{}", of_score.line("rank_of_score", players));
    }
}
