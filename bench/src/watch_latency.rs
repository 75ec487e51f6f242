//! `rankd-bench watch-latency`: how long after a write is acknowledged do
//! its watchers see it (protocol 1.1 watches)?
//!
//! Many watches (`--watchers`, up to 64 a connection) follow one board's
//! top N, or one player, while writers raise one player's score at a
//! steady rate: write k sets it to `base + k` (mode `best`, so writes that
//! cross on their way to the server cannot lower it), which makes it the
//! board's #1, so every write changes what each watch shows. A push that
//! shows score `base + k` is the first of its watch to show write k (a
//! watch only ever sees the score rise), so its latency is its receipt
//! minus write k's acknowledgement; writes a watch skipped between two
//! pushes were coalesced. Writers and watchers share this process's clock.
//!
//! Writer and watchers run on one machine's clock, so the figure is end to
//! end: commit, the server's push path (including the coalescing wait of
//! up to `interval_ms`), the network and this process's scheduling. A push
//! may even arrive before its write's acknowledgement (they race on
//! different connections): it counts as 0 and is reported.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use hdrhistogram::Histogram;
use rankd_client::{
    Call, Client, ConnectOptions, ErrorCode, Mode, OpKind, Order, Ties, WatchEvent, WatchSpec, Watcher,
};
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::report::{append_csv, csv_field};

/// The player whose score the writers raise.
pub const WRITER: &str = "watch-latency:writer";

/// What each watch follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WatchKind {
    /// The board's top N (`--top`).
    Top,
    /// The written player's rank.
    Player,
}

/// `rankd-bench watch-latency` flags.
#[derive(Debug, Clone, Args)]
pub struct WatchLatencyArgs {
    /// rankd server address.
    #[arg(long, short = 's', default_value = "127.0.0.1:7070")]
    pub server: String,
    /// TLS and the token.
    #[command(flatten)]
    pub connect: rankd_client::cli::ConnectArgs,
    /// Watches in all.
    #[arg(long, default_value_t = 1000)]
    pub watchers: usize,
    /// Watches per connection (the protocol allows 64).
    #[arg(long, default_value_t = 64)]
    pub watches_per_connection: usize,
    /// What each watch follows: the board's top N, or the written player.
    #[arg(long, value_enum, default_value = "top")]
    pub watch: WatchKind,
    /// N of a top watch (1-100).
    #[arg(long, default_value_t = 10)]
    pub top: u64,
    /// The watches' `interval_ms`: at most one push per watch per this many
    /// milliseconds [default: the server's, 100].
    #[arg(long)]
    pub interval_ms: Option<u64>,
    /// The board written and watched; created (desc, competition) if absent.
    #[arg(long, default_value = "bench-watch")]
    pub board: String,
    /// Drop the board first.
    #[arg(long)]
    pub reset: bool,
    /// Players written before the watches start, so a top list is full
    /// (their scores stay below the writer's).
    #[arg(long, default_value_t = 100)]
    pub prefill: u64,
    /// Writes per second offered, in all.
    #[arg(long, default_value_t = 100.0)]
    pub writes_per_sec: f64,
    /// Connections the writes are spread over, each with one write in flight.
    #[arg(long, default_value_t = 4)]
    pub writer_connections: usize,
    /// How long the writers write, seconds.
    #[arg(long, default_value_t = 10.0)]
    pub duration_secs: f64,
    /// How long the watchers keep reading after the last write, seconds.
    #[arg(long, default_value_t = 2.0)]
    pub drain_secs: f64,
    /// rankd's metrics address (its `--metrics-listen`, host:port): the
    /// report then gives the server's own count of pushes, of pushes it
    /// coalesced for slow readers, of its looks at the board, and its CPU.
    #[arg(long)]
    pub server_metrics: Option<String>,
    /// Also write the report as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Also append the report as one CSV row here (header when the file is new).
    #[arg(long)]
    pub csv: Option<PathBuf>,
}

