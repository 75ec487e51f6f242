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
}
