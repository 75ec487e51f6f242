//! `boards` in pages (protocol 1.1, "Many boards"): byte order of names,
//! `prefix`, `after` and `limit`, a default page of 1000, the bounds, and
//! the CLI's flags, creates and drops between pages against an oracle,
//! over TCP against the real server.

mod common;

use rankd_client::{set_call, Call, Mode, OpKind};

#[tokio::test]
async fn boards_come_in_pages_in_byte_order_within_a_prefix() {
    let server = common::Server::start(2);
    let mut client = server.client().await;
    let mut names: Vec<String> = (0..2500).map(|i| format!("lvl{i}")).collect();
    let calls: Vec<Call> = names.iter().map(|board| set_call(board, "p", 1, Mode::Set)).collect();
    for reply in client.pipeline::<i64>(&calls).await.unwrap() {
        reply.unwrap();
    }
    for other in ["a", "lvm", "season"] {
        client.set(other, "p", 1, Mode::Set).await.unwrap();
    }
    names.sort();

    // Without fields: the first 1000 of every board.
    let first = client.boards().await.unwrap();
    assert_eq!(first.len(), 1000);
    assert_eq!(first[0].board, "a");
    assert_eq!(first[1].board, names[0]);

    // Page through the prefix: every lvl board once, in order, each with its player.
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let page = client.boards_page("lvl", after.as_deref(), 700).await.unwrap();
        seen.extend(page.iter().map(|b| (b.board.clone(), b.count)));
        if page.len() < 700 {
            break;
        }
        after = page.last().map(|b| b.board.clone());
    }
    assert_eq!(seen.iter().map(|(name, _)| name.clone()).collect::<Vec<_>>(), names);
    assert!(seen.iter().all(|(_, count)| *count == 1));
    assert!(client.boards_page("lvl", Some("lvl999"), 10).await.unwrap().is_empty(), "after the last");
    let page = client.boards_page("", Some("lvl999"), 10).await.unwrap();
    assert_eq!(page.iter().map(|b| b.board.as_str()).collect::<Vec<_>>(), ["lvm", "season"]);

    // Bounds.
    for call in [
        Call::new(OpKind::Boards).with("limit", 0),
        Call::new(OpKind::Boards).with("limit", 10_001),
        Call::new(OpKind::Boards).with("prefix", "x".repeat(129)),
        Call::new(OpKind::Boards).with("after", 5),
    ] {
        let err = client.call::<rmpv::Value>(call).await.unwrap_err();
        assert_eq!(err.code(), Some("bad_request"), "{err}");
    }

    // The CLI pages the same way.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rankd"))
        .args(["boards", "-s", &server.addr, "--prefix", "lvl1", "--after", "lvl10", "--limit", "3", "--json"])
        .output()
        .expect("rankd boards runs");
    let listed: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let listed: Vec<&str> = listed.as_array().unwrap().iter().map(|b| b["board"].as_str().unwrap()).collect();
    assert_eq!(listed, ["lvl100", "lvl1000", "lvl1001"]);
}

/// The board gauges: `rankd_boards` follows creates and drops at once;
/// each shard's `rankd_shard_trees` (published once a second) counts a
/// compact tree per board it holds players of, and a burst one for a big
/// board. After a restart every small board's tree is loaded frozen (idle,
/// inline), a write thaws one, and ranks read either form alike.
#[tokio::test]
async fn board_gauges_count_boards_and_trees_by_form() {
    let mut server = common::Server::start(2);
    let mut client = server.client().await;
    let calls: Vec<Call> = (0..300).map(|i| set_call(&format!("small{i}"), &format!("p{i}"), 1, Mode::Set)).collect();
    for reply in client.pipeline::<i64>(&calls).await.unwrap() {
        reply.unwrap();
    }
    let big: Vec<(String, i64)> = (0..5000).map(|i| (format!("player{i}"), i)).collect();
    let big: Vec<(&str, i64)> = big.iter().map(|(p, s)| (p.as_str(), *s)).collect();
    client.set_many("big", &big, Mode::Set).await.unwrap();
    assert_eq!(common::sample(&server.metrics_text(), "rankd_boards", &[]), Some(301.0));
    assert!(client.drop_board("small0").await.unwrap());
    assert_eq!(common::sample(&server.metrics_text(), "rankd_boards", &[]), Some(300.0));
    // One player each: 299 compact trees over the two shards (live, or
    // frozen if a checkpoint found them idle); the big board is a compact
    // tree nowhere once checkpointed, but until then counts as compact: so
    // between 299 and 301 compact trees, and 0 to 2 burst.
    let forms = |text: &str, form: &str| {
        common::sample(text, "rankd_shard_trees", &[&format!("form=\"{form}\"")]).unwrap_or(0.0)
    };
    common::wait_until(std::time::Duration::from_secs(10), "the tree gauges", async || {
        let text = server.metrics_text();
        let compact = forms(&text, "compact") + forms(&text, "frozen");
        (299.0..=301.0).contains(&compact) && compact + forms(&text, "tree") == 301.0
    })
    .await;

    drop(client);
    server.terminate();
    server.restart();
    let mut client = server.client().await;
    common::wait_until(std::time::Duration::from_secs(10), "the tree gauges after a restart", async || {
        let text = server.metrics_text();
        (forms(&text, "frozen"), forms(&text, "compact"), forms(&text, "tree")) == (299.0, 0.0, 2.0)
    })
    .await;
    let before = client.rank("small7", "p7").await.unwrap().expect("ranked on a frozen tree").rank;
    // A player beside p7 on its shard, with a better score: p7's tree thaws.
    let shard = rankd::request_path::router::shard_of("p7", 2);
    let beside = (0..).map(|i| format!("q{i}")).find(|q| rankd::request_path::router::shard_of(q, 2) == shard);
    client.set("small7", &beside.expect("some name lands there"), 5, Mode::Set).await.unwrap();
    let after = client.rank("small7", "p7").await.unwrap().expect("ranked on a thawed tree").rank;
    assert_eq!(after, before + 1);
    common::wait_until(std::time::Duration::from_secs(10), "a write thaws a tree", async || {
        let text = server.metrics_text();
        (forms(&text, "frozen"), forms(&text, "compact"), forms(&text, "tree")) == (298.0, 1.0, 2.0)
    })
    .await;
}

