//! Online backups against the real server: `rankd backup` while writers
//! keep writing gives a data dir that `rankd check` passes and `rankd
//! serve` opens, holding every write acknowledged before the backup began
//! and no `set_many` in part (each spans the shards); the refusals.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{arg, Server};
use parking_lot::Mutex;
use rankd_client::{Call, Client, Mode, OpKind};
use rmpv::Value;

/// Players per `set_many`: with 3 shards, every one spans them all.
const GROUP: usize = 24;

/// One writer's `set_many` groups: the players of group `g` of writer `w`
/// are `w{w}-g{g}-{i}`, all with score `g`, written once.
#[derive(Default)]
struct Ledger {
    /// (writer, group, when acknowledged) of every acknowledged group.
    acked: Vec<(usize, u64, Instant)>,
    /// Groups sent, acknowledged or not, per writer (the next group's number).
    sent: Vec<u64>,
}

fn player(writer: usize, group: u64, i: usize) -> String {
    format!("w{writer}-g{group}-{i}")
}

async fn writer(addr: String, id: usize, ledger: Arc<Mutex<Ledger>>, stop: Arc<std::sync::atomic::AtomicBool>) {
    let mut client = Client::connect(&addr).await.expect("connect");
    for group in 0.. {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let names: Vec<String> = (0..GROUP).map(|i| player(id, group, i)).collect();
        let entries: Vec<(&str, i64)> = names.iter().map(|name| (name.as_str(), group as i64)).collect();
        ledger.lock().sent[id] = group + 1;
        client.set_many("b", &entries, Mode::Set).await.expect("set_many");
        ledger.lock().acked.push((id, group, Instant::now()));
    }
}

fn rankd() -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_rankd"));
    command.env("RANKD_LOG", "warn");
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_holds_everything_acknowledged_before_it_and_no_write_in_part() {
    let server = Server::start(3);
    let writers = 3;
    let ledger = Arc::new(Mutex::new(Ledger { acked: Vec::new(), sent: vec![0; writers] }));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let tasks: Vec<_> =
        (0..writers).map(|id| tokio::spawn(writer(server.addr.clone(), id, ledger.clone(), stop.clone()))).collect();
    common::wait_until(Duration::from_secs(30), "writes before the backup", async || ledger.lock().acked.len() > 200)
        .await;

    let copy = tempfile::tempdir().expect("temp dir");
    let target = copy.path().join("backup");
    let began = Instant::now();
    let addr = server.addr.clone();
    let to = target.clone();
    let out = tokio::task::spawn_blocking(move || {
        rankd().args(["backup", "--quiet", "--server", &addr, "--to", arg(&to)]).output().expect("run rankd backup")
    })
    .await
    .expect("backup task");
    assert!(out.status.success(), "rankd backup failed: {}", String::from_utf8_lossy(&out.stderr));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("backed up 3 shards"), "{said}");
    // The command it gives opens the copy on any machine: with the copy's
    // shard count and branching, not the defaults (one shard per core).
    let start = format!("rankd serve --data-dir {} --shards 3 --branching 16`", target.display());
    assert!(said.contains(&start), "{said}");
    // Writes went on during the backup and after it.
    let during = ledger.lock().acked.len();
    common::wait_until(Duration::from_secs(30), "writes after the backup", async || {
        ledger.lock().acked.len() > during + 50
    })
    .await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for task in tasks {
        task.await.expect("writer");
    }
    // Counted once the server has let the backup go, after its last frame.
    common::wait_until(Duration::from_secs(30), "the backup counted ok", async || {
        server.counter("rankd_requests_total", &["op=\"backup\"", "outcome=\"ok\""]) == 1.0
    })
    .await;

    common::rankd_check(&target, "on the backup");

    let restored = Server::start_in(&target, 3, &[]);
    let mut client = restored.client().await;
    let (acked, sent) = {
        let ledger = ledger.lock();
        (ledger.acked.clone(), ledger.sent.clone())
    };
    let before: std::collections::HashSet<(usize, u64)> =
        acked.iter().filter(|(_, _, at)| *at < began).map(|(w, g, _)| (*w, *g)).collect();
    assert!(!before.is_empty());
    let (mut whole, mut absent) = (0, 0);
    for (w, groups) in sent.iter().enumerate() {
        for group in 0..*groups {
            let calls: Vec<Call> = (0..GROUP)
                .map(|i| Call::new(OpKind::Get).with("board", "b").with("player", player(w, group, i)))
                .collect();
            let got: Vec<Option<i64>> = (client.pipeline::<Value>(&calls).await.expect("gets").into_iter())
                .map(|reply| reply.expect("get").as_i64())
                .collect();
            let present = got.iter().filter(|score| **score == Some(group as i64)).count();
            assert!(
                present == 0 || present == GROUP,
                "writer {w} group {group}: {present} of {GROUP} players in the backup: a set_many in part"
            );
            if before.contains(&(w, group)) {
                assert_eq!(present, GROUP, "writer {w} group {group} was acknowledged before the backup began");
            }
            if present == GROUP {
                whole += 1;
            } else {
                absent += 1;
            }
        }
    }
    assert_eq!(client.count("b").await.expect("count"), (whole * GROUP) as u64);
    // Some writes came after the cut: the backup is a moment, not the end.
    assert!(absent > 0, "every group is in the backup, even those written long after it");
    eprintln!("backup: {whole} groups whole, {absent} after the cut, {} acknowledged before it", before.len());
}

