//! `rankd import` and `rankd export` against the real server: a 1M-player
//! CSV round trip in rank order, and a msgpack import.

mod common;

use std::io::{Read, Write};
use std::process::Command;

use rand::{Rng, SeedableRng};

fn rankd(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_rankd")).args(args).output().expect("run rankd");
    assert!(out.status.success(), "rankd {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_million_players_round_trip_in_rank_order() {
    const PLAYERS: usize = 1_000_000;
    let server = common::Server::start(2);
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.csv");
    let mut rng = rand::rngs::StdRng::seed_from_u64(6);
    let mut expected: Vec<(String, i64)> = Vec::with_capacity(PLAYERS);
    {
        let mut file = std::io::BufWriter::new(std::fs::File::create(&input).unwrap());
        writeln!(file, "board,player,score").unwrap();
        for i in 0..PLAYERS {
            // A narrow score range, so many players tie and ranks repeat.
            let (player, score) = (format!("player-{i}"), rng.gen_range(-50_000..50_000i64));
            writeln!(file, "big,{player},{score}").unwrap();
            expected.push((player, score));
        }
    }
    let report = rankd(&["import", "-q", "-s", &server.addr, input.to_str().unwrap()]);
    assert!(report.contains(&format!("imported {PLAYERS} rows")), "{report}");

    let output = dir.path().join("out.csv");
    rankd(&["export", "-s", &server.addr, "big", "-o", output.to_str().unwrap()]);
    // Rank order: best score first, equal scores by player name bytes;
    // competition ranks.
    expected.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())));
    let mut reader = csv::Reader::from_path(&output).unwrap();
    let mut rank = 0u64;
    let mut rows = 0usize;
    for (i, record) in reader.records().enumerate() {
        let record = record.unwrap();
        let (player, score) = &expected[i];
        if i == 0 || expected[i - 1].1 != *score {
            rank = i as u64 + 1;
        }
        assert_eq!(&record[0], "big");
        assert_eq!((&record[1], record[2].parse::<i64>().unwrap()), (player.as_str(), *score), "row {i}");
        assert_eq!(record[3].parse::<u64>().unwrap(), rank, "rank of row {i}");
        rows += 1;
    }
    assert_eq!(rows, PLAYERS);

    // The export reads back in: a second board with the same content.
    let text = std::fs::read_to_string(&output).unwrap().replacen("\nbig,", "\ncopy,", 1).replace("\nbig,", "\ncopy,");
    let copy = dir.path().join("copy.csv");
    std::fs::write(&copy, text).unwrap();
    rankd(&["import", "-q", "-s", &server.addr, copy.to_str().unwrap()]);
    let out = Command::new(env!("CARGO_BIN_EXE_rankd")).args(["count", "-s", &server.addr, "copy"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), PLAYERS.to_string());
}

