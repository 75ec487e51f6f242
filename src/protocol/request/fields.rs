//! The second pass over a frame: its map's fields, turned into a typed
//! [`Op`], with an error that names the wrong field.

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

use super::{Op, View, WatchSpec, WatchTarget};
use crate::error::Error;
use crate::protocol::score::{self, ScoreInput};
use crate::security::Secret;

/// The map's fields, keyed by UTF-8 strings (checked once, here).
pub(super) struct Fields<'a> {
    /// Key and value of each entry, borrowed from the frame (nothing is
    /// copied); looked up by a scan, as a request has a handful.
    pairs: Vec<(ValueRef<'a>, ValueRef<'a>)>,
}

impl<'a> Fields<'a> {
    pub(super) fn new(pairs: Vec<(ValueRef<'a>, ValueRef<'a>)>) -> Result<Self, Error> {
        if !pairs.iter().all(|(key, _)| text(key).is_some()) {
            return Err(Error::BadFrame("request map keys must be UTF-8 strings".into()));
        }
        Ok(Self { pairs })
    }

    pub(super) fn get_str(&self, name: &str) -> Option<&str> {
        text(self.get(name)?)
    }

    pub(super) fn get(&self, name: &str) -> Option<&ValueRef<'a>> {
        self.pairs
            .iter()
            .find(|(key, _)| text(key) == Some(name))
            .map(|(_, v)| v)
            .filter(|v| !matches!(v, ValueRef::Nil))
    }

    pub(super) fn op(&self) -> Result<Op, Error> {
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
