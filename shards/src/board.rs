//! Boards and their fixed configuration: the vocabulary of `protocol.md`.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use compact_str::CompactString;

use crate::fields::{Field, FieldValues};

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

/// What a write brings to combine with the stored score under its [`Mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Amount {
    /// A whole score (on a board with fields, the packed one), or a plain
    /// board's `incr` delta.
    Score(i64),
    /// An `incr` on a board with fields: one delta per field. Packed deltas
    /// could not tell a field leaving its range from a carry into the next.
    Fields(FieldValues),
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
    /// A composite score's fields (none on a plain board). A board with
    /// fields stores packed scores (see [`crate::fields`]) and ranks them
    /// `desc`, whatever `order` was asked.
    pub fields: Vec<Field>,
}

impl Default for BoardConfig {
    fn default() -> Self {
        Self { order: Order::Desc, ties: Ties::Competition, windows: vec![Window::All], keep: 1, fields: Vec::new() }
    }
}

/// A board as the engine sees it: the name clients use, the numeric id its
/// storage keys use (short keys, and a dropped board's leftovers can never be
/// mistaken for a new board of the same name), and its config.
///
/// 40 bytes, cheap to clone: a name of up to 24 bytes is held inline, so
/// the router's shared copy is one allocation whose name a lookup compares
/// without a further cache miss, and boards of one config share the config
/// (see [`ConfigInterner`]). A server may hold a million small boards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Board {
    /// Engine-wide unique id, never reused.
    pub id: u64,
    /// The client-facing name.
    pub name: CompactString,
    /// Fixed configuration.
    pub config: Arc<BoardConfig>,
}

const _: () = assert!(std::mem::size_of::<Board>() == 40);

/// A board shared by the router's registry and the commands in flight.
/// triomphe's `Arc` keeps no weak count (rankd takes no weak references),
/// so with its 8-byte header a board is one allocation in jemalloc's
/// 48-byte class, where `std`'s 16-byte header took it to the 64-byte one:
/// 16 bytes a board on a server of a million boards.
pub type SharedBoard = triomphe::Arc<Board>;

const _: () = assert!(std::mem::size_of::<triomphe::Arc<Board>>() == 8);

/// Hands out one shared copy of each distinct config: most boards of a
/// server have one of a few configs.
#[derive(Debug, Default)]
pub struct ConfigInterner {
    held: HashSet<Arc<BoardConfig>>,
    /// Configs held after the last sweep: the next sweep comes once twice
    /// as many are, so configs of boards since dropped do not pile up, at
    /// an amortised O(1) per config.
    swept: usize,
    /// The config handed out last: boards read or made one after another
    /// mostly share it, and comparing is cheaper than hashing.
    last: Option<Arc<BoardConfig>>,
}

impl ConfigInterner {
    /// The shared copy of `config`.
    pub fn intern(&mut self, config: BoardConfig) -> Arc<BoardConfig> {
        if let Some(last) = self.last.as_ref().filter(|last| ***last == config) {
            return last.clone();
        }
        if let Some(held) = self.held.get(&config) {
            self.last = Some(held.clone());
            return held.clone();
        }
        if self.held.len() >= 2 * self.swept.max(64) {
            // Held by no board any more: only here.
            self.held.retain(|c| Arc::strong_count(c) > 1);
            self.swept = self.held.len();
        }
        let config = Arc::new(config);
        self.held.insert(config.clone());
        self.last = Some(config.clone());
        config
    }
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
    /// Whether scores on this board are composite.
    pub fn has_fields(&self) -> bool {
        !self.fields.is_empty()
    }

    /// Encodes for the shard's meta keyspace: version 1 for plain boards
    /// (as every earlier data dir has them), 2 when fields follow the windows.
    pub fn encode(&self, name: &str) -> Vec<u8> {
        let version = if self.has_fields() { 2 } else { 1 };
        let mut out = vec![version, self.order.code(), self.ties.code()];
        out.extend_from_slice(&self.keep.to_be_bytes());
        out.push(self.windows.len() as u8);
        out.extend(self.windows.iter().map(|w| w.code()));
        if self.has_fields() {
            out.push(self.fields.len() as u8);
            for field in &self.fields {
                out.push(field.name.len() as u8);
                out.extend_from_slice(field.name.as_bytes());
                out.push(field.order.code());
                out.extend_from_slice(&field.min.to_be_bytes());
                out.extend_from_slice(&field.max.to_be_bytes());
            }
        }
        out.extend_from_slice(name.as_bytes());
        out
    }

    /// Inverse of [`BoardConfig::encode`]; returns the name too.
    pub fn decode(bytes: &[u8]) -> Option<(&str, Self)> {
        let (&[version @ (1 | 2), order, ties, k0, k1, k2, k3, n], rest) = bytes.split_first_chunk::<8>()? else {
            return None;
        };
        let n = usize::from(n);
        let windows = rest.get(..n)?.iter().map(|&c| Window::from_code(c)).collect::<Option<Vec<_>>>()?;
        let mut rest = rest.get(n..)?;
        let mut fields = Vec::new();
        if version == 2 {
            let (&count, mut more) = rest.split_first()?;
            for _ in 0..count {
                let (&len, tail) = more.split_first()?;
                let (name, tail) = tail.split_at_checked(usize::from(len))?;
                let (&order, tail) = tail.split_first()?;
                let (min, tail) = tail.split_first_chunk::<8>()?;
                let (max, tail) = tail.split_first_chunk::<8>()?;
                fields.push(Field {
                    name: String::from_utf8(name.to_vec()).ok()?,
                    order: Order::from_code(order)?,
                    min: i64::from_be_bytes(*min),
                    max: i64::from_be_bytes(*max),
                });
                more = tail;
            }
            rest = more;
        }
        let name = std::str::from_utf8(rest).ok()?;
        let config = Self {
            order: Order::from_code(order)?,
            ties: Ties::from_code(ties)?,
            windows,
            keep: u32::from_be_bytes([k0, k1, k2, k3]),
            fields,
        };
        Some((name, config))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_round_trips() {
        let config = BoardConfig {
            order: Order::Asc,
            ties: Ties::Ordinal,
            windows: vec![Window::All, Window::Daily],
            keep: 7,
            fields: Vec::new(),
        };
        assert_eq!(BoardConfig::decode(&config.encode("b:1")), Some(("b:1", config.clone())));
        assert_eq!(BoardConfig::decode(&[1, 2]), None);
        let fields = vec![
            Field { name: "trophies".into(), order: Order::Desc, min: 0, max: 1 << 20 },
            Field { name: "time_ms".into(), order: Order::Asc, min: -5, max: i64::from(u32::MAX) },
        ];
        let composite = BoardConfig { fields, ..config };
        let encoded = composite.encode("lvl:1");
        assert_eq!(encoded[0], 2);
        assert_eq!(BoardConfig::decode(&encoded), Some(("lvl:1", composite)));
        assert_eq!(BoardConfig::decode(&encoded[..20]), None);
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
