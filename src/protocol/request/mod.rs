//! Decoding a frame into a typed [`Request`], with an error that says which
//! field is wrong. Unknown fields are ignored, as the protocol requires.
//!
//! A frame is checked in two passes: its msgpack shape, without
//! allocating (`shape.rs`), then its fields, op by op (`fields.rs`).

mod fields;
mod shape;

use std::time::Duration;

use rankd_client::OpKind;
use rankd_shards::{BoardConfig, Mode, Wid, Window};

use super::score::ScoreInput;
use crate::error::Error;
use crate::security::Secret;
use fields::Fields;
use shape::check_shape;

/// Decoder recursion budget. rmpv spends one unit per nesting level and one
/// per string, so the deepest legal request (`entries`: map, list, pair,
/// string) needs 5; anything far deeper is hostile and refused unrecursed.
const MAX_DEPTH: usize = 16;

/// One decoded request.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// Client-chosen id, echoed back.
    pub id: u64,
    /// What to do.
    pub op: Op,
}

/// Which window and period a read looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct View {
    /// `None` means the board's first window.
    pub window: Option<Window>,
    /// 0 is the current period, -1 the previous, ...
    pub period: i64,
}

/// What a watch follows.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum WatchTarget {
    /// The best N players, as `top` lists them.
    Top(usize),
    /// One player's rank, as `rank` answers it.
    Player(String),
}

/// A `watch` request's fields.
#[derive(Debug, Clone, PartialEq)]
pub struct WatchSpec {
    /// The board watched (it need not exist yet).
    pub board: String,
    /// What of it.
    pub target: WatchTarget,
    /// Which window and period.
    pub view: View,
    /// Pushes come at most this often.
    pub interval: Duration,
}

/// The operations of the protocol, with their validated fields. A write's
/// `wid` makes it idempotent (protocol 1.1).
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)]
pub enum Op {
    Ping,
    Auth {
        token: Secret,
    },
    CreateBoard {
        board: String,
        config: BoardConfig,
    },
    DropBoard {
        board: String,
    },
    Boards {
        prefix: String,
        after: Option<String>,
        limit: usize,
    },
    Set {
        board: String,
        player: String,
        score: ScoreInput,
        mode: Mode,
        wid: Option<Wid>,
    },
    SetMany {
        board: String,
        entries: Vec<(String, ScoreInput)>,
        mode: Mode,
        wid: Option<Wid>,
    },
    Get {
        board: String,
        player: String,
        view: View,
    },
    Remove {
        board: String,
        player: String,
        wid: Option<Wid>,
    },
    Count {
        board: String,
        view: View,
    },
    Rank {
        board: String,
        player: String,
        view: View,
    },
    RankOfScore {
        board: String,
        score: ScoreInput,
        view: View,
    },
    /// `rank` with `approx: true`: from the bucket summary.
    ApproxRank {
        board: String,
        player: String,
        view: View,
    },
    /// `rank_of_score` with `approx: true`: from the bucket summary.
    ApproxRankOfScore {
        board: String,
        score: ScoreInput,
        view: View,
    },
    Top {
        board: String,
        limit: usize,
        offset: u64,
        view: View,
    },
    Around {
        board: String,
        player: String,
        before: usize,
        after: usize,
        view: View,
    },
    Ranks {
        board: String,
        players: Vec<String>,
        view: View,
    },
    Watch(WatchSpec),
    Unwatch {
        watch: u64,
    },
    Backup,
}

impl Op {
    /// Which op this is (its protocol name, and its metrics' index).
    pub fn kind(&self) -> OpKind {
        match self {
            Self::Ping => OpKind::Ping,
            Self::Auth { .. } => OpKind::Auth,
            Self::CreateBoard { .. } => OpKind::CreateBoard,
            Self::DropBoard { .. } => OpKind::DropBoard,
            Self::Boards { .. } => OpKind::Boards,
            Self::Set { .. } => OpKind::Set,
            Self::SetMany { .. } => OpKind::SetMany,
            Self::Get { .. } => OpKind::Get,
            Self::Remove { .. } => OpKind::Remove,
            Self::Count { .. } => OpKind::Count,
            Self::Rank { .. } => OpKind::Rank,
            Self::RankOfScore { .. } => OpKind::RankOfScore,
            Self::ApproxRank { .. } => OpKind::Rank,
            Self::ApproxRankOfScore { .. } => OpKind::RankOfScore,
            Self::Top { .. } => OpKind::Top,
            Self::Around { .. } => OpKind::Around,
            Self::Ranks { .. } => OpKind::Ranks,
            Self::Watch(_) => OpKind::Watch,
            Self::Unwatch { .. } => OpKind::Unwatch,
            Self::Backup => OpKind::Backup,
        }
    }

