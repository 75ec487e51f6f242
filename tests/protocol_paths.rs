//! Protocol paths no other test reaches, on the real binary over TCP, each
//! checked against what `shared/protocol.md` says, value for value:
//!
//! - `create_board` answers `conflict` for another config, whether the board
//!   was created explicitly or implicitly by a write, and not after a
//!   `drop_board`, when the name takes a new config;
//! - `drop_board` answers true, then false; a dropped board with periodic
//!   windows reads as empty in every window and period, and comes back
//!   under a new config with none of its old periods;
//! - `window` and `period` on `rank`, `rank_of_score` and `around` (and the
//!   other reads) of a board with all four windows, after writes in four
//!   different days, weeks and months, against an oracle of the periods;
//!   a period beyond `keep` or a window the board lacks is `bad_request`;
//! - `set_many` and `remove` on boards with windows (every window's current
//!   period; results from the first window), and what `boards` reports;
//! - a `rank_of_score` pipelined behind a write sees it, under each tie rule;
//! - reads, those that take several rounds (`rank`, `ranks`, `top`,
//!   `around`) too, do not see a write pipelined behind them.
//!
//! Time moves by restarting the server with its clock shifted
//! (`--debug-clock-offset-secs`) to a later instant: nothing waits.

mod common;

use std::collections::{BTreeMap, HashMap};

use rankd_client::{set_call, BoardInfo, Call, Client, Entry, Mode, OpKind, Order, RankInfo, Ties};
use rmpv::Value;

/// 2026-04-29 12:00 UTC, a Wednesday: April, the week of Monday April 27.
const APR_29: i64 = 1_777_464_000;
/// 2026-05-20 12:00 UTC, a Wednesday: May, the week of May 18.
const MAY_20: i64 = 1_779_278_400;
/// 2026-05-27 12:00 UTC, a Wednesday: the week of May 25.
const MAY_27: i64 = 1_779_883_200;
/// 2026-05-28 12:00 UTC, the Thursday after: a new day only.
const MAY_28: i64 = 1_779_969_600;

// ------------------------------------------------------------- helpers --

/// A server (3 shards) whose clock reads `at`.
fn server_at(at: i64) -> common::Server {
    common::Server::start_with(3, &[common::CLOCK_OFFSET, &common::offset_to(at)])
}

/// Stops the server cleanly and starts it again with its clock at `at`.
async fn move_clock(server: &mut common::Server, at: i64) -> Client {
    assert!(server.terminate().success(), "SIGTERM exits 0");
    server.restart_with_flag(common::CLOCK_OFFSET, &common::offset_to(at));
    server.client().await
}

async fn ok(client: &mut Client, call: Call, what: &str) -> Value {
    client.call::<Value>(call).await.unwrap_or_else(|e| panic!("{what}: {e}"))
}

async fn code(client: &mut Client, call: Call, what: &str) -> String {
    let err = client.call::<Value>(call).await.expect_err(what);
    err.code().unwrap_or_else(|| panic!("{what}: not a server error: {err}")).to_string()
}

fn create(board: &str, order: &str, ties: &str, windows: &[&str], keep: u64) -> Call {
    let windows: Vec<Value> = windows.iter().map(|w| Value::from(*w)).collect();
    Call::new(OpKind::CreateBoard)
        .with("board", board)
        .with("order", order)
        .with("ties", ties)
        .with("windows", windows)
        .with("keep", keep)
}

fn entries(list: &[(&str, i64)]) -> Value {
    Value::Array(list.iter().map(|(p, s)| Value::Array(vec![Value::from(*p), Value::from(*s)])).collect())
}

/// `set_many`'s result: the stored scores, in entry order.
fn entries_scores(scores: &[i64]) -> Value {
    Value::Array(scores.iter().map(|s| Value::from(*s)).collect())
}

fn set_many(board: &str, list: &[(&str, i64)], mode: &str) -> Call {
    Call::new(OpKind::SetMany).with("board", board).with("entries", entries(list)).with("mode", mode)
}

/// Adds `window` and `period` to a read (none: the board's defaults).
fn at_view(call: Call, view: Option<(&str, i64)>) -> Call {
    match view {
        Some((window, period)) => call.with("window", window).with("period", period),
        None => call,
    }
}

fn info(board: &str, order: &str, ties: &str, windows: &[&str], keep: u32, count: u64) -> BoardInfo {
    BoardInfo {
        board: board.into(),
        order: order.into(),
        ties: ties.into(),
        windows: windows.iter().map(|w| w.to_string()).collect(),
        keep,
        count,
        fields: None,
    }
}

