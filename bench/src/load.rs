//! Running a load: prefilling the board (or boards), then C connections
//! each keeping D requests in flight, timing each pipeline batch into an HDR
//! histogram.

use std::borrow::Cow;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution as _, Zipf};

use crate::args::{BenchArgs, KeyDistribution, LoadArgs, Workload};
use crate::cpu;
use crate::error::BenchError;
use crate::report::Report;
use crate::target::{self, Target};
use rankd_client::{ConnectOptions, WidSource};

/// Runs the load against rankd at `args.server` (or `args.target`) and
/// returns the report.
pub async fn run(args: &BenchArgs) -> Result<Report, BenchError> {
    let target = match &args.target {
        Some(url) => Target::parse(url)?,
        None => Target::Rankd(args.server.clone()),
    };
    run_on(&target, &args.load, args.reset, &args.connect.options()?).await
}

/// Runs `load` against `target` (a rankd one reached as `connect` says):
/// optionally empties the board and prefills it, then measures.
pub async fn run_on(
    target: &Target,
    load: &LoadArgs,
    reset: bool,
    connect: &ConnectOptions,
) -> Result<Report, BenchError> {
    load.validate()?;
    if load.wid && !matches!(target, Target::Rankd(_)) {
        return Err(BenchError::Invalid("--wid needs a rankd target: Redis has no idempotent writes".into()));
    }
    if load.approx && !matches!(target, Target::Rankd(_)) {
        return Err(BenchError::Invalid("--approx needs a rankd target: Redis has no approximate ranks".into()));
    }
    if reset && load.boards > 1 {
        return Err(BenchError::Invalid("--reset empties one board: not with --boards".into()));
    }
    // One seed for the whole run, the prefill's and the measurement's.
    let load = &LoadArgs { seed: Some(load.seed.unwrap_or_else(rand::random)), ..load.clone() };
    let setup = target::Setup::probe(target, &load.board, connect).await?;
    if reset {
        setup.reset(&load.board).await?;
    }
    if load.prefill {
        let started = Instant::now();
        prefill(&setup, load).await?;
        let secs = started.elapsed().as_secs_f64();
        let players = load.players * load.boards;
        let boards = if load.boards > 1 { format!(" ({} boards)", load.boards) } else { String::new() };
        eprintln!(
            "prefilled {players} players{boards} on {} in {secs:.1} s ({:.0} players/s)",
            setup.url(),
            players as f64 / secs
        );
    }
    measure(&setup, load).await
}

pub(crate) fn progress_bar(load: &LoadArgs, len: u64, template: &str) -> ProgressBar {
    let target = if load.progress_visible() { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() };
    let bar = ProgressBar::with_draw_target(Some(len), target);
    if let Ok(style) = ProgressStyle::with_template(template) {
        bar.set_style(style.progress_chars("=> "));
    }
    bar
}

/// Gives every player of every board a score, over all connections: each
/// board's players in requests of up to [`target::Conn::prefill_chunk`];
/// one request in flight per connection on one board, `--pipeline` of them
/// with `--boards` (where each request is a whole small board).
async fn prefill(setup: &target::Setup, load: &LoadArgs) -> Result<(), BenchError> {
    let total = load.players * load.boards;
    let bar = progress_bar(load, total, "prefill [{elapsed_precise}] [{bar:30}] {pos}/{len} players");
    // Requests handed out so far, numbered board by board.
    let next = Arc::new(AtomicU64::new(0));
    let in_flight = if load.boards > 1 { load.pipeline as u64 } else { 1 };
    let mut tasks = Vec::new();
    for c in 0..load.connections {
        let (setup, load, next, bar) = (setup.clone(), load.clone(), next.clone(), bar.clone());
        tasks.push(tokio::spawn(async move {
            let names = Names::new(&load);
            let mut conn = setup.connect().await?;
            let chunk = conn.prefill_chunk();
            let per_board = load.players.div_ceil(chunk);
            let requests = per_board * load.boards;
            let mut rng = StdRng::seed_from_u64(load.seed() ^ ((c as u64) << 32));
            loop {
                let first = next.fetch_add(in_flight, Ordering::Relaxed);
                if first >= requests {
                    return Ok::<(), BenchError>(());
                }
                let batch: Vec<(u64, Vec<(u64, i64)>)> = (first..(first + in_flight).min(requests))
                    .map(|r| {
                        let start = r % per_board * chunk;
                        let players = start..(start + chunk).min(load.players);
                        (r / per_board, players.map(|i| (i, rng.gen_range(0..load.score_range))).collect())
                    })
                    .collect();
                conn.prefill(&names, &batch).await?;
                bar.inc(batch.iter().map(|(_, entries)| entries.len() as u64).sum());
            }
        }));
    }
    let result = join_all(tasks).await;
    bar.finish_and_clear();
    result.map(|_| ())
}