#[test]
fn msgpack_streams_import_and_bad_rows_are_refused() {
    let server = common::Server::start(1);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("in.msgpack");
    let mut bytes = Vec::new();
    for (board, player, score) in [("a", "x", 3i64), ("a", "y", 9), ("b", "x", -1)] {
        let row = rmpv::Value::Array(vec![board.into(), player.into(), score.into()]);
        rmpv::encode::write_value(&mut bytes, &row).unwrap();
    }
    std::fs::write(&path, &bytes).unwrap();
    rankd(&["import", "-q", "--format", "msgpack", "-s", &server.addr, path.to_str().unwrap()]);
    let top =
        Command::new(env!("CARGO_BIN_EXE_rankd")).args(["top", "--json", "-s", &server.addr, "a"]).output().unwrap();
    let top: serde_json::Value = serde_json::from_slice(&top.stdout).unwrap();
    assert_eq!(top[0]["player"], "y");
    assert_eq!(top[1]["score"], 3);

    let bad = dir.path().join("bad.csv");
    std::fs::write(&bad, "a,p,1\na,q,not-a-number\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_rankd"))
        .args(["import", "-q", "-s", &server.addr, bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("row 2"), "names the bad row");
    // A pipeline of 0 would never fill: refused, not the whole file held.
    let out = Command::new(env!("CARGO_BIN_EXE_rankd"))
        .args(["import", "-q", "--pipeline", "0", "-s", &server.addr, bad.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--pipeline must be at least 1"));
}

#[test]
fn boards_with_fields_round_trip_one_column_per_field() {
    let server = common::Server::start(2);
    let dir = tempfile::tempdir().unwrap();
    let cli = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_rankd")).args(args).output().expect("run rankd");
        (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (ok, _) = cli(&[
        "create-board",
        "-s",
        &server.addr,
        "cup",
        "--field",
        "trophies:desc:0:1000",
        "--field",
        "retries:asc:0:100",
    ]);
    assert!(ok, "create-board with fields");
    // Most trophies first, then fewest retries; the columns in any order.
    let mut rng = rand::rngs::StdRng::seed_from_u64(35);
    let mut expected: Vec<(String, i64, i64)> =
        (0..3000).map(|i| (format!("p{i}"), rng.gen_range(0..=20), rng.gen_range(0..=100))).collect();
    let input = dir.path().join("in.csv");
    let mut text = String::from("board,player,retries,trophies\n");
    for (player, trophies, retries) in &expected {
        text.push_str(&format!("cup,{player},{retries},{trophies}\n"));
    }
    std::fs::write(&input, text).unwrap();
    rankd(&["import", "-q", "-s", &server.addr, input.to_str().unwrap()]);

    let output = dir.path().join("out.csv");
    rankd(&["export", "-s", &server.addr, "cup", "-o", output.to_str().unwrap()]);
    expected.sort_by(|a, b| b.1.cmp(&a.1).then(a.2.cmp(&b.2)).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())));
    let mut reader = csv::Reader::from_path(&output).unwrap();
    assert_eq!(reader.headers().unwrap(), vec!["board", "player", "trophies", "retries", "rank"]);
    let mut rank = 0;
    for (i, record) in reader.records().enumerate() {
        let record = record.unwrap();
        let (player, trophies, retries) = &expected[i];
        if i == 0 || (expected[i - 1].1, expected[i - 1].2) != (*trophies, *retries) {
            rank = i + 1;
        }
        let got = (&record[1], record[2].parse::<i64>().unwrap(), record[3].parse::<i64>().unwrap());
        assert_eq!(got, (player.as_str(), *trophies, *retries), "row {i}");
        assert_eq!(record[4].parse::<usize>().unwrap(), rank, "rank of row {i}");
    }

    // The export reads back into a board with the same fields.
    cli(&["create-board", "-s", &server.addr, "copy", "--field", "trophies:desc:1000", "--field", "retries:asc:100"]);
    let copy = dir.path().join("copy.csv");
    std::fs::write(&copy, std::fs::read_to_string(&output).unwrap().replace("\ncup,", "\ncopy,")).unwrap();
    rankd(&["import", "-q", "-s", &server.addr, copy.to_str().unwrap()]);
    let (_, top) = cli(&["top", "--json", "-s", &server.addr, "copy", "--limit", "1"]);
    let top: serde_json::Value = serde_json::from_str(&top).unwrap();
    assert_eq!(top[0]["player"], expected[0].0.as_str());
    assert_eq!(top[0]["score"]["retries"], expected[0].2);

    // msgpack rows carry maps; an integer score on this board is refused.
    let path = dir.path().join("in.msgpack");
    let score = rmpv::Value::Map(vec![("trophies".into(), 1000.into()), ("retries".into(), 0.into())]);
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &rmpv::Value::Array(vec!["cup".into(), "max".into(), score])).unwrap();
    std::fs::write(&path, &bytes).unwrap();
    rankd(&["import", "-q", "--format", "msgpack", "-s", &server.addr, path.to_str().unwrap()]);
    let (_, rank) = cli(&["rank", "-s", &server.addr, "cup", "max"]);
    assert_eq!(rank.trim(), "rank 1 of 3001 (score trophies=1000,retries=0)");
    let plain = dir.path().join("plain.csv");
    std::fs::write(&plain, "cup,p,5\n").unwrap();
    let (ok, _) = cli(&["import", "-q", "-s", &server.addr, plain.to_str().unwrap()]);
    assert!(!ok, "an integer score on a board with fields");
}

