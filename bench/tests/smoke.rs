//! CI smoke test of `rankd-bench` (no timing is asserted): a run against a
//! real server with JSON and CSV output, a two-point shard sweep with its CSV
//! and PNG, and a run against a real Redis (`redis-server` must be on PATH;
//! `scripts/test.sh` installs it).
//!
//! The server is the `rankd` binary cargo built beside this test (`cargo
//! test --workspace` builds it for the server's own tests), or `$RANKD_BIN`.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use rankd_bench::serve::{locate_rankd, ServeProcess};
use serde_json::Value;

/// A `rankd serve` on a fresh data dir, stopped on drop.
struct Server {
    process: Option<ServeProcess>,
    addr: String,
    metrics_addr: String,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(shards: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let process = ServeProcess::start(&rankd(), &dir.path().join("data"), shards, &[]).expect("rankd serve starts");
        let (addr, metrics_addr) = (process.addr.clone(), process.metrics_addr.clone());
        Self { process: Some(process), addr, metrics_addr, _dir: dir }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(process) = self.process.take() {
            let _ = process.stop();
        }
    }
}

fn rankd() -> PathBuf {
    locate_rankd().unwrap_or_else(|e| panic!("{e}"))
}

fn rankd_bench(args: &[&str], dir: &Path) -> Output {
    let out = Command::new(env!("CARGO_BIN_EXE_rankd-bench"))
        .args(args)
        .env("RANKD_BIN", rankd())
        .current_dir(dir)
        .env("RANKD_LOG", "warn")
        .output()
        .expect("run rankd-bench");
    assert!(
        out.status.success(),
        "rankd-bench {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn read_report(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).expect("JSON report written");
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("report is not JSON ({e}): {text}"))
}

fn assert_clean(report: &Value) {
    assert!(report["ops"].as_u64().expect("ops") > 0, "no operation succeeded: {report}");
    assert_eq!(report["errors"].as_u64(), Some(0), "errors: {report}");
}

