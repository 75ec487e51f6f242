//! Power cuts, simulated: the data dir lives on `rankd-powercut`, a FUSE
//! layer that keeps every write since its file's last fsync, and every
//! directory change since its directory's last fsync, in a volatile state
//! it drops on a cut (kill -9 alone keeps the page cache, so it cannot
//! catch a missing fsync). Writers and a reader run while runs,
//! checkpoints, fjall flushes and compactions come often (test hooks) and
//! dropped boards are deleted in the background; the power is cut at a
//! random moment (all unsynced state dropped, or a random prefix of it
//! kept, or that with its last write torn), the server killed at that
//! instant, the layer powered on again, and then: `rankd check` passes, the
//! server starts, every acknowledged write is there (from every cycle so
//! far), each counter lies between its acknowledged and its sent
//! increments, and no write is torn: each shard's part of a `set_many`
//! (each spans the shards) is there whole or not at all. A `set_many` never
//! acknowledged may be on some shards and not others (each shard commits
//! on its own); resent with its `wid`, as a client retries, it is then
//! whole, every part applied exactly once. The first cut comes right after
//! the first acknowledged writes on a fresh data dir.
//!
//! `RANKD_POWER_CUTS` sets the number of cycles (default 20);
//! `scripts/power-cuts.sh N` runs N. Needs root, /dev/fuse and fuse3's
//! fusermount3 (scripts/test.sh installs it), and the `rankd-powercut`
//! binary (built by `cargo test --workspace`, or `cargo build -p
//! rankd-powercut`).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use powercut::CutMode;
use rand::{Rng, SeedableRng};
use rankd::request_path::router::shard_of;
use rankd_client::{set_call, Call, Client, Mode, OpKind};
use rmpv::Value;

/// Players per `set_many`: with 3 shards, each spans them all.
const GROUP: usize = 12;

/// Shards of the server.
const SHARDS: usize = 3;

/// The background work the cycles saw (from the metrics before each cut):
/// what the cuts may have landed in.
#[derive(Debug, Default)]
struct Background {
    /// Runs written.
    runs: f64,
    /// Checkpoints taken.
    checkpoints: f64,
    /// Cuts with a run still to be written (sealed, not yet in storage).
    runs_in_flight: u32,
    /// Cuts with sealed memtables waiting for fjall to flush them.
    flushes_waiting: u32,
    /// Time fjall spent compacting.
    compacting_seconds: f64,
}

#[derive(Default, Clone)]
struct Ledger {
    /// Groups acknowledged: (cycle, writer, group) → the score they got.
    acked: HashMap<(usize, usize, u64), i64>,
    /// Groups sent, acknowledged or not.
    sent: HashMap<(usize, usize, u64), i64>,
    /// counter → (acknowledged incrs, sent incrs).
    counters: HashMap<String, (u64, u64)>,
    /// Acknowledgments in the current cycle.
    acked_this_cycle: usize,
}

fn player(cycle: usize, writer: usize, group: u64, i: usize) -> String {
    format!("c{cycle}-w{writer}-g{group}-{i}")
}

/// A group's `set_many`, with the `wid` that makes its retry idempotent.
fn group_call(key: (usize, usize, u64), score: i64) -> Call {
    let (cycle, writer, group) = key;
    let entries: Vec<Value> =
        (0..GROUP).map(|i| Value::Array(vec![player(cycle, writer, group, i).into(), score.into()])).collect();
    Call::new(OpKind::SetMany)
        .with("board", "cut")
        .with("entries", Value::Array(entries))
        .with("wid", format!("c{cycle}-w{writer}-g{group}"))
}

