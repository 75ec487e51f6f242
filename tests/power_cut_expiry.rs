//! Power cuts while periods expire (see `tests/power_cut.rs` for the
//! layer). A board keeps its all-time window and a daily one with one past
//! period. Each cycle starts the server with its clock two seconds before a
//! day's boundary, two days later than the cycle before, so the last
//! cycle's writes expire: those before its boundary at start-up, those
//! after it at this cycle's boundary, with writers busy. The power is cut
//! at a random moment around the boundary, so cuts land in those drops and
//! in the writes around them. After each cut: `rankd check` passes, every
//! acknowledged write is in the all-time window, each write of this cycle
//! is in the daily period its time says (or, sent across the boundary, in
//! one of the two), no earlier write is in either, and each period's count
//! is what was found in it: an expired period never comes back. A second
//! board gets 60 000 players a cycle, so that deleting its expired periods
//! takes a few seconds, and cuts land in that deletion too.
//!
//! `RANKD_POWER_CUTS` sets the number of cycles (default 8).

mod common;

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use powercut::CutMode;
use rand::{Rng, SeedableRng};
use rankd_client::{set_call, Call, Client, Mode, OpKind};
use rmpv::Value;

const SHARDS: usize = 3;

/// A UTC midnight; cycle `k` crosses the one `2k` days after it.
const BOUNDARY: i64 = 1_780_272_000;

const DAY: i64 = 86_400;

const BOARD: &str = "days";

/// A board of many players written at each start, so that deleting its
/// expired period takes several of the shards' once-a-second steps.
const BULK: &str = "bulk";

/// Players written to [`BULK`] each cycle.
const BULK_PLAYERS: usize = 60_000;

/// One `set` of a player of its own.
#[derive(Debug, Clone)]
struct Write {
    cycle: usize,
    player: String,
    score: i64,
    /// Real times, Unix seconds (the server's clock is real time plus an
    /// offset, so the boundary is a real instant too).
    sent_at: f64,
    acked_at: Option<f64>,
}

/// The daily period a write landed in, as far as its times tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Day {
    /// Acknowledged before its cycle's boundary.
    Before,
    /// Sent after it.
    After,
    /// In flight across it.
    Either,
}

impl Write {
    fn day(&self, boundary: f64) -> Day {
        match self.acked_at {
            Some(acked) if acked < boundary => Day::Before,
            _ if self.sent_at >= boundary => Day::After,
            _ => Day::Either,
        }
    }
}

fn unix_now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

#[derive(Default)]
struct Ledger {
    writes: Vec<Write>,
    acked_this_cycle: usize,
}

