//! Watches (protocol 1.1) over TCP against the real server: the protocol's
//! rules one by one; random writes from several connections while slow
//! watchers read, after which every watch's last push equals a brute-force
//! oracle; pushes never show a write that was not yet durable (checked by
//! killing the server right after pushes, with commits slowed down); and a
//! watcher that never reads holds the server's memory and the writers back
//! not at all.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::Server;
use futures::StreamExt;
use rand::{Rng, SeedableRng};
use rankd_client::{
    set_call, Call, Client, ConnectOptions, Entry, ErrorCode, Mode, OpKind, Push, RankInfo, ResumingWatcher,
    WatchEvent, WatchSpec, Watcher, Window,
};

async fn watcher(server: &Server) -> Watcher {
    Watcher::connect_with(&server.addr, &ConnectOptions::default()).await.expect("a watcher connects")
}

/// The next push, or a panic after `within`.
async fn next_push(watcher: &mut Watcher, within: Duration) -> Push {
    match tokio::time::timeout(within, watcher.next()).await {
        Ok(Some(Ok(push))) => push,
        other => panic!("no push within {within:?}: {other:?}"),
    }
}

/// Whether a push arrives within `within`.
async fn quiet_for(watcher: &mut Watcher, within: Duration) -> Option<Push> {
    match tokio::time::timeout(within, watcher.next()).await {
        Err(_) => None,
        Ok(Some(Ok(push))) => Some(push),
        Ok(other) => panic!("the watch stream failed: {other:?}"),
    }
}

fn top_of(push: &Push) -> Vec<(String, i64, u64)> {
    match &push.event {
        WatchEvent::Top(entries) => entries.iter().map(|e| (e.player.clone(), e.score, e.rank)).collect(),
        other => panic!("not a top: {other:?}"),
    }
}