impl WatchLatencyArgs {
    fn validate(&self) -> Result<(), BenchError> {
        let bad = |msg: &str| Err(BenchError::Invalid(msg.into()));
        if self.watchers == 0 || self.writer_connections == 0 {
            return bad("--watchers and --writer-connections must be at least 1");
        }
        if self.watches_per_connection == 0 || self.watches_per_connection > rankd_client::protocol::MAX_WATCHES {
            return bad("--watches-per-connection must be 1 to 64");
        }
        if !(1..=rankd_client::protocol::MAX_WATCH_TOP).contains(&self.top) {
            return bad("--top must be 1 to 100");
        }
        if self.interval_ms.is_some_and(|ms| !rankd_client::protocol::WATCH_INTERVAL_MS.contains(&ms)) {
            return bad("--interval-ms must be 10 to 60000");
        }
        if !(self.writes_per_sec.is_finite() && self.writes_per_sec > 0.0) {
            return bad("--writes-per-sec must be a positive number");
        }
        if !(self.duration_secs.is_finite() && self.duration_secs > 0.0) {
            return bad("--duration-secs must be a positive number of seconds");
        }
        if !(self.drain_secs.is_finite() && self.drain_secs >= 0.0) {
            return bad("--drain-secs must be 0 or more seconds");
        }
        Ok(())
    }

    fn spec(&self) -> WatchSpec {
        let spec = match self.watch {
            WatchKind::Top => WatchSpec::top(&self.board, self.top),
            WatchKind::Player => WatchSpec::player(&self.board, WRITER),
        };
        WatchSpec { interval_ms: self.interval_ms, ..spec }
    }
}

/// What a watch-latency run measured.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WatchReport {
    /// `rankd://host:port`.
    pub target: String,
    /// What each watch followed: `top N` or `player`.
    pub watch: String,
    /// Watches open during the run.
    pub watches: usize,
    /// Connections they were spread over.
    pub connections: usize,
    /// Their `interval_ms` (none: the server's default).
    pub interval_ms: Option<u64>,
    /// Writes offered per second.
    pub offered_writes_per_sec: f64,
    /// Writes acknowledged.
    pub writes: u64,
    /// Writes answered with an error.
    pub write_errors: u64,
    /// Acknowledged writes that changed nothing: a later write (from
    /// another writer connection) had overtaken them. No watch can show
    /// them; they are not counted as coalesced.
    pub superseded: u64,
    /// Acknowledged writes per second of writing.
    pub writes_per_sec: f64,
    /// The writers' time, seconds.
    pub seconds: f64,
    /// The drain after them, seconds (`--drain-secs`).
    pub drain_seconds: f64,
    /// A write's latency (from when it was due to its acknowledgement),
    /// median, microseconds.
    pub write_p50_us: u64,
    /// Its 99th percentile.
    pub write_p99_us: u64,
    /// Pushes received while the writers wrote and the drain after (the
    /// first pushes, of the state before any write, not counted).
    pub pushes: u64,
    /// Pushes per second over writing and drain.
    pub pushes_per_sec: f64,
    /// Pushes that showed a write their watch had not shown before: the
    /// ones timed.
    pub timed: u64,
    /// Pushes that showed nothing new (a rank or count that moved).
    pub repeats: u64,
    /// (write, watch) pairs where the watch never showed that write as its
    /// own push (a later push showed a later write): coalesced. Superseded
    /// writes are not counted.
    pub coalesced: u64,
    /// `coalesced` over all (write, watch) pairs shown or skipped.
    pub coalesced_share: f64,
    /// Push latency (receipt minus the acknowledgement of the write it
    /// first shows), median, microseconds.
    pub p50_us: u64,
    /// 99th percentile.
    pub p99_us: u64,
    /// 99.9th percentile.
    pub p999_us: u64,
    /// Slowest push.
    pub max_us: u64,
    /// Pushes read before their write's acknowledgement (timed as 0).
    pub before_ack: u64,
    /// Pushes showing a write whose acknowledgement never came (not timed).
    pub unacknowledged: u64,
    /// Watches whose last push did not show the last acknowledged write
    /// by the end of the drain.
    pub stale_watches: usize,
    /// What the server counted over the run, given `--server-metrics`.
    #[serde(default)]
    pub server: Option<ServerWatchCounts>,
}

