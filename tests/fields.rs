//! Composite scores (protocol 1.1 `fields`) against the real server and a
//! brute-force oracle: boards with random fields (2–4, random orders and
//! ranges, narrow ones so ties abound), every tie rule and write mode
//! (`incr` included, in range and out of it), on 1, 4 and 7 shards, read
//! through every op in two windows; then the refusals protocol.md lists,
//! `boards`' listing, and a kill -9 restart.

mod common;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use futures::StreamExt;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rankd_client::{
    BoardSpec, Call, Client, ClientError, Entry, FieldScores, FieldSpec, Mode, OpKind, Order, Ties, WatchEvent,
    WatchSpec, Watcher, Window,
};

const PLAYERS: usize = 60;

/// One board's expected state: each present player's values (in declared
/// field order) and when they reached them (for `ordinal`).
#[derive(Clone)]
struct Oracle {
    fields: Vec<FieldSpec>,
    ties: Ties,
    players: BTreeMap<String, (Vec<i64>, u64)>,
    reached: u64,
}

impl Oracle {
    /// `Less` when `a` is the better score, field by field.
    fn compare(&self, a: &[i64], b: &[i64]) -> Ordering {
        for (field, (x, y)) in self.fields.iter().zip(a.iter().zip(b)) {
            let by_field = match field.order {
                Order::Desc => y.cmp(x),
                Order::Asc => x.cmp(y),
            };
            if by_field != Ordering::Equal {
                return by_field;
            }
        }
        Ordering::Equal
    }

    fn in_range(&self, values: &[i64]) -> bool {
        self.fields.iter().zip(values).all(|(f, v)| (f.min..=f.max).contains(v))
    }

    /// The stored values after a write, or `None` if the server must refuse it.
    fn written(&self, player: &str, values: &[i64], mode: Mode) -> Option<Vec<i64>> {
        let old = self.players.get(player).map(|(v, _)| v.clone());
        let new = match (mode, old) {
            (Mode::Set, _) | (Mode::Best, None) => values.to_vec(),
            (Mode::Best, Some(old)) => match self.compare(&old, values) {
                Ordering::Greater => values.to_vec(),
                _ => old,
            },
            (Mode::Incr, old) => {
                let old = old.unwrap_or_else(|| vec![0; self.fields.len()]);
                old.iter().zip(values).map(|(o, d)| o + d).collect()
            }
        };
        self.in_range(&new).then_some(new)
    }

    fn apply(&mut self, player: &str, new: Vec<i64>) {
        if self.players.get(player).is_some_and(|(old, _)| *old == new) {
            return; // unchanged: keeps when it was reached
        }
        self.reached += 1;
        self.players.insert(player.to_string(), (new, self.reached));
    }

    /// Every present player, best first, in the protocol's list order.
    fn listed(&self) -> Vec<(String, Vec<i64>, u64)> {
        let mut rows: Vec<(&String, &(Vec<i64>, u64))> = self.players.iter().collect();
        rows.sort_by(|(na, (va, ra)), (nb, (vb, rb))| {
            self.compare(va, vb).then_with(|| match self.ties {
                Ties::Ordinal => ra.cmp(rb),
                _ => na.as_bytes().cmp(nb.as_bytes()),
            })
        });
        let mut out = Vec::with_capacity(rows.len());
        for (i, (name, (values, _))) in rows.iter().enumerate() {
            let rank = match self.ties {
                Ties::Ordinal => i as u64 + 1,
                _ => self.rank_of(values, false),
            };
            out.push(((*name).clone(), values.clone(), rank));
        }
        out
    }

