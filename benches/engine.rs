//! Criterion micro-benchmarks of the engine's hot paths (see `benches/README.md`).
//!
//! - `tree/{add,rank}/<N>`: one count-tree update and one rank on a tree
//!   prefilled with N players, at the default branching factor (16). An `add`
//!   is one player *moving*: `add(old, -1)` then `add(new, +1)`.
//! - `tree/checkpoint_copy/<N>`: copying a checkpoint's changed leaves out
//!   of the tree (`CountTree::take_dirty`), which the shard's thread does
//!   between rounds, after a full cycle of the fixture's random moves has
//!   changed most leaves (as a checkpoint finds them).
//! - `small_trees/move/<N>`: N boxed trees of 3 players each, as a shard
//!   of N small boards holds them; one player of a random tree moves. What
//!   a tree's size and its leaf's allocation cost when every move misses
//!   the cache (N is the smallest tree size).
//! - `tree_branching/{add,rank}/<factor>`: the same two operations for every
//!   factor in `BRANCHINGS`, at the smallest N, so the default factor can be
//!   chosen by measurement.
//! - `shard_commit/<durability>/<batch>`: staging a batch of 1k or 10k `set`s
//!   for random players of a prefilled board in a real `Shard` (fjall in a
//!   temporary directory), then `commit()`.
//! - `shard_spread/{boards,one_board}/<P>`: the same with 1k `set`s spread
//!   uniformly over P players, either on boards of two players each (a
//!   shard's share of boards of five on two shards) or on one board, each
//!   batch looked ahead at 16 writes at a time as the server's batch loop
//!   does: what a write costs for landing on a board of its own among a
//!   million, the players being the same.
//! - `shard_scaling/<S>`: S shards, each on its own thread staging 1k
//!   `set`s and committing them with an fsync, over and over, free of the
//!   others; the board's players are split among the shards (by index, as
//!   a router would by hash). What the server's shard sweep cannot show on
//!   a small machine: how the engine alone scales when each shard has a
//!   core.
//!
//! Sizes: the env var `RANKD_BENCH_PLAYERS` is a comma list of tree sizes
//! (default `1000000,10000000`; `_` and `k`/`M` suffixes are accepted, e.g.
//! `10k,1M`). The branching sweep uses the smallest size; the shard board
//! holds `min(100000, smallest size)` players, and the spread has as many
//! boards as the smallest size (twice as many players). CI runs a quick pass with
//!
//! ```sh
//! RANKD_BENCH_PLAYERS=10000 cargo bench --benches -- --test
//! ```
//!
//! Keys are `tree_key(score_key(score, Desc), tiebreak)` with uniformly random
//! 64-bit scores and an ordinal tiebreak (the arrival sequence). Every random
//! input is precomputed with a fixed seed, outside the timed code, and fixtures
//! are built lazily the first time their benchmark runs, so a filter such as
//! `cargo bench --bench engine -- shard_commit` does not build 10M-player trees.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, SamplingMode, Throughput};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rankd_shards::key::{score_key, tiebreak, tree_key};
use rankd_shards::tree::{BRANCHINGS, DEFAULT_BRANCHING};
use rankd_shards::{
    Amount, Board, BoardConfig, CountTree, Durability, Mode, Order, Shard, ShardOptions, Ties, Upcoming, UpcomingWrite,
};
use tempfile::TempDir;

/// The server's allocator: the engine's costs as the server pays them.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// Comma list of tree sizes.
const PLAYERS_VAR: &str = "RANKD_BENCH_PLAYERS";
const DEFAULT_PLAYERS: &str = "1000000,10000000";
/// Players on the shard benchmarks' board (capped by the smallest tree size).
const SHARD_PLAYERS: usize = 100_000;
/// Random moves precomputed per tree fixture; the ring replays them and then
/// undoes them in reverse, so it can cycle forever and stays valid.
const MOVES: usize = 1 << 17;
/// Precomputed rank probes per tree fixture.
const PROBES: usize = 1 << 18;
const SEED: u64 = 0x7261_6e6b_6400_0001;

