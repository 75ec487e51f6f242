//! Byte layouts: how scores become order-preserving keys, and how every
//! stored key starts with its board, window and period.
//!
//! Everything a shard stores for one board window period lives under a
//! 13-byte [`TreeId`] prefix (board id, window, period), so adding time
//! windows needs no migration and dropping a board is a prefix range.

use crate::board::{Order, Ties, Window};

/// One ranked set: a board's window in one period. Each has its own count
/// tree, players and score index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TreeId {
    /// The board's numeric id.
    pub board: u64,
    /// The window's storage code.
    pub window: u8,
    /// Period number within the window (0 for `all`).
    pub period: u32,
}

/// Length of an encoded [`TreeId`].
pub const TREE_PREFIX_LEN: usize = 13;

impl TreeId {
    /// The tree of board `board`'s all-time window (its only period).
    pub fn all_time(board: u64) -> Self {
        Self { board, window: Window::All.code(), period: 0 }
    }

    /// Whether this is its board's all-time tree.
    pub fn is_all_time(&self) -> bool {
        *self == Self::all_time(self.board)
    }

    /// Key prefix shared by everything stored for this tree.
    pub fn prefix(&self) -> [u8; TREE_PREFIX_LEN] {
        let mut out = [0u8; TREE_PREFIX_LEN];
        out[..8].copy_from_slice(&self.board.to_be_bytes());
        out[8] = self.window;
        out[9..].copy_from_slice(&self.period.to_be_bytes());
        out
    }

    /// Parses a key's prefix.
    pub fn from_prefix(key: &[u8]) -> Option<Self> {
        let (prefix, _) = key.split_first_chunk::<TREE_PREFIX_LEN>()?;
        let (board, rest) = prefix.split_first_chunk::<8>()?;
        let (&window, period) = rest.split_first()?;
        Some(Self { board: u64::from_be_bytes(*board), window, period: u32::from_be_bytes(period.try_into().ok()?) })
    }
}

/// Maps a score to a `u64` whose ascending order is "better first" under
/// `order`. Flipping the sign bit makes two's complement sort as unsigned.
pub fn score_key(score: i64, order: Order) -> u64 {
    let ascending = (score as u64) ^ (1 << 63);
    match order {
        Order::Asc => ascending,
        Order::Desc => !ascending,
    }
}

/// Inverse of [`score_key`].
pub fn score_from_key(key: u64, order: Order) -> i64 {
    let ascending = match order {
        Order::Asc => key,
        Order::Desc => !key,
    };
    (ascending ^ (1 << 63)) as i64
}

/// The tiebreak half of a tree key. Ordinal boards break ties by reach
/// sequence; the others list equal scores by player name, so their tiebreak
/// is the name's first 8 bytes: coarser than the name, but in the same order,
/// which lets `top` find a deep offset by counting instead of scanning.
pub fn tiebreak(ties: Ties, player: &str, seq: u64) -> u64 {
    match ties {
        Ties::Ordinal => seq,
        Ties::Competition | Ties::Dense => name_tiebreak(player.as_bytes()),
    }
}

/// A name's tiebreak on a board with competition or dense ties: its first
/// 8 bytes, zero-padded.
pub fn name_tiebreak(name: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    let n = name.len().min(8);
    buf[..n].copy_from_slice(&name[..n]);
    u64::from_be_bytes(buf)
}

/// The count-tree key: score key above, tiebreak below.
pub fn tree_key(score_key: u64, tiebreak: u64) -> u128 {
    (u128::from(score_key) << 64) | u128::from(tiebreak)
}

/// The tree key a player's rank counts up to: players with a smaller key
/// rank before them. Ordinal boards order equal scores by reach sequence;
/// the others rank every player of a score after exactly the better scores,
/// so their key has the lowest tiebreak.
pub fn rank_key(ties: Ties, score_key: u64, seq: u64) -> u128 {
    match ties {
        Ties::Ordinal => tree_key(score_key, seq),
        Ties::Competition | Ties::Dense => tree_key(score_key, 0),
    }
}