#[test]
fn bench_against_rankd_writes_json_and_csv() {
    let server = Server::start(2);
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--server",
        &server.addr,
        "--duration",
        "1",
        "--players",
        "1000",
        "--prefill",
        "--workload",
        "mixed",
        "--json",
        "out.json",
        "--csv",
        "out.csv",
        "--server-metrics",
        &server.metrics_addr,
    ];
    rankd_bench(&args, dir.path());
    let report = read_report(&dir.path().join("out.json"));
    assert_clean(&report);
    assert_eq!(report["workload"], "mixed");
    // Both processes worked through a second of load: at least a clock tick each.
    for field in ["server_cpu_seconds", "client_cpu_seconds"] {
        assert!(report[field].as_f64().is_some_and(|s| s > 0.0), "{field}: {report}");
    }
    // The machine's time is accounted too: busy at least while both worked,
    // and busy plus idle covers at least one core for the run's length.
    let machine = |field: &str| report[field].as_f64().unwrap_or_else(|| panic!("{field}: {report}"));
    let (busy, idle, seconds) = (machine("machine_busy_seconds"), machine("machine_idle_seconds"), machine("seconds"));
    assert!(busy > 0.0 && idle >= 0.0 && busy + idle >= 0.5 * seconds, "{report}");
    assert!(report["target"].as_str().unwrap().starts_with("rankd://"), "{report}");
    // The server's own latency counts exactly the run's requests (the
    // prefill's were before its first scrape), by op.
    let latency = report["server_latency"].as_object().unwrap_or_else(|| panic!("server_latency: {report}"));
    let requests: u64 = latency.values().map(|op| op["requests"].as_u64().unwrap()).sum();
    assert_eq!(requests, report["ops"].as_u64().unwrap(), "{report}");
    assert!(latency.contains_key("set") && latency.contains_key("rank"), "mixed runs sets and ranks: {report}");
    for (op, figures) in latency {
        let (p50, p99, slow) =
            (figures["p50_us"].as_f64().unwrap(), figures["p99_us"].as_f64().unwrap(), figures["over_1ms"].as_f64());
        assert!(0.0 < p50 && p50 <= p99 && slow.is_some_and(|s| (0.0..=1.0).contains(&s)), "{op}: {figures}");
    }
    for field in ["p50_us", "p99_us", "p999_us", "max_us", "ops_per_sec"] {
        assert!(report[field].is_number(), "{field} missing: {report}");
    }
    let csv = std::fs::read_to_string(dir.path().join("out.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines.len(), 2, "header + one row:\n{csv}");
    assert!(lines[0].starts_with("target,") && lines[0].contains("ops_per_sec"), "{csv}");
    assert_eq!(lines[0].split(',').count(), lines[1].split(',').count(), "{csv}");

    // No seed given: one was drawn, and is reported so the run can be repeated.
    let drawn = report["seed"].as_u64().unwrap_or_else(|| panic!("seed: {report}"));

    // A second run appends a row without a second header (zipf keys this
    // time), with the seed it was given.
    let args = ["--server", &server.addr, "--ops", "2000", "--players", "1000", "--distribution", "zipf", "--csv"];
    let seeded = ["out.csv", "--seed", "42", "--json", "seeded.json"];
    rankd_bench(&[&args[..], &seeded].concat(), dir.path());
    assert_eq!(read_report(&dir.path().join("seeded.json"))["seed"].as_u64(), Some(42));
    // Drawn afresh each run: a measurement does not replay its warm-up's
    // keys (2^-64 that two draws meet).
    rankd_bench(&["--server", &server.addr, "--ops", "10", "--json", "again.json"], dir.path());
    let again = read_report(&dir.path().join("again.json"))["seed"].as_u64();
    assert!(again.is_some_and(|again| again != drawn), "{again:?} after {drawn}");
    let csv = std::fs::read_to_string(dir.path().join("out.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3, "{csv}");
    assert_eq!(csv.lines().filter(|l| l.starts_with("target,")).count(), 1, "{csv}");

    // A metrics address that does not answer fails the run up front.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_rankd-bench"))
        .args(["--server", &server.addr, "--ops", "10", "--server-metrics", &closed])
        .output()
        .expect("run rankd-bench");
    assert!(!out.status.success(), "a dead metrics address was accepted");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&closed), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `--rate` paces the load: batch k of each connection starts no earlier
/// than k * (pipeline * connections / rate), so however fast the server
/// answers, a run offers at most `rate` ops per second plus the batches due
/// at time zero. (Unpaced, this load runs thousands of ops per second.)
#[test]
fn rate_caps_the_offered_load() {
    let server = Server::start(1);
    let dir = tempfile::tempdir().unwrap();
    let args = ["--server", &server.addr, "--players", "1000", "--prefill", "-w", "rank", "-c", "2", "-d", "4"];
    let paced = ["--rate", "400", "--duration", "1", "--json", "paced.json"];
    rankd_bench(&[&args[..], &paced].concat(), dir.path());
    let report = read_report(&dir.path().join("paced.json"));
    assert_clean(&report);
    assert_eq!(report["offered_rate"].as_f64(), Some(400.0), "{report}");
    let (ops, seconds) = (report["ops"].as_f64().unwrap(), report["seconds"].as_f64().unwrap());
    assert!(ops <= 400.0 * seconds + 2.0 * 4.0, "{ops} ops in {seconds} s offered at 400/s: {report}");
}

#[test]
fn sweep_writes_csv_and_png() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["sweep", "--shards", "1,2", "--connection-counts", "1,4", "--pipeline", "1", "--duration", "1"];
    let out = rankd_bench(&[&args[..], &["--players", "1000", "--prefill", "--out-dir", "tmp"]].concat(), dir.path());
    let csv = std::fs::read_to_string(dir.path().join("tmp/sweep.csv")).expect("sweep.csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "shards,connections,pipeline,workload,ops_per_sec,p50_us,p99_us,p999_us,target,server_cores,\
         server_cpu_us_per_op,ops_per_server_core,client_cores,machine_idle_cores,scaling",
        "{csv}"
    );
    assert_eq!(lines.len(), 5, "four data rows:\n{csv}\nstdout:\n{}", String::from_utf8_lossy(&out.stdout));
    let field = |row: usize, column: usize| lines[row].split(',').nth(column).unwrap();
    let number = |row: usize, column: usize| field(row, column).parse::<f64>().unwrap();
    // Each shard count's server, at each connection count.
    for (row, (shards, connections)) in [("1", "1"), ("1", "4"), ("2", "1"), ("2", "4")].into_iter().enumerate() {
        let row = row + 1;
        assert_eq!((field(row, 0), field(row, 1), field(row, 2)), (shards, connections, "1"), "{csv}");
        assert!(number(row, 4) > 0.0, "no throughput: {csv}");
        assert!(field(row, 8).starts_with("rankd://127.0.0.1:"), "{csv}");
        // Each server's CPU, read from its metrics, and the generator's.
        for column in [9, 10, 11, 12] {
            assert!(field(row, column).parse::<f64>().is_ok_and(|x| x > 0.0), "no CPU figure: {csv}");
        }
        // Operations a server core gives: throughput over the server's cores.
        assert!((number(row, 11) / (number(row, 4) / number(row, 9)) - 1.0).abs() < 0.05, "{csv}");
        // And the machine's idle cores (zero when a run was CPU-bound).
        assert!(number(row, 13) >= 0.0, "no idle figure: {csv}");
    }
    // Scaling: each run's throughput over linear growth from one shard's at
    // the same connection count.
    assert_eq!((number(1, 14), number(2, 14)), (1.0, 1.0), "{csv}");
    for (one_shard, two_shards) in [(1, 3), (2, 4)] {
        let linear = 2.0 * number(one_shard, 4);
        assert!((number(two_shards, 14) - number(two_shards, 4) / linear).abs() < 0.01, "{csv}");
    }
    // One prefill a server: the second connection count finds the board filled.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.matches("prefilled 1000 players").count(), 2, "{stderr}");
    let json: Value = serde_json::from_slice(&std::fs::read(dir.path().join("tmp/sweep.json")).unwrap()).unwrap();
    assert_eq!(json["rankd"].as_array().map(Vec::len), Some(4), "{json}");
    assert_eq!(json["rankd"][1]["connections"], 4, "{json}");
    let png = std::fs::read(dir.path().join("tmp/sweep.png")).expect("sweep.png");
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n", "sweep.png is not a PNG");
}

/// A throwaway `redis-server` on a free loopback port, killed on drop.
struct Redis {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Redis {
    fn start() -> Self {
        let found = Command::new("redis-server").arg("--version").stdout(Stdio::null()).status();
        assert!(
            found.is_ok_and(|s| s.success()),
            "redis-server is not on PATH: install it (Debian: apt-get install redis-server; \
             scripts/test.sh does this) to run the Redis comparison smoke test"
        );
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let child = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(dir.path())
            .stdout(Stdio::null())
            .spawn()
            .expect("start redis-server");
        let redis = Self { child, port, _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not listen on {port} within 10 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        redis
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn bench_against_redis() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let target = format!("redis://127.0.0.1:{}", redis.port);
    for (workload, json) in [("mixed", "mixed.json"), ("around", "around.json")] {
        let args = [
            "--target",
            &target,
            "--duration",
            "1",
            "--players",
            "1000",
            "--prefill",
            "--workload",
            workload,
            "--json",
            json,
        ];
        rankd_bench(&args, dir.path());
        let report = read_report(&dir.path().join(json));
        assert_clean(&report);
        assert_eq!(report["target"].as_str(), Some(target.as_str()), "{report}");
        assert!(report["server_version"].is_string(), "no Redis version: {report}");
        assert!(report["server_cpu_seconds"].as_f64().is_some_and(|s| s > 0.0), "no Redis CPU: {report}");
    }
}

/// Runs `scripts/<name>` with `args` against a tiny, brief load (no warm-up,
/// one measured second, plus `env`) on this build's binaries; returns what
/// it printed once it succeeded.
fn run_script(name: &str, args: &[&str], env: &[(&str, &str)]) -> String {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts").join(name);
    let out = Command::new("bash")
        .arg(&script)
        .args(args)
        .env("RANKD", rankd())
        .env("RANKD_BENCH", env!("CARGO_BIN_EXE_rankd-bench"))
        .env("RANKD_LOG", "warn")
        .env("WARM", "0")
        .env("DURATION", "1")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run scripts/{name}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{name} failed ({}):\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// `scripts/stalls.sh` (tail latency beside the server's slow steps) runs
/// end to end on a tiny board and prints its five lines with a real run.
#[test]
fn stalls_script_reports_a_run() {
    let stdout = run_script("stalls.sh", &["2", "2000"], &[]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 5, "{stdout}");
    let ops: f64 = lines[0]
        .strip_prefix("set ")
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no throughput in {stdout}"));
    assert!(ops > 0.0, "{stdout}");
    for (line, step) in lines[1..].iter().zip(["apply", "seal", "journal write", "fsync"]) {
        assert!(line.trim_start().starts_with(step) && line.contains("over 100 ms:"), "{stdout}");
    }
}

/// `scripts/server-cost.sh` (a server's CPU an op, thread by thread) runs
/// end to end on a tiny board: a line a workload, with the CPU an op and,
/// for the writes, their fsyncs.
#[test]
fn server_cost_script_reports_each_workload() {
    let stdout = run_script("server-cost.sh", &["8", "1", "set", "rank"], &[("PLAYERS", "2000")]);
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    // The figures after the build and the workload, without the `|`s.
    let columns = |line: &str| -> Vec<f64> {
        line.split_whitespace()
            .skip(2)
            .filter(|field| *field != "|")
            .map(|field| field.parse().unwrap_or_else(|_| panic!("{field:?} is no figure: {stdout}")))
            .collect()
    };
    for (line, workload) in lines[1..].iter().zip(["set", "rank"]) {
        assert_eq!(line.split_whitespace().nth(1), Some(workload), "{stdout}");
        let figures = columns(line);
        let [ops, _p99, _cores, us_an_op, io, _shard, _commit, _runs, _fjall, _rest, fsyncs, writes_a_sync, _, _] =
            figures[..]
        else {
            panic!("not 14 figures: {stdout}")
        };
        assert!(ops > 0.0 && us_an_op > 0.0 && io > 0.0, "{stdout}");
        if workload == "set" {
            assert!(fsyncs > 0.0 && writes_a_sync >= 1.0, "writes with no fsync: {stdout}");
        }
    }
}

#[test]
fn watch_latency_and_wids_against_rankd() {
    let server = Server::start(2);
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "watch-latency",
        "--server",
        &server.addr,
        "--watchers",
        "80",
        "--writes-per-sec",
        "100",
        "--duration-secs",
        "1",
        "--drain-secs",
        "1",
        "--interval-ms",
        "20",
        "--server-metrics",
        &server.metrics_addr,
        "--json",
        "watch.json",
        "--csv",
        "watch.csv",
    ];
    let out = rankd_bench(&args, dir.path());
    let report = read_report(&dir.path().join("watch.json"));
    assert_eq!((report["watches"].as_u64(), report["connections"].as_u64()), (Some(80), Some(2)), "{report}");
    assert!(report["writes"].as_u64().unwrap() > 0 && report["write_errors"] == 0, "{report}");
    // Every watch saw pushes, and the last write by the end of the drain.
    assert!(report["timed"].as_u64().unwrap() >= 80, "{report}");
    assert_eq!((report["stale_watches"].as_u64(), report["unacknowledged"].as_u64()), (Some(0), Some(0)), "{report}");
    assert!(report["p50_us"].as_u64().unwrap() <= report["max_us"].as_u64().unwrap(), "{report}");
    // The server counted at least the pushes received after the first write.
    let server_pushes = report["server"]["pushes"].as_f64().unwrap_or_else(|| panic!("server counts: {report}"));
    assert!(server_pushes >= report["pushes"].as_f64().unwrap(), "{report}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("push latency p50"));
    let csv = std::fs::read_to_string(dir.path().join("watch.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!((lines.len(), lines[0].split(',').count()), (2, lines[1].split(',').count()), "{csv}");

    // Writes with a wid each: all applied, none a replay.
    let args = ["--server", &server.addr, "--ops", "3000", "--mode", "incr", "--wid", "--json", "wid.json"];
    rankd_bench(&[&args[..], &["--server-metrics", &server.metrics_addr]].concat(), dir.path());
    let report = read_report(&dir.path().join("wid.json"));
    assert_clean(&report);
    assert_eq!(report["wid"], true, "{report}");
    assert_eq!(report["ops"].as_u64(), Some(3000), "{report}");
    // The server kept a record of each wid (its gauge is published once a
    // second), and replayed none.
    let records = |page: &str| -> f64 {
        page.lines()
            .filter(|line| line.starts_with("rankd_dedup_records{"))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let page = loop {
        let page = metrics_page(&server.metrics_addr);
        if records(&page) >= 3000.0 || Instant::now() > deadline {
            break page;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(records(&page) >= 3000.0, "{} wid records", records(&page));
    assert!(page.lines().any(|line| line == "rankd_dedup_hits_total 0"), "a replay counted:\n{page}");
}

/// The Prometheus page at `addr`.
fn metrics_page(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.write_all(format!("GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).unwrap();
    let mut page = String::new();
    stream.read_to_string(&mut page).unwrap();
    page
}