#[tokio::test]
async fn a_backup_refuses_a_used_directory_and_a_read_token() {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        "[[tokens]]\nrole = \"read\"\ntoken = \"r-3c1\"\n\n[[tokens]]\nrole = \"write\"\ntoken = \"w-9f2\"\n",
    )
    .expect("tokens file");
    let server = Server::start_with(2, &["--tokens-file", arg(&tokens)]);

    let used = dir.path().join("used");
    std::fs::create_dir_all(&used).expect("dir");
    std::fs::write(used.join("something"), b"x").expect("file");
    let out = rankd()
        .args(["backup", "-q", "--server", &server.addr, "--to", arg(&used)])
        .env("RANKD_TOKEN", "w-9f2")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"), "{}", String::from_utf8_lossy(&out.stderr));

    let fresh = dir.path().join("fresh");
    let out = rankd()
        .args(["backup", "-q", "--server", &server.addr, "--to", arg(&fresh)])
        .env("RANKD_TOKEN", "r-3c1")
        .output()
        .expect("run");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("may only read"), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!fresh.join("rankd.layout.toml").exists(), "a refused backup leaves no data dir");

    // The write token may: an empty server's backup opens as an empty server.
    let out = rankd()
        .args(["backup", "-q", "--server", &server.addr, "--to", arg(&fresh)])
        .env("RANKD_TOKEN", "w-9f2")
        .output()
        .expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let restored = Server::start_in(&fresh, 2, &[]);
    let mut client = restored.client().await;
    assert!(client.boards().await.expect("boards").is_empty());
}

#[tokio::test]
async fn one_backup_at_a_time() {
    let server = Server::start(2);
    let mut client = server.client().await;
    // Far more than the socket buffers and the server's frame queue hold:
    // the first backup cannot be finished before its client reads it (with
    // 5000 players it could, under load, and the second was let through).
    let entries: Vec<(String, i64)> = (0..200_000).map(|i| (format!("player-with-a-longish-name-{i}"), i)).collect();
    for chunk in entries.chunks(10_000) {
        let chunk: Vec<(&str, i64)> = chunk.iter().map(|(p, s)| (p.as_str(), *s)).collect();
        client.set_many("b", &chunk, Mode::Set).await.expect("set_many");
    }
    let mut first = server.client().await;
    let mut running = first.backup().await.expect("first backup");
    assert!(matches!(running.next().await.expect("its header"), Some(rankd_client::BackupPart::Header(_))));
    let mut second = server.client().await;
    let mut refused = second.backup().await.expect("second backup sent");
    let err = refused.next().await.expect_err("a second backup while one runs");
    assert_eq!(err.code(), Some("overloaded"), "{err}");
    // Once the first is read to its end (and the server has let it go: a
    // moment after its last frame), another may run.
    while running.next().await.expect("the first backup's parts").is_some() {}
    drop(first);
    let header = common::wait_for(std::time::Duration::from_secs(10), "a backup after the first", async || {
        let mut third = server.client().await;
        let mut stream = third.backup().await.map_err(|e| e.to_string())?;
        match stream.next().await {
            Ok(Some(rankd_client::BackupPart::Header(header))) => Ok(header),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!(header.shards, 2);
}