async fn boards(client: &mut Client) -> Vec<BoardInfo> {
    client.boards().await.expect("boards")
}

// ------------------------------------------------------- period oracle --

/// Days from 1970-01-01 to a civil date's month: the month's index since
/// year 0 (Howard Hinnant's `civil_from_days`).
fn month_index(days: i64) -> i64 {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    year * 12 + month - 1
}

/// Which period of `window` the instant `t` falls in (UTC; weeks start on
/// Monday, and 1970-01-01 was a Thursday).
fn period_of(window: &str, t: i64) -> i64 {
    let days = t.div_euclid(86_400);
    match window {
        "all" => 0,
        "daily" => days,
        "weekly" => (days + 3).div_euclid(7),
        "monthly" => month_index(days),
        other => panic!("no window {other}"),
    }
}

/// A `desc`, `competition` board as protocol.md defines one with windows:
/// every write and remove acts on each window's current period, reads look
/// at one window's period `0` or `-k`.
struct Oracle {
    windows: Vec<&'static str>,
    periods: HashMap<(&'static str, i64), BTreeMap<String, i64>>,
}

impl Oracle {
    fn new(windows: &[&'static str]) -> Self {
        Self { windows: windows.to_vec(), periods: HashMap::new() }
    }

    /// An `incr` at `now`; returns the score in the first window.
    fn incr(&mut self, now: i64, player: &str, by: i64) -> i64 {
        let mut first = None;
        for &w in &self.windows {
            let score = self.periods.entry((w, period_of(w, now))).or_default().entry(player.to_string()).or_insert(0);
            *score += by;
            first.get_or_insert(*score);
        }
        first.expect("a board has a window")
    }

    /// A `remove` at `now`; returns whether the player was in the first
    /// window's current period.
    fn remove(&mut self, now: i64, player: &str) -> bool {
        let mut first = None;
        for &w in &self.windows {
            let removed = self.periods.entry((w, period_of(w, now))).or_default().remove(player).is_some();
            first.get_or_insert(removed);
        }
        first.expect("a board has a window")
    }

    /// The view's players, best first (ties by name bytes), with ranks.
    fn view(&self, now: i64, window: &str, period: i64) -> Vec<Entry> {
        let w = self.windows.iter().find(|w| **w == window).expect("a window of the board");
        let held = self.periods.get(&(*w, period_of(w, now) + period)).cloned().unwrap_or_default();
        let mut list: Vec<(String, i64)> = held.into_iter().collect();
        list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())));
        let better = |score: i64| list.iter().filter(|(_, s)| *s > score).count() as u64;
        list.iter().map(|(p, s)| Entry { player: p.clone(), score: *s, rank: better(*s) + 1 }).collect()
    }
}

/// Every read of one view (window and period, or the defaults) against the
/// `expected` list: `count`, `top`, and for each of `players` `get`, `rank` and
/// `around` (one before, one after), and `rank_of_score` for `probes` as on
/// a `desc` `competition` board (the same on a `dense` one whose scores are
/// all distinct).
async fn check_view(
    client: &mut Client,
    board: &str,
    view: Option<(&str, i64)>,
    expected: &[Entry],
    players: &[&str],
    probes: &[i64],
) {
    let mut calls = vec![
        at_view(Call::new(OpKind::Count).with("board", board), view),
        at_view(Call::new(OpKind::Top).with("board", board).with("limit", 100), view),
    ];
    for p in players {
        calls.push(at_view(Call::new(OpKind::Get).with("board", board).with("player", *p), view));
        calls.push(at_view(Call::new(OpKind::Rank).with("board", board).with("player", *p), view));
        calls.push(at_view(
            Call::new(OpKind::Around).with("board", board).with("player", *p).with("before", 1).with("after", 1),
            view,
        ));
    }
    for s in probes {
        calls.push(at_view(Call::new(OpKind::RankOfScore).with("board", board).with("score", *s), view));
    }
    let replies = client.pipeline::<Value>(&calls).await.expect("pipeline");
    let mut replies = replies.into_iter().map(|r| r.unwrap_or_else(|e| panic!("{board} {view:?}: a read failed: {e}")));
    let mut next = || replies.next().expect("a reply per call");
    let n = expected.len() as u64;
    assert_eq!(next().as_u64(), Some(n), "{board} {view:?}: count");
    let top: Vec<Entry> = rmpv::ext::from_value(next()).expect("top's shape");
    assert_eq!(top, expected, "{board} {view:?}: top");
    for p in players {
        let at = expected.iter().position(|e| e.player == *p);
        let get = next();
        assert_eq!(
            if get.is_nil() { None } else { get.as_i64() },
            at.map(|i| expected[i].score),
            "{board} {view:?}: get {p}"
        );
        let rank: Option<RankInfo> = rmpv::ext::from_value(next()).expect("rank's shape");
        let want = at.map(|i| RankInfo { rank: expected[i].rank, score: expected[i].score, count: n });
        assert_eq!(rank, want, "{board} {view:?}: rank {p}");
        let around: Vec<Entry> = rmpv::ext::from_value(next()).expect("around's shape");
        let want = at.map_or(Vec::new(), |i| expected[i.saturating_sub(1)..(i + 2).min(expected.len())].to_vec());
        assert_eq!(around, want, "{board} {view:?}: around {p}");
    }
    for s in probes {
        let want = 1 + expected.iter().filter(|e| e.score > *s).count() as u64;
        assert_eq!(next().as_u64(), Some(want), "{board} {view:?}: rank_of_score {s}");
    }
}

