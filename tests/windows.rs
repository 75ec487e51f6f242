//! Time windows on the real binary: one write updates every window, a
//! rollover starts new periods empty and keeps the previous ones readable,
//! and a board with windows survives kill -9 across a rollover.
//!
//! The server's clock is shifted (`--debug-clock-offset-secs`) to a few
//! seconds before 2026-06-01 00:00:00 UTC, a Monday and the first of a
//! month: day, week and month all roll over together. The tests wait for
//! the real clock to get there (that is what they test), polling the
//! server until it shows the new period.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rankd_client::{set_call, Call, Client, Mode, OpKind, Order, Ties};
use rmpv::Value;

/// 2026-06-01T00:00:00Z.
const BOUNDARY: i64 = 1_780_272_000;

/// Seconds between starting a server and its clock crossing the boundary:
/// time enough to start it and write before the boundary on a loaded machine.
const LEAD: u64 = 5;

/// Starts a server whose clock reads [`LEAD`] seconds before the boundary;
/// returns it and the real instant its clock reaches the boundary.
fn server_before_boundary() -> (common::Server, SystemTime) {
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs();
    let offset = (BOUNDARY - (now + LEAD) as i64).to_string();
    let server = common::Server::start_with(2, &[common::CLOCK_OFFSET, offset.as_str()]);
    // The server's clock is its whole Unix seconds plus the offset, so it
    // reads BOUNDARY from this instant on.
    (server, UNIX_EPOCH + Duration::from_secs(now + LEAD))
}

/// Fails clearly if the writes meant to land before the rollover were
/// acknowledged after it: the test would then check nothing it claims to.
fn assert_still_before(rollover: SystemTime) {
    assert!(
        SystemTime::now() < rollover,
        "the writes before the boundary took more than {LEAD} s to be acknowledged: raise LEAD"
    );
}

/// How long a test may wait for the server to show the new period: the
/// lead, plus slack for a loaded machine.
fn rollover_timeout() -> Duration {
    Duration::from_secs(LEAD + 20)
}

async fn get(client: &mut Client, board: &str, player: &str, window: &str, period: i64) -> Option<i64> {
    let v = client
        .call::<Value>(
            Call::new(OpKind::Get)
                .with("board", board)
                .with("player", player)
                .with("window", window)
                .with("period", period),
        )
        .await
        .expect("get");
    v.as_i64()
}

async fn count(client: &mut Client, board: &str, window: &str, period: i64) -> u64 {
    client
        .call::<Value>(Call::new(OpKind::Count).with("board", board).with("window", window).with("period", period))
        .await
        .expect("count")
        .as_u64()
        .expect("count is a uint")
}

async fn create(client: &mut Client, board: &str, mode_windows: &[&str], keep: u64) {
    let windows: Vec<Value> = mode_windows.iter().map(|w| Value::from(*w)).collect();
    let created = client
        .call::<Value>(Call::new(OpKind::CreateBoard).with("board", board).with("windows", windows).with("keep", keep))
        .await
        .expect("create_board");
    assert_eq!(created, Value::from(true));
}

#[tokio::test]
async fn rollover_starts_new_periods_and_keeps_the_previous_ones() {
    let (server, rollover) = server_before_boundary();
    let mut client = server.client().await;
    create(&mut client, "season", &["all", "daily", "weekly", "monthly"], 2).await;
    // Before the boundary: totals with incr; one write updates every window.
    let calls = [set_call("season", "ann", 10, Mode::Incr), set_call("season", "bob", 7, Mode::Incr)];
    client.pipeline::<Value>(&calls).await.expect("writes");
    for window in ["all", "daily", "weekly", "monthly"] {
        assert_eq!(get(&mut client, "season", "ann", window, 0).await, Some(10), "{window} before rollover");
    }
    assert_still_before(rollover);

    // Polls until the server's clock has crossed the boundary (real time
    // passing is the thing under test): today's period is then empty and
    // yesterday's holds the two players.
    common::wait_for(rollover_timeout(), "the daily period to roll over", async || {
        match (count(&mut client, "season", "daily", 0).await, count(&mut client, "season", "daily", -1).await) {
            (0, 2) => Ok(()),
            seen => Err(format!("(today, yesterday) counts {seen:?}")),
        }
    })
    .await;
    client
        .pipeline::<Value>(&[set_call("season", "ann", 5, Mode::Incr), set_call("season", "cy", 1, Mode::Incr)])
        .await
        .expect("writes");
    // The all-time window keeps adding; each periodic window starts afresh.
    assert_eq!(get(&mut client, "season", "ann", "all", 0).await, Some(15));
    for window in ["daily", "weekly", "monthly"] {
        assert_eq!(get(&mut client, "season", "ann", window, 0).await, Some(5), "{window}: new period, new total");
        assert_eq!(get(&mut client, "season", "bob", window, 0).await, None, "{window}: bob not yet this period");
        assert_eq!(count(&mut client, "season", window, 0).await, 2);
        assert_eq!(get(&mut client, "season", "ann", window, -1).await, Some(10), "{window}: last period kept");
        assert_eq!(count(&mut client, "season", window, -1).await, 2);
        assert_eq!(count(&mut client, "season", window, -2).await, 0, "{window}: two periods back is empty");
    }
    assert_eq!(count(&mut client, "season", "all", 0).await, 3);
    // The board's first window is the default for reads.
    assert_eq!(client.get("season", "ann").await.unwrap(), Some(15));
    // Past periods rank too.
    let top = client
        .call::<Value>(Call::new(OpKind::Top).with("board", "season").with("window", "daily").with("period", -1))
        .await
        .expect("top of yesterday");
    assert_eq!(top.as_array().map(Vec::len), Some(2));
    assert_eq!(top[0]["player"].as_str(), Some("ann"));

    // Views a board cannot have are refused.
    for (window, period) in [("daily", -3), ("all", -1)] {
        let err = client
            .call::<Value>(
                Call::new(OpKind::Count).with("board", "season").with("window", window).with("period", period),
            )
            .await
            .expect_err("out of range");
        assert_eq!(err.code(), Some("bad_request"), "{window} {period}");
    }
    client.create_board("alltime", Order::Desc, Ties::Competition).await.unwrap();
    let err = client
        .call::<Value>(Call::new(OpKind::Get).with("board", "alltime").with("player", "x").with("window", "daily"))
        .await
        .expect_err("no such window");
    assert_eq!(err.code(), Some("bad_request"));
}

