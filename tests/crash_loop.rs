//! The crash loop: several clients write and read while the server is
//! killed with SIGKILL at random moments, dozens of times. Each kill comes
//! after the cycle's first acknowledged write, so every cycle has writes of
//! its own to check. After every kill the data dir passes `rankd check`
//! (trees, index and players agree), and after every restart every
//! acknowledged write is there with its value: sets, removes and increments.
//!
//! `RANKD_CRASH_CYCLES` sets the number of cycles (default 24; more on demand).

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rankd_client::{set_call, Call, Client, Mode, OpKind};
use rmpv::Value;

#[derive(Default)]
struct Ledger {
    /// player -> Some(score) if its latest acknowledged write set it, None if removed.
    expected: HashMap<String, Option<i64>>,
    /// player -> the effect of a write sent but never acknowledged (the kill
    /// came first): it may or may not have applied, so either state is right.
    in_doubt: HashMap<String, Option<i64>>,
    /// counter -> (acknowledged incrs, sent incrs).
    counters: HashMap<String, (u64, u64)>,
    /// Writes acknowledged in the current cycle (reset before each).
    acked_this_cycle: usize,
}

/// Writes unique players, removes some of its own acknowledged ones, and
/// bumps a counter, in pipelines, until the connection dies.
async fn writer(addr: String, cycle: usize, id: usize, ledger: Arc<Mutex<Ledger>>) {
    let Ok(mut client) = Client::connect(addr.as_str()).await else { return };
    let mut rng = rand::rngs::StdRng::seed_from_u64((cycle * 16 + id) as u64);
    let counter = format!("counter-{id}");
    let mut mine: Vec<String> = Vec::new();
    for batch in 0.. {
        let mut calls = Vec::new();
        let mut effects: Vec<(String, Option<i64>)> = Vec::new();
        for i in 0..50 {
            if !mine.is_empty() && rng.gen_bool(0.1) {
                let player = mine.swap_remove(rng.gen_range(0..mine.len()));
                calls.push(Call::new(OpKind::Remove).with("board", "loop").with("player", player.as_str()));
                effects.push((player, None));
            } else {
                let player = format!("c{cycle}-w{id}-{batch}-{i}");
                let score = rng.gen_range(-1000..1000);
                calls.push(set_call("loop", &player, score, Mode::Set));
                effects.push((player, Some(score)));
            }
        }
        calls.push(set_call("loop", &counter, 1, Mode::Incr));
        ledger.lock().counters.entry(counter.clone()).or_default().1 += 1;
        let Ok(replies) = client.pipeline::<Value>(&calls).await else {
            ledger.lock().in_doubt.extend(effects);
            break;
        };
        let mut ledger = ledger.lock();
        ledger.acked_this_cycle += replies.iter().filter(|r| r.is_ok()).count();
        for ((player, effect), reply) in effects.into_iter().zip(&replies) {
            if reply.is_ok() {
                if effect.is_some() {
                    mine.push(player.clone());
                }
                ledger.expected.insert(player, effect);
            } else {
                ledger.in_doubt.insert(player, effect);
            }
        }
        if replies.last().is_some_and(Result::is_ok) {
            ledger.counters.entry(counter.clone()).or_default().0 += 1;
        }
    }
}

/// Reads while the writers write: must never see an error other than the
/// connection going away.
async fn reader(addr: String) {
    let Ok(mut client) = Client::connect(addr.as_str()).await else { return };
    loop {
        let calls = [
            Call::new(OpKind::Count).with("board", "loop"),
            Call::new(OpKind::Top).with("board", "loop").with("limit", 20),
        ];
        match client.pipeline::<Value>(&calls).await {
            Ok(replies) => {
                for r in replies {
                    if let Err(e) = r {
                        assert!(e.code().is_none(), "a read failed with {e}");
                    }
                }
            }
            Err(_) => return,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_dozens_of_kill_9s() {
    let cycles: usize = std::env::var("RANKD_CRASH_CYCLES").ok().and_then(|v| v.parse().ok()).unwrap_or(24);
    let mut server = common::Server::start(3);
    let ledger = Arc::new(Mutex::new(Ledger::default()));
    let mut rng = rand::rngs::StdRng::seed_from_u64(24);
    let mut checked_total = 0usize;
    for cycle in 0..cycles {
        ledger.lock().acked_this_cycle = 0;
        let mut tasks: Vec<_> =
            (0..3).map(|id| tokio::spawn(writer(server.addr.clone(), cycle, id, ledger.clone()))).collect();
        tasks.push(tokio::spawn(reader(server.addr.clone())));
        // A kill before any acknowledgment would leave the cycle nothing of
        // its own to check, as a fixed delay may on a loaded machine.
        common::wait_until(Duration::from_secs(30), &format!("cycle {cycle}'s first acknowledged write"), async || {
            ledger.lock().acked_this_cycle > 0
        })
        .await;
        // Then the kill lands at a random moment of the writing: the
        // randomness is what this test is about, not a synchronisation.
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..350))).await;
        server.kill9();
        for task in tasks {
            task.await.expect("client task");
        }
        common::rankd_check(server.data_dir(), "after a kill -9");
        server.restart();

        let mut client = server.client().await;
        let (expected, in_doubt, counters) = {
            let ledger = ledger.lock();
            (ledger.expected.clone(), ledger.in_doubt.clone(), ledger.counters.clone())
        };
        let players: Vec<(&String, &Option<i64>)> = expected.iter().collect();
        let this_cycle = format!("c{cycle}-");
        let checked_this_cycle = players.iter().filter(|(p, _)| p.starts_with(&this_cycle)).count();
        assert!(checked_this_cycle > 0, "cycle {cycle}: no acknowledged write of its own to check");
        for chunk in players.chunks(1000) {
            let calls: Vec<Call> = chunk
                .iter()
                .map(|(p, _)| Call::new(OpKind::Get).with("board", "loop").with("player", p.as_str()))
                .collect();
            let replies = client.pipeline::<Value>(&calls).await.expect("reads after restart");
            for ((player, want), got) in chunk.iter().zip(replies) {
                let got = got.expect("get").as_i64();
                let doubtful = in_doubt.get(*player).is_some_and(|maybe| *maybe == got);
                assert!(
                    got == **want || doubtful,
                    "cycle {cycle}: acknowledged write to {player} lost: {got:?}, want {want:?}"
                );
            }
        }
        for (counter, (acked, sent)) in &counters {
            let value = client.get("loop", counter).await.unwrap().unwrap_or(0) as u64;
            assert!(
                (*acked..=*sent).contains(&value),
                "cycle {cycle}: {counter} = {value}, acked {acked}, sent {sent}"
            );
        }
        checked_total += expected.len();
        eprintln!(
            "cycle {cycle}: {checked_this_cycle} of its own acknowledged writes checked, {} in all",
            expected.len()
        );
        drop(client);
    }
    eprintln!("{cycles} kill -9 cycles; {checked_total} acknowledged-write checks; lost: 0");
}