/// Pages against an oracle of the live names while boards are created
/// (in name order, as games make them, and at random) and dropped between
/// pages, then again after kill -9: every page is exactly what the names
/// held at its request give, whatever the router's name order did to hold
/// them (chunks filled in order, split, joined after drops, rebuilt at
/// start).
#[tokio::test]
async fn pages_equal_an_oracle_while_boards_come_and_go_and_after_kill_9() {
    use std::collections::BTreeSet;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    let mut server = common::Server::start(2);
    let mut client = server.client().await;
    let mut rng = StdRng::seed_from_u64(38);
    let mut live = BTreeSet::new();
    let mut next_in_order = 0;
    // A page of `prefix` after `after` must be the oracle's.
    async fn check_page(
        client: &mut rankd_client::Client,
        live: &BTreeSet<String>,
        prefix: &str,
        after: Option<&str>,
        limit: usize,
    ) -> Vec<String> {
        let page = client.boards_page(prefix, after, limit as u64).await.unwrap();
        let page: Vec<String> = page.into_iter().map(|b| b.board).collect();
        let from = after.filter(|after| *after >= prefix).unwrap_or(prefix);
        let want: Vec<String> = live
            .range::<str, _>((std::ops::Bound::Included(from), std::ops::Bound::Unbounded))
            .filter(|name| Some(name.as_str()) != after)
            .take_while(|name| name.starts_with(prefix))
            .take(limit)
            .cloned()
            .collect();
        assert_eq!(page, want, "prefix {prefix:?} after {after:?} limit {limit}");
        page
    }

    for round in 0..40 {
        // Creates: a run in name order, then some at random.
        let mut made: Vec<String> = (0..rng.gen_range(0..400))
            .map(|_| {
                next_in_order += 1;
                format!("lvl:{next_in_order:06}")
            })
            .collect();
        made.extend((0..rng.gen_range(0..150)).map(|_| format!("guild:{}", rng.gen_range(0..5000))));
        let calls: Vec<Call> = made.iter().map(|board| set_call(board, "p", round, Mode::Set)).collect();
        for reply in client.pipeline::<i64>(&calls).await.unwrap() {
            reply.unwrap();
        }
        live.extend(made);
        // Drops: most of a stretch of names now and then (chunks emptied), a few at random.
        let mut dropped: Vec<String> = live.iter().filter(|_| rng.gen_bool(0.03)).cloned().collect();
        if round % 5 == 4 {
            let start = rng.gen_range(0..live.len());
            dropped.extend(live.iter().skip(start).take(600).filter(|_| rng.gen_bool(0.9)).cloned());
        }
        for board in dropped {
            if live.remove(&board) {
                assert!(client.drop_board(&board).await.unwrap(), "{board} was live");
            }
        }
        // A walk through one prefix (or all), the names changing between pages.
        let prefix = ["", "lvl:", "guild:", "guild:1", "lvl:0002"][rng.gen_range(0..5)];
        let limit = rng.gen_range(1..700);
        let mut after: Option<String> = None;
        for _ in 0..4 {
            let page = check_page(&mut client, &live, prefix, after.as_deref(), limit).await;
            let Some(last) = page.last() else { break };
            after = Some(last.clone());
            let made = format!("lvl:{:06}", rng.gen_range(0..=next_in_order));
            client.set(&made, "q", 1, Mode::Set).await.unwrap();
            live.insert(made);
            if let Some(gone) = live.iter().nth(rng.gen_range(0..live.len())).cloned() {
                assert!(client.drop_board(&gone).await.unwrap());
                live.remove(&gone);
            }
        }
    }

    drop(client);
    server.kill9();
    server.restart();
    let mut client = server.client().await;
    for prefix in ["", "lvl:", "guild:"] {
        let mut after: Option<String> = None;
        let mut seen = 0;
        loop {
            let page = check_page(&mut client, &live, prefix, after.as_deref(), 997).await;
            seen += page.len();
            match page.last() {
                Some(last) if page.len() == 997 => after = Some(last.clone()),
                _ => break,
            }
        }
        assert_eq!(seen, live.iter().filter(|name| name.starts_with(prefix)).count(), "prefix {prefix:?}");
    }
    // The rebuilt order takes creates and drops as before.
    client.set("lvl:000000", "p", 1, Mode::Set).await.unwrap();
    live.insert("lvl:000000".into());
    let gone = live.iter().nth(live.len() / 2).cloned().unwrap();
    assert!(client.drop_board(&gone).await.unwrap());
    live.remove(&gone);
    check_page(&mut client, &live, "", None, 10_000).await;
}