fn player_counts() -> Vec<usize> {
    let raw = std::env::var(PLAYERS_VAR).unwrap_or_else(|_| DEFAULT_PLAYERS.to_string());
    let mut sizes: Vec<usize> = raw
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| parse_size(s).unwrap_or_else(|| panic!("{PLAYERS_VAR}: `{s}` is not a player count")))
        .collect();
    assert!(!sizes.is_empty(), "{PLAYERS_VAR} lists no sizes");
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

fn parse_size(s: &str) -> Option<usize> {
    let s = s.replace('_', "");
    let (digits, scale) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1_000),
        b'm' | b'M' => (&s[..s.len() - 1], 1_000_000),
        _ => (s.as_str(), 1),
    };
    digits.parse::<usize>().ok()?.checked_mul(scale).filter(|&n| n > 0)
}

/// `1000000` -> `1M`, `10000` -> `10k`.
fn label(n: usize) -> String {
    match n {
        n if n % 1_000_000 == 0 => format!("{}M", n / 1_000_000),
        n if n % 1_000 == 0 => format!("{}k", n / 1_000),
        n => n.to_string(),
    }
}

fn key(score: i64, seq: u64) -> u128 {
    tree_key(score_key(score, Order::Desc), tiebreak(Ties::Ordinal, "", seq))
}

/// A prefilled tree and the precomputed inputs of its benchmarks.
struct TreeFixture {
    tree: CountTree,
    /// `(old, new)` key moves; cycling through them is always valid.
    moves: Vec<(u128, u128)>,
    next_move: usize,
    /// Keys players held after the prefill (a rank costs the same whether or
    /// not the `add` benchmark has moved that player since).
    probes: Vec<u128>,
    next_probe: usize,
}

impl TreeFixture {
    fn new(players: usize, branching: u32) -> Self {
        let mut rng = StdRng::seed_from_u64(SEED ^ players as u64);
        let mut tree = CountTree::new(branching).expect("branching from BRANCHINGS");
        let mut keys: Vec<u128> = (0..players as u64).map(|seq| key(rng.gen(), seq)).collect();
        for &k in &keys {
            tree.add(k, 1);
        }
        // The shard checkpoints dirty leaves every 100k changes; start clean.
        tree.clear_dirty();
        let probes = (0..PROBES).map(|_| keys[rng.gen_range(0..players)]).collect();
        let mut moves = Vec::with_capacity(2 * MOVES);
        for i in 0..MOVES {
            let player = rng.gen_range(0..players);
            let new = key(rng.gen(), (players + i) as u64);
            moves.push((keys[player], new));
            keys[player] = new;
        }
        // Undo in reverse order: the ring ends where it started.
        let undo: Vec<(u128, u128)> = moves.iter().rev().map(|&(old, new)| (new, old)).collect();
        moves.extend(undo);
        Self { tree, moves, next_move: 0, probes, next_probe: 0 }
    }

    /// One player moves: its old key leaves, its new key arrives.
    #[inline]
    fn add(&mut self) {
        if self.step() {
            // Like a checkpoint: keeps the dirty set the size it has in a shard.
            self.tree.clear_dirty();
        }
    }

    /// The next move of the ring; whether it was the ring's last.
    #[inline]
    fn step(&mut self) -> bool {
        let (old, new) = self.moves[self.next_move];
        self.next_move += 1;
        if self.next_move == self.moves.len() {
            self.next_move = 0;
        }
        self.tree.prefetch(new);
        self.tree.add(old, -1);
        self.tree.add(new, 1);
        self.next_move == 0
    }

    /// Runs the whole ring of moves once: the tree ends as it began, with
    /// every leaf a move touched marked changed.
    fn change_many_leaves(&mut self) {
        for _ in 0..self.moves.len() {
            self.step();
        }
    }

    /// The rank of an existing player (players strictly before its key).
    #[inline]
    fn rank(&mut self) -> u64 {
        let probe = self.probes[self.next_probe];
        self.next_probe = (self.next_probe + 1) % self.probes.len();
        self.tree.count_before(probe)
    }
}

/// Players in each of [`SmallTrees`]'s trees.
const SMALL_TREE_PLAYERS: usize = 3;

