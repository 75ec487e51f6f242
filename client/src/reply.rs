//! Replies: the result types of the ops, and the envelope every reply
//! comes in (`{"id", "ok"}` or `{"id", "err": {"code", "msg"}}`).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::ClientError;

/// `rank`'s result. `S` is how scores read: `i64`, or
/// [`crate::FieldScores`] on a board with fields (protocol 1.1).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankInfo<S = i64> {
    /// 1-based rank under the board's tie rule.
    pub rank: u64,
    /// The player's score.
    pub score: S,
    /// Players on the board.
    pub count: u64,
}

/// `rank`'s result with `approx: true`: an estimate from the board's
/// bucket summary, whose exact rank (as of the summary's last refresh, at
/// most about a second old) lies within `rank ± error`.
/// `S` as for [`RankInfo`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApproxRankInfo<S = i64> {
    /// Estimated 1-based rank under the board's tie rule.
    pub rank: u64,
    /// The player's score, read now.
    pub score: S,
    /// Players on the board as of the summary.
    pub count: u64,
    /// The exact rank lies within `rank ± error`.
    pub error: u64,
}

/// `rank_of_score`'s result with `approx: true`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApproxRankOfScore {
    /// Estimated rank a new player with the score would get.
    pub rank: u64,
    /// The exact answer lies within `rank ± error`.
    pub error: u64,
}

/// One row of `top` / `around` / `ranks`; `S` as for [`RankInfo`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry<S = i64> {
    /// Who holds this row.
    pub player: String,
    /// Their score.
    pub score: S,
    /// 1-based rank under the board's tie rule.
    pub rank: u64,
}

/// One row of `boards`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoardInfo {
    /// The board's name, as clients address it.
    pub board: String,
    /// `desc` or `asc`.
    pub order: String,
    /// Tie rule.
    pub ties: String,
    /// Windows kept.
    pub windows: Vec<String>,
    /// Past periods kept.
    pub keep: u32,
    /// Players in the first window's current period.
    pub count: u64,
    /// A composite score's fields; `None` on a plain board.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fields: Option<Vec<crate::FieldSpec>>,
}

/// An error reply's body.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrBody {
    /// The error code, kept as text so a newer server's codes still read.
    pub code: String,
    /// The server's explanation, for people.
    pub msg: String,
}

/// A decoded reply: its id, its result as `T` or the server's error, and
/// whether the server flagged it a repeat of an idempotent write.
pub(crate) struct Envelope<T> {
    /// The request's id: how a reply is matched to its call.
    pub id: u64,
    /// `ok` decoded as `T`, or the server's error.
    pub result: Result<T, ClientError>,
    /// `"dup": true` beside `ok`: a write whose `wid` the server had
    /// already applied, answered with the first application's result.
    pub dup: bool,
}

/// A frame from the server: a reply to a request, or a watch's push
/// (`{"watch": id, "event": ...}`, which has no `id` key).
pub(crate) enum Incoming<T> {
    /// A reply.
    Reply(Envelope<T>),
    /// A push of the watch with this id; its event is not decoded here.
    Push(u64),
}

impl<T: DeserializeOwned> Incoming<T> {
    /// Decodes one frame's body, reading `ok` straight into `T` (no
    /// intermediate value tree; `T` = [`IgnoredAny`] skips it). A result
    /// that is not a `T` fails only its own call: the frame was read whole,
    /// so the connection is still in step.
    pub fn decode(body: &[u8]) -> Result<Self, ClientError> {
        match rmp_serde::from_slice(body) {
            Ok(incoming) => Ok(incoming),
            Err(shape) => match rmp_serde::from_slice::<Incoming<IgnoredAny>>(body) {
                Ok(Incoming::Reply(Envelope { id, dup, .. })) => Ok(Incoming::Reply(Envelope {
                    id,
                    result: Err(ClientError::Protocol(format!("unexpected result shape: {shape}"))),
                    dup,
                })),
                Ok(Incoming::Push(watch)) => Ok(Incoming::Push(watch)),
                Err(e) => Err(ClientError::Protocol(format!("bad reply: {e}"))),
            },
        }
    }
}

impl<T: DeserializeOwned> Envelope<T> {
    /// Decodes one reply frame's body (see [`Incoming::decode`]); a push is
    /// not a reply.
    #[cfg(test)]
    pub fn decode(body: &[u8]) -> Result<Self, ClientError> {
        match Incoming::decode(body)? {
            Incoming::Reply(envelope) => Ok(envelope),
            Incoming::Push(watch) => Err(ClientError::Protocol(format!("a push of watch {watch}, not a reply"))),
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Incoming<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(IncomingVisitor(PhantomData))
    }
}

struct IncomingVisitor<T>(PhantomData<T>);

impl<'de, T: DeserializeOwned> Visitor<'de> for IncomingVisitor<T> {
    type Value = Incoming<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a reply map with `id` and `ok` or `err`, or a push with `watch` and `event`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut id, mut result, mut dup, mut watch) = (None, None, false, None);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match &*key {
                "id" => id = Some(map.next_value::<u64>()?),
                "ok" => result = Some(Ok(map.next_value::<T>()?)),
                "err" => {
                    let ErrBody { code, msg } = map.next_value()?;
                    result = Some(Err(ClientError::Server { code, msg }));
                }
                "dup" => dup = map.next_value::<Lenient<bool>>()?.0 == Some(true),
                "watch" => watch = map.next_value::<Lenient<u64>>()?.0,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let Some(id) = id else {
            // Only a map without `id` can be a push: a reply always has one.
            return match watch {
                Some(watch) => Ok(Incoming::Push(watch)),
                None => Err(serde::de::Error::missing_field("id")),
            };
        };
        let result = result.ok_or_else(|| serde::de::Error::custom("reply has neither `ok` nor `err`"))?;
        Ok(Incoming::Reply(Envelope { id, result, dup }))
    }
}

