//! `rankd-bench watch-latency` end to end against a small scripted server
//! that keeps one board in memory and pushes every watch after each write
//! (no coalescing, no durability: the measurement's plumbing is under
//! test, not a server), and the `--wid` load against it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use clap::Parser;
use rankd_bench::watch_latency::{self, WatchLatencyArgs};
use rankd_bench::BenchCommand;
use rankd_client::frame::{write_frame, FrameReader};
use rmpv::Value;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;

/// The board, the open watches and what the server saw.
#[derive(Default)]
struct Board {
    scores: HashMap<String, i64>,
    /// (connection's outbox, watch id, `top` N or None for a player watch).
    watches: Vec<(mpsc::UnboundedSender<Vec<u8>>, u64, Option<u64>)>,
    /// Every write's wid (or "" without one).
    wids: Vec<String>,
}

impl Board {
    fn top(&self, n: u64) -> Value {
        let mut rows: Vec<(&String, &i64)> = self.scores.iter().collect();
        rows.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        let rows = rows.into_iter().take(n as usize).enumerate();
        Value::Array(
            rows.map(|(i, (player, score))| {
                map(&[("player", player.as_str().into()), ("score", (*score).into()), ("rank", (i as u64 + 1).into())])
            })
            .collect(),
        )
    }

    fn event(&self, top: Option<u64>) -> Value {
        match top {
            Some(n) => self.top(n),
            None => match self.scores.get(WRITER) {
                Some(&score) => {
                    let better = self.scores.values().filter(|&&s| s > score).count() as u64;
                    let count = self.scores.len() as u64;
                    map(&[("rank", (better + 1).into()), ("score", score.into()), ("count", count.into())])
                }
                None => Value::Nil,
            },
        }
    }

    fn push_all(&self) {
        for (outbox, watch, top) in &self.watches {
            let _ = outbox.send(frame(&map(&[("watch", (*watch).into()), ("event", self.event(*top))])));
        }
    }
}

const WRITER: &str = watch_latency::WRITER;

fn map(entries: &[(&str, Value)]) -> Value {
    Value::Map(entries.iter().map(|(k, v)| (Value::from(*k), v.clone())).collect())
}

fn frame(value: &Value) -> Vec<u8> {
    let mut body = Vec::new();
    rmpv::encode::write_value(&mut body, value).unwrap();
    let mut out = Vec::new();
    write_frame(&mut out, &body);
    out
}

fn field<'a>(request: &'a Value, name: &str) -> &'a Value {
    request.as_map().and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(name))).map_or(&Value::Nil, |(_, v)| v)
}

/// What the server answers `request` (pushes go to `outbox`).
fn answer(
    board: &Mutex<Board>,
    request: &Value,
    outbox: &mpsc::UnboundedSender<Vec<u8>>,
    next_watch: &mut u64,
) -> Value {
    let mut board = board.lock().unwrap();
    let text = |name| field(request, name).as_str().unwrap_or_default().to_string();
    match text("op").as_str() {
        "ping" => "pong".into(),
        "create_board" | "drop_board" => true.into(),
        "set_many" => {
            for entry in field(request, "entries").as_array().unwrap() {
                board.scores.insert(entry[0].as_str().unwrap().into(), entry[1].as_i64().unwrap());
            }
            Value::Array(vec![])
        }
        "set" => {
            let (player, score) = (text("player"), field(request, "score").as_i64().unwrap());
            board.wids.push(text("wid"));
            let stored = board.scores.entry(player).or_insert(i64::MIN);
            let before = *stored;
            *stored = if text("mode") == "best" { before.max(score) } else { score };
            let stored = *stored;
            if stored != before {
                board.push_all();
            }
            stored.into()
        }
        "top" => board.top(field(request, "limit").as_u64().unwrap()),
        "watch" => {
            let watch = *next_watch;
            *next_watch += 1;
            let top = field(request, "top").as_u64();
            board.watches.push((outbox.clone(), watch, top));
            let reply = map(&[("watch", watch.into())]);
            // The reply first, then the first push (the caller sends both).
            let _ = outbox.send(frame(&map(&[("id", field(request, "id").clone()), ("ok", reply)])));
            let _ = outbox.send(frame(&map(&[("watch", watch.into()), ("event", board.event(top))])));
            Value::Nil
        }
        op => panic!("the scripted server does not know {op}"),
    }
}