/// The server's watch metrics over a run (from the first write to the end
/// of the drain).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerWatchCounts {
    /// Pushes it put for connections (`rankd_watch_pushes_total`).
    pub pushes: f64,
    /// Pushes that replaced one a slow reader had not been sent yet
    /// (`rankd_watch_pushes_coalesced_total`): coalescing for slow
    /// readers, on top of the interval's.
    pub coalesced: f64,
    /// Looks at watched boards: a batch of reads and a fence on every
    /// shard each (`rankd_watch_looks_total`).
    pub looks: f64,
    /// CPU seconds the server used.
    pub cpu_seconds: f64,
}

impl ServerWatchCounts {
    /// The counters in a metrics page.
    fn in_page(page: &str) -> Self {
        let series = |name| crate::cpu::series_in(page, name).unwrap_or(0.0);
        Self {
            pushes: series("rankd_watch_pushes_total"),
            coalesced: series("rankd_watch_pushes_coalesced_total"),
            looks: series("rankd_watch_looks_total"),
            cpu_seconds: crate::cpu::total_cpu_seconds_in(page).unwrap_or(0.0),
        }
    }

    /// What was counted from `earlier` to `self`.
    fn since(&self, earlier: &Self) -> Self {
        Self {
            pushes: self.pushes - earlier.pushes,
            coalesced: self.coalesced - earlier.coalesced,
            looks: self.looks - earlier.looks,
            cpu_seconds: self.cpu_seconds - earlier.cpu_seconds,
        }
    }
}

impl WatchReport {
    /// The CSV header matching [`WatchReport::csv_row`].
    pub const CSV_HEADER: &'static str = "target,watch,watches,connections,interval_ms,offered_writes_per_sec,writes,\
                                          write_errors,superseded,writes_per_sec,seconds,drain_seconds,write_p50_us,write_p99_us,pushes,\
                                          pushes_per_sec,timed,repeats,coalesced,coalesced_share,p50_us,p99_us,\
                                          p999_us,max_us,before_ack,unacknowledged,stale_watches,server_pushes,\
                                          server_coalesced,server_looks,server_cpu_seconds";

    /// One CSV row.
    pub fn csv_row(&self) -> String {
        [
            csv_field(&self.target),
            csv_field(&self.watch),
            self.watches.to_string(),
            self.connections.to_string(),
            self.interval_ms.map(|ms| ms.to_string()).unwrap_or_default(),
            self.offered_writes_per_sec.to_string(),
            self.writes.to_string(),
            self.write_errors.to_string(),
            self.superseded.to_string(),
            format!("{:.1}", self.writes_per_sec),
            format!("{:.3}", self.seconds),
            self.drain_seconds.to_string(),
            self.write_p50_us.to_string(),
            self.write_p99_us.to_string(),
            self.pushes.to_string(),
            format!("{:.1}", self.pushes_per_sec),
            self.timed.to_string(),
            self.repeats.to_string(),
            self.coalesced.to_string(),
            format!("{:.4}", self.coalesced_share),
            self.p50_us.to_string(),
            self.p99_us.to_string(),
            self.p999_us.to_string(),
            self.max_us.to_string(),
            self.before_ack.to_string(),
            self.unacknowledged.to_string(),
            self.stale_watches.to_string(),
            self.server.as_ref().map(|s| s.pushes.to_string()).unwrap_or_default(),
            self.server.as_ref().map(|s| s.coalesced.to_string()).unwrap_or_default(),
            self.server.as_ref().map(|s| s.looks.to_string()).unwrap_or_default(),
            self.server.as_ref().map(|s| format!("{:.2}", s.cpu_seconds)).unwrap_or_default(),
        ]
        .join(",")
    }
}