/// Writes `set_many` groups and a counter increment per pipeline until
/// the connection dies.
async fn writer(addr: String, cycle: usize, id: usize, ledger: Arc<Mutex<Ledger>>) {
    let Ok(mut client) = Client::connect(&addr).await else { return };
    let mut rng = rand::rngs::StdRng::seed_from_u64((cycle * 8 + id) as u64);
    let counter = format!("counter-{id}");
    for group in 0u64.. {
        let score = rng.gen_range(-1_000_000..1_000_000);
        let calls = [group_call((cycle, id, group), score), set_call("cut", &counter, 1, Mode::Incr)];
        {
            let mut ledger = ledger.lock();
            ledger.sent.insert((cycle, id, group), score);
            ledger.counters.entry(counter.clone()).or_default().1 += 1;
        }
        let Ok(replies) = client.pipeline::<Value>(&calls).await else { break };
        let mut ledger = ledger.lock();
        if replies[0].is_ok() {
            ledger.acked.insert((cycle, id, group), score);
            ledger.acked_this_cycle += 1;
        }
        if replies[1].is_ok() {
            ledger.counters.entry(counter.clone()).or_default().0 += 1;
        }
        if replies.iter().any(Result::is_err) {
            break; // the storage failed under it: the power is out
        }
    }
}

/// Creates, fills and drops a board over and over, so the deletion of
/// dropped boards runs in the background when the power goes.
async fn dropper(addr: String, cycle: usize) {
    let Ok(mut client) = Client::connect(&addr).await else { return };
    for round in 0.. {
        let board = format!("tmp-{cycle}-{round}");
        let entries: Vec<(String, i64)> = (0..200).map(|i| (format!("t{i}"), i)).collect();
        let entries: Vec<(&str, i64)> = entries.iter().map(|(p, s)| (p.as_str(), *s)).collect();
        if client.set_many(&board, &entries, Mode::Set).await.is_err() || client.drop_board(&board).await.is_err() {
            return;
        }
    }
}

/// Reads while the others write: never an error but the connection's.
async fn reader(addr: String) {
    let Ok(mut client) = Client::connect(&addr).await else { return };
    loop {
        let calls = [
            Call::new(OpKind::Count).with("board", "cut"),
            Call::new(OpKind::Top).with("board", "cut").with("limit", 20),
        ];
        let Ok(replies) = client.pipeline::<Value>(&calls).await else { return };
        for reply in replies {
            // After the cut, a read may meet the failing storage: `internal`.
            if let Err(e) = reply {
                assert!(matches!(e.code(), None | Some("internal")), "a read failed with {e}");
            }
        }
    }
}

/// Every acknowledged group is whole with its score, every shard's part
/// of every group whole or absent; every counter between acknowledged and
/// sent. Returns the acknowledged groups checked and the groups sent but
/// never acknowledged that are there in part or not at all.
async fn verify(client: &mut Client, ledger: &Ledger, cycle: usize) -> (usize, Vec<(usize, usize, u64)>) {
    let (mut checked, mut unfinished) = (0, Vec::new());
    let groups: Vec<_> = ledger.sent.iter().collect();
    for chunk in groups.chunks(40) {
        let calls: Vec<Call> = chunk
            .iter()
            .flat_map(|((c, w, g), _)| {
                (0..GROUP)
                    .map(move |i| Call::new(OpKind::Get).with("board", "cut").with("player", player(*c, *w, *g, i)))
            })
            .collect();
        let replies = client.pipeline::<Value>(&calls).await.expect("reads after the restart");
        for ((key, score), got) in chunk.iter().zip(replies.chunks(GROUP)) {
            let (c, w, g) = **key;
            // Per shard: players of the group present with its score, and absent.
            let mut parts = [(0, 0); SHARDS];
            for (i, reply) in got.iter().enumerate() {
                let reply = reply.as_ref().unwrap_or_else(|e| panic!("cycle {cycle}: get: {e}"));
                let part = &mut parts[shard_of(&player(c, w, g, i), SHARDS)];
                match reply.as_i64() {
                    Some(found) if found == **score => part.0 += 1,
                    None if reply.is_nil() => part.1 += 1,
                    other => panic!("cycle {cycle}: a player of group {key:?} holds {other:?}, not its score {score}"),
                }
            }
            for (shard, (present, absent)) in parts.iter().enumerate() {
                assert!(
                    *present == 0 || *absent == 0,
                    "cycle {cycle}: group {key:?}'s part on shard {shard} is torn: {present} present, {absent} absent"
                );
            }
            let present: usize = parts.iter().map(|part| part.0).sum();
            if ledger.acked.contains_key(key) {
                assert_eq!(present, GROUP, "cycle {cycle}: acknowledged group {key:?} lost");
                checked += 1;
            } else if present < GROUP {
                unfinished.push(**key);
            }
        }
    }
    for (counter, (acked, sent)) in &ledger.counters {
        let value = client.get("cut", counter).await.expect("get").unwrap_or(0) as u64;
        assert!((*acked..=*sent).contains(&value), "cycle {cycle}: {counter} = {value}, acked {acked}, sent {sent}");
    }
    (checked, unfinished)
}