/// Many small trees, each boxed as a shard holds a board's, and the
/// precomputed moves of their benchmark.
struct SmallTrees {
    /// Boxed on purpose: a shard's holdings point to each tree.
    #[allow(clippy::vec_box)]
    trees: Vec<Box<CountTree>>,
    /// Each tree's players' keys now.
    keys: Vec<[u128; SMALL_TREE_PLAYERS]>,
    /// `(tree, player, new key)`; any order of them is valid, as the old
    /// key is looked up in `keys`.
    moves: Vec<(usize, usize, u128)>,
    next_move: usize,
}

impl SmallTrees {
    fn new(trees: usize) -> Self {
        let mut rng = StdRng::seed_from_u64(SEED ^ trees as u64 ^ 0x5);
        let mut seq = 0u64;
        let mut key_now = |rng: &mut StdRng| {
            seq += 1;
            key(rng.gen_range(0..1000), seq)
        };
        let keys: Vec<[u128; SMALL_TREE_PLAYERS]> =
            (0..trees).map(|_| std::array::from_fn(|_| key_now(&mut rng))).collect();
        let trees = keys
            .iter()
            .map(|players| {
                let mut tree = Box::new(CountTree::new(DEFAULT_BRANCHING).expect("the default branching"));
                for &k in players {
                    tree.add(k, 1);
                }
                tree
            })
            .collect();
        let moves = (0..MOVES)
            .map(|_| (rng.gen_range(0..keys.len()), rng.gen_range(0..SMALL_TREE_PLAYERS), key_now(&mut rng)))
            .collect();
        Self { trees, keys, moves, next_move: 0 }
    }

    /// One player of one tree moves: its old key leaves, its new key arrives.
    #[inline]
    fn step(&mut self) -> u64 {
        let (tree, player, new) = self.moves[self.next_move];
        self.next_move = (self.next_move + 1) % self.moves.len();
        let old = std::mem::replace(&mut self.keys[tree][player], new);
        let tree = &mut self.trees[tree];
        tree.add(old, -1);
        tree.add(new, 1)
    }
}

fn small_trees(c: &mut Criterion) {
    let trees = player_counts()[0];
    let mut group = c.benchmark_group("small_trees");
    group.throughput(Throughput::Elements(1));
    let mut fixture: Option<SmallTrees> = None;
    group.bench_function(BenchmarkId::new("move", label(trees)), |b| {
        let fx = fixture.get_or_insert_with(|| SmallTrees::new(trees));
        b.iter(|| black_box(fx.step()));
    });
    group.finish();
}

/// A compact tree of `entries` players (random scores below 10^9, short
/// names' tiebreaks, as a small board's), its change taken by a checkpoint,
/// and keys to rank.
fn compact_tree(entries: usize) -> (Box<CountTree>, Vec<u128>) {
    let mut rng = StdRng::seed_from_u64(SEED ^ entries as u64 ^ 0x6);
    let mut tree = Box::new(CountTree::new(DEFAULT_BRANCHING).expect("the default branching"));
    let name = |i: usize| tiebreak(Ties::Competition, &format!("p{i}"), 0);
    let keys: Vec<u128> =
        (0..entries).map(|i| tree_key(score_key(rng.gen_range(0..1_000_000_000), Order::Desc), name(i))).collect();
    for &k in &keys {
        tree.add(k, 1);
    }
    drop(tree.take_dirty());
    (tree, keys)
}

