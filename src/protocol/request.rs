//! Decoding a frame into a typed [`Request`], with an error that says which
//! field is wrong. Unknown fields are ignored, as the protocol requires.

use std::time::Duration;

use rankd_client::protocol::{
    DEFAULT_BOARDS_PAGE, DEFAULT_WATCH_INTERVAL_MS, MAX_AROUND, MAX_BOARDS_PAGE, MAX_RANKS, MAX_SET_MANY,
    MAX_TOP_LIMIT, MAX_WATCH_TOP, MAX_WID, WATCH_INTERVAL_MS,
};
use rankd_client::OpKind;
use rankd_shards::board::{valid_board_name, valid_player_name};
use rankd_shards::fields::{self, Field};
use rankd_shards::{BoardConfig, Mode, Order, Ties, Wid, Window};
use rmpv::ValueRef;

use super::score::{self, ScoreInput};
use crate::error::Error;
use crate::security::Secret;
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

/// Most msgpack values (at any depth) a request may hold: a full `set_many`
/// is 3 per entry plus a few fields, or 11 per entry with 4-field scores. Decoding allocates per value (tiny
/// maps cost many times their size in a value tree: see
/// docs/performance-history.md), so this bounds the memory one frame can
/// cost to a few MB whatever its shape.
const MAX_VALUES: usize = 11 * MAX_SET_MANY + 256;

/// Walks the msgpack structure without allocating: refuses frames that are
/// truncated, nest deeper than [`MAX_DEPTH`], or hold more than
/// [`MAX_VALUES`] values, before any value tree is built.
fn check_shape(mut buf: &[u8]) -> Result<(), Error> {
    use rmp::Marker;
    let bad = |what: &str| Error::BadFrame(format!("not a msgpack value: {what}"));
    // Values still to read in each open container, innermost last: a fixed
    // stack (depth is bounded), so checking a frame allocates nothing.
    let mut open = [0u64; MAX_DEPTH + 2];
    open[0] = 1;
    let mut depth = 1;
    let mut seen = 0usize;
    while depth > 0 {
        let left = &mut open[depth - 1];
        if *left == 0 {
            depth -= 1;
            continue;
        }
        *left -= 1;
        seen += 1;
        if seen > MAX_VALUES {
            return Err(Error::TooLarge(format!("a request may hold at most {MAX_VALUES} msgpack values")));
        }
        let marker = rmp::decode::read_marker(&mut buf).map_err(|_| bad("truncated"))?;
        let mut len = |bytes: usize| -> Result<u64, Error> {
            let (head, rest) = buf.split_at_checked(bytes).ok_or_else(|| bad("truncated"))?;
            buf = rest;
            Ok(head.iter().fold(0u64, |acc, b| (acc << 8) | u64::from(*b)))
        };
        let (skip, children) = match marker {
            Marker::FixPos(_) | Marker::FixNeg(_) | Marker::Null | Marker::True | Marker::False => (0, 0),
            Marker::U8 | Marker::I8 => (1, 0),
            Marker::U16 | Marker::I16 => (2, 0),
            Marker::U32 | Marker::I32 | Marker::F32 => (4, 0),
            Marker::U64 | Marker::I64 | Marker::F64 => (8, 0),
            Marker::FixStr(n) => (u64::from(n), 0),
            Marker::Str8 | Marker::Bin8 => (len(1)?, 0),
            Marker::Str16 | Marker::Bin16 => (len(2)?, 0),
            Marker::Str32 | Marker::Bin32 => (len(4)?, 0),
            Marker::FixExt1 => (2, 0),
            Marker::FixExt2 => (3, 0),
            Marker::FixExt4 => (5, 0),
            Marker::FixExt8 => (9, 0),
            Marker::FixExt16 => (17, 0),
            Marker::Ext8 => (len(1)? + 1, 0),
            Marker::Ext16 => (len(2)? + 1, 0),
            Marker::Ext32 => (len(4)? + 1, 0),
            Marker::FixArray(n) => (0, u64::from(n)),
            Marker::Array16 => (0, len(2)?),
            Marker::Array32 => (0, len(4)?),
            Marker::FixMap(n) => (0, 2 * u64::from(n)),
            Marker::Map16 => (0, 2 * len(2)?),
            Marker::Map32 => (0, 2 * len(4)?),
            Marker::Reserved => return Err(bad("reserved marker 0xc1")),
        };
        let skip = usize::try_from(skip).map_err(|_| bad("truncated"))?;
        buf = buf.get(skip..).ok_or_else(|| bad("truncated"))?;
        if children > 0 {
            // Every value takes at least a byte: more than remain is a lie.
            if children > buf.len() as u64 {
                return Err(bad("a list or map announces more values than the frame holds"));
            }
            if depth > MAX_DEPTH {
                return Err(bad("nested too deeply"));
            }
            open[depth] = children;
            depth += 1;
        }
    }
    if !buf.is_empty() {
        return Err(Error::BadFrame("frame holds more than one msgpack value".into()));
    }
    Ok(())
}

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

