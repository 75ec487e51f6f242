//! The one error type requests fail with, and the single place where every
//! internal error becomes a protocol error code.

use rankd_client::ErrorCode;
use rankd_shards::ShardError;

/// Why a request failed, one variant per protocol error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The bytes are not one msgpack map.
    #[error("{0}")]
    BadFrame(String),
    /// A field is missing, has the wrong type, or is out of range.
    #[error("{0}")]
    BadRequest(String),
    /// `op` names no operation.
    #[error("unknown op `{0}`")]
    UnknownOp(String),
    /// A frame or list over its limit.
    #[error("{0}")]
    TooLarge(String),
    /// `create_board` with a config different from the existing one.
    #[error("{0}")]
    Conflict(String),
    /// A token is required and `auth` has not succeeded on this connection,
    /// `auth` was given a wrong token, or the token's role does not allow
    /// the op.
    #[error("{0}")]
    Unauthorized(&'static str),
    /// Shed instead of queued without bound.
    #[error("{0}")]
    Overloaded(String),
    /// A server fault; the request may or may not have applied.
    #[error("{0}")]
    Internal(String),
}

impl Error {
    /// The protocol's code for this error.
    pub fn code(&self) -> ErrorCode {
        match self {
            Self::BadFrame(_) => ErrorCode::BadFrame,
            Self::BadRequest(_) => ErrorCode::BadRequest,
            Self::UnknownOp(_) => ErrorCode::UnknownOp,
            Self::TooLarge(_) => ErrorCode::TooLarge,
            Self::Conflict(_) => ErrorCode::Conflict,
            Self::Unauthorized(_) => ErrorCode::Unauthorized,
            Self::Overloaded(_) => ErrorCode::Overloaded,
            Self::Internal(_) => ErrorCode::Internal,
        }
    }
}

impl From<ShardError> for Error {
    fn from(err: ShardError) -> Self {
        match err {
            ShardError::Overflow | ShardError::Fields(_) => Self::BadRequest(err.to_string()),
            other => {
                tracing::error!(error = %other, "shard error");
                Self::Internal(other.to_string())
            }
        }
    }
}