/// Resends each unfinished group with its `wid`, as a retrying client
/// would: each must then be whole (parts applied before the cut are
/// replayed, not applied again), and counts as acknowledged from now on.
async fn finish(client: &mut Client, ledger: &Arc<Mutex<Ledger>>, unfinished: &[(usize, usize, u64)], cycle: usize) {
    for key in unfinished {
        let score = ledger.lock().sent[key];
        let stored: Vec<i64> = client.call(group_call(*key, score)).await.expect("resend with its wid");
        assert_eq!(stored, vec![score; GROUP], "cycle {cycle}: group {key:?} resent");
        let (c, w, g) = *key;
        for i in 0..GROUP {
            let got = client.get("cut", &player(c, w, g, i)).await.expect("get");
            assert_eq!(got, Some(score), "cycle {cycle}: group {key:?} resent with its wid is still not whole");
        }
        ledger.lock().acked.insert(*key, score);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_power_cuts() {
    let cycles: usize = std::env::var("RANKD_POWER_CUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let disk = common::power::PowerDisk::mount();
    let (layer, data_dir) = (&disk.layer, disk.path("data"));
    let mut server = common::Server::start_in(&data_dir, SHARDS, &common::power::BUSY_BACKGROUND);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(37);
    let (mut checked_total, mut dropped_total) = (0, 0u64);
    let mut background = Background::default();
    for cycle in 0..cycles {
        ledger.lock().acked_this_cycle = 0;
        let mut tasks: Vec<_> =
            (0..3).map(|id| tokio::spawn(writer(server.addr.clone(), cycle, id, ledger.clone()))).collect();
        tasks.push(tokio::spawn(reader(server.addr.clone())));
        tasks.push(tokio::spawn(dropper(server.addr.clone(), cycle)));
        common::wait_until(Duration::from_secs(60), &format!("cycle {cycle}'s first acknowledged write"), async || {
            ledger.lock().acked_this_cycle > 0
        })
        .await;
        // The first cut comes at once: a fresh data dir's first writes.
        let delay = if cycle == 0 { 0 } else { rng.gen_range(0..600) };
        tokio::time::sleep(Duration::from_millis(delay)).await;
        let mode = [CutMode::All, CutMode::Prefix, CutMode::Torn][cycle % 3];
        // What the background was doing, just before the cut.
        let metrics = server.metrics_text();
        let now = |name: &str| common::sample(&metrics, name, &[]).unwrap_or(0.0);
        background.runs += now("rankd_shard_run_seconds_count");
        background.checkpoints += now("rankd_shard_checkpoints_total");
        background.runs_in_flight += u32::from(now("rankd_shard_unwritten_runs") > 0.0);
        background.flushes_waiting += u32::from(now("rankd_shard_sealed_memtables") > 0.0);
        background.compacting_seconds += now("rankd_shard_compaction_seconds_total");
        let cut = layer.cut_with(mode).expect("cut the power");
        server.kill9();
        layer.resume().expect("power on");
        for task in tasks {
            task.await.expect("client task");
        }
        dropped_total += cut.bytes_dropped;
        common::rankd_check(&data_dir, &format!("after power cut {cycle}"));
        server.restart();
        let mut client = server.client().await;
        // Everything acknowledged in any cycle so far, not only this one's.
        let snapshot = ledger.lock().clone();
        let (checked, unfinished) = verify(&mut client, &snapshot, cycle).await;
        finish(&mut client, &ledger, &unfinished, cycle).await;
        checked_total += checked;
        eprintln!(
            "cycle {cycle}: cut {mode:?} dropped {} bytes of {} files; {checked} acknowledged groups checked, {} unacknowledged ones finished by their wid",
            cut.bytes_dropped, cut.files_reverted, unfinished.len()
        );
    }
    eprintln!(
        "{cycles} power cuts; {checked_total} acknowledged-group checks ({GROUP} writes each); {dropped_total} unsynced bytes dropped; lost: 0"
    );
    eprintln!("background work over the cycles: {background:?}");
}

/// A backup is durable once `rankd backup` returns: written onto the
/// layer, then the power cut, the copy still opens whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_backup_survives_a_power_cut() {
    let disk = common::power::PowerDisk::mount();
    let layer = &disk.layer;
    let server = common::Server::start_with(2, &common::power::BUSY_BACKGROUND);
    let mut client = server.client().await;
    fill(&mut client, "kept", (0..3000).map(|i| format!("p{i}")).map(|p| (p.clone(), p.len() as i64))).await;
    let copy = disk.path("copy");
    let out = backup(&server, &copy).output().expect("run rankd backup");
    assert!(out.status.success(), "rankd backup: {}", String::from_utf8_lossy(&out.stderr));
    let cut = layer.cut().expect("cut the power");
    layer.resume().expect("power on");
    common::rankd_check(&copy, "on a backup after a power cut");
    let restored = common::Server::start_in(&copy, 2, &[]);
    let mut client = restored.client().await;
    assert_eq!(client.count("kept").await.expect("count"), 3000, "after a cut that dropped {cut:?}");
    assert_eq!(client.get("kept", "p2999").await.expect("get"), Some(5));
}

/// A backup the power cut short never passes for a whole one: `rankd
/// check` refuses the copy, and so does `rankd serve` once anything of it
/// is on disk (an empty copy is only an empty dir, which serve would take
/// as a new data dir, as on any first start); or the cut came after the
/// backup finished, and the copy holds every player. On this layer a cut
/// short backup leaves nothing: its shards' directory names become durable
/// with the layout file, written last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_cut_short_by_the_power_is_refused_not_opened_in_part() {
    const PLAYERS: usize = 100_000;
    let disk = common::power::PowerDisk::mount();
    let server = common::Server::start(2);
    let mut client = server.client().await;
    fill(&mut client, "kept", (0..PLAYERS).map(|i| (format!("p{i}"), i as i64))).await;
    // How long a whole backup takes on the layer, so that cuts land in one.
    let started = std::time::Instant::now();
    assert!(backup(&server, &disk.path("whole")).status().expect("run rankd backup").success());
    let whole = started.elapsed();
    let (mut refused, mut finished, mut empty) = (0, 0, 0);
    for attempt in 0..8 {
        let copy = disk.path(&format!("copy-{attempt}"));
        if attempt % 2 == 1 {
            // An empty dir made ready beforehand (e.g. a mount), durable.
            std::fs::create_dir(&copy).expect("the copy's dir");
            disk.layer.sync_all().expect("sync");
        }
        let running = common::Running(backup(&server, &copy).spawn().expect("run rankd backup"));
        std::thread::sleep(whole.mul_f64(attempt as f64 / 7.0));
        let mode = [CutMode::All, CutMode::Prefix, CutMode::Torn][attempt % 3];
        disk.layer.cut_with(mode).expect("cut the power");
        drop(running);
        disk.layer.resume().expect("power on");
        let checked = std::process::Command::new(env!("CARGO_BIN_EXE_rankd"))
            .args(["check", "--data-dir"])
            .arg(&copy)
            .env("RANKD_LOG", "error")
            .output()
            .expect("run rankd check");
        if checked.status.success() {
            let restored = common::Server::start_in(&copy, 2, &[]);
            let mut client = restored.client().await;
            assert_eq!(client.count("kept").await.expect("count"), PLAYERS as u64, "copy {attempt} passed the check");
            finished += 1;
            continue;
        }
        let stored = walkdir_files(&copy);
        if stored == 0 {
            empty += 1;
            continue;
        }
        match common::Server::try_start_in(&copy, 2, &[]) {
            Ok(mut opened) => {
                let count = opened.client().await.count("kept").await.expect("count");
                opened.kill9();
                panic!(
                    "copy {attempt}, cut short with {stored} files on disk, opened with {count} of {PLAYERS} players"
                );
            }
            Err(_) => refused += 1,
        }
    }
    eprintln!("8 backups cut by the power: {refused} refused, {finished} finished whole, {empty} left nothing on disk");
    assert!(refused + empty > 0, "no cut landed inside a backup: the test checked nothing it claims to");
}

/// Writes `players`, each with its score, to `board`, 10 000 to a `set_many`.
async fn fill(client: &mut Client, board: &str, players: impl Iterator<Item = (String, i64)>) {
    let players: Vec<(String, i64)> = players.collect();
    for chunk in players.chunks(10_000) {
        let entries: Vec<(&str, i64)> = chunk.iter().map(|(p, s)| (p.as_str(), *s)).collect();
        client.set_many(board, &entries, Mode::Set).await.expect("set_many");
    }
}

/// `rankd backup` of `server` into `to`, without its spinner.
fn backup(server: &common::Server, to: &std::path::Path) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rankd"));
    command.args(["backup", "-q", "--server", &server.addr, "--to"]).arg(to);
    command
}

