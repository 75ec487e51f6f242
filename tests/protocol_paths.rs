//! Protocol paths no other test reaches, on the real binary over TCP, each
//! checked against what `shared/protocol.md` says, value for value:
//!
//! - `create_board` answers `conflict` for another config, whether the board
//!   was created explicitly or implicitly by a write, and not after a
//!   `drop_board`, when the name takes a new config;
//! - `drop_board` answers true, then false; a dropped board with periodic
//!   windows reads as empty in every window and period, and comes back
//!   under a new config with none of its old periods.
//!
//! Time moves by restarting the server with its clock shifted
//! (`RANKD_DEBUG_CLOCK_OFFSET_SECS`) to a later instant: nothing waits.

mod common;

use std::time::{SystemTime, UNIX_EPOCH};

use rankd::client::{set_call, Call, Client};
use rankd::protocol::{BoardInfo, Entry, RankInfo};
use rmpv::Value;

/// 2026-05-27 12:00 UTC, a Wednesday: the week of May 25.
const MAY_27: i64 = 1_779_883_200;
/// 2026-05-28 12:00 UTC, the Thursday after: a new day only.
const MAY_28: i64 = 1_779_969_600;

// ------------------------------------------------------------- helpers --

/// The clock offset that makes a server started now read `at`.
fn offset_to(at: i64) -> String {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    (at - now).to_string()
}

/// A server (3 shards) whose clock reads `at`.
fn server_at(at: i64) -> common::Server {
    common::Server::start_with_env(3, &[], &[(rankd::clock::OFFSET_ENV, &offset_to(at))])
}

/// Stops the server cleanly and starts it again with its clock at `at`.
async fn move_clock(server: &mut common::Server, at: i64) -> Client {
    assert!(server.terminate().success(), "SIGTERM exits 0");
    server.restart_with_env(rankd::clock::OFFSET_ENV, &offset_to(at));
    server.client().await
}

async fn ok(client: &mut Client, call: Call, what: &str) -> Value {
    client.call(call).await.unwrap_or_else(|e| panic!("{what}: {e}"))
}

async fn code(client: &mut Client, call: Call, what: &str) -> String {
    let err = client.call(call).await.expect_err(what);
    err.code().unwrap_or_else(|| panic!("{what}: not a server error: {err}")).to_string()
}

fn create(board: &str, order: &str, ties: &str, windows: &[&str], keep: u64) -> Call {
    let windows: Vec<Value> = windows.iter().map(|w| Value::from(*w)).collect();
    Call::new("create_board")
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
    Call::new("set_many").with("board", board).with("entries", entries(list)).with("mode", mode)
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
    }
}

async fn boards(client: &mut Client) -> Vec<BoardInfo> {
    client.boards().await.expect("boards")
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
        at_view(Call::new("count").with("board", board), view),
        at_view(Call::new("top").with("board", board).with("limit", 100), view),
    ];
    for p in players {
        calls.push(at_view(Call::new("get").with("board", board).with("player", *p), view));
        calls.push(at_view(Call::new("rank").with("board", board).with("player", *p), view));
        calls.push(at_view(
            Call::new("around").with("board", board).with("player", *p).with("before", 1).with("after", 1),
            view,
        ));
    }
    for s in probes {
        calls.push(at_view(Call::new("rank_of_score").with("board", board).with("score", *s), view));
    }
    let replies = client.pipeline(&calls).await.expect("pipeline");
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
    assert_eq!(ok(c, Call::new("create_board").with("board", "cfg"), "create").await, Value::from(true));
    assert_eq!(ok(c, Call::new("create_board").with("board", "cfg"), "again").await, Value::from(false));
    let defaults = create("cfg", "desc", "competition", &["all"], 1);
    assert_eq!(ok(c, defaults, "the defaults spelt out").await, Value::from(false), "the same config");
    c.set("cfg", "p", 5, "set").await.unwrap();
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
    assert_eq!(c.set("by_set", "p", 3, "set").await.unwrap(), 3);
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

#[tokio::test]
async fn drop_board_answers_true_then_false() {
    let server = common::Server::start(2);
    let c = &mut server.client().await;
    let drop_board = |board: &str| Call::new("drop_board").with("board", board);
    assert_eq!(ok(c, drop_board("never"), "drop").await, Value::from(false), "a board that never existed");
    assert_eq!(ok(c, create("b", "desc", "competition", &["all"], 1), "create").await, Value::from(true));
    assert_eq!(ok(c, drop_board("b"), "drop").await, Value::from(true), "an empty board that exists");
    assert_eq!(ok(c, drop_board("b"), "drop").await, Value::from(false), "the same board again");
    c.set("b", "p", 1, "set").await.unwrap();
    c.set("other", "p", 2, "set").await.unwrap();
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
    c.pipeline(&[set_call("w", "ann", 10, "incr"), set_call("w", "bob", 20, "incr")]).await.unwrap();
    let mut c = move_clock(&mut server, MAY_28).await;
    c.pipeline(&[set_call("w", "ann", 1, "incr"), set_call("w", "cy", 5, "incr")]).await.unwrap();
    // The board has data in this period and the last (else this proves little).
    let daily = |period: i64| Call::new("count").with("board", "w").with("window", "daily").with("period", period);
    assert_eq!(ok(&mut c, daily(0), "today").await, Value::from(2));
    assert_eq!(ok(&mut c, daily(-1), "yesterday").await, Value::from(2));
    assert_eq!(
        ok(&mut c, at_view(Call::new("count").with("board", "w"), Some(("weekly", 0))), "w").await,
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
    let err = code(&mut c, at_view(Call::new("count").with("board", "w"), Some(("daily", 0))), "daily").await;
    assert_eq!(err, "bad_request", "the new config has no daily window");
    assert_eq!(c.set("w", "dee", 7, "incr").await.unwrap(), 7);
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
