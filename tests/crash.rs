//! Durability against the real process: kill -9 while writes are pipelined,
//! restart, and find every acknowledged write; SIGTERM under load exits 0
//! and loses nothing acknowledged; SIGTERM still ends the process when the
//! storage cannot flush.

mod common;

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::{Rng, SeedableRng};
use rankd_client::{set_call, Call, Client, Mode, OpKind};
use rmpv::Value;

/// What the writers saw acknowledged.
#[derive(Default)]
struct Acked {
    /// (player, score) of every acknowledged `set`.
    sets: Vec<(String, i64)>,
    /// Per writer id: (acknowledged incrs, sent incrs) on its counter.
    incrs: [(u64, u64); 4],
    /// Every player a `set` was sent for.
    sent: Vec<(String, i64)>,
}

/// Pipelines batches of sets (unique players) and one incr per batch until
/// the connection fails.
async fn writer(addr: String, cycle: usize, id: usize, acked: Arc<Mutex<Acked>>) {
    let Ok(mut client) = Client::connect(addr.as_str()).await else { return };
    let counter = format!("counter-{id}");
    let (mut incr_acked, mut incr_sent) = (0u64, 0u64);
    for batch in 0.. {
        let players: Vec<(String, i64)> =
            (0..100).map(|i| (format!("c{cycle}-w{id}-{batch}-{i}"), (batch * 1000 + i) as i64 - 5000)).collect();
        let mut calls: Vec<Call> = players.iter().map(|(p, s)| set_call("crash", p, *s, Mode::Set)).collect();
        calls.push(set_call("crash", &counter, 1, Mode::Incr));
        acked.lock().sent.extend(players.iter().cloned());
        incr_sent += 1;
        match client.pipeline::<Value>(&calls).await {
            Ok(replies) => {
                let mut a = acked.lock();
                for ((p, s), reply) in players.into_iter().zip(&replies) {
                    if reply.is_ok() {
                        a.sets.push((p, s));
                    }
                }
                if replies.last().is_some_and(|r| r.is_ok()) {
                    incr_acked += 1;
                }
            }
            Err(_) => break,
        }
    }
    let mut a = acked.lock();
    a.incrs[id].0 += incr_acked;
    a.incrs[id].1 += incr_sent;
}

async fn verify(client: &mut Client, acked: &Acked) {
    // Every acknowledged set is there with its value.
    for chunk in acked.sets.chunks(500) {
        let calls: Vec<Call> = chunk
            .iter()
            .map(|(p, _)| Call::new(OpKind::Get).with("board", "crash").with("player", p.as_str()))
            .collect();
        let replies = client.pipeline::<Value>(&calls).await.expect("reads after restart");
        for ((p, s), r) in chunk.iter().zip(replies) {
            assert_eq!(r.expect("get").as_i64(), Some(*s), "acknowledged write to {p} lost");
        }
    }
    // Counters hold at least every acknowledged incr, at most every sent one
    // (an unacknowledged write may or may not have applied).
    for (id, &(acked_n, sent_n)) in acked.incrs.iter().enumerate() {
        let value = client.get("crash", &format!("counter-{id}")).await.expect("get").unwrap_or(0) as u64;
        assert!((acked_n..=sent_n).contains(&value), "counter-{id} = {value}, acked {acked_n}, sent {sent_n}");
    }
}

/// The tree's counts agree with the stored players: `count` equals the
/// players listed by paging through `top`.
async fn check_consistent(client: &mut Client) {
    let count = client.count("crash").await.expect("count");
    let mut listed = 0u64;
    loop {
        let page = client.top("crash", 1000, listed).await.expect("top");
        if page.is_empty() {
            break;
        }
        for pair in page.windows(2) {
            assert!(pair[0].score >= pair[1].score && pair[0].rank <= pair[1].rank, "list order: {pair:?}");
        }
        listed += page.len() as u64;
    }
    assert_eq!(listed, count, "count and the score index agree");
}