/// Serves until the test ends; returns the address and the board.
async fn serve() -> (String, Arc<Mutex<Board>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let board = Arc::new(Mutex::new(Board::default()));
    let shared = board.clone();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let (read, mut write) = stream.into_split();
            let (outbox, mut frames) = mpsc::unbounded_channel::<Vec<u8>>();
            tokio::spawn(async move {
                while let Some(frame) = frames.recv().await {
                    if write.write_all(&frame).await.is_err() {
                        return;
                    }
                }
            });
            let board = shared.clone();
            tokio::spawn(async move {
                let (mut reader, mut next_watch) = (FrameReader::new(read, 1 << 20), 1);
                while let Ok(Some(body)) = reader.next_frame().await {
                    let request = rmpv::decode::read_value(&mut &body[..]).unwrap();
                    let ok = answer(&board, &request, &outbox, &mut next_watch);
                    if field(&request, "op").as_str() != Some("watch") {
                        let _ = outbox.send(frame(&map(&[("id", field(&request, "id").clone()), ("ok", ok)])));
                    }
                }
                // Closed: its watches go.
                board.lock().unwrap().watches.retain(|(other, ..)| !other.same_channel(&outbox));
            });
        }
    });
    (addr, board)
}

fn args(addr: &str, extra: &[&str]) -> WatchLatencyArgs {
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchCommand,
    }
    let base = ["bench", "watch-latency", "--server", addr, "--board", "w", "--duration-secs", "0.5"];
    let cli = Cli::try_parse_from(base.iter().chain(extra)).unwrap();
    match cli.bench.sub {
        Some(rankd_bench::BenchSub::WatchLatency(args)) => args,
        _ => panic!("not watch-latency"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_watch_times_the_writes_it_shows() {
    let (addr, board) = serve().await;
    let extra = ["--watchers", "70", "--writes-per-sec", "200", "--drain-secs", "0.3", "--prefill", "20"];
    let report = watch_latency::run(&args(&addr, &extra)).await.unwrap();
    assert_eq!((report.watches, report.connections), (70, 2), "64 + 6 watches");
    assert!(report.writes >= 50 && report.write_errors == 0, "{report:?}");
    // This server pushes every write to every watch: nothing coalesced,
    // every write timed once per watch, every watch up to date.
    assert_eq!(report.coalesced, 0, "{report:?}");
    // (Writes on different connections may cross: one overtaken shows nowhere.)
    assert_eq!(report.timed, (report.writes - report.superseded) * 70, "{report:?}");
    assert_eq!((report.stale_watches, report.unacknowledged, report.repeats), (0, 0, 0), "{report:?}");
    assert!(report.max_us >= report.p50_us && report.p50_us > 0, "{report:?}");
    assert!(board.lock().unwrap().wids.iter().all(String::is_empty), "no wid unless asked");

    let report = watch_latency::run(&args(&addr, &["--watchers", "3", "--watch", "player", "--drain-secs", "0.2"]))
        .await
        .unwrap();
    assert_eq!(report.watch, "player");
    assert_eq!((report.timed, report.stale_watches), ((report.writes - report.superseded) * 3, 0), "{report:?}");
}

#[test]
fn the_set_load_sends_a_unique_wid_with_every_write() {
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let (addr, board) = runtime.block_on(serve());
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchCommand,
    }
    let cli =
        Cli::try_parse_from(["bench", "--server", &addr, "--ops", "300", "-c", "2", "-d", "8", "--wid", "-q"]).unwrap();
    let report = runtime.block_on(rankd_bench::run(&cli.bench.run)).unwrap();
    assert!(report.wid && report.ops == 300 && report.errors == 0, "{report:?}");
    let wids = board.lock().unwrap().wids.clone();
    assert_eq!(wids.len(), 300);
    assert!(wids.iter().all(|wid| wid.len() == 32));
    assert_eq!(wids.iter().collect::<std::collections::HashSet<_>>().len(), 300, "no wid repeats");
    let redis = Cli::try_parse_from(["bench", "--target", "redis://127.0.0.1:1", "--wid", "-q"]).unwrap();
    let refused = runtime.block_on(rankd_bench::run(&redis.bench.run)).unwrap_err();
    assert!(refused.to_string().contains("--wid"), "{refused}");
}