/// Prints a report for people.
pub fn print(report: &WatchReport) {
    let interval = report.interval_ms.map(|ms| format!("{ms} ms")).unwrap_or_else(|| "default".into());
    println!(
        "{} watch-latency ({} watches of {} on {} connections, interval {interval}): push latency p50 {} us, \
         p99 {} us, p99.9 {} us, max {} us over {} pushes",
        report.target,
        report.watches,
        report.watch,
        report.connections,
        report.p50_us,
        report.p99_us,
        report.p999_us,
        report.max_us,
        report.timed
    );
    println!(
        "  writes: {} in {:.2} s = {:.0}/s (offered {:.0}/s, {} errors, {} overtaken by a later one); write \
         latency p50 {} us, p99 {} us",
        report.writes,
        report.seconds,
        report.writes_per_sec,
        report.offered_writes_per_sec,
        report.write_errors,
        report.superseded,
        report.write_p50_us,
        report.write_p99_us
    );
    println!(
        "  pushes: {} received ({:.0}/s), {} timed, {} repeats; {} (write, watch) pairs coalesced ({:.1}%)",
        report.pushes,
        report.pushes_per_sec,
        report.timed,
        report.repeats,
        report.coalesced,
        report.coalesced_share * 100.0
    );
    if let Some(server) = &report.server {
        println!(
            "  server: {:.0} pushes, {:.0} coalesced for slow readers, {:.0} looks at the board; CPU {:.2} cores \
             ({:.1} us per push)",
            server.pushes,
            server.coalesced,
            server.looks,
            server.cpu_seconds / (report.seconds + report.drain_seconds),
            server.cpu_seconds * 1e6 / server.pushes.max(1.0)
        );
    }
    if report.before_ack > 0 || report.unacknowledged > 0 || report.stale_watches > 0 {
        println!(
            "  note: {} pushes arrived before their write's acknowledgement (timed as 0), {} showed an \
             unacknowledged write, {} watches never showed the last write",
            report.before_ack, report.unacknowledged, report.stale_watches
        );
    }
}

/// What one watch received: each push's receipt and the writer's score it
/// showed (`None`: the writer was not in it).
pub type WatchLog = Vec<(Instant, Option<i64>)>;

/// Push latencies and counts, from the writes' acknowledgements and what
/// each watch received.
#[derive(Debug)]
pub struct Analysis {
    /// Push latency, microseconds.
    pub latency: Histogram<u64>,
    /// Pushes received after the writes began.
    pub pushes: u64,
    /// Pushes that first showed a write.
    pub timed: u64,
    /// Pushes showing no new write.
    pub repeats: u64,
    /// (write, watch) pairs skipped between two timed pushes.
    pub coalesced: u64,
    /// Timed pushes read before their write's acknowledgement.
    pub before_ack: u64,
    /// Pushes showing a write never acknowledged.
    pub unacknowledged: u64,
    /// Watches whose last push shows less than the last acknowledged write.
    pub stale_watches: usize,
}

/// What became of one write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ack {
    /// No acknowledgement: it failed, or was never sent.
    Missing,
    /// Acknowledged at this instant.
    Applied(Instant),
    /// Acknowledged, but a later write had already raised the score past
    /// it (writes on different connections crossed): it changed nothing, so
    /// no watch can show it.
    Superseded,
}