/// A board whose first field is named `score`: its export's header
/// (`board,player,score,time,rank`) reads back as fields, not as a plain
/// score followed by a column to ignore.
#[test]
fn a_board_whose_first_field_is_named_score_round_trips() {
    let server = common::Server::start(1);
    let dir = tempfile::tempdir().unwrap();
    for board in ["race", "copy"] {
        let fields = ["--field", "score:desc:0:1000", "--field", "time:asc:0:100000"];
        rankd(&[&["create-board", "-s", &server.addr, board][..], &fields[..]].concat());
    }
    let input = dir.path().join("in.csv");
    std::fs::write(&input, "board,player,score,time\nrace,ann,7,300\nrace,bob,7,250\nrace,cy,9,900\n").unwrap();
    rankd(&["import", "-q", "-s", &server.addr, input.to_str().unwrap()]);
    let output = dir.path().join("out.csv");
    rankd(&["export", "-s", &server.addr, "race", "-o", output.to_str().unwrap()]);
    let exported = std::fs::read_to_string(&output).unwrap();
    assert_eq!(exported, "board,player,score,time,rank\nrace,cy,9,900,1\nrace,bob,7,250,2\nrace,ann,7,300,3\n");
    let copy = dir.path().join("copy.csv");
    std::fs::write(&copy, exported.replace("\nrace,", "\ncopy,")).unwrap();
    rankd(&["import", "-q", "-s", &server.addr, copy.to_str().unwrap()]);
    let again = dir.path().join("again.csv");
    rankd(&["export", "-s", &server.addr, "copy", "-o", again.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&again).unwrap(), exported.replace("\nrace,", "\ncopy,"));
}

/// `incr` rows of `players` players: row `i` (0-based, after the header)
/// adds `i % 7 + 1` to player `i % players`. Returns the CSV text and
/// each player's total over the first `upto` rows for any `upto`.
fn incr_rows(rows: usize, players: usize) -> (String, impl Fn(usize) -> Vec<i64>) {
    let mut text = String::from("board,player,score\n");
    for i in 0..rows {
        text.push_str(&format!("tally,p{},{}\n", i % players, i % 7 + 1));
    }
    let totals = move |upto: usize| {
        let mut totals = vec![0i64; players];
        for i in 0..upto.min(rows) {
            totals[i % players] += (i % 7 + 1) as i64;
        }
        totals
    };
    (text, totals)
}

/// Every player's score on `tally`, p0 first.
fn tally(addr: &str, players: usize) -> Vec<i64> {
    let args = ["top", "--json", "-s", addr, "tally", "--limit", "1000"];
    let out = Command::new(env!("CARGO_BIN_EXE_rankd")).args(args).output().expect("run rankd top");
    let top: serde_json::Value = serde_json::from_slice(&out.stdout).expect("top as JSON");
    let mut scores = vec![0i64; players];
    for entry in top.as_array().expect("a list") {
        let player: usize = entry["player"].as_str().unwrap()[1..].parse().unwrap();
        scores[player] = entry["score"].as_i64().unwrap();
    }
    scores
}

/// The `--resume-after` and `--run-id` a failed import printed.
fn resume_point(stderr: &str) -> (u64, String) {
    let after = stderr.split("--resume-after ").nth(1).expect("a --resume-after in the message");
    let (row, rest) = after.split_once(" --run-id ").expect("a --run-id after it");
    let run = rest.split_whitespace().next().expect("the run id");
    (row.parse().expect("a row number"), run.to_string())
}

