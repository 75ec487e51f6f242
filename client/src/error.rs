//! What a call can fail with.

use std::fmt;

use crate::frame::FrameError;
use crate::protocol::ErrorCode;

/// A failed call.
#[derive(Debug)]
pub enum ClientError {
    /// The server answered with an error; or the client refused a request
    /// as the server would have, before sending it: `too_large` for a
    /// frame over [`crate::ConnectOptions::max_frame`] (its `msg` says it
    /// was not sent; the connection stays usable).
    Server {
        /// The protocol's error code (see [`ErrorCode`]); kept as text so a
        /// code from a newer server still reads.
        code: String,
        /// For people.
        msg: String,
    },
    /// A field of the request could not be encoded; nothing was sent.
    Encode(String),
    /// The reply is not what the protocol promises: a frame that does not
    /// decode, a reply with the wrong `id`, or a call on a connection left
    /// out of step. (A connection the server closed is [`ClientError::Io`].)
    Protocol(String),
    /// TLS could not be set up (a CA or certificate file, the server name).
    Tls(String),
    /// The client's own settings are refused, before anything is sent: a
    /// [`crate::RetryPolicy`] whose `deadline` is over
    /// [`crate::RetryPolicy::MAX_DEADLINE`].
    Config(String),
    /// Connection failure: it could not be opened (a failed TLS handshake
    /// included), it broke, the server closed it (`UnexpectedEof`), or a
    /// reply did not come in time (`TimedOut`).
    Io(std::io::Error),
    /// A [`crate::RetryingClient`] gave up on a write that may have
    /// applied: a send of it went unanswered (timed out, or its connection
    /// broke or was closed) or was answered `internal`, or its re-sends
    /// were all shed (`overloaded`) until the policy's bounds ran out; or
    /// the server broke the protocol after it was sent (a reply for another
    /// request, or a result that does not decode: that write applied).
    ///
    /// Sending the same write again with this `wid`
    /// ([`crate::RetryingClient::write_with_wid`]) within the server's dedup
    /// horizon (10 minutes by default) applies it at most once: a `dup`
    /// answer says it had applied. A write that was only ever shed did not
    /// apply; it is reported here too, so that every write given up after
    /// a send carries its `wid` the same way (`last` then holds
    /// `overloaded`).
    MaybeApplied {
        /// The write's `wid` (the client's own, or the caller's).
        wid: String,
        /// How many times the write was sent (1 + its re-sends).
        sends: u32,
        /// The error that ended the last try.
        last: Box<ClientError>,
    },
}

impl ClientError {
    /// The server's error code, if the server answered with an error (for
    /// [`ClientError::MaybeApplied`], the last answer's, if the last try
    /// was answered).
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Server { code, .. } => Some(code),
            Self::MaybeApplied { last, .. } => last.code(),
            _ => None,
        }
    }

    /// The server's error code as a known [`ErrorCode`], if it is one.
    pub fn error_code(&self) -> Option<ErrorCode> {
        self.code().and_then(ErrorCode::from_name)
    }

    /// Whether the server's answer says a write may be sent again with its
    /// `wid`: it shed it (`overloaded`) or failed inside (`internal`: it may
    /// or may not have applied, which the `wid` settles).
    pub fn server_may_retry(&self) -> bool {
        matches!(self.error_code(), Some(ErrorCode::Overloaded | ErrorCode::Internal))
    }

    /// The `wid` of a write given up in doubt
    /// ([`ClientError::MaybeApplied`]).
    pub fn wid(&self) -> Option<&str> {
        match self {
            Self::MaybeApplied { wid, .. } => Some(wid),
            _ => None,
        }
    }

    /// The server closed the connection where a reply was due.
    pub(crate) fn closed() -> Self {
        Self::Io(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the server closed the connection"))
    }
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Server { code, msg } => write!(f, "{code}: {msg}"),
            Self::Encode(why) => write!(f, "cannot encode request: {why}"),
            Self::Protocol(why) => write!(f, "protocol violation: {why}"),
            Self::Tls(why) => write!(f, "TLS: {why}"),
            Self::Config(why) => write!(f, "invalid client settings: {why}"),
            Self::Io(e) => e.fmt(f),
            Self::MaybeApplied { wid, sends: 1, last } => write!(f, "write {wid} may have applied (sent once): {last}"),
            Self::MaybeApplied { wid, sends, last } => {
                write!(f, "write {wid} may have applied (sent {sends} times): {last}")
            }
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            Self::MaybeApplied { last, .. } => Some(&**last),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}

/// A frame that could not be read: a lost connection (a socket error, or
/// closed in the middle of a frame) is [`ClientError::Io`]; a frame the
/// protocol does not allow (empty, or over the reply limit) is
/// [`ClientError::Protocol`].
impl From<FrameError> for ClientError {
    fn from(e: FrameError) -> Self {
        match e {
            FrameError::Io(e) => Self::Io(e),
            FrameError::Truncated => Self::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection in the middle of a frame",
            )),
            e @ (FrameError::TooLarge { .. } | FrameError::Empty) => Self::Protocol(e.to_string()),
        }
    }
}