#[tokio::test]
async fn watches_follow_the_protocol_rules() {
    let server = Server::start(2);
    let mut writer = server.client().await;
    let mut w = watcher(&server).await;
    let top = w.watch(&WatchSpec::top("arena", 2).interval(Duration::from_millis(10))).await.unwrap();
    // The first push comes at once, with the current state (an empty board).
    let first = next_push(&mut w, Duration::from_secs(5)).await;
    assert_eq!((first.watch, top_of(&first)), (top, vec![]));

    writer.set("arena", "alice", 10, Mode::Set).await.unwrap();
    let push = next_push(&mut w, Duration::from_secs(5)).await;
    assert_eq!(top_of(&push), vec![("alice".into(), 10, 1)]);
    writer.set("arena", "bob", 20, Mode::Set).await.unwrap();
    let push = next_push(&mut w, Duration::from_secs(5)).await;
    assert_eq!(top_of(&push), vec![("bob".into(), 20, 1), ("alice".into(), 10, 2)]);
    // A write that leaves the watched value as it was pushes nothing.
    writer.set("arena", "carol", 1, Mode::Set).await.unwrap();
    assert_eq!(quiet_for(&mut w, Duration::from_millis(400)).await, None, "carol is not in the top 2");

    // A player watch: nil while absent, then its rank; a second watch on
    // the same connection has its own id.
    let dave = w.watch(&WatchSpec::player("arena", "dave").interval(Duration::from_millis(10))).await.unwrap();
    assert_ne!(dave, top);
    let push = next_push(&mut w, Duration::from_secs(5)).await;
    assert_eq!((push.watch, push.event), (dave, WatchEvent::Player(None)));
    writer.set("arena", "dave", 15, Mode::Set).await.unwrap();
    // dave is 2nd: both watches change; each pushes once.
    let mut seen = HashMap::new();
    while seen.len() < 2 {
        let push = next_push(&mut w, Duration::from_secs(5)).await;
        seen.insert(push.watch, push.event);
    }
    assert_eq!(seen[&dave], WatchEvent::Player(Some(RankInfo { rank: 2, score: 15, count: 4 })));

    // unwatch: true once, and no more pushes for it.
    assert!(w.unwatch(dave).await.unwrap());
    assert!(!w.unwatch(dave).await.unwrap());
    // A newcomer changes the count dave's watch showed, not the top 2.
    writer.set("arena", "erin", 1, Mode::Set).await.unwrap();
    assert_eq!(quiet_for(&mut w, Duration::from_millis(400)).await, None, "dave's watch is over");

    // Bad watches are refused; at most 64 per connection.
    let mut raw = server.client().await;
    let bad = [
        Call::new(OpKind::Watch).with("board", "arena"),
        Call::new(OpKind::Watch).with("board", "arena").with("top", 3).with("player", "x"),
        Call::new(OpKind::Watch).with("board", "arena").with("top", 0),
        Call::new(OpKind::Watch).with("board", "arena").with("top", 101),
        Call::new(OpKind::Watch).with("board", "arena").with("top", 3).with("interval_ms", 9),
        Call::new(OpKind::Watch).with("board", "arena").with("top", 3).with("interval_ms", 60_001),
        Call::new(OpKind::Unwatch),
    ];
    for call in bad {
        let err = raw.call::<rmpv::Value>(call).await.unwrap_err();
        assert_eq!(err.error_code(), Some(ErrorCode::BadRequest), "{err}");
    }
    let specs: Vec<WatchSpec> = (0..64).map(|i| WatchSpec::top(format!("many{i}"), 1)).collect();
    let mut full = watcher(&server).await;
    assert!(full.watch_many(&specs).await.unwrap().iter().all(Result::is_ok));
    let err = full.watch(&WatchSpec::top("one-more", 1)).await.unwrap_err();
    assert_eq!(err.error_code(), Some(ErrorCode::TooLarge));

    // Dropping the board ends its watches with a last push of nil.
    assert!(writer.drop_board("arena").await.unwrap());
    let last = next_push(&mut w, Duration::from_secs(5)).await;
    assert_eq!((last.watch, last.event), (top, WatchEvent::Ended));
    assert!(!w.unwatch(top).await.unwrap(), "the drop ended it");
    assert!(server.counter("rankd_watch_pushes_total", &[]) >= 6.0);
    assert_eq!(server.metric("rankd_watches_open", &[]), 64.0);
    drop(full);
    common::wait_until(Duration::from_secs(5), "closing the connection to end its watches", async || {
        server.metric("rankd_watches_open", &[]) == 0.0
    })
    .await;
}

/// A board as the protocol defines it (desc, competition ties).
#[derive(Default)]
struct Oracle(HashMap<String, i64>);