// ----------------------------------------------------------------- tests --

#[tokio::test]
async fn create_board_conflicts_only_with_another_config() {
    let mut server = common::Server::start(2);
    let mut client = server.client().await;
    let c = &mut client;
    assert_eq!(ok(c, Call::new(OpKind::CreateBoard).with("board", "cfg"), "create").await, Value::from(true));
    assert_eq!(ok(c, Call::new(OpKind::CreateBoard).with("board", "cfg"), "again").await, Value::from(false));
    let defaults = create("cfg", "desc", "competition", &["all"], 1);
    assert_eq!(ok(c, defaults, "the defaults spelt out").await, Value::from(false), "the same config");
    c.set("cfg", "p", 5, Mode::Set).await.unwrap();
    for (what, other) in [
        ("order", create("cfg", "asc", "competition", &["all"], 1)),
        ("ties", create("cfg", "desc", "dense", &["all"], 1)),
        ("ties", create("cfg", "desc", "ordinal", &["all"], 1)),
        ("windows", create("cfg", "desc", "competition", &["all", "daily"], 1)),
        ("windows", create("cfg", "desc", "competition", &["daily"], 1)),
        ("keep", create("cfg", "desc", "competition", &["all"], 2)),
    ] {
        assert_eq!(code(c, other, what).await, "conflict", "another {what}");
    }
    // A conflict changes nothing.
    assert_eq!(boards(c).await, vec![info("cfg", "desc", "competition", &["all"], 1, 1)]);
    assert_eq!(c.get("cfg", "p").await.unwrap(), Some(5));

    // A board made by its first write has the default config.
    assert_eq!(c.set("by_set", "p", 3, Mode::Set).await.unwrap(), 3);
    assert_eq!(ok(c, set_many("by_set_many", &[("a", 1), ("b", 2)], "set"), "set_many").await, entries_scores(&[1, 2]));
    for board in ["by_set", "by_set_many"] {
        let same = create(board, "desc", "competition", &["all"], 1);
        assert_eq!(ok(c, same, board).await, Value::from(false), "{board}: the default config");
        assert_eq!(code(c, create(board, "asc", "competition", &["all"], 1), board).await, "conflict", "{board}");
        let windows = create(board, "desc", "competition", &["all", "weekly"], 1);
        assert_eq!(code(c, windows, board).await, "conflict", "{board}");
    }
    // Reads do not create a board: it is still free for any config.
    assert_eq!(c.get("read_only", "p").await.unwrap(), None);
    assert_eq!(c.count("read_only").await.unwrap(), 0);
    let fresh = create("read_only", "asc", "dense", &["weekly"], 3);
    assert_eq!(ok(c, fresh, "create after reads").await, Value::from(true));

    // After a drop the name takes a new config, without its old players.
    assert!(c.drop_board("by_set").await.unwrap());
    let new_config = create("by_set", "asc", "ordinal", &["monthly", "all"], 4);
    assert_eq!(ok(c, new_config.clone(), "recreate").await, Value::from(true), "no conflict after a drop");
    assert_eq!(ok(c, new_config, "recreate again").await, Value::from(false));
    assert_eq!(c.get("by_set", "p").await.unwrap(), None, "the dropped board's player is gone");
    assert_eq!(code(c, create("by_set", "desc", "competition", &["all"], 1), "old config").await, "conflict");
    let listed = vec![
        info("by_set", "asc", "ordinal", &["monthly", "all"], 4, 0),
        info("by_set_many", "desc", "competition", &["all"], 1, 2),
        info("cfg", "desc", "competition", &["all"], 1, 1),
        info("read_only", "asc", "dense", &["weekly"], 3, 0),
    ];
    assert_eq!(boards(c).await, listed);

    // Configs are durable: the same answers after a kill -9.
    drop(client);
    server.kill9();
    server.restart();
    let c = &mut server.client().await;
    assert_eq!(boards(c).await, listed, "after kill -9");
    assert_eq!(code(c, create("cfg", "asc", "competition", &["all"], 1), "after restart").await, "conflict");
    let same = create("by_set", "asc", "ordinal", &["monthly", "all"], 4);
    assert_eq!(ok(c, same, "after restart").await, Value::from(false));
}