/// Reads of a small board's idle tree, live and frozen (packed, unpacked
/// by every read), and a thaw and freeze: what packing costs a read and a
/// first write.
fn frozen_tree(c: &mut Criterion) {
    let mut group = c.benchmark_group("frozen_tree");
    group.throughput(Throughput::Elements(1));
    for entries in [2, 16, 64] {
        let (live, keys) = compact_tree(entries);
        let mut probe = keys.iter().copied().cycle();
        group.bench_function(BenchmarkId::new("rank_live", entries), |b| {
            b.iter(|| black_box(live.view().count_before(probe.next().unwrap_or_default())))
        });
        let mut frozen = Some(live.freeze().expect("compact and idle"));
        group.bench_function(BenchmarkId::new("rank_frozen", entries), |b| {
            let view = frozen.as_ref().expect("frozen").view(DEFAULT_BRANCHING);
            b.iter(|| black_box(view.count_before(probe.next().unwrap_or_default())))
        });
        group.bench_function(BenchmarkId::new("thaw_and_freeze", entries), |b| {
            b.iter(|| {
                let tree = frozen.take().expect("frozen").thaw(DEFAULT_BRANCHING);
                frozen = Some(tree.freeze().expect("unchanged"));
            })
        });
    }
    group.finish();
}

/// Registers `add` and `rank` benchmarks sharing one lazily built fixture.
fn add_and_rank(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    param: &str,
    players: usize,
    branching: u32,
) {
    let mut fixture: Option<TreeFixture> = None;
    group.bench_function(BenchmarkId::new("add", param), |b| {
        let fx = fixture.get_or_insert_with(|| TreeFixture::new(players, branching));
        b.iter(|| fx.add());
    });
    group.bench_function(BenchmarkId::new("rank", param), |b| {
        let fx = fixture.get_or_insert_with(|| TreeFixture::new(players, branching));
        b.iter(|| black_box(fx.rank()));
    });
}

fn tree(c: &mut Criterion) {
    let mut group = c.benchmark_group("tree");
    group.throughput(Throughput::Elements(1));
    for players in player_counts() {
        add_and_rank(&mut group, &label(players), players, DEFAULT_BRANCHING);
    }
    group.finish();

    // Slow to set up (a whole ring of moves before each copy, untimed, as
    // is dropping the copy): few samples.
    let mut group = c.benchmark_group("tree");
    group.sample_size(10);
    for players in player_counts() {
        let mut fixture: Option<TreeFixture> = None;
        group.bench_function(BenchmarkId::new("checkpoint_copy", label(players)), |b| {
            let fx = fixture.get_or_insert_with(|| TreeFixture::new(players, DEFAULT_BRANCHING));
            b.iter_custom(|iters| {
                let mut timed = std::time::Duration::ZERO;
                for _ in 0..iters {
                    fx.change_many_leaves();
                    let started = std::time::Instant::now();
                    let copy = black_box(fx.tree.take_dirty());
                    timed += started.elapsed();
                    drop(copy);
                }
                timed
            });
        });
    }
    group.finish();
}

fn tree_branching(c: &mut Criterion) {
    let players = player_counts()[0];
    let mut group = c.benchmark_group("tree_branching");
    group.throughput(Throughput::Elements(1));
    for branching in BRANCHINGS {
        add_and_rank(&mut group, &branching.to_string(), players, branching);
    }
    group.finish();
}

/// A shard fixture whose batches of writes are drawn outside the timed
/// code and applied inside it.
trait Batches {
    type Writes;
    fn draw(&mut self, batch: usize) -> Self::Writes;
    fn apply(&mut self, writes: Self::Writes);
}

/// What applying `iters` batches of `batch` writes took, each drawn
/// untimed just before.
fn time_batches(fixture: &mut impl Batches, batch: usize, iters: u64) -> Duration {
    (0..iters)
        .map(|_| {
            let writes = fixture.draw(batch);
            let started = Instant::now();
            fixture.apply(writes);
            started.elapsed()
        })
        .sum()
}

/// A shard holding one board of prefilled players.
struct ShardFixture {
    // Declared before `_dir` so the database closes before its files go.
    shard: Shard,
    board: Board,
    names: Vec<String>,
    seq: u64,
    rng: StdRng,
    _dir: TempDir,
}

impl ShardFixture {
    fn new(players: usize, durability: Durability) -> Self {
        Self::with_names((0..players).map(|i| format!("player-{i:08}")).collect(), durability, 0)
    }