/// Waits (bounded) until `at_least` writes are acknowledged, so a kill or
/// SIGTERM lands while writes are being acknowledged: a fixed delay alone
/// once ended before the first ack on a loaded machine.
async fn acks(acked: &Mutex<Acked>, at_least: usize, when: &str) {
    let what = format!("{at_least} acknowledged writes {when}");
    common::wait_for(Duration::from_secs(30), &what, async || match acked.lock().sets.len() {
        n if n >= at_least => Ok(()),
        n => Err(format!("{n} acknowledged")),
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9() {
    kill_9_cycles(common::Server::start(4), 9).await;
}

/// The same with a checkpoint every few dozen changes, its leaves copied
/// one a batch: the kills land while copies are under way, between a
/// checkpoint's leaves and its log deletion, and everywhere else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_writes_survive_kill_9_amid_checkpoints() {
    let flags = ["--debug-checkpoint-every", "40", "--debug-checkpoint-slice-leaves", "1"];
    kill_9_cycles(common::Server::start_with(4, &flags), 10).await;
}

/// Three cycles of: pipelined writers, kill -9 at a random moment after the
/// first acknowledgment, restart, every acknowledged write checked.
async fn kill_9_cycles(mut server: common::Server, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut all = Acked::default();
    for cycle in 0..3 {
        let acked = Arc::new(Mutex::new(Acked::default()));
        let writers: Vec<_> =
            (0..4).map(|id| tokio::spawn(writer(server.addr.clone(), cycle, id, acked.clone()))).collect();
        acks(&acked, 1, &format!("in cycle {cycle}")).await;
        // The random moment is the point (not a synchronisation).
        tokio::time::sleep(Duration::from_millis(rng.gen_range(0..450))).await;
        server.kill9();
        for w in writers {
            w.await.expect("writer task");
        }
        let acked = Arc::try_unwrap(acked).ok().expect("writers done").into_inner();
        server.restart();
        let mut client = server.client().await;
        all.sets.extend(acked.sets);
        all.sent.extend(acked.sent);
        for (total, cycle) in all.incrs.iter_mut().zip(acked.incrs) {
            total.0 += cycle.0;
            total.1 += cycle.1;
        }
        verify(&mut client, &all).await;
        check_consistent(&mut client).await;
        // Nothing beyond what was sent appeared: count <= sent players + counters.
        let count = client.count("crash").await.expect("count");
        assert!(count as usize <= all.sent.len() + 4 && count as usize >= all.sets.len());
        eprintln!("cycle {cycle}: {} acknowledged writes verified, {count} players", all.sets.len());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_under_load_exits_zero_and_keeps_acknowledged_writes() {
    let mut server = common::Server::start(2);
    let acked = Arc::new(Mutex::new(Acked::default()));
    let writers: Vec<_> = (0..3).map(|id| tokio::spawn(writer(server.addr.clone(), 9, id, acked.clone()))).collect();
    // Three batches' worth: the writers are well under way.
    acks(&acked, 300, "before SIGTERM").await;
    let status = tokio::task::spawn_blocking(move || {
        let status = server.terminate();
        (server, status)
    });
    let (mut server, status) = status.await.expect("terminate");
    assert!(status.success(), "SIGTERM exits 0, got {status}");
    for w in writers {
        w.await.expect("writer");
    }
    let acked = Arc::try_unwrap(acked).ok().expect("writers done").into_inner();
    server.restart();
    let mut client = server.client().await;
    verify(&mut client, &acked).await;
    check_consistent(&mut client).await;
}

/// A shutdown flushes the memtables. When that cannot happen (here the data
/// dir is removed under the server; a full or failing disk does the same),
/// the process must still exit: it used to wait forever for fjall's stopped
/// flush worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_when_the_storage_cannot_flush() {
    let mut server = common::Server::start(2);
    let mut client = server.client().await;
    let calls: Vec<Call> = (0..2000).map(|i| set_call("gone", &format!("p{i}"), i, Mode::Set)).collect();
    client.pipeline::<Value>(&calls).await.expect("sets");
    drop(client);
    std::fs::remove_dir_all(server.data_dir()).expect("remove the data dir");
    // terminate() fails the test if the process is still there after 30 s.
    tokio::task::spawn_blocking(move || server.terminate()).await.expect("terminate");
}