/// A `set_many` refused for an overflow "changes nothing", and one with no
/// entries writes nothing: neither leaves a board behind, listed or in the
/// way of a `create_board`, before or after a restart.
#[tokio::test]
async fn a_refused_or_empty_set_many_creates_no_board() {
    let mut server = common::Server::start(2);
    let mut client = server.client().await;
    let c = &mut client;
    let overflow = [("p", i64::MAX), ("p", 1)];
    // With players on every shard too, so the refusal is not one shard's.
    let spread: Vec<(String, i64)> = (0..20).map(|i| (format!("q{i}"), 1)).collect();
    let mut spread: Vec<(&str, i64)> = spread.iter().map(|(p, s)| (p.as_str(), *s)).collect();
    spread.extend(overflow);
    assert_eq!(code(c, set_many("lone", &overflow, "incr"), "overflow").await, "bad_request");
    assert_eq!(code(c, set_many("spread", &spread, "incr"), "overflow").await, "bad_request");
    assert_eq!(ok(c, set_many("empty", &[], "set"), "empty").await, entries_scores(&[]));
    assert_eq!(boards(c).await, vec![], "no board was made");
    assert_eq!(ok(c, create("lone", "asc", "dense", &["all"], 1), "create").await, Value::from(true));
    // The same incrs apart fit, and make the board.
    ok(c, set_many("spread", &spread[..21], "incr"), "in range").await;
    drop(client);
    server.kill9();
    server.restart();
    let c = &mut server.client().await;
    let listed =
        vec![info("lone", "asc", "dense", &["all"], 1, 0), info("spread", "desc", "competition", &["all"], 1, 21)];
    assert_eq!(boards(c).await, listed, "after kill -9");
    assert_eq!(ok(c, create("empty", "asc", "competition", &["all"], 1), "create").await, Value::from(true));
}

#[tokio::test]
async fn drop_board_answers_true_then_false() {
    let server = common::Server::start(2);
    let c = &mut server.client().await;
    let drop_board = |board: &str| Call::new(OpKind::DropBoard).with("board", board);
    assert_eq!(ok(c, drop_board("never"), "drop").await, Value::from(false), "a board that never existed");
    assert_eq!(ok(c, create("b", "desc", "competition", &["all"], 1), "create").await, Value::from(true));
    assert_eq!(ok(c, drop_board("b"), "drop").await, Value::from(true), "an empty board that exists");
    assert_eq!(ok(c, drop_board("b"), "drop").await, Value::from(false), "the same board again");
    c.set("b", "p", 1, Mode::Set).await.unwrap();
    c.set("other", "p", 2, Mode::Set).await.unwrap();
    assert_eq!(ok(c, drop_board("b"), "drop").await, Value::from(true), "a board made again by a write");
    assert_eq!(ok(c, drop_board("b"), "drop").await, Value::from(false), "and dropped again");
    assert_eq!(c.get("b", "p").await.unwrap(), None, "its player is gone");
    assert_eq!(boards(c).await, vec![info("other", "desc", "competition", &["all"], 1, 1)], "only `other` is left");
    assert_eq!(c.get("other", "p").await.unwrap(), Some(2), "another board is untouched");
}