    /// A shard prefilled with `names`; `stream` varies its random moves.
    fn with_names(names: Vec<String>, durability: Durability, stream: u64) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let options = ShardOptions { durability, ..ShardOptions::default() };
        let mut shard = Shard::open(dir.path(), options).expect("open shard");
        let board = Board { id: 1, name: "bench".into(), config: BoardConfig::default().into() };
        let mut rng = StdRng::seed_from_u64(SEED ^ 0x5a4d ^ stream);
        let mut seq = 0;
        for chunk in names.chunks(10_000) {
            for name in chunk {
                seq += 1;
                shard.write(&board, name, rng.gen_range(0..1_000_000), Mode::Set, seq).expect("prefill write");
            }
            shard.commit().expect("prefill commit");
        }
        Self { shard, board, names, seq, rng, _dir: dir }
    }
}

impl Batches for ShardFixture {
    type Writes = Vec<(usize, i64)>;

    /// Random moves for one batch, drawn outside the timed code.
    fn draw(&mut self, batch: usize) -> Vec<(usize, i64)> {
        (0..batch).map(|_| (self.rng.gen_range(0..self.names.len()), self.rng.gen_range(0..1_000_000))).collect()
    }

    /// Stages `writes` and commits them as one batch.
    fn apply(&mut self, writes: Vec<(usize, i64)>) {
        for (player, score) in writes {
            self.seq += 1;
            self.shard.write(&self.board, &self.names[player], score, Mode::Set, self.seq).expect("write");
        }
        self.shard.commit().expect("commit");
    }
}

fn shard_commit(c: &mut Criterion) {
    let players = SHARD_PLAYERS.min(player_counts()[0]);
    let mut group = c.benchmark_group("shard_commit");
    // Iterations take milliseconds (10k writes: ~0.1 s): equal-sized samples.
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    let cases = [
        (Durability::Buffered, "buffered", 1_000),
        (Durability::Buffered, "buffered", 10_000),
        (Durability::Sync, "sync", 1_000),
    ];
    let mut fixtures: [Option<ShardFixture>; 2] = [None, None];
    for (durability, name, batch) in cases {
        let fixture = &mut fixtures[usize::from(durability == Durability::Sync)];
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(BenchmarkId::new(name, label(batch)), |b| {
            let fixture = fixture.get_or_insert_with(|| ShardFixture::new(players, durability));
            b.iter_custom(|iters| time_batches(fixture, batch, iters));
        });
    }
    group.finish();
}

/// Players each board of the spread holds in its shard (a shard's share of
/// boards of five on two shards).
const SPREAD_PLAYERS: usize = 2;

/// Writes the spread looks ahead at together: the server's batch loop's
/// `LOOK_AHEAD`.
const SPREAD_LOOK_AHEAD: usize = 16;

/// A real shard holding `boards` boards of the same players, for
/// `shard_spread`.
struct SpreadFixture {
    // Declared before `_dir` so the database closes before its files go.
    shard: Shard,
    boards: Vec<Board>,
    /// Every board's players, named as `rankd-bench --player-prefix p`
    /// names them.
    names: Vec<String>,
    seq: u64,
    rng: StdRng,
    _dir: TempDir,
}

impl SpreadFixture {
    fn new(boards: usize, players: usize) -> Self {
        let dir = tempfile::tempdir().expect("temporary directory");
        let options = ShardOptions { durability: Durability::Buffered, ..ShardOptions::default() };
        let mut shard = Shard::open(dir.path(), options).expect("open shard");
        let config = std::sync::Arc::new(BoardConfig::default());
        let boards: Vec<Board> = (0..boards)
            .map(|i| Board { id: i as u64 + 1, name: format!("lvl:{i:07}").into(), config: config.clone() })
            .collect();
        let names: Vec<String> = (0..players).map(|i| format!("p{i}")).collect();
        let mut rng = StdRng::seed_from_u64(SEED ^ 0x5b7e);
        let mut seq = 0;
        let all = boards.iter().flat_map(|board| names.iter().map(move |name| (board, name)));
        for (written, (board, name)) in all.enumerate() {
            seq += 1;
            shard.write(board, name, rng.gen_range(0..1_000_000), Mode::Set, seq).expect("prefill write");
            if written % 10_000 == 9_999 {
                shard.commit().expect("prefill commit");
            }
        }
        shard.commit().expect("prefill commit");
        Self { shard, boards, names, seq, rng, _dir: dir }
    }
}