pub(crate) async fn join_all<T>(
    tasks: Vec<tokio::task::JoinHandle<Result<T, BenchError>>>,
) -> Result<Vec<T>, BenchError> {
    let mut out = Vec::with_capacity(tasks.len());
    let mut first_error = None;
    for task in tasks {
        match task.await {
            Ok(Ok(v)) => out.push(v),
            Ok(Err(e)) => {
                first_error.get_or_insert(e);
            }
            Err(e) => {
                first_error.get_or_insert(BenchError::Other(e.to_string()));
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

fn new_histogram() -> Result<Histogram<u64>, BenchError> {
    Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).map_err(|e| BenchError::Other(e.to_string()))
}

/// The timed part of a run.
async fn measure(setup: &target::Setup, load: &LoadArgs) -> Result<Report, BenchError> {
    let stop = Arc::new(AtomicBool::new(false));
    let budget = Arc::new(AtomicU64::new(load.ops.unwrap_or(u64::MAX)));
    let done = Arc::new(AtomicU64::new(0));
    let bar_len = load.ops.unwrap_or((load.duration * 1000.0) as u64);
    let bar = progress_bar(load, bar_len, "{prefix} [{elapsed_precise}] [{bar:30}] {msg}");
    bar.set_prefix(format!("{:?}", load.workload).to_lowercase());
    // A metrics address that does not answer fails the run before it starts.
    let server_before = setup.server_sample(load.server_metrics.as_deref()).await?;
    let client_cpu_before = cpu::own_cpu_seconds();
    let machine_cpu_before = cpu::machine_cpu_seconds();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..load.connections {
        let (setup, load, stop, budget, done) =
            (setup.clone(), load.clone(), stop.clone(), budget.clone(), done.clone());
        tasks.push(tokio::spawn(async move { connection_load(&setup, &load, c as u64, &stop, &budget, &done).await }));
    }
    let ticker = {
        let (bar, done, stop, by_ops) = (bar.clone(), done.clone(), stop.clone(), load.ops.is_some());
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_millis(200));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let (n, secs) = (done.load(Ordering::Relaxed), started.elapsed().as_secs_f64());
                bar.set_position(if by_ops { n } else { (secs * 1000.0) as u64 });
                bar.set_message(format!("{n} ops, {:.0} ops/s", n as f64 / secs.max(1e-9)));
            }
        })
    };
    if load.ops.is_none() {
        // Stop at the deadline, or earlier if every connection has failed.
        let deadline = tokio::time::Instant::now() + Duration::from_secs_f64(load.duration);
        while tokio::time::Instant::now() < deadline && !tasks.iter().all(|t| t.is_finished()) {
            tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + Duration::from_millis(50))).await;
        }
    }
    // With --ops the connections stop by themselves when the budget is spent.
    stop.store(load.ops.is_none(), Ordering::Relaxed);
    let results = join_all(tasks).await;
    let seconds = started.elapsed().as_secs_f64();
    let client_cpu_seconds = cpu::own_cpu_seconds().zip(client_cpu_before).map(|(after, before)| after - before);
    let machine_cpu = cpu::machine_cpu_seconds().zip(machine_cpu_before).map(|(after, before)| after.since(before));
    let server = match server_before {
        Some(before) => setup.server_sample(load.server_metrics.as_deref()).await?.map(|after| after.since(&before)),
        None => None,
    };
    stop.store(true, Ordering::Relaxed);
    let _ = ticker.await;
    bar.finish_and_clear();
    let mut histogram = new_histogram()?;
    let (mut ops, mut errors) = (0, 0);
    for (h, ok, err) in results? {
        histogram.add(&h).map_err(|e| BenchError::Other(e.to_string()))?;
        ops += ok;
        errors += err;
    }
    Ok(Report {
        target: setup.url(),
        server_version: setup.version(),
        workload: load.workload,
        mode: load.mode,
        wid: load.wid,
        distribution: load.distribution,
        zipf_exponent: (load.distribution == KeyDistribution::Zipf).then_some(load.zipf_exponent),
        players: load.players,
        connections: load.connections,
        pipeline: load.pipeline,
        offered_rate: load.rate,
        seed: load.seed,
        ops,
        errors,
        seconds,
        ops_per_sec: ops as f64 / seconds,
        p50_us: histogram.value_at_quantile(0.5),
        p99_us: histogram.value_at_quantile(0.99),
        p999_us: histogram.value_at_quantile(0.999),
        max_us: histogram.max(),
        notes: setup.notes(load.workload).into_iter().chain(spread_note(load)).collect(),
        server_cpu_seconds: server.as_ref().map(|s| s.cpu.total),
        server_latency: server.as_ref().map(|s| s.latency.summary()).unwrap_or_default(),
        server_cpu_by_thread: server.map(|s| s.cpu.by_thread).unwrap_or_default(),
        client_cpu_seconds,
        machine_busy_seconds: machine_cpu.map(|cpu| cpu.busy),
        machine_idle_seconds: machine_cpu.map(|cpu| cpu.idle),
    })
}

