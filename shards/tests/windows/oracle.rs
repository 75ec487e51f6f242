//! The plain-map oracle: per board, each unexpired (window, period) with its
//! players, what a write or remove does in every current period, expiry.

use std::collections::{BTreeMap, BTreeSet};

use rankd_shards::{Board, BoardConfig, Mode, Order, Record, Ties, TreeId};

use crate::calendar::{is_expired, period, tid};

/// Is `a` strictly better than `b`?
pub fn better(order: Order, a: i64, b: i64) -> bool {
    match order {
        Order::Desc => a > b,
        Order::Asc => a < b,
    }
}

/// One period of one window.
#[derive(Debug, Clone, Default)]
pub struct Period {
    players: BTreeMap<String, Record>,
    /// Everyone ever written here (bounds the keys expiry must delete).
    ever: BTreeSet<String>,
}

#[derive(Debug, Clone)]
pub struct OBoard {
    pub board: Board,
    /// Periods not yet expired.
    pub periods: BTreeMap<TreeId, Period>,
}

impl OBoard {
    pub fn players(&self, tree: TreeId) -> BTreeMap<String, Record> {
        self.periods.get(&tree).map(|p| p.players.clone()).unwrap_or_default()
    }

    /// A write in every window's current period at `now`: `Ok(stored in
    /// the first window)`, or `Err(())` on overflow anywhere (nothing changes).
    pub fn write(&mut self, now: i64, name: &str, score: i64, mode: Mode, seq: u64) -> Result<i64, ()> {
        let order = self.board.config.order;
        let mut plans = Vec::new();
        for &w in &self.board.config.windows {
            let t = tid(&self.board, w, period(w, now));
            let old = self.periods.get(&t).and_then(|per| per.players.get(name)).copied();
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
            plans.push((t, old, new));
        }
        let stored = plans[0].2;
        for (t, old, new) in plans {
            if old.map(|o| o.score) == Some(new) {
                continue; // unchanged: keeps when it was reached
            }
            let per = self.periods.entry(t).or_default();
            per.players.insert(name.to_string(), Record { score: new, seq });
            per.ever.insert(name.to_string());
        }
        Ok(stored)
    }

    /// Removes from every window's current period; whether the player was in
    /// the first window's.
    pub fn remove(&mut self, now: i64, name: &str) -> bool {
        let mut first = None;
        for &w in &self.board.config.windows {
            let present = self
                .periods
                .get_mut(&tid(&self.board, w, period(w, now)))
                .and_then(|p| p.players.remove(name))
                .is_some();
            first.get_or_insert(present);
        }
        first.unwrap_or(false)
    }

    /// Takes out the periods expired at `now`, with how many players each ever held.
    pub fn take_expired(&mut self, now: i64) -> Vec<(TreeId, usize)> {
        let board = self.board.clone();
        let mut out = Vec::new();
        self.periods.retain(|&t, per| {
            let expired = is_expired(&board, t, now);
            if expired {
                out.push((t, per.ever.len()));
            }
            !expired
        });
        out
    }
}

/// List order, written independently of the key layouts.
pub fn sorted(cfg: &BoardConfig, players: &BTreeMap<String, Record>) -> Vec<(String, Record)> {
    let mut v: Vec<(String, Record)> = players.iter().map(|(n, r)| (n.clone(), *r)).collect();
    v.sort_by(|a, b| {
        let by_score = match cfg.order {
            Order::Desc => b.1.score.cmp(&a.1.score),
            Order::Asc => a.1.score.cmp(&b.1.score),
        };
        by_score.then_with(|| match cfg.ties {
            Ties::Ordinal => a.1.seq.cmp(&b.1.seq).then_with(|| a.0.as_bytes().cmp(b.0.as_bytes())),
            Ties::Competition | Ties::Dense => a.0.as_bytes().cmp(b.0.as_bytes()),
        })
    });
    v
}