    /// The rank `values` get: one plus the players (or, for `dense`, the
    /// distinct scores) strictly better, or better-or-equal for a newcomer
    /// on an `ordinal` board.
    fn rank_of(&self, values: &[i64], newcomer: bool) -> u64 {
        let better = |other: &Vec<i64>| match self.compare(other, values) {
            Ordering::Less => true,
            Ordering::Equal => newcomer && self.ties == Ties::Ordinal,
            Ordering::Greater => false,
        };
        let scores = self.players.values().map(|(v, _)| v).filter(|v| better(v));
        1 + match self.ties {
            Ties::Dense => scores.collect::<BTreeSet<_>>().len() as u64,
            _ => scores.count() as u64,
        }
    }

    fn shown(&self, values: &[i64]) -> FieldScores {
        self.fields.iter().zip(values).map(|(f, v)| (f.name.clone(), *v)).collect()
    }

    fn random_values(&self, rng: &mut StdRng) -> Vec<i64> {
        self.fields.iter().map(|f| rng.gen_range(f.min..=f.max)).collect()
    }
}

fn random_fields(rng: &mut StdRng) -> Vec<FieldSpec> {
    let n = rng.gen_range(2..=4);
    (0..n)
        .map(|i| {
            let min = rng.gen_range(-5..5);
            let order = if rng.gen() { Order::Desc } else { Order::Asc };
            FieldSpec { name: format!("f{i}"), order, min, max: min + rng.gen_range(0..4) }
        })
        .collect()
}

fn bad_request<T: std::fmt::Debug>(result: Result<T, ClientError>, what: &str) {
    match result {
        Err(e) => assert_eq!(e.code(), Some("bad_request"), "{what}: {e}"),
        Ok(v) => panic!("{what}: accepted, answered {v:?}"),
    }
}

/// Every read equals the oracle: `top` (whole and paged), `rank`, `get`,
/// `around`, `ranks`, `rank_of_score`, in both windows.
async fn check_reads(client: &mut Client, board: &str, oracle: &Oracle, names: &[String], rng: &mut StdRng) {
    let want: Vec<Entry<FieldScores>> = (oracle.listed().into_iter())
        .map(|(player, values, rank)| Entry { player, score: oracle.shown(&values), rank })
        .collect();
    for window in ["all", "daily"] {
        let call = Call::new(OpKind::Top).with("board", board).with("limit", 1000).with("window", window);
        let top: Vec<Entry<FieldScores>> = client.call(call).await.expect("top");
        assert_eq!(top, want, "{board}: top in {window}");
    }
    let offset = rng.gen_range(0..=want.len() as u64);
    let page = client.top_fields(board, 7, offset).await.expect("top page");
    assert_eq!(page[..], want[(offset as usize).min(want.len())..want.len().min(offset as usize + 7)]);
    for name in names.choose_multiple(rng, 10) {
        let at = want.iter().position(|e| e.player == *name);
        let rank = client.rank_fields(board, name).await.expect("rank");
        let got = client.get_fields(board, name).await.expect("get");
        match at {
            None => assert!(rank.is_none() && got.is_none(), "{board}: {name} is absent"),
            Some(i) => {
                let rank = rank.expect("a present player's rank");
                assert_eq!((rank.rank, &rank.score, rank.count), (want[i].rank, &want[i].score, want.len() as u64));
                assert_eq!(got.as_ref(), Some(&want[i].score));
                let around = client.around_fields(board, name, 2, 3).await.expect("around");
                assert_eq!(around[..], want[i.saturating_sub(2)..want.len().min(i + 4)], "{board}: around {name}");
            }
        }
    }
    let mut asked: Vec<&str> = names.choose_multiple(rng, 15).map(String::as_str).collect();
    asked.extend(["stranger", asked[0]]);
    let ranks = client.ranks_fields(board, &asked).await.expect("ranks");
    let named: BTreeSet<&str> = asked.iter().copied().collect();
    let wanted: Vec<Entry<FieldScores>> = want.iter().filter(|e| named.contains(e.player.as_str())).cloned().collect();
    assert_eq!(ranks, wanted, "{board}: ranks");
    for _ in 0..10 {
        let values = oracle.random_values(rng);
        let rank = client.rank_of_fields(board, &oracle.shown(&values)).await.expect("rank_of_score");
        assert_eq!(rank, oracle.rank_of(&values, true), "{board}: rank_of_score {values:?}");
    }
}