    /// The board the op names, if it names one.
    pub fn board(&self) -> Option<&str> {
        match self {
            Self::CreateBoard { board, .. }
            | Self::DropBoard { board }
            | Self::Set { board, .. }
            | Self::SetMany { board, .. }
            | Self::Get { board, .. }
            | Self::Remove { board, .. }
            | Self::Count { board, .. }
            | Self::Rank { board, .. }
            | Self::RankOfScore { board, .. }
            | Self::ApproxRank { board, .. }
            | Self::ApproxRankOfScore { board, .. }
            | Self::Top { board, .. }
            | Self::Around { board, .. }
            | Self::Ranks { board, .. } => Some(board),
            Self::Watch(spec) => Some(&spec.board),
            Self::Ping | Self::Auth { .. } | Self::Boards { .. } | Self::Unwatch { .. } | Self::Backup => None,
        }
    }

    /// Whether the op changes state. A connection never lets a write overtake
    /// a multi-step read sent before it, so reads see exactly the writes sent
    /// before them on their connection.
    pub fn is_write(&self) -> bool {
        self.kind().is_write()
    }

    /// The rows its reply may hold (a list's entries, a `set_many`'s
    /// scores), 1 for any other reply: what a connection's requests in
    /// flight may pin in memory until their client reads the replies.
    pub fn reply_rows(&self) -> usize {
        let rows = match self {
            Self::Top { limit, .. } | Self::Boards { limit, .. } => *limit,
            Self::Around { before, after, .. } => before.saturating_add(*after).saturating_add(1),
            Self::Ranks { players, .. } => players.len(),
            Self::SetMany { entries, .. } => entries.len(),
            _ => 1,
        };
        rows.max(1)
    }
}

/// A frame that is not a valid request: the error to answer, with the
/// request's id when it could be read (0 otherwise) and its op when known
/// (so metrics can say which op clients get wrong).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// Echoed id, or 0.
    pub id: u64,
    /// The op, if `op` named one.
    pub op: Option<OpKind>,
    /// What is wrong.
    pub error: Error,
}

/// Decodes one frame body.
pub fn parse(body: &[u8]) -> Result<Request, Rejected> {
    parse_inner(body).map_err(|(id, error)| Rejected { id, op: None, error }).and_then(
        |(id, fields_op)| match fields_op {
            Ok(op) => Ok(Request { id, op }),
            Err((op, error)) => Err(Rejected { id, op, error }),
        },
    )
}

type Parsed = (u64, Result<Op, (Option<OpKind>, Error)>);

fn parse_inner(body: &[u8]) -> Result<Parsed, (u64, Error)> {
    check_shape(body).map_err(|e| (0, e))?;
    // The map level is read here rather than by rmpv, which grows its pair
    // vector from empty (two reallocations for a `set`); its size is known,
    // and bounded by `check_shape`.
    let mut rest = body;
    let not_a_map = || (0, Error::BadFrame("a request must be a msgpack map".into()));
    let len = rmp::decode::read_map_len(&mut rest).map_err(|_| not_a_map())?;
    let mut pairs = Vec::with_capacity(usize::try_from(len).map_err(|_| not_a_map())?);
    for _ in 0..len {
        let mut value = || {
            rmpv::decode::read_value_ref_with_max_depth(&mut rest, MAX_DEPTH)
                .map_err(|e| (0, Error::BadFrame(format!("not a msgpack value: {e}"))))
        };
        pairs.push((value()?, value()?));
    }
    if !rest.is_empty() {
        return Err((0, Error::BadFrame("frame holds more than one msgpack value".into())));
    }
    let fields = Fields::new(pairs).map_err(|e| (0, e))?;
    let id = match fields.get("id") {
        None => return Err((0, Error::BadRequest("missing field `id`".into()))),
        Some(v) => v.as_u64().ok_or_else(|| (0, Error::BadRequest("field `id` must be an unsigned integer".into())))?,
    };
    let op = fields.op().map_err(|e| (fields.get_str("op").and_then(OpKind::from_name), e));
    Ok((id, op))
}

#[cfg(test)]
mod tests {
    use super::shape::MAX_VALUES;
    use super::*;
    use rankd_client::protocol::MAX_SET_MANY;
    use rankd_client::ErrorCode;
    use rmpv::Value;