/// Times each push that first shows a write: `acks[k]` is what became of
/// write k (k from 1, score `base + k`; `acks[0]` unused, later writes
/// count as missing), `begin` when the writes began (earlier pushes showed
/// the state before them).
pub fn analyse(base: i64, begin: Instant, acks: &[Ack], watches: &[WatchLog]) -> Result<Analysis, BenchError> {
    let mut analysis = Analysis {
        latency: new_histogram()?,
        pushes: 0,
        timed: 0,
        repeats: 0,
        coalesced: 0,
        before_ack: 0,
        unacknowledged: 0,
        stale_watches: 0,
    };
    let last_acked = acks.iter().rposition(|ack| matches!(ack, Ack::Applied(_))).unwrap_or(0) as u64;
    // superseded_before[i]: superseded writes among 0..i.
    let mut superseded_before = Vec::with_capacity(acks.len() + 1);
    superseded_before.push(0u64);
    for ack in acks {
        superseded_before.push(superseded_before.last().copied().unwrap_or(0) + u64::from(*ack == Ack::Superseded));
    }
    let superseded_under = |k: u64| superseded_before[(k as usize).min(acks.len())];
    for log in watches {
        let mut shown = 0u64;
        for &(received, score) in log {
            if received >= begin {
                analysis.pushes += 1;
            }
            let k = score.map_or(0, |score| u64::try_from(score.saturating_sub(base)).unwrap_or(0));
            if k <= shown {
                if received >= begin {
                    analysis.repeats += 1;
                }
                continue;
            }
            // The writes strictly between: skipped, unless they changed nothing.
            analysis.coalesced += k - shown - 1 - (superseded_under(k) - superseded_under(shown + 1));
            shown = k;
            match acks.get(k as usize) {
                Some(&Ack::Applied(ack)) => {
                    analysis.timed += 1;
                    let micros = match received.checked_duration_since(ack) {
                        Some(latency) => latency.as_micros() as u64,
                        None => {
                            analysis.before_ack += 1;
                            0
                        }
                    };
                    analysis.latency.saturating_record(micros.max(1));
                }
                _ => analysis.unacknowledged += 1,
            }
        }
        if shown < last_acked {
            analysis.stale_watches += 1;
        }
    }
    Ok(analysis)
}

fn new_histogram() -> Result<Histogram<u64>, BenchError> {
    Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).map_err(|e| BenchError::Other(e.to_string()))
}

/// `rankd-bench watch-latency ...`: runs it and prints or writes the report.
pub async fn main(args: &WatchLatencyArgs) -> Result<(), BenchError> {
    let report = run(args).await?;
    print(&report);
    if let Some(path) = &args.json {
        let json = serde_json::to_string_pretty(&report).map_err(|e| BenchError::Other(e.to_string()))?;
        std::fs::write(path, json + "\n")?;
    }
    if let Some(path) = &args.csv {
        append_csv(path, WatchReport::CSV_HEADER, &report.csv_row())?;
    }
    Ok(())
}

/// One writer's acknowledged writes `(k, due, acknowledged, superseded)`
/// and errors.
type WriterLog = (Vec<(u64, Instant, Instant, bool)>, u64);

