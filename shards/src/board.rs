//! Boards and their fixed configuration: the vocabulary of `protocol.md`.

use std::fmt;

/// Which end of the score range ranks first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Order {
    /// Higher score is better (the default).
    #[default]
    Desc,
    /// Lower score is better (golf, speed-runs).
    Asc,
}

/// How equal scores rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Ties {
    /// "1224": one plus the players strictly better.
    #[default]
    Competition,
    /// "1223": one plus the distinct scores strictly better.
    Dense,
    /// "1234": equal scores rank by who reached the score first.
    Ordinal,
}

/// A time window of a board. Only `All` is served today; the others are
/// reserved so storage keys already carry a window and period.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Window {
    /// Never resets.
    #[default]
    All,
    /// Resets at 00:00 UTC.
    Daily,
    /// Resets Monday 00:00 UTC.
    Weekly,
    /// Resets on the 1st, 00:00 UTC.
    Monthly,
}

/// How a write combines with the stored score.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Replace.
    #[default]
    Set,
    /// Keep the better of old and new.
    Best,
    /// Add to the old score (absent = 0).
    Incr,
}

/// A board's configuration, fixed at creation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BoardConfig {
    /// Which scores are better.
    pub order: Order,
    /// How ties rank.
    pub ties: Ties,
    /// Windows kept, the first being the default for reads.
    pub windows: Vec<Window>,
    /// Past periods kept per periodic window.
    pub keep: u32,
}

impl Default for BoardConfig {
    fn default() -> Self {
        Self { order: Order::Desc, ties: Ties::Competition, windows: vec![Window::All], keep: 1 }
    }
}

/// A board as the engine sees it: the name clients use, the numeric id its
/// storage keys use (short keys, and a dropped board's leftovers can never be
/// mistaken for a new board of the same name), and its config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Board {
    /// Engine-wide unique id, never reused.
    pub id: u64,
    /// The client-facing name.
    pub name: String,
    /// Fixed configuration.
    pub config: BoardConfig,
}

macro_rules! names {
    ($ty:ty { $($variant:ident => $name:literal),* $(,)? }) => {
        impl $ty {
            /// The protocol's name for this value.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $name),* }
            }
            /// Parses the protocol's name.
            pub fn parse(name: &str) -> Option<Self> {
                match name { $($name => Some(Self::$variant),)* _ => None }
            }
            /// Stable one-byte code used in storage.
            pub fn code(self) -> u8 {
                self as u8
            }
            /// Inverse of [`Self::code`].
            pub fn from_code(code: u8) -> Option<Self> {
                [$(Self::$variant),*].into_iter().find(|v| *v as u8 == code)
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

names!(Order { Desc => "desc", Asc => "asc" });
names!(Ties { Competition => "competition", Dense => "dense", Ordinal => "ordinal" });
names!(Window { All => "all", Daily => "daily", Weekly => "weekly", Monthly => "monthly" });
names!(Mode { Set => "set", Best => "best", Incr => "incr" });

/// Is `name` a valid board name: 1–128 bytes of `[A-Za-z0-9_.:-]`.
pub fn valid_board_name(name: &str) -> bool {
    (1..=128).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_.:-".contains(&b))
}

/// Is `player` a valid player name: 1–256 bytes of UTF-8 (a `&str` already is).
pub fn valid_player_name(player: &str) -> bool {
    (1..=256).contains(&player.len())
}

impl BoardConfig {
    /// Encodes for the shard's meta keyspace.
    pub fn encode(&self, name: &str) -> Vec<u8> {
        let mut out = vec![1u8, self.order.code(), self.ties.code()];
        out.extend_from_slice(&self.keep.to_be_bytes());
        out.push(self.windows.len() as u8);
        out.extend(self.windows.iter().map(|w| w.code()));
        out.extend_from_slice(name.as_bytes());
        out
    }

    /// Inverse of [`BoardConfig::encode`]; returns the name too.
    pub fn decode(bytes: &[u8]) -> Option<(String, Self)> {
        let (&[1, order, ties, k0, k1, k2, k3, n], rest) = bytes.split_first_chunk::<8>()? else {
            return None;
        };
        let n = usize::from(n);
        let windows = rest.get(..n)?.iter().map(|&c| Window::from_code(c)).collect::<Option<Vec<_>>>()?;
        let name = String::from_utf8(rest.get(n..)?.to_vec()).ok()?;
        let config = Self {
            order: Order::from_code(order)?,
            ties: Ties::from_code(ties)?,
            windows,
            keep: u32::from_be_bytes([k0, k1, k2, k3]),
        };
        Some((name, config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips() {
        let config =
            BoardConfig { order: Order::Asc, ties: Ties::Ordinal, windows: vec![Window::All, Window::Daily], keep: 7 };
        assert_eq!(BoardConfig::decode(&config.encode("b:1")), Some(("b:1".to_string(), config)));
        assert_eq!(BoardConfig::decode(&[1, 2]), None);
    }

    #[test]
    fn names_follow_the_protocol() {
        assert!(valid_board_name("season_1.eu-west:ranked"));
        assert!(!valid_board_name(""));
        assert!(!valid_board_name("has space"));
        assert!(!valid_board_name(&"x".repeat(129)));
        assert!(valid_player_name("é"));
        assert!(!valid_player_name(&"x".repeat(257)));
        assert_eq!(Ties::parse("dense"), Some(Ties::Dense));
        assert_eq!(Mode::from_code(Mode::Incr.code()), Some(Mode::Incr));
    }
}