async fn check_board(client: &mut Client, board: &str, ties: Ties, seed: u64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let fields = random_fields(&mut rng);
    let spec = BoardSpec {
        ties: Some(ties),
        windows: vec![Window::All, Window::Daily],
        ..BoardSpec::with_fields(fields.clone())
    };
    assert!(client.create_board_with(board, &spec).await.expect("create_board"));
    assert!(!client.create_board_with(board, &spec).await.expect("create_board again"), "same config: false");
    let mut oracle = Oracle { fields, ties, players: BTreeMap::new(), reached: 0 };
    let names: Vec<String> = (0..PLAYERS).map(|i| format!("p{i:02}")).collect();
    for round in 0..12 {
        for _ in 0..30 {
            let name = names.choose(&mut rng).expect("a name");
            match rng.gen_range(0..10) {
                0 => {
                    let removed = client.remove(board, name).await.expect("remove");
                    assert_eq!(removed, oracle.players.remove(name).is_some(), "{board}: remove {name}");
                }
                1..=3 => {
                    // An incr of some fields, sometimes past a range.
                    let deltas: Vec<i64> = oracle.fields.iter().map(|_| rng.gen_range(-2..=2)).collect();
                    let given: FieldScores = (oracle.fields.iter().zip(&deltas))
                        .filter(|(_, d)| **d != 0 || rng.gen_bool(0.3))
                        .map(|(f, d)| (f.name.clone(), *d))
                        .collect();
                    let got = client.set_fields(board, name, &given, Mode::Incr).await;
                    match oracle.written(name, &deltas, Mode::Incr) {
                        None => bad_request(got, "an incr past a field's range"),
                        Some(new) => {
                            assert_eq!(got.expect("incr"), oracle.shown(&new), "{board}: incr {name} {deltas:?}");
                            oracle.apply(name, new);
                        }
                    }
                }
                4 => {
                    // set_many: all or none, with a duplicate player.
                    let mode = *[Mode::Set, Mode::Best, Mode::Incr].choose(&mut rng).expect("a mode");
                    let chosen: Vec<&String> = names.choose_multiple(&mut rng, 4).chain([&names[0]]).collect();
                    let values: Vec<Vec<i64>> = chosen
                        .iter()
                        .map(|_| match mode {
                            Mode::Incr => oracle.fields.iter().map(|_| rng.gen_range(-1..=1)).collect(),
                            _ => oracle.random_values(&mut rng),
                        })
                        .collect();
                    let entries: Vec<(&str, FieldScores)> =
                        chosen.iter().zip(&values).map(|(n, v)| (n.as_str(), oracle.shown(v))).collect();
                    let got = client.set_many_fields(board, &entries, mode).await;
                    let mut after = oracle.clone();
                    let mut stored = Vec::new();
                    let mut refused = false;
                    for (name, v) in chosen.iter().zip(&values) {
                        match after.written(name, v, mode) {
                            None => refused = true,
                            Some(new) => {
                                stored.push(after.shown(&new));
                                after.apply(name, new);
                            }
                        }
                    }
                    if refused {
                        // All or none: the next reads prove none applied.
                        bad_request(got, "a set_many incr past a range");
                    } else {
                        assert_eq!(got.expect("set_many"), stored, "{board}: set_many {mode:?}");
                        oracle = after;
                    }
                }
                k => {
                    let mode = if k < 8 { Mode::Set } else { Mode::Best };
                    let values = oracle.random_values(&mut rng);
                    let got = client.set_fields(board, name, &oracle.shown(&values), mode).await.expect("set");
                    let new = oracle.written(name, &values, mode).expect("a whole score in range");
                    assert_eq!(got, oracle.shown(&new), "{board}: {mode:?} {name}");
                    oracle.apply(name, new);
                }
            }
        }
        if round % 3 == 2 {
            check_reads(client, board, &oracle, &names, &mut rng).await;
        }
    }
    assert!(oracle.players.len() >= PLAYERS / 2, "{board}: the board filled ({})", oracle.players.len());
    assert!(oracle.reached > 100, "{board}: scores changed often ({})", oracle.reached);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn composite_boards_match_a_brute_force_on_every_shard_count_tie_rule_and_mode() {
    for shards in [1, 4, 7] {
        let server = common::Server::start(shards);
        let mut client = server.client().await;
        for (i, ties) in [Ties::Competition, Ties::Dense, Ties::Ordinal].into_iter().enumerate() {
            let board = format!("cup:{ties:?}").to_lowercase();
            check_board(&mut client, &board, ties, shards as u64 * 10 + i as u64).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_listing_and_restart() {
    let mut server = common::Server::start(3);
    let mut client = server.client().await;
    let field = |name: &str, order: &str, min: i64, max: i64| {
        rmpv::Value::Map(vec![
            ("name".into(), name.into()),
            ("order".into(), order.into()),
            ("min".into(), min.into()),
            ("max".into(), max.into()),
        ])
    };
    let create = |fields: Vec<rmpv::Value>| Call::new(OpKind::CreateBoard).with("board", "bad").with("fields", fields);
    let refused = [
        ("one field", vec![field("a", "desc", 0, 9)]),
        ("five fields", (0..5).map(|i| field(&format!("f{i}"), "desc", 0, 1)).collect()),
        ("a name twice", vec![field("a", "desc", 0, 9), field("a", "asc", 0, 9)]),
        ("a capital", vec![field("A", "desc", 0, 9), field("b", "asc", 0, 9)]),
        ("a 33-byte name", vec![field(&"a".repeat(33), "desc", 0, 9), field("b", "asc", 0, 9)]),
        ("max below min", vec![field("a", "desc", 5, 4), field("b", "asc", 0, 9)]),
        ("an unknown order", vec![field("a", "up", 0, 9), field("b", "asc", 0, 9)]),
        ("ranges past 2^63", vec![field("a", "desc", 0, 1 << 32), field("b", "asc", 0, (1 << 31) - 1)]),
    ];
    for (what, fields) in refused {
        bad_request(client.call::<bool>(create(fields)).await, what);
    }
    // Exactly 2^63 values fit.
    let widest = vec![field("a", "desc", i64::MIN, i64::MIN + (1 << 32) - 1), field("b", "asc", 0, (1 << 31) - 1)];
    assert!(client.call::<bool>(create(widest)).await.expect("ranges of exactly 2^63"));

    let fields = vec![FieldSpec::desc("trophies", 0, 1_000_000), FieldSpec::asc("retries", 0, 1000)];
    let spec = BoardSpec { order: Some(Order::Asc), ..BoardSpec::with_fields(fields.clone()) };
    assert!(client.create_board_with("cup", &spec).await.expect("create"));
    let other = BoardSpec::with_fields(vec![fields[0].clone(), FieldSpec::asc("retries", 0, 999)]);
    let err = client.create_board_with("cup", &other).await.expect_err("another range");
    assert_eq!(err.code(), Some("conflict"));
    assert_eq!(client.board_fields("cup").await.expect("boards"), Some(fields.clone()));

    let score = |t: i64, r: i64| FieldScores::from([("trophies", t), ("retries", r)]);
    client.set_fields("cup", "ann", &score(30, 2), Mode::Set).await.expect("set");
    client.set_fields("cup", "bob", &score(30, 1), Mode::Set).await.expect("set");
    client.set_fields("cup", "cid", &score(31, 9), Mode::Set).await.expect("set");
    let order: Vec<String> =
        (client.top_fields("cup", 10, 0).await.expect("top").into_iter()).map(|e| e.player).collect();
    assert_eq!(order, ["cid", "bob", "ann"], "most trophies, then fewest retries");

    // Wrong kinds and ranges, each a bad_request that changes nothing.
    bad_request(client.set("cup", "ann", 5, Mode::Set).await, "an integer on a board with fields");
    bad_request(client.set_fields("plain", "ann", &score(1, 1), Mode::Set).await, "a map on a plain board");
    bad_request(
        client.set_fields("cup", "ann", &FieldScores::from([("trophies", 1)]), Mode::Set).await,
        "a field missing",
    );
    bad_request(client.set_fields("cup", "ann", &score(1_000_001, 0), Mode::Set).await, "past max");
    bad_request(client.set_fields("cup", "ann", &score(-1, 0), Mode::Best).await, "below min");
    let unknown = FieldScores::from([("trophies", 1), ("retries", 1), ("lives", 1)]);
    bad_request(client.set_fields("cup", "ann", &unknown, Mode::Set).await, "an unknown field");
    bad_request(
        client.rank_of_fields("cup", &FieldScores::from([("retries", 1)])).await,
        "rank_of_score lacking a field",
    );
    let past = FieldScores::from([("retries", -3)]);
    bad_request(client.set_fields("cup", "ann", &past, Mode::Incr).await, "an incr below min");
    assert_eq!(client.get_fields("cup", "ann").await.expect("get"), Some(score(30, 2)), "refusals changed nothing");
    let boards = client.boards().await.expect("boards");
    assert!(boards.iter().all(|b| b.board != "plain"), "a refused write creates no board");

    // Approximate ranks take and answer maps too; exact here, with
    // buckets far larger than this board.
    let approx = common::wait_for(Duration::from_secs(10), "a summary of the board", async || {
        match client.rank_approx_fields("cup", "bob").await {
            Ok(Some(info)) if info.count == 3 => Ok(info),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    assert_eq!((approx.rank, &approx.score, approx.error), (2, &score(30, 1), 0));
    let at = client.rank_of_fields_approx("cup", &score(30, 5)).await.expect("approx rank_of_score");
    assert_eq!((at.rank, at.error), (4, 0), "all three are better than 30 trophies with 5 retries");
    assert_eq!(client.rank_of_fields("cup", &score(30, 5)).await.expect("exact"), 4);
    bad_request(
        client.rank_of_fields_approx("cup", &FieldScores::from([("retries", 1)])).await,
        "approx lacking a field",
    );

    // Watches push maps too.
    let mut watcher = Watcher::connect(&server.addr).await.expect("watcher").with_scores::<FieldScores>();
    watcher.watch(&WatchSpec::top("cup", 2)).await.expect("watch");
    let push = tokio::time::timeout(Duration::from_secs(10), watcher.next()).await.expect("a push in time");
    let push = push.expect("a push").expect("a readable push");
    let WatchEvent::Top(rows) = push.event else { panic!("a top watch pushes its list") };
    let rows: Vec<(&str, &FieldScores)> = rows.iter().map(|e| (e.player.as_str(), &e.score)).collect();
    assert_eq!(rows, [("cid", &score(31, 9)), ("bob", &score(30, 1))]);
    drop(watcher);

    // Acknowledged composite writes and the board's fields survive kill -9.
    let added = client.set_fields("cup", "ann", &FieldScores::from([("trophies", 5)]), Mode::Incr).await.expect("incr");
    assert_eq!(added, score(35, 2));
    server.kill9();
    server.restart();
    let mut client = server.client().await;
    assert_eq!(client.board_fields("cup").await.expect("boards"), Some(fields));
    let top = client.top_fields("cup", 10, 0).await.expect("top after restart");
    let rows: Vec<(&str, &FieldScores, u64)> = top.iter().map(|e| (e.player.as_str(), &e.score, e.rank)).collect();
    assert_eq!(rows, [("ann", &score(35, 2), 1), ("cid", &score(31, 9), 2), ("bob", &score(30, 1), 3)]);
}