#[tokio::test]
async fn windows_survive_kill_9_across_a_rollover() {
    let (mut server, rollover) = server_before_boundary();
    let mut client = server.client().await;
    create(&mut client, "daily_best", &["daily", "all"], 1).await;
    client.set("daily_best", "ann", 50, Mode::Best).await.unwrap();
    client.set("daily_best", "ann", 40, Mode::Best).await.unwrap();
    assert_still_before(rollover);
    drop(client);
    let mut client = server.client().await;
    // Until the server's clock crosses the boundary, ann's 50 is today's.
    common::wait_for(rollover_timeout(), "the daily period to roll over", async || {
        match get(&mut client, "daily_best", "ann", "daily", 0).await {
            None => Ok(()),
            seen => Err(format!("ann's daily score {seen:?}")),
        }
    })
    .await;
    assert_eq!(client.set("daily_best", "ann", 30, Mode::Best).await.unwrap(), 30, "today's best starts afresh");
    drop(client);
    server.kill9();
    server.restart();
    let mut client = server.client().await;
    assert_eq!(get(&mut client, "daily_best", "ann", "daily", 0).await, Some(30));
    assert_eq!(get(&mut client, "daily_best", "ann", "daily", -1).await, Some(50));
    assert_eq!(get(&mut client, "daily_best", "ann", "all", 0).await, Some(50));
    let rank = client.rank("daily_best", "ann").await.unwrap().expect("ranked today");
    assert_eq!((rank.rank, rank.score, rank.count), (1, 30, 1));
}

/// Periods past `keep` are dropped (their trees forgotten, their keys then
/// deleted in steps) even while lone writes, staged on the I/O threads
/// between the shard's own steps, never stop: the drop needs a moment with
/// nothing staged and nothing in flight, which such writes never leave
/// unless they are held off for it. Without that, the drop was refused
/// ("needs the open batch committed first") second after second, and
/// went through only at a lucky moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_periods_are_dropped_while_lone_writes_never_stop() {
    // Written two days before the boundary, at noon.
    let written_at = common::offset_to(BOUNDARY - 2 * 86_400 + 43_200);
    let mut server = common::Server::start_capturing(1, &[common::CLOCK_OFFSET, &written_at], &[]);
    let mut client = server.client().await;
    create(&mut client, "d", &["all", "daily"], 1).await;
    let calls: Vec<Call> = (0..50).map(|i| set_call("d", &format!("p{i}"), i, Mode::Set)).collect();
    client.pipeline::<Value>(&calls).await.expect("writes");
    drop(client);
    assert!(server.terminate().success());
    // Back a day later, just before the boundary: that period is yesterday's
    // and kept; at the boundary it falls out of `keep`, with writers busy.
    server.restart_with_flag(common::CLOCK_OFFSET, &common::offset_to(BOUNDARY - LEAD as i64));
    let trees = |server: &common::Server| server.metric("rankd_shard_trees", &[r#"shard="0""#]);
    let writers = common::load::lone_writers(&server, 16, "busy").await;
    common::wait_until(Duration::from_secs(LEAD), "the writers' board", async || trees(&server) == 3.0).await;
    // Then `busy`'s tree and `d`'s all-time one only.
    let dropped =
        common::wait_for(Duration::from_secs(LEAD + 15), "the expired period dropped under load", async || {
            let held = trees(&server);
            if held == 2.0 {
                Ok(held)
            } else {
                Err(format!("{held} trees held"))
            }
        })
        .await;
    let (written, refused) = writers.stop().await;
    assert_eq!(refused, 0, "every write answered");
    assert!(written > 1_000, "the writers kept going: {written} writes");
    assert_eq!(dropped, 2.0);
    let mut client = server.client().await;
    assert_eq!(count(&mut client, "d", "all", 0).await, 50);
    drop(client);
    assert!(server.terminate().success());
    let logged = server.stderr_text();
    assert!(!logged.contains("deleting expired periods failed"), "the drop had to wait for a quiet moment:\n{logged}");
}