#[tokio::test]
async fn a_dropped_board_with_windows_reads_empty_and_comes_back_with_a_new_config() {
    let windows = ["daily", "weekly", "monthly"];
    let mut server = server_at(MAY_27);
    let mut c = server.client().await;
    assert_eq!(ok(&mut c, create("w", "desc", "competition", &windows, 2), "create").await, Value::from(true));
    c.pipeline::<Value>(&[set_call("w", "ann", 10, Mode::Incr), set_call("w", "bob", 20, Mode::Incr)]).await.unwrap();
    let mut c = move_clock(&mut server, MAY_28).await;
    c.pipeline::<Value>(&[set_call("w", "ann", 1, Mode::Incr), set_call("w", "cy", 5, Mode::Incr)]).await.unwrap();
    // The board has data in this period and the last (else this proves little).
    let daily =
        |period: i64| Call::new(OpKind::Count).with("board", "w").with("window", "daily").with("period", period);
    assert_eq!(ok(&mut c, daily(0), "today").await, Value::from(2));
    assert_eq!(ok(&mut c, daily(-1), "yesterday").await, Value::from(2));
    assert_eq!(
        ok(&mut c, at_view(Call::new(OpKind::Count).with("board", "w"), Some(("weekly", 0))), "w").await,
        Value::from(3)
    );

    assert!(c.drop_board("w").await.unwrap());
    let empty_reads = async |c: &mut Client, context: &str| {
        for window in windows {
            for period in [0, -1, -2] {
                let view = Some((window, period));
                check_view(c, "w", view, &[], &["ann", "bob", "cy"], &[0, 15, i64::MIN]).await;
            }
        }
        check_view(c, "w", None, &[], &["ann"], &[0]).await;
        assert!(boards(c).await.iter().all(|b| b.board != "w"), "{context}: `w` is not listed");
    };
    empty_reads(&mut c, "dropped").await;
    assert!(!c.drop_board("w").await.unwrap(), "dropped already");

    // Back with another config: none of the old periods shows through.
    let new_windows = ["weekly", "all"];
    assert_eq!(ok(&mut c, create("w", "desc", "dense", &new_windows, 3), "recreate").await, Value::from(true));
    assert_eq!(boards(&mut c).await, vec![info("w", "desc", "dense", &new_windows, 3, 0)]);
    for (window, period) in [("weekly", 0), ("weekly", -1), ("weekly", -3), ("all", 0)] {
        let view = Some((window, period));
        check_view(&mut c, "w", view, &[], &["ann", "bob", "cy"], &[0]).await;
    }
    let err = code(&mut c, at_view(Call::new(OpKind::Count).with("board", "w"), Some(("daily", 0))), "daily").await;
    assert_eq!(err, "bad_request", "the new config has no daily window");
    assert_eq!(c.set("w", "dee", 7, Mode::Incr).await.unwrap(), 7);
    let dee = vec![Entry { player: "dee".into(), score: 7, rank: 1 }];
    check_view(&mut c, "w", Some(("weekly", 0)), &dee, &["dee", "ann"], &[6, 7, 8]).await;
    check_view(&mut c, "w", Some(("weekly", -1)), &[], &["dee", "ann"], &[0]).await;

    // And after a kill -9 the drop still holds.
    drop(c);
    server.kill9();
    server.restart();
    let mut c = server.client().await;
    assert_eq!(boards(&mut c).await, vec![info("w", "desc", "dense", &new_windows, 3, 1)]);
    check_view(&mut c, "w", Some(("all", 0)), &dee, &["dee", "ann", "bob"], &[6, 7, 8]).await;
    check_view(&mut c, "w", Some(("weekly", -1)), &[], &["ann"], &[0]).await;
}