/// The map's fields, keyed by UTF-8 strings (checked once, here).
struct Fields<'a> {
    /// Key and value of each entry, borrowed from the frame (nothing is
    /// copied); looked up by a scan, as a request has a handful.
    pairs: Vec<(ValueRef<'a>, ValueRef<'a>)>,
}

impl<'a> Fields<'a> {
    fn new(pairs: Vec<(ValueRef<'a>, ValueRef<'a>)>) -> Result<Self, Error> {
        if !pairs.iter().all(|(key, _)| text(key).is_some()) {
            return Err(Error::BadFrame("request map keys must be UTF-8 strings".into()));
        }
        Ok(Self { pairs })
    }

    fn get_str(&self, name: &str) -> Option<&str> {
        text(self.get(name)?)
    }

    fn get(&self, name: &str) -> Option<&ValueRef<'a>> {
        self.pairs
            .iter()
            .find(|(key, _)| text(key) == Some(name))
            .map(|(_, v)| v)
            .filter(|v| !matches!(v, ValueRef::Nil))
    }

    fn op(&self) -> Result<Op, Error> {
        let name = self.str("op")?;
        let Some(kind) = OpKind::from_name(name) else {
            return Err(Error::UnknownOp(clip(name)));
        };
        Ok(match kind {
            OpKind::Ping => Op::Ping,
            OpKind::Auth => Op::Auth { token: Secret(self.str("token")?.to_string()) },
            OpKind::CreateBoard => Op::CreateBoard { board: self.board()?, config: self.config()? },
            OpKind::DropBoard => Op::DropBoard { board: self.board()? },
            OpKind::Boards => Op::Boards {
                prefix: self.name_part("prefix")?.unwrap_or_default(),
                after: self.name_part("after")?,
                limit: match self.opt_u64("limit")? {
                    None => DEFAULT_BOARDS_PAGE,
                    Some(limit) if (1..=MAX_BOARDS_PAGE as u64).contains(&limit) => limit as usize,
                    Some(_) => return Err(Error::BadRequest(format!("field `limit` must be 1 to {MAX_BOARDS_PAGE}"))),
                },
            },
            OpKind::Set => Op::Set {
                board: self.board()?,
                player: self.player()?,
                score: self.score()?,
                mode: self.mode()?,
                wid: self.wid()?,
            },
            OpKind::SetMany => {
                Op::SetMany { board: self.board()?, entries: self.entries()?, mode: self.mode()?, wid: self.wid()? }
            }
            OpKind::Get => Op::Get { board: self.board()?, player: self.player()?, view: self.view()? },
            OpKind::Remove => Op::Remove { board: self.board()?, player: self.player()?, wid: self.wid()? },
            OpKind::Count => Op::Count { board: self.board()?, view: self.view()? },
            OpKind::Rank => {
                let (board, player, view) = (self.board()?, self.player()?, self.view()?);
                match self.approx()? {
                    false => Op::Rank { board, player, view },
                    true => Op::ApproxRank { board, player, view },
                }
            }
            OpKind::RankOfScore => {
                let (board, score, view) = (self.board()?, self.score()?, self.view()?);
                match self.approx()? {
                    false => Op::RankOfScore { board, score, view },
                    true => Op::ApproxRankOfScore { board, score, view },
                }
            }
            OpKind::Top => Op::Top {
                board: self.board()?,
                limit: self.bounded("limit", 10, MAX_TOP_LIMIT)?,
                offset: self.opt_u64("offset")?.unwrap_or(0),
                view: self.view()?,
            },
            OpKind::Around => Op::Around {
                board: self.board()?,
                player: self.player()?,
                before: self.bounded("before", 5, MAX_AROUND)?,
                after: self.bounded("after", 5, MAX_AROUND)?,
                view: self.view()?,
            },
            OpKind::Ranks => Op::Ranks { board: self.board()?, players: self.players()?, view: self.view()? },
            OpKind::Watch => Op::Watch(self.watch()?),
            OpKind::Unwatch => Op::Unwatch {
                watch: self.opt_u64("watch")?.ok_or_else(|| Error::BadRequest("missing field `watch`".into()))?,
            },
            OpKind::Backup => Op::Backup,
        })
    }

    /// A `boards` page's `prefix` or `after`: at most a board name's length.
    fn name_part(&self, name: &str) -> Result<Option<String>, Error> {
        match self.opt_str(name)? {
            Some(text) if text.len() > 128 => Err(Error::BadRequest(format!("field `{name}` is at most 128 bytes"))),
            text => Ok(text.map(str::to_string)),
        }
    }

    fn wid(&self) -> Result<Option<Wid>, Error> {
        let Some(wid) = self.opt_str("wid")? else { return Ok(None) };
        if wid.is_empty() || wid.len() > MAX_WID {
            return Err(Error::BadRequest(format!("field `wid` must be 1-{MAX_WID} bytes")));
        }
        Ok(Some(Wid::from(wid)))
    }

    fn watch(&self) -> Result<WatchSpec, Error> {
        let target = match (self.get("top"), self.get("player")) {
            (Some(_), None) => {
                let top = self.opt_u64("top")?.unwrap_or(0);
                if !(1..=MAX_WATCH_TOP).contains(&top) {
                    return Err(Error::BadRequest(format!("field `top` must be 1 to {MAX_WATCH_TOP}")));
                }
                WatchTarget::Top(top as usize)
            }
            (None, Some(_)) => WatchTarget::Player(self.player()?),
            _ => return Err(Error::BadRequest("a watch takes exactly one of `top` and `player`".into())),
        };
        let interval = self.opt_u64("interval_ms")?.unwrap_or(DEFAULT_WATCH_INTERVAL_MS);
        if !WATCH_INTERVAL_MS.contains(&interval) {
            return Err(Error::BadRequest(format!(
                "field `interval_ms` must be {} to {}",
                WATCH_INTERVAL_MS.start(),
                WATCH_INTERVAL_MS.end()
            )));
        }
        Ok(WatchSpec { board: self.board()?, target, view: self.view()?, interval: Duration::from_millis(interval) })
    }

    fn required(&self, name: &str) -> Result<&ValueRef<'a>, Error> {
        self.get(name).ok_or_else(|| Error::BadRequest(format!("missing field `{name}`")))
    }

    fn str(&self, name: &str) -> Result<&str, Error> {
        as_str(self.required(name)?, name)
    }

    fn opt_str(&self, name: &str) -> Result<Option<&str>, Error> {
        self.get(name).map(|v| as_str(v, name)).transpose()
    }

    fn score(&self) -> Result<ScoreInput, Error> {
        score::decode(self.required("score")?, "field `score`")
    }

    fn opt_u64(&self, name: &str) -> Result<Option<u64>, Error> {
        self.get(name)
            .map(|v| v.as_u64().ok_or_else(|| Error::BadRequest(format!("field `{name}` must be an unsigned integer"))))
            .transpose()
    }

    /// An optional count with a default and a protocol maximum.
    fn bounded(&self, name: &str, default: u64, max: u64) -> Result<usize, Error> {
        let value = self.opt_u64(name)?.unwrap_or(default);
        if value > max {
            return Err(Error::BadRequest(format!("field `{name}` must be at most {max}")));
        }
        Ok(value as usize)
    }

    fn board(&self) -> Result<String, Error> {
        let board = self.str("board")?;
        if !valid_board_name(board) {
            return Err(Error::BadRequest("field `board` must be 1-128 bytes of [A-Za-z0-9_.:-]".into()));
        }
        Ok(board.to_string())
    }

    fn player(&self) -> Result<String, Error> {
        let player = self.str("player")?;
        check_player(player)?;
        Ok(player.to_string())
    }

    fn mode(&self) -> Result<Mode, Error> {
        self.opt_str("mode")?.map_or(Ok(Mode::Set), |m| {
            Mode::parse(m).ok_or_else(|| Error::BadRequest(format!("unknown mode `{}`", clip(m))))
        })
    }

    /// `approx`: absent (or nil) is false.
    fn approx(&self) -> Result<bool, Error> {
        match self.get("approx") {
            None => Ok(false),
            Some(ValueRef::Boolean(approx)) => Ok(*approx),
            Some(_) => Err(Error::BadRequest("field `approx` must be true or false".into())),
        }
    }

    fn view(&self) -> Result<View, Error> {
        let window = self
            .opt_str("window")?
            .map(|w| Window::parse(w).ok_or_else(|| Error::BadRequest(format!("unknown window `{}`", clip(w)))))
            .transpose()?;
        let period = match self.get("period") {
            None => 0,
            Some(v) => as_i64(v)
                .filter(|p| *p <= 0)
                .ok_or_else(|| Error::BadRequest("field `period` must be 0 or a negative integer".into()))?,
        };
        Ok(View { window, period })
    }

    fn config(&self) -> Result<BoardConfig, Error> {
        let mut config = BoardConfig::default();
        if let Some(order) = self.opt_str("order")? {
            config.order =
                Order::parse(order).ok_or_else(|| Error::BadRequest(format!("unknown order `{}`", clip(order))))?;
        }
        if let Some(ties) = self.opt_str("ties")? {
            config.ties =
                Ties::parse(ties).ok_or_else(|| Error::BadRequest(format!("unknown ties `{}`", clip(ties))))?;
        }
        if let Some(windows) = self.get("windows") {
            let ValueRef::Array(items) = windows else {
                return Err(Error::BadRequest("field `windows` must be a list of strings".into()));
            };
            if items.is_empty() || items.len() > 4 {
                return Err(Error::BadRequest("field `windows` must list 1 to 4 windows".into()));
            }
            let mut windows = Vec::with_capacity(items.len());
            for item in items {
                let name = as_str(item, "windows")?;
                let window =
                    Window::parse(name).ok_or_else(|| Error::BadRequest(format!("unknown window `{}`", clip(name))))?;
                if windows.contains(&window) {
                    return Err(Error::BadRequest(format!("window `{name}` listed twice")));
                }
                windows.push(window);
            }
            config.windows = windows;
        }
        if let Some(keep) = self.opt_u64("keep")? {
            config.keep = u32::try_from(keep)
                .ok()
                .filter(|k| (1..=1000).contains(k))
                .ok_or_else(|| Error::BadRequest("field `keep` must be 1 to 1000".into()))?;
        }
        if let Some(declared) = self.get("fields") {
            config.fields = composite_fields(declared)?;
            config.order = Order::Desc; // packed scores rank high-first
        }
        Ok(config)
    }

    /// `ranks`' `players`: 1 to [`MAX_RANKS`] valid names (repeats allowed).
    fn players(&self) -> Result<Vec<String>, Error> {
        let ValueRef::Array(items) = self.required("players")? else {
            return Err(Error::BadRequest("field `players` must be a list of player names".into()));
        };
        if items.is_empty() {
            return Err(Error::BadRequest("field `players` must name at least one player".into()));
        }
        if items.len() > MAX_RANKS {
            return Err(Error::TooLarge(format!("`players` holds {} names; the limit is {MAX_RANKS}", items.len())));
        }
        items
            .iter()
            .map(|item| {
                let player = as_str(item, "players")?;
                check_player(player)?;
                Ok(player.to_string())
            })
            .collect()
    }

    fn entries(&self) -> Result<Vec<(String, ScoreInput)>, Error> {
        let ValueRef::Array(items) = self.required("entries")? else {
            return Err(Error::BadRequest("field `entries` must be a list of [player, score] pairs".into()));
        };
        if items.len() > MAX_SET_MANY {
            return Err(Error::TooLarge(format!(
                "`entries` holds {} entries; the limit is {MAX_SET_MANY}",
                items.len()
            )));
        }
        items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                ValueRef::Array(pair) if pair.len() == 2 => {
                    let player = as_str(&pair[0], "entries")?;
                    check_player(player)?;
                    let score = score::decode(&pair[1], &format!("entries[{i}]: score"))?;
                    Ok((player.to_string(), score))
                }
                _ => Err(Error::BadRequest(format!("entries[{i}] must be a [player, score] pair"))),
            })
            .collect()
    }
}