    fn encode(pairs: Vec<(&str, Value)>) -> Vec<u8> {
        let map = Value::Map(pairs.into_iter().map(|(k, v)| (Value::from(k), v)).collect());
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &map).unwrap();
        out
    }

    #[test]
    fn parses_a_set_with_defaults() {
        let body = encode(vec![
            ("id", 7.into()),
            ("op", "set".into()),
            ("board", "b".into()),
            ("player", "p".into()),
            ("score", (-3).into()),
            ("extra", true.into()),
        ]);
        assert_eq!(
            parse(&body),
            Ok(Request {
                id: 7,
                op: Op::Set { board: "b".into(), player: "p".into(), score: (-3).into(), mode: Mode::Set, wid: None }
            })
        );
    }

    #[test]
    fn names_the_bad_field_and_keeps_the_id() {
        let body = encode(vec![
            ("id", 9.into()),
            ("op", "set".into()),
            ("board", "b".into()),
            ("player", "p".into()),
            ("score", "x".into()),
        ]);
        let rejected = parse(&body).unwrap_err();
        assert_eq!((rejected.id, rejected.op), (9, Some(OpKind::Set)));
        assert_eq!(rejected.error.code(), ErrorCode::BadRequest);
        assert!(rejected.error.to_string().contains("score"));

        let body = encode(vec![("id", 1.into()), ("op", "fly".into())]);
        assert_eq!(parse(&body).unwrap_err().error, Error::UnknownOp("fly".into()));

        let body = encode(vec![("id", 1.into()), ("op", "top".into()), ("board", "b".into()), ("limit", 1001.into())]);
        assert_eq!(parse(&body).unwrap_err().error.code(), ErrorCode::BadRequest);
    }

    #[test]
    fn bounds_the_values_a_frame_may_hold() {
        // A full set_many is fine...
        let entries: Vec<Value> =
            (0..MAX_SET_MANY).map(|i| Value::Array(vec![format!("p{i}").into(), Value::from(i as i64)])).collect();
        let body = encode(vec![
            ("id", 1.into()),
            ("op", "set_many".into()),
            ("board", "b".into()),
            ("entries", Value::Array(entries)),
        ]);
        assert!(matches!(parse(&body), Ok(Request { op: Op::SetMany { .. }, .. })));
        // ...but a frame of tiny nested values that would cost far more
        // memory than its size is refused before it is decoded.
        let many: Vec<Value> = (0..MAX_VALUES).map(|_| Value::Map(vec![(Value::Nil, Value::Nil)])).collect();
        let body = encode(vec![("id", 1.into()), ("op", "ping".into()), ("x", Value::Array(many))]);
        assert_eq!(parse(&body).unwrap_err().error.code(), ErrorCode::TooLarge);
    }

    #[test]
    fn approx_picks_the_summary_reads_and_must_be_a_bool() {
        let rank = |approx: Value| {
            parse(&encode(vec![
                ("id", 1.into()),
                ("op", "rank".into()),
                ("board", "b".into()),
                ("player", "p".into()),
                ("approx", approx),
            ]))
        };
        let op = |approx| rank(approx).map(|r| r.op);
        assert_eq!(
            op(true.into()),
            Ok(Op::ApproxRank { board: "b".into(), player: "p".into(), view: View::default() })
        );
        assert_eq!(op(false.into()), Ok(Op::Rank { board: "b".into(), player: "p".into(), view: View::default() }));
        assert_eq!(op(Value::Nil), Ok(Op::Rank { board: "b".into(), player: "p".into(), view: View::default() }));
        let wrong = rank(1.into()).unwrap_err();
        assert_eq!((wrong.error.code(), wrong.op), (ErrorCode::BadRequest, Some(OpKind::Rank)));
        assert!(wrong.error.to_string().contains("approx"));
        let body = encode(vec![
            ("id", 2.into()),
            ("op", "rank_of_score".into()),
            ("board", "b".into()),
            ("score", 5.into()),
            ("approx", true.into()),
        ]);
        assert_eq!(parse(&body).map(|r| r.op.kind()), Ok(OpKind::RankOfScore));
        assert!(matches!(parse(&body).map(|r| r.op), Ok(Op::ApproxRankOfScore { score: ScoreInput::Int(5), .. })));
    }

    #[test]
    fn rejects_non_maps_and_garbage() {
        let mut body = Vec::new();
        rmpv::encode::write_value(&mut body, &Value::from(vec![Value::from(1)])).unwrap();
        assert_eq!(
            parse(&body).unwrap_err(),
            Rejected { id: 0, op: None, error: Error::BadFrame("a request must be a msgpack map".into()) }
        );
        assert_eq!(parse(&[0xc1]).unwrap_err().error.code(), ErrorCode::BadFrame);
        // A map announcing far more entries than the frame holds.
        assert_eq!(parse(&[0xdf, 0xff, 0xff, 0xff, 0xff]).unwrap_err().error.code(), ErrorCode::BadFrame);
        // Deep nesting is refused, not recursed into.
        assert_eq!(parse(&[0x91; 64]).unwrap_err().error.code(), ErrorCode::BadFrame);
    }
}
