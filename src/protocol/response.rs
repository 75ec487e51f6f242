//! Encoding replies: `{"id", "ok"}` or `{"id", "err": {"code", "msg"}}`,
//! framed, with string keys (rmp-serde's named encoding).

use rankd_client::frame::write_frame_with;
use rankd_client::{ApproxRankInfo, ApproxRankOfScore, Entry, RankInfo};
use serde::Serialize;

use super::score::FieldScore;
use crate::error::Error;
use crate::security::Role;

/// A successful result, shaped as `protocol.md` lists it per op.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Reply {
    /// `ping`.
    Text(&'static str),
    /// `auth`, `create_board`, `drop_board`, `remove`.
    Bool(bool),
    /// `set`.
    Score(i64),
    /// `set_many`.
    Scores(Vec<i64>),
    /// `get`.
    MaybeScore(Option<i64>),
    /// `count`, `rank_of_score`.
    Count(u64),
    /// `rank`.
    Rank(Option<RankInfo>),
    /// `rank` with `approx: true`.
    ApproxRank(Option<ApproxRankInfo>),
    /// `rank_of_score` with `approx: true`.
    ApproxRankOfScore(ApproxRankOfScore),
    /// `top`, `around`.
    Entries(Vec<Entry>),
    /// `boards`.
    Boards(Vec<BoardListing>),
    /// `set` on a board with fields.
    FieldScore(FieldScore),
    /// `set_many` on a board with fields.
    FieldScores(Vec<FieldScore>),
    /// `get` on a board with fields.
    MaybeFieldScore(Option<FieldScore>),
    /// `rank` on a board with fields.
    FieldRank(Option<RankInfo<FieldScore>>),
    /// `rank` with `approx: true` on a board with fields.
    FieldApproxRank(Option<ApproxRankInfo<FieldScore>>),
    /// `top`, `around`, `ranks` on a board with fields.
    FieldEntries(Vec<Entry<FieldScore>>),
    /// `auth` on a server with token roles: `{"role": "read"|"write"}`.
    Role {
        /// The role the token grants.
        role: Role,
    },
    /// `watch`: `{"watch": id}`.
    Watch {
        /// The watch's id on its connection.
        watch: u64,
    },
    /// An idempotent write's first answer, replayed: encoded as the inner
    /// reply with `"dup": true` beside `"ok"`.
    #[serde(skip)]
    Replayed(Box<Reply>),
}

/// One row of `boards`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BoardListing {
    /// The board's name.
    pub board: String,
    /// `desc` or `asc` (`desc` on a board with fields, which ranks by them).
    pub order: &'static str,
    /// Tie rule.
    pub ties: &'static str,
    /// Windows kept.
    pub windows: Vec<&'static str>,
    /// Past periods kept.
    pub keep: u32,
    /// Players in the first window's current period.
    pub count: u64,
    /// A composite score's fields, on boards that have them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<FieldListing>,
}

/// One field of a board, as `create_board` declares it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FieldListing {
    /// Its name.
    pub name: String,
    /// `desc` or `asc`.
    pub order: &'static str,
    /// Smallest value.
    pub min: i64,
    /// Largest value.
    pub max: i64,
}

#[derive(Serialize)]
struct OkFrame<'a> {
    /// The request's id, so a pipelining client can match the reply.
    id: u64,
    /// The result, borrowed: encoded without a copy.
    ok: &'a Reply,
    /// Set on a replayed idempotent write only.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    dup: bool,
}

#[derive(Serialize)]
struct ErrFrame<'a> {
    /// The request's id (0 when it could not be read).
    id: u64,
    /// What went wrong, in place of `ok`.
    err: ErrBody<'a>,
}

#[derive(Serialize)]
struct ErrBody<'a> {
    /// What a client program branches on.
    code: rankd_client::ErrorCode,
    /// What a person reads.
    msg: &'a str,
}

/// Appends the framed success response to `out`.
pub fn encode_reply(out: &mut Vec<u8>, id: u64, reply: &Reply) {
    match reply {
        Reply::Replayed(first) => framed(out, &OkFrame { id, ok: first, dup: true }),
        reply => framed(out, &OkFrame { id, ok: reply, dup: false }),
    }
}

/// Appends the framed error response to `out`.
pub fn encode_error(out: &mut Vec<u8>, id: u64, error: &Error) {
    framed(out, &ErrFrame { id, err: ErrBody { code: error.code(), msg: &error.to_string() } });
}

fn framed<T: Serialize>(out: &mut Vec<u8>, value: &T) {
    // Serializing these plain structs into a Vec cannot fail.
    write_frame_with(out, |out| rmp_serde::encode::write_named(out, value).is_ok());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode(frame: &[u8]) -> rmpv::Value {
        assert_eq!(u32::from_be_bytes(frame[..4].try_into().unwrap()) as usize, frame.len() - 4);
        rmpv::decode::read_value(&mut &frame[4..]).unwrap()
    }

    #[test]
    fn encodes_maps_with_string_keys() {
        let mut out = Vec::new();
        encode_reply(&mut out, 3, &Reply::Rank(Some(RankInfo { rank: 1, score: -5, count: 2 })));
        let v = decode(&out);
        assert_eq!(v["id"], rmpv::Value::from(3));
        assert_eq!(v["ok"]["score"], rmpv::Value::from(-5));

        let mut out = Vec::new();
        encode_reply(&mut out, 4, &Reply::MaybeScore(None));
        assert!(decode(&out)["ok"].is_nil());

        let mut out = Vec::new();
        encode_reply(&mut out, 5, &Reply::Replayed(Box::new(Reply::Score(7))));
        let v = decode(&out);
        assert_eq!((v["ok"].as_i64(), v["dup"].as_bool()), (Some(7), Some(true)));
        let mut out = Vec::new();
        encode_reply(&mut out, 5, &Reply::Score(7));
        assert!(decode(&out).as_map().unwrap().iter().all(|(k, _)| k.as_str() != Some("dup")));

        let mut out = Vec::new();
        encode_error(&mut out, 0, &Error::TooLarge("big".into()));
        assert_eq!(decode(&out)["err"]["code"], rmpv::Value::from("too_large"));
    }
}