impl Oracle {
    fn top(&self, n: usize) -> Vec<(String, i64, u64)> {
        let mut all: Vec<(&String, i64)> = self.0.iter().map(|(p, s)| (p, *s)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        all.iter().take(n).map(|(p, s)| ((*p).clone(), *s, self.rank_of(*s))).collect()
    }

    fn rank_of(&self, score: i64) -> u64 {
        1 + self.0.values().filter(|s| **s > score).count() as u64
    }

    fn rank(&self, player: &str) -> Option<RankInfo> {
        let score = *self.0.get(player)?;
        Some(RankInfo { rank: self.rank_of(score), score, count: self.0.len() as u64 })
    }
}

/// One writer's random writes to its own players (so the final state does
/// not depend on how the writers interleave), applied to its oracle too.
async fn random_writes(addr: String, id: usize, writes: usize) -> HashMap<String, Option<i64>> {
    let mut client = Client::connect(&addr).await.expect("a writer connects");
    let mut rng = rand::rngs::StdRng::seed_from_u64(id as u64);
    let mut mine: HashMap<String, Option<i64>> = HashMap::new();
    for _ in 0..writes {
        let player = format!("w{id}-p{}", rng.gen_range(0..12));
        let score = rng.gen_range(-50..200);
        let old = mine.get(&player).copied().flatten();
        let (call, new) = match rng.gen_range(0..10) {
            0 => (Call::new(OpKind::Remove).with("board", "live").with("player", player.as_str()), None),
            1..=2 => (set_call("live", &player, score, Mode::Incr), Some(old.unwrap_or(0) + score)),
            3..=4 => (set_call("live", &player, score, Mode::Best), Some(old.map_or(score, |o| o.max(score)))),
            _ => (set_call("live", &player, score, Mode::Set), Some(score)),
        };
        client.call::<rmpv::Value>(call).await.expect("a write");
        mine.insert(player, new);
        if rng.gen_bool(0.3) {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(0..5))).await;
        }
    }
    mine
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_last_push_of_every_watch_equals_the_oracle_once_writes_stop() {
    for shards in [1, 4] {
        let server = Server::start(shards);
        // Watchers of the top 3, the top 20 and six players, at intervals
        // from 10 ms to 250 ms, each reading slowly.
        let players: Vec<String> = (0..3).flat_map(|w| [format!("w{w}-p0"), format!("w{w}-p7")]).collect();
        let mut specs = vec![
            WatchSpec::top("live", 3).interval(Duration::from_millis(10)),
            WatchSpec::top("live", 20).interval(Duration::from_millis(250)),
        ];
        specs.extend(players.iter().map(|p| WatchSpec::player("live", p.as_str()).interval(Duration::from_millis(30))));
        let writes_done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut readers = Vec::new();
        for (i, spec) in specs.iter().enumerate() {
            let mut w = watcher(&server).await;
            let id = w.watch(spec).await.unwrap();
            let writes_done = writes_done.clone();
            readers.push(tokio::spawn(async move {
                let mut last: Option<WatchEvent> = None;
                let mut pushes = 0;
                let mut quiet_since_done = 0;
                // Until a second without pushes once the writes are over.
                while quiet_since_done < 4 {
                    match quiet_for(&mut w, Duration::from_millis(250)).await {
                        Some(push) => {
                            assert_eq!(push.watch, id);
                            last = Some(push.event);
                            pushes += 1;
                            quiet_since_done = 0;
                            // Slow: a pause after each push (the server coalesces meanwhile).
                            tokio::time::sleep(Duration::from_millis(5 + 20 * (i as u64 % 3))).await;
                        }
                        None if writes_done.load(std::sync::atomic::Ordering::Relaxed) => quiet_since_done += 1,
                        None => {}
                    }
                }
                (last, pushes)
            }));
        }
        let writers: Vec<_> = (0..3).map(|id| tokio::spawn(random_writes(server.addr.clone(), id, 400))).collect();
        let mut oracle = Oracle::default();
        for writer in writers {
            for (player, score) in writer.await.expect("a writer") {
                if let Some(score) = score {
                    oracle.0.insert(player, score);
                }
            }
        }
        writes_done.store(true, std::sync::atomic::Ordering::Relaxed);
        for (spec, reader) in specs.iter().zip(readers) {
            let (last, pushes) = reader.await.expect("a reader");
            let last = last.expect("at least the first push");
            match &spec.target {
                rankd_client::WatchTarget::Top(n) => {
                    let WatchEvent::Top(entries) = &last else { panic!("{last:?}") };
                    let got: Vec<(String, i64, u64)> =
                        entries.iter().map(|Entry { player, score, rank }| (player.clone(), *score, *rank)).collect();
                    assert_eq!(got, oracle.top(*n as usize), "top {n} on {shards} shards after {pushes} pushes");
                }
                rankd_client::WatchTarget::Player(player) => {
                    assert_eq!(last, WatchEvent::Player(oracle.rank(player)), "{player} on {shards} shards");
                }
            }
        }
        let looks = server.counter("rankd_watch_looks_total", &[]);
        let timed = server.counter("rankd_watch_look_duration_seconds_count", &[]);
        assert!(looks > 0.0 && timed > 0.0 && timed <= looks, "{timed} looks timed of {looks}");
    }
}

