//! The wire protocol of `../shared/protocol.md`: length-prefixed frames, each
//! one msgpack map; requests decoded into typed [`Request`]s and replies
//! encoded back.

pub mod frame;
pub mod request;
pub mod response;

pub use frame::{FrameError, FrameReader, DEFAULT_MAX_FRAME};
pub use request::{Op, Request, View};
pub use response::{encode_error, encode_reply, BoardInfo, Entry, RankInfo, Reply};
