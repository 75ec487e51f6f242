//! The metrics endpoint of the real server moves with the load it serves.

mod common;

use rankd_client::{ClientError, Mode, OpKind};
use rmpv::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A plain HTTP/1.0 GET (the endpoint is served by axum; the test needs no
/// HTTP client of its own). Returns (status line, body).
fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut stream = TcpStream::connect(addr).expect("connect to metrics");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    (head.lines().next().unwrap_or_default().to_string(), body.to_string())
}

/// Sum of every sample of `name` whose labels contain all of `labels`.
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn counters_rise_by_the_requests_served() {
    let server = common::Server::start(2);
    let (status, _) = http_get(&server.metrics_addr, "/healthz");
    assert!(status.contains("200"), "healthz: {status}");
    let (status, _) = http_get(&server.metrics_addr, "/readyz");
    assert!(status.contains("200"), "readyz: {status}");

    let (_, before) = http_get(&server.metrics_addr, "/metrics");
    let sets_before = sample(&before, "rankd_requests_total", &[r#"op="set""#, r#"outcome="ok""#]);
    let mut client = server.client().await;
    let calls: Vec<_> = (0..250).map(|i| rankd_client::set_call("m", &format!("p{i}"), i, Mode::Set)).collect();
    client.pipeline::<Value>(&calls).await.expect("sets");
    client.rank("m", "p3").await.expect("rank");
    client.call::<Value>(rankd_client::Call::named("no_such_op")).await.expect_err("unknown op");

    let (_, after) = http_get(&server.metrics_addr, "/metrics");
    assert_eq!(sample(&after, "rankd_requests_total", &[r#"op="set""#, r#"outcome="ok""#]) - sets_before, 250.0);
    assert_eq!(sample(&after, "rankd_shard_writes_applied_total", &[]), 250.0, "writes over all shards");
    assert_eq!(sample(&after, "rankd_shard_players", &[]), 250.0);
    // Each new player's first write looks for them once: in the board's
    // count tree while it is one leaf (the names are short, the ties
    // competition), else in the record cache, which misses (and caches the
    // absence). Every write caches its record, so the rank finds it there.
    let misses = sample(&after, "rankd_shard_record_cache_misses_total", &[]);
    let tree_reads = sample(&after, "rankd_shard_record_tree_reads_total", &[]);
    assert_eq!(misses + tree_reads, 250.0);
    assert!(tree_reads >= 60.0, "a one-leaf tree tells a short name's absence: {tree_reads}");
    assert_eq!(sample(&after, "rankd_requests_total", &[r#"outcome="unknown_op""#]), 1.0);
    // The rank was answered in place or fanned out to the shards, once.
    let fanned_out = sample(&after, "rankd_fanout_duration_seconds_count", &[r#"op="rank""#]);
    let in_place = sample(&after, "rankd_ranks_in_place_total", &[]);
    assert_eq!(fanned_out + in_place, 1.0);
    // In place, the owner found the record once. Fanned out, once more if an
    // attempt in place had found it before another shard's lock was taken.
    let hits = sample(&after, "rankd_shard_record_cache_hits_total", &[]);
    let expected = if in_place == 1.0 { 1.0..=1.0 } else { 1.0..=2.0 };
    assert!(expected.contains(&hits), "{hits} record-cache hits for one rank ({in_place} in place)");
    assert!(sample(&after, "rankd_request_duration_seconds_count", &[r#"op="set""#]) >= 250.0);
    assert!(sample(&after, "rankd_shard_fsync_seconds_count", &[]) >= 1.0);
    // Every round sealed is timed; a round carries at least one of the sets.
    let sealed = sample(&after, "rankd_shard_seal_seconds_count", &[]);
    assert!((1.0..=250.0).contains(&sealed), "{sealed} rounds sealed");
    assert_eq!(sample(&after, "rankd_connections_open", &[]), 1.0);
    assert!(sample(&after, "rankd_received_bytes_total", &[]) > 250.0 * 30.0);
    assert!(sample(&after, "rankd_sent_bytes_total", &[]) > 250.0 * 10.0);
    assert_eq!(sample(&after, "rankd_shard_mailbox_depth", &[]), 0.0, "nothing left queued");
    // Every thread with a role has its CPU series (its values, in clock
    // ticks, are checked under load by bench/tests/smoke.rs). A runs thread
    // registers once it first runs, which nothing here waits for.
    let has_series = |text: &str, role: &str| {
        let series = format!("rankd_thread_cpu_seconds_total{{thread=\"{role}\"}} ");
        text.lines().any(|l| l.starts_with(&series))
    };
    for role in ["main", "io-0", "shard-0", "shard-1", "commit-0", "commit-1"] {
        assert!(has_series(&after, role), "no CPU series for {role}");
    }
    common::wait_until(Duration::from_secs(30), "the runs threads' CPU series", async || {
        let (_, text) = http_get(&server.metrics_addr, "/metrics");
        has_series(&text, "runs-0") && has_series(&text, "runs-1")
    })
    .await;
    assert!(sample(&after, "process_resident_memory_bytes", &[]) > 1e6);
    assert_eq!(sample(&after, "rankd_build_info", &[]), 1.0);
}

/// A rank or `set` its client waits for alone is handled in place; a
/// pipeline, and every request under `--debug-queue-lone`, is queued for
/// the shards. (A lone request meeting a shard mid-command is queued too,
/// hence "most".)
#[tokio::test]
async fn lone_ranks_and_writes_are_handled_in_place_and_pipelines_queued() {
    for (flags, lone_in_place) in [(&[][..], true), (&["--debug-queue-lone"][..], false)] {
        let server = common::Server::start_with(2, flags);
        let mut client = server.client().await;
        let calls: Vec<_> = (0..100).map(|i| rankd_client::set_call("m", &format!("p{i}"), i, Mode::Set)).collect();
        client.pipeline::<Value>(&calls).await.expect("sets");
        let writes = || sample(&http_get(&server.metrics_addr, "/metrics").1, "rankd_writes_in_place_total", &[]);
        let pipelined_writes = writes();
        assert!(pipelined_writes <= 4.0, "{pipelined_writes} of 100 pipelined sets staged in place ({flags:?})");
        for i in 100..120 {
            client.set("m", &format!("p{i}"), -i, Mode::Set).await.expect("set");
            // below the first 100
        }
        let lone_writes = writes() - pipelined_writes;
        if lone_in_place {
            assert!(lone_writes >= 15.0, "{lone_writes} of 20 lone sets staged in place");
        } else {
            assert_eq!(lone_writes, 0.0, "{flags:?}");
        }
        let in_place = || sample(&http_get(&server.metrics_addr, "/metrics").1, "rankd_ranks_in_place_total", &[]);
        for i in 0..20 {
            let rank = client.rank("m", &format!("p{i}")).await.expect("rank").expect("ranked");
            assert_eq!(rank.rank, 100 - i, "{flags:?}");
        }
        let lone = in_place();
        if lone_in_place {
            assert!(lone >= 15.0, "{lone} of 20 lone ranks answered in place");
        } else {
            assert_eq!(lone, 0.0, "{flags:?}");
        }
        let ranks: Vec<_> = (0..64)
            .map(|i| rankd_client::Call::new(OpKind::Rank).with("board", "m").with("player", format!("p{i}")))
            .collect();
        client.pipeline::<Value>(&ranks).await.expect("ranks");
        let pipelined = in_place() - lone;
        assert!(pipelined <= 4.0, "{pipelined} of 64 pipelined ranks answered in place ({flags:?})");
    }
}

#[tokio::test]
async fn a_slow_commit_shows_in_the_commit_histogram() {
    let server = common::Server::start_with(1, &["--debug-commit-delay-ms", "300"]);
    let mut client = server.client().await;
    client.set("slow", "p", 1, Mode::Set).await.expect("set");
    let (_, text) = http_get(&server.metrics_addr, "/metrics");
    let total = sample(&text, "rankd_shard_commit_seconds_count", &[]);
    let fast = sample(&text, "rankd_shard_commit_seconds_bucket", &[r#"le="0.25""#]);
    assert!(total >= 1.0, "a commit was timed");
    assert_eq!(fast, 0.0, "the 300 ms commit is above the 250 ms bucket");
    assert!(sample(&text, "rankd_request_duration_seconds_sum", &[r#"op="set""#]) >= 0.3, "and in the set latency");
}

/// A backup, over real TCP, is timed and its bytes counted by metrics of
/// its own (its minutes would all land in the request histogram's +Inf
/// bucket), and its outcome with the other requests'.
/// Each shard shows the bytes its storage takes and the bytes still free
/// on its filesystem, as the files and `statvfs` say.
#[tokio::test]
async fn each_shard_shows_its_disk_use_and_the_space_left() {
    let server = common::Server::start(2);
    let mut client = server.client().await;
    let entries: Vec<(String, i64)> = (0..20_000).map(|i| (format!("player-{i}"), i)).collect();
    let entries: Vec<(&str, i64)> = entries.iter().map(|(p, s)| (p.as_str(), *s)).collect();
    for chunk in entries.chunks(10_000) {
        client.set_many("b", chunk, Mode::Set).await.expect("set_many");
    }
    for shard in ["0", "1"] {
        let label = format!("shard=\"{shard}\"");
        let dir = server.data_dir().join(format!("shard-{shard}"));
        let files: u64 = walk(&dir).iter().map(|path| std::fs::metadata(path).map_or(0, |m| m.len())).sum();
        // Published once a second.
        let used = common::wait_for(Duration::from_secs(10), "the disk use published", async || {
            let (_, text) = http_get(&server.metrics_addr, "/metrics");
            match sample(&text, "rankd_shard_disk_bytes", &[&label]) {
                0.0 => Err("0 bytes".to_string()),
                used => Ok(used),
            }
        })
        .await;
        assert!(used <= files as f64 * 1.5 + 1e6, "shard {shard}: {used} bytes shown, its files hold {files}");
        let (_, text) = http_get(&server.metrics_addr, "/metrics");
        let available = sample(&text, "rankd_shard_disk_available_bytes", &[&label]);
        let df = std::process::Command::new("df").args(["-B1", "--output=avail"]).arg(&dir).output().expect("df");
        let df: f64 = String::from_utf8_lossy(&df.stdout).lines().nth(1).expect("df's figure").trim().parse().unwrap();
        // The disk is shared with the rest of the machine: within 10%.
        assert!((available - df).abs() <= df * 0.1 + 1e8, "shard {shard}: {available} free shown, df says {df}");
    }
}

/// Every file under `dir`.
fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files.extend(walk(&path));
        } else {
            files.push(path);
        }
    }
    files
}

/// A client that sends writes and resets its connection before their
/// answers: the requests it left are counted as abandoned, and with those
/// answered every request read is counted once.
#[tokio::test]
async fn requests_whose_client_left_are_counted_abandoned() {
    const SETS: u64 = 500;
    let server = common::Server::start_with(1, &["--debug-commit-delay-ms", "300"]);
    let mut stream = TcpStream::connect(&server.addr).expect("connect");
    let mut frames = Vec::new();
    for i in 0..SETS {
        rankd_client::set_call("b", &format!("p{i}"), i as i64, Mode::Set).encode(i + 1, &mut frames);
    }
    stream.write_all(&frames).expect("send the sets");
    std::thread::sleep(Duration::from_millis(50)); // read, and waiting for their commit
                                                   // A reset, not a polite close: the server's next read or write fails.
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    let size = std::mem::size_of::<libc::linger>() as libc::socklen_t;
    let option = (&linger as *const libc::linger).cast::<libc::c_void>();
    use std::os::fd::AsRawFd;
    // SAFETY: the socket is open, and `option` points at a `linger` of `size` bytes.
    let set = unsafe { libc::setsockopt(stream.as_raw_fd(), libc::SOL_SOCKET, libc::SO_LINGER, option, size) };
    assert_eq!(set, 0, "SO_LINGER 0");
    drop(stream);
    let (answered, abandoned) = common::wait_for(Duration::from_secs(10), "every set counted", async || {
        let (_, text) = http_get(&server.metrics_addr, "/metrics");
        let answered = sample(&text, "rankd_requests_total", &[r#"op="set""#]);
        let abandoned = sample(&text, "rankd_requests_abandoned_total", &[]);
        match answered + abandoned == SETS as f64 {
            true => Ok((answered, abandoned)),
            false => Err(format!("{answered} answered and {abandoned} abandoned")),
        }
    })
    .await;
    assert!(abandoned > 0.0, "none abandoned ({answered} answered)");
}

#[tokio::test]
async fn a_backup_is_timed_and_its_bytes_counted_by_backup_metrics() {
    let server = common::Server::start(2);
    let mut client = server.client().await;
    let calls: Vec<_> = (0..200).map(|i| rankd_client::set_call("b", &format!("p{i}"), i, Mode::Set)).collect();
    client.pipeline::<Value>(&calls).await.expect("sets");
    let mut backup = server.client().await;
    let mut stream = backup.backup().await.expect("backup");
    let mut copied = 0;
    while let Some(part) = stream.next().await.expect("backup parts") {
        if let rankd_client::BackupPart::Chunk(chunk) = part {
            copied += chunk.entries.iter().map(|(key, value)| key.len() + value.len()).sum::<usize>();
        }
    }
    assert!(copied > 200 * 10, "the players were copied: {copied} bytes");
    // Timed and counted once the server has let the backup go, a moment
    // after its last frame (the count just after the timing).
    let text = common::wait_for(Duration::from_secs(30), "the backup timed and counted", async || {
        let (_, text) = http_get(&server.metrics_addr, "/metrics");
        let timed = sample(&text, "rankd_backup_duration_seconds_count", &[]);
        let counted = sample(&text, "rankd_requests_total", &[r#"op="backup""#, r#"outcome="ok""#]);
        if timed == 1.0 && counted == 1.0 {
            Ok(text)
        } else {
            Err(format!("{timed} backups timed, {counted} counted ok"))
        }
    })
    .await;
    // Every frame's bytes: the keys and values, and their framing.
    let bytes = sample(&text, "rankd_backup_bytes_total", &[]);
    assert!(bytes > copied as f64, "{bytes} bytes of frames for {copied} of keys and values");
    assert_eq!(sample(&text, "rankd_backup_duration_seconds_bucket", &[r#"le="3600""#]), 1.0, "within the hour");
    assert!(!text.contains(r#"rankd_request_duration_seconds_count{op="backup"}"#), "nor a request latency");
}

/// Every checkpoint starts a pass over the count-tree leaves that moves those
/// on sparse allocator slabs; the counters show checkpoints written and
/// passes over every leaf, and ranks read afterwards are exact. Checkpoints
/// come every 50 changes here (a testing flag) instead of every 100k.
#[tokio::test]
async fn checkpoints_start_leaf_repacking_and_ranks_stay_exact() {
    let server = common::Server::start_with(2, &["--debug-checkpoint-every", "50"]);
    let mut client = server.client().await;
    // Distinct scores (2003 is prime), so a rank is 1 + the players above.
    let score = |i: i64| i * 7919 % 2003;
    for chunk in 0..4i64 {
        let calls: Vec<_> = (chunk * 500..(chunk + 1) * 500)
            .map(|i| rankd_client::set_call("r", &format!("p{i}"), score(i), Mode::Set))
            .collect();
        client.pipeline::<Value>(&calls).await.expect("sets");
    }
    // 1000 players a shard, at most 64 keys a leaf: 16+ leaves each, and a
    // pass after each of dozens of checkpoints.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, text) = http_get(&server.metrics_addr, "/metrics");
        let visited = sample(&text, "rankd_shard_repack_leaves_visited_total", &[]);
        let moved = sample(&text, "rankd_shard_repack_leaves_moved_total", &[]);
        let checkpoints = sample(&text, "rankd_shard_checkpoints_total", &[]);
        // Changes since a shard's last checkpoint began: one is due after
        // 200 (4 x 50) at the latest; the gauge is set per batch.
        let logged = sample(&text, "rankd_shard_logged_changes", &[r#"shard="0""#]);
        assert!(moved <= visited, "moved {moved} of {visited} leaves visited");
        assert!(logged < 1000.0, "{logged} changes logged since shard 0's last checkpoint began");
        // 1000 changes a shard, a checkpoint after at most 200: four or more each.
        if visited >= 2.0 * 16.0 && checkpoints >= 4.0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "only {visited} leaves visited and {checkpoints} checkpoints written after 2000 writes"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let calls: Vec<_> = (0..2000)
        .map(|i| rankd_client::Call::new(OpKind::Rank).with("board", "r").with("player", format!("p{i}")))
        .collect();
    let replies = client.pipeline::<Value>(&calls).await.expect("ranks");
    for (i, reply) in (0..2000i64).zip(replies) {
        let above = (0..2000).filter(|j| score(*j) > score(i)).count() as u64;
        let reply = reply.expect("rank");
        let rank = reply.as_map().and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some("rank"))).map(|(_, v)| v);
        assert_eq!(rank.and_then(|v| v.as_u64()), Some(above + 1), "p{i}: {reply:?}");
    }
    // Each shard's storage gauges are published once a second: its
    // memtables hold the log of those writes (far below the 8 MiB at which
    // one is sealed), and its compaction time has a series.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (_, text) = http_get(&server.metrics_addr, "/metrics");
        let memtables = |shard: &str| sample(&text, "rankd_shard_memtable_bytes", &[shard]);
        let (first, second) = (memtables(r#"shard="0""#), memtables(r#"shard="1""#));
        assert!(first < 8e6 && second < 8e6, "memtables of {first} and {second} bytes after 2000 writes");
        if first > 0.0 && second > 0.0 {
            assert_eq!(sample(&text, "rankd_shard_sealed_memtables", &[]), 0.0, "a memtable was sealed");
            assert!(text.lines().any(|l| l.starts_with(r#"rankd_shard_compaction_seconds_total{shard="1"}"#)));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "memtable bytes not published: {first}, {second}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The runs thread runs at a low priority, so a busy shard can starve it;
/// each run it has not written holds a frozen overlay in memory. Past 4 the
/// batch loop waits for it instead of sealing more. Here a run comes every
/// 50 changed players and the runs thread sleeps 100 ms before each group
/// it writes (a testing flag), so a pipelining writer outruns it many times
/// over: with the wait taken out, 1,215 runs piled up within the 3 s.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_starved_runs_thread_holds_writes_back_instead_of_piling_up_runs() {
    const RUN_EVERY: usize = 50;
    let run_every = RUN_EVERY.to_string();
    let server = common::Server::start_with(1, &["--debug-run-every", &run_every, "--debug-runs-delay-ms", "100"]);
    let mut client = server.client().await;
    let writing = tokio::spawn(async move {
        // Three seconds, and on a loaded machine as long as the held-back
        // writes take to reach the count asserted below (within reason).
        let started = std::time::Instant::now();
        let writing_for = |secs| started.elapsed() < std::time::Duration::from_secs(secs);
        let mut written = 0;
        while writing_for(3) || (written < 10 * RUN_EVERY && writing_for(120)) {
            let calls: Vec<_> = (written..written + 2 * RUN_EVERY)
                .map(|i| rankd_client::set_call("starved", &format!("p{i}"), i as i64, Mode::Set))
                .collect();
            for reply in client.pipeline::<Value>(&calls).await.expect("pipeline") {
                reply.expect("set acknowledged");
            }
            written += calls.len();
        }
        (client, written)
    });
    let mut most = 0.0f64;
    while !writing.is_finished() {
        let (_, text) = http_get(&server.metrics_addr, "/metrics");
        most = most.max(sample(&text, "rankd_shard_unwritten_runs", &[]));
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let (mut client, written) = writing.await.expect("writer");
    assert!(written >= 10 * RUN_EVERY, "writes went on while held back: {written}");
    assert!(most >= 2.0, "the runs thread fell behind (else this proves nothing): at most {most} unwritten");
    assert!(most <= 5.0, "the loop waits for the runs thread past 4 unwritten runs, saw {most}");
    assert_eq!(client.count("starved").await.expect("count"), written as u64, "every acknowledged write is there");
    let top = client.top("starved", 1, 0).await.expect("top");
    assert_eq!(top[0].player, format!("p{}", written - 1), "and listed from the written runs");
}

/// Sends a `set` (whose commit the server's debug delay holds up) and,
/// once it is queued at its shard, SIGTERM; returns the set's answer to
/// come.
async fn sigterm_behind_a_write(server: &common::Server) -> tokio::task::JoinHandle<Result<i64, ClientError>> {
    let mut client = server.client().await;
    let write = tokio::spawn(async move { client.set("b", "p", 1, Mode::Set).await });
    common::wait_until(Duration::from_secs(30), "the write to reach its shard", async || {
        server.metric("rankd_shard_mailbox_depth", &[]) > 0.0
    })
    .await;
    let pid = server.pid().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().unwrap().success());
    write
}

/// `/readyz` answers 503 from the moment SIGTERM arrives, not only once
/// the connections are drained (up to 30 s later): a load balancer stops
/// sending clients to a port that no longer accepts them.
#[tokio::test]
async fn readyz_turns_503_as_soon_as_sigterm_arrives() {
    // A write whose commit takes 3 s keeps the drain busy.
    let mut server = common::Server::start_with(1, &["--debug-commit-delay-ms", "3000"]);
    let (status, _) = http_get(&server.metrics_addr, "/readyz");
    assert!(status.contains("200"), "readyz: {status}");
    let write = sigterm_behind_a_write(&server).await;
    common::wait_until(Duration::from_secs(2), "/readyz to answer 503 during the drain", async || {
        http_get(&server.metrics_addr, "/readyz").0.contains("503")
    })
    .await;
    assert_eq!(write.await.unwrap().expect("answered before the exit"), 1);
    assert!(server.wait_for_exit().success(), "the one SIGTERM: a clean exit");
}

/// A second SIGTERM ends a shutdown stalled on its drain at once, with exit
/// status 2 (a first one alone waits up to 30 s for the connections, and
/// then for every shard's last sync, which a hung disk never finishes).
/// Nothing acknowledged is lost: every acknowledged write is durable.
#[tokio::test]
async fn a_second_sigterm_ends_a_stalled_shutdown_at_once() {
    let mut server = common::Server::start_with(1, &["--debug-commit-delay-ms", "20000"]);
    let stalled = sigterm_behind_a_write(&server).await;
    common::wait_until(Duration::from_secs(30), "the shutdown to begin", async || {
        http_get(&server.metrics_addr, "/readyz").0.contains("503")
    })
    .await;
    let status = tokio::task::spawn_blocking(move || server.terminate()).await.expect("terminate");
    assert_eq!(status.code(), Some(2), "cut short by the second signal: {status}");
    assert!(stalled.await.unwrap().is_err(), "the stalled write was never acknowledged");
}
