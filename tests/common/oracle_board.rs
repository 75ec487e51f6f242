//! A board as the protocol defines it, for tests that hold the server to
//! an oracle over TCP: a plain map, ranked by sorting and counting.

use std::collections::HashMap;

use rankd_client::Entry;

/// A board as a plain map, ranked by sorting and counting.
pub struct OracleBoard {
    pub desc: bool,
    pub ties: &'static str,
    /// player -> (score, reach sequence)
    pub players: HashMap<String, (i64, u64)>,
}

impl OracleBoard {
    pub fn better(&self, a: i64, b: i64) -> bool {
        if self.desc {
            a > b
        } else {
            a < b
        }
    }

    /// Applies a write as the protocol defines it; `None` on incr overflow.
    pub fn write(&mut self, player: &str, score: i64, mode: &str, seq: u64) -> Option<i64> {
        let old = self.players.get(player).map(|p| p.0);
        let new = match (mode, old) {
            ("set", _) | (_, None) => score,
            ("best", Some(o)) => {
                if self.better(score, o) {
                    score
                } else {
                    o
                }
            }
            ("incr", Some(o)) => o.checked_add(score)?,
            _ => unreachable!(),
        };
        if old != Some(new) {
            self.players.insert(player.to_string(), (new, seq));
        }
        Some(new)
    }

    /// Best first; ordinal ties by reach, the others by name bytes.
    pub fn sorted(&self) -> Vec<(String, i64, u64)> {
        let mut all: Vec<_> = self.players.iter().map(|(p, &(s, q))| (p.clone(), s, q)).collect();
        all.sort_by(|a, b| {
            let by_score = if self.desc { b.1.cmp(&a.1) } else { a.1.cmp(&b.1) };
            by_score
                .then_with(|| if self.ties == "ordinal" { a.2.cmp(&b.2) } else { a.0.as_bytes().cmp(b.0.as_bytes()) })
        });
        all
    }

    pub fn rank_at(&self, sorted: &[(String, i64, u64)], index: usize) -> u64 {
        let score = sorted[index].1;
        match self.ties {
            "competition" => 1 + sorted.iter().filter(|e| self.better(e.1, score)).count() as u64,
            "dense" => {
                let mut distinct: Vec<i64> = sorted.iter().filter(|e| self.better(e.1, score)).map(|e| e.1).collect();
                distinct.dedup();
                1 + distinct.len() as u64
            }
            _ => index as u64 + 1,
        }
    }

    pub fn rank_of_score(&self, score: i64) -> u64 {
        let better = |s: i64| self.better(s, score);
        let scores: Vec<i64> = self.sorted().into_iter().map(|e| e.1).collect();
        1 + match self.ties {
            "competition" => scores.iter().filter(|&&s| better(s)).count(),
            "dense" => {
                let mut d: Vec<i64> = scores.into_iter().filter(|&s| better(s)).collect();
                d.dedup();
                d.len()
            }
            _ => scores.iter().filter(|&&s| better(s) || s == score).count(),
        } as u64
    }

    pub fn entries(&self, sorted: &[(String, i64, u64)], range: std::ops::Range<usize>) -> Vec<Entry> {
        range
            .map(|i| Entry { player: sorted[i].0.clone(), score: sorted[i].1, rank: self.rank_at(sorted, i) })
            .collect()
    }
}