/// A board with all four windows and one with `daily` and `weekly` only,
/// written on four days: April 29; May 20 (new month, week and day); May
/// 27 (new week and day); May 28 (new day). Then every read of every view
/// matches the oracle, the views differ from each other, and `set_many`,
/// `remove` and `boards` act on and report windows as protocol.md says.
#[tokio::test]
async fn reads_writes_and_boards_follow_each_window_and_period() {
    let season_windows = ["all", "daily", "weekly", "monthly"];
    let mut season = Oracle::new(&season_windows);
    let mut short = Oracle::new(&["daily", "weekly"]);
    let mut server = server_at(APR_29);
    let mut c = server.client().await;
    assert_eq!(
        ok(&mut c, create("season", "desc", "competition", &season_windows, 2), "season").await,
        Value::from(true)
    );
    assert_eq!(
        ok(&mut c, create("short", "desc", "competition", &["daily", "weekly"], 1), "short").await,
        Value::from(true)
    );

    // Each day: its instant, its incrs on `season`, its incrs on `short`.
    type Writes<'a> = &'a [(&'a str, i64)];
    let days: [(i64, Writes, Writes); 4] = [
        (APR_29, &[("ann", 50), ("bob", 40), ("cat", 10)], &[]),
        (MAY_20, &[("bob", 30), ("cat", 25), ("dan", 5)], &[]),
        (MAY_27, &[("ann", 5), ("dan", 20), ("eve", 15)], &[("hal", 4), ("jon", 9), ("kim", 2)]),
        (MAY_28, &[("cat", 12), ("eve", 3), ("fay", 12)], &[("ivy", 6)]),
    ];
    for (i, (day, writes, short_writes)) in days.iter().enumerate() {
        if i > 0 {
            c = move_clock(&mut server, *day).await;
        }
        // `set` answers the first window's score: all-time on `season`,
        // today's on `short`.
        for (board, oracle, writes) in [("season", &mut season, writes), ("short", &mut short, short_writes)] {
            for (player, by) in writes.iter() {
                let want = oracle.incr(*day, player, *by);
                assert_eq!(
                    c.set(board, player, *by, Mode::Incr).await.unwrap(),
                    want,
                    "{board}: incr {player} on {day}"
                );
            }
        }
    }
    let now = MAY_28;
    // The configs survived three restarts.
    let same = create("season", "desc", "competition", &season_windows, 2);
    assert_eq!(ok(&mut c, same, "same config").await, Value::from(false));

    // The four current views hold different players or scores (so a
    // server answering every window from one would fail below).
    let current: Vec<Vec<Entry>> = season_windows.iter().map(|w| season.view(now, w, 0)).collect();
    for (i, a) in current.iter().enumerate() {
        for b in &current[i + 1..] {
            assert_ne!(a, b, "the oracle's views should differ");
        }
    }
    let players = ["ann", "bob", "cat", "dan", "eve", "fay", "gus"];
    let probes = [100, 50, 30, 25, 20, 12, 11, 5, 0, i64::MIN, i64::MAX];
    let check_all = async |c: &mut Client, season: &Oracle, short: &Oracle, context: &str| {
        eprintln!("checking every view: {context}");
        for window in season_windows {
            let periods: &[i64] = if window == "all" { &[0] } else { &[0, -1, -2] };
            for &period in periods {
                check_view(c, "season", Some((window, period)), &season.view(now, window, period), &players, &probes)
                    .await;
            }
        }
        // No window: the first one's current period.
        check_view(c, "season", None, &season.view(now, "all", 0), &players, &probes).await;
        for (window, period) in [("daily", 0), ("daily", -1), ("weekly", 0), ("weekly", -1)] {
            let expected = short.view(now, window, period);
            check_view(c, "short", Some((window, period)), &expected, &["hal", "ivy", "jon", "kim"], &[0, 5, 9]).await;
        }
        check_view(c, "short", None, &short.view(now, "daily", 0), &["hal", "ivy", "jon", "kim"], &[0, 5, 9]).await;
    };
    check_all(&mut c, &season, &short, "after the four days").await;
    // Spot checks of the oracle itself, worked out by hand: cat is third
    // all-time (47 after bob 70, ann 55), first this month (37), third this
    // week tied with fay (12, after dan 20, eve 18), first today tied with fay.
    let cat =
        |window: &str| season.view(now, window, 0).into_iter().find(|e| e.player == "cat").map(|e| (e.score, e.rank));
    assert_eq!(
        [cat("all"), cat("monthly"), cat("weekly"), cat("daily")],
        [Some((47, 3)), Some((37, 1)), Some((12, 3)), Some((12, 1))]
    );

    // A view the board cannot have is a bad_request, for every read.
    let reads = |board: &str| {
        vec![
            Call::new(OpKind::Rank).with("board", board).with("player", "cat"),
            Call::new(OpKind::RankOfScore).with("board", board).with("score", 10),
            Call::new(OpKind::Around).with("board", board).with("player", "cat"),
            Call::new(OpKind::Get).with("board", board).with("player", "cat"),
            Call::new(OpKind::Count).with("board", board),
            Call::new(OpKind::Top).with("board", board),
        ]
    };
    let bad_views: [(&str, &str, i64, &str); 6] = [
        ("season", "daily", -3, "beyond keep 2"),
        ("season", "monthly", -3, "beyond keep 2"),
        ("season", "all", -1, "`all` has no past periods"),
        ("season", "weekly", 1, "a future period"),
        ("short", "all", 0, "a window `short` lacks"),
        ("short", "daily", -2, "beyond keep 1"),
    ];
    for (board, window, period, why) in bad_views {
        for call in reads(board) {
            let call = at_view(call, Some((window, period)));
            assert_eq!(code(&mut c, call, why).await, "bad_request", "{board} {window} {period}: {why}");
        }
    }
    for call in reads("short") {
        let call = call.with("window", "monthly");
        assert_eq!(code(&mut c, call, "monthly").await, "bad_request", "a window `short` lacks, default period");
    }

    // set_many updates every window's current period and answers the first
    // window's scores, in entry order.
    let batch = [("ann", 1), ("gus", 7), ("cat", -2)];
    let want: Vec<i64> = batch.iter().map(|(p, by)| season.incr(now, p, *by)).collect();
    assert_eq!(want, [56, 7, 45], "all-time totals");
    assert_eq!(ok(&mut c, set_many("season", &batch, "incr"), "set_many").await, entries_scores(&want));
    let batch = [("hal", 1), ("ivy", 2)];
    let want: Vec<i64> = batch.iter().map(|(p, by)| short.incr(now, p, *by)).collect();
    assert_eq!(want, [1, 8], "today's totals (hal's weekly total is 5)");
    assert_eq!(ok(&mut c, set_many("short", &batch, "incr"), "set_many").await, entries_scores(&want));

    // remove: true if in the first window's current period; gone from every
    // window's current period; past periods keep the player.
    for (board, player) in [
        ("season", "bob"), // all-time and this month, not this week or today
        ("season", "eve"), // in every current period
        ("season", "zed"), // nowhere
        ("short", "jon"),  // this week, but not today: false, and still removed from the week
        ("short", "ivy"),  // today and this week
    ] {
        let oracle = if board == "season" { &mut season } else { &mut short };
        let want = oracle.remove(now, player);
        assert_eq!(c.remove(board, player).await.unwrap(), want, "{board}: remove {player}");
    }
    let listed = |view: Vec<Entry>| view.into_iter().map(|e| e.player).collect::<Vec<_>>();
    assert_eq!(listed(season.view(now, "weekly", -1)), ["bob", "cat", "dan"], "the oracle: last week keeps bob");
    assert_eq!(listed(short.view(now, "weekly", 0)), ["hal", "kim"], "the oracle: jon and ivy left this week");
    check_all(&mut c, &season, &short, "after set_many and remove").await;

    // boards: each board's config, and the count of its first window's
    // current period (all-time for `season`, today for `short`).
    let season_count = season.view(now, "all", 0).len() as u64;
    let short_count = short.view(now, "daily", 0).len() as u64;
    assert_eq!((season_count, short_count), (5, 1), "the oracle's counts");
    assert_ne!(short.view(now, "weekly", 0).len() as u64, short_count, "`short`'s weekly count differs");
    assert_eq!(
        boards(&mut c).await,
        vec![
            info("season", "desc", "competition", &season_windows, 2, season_count),
            info("short", "desc", "competition", &["daily", "weekly"], 1, short_count),
        ]
    );

    // All of it durable: the same after a kill -9.
    drop(c);
    server.kill9();
    server.restart();
    let mut c = server.client().await;
    check_all(&mut c, &season, &short, "after kill -9").await;
}

/// protocol.md: requests on one connection take effect in the order they
/// were sent. A `rank_of_score` and a `rank` pipelined right behind a `set`
/// of a new score count it, whichever shards the two players live on.
async fn reads_see_the_writes_pipelined_before_them(ties: Ties) {
    let server = common::Server::start(2);
    let c = &mut server.client().await;
    assert!(c.create_board("b", Order::Desc, ties).await.expect("create"));
    for round in 0..20i64 {
        let score = 100 * (round + 1);
        let calls = [
            set_call("b", &format!("p{round}"), score, Mode::Set),
            Call::new(OpKind::RankOfScore).with("board", "b").with("score", 0),
            Call::new(OpKind::Rank).with("board", "b").with("player", "p0"),
        ];
        let replies = c.pipeline::<Value>(&calls).await.expect("pipeline");
        assert_eq!(replies[0].as_ref().expect("set"), &Value::from(score));
        // Every player so far holds a distinct score above 0, and p0 the lowest.
        let want = round as u64 + 2;
        assert_eq!(replies[1].as_ref().expect("rank_of_score"), &Value::from(want), "{ties}, round {round}");
        let rank = replies[2].as_ref().expect("rank");
        assert_eq!(rank["rank"], Value::from(round as u64 + 1), "{ties}, round {round}: {rank}");
    }
}

#[tokio::test]
async fn reads_see_the_writes_pipelined_before_them_competition() {
    reads_see_the_writes_pipelined_before_them(Ties::Competition).await;
}

#[tokio::test]
async fn reads_see_the_writes_pipelined_before_them_ordinal() {
    reads_see_the_writes_pipelined_before_them(Ties::Ordinal).await;
}

/// The dense index is shared by the shards and read by the router: shards
/// report to it as they stage a write, and a dense `rank_of_score` reads
/// it only after a round through every shard.
#[tokio::test]
async fn reads_see_the_writes_pipelined_before_them_dense() {
    reads_see_the_writes_pipelined_before_them(Ties::Dense).await;
}

/// protocol.md, the other way round: a write pipelined right behind a read
/// does not reach it, even a read that takes several rounds across the
/// shards (the owner's record first, then everyone's counts). Each of
/// `rank`, `ranks`, `top`, `around`, `rank_of_score` and `count` goes alone
/// in front of a write of a new leader, and must still see the field as it
/// was before it.
async fn reads_miss_the_writes_pipelined_after_them(ties: Ties) {
    let server = common::Server::start(3);
    let c = &mut server.client().await;
    assert!(c.create_board("b", Order::Desc, ties).await.expect("create"));
    let field: Vec<String> = (0..6).map(|i| format!("p{i}")).collect();
    let calls: Vec<Call> = field.iter().zip(1..).map(|(p, score)| set_call("b", p, 10 * score, Mode::Set)).collect();
    c.pipeline::<Value>(&calls).await.expect("field");
    let reads = [
        Call::new(OpKind::Rank).with("board", "b").with("player", "p0"),
        Call::new(OpKind::Ranks).with("board", "b").with("players", ["p0", "p3"]),
        Call::new(OpKind::Top).with("board", "b").with("limit", 100),
        Call::new(OpKind::Around).with("board", "b").with("player", "p0").with("before", 1).with("after", 1),
        Call::new(OpKind::RankOfScore).with("board", "b").with("score", 0),
        Call::new(OpKind::Count).with("board", "b"),
    ];
    for round in 0..60u64 {
        // Ahead of p0: p5..p1 and every earlier leader.
        let before_p0 = field.len() as u64 - 1 + round;
        let leader = format!("lead{round}");
        let read = &reads[round as usize % reads.len()];
        let calls = [read.clone(), set_call("b", &leader, 1000 + 10 * round as i64, Mode::Set)];
        let replies = c.pipeline::<Value>(&calls).await.expect("pipeline");
        let at = format!("{ties}, round {round}");
        let reply = replies[0].as_ref().unwrap_or_else(|e| panic!("{at}: {e}"));
        let entries = || -> Vec<(String, u64)> {
            let entries: Vec<Entry> = rmpv::ext::from_value(reply.clone()).expect("entries");
            entries.into_iter().map(|e| (e.player, e.rank)).collect()
        };
        let named = |p: &str, rank: u64| (p.to_string(), rank);
        match round as usize % reads.len() {
            0 => assert_eq!(reply["rank"], Value::from(before_p0 + 1), "rank, {at}: {reply}"),
            1 => assert_eq!(entries(), [named("p3", before_p0 - 2), named("p0", before_p0 + 1)], "ranks, {at}"),
            2 => assert_eq!(entries().len() as u64, before_p0 + 1, "top, {at}: {reply}"),
            3 => assert_eq!(entries(), [named("p1", before_p0), named("p0", before_p0 + 1)], "around, {at}"),
            4 => assert_eq!(reply, &Value::from(before_p0 + 2), "rank_of_score, {at}"),
            _ => assert_eq!(reply, &Value::from(before_p0 + 1), "count, {at}"),
        }
    }
}

#[tokio::test]
async fn reads_miss_the_writes_pipelined_after_them_competition() {
    reads_miss_the_writes_pipelined_after_them(Ties::Competition).await;
}

#[tokio::test]
async fn reads_miss_the_writes_pipelined_after_them_ordinal() {
    reads_miss_the_writes_pipelined_after_them(Ties::Ordinal).await;
}

#[tokio::test]
async fn reads_miss_the_writes_pipelined_after_them_dense() {
    reads_miss_the_writes_pipelined_after_them(Ties::Dense).await;
}
