//! A request before it is sent: the op and its fields, already encoded, so
//! a pipeline of calls is framed by copying bytes.

use serde::Serialize;

use crate::frame::write_frame_with;
use crate::protocol::{Mode, OpKind};

/// One request: an op and its fields (the client adds `id` when sending).
///
/// Fields are msgpack-encoded as they are added, from any `Serialize`
/// value, so building a call allocates one buffer.
#[derive(Debug, Clone)]
pub struct Call {
    /// `"op"`, the op's name and each field's name and value, encoded.
    body: Vec<u8>,
    /// Map entries in `body`.
    entries: u32,
    /// Why a field could not be encoded, reported when the call is sent.
    invalid: Option<String>,
}

impl Call {
    /// The length of the frame's body (after its 4-byte length) when its
    /// `id` takes the most bytes one can (a msgpack u64: 9): the most any
    /// send of this call needs, whatever its id.
    pub(crate) fn longest_body_len(&self) -> usize {
        let map_header = match self.entries + 1 {
            n if n < 16 => 1,
            n if n <= u32::from(u16::MAX) => 3,
            _ => 5,
        };
        // The "id" key: a fixstr header byte and its two bytes.
        map_header + 1 + "id".len() + 9 + self.body.len()
    }

    /// A request for `op`.
    pub fn new(op: OpKind) -> Self {
        Self::named(op.name())
    }

    /// A request naming an op by its text, known to this client or not (to
    /// test what a server does with an op it does not know).
    pub fn named(op: &str) -> Self {
        let mut body = Vec::with_capacity(64);
        // Writing into a Vec cannot fail.
        let _ = rmp::encode::write_str(&mut body, "op");
        let _ = rmp::encode::write_str(&mut body, op);
        Self { body, entries: 1, invalid: None }
    }

    /// Adds a field. A value that cannot be encoded fails the call when it is
    /// sent ([`crate::ClientError::Encode`]).
    pub fn with(mut self, name: &str, value: impl Serialize) -> Self {
        let start = self.body.len();
        let _ = rmp::encode::write_str(&mut self.body, name);
        match rmp_serde::encode::write_named(&mut self.body, &value) {
            Ok(()) => self.entries += 1,
            Err(e) => {
                self.body.truncate(start);
                self.invalid.get_or_insert_with(|| format!("field `{name}`: {e}"));
            }
        }
        self
    }

    /// Adds a field only when `value` is `Some`.
    pub fn with_opt(self, name: &str, value: Option<impl Serialize>) -> Self {
        match value {
            Some(value) => self.with(name, value),
            None => self,
        }
    }

    /// Why a field could not be encoded, if one could not.
    pub fn invalid(&self) -> Option<&str> {
        self.invalid.as_deref()
    }

    /// Appends the framed request with `id` to `out`.
    pub fn encode(&self, id: u64, out: &mut Vec<u8>) {
        write_frame_with(out, |out| {
            rmp::encode::write_map_len(out, self.entries + 1).is_ok()
                && rmp::encode::write_str(out, "id").is_ok()
                && rmp::encode::write_uint(out, id).is_ok()
                && {
                    out.extend_from_slice(&self.body);
                    true
                }
        });
    }
}

/// The `set` request.
pub fn set_call(board: &str, player: &str, score: i64, mode: Mode) -> Call {
    let call = Call::new(OpKind::Set).with("board", board).with("player", player).with("score", score);
    match mode {
        Mode::Set => call, // the default: not sent
        mode => call.with("mode", mode),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_body_len_is_that_of_the_frame_with_a_u64_id() {
        let encoded_len = |call: &Call, id: u64| {
            let mut out = Vec::new();
            call.encode(id, &mut out);
            out.len() - 4
        };
        let mut wide = Call::new(OpKind::Ping);
        for i in 0..20 {
            wide = wide.with(&format!("f{i}"), i);
        }
        for call in [set_call("b", "p", -3, Mode::Incr), Call::new(OpKind::Ping), wide] {
            assert_eq!(call.longest_body_len(), encoded_len(&call, u64::MAX), "{} entries", call.entries);
            assert_eq!(call.longest_body_len(), encoded_len(&call, 1) + 8);
        }
    }

    #[test]
    fn encodes_one_map_with_id_op_and_fields() {
        let mut out = Vec::new();
        set_call("b", "p", -3, Mode::Incr).encode(7, &mut out);
        let len = u32::from_be_bytes([out[0], out[1], out[2], out[3]]) as usize;
        assert_eq!(len, out.len() - 4);
        #[derive(serde::Deserialize, Debug, PartialEq)]
        struct Set {
            id: u64,
            op: String,
            board: String,
            player: String,
            score: i64,
            mode: Mode,
        }
        let set: Set = rmp_serde::from_slice(&out[4..]).unwrap();
        let expected =
            Set { id: 7, op: "set".into(), board: "b".into(), player: "p".into(), score: -3, mode: Mode::Incr };
        assert_eq!(set, expected);
    }

    #[test]
    fn a_value_that_cannot_be_encoded_is_reported_not_sent() {
        struct Refuses;
        impl Serialize for Refuses {
            fn serialize<S: serde::Serializer>(&self, _: S) -> Result<S::Ok, S::Error> {
                Err(serde::ser::Error::custom("no"))
            }
        }
        let call = Call::new(OpKind::Ping).with("x", Refuses);
        assert!(call.invalid().is_some_and(|why| why.contains("`x`")));
        assert_eq!(call.entries, 1);
    }
}
