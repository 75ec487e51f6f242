//! The words of the protocol (`docs/PROTOCOL.md`): op names, error codes,
//! limits and the enumerated field values. The server and every client read
//! them from here, so a name is written once.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Default largest frame, in bytes: 1 MiB, as the protocol specifies.
pub const DEFAULT_MAX_FRAME: usize = 1 << 20;
/// The max frames a server may be set to (`--max-frame`): 64 bytes (room
/// for any request but a large `set_many`) to 64 MiB.
pub const MAX_FRAME_RANGE: std::ops::RangeInclusive<usize> = 64..=64 << 20;
/// Most `entries` in one `set_many`.
pub const MAX_SET_MANY: usize = 10_000;
/// Largest `top` `limit`.
pub const MAX_TOP_LIMIT: u64 = 1000;
/// Largest `around` `before` and `after`.
pub const MAX_AROUND: u64 = 500;
/// Most players one `ranks` asks for (protocol 1.1).
pub const MAX_RANKS: usize = 1000;
/// Most boards one `boards` page may hold.
pub const MAX_BOARDS_PAGE: usize = 10_000;
/// Boards in a `boards` page when `limit` is not given.
pub const DEFAULT_BOARDS_PAGE: usize = 1000;
/// Largest `top` a watch may follow.
pub const MAX_WATCH_TOP: u64 = 100;
/// Most watches one connection may hold.
pub const MAX_WATCHES: usize = 64;
/// Fastest and slowest a watch may push, in milliseconds; and its default.
pub const WATCH_INTERVAL_MS: std::ops::RangeInclusive<u64> = 10..=60_000;
/// How often a watch pushes at most when `interval_ms` is not given.
pub const DEFAULT_WATCH_INTERVAL_MS: u64 = 100;
/// Longest `wid` of an idempotent write, in bytes.
pub const MAX_WID: usize = 64;

/// Declares a fieldless enum whose variants each have one wire name, with
/// the name, the reverse lookup and the list of all variants.
macro_rules! wire_names {
    ($(#[$meta:meta])* $name:ident { $($(#[$vmeta:meta])* $variant:ident => $text:literal,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)*
        }

        impl $name {
            /// Every variant, in declaration order (`ALL[x as usize] == x`).
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];
            /// How many variants there are.
            pub const COUNT: usize = Self::ALL.len();

            /// The name on the wire.
            pub const fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)*
                }
            }

            /// The variant with this wire name.
            pub fn from_name(text: &str) -> Option<Self> {
                match text {
                    $($text => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.name())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
                Self::from_name(&text).ok_or_else(|| {
                    serde::de::Error::custom(format!(concat!("unknown ", stringify!($name), " `{}`"), text))
                })
            }
        }
    };
}

wire_names!(
    /// Every operation of the protocol.
    OpKind {
        /// Liveness check.
        Ping => "ping",
        /// Present the server's token.
        Auth => "auth",
        /// Create a board with a config.
        CreateBoard => "create_board",
        /// Delete a board.
        DropBoard => "drop_board",
        /// List the boards.
        Boards => "boards",
        /// Write one score.
        Set => "set",
        /// Write many scores of one board, all or none.
        SetMany => "set_many",
        /// A player's score.
        Get => "get",
        /// Remove a player.
        Remove => "remove",
        /// Players on a board.
        Count => "count",
        /// A player's rank.
        Rank => "rank",
        /// The rank a score would get.
        RankOfScore => "rank_of_score",
        /// The best players.
        Top => "top",
        /// A player and their neighbours.
        Around => "around",
        /// The ranks of a list of players, best first: a friends
        /// leaderboard in one call (protocol 1.1).
        Ranks => "ranks",
        /// Push a board's top or a player's rank whenever it changes.
        Watch => "watch",
        /// End a watch.
        Unwatch => "unwatch",
        /// Stream a consistent copy of the server's data (an operator's op,
        /// beyond protocol.md; see [`crate::BackupStream`]).
        Backup => "backup",
    }
);

impl OpKind {
    /// Whether the op changes what is stored.
    pub const fn is_write(self) -> bool {
        matches!(self, Self::CreateBoard | Self::DropBoard | Self::Set | Self::SetMany | Self::Remove)
    }

    /// Whether a `read` token may not run the op: writes, and `backup`,
    /// which holds every shard for a commit and copies everything.
    pub const fn needs_write_role(self) -> bool {
        self.is_write() || matches!(self, Self::Backup)
    }
}

wire_names!(
    /// Why a request failed: the `code` of an error reply.
    ErrorCode {
        /// The bytes are not one msgpack map.
        BadFrame => "bad_frame",
        /// A field is missing, has the wrong type, or is out of range.
        BadRequest => "bad_request",
        /// `op` names no operation.
        UnknownOp => "unknown_op",
        /// A frame or list over its limit.
        TooLarge => "too_large",
        /// `create_board` with a config different from the existing board's.
        Conflict => "conflict",
        /// The server requires a token and `auth` has not succeeded.
        Unauthorized => "unauthorized",
        /// Shed instead of queued without bound: retry later.
        Overloaded => "overloaded",
        /// A server fault; the request may or may not have applied.
        Internal => "internal",
    }
);

wire_names!(
    /// How a write combines with the stored score.
    #[derive(Default)]
    Mode {
        /// The new score replaces the old one.
        #[default]
        Set => "set",
        /// Keep whichever of old and new is better under the board's order.
        Best => "best",
        /// Add to the current score (absent counts as 0).
        Incr => "incr",
    }
);

wire_names!(
    /// Which scores are better.
    Order {
        /// Higher is better.
        Desc => "desc",
        /// Lower is better.
        Asc => "asc",
    }
);

wire_names!(
    /// How equal scores rank.
    Ties {
        /// "1224": 1 + players with a strictly better score.
        Competition => "competition",
        /// "1223": 1 + distinct strictly better scores.
        Dense => "dense",
        /// "1234": among equal scores, who reached it first ranks higher.
        Ordinal => "ordinal",
    }
);

wire_names!(
    /// A time window a board keeps.
    Window {
        /// Never resets.
        All => "all",
        /// Resets at 00:00 UTC.
        Daily => "daily",
        /// Resets Monday 00:00 UTC.
        Weekly => "weekly",
        /// Resets on the 1st, 00:00 UTC.
        Monthly => "monthly",
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_index_their_list() {
        for (i, op) in OpKind::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i);
            assert_eq!(OpKind::from_name(op.name()), Some(*op));
        }
        assert_eq!(OpKind::COUNT, 18);
        for (i, code) in ErrorCode::ALL.iter().enumerate() {
            assert_eq!(*code as usize, i);
            assert_eq!(ErrorCode::from_name(code.name()), Some(*code));
        }
        assert_eq!(OpKind::from_name("fly"), None);
        assert!(OpKind::Set.is_write() && !OpKind::Rank.is_write());
    }

    #[test]
    fn serialize_as_their_wire_names() {
        let bytes = rmp_serde::to_vec(&Window::Weekly).unwrap();
        assert_eq!(rmp_serde::from_slice::<String>(&bytes).unwrap(), "weekly");
        assert_eq!(rmp_serde::from_slice::<Mode>(&bytes).unwrap_err().to_string(), "unknown Mode `weekly`");
        assert_eq!(rmp_serde::from_slice::<Window>(&bytes).unwrap(), Window::Weekly);
    }
}
