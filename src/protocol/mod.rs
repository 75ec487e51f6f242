//! The wire protocol of `../shared/protocol.md`: length-prefixed frames, each
//! one msgpack map; requests decoded into typed [`Request`]s and replies
//! encoded back.

pub mod request;
pub mod response;
pub mod score;

pub use request::{Op, Request, View};
pub use response::{encode_error, encode_reply, Reply};
pub use score::ScoreInput;
