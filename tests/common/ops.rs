//! The protocol's ops as the auth, role and TLS tests send them, with the
//! results protocol.md gives for them: a board `b` (`asc`, `ordinal`,
//! windows `all` and `daily`, keep 2) filled with p=7, q=3, r=9 (rank order
//! q, p, r), read, and emptied again.

use rankd_client::{set_call, Call, Mode, OpKind};
use rmpv::Value;

/// An op's name, its request and the result it must get.
pub type Op = (&'static str, Call, Value);

/// A `top` or `around` entry.
pub fn entry(player: &str, score: i64, rank: u64) -> Value {
    Value::Map(vec![("player".into(), player.into()), ("score".into(), score.into()), ("rank".into(), rank.into())])
}

/// The windows board `b` keeps.
fn windows() -> Value {
    Value::Array(vec!["all".into(), "daily".into()])
}

/// `create_board` for `b`: `asc`, `ordinal`, windows `all` and `daily`,
/// keep 2.
pub fn create_b() -> Call {
    Call::new(OpKind::CreateBoard)
        .with("board", "b")
        .with("order", "asc")
        .with("ties", "ordinal")
        .with("windows", windows())
        .with("keep", 2)
}

/// What `boards` answers while `b` is the only board and holds `count`
/// players.
pub fn boards_b(count: u64) -> Value {
    Value::Array(vec![Value::Map(vec![
        ("board".into(), "b".into()),
        ("order".into(), "asc".into()),
        ("ties".into(), "ordinal".into()),
        ("windows".into(), windows()),
        ("keep".into(), 2.into()),
        ("count".into(), count.into()),
    ])])
}

/// Creates `b` and fills it: p=7 by `set`, then q=3 and r=9 by `set_many`.
pub fn fill_b() -> Vec<Op> {
    vec![
        ("create_board", create_b(), Value::from(true)),
        ("set", set_call("b", "p", 7, Mode::Set), Value::from(7)),
        (
            "set_many",
            Call::new(OpKind::SetMany).with("board", "b").with(
                "entries",
                Value::Array(vec![Value::Array(vec!["q".into(), 3.into()]), Value::Array(vec!["r".into(), 9.into()])]),
            ),
            Value::Array(vec![3.into(), 9.into()]),
        ),
    ]
}

/// The reads of `b` (`get`, `count`, `rank`, `rank_of_score`, `top`,
/// `around`) and their results while it holds what [`fill_b`] wrote.
pub fn read_b() -> Vec<Op> {
    vec![
        ("get", Call::new(OpKind::Get).with("board", "b").with("player", "p"), Value::from(7)),
        ("count", Call::new(OpKind::Count).with("board", "b"), Value::from(3)),
        (
            "rank",
            Call::new(OpKind::Rank).with("board", "b").with("player", "p"),
            Value::Map(vec![("rank".into(), 2.into()), ("score".into(), 7.into()), ("count".into(), 3.into())]),
        ),
        // asc: 3 and 7 are better than 8.
        ("rank_of_score", Call::new(OpKind::RankOfScore).with("board", "b").with("score", 8), Value::from(3)),
        (
            "top",
            Call::new(OpKind::Top).with("board", "b"),
            Value::Array(vec![entry("q", 3, 1), entry("p", 7, 2), entry("r", 9, 3)]),
        ),
        (
            "around",
            Call::new(OpKind::Around).with("board", "b").with("player", "p").with("before", 1).with("after", 0),
            Value::Array(vec![entry("q", 3, 1), entry("p", 7, 2)]),
        ),
        // Best first, each once, absent ones left out.
        (
            "ranks",
            Call::new(OpKind::Ranks).with("board", "b").with("players", ["r", "nobody", "q", "r"]),
            Value::Array(vec![entry("q", 3, 1), entry("r", 9, 3)]),
        ),
    ]
}

/// One request of every op but `ping` and `auth` (every `OpKind`), each
/// with valid fields, and the exact result protocol.md gives for it, sent
/// in this order on one connection of a fresh server: [`fill_b`],
/// [`read_b`], a watch opened and ended, then r removed, `boards`, and `b`
/// dropped.
pub fn every_other_op() -> Vec<Op> {
    let mut ops = fill_b();
    ops.extend(read_b());
    ops.extend([
        (
            "watch",
            Call::new(OpKind::Watch).with("board", "b").with("top", 3),
            Value::Map(vec![("watch".into(), 1.into())]),
        ),
        ("unwatch", Call::new(OpKind::Unwatch).with("watch", 1), Value::from(true)),
    ]);
    ops.extend([
        ("remove", Call::new(OpKind::Remove).with("board", "b").with("player", "r"), Value::from(true)),
        ("boards", Call::new(OpKind::Boards), boards_b(2)),
        ("drop_board", Call::new(OpKind::DropBoard).with("board", "b"), Value::from(true)),
    ]);
    ops
}

/// Values compared with maps equal whatever the order of their keys (as
/// `boards` and `rank` answer them).
pub fn same_value(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Map(x), Value::Map(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.iter().any(|(k2, v2)| k == k2 && same_value(v, v2)))
        }
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same_value(a, b)),
        _ => a == b,
    }
}

/// Asserts that `names` (repeats allowed) name every op of the protocol and
/// nothing else: a test that says it tries every op does.
pub fn assert_every_op_is_tried<'a>(names: impl IntoIterator<Item = &'a str>) {
    let mut names: Vec<&str> = names.into_iter().collect();
    names.sort_unstable();
    names.dedup();
    let mut all: Vec<&str> = OpKind::ALL.iter().map(|op| op.name()).collect();
    all.sort_unstable();
    assert_eq!(names, all, "every op of the protocol is tried");
}

/// Streams a `backup` on `client` to its end (the server then closes the
/// connection) and returns its header and summary: the op every-op tests
/// try on a connection of its own, as its answer is a stream.
pub async fn backup_to_the_end(
    client: &mut rankd_client::Client,
) -> (rankd_client::BackupHeader, rankd_client::BackupSummary) {
    let mut stream = client.backup().await.expect("send backup");
    let Some(rankd_client::BackupPart::Header(header)) = stream.next().await.expect("backup header") else {
        panic!("a backup starts with its header");
    };
    while let Some(part) = stream.next().await.expect("backup part") {
        assert!(matches!(part, rankd_client::BackupPart::Chunk(_)), "a second header");
    }
    (header, stream.summary().expect("a complete backup has a summary"))
}
