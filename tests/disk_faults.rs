//! A full disk, for real: the data dir lives on a small tmpfs that the test
//! fills. While it is full the shard acknowledges no write (every write is
//! answered `internal`, never a false ack), reads keep working, the failure
//! shows in the metrics; once space is freed, writes resume by themselves;
//! after kill -9 and a restart every acknowledged write is there.
//!
//! Mounting a tmpfs needs root (CI runs as root).

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use rankd_client::{set_call, Mode, Order, Ties};
use rmpv::Value;

/// A tmpfs mounted for the test, unmounted on drop.
struct Tmpfs {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Self {
        let parent = tempfile::tempdir().unwrap();
        let dir = parent.path().join("mnt");
        std::fs::create_dir(&dir).unwrap();
        let status =
            Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"]).arg(&dir).status();
        assert!(
            status.is_ok_and(|s| s.success()),
            "mounting a tmpfs failed: this test needs root (CI runs as root) and the mount command"
        );
        Self { dir, _parent: parent }
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}

/// Fills the filesystem of `dir` with one file; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let _ = Command::new("dd")
        .args(["if=/dev/zero", "bs=1M", "status=none"])
        .arg(format!("of={}", path.display()))
        .status();
    path
}

fn metric(addr: &str, name: &str) -> f64 {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET /metrics HTTP/1.0\r\n\r\n").unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_writes_keeps_reads_and_recovers() {
    let disk = Tmpfs::mount("48m");
    let data_dir = disk.dir.join("data");
    // Declared after the tmpfs: dropped (killed) before it is unmounted.
    let mut server = common::Server::start_in(&data_dir, 1, &["--max-batch", "64"]);
    let metrics_addr = server.metrics_addr.clone();
    let mut client = server.client().await;
    // Dense ties: a refused write's score was already counted as distinct
    // when its batch was sealed, and must be forgotten on recovery.
    client.create_board("disk", Order::Desc, Ties::Dense).await.unwrap();
    let mut acked: Vec<(String, i64)> = Vec::new();
    for i in 0..200 {
        let player = format!("before-{i}");
        client.set("disk", &player, i, Mode::Set).await.unwrap();
        acked.push((player, i));
    }

    let filler = fill(&disk.dir);
    // Write until the disk refuses: every reply is an ack (there was still
    // room) or `internal`, never anything else.
    let mut refused = 0;
    // `internal` means the write may or may not have applied.
    let mut unknown: Vec<(String, i64)> = Vec::new();
    let mut seq = 0i64;
    let started = Instant::now();
    while refused < 20 && started.elapsed() < Duration::from_secs(30) {
        let batch: Vec<(String, i64)> = (0..50)
            .map(|_| {
                seq += 1;
                (format!("during-{seq}"), 1000 + seq) // scores no one else holds
            })
            .collect();
        let calls: Vec<_> = batch.iter().map(|(player, score)| set_call("disk", player, *score, Mode::Set)).collect();
        let replies = client.pipeline::<Value>(&calls).await.expect("connection survives");
        for ((player, score), reply) in batch.into_iter().zip(replies) {
            match reply {
                Ok(stored) => {
                    assert_eq!(stored.as_i64(), Some(score));
                    acked.push((player, score));
                }
                Err(e) => {
                    assert_eq!(e.code(), Some("internal"), "a failed write says internal: {e}");
                    refused += 1;
                    unknown.push((player, score));
                }
            }
        }
    }
    assert!(refused >= 20, "the full disk refused writes");
    // Reads go on.
    for (player, score) in acked.iter().take(50) {
        assert_eq!(client.get("disk", player).await.unwrap(), Some(*score), "read during the fault");
    }
    // The committer answers a failed batch before the shard's actor takes
    // in the failure (and counts it), so the metrics may lag the refusals.
    common::wait_for(Duration::from_secs(30), "the failure to show in metrics", async || {
        let errors = metric(&metrics_addr, "rankd_shard_commit_errors_total");
        let degraded = metric(&metrics_addr, "rankd_shard_degraded");
        if errors >= 1.0 && degraded == 1.0 {
            Ok(())
        } else {
            Err(format!("commit errors {errors}, degraded {degraded}"))
        }
    })
    .await;

    // Free the space: writes resume by themselves.
    std::fs::remove_file(&filler).unwrap();
    let resumed = Instant::now();
    loop {
        match client.set("disk", "after", 1, Mode::Set).await {
            Ok(_) => break,
            Err(e) => {
                assert_eq!(e.code(), Some("internal"));
                assert!(resumed.elapsed() < Duration::from_secs(20), "writes did not resume: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    acked.push(("after".into(), 1));
    assert_eq!(metric(&metrics_addr, "rankd_shard_degraded"), 0.0);
    // Whatever the storage holds now, the dense index agrees with it: a
    // refused write that did not land must not count as a distinct score.
    let mut held = acked.clone();
    for (player, score) in &unknown {
        if let Some(stored) = client.get("disk", player).await.unwrap() {
            assert_eq!(stored, *score, "a refused write holds its own score or none");
            held.push((player.clone(), *score));
        }
    }
    let distinct_above_zero = |held: &[(String, i64)]| {
        1 + held.iter().map(|(_, score)| *score).filter(|&s| s > 0).collect::<std::collections::BTreeSet<_>>().len()
            as u64
    };
    assert_eq!(
        client.rank_of_score("disk", 0).await.unwrap(),
        distinct_above_zero(&held),
        "dense rank counts exactly the scores held after recovery"
    );

    // Nothing acknowledged was lost, even across kill -9.
    server.kill9();
    server.restart();
    let mut client = server.client().await;
    for (player, score) in &acked {
        assert_eq!(client.get("disk", player).await.unwrap(), Some(*score), "acknowledged {player} lost");
    }
    assert_eq!(client.rank_of_score("disk", 0).await.unwrap(), distinct_above_zero(&held), "dense rank after restart");
    eprintln!(
        "{} acknowledged writes checked, {refused} refused during the fault ({} of them applied)",
        acked.len(),
        held.len() - acked.len()
    );
}
