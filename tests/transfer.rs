//! `rankd import` and `rankd export` against the real server: a 1M-player
//! CSV round trip in rank order, and a msgpack import.

mod common;

use std::io::Write;
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
