//! Replies: the result types of the ops, and the envelope every reply
//! comes in (`{"id", "ok"}` or `{"id", "err": {"code", "msg"}}`).

use std::fmt;
use std::marker::PhantomData;

use serde::de::{DeserializeOwned, IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};

use crate::error::ClientError;

/// `rank`'s result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RankInfo {
    /// 1-based rank under the board's tie rule.
    pub rank: u64,
    /// The player's score.
    pub score: i64,
    /// Players on the board.
    pub count: u64,
}

/// One row of `top` / `around`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Who holds this row.
    pub player: String,
    /// Their score.
    pub score: i64,
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
}

/// An error reply's body.
#[derive(Debug, Deserialize)]
struct ErrBody {
    /// The error code, kept as text so a newer server's codes still read.
    code: String,
    /// The server's explanation, for people.
    msg: String,
}

/// A decoded reply: its id, and its result as `T` or the server's error.
pub(crate) struct Envelope<T> {
    /// The request's id: how a reply is matched to its call.
    pub id: u64,
    /// `ok` decoded as `T`, or the server's error.
    pub result: Result<T, ClientError>,
}

impl<T: DeserializeOwned> Envelope<T> {
    /// Decodes one reply frame's body, reading `ok` straight into `T` (no
    /// intermediate value tree; `T` = [`IgnoredAny`] skips it). A result
    /// that is not a `T` fails only its own call: the frame was read whole,
    /// so the connection is still in step.
    pub fn decode(body: &[u8]) -> Result<Self, ClientError> {
        match rmp_serde::from_slice(body) {
            Ok(envelope) => Ok(envelope),
            Err(shape) => match rmp_serde::from_slice::<Envelope<IgnoredAny>>(body) {
                Ok(Envelope { id, .. }) => {
                    Ok(Envelope { id, result: Err(ClientError::Protocol(format!("unexpected result shape: {shape}"))) })
                }
                Err(e) => Err(ClientError::Protocol(format!("bad reply: {e}"))),
            },
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Envelope<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_map(EnvelopeVisitor(PhantomData))
    }
}

struct EnvelopeVisitor<T>(PhantomData<T>);

impl<'de, T: DeserializeOwned> Visitor<'de> for EnvelopeVisitor<T> {
    type Value = Envelope<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a reply map with `id` and `ok` or `err`")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let (mut id, mut result) = (None, None);
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match &*key {
                "id" => id = Some(map.next_value::<u64>()?),
                "ok" => result = Some(Ok(map.next_value::<T>()?)),
                "err" => {
                    let ErrBody { code, msg } = map.next_value()?;
                    result = Some(Err(ClientError::Server { code, msg }));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let id = id.ok_or_else(|| serde::de::Error::missing_field("id"))?;
        let result = result.ok_or_else(|| serde::de::Error::custom("reply has neither `ok` nor `err`"))?;
        Ok(Envelope { id, result })
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
}
