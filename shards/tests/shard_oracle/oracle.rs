//! The plain-map oracle: each board's players and records, list order
//! written independently of the key layouts, and what a write does.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use rankd_shards::key::{score_key, tiebreak, tree_key};
use rankd_shards::{Board, BoardConfig, Mode, Order, Record, Ties, Window};

#[derive(Debug, Clone)]
pub struct OBoard {
    pub board: Board,
    pub players: BTreeMap<String, Record>,
}

#[derive(Debug, Clone)]
pub struct State {
    pub slots: Vec<OBoard>,
    /// Boards whose config the shard holds (it saw a successful write).
    pub known: BTreeMap<u64, Board>,
    pub max_seq: u64,
    pub max_board_id: u64,
}

/// Is `a` strictly better than `b`?
pub fn better(order: Order, a: i64, b: i64) -> bool {
    match order {
        Order::Desc => a > b,
        Order::Asc => a < b,
    }
}

/// List order, written independently of the key layouts.
pub fn list_cmp(cfg: &BoardConfig, a: (&str, &Record), b: (&str, &Record)) -> Ordering {
    let by_score = match cfg.order {
        Order::Desc => b.1.score.cmp(&a.1.score),
        Order::Asc => a.1.score.cmp(&b.1.score),
    };
    by_score.then_with(|| match cfg.ties {
        Ties::Ordinal => a.1.seq.cmp(&b.1.seq).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())),
        Ties::Competition | Ties::Dense => a.0.as_bytes().cmp(b.0.as_bytes()),
    })
}

pub fn sorted(ob: &OBoard) -> Vec<(String, Record)> {
    let mut v: Vec<(String, Record)> = ob.players.iter().map(|(n, r)| (n.clone(), *r)).collect();
    v.sort_by(|a, b| list_cmp(&ob.board.config, (&a.0, &a.1), (&b.0, &b.1)));
    v
}

pub fn player_tree_key(cfg: &BoardConfig, name: &str, r: &Record) -> u128 {
    tree_key(score_key(r.score, cfg.order), tiebreak(cfg.ties, name, r.seq))
}

/// What a write does to the oracle: `Ok(stored)` or `Err(())` on overflow
/// (and then nothing changes).
pub fn oracle_write(ob: &mut OBoard, name: &str, score: i64, mode: Mode, seq: u64) -> Result<i64, ()> {
    let order = ob.board.config.order;
    let old = ob.players.get(name).copied();
    let new = match (mode, old) {
        (Mode::Set, _) | (Mode::Best | Mode::Incr, None) => score,
        (Mode::Best, Some(o)) => {
            if better(order, score, o.score) {
                score
            } else {
                o.score
            }
        }
        (Mode::Incr, Some(o)) => o.score.checked_add(score).ok_or(())?,
    };
    if old.map(|o| o.score) != Some(new) {
        ob.players.insert(name.to_string(), Record { score: new, seq });
    }
    Ok(new)
}

pub fn new_board(id: u64, order: Order, ties: Ties) -> OBoard {
    OBoard {
        board: Board {
            id,
            name: format!("board:{id}").into(),
            config: BoardConfig { order, ties, windows: vec![Window::All], keep: 1, fields: Vec::new() }.into(),
        },
        players: BTreeMap::new(),
    }
}