/// Files under `dir`, at any depth (0 if it does not exist).
fn walkdir_files(dir: &std::path::Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries.flatten().map(|entry| if entry.path().is_dir() { walkdir_files(&entry.path()) } else { 1 }).sum()
}

/// A big board dropped, its name reused at once, then the power cut while
/// its keys are being deleted (their tombstones are not fsynced): after
/// each cut the old players never answer again, not even after the
/// restarted server has finished the deletion and been restarted once
/// more, and the board that took the name, and another board, keep every
/// acknowledged player.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_board_stays_dropped_across_power_cuts_in_its_deletion() {
    const BIG: usize = 100_000;
    let disk = common::power::PowerDisk::mount();
    let data_dir = disk.path("data");
    let mut server = common::Server::start_in(&data_dir, 2, &common::power::BUSY_BACKGROUND);
    let mut client = server.client().await;
    fill(&mut client, "kept", (0..1000).map(|i| (format!("k{i}"), i))).await;
    let deleting = |server: &common::Server| server.counter("rankd_shard_trees_being_deleted", &[]);
    let mut rng = rand::rngs::StdRng::seed_from_u64(47);
    for (round, mode) in [CutMode::All, CutMode::Torn].into_iter().enumerate() {
        let mut client = server.client().await;
        fill(&mut client, "big", (0..BIG).map(|i| (format!("old{round}-{i}"), 1))).await;
        assert!(client.drop_board("big").await.expect("drop_board"));
        fill(&mut client, "big", (0..10).map(|i| (format!("new{round}-{i}"), i))).await;
        common::wait_until(Duration::from_secs(30), "the dropped board's keys being deleted", async || {
            deleting(&server) > 0.0
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..3000))).await;
        let still_deleting = deleting(&server);
        let cut = disk.layer.cut_with(mode).expect("cut the power");
        server.kill9();
        disk.layer.resume().expect("power on");
        common::rankd_check(&data_dir, &format!("after the cut of round {round}"));
        for restart in ["after the cut", "after the deletion and one more restart"] {
            server.restart();
            let mut client = server.client().await;
            let at = format!("round {round}, {restart}");
            assert_eq!(client.count("big").await.expect("count"), 10, "{at}: the old players came back");
            assert_eq!(client.get("big", &format!("old{round}-{}", BIG / 2)).await.expect("get"), None, "{at}");
            assert_eq!(client.get("big", &format!("new{round}-9")).await.expect("get"), Some(9), "{at}");
            assert_eq!(client.count("kept").await.expect("count"), 1000, "{at}");
            common::wait_until(Duration::from_secs(120), "the deletion finished", async || deleting(&server) == 0.0)
                .await;
            server.kill9();
        }
        server.restart();
        // The next round reuses the name once more.
        assert!(server.client().await.drop_board("big").await.expect("drop_board"));
        eprintln!(
            "round {round}: cut {mode:?} with {still_deleting} trees being deleted dropped {} bytes",
            cut.bytes_dropped
        );
    }
    drop(client);
}