/// What the report says of a load spread over boards.
fn spread_note(load: &LoadArgs) -> Option<String> {
    let names = Names::new(load);
    (load.boards > 1).then(|| {
        format!(
            "spread uniformly over {} boards ({} to {}), {} players each",
            load.boards,
            names.board(0),
            names.board(load.boards - 1),
            load.players
        )
    })
}

async fn connection_load(
    setup: &target::Setup,
    load: &LoadArgs,
    id: u64,
    stop: &AtomicBool,
    budget: &AtomicU64,
    done: &AtomicU64,
) -> Result<(Histogram<u64>, u64, u64), BenchError> {
    let mut conn = setup.connect().await?;
    let names = Names::new(load);
    let mut generator = Generator::new(load, load.seed().wrapping_mul(31).wrapping_add(id))?;
    let mut histogram = new_histogram()?;
    let (mut ok, mut err) = (0u64, 0u64);
    let mut ops = Vec::with_capacity(load.pipeline);
    let mut wids = load.wid.then(WidSource::new);
    // With --rate, batch k of this connection is due at `k * every`.
    let every = load.rate.map(|rate| Duration::from_secs_f64(load.pipeline as f64 * load.connections as f64 / rate));
    let (start, mut batches) = (Instant::now(), 0u32);
    while !stop.load(Ordering::Relaxed) {
        let want = load.pipeline as u64;
        let granted = budget
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |left| Some(left.saturating_sub(want)))
            .map_or(0, |left| left.min(want));
        if granted == 0 {
            break;
        }
        ops.clear();
        ops.extend((0..granted).map(|_| (generator.board(), generator.next_op())));
        let sent = match every {
            Some(every) => {
                let due = start + every * batches;
                batches += 1;
                tokio::time::sleep_until(due.into()).await;
                due
            }
            None => Instant::now(),
        };
        let (good, bad) = conn.execute(&names, load.mode, load.approx, &ops, wids.as_mut()).await?;
        let micros = sent.elapsed().as_micros() as u64;
        histogram.saturating_record_n(micros.max(1), granted);
        ok += good;
        err += bad;
        done.fetch_add(granted, Ordering::Relaxed);
    }
    Ok((histogram, ok, err))
}

/// One operation of the load, independent of the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// Write `score` for player `player` (with the run's mode).
    Write {
        /// Player index.
        player: u64,
        /// Score.
        score: i64,
    },
    /// A player's rank.
    Rank(u64),
    /// The best 10.
    Top,
    /// A player and 5 neighbours each side.
    Around(u64),
    /// Players on the board.
    Count,
}

/// How a load names its boards and players, the same on every target.
#[derive(Debug, Clone)]
pub struct Names {
    /// `--board`: the board, or the boards' common prefix.
    board: String,
    /// `--boards`.
    boards: u64,
    /// `--player-prefix`.
    player_prefix: String,
}

impl Names {
    /// The names `load` uses.
    pub fn new(load: &LoadArgs) -> Self {
        Self { board: load.board.clone(), boards: load.boards, player_prefix: load.player_prefix.clone() }
    }