/// A field read as `T` when it is one, and skipped (`None`) when it is
/// anything else: a reply's unexpected `watch` or `dup` must not fail it.
struct Lenient<T>(Option<T>);

impl<'de> Deserialize<'de> for Lenient<u64> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LenientVisitor(PhantomData))
    }
}

impl<'de> Deserialize<'de> for Lenient<bool> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LenientVisitor(PhantomData))
    }
}

struct LenientVisitor<T>(PhantomData<T>);

/// What a lenient field keeps of each kind of value.
trait LenientValue: Sized {
    fn from_u64(_: u64) -> Option<Self> {
        None
    }
    fn from_bool(_: bool) -> Option<Self> {
        None
    }
}

impl LenientValue for u64 {
    fn from_u64(v: u64) -> Option<Self> {
        Some(v)
    }
}

impl LenientValue for bool {
    fn from_bool(v: bool) -> Option<Self> {
        Some(v)
    }
}

impl<'de, T: LenientValue> Visitor<'de> for LenientVisitor<T> {
    type Value = Lenient<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(Lenient(T::from_bool(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Lenient(T::from_u64(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(Lenient(u64::try_from(v).ok().and_then(T::from_u64)))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }

    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }

    fn visit_bytes<E>(self, _: &[u8]) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Lenient(None))
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        IgnoredAny::deserialize(deserializer)?;
        Ok(Lenient(None))
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Lenient(None))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Lenient(None))
    }

    fn visit_newtype_struct<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        IgnoredAny::deserialize(deserializer)?;
        Ok(Lenient(None))
    }

    fn visit_enum<A: serde::de::EnumAccess<'de>>(self, data: A) -> Result<Self::Value, A::Error> {
        IgnoredAny.visit_enum(data)?;
        Ok(Lenient(None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Serialize)]
    struct Reply<'a, T> {
        id: u64,
        ok: T,
        extra: &'a str,
    }

    #[derive(Serialize)]
    struct Failure<'a> {
        id: u64,
        err: Err<'a>,
    }

    #[derive(Serialize)]
    struct Err<'a> {
        code: &'a str,
        msg: &'a str,
    }

    fn named(value: &impl Serialize) -> Vec<u8> {
        rmp_serde::to_vec_named(value).unwrap()
    }

    #[test]
    fn results_decode_into_the_callers_type() {
        let body = named(&Reply { id: 3, ok: Option::<i64>::None, extra: "ignored" });
        let envelope = Envelope::<Option<i64>>::decode(&body).unwrap();
        assert_eq!((envelope.id, envelope.result.unwrap()), (3, None));
        let body = named(&Reply { id: 4, ok: RankInfo { rank: 2, score: -5, count: 9 }, extra: "" });
        assert_eq!(Envelope::<Option<RankInfo>>::decode(&body).unwrap().result.unwrap().unwrap().rank, 2);
        assert_eq!(Envelope::<IgnoredAny>::decode(&body).unwrap().id, 4);
    }

    #[test]
    fn errors_and_wrong_shapes_fail_only_their_call() {
        let body = named(&Failure { id: 5, err: Err { code: "conflict", msg: "no" } });
        let envelope = Envelope::<bool>::decode(&body).unwrap();
        let error = envelope.result.unwrap_err();
        assert_eq!((envelope.id, error.error_code()), (5, Some(crate::ErrorCode::Conflict)));
        let body = named(&Reply { id: 6, ok: "pong", extra: "" });
        let envelope = Envelope::<u64>::decode(&body).unwrap();
        assert_eq!(envelope.id, 6);
        assert!(matches!(envelope.result, Err(ClientError::Protocol(why)) if why.contains("shape")));
        assert!(Envelope::<u64>::decode(&named(&("not", "a map"))).is_err());
    }

    #[derive(Serialize)]
    struct Dup {
        id: u64,
        ok: i64,
        dup: bool,
    }

    #[derive(Serialize)]
    struct PushFrame {
        watch: u64,
        event: Option<Vec<Entry>>,
    }

    #[test]
    fn dup_flags_and_pushes_are_told_apart_from_replies() {
        let envelope = Envelope::<i64>::decode(&named(&Dup { id: 8, ok: 41, dup: true })).unwrap();
        assert_eq!((envelope.id, envelope.result.unwrap(), envelope.dup), (8, 41, true));
        let envelope = Envelope::<i64>::decode(&named(&Reply { id: 9, ok: 3, extra: "" })).unwrap();
        assert!(!envelope.dup);
        // A push has `watch` and no `id`, whatever its event.
        for event in [None, Some(vec![])] {
            match Incoming::<bool>::decode(&named(&PushFrame { watch: 4, event })).unwrap() {
                Incoming::Push(watch) => assert_eq!(watch, 4),
                Incoming::Reply(_) => panic!("a push read as a reply"),
            }
        }
        // A reply's own `watch` (the result of `watch` is under `ok`) or an
        // odd `dup` does not make it a push or fail it.
        #[derive(Serialize)]
        struct Odd<'a> {
            id: u64,
            ok: bool,
            watch: &'a str,
            dup: Vec<u8>,
        }
        let odd = Incoming::<bool>::decode(&named(&Odd { id: 2, ok: true, watch: "x", dup: vec![1] })).unwrap();
        assert!(matches!(odd, Incoming::Reply(Envelope { id: 2, result: Ok(true), dup: false })));
        // Neither an id nor a watch: not a frame of this protocol.
        assert!(Incoming::<bool>::decode(&named(&Err { code: "x", msg: "y" })).is_err());
    }
}