/// Runs the measurement.
pub async fn run(args: &WatchLatencyArgs) -> Result<WatchReport, BenchError> {
    args.validate()?;
    let options = args.connect.options()?;
    let base = prepare(args, &options).await?;

    // Every watch open (and its first push sent) before the first write.
    let mut openers = Vec::new();
    let mut left = args.watchers;
    while left > 0 {
        let n = left.min(args.watches_per_connection);
        left -= n;
        let (addr, options, specs) = (args.server.clone(), options.clone(), vec![args.spec(); n]);
        openers.push(tokio::spawn(async move {
            let mut watcher = Watcher::connect_with(&addr, &options).await?;
            for result in watcher.watch_many(&specs).await? {
                result.map_err(refused_watch)?;
            }
            Ok::<_, BenchError>(watcher)
        }));
    }
    let connections = openers.len();
    let watchers = crate::load::join_all(openers).await?;
    eprintln!(
        "watch-latency: {} watches of {} on {connections} connections; writing {} writes/s for {} s",
        args.watchers,
        describe(args),
        args.writes_per_sec,
        args.duration_secs
    );

    let begin = Instant::now() + Duration::from_millis(100);
    let end = begin + Duration::from_secs_f64(args.duration_secs);
    let drained = end + Duration::from_secs_f64(args.drain_secs);
    let server_before = match &args.server_metrics {
        Some(addr) => Some(ServerWatchCounts::in_page(&crate::cpu::metrics_page(addr).await?)),
        None => None,
    };
    let readers: Vec<_> = watchers.into_iter().map(|watcher| tokio::spawn(read(watcher, drained))).collect();
    let next = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(1));
    let every = Duration::from_secs_f64(1.0 / args.writes_per_sec);
    let mut writers = Vec::new();
    for _ in 0..args.writer_connections {
        let (addr, options, board, next) = (args.server.clone(), options.clone(), args.board.clone(), next.clone());
        writers.push(tokio::spawn(async move {
            let mut client = Client::connect_with(&addr, &options).await?;
            let (mut log, mut errors) = (Vec::new(), 0);
            loop {
                let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let due = begin + every.mul_f64((k - 1) as f64);
                if due >= end || Instant::now() >= end {
                    return Ok::<WriterLog, BenchError>((log, errors));
                }
                tokio::time::sleep_until(due.into()).await;
                match client.set(&board, WRITER, base + k as i64, Mode::Best).await {
                    Ok(stored) => log.push((k, due, Instant::now(), stored > base + k as i64)),
                    Err(rankd_client::ClientError::Server { .. }) => errors += 1,
                    Err(e) => return Err(e.into()),
                }
            }
        }));
    }
    let writer_logs = crate::load::join_all(writers).await?;
    let seconds = begin.elapsed().as_secs_f64().min(args.duration_secs).max(1e-9);
    let watch_logs: Vec<WatchLog> = crate::load::join_all(readers).await?.into_iter().flatten().collect();
    let server = match (&args.server_metrics, server_before) {
        (Some(addr), Some(before)) => {
            Some(ServerWatchCounts::in_page(&crate::cpu::metrics_page(addr).await?).since(&before))
        }
        _ => None,
    };

    let written = writer_logs.iter().map(|(log, _)| log.len()).sum::<usize>() as u64;
    let write_errors = writer_logs.iter().map(|(_, errors)| errors).sum();
    let last = writer_logs.iter().flat_map(|(log, _)| log.iter().map(|&(k, ..)| k)).max().unwrap_or(0);
    let mut acks = vec![Ack::Missing; last as usize + 1];
    let mut write_latency = new_histogram()?;
    let mut superseded = 0;
    for &(k, due, acked, crossed) in writer_logs.iter().flat_map(|(log, _)| log) {
        acks[k as usize] = if crossed { Ack::Superseded } else { Ack::Applied(acked) };
        superseded += u64::from(crossed);
        write_latency.saturating_record((acked.saturating_duration_since(due).as_micros() as u64).max(1));
    }
    let analysis = analyse(base, begin, &acks, &watch_logs)?;
    let pairs = analysis.timed + analysis.unacknowledged + analysis.coalesced;
    let reading = (seconds + args.drain_secs).max(1e-9);
    Ok(WatchReport {
        target: format!("rankd://{}{}", args.server, if options.tls.is_some() { " (TLS)" } else { "" }),
        watch: describe(args),
        watches: args.watchers,
        connections,
        interval_ms: args.interval_ms,
        offered_writes_per_sec: args.writes_per_sec,
        writes: written,
        write_errors,
        superseded,
        writes_per_sec: written as f64 / seconds,
        seconds,
        drain_seconds: args.drain_secs,
        write_p50_us: write_latency.value_at_quantile(0.5),
        write_p99_us: write_latency.value_at_quantile(0.99),
        pushes: analysis.pushes,
        pushes_per_sec: analysis.pushes as f64 / reading,
        timed: analysis.timed,
        repeats: analysis.repeats,
        coalesced: analysis.coalesced,
        coalesced_share: if pairs == 0 { 0.0 } else { analysis.coalesced as f64 / pairs as f64 },
        p50_us: analysis.latency.value_at_quantile(0.5),
        p99_us: analysis.latency.value_at_quantile(0.99),
        p999_us: analysis.latency.value_at_quantile(0.999),
        max_us: analysis.latency.max(),
        before_ack: analysis.before_ack,
        unacknowledged: analysis.unacknowledged,
        stale_watches: analysis.stale_watches,
        server,
    })
}

fn describe(args: &WatchLatencyArgs) -> String {
    match args.watch {
        WatchKind::Top => format!("top {}", args.top),
        WatchKind::Player => "player".into(),
    }
}

fn refused_watch(error: rankd_client::ClientError) -> BenchError {
    match error.error_code() {
        Some(ErrorCode::UnknownOp) => BenchError::Invalid("the server does not know `watch` (protocol 1.1)".into()),
        _ => BenchError::Client(error),
    }
}