    /// The name of board `i` (`0..boards`): `--board` itself when there is
    /// one, else `--board`, a colon and `i` in 7 digits.
    pub fn board(&self, i: u64) -> Cow<'_, str> {
        if self.boards == 1 {
            Cow::Borrowed(&self.board)
        } else {
            Cow::Owned(format!("{}:{i:07}", self.board))
        }
    }

    /// The name of player `i`.
    pub fn player(&self, i: u64) -> String {
        format!("{}{i}", self.player_prefix)
    }
}

enum Keys {
    Uniform(u64),
    Zipf(Zipf<f64>),
}

/// Draws the load's operations and the boards they go to.
struct Generator {
    /// Seeded per connection, so a run can be repeated exactly.
    rng: StdRng,
    /// Boards drawn from (`--boards`).
    boards: u64,
    /// How players are picked (`--distribution`).
    keys: Keys,
    /// Which operations are drawn (`--workload`).
    workload: Workload,
    /// Share of writes in `mixed` (`--write-ratio`).
    write_ratio: f64,
    /// Scores are drawn from `0..score_range` (`--score-range`).
    score_range: i64,
}

impl Generator {
    fn new(load: &LoadArgs, seed: u64) -> Result<Self, BenchError> {
        let keys = match load.distribution {
            KeyDistribution::Uniform => Keys::Uniform(load.players),
            KeyDistribution::Zipf => {
                Keys::Zipf(Zipf::new(load.players, load.zipf_exponent).map_err(|e| BenchError::Invalid(e.to_string()))?)
            }
        };
        Ok(Self {
            rng: StdRng::seed_from_u64(seed),
            boards: load.boards,
            keys,
            workload: load.workload,
            write_ratio: load.write_ratio,
            score_range: load.score_range,
        })
    }

    /// The board of the next operation: uniform over `--boards` (drawing
    /// nothing when there is one, so one-board runs repeat as before).
    fn board(&mut self) -> u64 {
        if self.boards > 1 {
            self.rng.gen_range(0..self.boards)
        } else {
            0
        }
    }

    fn player(&mut self) -> u64 {
        match &self.keys {
            Keys::Uniform(n) => self.rng.gen_range(0..*n),
            // Zipf draws 1..=n, most often 1.
            Keys::Zipf(z) => (z.sample(&mut self.rng) as u64).saturating_sub(1),
        }
    }