/// `create_board`'s `fields`: 2–4 maps `{name, order, min, max}`, checked
/// as protocol.md asks (unique names, ranges multiplying to at most 2^63).
fn composite_fields(declared: &ValueRef<'_>) -> Result<Vec<Field>, Error> {
    let bad = |what: String| Error::BadRequest(format!("field `fields`: {what}"));
    let ValueRef::Array(items) = declared else {
        return Err(bad("must be a list of {name, order, min, max} maps".into()));
    };
    if items.len() > fields::MAX_FIELDS {
        return Err(bad(format!("lists {} fields; the limit is {}", items.len(), fields::MAX_FIELDS)));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let ValueRef::Map(pairs) = item else { return Err(bad(format!("[{i}] must be a map"))) };
        let get = |key: &str| {
            pairs.iter().find(|(k, _)| text(k) == Some(key)).map(|(_, v)| v).filter(|v| !matches!(v, ValueRef::Nil))
        };
        let name = match get("name") {
            Some(ValueRef::String(s)) => s.as_str().ok_or_else(|| bad(format!("[{i}].name is not UTF-8")))?,
            Some(_) => return Err(bad(format!("[{i}].name must be a string"))),
            None => return Err(bad(format!("[{i}] lacks `name`"))),
        };
        let order = match get("order") {
            None => Order::Desc,
            Some(v) => {
                text(v).and_then(Order::parse).ok_or_else(|| bad(format!("[{i}].order must be \"desc\" or \"asc\"")))?
            }
        };
        let bound = |key: &str| -> Result<Option<i64>, Error> {
            get(key)
                .map(|v| as_i64(v).ok_or_else(|| bad(format!("[{i}].{key} must be a signed 64-bit integer"))))
                .transpose()
        };
        let min = bound("min")?.unwrap_or(0);
        let max = bound("max")?.ok_or_else(|| bad(format!("[{i}] lacks `max`")))?;
        out.push(Field { name: name.to_string(), order, min, max });
    }
    fields::check(&out).map_err(|e| bad(e.to_string()))?;
    Ok(out)
}

fn as_str<'a>(value: &'a ValueRef<'a>, name: &str) -> Result<&'a str, Error> {
    match value {
        ValueRef::String(s) => {
            s.as_str().ok_or_else(|| Error::BadRequest(format!("field `{name}` is not valid UTF-8")))
        }
        _ => Err(Error::BadRequest(format!("field `{name}` must be a string"))),
    }
}

/// A value's text, if it is a UTF-8 string.
fn text<'v>(value: &'v ValueRef<'_>) -> Option<&'v str> {
    match value {
        ValueRef::String(s) => s.as_str(),
        _ => None,
    }
}

fn as_i64(value: &ValueRef<'_>) -> Option<i64> {
    match value {
        ValueRef::Integer(i) => i.as_i64(),
        _ => None,
    }
}

fn check_player(player: &str) -> Result<(), Error> {
    if valid_player_name(player) {
        Ok(())
    } else {
        Err(Error::BadRequest("field `player` must be 1-256 bytes of UTF-8".into()))
    }
}

/// Echoing client text back is handy, but never a lot of it.
fn clip(s: &str) -> String {
    s.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
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
