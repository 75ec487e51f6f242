//! What a call can fail with.

use std::fmt;

use crate::protocol::ErrorCode;

/// A failed call.
#[derive(Debug)]
pub enum ClientError {
    /// The server answered with an error.
    Server {
        /// The protocol's error code (see [`ErrorCode`]); kept as text so a
        /// code from a newer server still reads.
        code: String,
        /// For people.
        msg: String,
    },
    /// A field of the request could not be encoded; nothing was sent.
    Encode(String),
    /// The reply is not what the protocol promises.
    Protocol(String),
    /// TLS could not be set up (a CA or certificate file, the server name).
    Tls(String),
    /// Connection failure (a failed TLS handshake included).
    Io(std::io::Error),
}

impl ClientError {
    /// The server's error code, if the server answered with an error.
    pub fn code(&self) -> Option<&str> {
        match self {
            Self::Server { code, .. } => Some(code),
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
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Server { code, msg } => write!(f, "{code}: {msg}"),
            Self::Encode(why) => write!(f, "cannot encode request: {why}"),
            Self::Protocol(why) => write!(f, "protocol violation: {why}"),
            Self::Tls(why) => write!(f, "TLS: {why}"),
            Self::Io(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io(e) => Some(e),
            _ => None,
        }
    }
}

impl From<std::io::Error> for ClientError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e)
    }
}