/// Pipelines `set`s of new players until the connection dies.
async fn writer(addr: String, cycle: usize, id: usize, ledger: Arc<Mutex<Ledger>>) {
    let Ok(mut client) = Client::connect(&addr).await else { return };
    for batch in 0i64.. {
        let sent_at = unix_now();
        let writes: Vec<Write> = (0..4)
            .map(|i| Write {
                cycle,
                player: format!("c{cycle}-w{id}-{batch}-{i}"),
                score: batch * 4 + i,
                sent_at,
                acked_at: None,
            })
            .collect();
        let first = {
            let mut ledger = ledger.lock();
            ledger.writes.extend(writes.iter().cloned());
            ledger.writes.len() - writes.len()
        };
        let calls: Vec<Call> = writes.iter().map(|w| set_call(BOARD, &w.player, w.score, Mode::Set)).collect();
        let Ok(replies) = client.pipeline::<Value>(&calls).await else { break };
        let acked_at = unix_now();
        {
            let mut ledger = ledger.lock();
            for (i, reply) in replies.iter().enumerate() {
                if reply.is_ok() {
                    ledger.writes[first + i].acked_at = Some(acked_at);
                    ledger.acked_this_cycle += 1;
                }
            }
        }
        if replies.iter().any(Result::is_err) {
            break; // the power is out
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Each write's score in the all-time window and in daily periods 0 and -1.
async fn scores(client: &mut Client, writes: &[Write]) -> Vec<[Option<i64>; 3]> {
    let mut found = Vec::with_capacity(writes.len());
    for chunk in writes.chunks(100) {
        let calls: Vec<Call> = chunk
            .iter()
            .flat_map(|w| {
                let get = Call::new(OpKind::Get).with("board", BOARD).with("player", &w.player);
                [
                    get.clone().with("window", "all"),
                    get.clone().with("window", "daily"),
                    get.with("window", "daily").with("period", -1),
                ]
            })
            .collect();
        let replies = client.pipeline::<Option<i64>>(&calls).await.expect("reads after the restart");
        for three in replies.chunks(3) {
            found.push([0, 1, 2].map(|i| three[i].as_ref().cloned().expect("get")));
        }
    }
    found
}

async fn count(client: &mut Client, board: &str, window: &str, period: i64) -> usize {
    let call = Call::new(OpKind::Count).with("board", board).with("window", window).with("period", period);
    client.call::<u64>(call).await.expect("count") as usize
}

/// Checks where `writes` (this cycle's and the last one's) are, with the
/// server's clock past cycle `cycle`'s boundary (`boundaries[cycle]`);
/// `settled` older players are in the all-time window too. Returns how
/// many of the last cycle's writes are.
async fn verify(client: &mut Client, writes: &[Write], boundaries: &[f64], cycle: usize, settled: usize) -> usize {
    let found = scores(client, writes).await;
    let (mut in_all, mut in_today, mut in_yesterday, mut last_cycle_in_all) = (0, 0, 0, 0);
    for (write, &[all, today, yesterday]) in writes.iter().zip(&found) {
        let at = format!("cycle {cycle}: {write:?}");
        assert!(all.is_none() || all == Some(write.score), "{at}: all-time score {all:?}");
        if write.acked_at.is_some() {
            assert_eq!(all, Some(write.score), "{at}: acknowledged, missing from the all-time window");
        }
        for daily in [today, yesterday] {
            assert!(daily.is_none() || (daily == Some(write.score) && all.is_some()), "{at}: daily {daily:?}");
        }
        let (today, yesterday) = (today.is_some(), yesterday.is_some());
        let acked = write.acked_at.is_some();
        let day = write.day(boundaries[write.cycle]);
        // This cycle's writes: yesterday's period before the boundary,
        // today's after; earlier cycles' periods have all expired.
        let (may_today, may_yesterday, must) = match (write.cycle == cycle, day) {
            (true, Day::Before) => (false, true, acked),
            (true, Day::After) => (true, false, acked),
            (true, Day::Either) => (true, true, acked),
            (false, _) => (false, false, false),
        };
        assert!(may_today || !today, "{at} ({day:?}): in today's period");
        assert!(may_yesterday || !yesterday, "{at} ({day:?}): in yesterday's period");
        assert!(!(today && yesterday), "{at}: in both daily periods");
        assert!(!must || today || yesterday, "{at} ({day:?}): acknowledged, missing from its daily period");
        in_all += usize::from(all.is_some());
        last_cycle_in_all += usize::from(all.is_some() && write.cycle < cycle);
        in_today += usize::from(today);
        in_yesterday += usize::from(yesterday);
    }
    // Nothing else: no expired period's players come back.
    assert_eq!(count(client, BOARD, "all", 0).await, in_all + settled, "cycle {cycle}: all-time count");
    assert_eq!(count(client, BOARD, "daily", 0).await, in_today, "cycle {cycle}: today's count");
    assert_eq!(count(client, BOARD, "daily", -1).await, in_yesterday, "cycle {cycle}: yesterday's count");
    last_cycle_in_all
}

/// Writes this cycle's players to [`BULK`], in `set_many`s of 10 000.
async fn write_bulk(client: &mut Client, cycle: usize) {
    let calls: Vec<Call> = (0..BULK_PLAYERS / 10_000)
        .map(|chunk| {
            let entries: Vec<(String, i64)> =
                (0..10_000).map(|i| (format!("c{cycle}-{chunk}-{i}"), i as i64)).collect();
            Call::new(OpKind::SetMany).with("board", BULK).with("entries", entries)
        })
        .collect();
    for reply in client.pipeline::<Value>(&calls).await.expect("bulk writes") {
        reply.expect("a bulk set_many");
    }
}

/// The bulk board after cycle `cycle`'s boundary: every cycle's players in
/// the all-time window, this cycle's in one of the two daily periods.
async fn verify_bulk(client: &mut Client, cycle: usize) {
    let (all, today, yesterday) = (
        count(client, BULK, "all", 0).await,
        count(client, BULK, "daily", 0).await,
        count(client, BULK, "daily", -1).await,
    );
    assert_eq!(all, BULK_PLAYERS * (cycle + 1), "cycle {cycle}: the bulk board's all-time count");
    assert_eq!(
        today + yesterday,
        BULK_PLAYERS,
        "cycle {cycle}: the bulk board's daily periods hold {today} + {yesterday}"
    );
}

/// The clock offset that puts the server two to three seconds before
/// `boundary`, and the real instant its clock crosses it.
fn offset_before(boundary: i64) -> (String, f64) {
    let now = unix_now() as i64;
    let offset = boundary - (now + 2);
    (offset.to_string(), (boundary - offset) as f64)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiring_periods_survive_power_cuts() {
    let cycles: usize = std::env::var("RANKD_POWER_CUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let disk = common::power::PowerDisk::mount();
    let data_dir = disk.path("data");
    let (offset, first_boundary) = offset_before(BOUNDARY);
    let flags: Vec<&str> =
        common::power::BUSY_BACKGROUND.iter().copied().chain([common::CLOCK_OFFSET, offset.as_str()]).collect();
    let mut server = common::Server::start_in(&data_dir, SHARDS, &flags);
    for board in [BOARD, BULK] {
        let create =
            Call::new(OpKind::CreateBoard).with("board", board).with("windows", ["all", "daily"]).with("keep", 1);
        assert!(server.client().await.call::<bool>(create).await.expect("create_board"));
    }
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut boundaries = vec![first_boundary];
    let mut rng = rand::rngs::StdRng::seed_from_u64(43);
    // Cuts that came while an expired period's keys were being deleted.
    let mut cuts_while_deleting = 0;
    // Players of cycles before the last, checked and left out of the ledger.
    let mut settled = 0;
    for cycle in 0..cycles {
        if cycle > 0 {
            server.kill9();
            let (offset, boundary) = offset_before(BOUNDARY + 2 * cycle as i64 * DAY);
            server.restart_with_flag(common::CLOCK_OFFSET, &offset);
            boundaries.push(boundary);
        }
        let boundary = boundaries[cycle];
        write_bulk(&mut server.client().await, cycle).await;
        ledger.lock().acked_this_cycle = 0;
        let tasks: Vec<_> =
            (0..3).map(|id| tokio::spawn(writer(server.addr.clone(), cycle, id, ledger.clone()))).collect();
        // The cut: up to a second before the boundary, or up to 1.5 s after
        // (later if the first write took longer).
        let cut_at = boundary + rng.gen_range(-1.0..1.5);
        common::wait_until(Duration::from_secs(60), &format!("cycle {cycle}'s first acknowledged write"), async || {
            ledger.lock().acked_this_cycle > 0
        })
        .await;
        tokio::time::sleep(Duration::from_secs_f64((cut_at - unix_now()).max(0.0))).await;
        let mode = [CutMode::All, CutMode::Prefix, CutMode::Torn][cycle % 3];
        let deleting = server.counter("rankd_shard_trees_being_deleted", &[]);
        cuts_while_deleting += usize::from(deleting > 0.0);
        let cut_time = unix_now();
        let cut = disk.layer.cut_with(mode).expect("cut the power");
        server.kill9();
        disk.layer.resume().expect("power on");
        for task in tasks {
            task.await.expect("writer task");
        }
        common::rankd_check(&data_dir, &format!("after power cut {cycle}"));
        server.restart();
        // Past the boundary, so the periods read are known.
        tokio::time::sleep(Duration::from_secs_f64((boundary + 1.0 - unix_now()).max(0.0))).await;
        let mut client = server.client().await;
        let writes = ledger.lock().writes.clone();
        settled += verify(&mut client, &writes, &boundaries, cycle, settled).await;
        ledger.lock().writes.retain(|write| write.cycle == cycle);
        verify_bulk(&mut client, cycle).await;
        eprintln!(
            "cycle {cycle}: cut {mode:?} {:+.2} s from the boundary{} dropped {} bytes; {} writes of this cycle and the last checked",
            cut_time - boundary,
            if deleting > 0.0 { ", keys of expired periods being deleted," } else { "" },
            cut.bytes_dropped,
            writes.len()
        );
    }
    eprintln!("{cycles} power cuts, {cuts_while_deleting} of them while expired periods were being deleted");
}