impl Batches for SpreadFixture {
    type Writes = Vec<(usize, usize, i64)>;

    /// Random writes for one batch (board, player, score), drawn outside
    /// the timed code.
    fn draw(&mut self, batch: usize) -> Vec<(usize, usize, i64)> {
        let (boards, players) = (self.boards.len(), self.names.len());
        (0..batch)
            .map(|_| (self.rng.gen_range(0..boards), self.rng.gen_range(0..players), self.rng.gen_range(0..1_000_000)))
            .collect()
    }

    /// Looks ahead at, stages and commits `writes` as one batch.
    fn apply(&mut self, writes: Vec<(usize, usize, i64)>) {
        for group in writes.chunks(SPREAD_LOOK_AHEAD) {
            let upcoming = group.iter().enumerate().map(|(i, &(board, player, score))| {
                Upcoming::Write(UpcomingWrite {
                    board: &self.boards[board],
                    player: &self.names[player],
                    amount: Amount::Score(score),
                    mode: Mode::Set,
                    seq: self.seq + 1 + i as u64,
                })
            });
            self.shard.prefetch(upcoming);
            for &(board, player, score) in group {
                self.seq += 1;
                let (board, player) = (&self.boards[board], &self.names[player]);
                self.shard.write(board, player, score, Mode::Set, self.seq).expect("write");
            }
        }
        self.shard.commit().expect("commit");
    }
}

fn shard_spread(c: &mut Criterion) {
    const BATCH: usize = 1_000;
    let boards = player_counts()[0];
    let mut group = c.benchmark_group("shard_spread");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.throughput(Throughput::Elements(BATCH as u64));
    let players = boards * SPREAD_PLAYERS;
    let cases = [("boards", boards, SPREAD_PLAYERS), ("one_board", 1, players)];
    for (name, boards, per_board) in cases {
        let mut fixture: Option<SpreadFixture> = None;
        group.bench_function(BenchmarkId::new(name, label(players)), |b| {
            let fixture = fixture.get_or_insert_with(|| SpreadFixture::new(boards, per_board));
            b.iter_custom(|iters| time_batches(fixture, BATCH, iters));
        });
    }
    group.finish();
}

/// Shard counts of the scaling group: one, and one per core up to four.
fn shard_counts() -> Vec<usize> {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    let mut counts = vec![1, 2, 4];
    counts.retain(|&s| s == 1 || s <= cores);
    counts
}

fn shard_scaling(c: &mut Criterion) {
    const BATCH: usize = 1_000;
    let players = SHARD_PLAYERS.min(player_counts()[0]);
    let mut group = c.benchmark_group("shard_scaling");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    for shards in shard_counts() {
        group.throughput(Throughput::Elements((shards * BATCH) as u64));
        let mut fixtures: Option<Vec<ShardFixture>> = None;
        group.bench_function(BenchmarkId::from_parameter(shards), |b| {
            let fixtures = fixtures.get_or_insert_with(|| {
                (0..shards)
                    .map(|shard| {
                        let names = (shard..players).step_by(shards).map(|i| format!("player-{i:08}")).collect();
                        ShardFixture::with_names(names, Durability::Sync, shard as u64)
                    })
                    .collect()
            });
            // Each shard runs its `iters` batches on its own thread, free
            // of the others (a barrier per batch would make every shard
            // wait for the slowest, e.g. one writing runs), as in a server.
            b.iter_custom(|iters| {
                let batches: Vec<Vec<_>> =
                    fixtures.iter_mut().map(|fixture| (0..iters).map(|_| fixture.draw(BATCH)).collect()).collect();
                let started = Instant::now();
                std::thread::scope(|scope| {
                    for (fixture, batches) in fixtures.iter_mut().zip(batches) {
                        scope.spawn(move || batches.into_iter().for_each(|writes| fixture.apply(writes)));
                    }
                });
                started.elapsed()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, tree, small_trees, frozen_tree, tree_branching, shard_commit, shard_spread, shard_scaling);
criterion_main!(benches);