/// Empties or creates the board, prefills it, and returns the score base:
/// the best score on it, so write k's `base + k` always ranks first.
async fn prepare(args: &WatchLatencyArgs, options: &ConnectOptions) -> Result<i64, BenchError> {
    let mut client = Client::connect_with(&args.server, options).await?;
    if args.reset {
        client.drop_board(&args.board).await?;
    }
    client.create_board(&args.board, Order::Desc, Ties::Competition).await.map_err(|e| match e.error_code() {
        Some(ErrorCode::Conflict) => BenchError::Invalid(format!(
            "board {} exists with another config (it must rank higher scores first): --reset or another --board",
            args.board
        )),
        _ => BenchError::Client(e),
    })?;
    let chunk = rankd_client::protocol::MAX_SET_MANY as u64;
    for start in (0..args.prefill).step_by(chunk as usize) {
        let entries: Vec<(String, i64)> =
            (start..(start + chunk).min(args.prefill)).map(|i| (format!("watch-latency:{i}"), i as i64 + 1)).collect();
        let call = Call::new(OpKind::SetMany).with("board", &args.board).with("entries", entries);
        client.call::<serde::de::IgnoredAny>(call).await?;
    }
    Ok(client.top(&args.board, 1, 0).await?.first().map_or(0, |best| best.score))
}

