//! What a benchmark can fail with.

use rankd_client::ClientError;

use crate::resp;

/// A failed benchmark.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// Talking to rankd failed.
    #[error("rankd: {0}")]
    Client(#[from] ClientError),
    /// Talking to Redis failed.
    #[error("redis: {0}")]
    Resp(#[from] resp::RespError),
    /// Redis answered a set-up command with an error.
    #[error("redis: {0}")]
    Redis(String),
    /// Files, processes.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// A bad flag.
    #[error("{0}")]
    Invalid(String),
    /// Anything else.
    #[error("{0}")]
    Other(String),
}
