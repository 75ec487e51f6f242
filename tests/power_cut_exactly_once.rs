//! Exactly once across power cuts (see `tests/power_cut.rs` for the
//! layer): writers pipeline `incr`s that carry a `wid`, lone and in
//! `set_many`s spanning the shards, while runs and checkpoints come often;
//! the power is cut at a random moment and, every other cycle, cut again
//! while the server recovers from the first cut. Then every counter lies
//! between its acknowledged and its sent increments; every request never
//! acknowledged is resent with its `wid`, as a retrying client does, after
//! which every counter equals the sum of all increments ever sent: none
//! lost, none applied twice. Acknowledged requests resent come back `dup`
//! and change nothing. protocol.md: "Exactly once holds across crashes".
//!
//! `RANKD_POWER_CUTS` sets the number of cycles (default 12).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use powercut::CutMode;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rankd::request_path::router::shard_of;
use rankd_client::{set_call, Call, Client, Mode, OpKind};
use rmpv::Value;

const SHARDS: usize = 3;

/// Counters the writers share: few, so each takes many increments.
const COUNTERS: usize = 24;

/// Requests per writer's pipeline.
const PIPELINE: usize = 4;

const BOARD: &str = "exact";

fn counter(i: usize) -> String {
    format!("k{i}")
}

/// One write: a lone `incr`, or a `set_many` incr of several counters.
#[derive(Debug, Clone)]
struct Request {
    wid: String,
    /// (counter, amount); more than one: a `set_many`.
    increments: Vec<(usize, i64)>,
}

impl Request {
    fn call(&self) -> Call {
        let call = match self.increments[..] {
            [(c, amount)] => set_call(BOARD, &counter(c), amount, Mode::Incr),
            _ => {
                let entries: Vec<(String, i64)> = self.increments.iter().map(|&(c, a)| (counter(c), a)).collect();
                Call::new(OpKind::SetMany).with("board", BOARD).with("entries", entries).with("mode", Mode::Incr)
            }
        };
        call.with("wid", &self.wid)
    }
}

#[derive(Default)]
struct Ledger {
    /// Every request sent, with whether it was acknowledged.
    requests: Vec<(Request, bool)>,
    /// Acknowledgments in the current cycle.
    acked_this_cycle: usize,
}

impl Ledger {
    /// Per counter: (acknowledged increments, sent increments).
    fn bounds(&self) -> Vec<(i64, i64)> {
        let mut bounds = vec![(0, 0); COUNTERS];
        for (request, acked) in &self.requests {
            for &(c, amount) in &request.increments {
                bounds[c].1 += amount;
                if *acked {
                    bounds[c].0 += amount;
                }
            }
        }
        bounds
    }
}

/// A `set_many` whose counters span every shard.
fn spanning_counters(rng: &mut impl Rng) -> Vec<usize> {
    let mut by_shard: HashMap<usize, Vec<usize>> = HashMap::new();
    for c in 0..COUNTERS {
        by_shard.entry(shard_of(&counter(c), SHARDS)).or_default().push(c);
    }
    assert_eq!(by_shard.len(), SHARDS, "every shard holds a counter");
    by_shard.values().map(|counters| *counters.choose(rng).expect("a counter")).collect()
}

/// Pipelines requests until the connection dies, each recorded as sent
/// before it goes out and as acknowledged when its reply says ok.
async fn writer(addr: String, cycle: usize, id: usize, ledger: Arc<Mutex<Ledger>>) {
    let Ok(mut client) = Client::connect(&addr).await else { return };
    let mut rng = rand::rngs::StdRng::seed_from_u64((cycle * 8 + id) as u64);
    for batch in 0u64.. {
        let requests: Vec<Request> = (0..PIPELINE)
            .map(|i| {
                let increments = if i == 0 {
                    spanning_counters(&mut rng).into_iter().map(|c| (c, rng.gen_range(1..100))).collect()
                } else {
                    vec![(rng.gen_range(0..COUNTERS), rng.gen_range(1..100))]
                };
                Request { wid: format!("c{cycle}-w{id}-b{batch}-{i}"), increments }
            })
            .collect();
        let first = {
            let mut ledger = ledger.lock();
            ledger.requests.extend(requests.iter().map(|r| (r.clone(), false)));
            ledger.requests.len() - requests.len()
        };
        let calls: Vec<Call> = requests.iter().map(Request::call).collect();
        let Ok(replies) = client.pipeline::<Value>(&calls).await else { break };
        let mut ledger = ledger.lock();
        for (i, reply) in replies.iter().enumerate() {
            if reply.is_ok() {
                ledger.requests[first + i].1 = true;
                ledger.acked_this_cycle += 1;
            }
        }
        if replies.iter().any(Result::is_err) {
            break; // the storage failed under it: the power is out
        }
    }
}