/// A position in a tree's list order (best first), as the bytes of the score
/// index after the tree prefix: `score_key ‖ [seq, ordinal only] ‖ player`.
/// Positions from every shard compare byte-wise, so the router can merge.
pub fn list_position(ties: Ties, score_key: u64, seq: u64, player: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + player.len());
    out.extend_from_slice(&score_key.to_be_bytes());
    push_list_position_tail(&mut out, ties, seq, player);
    out
}

/// A list position after its score key: `[seq, ordinal only] ‖ player`.
///
/// Sized exactly: the overlay boxes it, and a spare capacity meant a
/// reallocation per write (see docs/performance-history.md).
pub fn list_position_tail(ties: Ties, seq: u64, player: &str) -> Vec<u8> {
    let seq_len = if ties == Ties::Ordinal { 8 } else { 0 };
    let mut out = Vec::with_capacity(seq_len + player.len());
    push_list_position_tail(&mut out, ties, seq, player);
    out
}

fn push_list_position_tail(out: &mut Vec<u8>, ties: Ties, seq: u64, player: &str) {
    if ties == Ties::Ordinal {
        out.extend_from_slice(&seq.to_be_bytes());
    }
    out.extend_from_slice(player.as_bytes());
}

/// The first list position whose tree key is `key` (for seeking `top`).
pub fn list_position_of_tree_key(ties: Ties, key: u128) -> Vec<u8> {
    let score_key = (key >> 64) as u64;
    let low = key as u64;
    let mut out = score_key.to_be_bytes().to_vec();
    match ties {
        Ties::Ordinal => out.extend_from_slice(&low.to_be_bytes()),
        Ties::Competition | Ties::Dense => {
            let name = low.to_be_bytes();
            let len = name.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
            out.extend_from_slice(&name[..len]);
        }
    }
    out
}

/// Splits a list position back into `(score_key, seq, player)`.
pub fn parse_list_position(ties: Ties, position: &[u8]) -> Option<(u64, u64, &str)> {
    let (score, rest) = position.split_first_chunk::<8>()?;
    let (seq, player) = match ties {
        Ties::Ordinal => {
            let (seq, player) = rest.split_first_chunk::<8>()?;
            (u64::from_be_bytes(*seq), player)
        }
        Ties::Competition | Ties::Dense => (0, rest),
    };
    Some((u64::from_be_bytes(*score), seq, std::str::from_utf8(player).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn score_keys_order_better_first(a in any::<i64>(), b in any::<i64>()) {
            prop_assert_eq!(score_key(a, Order::Asc) < score_key(b, Order::Asc), a < b);
            prop_assert_eq!(score_key(a, Order::Desc) < score_key(b, Order::Desc), a > b);
            prop_assert_eq!(score_from_key(score_key(a, Order::Desc), Order::Desc), a);
            prop_assert_eq!(score_from_key(score_key(a, Order::Asc), Order::Asc), a);
        }

        #[test]
        fn name_tiebreak_is_monotone(a in "\\PC{1,12}", b in "\\PC{1,12}") {
            if a.as_bytes() < b.as_bytes() {
                prop_assert!(tiebreak(Ties::Competition, &a, 0) <= tiebreak(Ties::Competition, &b, 0));
            }
            // Seeking to a tree key never skips a name with that key.
            let key = tree_key(5, tiebreak(Ties::Dense, &a, 0));
            prop_assert!(list_position_of_tree_key(Ties::Dense, key) <= list_position(Ties::Dense, 5, 0, &a));
        }
    }

    #[test]
    fn tree_prefix_round_trips() {
        let id = TreeId { board: 7, window: 2, period: 20_000 };
        assert_eq!(TreeId::from_prefix(&id.prefix()), Some(id));
        let pos = list_position(Ties::Ordinal, 9, 42, "bob");
        assert_eq!(parse_list_position(Ties::Ordinal, &pos), Some((9, 42, "bob")));
    }
}