/// Reads one connection's pushes until `until`; one log per watch.
async fn read(mut watcher: Watcher, until: Instant) -> Result<Vec<WatchLog>, BenchError> {
    let mut logs: std::collections::HashMap<u64, WatchLog> =
        watcher.watches().map(|watch| (watch.0, Vec::new())).collect();
    loop {
        let push = tokio::select! {
            push = watcher.next_event() => push?,
            _ = tokio::time::sleep_until(until.into()) => break,
        };
        let Some(push) = push else { break };
        let shown = match &push.event {
            WatchEvent::Top(entries) => entries.iter().find(|entry| entry.player == WRITER).map(|entry| entry.score),
            WatchEvent::Player(info) => info.as_ref().map(|info| info.score),
            WatchEvent::Ended => None,
        };
        logs.entry(push.watch.0).or_default().push((push.received, shown));
    }
    Ok(logs.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_push_is_timed_from_the_write_it_first_shows() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let begin = at(10);
        // Writes 1..=4 (scores 101..=104) acknowledged at 20, 30, 40, 50 ms.
        let acks =
            [Ack::Missing, Ack::Applied(at(20)), Ack::Applied(at(30)), Ack::Applied(at(40)), Ack::Applied(at(50))];
        let watches = vec![
            // The state before the writes, then every write but the 2nd, then
            // a push that shows nothing new.
            vec![
                (at(5), Some(100)),
                (at(22), Some(101)),
                (at(45), Some(103)),
                (at(52), Some(104)),
                (at(60), Some(104)),
            ],
            // Write 2 before its acknowledgement; then write 5, never
            // acknowledged (so not timed, but it is past the last one).
            vec![(at(29), Some(102)), (at(70), Some(105))],
            // Stale: never saw write 4; the writer absent at first.
            vec![(at(6), None), (at(41), Some(103))],
        ];
        let analysis = analyse(100, begin, &acks, &watches).unwrap();
        assert_eq!(analysis.pushes, 7, "the two before the writes are not counted");
        assert_eq!((analysis.timed, analysis.repeats, analysis.unacknowledged), (5, 1, 1));
        // Watch 0 skipped write 2; watch 1 skipped 1 and 3, 4; watch 2 skipped 1 and 2.
        assert_eq!(analysis.coalesced, 1 + 1 + 2 + 2);
        assert_eq!((analysis.before_ack, analysis.stale_watches), (1, 1));
        let latency = &analysis.latency;
        assert_eq!(latency.len(), 5);
        // 2 ms (write 1), 5 ms (3), 2 ms (4), 0 (2, early), 1 ms (3).
        assert_eq!(latency.max() / 1000, 5);
        assert_eq!(latency.min(), 1, "the early push");

        // Write 3 overtaken by 4: no watch skipping it coalesced it.
        let acks = [Ack::Missing, Ack::Applied(at(20)), Ack::Applied(at(30)), Ack::Superseded, Ack::Applied(at(50))];
        let watches = vec![vec![(at(21), Some(101)), (at(51), Some(104))], vec![(at(52), Some(104))]];
        let analysis = analyse(100, begin, &acks, &watches).unwrap();
        assert_eq!((analysis.timed, analysis.coalesced, analysis.stale_watches), (3, 1 + 2, 0));
    }

    #[test]
    fn the_servers_counts_come_from_its_metrics() {
        let page = |pushes: u64, cpu: f64| {
            format!(
                "# TYPE rankd_watch_pushes_total counter\nrankd_watch_pushes_total {pushes}\n\
                 rankd_watch_pushes_coalesced_total 3\nrankd_watch_looks_total 7\n\
                 rankd_thread_cpu_seconds_total{{thread=\"watch\"}} {cpu}\n"
            )
        };
        let before = ServerWatchCounts::in_page(&page(10, 1.0));
        let after = ServerWatchCounts::in_page(&page(250, 3.5));
        let run = after.since(&before);
        assert_eq!((run.pushes, run.coalesced, run.looks, run.cpu_seconds), (240.0, 0.0, 0.0, 2.5));
        assert_eq!(ServerWatchCounts::in_page(""), ServerWatchCounts::default());
    }

    #[test]
    fn flags_parse_and_are_checked() {
        use crate::args::{BenchCommand, BenchSub};
        use clap::Parser;
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            bench: BenchCommand,
        }
        let cli = Cli::try_parse_from([
            "bench",
            "watch-latency",
            "--server",
            "10.0.0.1:7070",
            "--watchers",
            "130",
            "--board",
            "b",
            "--writes-per-sec",
            "500",
            "--duration-secs",
            "3",
            "--interval-ms",
            "20",
        ])
        .unwrap();
        let Some(BenchSub::WatchLatency(args)) = cli.bench.sub else { panic!("no watch-latency") };
        assert_eq!((args.watchers, args.watches_per_connection, args.top), (130, 64, 10));
        assert_eq!((args.writes_per_sec, args.duration_secs), (500.0, 3.0));
        assert!(args.validate().is_ok());
        assert_eq!(args.spec(), WatchSpec::top("b", 10).interval(Duration::from_millis(20)));
        let player = WatchLatencyArgs { watch: WatchKind::Player, interval_ms: None, ..args.clone() };
        assert_eq!(player.spec(), WatchSpec::player("b", WRITER));
        for bad in [
            WatchLatencyArgs { watches_per_connection: 65, ..args.clone() },
            WatchLatencyArgs { top: 101, ..args.clone() },
            WatchLatencyArgs { interval_ms: Some(5), ..args.clone() },
            WatchLatencyArgs { writes_per_sec: 0.0, ..args.clone() },
        ] {
            assert!(bad.validate().is_err(), "{bad:?}");
        }
        let report = WatchReport {
            target: "rankd://x".into(),
            watch: "top 10".into(),
            watches: 1,
            connections: 1,
            interval_ms: None,
            offered_writes_per_sec: 1.0,
            writes: 1,
            write_errors: 0,
            superseded: 0,
            writes_per_sec: 1.0,
            seconds: 1.0,
            drain_seconds: 0.5,
            write_p50_us: 1,
            write_p99_us: 1,
            pushes: 1,
            pushes_per_sec: 1.0,
            timed: 1,
            repeats: 0,
            coalesced: 0,
            coalesced_share: 0.0,
            p50_us: 1,
            p99_us: 1,
            p999_us: 1,
            max_us: 1,
            before_ack: 0,
            unacknowledged: 0,
            stale_watches: 0,
            server: Some(ServerWatchCounts::default()),
        };
        assert_eq!(report.csv_row().split(',').count(), WatchReport::CSV_HEADER.split(',').count());
    }
}