async fn counters(client: &mut Client) -> Vec<i64> {
    let calls: Vec<Call> =
        (0..COUNTERS).map(|c| Call::new(OpKind::Get).with("board", BOARD).with("player", counter(c))).collect();
    let replies = client.pipeline::<Option<i64>>(&calls).await.expect("read the counters");
    replies.into_iter().map(|r| r.expect("get").unwrap_or(0)).collect()
}

/// Resends every unacknowledged request with its `wid`, and a few of this
/// cycle's acknowledged ones (from index `first_of_cycle` on), which must
/// come back `dup`.
async fn retry(client: &mut Client, ledger: &Mutex<Ledger>, first_of_cycle: usize, cycle: usize, rng: &mut impl Rng) {
    let (unacked, mut acked_now): (Vec<usize>, Vec<usize>) = {
        let ledger = ledger.lock();
        (0..ledger.requests.len()).partition(|&i| !ledger.requests[i].1)
    };
    acked_now.retain(|&i| i >= first_of_cycle);
    acked_now.shuffle(rng);
    for &i in &unacked {
        let request = ledger.lock().requests[i].0.clone();
        client.call::<Value>(request.call()).await.unwrap_or_else(|e| panic!("cycle {cycle}: resend {request:?}: {e}"));
        ledger.lock().requests[i].1 = true;
    }
    for &i in acked_now.iter().take(20) {
        let request = ledger.lock().requests[i].0.clone();
        let written = client.call_written::<Value>(request.call()).await.expect("resend an acknowledged request");
        assert!(written.dup, "cycle {cycle}: {request:?} was acknowledged, yet its resend was not a dup");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn increments_with_a_wid_apply_exactly_once_across_power_cuts() {
    let cycles: usize = std::env::var("RANKD_POWER_CUTS").ok().and_then(|v| v.parse().ok()).unwrap_or(12);
    let disk = common::power::PowerDisk::mount();
    let data_dir = disk.path("data");
    let mut server = common::Server::start_in(&data_dir, SHARDS, &common::power::BUSY_BACKGROUND);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(41);
    // How long a restart takes, so a cut during one lands inside it.
    let mut start_up = Duration::from_millis(100);
    let mut recovery_cuts = 0;
    for cycle in 0..cycles {
        ledger.lock().acked_this_cycle = 0;
        let first_of_cycle = ledger.lock().requests.len();
        let tasks: Vec<_> =
            (0..3).map(|id| tokio::spawn(writer(server.addr.clone(), cycle, id, ledger.clone()))).collect();
        common::wait_until(Duration::from_secs(60), &format!("cycle {cycle}'s first acknowledged write"), async || {
            ledger.lock().acked_this_cycle > 0
        })
        .await;
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..500))).await;
        let mode = [CutMode::All, CutMode::Prefix, CutMode::Torn][cycle % 3];
        let cut = disk.layer.cut_with(mode).expect("cut the power");
        server.kill9();
        disk.layer.resume().expect("power on");
        for task in tasks {
            task.await.expect("writer task");
        }
        let mut second = String::new();
        if cycle % 2 == 1 {
            let after = start_up.mul_f64(rng.gen_range(0.0..1.0));
            let mode = [CutMode::All, CutMode::Prefix, CutMode::Torn][(cycle / 2) % 3];
            let again = disk.cut_while_starting(&data_dir, SHARDS, &common::power::BUSY_BACKGROUND, after, mode);
            recovery_cuts += 1;
            second = format!(", then {mode:?} {after:?} into the restart, dropping {} bytes", again.bytes_dropped);
        }
        common::rankd_check(&data_dir, &format!("after power cut {cycle}"));
        let started = Instant::now();
        server.restart();
        start_up = started.elapsed();
        let mut client = server.client().await;
        let values = counters(&mut client).await;
        let bounds = ledger.lock().bounds();
        for (c, (&value, &(acked, sent))) in values.iter().zip(&bounds).enumerate() {
            assert!(
                (acked..=sent).contains(&value),
                "cycle {cycle}: counter {c} = {value}, its acknowledged increments {acked}, sent {sent}"
            );
        }
        retry(&mut client, &ledger, first_of_cycle, cycle, &mut rng).await;
        let values = counters(&mut client).await;
        let sent: Vec<i64> = ledger.lock().bounds().into_iter().map(|(_, sent)| sent).collect();
        assert_eq!(values, sent, "cycle {cycle}: after every request was resent with its wid");
        eprintln!(
            "cycle {cycle}: cut {mode:?} dropped {} bytes{second}; {} requests so far, all applied once",
            cut.bytes_dropped,
            ledger.lock().requests.len()
        );
    }
    assert!(recovery_cuts > 0 || cycles < 2);
}