/// An `incr` import stopped by a bad row says how far it wrote and how to
/// go on; resumed from before that point, the rows it sends again count
/// once, because each request's `wid` names its run and rows.
#[test]
fn an_import_stopped_by_a_bad_row_resumes_and_counts_each_row_once() {
    const ROWS: usize = 25_000;
    const PLAYERS: usize = 20;
    const BAD: usize = 17_000; // 0-based data row; file row BAD + 2
    let server = common::Server::start(2);
    let dir = tempfile::tempdir().unwrap();
    let (text, totals) = incr_rows(ROWS, PLAYERS);
    let good_line = format!("tally,p{},{}\n", BAD % PLAYERS, BAD % 7 + 1);
    let bad_line = format!("tally,p{},oops\n", BAD % PLAYERS);
    let at = text.match_indices('\n').nth(BAD).unwrap().0 + 1; // after the header and BAD rows
    assert!(text[at..].starts_with(&good_line));
    let input = dir.path().join("in.csv");
    std::fs::write(&input, format!("{}{}{}", &text[..at], bad_line, &text[at + good_line.len()..])).unwrap();
    let import = |extra: &[&str]| {
        let mut args = vec!["import", "-q", "--mode", "incr", "--batch", "1000", "-s", &server.addr];
        args.extend_from_slice(extra);
        args.push(input.to_str().unwrap());
        Command::new(env!("CARGO_BIN_EXE_rankd")).args(&args).output().expect("run rankd import")
    };

    let failed = import(&[]);
    assert!(!failed.status.success());
    let stderr = String::from_utf8_lossy(&failed.stderr);
    assert!(stderr.contains(&format!("row {}", BAD + 2)), "names the bad row: {stderr}");
    let (written, run) = resume_point(&stderr);
    assert!((10_000..=BAD as u64 + 1).contains(&written), "{written}: {stderr}");
    // Exactly the rows up to the one it names are written: file row r is
    // data row r - 2.
    assert_eq!(tally(&server.addr, PLAYERS), totals(written as usize - 1), "rows up to {written}");

    // Fixed, and resumed 3000 rows (three requests) early: those are sent
    // again with their first wids and must not count twice.
    std::fs::write(&input, &text).unwrap();
    let early = (written - 3000).to_string();
    let resumed = import(&["--resume-after", &early, "--run-id", &run]);
    let stderr = String::from_utf8_lossy(&resumed.stderr);
    assert!(resumed.status.success(), "{stderr}");
    assert!(stderr.contains(&format!("imported {} rows", ROWS as u64 + 1 - (written - 3000))), "{stderr}");
    assert_eq!(tally(&server.addr, PLAYERS), totals(ROWS), "every row counted once");
}

/// A server killed -9 and restarted in the middle of an `incr` import: the
/// import reconnects, sends the unanswered requests again with their
/// `wid`s, and finishes with every row counted once.
#[test]
fn an_import_rides_out_a_server_restart_and_counts_each_row_once() {
    const ROWS: usize = 200_000;
    const PLAYERS: usize = 100;
    let listen = format!("127.0.0.1:{}", common::free_port());
    let mut server = common::Server::start_with(2, &["--listen", &listen]);
    let dir = tempfile::tempdir().unwrap();
    let (text, totals) = incr_rows(ROWS, PLAYERS);
    let input = dir.path().join("in.csv");
    std::fs::write(&input, &text).unwrap();
    let import = Command::new(env!("CARGO_BIN_EXE_rankd"))
        .args(["import", "-q", "--mode", "incr", "--batch", "100", "--pipeline", "2", "-s", &server.addr])
        .arg(&input)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start rankd import");
    let mut import = common::Running(import);
    // Kill it a fifth of the way in, while requests are in flight.
    let fifth = totals(ROWS)[0] / 5;
    common::wait_for_blocking(std::time::Duration::from_secs(60), "a fifth of the import", || {
        let p0 = tally(&server.addr, PLAYERS)[0];
        if p0 >= fifth {
            Ok(())
        } else {
            Err(format!("p0 at {p0}"))
        }
    });
    server.kill9();
    std::thread::sleep(std::time::Duration::from_millis(300));
    server.restart();
    let mut stderr = String::new();
    import.0.stderr.take().expect("piped").read_to_string(&mut stderr).expect("its stderr");
    let status = import.0.wait().expect("the import ends");
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains(&format!("imported {ROWS} rows")) && stderr.contains("sent again"), "{stderr}");
    assert_eq!(tally(&server.addr, PLAYERS), totals(ROWS), "every row counted once across the restart");
}