/// With commits slowed to 300 ms, writes sit staged (readable, not yet
/// durable) for a long time; a push must still only show durable ones. The
/// server is killed right after a push; after the restart the player's
/// score (only ever incremented) is at least every score pushed. (Without
/// the fence a look waits for, this fails in the first cycle.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pushes_show_only_durable_writes_even_when_the_server_dies_right_after() {
    let mut server = Server::start_with(2, &["--debug-commit-delay-ms", "300"]);
    for cycle in 0..3 {
        let mut w = watcher(&server).await;
        w.watch(&WatchSpec::player("durable", "hero").interval(Duration::from_millis(10))).await.unwrap();
        // Four connections' pipelines of increments: while one's are
        // acknowledged (which makes the watch look), the others' are staged,
        // readable and not yet durable.
        let writers: Vec<_> = (0..4)
            .map(|_| {
                let addr = server.addr.clone();
                tokio::spawn(async move {
                    let Ok(mut client) = Client::connect(&addr).await else { return };
                    let calls: Vec<Call> = (0..50).map(|_| set_call("durable", "hero", 1, Mode::Incr)).collect();
                    while client.pipeline::<rmpv::Value>(&calls).await.is_ok() {}
                })
            })
            .collect();
        let started = Instant::now();
        let mut highest = 0;
        while started.elapsed() < Duration::from_millis(1500) {
            if let WatchEvent::Player(Some(info)) = next_push(&mut w, Duration::from_secs(5)).await.event {
                highest = highest.max(info.score);
            }
        }
        // Right after a push.
        next_push(&mut w, Duration::from_secs(5)).await;
        server.kill9();
        writers.iter().for_each(|writer| writer.abort());
        server.restart();
        let recovered = server.client().await.get("durable", "hero").await.unwrap().unwrap_or(0);
        assert!(highest > 0, "cycle {cycle}: pushes came");
        assert!(recovered >= highest, "cycle {cycle}: a push showed {highest}, but only {recovered} was durable");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_never_reads_holds_neither_memory_nor_writers() {
    let server = Server::start(2);
    // 64 watches of the top 100 on one connection that is never read.
    let mut idle = server.client().await;
    let calls: Vec<Call> =
        (0..64).map(|_| WatchSpec::top("busy", 100).interval(Duration::from_millis(10)).call()).collect();
    idle.pipeline::<rmpv::Value>(&calls).await.unwrap();
    let mut client = server.client().await;
    let players: Vec<String> = (0..100).map(|i| format!("{i:0>200}")).collect();
    let rss_start = server.rss_bytes();
    let started = Instant::now();
    // At least 60 rounds of 100 writes, and on until the unread pushes
    // have filled the connection and begun to replace each other (how many
    // rounds that takes depends on how fast the writes go).
    let mut rounds = 0;
    loop {
        let calls: Vec<Call> = players.iter().map(|p| set_call("busy", p, rounds, Mode::Incr)).collect();
        client.pipeline::<rmpv::Value>(&calls).await.unwrap();
        rounds += 1;
        if rounds >= 60 && server.counter("rankd_watch_pushes_coalesced_total", &[]) > 0.0 {
            break;
        }
        assert!(rounds < 3000, "pushes replaced unread ones: none after {rounds} rounds of writes");
    }
    let took = started.elapsed();
    let grown = server.rss_bytes().saturating_sub(rss_start);
    // Each push of 100 entries with 200-byte names is ~22 KB: a backlog of
    // one per write would be far over this.
    assert!(grown < 64 << 20, "the server grew {grown} bytes");
    eprintln!("{} writes beside an unread watcher: {took:?}, server grew {} KiB", rounds * 100, grown / 1024);
    assert_eq!(server.metric("rankd_watches_open", &[]), 64.0);
    drop(idle);
}

/// A drop whose client leaves before the answer still ends the board's
/// watches: the drop's end does not depend on the connection that asked.
/// Commits are slowed so the client is gone while the drop is in flight.
#[tokio::test]
async fn a_drop_whose_client_left_still_ends_the_watches() {
    let server = Server::start_with(2, &["--debug-commit-delay-ms", "300"]);
    let mut w = watcher(&server).await;
    let top = w.watch(&WatchSpec::top("left", 3).interval(Duration::from_millis(10))).await.unwrap();
    assert_eq!(top_of(&next_push(&mut w, Duration::from_secs(5)).await), vec![]);
    server.client().await.set("left", "alice", 5, Mode::Set).await.unwrap();
    assert_eq!(top_of(&next_push(&mut w, Duration::from_secs(5)).await), vec![("alice".into(), 5, 1)]);
    let mut dropper = server.client().await;
    let asked = tokio::spawn(async move { dropper.drop_board("left").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    asked.abort(); // the client and its connection go
    let push = next_push(&mut w, Duration::from_secs(5)).await;
    assert_eq!((push.watch, push.event), (top, WatchEvent::Ended));
    let mut client = server.client().await;
    assert_eq!(client.top("left", 10, 0).await.unwrap(), vec![], "dropped");
}

/// A watch of a window its board does not have (opened before the board
/// was made, which a first `set` then made with the default windows) ends
/// with a last push of nil, and harms no other watch: the evaluator reads
/// every due watch in one batch, and that refused read once failed the
/// whole batch, so no watch on the server was pushed again.
#[tokio::test]
async fn a_watch_of_a_window_its_board_lacks_ends_and_harms_no_other() {
    let server = Server::start(2);
    let mut writer = server.client().await;
    let mut w = watcher(&server).await;
    let fast = Duration::from_millis(10);
    // Sorted first among the server's boards: read ahead of the good one.
    let weekly = w.watch(&WatchSpec::top("a-later", 3).window(Window::Weekly).interval(fast)).await.unwrap();
    let good = w.watch(&WatchSpec::top("b-live", 3).interval(fast)).await.unwrap();
    let mut firsts = HashMap::new();
    while firsts.len() < 2 {
        let push = next_push(&mut w, Duration::from_secs(5)).await;
        firsts.insert(push.watch, top_of(&push));
    }
    assert_eq!((firsts[&weekly].len(), firsts[&good].len()), (0, 0), "no board yet: empty tops");

    writer.set("a-later", "alice", 5, Mode::Set).await.unwrap(); // made with the `all` window only
    writer.set("b-live", "bob", 7, Mode::Set).await.unwrap();
    let mut seen = HashMap::new();
    while seen.len() < 2 {
        let push = next_push(&mut w, Duration::from_secs(5)).await;
        seen.insert(push.watch, push.event);
    }
    assert_eq!(seen[&weekly], WatchEvent::Ended, "the board has no weekly window");
    assert!(!w.unwatch(weekly).await.unwrap(), "ended");
    match &seen[&good] {
        WatchEvent::Top(entries) => assert_eq!(entries.len(), 1, "{entries:?}"),
        other => panic!("not a top: {other:?}"),
    }
    // And the good watch goes on.
    writer.set("b-live", "carol", 9, Mode::Set).await.unwrap();
    let push = next_push(&mut w, Duration::from_secs(5)).await;
    assert_eq!((push.watch, top_of(&push)), (good, vec![("carol".into(), 9, 1), ("bob".into(), 7, 2)]));
}

/// `rankd watch BOARD --top N --json` prints each push as a JSON line and
/// exits 0 once the board is dropped; `rankd set --wid` applies once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_watches_until_the_board_is_dropped() {
    use std::io::{BufRead, BufReader};
    let server = Server::start(2);
    let rankd = env!("CARGO_BIN_EXE_rankd");
    let mut child = std::process::Command::new(rankd)
        .args(["watch", "-s", &server.addr, "cli", "--top", "2", "--interval-ms", "10", "--json"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("rankd watch starts");
    let mut lines = BufReader::new(child.stdout.take().expect("its stdout")).lines();
    let mut next_line = move || lines.next().expect("a line").expect("readable");
    let line = tokio::task::spawn_blocking(move || (next_line(), next_line));
    let (first, mut next_line) = line.await.unwrap();
    assert_eq!(first, r#"{"watch":1,"event":[]}"#);
    for _ in 0..2 {
        let out = std::process::Command::new(rankd)
            .args(["set", "-s", &server.addr, "cli", "alice", "5", "--mode", "incr", "--wid", "once"])
            .output()
            .expect("rankd set runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "5", "the repeat answers the first result");
    }
    let pushed = tokio::task::spawn_blocking(move || (next_line(), next_line)).await.unwrap();
    let (pushed, next_line) = pushed;
    assert_eq!(pushed, r#"{"watch":1,"event":[{"player":"alice","score":5,"rank":1}]}"#);
    server.client().await.drop_board("cli").await.unwrap();
    let last = tokio::task::spawn_blocking(next_line).await.unwrap();
    assert_eq!(last, r#"{"watch":1,"event":null}"#);
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().expect("it exits");
    assert!(status.success());
}

/// A period boundary changes what a periodic window shows with no write:
/// today's top empties and yesterday's (period -1) becomes what today's
/// was. Both are pushed, on the server's clock, which starts a few seconds
/// before 2026-06-01T00:00:00Z (as in tests/windows.rs).
#[tokio::test]
async fn a_period_rollover_pushes_with_no_write() {
    const BOUNDARY: i64 = 1_780_272_000;
    const LEAD: u64 = 5;
    let server = Server::start_with(2, &[common::CLOCK_OFFSET, &common::offset_to(BOUNDARY - LEAD as i64)]);
    // The server's clock reads whole seconds: it reaches the boundary no later.
    let rollover = Instant::now() + Duration::from_secs(LEAD);
    let mut writer = server.client().await;
    let created = writer
        .call::<rmpv::Value>(
            Call::new(OpKind::CreateBoard).with("board", "daily").with("windows", vec![rmpv::Value::from("daily")]),
        )
        .await
        .unwrap();
    assert_eq!(created, rmpv::Value::from(true));
    writer.set("daily", "alice", 5, Mode::Set).await.unwrap();
    let mut w = watcher(&server).await;
    let fast = Duration::from_millis(10);
    // The board's first window (daily), and its previous period.
    let today = w.watch(&WatchSpec::top("daily", 3).interval(fast)).await.unwrap();
    let yesterday = w.watch(&WatchSpec::top("daily", 3).window(Window::Daily).period(-1).interval(fast)).await.unwrap();
    let mut firsts = HashMap::new();
    while firsts.len() < 2 {
        let push = next_push(&mut w, Duration::from_secs(5)).await;
        firsts.insert(push.watch, top_of(&push));
    }
    assert_eq!(firsts[&today], vec![("alice".into(), 5, 1)], "read after the boundary: raise LEAD");
    assert_eq!(firsts[&yesterday], vec![]);

    let mut rolled = HashMap::new();
    while rolled.len() < 2 {
        let within = rollover.saturating_duration_since(Instant::now()) + Duration::from_secs(3);
        let push = next_push(&mut w, within).await;
        rolled.insert(push.watch, top_of(&push));
    }
    assert_eq!(rolled[&today], vec![], "a new day starts empty");
    assert_eq!(rolled[&yesterday], vec![("alice".into(), 5, 1)]);
}

/// A watch pipelined behind a write that waits for a multi-step read sent
/// before it: the watch takes effect after the write is routed, so its
/// first push, which comes after the write's acknowledgement, shows it.
#[tokio::test]
async fn a_watch_sees_the_write_pipelined_before_it_in_its_first_push() {
    let server = Server::start(2);
    let mut client = server.client().await;
    let mut filler = server.client().await;
    let names: Vec<String> = (0..10_000).map(|i| format!("filler-{i}")).collect();
    for round in 0..20 {
        // Work queued for the shards just before, so the top (and with it
        // the write held behind it) waits while the watch is read.
        let entries: Vec<(&str, i64)> = names.iter().map(|name| (name.as_str(), round)).collect();
        let fill = Call::new(OpKind::SetMany).with("board", "filler").with("entries", entries);
        filler
            .send_raw(&{
                let mut frame = Vec::new();
                fill.encode(1_000_000 + round as u64, &mut frame);
                frame
            })
            .await
            .expect("fill");
        let board = format!("race-{round}");
        let calls = [
            Call::new(OpKind::Top).with("board", board.as_str()),
            set_call(&board, "alice", 10, Mode::Set),
            Call::new(OpKind::Watch).with("board", board.as_str()).with("top", 3).with("interval_ms", 10),
        ];
        let replies = client.pipeline::<rmpv::Value>(&calls).await.expect("pipeline");
        assert!(replies.iter().all(Result::is_ok), "round {round}: {replies:?}");
        let push = tokio::time::timeout(Duration::from_secs(5), client.next_push())
            .await
            .expect("a first push")
            .expect("the connection")
            .expect("a push");
        let top: Vec<Entry> = push.event().expect("a top").expect("not nil");
        let players: Vec<&str> = top.iter().map(|entry| entry.player.as_str()).collect();
        assert_eq!(players, ["alice"], "round {round}: the first push misses the write sent before the watch");
        let unwatch = Call::new(OpKind::Unwatch).with("watch", push.watch());
        assert!(client.call::<bool>(unwatch).await.expect("unwatch"), "the watch was open");
        filler.read_raw::<rmpv::Value>().await.expect("the fill's reply").expect("its connection");
    }
}

/// A `ResumingWatcher` outlives a kill -9 of the server: once it is back on
/// its address, the watch is asked for again, under the id its caller
/// holds, and pushes what the restart kept, then the writes after it.
#[tokio::test]
async fn a_resuming_watcher_follows_its_board_through_a_kill_9() {
    let listen = format!("127.0.0.1:{}", common::free_port());
    let mut server = Server::start_with(2, &["--listen", &listen]);
    server.client().await.set("resume", "alice", 5, Mode::Set).await.unwrap();
    let mut watcher = ResumingWatcher::connect_with(&listen, &ConnectOptions::default(), 20).await.unwrap();
    let top = watcher.watch(&WatchSpec::top("resume", 3)).await.unwrap();
    let next = async |watcher: &mut ResumingWatcher| {
        let push = tokio::time::timeout(Duration::from_secs(30), watcher.next_event()).await;
        push.expect("a push within 30 s").expect("no error").expect("the stream goes on")
    };
    let alice = Entry { player: "alice".into(), score: 5, rank: 1 };
    assert_eq!(next(&mut watcher).await.event, WatchEvent::Top(vec![alice.clone()]));
    server.kill9();
    server.restart();
    let resumed = next(&mut watcher).await;
    assert_eq!((resumed.watch, resumed.event), (top, WatchEvent::Top(vec![alice.clone()])), "the acknowledged write");
    assert_eq!(watcher.reconnects(), 1);
    server.client().await.set("resume", "bob", 9, Mode::Set).await.unwrap();
    let bob = Entry { player: "bob".into(), score: 9, rank: 1 };
    let after = next(&mut watcher).await;
    assert_eq!((after.watch, after.event), (top, WatchEvent::Top(vec![bob, Entry { rank: 2, ..alice }])));
}