    fn next_op(&mut self) -> Op {
        let write = match self.workload {
            Workload::Set => true,
            Workload::Mixed => self.rng.gen_bool(self.write_ratio),
            _ => false,
        };
        if write {
            let player = self.player();
            return Op::Write { player, score: self.rng.gen_range(0..self.score_range) };
        }
        match self.workload {
            Workload::Top => Op::Top,
            Workload::Count => Op::Count,
            Workload::Around => Op::Around(self.player()),
            _ => Op::Rank(self.player()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::args::{BenchCommand, BenchSub};
    use crate::report::{append_csv, csv_field};
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchCommand,
    }

    fn load(distribution: KeyDistribution, workload: Workload) -> LoadArgs {
        let cli = Cli::try_parse_from(["bench"]).unwrap();
        LoadArgs { distribution, workload, players: 1000, ..cli.bench.run.load }
    }

    #[test]
    fn zipf_keys_are_skewed_and_in_range() {
        let mut generator = Generator::new(&load(KeyDistribution::Zipf, Workload::Rank), 7).unwrap();
        let mut hits = vec![0u32; 1000];
        for _ in 0..100_000 {
            match generator.next_op() {
                Op::Rank(p) => hits[p as usize] += 1,
                other => panic!("{other:?}"),
            }
        }
        // s = 1 over 1000 keys: the hottest key draws ~13%, the top 10 ~39%.
        assert!(hits[0] > 10_000, "{}", hits[0]);
        assert!(hits[0] > hits[10] && hits[10] > hits[500]);
        let mut uniform = Generator::new(&load(KeyDistribution::Uniform, Workload::Rank), 7).unwrap();
        let mut hits = vec![0u32; 1000];
        for _ in 0..100_000 {
            if let Op::Rank(p) = uniform.next_op() {
                hits[p as usize] += 1;
            }
        }
        assert!(hits.iter().all(|&h| h < 200), "uniform keys are not skewed");
    }

    #[test]
    fn boards_spread_uniformly_and_one_board_draws_none() {
        let spread = LoadArgs {
            boards: 100,
            board: "lvl".into(),
            player_prefix: "p".into(),
            ..load(KeyDistribution::Uniform, Workload::Set)
        };
        let names = Names::new(&spread);
        assert_eq!((names.board(7), names.player(3)), ("lvl:0000007".into(), "p3".to_string()));
        let mut generator = Generator::new(&spread, 3).unwrap();
        let mut hits = vec![0u32; 100];
        for _ in 0..100_000 {
            hits[generator.board() as usize] += 1;
        }
        assert!(hits.iter().all(|&h| (800..1200).contains(&h)), "{hits:?}");
        // One board: its name as given, and the same operations as before
        // boards were drawn.
        let one = load(KeyDistribution::Uniform, Workload::Set);
        assert_eq!((Names::new(&one).board(0), Names::new(&one).player(3)), ("bench".into(), "player:3".to_string()));
        let (mut with_boards, mut plain) = (Generator::new(&one, 5).unwrap(), Generator::new(&one, 5).unwrap());
        for _ in 0..100 {
            assert_eq!(with_boards.board(), 0);
            assert_eq!(with_boards.next_op(), plain.next_op());
        }
    }

    #[test]
    fn mixed_mixes_writes_and_ranks() {
        let mut generator = Generator::new(&load(KeyDistribution::Uniform, Workload::Mixed), 1).unwrap();
        let writes = (0..10_000).filter(|_| matches!(generator.next_op(), Op::Write { .. })).count();
        assert!((4000..6000).contains(&writes), "{writes}");
    }

    #[test]
    fn bench_flags_and_sweep_parse() {
        let cli = Cli::try_parse_from(["bench", "--workload", "rank", "--distribution", "zipf", "-c", "2"]).unwrap();
        assert!(cli.bench.sub.is_none());
        assert_eq!(cli.bench.run.load.workload, Workload::Rank);
        assert_eq!(cli.bench.run.load.connections, 2);
        let cli =
            Cli::try_parse_from(["bench", "sweep", "--shards", "1,2,4", "--duration", "3", "--redis", "redis://x:1"])
                .unwrap();
        match cli.bench.sub {
            Some(BenchSub::Sweep(args)) => {
                assert_eq!(args.shards, vec![1, 2, 4]);
                assert_eq!(args.load.duration, 3.0);
                assert_eq!(args.redis.as_deref(), Some("redis://x:1"));
            }
            _ => panic!("no sweep"),
        }
        assert!(Cli::try_parse_from(["bench", "--workload", "set", "sweep"]).is_err());
        let cli = Cli::try_parse_from(["bench", "--wid", "--mode", "incr"]).unwrap();
        assert!(cli.bench.run.load.wid && !load(KeyDistribution::Uniform, Workload::Set).wid);
    }

    #[test]
    fn csv_rows_match_the_header() {
        let report = Report {
            target: "redis://127.0.0.1:6379".into(),
            server_version: Some("7.0.15".into()),
            workload: Workload::Set,
            mode: rankd_client::Mode::Best,
            wid: true,
            distribution: KeyDistribution::Zipf,
            zipf_exponent: Some(1.0),
            players: 10,
            connections: 1,
            pipeline: 1,
            offered_rate: Some(100.0),
            seed: Some(9),
            ops: 5,
            errors: 0,
            seconds: 1.0,
            ops_per_sec: 5.0,
            p50_us: 1,
            p99_us: 2,
            p999_us: 3,
            max_us: 4,
            notes: vec![],
            server_cpu_seconds: Some(0.5),
            server_cpu_by_thread: Default::default(),
            server_latency: Default::default(),
            client_cpu_seconds: None,
            machine_busy_seconds: Some(1.5),
            machine_idle_seconds: Some(0.25),
        };
        assert_eq!(report.csv_row().split(',').count(), Report::CSV_HEADER.split(',').count());
        assert!(report.csv_row().ends_with(",0.50,,1.50,0.25,true"), "{}", report.csv_row());
        assert_eq!((report.machine_busy_cores(), report.machine_idle_cores()), (Some(1.5), Some(0.25)));
        assert_eq!(report.server_cpu_us_per_op(), Some(100_000.0));
        assert_eq!(csv_field("a,\"b\""), "\"a,\"\"b\"\"\"");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.csv");
        append_csv(&path, Report::CSV_HEADER, &report.csv_row()).unwrap();
        append_csv(&path, Report::CSV_HEADER, &report.csv_row()).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 3);
        assert!(text.starts_with("target,"));
    }
}
